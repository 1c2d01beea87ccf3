// tiny_model/devices.hpp -- --device NAME -> a ModelRunner.
//
// The one place that knows every runner, so that the engine (which only
// knows the ModelRunner interface, runner.hpp) and the examples can pick one
// by name. A g++/clang++ build runs the CUDA kernels emulated on the CPU; a
// `make cuda` build runs them on the GPU. Asking a build for the other kind
// is an error that says which build to use. `sim` is the simulated GPU
// (sim_runner.hpp): it needs no weights, only the model's shape, and a GPU
// preset (SimOptions).
#pragma once

#include <memory>
#include <stdexcept>
#include <string>

#include "cuda_shim.hpp"
#include "sim_runner.hpp"
#include "tiny_model/forward_gpu.cuh"
#include "tiny_model/model.hpp"
#include "tiny_model/runner.hpp"

namespace pkv {

// What `--device sim` simulates for a model given as weights: the GPU and
// link presets (cost_model.hpp), and the cost parameters.
struct SimOptions {
    std::string gpu = "h200";
    std::string pcie;  // "" = the GPU's own link
    CostParams cost;
};

inline std::unique_ptr<ModelRunner> make_model_runner(Device device, const Model& m, const SimOptions& sim = {}) {
    if (device == Device::kCpu) return std::make_unique<CpuRunner>(m);
    if (device == Device::kSim) {
        SimConfig s = sim_config(sim.gpu, "builtin", sim.pcie);
        s.model = ModelSpec{"this model", m.cfg, 4, 4, "the model's own f32 checkpoint"};
        s.cost = sim.cost;
        return std::make_unique<SimRunner>(s);
    }
    const std::string built = kDeviceKind;
    if (to_string(device) != built)
        throw std::invalid_argument(device == Device::kCuda
                                        ? "--device cuda needs a binary built by `make cuda` (this one runs kernels emulated: use --device emulated)"
                                        : "--device emulated needs the CPU build (`make`); this `make cuda` binary runs kernels on the GPU");
    std::string why;
    if (!device_available(&why)) throw std::runtime_error("--device cuda: no usable GPU here (CUDA says: " + why + ")");
    return std::make_unique<GpuRunner>(m);
}

}  // namespace pkv

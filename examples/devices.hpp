// examples/devices.hpp -- --device NAME -> a ModelRunner, and where the
// programs choose lab/'s faster paths.
//
// The one place that knows every runner, so that the engine (which only
// knows the ModelRunner interface, tiny_model/runner.hpp) and the examples can
// pick one by name. A g++/clang++ build runs the CUDA kernels emulated on the
// CPU; a `make cuda` build runs them on the GPU. Asking a build for the other
// kind is an error that says which build to use. `sim` is the simulated GPU
// (lab/sim_runner.hpp): it needs no weights, only the model's shape, and a GPU
// preset (SimOptions).
//
// It is also the seam between the two tiers. The reference (the top level,
// core/, tiny_model/) never names lab/; the runners take their arithmetic from
// whoever builds them. This file is the one outside lab/ that includes lab/
// headers, and it hands every program the fast paths: FastCpuMath
// (lab/fast_cpu.hpp) to the CPU runner, FastGpuMath (lab/fast_gpu.cuh) to the
// kernel runner. Same tokens either way; only the time differs. The
// scheduling policies of lab/policies.hpp come through here too, so that
// examples/workload.hpp can offer them as flags.
#pragma once

#include <memory>
#include <stdexcept>
#include <string>

#include "core/emu/cuda_shim.hpp"
#include "lab/fast_cpu.hpp"
#include "lab/fast_gpu.cuh"
#include "lab/policies.hpp"
#include "lab/sim_runner.hpp"
#include "tiny_model/forward_gpu.cuh"
#include "tiny_model/model.hpp"
#include "tiny_model/runner.hpp"

namespace pkv {

// What `--device sim` simulates for a model given as weights: the GPU and
// link presets (lab/cost_model.hpp), and the cost parameters. The simulator never
// touches the weights; it only needs the model's shape to price each step
// (bytes of weights and KV read, multiply-adds done).
struct SimOptions {
    std::string gpu = "h200";
    std::string pcie;  // "" = the GPU's own link
    CostParams cost;
};

// The four devices, and why each check sits where it does:
//   cpu       always available: forward_cpu.hpp with FastCpuMath;
//   sim       always available: prices steps, computes no logits that matter;
//   emulated  the kernels of forward_gpu.cuh (with FastGpuMath) on CPU threads, only in a g++
//             or clang++ build (kDeviceKind says which build this is);
//   cuda      the same kernels on a GPU, only in a `make cuda` build, and
//             only if CUDA finds a usable device *now*: a machine without a
//             driver gets a sentence naming the cause, not a crash in the
//             first kernel launch.
// One wrong choice is refused with the command that would work, because a
// student who types --device cuda into the CPU build deserves to learn which
// build to make rather than read a CUDA error code.
// `attention` matters only to the kernel path (emulated, cuda): which
// attention kernel FastGpuMath launches (lab/fast_gpu.cuh).
inline std::unique_ptr<ModelRunner> make_model_runner(Device device, const Model& m, const SimOptions& sim = {},
                                                      AttentionKernel attention = AttentionKernel::kPartitioned) {
    if (device == Device::kCpu) return std::make_unique<CpuRunner>(m, std::make_unique<FastCpuMath>());
    if (device == Device::kSim) {
        // Four bytes per weight and per KV element: this model's own f32
        // checkpoint, priced on the chosen GPU.
        SimConfig s = sim_config(sim.gpu, "builtin", sim.pcie);
        s.model = ModelSpec{"this model", m.cfg, 4, 4, "the model's own f32 checkpoint"};
        s.cost = sim.cost;
        return std::make_unique<SimRunner>(s);
    }
    // Emulated or CUDA: which one this binary can run was fixed at compile time.
    const std::string built = kDeviceKind;
    if (to_string(device) != built)
        throw std::invalid_argument(device == Device::kCuda
                                        ? "--device cuda needs a binary built by `make cuda` (this one runs kernels emulated: use --device emulated)"
                                        : "--device emulated needs the CPU build (`make`); this `make cuda` binary runs kernels on the GPU");
    std::string why;
    if (!device_available(&why)) throw std::runtime_error("--device cuda: no usable GPU here (CUDA says: " + why + ")");
    return std::make_unique<GpuRunner>(m, std::make_unique<FastGpuMath>(attention));
}

}  // namespace pkv

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
// headers. By default every program runs the reference's arithmetic, the code
// the tutorial reads and a debugger steps through: forward_cpu.hpp's plain
// loops (CpuMath, one thread) on the CPU, forward_gpu.cuh's gemm_simple and
// paged_kv.cuh's one-pass paged_attention_kernel (GpuMath) on the kernel
// path. `--math fast` (MathPath::kFast) hands the runner lab's instead:
// FastCpuMath (lab/fast_cpu.hpp: SIMD and a worker pool) or FastGpuMath
// (lab/fast_gpu.cuh: the tiled GEMM and the partitioned kernel). Same tokens
// either way, bit for bit; only the time differs. Benches, studies and other
// timed programs ask for the fast path themselves, and say so. The
// scheduling policies of lab/policies.hpp come through here too, so that
// examples/workload.hpp can offer them as flags.
#pragma once

#include <cstdlib>
#include <memory>
#include <stdexcept>
#include <string>

#include "core/emu/cuda_shim.hpp"
#include "examples/cli.hpp"
#include "lab/fast_cpu.hpp"
#include "lab/fast_gpu.cuh"
#include "lab/policies.hpp"
#include "lab/sim_runner.hpp"
#include "tiny_model/forward_gpu.cuh"
#include "tiny_model/model.hpp"
#include "tiny_model/runner.hpp"

namespace pkv {

// Where a program runs its model: the reference's two runners (cpu, and the
// kernel path, emulated or cuda by how the binary was built) and lab's
// simulated GPU. One enum for every program, so each parses one --device.
enum class Device { kCpu, kEmulated, kCuda, kSim };

inline const char* to_string(Device d) {
    switch (d) {
        case Device::kCpu: return "cpu";
        case Device::kEmulated: return "emulated";
        case Device::kCuda: return "cuda";
        case Device::kSim: return "sim";
    }
    return "?";
}
// "cpu" | "emulated" | "cuda" | "sim" -> Device; anything else is an invalid_argument.
inline Device parse_device(const std::string& s) {
    for (Device d : {Device::kCpu, Device::kEmulated, Device::kCuda, Device::kSim})
        if (s == to_string(d)) return d;
    throw std::invalid_argument("--device expects cpu, emulated, cuda or sim, got '" + s + "'");
}

// What `--device sim` simulates for a model given as weights: the GPU and
// link presets (lab/cost_model.hpp), and the cost parameters. The simulator never
// touches the weights; it only needs the model's shape to price each step
// (bytes of weights and KV read, multiply-adds done).
struct SimOptions {
    std::string gpu = "h200";
    std::string pcie;  // "" = the GPU's own link
    CostParams cost;
    VirtualClock* clock = nullptr;  // the engine's clock, which each step moves on (lab/sim_runner.hpp)
};

// Which arithmetic a runner is given (the top of this file): the
// reference's, or lab's faster code for the same bits.
enum class MathPath { kReference, kFast };
inline const char* to_string(MathPath m) { return m == MathPath::kReference ? "reference" : "fast"; }
// The one spelling every program uses for it.
inline void add_math_flag(cli::Parser& p, MathPath* m) {
    p.choice("--math", m, {{"reference", MathPath::kReference}, {"fast", MathPath::kFast}},
             "the forward pass's arithmetic: reference (the code the TUTORIAL reads: plain loops on one thread, the "
             "one-pass kernel) or fast (lab/: SIMD and threads, the tiled GEMM and partitioned kernel); the same tokens");
}

// The four devices, and why each check sits where it does:
//   cpu       always available: forward_cpu.hpp (CpuMath, or FastCpuMath);
//   sim       always available: prices steps, computes no logits that matter;
//   emulated  the kernels of forward_gpu.cuh (GpuMath, or FastGpuMath) run by the
//             emulated launch (core/emu/: fibers on the calling thread), only in a g++
//             or clang++ build (kDeviceKind says which build this is);
//   cuda      the same kernels on a GPU, only in a `make cuda` build, and
//             only if CUDA finds a usable device *now*: a machine without a
//             driver gets a sentence naming the cause, not a crash in the
//             first kernel launch.
// One wrong choice is refused with the command that would work, because a
// student who types --device cuda into the CPU build deserves to learn which
// build to make rather than read a CUDA error code.
inline std::unique_ptr<ModelRunner> make_model_runner(Device device, const Model& m, MathPath math = MathPath::kReference,
                                                      const SimOptions& sim = {}) {
    // PKV_SIMD picks the fast path's instruction set (lab/fast_cpu.hpp); the
    // reference has none to pick, and a setting nobody reads must not pass
    // for one that took effect.
    if (math == MathPath::kReference && std::getenv("PKV_SIMD"))
        throw std::invalid_argument("PKV_SIMD chooses the instruction set of lab's fast path, which this run does not use: add "
                                    "--math fast, or unset PKV_SIMD");
    if (device == Device::kCpu)
        return std::make_unique<CpuRunner>(m, math == MathPath::kFast ? std::make_unique<FastCpuMath>() : std::make_unique<CpuMath>());
    if (device == Device::kSim) {
        // Four bytes per weight and per KV element: this model's own f32
        // checkpoint, priced on the chosen GPU.
        SimConfig s = sim_config(sim.gpu, "builtin", sim.pcie);
        s.model = ModelSpec{"this model", m.cfg, 4, 4, "the model's own f32 checkpoint"};
        s.cost = sim.cost;
        auto r = std::make_unique<SimRunner>(s);
        r->set_clock(sim.clock);
        return r;
    }
    // Emulated or CUDA: which one this binary can run was fixed at compile time.
    const std::string built = kDeviceKind;
    if (to_string(device) != built)
        throw std::invalid_argument(device == Device::kCuda
                                        ? "--device cuda needs a binary built by `make cuda` (this one runs kernels emulated: use --device emulated)"
                                        : "--device emulated needs the CPU build (`make`); this `make cuda` binary runs kernels on the GPU");
    std::string why;
    if (!device_available(&why)) throw std::runtime_error("--device cuda: no usable GPU here (CUDA says: " + why + ")");
    return std::make_unique<GpuRunner>(m, math == MathPath::kFast ? std::make_unique<FastGpuMath>() : std::make_unique<GpuMath>());
}

}  // namespace pkv

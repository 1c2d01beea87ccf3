// lab/sim_engine.hpp -- one recipe for an engine on a simulated GPU.
//
// sim_scale, the studies (study_kit.hpp) and the simulator's tests all build
// the same thing: an Engine over a SimRunner, its KV pool sized as vLLM sizes
// it -- what the GPU holds after the weights and the activation reserve
// (cost_model.hpp section 3) -- and its clock the simulated one. This is that
// recipe, once, on top of the knobs every program shares (workload::EngineKnobs,
// examples/workload.hpp).
#pragma once

#include <memory>
#include <stdexcept>
#include <string>

#include "engine.hpp"
#include "examples/workload.hpp"
#include "lab/sim_runner.hpp"

namespace study {

// The knobs, workloads and helpers every program shares (examples/workload.hpp).
using namespace workload;

// The EngineConfig of `knobs` for an engine on `runner`: the cache's element
// type is the simulated model's, and num_blocks 0 means vLLM's rule (the
// runner's memory for the KV cache, as a byte budget). A model that leaves no
// memory for a cache is refused with what would have to change.
inline pkv::EngineConfig sim_engine_config(const EngineKnobs& knobs, const pkv::SimRunner& runner) {
    pkv::EngineConfig ec = engine_config(knobs);
    const pkv::SimConfig& sc = runner.config();
    ec.kv_dtype = pkv::kv_dtype_of(sc.model);
    ec.log_interval_s = 0;
    if (knobs.num_blocks == 0) {
        ec.kv_cache_bytes = runner.memory_for_kv_cache();
        if (ec.kv_cache_bytes == 0)
            throw std::invalid_argument("model " + sc.model.name + " leaves no memory for a KV cache on " + sc.hw.name +
                                        " at gpu-memory-utilization " + cli::number_text(sc.memory_utilization));
    }
    return ec;
}

// An engine of `knobs` on a simulated GPU of `sc`, timed by `clock`, which
// each step moves on by its modelled duration. sc's batch limits follow the
// knobs, so that the cost model reserves activations for the batches the
// scheduler will make; a swapping policy's copies are priced by the runner.
inline std::unique_ptr<pkv::Engine> make_sim_engine(pkv::SimConfig sc, const EngineKnobs& knobs, pkv::VirtualClock* clock) {
    sc.max_num_batched_tokens = knobs.max_num_batched_tokens;
    sc.max_num_seqs = knobs.max_num_seqs;
    auto runner = std::make_unique<pkv::SimRunner>(sc);
    runner->set_clock(clock);
    const pkv::EngineConfig ec = sim_engine_config(knobs, *runner);
    return make_engine(ec, policy_of(knobs), std::move(runner), clock);
}

}  // namespace study

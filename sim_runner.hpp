// sim_runner.hpp -- a simulated GPU: the third ModelRunner, with no weights
// and no logits, only a modelled duration for every step (chapter 5,
// cost_model.hpp, says how the duration is computed).
//
// Everything above the runner is the real thing: the scheduler, the block
// pool with its prefix cache, preemption and swap bookkeeping, the metrics and
// the event stream. The engine hands SimRunner the same flat batch it would
// hand the CPU or a GPU; SimRunner reads off the batch's composition (how many
// new tokens each request computes, how long its context is), asks the cost
// model what that step would take on the chosen GPU, and returns tokens
// without computing anything:
//   token = 3 + hash(request seed, output index) mod (vocab - 3)
// a pure function of the request, never of the batch or the step, so a
// preempted and recomputed request produces the very same tokens (and the
// special ids 0..2, <unk>/BOS/EOS, never come out: requests end by max_tokens,
// which the workload draws). The engine advances its clock by the modelled
// duration (Clock::advance), so every latency it records -- TTFT, ITL, the
// pauses of preemption -- is in simulated seconds.
//
// The `cpu` preset is the one hardware we can check the model against: it is
// measured here (calibrate_cpu) from the project's own CPU forward pass, and
// examples/sim_fidelity compares the simulated step times with real ones.
//
// Sections: 1. SimRunner  2. the cpu preset, calibrated on this machine.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <limits>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "block_pool.hpp"
#include "cost_model.hpp"
#include "paged_kv.cuh"
#include "tiny_model/forward_cpu.hpp"
#include "tiny_model/model.hpp"
#include "tiny_model/runner.hpp"

namespace pkv {

// ============================================================================
// 1. SimRunner
// ============================================================================

// Everything a simulated run needs to know about the hardware and the model.
struct SimConfig {
    ModelSpec model;
    Hardware hw;
    CostParams cost;
    // vLLM's gpu_memory_utilization, and the two scheduler limits its
    // activation reserve depends on (cost_model.hpp section 3).
    double memory_utilization = 0.9;
    int max_num_batched_tokens = 8192, max_num_seqs = 256;
};

// The engine's KV element type with the size the served model uses: BF16 is
// 2 bytes like f16 (the engine only counts bytes for a simulated cache).
inline KVDtype kv_dtype_of(const ModelSpec& m) {
    return m.kv_bytes == 1 ? KVDtype::kInt8 : m.kv_bytes == 2 ? KVDtype::kF16 : KVDtype::kF32;
}

// A simulated run of `model` on GPU preset `gpu` ("h200", ...) over PCIe
// preset `pcie` ("" = the GPU's own link).
inline SimConfig sim_config(const std::string& gpu, const std::string& model, const std::string& pcie = "") {
    const GpuSpec& g = find_preset(gpu_presets(), gpu, "GPU preset");
    SimConfig s;
    s.model = find_preset(model_presets(), model, "model preset");
    s.hw = hardware_of(g, find_preset(pcie_presets(), pcie.empty() ? g.pcie : pcie, "PCIe preset"));
    return s;
}

class SimRunner : public ModelRunner {
public:
    explicit SimRunner(SimConfig cfg) : cfg_(std::move(cfg)) {
        if (std::string p = cfg_.model.shape.problem(); !p.empty()) throw std::invalid_argument("sim model " + cfg_.model.name + ": " + p);
        const double weights = total_params(cfg_.model.shape) * cfg_.model.weight_bytes;
        if (weights > cfg_.memory_utilization * cfg_.hw.memory_bytes)
            throw std::invalid_argument("model " + cfg_.model.name + " needs " + format_bytes((uint64_t)weights) + " of weights, more than " +
                                        format_bytes((uint64_t)(cfg_.memory_utilization * cfg_.hw.memory_bytes)) + " of " +
                                        cfg_.hw.name + " (" + std::to_string(cfg_.memory_utilization) +
                                        " of its memory): pick a larger GPU or a smaller model");
    }
    const SimConfig& config() const { return cfg_; }
    const Config& model_config() const override { return cfg_.model.shape; }
    Device device() const override { return Device::kSim; }
    bool kv_in_host_memory() const override { return false; }
    bool produces_tokens() const override { return true; }
    // The KV budget of vLLM's rule (cost_model.hpp section 3) for a pool of
    // `block_size` blocks; the engine turns it into blocks.
    uint64_t memory_for_kv_cache() const override {
        const KVPoolSize k = kv_pool_size(cfg_.model, cfg_.hw.memory_bytes, cfg_.memory_utilization, 16, cfg_.max_num_batched_tokens,
                                          cfg_.max_num_seqs);
        return k.kv_budget_bytes > 0 ? (uint64_t)k.kv_budget_bytes : 0;
    }
    // Swap space is modelled, not allocated: any size the scheduler asks for.
    uint64_t memory_for_swap() const override { return UINT64_MAX; }
    void init_kv_cache(const KVGeometry& geo, int) override { geo_ = geo; }

    void forward(const ForwardBatch&, std::vector<float>&) override {
        throw std::logic_error("SimRunner computes no logits (produces_tokens() is true: the engine asks forward_argmax)");
    }
    // One step: the cost of the batch (plus the swaps queued since the last
    // step), and a token for every row that wants one.
    void forward_argmax(const ForwardBatch& b, std::vector<int32_t>& tokens) override {
        // Per sequence row: new tokens, and where its context ends.
        items_.assign((size_t)b.num_seqs(), StepItem{0, 0});
        for (int t = 0; t < b.num_tokens(); ++t) {
            StepItem& it = items_[(size_t)b.token_seq[t]];
            it.new_tokens++;
            it.context_end = std::max(it.context_end, b.positions[t] + 1);
        }
        last_ = step_cost(cfg_.model, cfg_.hw, cfg_.cost, items_, (int)b.logits_indices.size(), pending_swap_bytes_);
        pending_swap_bytes_ = 0;
        modelled_s_ += last_.total_s;
        const int V = cfg_.model.shape.vocab_size;
        tokens.resize(b.logits_indices.size());
        for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = sim_token(b.logits_seed.at(i), b.logits_output_index.at(i), V);
    }
    void swap_out(const std::vector<std::pair<int32_t, int32_t>>& pairs) override { pending_swap_bytes_ += pairs.size() * (double)geo_.bytes_per_block(); }
    void swap_in(const std::vector<std::pair<int32_t, int32_t>>& pairs) override { pending_swap_bytes_ += pairs.size() * (double)geo_.bytes_per_block(); }
    double take_modelled_seconds() override {
        const double s = modelled_s_;
        modelled_s_ = 0;
        return s;
    }
    // The last step's cost, by phase.
    const StepCost& last_step() const { return last_; }

    // The token a simulated request emits as its `output_index`-th output:
    // splitmix64 of (seed, index), never one of the special ids 0..2.
    static int32_t sim_token(uint64_t seed, int output_index, int vocab) {
        uint64_t s = seed * 0x9e3779b97f4a7c15ull + (uint64_t)output_index + 1;
        return 3 + (int32_t)(splitmix64(s) % (uint64_t)std::max(1, vocab - 3));
    }

private:
    SimConfig cfg_;
    KVGeometry geo_;
    std::vector<StepItem> items_;  // [num_seqs] this step's composition
    double pending_swap_bytes_ = 0;
    double modelled_s_ = 0;
    StepCost last_;
};

// ============================================================================
// 2. The `cpu` preset: this machine, measured
// ============================================================================
//
// To compare the model with reality we need a machine we can run: this CPU,
// with the project's own forward pass (one thread, so that the measurement
// does not depend on what else the machine is doing at the moment). We
// measure, on the real model's own matrices:
//   memory_bw   weight bytes / the time of one token through every linear
//               layer (matmul at T = 1: the weights streamed once);
//   peak_flops  2 x parameters x 64 / the time of 64 tokens through them
//               (matmul at T = 64: the project's GEMM throughput);
//   attn_peak   attention FLOPs / time, from one token attending to 512
//               positions against one attending to 1;
//   per_token   what a token costs beyond matmul and attention (norms,
//               RoPE, the K/V write), from whole forward passes;
// and the efficiencies are 1, since these are already achieved rates. The
// step overhead (scheduling, batch building, sampling) is measured by
// sim_fidelity, which runs the engine; here it is a parameter.
struct CpuCalibration {
    Hardware hw;
    CostParams cost;
    double matmul_t1_s = 0, matmul_t64_s = 0, attn_s_per_key = 0;
};

inline double median_seconds(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

inline CpuCalibration calibrate_cpu(const Model& m, double step_overhead_s = 0.0, int repeats = 9) {
    const Config& c = m.cfg;
    const int D = c.dim, KV = c.kv_dim(), H = c.hidden_dim, V = c.vocab_size;
    auto time_it = [&](auto&& fn) {
        std::vector<double> t;
        fn();  // warm-up: caches and page faults
        for (int r = 0; r < repeats; ++r) {
            const auto t0 = std::chrono::steady_clock::now();
            fn();
            t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
        }
        return median_seconds(t);
    };
    // Every linear layer of the model once, for T tokens: the weights as the
    // CPU forward reads them.
    std::vector<float> x((size_t)64 * H, 0.01f), y((size_t)64 * std::max(V, H));
    auto linear = [&](int T) {
        for (int l = 0; l < c.n_layers; ++l) {
            const Weights& w = m.w;
            matmul(y.data(), x.data(), &w.wq[(size_t)l * D * D], T, D, D);
            matmul(y.data(), x.data(), &w.wk[(size_t)l * KV * D], T, D, KV);
            matmul(y.data(), x.data(), &w.wv[(size_t)l * KV * D], T, D, KV);
            matmul(y.data(), x.data(), &w.wo[(size_t)l * D * D], T, D, D);
            matmul(y.data(), x.data(), &w.w1[(size_t)l * H * D], T, D, H);
            matmul(y.data(), x.data(), &w.w3[(size_t)l * H * D], T, D, H);
            matmul(y.data(), x.data(), &w.w2[(size_t)l * D * H], T, H, D);
        }
        matmul(y.data(), x.data(), m.classifier(), T, D, V);
    };
    CpuCalibration cal;
    cal.matmul_t1_s = time_it([&] { linear(1); });
    cal.matmul_t64_s = time_it([&] { linear(64); });
    const double params = layer_params(c) + classifier_params(c);

    // Whole forward passes through the model, on a cache big enough for one
    // sequence of 520 positions (and 64 of 1).
    const int bs = 16;
    KVCache cache(KVGeometry{c.n_layers, 80, bs, c.n_kv_heads, c.head_dim()});
    CpuForward fwd(m, cache);
    std::vector<float> logits;
    std::vector<int32_t> table(40);
    for (int i = 0; i < 40; ++i) table[(size_t)i] = i;
    auto decode_at = [&](int pos) {  // one token at `pos`, attending to pos + 1 keys
        ForwardBatch b;
        const int32_t tok = 5;
        b.add_sequence(table, bs, &tok, pos, 1, true);
        fwd.forward(b, logits);
    };
    auto decode64 = [&]() {  // 64 sequences, one token each at position 0
        ForwardBatch b;
        const int32_t tok = 5;
        for (int s = 0; s < 64; ++s) b.add_sequence({40 + s % 40}, bs, &tok, 0, 1, true);
        fwd.forward(b, logits);
    };
    const double t_short = time_it([&] { decode_at(0); });
    const double t_long = time_it([&] { decode_at(511); });
    const double t_64 = time_it(decode64);
    const double per_key = 4.0 * c.n_heads * c.head_dim() * c.n_layers;
    cal.attn_s_per_key = std::max(1e-12, (t_long - t_short) / 511.0);

    cal.hw.name = "cpu";
    cal.hw.memory_bw = params * 4.0 / cal.matmul_t1_s;
    cal.hw.peak_flops = 2.0 * params * 64 / cal.matmul_t64_s;
    cal.hw.attn_peak_flops = per_key / cal.attn_s_per_key;
    cal.hw.memory_bytes = (double)host_memory_bytes();
    cal.hw.pcie_bw = cal.hw.memory_bw;  // "swap" is a memcpy in host memory
    cal.hw.source = "measured on this machine: the CPU forward pass of the model itself, one thread";
    cal.cost.bw_efficiency = cal.cost.flops_efficiency = cal.cost.attn_flops_efficiency = 1.0;
    cal.cost.step_overhead_s = step_overhead_s;
    // What 64 tokens cost beyond the roofline's linear and attention terms.
    const double linear64 = std::max(cal.matmul_t64_s, cal.matmul_t1_s);
    cal.cost.per_token_s = std::max(0.0, (t_64 - linear64 - 64 * cal.attn_s_per_key) / 64.0);
    return cal;
}

// The `cpu` preset for a model we hold the weights of.
inline SimConfig cpu_sim_config(const Model& m, const std::string& name, double step_overhead_s = 0.0) {
    SimConfig s;
    s.model = ModelSpec{name, m.cfg, 4, 4, "the model's own f32 checkpoint"};
    const CpuCalibration cal = calibrate_cpu(m, step_overhead_s);
    s.hw = cal.hw;
    s.cost = cal.cost;
    s.cost.swap_stalls = true;
    return s;
}

}  // namespace pkv

// lab/sim_runner.hpp -- lab/LAB.md chapter L6: a simulated GPU, a third
// ModelRunner (tiny_model/runner.hpp's seam), with no weights and no logits,
// only a modelled duration for every step (cost_model.hpp says how the
// duration is computed).
//
// Everything above the runner is the real thing: the scheduler, the block
// pool with its prefix cache, preemption and swap bookkeeping, the metrics and
// the event stream. The engine hands SimRunner the same flat batch it would
// hand the CPU or a GPU; SimRunner reads off the batch's composition (how many
// new tokens each request computes, how long its context is), asks the cost
// model what that step would take on the chosen GPU, moves the simulated
// clock (VirtualClock, below) on by that much, and returns tokens without
// computing anything:
//   token = 3 + hash(the sequence's last token, its position) mod (vocab - 3)
// a pure function of the sequence, never of the batch or the step, so a
// preempted and recomputed request produces the very same tokens (and the
// special ids 0..2, <unk>/BOS/EOS, never come out: requests end by max_tokens,
// which the workload draws). The engine reads every timestamp from the same
// clock, so every latency it records -- TTFT, ITL, the pauses of preemption --
// is in simulated seconds. A swap's copies are priced too: SimRunner is the
// BlockCopier of a swapping policy (lab/swap.hpp) and charges them to the
// next step (cost_model.hpp section 4b).
//
// The `cpu` preset is the one hardware we can check the model against: it is
// measured here (calibrate_cpu) from the project's own CPU forward pass, and
// lab/sim_fidelity compares the simulated step times with real ones.
//
// Sections: 1. SimRunner  2. the cpu preset, calibrated on this machine.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <ctime>
#include <limits>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/block_pool.hpp"
#include "core/clock.hpp"
#include "lab/cost_model.hpp"
#include "lab/fast_cpu.hpp"
#include "lab/swap.hpp"
#include "paged_kv.cuh"
#include "tiny_model/forward_batch.hpp"
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
    // The engine's host work per step (cost_model.hpp section 4c); none by
    // default: only the GPU's step is charged.
    HostProfile host;
    // vLLM's gpu_memory_utilization (its default was 0.9 through at least
    // v0.11; its newest config says 0.92, a change we did not date), and the
    // two scheduler limits its activation reserve depends on (cost_model.hpp
    // section 3).
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
    s.hw = hardware_for(g, find_preset(pcie_presets(), pcie.empty() ? g.pcie : pcie, "PCIe preset"), s.model.weight_bytes);
    return s;
}

// Simulated time: it moves only when the simulated GPU says its work took
// time (SimRunner::forward_argmax), so inside a step everything before the
// forward pass happens at the step's start and every token at its end.
struct VirtualClock : Clock {
    double t = 0.0;
    double now() override { return t; }
    void advance(double seconds) { t += seconds; }
};

class SimRunner : public ModelRunner, public BlockCopier {
public:
    explicit SimRunner(SimConfig cfg) : cfg_(std::move(cfg)) {
        validate(cfg_.model);  // cost_model.hpp's doors: every field named when it is impossible
        validate(cfg_.hw);
        validate(cfg_.cost);
        require_number(cfg_.memory_utilization, "gpu_memory_utilization", 0, 1, true);
        if (cfg_.max_num_batched_tokens < 1 || cfg_.max_num_seqs < 1)
            throw std::invalid_argument("SimConfig: max_num_batched_tokens and max_num_seqs must be >= 1");
        const double weights = total_params(cfg_.model.shape) * cfg_.model.weight_bytes;
        if (weights > cfg_.memory_utilization * cfg_.hw.memory_bytes)
            throw std::invalid_argument("model " + cfg_.model.name + " needs " + format_bytes((uint64_t)weights) + " of weights, more than " +
                                        format_bytes((uint64_t)(cfg_.memory_utilization * cfg_.hw.memory_bytes)) + " of " +
                                        cfg_.hw.name + " (" + std::to_string(cfg_.memory_utilization) +
                                        " of its memory): pick a larger GPU or a smaller model");
    }
    const SimConfig& config() const { return cfg_; }
    // The clock this runner moves on by each step's modelled duration (the
    // engine's: pass the same one to both), or none.
    void set_clock(VirtualClock* clock) { clock_ = clock; }
    const Config& model_config() const override { return cfg_.model.shape; }
    std::string device_name() const override { return "sim"; }
    // The KV budget of vLLM's rule (cost_model.hpp section 3) for a pool of
    // `block_size` blocks; the engine turns it into blocks.
    uint64_t memory_for_kv_cache() const override {
        const KVPoolSize k = kv_pool_size(cfg_.model, cfg_.hw.memory_bytes, cfg_.memory_utilization, 16, cfg_.max_num_batched_tokens,
                                          cfg_.max_num_seqs);
        return k.kv_budget_bytes > 0 ? (uint64_t)k.kv_budget_bytes : 0;
    }
    void init_kv_cache(const KVGeometry& geo) override { geo_ = geo; }
    KVView kv_view(int, int) override { throw std::logic_error("the simulated GPU keeps no K/V bytes: it only prices the steps"); }

    // Sampling asks for logits: a row that makes this step's token (below)
    // the only likely one, so a sampled request still emits it. Greedy runs
    // (every study) take forward_argmax and never build a row.
    void forward(const ForwardBatch& b, std::vector<float>& logits) override {
        std::vector<int32_t> tokens;
        forward_argmax(b, tokens);
        const size_t V = (size_t)cfg_.model.shape.vocab_size;
        logits.assign(tokens.size() * V, 0.0f);
        for (size_t i = 0; i < tokens.size(); ++i) logits[i * V + (size_t)tokens[i]] = 100.0f;
    }
    // One step: the cost of the batch (plus the swaps copied since the last
    // step, priced by cost_model.hpp section 4b), the clock moved on by it,
    // and a token for every row that wants one.
    void forward_argmax(const ForwardBatch& b, std::vector<int32_t>& tokens) override {
        // Per sequence row: new tokens, and where its context ends.
        items_.assign((size_t)b.num_seqs(), StepItem{0, 0});
        for (int t = 0; t < b.num_tokens(); ++t) {
            StepItem& it = items_[(size_t)b.token_seq[t]];
            it.new_tokens++;
            it.context_end = std::max(it.context_end, b.positions[t] + 1);
        }
        last_ = step_cost(cfg_.model, cfg_.hw, cfg_.cost, items_, (int)b.logits_indices.size(), 0.0);
        last_.swap_s = swap_stall_seconds(cfg_.hw, cfg_.cost, pending_swap_, last_.linear_s + last_.attention_s);
        last_.total_s += last_.swap_s;
        last_.host_s = host_seconds(cfg_.host, b.num_seqs(), last_.total_s);
        last_.total_s += last_.host_s;
        pending_swap_ = SwapTraffic{};
        modelled_s_ += last_.total_s;
        if (clock_) clock_->advance(last_.total_s);
        const int V = cfg_.model.shape.vocab_size;
        tokens.resize(b.logits_indices.size());
        for (size_t i = 0; i < tokens.size(); ++i) {
            const int32_t row = b.logits_indices[i];
            tokens[i] = sim_token(b.token_ids[(size_t)row], b.positions[(size_t)row], V);
        }
    }
    // As a BlockCopier (lab/swap.hpp): a block crosses the link as
    // 2 x n_layers copies (its K and its V, layer by layer: vLLM V0's way,
    // cost_model.hpp section 4b), priced with the next step.
    void copy_out(const BlockSlotPairs& pairs) override {
        pending_swap_.out_copies += (double)pairs.size() * copies_per_block();
        pending_swap_.out_bytes += (double)pairs.size() * (double)geo_.bytes_per_block();
    }
    void copy_in(const BlockSlotPairs& pairs) override {
        pending_swap_.in_copies += (double)pairs.size() * copies_per_block();
        pending_swap_.in_bytes += (double)pairs.size() * (double)geo_.bytes_per_block();
    }
    uint64_t bytes_per_block() const override { return geo_.bytes_per_block(); }
    double copies_per_block() const { return 2.0 * cfg_.model.shape.n_layers; }
    // The modelled seconds of every step since the last call (what the clock
    // was moved by), for a caller that keeps its own account (sim_fidelity).
    double take_modelled_seconds() {
        const double s = modelled_s_;
        modelled_s_ = 0;
        return s;
    }
    // The last step's cost, by phase.
    const StepCost& last_step() const { return last_; }

    // The token that follows `last` at `position`: splitmix64 of the two,
    // never one of the special ids 0..2.
    static int32_t sim_token(int32_t last, int position, int vocab) {
        uint64_t s = (uint64_t)(uint32_t)last * 0x9e3779b97f4a7c15ull + (uint64_t)position + 1;
        return 3 + (int32_t)(splitmix64(s) % (uint64_t)std::max(1, vocab - 3));
    }

private:
    SimConfig cfg_;
    KVGeometry geo_;
    std::vector<StepItem> items_;  // [num_seqs] this step's composition
    SwapTraffic pending_swap_;  // the swaps copied since the last step, priced with the next
    double modelled_s_ = 0;
    StepCost last_;
    VirtualClock* clock_ = nullptr;
};

// ============================================================================
// 2. The `cpu` preset: this machine, measured
// ============================================================================
//
// To compare the model with reality we need a machine we can run: this CPU,
// with the project's own forward pass on one thread (so that the measurement
// does not depend on how many cores happen to be free). We calibrate the
// roofline of cost_model.hpp section 4 on the engine's own code path -- a
// CpuForward with FastCpuMath over a paged KV cache, then the argmax of each logits row, as
// ModelRunner::forward_argmax does -- with small synthetic batches chosen so
// that each cost shows up alone.
//
// What a CPU step is made of, and which term of step_cost() pays for it:
//   linear      2 FLOPs per parameter per token at the rate our dot() reaches
//               on the model's own layer matrices (peak_flops).
//   weights     reading every weight once per step. On a GPU this is the
//               memory side of the roofline, and it *overlaps* with the
//               FLOPs: a step takes the larger of the two. On this CPU it
//               does not: the matmul walks the weights row by row and each output
//               waits for its row's loads, so the read time *adds* to the
//               compute time. We see it in the intercept of the step time
//               against the batch size (below), together with the other fixed
//               costs of a forward pass; the calibration also times one
//               streaming read of the weights alone, so a reader can compare.
//               step_cost() has max(), not a sum, so we charge the read as a
//               fixed cost per step (step_overhead_s), and set memory_bw so
//               that the max() picks the FLOPs from one token on: the read is
//               already paid, it must not be paid twice.
//   fixed       the rest of what a forward pass costs whatever its size
//               (seven matmul calls per layer, scratch bookkeeping) lands in
//               the same intercept; and the engine's own per-step work
//               (scheduling, building the batch, streaming tokens) comes on
//               top, measured by the caller, who runs an Engine
//               (lab/sim_fidelity does).
//   attention   paged_attention_cpu (lab/fast_cpu.hpp), which --device cpu
//               runs: the reference's two passes, bit for bit, with each
//               cache row located once, but still one query at a time, with
//               no reuse of a K/V vector between the queries of a prefill.
//               Its cost is per (query, key) pair: compute-bound, at
//               attn_peak_flops. A chunk of n tokens ending at position e
//               pays for n * e - n * (n - 1) / 2 pairs, so on the CPU long
//               prefills and recomputes are dominated by it.
//   per token   what a token costs beyond its FLOPs and its keys: the
//               embedding copy, two RMSNorms and two residual adds per layer,
//               RoPE (a pow, a cos and a sin per pair of q and k), the K/V
//               store, SiLU (an exp per hidden unit), and attention's per-head
//               setup: per_token_s.
//   per logit   the classifier row is FLOPs like any other. The argmax over
//               the vocabulary that follows it is not: a compare and a
//               data-dependent branch per entry, a sizeable fraction of the
//               row's cost for a small model, and the final RMSNorm rides
//               along. We measure the whole per-row cost, and what the FLOPs
//               do not cover (logit_extra_s) becomes CostParams::per_logit_s.
//   swap        a memcpy between the cache and a host array (pcie_bw).
// Every rate is achieved, not a datasheet peak, so the efficiencies are 1.
//
// The measurements, each the median over rounds:
//   sweep      T single-token sequences at position 0, no logits, for
//              T = 1, 2, 4, ..., 64: t(T) = fixed + T * token, a line we fit
//              with least relative error (so that T = 1 counts as much as
//              T = 64); token = layer FLOPs + per token + one key;
//   layers     the layer matmuls alone at T = 16 and T = 64, on buffers laid
//              out as CpuForward's: peak_flops from the slope (the
//              difference removes their own read time);
//   per logit  (64 sequences with logits - the same without) / 64;
//   per key    (8 decodes at position 255 - the same at position 0) / (8 x 255);
//   read       one streaming read of the weights step_cost() counts;
//   copy       a memcpy of the cache's K half.
// The two halves of each difference run back to back in the same round, so
// that a slow moment of the machine cancels. Then
//   per_token = token - 2 x layer parameters / peak_flops - per key.
// The line's largest residual is reported: if t(T) is not a line, the
// roofline's structure does not fit this CPU and the rest is suspect.
//
// What no choice of these numbers can express: one rate per phase. The CPU's
// rates move with where the data sits -- attention per key is a little
// cheaper when a step's K/V fit in the core's own cache, and its speed even
// depends on where the cache's buffer starts within a page (sim_fidelity
// pins the allocator so that calibration and engine get the same layout) --
// and a step's first touch of freshly grown scratch memory is not in the
// model at all. lab/sim_fidelity shows how much each costs.
//
// Timing: every figure is this thread's CPU time (CLOCK_THREAD_CPUTIME_ID).
// On a machine shared with other work the wall clock also counts the time
// the OS gave our core to someone else, which says nothing about the engine;
// the thread's CPU time does not (what it cannot remove is a neighbour
// evicting our data from a shared cache). On an idle machine the two agree.
// The calibration takes a second or so at the default 15 rounds, on fixed
// batches and a KV cache filled with fixed pseudo-random values: what it
// measures is deterministic, only the timings vary.

// This thread's CPU time in seconds (POSIX clock_gettime; <ctime>, which
// <chrono> brings in, declares it).
inline double thread_cpu_seconds() {
    timespec ts{};
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

// The median (the upper one for an even count); 0 for no samples.
inline double median_seconds(std::vector<double> v) {
    if (v.empty()) return 0.0;
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

// y = a + b x fitted to points (x_i, y_i > 0) with the least *relative*
// error: minimise sum ((a + b x_i - y_i) / y_i)^2, i.e. weights 1 / y_i^2.
// An ordinary least-squares line would follow the largest y and could miss
// the small ones by a factor; relative weights make the intercept (the fixed
// cost, visible only at small x) as trustworthy as the slope. An intercept
// that noise drives below zero is refitted as 0: a negative fixed cost would
// make tiny steps cheaper than free.
struct LineFit {
    double a = 0, b = 0;
    double max_rel_residual = 0;  // max over the points of |a + b x_i - y_i| / y_i
};
inline LineFit fit_line_relative(const std::vector<double>& x, const std::vector<double>& y) {
    double s = 0, sx = 0, sxx = 0, sy = 0, sxy = 0;
    for (size_t i = 0; i < x.size(); ++i) {
        const double w = 1.0 / (y[i] * y[i]);
        s += w; sx += w * x[i]; sxx += w * x[i] * x[i]; sy += w * y[i]; sxy += w * x[i] * y[i];
    }
    LineFit f;
    const double det = s * sxx - sx * sx;
    if (det > 0) {
        f.a = (sy * sxx - sx * sxy) / det;
        f.b = (s * sxy - sx * sy) / det;
    }
    if (det <= 0 || f.a < 0) {
        f.a = 0;
        f.b = sxx > 0 ? sxy / sxx : 0;
    }
    for (size_t i = 0; i < x.size(); ++i) f.max_rel_residual = std::max(f.max_rel_residual, std::fabs(f.a + f.b * x[i] - y[i]) / y[i]);
    return f;
}

// The preset, and the measurements it came from (seconds of thread CPU
// time, medians), so that a program can show its reader where each number
// comes from -- and can combine several calibrations (see
// combine_calibrations) before deriving the preset once.
struct CpuCalibration {
    // Measured.
    std::vector<int> sweep_tokens;      // the T of the sweep ...
    std::vector<double> sweep_seconds;  // ... and t(T)
    double layers_t16_s = 0, layers_t64_s = 0;  // the layer matmuls alone, 16 and 64 tokens
    double logit_s = 0;            // one more logits row: classifier row, final norm, argmax
    double attn_s_per_key = 0;     // one more (query, key) pair
    double weights_read_s = 0;     // one streaming read of the weights step_cost() counts
    double copy_s = 0;             // one memcpy of copy_bytes (the cache's K half)
    double copy_bytes = 0;
    double engine_overhead_s = 0;  // the engine's own per-step work, as the caller measured it
    double elapsed_s = 0;          // wall seconds the calibration took
    // Derived (derive_cpu_preset).
    double forward_fixed_s = 0;    // a forward pass whatever its size: the line's intercept
    double token_s = 0;            // one more single-token sequence (no logits, one key): the line's slope
    double fit_max_residual = 0;   // how far the line misses its points, relative
    double logit_extra_s = 0;      // logit_s beyond the row's FLOPs at peak_flops: charged as per_logit_s
    double read_bw = 0;            // the weights' streaming read as bytes/s (memory_bw is at least this)
    Hardware hw;
    CostParams cost;
};

// The preset from the measurements: the line, then every rate. One function,
// so that a single calibration and a combination of several are turned into
// parameters the same way.
inline void derive_cpu_preset(const Model& m, CpuCalibration& cal) {
    const Config& c = m.cfg;
    // The line t(T) = fixed + T x token.
    const std::vector<double> xs(cal.sweep_tokens.begin(), cal.sweep_tokens.end());
    const LineFit fit = fit_line_relative(xs, cal.sweep_seconds);
    cal.forward_fixed_s = fit.a;
    cal.token_s = fit.b;
    cal.fit_max_residual = fit.max_rel_residual;

    const double lp = layer_params(c), cp = classifier_params(c), weight_bytes = 4.0;  // f32 checkpoints
    const double per_key_flops = 4.0 * c.n_heads * c.head_dim() * c.n_layers;       // as step_cost() counts them
    // A difference of two timings can come out <= 0 on a machine this noisy;
    // a floor keeps every rate finite (and a printout shows the nonsense).
    constexpr double kFloor = 1e-12;
    cal.hw.name = "cpu";
    // The GEMM rate: 48 more tokens through every layer matrix, over the
    // time they added. Taking the slope, not one timing, leaves out the
    // matmuls' own read of the weights, which the fixed cost already holds.
    cal.hw.peak_flops = 2.0 * lp * (64 - 16) / std::max(kFloor, cal.layers_t64_s - cal.layers_t16_s);
    // Attention's rate, in the FLOPs step_cost() counts per (query, key).
    cal.hw.attn_peak_flops = per_key_flops / std::max(kFloor, cal.attn_s_per_key);
    cal.read_bw = (lp + cp) * weight_bytes / std::max(kFloor, cal.weights_read_s);
    // One token's FLOPs per weight byte are 2 / weight_bytes, so at
    // peak_flops x weight_bytes / 2 bytes/s reading the weights takes
    // exactly as long as computing one token: at that bandwidth or above the
    // max() picks the FLOPs for every batch. The read itself is charged in
    // the fixed cost. (Attention's K/V bytes meet the same bandwidth; at a
    // few KB per key against a microsecond of scalar arithmetic they never
    // bind on the CPU either.)
    cal.hw.memory_bw = std::max(cal.read_bw, cal.hw.peak_flops * weight_bytes / 2.0);
    cal.hw.pcie_bw = cal.copy_bytes / std::max(kFloor, cal.copy_s);
    cal.hw.memory_bytes = (double)host_memory_bytes();
    cal.hw.source = "measured on this machine: the model's own CPU forward pass, one thread";
    cal.cost.bw_efficiency = cal.cost.flops_efficiency = cal.cost.attn_flops_efficiency = 1.0;
    // What the slope per token leaves once its layer FLOPs and its one key
    // are paid. With peak_flops taken from the layers alone this is the
    // non-GEMM work listed above; if it ever comes out negative, the layer
    // matmuls ran faster inside the forward pass than alone, and the sum per
    // token is still the measured one.
    cal.cost.per_token_s = cal.token_s - 2.0 * lp / cal.hw.peak_flops - cal.attn_s_per_key;
    cal.cost.step_overhead_s = cal.engine_overhead_s + cal.forward_fixed_s;
    cal.cost.swap_stalls = true;  // the CPU runner copies before the forward pass, on the same thread
    cal.logit_extra_s = cal.logit_s - 2.0 * cp / cal.hw.peak_flops;
    cal.cost.per_logit_s = std::max(0.0, cal.logit_extra_s);
}

inline CpuCalibration calibrate_cpu(const Model& m, double engine_overhead_s = 0.0, int repeats = 15) {
    if (repeats < 1) throw std::invalid_argument("calibrate_cpu: repeats must be at least 1");
    const auto wall0 = std::chrono::steady_clock::now();
    const Config& c = m.cfg;
    const int V = c.vocab_size, D = c.dim, KV = c.kv_dim(), H = c.hidden_dim, bs = 16;
    // Up to 64 single-token sequences of one block each, and 8 sequences of
    // 256 positions (16 blocks each) for attention, each in blocks of its
    // own, as distinct requests are in the engine.
    constexpr int kMaxT = 64, kAttnSeqs = 8, kAttnPos = 255;
    const int attn_blocks = (kAttnPos + bs) / bs;
    const int num_blocks = kMaxT + kAttnSeqs * attn_blocks;
    if (c.seq_len <= kAttnPos) throw std::invalid_argument("calibrate_cpu: the model's context is shorter than 256 positions");
    KVCache cache(KVGeometry{c.n_layers, num_blocks, bs, c.n_kv_heads, c.head_dim(), KVDtype::kF32});
    uint64_t rng = 0x5eed;
    auto uniform = [&rng]() { return (float)((double)(splitmix64(rng) >> 11) * (2.0 / 9007199254740992.0) - 1.0); };
    // Fixed pseudo-random K/V in [-1, 1): attention computes with values of
    // a realistic size, the same ones every time.
    std::vector<float> vec((size_t)c.head_dim());
    for (int l = 0; l < c.n_layers; ++l)
        for (const KVView& view : {cache.k_view(l), cache.v_view(l)})
            for (int64_t slot = 0; slot < (int64_t)num_blocks * bs; ++slot)
                for (int h = 0; h < c.n_kv_heads; ++h) {
                    for (float& e : vec) e = uniform();
                    kv_store(view, slot, h, vec.data());
                }

    FastCpuMath fast;  // what --device cpu runs (examples/devices.hpp)
    CpuForward fwd(m, cache, fast);
    std::vector<float> logits;
    std::vector<int32_t> tokens;
    // One forward pass and the argmax of its logits rows: the work of
    // CpuRunner::forward_argmax, which the engine calls for greedy batches.
    auto timed = [&](const ForwardBatch& b) {
        const double t0 = thread_cpu_seconds();
        fwd.forward(b, logits);
        tokens.resize(b.logits_indices.size());
        for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = argmax(logits.data() + i * (size_t)V, V);
        return thread_cpu_seconds() - t0;
    };
    // T sequences of one token each, at position 0 (one key each), in blocks
    // 0..T-1; the token ids vary so that the embedding rows do too.
    auto singles = [&](int T, bool want_logits) {
        ForwardBatch b;
        for (int s = 0; s < T; ++s) {
            const int32_t tok = 3 + s % std::max(1, V - 3);
            b.add_sequence({s}, bs, &tok, 0, 1, want_logits);
        }
        return b;
    };
    // kAttnSeqs sequences decoding one token at `pos`, each over its own blocks.
    auto decodes = [&](int pos) {
        ForwardBatch b;
        for (int s = 0; s < kAttnSeqs; ++s) {
            std::vector<int32_t> table((size_t)attn_blocks);
            for (int i = 0; i < attn_blocks; ++i) table[(size_t)i] = kMaxT + s * attn_blocks + i;
            const int32_t tok = 3 + s % std::max(1, V - 3);
            b.add_sequence(table, bs, &tok, pos, 1, false);
        }
        return b;
    };
    const std::vector<int> sweep = {1, 2, 4, 8, 16, 32, kMaxT};
    std::vector<ForwardBatch> sweep_b;
    for (int T : sweep) sweep_b.push_back(singles(T, false));
    const ForwardBatch with_logits = singles(kMaxT, true), attn_long = decodes(kAttnPos), attn_short = decodes(0);

    // The layer matmuls alone, as CpuForward::forward calls them, on
    // buffers of its shapes (each its own allocation, [T, n]) holding values
    // of a realistic size. Same-sized buffers that all start on a page
    // boundary can make loads and stores alias in the CPU's store buffer and
    // run much slower than the forward pass does: separate, differently sized
    // vectors, as the forward's own, avoid measuring that.
    const Weights& w = m.w;
    std::vector<float> xb((size_t)kMaxT * D), hb((size_t)kMaxT * H), q((size_t)kMaxT * D), k((size_t)kMaxT * KV),
        v((size_t)kMaxT * KV), att((size_t)kMaxT * D), h1((size_t)kMaxT * H), h3((size_t)kMaxT * H);
    for (float& e : xb) e = uniform();
    for (float& e : hb) e = uniform();
    auto layers = [&](int T) {
        const double t0 = thread_cpu_seconds();
        for (int l = 0; l < c.n_layers; ++l) {
            matmul_fast(q.data(), xb.data(), &w.wq[(size_t)l * D * D], T, D, D);
            matmul_fast(k.data(), xb.data(), &w.wk[(size_t)l * KV * D], T, D, KV);
            matmul_fast(v.data(), xb.data(), &w.wv[(size_t)l * KV * D], T, D, KV);
            matmul_fast(att.data(), xb.data(), &w.wo[(size_t)l * D * D], T, D, D);
            matmul_fast(h1.data(), xb.data(), &w.w1[(size_t)l * H * D], T, D, H);
            matmul_fast(h3.data(), xb.data(), &w.w3[(size_t)l * H * D], T, D, H);
            matmul_fast(att.data(), hb.data(), &w.w2[(size_t)l * D * H], T, H, D);
        }
        return thread_cpu_seconds() - t0;
    };

    // The weights step_cost() counts as linear_bytes (every layer matrix and
    // the classifier), read as 64-bit words with four independent XOR chains:
    // a loop that retires more bytes per cycle than any cache delivers, so it
    // times the reads and not itself (a float sum would be bound by the
    // latency of its adds). memcpy is the legal way to look at a float's bits.
    const std::vector<std::pair<const float*, size_t>> arrays = {
        {w.wq.data(), w.wq.size()}, {w.wk.data(), w.wk.size()}, {w.wv.data(), w.wv.size()}, {w.wo.data(), w.wo.size()},
        {w.w1.data(), w.w1.size()}, {w.w2.data(), w.w2.size()}, {w.w3.data(), w.w3.size()},
        {m.classifier(), (size_t)V * D}};
    volatile uint64_t read_sink = 0;  // the result goes somewhere, so the reads cannot be optimised away
    auto read_weights = [&]() {
        const double t0 = thread_cpu_seconds();
        uint64_t a0 = 0, a1 = 0, a2 = 0, a3 = 0;
        for (const auto& [p, n] : arrays) {
            const unsigned char* bytes = reinterpret_cast<const unsigned char*>(p);
            const unsigned char* end = bytes + n * sizeof(float) / 32 * 32;
            for (; bytes < end; bytes += 32) {
                uint64_t x0, x1, x2, x3;  // four plain 8-byte loads
                std::memcpy(&x0, bytes, 8); std::memcpy(&x1, bytes + 8, 8);
                std::memcpy(&x2, bytes + 16, 8); std::memcpy(&x3, bytes + 24, 8);
                a0 ^= x0; a1 ^= x1; a2 ^= x2; a3 ^= x3;
            }
        }
        read_sink = a0 ^ a1 ^ a2 ^ a3;
        return thread_cpu_seconds() - t0;
    };
    // A swap copy on the CPU runner is a memcpy of whole blocks; we time one
    // over the K half of the cache.
    std::vector<std::byte> host(cache.k.size());
    auto copy_cache = [&]() {
        const double t0 = thread_cpu_seconds();
        std::copy_n(cache.k.data(), cache.k.size(), host.data());
        return thread_cpu_seconds() - t0;
    };

    // Warm-up: the largest batch first sizes CpuForward's scratch, then one
    // of each, so that no round pays for a first touch.
    timed(with_logits);
    for (const ForwardBatch& b : sweep_b) timed(b);
    timed(attn_long);
    timed(attn_short);
    layers(kMaxT);
    read_weights();
    copy_cache();

    // The rounds: every measurement once per round, the pairs back to back.
    std::vector<std::vector<double>> sweep_t(sweep.size());
    std::vector<double> l16, l64, per_logit, per_key, reads, copies;
    for (int r = 0; r < repeats; ++r) {
        for (size_t i = 0; i < sweep.size(); ++i) sweep_t[i].push_back(timed(sweep_b[i]));
        const double with = timed(with_logits), without = timed(sweep_b.back());
        per_logit.push_back((with - without) / kMaxT);
        const double long_ = timed(attn_long), short_ = timed(attn_short);
        per_key.push_back((long_ - short_) / ((double)kAttnSeqs * kAttnPos));
        l16.push_back(layers(16));
        l64.push_back(layers(kMaxT));
        reads.push_back(read_weights());
        copies.push_back(copy_cache());
    }

    CpuCalibration cal;
    cal.sweep_tokens = sweep;
    for (const std::vector<double>& t : sweep_t) cal.sweep_seconds.push_back(median_seconds(t));
    cal.layers_t16_s = median_seconds(l16);
    cal.layers_t64_s = median_seconds(l64);
    cal.logit_s = median_seconds(per_logit);
    cal.attn_s_per_key = median_seconds(per_key);
    cal.weights_read_s = median_seconds(reads);
    cal.copy_s = median_seconds(copies);
    cal.copy_bytes = (double)cache.k.size();
    cal.engine_overhead_s = engine_overhead_s;
    derive_cpu_preset(m, cal);
    cal.elapsed_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - wall0).count();
    return cal;
}

// Several calibrations made at different moments (a program can calibrate
// again before each of its real runs, so that the preset describes the
// machine as those runs found it), as one: the median of each measurement,
// then the preset derived once. A calibration that caught the machine in a
// slow second is outvoted instead of setting every rate.
inline CpuCalibration combine_calibrations(const Model& m, const std::vector<CpuCalibration>& cals) {
    if (cals.empty()) throw std::invalid_argument("combine_calibrations: no calibration");
    CpuCalibration out = cals.front();
    auto median_of = [&](double CpuCalibration::*field) {
        std::vector<double> v;
        for (const CpuCalibration& c : cals) v.push_back(c.*field);
        return median_seconds(v);
    };
    for (size_t i = 0; i < out.sweep_seconds.size(); ++i) {
        std::vector<double> v;
        for (const CpuCalibration& c : cals) v.push_back(c.sweep_seconds.at(i));
        out.sweep_seconds[i] = median_seconds(v);
    }
    // (A named pointer-to-member type: nvcc's host compiler reads the bare
    // declarator in a range-for as parenthesised and warns.)
    using Field = double CpuCalibration::*;
    for (Field f : {&CpuCalibration::layers_t16_s, &CpuCalibration::layers_t64_s, &CpuCalibration::logit_s,
                                      &CpuCalibration::attn_s_per_key, &CpuCalibration::weights_read_s, &CpuCalibration::copy_s,
                                      &CpuCalibration::engine_overhead_s})
        out.*f = median_of(f);
    out.elapsed_s = 0;
    for (const CpuCalibration& c : cals) out.elapsed_s += c.elapsed_s;
    derive_cpu_preset(m, out);
    return out;
}

// The engine's own per-step work, measured after the calibration (a caller
// that runs an Engine to find it needs the preset first): it joins the
// forward pass's fixed cost in step_overhead_s.
inline void set_engine_overhead(const Model& m, CpuCalibration& cal, double engine_overhead_s) {
    cal.engine_overhead_s = engine_overhead_s;
    derive_cpu_preset(m, cal);
}

// The `cpu` preset for a model we hold the weights of, from a calibration
// already made (a program that prints the measurements keeps them) ...
inline SimConfig cpu_sim_config(const Model& m, const std::string& name, const CpuCalibration& cal) {
    SimConfig s;
    s.model = ModelSpec{name, m.cfg, 4, 4, "the model's own f32 checkpoint"};
    s.hw = cal.hw;
    s.cost = cal.cost;
    return s;
}
// ... or measured now, with the engine's per-step overhead as the caller
// knows it (0: only the forward pass's own fixed cost is charged per step).
inline SimConfig cpu_sim_config(const Model& m, const std::string& name, double engine_overhead_s = 0.0) {
    return cpu_sim_config(m, name, calibrate_cpu(m, engine_overhead_s));
}

}  // namespace pkv

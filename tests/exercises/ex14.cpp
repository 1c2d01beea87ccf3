// tests/exercises/ex14.cpp -- grades exercise 14, "lab L6: the cost of a
// step" (lab/cost_model.hpp: step_cost), a lab exercise: lab/LAB.md chapter
// L6, the simulated GPU.
//
// Every expected number is worked out here by hand, from the model's shape
// and the hardware's datasheet numbers, the way cost_model.hpp's section 5
// works a Llama-3-8B decode step on an H200; step_cost must land on it.
//
//   - section 5's decode step: 64 requests at 1025 tokens of context, phase by
//     phase (bytes, FLOPs, seconds, which bound applies), 7.15 ms in all;
//   - a 2048-token prefill: compute-bound in both phases, and attention counts
//     the causal pairs n e - n (n - 1) / 2, not n e;
//   - a mixed batch on a small made-up model and GPU, every field to the last
//     byte and FLOP;
//   - the classifier's weights are read once, and only when some row wants
//     logits; its FLOPs scale with the number of logits rows;
//   - attention runs at the hardware's own attention peak when it has one;
//   - the overheads: per step, per token and per logits row;
//   - swap: copies stall the step, or hide behind its compute and cost only
//     what sticks out; a step with copies alone costs the copies alone;
//   - weights and KV of one and of four bytes (FP8/INT8, FP32), not only
//     BF16's two: bytes scale with them, and a phase may turn compute-bound.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "lab/cost_model.hpp"

// doctest last, after every header with an exercise region (main.cpp says why).
#include <doctest/doctest.h>

using namespace pkv;

namespace {

bool near(double got, double want, double rel = 1e-9) { return std::fabs(got - want) <= rel * std::fabs(want); }

const ModelSpec& preset_model(const std::string& name) { return find_preset(model_presets(), name, "model"); }
Hardware preset_hw(const std::string& gpu) {
    const GpuSpec& g = find_preset(gpu_presets(), gpu, "gpu");
    return hardware_of(g, find_preset(pcie_presets(), g.pcie, "pcie"));
}

// A made-up model with small round numbers: dim 64, SwiGLU 128, 2 layers,
// 4 query heads over 2 kv heads (head_dim 16), vocabulary 100, 2-byte
// weights and KV. Per layer: q and o 64 x 64 (4096 each), k and v 32 x 64
// (2048 each), three MLP matrices 128 x 64 (8192 each): 36,864; both layers
// 73,728. Classifier 100 x 64 = 6,400. K and V of one token, both layers:
// 2 x 2 x 2 x 16 x 2 bytes = 256. One (query, key) pair: 4 x 4 heads x 16 x
// 2 layers = 512 FLOPs.
ModelSpec small_model() {
    ModelSpec m;
    m.name = "small";
    m.shape.dim = 64;
    m.shape.hidden_dim = 128;
    m.shape.n_layers = 2;
    m.shape.n_heads = 4;
    m.shape.n_kv_heads = 2;
    m.shape.vocab_size = 100;
    m.shape.seq_len = 1024;
    m.shape.shared_classifier = false;
    m.weight_bytes = 2;
    m.kv_bytes = 2;
    return m;
}
constexpr double kSmallLayerParams = 73728, kSmallClassifier = 6400, kSmallKvPerToken = 256, kSmallPairFlops = 512;

// A made-up GPU: 1 GB/s, 10 GFLOP/s, a 100 MB/s link.
Hardware small_hw() {
    Hardware h;
    h.name = "small";
    h.memory_bw = 1e9;
    h.peak_flops = 1e10;
    h.pcie_bw = 1e8;
    return h;
}
CostParams small_params() {
    CostParams p;
    p.bw_efficiency = 0.5;          // 0.5 GB/s reached
    p.flops_efficiency = 0.5;       // 5 GFLOP/s for the GEMMs
    p.attn_flops_efficiency = 0.25;  // 2.5 GFLOP/s for attention
    p.step_overhead_s = 1e-3;
    return p;
}

// A decode at context 10 (1 token, 10 keys), a whole 5-token prompt
// (1 + 2 + 3 + 4 + 5 = 15 pairs) and a 3-token chunk ending at 20
// (18 + 19 + 20 = 57 pairs): 9 tokens, 82 pairs, 2 logits rows.
const std::vector<StepItem> kMixed = {{1, 10}, {5, 5}, {3, 20}};

}  // namespace

// cost_model.hpp section 5, by hand: 218,103,808 parameters per layer
// (2 x 4096^2 + 2 x 1024 x 4096 + 3 x 14336 x 4096), 32 layers; the
// classifier 128256 x 4096; 131,072 bytes of K/V per token; 4 x 32 x 128 x
// 32 FLOPs per (query, key) pair; 64 requests reading 1025 tokens and writing 1.
TEST_CASE("the worked Llama 3 8B decode step on an H200") {
    const double layers = 32.0 * 218103808.0, cls = 128256.0 * 4096.0;
    const double lin_bytes = (layers + cls) * 2, lin_flops = 2 * layers * 64 + 2 * cls * 64;
    const double attn_bytes = 131072.0 * 1026 * 64, attn_flops = 4.0 * 32 * 128 * 32 * 1025 * 64;
    const double lin_mem = lin_bytes / (4.8e12 * 0.8), lin_cmp = lin_flops / (989e12 * 0.6);
    const double attn_mem = attn_bytes / (4.8e12 * 0.8), attn_cmp = attn_flops / (989e12 * 0.4);
    const StepCost s = step_cost(preset_model("llama-3-8b"), preset_hw("h200"), CostParams{},
                                 std::vector<StepItem>(64, StepItem{1, 1025}), 64, 0.0);
    CHECK(near(s.linear_bytes, lin_bytes));
    CHECK(near(s.linear_flops, lin_flops));
    CHECK(near(s.linear_s, lin_mem));
    CHECK(s.linear_memory_bound);
    CHECK(lin_cmp < lin_mem);
    CHECK(near(s.attention_bytes, attn_bytes));
    CHECK(near(s.attention_flops, attn_flops));
    CHECK(near(s.attention_s, attn_mem));
    CHECK(s.attention_memory_bound);
    CHECK(attn_cmp < attn_mem);
    CHECK(s.overhead_s == 1e-3);
    CHECK(s.swap_s == 0.0);
    CHECK(near(s.total_s, 1e-3 + lin_mem + attn_mem));
    // Section 5's rounded figures.
    CHECK(near(s.linear_s, 3.909e-3, 1e-3));
    CHECK(near(s.attention_s, 2.241e-3, 1e-3));
    CHECK(near(s.total_s, 7.150e-3, 1e-3));
}

// One 2048-token prompt computed in one step, one logits row. Query i
// (0-based) sees i + 1 keys: 2048 x 2049 / 2 = 2,098,176 pairs, which is
// n e - n (n - 1) / 2 with n = e = 2048 (and about half of n e).
TEST_CASE("a long prefill is compute bound and counts only causal pairs") {
    const double layers = 32.0 * 218103808.0, cls = 128256.0 * 4096.0;
    const double pairs = 2048.0 * 2049.0 / 2.0;
    const double lin_flops = 2 * layers * 2048 + 2 * cls * 1;
    const double attn_flops = 4.0 * 32 * 128 * 32 * pairs, attn_bytes = 131072.0 * (2048 + 2048);
    const StepCost s = step_cost(preset_model("llama-3-8b"), preset_hw("h200"), CostParams{}, {{2048, 2048}}, 1, 0.0);
    CHECK(near(s.linear_flops, lin_flops));
    CHECK_FALSE(s.linear_memory_bound);
    CHECK(near(s.linear_s, lin_flops / (989e12 * 0.6)));
    CHECK(near(s.attention_flops, attn_flops));
    CHECK(near(s.attention_bytes, attn_bytes));
    CHECK_FALSE(s.attention_memory_bound);
    CHECK(near(s.attention_s, attn_flops / (989e12 * 0.4)));
    CHECK(near(s.total_s, 1e-3 + lin_flops / (989e12 * 0.6) + attn_flops / (989e12 * 0.4)));
}

// kMixed on the small model and GPU:
//   linear  bytes (73,728 + 6,400) x 2 = 160,256 -> 3.20512e-4 s at 0.5 GB/s
//           FLOPs 2 x 73,728 x 9 + 2 x 6,400 x 2 = 1,352,704 -> 2.705408e-4 s at 5 GFLOP/s
//           memory-bound
//   attn    bytes 256 x (11 + 10 + 23) = 11,264 -> 2.2528e-5 s
//           FLOPs 512 x 82 = 41,984 -> 1.67936e-5 s at 2.5 GFLOP/s
//           memory-bound
//   total   1e-3 + 3.20512e-4 + 2.2528e-5 = 1.34304e-3 s
TEST_CASE("a mixed batch on a small model worked to the last byte") {
    const StepCost s = step_cost(small_model(), small_hw(), small_params(), kMixed, 2, 0.0);
    CHECK(near(s.linear_bytes, 160256.0, 1e-12));
    CHECK(near(s.linear_flops, 1352704.0, 1e-12));
    CHECK(near(s.linear_s, 3.20512e-4));
    CHECK(s.linear_memory_bound);
    CHECK(near(s.attention_bytes, 11264.0, 1e-12));
    CHECK(near(s.attention_flops, 41984.0, 1e-12));
    CHECK(near(s.attention_s, 2.2528e-5));
    CHECK(s.attention_memory_bound);
    CHECK(near(s.overhead_s, 1e-3));
    CHECK(s.swap_s == 0.0);
    CHECK(near(s.total_s, 1.34304e-3));
    // The same sums from the constants above, for the record.
    CHECK(near(s.linear_bytes, (kSmallLayerParams + kSmallClassifier) * 2, 1e-12));
    CHECK(near(s.attention_bytes, kSmallKvPerToken * 44, 1e-12));
    CHECK(near(s.attention_flops, kSmallPairFlops * 82, 1e-12));
}

// A 4-token chunk in the middle of a prompt samples nothing: the classifier
// is neither read nor multiplied. With 3 logits rows it is read once and
// multiplied 3 times.
TEST_CASE("the classifier is read only when a row wants logits") {
    const std::vector<StepItem> chunk = {{4, 12}};
    const StepCost none = step_cost(small_model(), small_hw(), small_params(), chunk, 0, 0.0);
    CHECK(near(none.linear_bytes, 73728.0 * 2, 1e-12));
    CHECK(near(none.linear_flops, 2.0 * 73728 * 4, 1e-12));
    const StepCost three = step_cost(small_model(), small_hw(), small_params(), chunk, 3, 0.0);
    CHECK(near(three.linear_bytes, (73728.0 + 6400) * 2, 1e-12));
    CHECK(near(three.linear_flops, 2.0 * 73728 * 4 + 2.0 * 6400 * 3, 1e-12));
    // Attention does not care about logits: 4 x 12 - 6 = 42 pairs either way.
    CHECK(near(none.attention_flops, 512.0 * 42, 1e-12));
    CHECK(near(three.attention_flops, none.attention_flops, 1e-12));
    CHECK(near(none.attention_bytes, 256.0 * 16, 1e-12));
}

// Hardware with a separate attention peak of 1 GFLOP/s (x 0.25): kMixed's
// 41,984 attention FLOPs now take 1.67936e-4 s, more than its 2.2528e-5 s of
// memory, so attention turns compute-bound. The linear phase is untouched.
TEST_CASE("attention runs at its own peak when the hardware names one") {
    Hardware hw = small_hw();
    hw.attn_peak_flops = 1e9;
    const StepCost s = step_cost(small_model(), hw, small_params(), kMixed, 2, 0.0);
    CHECK_FALSE(s.attention_memory_bound);
    CHECK(near(s.attention_s, 1.67936e-4));
    CHECK(near(s.linear_s, 3.20512e-4));
    CHECK(near(s.total_s, 1e-3 + 3.20512e-4 + 1.67936e-4));
}

// 0.5 ms per step, 10 us per token, 2 us per logits row: kMixed (9 tokens,
// 2 rows) pays 0.5 + 0.09 + 0.004 ms.
TEST_CASE("overheads per step per token and per logits row") {
    CostParams p = small_params();
    p.step_overhead_s = 5e-4;
    p.per_token_s = 1e-5;
    p.per_logit_s = 2e-6;
    const StepCost s = step_cost(small_model(), small_hw(), p, kMixed, 2, 0.0);
    CHECK(near(s.overhead_s, 5.94e-4));
    CHECK(near(s.total_s, 5.94e-4 + 3.20512e-4 + 2.2528e-5));
}

// kMixed computes for 3.4304e-4 s. 100,000 bytes over 100 MB/s take 1 ms:
// stalled, all of it is added; overlapped, only 1e-3 - 3.4304e-4 = 6.5696e-4
// s sticks out. 10,000 bytes (0.1 ms) hide completely. A step that only
// copies (nothing to compute) costs the copy, and no step overhead.
TEST_CASE("swap copies stall the step or hide behind compute") {
    CostParams stall = small_params();
    stall.swap_stalls = true;
    CostParams overlap = small_params();
    overlap.swap_stalls = false;
    const double compute = 3.20512e-4 + 2.2528e-5;
    const StepCost s = step_cost(small_model(), small_hw(), stall, kMixed, 2, 1e5);
    CHECK(near(s.swap_s, 1e-3));
    CHECK(near(s.total_s, 1e-3 + compute + 1e-3));
    const StepCost o = step_cost(small_model(), small_hw(), overlap, kMixed, 2, 1e5);
    CHECK(near(o.swap_s, 1e-3 - compute));
    CHECK(near(o.total_s, 1e-3 + compute + (1e-3 - compute)));
    CHECK(near(o.linear_s, s.linear_s, 1e-12));
    const StepCost hidden = step_cost(small_model(), small_hw(), overlap, kMixed, 2, 1e4);
    CHECK(hidden.swap_s == 0.0);
    CHECK(near(hidden.total_s, 1e-3 + compute));
    CHECK(near(step_cost(small_model(), small_hw(), stall, kMixed, 2, 1e4).swap_s, 1e-4));
    for (const CostParams& p : {stall, overlap}) {
        const StepCost only = step_cost(small_model(), small_hw(), p, {}, 0, 1e5);
        CHECK(only.overhead_s == 0.0);
        CHECK(near(only.swap_s, 1e-3));
        CHECK(near(only.total_s, 1e-3));
    }
}

// kMixed on the small model with 1-byte and 4-byte weights and KV (the
// checks above use 2). Linear bytes 80,128 x w: at 1 byte 1.60256e-4 s of
// memory against 2.705408e-4 s of FLOPs, compute-bound; at 4 bytes
// 6.41024e-4 s, memory-bound. K and V of one token: 128 x kv bytes, 44
// tokens' worth: at 1 byte 5,632 bytes, 1.1264e-5 s against 1.67936e-5 s of
// FLOPs, compute-bound; at 4 bytes 22,528, 4.5056e-5 s, memory-bound.
TEST_CASE("one and four byte weights and KV scale the bytes read") {
    for (int bytes : {1, 4}) {
        CAPTURE(bytes);
        ModelSpec m = small_model();
        m.weight_bytes = bytes;
        m.kv_bytes = bytes;
        const StepCost s = step_cost(m, small_hw(), small_params(), kMixed, 2, 0.0);
        CHECK(near(s.linear_bytes, 80128.0 * bytes, 1e-12));
        CHECK(near(s.linear_flops, 1352704.0, 1e-12));
        CHECK(near(s.attention_bytes, 128.0 * bytes * 44, 1e-12));
        CHECK(near(s.attention_flops, 41984.0, 1e-12));
        CHECK(s.linear_memory_bound == (bytes == 4));
        CHECK(s.attention_memory_bound == (bytes == 4));
        CHECK(near(s.linear_s, bytes == 1 ? 2.705408e-4 : 6.41024e-4));
        CHECK(near(s.attention_s, bytes == 1 ? 1.67936e-5 : 4.5056e-5));
        CHECK(near(s.total_s, 1e-3 + s.linear_s + s.attention_s));
    }
}

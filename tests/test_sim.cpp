// tests/test_sim.cpp -- the simulated GPU (lab/LAB.md chapter L6:
// lab/cost_model.hpp and lab/sim_runner.hpp).
//
// What we prove: the roofline of cost_model.hpp gives the very numbers its
// section 5 works out by hand for a Llama-3-8B decode step on an H200; the KV
// pool follows vLLM's rule, recomputed here from that rule alone; a model too
// big for its GPU is refused with a message naming both; swap costs PCIe time
// (all of it when copies stall, only what exceeds compute when they overlap);
// a simulated run is deterministic to the last event, preempted or not, and
// its tokens do not depend on preemption; at production scale (tens of
// thousands of blocks, thousands of steps, prefix caching and swap) the pool
// and the swap space stay consistent after every step; and every latency is
// in simulated seconds, equal to what the cost model says a step takes.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "lab/cost_model.hpp"
#include "engine.hpp"
#include "examples/workload.hpp"
#include "lab/traffic.hpp"
#include "lab/sim_engine.hpp"
#include "lab/sim_runner.hpp"
#include "tests/test_util.hpp"

using namespace pkv;

namespace {

// The sanitizer build runs the production-scale test on fewer requests.
using pkv_test::kSanitized;  // tests/test_util.hpp

// |a - b| <= rel * |b|: the relative tolerance the hand-worked numbers are
// checked with (they are printed to 4 significant digits).
bool near_rel(double a, double b, double rel = 1e-3) { return std::fabs(a - b) <= rel * std::fabs(b); }

const ModelSpec& model_preset(const std::string& name) { return find_preset(model_presets(), name, "model preset"); }

// The worked example's batch: `n` requests, each decoding one token with
// 1024 tokens of context before it.
std::vector<StepItem> decode_batch(int n, int context_end = 1025) { return std::vector<StepItem>((size_t)n, StepItem{1, context_end}); }

// One event, as a client (plus the lanes) would see it.
struct Ev {
    EventType type;
    int id;
    double time;
    int token, output_index;
    FinishReason reason;
    bool operator==(const Ev&) const = default;
};

// How a simulated engine is built and fed (the same recipe as
// lab/sim_scale.cpp): the engine knobs every program uses
// (workload::EngineKnobs), with a simulated GPU's defaults.
struct SimSetup : workload::EngineKnobs {
    SimSetup() {
        max_num_seqs = 256;
        max_num_batched_tokens = 8192;
        num_blocks = 0;  // 0 = vLLM's rule (the pool the GPU holds); else exactly this many
    }
    std::string gpu = "h200", model = "llama-3-8b";
    bool check_every_step = false;  // Engine::check_invariants() after every step
    int max_steps = 200000;
};

struct SimResult {
    std::vector<Ev> events;
    Metrics metrics;
    SwapStats swap;                             // the swap policy's counters (lab/swap.hpp)
    std::vector<std::vector<int32_t>> outputs;  // [request] output tokens
    std::vector<FinishReason> reasons;          // [request]
    std::vector<int> prompt_lens;               // [request]
    std::vector<int32_t> prompt_last;           // [request] the prompt's last token
    std::vector<int> max_tokens;                // [request]
    int num_blocks = 0, max_model_len = 0, vocab = 0, steps = 0;
    double sim_seconds = 0;
};

// Runs `traffic` on a simulated engine: each request is added once the
// virtual clock reaches its arrival time (between steps), and an idle engine
// jumps the clock to the next arrival.
SimResult run_sim(const study::Traffic& traffic, const SimSetup& s) {
    VirtualClock clock;
    const std::unique_ptr<Engine> engine = study::make_sim_engine(sim_config(s.gpu, s.model), s, &clock);
    Engine& eng = *engine;

    SimResult r;
    r.num_blocks = eng.config().num_blocks;
    r.max_model_len = eng.config().sched.max_model_len;
    r.vocab = eng.model().vocab_size;
    eng.on_event = [&](const StreamEvent& e) {
        r.events.push_back({e.type, e.request_id, e.time, e.token, e.output_index, e.reason});
    };
    const std::vector<study::PlannedRequest> plan = study::plan_traffic(traffic, r.vocab);
    size_t next = 0;
    while (next < plan.size() || eng.has_unfinished()) {
        while (next < plan.size() && clock.t >= plan[next].arrival_s) {
            const int id = eng.add_request(plan[next].prompt, plan[next].params);
            REQUIRE(id == (int)next);
            REQUIRE_MESSAGE(!eng.request(id)->finished(), "request " << id << " rejected: " << eng.request(id)->reject_reason);
            ++next;
        }
        if (!eng.has_unfinished()) {
            clock.t = plan[next].arrival_s;  // idle: nothing happens until the next arrival
            continue;
        }
        eng.step();
        ++r.steps;
        if (s.check_every_step) {
            const std::string inv = eng.check_invariants();
            REQUIRE_MESSAGE(inv.empty(), "step " << r.steps << ": " << inv);
        }
        REQUIRE(r.steps < s.max_steps);
    }
    for (size_t i = 0; i < plan.size(); ++i) {
        const Request* q = eng.request((int)i);
        r.outputs.emplace_back(q->tokens.begin() + q->num_prompt_tokens, q->tokens.end());
        r.reasons.push_back(q->finish_reason);
        r.prompt_lens.push_back(q->num_prompt_tokens);
        r.prompt_last.push_back(q->tokens[(size_t)q->num_prompt_tokens - 1]);
        r.max_tokens.push_back(q->params.max_tokens);
    }
    r.metrics = eng.metrics();
    r.swap = pkv_test::swap_stats(eng);
    r.sim_seconds = clock.t;
    // Nothing leaks: every block and every swap slot is free again.
    CHECK(eng.pool().num_free_blocks() == r.num_blocks);
    CHECK(pkv_test::swap_slots_in_use(eng.scheduler()) == 0);
    CHECK(eng.check_invariants() == "");
    return r;
}

// Chat-like traffic (ShareGPT means) with Poisson arrivals.
study::Traffic poisson_chat(int requests, double rate, int max_prompt, int max_output, uint64_t seed) {
    study::Traffic t = study::chat_like(requests, max_prompt, max_output);
    t.arrivals.kind = study::Arrivals::Kind::kPoisson;
    t.arrivals.rate = rate;
    t.seed = seed;
    return t;
}

long sum_outputs(const SimResult& r) {
    long n = 0;
    for (const auto& o : r.outputs) n += (long)o.size();
    return n;
}

}  // namespace

TEST_SUITE("sim") {

// Proves every impossible number of a simulated GPU, a model or the cost
// parameters is refused where it comes in, naming the field -- never a clock
// at inf, or stuck at 0 for hundreds of steps, or a pool larger than the GPU:
// zero or NaN or negative bandwidth, FLOPs and efficiencies, a zero link when
// something is copied, an infinite step overhead, memory utilization 2.0, a
// model without KV bytes (kv_pool_size divided by 0), a vocabulary of 3 (no
// token left that is not special).
TEST_CASE("impossible simulated hardware, models and costs are refused, naming the field") {
    const SimConfig good = sim_config("h200", "llama-3-8b");
    CHECK_NOTHROW(SimRunner{good});
    auto refused = [](SimConfig sc, const std::string& field) {
        INFO(field);
        CHECK_THROWS_WITH_AS(SimRunner{sc}, doctest::Contains(field.c_str()), std::invalid_argument);
    };
    const double nan = std::numeric_limits<double>::quiet_NaN(), inf = std::numeric_limits<double>::infinity();
    for (double bad : {0.0, -1.0, nan, inf}) {
        CAPTURE(bad);
        SimConfig a = good; a.hw.memory_bw = bad; refused(a, "memory_bw");
        SimConfig b = good; b.hw.peak_flops = bad; refused(b, "peak_flops");
        SimConfig c = good; c.hw.pcie_bw = bad; refused(c, "pcie_bw");
        SimConfig d = good; d.hw.memory_bytes = bad; refused(d, "memory_bytes");
        SimConfig e = good; e.cost.bw_efficiency = bad; refused(e, "bw_efficiency");
        SimConfig f = good; f.cost.flops_efficiency = bad; refused(f, "flops_efficiency");
        SimConfig g = good; g.cost.attn_flops_efficiency = bad; refused(g, "attn_flops_efficiency");
        SimConfig h = good; h.memory_utilization = bad; refused(h, "gpu_memory_utilization");
    }
    SimConfig over = good; over.memory_utilization = 2.0; refused(over, "gpu_memory_utilization");
    SimConfig slow = good; slow.cost.step_overhead_s = inf; refused(slow, "step_overhead_s");
    SimConfig neg = good; neg.cost.per_token_s = -1e-6; refused(neg, "per_token_s");
    SimConfig eff = good; eff.cost.bw_efficiency = 1.5; refused(eff, "bw_efficiency");
    SimConfig nokv = good; nokv.model.kv_bytes = 0; refused(nokv, "kv_bytes");
    SimConfig vocab = good; vocab.model.shape.vocab_size = 3; refused(vocab, "vocab_size must be >= 4");
    // kv_pool_size alone: a model that stores nothing per token.
    ModelSpec m = good.model;
    m.kv_bytes = 0;
    CHECK_THROWS_WITH_AS(kv_pool_size(m, 141e9, 0.9, 16, 8192, 256), doctest::Contains("no KV bytes"), std::invalid_argument);
    CHECK_THROWS_AS(kv_pool_size(good.model, 141e9, 2.0, 16, 8192, 256), std::invalid_argument);
    // step_cost, handed a zero bandwidth directly (the study code calls it so).
    Hardware hw = good.hw;
    hw.memory_bw = 0;
    CHECK_THROWS_WITH_AS(step_cost(good.model, hw, good.cost, {{1, 10}}, 1, 0.0), doctest::Contains("memory_bw"), std::invalid_argument);
    hw = good.hw;
    hw.pcie_bw = 0;  // no link: fine until something is copied
    CHECK(std::isfinite(step_cost(good.model, hw, good.cost, {{1, 10}}, 1, 0.0).total_s));
    CHECK_THROWS_WITH_AS(step_cost(good.model, hw, good.cost, {{1, 10}}, 1, 4096.0), doctest::Contains("pcie_bw"), std::invalid_argument);
    // A vocabulary of exactly 4: every simulated token is 3, never a special id.
    for (int i = 0; i < 50; ++i) CHECK(SimRunner::sim_token(7, i, 4) == 3);
}

// Proves step_cost reproduces cost_model.hpp section 5's hand-worked Llama-3-8B decode step on an H200, phase by phase, and the model sizes it rests on.
TEST_CASE("the worked H200 decode step of cost_model.hpp section 5") {
    const ModelSpec& m = model_preset("llama-3-8b");
    const SimConfig sc = sim_config("h200", "llama-3-8b");
    // Sizes: 218.10M linear parameters per layer x 32, 8.03B in all (the
    // model card's number), 128 KiB of K and V per token.
    CHECK(near_rel(layer_params(m.shape), 6.979e9));
    CHECK(layer_params(m.shape) == 32.0 * 218103808.0);
    CHECK(near_rel(total_params(m.shape), 8.03e9));
    CHECK(kv_bytes_per_token(m) == 131072.0);
    // Llama-2-7B: 32 KV heads instead of 8 (MHA, not GQA), so exactly 4x the KV bytes.
    CHECK(kv_bytes_per_token(model_preset("llama-2-7b")) == 4.0 * kv_bytes_per_token(m));

    const CostParams p;  // the defaults section 5 uses
    const StepCost s = step_cost(m, sc.hw, p, decode_batch(64), 64, 0.0);
    CHECK(near_rel(s.linear_bytes, 15.01e9));
    CHECK(near_rel(s.linear_flops, 960.6e9));
    CHECK(near_rel(s.linear_s, 3.909e-3));
    CHECK(s.linear_memory_bound);
    CHECK(near_rel(s.attention_bytes, 8.607e9));
    CHECK(near_rel(s.attention_flops, 34.39e9));
    CHECK(near_rel(s.attention_s, 2.241e-3));
    CHECK(s.attention_memory_bound);
    CHECK(s.overhead_s == 1e-3);
    CHECK(s.swap_s == 0.0);
    CHECK(near_rel(s.total_s, 7.150e-3));
    // The same step at batch 1: 1 + 3.909 + 0.035 ms.
    const StepCost one = step_cost(m, sc.hw, p, decode_batch(1), 1, 0.0);
    CHECK(near_rel(one.total_s, 4.94e-3));
    CHECK(near_rel(one.linear_s, s.linear_s, 1e-12));  // the weights cost the same at any decode batch
    CHECK(one.linear_memory_bound);
}

// Proves the KV pool is vLLM's rule (utilization x memory - weights - activation reserve, in whole blocks), recomputed here from the rule, and that the engine builds exactly that pool.
TEST_CASE("KV pool sizing follows vLLM's rule") {
    const ModelSpec& m = model_preset("llama-3-8b");
    const GpuSpec& g = find_preset(gpu_presets(), "h200", "GPU preset");
    const KVPoolSize k = kv_pool_size(m, g.memory_bytes, 0.9, 16, 8192, 256);
    // The rule, written out: weights are every parameter in BF16; the reserve
    // is 1 GiB + one chunk's hidden states (BF16) + one logits row per sequence (f32).
    const double weights = 8030261248.0 * 2;  // total parameters of Llama-3-8B, BF16
    CHECK(near_rel(total_params(m.shape), 8030261248.0, 1e-9));
    const double reserve = 1024.0 * 1024 * 1024 + 8192.0 * (4 * 4096 + 2 * 14336) * 2 + 256.0 * 128256 * 4;
    // The H200's capacity is what the device reports: 143,771 MiB.
    CHECK(g.memory_bytes == 143771.0 * 1048576.0);
    const double budget = 0.9 * 143771.0 * 1048576.0 - weights - reserve;
    const int64_t blocks = (int64_t)std::floor(budget / (16.0 * 131072));
    CHECK(near_rel(k.weight_bytes, weights, 1e-9));
    CHECK(near_rel(k.reserve_bytes, reserve, 1e-9));
    CHECK(near_rel(k.kv_budget_bytes, budget, 1e-9));
    CHECK(k.block_bytes == 2097152.0);
    CHECK(k.num_blocks == blocks);
    CHECK(k.num_blocks > 10000);  // tens of thousands
    CHECK(k.num_blocks < 100000);
    // The engine turns SimRunner's byte budget into the same pool.
    VirtualClock clock;
    const std::unique_ptr<Engine> engine = study::make_sim_engine(sim_config("h200", "llama-3-8b"), SimSetup(), &clock);
    Engine& eng = *engine;
    CHECK(eng.config().num_blocks == blocks);
    CHECK(eng.geometry().bytes_per_block() == 2097152u);
    CHECK(eng.config().sched.max_model_len == 8192);  // the model's context: the pool holds it many times over
    // A lower utilization gives a smaller pool, by exactly the memory taken away.
    const KVPoolSize half = kv_pool_size(m, g.memory_bytes, 0.5, 16, 8192, 256);
    CHECK(near_rel(k.kv_budget_bytes - half.kv_budget_bytes, 0.4 * g.memory_bytes, 1e-9));
}

// Proves a model whose weights exceed utilization x memory is refused at SimRunner construction with std::invalid_argument naming the model and the GPU.
TEST_CASE("a model that does not fit its GPU is refused, by name") {
    // Llama-3-8B's weights are 16.06 GB in BF16; half of an L4's 24 GB is 12 GB.
    SimConfig sc = sim_config("l4", "llama-3-8b");
    sc.memory_utilization = 0.5;
    CHECK(total_params(sc.model.shape) * sc.model.weight_bytes > 0.5 * sc.hw.memory_bytes);
    std::string msg;
    try {
        SimRunner r(sc);
    } catch (const std::invalid_argument& e) {
        msg = e.what();
    }
    CAPTURE(msg);
    CHECK(msg.find("llama-3-8b") != std::string::npos);
    CHECK(msg.find("l4") != std::string::npos);
    // At 0.9 (21.6 GB) the weights fit, and a small pool is left.
    sc.memory_utilization = 0.9;
    SimRunner fits(sc);
    CHECK(fits.memory_for_kv_cache() > 0);
    CHECK(fits.memory_for_kv_cache() < 6e9);
    // Unknown presets name the known ones.
    CHECK_THROWS_AS(sim_config("h300", "llama-3-8b"), std::invalid_argument);
    CHECK_THROWS_WITH_AS(sim_config("h200", "llama-4"), doctest::Contains("llama-3-8b"), std::invalid_argument);
}

// Proves swap copies cost bytes / PCIe bandwidth on top of compute when they stall the step, and only the part exceeding compute when they overlap it.
TEST_CASE("swap cost: stalled or overlapped with compute") {
    const ModelSpec& m = model_preset("llama-3-8b");
    const SimConfig sc = sim_config("h200", "llama-3-8b");
    REQUIRE(sc.hw.pcie_bw == 50e9);  // the H200's own link: PCIe Gen5
    CostParams stall;
    stall.swap_stalls = true;
    CostParams overlap = stall;
    overlap.swap_stalls = false;
    const StepCost none = step_cost(m, sc.hw, stall, decode_batch(64), 64, 0.0);
    const double compute = none.linear_s + none.attention_s;
    for (double bytes : {1e8, 1e9}) {  // 2 ms: less than compute (6.15 ms); 20 ms: more
        CAPTURE(bytes);
        const double t = bytes / 50e9;
        const StepCost s = step_cost(m, sc.hw, stall, decode_batch(64), 64, bytes);
        CHECK(near_rel(s.swap_s, t, 1e-12));
        CHECK(near_rel(s.total_s, none.total_s + t, 1e-12));
        const StepCost o = step_cost(m, sc.hw, overlap, decode_batch(64), 64, bytes);
        const double extra = std::max(0.0, t - compute);
        CHECK(o.swap_s == doctest::Approx(extra).epsilon(1e-12));
        CHECK(o.total_s == doctest::Approx(none.total_s + extra).epsilon(1e-12));
        // The compute phases do not change either way.
        CHECK(o.linear_s == none.linear_s);
        CHECK(o.attention_s == none.attention_s);
    }
    CHECK(step_cost(m, sc.hw, overlap, decode_batch(64), 64, 1e8).swap_s == 0.0);  // hidden under compute entirely
    // A step with copies and no tokens is the copies alone, whatever the mode.
    const StepCost only = step_cost(m, sc.hw, overlap, {}, 0, 1e9);
    CHECK(only.overhead_s == 0.0);
    CHECK(near_rel(only.total_s, 0.02, 1e-12));
    CHECK(near_rel(step_cost(m, sc.hw, stall, {}, 0, 1e9).total_s, 0.02, 1e-12));
}

// Proves the simulated GPU's swap price (cost_model.hpp section 4b): a block
// of Llama-3-8B crosses the link as 2 x 32 copies of 5 us each plus its bytes
// at what the other traffic leaves of the link; both directions are paid;
// when copies stall the step (vLLM V0) the step waits for all of them,
// otherwise swap-outs hide behind compute but swap-ins never do; and an FP8
// model's GEMMs run at the GPU's FP8 rate (attention at BF16).
TEST_CASE("swap cost: per-copy overhead, both directions, background traffic, swap-ins stall") {
    const SimConfig sc = sim_config("a100-80g", "llama-3-8b");
    REQUIRE(sc.hw.pcie_bw == 25e9);
    REQUIRE(sc.hw.copy_overhead_s == 5e-6);
    SimRunner r(sc);
    CHECK(r.copies_per_block() == 64.0);
    const double block = 2097152.0;  // 16 tokens x 128 KiB
    // One block: 64 calls (320 us) + 2 MiB at 25 GB/s (83.9 us).
    CHECK(near_rel(swap_seconds(sc.hw, 64, block), 64 * 5e-6 + block / 25e9, 1e-12));
    Hardware busy = sc.hw;
    busy.pcie_background = 0.5;  // half the link taken: the bytes take twice as long, the calls the same
    CHECK(near_rel(swap_seconds(busy, 64, block), 64 * 5e-6 + block / 12.5e9, 1e-12));
    CHECK(swap_seconds(sc.hw, 0, 0) == 0.0);
    CHECK_THROWS_AS(swap_seconds(sc.hw, -1, block), std::invalid_argument);
    SwapTraffic t;
    t.out_copies = t.in_copies = 64 * 10;
    t.out_bytes = t.in_bytes = 10 * block;
    const double one_way = swap_seconds(sc.hw, 640, 10 * block);
    CostParams stall, overlap;
    stall.swap_stalls = true;
    overlap.swap_stalls = false;
    CHECK(near_rel(swap_stall_seconds(sc.hw, stall, t, 1e-3), 2 * one_way, 1e-12));  // both ways, on the step's stream
    CHECK(near_rel(swap_stall_seconds(sc.hw, overlap, t, 1.0), one_way, 1e-12));     // outs hidden under 1 s of compute; ins wait
    CHECK(near_rel(swap_stall_seconds(sc.hw, overlap, t, 1e-3), one_way + (one_way - 1e-3), 1e-12));
    SwapTraffic in_only;
    in_only.in_copies = 64;
    in_only.in_bytes = block;
    CHECK(swap_stall_seconds(sc.hw, overlap, in_only, 10.0) > 0.0);  // a swap-in never hides
    // The door: a background share of 1 would leave no link.
    SimConfig bad = sc;
    bad.hw.pcie_background = 1.0;
    CHECK_THROWS_WITH_AS(SimRunner{bad}, doctest::Contains("pcie_background"), std::invalid_argument);
    // FP8 weights on Hopper: the GEMMs at the FP8 rate; on an A100 (no FP8 units) at BF16.
    const SimConfig h = sim_config("h100", "llama-3.1-8b-fp8"), a = sim_config("a100-80g", "llama-3.1-8b-fp8");
    CHECK(h.hw.peak_flops == 1979e12);
    CHECK(h.hw.attn_peak_flops == 989e12);
    CHECK(a.hw.peak_flops == 312e12);
}

// Proves a simulated run is deterministic to the last event (type, id, time, token, output index), with recompute and with swap preemptions, and that its tokens depend only on the sequence (the token before, its position): identical between an ample pool and a pressured one.
TEST_CASE("sim runs are deterministic, and preemption does not change tokens") {
    const study::Traffic t = poisson_chat(120, 60.0, 1024, 768, 5);
    SimSetup ample;
    ample.max_num_seqs = 64;
    ample.max_num_batched_tokens = 2048;
    SimSetup tight = ample;
    tight.num_blocks = 240;  // 3,840 token slots for up to 64 growing sequences: the pool runs dry
    SimSetup swap = tight;
    swap.policy.preemption = Preemption::kSwap;
    swap.swap_space_blocks = 40;  // room for some victims, not all: swaps and fallbacks
    SimSetup cached = swap;
    cached.prefix_caching = true;

    const SimResult a = run_sim(t, ample);
    CHECK(a.num_blocks > 10000);
    CHECK(a.metrics.num_preemptions_total == 0);
    for (const SimSetup* s : {&tight, &swap, &cached}) {
        const std::string mode = to_string(s->policy.preemption);
        CAPTURE(mode);
        CAPTURE(s->prefix_caching);
        const SimResult r1 = run_sim(t, *s), r2 = run_sim(t, *s);
        CHECK(r1.num_blocks == 240);
        CHECK(r1.events.size() > 20000);  // every token of 120 requests, and the preemptions
        CHECK(r1.metrics.num_preemptions_total > 0);
        if (s->policy.preemption == Preemption::kSwap) {
            CHECK(r1.swap.num_swap_outs > 0);
            CHECK(r1.swap.num_swap_fallbacks > 0);
            CHECK(r1.swap.bytes_out > 0);
        }
        // The same run twice: the very same event stream, times included.
        REQUIRE(r1.events.size() == r2.events.size());
        size_t first_diff = r1.events.size();
        for (size_t i = 0; i < r1.events.size() && first_diff == r1.events.size(); ++i)
            if (!(r1.events[i] == r2.events[i])) first_diff = i;
        CHECK_MESSAGE(first_diff == r1.events.size(), "event streams differ at event " << first_diff);
        CHECK(r1.sim_seconds == r2.sim_seconds);
        CHECK(r1.steps == r2.steps);
        // Preemption makes the run slower, never different in content.
        CHECK(r1.outputs == a.outputs);
        CHECK(r1.sim_seconds > a.sim_seconds);
    }
    // Tokens are SimRunner::sim_token(the token before, its position), never
    // a special id (0..2), and every request ran to its max_tokens.
    int min_token = a.vocab;
    for (size_t i = 0; i < a.outputs.size(); ++i) {
        CHECK(a.reasons[i] == FinishReason::kMaxTokens);
        for (size_t k = 0; k < a.outputs[i].size(); ++k) {
            min_token = std::min(min_token, (int)a.outputs[i][k]);
            const int32_t before = k == 0 ? a.prompt_last[i] : a.outputs[i][k - 1];
            if (a.outputs[i][k] != SimRunner::sim_token(before, a.prompt_lens[i] - 1 + (int)k, a.vocab)) {
                FAIL_CHECK("request " << i << " output " << k << " is not sim_token(the token before, its position)");
                break;
            }
        }
    }
    CHECK(min_token >= 3);
    CHECK(sum_outputs(a) == a.metrics.generation_tokens_total);
}

// Proves that at production scale (Llama-3-8B on an H200, the real pool of tens of thousands of blocks, thousands of steps of Poisson traffic with prefix caching and swap) the pool and swap space are consistent after every step, every request finishes by a length limit, and the metrics add up.
TEST_CASE("production scale: invariants after every step") {
    // Long chat turns (RAG-sized prompts, lognormal like chat_like's), half
    // of them behind one 200-token system prompt, arriving far faster than
    // the GPU serves them: admission fills the ~830k-token pool to the brim,
    // growth then runs it dry, and victims are swapped to a host space that
    // holds only some of them (the rest are recomputed). max_model_len 4096
    // cuts the longest requests short. About 1,400 steps (1,200 under the
    // sanitizers), each followed by a full invariant check: O(blocks), so
    // this is the slow test of the suite (a few seconds at -O2).
    const int n = kSanitized ? 600 : 800;
    study::Traffic t;
    t.requests = n;
    t.arrivals.kind = study::Arrivals::Kind::kPoisson;
    t.arrivals.rate = 800.0;
    t.prompt = study::LengthDist::lognormal(2000, 0.6, 2, 4000);
    t.output = study::LengthDist::lognormal(500, 1.0, 1, 1000);
    t.shared_prefix_fraction = 0.5;
    t.shared_prefix_len = 200;
    t.seed = 11;
    SimSetup s;
    s.max_num_seqs = 512;
    s.max_num_batched_tokens = 8192;
    s.max_model_len = 4096;
    s.prefix_caching = true;
    s.policy.preemption = Preemption::kSwap;
    s.swap_space_blocks = 120;  // 240 MiB: one long victim, or a few short ones
    s.check_every_step = true;
    const SimResult r = run_sim(t, s);
    INFO("production scale: " << r.num_blocks << " blocks, " << n << " requests, " << r.steps << " steps, "
                                 << r.sim_seconds << " simulated s, " << r.metrics.num_preemptions_total << " preemptions ("
                                 << r.swap.num_swap_outs << " swapped, " << r.swap.num_swap_fallbacks << " recomputed), peak KV "
                                 << r.metrics.max_kv_cache_usage_perc);
    CHECK(r.num_blocks > 10000);
    CHECK(r.steps > 1000);
    const Metrics& m = r.metrics;
    CHECK(m.num_requests_finished == n);
    CHECK(m.num_requests_rejected + m.num_requests_aborted + m.num_requests_failed == 0);
    CHECK(m.num_preemptions_total > 0);
    const SwapStats& sw = r.swap;
    CHECK(sw.num_swap_outs > 0);
    CHECK(sw.num_swap_ins == sw.num_swap_outs);
    CHECK(sw.bytes_in == sw.bytes_out);
    CHECK(sw.num_swap_fallbacks > 0);
    CHECK(m.recomputed_tokens_total > 0);
    CHECK(sw.num_swap_outs + sw.num_swap_fallbacks <= m.num_preemptions_total);
    CHECK(m.prefix_cache_hits > 0);
    CHECK(m.max_kv_cache_usage_perc > 0.9);
    int by_length = 0;
    for (size_t i = 0; i < r.outputs.size(); ++i) {
        const int out = (int)r.outputs[i].size(), total = r.prompt_lens[i] + out;
        const bool ok = (r.reasons[i] == FinishReason::kMaxTokens && out == r.max_tokens[i]) ||
                        (r.reasons[i] == FinishReason::kMaxModelLen && total == r.max_model_len && out < r.max_tokens[i]);
        CHECK_MESSAGE(ok, "request " << i << " finished " << to_string(r.reasons[i]) << " with " << total << " tokens");
        by_length += r.reasons[i] == FinishReason::kMaxModelLen;
    }
    CHECK(by_length > 0);  // the workload really reaches max_model_len
    CHECK(m.generation_tokens_total == sum_outputs(r));
    CHECK((long)m.time_to_first_token.count() == n);
    CHECK((long)m.inter_token_latency.count() == m.generation_tokens_total - n);
    CHECK((long)m.e2e_request_latency.count() == n);
}

// Proves the virtual clock advances by exactly step_cost of each step's batch, and that TTFT and ITL are simulated seconds: every TTFT is the one prefill step, ITL p50 the modelled decode step.
TEST_CASE("simulated time is the cost model's time") {
    // 32 requests of 128 prompt tokens arrive at once (4,096 tokens: one
    // prefill step), then decode 200 tokens each in lockstep.
    study::Traffic t;
    t.requests = 32;
    t.prompt = study::LengthDist::fixed(128);
    t.output = study::LengthDist::fixed(200);
    t.seed = 9;
    VirtualClock clock;
    const std::unique_ptr<Engine> engine = study::make_sim_engine(sim_config("h200", "llama-3-8b"), SimSetup(), &clock);
    Engine& eng = *engine;
    auto& sim = dynamic_cast<SimRunner&>(eng.runner());
    for (const auto& p : study::plan_traffic(t, eng.model().vocab_size)) eng.add_request(p.prompt, p.params);

    // Step 1: every prompt, in one step.
    std::vector<StepItem> prefill;
    for (int i = 0; i < 32; ++i) prefill.push_back({128, 128});
    const SimConfig& sc = sim.config();
    const double prefill_s = step_cost(sc.model, sc.hw, sc.cost, prefill, 32, 0).total_s;
    CHECK(eng.step() == 32 * 128);
    CHECK(clock.t == prefill_s);
    CHECK(sim.last_step().total_s == prefill_s);
    CHECK_FALSE(sim.last_step().linear_memory_bound);  // 4,096 tokens: compute-bound

    // Every later step is a decode of all 32: its cost, computed from the
    // requests' lengths before the step, is exactly the clock's advance.
    std::vector<double> decode_s;
    while (eng.has_unfinished()) {
        std::vector<StepItem> items;
        for (const Request* r : eng.scheduler().running()) {
            REQUIRE(r->num_computed_tokens == r->num_tokens() - 1);  // decode-only
            items.push_back({1, r->num_tokens()});
        }
        const StepCost expect = step_cost(sc.model, sc.hw, sc.cost, items, (int)items.size(), 0);
        const double before = clock.t;
        CHECK(eng.step() == (int)items.size());
        CHECK(sim.last_step().total_s == expect.total_s);
        CHECK(clock.t - before == doctest::Approx(expect.total_s).epsilon(1e-12));
        decode_s.push_back(clock.t - before);
    }
    REQUIRE(decode_s.size() == 199);
    const Metrics& m = eng.metrics();
    // Every request arrived at 0 and got its first token at the end of step 1.
    REQUIRE(m.time_to_first_token.count() == 32);
    for (double x : m.time_to_first_token.v) CHECK(x == prefill_s);
    // ITL is in simulated seconds: its median is the modelled decode step of
    // the median context (128 + 100 tokens), a few ms, not a wall-clock time.
    const double modelled = step_cost(sc.model, sc.hw, sc.cost, decode_batch(32, 228), 32, 0).total_s;
    const double p50 = m.inter_token_latency.percentile(50);
    CHECK(p50 == doctest::Approx(modelled).epsilon(0.03));
    CHECK(p50 > 4e-3);
    CHECK(p50 < 6e-3);
    double total = prefill_s;
    for (double d : decode_s) total += d;
    CHECK(clock.t == doctest::Approx(total).epsilon(1e-12));
    CHECK(m.e2e_request_latency.percentile(100) == clock.t);
}

// Proves the host's share of a step (cost_model.hpp section 4c) is paid as each profile says: work that is not overlapped adds to the GPU's step; overlapped work shows only where it outlasts the step; multi-step divides the per-step part; and SimRunner charges exactly that on top of the roofline.
TEST_CASE("host work: added, overlapped or spread over several steps") {
    HostProfile h{"t", 1e-3, 10e-6, false, false, 1, ""};
    CHECK(host_seconds(h, 100, 5e-3) == doctest::Approx(2e-3));  // 1 ms + 100 x 10 us, added
    h.seq_overlaps = true;  // vLLM V1: per-sequence work beside the engine loop
    CHECK(host_seconds(h, 100, 5e-3) == doctest::Approx(1e-3));   // hidden behind 5 ms + 1 ms
    CHECK(host_seconds(h, 1000, 5e-3) == doctest::Approx(1e-3 + (10e-3 - 6e-3)));  // 10 ms of it outlasts the 6 ms
    h.step_overlaps = true;  // TensorRT-LLM: all of it overlapped
    CHECK(host_seconds(h, 100, 5e-3) == 0.0);
    CHECK(host_seconds(h, 1000, 5e-3) == doctest::Approx(6e-3));  // 11 ms against a 5 ms step
    HostProfile multi{"m", 4e-3, 0, false, true, 10, ""};
    CHECK(host_seconds(multi, 64, 1e-3) == doctest::Approx(0.4e-3));
    multi.steps_per_schedule = 0;
    CHECK_THROWS_AS(host_seconds(multi, 1, 0), std::invalid_argument);
    // The profiles the anchors use: every engine's pair is the fitted one.
    for (const char* name : {"vllm", "vllm-multistep", "trtllm"}) {
        const HostProfile& p = find_preset(host_profiles(), name, "host profile");
        CHECK(p.per_step_s == kHostPerStepS);
        CHECK(p.per_seq_s == kHostPerSeqS);
    }
    CHECK(study_host_profile().name == "vllm");
    // SimRunner adds it to the step.
    SimConfig sc = sim_config("h200", "llama-3-8b");
    sc.host = find_preset(host_profiles(), "vllm", "host profile");
    SimRunner r(sc);
    r.init_kv_cache(KVGeometry{32, 64, 16, 8, 128, KVDtype::kF16});
    ForwardBatch b;
    for (int i = 0; i < 4; ++i) {
        const int32_t tok = 5;
        b.add_sequence({i}, 16, &tok, 3, 1, true);
    }
    std::vector<int32_t> out;
    r.forward_argmax(b, out);
    const StepCost gpu = step_cost(sc.model, sc.hw, sc.cost, decode_batch(4, 4), 4, 0.0);
    CHECK(r.last_step().host_s == doctest::Approx(host_seconds(sc.host, 4, gpu.total_s)));
    CHECK(r.last_step().total_s == doctest::Approx(gpu.total_s + r.last_step().host_s));
}

// Proves the swap crossover L* (cost_model.hpp section 4d) is where the two costs meet: below it recompute is cheaper, above it swap; it is larger on the slower link (fewer bytes a second), at 0 where recompute is dearer from the first block (an A100's FLOPs), and beyond Llama-3-8B's 8192-token context on an H200 -- why the preemption study needs the long-context preset.
TEST_CASE("the swap crossover length L*") {
    const ModelSpec& m = model_preset("llama-3.1-8b");
    const CostParams p;
    const SimConfig h200g5 = sim_config("h200", "llama-3.1-8b", "gen5"), h200g4 = sim_config("h200", "llama-3.1-8b", "gen4");
    const long g5 = swap_crossover_tokens(m, h200g5.hw, p, 16), g4 = swap_crossover_tokens(m, h200g4.hw, p, 16);
    CAPTURE(g5);
    CAPTURE(g4);
    REQUIRE(g5 > 0);
    CHECK(g4 > g5);
    CHECK(g5 % 16 == 0);
    CHECK(g5 > 8192);     // beyond Llama-3-8B's context
    CHECK(g4 < 131072);   // within Llama-3.1-8B's
    CHECK(recompute_seconds(m, h200g5.hw, p, g5 - 16.0) <= swap_roundtrip_seconds(m, h200g5.hw, g5 - 16.0, 16));
    CHECK(recompute_seconds(m, h200g5.hw, p, g5 + 16.0) > swap_roundtrip_seconds(m, h200g5.hw, g5 + 16.0, 16));
    // Swap's copies: 2 x 32 per 16-token block at 5 us, and the bytes both ways.
    CHECK(swap_roundtrip_seconds(m, h200g5.hw, 16, 16) == doctest::Approx(2 * (64 * 5e-6 + 16 * 131072.0 / 50e9)));
    // An A100-40GB computes slower: swap is cheaper from the first block.
    const SimConfig a100 = sim_config("a100-40g", "llama-3.1-8b");
    CHECK(swap_crossover_tokens(m, a100.hw, p, 16) == 0);
    // Larger blocks mean fewer copy calls: the crossover comes sooner.
    CHECK(swap_crossover_tokens(m, h200g5.hw, p, 256) < g5);
}

// Proves the presets the anchor rows need carry their sources' numbers: Qwen2.5-7B's KV is 57,344 bytes a token (vLLM #44594's "16 GiB -> 299,584 tokens"), OPT-13B's 800 KB (the vLLM paper's), Llama-3.3-70B is 70.6B parameters, and the GB200 runs FP8 at twice its BF16 rate.
TEST_CASE("the anchor rows' presets") {
    CHECK(kv_bytes_per_token(model_preset("qwen2.5-7b")) == 57344.0);
    CHECK(std::floor(16.0 * 1073741824.0 / 57344.0 / 16) * 16 == 299584.0);
    CHECK(kv_bytes_per_token(model_preset("opt-13b")) == 819200.0);
    CHECK(near_rel(total_params(model_preset("llama-3.3-70b-fp8").shape), 70.55e9, 2e-3));
    CHECK(near_rel(layer_params(model_preset("opt-13b").shape), 40 * 12.0 * 5120 * 5120, 1e-4));
    const SimConfig gb = sim_config("gb200", "qwen2.5-7b");
    CHECK(gb.hw.peak_flops == 2500e12);
    CHECK(sim_config("gb200", "llama-3.3-70b-fp8").hw.peak_flops == 5000e12);
    CHECK(gb.hw.pcie_bw == 360e9);
    for (const char* model : {"qwen2.5-7b", "llama-3.3-70b-fp8", "llama-3.1-8b", "opt-13b"}) CHECK_NOTHROW(validate(model_preset(model)));
}

// Proves build/sim_anchors --json has at least 26 published rows, each with its source and its set (fit or holdout), both sets present, at least 4 rows comparing preemptions, and the fit and holdout errors as numbers.
TEST_CASE("build/sim_anchors --json: rows, sources, fit and holdout") {
    const std::string exe = pkv_test::need_program("sim_anchors");
    if (exe.empty()) return;
    const auto result = pkv_test::run_command(pkv_test::shell_quote(exe) + " --json 2>&1");
    REQUIRE(result.second == 0);
    const std::string& out = result.first;  // (a lambda may not capture a structured binding in clang 14)
    auto count = [&](const std::string& needle) {
        size_t n = 0;
        for (size_t at = out.find(needle); at != std::string::npos; at = out.find(needle, at + 1)) ++n;
        return n;
    };
    const size_t rows = count("\"id\":");
    CHECK(rows >= 26);
    CHECK(count("\"source\":\"") == rows);
    CHECK(count("\"set\":\"fit\"") + count("\"set\":\"holdout\"") == rows);
    CHECK(count("\"set\":\"fit\"") > 0);
    CHECK(count("\"set\":\"holdout\"") > 0);
    CHECK(count("\"published_preemptions\":") >= 4);
    CHECK(count("\"error\":") == 0);  // every row ran
    for (const char* key : {"\"fit\":{\"rows\":", "\"holdout\":{\"rows\":", "\"median_abs_error\":", "\"max_abs_error\":"})
        CHECK(out.find(key) != std::string::npos);
}

}  // TEST_SUITE

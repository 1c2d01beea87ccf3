// tests/test_swap.cpp -- preemption by swap (lab/policies.hpp, Preemption::kSwap; lab/swap.hpp).
//
// What we prove: a swapped-out request comes back with its K/V intact
// (bit-identical tokens to a run that was never preempted), the fallback to
// recompute when the swap space is full changes nothing either, both modes can
// mix in one run, and neither the device block pool nor the host swap space
// leaks, after every single step.
#include <doctest/doctest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "engine.hpp"
#include "tests/test_util.hpp"

using namespace pkv;

namespace {

const Model& swap_model() { return pkv_test::small_engine_model(7); }  // tests/test_util.hpp

struct RunResult {
    std::vector<std::vector<int32_t>> tokens;  // [request] prompt + outputs
    Metrics metrics;
    SwapStats stats;  // the swap policy's counters (zero under recompute)
    int max_preemptions = 0;
    // Counted from the event stream, independently of the scheduler's own
    // counters: blocks a swapped victim held when it was preempted
    // (ceil(num_computed_tokens / block_size), its K/V kept for the copy).
    long blocks_seen_swapped = 0;
};

// Runs `n` requests (all arriving at once) and checks both pools after every step.
RunResult run(int num_blocks, Preemption mode, int swap_blocks, bool prefix_caching, float temperature, int n = 10,
              Device device = Device::kCpu, int max_tokens = 40) {
    EngineConfig ec;
    ec.num_blocks = num_blocks;
    ec.block_size = 4;
    ec.enable_prefix_caching = prefix_caching;
    ec.sched.max_num_seqs = 8;
    ec.sched.max_num_batched_tokens = 64;
    ec.log_interval_s = 0;
    StepClock clock;
    const auto engine = pkv_test::engine_with(ec, {.preemption = mode, .swap_space_blocks = swap_blocks}, pkv_test::runner(swap_model(), device), &clock);
    Engine& eng = *engine;
    long blocks_seen_swapped = 0;
    eng.on_event = [&](const StreamEvent& e) {
        const Request* v = eng.request(e.request_id);
        if (e.type == EventType::kPreempted && lab_policy(eng.scheduler()) && !lab_policy(eng.scheduler())->swap_slots(*v).empty())
            blocks_seen_swapped += (v->num_computed_tokens + ec.block_size - 1) / ec.block_size;
    };
    for (int i = 0; i < n; ++i) {
        std::vector<int32_t> prompt(6 + i % 5);
        for (size_t j = 0; j < prompt.size(); ++j) prompt[j] = (int32_t)((i * 7 + j * 3 + (j == 0 ? 0 : 5)) % 64);
        if (prefix_caching) prompt[1] = prompt[2] = prompt[3] = 9;  // a shared head to hit
        SamplingParams sp;
        sp.max_tokens = max_tokens;
        sp.temperature = temperature;
        sp.top_p = 0.9f;
        sp.seed = 1000 + i;
        sp.ignore_eos = true;
        eng.add_request(prompt, sp);
    }
    int steps = 0;
    while (eng.has_unfinished()) {
        eng.step();
        const std::string inv = eng.check_invariants();
        REQUIRE_MESSAGE(inv.empty(), "step " << steps << ": " << inv);
        REQUIRE(++steps < 5000);
    }
    RunResult r;
    for (int i = 0; i < n; ++i) {
        r.tokens.push_back(eng.request(i)->tokens);
        r.max_preemptions = std::max(r.max_preemptions, eng.request(i)->num_preemptions);
        CHECK(eng.request(i)->finish_reason == FinishReason::kMaxTokens);
    }
    r.metrics = eng.metrics();
    r.stats = pkv_test::swap_stats(eng);
    r.blocks_seen_swapped = blocks_seen_swapped;
    // Nothing leaks: every device block and every swap slot is free again.
    CHECK(eng.pool().num_free_blocks() == num_blocks);
    CHECK(pkv_test::swap_slots_in_use(eng.scheduler()) == 0);
    return r;
}

}  // namespace

TEST_SUITE("swap") {

// Swapped-out requests resume with their K/V copied back: tokens identical to
// an ample cache, nothing recomputed, every swap-out matched by a swap-in.
TEST_CASE("swap reproduces an unpreempted run bit for bit") {
    for (float temperature : {0.0f, 0.8f})
        for (bool pc : {false, true}) {
            CAPTURE(temperature);
            CAPTURE(pc);
            const RunResult ample = run(400, Preemption::kRecompute, 0, pc, temperature);
            CHECK(ample.metrics.num_preemptions_total == 0);
            const RunResult swapped = run(24, Preemption::kSwap, 200, pc, temperature);
            CHECK(swapped.metrics.num_preemptions_total > 0);
            CHECK(swapped.max_preemptions >= 2);
            CHECK(swapped.stats.num_swap_outs == swapped.metrics.num_preemptions_total);
            CHECK(swapped.stats.num_swap_ins == swapped.stats.num_swap_outs);
            CHECK(swapped.stats.num_swap_fallbacks == 0);
            CHECK(swapped.metrics.recomputed_tokens_total == 0);
            CHECK(swapped.stats.bytes_out > 0);
            CHECK(swapped.stats.bytes_in == swapped.stats.bytes_out);
            CHECK(swapped.tokens == ample.tokens);
        }
}

// A swap space too small for any victim: every preemption falls back to
// recompute, and the tokens are still identical.
TEST_CASE("a full swap space falls back to recompute") {
    const RunResult ample = run(400, Preemption::kRecompute, 0, false, 0.0f);
    const RunResult fb = run(24, Preemption::kSwap, 1, false, 0.0f);
    CHECK(fb.metrics.num_preemptions_total > 0);
    CHECK(fb.stats.num_swap_fallbacks == fb.metrics.num_preemptions_total - fb.stats.num_swap_outs);
    CHECK(fb.stats.num_swap_fallbacks > 0);
    CHECK(fb.metrics.recomputed_tokens_total > 0);
    CHECK(fb.tokens == ample.tokens);
}

// A swap space that fits some victims but not all: both modes in one run.
TEST_CASE("swap and recompute mix in one run") {
    const RunResult ample = run(400, Preemption::kRecompute, 0, false, 0.8f);
    const RunResult mix = run(24, Preemption::kSwap, 12, false, 0.8f);
    CHECK(mix.stats.num_swap_outs > 0);
    CHECK(mix.stats.num_swap_fallbacks > 0);
    CHECK(mix.metrics.recomputed_tokens_total > 0);
    CHECK(mix.stats.num_swap_outs + mix.stats.num_swap_fallbacks == mix.metrics.num_preemptions_total);
    CHECK(mix.tokens == ample.tokens);
    // Recompute-only on the same cache recomputes more than the mix.
    const RunResult rec = run(24, Preemption::kRecompute, 0, false, 0.8f);
    CHECK(rec.tokens == ample.tokens);
    CHECK(rec.metrics.recomputed_tokens_total > mix.metrics.recomputed_tokens_total);
}

// Bytes moved are exactly the blocks that held computed K/V, whole: every
// layer's K and V of each, each way. The block count comes from the event
// stream (what each victim held), the block size from the model's shape.
TEST_CASE("swap byte accounting is exact") {
    const RunResult r = run(24, Preemption::kSwap, 200, false, 0.0f);
    const Config& c = swap_model().cfg;
    const long block_bytes = 2L * c.n_layers * 4 /*block_size*/ * c.n_kv_heads * c.head_dim() * (long)sizeof(float);
    REQUIRE(r.stats.num_swap_outs > 0);  // the workload really swaps
    REQUIRE(r.blocks_seen_swapped > r.stats.num_swap_outs);  // and victims held more than one block
    CHECK(r.stats.num_swap_fallbacks == 0);
    CHECK(r.stats.blocks_swapped_out == r.blocks_seen_swapped);
    CHECK(r.stats.bytes_out == r.blocks_seen_swapped * block_bytes);
    // Every swapped victim came back: the same blocks, the same bytes.
    CHECK(r.stats.num_swap_ins == r.stats.num_swap_outs);
    CHECK(r.stats.bytes_in == r.stats.bytes_out);
}

// Aborting a swapped-out request gives its swap slots back at once.
TEST_CASE("abort of a swapped-out request frees its swap slots") {
    EngineConfig ec;
    ec.num_blocks = 12;
    ec.block_size = 4;
    ec.sched.max_num_seqs = 8;
    ec.log_interval_s = 0;
    StepClock clock;
    const auto engine = pkv_test::engine_with(ec, {.preemption = Preemption::kSwap, .swap_space_blocks = 64}, pkv_test::runner(swap_model()), &clock);
    Engine& eng = *engine;
    const LabPolicy& lab = *lab_policy(eng.scheduler());
    SamplingParams sp;
    sp.max_tokens = 30;
    sp.ignore_eos = true;
    for (int i = 0; i < 6; ++i) eng.add_request({1, (int32_t)(10 + i), 3, 4, 5}, sp);
    int victim = -1;
    for (int step = 0; step < 200 && victim < 0; ++step) {
        eng.step();
        if (!lab.swapped().empty()) victim = lab.swapped().front()->id;
    }
    REQUIRE(victim >= 0);
    const int held = (int)lab.swap_slots(*eng.request(victim)).size();
    CHECK(held > 0);
    const int in_use = lab.swap_space().in_use();
    CHECK(eng.abort(victim));
    CHECK(lab.swap_space().in_use() == in_use - held);
    CHECK(lab.swap_slots(*eng.request(victim)).empty());
    CHECK(eng.check_invariants() == "");
    eng.run_until_done();
    CHECK(lab.swap_space().in_use() == 0);
    CHECK(eng.pool().num_free_blocks() == 12);
}

// The kernel path's swap copies (GpuRunner; emulated in a CPU build) move the
// same bytes: a swapped run on it matches the CPU's tokens.
TEST_CASE("swap on the kernel path matches the CPU") {
    std::string why;
    const Device kernels = std::string(kDeviceKind) == "cuda" ? Device::kCuda : Device::kEmulated;
    if (!device_available(&why)) {
        pkv_test::skip(pkv_test::SkipKind::kGpu, "no GPU: " + why);
        return;
    }
    const RunResult cpu = run(10, Preemption::kSwap, 64, false, 0.0f, 4, Device::kCpu, 12);
    const RunResult dev = run(10, Preemption::kSwap, 64, false, 0.0f, 4, kernels, 12);
    CHECK(cpu.stats.num_swap_outs > 0);
    CHECK(dev.stats.num_swap_outs == cpu.stats.num_swap_outs);
    CHECK(dev.tokens == cpu.tokens);
}

}  // TEST_SUITE

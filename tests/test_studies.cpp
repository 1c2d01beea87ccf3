// Tests for the study driver (lab/study.cpp, lab/studies.hpp, lab/study_map.hpp):
//   - every decider, handed the numbers of a workload built to bear its
//     claim out, of one built against it, and of one where the claim's
//     premise never occurred, gives supported, contradicted and "not shown";
//   - a verdict is computed from the study's numbers, so changing a preset
//     that changes the numbers changes the verdict (real runs: C6b);
//   - a map counts only the cells where a claim's premise occurred, and says
//     how many were not shown;
//   - every study runs to a verdict on the simulated GPU, on synthetic
//     traffic and on a replay of an Azure trace, and its --json carries the
//     claims, the verdicts and the table;
//   - `build/study --list` names every study and every claim.
#include <doctest/doctest.h>

#include <fstream>
#include <string>
#include <vector>

#include "lab/studies.hpp"
#include "lab/study_map.hpp"
#include "tests/test_util.hpp"

namespace {

const study::ClaimVerdict& find_verdict(const study::StudyResult& r, const std::string& claim) {
    for (const study::ClaimVerdict& v : r.verdicts)
        if (v.claim == claim) return v;
    FAIL("no verdict for " << claim);
    return r.verdicts.front();
}

// The Azure traces live beside the repository (../shared/traces); a test
// that needs one says so and skips where it is absent.
bool have_trace(const std::string& name) { return std::ifstream(study::trace_path(name)).good(); }

}  // namespace

TEST_SUITE("studies") {

using study::Verdict;

// ---- the deciders: each flips with its numbers, and reads "not shown" without its premise ----
//
// Each verdict is a small function of the study's numbers (studies.hpp's
// decide_*). These cases hand each decider the numbers of a workload that
// bears the claim out, of one built to contradict it, of one inside the draw
// band, and of one where the claim's premise never occurred: none of them can
// only come out one way, and nothing reads "contradicted" because nothing
// happened.

// Proves C13 and C11 follow the sweep: a 30% fall at the top with more preemptions, a busy device and more tokens processed supports both; a top that is the best contradicts both; a fall inside the 5% band is a draw (contradicted); a fall while the device processes fewer tokens too is C11-mixed (slower, not thrashing); no preemption at the top is not shown.
TEST_CASE("deciders: C13 and C11 flip with the sweep, and need a preemption") {
    study::SweepEnds thrash;
    thrash.best_seqs = 100;
    thrash.top_seqs = 800;
    thrash.best_tok_s = 1000;
    thrash.top_tok_s = 700;
    thrash.best_processed = 1200;
    thrash.top_processed = 1500;
    thrash.best_preemptions = 5;
    thrash.top_preemptions = 500;
    thrash.top_busy = 0.99;
    thrash.top_waste = 0.3;
    CHECK(study::decide_c13(thrash).verdict == Verdict::kSupported);
    CHECK(study::decide_c11(thrash).verdict == Verdict::kSupported);
    study::SweepEnds fine = thrash;
    fine.top_is_best = true;
    fine.top_tok_s = 1000;
    CHECK(study::decide_c13(fine).verdict == Verdict::kContradicted);
    CHECK(study::decide_c11(fine).verdict == Verdict::kContradicted);
    study::SweepEnds draw = thrash;
    draw.top_tok_s = 960;  // -4%: inside the band
    CHECK(study::decide_c13(draw).verdict == Verdict::kContradicted);
    CHECK(study::decide_c11(draw).verdict == Verdict::kContradicted);
    study::SweepEnds slower = thrash;
    slower.top_processed = 900;  // processes fewer tokens too: not the busy-but-useless shape
    CHECK(study::decide_c11(slower).verdict == Verdict::kMixed);
    study::SweepEnds idle = thrash;
    idle.top_busy = 0.6;
    CHECK(study::decide_c11(idle).verdict == Verdict::kMixed);
    study::SweepEnds calm_climb = thrash;
    calm_climb.top_preemptions = calm_climb.best_preemptions;  // worse, but the preemptions did not climb
    CHECK(study::decide_c13(calm_climb).verdict == Verdict::kMixed);
    study::SweepEnds none = thrash;
    none.best_preemptions = none.top_preemptions = 0;  // nothing preempted: no premise
    CHECK(study::decide_c13(none).verdict == Verdict::kNotShown);
    CHECK(study::decide_c11(none).verdict == Verdict::kNotShown);
    CHECK(study::decide_c11(none).premise.size() >= 1);
}

// Proves C1 calls a win only outside the draw band, and only where reserving held someone back: +20% everywhere supports, -20% contradicts, a draw or a split is mixed, and a pool that never bound (the same peak concurrency) is not shown.
TEST_CASE("deciders: C1 has a draw band and needs a pool that binds") {
    auto at = [](std::vector<double> gains, bool binds = true) {
        std::vector<study::AdmissionPoint> pts;
        for (size_t i = 0; i < gains.size(); ++i) pts.push_back({(int)(10 * (i + 1)), 100 * (1 + gains[i]), 100, 3, 10, binds ? 30 : 10});
        return study::decide_c1(pts).verdict;
    };
    CHECK(at({0.2, 0.3}) == Verdict::kSupported);
    CHECK(at({-0.2, -0.3}) == Verdict::kContradicted);
    CHECK(at({0.04, 0.2}) == Verdict::kMixed);
    CHECK(at({0.2, -0.2}) == Verdict::kMixed);
    CHECK(at({-0.2, -0.3}, false) == Verdict::kNotShown);
}

// Proves C3 follows the completion counts: newest-first ahead supports, fair ahead contradicts, a difference inside the band is a draw, and a run without preemptions is not shown.
TEST_CASE("deciders: C3 flips with who completes first") {
    study::VictimCounts v;
    v.newest = {10, 30, 60, 100};
    v.fair = {0, 5, 40, 100};
    v.newest_preemptions = v.fair_preemptions = 20;
    CHECK(study::decide_c3(v).verdict == Verdict::kSupported);
    std::swap(v.newest, v.fair);
    CHECK(study::decide_c3(v).verdict == Verdict::kContradicted);
    v.newest = {50, 60, 80, 100};
    v.fair = {49, 62, 79, 100};
    CHECK(study::decide_c3(v).verdict == Verdict::kMixed);
    v.newest_preemptions = v.fair_preemptions = 0;
    CHECK(study::decide_c3(v).verdict == Verdict::kNotShown);
}

// Proves C5, C6a, C6b and C8 follow the preemption numbers, and read "not shown" without a victim (or, for C6b, without a length beyond L*).
TEST_CASE("deciders: C5, C6a, C6b and C8 flip with the preemption numbers") {
    CHECK(study::decide_c5(10, 1000, 1000, 600).verdict == Verdict::kSupported);
    CHECK(study::decide_c5(10, 1000, 3000, 1000).verdict == Verdict::kContradicted);
    CHECK(study::decide_c5(10, 1000, 1000, 1000).verdict == Verdict::kMixed);
    CHECK(study::decide_c5(0, 0, 0, 0).verdict == Verdict::kNotShown);

    // C6a: both ways, a small space that fills, swap slower on the scarcest link.
    CHECK(study::decide_c6a(10, 1e9, 1e9, 3, {"gen4", 1.2, 1.0}).verdict == Verdict::kSupported);
    CHECK(study::decide_c6a(10, 1e9, 1e9, 3, {"gen4", 0.8, 1.0}).verdict == Verdict::kContradicted);  // swap wins where PCIe is scarce
    CHECK(study::decide_c6a(10, 1e9, 1e9, 0, {"gen4", 1.2, 1.0}).verdict == Verdict::kMixed);         // the buffer never filled
    CHECK(study::decide_c6a(10, 1e9, 1e9, 3, {"gen4", 1.02, 1.0}).verdict == Verdict::kMixed);        // a draw
    CHECK(study::decide_c6a(0, 0, 0, 0, {"gen4", 1.0, 1.0}).verdict == Verdict::kNotShown);

    // C6b: swap loses below L* and wins beyond it.
    auto link = [](std::vector<double> swap, long lstar = 1000) {
        study::SwapLink l;
        l.name = "gen5";
        l.lstar = lstar;
        l.lengths = {250, 2000};
        l.swap_s = swap;
        l.recompute_s = {1.0, 1.0};
        return l;
    };
    CHECK(study::decide_c6b({link({1.3, 0.8})}, 8192).verdict == Verdict::kSupported);
    CHECK(study::decide_c6b({link({0.8, 0.7})}, 8192).verdict == Verdict::kContradicted);  // wins at the short length too
    CHECK(study::decide_c6b({link({1.3, 1.2})}, 8192).verdict == Verdict::kContradicted);  // never wins
    CHECK(study::decide_c6b({link({1.3, 0.98})}, 8192).verdict == Verdict::kMixed);        // a draw beyond L*
    study::SwapLink unreachable = link({}, 40000);
    unreachable.lengths.clear();
    CHECK(study::decide_c6b({unreachable}, 8192).verdict == Verdict::kNotShown);  // 2 L* beyond the context
    CHECK(study::decide_c6b({unreachable, link({1.3, 0.8})}, 8192).verdict == Verdict::kSupported);  // the reachable link decides

    CHECK(study::decide_c8(10, 1200, 1000).verdict == Verdict::kSupported);
    CHECK(study::decide_c8(10, 1000, 1200).verdict == Verdict::kContradicted);
    CHECK(study::decide_c8(10, 1030, 1000).verdict == Verdict::kMixed);
    CHECK(study::decide_c8(0, 1000, 1000).verdict == Verdict::kNotShown);
}

// Proves C12 (fixes) tests relief beyond the draw band and the order of bluntness, and needs thrash and a runaway request: fixes that relieve with harm falling along the claim's order support it; harm rising along it contradicts; no relief contradicts; a baseline without preemptions, or traffic without a runaway, is not shown. And C12 (kv_dtype): relief supports, neither fewer preemptions nor a lower p99 contradicts, no preemption at the larger element is not shown.
TEST_CASE("deciders: C12 tests relief and the order of bluntness") {
    auto fixes = [](std::vector<double> harm) {
        std::vector<study::FixOutcome> f;
        for (int g = 1; g <= 4; ++g) f.push_back({"fix" + std::to_string(g), g, true, harm[(size_t)g - 1]});
        return f;
    };
    CHECK(study::decide_c12_fixes(fixes({0.9, 0.6, 0.2, 0.0}), 100, 0.5, 10).verdict == Verdict::kSupported);
    CHECK(study::decide_c12_fixes(fixes({0.0, 0.2, 0.6, 0.9}), 100, 0.5, 10).verdict == Verdict::kContradicted);
    CHECK(study::decide_c12_fixes(fixes({0.5, 0.7, 0.2, 0.0}), 100, 0.5, 10).verdict == Verdict::kMixed);  // out of order, not reversed
    std::vector<study::FixOutcome> none = fixes({0.9, 0.6, 0.2, 0.0});
    for (auto& f : none) f.relieves = false;
    CHECK(study::decide_c12_fixes(none, 100, 0.5, 10).verdict == Verdict::kContradicted);
    CHECK(study::decide_c12_fixes(fixes({0.9, 0.6, 0.2, 0.0}), 0, 0.5, 10).verdict == Verdict::kNotShown);
    CHECK(study::decide_c12_fixes(fixes({0.9, 0.6, 0.2, 0.0}), 100, 0.5, 0).verdict == Verdict::kNotShown);
    // Relief is "better than the draw band", not "half": 10% fewer preemptions and 10% lower p99 relieve; 3% does not.
    CHECK(study::relieves(100, 1.0, 90, 0.9));
    CHECK_FALSE(study::relieves(100, 1.0, 97, 0.9));
    CHECK_FALSE(study::relieves(100, 1.0, 90, 0.98));
    CHECK(study::relieves(100, 1.0, 0, 0.5));  // down to zero preemptions: relief, not a division by zero
    CHECK(study::decide_c12_quantize("fp8", 2000, 1000, 10, 40, 0.1, 0.5, "").verdict == Verdict::kSupported);
    CHECK(study::decide_c12_quantize("fp8", 2000, 1000, 40, 40, 0.5, 0.5, "").verdict == Verdict::kContradicted);
    CHECK(study::decide_c12_quantize("fp8", 2000, 1000, 10, 40, 0.5, 0.5, "").verdict == Verdict::kMixed);
    CHECK(study::decide_c12_quantize("fp8", 2000, 1000, 0, 0, 0.1, 0.1, "").verdict == Verdict::kNotShown);
    CHECK(study::decide_c12_quantize("fp8", 2000, 1000, 0, 40, 0.1, 0.5, "").verdict == Verdict::kSupported);  // none left
}

// Proves C9 follows the shedding numbers and needs a queue at the door: fast rejections and a lower accepted TTFT support it; nothing rejected although the queue formed, or rejections as slow as the stall, contradict it; a TTFT gain inside the band is mixed; a queue that never passed the limit is not shown.
TEST_CASE("deciders: C9 flips with the shedding numbers and needs a queue") {
    CHECK(study::decide_c9(8, 100, 50, 0.001, 2.0, 0.5).verdict == Verdict::kSupported);
    CHECK(study::decide_c9(8, 100, 0, 0.0, 2.0, 2.0).verdict == Verdict::kContradicted);
    CHECK(study::decide_c9(8, 100, 50, 3.0, 2.0, 0.5).verdict == Verdict::kContradicted);
    CHECK(study::decide_c9(8, 100, 50, 0.001, 2.0, 1.96).verdict == Verdict::kMixed);
    CHECK(study::decide_c9(8, 5, 0, 0.0, 2.0, 2.0).verdict == Verdict::kNotShown);
}

// Proves C7 and C10 read the pause per stream and the absolute p99 against the unpressured run, and count recompute stalls as preemption's: a run whose preempted streams pause, whose p99 is 5x the unpressured one and whose slowest gaps wait on preemption supports both; the same p99 caused by admission prefill instead is C7-mixed; no pause and no cliff contradicts C7; no preemption is not shown.
TEST_CASE("deciders: C7 and C10 read the pause, the cliff and its cause") {
    study::SignalRun calm;  // unpressured: no preemption, a steady stream
    calm.requests = calm.finished = 100;
    calm.p50 = 0.010;
    calm.p99 = 0.020;
    calm.decode_p50 = 0.010;
    study::SignalRun cliff = calm;  // overloaded: preempted streams pause, p99 5x
    cliff.preemptions = 50;
    cliff.preempted_streams = 40;
    cliff.paused_streams = 30;
    cliff.full_fraction = 0.6;
    cliff.p99 = 0.100;
    cliff.preemption_share_p99 = 0.8;
    CHECK(study::decide_c7(cliff, calm).verdict == Verdict::kSupported);
    CHECK(study::decide_c10(cliff, calm).verdict == Verdict::kSupported);
    study::SignalRun prefill = cliff;  // the same p99, but the slow gaps wait on admissions' prefill
    prefill.preemption_share_p99 = 0.1;
    CHECK(study::decide_c7(prefill, calm).verdict == Verdict::kMixed);
    study::SignalRun quiet = cliff;  // preempted, but no stream paused long and p99 flat
    quiet.paused_streams = 5;
    quiet.p99 = 0.022;
    CHECK(study::decide_c7(quiet, calm).verdict == Verdict::kContradicted);
    study::SignalRun loud_calm = calm;  // the unpressured run's own p99/p50 is high: the signal misleads
    loud_calm.p99 = 0.05;
    CHECK(study::decide_c10(cliff, loud_calm).verdict == Verdict::kMixed);
    study::SignalRun counter_only = cliff;  // only the counter: neither the pinned pool nor the p99 ratio
    counter_only.full_fraction = 0.1;
    counter_only.p99 = 0.02;
    CHECK(study::decide_c10(counter_only, calm).verdict == Verdict::kContradicted);
    study::SignalRun unpreempted = cliff;
    unpreempted.preemptions = 0;
    CHECK(study::decide_c7(unpreempted, calm).verdict == Verdict::kNotShown);
    CHECK(study::decide_c10(unpreempted, calm).verdict == Verdict::kNotShown);
}

// Proves C2 and C4 are counts that can go either way, and need an allocation to fail: preemptions with every request done (victims back in order) support them; a failed request or a victim out of order or never back contradicts them; no preemption is not shown.
TEST_CASE("deciders: C2 and C4 flip with the counts") {
    CHECK(study::decide_c2(10, 100, 100, 0).verdict == Verdict::kSupported);
    CHECK(study::decide_c2(10, 100, 99, 1).verdict == Verdict::kContradicted);
    CHECK(study::decide_c2(0, 100, 100, 0).verdict == Verdict::kNotShown);
    CHECK(study::decide_c4(10, 10, 0, 0).verdict == Verdict::kSupported);
    CHECK(study::decide_c4(10, 10, 2, 0).verdict == Verdict::kContradicted);
    CHECK(study::decide_c4(10, 9, 0, 1).verdict == Verdict::kContradicted);
    CHECK(study::decide_c4(0, 0, 0, 0).verdict == Verdict::kNotShown);
}

// ---- real runs ---------------------------------------------------------------

// Proves the thrash study's C13 verdict follows its numbers: on an A100-40GB at twice its capacity (a map cell's run), serving Llama-3-8B (GQA) useful throughput falls beyond the draw band at the top of the sweep while preemptions climb (supported), while serving Llama-2-7B (MHA, 4x the KV bytes per token) it stays within the band of the best (contradicted) -- the same code, another preset, the other verdict.
TEST_CASE("the thrash study's C13 verdict flips with the model preset") {
    study::Env gqa, mha;
    gqa.device = mha.device = pkv::Device::kSim;
    gqa.gpu = mha.gpu = "a100-40g";
    gqa.model = "llama-3-8b";
    mha.model = "llama-2-7b";
    for (study::Env* e : {&gqa, &mha}) {
        e->map_cell = true;
        e->drains = study::kMapDrains;
        e->load = 2;
    }
    const study::StudyResult a = study::thrash_study(gqa), b = study::thrash_study(mha);
    const study::ClaimVerdict& va = find_verdict(a, "C13");
    const study::ClaimVerdict& vb = find_verdict(b, "C13");
    INFO("llama-3-8b: " << va.because);
    INFO("llama-2-7b: " << vb.because);
    CHECK(va.verdict == Verdict::kSupported);
    CHECK(vb.verdict == Verdict::kContradicted);
    // The verdict text quotes the table: the top row's preemptions appear in it.
    REQUIRE(!a.table.rows.empty());
    CHECK(va.because.find(a.table.rows.back()[1] + " preemptions") != std::string::npos);
}

// Proves C6b's verdict is computed from the victim round trips: on an H200 with Llama-3.1-8B (whose context reaches twice the crossover length L*) swap loses at L*/4 and wins at 2 L* (supported); on an A100-40GB, whose FLOPs put L* at 0, swap wins from the shortest length (contradicted); with Llama-3-8B, whose 8192-token context ends before L*, it is not shown.
TEST_CASE("the preemption study's C6b verdict flips with the GPU, and needs the context to reach L*") {
    study::Env h200, a100, short_ctx;
    h200.device = a100.device = short_ctx.device = pkv::Device::kSim;
    h200.model = a100.model = "llama-3.1-8b";
    short_ctx.model = "llama-3-8b";
    a100.gpu = "a100-40g";
    h200.pcie = a100.pcie = short_ctx.pcie = "gen5";
    for (study::Env* e : {&h200, &a100, &short_ctx}) {
        e->map_cell = true;  // the lighter run: two lengths per link
        e->drains = study::kMapDrains;
    }
    const study::ClaimVerdict s = find_verdict(study::preemption_study(h200), "C6b");
    const study::ClaimVerdict c = find_verdict(study::preemption_study(a100), "C6b");
    const study::ClaimVerdict n = find_verdict(study::preemption_study(short_ctx), "C6b");
    INFO("h200: " << s.because);
    INFO("a100-40g: " << c.because);
    INFO("llama-3-8b: " << n.because);
    CHECK(s.verdict == Verdict::kSupported);
    CHECK(c.verdict == Verdict::kContradicted);
    CHECK(n.verdict == Verdict::kNotShown);
}

// Proves measure() puts every inter-token gap down to one cause and counts recompute stalls as preemption's: in an overloaded simulated run with preemptions, the five kinds add up to all the gaps, some gaps wait on other requests' recompute, the preempted streams' own longest gaps are recorded, and every preempted request is counted.
TEST_CASE("measure: every gap has one cause, and recompute stalls are preemption's") {
    study::Env env;
    env.device = pkv::Device::kSim;
    env.gpu = "a100-40g";
    study::Base b = study::base_scenario(env);
    study::Scenario s = study::all_at_once(env, b, 3 * b.fit);
    s.max_num_seqs = 4 * b.fit;
    const study::Measurement m = study::measure(env, s);
    REQUIRE(m.preemptions > 0);
    const size_t kinds = m.itl_preempted.count() + m.itl_recompute.count() + m.itl_swap.count() + m.itl_prefill.count() + m.itl_decode.count();
    CHECK(kinds == m.itl.count());
    CHECK(m.itl_preempted.count() > 0);
    CHECK(m.itl_recompute.count() > 0);
    CHECK(m.gaps_from_preemption() == (long)(m.itl_preempted.count() + m.itl_recompute.count() + m.itl_swap.count()));
    int preempted = 0;
    for (size_t i = 0; i < m.preemptions_by_request.size(); ++i) {
        preempted += m.preemptions_by_request[i] > 0;
        CHECK(m.longest_gap_by_request[i] <= m.itl.percentile(100));
    }
    CHECK(preempted == m.preempted_requests);
    CHECK(m.preemption_share_at_or_above(0) > 0);
    CHECK(m.preemption_share_at_or_above(0) <= 1);
}

// Proves a trace replay serves the trace's own requests: a 200-request window of the Azure conversation trace keeps each row's prompt and output length (capped), spreads the arrivals in the trace's own proportions at the requested mean rate, and runs to the end on the simulated GPU. Skipped, with a message, where ../shared/traces is absent.
TEST_CASE("a trace replay keeps the trace's lengths and proportions, at the offered rate") {
    if (!have_trace("conv")) {
        MESSAGE("skipped: " << study::trace_path("conv") << " is absent (the Azure traces live in ../shared/traces)");
        return;
    }
    const auto trace = study::load_trace("conv");
    REQUIRE(trace->rows.size() == 19366);
    auto tr = std::make_shared<study::TraceReplay>();
    tr->trace = trace;
    tr->first = 100;
    tr->rate = 20;
    study::Traffic t;
    t.requests = 200;
    t.trace = tr;
    t.prompt = study::LengthDist::uniform(2, 6000);
    t.output = study::LengthDist::uniform(1, 2000);
    const std::vector<study::PlannedRequest> plan = study::plan_traffic(t, 128256);
    REQUIRE(plan.size() == 200);
    for (size_t i = 0; i < plan.size(); ++i) {
        const study::TraceRow& row = trace->rows[100 + i];
        CHECK((int)plan[i].prompt.size() == std::clamp(row.prompt, 2, 6000));
        CHECK(plan[i].params.max_tokens == std::clamp(row.output, 1, 2000));
    }
    // The mean rate is the one asked for; the gaps keep the trace's proportions.
    CHECK(plan.back().arrival_s == doctest::Approx(199.0 / 20).epsilon(1e-9));
    const double scale = (trace->rows[150].t - trace->rows[100].t) / plan[50].arrival_s;
    CHECK((trace->rows[250].t - trace->rows[100].t) / plan[150].arrival_s == doctest::Approx(scale).epsilon(1e-9));
    // And it runs.
    study::Env env;
    env.device = pkv::Device::kSim;
    env.gpu = "a100-40g";
    study::Scenario s;
    s.max_num_batched_tokens = 8192;
    s.max_num_seqs = 64;
    s.traffic = t;
    s.traffic.prompt.hi = 6000;
    s.traffic.output.hi = 2000;
    const study::Measurement m = study::measure(env, s);
    CHECK(m.finished == 200);
    // A malformed name is refused, naming the ones there are.
    CHECK_THROWS_WITH_AS(study::load_trace("chat"), doctest::Contains("known: conv, code"), std::invalid_argument);
}

// ---- maps --------------------------------------------------------------------

// Proves every study declares a map of 12 or more cells with cells replaying an Azure trace, and that a map counts only the cells where a claim's premise occurred: the thrash study mapped over the load alone on an A100-40GB gives a cell below capacity (nothing preempted: not shown) and one above it (preempted: a verdict), the count says "1 of 1 (1 not shown)" or "0 of 1 (1 not shown)", and the JSON carries "not_shown" and each cell's premise numbers.
TEST_CASE("maps: every study has a grid of 12 or more cells with trace cells, and a map counts premise cells only") {
    for (const study::Study& s : study::all_studies()) {
        CAPTURE(s.name);
        const std::vector<study::Axis> axes = study::map_of(s.name);
        CHECK(study::grid_of(axes).size() >= 12);
        bool trace_cells = false;
        for (const study::Axis& a : axes)
            if (a.name == "traffic")
                for (const std::string& v : a.values) trace_cells = trace_cells || v == "conv" || v == "code";
        CHECK(trace_cells);
    }
    CHECK_THROWS_AS(study::map_of("nonesuch"), std::invalid_argument);
    study::Env env;
    env.device = pkv::Device::kSim;
    env.gpu = "a100-40g";
    const study::Study* thrash = nullptr;
    for (const study::Study& s : study::all_studies())
        if (s.name == "thrash") thrash = &s;
    REQUIRE(thrash);
    const study::MapResult m = study::run_map(*thrash, {study::axis_load({"0.5", "2"})}, env, 2);
    REQUIRE(m.cells.size() == 2);
    for (const study::Cell& c : m.cells) CHECK(c.error.empty());
    const study::ClaimVerdict* low = study::cell_claim(m.cells[0], "C13");
    const study::ClaimVerdict* high = study::cell_claim(m.cells[1], "C13");
    REQUIRE(low);
    REQUIRE(high);
    INFO("load 0.5: " << low->because);
    INFO("load 2: " << high->because);
    CHECK(low->verdict == Verdict::kNotShown);
    CHECK(high->verdict != Verdict::kNotShown);
    const study::Holds h = study::holds_count(m, "C13");
    CHECK(h.shown == 1);
    CHECK(h.not_shown == 1);
    CHECK(h.holds == (high->verdict == Verdict::kSupported));
    CHECK(study::holds_text(h).find("(1 not shown)") != std::string::npos);
    const std::string j = study::map_json(m, {"C13"});
    for (const char* key : {"\"claim\":\"C13\"", "\"cells\":[", "\"params\":{\"load\":0.5", "\"verdict\":\"not shown\"", "\"premise\":{\"top_preemptions\":0",
                            "\"holds\":", "\"total\":1", "\"not_shown\":1"})
        CHECK(j.find(key) != std::string::npos);
    // A map is for the simulated GPU: this CPU keeps its single-point verdicts.
    study::Env cpu;
    CHECK_THROWS_AS(study::run_map(*thrash, {study::axis_load({"1"})}, cpu, 1), std::invalid_argument);
}

// ---- the driver ----------------------------------------------------------------

// Proves build/study lists every study and claim, and that each study runs on the simulated GPU (an L4, the quickest) to a verdict, with --json carrying claims, verdicts and the table; one study also on a replay of the Azure code trace (where ../shared/traces has it).
TEST_CASE("build/study: --list, and every study's --json") {
    const std::string exe = pkv_test::need_program("study");
    if (exe.empty()) return;
    const auto [list, status] = pkv_test::run_command(pkv_test::shell_quote(exe) + " --list");
    CHECK(status == 0);
    for (const study::Study& s : study::all_studies()) CHECK(list.find(s.name) != std::string::npos);
    for (const auto& c : study::claims()) CHECK(list.find(c.first + ": ") != std::string::npos);
    for (const study::Study& s : study::all_studies()) {
        CAPTURE(s.name);
        const auto [out, st] = pkv_test::run_command(pkv_test::shell_quote(exe) + " " + s.name + " --device sim --gpu l4 --json 2>&1");
        CHECK(st == 0);
        for (const char* key : {"\"claims\":[", "\"verdicts\":[", "\"table\":[", "\"verdict\":\""}) CHECK(out.find(key) != std::string::npos);
        for (const std::string& c : s.claims) CHECK(out.find("\"claim\":\"" + c + "\"") != std::string::npos);
    }
    const auto [text, st2] = pkv_test::run_command(pkv_test::shell_quote(exe) + " mechanisms --device sim --gpu l4 2>&1");
    CHECK(st2 == 0);
    CHECK(text.find("\nverdict: ") != std::string::npos);
    if (have_trace("code")) {
        const auto [tr, st3] = pkv_test::run_command(pkv_test::shell_quote(exe) + " mechanisms --device sim --gpu l4 --traffic code 2>&1");
        CHECK(st3 == 0);
        CHECK(tr.find("Azure code trace") != std::string::npos);
    } else {
        MESSAGE("skipped the trace run: " << study::trace_path("code") << " is absent");
    }
    // --map is for the simulated GPU: on this CPU it is refused, with the reason, exit 2.
    const auto [bad, st4] = pkv_test::run_command(pkv_test::shell_quote(exe) + " thrash --map 2>&1");
    CHECK(st4 == 2);
    CHECK(bad.find("--device sim") != std::string::npos);
    // An unknown trace is refused by the flag parser.
    const auto [bad2, st5] = pkv_test::run_command(pkv_test::shell_quote(exe) + " thrash --device sim --traffic chat 2>&1");
    CHECK(st5 == 2);
    CHECK(bad2.find("conv") != std::string::npos);
}

}  // TEST_SUITE

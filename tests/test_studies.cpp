// Tests for the study driver (lab/study.cpp, lab/studies.hpp):
//   - a verdict is computed from the study's numbers, so changing a preset
//     that changes the numbers changes the verdict (the flip test);
//   - every study runs to a verdict on the simulated GPU, and its --json
//     carries the claims, the verdicts and the table;
//   - `build/study --list` names every study and every claim.
#include <doctest/doctest.h>

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

}  // namespace

TEST_SUITE("studies") {

// Proves the thrash study's C13 verdict follows its numbers: on an A100 serving Llama-3-8B (GQA) useful throughput falls well past the best concurrency (supported), while serving Llama-2-7B (MHA, 4x the KV bytes per token) the fall stays under the study's 10% threshold (contradicted) -- the same code, another preset, the other verdict.
TEST_CASE("the thrash study's verdict flips with the model preset") {
    study::Env gqa, mha;
    gqa.device = mha.device = pkv::Device::kSim;
    gqa.gpu = mha.gpu = "a100-80g";
    gqa.model = "llama-3-8b";
    mha.model = "llama-2-7b";
    const study::StudyResult a = study::thrash_study(gqa), b = study::thrash_study(mha);
    const study::ClaimVerdict& va = find_verdict(a, "C13");
    const study::ClaimVerdict& vb = find_verdict(b, "C13");
    INFO("llama-3-8b: " << va.because);
    INFO("llama-2-7b: " << vb.because);
    CHECK(va.verdict == study::Verdict::kSupported);
    CHECK(vb.verdict == study::Verdict::kContradicted);
    // The verdict text quotes the table: the top row's preemptions appear in it.
    REQUIRE(!a.table.rows.empty());
    CHECK(va.because.find(a.table.rows.back()[1] + " preemptions") != std::string::npos);
}

// Proves C6's verdict is computed from the swap/recompute comparison, with swap priced per copy (cost_model.hpp section 4b): on an A100-40GB with a 100 GB/s host link swap loses at 80 tokens and wins by more than the draw band from 320 on (supported); on a 3 GB/s link it loses at every length (contradicted).
TEST_CASE("the preemption study's C6 verdict flips with the PCIe bandwidth") {
    study::Env fast, slow;
    fast.device = slow.device = pkv::Device::kSim;
    fast.gpu = slow.gpu = "a100-40g";
    fast.model = slow.model = "llama-3-8b";
    fast.pcie_bw_override = 100e9;
    slow.pcie_bw_override = 3e9;
    const study::ClaimVerdict f = find_verdict(study::preemption_study(fast), "C6");
    const study::ClaimVerdict s = find_verdict(study::preemption_study(slow), "C6");
    INFO("100 GB/s: " << f.because);
    INFO("3 GB/s: " << s.because);
    CHECK(f.verdict == study::Verdict::kSupported);
    CHECK(s.verdict == study::Verdict::kContradicted);
}

// Proves build/study lists every study and claim, and that each study runs on the simulated GPU (an L4, the quickest) to a verdict, with --json carrying claims, verdicts and the table.
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
        const auto [text, st2] = pkv_test::run_command(pkv_test::shell_quote(exe) + " " + s.name + " --device sim --gpu l4 2>&1");
        CHECK(st2 == 0);
        CHECK(text.find("\nverdict: ") != std::string::npos);
    }
    // --map is for the simulated GPU: on this CPU it is refused, with the reason, exit 2.
    const auto [bad, st3] = pkv_test::run_command(pkv_test::shell_quote(exe) + " thrash --map 2>&1");
    CHECK(st3 == 2);
    CHECK(bad.find("--device sim") != std::string::npos);
}

// ---- maps --------------------------------------------------------------------

// Proves every study declares a map of at least 12 cells, each axis with values, and that a map's result does not come out one colour by construction: the kv_dtype study mapped over the length scale alone (a test-size map, two cells, on an H100 + Llama-3-8B) gives C12 different verdicts in its two cells, the count and the boundary say so, and the JSON carries the shape the lab documents.
TEST_CASE("maps: every study has a grid of 12 or more cells, and a map's cells disagree") {
    for (const study::Study& s : study::all_studies()) {
        CAPTURE(s.name);
        const std::vector<study::Axis> axes = study::map_of(s.name);
        CHECK(study::grid_of(axes).size() >= 12);
    }
    CHECK_THROWS_AS(study::map_of("nonesuch"), std::invalid_argument);
    study::Env env;
    env.device = pkv::Device::kSim;
    env.gpu = "l4";
    env.model = "llama-3-8b";
    env.gpu = "h100";
    const study::Study* kv = nullptr;
    for (const study::Study& s : study::all_studies())
        if (s.name == "kv_dtype") kv = &s;
    REQUIRE(kv);
    const study::MapResult m = study::run_map(*kv, {study::axis_scale({"0.5", "1"})}, env, 2);
    REQUIRE(m.cells.size() == 2);
    for (const study::Cell& c : m.cells) CHECK(c.error.empty());
    const study::ClaimVerdict* half = study::cell_claim(m.cells[0], "C12");
    const study::ClaimVerdict* full = study::cell_claim(m.cells[1], "C12");
    REQUIRE(half);
    REQUIRE(full);
    INFO("scale 0.5: " << half->because);
    INFO("scale 1: " << full->because);
    CHECK(half->verdict != full->verdict);
    CHECK(study::holds_count(m, "C12").second == 2);
    CHECK(study::holds_count(m, "C12").first == (half->verdict == study::Verdict::kSupported) + (full->verdict == study::Verdict::kSupported));
    CHECK(study::boundary(m, "C12").find("scale") != std::string::npos);
    const std::string j = study::map_json(m, {"C12"});
    for (const char* key : {"\"claim\":\"C12\"", "\"cells\":[", "\"params\":{\"scale\":0.5", "\"verdict\":\"", "\"numbers\":{\"preemptions_small\":",
                            "\"holds\":", "\"total\":2"})
        CHECK(j.find(key) != std::string::npos);
    // A map is for the simulated GPU: this CPU keeps its single-point verdicts.
    study::Env cpu;
    CHECK_THROWS_AS(study::run_map(*kv, {study::axis_scale({"1"})}, cpu, 1), std::invalid_argument);
}

// ---- the deciders: each one, handed numbers built to contradict it, flips ----
//
// Each verdict is a small function of the study's numbers (studies.hpp's
// decide_*). These cases hand each decider the numbers of a workload that
// bears the claim out, of one built to contradict it, and of one inside the
// draw band, and check the verdict follows: none of them can only come out
// one way. (The map test below, and the two flips above, do the same with
// real runs.)

using study::Verdict;

// Proves C13 and C11 follow the sweep's numbers: a 30% drop at the top with more preemptions and a busy device supports both; a top that is the best contradicts both; a device that idles 40% of the time contradicts C11 even with the drop (busy is a measurement); a 3% drop is a draw.
TEST_CASE("deciders: C13 and C11 flip with the sweep's numbers") {
    study::SweepEnds thrash;
    thrash.best_seqs = 100;
    thrash.top_seqs = 800;
    thrash.best_tok_s = 1000;
    thrash.top_tok_s = 700;
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
    study::SweepEnds idle = thrash;
    idle.top_busy = 0.6;  // keeps up between arrivals: no thrash, whatever the drop
    CHECK(study::decide_c11(idle).verdict == Verdict::kContradicted);
    study::SweepEnds draw = thrash;
    draw.top_tok_s = 970;
    CHECK(study::decide_c13(draw).verdict == Verdict::kContradicted);  // within the draw band of the best
    study::SweepEnds between = thrash;
    between.top_tok_s = 920;  // -8%: outside the band, short of the claim's 10%
    CHECK(study::decide_c13(between).verdict == Verdict::kMixed);
    CHECK(study::decide_c11(between).verdict == Verdict::kMixed);
}

// Proves C1 calls a win only outside the draw band: +20% everywhere supports, -20% everywhere contradicts, +4% (a draw) or one win and one loss is mixed.
TEST_CASE("deciders: C1 has a draw band") {
    auto at = [](std::vector<double> gains) {
        std::vector<study::AdmissionPoint> pts;
        for (size_t i = 0; i < gains.size(); ++i) pts.push_back({(int)(10 * (i + 1)), 100 * (1 + gains[i]), 100, 3, 10});
        return study::decide_c1(pts).verdict;
    };
    CHECK(at({0.2, 0.3}) == Verdict::kSupported);
    CHECK(at({-0.2, -0.3}) == Verdict::kContradicted);
    CHECK(at({0.04, 0.2}) == Verdict::kMixed);
    CHECK(at({0.04, 0.04}) == Verdict::kMixed);
    CHECK(at({0.2, -0.2}) == Verdict::kMixed);
}

// Proves C3 follows the completion counts: newest-first ahead supports, fair ahead contradicts, a difference inside the band (or of one request) is a draw.
TEST_CASE("deciders: C3 flips with who completes first") {
    study::VictimCounts v;
    v.newest = {10, 30, 60, 100};
    v.fair = {0, 5, 40, 100};
    CHECK(study::decide_c3(v).verdict == Verdict::kSupported);
    std::swap(v.newest, v.fair);
    CHECK(study::decide_c3(v).verdict == Verdict::kContradicted);
    v.newest = {50, 60, 80, 100};
    v.fair = {49, 62, 79, 100};
    CHECK(study::decide_c3(v).verdict == Verdict::kMixed);
}

// Proves C5, C6 and C8 follow the preemption study's numbers: recompute that redoes what victims held (and a cache that saves some) supports C5, no saving and a ratio far off contradicts it; swap winning only at long lengths (later on the scarcer link) supports C6, winning everywhere or losing everywhere contradicts it, a draw at the longest length is mixed; C8 needs more than the band.
TEST_CASE("deciders: C5, C6 and C8 flip with the preemption numbers") {
    CHECK(study::decide_c5(10, 1000, 1000, 600).verdict == Verdict::kSupported);
    CHECK(study::decide_c5(10, 1000, 3000, 1000).verdict == Verdict::kContradicted);
    CHECK(study::decide_c5(10, 1000, 1000, 1000).verdict == Verdict::kMixed);

    auto link = [](std::string name, std::vector<double> swap) {
        study::SwapLink l;
        l.name = name;
        l.lengths = {320, 1280, 2560};
        l.swap_s = swap;
        l.recompute_s = {1.0, 1.0, 1.0};
        return l;
    };
    study::SwapEvidence ev;
    ev.out_bytes = ev.in_bytes = 1e9;
    ev.small_space_fallbacks = 3;
    ev.links = {link("gen4", {1.3, 1.1, 0.8}), link("gen5", {1.2, 0.9, 0.7})};
    CHECK(study::decide_c6(ev).verdict == Verdict::kSupported);
    ev.links = {link("gen4", {0.8, 0.8, 0.8}), link("gen5", {0.7, 0.7, 0.7})};
    CHECK(study::decide_c6(ev).verdict == Verdict::kContradicted);  // swap wins at every length: not "only long"
    ev.links = {link("gen4", {1.3, 1.3, 1.2}), link("gen5", {1.2, 1.2, 1.1})};
    CHECK(study::decide_c6(ev).verdict == Verdict::kContradicted);  // swap never wins
    ev.links = {link("gen4", {1.3, 1.1, 0.98}), link("gen5", {1.2, 1.1, 0.97})};
    CHECK(study::decide_c6(ev).verdict == Verdict::kMixed);  // a draw at the longest length
    ev.links = {link("gen4", {1.3, 0.9, 0.8}), link("gen5", {1.2, 1.1, 0.8})};
    CHECK(study::decide_c6(ev).verdict == Verdict::kMixed);  // the scarcer link crosses over first
    ev.links = {link("gen4", {1.3, 1.1, 0.8}), link("gen5", {1.2, 0.9, 0.7})};
    ev.in_bytes = 0;  // nothing came back
    CHECK(study::decide_c6(ev).verdict == Verdict::kMixed);

    CHECK(study::decide_c8(1200, 1000).verdict == Verdict::kSupported);
    CHECK(study::decide_c8(1000, 1200).verdict == Verdict::kContradicted);
    CHECK(study::decide_c8(1030, 1000).verdict == Verdict::kMixed);
}

// Proves C12 (fixes) tests both relief and the order of bluntness: fixes that relieve with harm falling along the claim's order support it; the same fixes with harm rising along the order contradict it; no relief contradicts it; a baseline without preemptions shows nothing. And C12 (kv_dtype): half the preemptions supports, as many contradicts.
TEST_CASE("deciders: C12 tests relief and the order of bluntness") {
    auto fixes = [](std::vector<double> harm) {
        std::vector<study::FixOutcome> f;
        for (int g = 1; g <= 4; ++g) f.push_back({"fix" + std::to_string(g), g, true, harm[(size_t)g - 1]});
        return f;
    };
    CHECK(study::decide_c12_fixes(fixes({0.9, 0.6, 0.2, 0.0}), 100, 0.5).verdict == Verdict::kSupported);
    CHECK(study::decide_c12_fixes(fixes({0.0, 0.2, 0.6, 0.9}), 100, 0.5).verdict == Verdict::kContradicted);
    CHECK(study::decide_c12_fixes(fixes({0.5, 0.7, 0.2, 0.0}), 100, 0.5).verdict == Verdict::kMixed);  // out of order, not reversed
    std::vector<study::FixOutcome> none = fixes({0.9, 0.6, 0.2, 0.0});
    for (auto& f : none) f.relieves = false;
    CHECK(study::decide_c12_fixes(none, 100, 0.5).verdict == Verdict::kContradicted);
    CHECK(study::decide_c12_fixes(fixes({0.9, 0.6, 0.2, 0.0}), 0, 0.5).verdict == Verdict::kNotShown);
    CHECK(study::decide_c12_quantize("fp8", 2000, 1000, 10, 40, "").verdict == Verdict::kSupported);
    CHECK(study::decide_c12_quantize("fp8", 2000, 1000, 40, 40, "").verdict == Verdict::kContradicted);
    CHECK(study::decide_c12_quantize("fp8", 2000, 1000, 30, 40, "").verdict == Verdict::kMixed);
    CHECK(study::decide_c12_quantize("fp8", 2000, 1000, 0, 0, "").verdict == Verdict::kNotShown);
}

// Proves C9 follows the shedding numbers: fast rejections and a lower accepted TTFT support it; nothing rejected, or rejections as slow as the stall, contradict it; a TTFT gain inside the band is mixed.
TEST_CASE("deciders: C9 flips with the shedding numbers") {
    CHECK(study::decide_c9(8, 50, 0.001, 2.0, 0.5).verdict == Verdict::kSupported);
    CHECK(study::decide_c9(8, 0, 0.0, 2.0, 2.0).verdict == Verdict::kContradicted);
    CHECK(study::decide_c9(8, 50, 3.0, 2.0, 0.5).verdict == Verdict::kContradicted);
    CHECK(study::decide_c9(8, 50, 0.001, 2.0, 1.96).verdict == Verdict::kMixed);
}

// Proves C7 and C10 separate the preemption cliff from chunked-prefill stalls: a run whose raw p99/p50 is 6 only because of prefill chunks (gaps without them flat) shows no cliff, so a pressured run with that shape contradicts C7 and is not 3 of 3 for C10; the same run with long preempted gaps supports both.
TEST_CASE("deciders: C7 and C10 set prefill stalls apart from preemption") {
    study::SignalRun calm;  // unpressured: prefill stalls make the raw ratio 6.1, without them 1.1
    calm.requests = calm.finished = 100;
    calm.p50 = 0.01;
    calm.p99 = 0.061;
    calm.p50_np = 0.01;
    calm.p99_np = 0.011;
    calm.decode_p50 = 0.01;
    study::SignalRun cliff = calm;  // overloaded, preempted: long gaps across preemptions
    cliff.preemptions = 50;
    cliff.full_fraction = 0.6;
    cliff.p99_np = 0.2;
    cliff.longest_preempted = 1.5;
    CHECK(study::decide_c7(cliff, calm).verdict == Verdict::kSupported);
    CHECK(study::decide_c10(cliff, calm).verdict == Verdict::kSupported);
    study::SignalRun stalls = calm;  // "overloaded" but only prefill stalls: no preemption, no cliff
    stalls.full_fraction = 0.1;
    CHECK(study::decide_c7(stalls, calm).verdict == Verdict::kContradicted);
    CHECK(study::decide_c10(stalls, calm).verdict == Verdict::kContradicted);
    // The raw ratio alone (6.1) would have counted as a signal in the calm run: with the split it does not.
    CHECK(calm.ratio() > 3.0);
    CHECK(calm.ratio_np() < 3.0);
    study::SignalRun pause_only = cliff;
    pause_only.p99_np = 0.02;  // a pause, no cliff
    CHECK(study::decide_c7(pause_only, calm).verdict == Verdict::kMixed);
}

// Proves C2 and C4 are counts that can go either way: preemptions with every request done (and victims back in order) support them; a failed request or a victim that never resumes contradicts them.
TEST_CASE("deciders: C2 and C4 flip with the counts") {
    CHECK(study::decide_c2(10, 100, 100, 0).verdict == Verdict::kSupported);
    CHECK(study::decide_c2(10, 100, 99, 1).verdict == Verdict::kContradicted);
    CHECK(study::decide_c2(0, 100, 100, 0).verdict == Verdict::kMixed);
    CHECK(study::decide_c4(10, 10, 0, 0).verdict == Verdict::kSupported);
    CHECK(study::decide_c4(10, 10, 2, 0).verdict == Verdict::kContradicted);
    CHECK(study::decide_c4(10, 9, 0, 1).verdict == Verdict::kContradicted);
}

}  // TEST_SUITE

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

// Proves C6's verdict is computed from the swap/recompute comparison: on an L4 with its own Gen4 link swap wins at every length (contradicted: "only for very long sequences"); on a 2 GB/s link it loses at short lengths and wins at long ones (supported).
TEST_CASE("the preemption study's C6 verdict flips with the PCIe bandwidth") {
    study::Env fast, slow;
    fast.device = slow.device = pkv::Device::kSim;
    fast.gpu = slow.gpu = "l4";
    fast.model = slow.model = "llama-3-8b";
    slow.pcie_bw_override = 2e9;
    const study::ClaimVerdict f = find_verdict(study::preemption_study(fast), "C6");
    const study::ClaimVerdict s = find_verdict(study::preemption_study(slow), "C6");
    INFO("gen4: " << f.because);
    INFO("2 GB/s: " << s.because);
    CHECK(f.verdict == study::Verdict::kContradicted);
    CHECK(s.verdict == study::Verdict::kSupported);
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
}

}  // TEST_SUITE

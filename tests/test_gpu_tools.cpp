// tests/test_gpu_tools.cpp -- the tools that measure the GPU must themselves
// be right before anyone reads their numbers.
//
// lab/bench_attention is what tests/gpu_check.sh runs on a rented GPU for
// the bandwidth figures; there is one such run, so a bench that prints PASS
// over wrong outputs, or exits 0 after a FAIL, would waste it. Here the build
// of the same folder as this test binary (build/, build/asan/, build/cuda/)
// runs its small shapes:
//   1. a clean run prints one RESULT line per (shape, dtype, kernel), every one
//      PASS, and exits 0;
//   2. with --inject-nan (one NaN written into each checked output) every
//      RESULT line is FAIL and the exit status is 1: the check sees a NaN.
// In the CPU build the kernels are emulated (a second or so); a CUDA build
// runs them on the GPU, and skips (a GPU skip: PAGEDKV_REQUIRE_GPU=1 fails it)
// on a machine without one.
#include <doctest/doctest.h>

#include <sstream>
#include <string>
#include <vector>

#include "tests/test_util.hpp"

namespace {

// The bench of this build, or "" after recording why it cannot run here.
std::string bench_program() {
    std::string why;
    if (!pkv::device_available(&why)) {
        pkv_test::skip(pkv_test::SkipKind::kGpu, "no GPU: " + why);
        return "";
    }
    return pkv_test::need_program("bench_attention");
}

// The RESULT lines of a run's output, each split into its words:
// RESULT <shape> <dtype> <kernel> <GB/s> <%peak> <%copy> PASS|FAIL.
std::vector<std::vector<std::string>> result_lines(const std::string& out) {
    std::vector<std::vector<std::string>> rows;
    std::istringstream in(out);
    for (std::string line; std::getline(in, line);) {
        if (line.rfind("RESULT ", 0) != 0) continue;
        std::istringstream words(line);
        std::vector<std::string> w;
        for (std::string x; words >> x;) w.push_back(x);
        rows.push_back(w);
    }
    return rows;
}

// Runs the bench (stderr folded into the output), bounded by `timeout`.
std::pair<std::string, int> run_bench(const std::string& exe, const std::string& args) {
    return pkv_test::run_command("timeout -k 5 300 " + pkv_test::shell_quote(exe) + " " + args + " 2>&1 </dev/null");
}

}  // namespace

TEST_SUITE("gpu_tools") {

TEST_CASE("bench_attention checks every output of every kernel, shape and dtype, and passes") {
    const std::string exe = bench_program();
    if (exe.empty()) return;
    // Not a structured binding: clang++ 14 refuses to capture one in INFO's lambda.
    const std::pair<std::string, int> run = run_bench(exe, "--shapes small --dtype all --iters 2");
    const std::string& out = run.first;
    const int code = run.second;
    INFO("output:\n" << out);
    CHECK(code == 0);
    CHECK(out.find("device: ") != std::string::npos);
    const auto rows = result_lines(out);
    // 2 small shapes x 3 dtypes x however many kernels the table has.
    REQUIRE(!rows.empty());
    CHECK(rows.size() % 6 == 0);
    for (const auto& w : rows) {
        REQUIRE(w.size() == 8);
        CHECK(w[7] == "PASS");
    }
    // Every dtype appears, on every small shape.
    for (const char* dt : {"f32", "f16", "int8"})
        for (const char* shape : {"S1_b4_ctx250", "S2_b1_ctx1024"}) {
            bool seen = false;
            for (const auto& w : rows) seen = seen || (w[1] == shape && w[2] == dt);
            CHECK_MESSAGE(seen, "no RESULT line for " << shape << " " << dt);
        }
}

TEST_CASE("bench_attention --inject-nan: a NaN in the output fails the check and the exit status") {
    const std::string exe = bench_program();
    if (exe.empty()) return;
    // Not a structured binding: clang++ 14 refuses to capture one in INFO's lambda.
    const std::pair<std::string, int> run = run_bench(exe, "--shapes small --dtype f32 --iters 1 --inject-nan");
    const std::string& out = run.first;
    const int code = run.second;
    INFO("output:\n" << out);
    CHECK(code == 1);
    const auto rows = result_lines(out);
    REQUIRE(!rows.empty());
    for (const auto& w : rows) {
        REQUIRE(w.size() == 8);
        CHECK(w[7] == "FAIL");
    }
    CHECK(out.find("results FAIL") != std::string::npos);
}

}  // TEST_SUITE("gpu_tools")

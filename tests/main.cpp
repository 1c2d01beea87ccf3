// The doctest runner for every suite in tests/. Each test_*.cpp adds its cases.
//
// After doctest's own summary we list the tests that skipped part or all of
// their work (pkv_test::skip in test_util.hpp) and why, because doctest
// counts such a test as passed. PAGEDKV_REQUIRE_MODELS=1 makes a skip for
// missing model files a failure, PAGEDKV_REQUIRE_GPU=1 one for a missing GPU,
// PAGEDKV_REQUIRE_BROWSER=1 one for a missing headless browser.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "tests/test_util.hpp"

namespace {

// A doctest listener that only remembers which test case is running, so that
// a skip can say where it happened.
struct CurrentTestListener : doctest::IReporter {
    explicit CurrentTestListener(const doctest::ContextOptions&) {}
    void report_query(const doctest::QueryData&) override {}
    void test_run_start() override {}
    void test_run_end(const doctest::TestRunStats&) override {}
    void test_case_start(const doctest::TestCaseData& tc) override { pkv_test::current_test() = tc.m_name; }
    void test_case_reenter(const doctest::TestCaseData&) override {}
    void test_case_end(const doctest::CurrentTestCaseStats&) override {}
    void test_case_exception(const doctest::TestCaseException&) override {}
    void subcase_start(const doctest::SubcaseSignature&) override {}
    void subcase_end() override {}
    void log_assert(const doctest::AssertData&) override {}
    void log_message(const doctest::MessageData&) override {}
    void test_case_skipped(const doctest::TestCaseData&) override {}
};
REGISTER_LISTENER("pagedkv_current_test", 1, CurrentTestListener);

// A 0/1 switch from the environment: unset, "" and "0" are off, "1" is on,
// anything else a mistake we refuse (a typo must not quietly turn a failure
// into a skip).
bool env_set(const char* name) {
    const char* v = std::getenv(name);
    if (!v || !*v || std::string(v) == "0") return false;
    if (std::string(v) == "1") return true;
    std::fprintf(stderr, "[pagedkv] %s must be 0 or 1 (or unset), got '%s'\n", name, v);
    std::exit(2);
}
}  // namespace

int main(int argc, char** argv) {
    const bool require_models = env_set("PAGEDKV_REQUIRE_MODELS"), require_gpu = env_set("PAGEDKV_REQUIRE_GPU");
    const bool require_browser = env_set("PAGEDKV_REQUIRE_BROWSER");
    doctest::Context context(argc, argv);
    int status = context.run();
    if (context.shouldExit()) return status;
    const auto& skips = pkv_test::skips();
    int models = 0, gpu = 0, browser = 0;
    for (const auto& s : skips) {
        models += s.kind == pkv_test::SkipKind::kModels;
        gpu += s.kind == pkv_test::SkipKind::kGpu;
        browser += s.kind == pkv_test::SkipKind::kBrowser;
    }
    if (!skips.empty()) {
        std::printf("[pagedkv] %zu skip(s) (doctest counts these tests as passed):\n", skips.size());
        for (const auto& s : skips) std::printf("[pagedkv]   %s: %s\n", s.test.c_str(), s.why.c_str());
    }
    if (models > 0 && require_models) {
        std::printf("[pagedkv] FAILURE: %d skip(s) for missing model files, and PAGEDKV_REQUIRE_MODELS is set\n", models);
        status = status ? status : 1;
    }
    if (gpu > 0 && require_gpu) {
        std::printf("[pagedkv] FAILURE: %d skip(s) for a missing GPU, and PAGEDKV_REQUIRE_GPU is set\n", gpu);
        status = status ? status : 1;
    }
    if (browser > 0 && require_browser) {
        std::printf("[pagedkv] FAILURE: %d skip(s) for a missing headless browser, and PAGEDKV_REQUIRE_BROWSER is set\n", browser);
        status = status ? status : 1;
    }
    return status;
}

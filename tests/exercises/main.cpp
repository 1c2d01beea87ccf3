// tests/exercises/main.cpp -- the doctest runner for the course kit's checks,
// and the channel through which a check reports its verdict to the grader.
//
// `make grade` (tools/kit.cpp) compiles each tests/exercises/exNN.cpp with this
// file into one small program per exercise and runs every TEST_CASE of it in
// a process of its own (`-tc=NAME`), so that a stub that throws, aborts or
// hangs costs that one check and nothing else. A check file follows a few
// rules, because the kit reads it as well as compiles it:
//   - one TEST_CASE is one check, named in plain words (no `*`, `?`, `,`,
//     `[` or `]`: doctest's -tc filter would read them as patterns), no two
//     names alike;
//   - it includes the project's headers first and doctest last (directly or
//     through check_util.hpp, which does the same): the exercise regions are
//     then compiled before doctest's macros exist, so a region cannot touch
//     them (`kit selftest` checks the order);
//   - it expects what it checks from its own arithmetic, not from another
//     exercise's code where that is practical, so that a student can grade
//     exercise 10 before writing exercise 9 (the kit grades each exercise in
//     a tree where every other region is the reference's anyway);
//   - it needs no model files and runs in well under a second;
//   - `// kit: tsan` anywhere in the file makes the kit build it once more
//     under ThreadSanitizer and count "no data race" as one more check.
// These files are not part of `make test`: they are the course's checks, and
// the reference passes them all (CI: `make kit-selftest`).
//
// ---- the verdict channel ------------------------------------------------------
// A student's code runs inside these programs, and it can print anything,
// doctest's summary line included. So the grader does not read the summary:
// it starts the program with two extra pipes and says which in the
// environment (PKV_KIT_CHANNEL=R,W). Before any test runs, main() reads a
// random nonce from R (the grader wrote it and closed its end) and closes R;
// when the tests are over, it writes one line to W:
//
//     pkv-kit-verdict NONCE CASES FAILED NAME_OF_EACH_CASE_THAT_RAN...
//
// Code that exits early (exit, _Exit, a crash) never writes it, and code that
// writes its own line does not know the nonce, which lived only in main()'s
// memory, read before that code ran. The grader passes a check only on a
// verdict line with its nonce saying that exactly the named case ran and
// passed, and an exit status of 0. Run by hand (no PKV_KIT_CHANNEL), this is
// an ordinary doctest main.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace {

// What ran, as doctest's reporters see it: one entry per test case, failed
// if any of its runs failed (a case runs once per subcase path).
struct Ran {
    std::string name;
    bool failed = false;
};
std::vector<Ran>& ran() {
    static std::vector<Ran> r;
    return r;
}

// A listener: it prints nothing and only records names and outcomes.
struct KitListener : doctest::IReporter {
    explicit KitListener(const doctest::ContextOptions&) {}
    void report_query(const doctest::QueryData&) override {}
    void test_run_start() override {}
    void test_run_end(const doctest::TestRunStats&) override {}
    void test_case_start(const doctest::TestCaseData& d) override { ran().push_back({d.m_name, false}); }
    void test_case_reenter(const doctest::TestCaseData&) override {}
    void test_case_end(const doctest::CurrentTestCaseStats& s) override {
        if (!ran().empty() && !s.testCaseSuccess) ran().back().failed = true;
    }
    void test_case_exception(const doctest::TestCaseException&) override {
        if (!ran().empty()) ran().back().failed = true;
    }
    void subcase_start(const doctest::SubcaseSignature&) override {}
    void subcase_end() override {}
    void log_assert(const doctest::AssertData&) override {}
    void log_message(const doctest::MessageData&) override {}
    void test_case_skipped(const doctest::TestCaseData&) override {}
};
REGISTER_LISTENER("pkv-kit", 1, KitListener);

// "R,W" -> the two descriptors; false when the text is anything else.
bool parse_channel(const char* s, int& r, int& w) {
    char tail = 0;
    return s && std::sscanf(s, "%d,%d%c", &r, &w, &tail) == 2 && r > 2 && w > 2 && r != w;
}

// A name on the verdict line: spaces become '_' (names are plain words).
std::string word(std::string s) {
    for (char& c : s)
        if (c == ' ' || c == '\n' || c == '\r' || c == '\t') c = '_';
    return s;
}

}  // namespace

int main(int argc, char** argv) {
    int rfd = -1, wfd = -1;
    std::string nonce;
    if (const char* ch = std::getenv("PKV_KIT_CHANNEL")) {
        if (!parse_channel(ch, rfd, wfd)) {
            std::fprintf(stderr, "check: PKV_KIT_CHANNEL must be 'R,W' (two descriptors above 2), got '%s'\n", ch);
            return 2;
        }
        // The nonce, before anything else runs; then its pipe is gone.
        char buf[128];
        for (ssize_t n; nonce.size() < 64 && (n = read(rfd, buf, sizeof buf)) > 0;) nonce.append(buf, (size_t)n);
        close(rfd);
        unsetenv("PKV_KIT_CHANNEL");
        if (nonce.empty()) {
            std::fprintf(stderr, "check: no nonce on descriptor %d\n", rfd);
            return 2;
        }
    }
    doctest::Context context(argc, argv);
    const int rc = context.run();
    if (wfd >= 0) {
        int failed = 0;
        for (const Ran& r : ran()) failed += r.failed;
        std::string line = "pkv-kit-verdict " + nonce + " " + std::to_string(ran().size()) + " " + std::to_string(failed);
        for (const Ran& r : ran()) line += " " + word(r.name);
        line += "\n";
        for (size_t off = 0; off < line.size();) {
            const ssize_t n = write(wfd, line.data() + off, line.size() - off);
            if (n <= 0) break;
            off += (size_t)n;
        }
        close(wfd);
    }
    return rc;
}

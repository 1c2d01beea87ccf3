// tools/kit.cpp -- the course kit: exercises cut from the real code, and their grader.
//
// pagedkv's headers carry marked regions, each a piece of the engine a student
// can write in one sitting:
//
//     <begin marker: "// ---- exercise N begin: TITLE ----">
//     // A hint: the comment lines right after the begin marker.
//     ...the reference code...
//     <end marker: "// ---- exercise N end ----">
//
// (The markers are comment lines of exactly that shape; this file spells them
// only inside string literals, so it never carries a region itself.)
// One exercise may own several regions (exercise 2 is allocate, touch and
// release). This program does five things with them:
//
//   kit cut       writes a *student copy* of the project in a folder of its
//                 own: every file, except that each chosen region keeps its
//                 markers and its hint and loses its code to a stub that
//                 compiles and fails loudly: "exercise 3 (...): not
//                 implemented". It also writes ANSWERS.txt (the analysis
//                 questions), .kit (this is a copy, and which exercises were
//                 cut) and .kit.mk (warnings a stub provokes, switched off).
//   kit grade     runs each exercise's checks (tests/exercises/exNN.cpp) and
//                 the analysis questions, one line per exercise as it
//                 finishes and a total. Exit 0 only when everything passes.
//   kit list      the exercises, their checks and where their regions are.
//   kit wrong     the known-wrong implementations (tests/exercises/wrong/),
//                 and writes one into a copy: what a failing grade looks like.
//   kit selftest  proves the kit on the reference itself (CI runs it).
//
// ---- how grading keeps one exercise from failing another ----------------------
// Exercise 10's kernel is tested through slot_of() (exercise 1), and exercise
// 5's scheduler through the block pool (exercises 2 and 3). Grading a student's
// copy as it stands would report a missing exercise 1 as a failure of every
// exercise that reaches it. So when the
// reference is at hand (--reference, PAGEDKV_REFERENCE, or the folder the kit
// runs in, when that is the reference), each exercise N is graded in a tree
// of its own: the reference's sources with only exercise N's regions taken
// from the student's copy. Without a reference (a copy taken home) the kit
// self-checks the copy as it is, with the copy's own checks, and says "needs
// exercise K" where another exercise's stub was hit: useful to the student,
// worth nothing as a grade.
//
// ---- what a grade from the reference can be trusted for ------------------------
// The student's code runs inside the programs that check it, so nothing those
// programs print is believed. A grade from the reference rests on this:
//   1. Only the regions come from the copy. The checks, their doctest main,
//      doctest itself, every other line of the engine, the compiler flags and
//      this grader are the reference's; a copy without a valid .kit is refused
//      rather than graded as if it were a reference, and so is a folder
//      without .kit that is not the reference (no tests/exercises/wrong/,
//      or stubs where the regions' code should be: a copy that lost it).
//   2. Each region is scanned before it is compiled (section 3): no
//      preprocessor line, no way out of its function's braces, no call that
//      ends the process, starts one, touches a file or a descriptor, or
//      reaches doctest; a refusal names the line.
//   3. The check files include doctest after the project's headers, so a
//      region is compiled before doctest's macros exist.
//   4. Every program is built fresh, in a private temporary folder that is
//      deleted afterwards; nothing under the copy's build/ is ever run.
//   5. A check passes on its verdict, not its output: the grader hands the
//      program a random nonce through a pipe, the doctest main reads it
//      before any test runs, and at the end reports which cases ran and
//      failed through a second pipe, with the nonce (tests/exercises/main.cpp).
//      No verdict (the process exited early), a wrong nonce or a case that
//      did not run fails the check.
//   6. A check runs under a time limit, may not write a byte to any file
//      (RLIMIT_FSIZE 0; except under ThreadSanitizer, whose runtime writes
//      a scratch file), and what it prints is kept up to 1 MiB.
// It is not a sandbox: code in a region runs with the grader's rights and
// could, with effort (raw pointers into the process, say), do what the scan
// refuses by name. COURSE.md says so; an instructor who needs more runs the
// grader in a container.
//
// Each check (one TEST_CASE) runs in a process of its own under a timeout, so a
// stub that throws, a kernel that aborts or a loop that never ends costs that
// one check. A check file containing the line "// kit: tsan" is also built under
// ThreadSanitizer, and "no data race" counts as one more check: a kernel with a
// barrier missing may compute the right numbers on a lucky run, but never
// passes that one. (It is built and run once every other check passes.)
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>  // mkdtemp
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <random>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "examples/cli.hpp"

extern char** environ;

namespace fs = std::filesystem;

namespace kit {

// ============================================================================
// 1. Files and processes
// ============================================================================

constexpr uintmax_t kMaxFileBytes = 64u << 20;    // any file the kit reads
constexpr uintmax_t kMaxRegionFileBytes = 4u << 20;  // a student's file with regions
constexpr size_t kMaxCheckOutput = 1u << 20;     // what a check may print that we keep
constexpr size_t kMaxToolOutput = 4u << 20;      // a compiler's or make's messages
constexpr int kCompileTimeoutS = 1800;           // one compilation, on a busy machine

std::string read_file(const fs::path& p, uintmax_t max_bytes = kMaxFileBytes) {
    std::error_code ec;
    const uintmax_t size = fs::file_size(p, ec);
    if (!ec && size > max_bytes)
        throw std::runtime_error(p.string() + " is " + std::to_string(size) + " bytes, more than the " +
                                 std::to_string(max_bytes >> 20) + " MiB the kit reads");
    std::ifstream in(p, std::ios::binary);
    if (!in) throw std::runtime_error("cannot read " + p.string());
    std::ostringstream ss;
    ss << in.rdbuf();
    return ss.str();
}

void write_file(const fs::path& p, const std::string& text) {
    if (p.has_parent_path()) fs::create_directories(p.parent_path());
    std::ofstream out(p, std::ios::binary);
    if (!out || !(out << text) || !out.flush()) throw std::runtime_error("cannot write " + p.string());
}

// `p` shown to a person: relative to the folder we run in when it lies below
// it (build/course/sample), else as it is.
std::string shown(const fs::path& p) {
    std::error_code ec;
    const fs::path cwd = fs::current_path(ec);
    const fs::path rel = fs::relative(p, cwd, ec);
    if (ec || rel.empty()) return p.string();
    const std::string r = rel.generic_string();
    return r.rfind("..", 0) == 0 ? p.string() : r;
}

// A command and how to run it (run_process).
struct Proc {
    std::vector<std::string> argv;
    fs::path cwd;                                                // empty: ours
    std::vector<std::pair<std::string, std::string>> set_env;   // added or replaced
    std::vector<std::string> unset_env;
    int timeout_s = 0;                                           // 0: no limit
    size_t max_output = kMaxToolOutput;
    std::string nonce;           // not empty: open the verdict channel (section 6)
    bool no_file_writes = false;  // RLIMIT_FSIZE 0: writing one byte to a file kills it
};

struct RunResult {
    int status = -1;        // exit status; 128 + N: killed by signal N; 124: timed out
    bool timed_out = false;
    std::string output;     // stdout and stderr together: the first max_output bytes
    size_t dropped = 0;     // bytes printed beyond those
    std::string verdict;    // what arrived through the verdict channel
};

// A plain command: its arguments, where it runs, how long it may take.
Proc command(std::vector<std::string> argv, fs::path cwd = {}, int timeout_s = 0) {
    Proc p;
    p.argv = std::move(argv);
    p.cwd = std::move(cwd);
    p.timeout_s = timeout_s;
    return p;
}

// The program `name` as execve wants it, a path: looked up on PATH here,
// before fork, because the child of a threaded program may call only
// async-signal-safe functions.
std::string find_program(const std::string& name) {
    if (name.find('/') != std::string::npos) return name;
    const char* path = std::getenv("PATH");
    std::istringstream dirs(path && *path ? path : "/usr/local/bin:/usr/bin:/bin");
    for (std::string d; std::getline(dirs, d, ':');) {
        const std::string c = (d.empty() ? "." : d) + "/" + name;
        if (access(c.c_str(), X_OK) == 0) return c;
    }
    throw std::runtime_error("cannot find the program '" + name + "' on PATH");
}

// Two ends of a pipe, closed when we are done with them.
struct Pipe {
    int r = -1, w = -1;
    Pipe() {
        int fd[2];
        if (pipe2(fd, O_CLOEXEC) != 0) throw std::runtime_error(std::string("pipe: ") + std::strerror(errno));
        r = fd[0];
        w = fd[1];
    }
    ~Pipe() {
        close_r();
        close_w();
    }
    void close_r() {
        if (r >= 0) close(r);
        r = -1;
    }
    void close_w() {
        if (w >= 0) close(w);
        w = -1;
    }
    Pipe(const Pipe&) = delete;
    Pipe& operator=(const Pipe&) = delete;
};

// Run a program, collecting what it prints (capped: a check that prints
// without end costs memory up to max_output, no more) and, with a nonce,
// the line its doctest main writes to the verdict channel: the nonce goes
// in through a pipe on descriptor 3, the verdict comes back through one on
// descriptor 4, and PKV_KIT_CHANNEL=3,4 says so. The program gets a process
// group of its own, so a timeout stops everything it started.
RunResult run_process(const Proc& p) {
    if (p.argv.empty()) throw std::logic_error("run_process: no program");
    const bool channel = !p.nonce.empty();
    // Everything the child needs, built before fork.
    const std::string exe = find_program(p.argv[0]);
    std::vector<char*> argv;
    for (const std::string& a : p.argv) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    std::vector<std::string> env;
    for (char** e = environ; *e; ++e) {
        const std::string kv = *e;
        const std::string key = kv.substr(0, kv.find('='));
        bool drop = key == "PKV_KIT_CHANNEL";
        for (const std::string& u : p.unset_env) drop |= key == u;
        for (const auto& kvp : p.set_env) drop |= key == kvp.first;
        if (!drop) env.push_back(kv);
    }
    for (const auto& [k, v] : p.set_env) env.push_back(k + "=" + v);
    if (channel) env.push_back("PKV_KIT_CHANNEL=3,4");
    std::vector<char*> envp;
    for (const std::string& e : env) envp.push_back(const_cast<char*>(e.c_str()));
    envp.push_back(nullptr);
    const std::string cwd = p.cwd.string();

    Pipe out;
    std::unique_ptr<Pipe> nonce_in, verdict_out;
    if (channel) {
        nonce_in = std::make_unique<Pipe>();
        verdict_out = std::make_unique<Pipe>();
    }
    const int devnull = open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (devnull < 0) throw std::runtime_error(std::string("/dev/null: ") + std::strerror(errno));
    const pid_t pid = fork();
    if (pid < 0) {
        close(devnull);
        throw std::runtime_error(std::string("fork: ") + std::strerror(errno));
    }
    if (pid == 0) {
        // The child: async-signal-safe calls only. The descriptors it keeps
        // go above 9 first, so that dup2 onto 0..4 never closes one of them.
        setpgid(0, 0);
        const int o = fcntl(out.w, F_DUPFD, 10), dn = fcntl(devnull, F_DUPFD, 10);
        const int nr = channel ? fcntl(nonce_in->r, F_DUPFD, 10) : -1, vw = channel ? fcntl(verdict_out->w, F_DUPFD, 10) : -1;
        if (o < 0 || dn < 0 || (channel && (nr < 0 || vw < 0))) _exit(126);
        dup2(dn, 0);
        dup2(o, 1);
        dup2(o, 2);
        if (channel) {
            dup2(nr, 3);
            dup2(vw, 4);
        }
        const unsigned first_closed = channel ? 5 : 3;
        if (syscall(SYS_close_range, first_closed, ~0u, 0) != 0)
            for (int fd = (int)first_closed; fd < 4096; ++fd) close(fd);
        struct sigaction dfl {};
        dfl.sa_handler = SIG_DFL;
        sigaction(SIGPIPE, &dfl, nullptr);
        sigset_t none;
        sigemptyset(&none);
        sigprocmask(SIG_SETMASK, &none, nullptr);
        if (p.no_file_writes) {
            const rlimit zero{0, 0};
            setrlimit(RLIMIT_FSIZE, &zero);
        }
        if (!cwd.empty() && chdir(cwd.c_str()) != 0) _exit(126);
        execve(exe.c_str(), argv.data(), envp.data());
        _exit(127);
    }
    close(devnull);
    setpgid(pid, pid);  // also here: no race with a kill before the child ran
    out.close_w();
    if (channel) {
        nonce_in->close_r();
        verdict_out->close_w();
        for (size_t off = 0; off < p.nonce.size();) {  // a few dozen bytes: never blocks
            const ssize_t n = write(nonce_in->w, p.nonce.data() + off, p.nonce.size() - off);
            if (n <= 0) break;  // it died already (EPIPE; SIGPIPE is ignored in the kit)
            off += (size_t)n;
        }
        nonce_in->close_w();
    }

    using clock = std::chrono::steady_clock;
    RunResult r;
    const auto never = clock::time_point::max();
    const auto deadline = p.timeout_s > 0 ? clock::now() + std::chrono::seconds(p.timeout_s) : never;
    auto kill_at = never, stop_reading_at = never;
    bool out_open = true, verdict_open = channel, exited = false;
    char buf[65536];
    for (;;) {
        // Has it ended? (WNOWAIT: still a zombie, so its process group id
        // cannot be reused before we stop what it left behind.)
        if (!exited) {
            siginfo_t info{};
            if (waitid(P_PID, (id_t)pid, &info, WEXITED | WNOHANG | WNOWAIT) == 0 && info.si_pid == pid) {
                exited = true;
                stop_reading_at = clock::now() + std::chrono::seconds(2);  // a grandchild may hold the pipes
            }
        }
        if (exited && !out_open && !verdict_open) break;
        const auto now = clock::now();
        if (exited && now >= stop_reading_at) break;
        if (!exited && !r.timed_out && now >= deadline) {
            r.timed_out = true;
            killpg(pid, SIGTERM);
            kill_at = now + std::chrono::seconds(2);
        }
        if (!exited && now >= kill_at) {
            killpg(pid, SIGKILL);
            kill_at = never;
        }
        pollfd fds[2];
        int nf = 0;
        if (out_open) fds[nf++] = {out.r, POLLIN, 0};
        if (verdict_open) fds[nf++] = {verdict_out->r, POLLIN, 0};
        if (nf == 0) {
            usleep(10000);
            continue;
        }
        if (poll(fds, (nfds_t)nf, 100) <= 0) continue;
        for (int i = 0; i < nf; ++i) {
            if (!(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
            const ssize_t n = read(fds[i].fd, buf, sizeof buf);
            if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
            const bool is_out = fds[i].fd == out.r;
            if (n <= 0) {
                (is_out ? out_open : verdict_open) = false;
                continue;
            }
            std::string& dst = is_out ? r.output : r.verdict;
            const size_t cap = is_out ? p.max_output : 4096;
            const size_t keep = dst.size() < cap ? std::min((size_t)n, cap - dst.size()) : 0;
            dst.append(buf, keep);
            if (is_out) r.dropped += (size_t)n - keep;
        }
    }
    killpg(pid, SIGKILL);  // whatever it started and left running
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    r.status = r.timed_out ? 124 : WIFEXITED(status) ? WEXITSTATUS(status) : 128 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
    return r;
}

// FNV-1a, 64 bits: names a build by the bytes that went into it.
struct Hash {
    uint64_t h = 0xcbf29ce484222325ull;
    void add(const std::string& s) {
        for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ull;
        h = (h ^ 0xff) * 0x100000001b3ull;  // a separator, so "ab"+"c" != "a"+"bc"
    }
    std::string hex() const {
        char b[17];
        std::snprintf(b, sizeof b, "%016llx", (unsigned long long)h);
        return b;
    }
};

// 128 random bits in hex, from the operating system's generator.
std::string random_hex() {
    std::random_device rd;
    std::string s;
    for (int i = 0; i < 4; ++i) {
        char b[9];
        std::snprintf(b, sizeof b, "%08x", (unsigned)rd());
        s += b;
    }
    return s;
}

// The project's files, relative to `root`: what git tracks plus new files it
// does not ignore, or (no git) every file outside build/ and .git/.
std::vector<std::string> project_files(const fs::path& root) {
    std::vector<std::string> files;
    if (fs::exists(root / ".git")) {
        const RunResult r = run_process(command({"git", "-C", root.string(), "ls-files", "-z", "--cached", "--others", "--exclude-standard"}));
        if (r.status == 0 && r.dropped == 0)
            for (size_t s = 0, e; s < r.output.size(); s = e + 1) {
                e = r.output.find('\0', s);
                if (e == std::string::npos) e = r.output.size();
                const std::string f = r.output.substr(s, e - s);
                if (!f.empty() && fs::is_regular_file(root / f)) files.push_back(f);
            }
    }
    if (files.empty()) {
        for (auto it = fs::recursive_directory_iterator(root); it != fs::recursive_directory_iterator(); ++it) {
            const std::string rel = fs::relative(it->path(), root).generic_string();
            if (it->is_directory() && (rel == "build" || rel == ".git" || rel == ".doctest")) {
                it.disable_recursion_pending();
                continue;
            }
            if (it->is_regular_file()) files.push_back(rel);
        }
    }
    std::sort(files.begin(), files.end());
    files.erase(std::unique(files.begin(), files.end()), files.end());
    return files;
}

// Run jobs(0..n-1) on up to `threads` threads. An exception in any job
// (std::bad_alloc from a runaway check included) stops the others from
// taking new jobs and is thrown again here, in the caller's thread, with
// `what(i)` saying which job it was: it reaches the top of the program
// instead of terminating it from a worker.
void parallel_for(int n, int threads, const std::function<void(int)>& job, const std::function<std::string(int)>& what = {}) {
    std::atomic<int> next{0};
    std::atomic<bool> stop{false};
    std::mutex mu;
    std::string first_error;
    auto fail = [&](int i, const std::string& msg) {
        std::lock_guard<std::mutex> lock(mu);
        if (first_error.empty()) first_error = (what ? what(i) + ": " : std::string()) + msg;
        stop = true;
    };
    auto worker = [&] {
        for (int i; !stop && (i = next++) < n;) {
            try {
                job(i);
            } catch (const std::bad_alloc&) {
                fail(i, "out of memory (std::bad_alloc)");
            } catch (const std::exception& e) {
                fail(i, e.what());
            } catch (...) {
                fail(i, "an exception that is not a std::exception");
            }
        }
    };
    std::vector<std::thread> pool;
    try {
        for (int t = 0; t < std::max(1, std::min(threads, n)); ++t) pool.emplace_back(worker);
    } catch (...) {  // no thread to be had: stop the ones that run, then say why
        stop = true;
        for (auto& th : pool) th.join();
        throw;
    }
    for (auto& th : pool) th.join();
    if (!first_error.empty()) throw std::runtime_error(first_error);
}

// ============================================================================
// 2. Regions
// ============================================================================
//
// A region is found by its two marker lines. `body_begin`..`body_end` is the
// text strictly between them (whole lines), which is what a student writes
// and what the grader splices.

struct Region {
    int number = 0;
    std::string title;
    std::string indent;     // the begin marker's indentation
    size_t body_begin = 0;  // offset just after the begin marker's line
    size_t body_end = 0;    // offset of the end marker's line
    int line = 0;           // 1-based line of the begin marker
};

const std::string kMarker = "// ---- exercise ";

// The regions of one file, in order. Throws on a marker out of place: an end
// without a begin, a begin inside a region, a number that does not match.
std::vector<Region> find_regions(const std::string& text, const std::string& name) {
    std::vector<Region> out;
    bool open = false;
    Region cur;
    size_t pos = 0;
    int line_no = 0;
    while (pos < text.size()) {
        size_t eol = text.find('\n', pos);
        const size_t next = eol == std::string::npos ? text.size() : eol + 1;
        ++line_no;
        std::string line = text.substr(pos, next - pos);
        while (!line.empty() && (line.back() == '\n' || line.back() == '\r' || line.back() == ' ')) line.pop_back();
        const size_t ind = line.find_first_not_of(" \t");
        if (ind != std::string::npos && line.compare(ind, kMarker.size(), kMarker) == 0 && line.size() > 5 &&
            line.compare(line.size() - 5, 5, " ----") == 0) {
            // "N begin: TITLE" or "N end"
            const std::string rest = line.substr(ind + kMarker.size(), line.size() - 5 - ind - kMarker.size());
            const std::string where = name + ":" + std::to_string(line_no);
            size_t digits = 0;
            while (digits < rest.size() && std::isdigit((unsigned char)rest[digits])) ++digits;
            if (digits == 0 || digits > 3) throw std::runtime_error(where + ": exercise marker without a number");
            const int n = std::stoi(rest.substr(0, digits));
            const std::string what = rest.substr(digits);
            if (what.rfind(" begin: ", 0) == 0) {
                if (open) throw std::runtime_error(where + ": exercise " + std::to_string(n) + " begins inside exercise " + std::to_string(cur.number));
                cur = Region{};
                cur.number = n;
                cur.title = what.substr(8);
                cur.indent = line.substr(0, ind);
                cur.body_begin = next;
                cur.line = line_no;
                open = true;
            } else if (what == " end") {
                if (!open || n != cur.number)
                    throw std::runtime_error(where + ": end of exercise " + std::to_string(n) + " without its begin");
                cur.body_end = pos;
                out.push_back(cur);
                open = false;
            } else {
                throw std::runtime_error(where + ": a marker reads 'exercise N begin: TITLE' or 'exercise N end'");
            }
        }
        pos = next;
    }
    if (open) throw std::runtime_error(name + ":" + std::to_string(cur.line) + ": exercise " + std::to_string(cur.number) + " never ends");
    return out;
}

// Files that may carry regions: the project's own sources. Not tools/ (this
// file) and not tests/ (the checks must stay whole).
bool may_carry_regions(const std::string& rel) {
    if (rel.rfind("tools/", 0) == 0 || rel.rfind("tests/", 0) == 0) return false;
    for (const char* ext : {".hpp", ".cuh", ".h", ".cpp", ".cu"})
        if (rel.size() > std::string(ext).size() && rel.compare(rel.size() - std::string(ext).size(), std::string::npos, ext) == 0)
            return true;
    return false;
}

struct Exercise {
    int number = 0;
    std::string title;
    std::vector<std::pair<std::string, int>> places;  // (file, line) of each region
};

// A lab exercise is titled "lab LN: ...": it is lab/ code, taught in
// lab/LAB.md chapter LN, not the reference's (COURSE.md). "LN" for one, ""
// for a core exercise. Core exercises come first, and their checks use no
// lab/ code (`kit selftest` checks both).
std::string lab_chapter(const std::string& title) {
    if (title.rfind("lab L", 0) != 0) return "";
    size_t i = 5;
    while (i < title.size() && std::isdigit((unsigned char)title[i])) ++i;
    if (i == 5 || title.compare(i, 2, ": ") != 0) return "";
    return title.substr(4, i - 4);
}

// Every exercise of the tree at `root`, by number.
std::map<int, Exercise> scan_exercises(const fs::path& root, const std::vector<std::string>& files) {
    std::map<int, Exercise> ex;
    for (const std::string& f : files) {
        if (!may_carry_regions(f)) continue;
        const std::string text = read_file(root / f);
        if (text.find(kMarker) == std::string::npos) continue;
        for (const Region& r : find_regions(text, f)) {
            Exercise& e = ex[r.number];
            if (e.number == 0) {
                e.number = r.number;
                e.title = r.title;
            } else if (e.title != r.title) {
                throw std::runtime_error(f + ":" + std::to_string(r.line) + ": exercise " + std::to_string(r.number) +
                                         " is titled '" + e.title + "' elsewhere");
            }
            e.places.push_back({f, r.line});
        }
    }
    return ex;
}

// "1, 2, ..., 11": the exercises there are, for messages.
std::string numbers_of(const std::map<int, Exercise>& ex) {
    std::string s;
    for (const auto& [n, e] : ex) s += (s.empty() ? "" : ", ") + std::to_string(n);
    return s;
}

// What replaces a region's code in a student copy: the hint (the comment lines
// that open the region) and one statement that fails loudly. In .cuh files the
// code may run on a GPU, where a thread cannot throw: PKV_EXERCISE_TODO
// (cuda_shim.hpp) prints and traps there, and throws on the host.
std::string stub_body(const std::string& text, const Region& r, const std::string& file) {
    std::string hint;
    size_t pos = r.body_begin;
    while (pos < r.body_end) {
        const size_t next = std::min(text.find('\n', pos) + 1, r.body_end);
        const std::string line = text.substr(pos, next - pos);
        const size_t ind = line.find_first_not_of(" \t");
        if (ind == std::string::npos || line.compare(ind, 2, "//") != 0) break;
        hint += line;
        pos = next;
    }
    const bool device_code = file.size() > 4 && file.compare(file.size() - 4, 4, ".cuh") == 0;
    const std::string n = std::to_string(r.number);
    const std::string stmt = device_code ? "PKV_EXERCISE_TODO(" + n + ", \"" + r.title + "\");"
                                         : "throw std::logic_error(\"exercise " + n + " (" + r.title + "): not implemented\");";
    return hint + r.indent + stmt + "\n";
}

// `text` with the regions whose number is in `which` replaced by stubs.
std::string cut_text(const std::string& text, const std::string& file, const std::set<int>& which) {
    std::string out;
    size_t pos = 0;
    for (const Region& r : find_regions(text, file)) {
        if (!which.count(r.number)) continue;
        out += text.substr(pos, r.body_begin - pos);
        out += stub_body(text, r, file);
        pos = r.body_end;
    }
    return out + text.substr(pos);
}

// The exercises of the tree at `root` with a region that is a stub exactly as
// `kit cut` writes it (its hint, then the statement that fails loudly): what
// a student copy has and the reference never does.
std::set<int> stubbed_exercises(const fs::path& root, const std::vector<std::string>& files) {
    std::set<int> stubbed;
    for (const std::string& f : files) {
        if (!may_carry_regions(f)) continue;
        const std::string text = read_file(root / f);
        if (text.find(kMarker) == std::string::npos) continue;
        for (const Region& r : find_regions(text, f))
            if (text.compare(r.body_begin, r.body_end - r.body_begin, stub_body(text, r, f)) == 0) stubbed.insert(r.number);
    }
    return stubbed;
}

// `ref` with exercise n's regions taken from `student` (the same file in the
// student's copy). The markers must still be there, in the same number.
std::string splice(const std::string& ref, const std::string& student, const std::string& file, int n) {
    std::vector<Region> rr, sr;
    for (const Region& r : find_regions(ref, file))
        if (r.number == n) rr.push_back(r);
    for (const Region& r : find_regions(student, file + " (your copy)"))
        if (r.number == n) sr.push_back(r);
    if (rr.size() != sr.size())
        throw std::runtime_error(file + ": your copy has " + std::to_string(sr.size()) + " region(s) of exercise " +
                                 std::to_string(n) + ", the reference " + std::to_string(rr.size()) +
                                 ": put the begin/end marker lines back as they were");
    std::string out;
    size_t pos = 0;
    for (size_t i = 0; i < rr.size(); ++i) {
        out += ref.substr(pos, rr[i].body_begin - pos);
        out += student.substr(sr[i].body_begin, sr[i].body_end - sr[i].body_begin);
        pos = rr[i].body_end;
    }
    return out + ref.substr(pos);
}

// A student's file with regions: a plain file (a symbolic link could point
// anywhere, the reference's solution included), of a sane size.
std::string read_student_file(const fs::path& copy, const std::string& rel) {
    const fs::path p = copy / rel;
    std::error_code ec;
    const fs::file_status st = fs::symlink_status(p, ec);
    if (ec || !fs::exists(st)) throw std::runtime_error(rel + " is missing from your copy");
    if (fs::is_symlink(st)) throw std::runtime_error(rel + " is a symbolic link in your copy: a submission's files must be plain files");
    if (!fs::is_regular_file(st)) throw std::runtime_error(rel + " is not a plain file in your copy");
    // Nor may a folder on the way be a link out of the copy.
    const std::string real = fs::canonical(p).string(), base = fs::canonical(copy).string() + "/";
    if (real.rfind(base, 0) != 0) throw std::runtime_error(rel + " lies outside your copy (a folder on its path is a symbolic link)");
    return read_file(p, kMaxRegionFileBytes);
}

// ============================================================================
// 3. The scan: what a region may not contain
// ============================================================================
//
// A region is the inside of a function, and the checks run it. Before a
// region from a student's copy is compiled, we read it as the compiler would
// (comments, string and character literals, numbers with digit separators)
// and refuse, naming the line:
//   - any '#' (a preprocessor line: #define CHECK, #undef, #include, #pragma)
//     and its digraph "%:", and _Pragma: a region could otherwise rewrite the
//     macros of the code after it;
//   - a backslash outside a literal (a line splice, or a universal character
//     name that spells a refused name), a raw string literal, a character
//     outside ASCII;
//   - a '}' that closes a brace the region did not open, or a '{' it leaves
//     open, and the digraphs "<%" "%>": code must stay inside its function
//     (outside it, a global object's constructor would run before main);
//   - the names below, unless right after '.' or '->' (a member of one of
//     our objects): calls that end the process (exit, abort: a check must
//     end by returning, or the grader cannot tell a pass from an escape),
//     start programs, touch files, descriptors or the environment, inline
//     assembly and compiler back doors, and doctest's names.
// This is a tripwire for the obvious, not a proof: C++ has raw pointers,
// and the real guarantee is the verdict channel (section 6), which code
// that leaves early or prints its own summary cannot satisfy.

struct Refused {
    const char* names;  // space-separated
    const char* why;
};
const Refused kRefusedNames[] = {
    {"exit _Exit _exit quick_exit abort terminate atexit at_quick_exit set_terminate raise kill killpg signal sigaction "
     "longjmp setjmp siglongjmp sigsetjmp pthread_exit pthread_kill tgkill alarm",
     "ends or signals the process (a check must end by returning)"},
    {"system popen pclose fork vfork clone execl execlp execle execv execvp execve execvpe posix_spawn posix_spawnp daemon "
     "ptrace prctl setrlimit syscall dlopen dlsym",
     "starts programs or reaches into the system"},
    {"fopen freopen fdopen tmpfile tmpnam mkstemp open openat creat read write pread pwrite readv writev close dup dup2 "
     "dup3 pipe pipe2 socket connect bind sendfile splice mmap munmap mprotect ioctl fcntl unlink unlinkat rename renameat "
     "mkdir rmdir chdir chmod chown link symlink truncate ftruncate ofstream ifstream fstream basic_ofstream "
     "basic_ifstream basic_fstream filebuf basic_filebuf filesystem FILE save_checkpoint",
     "touches files or descriptors"},
    {"getenv secure_getenv setenv unsetenv putenv clearenv environ", "reads or changes the environment"},
    {"asm __asm __asm__ __attribute__ __attribute __declspec extern", "is inline assembly or a declaration that reaches outside"},
};
const char* const kRefusedPrefixes[] = {"__builtin_", "__sanitizer", "__tsan", "__asan", "__ubsan", "__lsan", "__cxa_", "doctest", "DOCTEST"};

// Why `word` (an identifier) may not appear in a region, or "".
std::string refused_name(const std::string& word) {
    for (const Refused& r : kRefusedNames) {
        std::istringstream ss(r.names);
        for (std::string w; ss >> w;)
            if (w == word) return r.why;
    }
    for (const char* p : kRefusedPrefixes)
        if (word.rfind(p, 0) == 0)
            return std::string(p).rfind("doctest", 0) == 0 || std::string(p) == "DOCTEST" ? "belongs to the checks (doctest)"
                                                                                          : "is a compiler or sanitizer back door";
    return "";
}

// "" when the region body `body` (from `file`, its first line `first_line`)
// may be compiled; else "file:line: why" for the first thing refused.
std::string scan_region(const std::string& body, const std::string& file, int first_line) {
    int line = first_line, depth = 0;
    bool member = false;  // the last token was '.' or '->'
    auto at = [&](const std::string& why) { return file + ":" + std::to_string(line) + ": " + why; };
    const size_t n = body.size();
    auto ident_char = [](char c) { return std::isalnum((unsigned char)c) || c == '_'; };
    for (size_t i = 0; i < n;) {
        const char c = body[i];
        if (c == '\n') {
            ++line;
            ++i;
            continue;
        }
        if (c == ' ' || c == '\t' || c == '\r' || c == '\f' || c == '\v') {
            ++i;
            continue;
        }
        if ((unsigned char)c >= 0x80) return at("a character outside ASCII, outside a comment or a string: write code in ASCII");
        if (c == '/' && i + 1 < n && body[i + 1] == '/') {  // to the end of the line (a trailing '\' would
            while (i < n && body[i] != '\n') ++i;          // continue it: we then scan more, never less)
            continue;
        }
        if (c == '/' && i + 1 < n && body[i + 1] == '*') {
            const size_t e = body.find("*/", i + 2);
            if (e == std::string::npos) return at("a /* comment that does not end inside the region");
            line += (int)std::count(body.begin() + (long)i, body.begin() + (long)e, '\n');
            i = e + 2;
            continue;
        }
        if (c == '"' || c == '\'') {  // a literal: escapes skip one character, a bare newline ends it badly
            size_t j = i + 1;
            while (j < n && body[j] != c) {
                if (body[j] == '\n') return at("a string or character literal without its closing quote");
                if (body[j] == '\\') ++j;
                if (j < n && body[j] == '\n') ++line;
                ++j;
            }
            if (j >= n) return at("a string or character literal without its closing quote");
            i = j + 1;
            member = false;
            continue;
        }
        if (std::isdigit((unsigned char)c) || (c == '.' && i + 1 < n && std::isdigit((unsigned char)body[i + 1]))) {
            // A pp-number: 1'000'000, 0x1p-3, 1e+9f. Its quotes are digit separators.
            size_t j = i + 1;
            while (j < n) {
                if (ident_char(body[j]) || body[j] == '.') ++j;
                else if ((body[j] == '+' || body[j] == '-') && std::strchr("eEpP", body[j - 1])) ++j;
                else if (body[j] == '\'' && j + 1 < n && ident_char(body[j + 1])) j += 2;
                else break;
            }
            i = j;
            member = false;
            continue;
        }
        if (std::isalpha((unsigned char)c) || c == '_') {
            size_t j = i;
            while (j < n && ident_char(body[j])) ++j;
            const std::string word = body.substr(i, j - i);
            if (j < n && body[j] == '"' && (word == "R" || word == "LR" || word == "uR" || word == "UR" || word == "u8R"))
                return at("a raw string literal: use an ordinary one");
            if (word == "_Pragma") return at("_Pragma is a preprocessor directive, and a region has none");
            if (!member) {
                const std::string why = refused_name(word);
                if (!why.empty())
                    return at("'" + word + "' " + why + ": the kit refuses it in a region (if it is a name of yours, rename it)");
            }
            member = false;
            i = j;
            continue;
        }
        if (c == '#' || (c == '%' && i + 1 < n && body[i + 1] == ':'))
            return at("a preprocessor line or '#': a region holds code only (no #define, #undef, #include, #pragma)");
        if ((c == '<' && i + 1 < n && body[i + 1] == '%') || (c == '%' && i + 1 < n && body[i + 1] == '>'))
            return at("a digraph for a brace: write { and }");
        if (c == '\\') return at("a backslash outside a literal (a line splice or a \\u name): not in a region");
        if (c == '{') ++depth;
        if (c == '}' && --depth < 0) return at("this '}' closes a brace the region did not open: code must stay inside its function");
        member = c == '.' || (c == '>' && i > 0 && body[i - 1] == '-');
        ++i;
    }
    if (depth != 0) return at("the region leaves " + std::to_string(depth) + " brace(s) open: code must stay inside its function");
    return "";
}

// Every region of exercise `n` in `text` (a student's `file`), scanned.
std::string scan_exercise(const std::string& text, const std::string& file, int n) {
    for (const Region& r : find_regions(text, file)) {
        if (r.number != n) continue;
        const std::string why = scan_region(text.substr(r.body_begin, r.body_end - r.body_begin), file, r.line + 1);
        if (!why.empty()) return why;
    }
    return "";
}

// ============================================================================
// 4. A little JSON, for the engine's --json output
// ============================================================================
//
// Enough of JSON to read what overload and study print: objects, arrays,
// strings (the escapes they use), numbers, true/false/null.

struct Json {
    enum Kind { kNull, kBool, kNumber, kString, kArray, kObject } kind = kNull;
    double number = 0;
    bool boolean = false;
    std::string string;
    std::vector<Json> array;
    // An object's fields, in order: keys[i] names values[i]. (Two vectors and
    // not one of pairs: a pair cannot hold the still-incomplete Json type.)
    std::vector<std::string> keys;
    std::vector<Json> values;

    const Json& operator[](const std::string& key) const {
        for (size_t i = 0; i < keys.size(); ++i)
            if (keys[i] == key) return values[i];
        throw std::runtime_error("JSON: no field '" + key + "'");
    }
    // A number, or a string holding one (the studies' tables print strings).
    double as_number() const {
        if (kind == kNumber) return number;
        if (kind == kString) {
            double x;
            if (cli::to_real(string.c_str(), -1e300, 1e300, x)) return x;
        }
        throw std::runtime_error("JSON: expected a number");
    }
};

class JsonParser {
public:
    explicit JsonParser(const std::string& s) : s_(s) {}
    Json parse() {
        Json v = value();
        space();
        if (i_ != s_.size()) fail("text after the value");
        return v;
    }

private:
    [[noreturn]] void fail(const std::string& what) { throw std::runtime_error("JSON: " + what + " at offset " + std::to_string(i_)); }
    void space() {
        while (i_ < s_.size() && std::isspace((unsigned char)s_[i_])) ++i_;
    }
    bool eat(char c) {
        space();
        if (i_ < s_.size() && s_[i_] == c) return ++i_, true;
        return false;
    }
    Json value() {
        space();
        if (i_ >= s_.size()) fail("unexpected end");
        Json v;
        const char c = s_[i_];
        if (c == '{') {
            v.kind = Json::kObject;
            ++i_;
            if (eat('}')) return v;
            do {
                space();
                v.keys.push_back(str());
                if (!eat(':')) fail("expected ':'");
                v.values.push_back(value());
            } while (eat(','));
            if (!eat('}')) fail("expected '}'");
        } else if (c == '[') {
            v.kind = Json::kArray;
            ++i_;
            if (eat(']')) return v;
            do v.array.push_back(value());
            while (eat(','));
            if (!eat(']')) fail("expected ']'");
        } else if (c == '"') {
            v.kind = Json::kString;
            v.string = str();
        } else if (s_.compare(i_, 4, "true") == 0 || s_.compare(i_, 5, "false") == 0) {
            v.kind = Json::kBool;
            v.boolean = c == 't';
            i_ += v.boolean ? 4 : 5;
        } else if (s_.compare(i_, 4, "null") == 0) {
            i_ += 4;
        } else {
            size_t end = i_;
            while (end < s_.size() && std::strchr("+-0123456789.eE", s_[end])) ++end;
            double x;
            if (end == i_ || !cli::to_real(s_.substr(i_, end - i_).c_str(), -1e308, 1e308, x)) fail("bad value");
            v.kind = Json::kNumber;
            v.number = x;
            i_ = end;
        }
        return v;
    }
    std::string str() {
        if (i_ >= s_.size() || s_[i_] != '"') fail("expected a string");
        std::string out;
        for (++i_; i_ < s_.size() && s_[i_] != '"'; ++i_) {
            if (s_[i_] != '\\') {
                out += s_[i_];
                continue;
            }
            if (++i_ >= s_.size()) break;
            const char e = s_[i_];
            if (e == 'n') out += '\n';
            else if (e == 't') out += '\t';
            else if (e == 'u') {  // \u00XX only: the programs escape control characters so
                if (i_ + 4 >= s_.size()) fail("bad \\u escape");
                out += (char)std::stoi(s_.substr(i_ + 1, 4), nullptr, 16);
                i_ += 4;
            } else out += e;
        }
        if (i_ >= s_.size()) fail("unterminated string");
        ++i_;
        return out;
    }
    const std::string& s_;
    size_t i_ = 0;
};


// ============================================================================
// 5. The analysis questions
// ============================================================================
//
// Each question names the command a student runs (in the project folder,
// after `make`) and reads a figure from. The grader runs the same program
// with --json, built from the reference, and takes the figure from the
// engine's own output, so the answer key can never go stale: change the
// engine and the key moves.

struct Question {
    std::string id, text;
    std::string program;                      // overload, study: a program of examples/ or lab/
    std::vector<std::string> args;            // what the student types after ./build/PROGRAM
    std::function<double(const Json&)> pick;  // the answer, from the --json output
    double rel_tolerance = 0;                 // 0: exactly
    std::string lab;                          // a lab question: the lab/LAB.md chapters it draws on ("" = core)
    std::string command() const {
        std::string c = "./build/" + program;
        for (const std::string& a : args) c += " " + a;
        return c;
    }
};

std::vector<Question> questions() {
    std::vector<Question> q;
    q.push_back({"q1",
                 "The default overload workload (24 requests of 32 + 96 tokens on 40 blocks of 16) runs with at most\n"
                 "8 requests at once. How many tokens does the engine compute again because a preempted\n"
                 "request lost its KV cache (vLLM's recomputed tokens)?",
                 "overload", {"--max-num-seqs", "8"},
                 [](const Json& j) { return j["metrics"]["recomputed_tokens_total"].as_number(); }, 0, ""});
    q.push_back({"q2",
                 "The same workload with the default max_num_seqs and prefix caching on. How many prompt and\n"
                 "recomputed tokens are served from the prefix cache instead of being computed (prefix cache hits)?",
                 "overload", {"--prefix-caching", "on"},
                 [](const Json& j) { return j["metrics"]["prefix_cache_hits"].as_number(); }, 0, ""});
    q.push_back({"q3",
                 "A lab question (lab/LAB.md chapters L5 and L6: the studies and the simulated GPU). On a\n"
                 "simulated L4 whose host link is cut to 2 GB/s, the preemption study's part two brings one\n"
                 "victim of each length back with recompute and with swap. From which length on does swap finish\n"
                 "sooner than recompute? Give the first such length.",
                 "study", {"preemption", "--device", "sim", "--gpu", "l4", "--pcie-gbps", "2"},
                 [](const Json& j) {
                     // rows: part, length, link, mode, ..., "makespan s"; in
                     // part two, the first "swap" row of a length against its
                     // "recompute" row.
                     std::map<double, double> rec, swp;
                     std::vector<double> order;
                     for (const Json& row : j["table"].array) {
                         if (row["part"].string != "2") continue;
                         const double len = row["length"].as_number();
                         const std::string mode = row["mode"].string;
                         const double t = row["makespan s"].as_number();
                         if (std::find(order.begin(), order.end(), len) == order.end()) order.push_back(len);
                         if (mode == "recompute") rec[len] = t;
                         if (mode == "swap" && !swp.count(len)) swp[len] = t;
                     }
                     for (double len : order)
                         if (rec.count(len) && swp.count(len) && swp[len] < rec[len]) return len;
                     return std::nan("");
                 },
                 0, "L5, L6"});
    return q;
}

// The student's answers: "qN = number" lines; '#' starts a comment; a later
// line for the same question wins.
std::map<std::string, std::string> read_answers(const fs::path& file) {
    std::map<std::string, std::string> a;
    if (!fs::exists(file)) return a;
    std::istringstream ss(read_file(file, 1u << 20));
    for (std::string line; std::getline(ss, line);) {
        if (const size_t h = line.find('#'); h != std::string::npos) line.resize(h);
        const size_t eq = line.find('=');
        if (eq == std::string::npos) continue;
        auto trim = [](std::string s) {
            s.erase(0, s.find_first_not_of(" \t\r"));
            s.erase(s.find_last_not_of(" \t\r") + 1);
            return s;
        };
        a[trim(line.substr(0, eq))] = trim(line.substr(eq + 1));
    }
    return a;
}

// ANSWERS.txt as `kit cut` writes it: the exercises cut (when `cut` is
// given, with their titles from `ex`), then the questions.
std::string answers_template(const std::map<int, Exercise>* ex = nullptr, const std::set<int>* cut = nullptr) {
    std::string t = "# pagedkv: your exercises and the analysis questions.\n";
    if (ex && cut && !cut->empty()) {
        t += "#\n# The exercises cut in this copy (`./build/kit list` says where each one is). A title\n"
             "# that starts \"lab LN:\" is a lab exercise: lab/ code, taught in lab/LAB.md chapter LN;\n"
             "# the others are the reference's, in the TUTORIAL's order.\n";
        for (int n : *cut) {
            char line[128];
            std::snprintf(line, sizeof line, "#   exercise %-2d %s\n", n, ex->at(n).title.c_str());
            t += line;
        }
    }
    t += "#\n"
         "# The questions: build the project (make), run the command each question names, read the\n"
         "# figure off its output and write it after the '='. The grader checks every answer against\n"
         "# the reference engine's own --json output.\n";
    for (const Question& q : questions()) {
        t += "\n";
        std::istringstream ss(q.text);
        bool first = true;
        for (std::string line; std::getline(ss, line); first = false)
            t += (first ? "# " + q.id + ". " : "#     ") + line + "\n";
        t += "#     command: " + q.command() + "\n";
        t += q.id + " =\n";
    }
    return t;
}

// ============================================================================
// 6. Building and running the checks
// ============================================================================

struct Options {
    std::string cxx = "g++";
    int jobs = 2;
    int timeout_s = 60;
    bool verbose = false;
    bool scan = true;  // the region scan (section 3); off only in the self-test's second line of defence
    bool tsan_always = false;  // run the TSan check even when other checks fail (the self-test's step d)
};

// One check's outcome.
struct CheckResult {
    std::string name;
    bool pass = false;
    std::string why;  // when it failed: "not implemented", "needs exercise 4", the first lines printed
};

struct ExerciseResult {
    int number = 0;
    std::string title;
    std::vector<CheckResult> checks;
    std::string build_error;  // the check program did not compile, or the tree could not be made
    std::string refused;      // the scan refused a region: "file:line: why"
    int passed() const {
        int n = 0;
        for (const auto& c : checks) n += c.pass;
        return n;
    }
    bool pass() const { return build_error.empty() && refused.empty() && !checks.empty() && passed() == (int)checks.size(); }
    bool all_not_implemented() const {
        if (checks.empty() || !refused.empty()) return false;
        for (const auto& c : checks)
            if (c.pass || c.why != "not implemented") return false;
        return true;
    }
    const CheckResult* check(const std::string& name) const {
        for (const auto& c : checks)
            if (c.name == name) return &c;
        return nullptr;
    }
};

// The names of a check file's TEST_CASEs, in order.
std::vector<std::string> check_names(const std::string& src) {
    std::vector<std::string> names;
    for (size_t p = 0; (p = src.find("TEST_CASE(\"", p)) != std::string::npos;) {
        p += 11;
        const size_t e = src.find('"', p);
        if (e == std::string::npos) break;
        names.push_back(src.substr(p, e - p));
    }
    return names;
}
bool has_tsan_check(const std::string& src) { return src.find("// kit: tsan") != std::string::npos; }
const char* const kTsanCheck = "no data race under ThreadSanitizer";

// A check name as the verdict line writes it (tests/exercises/main.cpp):
// blanks become '_'.
std::string verdict_word(std::string s) {
    for (char& c : s)
        if (c == ' ' || c == '\n' || c == '\r' || c == '\t') c = '_';
    return s;
}

// Does the verdict line say that exactly the cases `names` ran, none failed?
// "" when it does, else what is wrong with it. `nonce` is the one we gave.
std::string read_verdict(const std::string& verdict, const std::string& nonce, std::vector<std::string> names) {
    if (verdict.empty()) return "the check ended without reporting (an exit, an abort or a crash before its end)";
    if (std::count(verdict.begin(), verdict.end(), '\n') != 1 || verdict.back() != '\n')
        return "the verdict channel carried something other than one verdict line";
    std::istringstream ss(verdict);
    std::string tag, got_nonce;
    long cases = -1, failed = -1;
    ss >> tag >> got_nonce >> cases >> failed;
    if (tag != "pkv-kit-verdict" || !ss) return "the verdict channel carried something other than a verdict";
    if (got_nonce != nonce) return "a verdict with the wrong nonce (not written by the check's main)";
    std::vector<std::string> ran;
    for (std::string w; ss >> w;) ran.push_back(w);
    for (std::string& n : names) n = verdict_word(n);
    std::sort(ran.begin(), ran.end());
    std::sort(names.begin(), names.end());
    if (cases != (long)ran.size() || ran != names)
        return cases == 0 ? "no check of that name ran" : "other checks ran than the one asked for";
    if (failed != 0) return "failed";
    return "";
}

std::string first_lines(const std::string& text, int n) {
    std::istringstream ss(text);
    std::string out;
    int k = 0;
    for (std::string line; std::getline(ss, line) && k < n;) {
        if (line.find_first_not_of(" =\t") == std::string::npos) continue;  // doctest's rulers
        if (line.rfind("[doctest]", 0) == 0 || line.rfind("TEST CASE:", 0) == 0) continue;
        if (line.back() == ':' && line.find(' ') == std::string::npos) continue;  // "file:line:" of the case
        out += (k++ ? "\n" : "") + line;
    }
    return out;
}

// `text` without any occurrence of `cut` (the grading tree's path, which
// means nothing to a student).
std::string without(std::string text, const std::string& cut) {
    for (size_t p; (p = text.find(cut)) != std::string::npos;) text.erase(p, cut.size());
    return text;
}

// Why a check failed, from what it printed. The pass itself was decided by
// the verdict; this only explains a failure to the student.
std::string reason(const RunResult& r, int exercise, const std::string& verdict_problem) {
    if (r.timed_out) return "timed out";
    // A stub's message: ours, or another exercise's (self-check mode).
    for (size_t p = 0; (p = r.output.find("): not implemented", p)) != std::string::npos; ++p) {
        const size_t s = r.output.rfind("exercise ", p);
        if (s == std::string::npos) continue;
        // The digits after "exercise ", read strictly: a message cut short
        // or garbled yields no number rather than a wrong one.
        size_t e = s + 9;
        while (e < r.output.size() && e < s + 12 && std::isdigit((unsigned char)r.output[e])) ++e;
        long long k = 0;
        if (!cli::to_integer(r.output.substr(s + 9, e - s - 9).c_str(), 1, 999, k)) continue;
        if (k == exercise) return "not implemented";
        return "needs exercise " + std::to_string(k);
    }
    std::string why = first_lines(r.output, 4);
    if (why.empty() || verdict_problem != "failed") why = verdict_problem + (why.empty() ? "" : "\n" + why);
    if (r.dropped > 0)
        why = "(it printed " + std::to_string(r.output.size() + r.dropped) + " bytes; the grader kept the first " +
              std::to_string(r.output.size()) + ")\n" + why;
    return why;
}

// Where doctest's header is, as compiler flags: $DOCTEST_INC, else the
// copy that tests/get_doctest.sh fetched into a build/deps of `roots` (the
// reference first), else "" when the compiler finds it itself (Debian's
// doctest-dev). Throws when it is nowhere.
std::vector<std::string> doctest_flags(const std::vector<fs::path>& roots) {
    std::vector<fs::path> dirs;
    if (const char* d = std::getenv("DOCTEST_INC"); d && *d) dirs.push_back(d);
    for (const fs::path& r : roots) dirs.push_back(r / "build/deps/include");
    for (const fs::path& d : dirs)
        if (fs::exists(d / "doctest/doctest.h")) return {"-isystem", fs::absolute(d).string()};
    for (const char* d : {"/usr/include", "/usr/local/include"})
        if (fs::exists(fs::path(d) / "doctest/doctest.h")) return {};
    throw std::runtime_error("doctest is not installed: run `make check-doctest` in the reference (it installs or fetches it)");
}

// The grader's workshop: a private temporary folder (mode 0700, a random
// name, deleted when the grader is done) where each grading tree is written
// and compiled. Nothing is taken from an earlier run or from the copy's
// build/: every program is built here, fresh, from sources the grader wrote.
// Within one run, identical trees (every exercise the student got right is
// byte-for-byte the reference) share one build, and the self-test, which
// grades the same trees many times, runs each (program, check) once.
class Grader {
public:
    Grader(Options opt, std::vector<std::string> doctest) : opt_(std::move(opt)), doctest_(std::move(doctest)) {
        std::string tmpl = (fs::temp_directory_path() / "pagedkv-grade-XXXXXX").string();
        if (!mkdtemp(tmpl.data())) throw std::runtime_error("cannot make a temporary folder: " + std::string(std::strerror(errno)));
        work_ = tmpl;
        fs::create_directories(work_ / "run");  // the checks' working folder: empty
    }
    ~Grader() {
        std::error_code ec;
        fs::remove_all(work_, ec);
    }
    Grader(const Grader&) = delete;
    Grader& operator=(const Grader&) = delete;
    const fs::path& work() const { return work_; }
    void set_tsan_always(bool on) { opt_.tsan_always = on; }
    const Options& options() const { return opt_; }

    // The sources of one grading tree: relative path -> text.
    using Tree = std::map<std::string, std::string>;

    // Grade exercise `n` on `tree` (which holds tests/exercises/exNN.cpp).
    ExerciseResult grade(int n, const std::string& title, const Tree& tree) {
        ExerciseResult res;
        res.number = n;
        res.title = title;
        char nn[8];
        std::snprintf(nn, sizeof nn, "%02d", n);
        const std::string check_rel = std::string("tests/exercises/ex") + nn + ".cpp";
        auto it = tree.find(check_rel);
        if (it == tree.end()) {
            res.build_error = "no checks: " + check_rel + " is missing";
            return res;
        }
        const fs::path dir = materialise(tree);
        const bool tsan = has_tsan_check(it->second);
        const fs::path bin = dir / (std::string("ex") + nn), tsan_bin = dir / (std::string("ex") + nn + "-tsan");
        const std::string err = build(dir, check_rel, bin, false);
        if (!err.empty()) {
            res.build_error = without(err, dir.string() + "/");
            return res;
        }
        const std::vector<std::string> names = check_names(it->second);
        res.checks.resize(names.size());
        parallel_for(
            (int)names.size(), opt_.jobs,
            [&](int i) {
                CheckResult& c = res.checks[i];
                c.name = names[i];
                const auto [r, problem] = memo_run(bin, {"-tc=" + names[i], "--no-colors", "--case-sensitive"}, {names[i]},
                                                   opt_.timeout_s, false);
                c.pass = problem.empty() && r.status == 0;
                if (!c.pass) c.why = without(reason(r, n, problem.empty() ? "exit status " + std::to_string(r.status) : problem),
                                             dir.string() + "/");
            },
            [&](int i) { return "exercise " + std::to_string(n) + ", check '" + names[i] + "'"; });
        if (!tsan) return res;
        // The ThreadSanitizer check: built and run only when every other
        // check passed (a kernel that computes wrong numbers fails anyway,
        // and the TSan build is the slowest of all). A stub's is "not
        // implemented" like the rest, so the exercise still reads so.
        CheckResult c;
        c.name = kTsanCheck;
        if (res.passed() != (int)names.size() && !opt_.tsan_always) {
            c.why = res.all_not_implemented() ? "not implemented" : "not run: the checks above fail first";
            res.checks.push_back(c);
            return res;
        }
        const std::string terr = build(dir, check_rel, tsan_bin, true);
        if (!terr.empty()) {
            c.why = "the ThreadSanitizer build failed: " + without(terr, dir.string() + "/");
        } else {
            const auto [r, problem] = memo_run(tsan_bin, {"--no-colors"}, names, opt_.timeout_s * 5, true);
            const bool race = r.output.find("ThreadSanitizer") != std::string::npos || r.status == 66;
            c.pass = problem.empty() && r.status == 0 && !race;
            if (!c.pass) {
                c.why = without(reason(r, n, problem.empty() ? "exit status " + std::to_string(r.status) : problem), dir.string() + "/");
                if (race) c.why = "ThreadSanitizer reports a data race (a barrier missing?)";
            }
        }
        res.checks.push_back(c);
        return res;
    }

    // Build `src` (a program of examples/ or lab/ in `root`) into the
    // workshop: a question's program when the reference's own is not up to
    // date and the reference is not ours to write to.
    fs::path build_program(const fs::path& root, const std::string& src) {
        // Named by the bytes that go into it (the program and every header),
        // not by where they lie: two copies of one reference share a build.
        Hash h;
        h.add(opt_.cxx);
        h.add(src);
        h.add(read_file(root / src));
        for (const std::string& f : project_files(root))
            if (f.ends_with(".hpp") || f.ends_with(".cuh") || f.ends_with(".h")) {
                h.add(f);
                h.add(read_file(root / f));
            }
        const fs::path out = work_ / "programs" / h.hex() / fs::path(src).stem();
        std::lock_guard<std::mutex> lock(programs_mu_);
        if (fs::exists(out)) return out;
        fs::create_directories(out.parent_path());
        std::vector<std::string> argv = compiler();
        for (const char* f : {"-O2", "-std=c++20", "-ffp-contract=off", "-fopenmp"}) argv.push_back(f);
        argv.insert(argv.end(), {"-I", root.string(), (root / src).string(), "-o", out.string()});
        const RunResult r = run_process(command(argv, {}, kCompileTimeoutS));
        if (r.status != 0) throw std::runtime_error("cannot build the reference's " + src + ":\n" + first_lines(r.output, 6));
        return out;
    }

private:
    std::vector<std::string> compiler() const {
        std::vector<std::string> argv;
        std::istringstream ss(opt_.cxx);
        for (std::string w; ss >> w;) argv.push_back(w);
        if (argv.empty()) throw std::runtime_error("no compiler: --cxx is empty");
        return argv;
    }

    // Write a tree under trees/<hash of its contents>/ (once).
    fs::path materialise(const Tree& tree) {
        Hash h;
        h.add(opt_.cxx);
        for (const auto& [path, text] : tree) {
            h.add(path);
            h.add(text);
        }
        const fs::path dir = work_ / "trees" / h.hex();
        std::lock_guard<std::mutex> lock(mu_);
        if (!trees_.count(dir)) {
            for (const auto& [path, text] : tree) write_file(dir / path, text);
            trees_.insert(dir);
        }
        return dir;
    }

    // Compile one check program in `dir`, or say why it failed. The doctest
    // main (tests/exercises/main.cpp) is compiled once per flavour and main.cpp.
    // Each program is built once per grader: later calls wait for the first.
    std::string build(const fs::path& dir, const std::string& check_rel, const fs::path& bin, bool tsan) {
        std::shared_future<std::string> done;
        std::promise<std::string> mine;
        {
            std::lock_guard<std::mutex> lock(mu_);
            auto it = builds_.find(bin.string());
            if (it != builds_.end()) done = it->second;
            else builds_[bin.string()] = mine.get_future().share();
        }
        if (done.valid()) return done.get();
        std::string err;
        try {
            err = compile(dir, check_rel, bin, tsan);
        } catch (const std::exception& e) {
            err = e.what();
        }
        mine.set_value(err);
        return err;
    }

    std::string compile(const fs::path& dir, const std::string& check_rel, const fs::path& bin, bool tsan) {
        // -Og: a check runs small workloads, and -Og compiles in about two
        // thirds of -O1's time. The ThreadSanitizer check keeps -O1, where
        // TSan's runs are faster.
        std::vector<std::string> flags = {"-std=c++20", "-ffp-contract=off", "-Wno-unknown-pragmas", tsan ? "-O1" : "-Og"};
        if (tsan) flags.insert(flags.end(), {"-g1", "-fsanitize=thread"});  // line tables: all a report prints
        flags.insert(flags.end(), doctest_.begin(), doctest_.end());
        const fs::path main_src = dir / "tests/exercises/main.cpp";
        Hash mh;
        mh.add(opt_.cxx);
        for (const std::string& f : flags) mh.add(f);
        mh.add(read_file(main_src));
        const fs::path main_obj = work_ / ("main-" + mh.hex() + ".o");
        {
            std::lock_guard<std::mutex> lock(main_mu_);
            if (!fs::exists(main_obj)) {
                const fs::path tmp = main_obj.string() + ".tmp";
                std::vector<std::string> argv = compiler();
                argv.insert(argv.end(), flags.begin(), flags.end());
                argv.insert(argv.end(), {"-c", main_src.string(), "-o", tmp.string()});
                const RunResult r = run_process(command(argv, {}, kCompileTimeoutS));
                if (r.status != 0) return "the doctest main does not compile:\n" + first_lines(r.output, 8);
                fs::rename(tmp, main_obj);
            }
        }
        std::vector<std::string> argv = compiler();
        argv.insert(argv.end(), flags.begin(), flags.end());
        const std::vector<std::string> pch = std_pch(flags);
        argv.insert(argv.end(), pch.begin(), pch.end());
        argv.insert(argv.end(), {"-I", dir.string(), (dir / check_rel).string(), main_obj.string(), "-o", bin.string(), "-lpthread"});
        const RunResult r = run_process(command(argv, {}, kCompileTimeoutS));
        if (r.status != 0) return "does not compile:\n" + first_lines(r.output, 12);
        return "";
    }

    // The standard headers the project includes, precompiled once per set of
    // flags (GCC only): {"-include", header} for a check's compilation, or {}
    // (another compiler, or the header did not precompile). It holds only the
    // standard library, which comes before every header with a region, so it
    // changes what a region sees no more than the project's own includes do;
    // it saves about a quarter of each check's compile time, and the
    // self-test compiles some fifty.
    std::vector<std::string> std_pch(const std::vector<std::string>& flags) {
        Hash h;
        h.add(opt_.cxx);
        for (const std::string& f : flags) h.add(f);
        const fs::path hdr = work_ / ("std-" + h.hex() + ".hpp");
        std::lock_guard<std::mutex> lock(pch_mu_);
        if (auto it = pch_.find(hdr.string()); it != pch_.end()) return it->second;
        std::vector<std::string>& out = pch_[hdr.string()];
        std::vector<std::string> argv = compiler();
        if (!is_gcc_) {
            std::vector<std::string> v = argv;
            v.push_back("--version");
            is_gcc_ = run_process(command(v)).output.find("Free Software Foundation") != std::string::npos ? 1 : -1;
        }
        if (is_gcc_ != 1) return out;
        std::string text = "// The standard headers of the project, precompiled by the grader.\n";
        for (const char* name : {"algorithm", "atomic", "barrier", "cctype", "cerrno", "chrono", "cmath", "condition_variable",
                                 "cstddef", "cstdint", "cstdio", "cstdlib", "cstring", "ctime", "deque", "exception", "functional",
                                 "initializer_list", "limits", "map", "memory", "mutex", "new", "numeric", "queue", "semaphore", "set",
                                 "sstream", "stdexcept", "string", "string_view", "thread", "type_traits", "unordered_map", "utility",
                                 "vector"})
            text += std::string("#include <") + name + ">\n";
        write_file(hdr, text);
        argv.insert(argv.end(), flags.begin(), flags.end());
        argv.insert(argv.end(), {"-x", "c++-header", hdr.string(), "-o", hdr.string() + ".gch"});
        if (run_process(command(argv, {}, kCompileTimeoutS)).status == 0) out = {"-include", hdr.string()};
        return out;
    }

    // Run a check program once per (program, arguments) with a fresh nonce;
    // the result and what is wrong with its verdict ("" = nothing).
    std::pair<RunResult, std::string> memo_run(const fs::path& bin, const std::vector<std::string>& args,
                                               const std::vector<std::string>& expect, int timeout_s, bool tsan) {
        std::string key = bin.string();
        for (const std::string& a : args) key += '\x1f' + a;
        {
            std::lock_guard<std::mutex> lock(mu_);
            if (auto it = memo_.find(key); it != memo_.end()) return it->second;
        }
        Proc p;
        p.argv = {bin.string()};
        p.argv.insert(p.argv.end(), args.begin(), args.end());
        p.cwd = work_ / "run";
        p.timeout_s = timeout_s;
        p.max_output = kMaxCheckOutput;
        p.nonce = random_hex();
        p.no_file_writes = !tsan;  // TSan's runtime writes a scratch file of its own in /tmp
        if (tsan) p.set_env.push_back({"TSAN_OPTIONS", "exitcode=66 halt_on_error=0"});
        const RunResult r = run_process(p);
        std::pair<RunResult, std::string> out{r, read_verdict(r.verdict, p.nonce, expect)};
        std::lock_guard<std::mutex> lock(mu_);
        memo_[key] = out;
        return out;
    }

    Options opt_;
    std::vector<std::string> doctest_;  // compiler flags that find doctest
    fs::path work_;
    std::mutex mu_, main_mu_, programs_mu_, pch_mu_;
    std::map<std::string, std::vector<std::string>> pch_;  // std_pch's, by header
    int is_gcc_ = 0;                                        // 0: not asked yet, 1: GCC, -1: another
    std::set<fs::path> trees_;
    std::map<std::string, std::shared_future<std::string>> builds_;
    std::map<std::string, std::pair<RunResult, std::string>> memo_;
};

// ============================================================================
// 7. kit cut
// ============================================================================

// Files of the reference that stay out of a student copy: the known-wrong
// implementations, whose lines quote the solutions.
const char* const kWrongDir = "tests/exercises/wrong";
bool stays_out_of_copies(const std::string& rel) { return rel.rfind(std::string(kWrongDir) + "/", 0) == 0; }

// Why `dir` is not a pagedkv reference, or "" when it is one: the reference
// has the checks' main, no .kit (a student copy has one) and the known-wrong
// implementations (tests/exercises/wrong/), which `kit cut` leaves out of
// every copy -- so a copy that lost its .kit is still told apart. Whether
// its regions are stubs is found out by scanning (reference_exercises).
std::string not_a_reference(const fs::path& dir) {
    std::error_code ec;
    if (!fs::is_regular_file(dir / "tests/exercises/main.cpp", ec)) return "it is not a pagedkv tree (no tests/exercises/main.cpp)";
    if (fs::exists(fs::symlink_status(dir / ".kit", ec))) return "it is a student copy (it has a .kit)";
    if (!fs::is_directory(dir / kWrongDir, ec))
        return std::string("it has no ") + kWrongDir + "/, which the reference has and `kit cut` leaves out of every student copy";
    return "";
}
bool is_reference(const fs::path& dir) { return not_a_reference(dir).empty(); }

// "1, 3": a set of exercise numbers, for messages.
std::string list_of(const std::set<int>& s) {
    std::string out;
    for (int n : s) out += (out.empty() ? "" : ", ") + std::to_string(n);
    return out;
}

// Extra compiler flags a student copy needs: a stub leaves parameters and
// locals unused, and -Werror would turn that into a build failure.
const char* kKitMk =
    "# Written by `kit cut`: the exercises' stubs leave parameters and variables\n"
    "# unused, which -Werror would refuse. Delete this file once every exercise is done.\n"
    "KIT_CXXFLAGS := -Wno-unused-parameter -Wno-unused-variable -Wno-unused-but-set-variable -Wno-unused-function "
    "-Wno-unused-private-field -Wno-return-type\n";

// The exercises of the reference at `root`, or an error saying it is not one.
std::map<int, Exercise> reference_exercises(const fs::path& root, const std::vector<std::string>& files) {
    if (const std::string why = not_a_reference(root); !why.empty())
        throw std::runtime_error(root.string() + " is not the pagedkv reference: " + why + ": run the kit at the root of the pagedkv repository");
    std::map<int, Exercise> ex = scan_exercises(root, files);
    if (ex.empty()) throw std::runtime_error(root.string() + " has no exercise regions: run the kit at the root of the pagedkv repository");
    if (const std::set<int> stubs = stubbed_exercises(root, files); !stubs.empty())
        throw std::runtime_error(root.string() + " is not the pagedkv reference: the regions of exercise(s) " + list_of(stubs) +
                                 " are stubs as `kit cut` writes them: run the kit at the root of the pagedkv repository");
    return ex;
}

void cut(const fs::path& ref_root, const fs::path& out, const std::set<int>& which_in, bool all, bool quiet = false) {
    const fs::path abs_ref = fs::canonical(ref_root);
    const std::vector<std::string> files = project_files(abs_ref);
    const std::map<int, Exercise> ex = reference_exercises(abs_ref, files);
    std::set<int> which = which_in;
    if (all)
        for (const auto& [n, e] : ex) which.insert(n);
    for (int n : which)
        if (!ex.count(n)) cli::bad_usage("there is no exercise " + std::to_string(n) + " (the exercises are " + numbers_of(ex) + ")");
    if (fs::exists(out) && !fs::is_empty(out))
        throw std::runtime_error(out.string() + " already exists and is not empty: remove it first (a student's work may be in it)");
    const fs::path abs_out = fs::weakly_canonical(fs::absolute(out));
    if (abs_out == abs_ref || abs_out.string().rfind(abs_ref.string() + "/", 0) == 0) {
        // Inside the reference is fine only under its build/ (ignored by git, not copied).
        const std::string rel = fs::relative(abs_out, abs_ref).generic_string();
        if (rel.rfind("build/", 0) != 0)
            throw std::runtime_error(out.string() + " is inside the reference: write the copy under build/ or outside it");
    }
    for (const std::string& f : files) {
        if (stays_out_of_copies(f)) continue;
        std::string text = read_file(abs_ref / f);
        if (may_carry_regions(f) && text.find(kMarker) != std::string::npos) text = cut_text(text, f, which);
        write_file(abs_out / f, text);
        fs::permissions(abs_out / f, fs::status(abs_ref / f).permissions());
    }
    std::string cut_list;
    for (int n : which) cut_list += (cut_list.empty() ? "" : " ") + std::to_string(n);
    const std::time_t now = std::time(nullptr);
    char date[32];
    std::strftime(date, sizeof date, "%Y-%m-%d", std::gmtime(&now));
    // .kit says "this is a student copy" and which exercises were cut. It
    // does not say where the reference is: a student on a shared machine
    // could read the solutions there.
    write_file(abs_out / ".kit", std::string("# A pagedkv student copy, written by `kit cut` on ") + date +
                                     ".\n# `make grade` here self-checks it; the grade that counts is your instructor's,\n"
                                     "# from the reference: kit grade --copy THIS_FOLDER (COURSE.md).\n"
                                     "kit = 2\nexercises = " + cut_list + "\n");
    write_file(abs_out / ".kit.mk", kKitMk);
    write_file(abs_out / "ANSWERS.txt", answers_template(&ex, &which));
    if (quiet) return;
    std::printf("kit: wrote a student copy to %s\n", shown(abs_out).c_str());
    for (int n : which) {
        const Exercise& e = ex.at(n);
        std::string where;
        for (const auto& [f, line] : e.places)
            if (where.find(f) == std::string::npos) where += (where.empty() ? "" : ", ") + f;
        std::printf("  exercise %-2d %-52s %s\n", n, e.title.c_str(), where.c_str());
    }
    std::printf("  and %zu analysis questions in ANSWERS.txt. In that folder: make grade\n", questions().size());
}

// ============================================================================
// 8. kit grade
// ============================================================================

struct GradeReport {
    std::vector<ExerciseResult> exercises;
    int questions_right = 0, questions_total = 0;
    bool all_pass() const {
        for (const auto& e : exercises)
            if (!e.pass()) return false;
        return questions_right == questions_total;
    }
};

struct GradeRequest {
    fs::path copy = ".";       // the folder to grade
    bool copy_given = false;   // named with --copy: it must be a student copy
    std::string reference;     // --reference
    std::set<int> only;        // --exercises; empty: all
    bool questions = true;
    bool print = true;
};

// A copy's .kit: present or not, and when present, valid or why not.
struct KitFile {
    bool present = false;
    std::string error;
    std::set<int> exercises;
};

KitFile read_kit(const fs::path& copy) {
    KitFile k;
    const fs::path p = copy / ".kit";
    std::error_code ec;
    if (!fs::exists(fs::symlink_status(p, ec))) return k;
    k.present = true;
    if (!fs::is_regular_file(fs::symlink_status(p, ec))) {
        k.error = ".kit is not a plain file";
        return k;
    }
    std::istringstream ss(read_file(p, 1u << 16));
    bool listed = false;
    for (std::string line; std::getline(ss, line);) {
        if (line.rfind("exercises =", 0) != 0) continue;
        listed = true;
        std::istringstream nums(line.substr(11));
        for (std::string w; nums >> w;) {
            long long n;
            if (!cli::to_integer(w.c_str(), 1, 999, n)) {
                k.error = ".kit's exercises line has '" + w + "', not an exercise number";
                return k;
            }
            k.exercises.insert((int)n);
        }
    }
    // An empty list is a copy with nothing cut (the self-test writes known-wrong
    // implementations into such copies); no line at all is no copy of ours.
    if (!listed) k.error = ".kit has no 'exercises = ...' line (kit cut writes one)";
    return k;
}

// The reference a copy is graded against: --reference, PAGEDKV_REFERENCE, or
// the folder the kit runs in when that is a reference (an instructor runs
// `./build/kit grade --copy SUB` in theirs). Empty when none is at hand. A
// reference that is named but is not one is an error, never ignored.
fs::path find_reference(const fs::path& copy, const std::string& flag) {
    std::string ref = flag, from = "--reference";
    if (ref.empty())
        if (const char* e = std::getenv("PAGEDKV_REFERENCE"); e && *e) ref = e, from = "PAGEDKV_REFERENCE";
    if (ref.empty()) {
        std::error_code ec;
        const fs::path cwd = fs::current_path(ec);
        if (!ec && is_reference(cwd) && fs::canonical(cwd) != copy) return fs::canonical(cwd);
        return {};
    }
    if (!fs::is_directory(ref)) throw std::runtime_error(from + " names " + ref + ", which is not a folder");
    if (const std::string why = not_a_reference(ref); !why.empty())
        throw std::runtime_error(from + " names " + ref + ", which is not a pagedkv reference (" + why + ")");
    const fs::path canon = fs::canonical(ref);
    if (canon == copy) throw std::runtime_error(from + " names the copy itself");
    return canon;
}

// The path of a question's program, built from `root`. `may_write`: root is
// ours (a student's own copy): make builds it there. Otherwise the root's
// build/NAME is used only when make says it is up to date (make -q writes
// nothing), and else the program is compiled into the grader's workshop:
// a read-only reference works too.
fs::path question_program(const fs::path& root, const std::string& name, bool may_write, Grader& g) {
    std::string src;
    for (const char* dir : {"examples/", "lab/"})
        if (fs::exists(root / (dir + name + ".cpp"))) src = dir + name + ".cpp";
    if (src.empty()) throw std::runtime_error(shown(root) + " has no examples/" + name + ".cpp or lab/" + name + ".cpp");
    Proc mk;
    mk.unset_env = {"MAKEFLAGS", "MFLAGS", "MAKELEVEL"};
    mk.timeout_s = kCompileTimeoutS;
    if (may_write) {
        mk.argv = {"make", "-s", "-C", root.string(), "build/" + name};
        const RunResult r = run_process(mk);
        if (r.status != 0) throw std::runtime_error("make build/" + name + " failed: " + first_lines(r.output, 2));
        return root / "build" / name;
    }
    mk.argv = {"make", "-q", "-C", root.string(), "build/" + name};
    if (run_process(mk).status == 0 && fs::exists(root / "build" / name)) return root / "build" / name;
    return g.build_program(root, src);
}

// Run the questions' programs (built from `root`, run in it) and compare
// with `answers` (nullptr: print the answer key).
void grade_questions(const fs::path& root, bool may_write, Grader& g, const std::map<std::string, std::string>* answers,
                     GradeReport& rep, bool print) {
    for (const Question& q : questions()) {
        ++rep.questions_total;
        std::string verdict;
        bool right = false;
        double key = std::nan("");
        try {
            Proc p;
            p.argv = {question_program(root, q.program, may_write, g).string()};
            p.argv.insert(p.argv.end(), q.args.begin(), q.args.end());
            p.argv.push_back("--json");
            p.cwd = root;
            p.timeout_s = 600;
            const RunResult r = run_process(p);
            if (r.status != 0) throw std::runtime_error("exit status " + std::to_string(r.status));
            // --json prints one JSON value on stdout; a line on stderr (a
            // warning) may come before it.
            const size_t start = r.output.find('{');
            key = q.pick(JsonParser(start == std::string::npos ? r.output : r.output.substr(start)).parse());
        } catch (const std::exception& e) {
            verdict = std::string("the reference's output could not be read (") + e.what() + ")";
        }
        if (verdict.empty()) {
            char keytext[64];
            std::snprintf(keytext, sizeof keytext, "%.6g", key);
            if (!answers) {
                right = !std::isnan(key);
                verdict = std::string("answer key: ") + (std::isnan(key) ? "none" : keytext);
            } else {
                auto it = answers->find(q.id);
                double given;
                if (it == answers->end() || it->second.empty()) verdict = "not answered (ANSWERS.txt)";
                else if (!cli::to_real(it->second.c_str(), -1e300, 1e300, given)) verdict = "'" + it->second + "' is not a number";
                else {
                    right = std::fabs(given - key) <= q.rel_tolerance * std::fabs(key) + 1e-9 * std::max(1.0, std::fabs(key));
                    verdict = right ? "right" : "wrong";
                }
            }
        }
        rep.questions_right += right;
        if (print) std::printf("question %-2s %-62s %s\n", q.id.substr(1).c_str(), q.command().c_str(), verdict.c_str());
    }
}

// One exercise's line (and, when it failed, its failed checks).
void print_exercise(const ExerciseResult& e, bool verbose) {
    char count[32];
    std::snprintf(count, sizeof count, "%d/%zu checks", e.passed(), e.checks.size());
    const char* verdict = e.pass() ? "PASS" : !e.refused.empty() ? "refused" : e.all_not_implemented() ? "not implemented" : "FAIL";
    std::printf("exercise %-2d %-52s %-13s %s\n", e.number, e.title.c_str(), count, verdict);
    for (const std::string& text : {e.refused, e.build_error}) {
        std::istringstream ss(text);
        int k = 0;
        for (std::string line; std::getline(ss, line) && k < 14; ++k) std::printf("    %s\n", line.c_str());
    }
    if (e.all_not_implemented() && !verbose) return;
    for (const CheckResult& c : e.checks) {
        if (c.pass && !verbose) continue;
        std::printf("    %s %s", c.pass ? "ok  " : "FAIL", c.name.c_str());
        if (!c.pass) {
            std::istringstream ss(c.why);
            std::string line;
            std::getline(ss, line);
            std::printf(": %s", line.c_str());
            for (int k = 0; k < 4 && std::getline(ss, line); ++k) std::printf("\n          %s", line.c_str());
        }
        std::printf("\n");
    }
}

// A folder without .kit is graded as the reference itself, by its own checks.
// That is right for the reference only: a student copy that lost its .kit
// would be graded by the checks in it, and its stubs reported as if the
// reference failed. So anything else is refused, saying what would work.
void refuse_unless_reference(const fs::path& dir) {
    const std::string why = not_a_reference(dir);
    if (why.rfind("it is not a pagedkv tree", 0) == 0)
        throw std::runtime_error(shown(dir) + " is not a pagedkv tree (no tests/exercises/main.cpp): run the kit at the root of the "
                                 "pagedkv repository or of a student copy");
    const std::set<int> stubs = stubbed_exercises(dir, project_files(dir));
    if (why.empty() && stubs.empty()) return;
    std::string what;
    if (!stubs.empty()) what = "the regions of exercise(s) " + list_of(stubs) + " are stubs as `kit cut` writes them";
    if (!why.empty()) what += (what.empty() ? "" : ", and ") + why;
    std::string cut_list;
    for (int n : stubs) cut_list += (cut_list.empty() ? "" : " ") + std::to_string(n);
    throw std::runtime_error(
        dir.string() + " has no .kit, and it is not the pagedkv reference: " + what +
        ". It looks like a student copy that lost its .kit, and grading it as the reference would grade it by its own "
        "checks. Put its .kit back: a file named .kit at its top with the line 'exercises = " +
        (cut_list.empty() ? "N M ..." : cut_list) +
        "' (the exercises that were cut). Then `make grade` there self-checks it, and `kit grade --copy " + dir.string() +
        "` run in the reference grades it.");
}

// Grade a copy, or the reference itself. Prints each exercise's line as soon
// as it and every exercise before it are done.
GradeReport grade(const GradeRequest& rq, const Options& opt, Grader* shared = nullptr) {
    if (!fs::is_directory(rq.copy)) throw std::runtime_error(rq.copy.string() + " is not a folder");
    const fs::path copy = fs::canonical(rq.copy);
    const KitFile kf = read_kit(copy);
    if (kf.present && !kf.error.empty())
        throw std::runtime_error(shown(copy) + "/" + kf.error + ": it is not a student copy as `kit cut` writes one");
    enum { kReference, kIsolated, kSelfCheck } mode;
    fs::path ref;
    if (!kf.present) {
        if (rq.copy_given)
            throw std::runtime_error(shown(copy) + " has no .kit, so it is not a student copy written by `kit cut`: a copy "
                                     "without one is not graded (its own checks would grade it). To grade the reference "
                                     "itself, run `kit grade` in it without --copy.");
        if (!rq.reference.empty()) throw std::runtime_error("--reference goes with a student copy; this folder is no copy (it has no .kit)");
        refuse_unless_reference(copy);
        mode = kReference;
    } else {
        ref = find_reference(copy, rq.reference);
        mode = ref.empty() ? kSelfCheck : kIsolated;
    }
    const fs::path src_root = mode == kIsolated ? ref : copy;  // where the checks and the other regions come from
    const std::vector<std::string> files = project_files(src_root);
    const std::map<int, Exercise> ex = mode == kSelfCheck ? scan_exercises(src_root, files) : reference_exercises(src_root, files);
    if (ex.empty()) throw std::runtime_error(shown(src_root) + " has no exercise regions");
    for (int n : rq.only)
        if (!ex.count(n)) cli::bad_usage("there is no exercise " + std::to_string(n) + " (the exercises are " + numbers_of(ex) + ")");

    std::unique_ptr<Grader> local;
    if (!shared) {
        std::vector<fs::path> roots = {src_root};
        std::error_code ec;
        if (const fs::path cwd = fs::current_path(ec); !ec && is_reference(cwd)) roots.push_back(cwd);
        local = std::make_unique<Grader>(opt, doctest_flags(roots));
    }
    Grader& g = shared ? *shared : *local;
    if (rq.print) {
        if (mode == kReference) std::printf("kit: grading the reference itself (%s)\n", shown(copy).c_str());
        else if (mode == kIsolated)
            std::printf("kit: grading %s against the reference %s (checks, grader and all other code from the reference)\n",
                        shown(copy).c_str(), shown(ref).c_str());
        else
            std::printf("kit: no reference given (--reference DIR or PAGEDKV_REFERENCE): a self-check of %s with its own checks,\n"
                        "     not a grade (\"needs exercise K\" = another exercise's stub was hit)\n",
                        shown(copy).c_str());
        std::fflush(stdout);
    }
    Grader::Tree base;
    for (const std::string& f : files) {
        const bool header = f.ends_with(".hpp") || f.ends_with(".cuh") || f.ends_with(".h");
        if (header || (f.rfind("tests/exercises/", 0) == 0 && !stays_out_of_copies(f))) base[f] = read_file(src_root / f);
    }
    GradeReport rep;
    std::vector<int> todo;
    for (const auto& [n, e] : ex)
        if (rq.only.empty() || rq.only.count(n)) todo.push_back(n);
    rep.exercises.resize(todo.size());

    // Each exercise's tree: the student's regions are read (plain files
    // only), scanned and spliced here, before anything is compiled.
    std::vector<Grader::Tree> trees(todo.size());
    std::vector<std::string> tree_errors(todo.size()), refusals(todo.size());
    for (size_t i = 0; i < todo.size(); ++i) {
        trees[i] = base;
        if (mode == kReference) continue;
        try {
            std::set<std::string> seen;
            for (const auto& [f, line] : ex.at(todo[i]).places) {
                if (!seen.insert(f).second) continue;
                const std::string mine = read_student_file(copy, f);
                if (opt.scan && refusals[i].empty()) refusals[i] = scan_exercise(mine, f, todo[i]);
                if (mode == kIsolated) trees[i][f] = splice(trees[i][f], mine, f, todo[i]);
            }
        } catch (const std::exception& e) {
            tree_errors[i] = e.what();
        }
    }
    std::mutex print_mu;
    std::vector<bool> done(todo.size(), false);
    size_t next_print = 0;
    parallel_for(
        (int)todo.size(), std::max(1, opt.jobs),
        [&](int i) {
            ExerciseResult& r = rep.exercises[i];
            if (!tree_errors[i].empty() || !refusals[i].empty()) {
                r.number = todo[i];
                r.title = ex.at(todo[i]).title;
                r.build_error = tree_errors[i];
                if (!refusals[i].empty()) r.refused = "refused: " + refusals[i];
            } else {
                r = g.grade(todo[i], ex.at(todo[i]).title, trees[i]);
            }
            std::lock_guard<std::mutex> lock(print_mu);
            done[i] = true;
            for (; next_print < todo.size() && done[next_print]; ++next_print)
                if (rq.print) {
                    print_exercise(rep.exercises[next_print], opt.verbose);
                    std::fflush(stdout);
                }
        },
        [&](int i) { return "grading exercise " + std::to_string(todo[i]); });

    if (rq.questions) {
        if (mode == kReference) grade_questions(copy, false, g, nullptr, rep, rq.print);
        else if (mode == kIsolated) {
            const std::map<std::string, std::string> answers = read_answers(copy / "ANSWERS.txt");
            grade_questions(ref, false, g, &answers, rep, rq.print);
        } else {
            bool all = true;
            for (const auto& e : rep.exercises) all = all && e.pass();
            const std::map<std::string, std::string> answers = read_answers(copy / "ANSWERS.txt");
            if (all) grade_questions(copy, true, g, &answers, rep, rq.print);
            else {
                rep.questions_total = (int)questions().size();
                if (rq.print) std::printf("questions: not graded without a reference until every exercise passes "
                                          "(then your own engine's output is the key)\n");
            }
        }
    }
    if (rq.print) {
        int ok = 0;
        for (const auto& e : rep.exercises) ok += e.pass();
        std::printf("total: %d/%zu exercises pass", ok, rep.exercises.size());
        if (rq.questions) std::printf(", %d/%d questions right", rep.questions_right, rep.questions_total);
        std::printf(" -- %s\n", rep.all_pass() ? "PASS" : "not yet");
    }
    return rep;
}

// ============================================================================
// 9. Known-wrong implementations
// ============================================================================
//
// tests/exercises/wrong/*.txt each describe a mistake a student could make
// (or a cheat one could try) as an edit of the reference's regions:
//
//     # exercise 4: prefix_cache_queries counts only the prompt   <- what it is
//     exercise: 4
//     expect: fail                   fail: graded, it must fail; refused: the scan must refuse it
//     caught by: NAME OF A CHECK     (optional) a check that must be among the failures
//     unscanned: fail                (optional, with refused) with the scan off it must still fail
//     output: cut                    (optional) its report must say the output was cut
//     file: scheduler.hpp
//     -        stats_.prefix_cache_queries += req->num_tokens();
//     +        stats_.prefix_cache_queries += req->num_prompt_tokens;
//
// After a `file:` line come hunks: lines starting with ' ' (kept), '-'
// (removed) or '+' (added); a blank line or '@@' ends a hunk. The kept and
// removed lines of a hunk must occur exactly once inside the exercise's
// regions of that file. `kit selftest` grades every one of them; `kit
// wrong NAME --copy DIR` writes one into a copy (to see a failing grade).

struct Hunk {
    std::string file, old_text, new_text;
};

struct Wrong {
    std::string name;  // the file's stem: 07-queries-count-only-the-prompt
    std::string about;
    int exercise = 0;
    bool refused = false;           // expect: refused
    std::string caught_by;          // a check that must fail ("" = any)
    bool unscanned_fails = false;   // unscanned: fail
    bool output_cut = false;        // output: cut
    std::vector<Hunk> hunks;
};

Wrong parse_wrong(const std::string& text, const std::string& name) {
    Wrong w;
    w.name = name;
    Hunk cur;
    bool in_hunk = false;
    int line_no = 0;
    auto where = [&] { return std::string(kWrongDir) + "/" + name + ".txt:" + std::to_string(line_no) + ": "; };
    auto end_hunk = [&] {
        if (in_hunk) {
            if (cur.old_text.empty()) throw std::runtime_error(where() + "a hunk with no ' ' or '-' line to find");
            w.hunks.push_back(cur);
        }
        in_hunk = false;
        cur.old_text.clear();
        cur.new_text.clear();
    };
    std::istringstream ss(text);
    for (std::string line; std::getline(ss, line);) {
        ++line_no;
        if (!line.empty() && (line[0] == ' ' || line[0] == '-' || line[0] == '+')) {
            if (cur.file.empty()) throw std::runtime_error(where() + "an edit line before any 'file:' line");
            in_hunk = true;
            if (line[0] != '+') cur.old_text += line.substr(1) + "\n";
            if (line[0] != '-') cur.new_text += line.substr(1) + "\n";
            continue;
        }
        end_hunk();
        if (line.empty() || line == "@@") continue;
        if (line[0] == '#') {
            if (w.about.empty()) {  // "# exercise 7: WHAT" -> "WHAT"
                w.about = line.substr(std::min(line.size(), line.find_first_not_of("# ")));
                const size_t colon = w.about.find(": ");
                if (w.about.rfind("exercise ", 0) == 0 && colon != std::string::npos && colon < 13) w.about = w.about.substr(colon + 2);
            }
            continue;
        }
        const size_t colon = line.find(':');
        if (colon == std::string::npos) throw std::runtime_error(where() + "expected 'key: value', an edit line or a comment");
        const std::string key = line.substr(0, colon);
        std::string value = line.substr(colon + 1);
        value.erase(0, value.find_first_not_of(' '));
        if (key == "exercise") {
            long long n;
            if (!cli::to_integer(value.c_str(), 1, 999, n)) throw std::runtime_error(where() + "exercise: expects a number");
            w.exercise = (int)n;
        } else if (key == "expect") {
            if (value != "fail" && value != "refused") throw std::runtime_error(where() + "expect: is fail or refused");
            w.refused = value == "refused";
        } else if (key == "caught by") {
            w.caught_by = value;
        } else if (key == "unscanned") {
            if (value != "fail") throw std::runtime_error(where() + "unscanned: takes fail");
            w.unscanned_fails = true;
        } else if (key == "output") {
            if (value != "cut") throw std::runtime_error(where() + "output: takes cut");
            w.output_cut = true;
        } else if (key == "file") {
            cur.file = value;
        } else {
            throw std::runtime_error(where() + "unknown key '" + key + "' (exercise, expect, caught by, unscanned, output, file)");
        }
    }
    end_hunk();
    if (w.exercise == 0 || w.hunks.empty()) throw std::runtime_error(std::string(kWrongDir) + "/" + name + ".txt: needs an exercise: line and at least one edit");
    return w;
}

std::vector<Wrong> wrong_implementations(const fs::path& root) {
    std::vector<Wrong> all;
    const fs::path dir = root / kWrongDir;
    if (!fs::is_directory(dir)) return all;
    std::vector<fs::path> files;
    for (const auto& e : fs::directory_iterator(dir))
        if (e.path().extension() == ".txt") files.push_back(e.path());
    std::sort(files.begin(), files.end());
    for (const fs::path& f : files) all.push_back(parse_wrong(read_file(f), f.stem().string()));
    return all;
}

// `text` (the reference's `file`) with w's hunks for that file applied, each
// found exactly once inside exercise w.exercise's regions.
std::string apply_hunks(std::string text, const std::string& file, const Wrong& w) {
    for (const Hunk& h : w.hunks) {
        if (h.file != file) continue;
        size_t found = std::string::npos;
        int count = 0;
        for (const Region& r : find_regions(text, file)) {
            if (r.number != w.exercise) continue;
            for (size_t p = r.body_begin; (p = text.find(h.old_text, p)) != std::string::npos && p + h.old_text.size() <= r.body_end; ++p) {
                found = p;
                ++count;
            }
        }
        if (count != 1)
            throw std::runtime_error(std::string(kWrongDir) + "/" + w.name + ".txt: its edit of " + file + " matches " + std::to_string(count) +
                                     " places in exercise " + std::to_string(w.exercise) + "'s regions, not exactly one");
        text.replace(found, h.old_text.size(), h.new_text);
    }
    return text;
}

// Write `w` into the copy at `copy`: every region of its exercise becomes
// the reference's code with w's edits.
void apply_wrong(const fs::path& ref, const fs::path& copy, const Wrong& w, const std::map<int, Exercise>& ex) {
    if (!ex.count(w.exercise)) throw std::runtime_error(w.name + ": there is no exercise " + std::to_string(w.exercise));
    for (const Hunk& h : w.hunks) {
        bool ok = false;
        for (const auto& [f, line] : ex.at(w.exercise).places) ok |= f == h.file;
        if (!ok) throw std::runtime_error(w.name + ": " + h.file + " has no region of exercise " + std::to_string(w.exercise));
    }
    std::set<std::string> seen;
    for (const auto& [f, line] : ex.at(w.exercise).places) {
        if (!seen.insert(f).second) continue;
        const std::string patched = apply_hunks(read_file(ref / f), f, w);
        write_file(copy / f, splice(read_student_file(copy, f), patched, f, w.exercise));
    }
}

// ============================================================================
// 10. kit selftest: the kit proves itself on the reference
// ============================================================================
//
// (a) the reference passes every check and has an answer for every question;
//     its check files follow main.cpp's rules and its regions pass the scan;
//     core exercises come first and neither live in lab/ nor include it in
//     their checks; each lab exercise names a chapter of lab/LAB.md;
// (b) a copy with every exercise cut fails each one, every check "not
//     implemented";
// (c) a copy with one exercise cut fails that one only: every other exercise
//     still passes (the isolation of section 8);
// (d) the kernel's exercise (the one checked under ThreadSanitizer too) with
//     one barrier deleted fails its ThreadSanitizer check;
// (e) right answers pass the questions, graded against a read-only copy of
//     the reference that the grader leaves as it was; a wrong one fails;
// (f) every known-wrong implementation fails its exercise (section 9);
// (g) every cheat is refused by the scan and, with the scan off, still fails;
//     check programs planted in a copy's build/ are never run; a copy
//     without .kit is refused, whether named with --copy, graded from inside
//     (a stub, or no tests/exercises/wrong/, gives it away; the refusal's
//     advice, a .kit put back, then works) or named as the reference;
// (h) the command line: an unknown exercise, a folder that is no pagedkv
//     tree; an exception in a worker thread reaches the caller.

// Owner write permission back on everything under `p` (a read-only copy of
// the reference from an earlier run), so that it can be deleted.
void make_writable(const fs::path& p) {
    std::error_code ec;
    if (!fs::exists(p, ec)) return;
    fs::permissions(p, fs::perms::owner_all, fs::perm_options::add, ec);
    for (auto it = fs::recursive_directory_iterator(p, ec); it != fs::recursive_directory_iterator(); it.increment(ec))
        fs::permissions(it->path(), fs::perms::owner_write | fs::perms::owner_read | (it->is_directory() ? fs::perms::owner_exec : fs::perms::none),
                        fs::perm_options::add, ec);
}

// Every file and folder under `p` with its size and time: what a grader
// must leave unchanged in a reference it only reads.
std::string snapshot(const fs::path& p) {
    std::string s;
    std::vector<std::string> lines;
    for (auto it = fs::recursive_directory_iterator(p); it != fs::recursive_directory_iterator(); ++it) {
        std::error_code ec;
        const auto t = fs::last_write_time(it->path(), ec).time_since_epoch().count();
        const uintmax_t size = it->is_regular_file() ? fs::file_size(it->path(), ec) : 0;
        lines.push_back(fs::relative(it->path(), p).generic_string() + " " + std::to_string(size) + " " + std::to_string(t));
    }
    std::sort(lines.begin(), lines.end());
    for (const std::string& l : lines) s += l + "\n";
    return s;
}

int selftest(const fs::path& root_in, const Options& opt) {
    const auto t0 = std::chrono::steady_clock::now();
    const fs::path root = fs::canonical(root_in);
    const std::vector<std::string> files = project_files(root);
    const std::map<int, Exercise> ex = reference_exercises(root, files);
    const fs::path work = root / "build/kit-selftest";
    make_writable(work);
    fs::remove_all(work);
    const std::vector<std::string> doctest = doctest_flags({root});
    Grader g(opt, doctest);
    int failures = 0, steps = 0;
    auto expect = [&](bool ok, const std::string& what) {
        std::printf("  %s  %s\n", ok ? "ok  " : "FAIL", what.c_str());
        std::fflush(stdout);
        failures += !ok;
        ++steps;
    };
    // Grade a copy against the reference, printing nothing.
    auto grade_copy = [&](const fs::path& copy, std::set<int> only, bool with_questions, const Options& o, Grader& gr,
                          const std::string& reference = "") {
        GradeRequest rq;
        rq.copy = copy;
        rq.copy_given = true;
        rq.reference = reference.empty() ? root.string() : reference;
        rq.only = std::move(only);
        rq.questions = with_questions;
        rq.print = false;
        return grade(rq, o, &gr);
    };
    auto nn = [](int n) {
        char b[8];
        std::snprintf(b, sizeof b, "%02d", n);
        return std::string(b);
    };
    const std::vector<Wrong> wrongs = wrong_implementations(root);
    // A section's heading, with the seconds spent so far (where the time goes).
    auto section = [&](const char* heading) {
        std::printf("[%4.0f s] %s\n", std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), heading);
        std::fflush(stdout);
    };

    section("(a) the reference passes every exercise and every question has a key");
    {
        GradeRequest rq;
        rq.copy = root;
        GradeReport a = grade(rq, opt, &g);
        expect(a.all_pass() && a.exercises.size() == ex.size(), "reference: all pass");
        for (const auto& e : a.exercises)
            expect(e.checks.size() >= 3, "exercise " + std::to_string(e.number) + " has " + std::to_string(e.checks.size()) + " checks");
        // The check files follow main.cpp's rules.
        for (const auto& [n, e] : ex) {
            const std::string rel = "tests/exercises/ex" + nn(n) + ".cpp";
            const std::string src = read_file(root / rel);
            std::set<std::string> lower;
            bool names_ok = true;
            for (std::string name : check_names(src)) {
                names_ok &= name.find_first_of("*?,[]") == std::string::npos;
                std::transform(name.begin(), name.end(), name.begin(), [](unsigned char c) { return (char)std::tolower(c); });
                names_ok &= lower.insert(name).second;
            }
            expect(names_ok, rel + ": check names are plain and unlike each other");
        }
        for (const std::string& f : files) {
            if (f.rfind("tests/exercises/", 0) != 0 || stays_out_of_copies(f) || f.ends_with("main.cpp")) continue;
            const std::string src = read_file(root / f);
            const size_t d = src.find("#include <doctest/doctest.h>"), last_project = src.rfind("#include \"");
            if (d == std::string::npos) continue;
            expect(last_project == std::string::npos || last_project < d, f + " includes doctest after the project's headers");
        }
        // Core exercises first, each titled as the TUTORIAL's code and checked
        // without lab/ code; lab exercises after them, each naming a chapter
        // of lab/LAB.md.
        {
            const std::string lab_md = fs::exists(root / "lab/LAB.md") ? read_file(root / "lab/LAB.md") : "";
            int last_core = 0, first_lab = 0;
            for (const auto& [n, e] : ex) {
                const std::string chapter = lab_chapter(e.title);
                if (chapter.empty()) {
                    last_core = n;
                    std::string in_lab;
                    for (const auto& [f, line] : e.places)
                        if (f.rfind("lab/", 0) == 0 && in_lab.empty()) in_lab = f + ":" + std::to_string(line);
                    // The check file and the tests/exercises headers it
                    // includes, followed: which of them includes lab/?
                    std::string lab_include;
                    std::vector<std::string> todo = {"tests/exercises/ex" + nn(n) + ".cpp"};
                    std::set<std::string> read;
                    while (!todo.empty() && lab_include.empty()) {
                        const std::string rel = todo.back();
                        todo.pop_back();
                        if (!read.insert(rel).second || !fs::exists(root / rel)) continue;
                        std::istringstream src(read_file(root / rel));
                        for (std::string line; std::getline(src, line);) {
                            const size_t q = line.find("#include \"");
                            if (q == std::string::npos) continue;
                            const std::string inc = line.substr(q + 10, line.find('"', q + 10) - q - 10);
                            if (inc.rfind("lab/", 0) == 0) lab_include = rel + " includes " + inc;
                            else if (inc.rfind("tests/exercises/", 0) == 0) todo.push_back(inc);
                        }
                    }
                    expect(in_lab.empty() && lab_include.empty(),
                           "exercise " + std::to_string(n) + " (core) has no region in lab/ and its checks use no lab/ code" +
                               (in_lab.empty() ? "" : ": a region at " + in_lab) + (lab_include.empty() ? "" : ": " + lab_include));
                } else {
                    if (!first_lab) first_lab = n;
                    const bool named = lab_md.find("\n## " + chapter + ". ") != std::string::npos;
                    expect(named, "exercise " + std::to_string(n) + " (lab " + chapter + ") names a chapter of lab/LAB.md");
                }
            }
            expect(!first_lab || first_lab > last_core,
                   "the lab exercises come after every core one (core up to " + std::to_string(last_core) + ", lab from " +
                       std::to_string(first_lab) + ")");
        }
        // A correct solution must never be refused: the reference's regions pass the scan.
        std::string refused;
        for (const std::string& f : files) {
            if (!may_carry_regions(f)) continue;
            const std::string text = read_file(root / f);
            if (text.find(kMarker) == std::string::npos) continue;
            for (const Region& r : find_regions(text, f))
                if (refused.empty()) refused = scan_region(text.substr(r.body_begin, r.body_end - r.body_begin), f, r.line + 1);
        }
        expect(refused.empty(), "the reference's regions pass the scan" + (refused.empty() ? "" : ": " + refused));
    }

    section("(b) every exercise cut: each fails, every check 'not implemented'");
    {
        cut(root, work / "copies/all", {}, true, true);
        GradeReport b = grade_copy(work / "copies/all", {}, false, opt, g);
        for (const auto& e : b.exercises) expect(e.all_not_implemented(), "exercise " + std::to_string(e.number) + ": all checks not implemented");
    }

    section("(c) one exercise cut: that one fails, no other does");
    for (const auto& [n, e] : ex) {
        const fs::path dir = work / ("copies/ex" + std::to_string(n));
        cut(root, dir, {n}, false, true);
        GradeReport c = grade_copy(dir, {}, false, opt, g);
        bool ok = true;
        std::string detail;
        for (const auto& r : c.exercises) {
            const bool want_fail = r.number == n;
            if (want_fail ? !r.all_not_implemented() : !r.pass()) {
                ok = false;
                detail += " exercise " + std::to_string(r.number) + (want_fail ? " did not fail as not implemented" : " failed");
            }
        }
        expect(ok, "exercise " + std::to_string(n) + " cut: only it fails" + detail);
    }

    // The exercise whose checks run under ThreadSanitizer too: the kernel's.
    int kernel = 0;
    for (const auto& [n, e] : ex)
        if (!kernel && fs::exists(root / ("tests/exercises/ex" + nn(n) + ".cpp")) &&
            has_tsan_check(read_file(root / ("tests/exercises/ex" + nn(n) + ".cpp"))))
            kernel = n;
    const std::string kernel_s = std::to_string(kernel);
    section(("(d) exercise " + kernel_s + " (checked under ThreadSanitizer) with a barrier deleted fails there").c_str());
    {
        const fs::path dir = work / "copies/barrier";
        cut(root, dir, {}, false, true);
        bool removed = false;
        std::set<std::string> seen;
        for (const auto& [file, line] : kernel ? ex.at(kernel).places : std::vector<std::pair<std::string, int>>{}) {
            if (removed || !seen.insert(file).second) continue;
            const fs::path f = dir / file;
            std::string text = read_file(f);
            for (const Region& r : find_regions(text, file)) {
                if (r.number != kernel) continue;
                const size_t s = text.find("syncthreads();", r.body_begin);
                if (s != std::string::npos && s < r.body_end) {
                    const size_t ls = text.rfind('\n', s) + 1, le = text.find('\n', s) + 1;
                    text.erase(ls, le - ls);
                    removed = true;
                    write_file(f, text);
                    break;
                }
            }
        }
        expect(removed, "deleted the first syncthreads() of exercise " + kernel_s + "'s regions");
        // The numbers may come out wrong already, or right on a lucky
        // schedule: the TSan check must catch it either way, so here it runs
        // even when other checks fail (a grade runs it only after they pass).
        g.set_tsan_always(true);
        GradeReport d = grade_copy(dir, {kernel}, false, opt, g);
        g.set_tsan_always(false);
        std::string tsan_why = "no TSan check";
        for (const auto& e : d.exercises)
            for (const auto& c : e.checks)
                if (c.name == kTsanCheck) tsan_why = c.pass ? "it PASSED" : c.why;
        expect(tsan_why.find("data race") != std::string::npos,
               "exercise " + kernel_s + "'s ThreadSanitizer check fails: " + first_lines(tsan_why, 1));
    }

    section("(e) the questions: the key's answers pass against a read-only reference, a wrong one fails");
    {
        // A read-only copy of the reference, its files with their times. Its
        // build/ holds study (up to date: the grader must use it and leave
        // it) and not overload (the grader must build that one elsewhere, in
        // its own folder). One of each keeps this step short: study is the
        // slowest program to compile.
        const fs::path ro = work / "ro-reference";
        std::vector<std::string> copied = files;
        if (fs::exists(root / "build/study")) copied.push_back("build/study");
        for (const std::string& f : copied) {
            write_file(ro / f, read_file(root / f, 1u << 30));
            fs::permissions(ro / f, fs::status(root / f).permissions());
            fs::last_write_time(ro / f, fs::last_write_time(root / f));
        }
        for (auto it = fs::recursive_directory_iterator(ro); it != fs::recursive_directory_iterator(); ++it)
            fs::permissions(it->path(), fs::perms::owner_write | fs::perms::group_write | fs::perms::others_write, fs::perm_options::remove);
        fs::permissions(ro, fs::perms::owner_write | fs::perms::group_write | fs::perms::others_write, fs::perm_options::remove);
        const std::string before = snapshot(ro);

        const fs::path dir = work / "copies/answers";
        cut(root, dir, {}, false, true);
        std::string right, wrong;
        bool keys = true;
        for (const Question& q : questions()) {
            GradeReport key_only;
            Proc p;
            p.argv = {question_program(root, q.program, false, g).string()};
            p.argv.insert(p.argv.end(), q.args.begin(), q.args.end());
            p.argv.push_back("--json");
            p.cwd = root;
            p.timeout_s = 600;
            const RunResult r = run_process(p);
            double key = std::nan("");
            try {
                key = q.pick(JsonParser(r.output.substr(std::min(r.output.size(), r.output.find('{')))).parse());
            } catch (const std::exception&) {
            }
            keys &= r.status == 0 && !std::isnan(key);
            char b[96];
            std::snprintf(b, sizeof b, "%s = %.10g\n", q.id.c_str(), key);
            right += b;
            std::snprintf(b, sizeof b, "%s = %.10g\n", q.id.c_str(), wrong.empty() ? key + 1 : key);
            wrong += b;
        }
        expect(keys, "the reference's programs give every question a key");
        write_file(dir / "ANSWERS.txt", answers_template() + right);
        GradeReport e1 = grade_copy(dir, {1}, true, opt, g, ro.string());
        expect(e1.questions_right == e1.questions_total && e1.questions_total > 0, "right answers: all right (graded against the read-only reference)");
        expect(snapshot(ro) == before, "the read-only reference is exactly as it was (nothing written, nothing built in it)");
        const fs::path built = question_program(ro, "overload", false, g);
        expect(built.string().rfind(g.work().string() + "/", 0) == 0,
               "its overload, absent from its build/, was compiled in the grader's own folder");
        write_file(dir / "ANSWERS.txt", answers_template() + wrong);
        GradeReport e2 = grade_copy(dir, {1}, true, opt, g);
        expect(e2.questions_right == e2.questions_total - 1, "one wrong answer: exactly one question wrong");
        make_writable(ro);
    }

    section("(f) the known-wrong implementations (tests/exercises/wrong/): each fails its exercise");
    {
        std::set<int> covered;
        for (const Wrong& w : wrongs) {
            if (w.refused) continue;
            const fs::path dir = work / ("copies/wrong-" + w.name);
            std::string detail;
            bool ok = false;
            try {
                cut(root, dir, {}, false, true);
                apply_wrong(root, dir, w, ex);
                const GradeReport r = grade_copy(dir, {w.exercise}, false, opt, g);
                const ExerciseResult& e = r.exercises.at(0);
                ok = !e.pass() && e.refused.empty() && e.build_error.empty();
                if (!e.refused.empty()) detail = " -- but it was refused: " + e.refused;
                if (!e.build_error.empty()) detail = " -- but it did not compile: " + first_lines(e.build_error, 3);
                if (!w.caught_by.empty()) {
                    const CheckResult* c = e.check(w.caught_by);
                    ok &= c && !c->pass;
                    if (!c) detail += " -- no check named '" + w.caught_by + "'";
                    else if (c->pass) detail += " -- '" + w.caught_by + "' passed";
                }
                if (w.output_cut) {
                    bool cut_said = false;
                    for (const CheckResult& c : e.checks) cut_said |= c.why.find("the grader kept the first") != std::string::npos;
                    ok &= cut_said;
                    if (!cut_said) detail += " -- no report says its output was cut";
                }
                if (ok) covered.insert(w.exercise);
            } catch (const std::exception& x) {
                detail = std::string(" -- ") + x.what();
            }
            expect(ok, w.name + ": " + w.about + detail);
        }
        std::string missing;
        for (const auto& [n, e] : ex)
            if (!covered.count(n)) missing += " " + std::to_string(n);
        expect(missing.empty(), "every exercise has a known-wrong implementation that fails" + (missing.empty() ? "" : ": none for" + missing));
    }

    section("(g) cheats: refused by the scan, and failing without it; planted programs; a copy without .kit");
    {
        Options unscanned = opt;
        unscanned.scan = false;
        for (const Wrong& w : wrongs) {
            if (!w.refused) continue;
            const fs::path dir = work / ("copies/cheat-" + w.name);
            try {
                cut(root, dir, {}, false, true);
                apply_wrong(root, dir, w, ex);
                const ExerciseResult e = grade_copy(dir, {w.exercise}, false, opt, g).exercises.at(0);
                expect(!e.pass() && !e.refused.empty(), w.name + ": " + w.about + " -- " + (e.refused.empty() ? "NOT refused" : e.refused));
                if (w.unscanned_fails) {
                    const ExerciseResult u = grade_copy(dir, {w.exercise}, false, unscanned, g).exercises.at(0);
                    std::string why = u.build_error.empty() ? "" : "it does not compile";
                    for (const CheckResult& c : u.checks)
                        if (!c.pass && why.empty()) why = first_lines(c.why, 1);
                    expect(!u.pass(), w.name + " with the scan off: still fails (" + (u.pass() ? "it PASSED" : why) + ")");
                }
            } catch (const std::exception& x) {
                expect(false, w.name + ": " + x.what());
            }
        }

        // The cheats' exercise: the planted programs and the copies without
        // .kit below use it too.
        int cx = 0;
        for (const Wrong& w : wrongs)
            if (w.refused && !cx) cx = w.exercise;
        const std::string cx_s = std::to_string(cx), cx_nn = nn(cx);

        // Cheat (c): grade a wrong copy, plant programs that print a passing
        // summary wherever an earlier kit kept its builds, grade again with
        // a new grader: still a failure, and the copy was never written to.
        const Wrong* wc = nullptr;
        for (const Wrong& w : wrongs)
            if (!w.refused && w.exercise == cx && !wc) wc = &w;
        if (wc) {
            const fs::path dir = work / "copies/planted";
            cut(root, dir, {}, false, true);
            apply_wrong(root, dir, *wc, ex);
            const bool first_fails = !grade_copy(dir, {cx}, false, opt, g).exercises.at(0).pass();
            expect(first_fails && !fs::exists(dir / "build"), "a wrong exercise " + cx_s + " fails, and grading wrote nothing into the copy");
            const std::string fake = "#!/bin/sh\necho '[doctest] test cases: 1 | 1 passed | 0 failed | 0 skipped'\n"
                                     "echo '[doctest] Status: SUCCESS!'\nexit 0\n";
            for (const std::string& at : {"build/grade/ex" + cx_nn, "build/grade/trees/0000000000000000/ex" + cx_nn, "build/ex" + cx_nn,
                                          "build/grade/ex" + cx_nn + "-tsan"}) {
                write_file(dir / at, fake);
                fs::permissions(dir / at, fs::perms::owner_all);
            }
            Grader fresh(opt, doctest);
            const bool second_fails = !grade_copy(dir, {cx}, false, opt, fresh).exercises.at(0).pass();
            expect(second_fails, "with programs that print a passing summary planted in its build/: still a failure");
        } else {
            expect(false, "a known-wrong implementation of exercise " + cx_s + " (the cheats' exercise) for the planted-programs cheat");
        }

        // Cheat (d): a copy without .kit is not graded (as the reference, with
        // its own checks); .kit does not name the reference.
        const fs::path self = fs::read_symlink("/proc/self/exe");
        const fs::path dir = work / "copies/no-kit";
        cut(root, dir, {cx}, false, true);
        const std::string kit_text = read_file(dir / ".kit");
        expect(kit_text.find(root.string()) == std::string::npos, ".kit does not name the reference's path");
        fs::remove(dir / ".kit");
        const RunResult r = run_process(command({self.string(), "grade", "--copy", dir.string(), "--reference", root.string(), "--exercises",
                                                 cx_s, "--no-questions"}, root));
        expect(r.status == 1 && r.output.find("has no .kit") != std::string::npos && r.output.find("exercise " + cx_s + " ") == std::string::npos,
               "kit grade --copy on a copy without .kit: refused, exit status " + std::to_string(r.status));
        // The same copy graded from inside it, as `make grade` there does: not
        // "the reference itself" -- its stub is named, and the fix.
        Proc in_copy = command({self.string(), "grade", "--no-questions"}, dir);
        in_copy.unset_env = {"PAGEDKV_REFERENCE"};
        const RunResult r3 = run_process(in_copy);
        expect(r3.status == 1 && r3.output.find("has no .kit") != std::string::npos &&
                   r3.output.find("exercise(s) " + cx_s + " are stubs") != std::string::npos &&
                   r3.output.find("'exercises = " + cx_s + "'") != std::string::npos &&
                   r3.output.find("grading the reference itself") == std::string::npos &&
                   r3.output.find("exercise " + cx_s + " ") == std::string::npos,
               "kit grade inside a copy without .kit (exercise " + cx_s + " a stub): refused, exit status " + std::to_string(r3.status) +
                   ", '" + first_lines(r3.output, 1).substr(0, 160) + "...'");
        // What the refusal says would work does: a .kit with the line it
        // names, and `kit grade` there self-checks the copy (its stub: not
        // implemented), refusing nothing.
        write_file(dir / ".kit", "exercises = " + cx_s + "\n");
        Proc fixed = command({self.string(), "grade", "--exercises", cx_s, "--no-questions"}, dir);
        fixed.unset_env = {"PAGEDKV_REFERENCE"};
        const RunResult r6 = run_process(fixed);
        expect(r6.status == 1 && r6.output.find("has no .kit") == std::string::npos &&
                   r6.output.find("a self-check of") != std::string::npos &&
                   r6.output.find("exercise " + cx_s + " ") != std::string::npos &&
                   r6.output.find("not implemented") != std::string::npos,
               "the same copy with the .kit line the refusal names: self-checked, exercise " + cx_s +
                   " not implemented (exit status " + std::to_string(r6.status) + ")");
        // A copy with nothing cut left (every region the reference's code)
        // that lost its .kit: no stub to see, but no tests/exercises/wrong/.
        const fs::path whole = work / "copies/no-kit-whole";
        cut(root, whole, {}, false, true);
        fs::remove(whole / ".kit");
        Proc in_whole = command({self.string(), "grade", "--no-questions"}, whole);
        in_whole.unset_env = {"PAGEDKV_REFERENCE"};
        const RunResult r4 = run_process(in_whole);
        expect(r4.status == 1 && r4.output.find("has no .kit") != std::string::npos &&
                   r4.output.find("tests/exercises/wrong/") != std::string::npos &&
                   r4.output.find("grading the reference itself") == std::string::npos,
               "kit grade inside a whole copy without .kit: refused (no tests/exercises/wrong/), exit status " + std::to_string(r4.status));
        const RunResult r2 = run_process(command({self.string(), "grade", "--copy", (work / "copies/all").string(), "--reference",
                                           (work / "copies/ex1").string(), "--no-questions"}, root));
        expect(r2.status == 1 && r2.output.find("not a pagedkv reference") != std::string::npos,
               "--reference naming a student copy: an error, not ignored (exit status " + std::to_string(r2.status) + ")");
        // PAGEDKV_REFERENCE naming a copy that lost its .kit is no reference either.
        Proc via_env = command({self.string(), "grade", "--copy", (work / "copies/all").string(), "--no-questions"}, root);
        via_env.set_env = {{"PAGEDKV_REFERENCE", whole.string()}};
        const RunResult r5 = run_process(via_env);
        expect(r5.status == 1 && r5.output.find("not a pagedkv reference") != std::string::npos,
               "PAGEDKV_REFERENCE naming a copy without .kit: an error (exit status " + std::to_string(r5.status) + ")");
    }

    section("(h) the command line and the grader's own failures");
    {
        const fs::path self = fs::read_symlink("/proc/self/exe");
        const RunResult bad = run_process(command({self.string(), "grade", "--exercises", "50", "--no-questions"}, root));
        expect(bad.status == 2 && bad.output.find("there is no exercise 50") != std::string::npos,
               "kit grade --exercises 50: exit status " + std::to_string(bad.status) + ", '" + first_lines(bad.output, 1) + "'");
        const fs::path empty = work / "not-a-tree";
        fs::create_directories(empty);
        const RunResult l = run_process(command({self.string(), "list"}, empty));
        expect(l.status == 1 && l.output.find("not a pagedkv tree") != std::string::npos,
               "kit list outside a pagedkv tree: exit status " + std::to_string(l.status) + ", '" + first_lines(l.output, 1) + "'");
        const RunResult c = run_process(command({self.string(), "cut", "--all", "--out", (empty / "copy").string()}, empty));
        expect(c.status == 1 && !fs::exists(empty / "copy"), "kit cut --all outside a pagedkv tree: exit status " + std::to_string(c.status) +
                                                                  ", nothing written");
        const RunResult c50 = run_process(command({self.string(), "cut", "--exercises", "50", "--out", (empty / "copy50").string()}, root));
        expect(c50.status == 2 && !fs::exists(empty / "copy50"), "kit cut --exercises 50: exit status " + std::to_string(c50.status) +
                                                                     ", nothing written");
        std::string caught;
        try {
            parallel_for(8, 2, [](int i) { if (i == 5) throw std::bad_alloc(); }, [](int i) { return "job " + std::to_string(i); });
        } catch (const std::runtime_error& e) {
            caught = e.what();
        }
        expect(caught == "job 5: out of memory (std::bad_alloc)", "a worker thread's std::bad_alloc reaches the caller: '" + caught + "'");
    }
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("kit selftest: %s (%d steps, %d failed) in %.0f s\n", failures ? "FAILED" : "passed", steps, failures, secs);
    return failures ? 1 : 0;
}

// ============================================================================
// 11. The command line
// ============================================================================

int list(const fs::path& root) {
    if (!fs::exists(root / "tests/exercises/main.cpp"))
        throw std::runtime_error(fs::absolute(root).lexically_normal().string() + " is not a pagedkv tree (no tests/exercises/main.cpp): run the kit at the root of "
                                 "the pagedkv repository or of a student copy");
    const std::map<int, Exercise> ex = scan_exercises(root, project_files(root));
    if (ex.empty()) throw std::runtime_error(fs::absolute(root).lexically_normal().string() + " has no exercise regions");
    for (const auto& [n, e] : ex) {
        char nn[8];
        std::snprintf(nn, sizeof nn, "%02d", n);
        const fs::path check = root / (std::string("tests/exercises/ex") + nn + ".cpp");
        size_t checks = 0;
        if (fs::exists(check)) {
            const std::string src = read_file(check);
            checks = check_names(src).size() + (has_tsan_check(src) ? 1 : 0);
        }
        std::string where;
        for (const auto& [f, line] : e.places) where += (where.empty() ? "" : " ") + f + ":" + std::to_string(line);
        std::printf("exercise %-2d %-52s %2zu checks  %s\n", n, e.title.c_str(), checks, where.c_str());
    }
    for (const Question& q : questions())
        std::printf("question %-2s %s%s\n", q.id.substr(1).c_str(), q.command().c_str(),
                    q.lab.empty() ? "" : ("   (lab: lab/LAB.md " + q.lab + ")").c_str());
    return 0;
}

// kit wrong: list the known-wrong implementations, or write one into a copy.
int wrong(const fs::path& root, const std::string& name, const std::string& copy) {
    const std::vector<std::string> files = project_files(root);
    const std::map<int, Exercise> ex = reference_exercises(root, files);
    const std::vector<Wrong> all = wrong_implementations(root);
    if (name.empty()) {
        for (const Wrong& w : all)
            std::printf("%-44s exercise %-2d %s%s\n", w.name.c_str(), w.exercise, w.refused ? "(a cheat the kit refuses) " : "", w.about.c_str());
        return 0;
    }
    if (copy.empty()) cli::bad_usage("say which copy: kit wrong " + name + " --copy DIR");
    for (const Wrong& w : all)
        if (w.name == name) {
            if (!read_kit(fs::path(copy)).present) throw std::runtime_error(copy + " has no .kit: write into a student copy (kit cut)");
            apply_wrong(root, copy, w, ex);
            std::printf("kit: exercise %d of %s is now %s: %s\n", w.exercise, copy.c_str(), w.name.c_str(), w.about.c_str());
            return 0;
        }
    cli::bad_usage("no known-wrong implementation is named '" + name + "' (kit wrong lists them)");
}

}  // namespace kit

int main(int argc, char** argv) {
    std::setvbuf(stdout, nullptr, _IOLBF, 0);  // one line per exercise as it finishes, in a pipe too
    signal(SIGPIPE, SIG_IGN);                  // a check that died before reading its nonce must not end us
    return cli::guarded_main("kit", [&]() -> int {
        const std::string sub = argc > 1 ? argv[1] : "";
        if (sub.empty() || sub == "-h" || sub == "--help") {
            std::printf(
                "Usage: kit cut|grade|list|wrong|selftest [options]   (each has --help)\n"
                "The course kit (COURSE.md): exercises cut from the reference's marked regions, and their grader.\n"
                "  kit cut --all --out DIR           a student copy with every exercise replaced by a stub\n"
                "  kit cut --exercises 3 --out DIR   the same with only exercise 3 cut\n"
                "  kit grade --copy DIR              grade a student copy against this reference\n"
                "  kit grade                         in a copy: a self-check (PAGEDKV_REFERENCE: a grade); in the reference: itself\n"
                "  kit list                          the exercises, their checks and where they are\n"
                "  kit wrong [NAME --copy DIR]       the known-wrong implementations; write one into a copy\n"
                "  kit selftest                      prove the kit on the reference (CI)\n");
            return sub.empty() ? 2 : 0;
        }
        kit::Options opt;
        opt.jobs = (int)std::max(1u, std::min(64u, std::thread::hardware_concurrency()));
        if (const char* c = std::getenv("CXX"); c && *c) opt.cxx = c;
        std::vector<int> exercises;
        std::string out, reference, copy, name;
        bool all = false, no_questions = false;
        const std::string prog = "kit " + sub;
        cli::Parser p(prog.c_str(), sub == "wrong" ? "[NAME --copy DIR]" : "[options]",
                      sub == "cut"     ? "Writes a student copy of this project with the chosen exercises replaced by stubs."
                      : sub == "grade" ? "Grades a student copy (or the reference itself): one line per exercise, a total."
                      : sub == "list"  ? "Lists the exercises, their checks and their regions."
                      : sub == "wrong" ? "Lists the known-wrong implementations (tests/exercises/wrong/), or writes one into a student copy."
                                       : "Proves the kit on the reference: (a) all pass ... (h) the command line; see tools/kit.cpp.");
        if (sub == "cut") {
            p.int_list("--exercises", &exercises, 1, 99, 99, "which exercises to cut");
            p.flag("--all", &all, "cut every exercise");
            p.text("--out", &out, "DIR", "the folder to write (must not exist, or be empty)");
        } else if (sub == "grade" || sub == "selftest") {
            if (sub == "grade") {
                p.text("--copy", &copy, "DIR", "the student copy to grade (it must have the .kit that kit cut wrote)");
                p.text("--reference", &reference, "DIR",
                       "the reference to grade against (default: $PAGEDKV_REFERENCE, or this folder when it is the reference)");
                p.int_list("--exercises", &exercises, 1, 99, 99, "grade only these exercises");
                p.flag("--no-questions", &no_questions, "skip the analysis questions");
                p.flag("-v", &opt.verbose, "list every check, passed or not");
            }
            p.text("--cxx", &opt.cxx, "CXX", "the compiler for the checks");
            p.integer("--jobs", &opt.jobs, 1, 64, "compilations and checks at once");
            p.integer("--timeout", &opt.timeout_s, 1, 3600, "seconds one check may take (ThreadSanitizer: 5x)");
        } else if (sub == "wrong") {
            p.positional(&name, "NAME");
            p.text("--copy", &copy, "DIR", "the student copy to write it into");
        } else if (sub != "list") {
            cli::bad_usage("unknown command '" + sub + "': use cut, grade, list, wrong or selftest");
        }
        p.parse(argc - 1, argv + 1);
        const std::set<int> which(exercises.begin(), exercises.end());
        if (sub == "cut") {
            if (out.empty()) cli::bad_usage("--out DIR is required");
            if (!all && which.empty()) cli::bad_usage("say which exercises: --exercises N[,M...] or --all");
            kit::cut(".", out, which, all);
            return 0;
        }
        if (sub == "list") return kit::list(".");
        if (sub == "wrong") return kit::wrong(fs::canonical("."), name, copy);
        if (sub == "selftest") return kit::selftest(".", opt);
        kit::GradeRequest rq;
        rq.copy = copy.empty() ? fs::path(".") : fs::path(copy);
        rq.copy_given = !copy.empty();
        rq.reference = reference;
        rq.only = which;
        rq.questions = !no_questions;
        return kit::grade(rq, opt).all_pass() ? 0 : 1;
    });
}

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
// release). This program does three things with them:
//
//   kit cut    writes a *student copy* of the project in a folder of its own:
//              every file, except that each chosen region keeps its markers and
//              its hint and loses its code to a stub that compiles and fails
//              loudly: "exercise 3 (...): not implemented". It also writes
//              ANSWERS.txt (the analysis questions), .kit (where the reference
//              is) and .kit.mk (warnings a stub provokes, switched off).
//   kit grade  runs each exercise's checks (tests/exercises/exNN.cpp) and the
//              analysis questions, one line per exercise and a total. Exit 0
//              only when everything passes.
//   kit selftest  proves the kit on the reference itself (CI runs it).
//
// ---- how grading keeps one exercise from failing another ----------------------
// Exercise 9's kernel is tested through slot_of() (exercise 1), and exercise 5's
// scheduler through the block pool (exercises 2-4). Grading a student's copy as
// it stands would report a missing exercise 1 as eleven failures. So when the
// reference is at hand (the .kit file names it, or PAGEDKV_REFERENCE, or
// --reference), each exercise N is graded in a tree of its own: the
// reference's sources with only exercise N's regions taken from the student's
// copy. The checks come from the reference too, so editing them changes
// nothing, and code a student changed outside the regions is not graded.
// Without a reference (a copy taken home) the kit grades the copy as it is and
// says "needs exercise K" where another exercise's stub was hit.
//
// Each check (one TEST_CASE) runs in a process of its own under a timeout, so a
// stub that throws, a kernel that aborts or a loop that never ends costs that
// one check. A check file containing the line "// kit: tsan" is also built under
// ThreadSanitizer, and "no data race" counts as one more check: a kernel with a
// barrier missing may compute the right numbers on a lucky run, but never
// passes that one.
//
// Compiled programs are kept under build/grade/, named by a hash of every
// source that went into them, so grading again after editing one exercise
// rebuilds one program, and identical trees (every exercise the student got
// right is byte-for-byte the reference) share one build.
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "examples/cli.hpp"

namespace fs = std::filesystem;

namespace kit {

// ============================================================================
// 1. Files and processes
// ============================================================================

std::string read_file(const fs::path& p) {
    std::ifstream in(p, std::ios::binary);
    if (!in) throw std::runtime_error("cannot read " + p.string());
    std::ostringstream ss;
    ss << in.rdbuf();
    return ss.str();
}

void write_file(const fs::path& p, const std::string& text) {
    if (p.has_parent_path()) fs::create_directories(p.parent_path());
    std::ofstream out(p, std::ios::binary);
    if (!out || !(out << text)) throw std::runtime_error("cannot write " + p.string());
}

// A word for the shell, in single quotes.
std::string quote(const std::string& s) {
    std::string q = "'";
    for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
    return q + "'";
}

struct RunResult {
    int status = -1;     // exit status; 124 = timed out (coreutils timeout)
    std::string output;  // stdout and stderr together
};

// Run a shell command, collecting what it prints. `timeout_s` > 0 puts it
// under timeout(1), which kills it (and reports 124) when time is up.
RunResult run(const std::string& cmd, int timeout_s = 0) {
    const std::string full =
        (timeout_s > 0 ? "timeout -k 5 " + std::to_string(timeout_s) + " bash -c " + quote(cmd) : cmd) + " 2>&1";
    RunResult r;
    FILE* p = popen(full.c_str(), "r");
    if (!p) throw std::runtime_error("cannot run: " + cmd);
    char buf[4096];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, p)) > 0) r.output.append(buf, n);
    const int st = pclose(p);
    r.status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + (WIFSIGNALED(st) ? WTERMSIG(st) : 0);
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

// The project's files, relative to `root`: what git tracks plus new files it
// does not ignore, or (no git) every file outside build/ and .git/.
std::vector<std::string> project_files(const fs::path& root) {
    std::vector<std::string> files;
    if (fs::exists(root / ".git")) {
        RunResult r = run("git -C " + quote(root.string()) + " ls-files --cached --others --exclude-standard");
        if (r.status == 0) {
            std::istringstream ss(r.output);
            for (std::string line; std::getline(ss, line);)
                if (!line.empty() && fs::is_regular_file(root / line)) files.push_back(line);
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

// Run jobs(0..n-1) on up to `threads` threads.
void parallel_for(int n, int threads, const std::function<void(int)>& job) {
    std::atomic<int> next{0};
    std::vector<std::thread> pool;
    for (int t = 0; t < std::max(1, std::min(threads, n)); ++t)
        pool.emplace_back([&] {
            for (int i; (i = next++) < n;) job(i);
        });
    for (auto& th : pool) th.join();
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

// ============================================================================
// 3. A little JSON, for the engine's --json output
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
// 4. The analysis questions
// ============================================================================
//
// Each question names the command a student runs (in the project folder,
// after `make`) and reads a figure from. The grader runs the same command with
// --json in the reference and takes the figure from the engine's own output,
// so the answer key can never go stale: change the engine and the key moves.

struct Question {
    std::string id, text, command;
    std::string json_command;                 // what the grader runs
    std::function<double(const Json&)> pick;  // the answer, from its output
    double rel_tolerance = 0;                 // 0: exactly
};

std::vector<Question> questions() {
    std::vector<Question> q;
    q.push_back({"q1",
                 "The default overload workload (24 requests of 32 + 96 tokens on 40 blocks of 16) runs with at most\n"
                 "8 requests at once. How many tokens does the engine compute again because a preempted\n"
                 "request lost its KV cache (vLLM's recomputed tokens)?",
                 "./build/overload --max-num-seqs 8", "./build/overload --max-num-seqs 8 --json",
                 [](const Json& j) { return j["metrics"]["recomputed_tokens_total"].as_number(); }, 0});
    q.push_back({"q2",
                 "The same workload with the default max_num_seqs and prefix caching on. How many prompt and\n"
                 "recomputed tokens are served from the prefix cache instead of being computed (prefix cache hits)?",
                 "./build/overload --prefix-caching on", "./build/overload --prefix-caching on --json",
                 [](const Json& j) { return j["metrics"]["prefix_cache_hits"].as_number(); }, 0});
    q.push_back({"q3",
                 "On a simulated L4 whose host link is cut to 2 GB/s, the preemption study runs each sequence\n"
                 "length with recompute and with swap. From which length on does swap (with ample swap space)\n"
                 "finish the workload sooner than recompute? Give the first such length.",
                 "./build/study preemption --device sim --gpu l4 --pcie-gbps 2",
                 "./build/study preemption --device sim --gpu l4 --pcie-gbps 2 --json", [](const Json& j) {
                     // rows: length, link, mode, ..., "makespan s"; the first
                     // "swap" row of a length against its "recompute" row.
                     std::map<double, double> rec, swp;
                     std::vector<double> order;
                     for (const Json& row : j["table"].array) {
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
                 0});
    return q;
}

// The student's answers: "qN = number" lines; '#' starts a comment.
std::map<std::string, std::string> read_answers(const fs::path& file) {
    std::map<std::string, std::string> a;
    if (!fs::exists(file)) return a;
    std::istringstream ss(read_file(file));
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

std::string answers_template() {
    std::string t =
        "# pagedkv: analysis questions.\n"
        "# Build the project (make), run the command each question names, read the figure off\n"
        "# its output and write it after the '='. `make grade` checks every answer against the\n"
        "# reference engine's own --json output.\n";
    for (const Question& q : questions()) {
        t += "\n";
        std::istringstream ss(q.text);
        bool first = true;
        for (std::string line; std::getline(ss, line); first = false)
            t += (first ? "# " + q.id + ". " : "#     ") + line + "\n";
        t += "#     command: " + q.command + "\n";
        t += q.id + " =\n";
    }
    return t;
}

// ============================================================================
// 5. Building and running the checks
// ============================================================================

struct Options {
    std::string cxx = "g++";
    int jobs = 2;
    int timeout_s = 60;
    bool verbose = false;
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
    std::string build_error;  // the check program did not compile
    int passed() const {
        int n = 0;
        for (const auto& c : checks) n += c.pass;
        return n;
    }
    bool pass() const { return build_error.empty() && !checks.empty() && passed() == (int)checks.size(); }
    bool all_not_implemented() const {
        if (checks.empty()) return false;
        for (const auto& c : checks)
            if (c.pass || c.why != "not implemented") return false;
        return true;
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

// doctest's summary says "test cases:  1 |  1 passed | ..." (padded): exactly
// one case ran, and passed. A filter that matched nothing also exits 0.
bool ran_one_and_passed(const std::string& out) {
    const size_t p = out.find("test cases:");
    if (p == std::string::npos) return false;
    std::string line = out.substr(p, out.find('\n', p) - p);
    line.erase(std::remove(line.begin(), line.end(), ' '), line.end());
    return line.rfind("testcases:1|1passed|", 0) == 0;
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

// Why a check failed, from what it printed.
std::string reason(const RunResult& r, int exercise) {
    if (r.status == 124 || r.status == 137) return "timed out";
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
    return first_lines(r.output, 4);
}

class Grader {
public:
    Grader(fs::path work, Options opt) : work_(std::move(work)), opt_(std::move(opt)) {}

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
        const bool tsan = it->second.find("// kit: tsan") != std::string::npos;
        const fs::path bin = dir / (std::string("ex") + nn), tsan_bin = dir / (std::string("ex") + nn + "-tsan");
        std::string err = build(dir, check_rel, bin, false);
        if (err.empty() && tsan) err = build(dir, check_rel, tsan_bin, true);
        if (!err.empty()) {
            res.build_error = err;
            return res;
        }
        const std::vector<std::string> names = check_names(it->second);
        res.checks.resize(names.size() + (tsan ? 1 : 0));
        parallel_for((int)res.checks.size(), opt_.jobs, [&](int i) {
            CheckResult& c = res.checks[i];
            if (i < (int)names.size()) {
                c.name = names[i];
                const RunResult r = memo_run(bin, "-tc=" + quote(names[i]) + " --no-colors", opt_.timeout_s);
                c.pass = r.status == 0 && ran_one_and_passed(r.output);
                if (!c.pass) c.why = without(reason(r, n), dir.string() + "/");
            } else {
                c.name = "no data race under ThreadSanitizer";
                const RunResult r = memo_run(tsan_bin, "--no-colors", opt_.timeout_s * 5);
                const bool race = r.output.find("ThreadSanitizer") != std::string::npos;
                c.pass = r.status == 0 && !race;
                if (!c.pass) {
                    c.why = reason(r, n);
                    if (race && c.why != "not implemented") c.why = "ThreadSanitizer reports a data race (a barrier missing?)";
                }
            }
        });
        return res;
    }

private:
    // Write a tree under build/grade/trees/<hash of its contents>/ (once).
    fs::path materialise(const Tree& tree) {
        Hash h;
        h.add(opt_.cxx);
        for (const auto& [path, text] : tree) {
            h.add(path);
            h.add(text);
        }
        const fs::path dir = work_ / "trees" / h.hex();
        std::lock_guard<std::mutex> lock(mu_);
        if (!fs::exists(dir / ".complete")) {
            for (const auto& [path, text] : tree) write_file(dir / path, text);
            write_file(dir / ".complete", "");
        }
        return dir;
    }

    // Compile one check program in `dir`, or say why it failed. The doctest
    // main (tests/exercises/main.cpp) is compiled once per flavour.
    std::string build(const fs::path& dir, const std::string& check_rel, const fs::path& bin, bool tsan) {
        if (fs::exists(bin)) return "";
        const std::string flags = std::string("-std=c++20 -ffp-contract=off -Wno-unknown-pragmas ") +
                                  (tsan ? "-O1 -g -fsanitize=thread" : "-O1") + deps_include();
        const fs::path main_src = dir / "tests/exercises/main.cpp";
        Hash mh;
        mh.add(opt_.cxx + flags);
        mh.add(read_file(main_src));
        const fs::path main_obj = work_ / ("main-" + mh.hex() + ".o");
        {
            std::lock_guard<std::mutex> lock(main_mu_);
            if (!fs::exists(main_obj)) {
                const fs::path tmp = main_obj.string() + ".tmp";
                RunResult r = run(opt_.cxx + " " + flags + " -c " + quote(main_src.string()) + " -o " + quote(tmp.string()));
                if (r.status != 0) return "the doctest main does not compile:\n" + first_lines(r.output, 8);
                fs::rename(tmp, main_obj);
            }
        }
        const fs::path tmp = bin.string() + ".tmp";
        RunResult r = run(opt_.cxx + " " + flags + " -I" + quote(dir.string()) + " " + quote((dir / check_rel).string()) + " " +
                          quote(main_obj.string()) + " -o " + quote(tmp.string()) + " -lpthread");
        if (r.status != 0) return "does not compile:\n" + first_lines(r.output, 12);
        fs::rename(tmp, bin);
        return "";
    }

    // Where doctest's header is: Debian's doctest-dev, or the copy that
    // tests/get_doctest.sh fetched into build/deps.
    // Empty: it is in the compiler's own search path.
    std::string deps_include() const {
        for (fs::path p : {work_.parent_path() / "deps/include", fs::path("build/deps/include")})
            if (fs::exists(p / "doctest/doctest.h")) return " -isystem " + quote(fs::absolute(p).string());
        return "";
    }

    // Identical programs give identical results: the self-test grades the
    // same trees many times, and runs each (program, check) once.
    RunResult memo_run(const fs::path& bin, const std::string& args, int timeout_s) {
        const std::string key = bin.string() + " " + args;
        {
            std::lock_guard<std::mutex> lock(mu_);
            if (auto it = memo_.find(key); it != memo_.end()) return it->second;
        }
        RunResult r = run(quote(bin.string()) + " " + args, timeout_s);
        std::lock_guard<std::mutex> lock(mu_);
        memo_[key] = r;
        return r;
    }

    fs::path work_;
    Options opt_;
    std::mutex mu_, main_mu_;
    std::map<std::string, RunResult> memo_;
};

// ============================================================================
// 6. kit cut
// ============================================================================

// Extra compiler flags a student copy needs: a stub leaves parameters and
// locals unused, and -Werror would turn that into a build failure.
const char* kKitMk =
    "# Written by `kit cut`: the exercises' stubs leave parameters and variables\n"
    "# unused, which -Werror would refuse. Delete this file once every exercise is done.\n"
    "KIT_CXXFLAGS := -Wno-unused-parameter -Wno-unused-variable -Wno-unused-but-set-variable -Wno-unused-function "
    "-Wno-unused-private-field -Wno-return-type\n";

void cut(const fs::path& ref_root, const fs::path& out, const std::set<int>& which_in, bool all, bool quiet = false) {
    const std::vector<std::string> files = project_files(ref_root);
    const std::map<int, Exercise> ex = scan_exercises(ref_root, files);
    std::set<int> which = which_in;
    if (all)
        for (const auto& [n, e] : ex) which.insert(n);
    for (int n : which)
        if (!ex.count(n)) {
            std::string list;
            for (const auto& [k, e] : ex) list += (list.empty() ? "" : ", ") + std::to_string(k);
            throw std::runtime_error("there is no exercise " + std::to_string(n) + " (the exercises are " + list + ")");
        }
    if (fs::exists(out) && !fs::is_empty(out))
        throw std::runtime_error(out.string() + " already exists and is not empty: remove it first (a student's work may be in it)");
    const fs::path abs_out = fs::weakly_canonical(fs::absolute(out));
    const fs::path abs_ref = fs::canonical(ref_root);
    for (const std::string& f : files) {
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
    write_file(abs_out / ".kit", std::string("# A pagedkv student copy, written by `kit cut` on ") + date +
                                     ".\n# `make grade` grades it against the reference named here (see COURSE.md).\n"
                                     "reference = " + abs_ref.string() + "\nexercises = " + cut_list + "\n");
    write_file(abs_out / ".kit.mk", kKitMk);
    write_file(abs_out / "ANSWERS.txt", answers_template());
    if (quiet) return;
    std::printf("kit: wrote a student copy to %s\n", abs_out.string().c_str());
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
// 7. kit grade
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

// The reference a copy is graded against: --reference, PAGEDKV_REFERENCE, or
// the .kit file's line; empty when none is at hand.
fs::path find_reference(const fs::path& copy, const std::string& flag) {
    std::string ref = flag;
    if (ref.empty())
        if (const char* e = std::getenv("PAGEDKV_REFERENCE"); e && *e) ref = e;
    if (ref.empty() && fs::exists(copy / ".kit")) {
        std::istringstream ss(read_file(copy / ".kit"));
        for (std::string line; std::getline(ss, line);)
            if (line.rfind("reference = ", 0) == 0) ref = line.substr(12);
    }
    if (ref.empty()) return {};
    if (!fs::exists(fs::path(ref) / "tests/exercises/main.cpp") || fs::exists(fs::path(ref) / ".kit")) {
        std::fprintf(stderr, "kit: %s is not a pagedkv reference (no tests/exercises, or it is a student copy itself); "
                             "grading the copy as it stands\n", ref.c_str());
        return {};
    }
    return fs::canonical(ref);
}

// Run the questions' commands in `root` and compare with `answers`.
void grade_questions(const fs::path& root, const std::map<std::string, std::string>* answers, GradeReport& rep, bool print) {
    RunResult mk = run("make -s -C " + quote(root.string()) + " build/overload build/study");
    for (const Question& q : questions()) {
        ++rep.questions_total;
        std::string verdict;
        bool right = false;
        double key = std::nan("");
        if (mk.status != 0) {
            verdict = "cannot build the reference's programs: " + first_lines(mk.output, 2);
        } else {
            RunResult r = run("cd " + quote(root.string()) + " && " + q.json_command + " 2>/dev/null", 600);
            try {
                if (r.status != 0) throw std::runtime_error("exit status " + std::to_string(r.status));
                key = q.pick(JsonParser(r.output).parse());
            } catch (const std::exception& e) {
                verdict = std::string("the reference's output could not be read (") + e.what() + ")";
            }
        }
        if (verdict.empty()) {
            char keytext[64];
            std::snprintf(keytext, sizeof keytext, "%.6g", key);
            if (!answers) {
                right = true;
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
        if (print) std::printf("question %-2s %-62s %s\n", q.id.substr(1).c_str(), q.command.c_str(), verdict.c_str());
    }
}

// Grade the copy at `copy`. `print`: the report on stdout.
GradeReport grade(const fs::path& copy_in, const std::string& ref_flag, const std::set<int>& only, bool with_questions,
                  const Options& opt, bool print, Grader* shared = nullptr) {
    const fs::path copy = fs::canonical(copy_in);
    const bool is_copy = fs::exists(copy / ".kit");
    const fs::path ref = is_copy ? find_reference(copy, ref_flag) : copy;
    const bool isolated = !ref.empty();
    const fs::path src_root = isolated ? ref : copy;  // where the checks and the other regions come from

    const std::vector<std::string> files = project_files(src_root);
    const std::map<int, Exercise> ex = scan_exercises(src_root, files);
    if (ex.empty()) throw std::runtime_error(src_root.string() + " has no exercise regions");
    Grader::Tree base;
    for (const std::string& f : files) {
        const bool header = f.size() > 4 && (f.ends_with(".hpp") || f.ends_with(".cuh") || f.ends_with(".h"));
        if (header || f.rfind("tests/exercises/", 0) == 0) base[f] = read_file(src_root / f);
    }
    if (print) {
        if (!is_copy) std::printf("kit: grading the reference itself (%s)\n", copy.string().c_str());
        else if (isolated) std::printf("kit: grading %s against the reference %s\n", copy.string().c_str(), ref.string().c_str());
        else std::printf("kit: no reference at hand: grading %s as it stands (\"needs exercise K\" = another stub was hit)\n",
                         copy.string().c_str());
    }
    Grader local(copy / "build/grade", opt);
    Grader& g = shared ? *shared : local;
    GradeReport rep;
    std::vector<int> todo;
    for (const auto& [n, e] : ex)
        if (only.empty() || only.count(n)) todo.push_back(n);
    rep.exercises.resize(todo.size());
    // Trees first (reading the student's files), then the builds, in parallel.
    std::vector<Grader::Tree> trees(todo.size());
    std::vector<std::string> tree_errors(todo.size());
    for (size_t i = 0; i < todo.size(); ++i) {
        trees[i] = base;
        if (!isolated || !is_copy) continue;
        try {
            for (const auto& [f, line] : ex.at(todo[i]).places) {
                if (!fs::exists(copy / f)) throw std::runtime_error(f + " is missing from your copy");
                trees[i][f] = splice(trees[i][f], read_file(copy / f), f, todo[i]);
            }
        } catch (const std::exception& e) {
            tree_errors[i] = e.what();
        }
    }
    parallel_for((int)todo.size(), std::max(1, opt.jobs), [&](int i) {
        if (!tree_errors[i].empty()) {
            rep.exercises[i].number = todo[i];
            rep.exercises[i].title = ex.at(todo[i]).title;
            rep.exercises[i].build_error = tree_errors[i];
            return;
        }
        rep.exercises[i] = g.grade(todo[i], ex.at(todo[i]).title, trees[i]);
    });
    for (const ExerciseResult& e : rep.exercises) {
        if (!print) break;
        char count[32];
        std::snprintf(count, sizeof count, "%d/%zu checks", e.passed(), e.checks.size());
        const char* verdict = e.pass() ? "PASS" : e.all_not_implemented() ? "not implemented" : "FAIL";
        std::printf("exercise %-2d %-52s %-13s %s\n", e.number, e.title.c_str(), count, verdict);
        if (!e.build_error.empty()) {
            std::istringstream ss(e.build_error);
            for (std::string line; std::getline(ss, line);) std::printf("    %s\n", line.c_str());
        }
        if (e.all_not_implemented() && !opt.verbose) continue;
        for (const CheckResult& c : e.checks) {
            if (c.pass && !opt.verbose) continue;
            std::printf("    %s %s", c.pass ? "ok  " : "FAIL", c.name.c_str());
            if (!c.pass) {
                std::istringstream ss(c.why);
                std::string line;
                std::getline(ss, line);
                std::printf(": %s", line.c_str());
                for (int k = 0; k < 3 && std::getline(ss, line); ++k) std::printf("\n          %s", line.c_str());
            }
            std::printf("\n");
        }
    }
    if (with_questions) {
        if (isolated) {
            const std::map<std::string, std::string> answers = read_answers(copy / "ANSWERS.txt");
            grade_questions(ref, is_copy ? &answers : nullptr, rep, print);
        } else {
            bool all = true;
            for (const auto& e : rep.exercises) all = all && e.pass();
            const std::map<std::string, std::string> answers = read_answers(copy / "ANSWERS.txt");
            if (all) grade_questions(copy, &answers, rep, print);
            else {
                rep.questions_total = (int)questions().size();
                if (print) std::printf("questions: not graded without a reference until every exercise passes "
                                       "(then your own engine's output is the key)\n");
            }
        }
    }
    if (print) {
        int ok = 0;
        for (const auto& e : rep.exercises) ok += e.pass();
        std::printf("total: %d/%zu exercises pass", ok, rep.exercises.size());
        if (with_questions) std::printf(", %d/%d questions right", rep.questions_right, rep.questions_total);
        std::printf(" -- %s\n", rep.all_pass() ? "PASS" : "not yet");
    }
    return rep;
}

// ============================================================================
// 8. kit selftest: the kit proves itself on the reference
// ============================================================================
//
// (a) the reference passes every check and has an answer for every question;
// (b) a copy with every exercise cut fails each one, every check "not
//     implemented";
// (c) a copy with one exercise cut fails that one only: every other exercise
//     still passes (the isolation of section 5);
// (d) exercise 9 with one barrier deleted fails its ThreadSanitizer check;
// (e) right answers pass the questions and a wrong one fails.
int selftest(const fs::path& root_in, const Options& opt) {
    const fs::path root = fs::canonical(root_in);
    const fs::path work = root / "build/kit-selftest";
    fs::remove_all(work / "copies");
    Grader g(work / "grade", opt);
    int failures = 0;
    auto expect = [&](bool ok, const std::string& what) {
        std::printf("  %s  %s\n", ok ? "ok  " : "FAIL", what.c_str());
        failures += !ok;
    };
    const std::map<int, Exercise> ex = scan_exercises(root, project_files(root));

    std::printf("(a) the reference passes every exercise and every question has a key\n");
    GradeReport a = grade(root, "", {}, true, opt, true, &g);
    expect(a.all_pass() && a.exercises.size() == ex.size(), "reference: all pass");
    for (const auto& e : a.exercises) expect(e.checks.size() >= 3, "exercise " + std::to_string(e.number) + " has " + std::to_string(e.checks.size()) + " checks");

    std::printf("(b) every exercise cut: each fails, every check 'not implemented'\n");
    cut(root, work / "copies/all", {}, true, true);
    GradeReport b = grade(work / "copies/all", root.string(), {}, false, opt, true, &g);
    for (const auto& e : b.exercises) expect(e.all_not_implemented(), "exercise " + std::to_string(e.number) + ": all checks not implemented");

    std::printf("(c) one exercise cut: that one fails, no other does\n");
    for (const auto& [n, e] : ex) {
        const fs::path dir = work / ("copies/ex" + std::to_string(n));
        cut(root, dir, {n}, false, true);
        GradeReport c = grade(dir, root.string(), {}, false, opt, false, &g);
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

    std::printf("(d) exercise 9 with a barrier deleted fails under ThreadSanitizer\n");
    {
        const fs::path dir = work / "copies/barrier";
        cut(root, dir, {}, false, true);
        const fs::path f = dir / "paged_kv.cuh";
        std::string text = read_file(f);
        bool removed = false;
        for (const Region& r : find_regions(text, "paged_kv.cuh")) {
            if (r.number != 9) continue;
            const size_t s = text.find("syncthreads();", r.body_begin);
            if (s != std::string::npos && s < r.body_end) {
                const size_t ls = text.rfind('\n', s) + 1, le = text.find('\n', s) + 1;
                text.erase(ls, le - ls);
                removed = true;
            }
            break;
        }
        expect(removed, "deleted the first syncthreads() of exercise 9's region");
        write_file(f, text);
        GradeReport d = grade(dir, root.string(), {9}, false, opt, true, &g);
        bool tsan_failed = false;
        for (const auto& e : d.exercises)
            for (const auto& c : e.checks) tsan_failed |= c.name.find("ThreadSanitizer") != std::string::npos && !c.pass;
        expect(tsan_failed, "exercise 9's ThreadSanitizer check fails");
    }

    std::printf("(e) the questions: the key's own answers pass, a wrong one fails\n");
    {
        const fs::path dir = work / "copies/answers";
        cut(root, dir, {}, false, true);
        std::string right = answers_template(), wrong;
        // The key, from the reference, written into the copy's ANSWERS.txt.
        RunResult mk = run("make -s -C " + quote(root.string()) + " build/overload build/study");
        expect(mk.status == 0, "the reference's programs build");
        std::string filled;
        std::istringstream ss(right);
        bool first_wrong_done = false;
        for (std::string line; std::getline(ss, line);) {
            for (const Question& q : questions())
                if (line == q.id + " =") {
                    RunResult r = run("cd " + quote(root.string()) + " && " + q.json_command + " 2>/dev/null", 600);
                    const double key = q.pick(JsonParser(r.output).parse());
                    char b[64];
                    std::snprintf(b, sizeof b, "%s = %.10g", q.id.c_str(), key);
                    line = b;
                    std::snprintf(b, sizeof b, "%s = %.10g", q.id.c_str(), first_wrong_done ? key : key + 1);
                    wrong += std::string(b) + "\n";
                    first_wrong_done = true;
                    filled += line + "\n";
                    goto next_line;
                }
            filled += line + "\n";
            wrong += line + "\n";
        next_line:;
        }
        write_file(dir / "ANSWERS.txt", filled);
        GradeReport e1 = grade(dir, root.string(), {1}, true, opt, false, &g);
        expect(e1.questions_right == e1.questions_total && e1.questions_total > 0, "right answers: all right");
        write_file(dir / "ANSWERS.txt", wrong);
        GradeReport e2 = grade(dir, root.string(), {1}, true, opt, false, &g);
        expect(e2.questions_right == e2.questions_total - 1, "one wrong answer: exactly one question wrong");
    }
    std::printf("kit selftest: %s\n", failures ? "FAILED" : "passed");
    return failures ? 1 : 0;
}

// ============================================================================
// 9. The command line
// ============================================================================

int list(const fs::path& root) {
    const std::map<int, Exercise> ex = scan_exercises(root, project_files(root));
    for (const auto& [n, e] : ex) {
        char nn[8];
        std::snprintf(nn, sizeof nn, "%02d", n);
        const fs::path check = root / (std::string("tests/exercises/ex") + nn + ".cpp");
        const size_t checks = fs::exists(check) ? check_names(read_file(check)).size() : 0;
        std::string where;
        for (const auto& [f, line] : e.places) where += (where.empty() ? "" : " ") + f + ":" + std::to_string(line);
        std::printf("exercise %-2d %-52s %2zu checks  %s\n", n, e.title.c_str(), checks, where.c_str());
    }
    for (const Question& q : questions()) std::printf("question %-2s %s\n", q.id.substr(1).c_str(), q.command.c_str());
    return 0;
}

}  // namespace kit

int main(int argc, char** argv) {
    return cli::guarded_main("kit", [&]() -> int {
        const std::string sub = argc > 1 ? argv[1] : "";
        if (sub.empty() || sub == "-h" || sub == "--help") {
            std::printf(
                "Usage: kit cut|grade|list|selftest [options]   (each has --help)\n"
                "The course kit (COURSE.md): exercises cut from the reference's marked regions, and their grader.\n"
                "  kit cut --all --out DIR         a student copy with every exercise replaced by a stub\n"
                "  kit cut --exercises 3 --out DIR the same with only exercise 3 cut\n"
                "  kit grade                       grade the copy in this folder (or the reference itself)\n"
                "  kit list                        the exercises, their checks and where they are\n"
                "  kit selftest                    prove the kit on the reference (CI)\n");
            return sub.empty() ? 2 : 0;
        }
        kit::Options opt;
        opt.jobs = (int)std::max(1u, std::thread::hardware_concurrency());
        if (const char* c = std::getenv("CXX"); c && *c) opt.cxx = c;
        std::vector<int> exercises;
        std::string out, reference, copy = ".";
        bool all = false, no_questions = false;
        const std::string prog = "kit " + sub;
        cli::Parser p(prog.c_str(), "[options]",
                      sub == "cut"     ? "Writes a student copy of this project with the chosen exercises replaced by stubs."
                      : sub == "grade" ? "Grades a student copy (or the reference itself): one line per exercise, a total."
                      : sub == "list"  ? "Lists the exercises, their checks and their regions."
                                       : "Proves the kit on the reference: (a) all pass, (b) stubs fail, (c) isolation, (d) TSan, (e) answers.");
        if (sub == "cut") {
            p.int_list("--exercises", &exercises, 1, 99, 99, "which exercises to cut");
            p.flag("--all", &all, "cut every exercise");
            p.text("--out", &out, "DIR", "the folder to write (must not exist, or be empty)");
        } else if (sub == "grade" || sub == "selftest") {
            if (sub == "grade") {
                p.text("--copy", &copy, "DIR", "the student copy to grade");
                p.text("--reference", &reference, "DIR", "the reference to grade against (default: the copy's .kit, or $PAGEDKV_REFERENCE)");
                p.int_list("--exercises", &exercises, 1, 99, 99, "grade only these exercises");
                p.flag("--no-questions", &no_questions, "skip the analysis questions");
                p.flag("-v", &opt.verbose, "list every check, passed or not");
            }
            p.text("--cxx", &opt.cxx, "CXX", "the compiler for the checks");
            p.integer("--jobs", &opt.jobs, 1, 64, "compilations and checks at once");
            p.integer("--timeout", &opt.timeout_s, 1, 3600, "seconds one check may take (ThreadSanitizer: 5x)");
        } else if (sub != "list") {
            cli::bad_usage("unknown command '" + sub + "': use cut, grade, list or selftest");
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
        if (sub == "selftest") return kit::selftest(".", opt);
        return kit::grade(copy, reference, which, !no_questions, opt, true).all_pass() ? 0 : 1;
    });
}

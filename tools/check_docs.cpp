// tools/check_docs.cpp -- runs the command listings of TUTORIAL.md, lab/LAB.md
// and README.md again and says which ones no longer print what the page shows.
//
//   build/check_docs TUTORIAL.md lab/LAB.md README.md            check (make check-docs)
//   build/check_docs --update TUTORIAL.md lab/LAB.md README.md   rewrite the outputs (make docs)
//   build/check_docs --selftest TUTORIAL.md           prove that a changed count fails
//   build/check_docs --help
//
// Why this exists. The tutorial teaches by showing commands with what they
// printed, and its prose draws conclusions from those numbers. Code changes;
// a listing that is no longer what the program prints is worse than none,
// because a reader who reruns it and sees 31 where the page says 30 stops
// trusting every other number too. So I made the listings executable: every
// listing that shows a command with its output is run again and compared with
// the page, CI fails on any drift, and `make docs` writes the real output back,
// so keeping the pages true costs one command.
//
// The listing format. A checked listing is a fenced code block (``` ... ```)
// in which some lines start with "$ ". Each such line is a command, typed as
// at a terminal; the lines after it, up to the next "$ " line or the closing
// fence, are what it printed:
//
//     ```
//     $ ./build/overload --no-lanes | tail -n 2
//       end-to-end latency       p50 ~346.3 ms  p99 ~527.0 ms
//       throughput               ~4372 useful tok/s, ~8600 processed tok/s, 350 steps in ~0.53 s (cpu)
//     ```
//
// A command whose line ends with a backslash goes on to the next line, as in
// the shell. A fenced block without any "$ " line is prose or code and is left
// alone, so a listing that should not be checked can simply show its commands
// without the prompt.
//
// What is compared. Every expected line must equal the printed line (trailing
// spaces ignored; so are blank lines at the very end), with two marks:
//   - "~" written right before a number, as in ~346.3, ~0.53 s, ~20.4x or
//     ~0x7ffff7e6, says that number changes from run to run or from machine to
//     machine (a timing, a thread count, an address, a line number in a
//     report): any number matches there, and the spaces around it may grow or
//     shrink, because columns realign when a number gets wider. A "~" that is
//     not followed by a digit (the overload demo's lanes use it for a paused
//     request) is an ordinary character.
//   - a line that is only "..." stands for any number of printed lines,
//     including none: cut stack frames, a long table's middle.
// Everything else is compared exactly, which is the point: counts, token ids,
// generated text, steps, preemptions and verdicts must be what the page says.
// Use the marks sparingly: a "~" on a count would hide the very drift this
// program is for.
//
// Directives. An HTML comment (invisible on GitHub) on the line before a
// listing, blank lines allowed between, tunes how it is checked:
//     <!-- check-docs: skip -- REASON -->      not run; reported as SKIP with the reason
//     <!-- check-docs: needs gdb -->           SKIP, saying why, unless gdb is on PATH
//     <!-- check-docs: needs ../shared/models/tok512.bin -->   ... unless that file exists
//     <!-- check-docs: timeout 300 -->         seconds for the whole listing (default 120)
// A word of `needs` with a "/" in it is a file, relative to the folder the
// listing runs in (below); any other is a program looked up on PATH. Several directives go in
// one comment separated by ";" (skip takes the rest of the comment).
// Skipping is for what cannot run everywhere (a GPU) or takes too long to
// check on every change; the reason is printed each time, so it stays honest.
//
// How commands run. All the commands of one listing run, in order, in one
// `bash -c` started in the document's project root: the nearest folder, from
// the document's own upwards, that holds a Makefile (the repository root for
// TUTORIAL.md and README.md, and for lab/LAB.md too), or the document's own
// folder when none does. A page's commands are written as a reader types them
// at the root of the project after `make` (./build/study ..., paths such as
// ../shared/models/), wherever in the project the page sits. A listing may
// `cd` or set a variable in one command and use it in the next, as at a
// terminal. Their stdout and stderr go
// to a pseudo-terminal, not a pipe, because a program behaves differently on
// each: at a terminal C's stdio writes stdout line by line, in a pipe it holds
// the text until its buffer fills, so there a line on stderr (generate's
// "achieved tok/s") overtakes the story printed before it, and the page must
// show what a reader at a terminal sees. stdin is /dev/null. The environment
// is the caller's with these changes: LC_ALL=C and TERM=dumb (messages, number
// formats and colors must not depend on who runs the check), and no MAKEFLAGS,
// MFLAGS or MAKELEVEL, so a listing that runs `make` prints what it prints at a
// terminal, not what a make nested in `make check-docs` prints ("make[1]:
// Entering directory ..."). Exit statuses are not compared: a terminal does
// not show them either; a listing that cares prints it (`...; echo "rc=$?"`).
// A listing that runs past its timeout is stopped, with everything it started,
// and counts as drift.
//
// Output: one line per listing, "OK", "DRIFT" or "SKIP", its file and line and
// its first command, then a summary. For a drift, the first differing lines:
// "-" what the page says, with its line number in the page, and "+" what was
// printed. Exit status 0 when nothing drifted, 1 when something did, 2 for a
// bad command line, an unreadable file or a malformed listing.
//
// --update replaces the output of every drifted command with what it printed,
// and keeps the page's marks: a printed line that matches a page line except
// for its numbers gets its "~" on the same numbers (the 3rd and 5th number of
// the line, say), and a "..." stays where the lines around it are still there.
// A listing that still matches is left as it is, timings included, so an
// update touches only what drifted; --update --refresh also writes the new
// timings into the listings that match (run that on a quiet machine). Read
// the diff afterwards (git diff): an update makes the page agree with the
// program, and only a person can tell whether the prose around it still
// agrees with the page.
//
// --selftest FILE proves the check can fail, which a check that always passes
// cannot show by passing: it takes the first checked listing with a printed
// count (or the first one --only picks), checks it as it is (it must be OK),
// then copies the document to a temporary file with that count increased by
// one and checks the copy's listing, which must be DRIFT. Before that it
// proves the comparison's bounds on made-up listings (selftest_alignment).
//
// Dependencies: the C++ standard library and POSIX (fork, a pseudo-terminal,
// poll, process groups), which is what running a shell command as at a
// terminal, with a time limit, takes.

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>  // posix_openpt, grantpt, unlockpt, ptsname
#include <sys/types.h>
#include <sys/wait.h>
#include <termios.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace {

namespace fs = std::filesystem;

constexpr int kDefaultTimeoutS = 120;
constexpr size_t kMaxOutputBytes = 32u << 20;  // a runaway command is cut here, not allowed to eat memory
constexpr size_t kMaxAlignLines = 20000;        // printed lines compared; past this, only the first are
constexpr size_t kMaxExpectedLines = 20000;     // a page's output block longer than this is malformed
constexpr size_t kMaxAlignCells = 4u << 20;     // (page lines) x (printed lines) the exact alignment may take
constexpr int kDiffLinesShown = 12;

// A malformed page or an unreadable file: exit status 2, with the place.
struct DocError : std::runtime_error {
    using std::runtime_error::runtime_error;
};

[[noreturn]] void usage_error(const std::string& msg) {
    std::fprintf(stderr, "check_docs: %s\nRun 'check_docs --help' for the usage.\n", msg.c_str());
    std::exit(2);
}

// ---------------------------------------------------------------------------
// Text helpers
// ---------------------------------------------------------------------------

std::string rtrim(const std::string& s) {
    size_t n = s.size();
    while (n > 0 && std::isspace((unsigned char)s[n - 1])) --n;
    return s.substr(0, n);
}

std::string trim(const std::string& s) {
    size_t b = 0;
    while (b < s.size() && std::isspace((unsigned char)s[b])) ++b;
    return rtrim(s.substr(b));
}

bool starts_with(const std::string& s, const std::string& p) { return s.compare(0, p.size(), p) == 0; }

// Lines without their '\n'. A final newline ends the last line; it does not
// start an empty one.
std::vector<std::string> split_lines(const std::string& text) {
    std::vector<std::string> lines;
    size_t start = 0;
    while (start < text.size()) {
        const size_t nl = text.find('\n', start);
        if (nl == std::string::npos) {
            lines.push_back(text.substr(start));
            break;
        }
        lines.push_back(text.substr(start, nl - start));
        start = nl + 1;
    }
    return lines;
}

std::string read_file(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    if (!in) throw DocError(path + ": cannot read it: " + std::strerror(errno));
    std::ostringstream ss;
    ss << in.rdbuf();
    return ss.str();
}

// Written next to the target and renamed over it, so an interrupted update
// never leaves half a page behind.
void write_file(const std::string& path, const std::string& text) {
    const std::string tmp = path + ".check_docs.tmp";
    {
        std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
        if (!out) throw DocError(tmp + ": cannot write it: " + std::strerror(errno));
        out << text;
        if (!out.flush()) throw DocError(tmp + ": write failed");
    }
    std::error_code ec;
    fs::rename(tmp, path, ec);
    if (ec) throw DocError(path + ": cannot replace it: " + ec.message());
}

// ---------------------------------------------------------------------------
// Numbers, and the two marks
// ---------------------------------------------------------------------------

// Length of the number-like token that starts at s[i], or 0: an optional
// sign, then hex (0x7ffe...) or decimal digits with an optional fraction and
// exponent. "p99" holds the number 99 and "0m44.470s" the numbers 0 and 44.470.
size_t number_at(const std::string& s, size_t i) {
    const size_t n = s.size();
    auto digit = [&](size_t k) { return k < n && std::isdigit((unsigned char)s[k]); };
    size_t j = i;
    if (j < n && (s[j] == '+' || s[j] == '-')) ++j;
    if (j + 2 < n && s[j] == '0' && (s[j + 1] == 'x' || s[j + 1] == 'X') && std::isxdigit((unsigned char)s[j + 2])) {
        j += 2;
        while (j < n && std::isxdigit((unsigned char)s[j])) ++j;
        return j - i;
    }
    const size_t first = j;
    while (digit(j)) ++j;
    bool any = j > first;
    if (j < n && s[j] == '.' && digit(j + 1)) {
        ++j;
        while (digit(j)) ++j;
        any = true;
    }
    if (!any) return 0;
    if (j < n && (s[j] == 'e' || s[j] == 'E')) {
        size_t k = j + 1;
        if (k < n && (s[k] == '+' || s[k] == '-')) ++k;
        if (digit(k)) {
            while (digit(k)) ++k;
            j = k;
        }
    }
    return j - i;
}

// A "~" is a mark only right before a number.
bool is_mark(const std::string& s, size_t i) { return s[i] == '~' && number_at(s, i + 1) > 0; }

// Start offsets of the number-like tokens of s, left to right.
std::vector<size_t> number_starts(const std::string& s) {
    std::vector<size_t> starts;
    for (size_t i = 0; i < s.size();) {
        const size_t len = number_at(s, i);
        if (len > 0) {
            starts.push_back(i);
            i += len;
        } else {
            ++i;
        }
    }
    return starts;
}

// What a line looks like with every number replaced by '#' and every run of
// spaces by one space. Two lines with the same skeleton differ only in their
// numbers: that is how --update knows which printed line takes which page
// line's marks, and how a diff pairs "-" with "+" lines.
std::string skeleton(const std::string& s) {
    std::string out;
    for (size_t i = 0; i < s.size();) {
        if (std::isspace((unsigned char)s[i])) {
            while (i < s.size() && std::isspace((unsigned char)s[i])) ++i;
            out += ' ';
            continue;
        }
        const size_t len = number_at(s, i);
        if (len > 0) {
            out += '#';
            i += len;
        } else {
            out += s[i++];
        }
    }
    return out;
}

// One expected line, compiled: literal text, "any number here" (a mark),
// and "any run of spaces" (the spaces next to a mark).
struct Pattern {
    enum Kind { kText, kNumber, kSpaces };
    struct Item {
        Kind kind;
        std::string text;
    };
    std::string line;          // as the page writes it (indentation of the fence removed)
    bool ellipsis = false;     // a "..." line
    std::vector<Item> items;
    std::string plain;         // the line with its marks removed
    std::vector<bool> marked;  // per number of `plain`: was it marked?
};

Pattern compile(const std::string& raw) {
    Pattern p;
    p.line = rtrim(raw);
    if (trim(p.line) == "...") {
        p.ellipsis = true;
        return p;
    }
    const std::string& s = p.line;
    std::vector<size_t> marked_at;  // offsets in `plain` of the marked numbers
    auto add = [&](Pattern::Kind k, const std::string& t) {
        if (k == Pattern::kText && !p.items.empty() && p.items.back().kind == Pattern::kText)
            p.items.back().text += t;
        else
            p.items.push_back({k, t});
    };
    for (size_t i = 0; i < s.size();) {
        if (is_mark(s, i)) {
            // The spaces just before the mark become flexible.
            if (!p.items.empty() && p.items.back().kind == Pattern::kText) {
                std::string& t = p.items.back().text;
                size_t k = t.size();
                while (k > 0 && (t[k - 1] == ' ' || t[k - 1] == '\t')) --k;
                if (k < t.size()) {
                    t.erase(k);
                    if (t.empty()) p.items.pop_back();
                    p.items.push_back({Pattern::kSpaces, ""});
                }
            }
            const size_t len = number_at(s, i + 1);
            marked_at.push_back(p.plain.size());
            p.plain += s.substr(i + 1, len);
            p.items.push_back({Pattern::kNumber, ""});
            i += 1 + len;
            // ... and so do the spaces just after it.
            size_t j = i;
            while (j < s.size() && (s[j] == ' ' || s[j] == '\t')) ++j;
            if (j > i) {
                p.plain += s.substr(i, j - i);
                p.items.push_back({Pattern::kSpaces, ""});
                i = j;
            }
            continue;
        }
        p.plain += s[i];
        add(Pattern::kText, std::string(1, s[i]));
        ++i;
    }
    for (size_t start : number_starts(p.plain))
        p.marked.push_back(std::find(marked_at.begin(), marked_at.end(), start) != marked_at.end());
    return p;
}

// Does the printed line `a` match the page's line? Greedy is exact here: a
// flexible space run is always followed by a number or by text that does not
// start with a space, and a number is taken whole.
bool matches(const Pattern& p, const std::string& a) {
    size_t pos = 0;
    for (const Pattern::Item& it : p.items) {
        switch (it.kind) {
            case Pattern::kText:
                if (a.compare(pos, it.text.size(), it.text) != 0) return false;
                pos += it.text.size();
                break;
            case Pattern::kSpaces:
                while (pos < a.size() && (a[pos] == ' ' || a[pos] == '\t')) ++pos;
                break;
            case Pattern::kNumber: {
                const size_t len = number_at(a, pos);
                if (len == 0) return false;
                pos += len;
                break;
            }
        }
    }
    return pos == a.size();
}

// The printed line with a "~" before the same numbers (by their order in the
// line) that the page marked. Only meaningful when the skeletons are equal.
std::string remark(const std::string& printed, const Pattern& like) {
    const std::vector<size_t> starts = number_starts(printed);
    std::string out;
    size_t from = 0;
    for (size_t k = 0; k < starts.size() && k < like.marked.size(); ++k) {
        if (!like.marked[k]) continue;
        out += printed.substr(from, starts[k] - from);
        out += '~';
        from = starts[k];
    }
    return out + printed.substr(from);
}

bool has_marks(const Pattern& p) { return std::find(p.marked.begin(), p.marked.end(), true) != p.marked.end(); }

// ---------------------------------------------------------------------------
// The document: fences, commands, directives
// ---------------------------------------------------------------------------

struct Command {
    std::string text;             // what bash runs (continuation lines included)
    std::string first_line;       // the "$ " line without its prompt, for messages
    size_t line = 0;              // index of the "$ " line in Document::lines
    size_t out_begin = 0;         // its expected output: Document::lines[out_begin, out_end)
    size_t out_end = 0;
};

struct Listing {
    size_t fence = 0;             // index of the opening fence in Document::lines
    std::string indent;           // the fence's indentation, which its lines share
    std::vector<Command> commands;
    std::string skip_reason;      // non-empty: not run
    std::vector<std::string> needs;
    int timeout_s = 0;            // 0: --timeout's
};

struct Document {
    std::string path;             // as named on the command line (messages)
    std::string run_dir;          // where the commands run: the real document's project root (run_dir_of)
    std::vector<std::string> lines;
    bool final_newline = true;
    std::vector<Listing> listings;
};

std::string where(const Document& d, size_t line_index) { return d.path + ":" + std::to_string(line_index + 1); }

// "<!-- check-docs: needs gdb; timeout 300 -->" -> the listing's settings.
void parse_directive(const Document& d, size_t at, const std::string& body, Listing& l) {
    std::string rest = trim(body);
    while (!rest.empty()) {
        if (starts_with(rest, "skip")) {
            // "skip -- REASON": the reason is the rest of the comment, ';' included.
            std::string reason = trim(rest.substr(4));
            if (starts_with(reason, "--")) reason = trim(reason.substr(2));
            if (reason.empty()) throw DocError(where(d, at) + ": 'skip' needs a reason: <!-- check-docs: skip -- REASON -->");
            l.skip_reason = reason;
            return;
        }
        const size_t semi = rest.find(';');
        const std::string part = trim(rest.substr(0, semi));
        rest = semi == std::string::npos ? "" : trim(rest.substr(semi + 1));
        if (starts_with(part, "needs ")) {
            std::istringstream words(part.substr(6));
            for (std::string w; words >> w;) l.needs.push_back(w);
        } else if (starts_with(part, "timeout ")) {
            const std::string v = trim(part.substr(8));
            char* end = nullptr;
            const long s = std::strtol(v.c_str(), &end, 10);
            if (v.empty() || *end != '\0' || s < 1 || s > 86400)
                throw DocError(where(d, at) + ": timeout expects whole seconds in 1..86400, got '" + v + "'");
            l.timeout_s = (int)s;
        } else if (!part.empty()) {
            throw DocError(where(d, at) + ": unknown check-docs directive '" + part +
                           "' (known: skip -- REASON; needs PROGRAM or PATH; timeout SECONDS)");
        }
    }
}

Document parse_document(const std::string& path, const std::string& text, const std::string& run_dir) {
    Document d;
    d.path = path;
    d.run_dir = run_dir;
    d.lines = split_lines(text);
    d.final_newline = text.empty() || text.back() == '\n';
    const std::string kDirective = "<!-- check-docs:";
    std::vector<bool> directive_used(d.lines.size(), false);

    for (size_t i = 0; i < d.lines.size(); ++i) {
        const std::string& line = d.lines[i];
        const size_t ind = line.find_first_not_of(' ');
        if (ind == std::string::npos || line.compare(ind, 3, "```") != 0) continue;
        // An opening fence: its backticks, then an optional info string.
        size_t ticks = 0;
        while (ind + ticks < line.size() && line[ind + ticks] == '`') ++ticks;
        Listing l;
        l.fence = i;
        l.indent = line.substr(0, ind);
        size_t close = i + 1;
        for (; close < d.lines.size(); ++close) {
            const std::string t = trim(d.lines[close]);
            if (t.size() >= ticks && t.find_first_not_of('`') == std::string::npos) break;
        }
        if (close == d.lines.size()) throw DocError(where(d, i) + ": this code fence is never closed");

        // The body, by lines: commands and what follows each.
        auto body = [&](size_t k) {
            const std::string& s = d.lines[k];
            return starts_with(s, l.indent) ? s.substr(l.indent.size()) : s;
        };
        for (size_t k = i + 1; k < close;) {
            const std::string s = body(k);
            if (!starts_with(s, "$ ")) {  // a block without commands (checked below)
                ++k;
                continue;
            }
            Command c;
            c.line = k;
            c.first_line = s.substr(2);
            c.text = s.substr(2);
            while (!c.text.empty() && c.text.back() == '\\') {
                if (++k >= close) throw DocError(where(d, c.line) + ": the command's last line ends with '\\' but the listing ends");
                c.text += "\n" + body(k);
            }
            ++k;
            c.out_begin = k;
            while (k < close && !starts_with(body(k), "$ ")) ++k;
            c.out_end = k;
            if (c.out_end - c.out_begin > kMaxExpectedLines)
                throw DocError(where(d, c.line) + ": this command's output on the page is " + std::to_string(c.out_end - c.out_begin) +
                               " lines, more than the " + std::to_string(kMaxExpectedLines) +
                               " check_docs compares: show its start and its end with a \"...\" line between them");
            l.commands.push_back(c);
        }
        if (!l.commands.empty() && l.commands.front().line != i + 1)
            throw DocError(where(d, i + 1) + ": a listing with commands must start with its first \"$ \" line");

        // Directives: the comment lines right above the fence (blank lines allowed).
        size_t k = i;
        while (k > 0 && trim(d.lines[k - 1]).empty()) --k;
        while (k > 0 && starts_with(trim(d.lines[k - 1]), kDirective)) {
            const std::string t = trim(d.lines[k - 1]);
            if (t.size() < kDirective.size() + 3 || t.compare(t.size() - 3, 3, "-->") != 0)
                throw DocError(where(d, k - 1) + ": a check-docs comment must end with --> on the same line");
            if (l.commands.empty())
                throw DocError(where(d, k - 1) + ": a check-docs directive must come right before a listing with a \"$ \" command");
            parse_directive(d, k - 1, t.substr(kDirective.size(), t.size() - 3 - kDirective.size()), l);
            directive_used[k - 1] = true;
            --k;
        }
        if (!l.commands.empty()) d.listings.push_back(l);
        i = close;
    }
    for (size_t i = 0; i < d.lines.size(); ++i)
        if (starts_with(trim(d.lines[i]), kDirective) && !directive_used[i])
            throw DocError(where(d, i) + ": a check-docs directive must come right before a listing with a \"$ \" command");
    return d;
}

Document load_document(const std::string& path, const std::string& run_dir) {
    return parse_document(path, read_file(path), run_dir);
}

// Where a document's listings run (and its `needs` paths are resolved): the
// nearest folder at or above the document's own that holds a Makefile, i.e.
// the root of the project the page belongs to; the document's own folder when
// there is none. lab/LAB.md's commands are `./build/study ...`, typed at the
// repository root as the tutorial's are, not from lab/.
std::string run_dir_of(const std::string& path) {
    std::error_code ec;
    fs::path own = fs::path(path).parent_path();
    if (own.empty()) own = ".";
    fs::path dir = fs::absolute(own, ec);
    if (ec) return own.string();
    dir = dir.lexically_normal();
    if (!dir.has_filename()) dir = dir.parent_path();  // "/repo/" -> "/repo"
    for (fs::path d = dir;; d = d.parent_path()) {
        if (fs::is_regular_file(d / "Makefile", ec)) return d.string();
        if (d == d.root_path() || d.parent_path() == d) break;
    }
    return own.string();
}

// ---------------------------------------------------------------------------
// Running a listing
// ---------------------------------------------------------------------------

struct RunResult {
    std::vector<std::string> outputs;  // what each command printed
    bool timed_out = false;
    double seconds = 0;
};

// Between two commands the script prints this, so one shell can run them all
// and the output can still be cut per command. \x1e (the ASCII record
// separator) does not occur in text a program means to show.
std::string separator(size_t i) { return "\x1e" "check_docs " + std::to_string(i) + "\x1e"; }

RunResult run_listing(const Listing& l, const std::string& dir, int timeout_s) {
    std::string script;
    for (size_t i = 0; i < l.commands.size(); ++i)
        script += l.commands[i].text + "\nprintf '\\036check_docs " + std::to_string(i) + "\\036\\n'\n";

    // The listing's terminal: a pseudo-terminal, whose master end we read.
    // Not a pipe: at a terminal a program's stdout is flushed at every line,
    // in a pipe only when its buffer fills or the program exits, so in a pipe
    // a line on stderr can overtake a line printed to stdout before it. The
    // page must show what a reader at a terminal sees.
    const int master = posix_openpt(O_RDWR | O_NOCTTY);
    if (master < 0 || grantpt(master) != 0 || unlockpt(master) != 0 || ptsname(master) == nullptr)
        throw DocError(std::string("cannot open a pseudo-terminal: ") + std::strerror(errno));
    const std::string slave_name = ptsname(master);
    const auto t0 = std::chrono::steady_clock::now();
    const pid_t pid = fork();
    if (pid < 0) throw DocError(std::string("fork: ") + std::strerror(errno));
    if (pid == 0) {
        // The child: a session of its own (so the terminal is its controlling
        // terminal, and a timeout can stop everything the listing started by
        // its process group), stdout and stderr on the terminal, no input.
        setsid();
        const int slave = open(slave_name.c_str(), O_RDWR);
        if (slave < 0) _exit(127);
        termios t;
        if (tcgetattr(slave, &t) == 0) {
            t.c_oflag &= ~(tcflag_t)OPOST;  // "\n" stays "\n" (a terminal would send "\r\n")
            tcsetattr(slave, TCSANOW, &t);
        }
        const int devnull = open("/dev/null", O_RDONLY);
        if (devnull >= 0) dup2(devnull, 0);
        dup2(slave, 1);
        dup2(slave, 2);
        close(slave);
        close(master);
        setenv("LC_ALL", "C", 1);
        setenv("TERM", "dumb", 1);  // no colors, no cursor tricks
        for (const char* v : {"MAKEFLAGS", "MFLAGS", "MAKELEVEL", "BASH_ENV"}) unsetenv(v);
        signal(SIGPIPE, SIG_DFL);  // `cmd | head` must end cmd as it does at a terminal
        if (chdir(dir.c_str()) != 0) {
            std::fprintf(stderr, "check_docs: cannot enter %s: %s\n", dir.c_str(), std::strerror(errno));
            _exit(127);
        }
        execlp("bash", "bash", "-c", script.c_str(), (char*)nullptr);
        std::fprintf(stderr, "check_docs: cannot run bash: %s\n", std::strerror(errno));
        _exit(127);
    }

    RunResult r;
    std::string out;
    const auto deadline = t0 + std::chrono::seconds(timeout_s);
    bool term_sent = false;
    auto kill_at = deadline;
    char buf[65536];
    for (;;) {
        const auto now = std::chrono::steady_clock::now();
        if (!term_sent && now >= deadline) {
            // Ask politely, then insist two seconds later.
            r.timed_out = true;
            killpg(pid, SIGTERM);
            term_sent = true;
            kill_at = now + std::chrono::seconds(2);
        } else if (term_sent && now >= kill_at) {
            killpg(pid, SIGKILL);
            kill_at = now + std::chrono::hours(1);
        }
        const auto next = term_sent ? kill_at : deadline;
        const long long ms = std::chrono::duration_cast<std::chrono::milliseconds>(next - now).count();
        pollfd pfd{master, POLLIN, 0};
        const int ready = poll(&pfd, 1, (int)std::clamp(ms, 1LL, 1000LL));
        if (ready < 0 && errno == EINTR) continue;
        if (ready <= 0) continue;
        const ssize_t got = read(master, buf, sizeof buf);
        if (got < 0 && errno == EINTR) continue;
        if (got <= 0) break;  // EIO (Linux) or EOF: every process that held the terminal is gone
        if (out.size() < kMaxOutputBytes) out.append(buf, (size_t)got);
    }
    close(master);
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

    // Cut the output at the separators. A command that printed no final
    // newline leaves the separator at the end of its last line.
    size_t from = 0;
    for (size_t i = 0; i < l.commands.size(); ++i) {
        const std::string sep = separator(i);
        const size_t at = out.find(sep, from);
        if (at == std::string::npos) {
            r.outputs.push_back(out.substr(from));  // it never finished (timeout, exit)
            from = out.size();
            continue;
        }
        r.outputs.push_back(out.substr(from, at - from));
        from = at + sep.size();
        if (from < out.size() && out[from] == '\n') ++from;
    }
    return r;
}

bool on_path(const std::string& program) {
    const char* path = std::getenv("PATH");
    if (!path) return false;
    std::istringstream dirs(path);
    for (std::string dir; std::getline(dirs, dir, ':');) {
        const std::string candidate = (dir.empty() ? "." : dir) + "/" + program;
        if (access(candidate.c_str(), X_OK) == 0) return true;
    }
    return false;
}

// Why a listing cannot run here, or "" when it can.
std::string unmet_need(const Listing& l, const std::string& dir) {
    for (const std::string& n : l.needs) {
        if (n.find('/') != std::string::npos) {
            std::error_code ec;
            if (!fs::exists(fs::path(dir) / n, ec)) return "needs " + n + ", which is not there";
        } else if (!on_path(n)) {
            return "needs " + n + ", which is not on PATH";
        }
    }
    return "";
}

// ---------------------------------------------------------------------------
// Comparing: an alignment of the page's lines with the printed ones
// ---------------------------------------------------------------------------
//
// A listing matches when its expected lines can be laid over the printed
// lines one to one, each "..." taking any run of printed lines. When they
// cannot, I want the smallest explanation of the difference, both for the
// diff shown and for --update, so this is an edit distance: a page line and a
// printed line that match cost 0, a pair that differs only in numbers costs
// 1 (the usual drift: "31" became "30"), a printed line the page does not have
// costs 1, and a page line that was not printed costs 3, because the author
// chose to show it: with a cheaper price a "..." next to it would rather
// swallow its printed successor and drop the line from the page on --update.
// Dynamic programming finds the cheapest alignment.
//
// Dynamic programming costs (page lines) x (printed lines) in time and
// memory, which for a long listing is seconds and, for a page block of tens
// of thousands of lines, more memory than there is. So: both sides are
// bounded (kMaxExpectedLines on the page, kMaxAlignLines printed); the lines
// that match at the start and at the end are paired first, in linear time
// (pairing an equal first or last pair is always part of a cheapest
// alignment, as in any edit distance); only the middle that is left goes to
// the dynamic programme, and only while it fits in kMaxAlignCells. A middle
// bigger than that (two long listings that differ throughout) is aligned
// greedily, in linear time: a pair that matches or differs in numbers only,
// else a short look ahead for the line that resumes the match, and a "..."
// that ends where the page line after it first matches. That alignment is
// not always the cheapest, but it never calls a drift OK: a zero cost still
// means every page line found its printed line.

struct Step {
    enum Op { kMatch, kEllipsis, kSwallowed, kChanged, kMissing, kExtra };
    Op op;
    int e;  // index into the page's lines, or -1
    int a;  // index into the printed lines, or -1
};

// Blank lines at the end do not count, on either side.
template <class T, class Blank>
void drop_trailing(std::vector<T>& v, Blank blank) {
    while (!v.empty() && blank(v.back())) v.pop_back();
}

constexpr int kMissingCost = 3;
constexpr size_t kLookAhead = 64;  // the greedy alignment's reach

// The cheapest alignment of E[e0, e1) with A[a0, a1), by dynamic programming
// (the caller keeps (e1 - e0) x (a1 - a0) within kMaxAlignCells). Steps carry
// absolute indices.
std::vector<Step> align_exact(const std::vector<Pattern>& E, const std::vector<std::string>& A, size_t e0, size_t e1, size_t a0,
                              size_t a1, int* total_cost) {
    const size_t n = e1 - e0, m = a1 - a0;
    std::vector<std::string> sk_a(m);
    for (size_t j = 0; j < m; ++j) sk_a[j] = skeleton(A[a0 + j]);
    std::vector<std::string> sk_e(n);
    for (size_t i = 0; i < n; ++i) sk_e[i] = E[e0 + i].ellipsis ? "" : skeleton(E[e0 + i].plain);
    auto pair_cost = [&](size_t i, size_t j) {
        if (matches(E[e0 + i], A[a0 + j])) return 0;
        return sk_e[i] == sk_a[j] ? 1 : kMissingCost + 1;
    };
    // cost[i][j]: cheapest alignment of E[i..] with A[j..]; pc caches pair_cost.
    const size_t W = m + 1;
    std::vector<int> cost((n + 1) * W, 0);
    std::vector<signed char> pc(n * m, 0);
    for (size_t i = 0; i < n; ++i)
        if (!E[e0 + i].ellipsis)
            for (size_t j = 0; j < m; ++j) pc[i * m + j] = (signed char)pair_cost(i, j);
    for (size_t j = 0; j <= m; ++j) cost[n * W + j] = (int)(m - j);
    for (size_t ii = n; ii-- > 0;) {
        for (size_t jj = m + 1; jj-- > 0;) {
            int best;
            if (E[e0 + ii].ellipsis) {
                best = cost[(ii + 1) * W + jj];
                if (jj < m) best = std::min(best, cost[ii * W + jj + 1]);
            } else {
                best = kMissingCost + cost[(ii + 1) * W + jj];
                if (jj < m) {
                    best = std::min(best, 1 + cost[ii * W + jj + 1]);
                    best = std::min(best, pc[ii * m + jj] + cost[(ii + 1) * W + jj + 1]);
                }
            }
            cost[ii * W + jj] = best;
        }
    }
    *total_cost = cost[0];
    // Walk the cheapest path. On ties: pair lines first, and end an ellipsis
    // as early as possible, so "..." swallows no line the page shows.
    std::vector<Step> steps;
    size_t i = 0, j = 0;
    while (i < n || j < m) {
        if (i == n) {
            steps.push_back({Step::kExtra, -1, (int)(a0 + j++)});
            continue;
        }
        const int here = cost[i * W + j];
        if (E[e0 + i].ellipsis) {
            if (cost[(i + 1) * W + j] == here) {
                steps.push_back({Step::kEllipsis, (int)(e0 + i++), -1});
            } else {
                steps.push_back({Step::kSwallowed, (int)(e0 + i), (int)(a0 + j++)});
            }
            continue;
        }
        if (j < m && pc[i * m + j] + cost[(i + 1) * W + j + 1] == here) {
            steps.push_back({pc[i * m + j] == 0 ? Step::kMatch : Step::kChanged, (int)(e0 + i++), (int)(a0 + j++)});
        } else if (kMissingCost + cost[(i + 1) * W + j] == here) {
            steps.push_back({Step::kMissing, (int)(e0 + i++), -1});
        } else {
            steps.push_back({Step::kExtra, -1, (int)(a0 + j++)});
        }
    }
    return steps;
}

// A linear alignment of E[e0, e1) with A[a0, a1), for a middle too big for
// the exact one (see above).
std::vector<Step> align_greedy(const std::vector<Pattern>& E, const std::vector<std::string>& A, size_t e0, size_t e1, size_t a0,
                               size_t a1, int* total_cost) {
    std::vector<Step> steps;
    int total = 0;
    size_t i = e0, j = a0;
    auto same_skeleton = [&](size_t ei, size_t aj) { return skeleton(E[ei].plain) == skeleton(A[aj]); };
    while (i < e1 || j < a1) {
        if (i == e1) {
            steps.push_back({Step::kExtra, -1, (int)j++});
            total += 1;
            continue;
        }
        if (E[i].ellipsis) {
            // End it where the next page line that is not "..." first matches.
            size_t next = i + 1;
            while (next < e1 && E[next].ellipsis) ++next;
            size_t stop = a1;
            if (next < e1)
                for (size_t k = j; k < a1; ++k)
                    if (matches(E[next], A[k])) {
                        stop = k;
                        break;
                    }
            if (next < e1 && stop == a1) stop = j;  // nothing matches: let the lines after it explain the rest
            for (; j < stop; ++j) steps.push_back({Step::kSwallowed, (int)i, (int)j});
            steps.push_back({Step::kEllipsis, (int)i++, -1});
            continue;
        }
        if (j == a1) {
            steps.push_back({Step::kMissing, (int)i++, -1});
            total += kMissingCost;
            continue;
        }
        if (matches(E[i], A[j])) {
            steps.push_back({Step::kMatch, (int)i++, (int)j++});
            continue;
        }
        if (same_skeleton(i, j)) {
            steps.push_back({Step::kChanged, (int)i++, (int)j++});
            total += 1;
            continue;
        }
        // Printed lines the page does not have, before this page line?
        size_t k = j + 1;
        while (k < a1 && k <= j + kLookAhead && !matches(E[i], A[k])) ++k;
        if (k < a1 && k <= j + kLookAhead) {
            for (; j < k; ++j) steps.push_back({Step::kExtra, -1, (int)j}), total += 1;
            continue;
        }
        // Page lines that were not printed, before this printed line?
        size_t l = i + 1;
        while (l < e1 && l <= i + kLookAhead && (E[l].ellipsis || !matches(E[l], A[j]))) ++l;
        if (l < e1 && l <= i + kLookAhead) {
            for (; i < l; ++i) steps.push_back({Step::kMissing, (int)i, -1}), total += kMissingCost;
            continue;
        }
        steps.push_back({Step::kMissing, (int)i++, -1});
        steps.push_back({Step::kExtra, -1, (int)j++});
        total += kMissingCost + 1;
    }
    *total_cost = total;
    return steps;
}

// The alignment of the page's lines E with the printed lines A: equal ends
// first, then the middle, exactly when it is small enough.
std::vector<Step> align(const std::vector<Pattern>& E, const std::vector<std::string>& A, int* total_cost,
                        bool* greedy = nullptr) {
    size_t head = 0;
    while (head < E.size() && head < A.size() && !E[head].ellipsis && matches(E[head], A[head])) ++head;
    size_t tail = 0;
    while (tail < E.size() - head && tail < A.size() - head && !E[E.size() - 1 - tail].ellipsis &&
           matches(E[E.size() - 1 - tail], A[A.size() - 1 - tail]))
        ++tail;
    const size_t e0 = head, e1 = E.size() - tail, a0 = head, a1 = A.size() - tail;
    std::vector<Step> steps;
    for (size_t k = 0; k < head; ++k) steps.push_back({Step::kMatch, (int)k, (int)k});
    const bool big = (e1 - e0) * (a1 - a0) > kMaxAlignCells;
    if (greedy) *greedy = big;
    const std::vector<Step> middle = big ? align_greedy(E, A, e0, e1, a0, a1, total_cost) : align_exact(E, A, e0, e1, a0, a1, total_cost);
    steps.insert(steps.end(), middle.begin(), middle.end());
    for (size_t k = tail; k-- > 0;) steps.push_back({Step::kMatch, (int)(E.size() - 1 - k), (int)(A.size() - 1 - k)});
    return steps;
}

// One command's comparison.
struct Verdict {
    bool ok = true;
    std::vector<Pattern> expected;
    std::vector<std::string> printed;
    std::vector<Step> steps;
    bool truncated = false;  // too many printed lines to align
};

Verdict compare(const Document& d, const Listing& l, const Command& c, const std::string& output) {
    Verdict v;
    for (size_t k = c.out_begin; k < c.out_end; ++k) {
        const std::string& s = d.lines[k];
        v.expected.push_back(compile(starts_with(s, l.indent) ? s.substr(l.indent.size()) : s));
    }
    drop_trailing(v.expected, [](const Pattern& p) { return !p.ellipsis && p.line.empty(); });
    for (const std::string& s : split_lines(output)) v.printed.push_back(rtrim(s));
    drop_trailing(v.printed, [](const std::string& s) { return s.empty(); });
    if (v.printed.size() > kMaxAlignLines) {
        v.printed.resize(kMaxAlignLines);
        v.truncated = true;
    }
    int total = 0;
    v.steps = align(v.expected, v.printed, &total);
    v.ok = total == 0 && !v.truncated;
    return v;
}

void print_diff(const Document& d, const Command& c, const Verdict& v) {
    int shown = 0, hidden = 0;
    auto show = [&](char sign, const std::string& place, const std::string& text) {
        if (shown >= kDiffLinesShown) {
            ++hidden;
            return;
        }
        std::printf("      %c %-22s |%s\n", sign, place.c_str(), text.c_str());
        ++shown;
    };
    for (const Step& s : v.steps) {
        const std::string page = s.e >= 0 ? where(d, c.out_begin + (size_t)s.e) : "";
        const std::string got = s.a >= 0 ? "printed line " + std::to_string(s.a + 1) : "";
        switch (s.op) {
            case Step::kChanged:
                show('-', page, v.expected[(size_t)s.e].line);
                show('+', got, v.printed[(size_t)s.a]);
                break;
            case Step::kMissing: show('-', page, v.expected[(size_t)s.e].line); break;
            case Step::kExtra: show('+', got, v.printed[(size_t)s.a]); break;
            default: break;
        }
    }
    if (hidden > 0) std::printf("      (%d more differing lines; --update writes the printed output into the page)\n", hidden);
    if (v.truncated) std::printf("      (it printed more than %zu lines; only those were compared)\n", kMaxAlignLines);
}

// The page's new lines for a drifted command: what was printed, with the
// page's marks and elisions kept where they still fit.
std::vector<std::string> updated_lines(const Verdict& v, const std::string& indent, bool refresh, bool* ok, std::string* why) {
    std::vector<std::string> out;
    auto like_any = [&](const std::string& printed) -> std::string {
        // A printed line the page did not pair: borrow the marks of any page
        // line that has its skeleton.
        const std::string sk = skeleton(printed);
        for (const Pattern& p : v.expected)
            if (!p.ellipsis && has_marks(p) && skeleton(p.plain) == sk) return remark(printed, p);
        return printed;
    };
    for (const Step& s : v.steps) {
        switch (s.op) {
            case Step::kMatch:
                // A line that matches stays as the page has it, unless fresh
                // timings were asked for: then its ~ numbers are the new ones.
                out.push_back(refresh ? remark(v.printed[(size_t)s.a], v.expected[(size_t)s.e]) : v.expected[(size_t)s.e].line);
                break;
            case Step::kEllipsis: out.push_back(v.expected[(size_t)s.e].line); break;
            case Step::kSwallowed: break;
            case Step::kMissing: break;
            case Step::kChanged: {
                const Pattern& p = v.expected[(size_t)s.e];
                const std::string& a = v.printed[(size_t)s.a];
                out.push_back(skeleton(p.plain) == skeleton(a) ? remark(a, p) : like_any(a));
                break;
            }
            case Step::kExtra: out.push_back(like_any(v.printed[(size_t)s.a])); break;
        }
    }
    *ok = true;
    for (std::string& s : out) {
        if (starts_with(s, "$ ") || trim(s).find_first_not_of('`') == std::string::npos) {
            if (!trim(s).empty()) {
                *ok = false;
                *why = "a printed line would read as a command or a fence: '" + s + "'";
            }
        }
        if (!s.empty()) s = indent + s;
    }
    return out;
}

// ---------------------------------------------------------------------------
// Checking documents
// ---------------------------------------------------------------------------

struct Options {
    bool update = false;
    bool refresh = false;  // with update: rewrite the ~ numbers of matching listings too
    bool selftest = false;
    bool list = false;
    std::string only;
    int timeout_s = kDefaultTimeoutS;
    std::vector<std::string> files;
};

struct Tally {
    int ok = 0, drift = 0, skip = 0;
    int unfixed = 0;  // drifted listings that --update could not rewrite (a timeout, say)
};

bool picked(const Listing& l, const Options& o) {
    if (o.only.empty()) return true;
    for (const Command& c : l.commands)
        if (c.text.find(o.only) != std::string::npos) return true;
    return false;
}

std::string one_line(const std::string& s, size_t width = 90) {
    std::string t = s.substr(0, s.find('\n'));
    if (s.find('\n') != std::string::npos) t += " \\ ...";
    if (t.size() > width) t = t.substr(0, width - 3) + "...";
    return t;
}

// A rewrite of one command's output: page lines [begin, end) become `lines`.
struct Edit {
    size_t begin, end;
    std::vector<std::string> lines;
};

// Checks one listing and prints its line; returns "OK", "DRIFT" or "SKIP".
// When updating (`edits` given) it adds the rewrites of its drifted commands,
// and `fixed` says whether they cover the whole drift (not after a timeout).
std::string check_listing(const Document& d, const Listing& l, const Options& o, std::vector<Edit>* edits, bool* fixed = nullptr) {
    const std::string head = where(d, l.commands.front().line) + "  " + one_line(l.commands.front().first_line);
    std::string why = l.skip_reason;
    if (why.empty()) why = unmet_need(l, d.run_dir);
    if (!why.empty()) {
        std::printf("SKIP   %s\n       (%s)\n", head.c_str(), why.c_str());
        return "SKIP";
    }
    const int timeout = l.timeout_s > 0 ? l.timeout_s : o.timeout_s;
    const RunResult r = run_listing(l, d.run_dir, timeout);
    bool ok = !r.timed_out;
    std::vector<std::pair<size_t, Verdict>> drifted;
    for (size_t i = 0; i < l.commands.size(); ++i) {
        Verdict v = compare(d, l, l.commands[i], r.outputs[i]);
        if (!v.ok) {
            ok = false;
            drifted.emplace_back(i, std::move(v));
        }
    }
    char secs[32];
    std::snprintf(secs, sizeof secs, "%.1f s", r.seconds);
    if (ok) {
        std::printf("OK     %s  (%s)\n", head.c_str(), secs);
        if (edits && o.refresh) {
            // Fresh timings: the page's ~ numbers become the ones just printed.
            for (size_t i = 0; i < l.commands.size(); ++i) {
                const Command& c = l.commands[i];
                const Verdict v = compare(d, l, c, r.outputs[i]);
                bool can = true;
                std::string why_not;
                std::vector<std::string> lines = updated_lines(v, l.indent, true, &can, &why_not);
                size_t end = c.out_end;
                while (end > c.out_begin && trim(d.lines[end - 1]).empty()) --end;
                if (can && !std::equal(lines.begin(), lines.end(), d.lines.begin() + (long)c.out_begin, d.lines.begin() + (long)end))
                    edits->push_back({c.out_begin, end, lines});
            }
        }
        return "OK";
    }
    std::printf("DRIFT  %s  (%s)\n", head.c_str(), secs);
    if (r.timed_out)
        std::printf("       timed out after %d s and was stopped (a longer limit: <!-- check-docs: timeout SECONDS -->)\n", timeout);
    for (const auto& [i, v] : drifted) {
        if (l.commands.size() > 1)
            std::printf("       in %s: $ %s\n", where(d, l.commands[i].line).c_str(), one_line(l.commands[i].first_line).c_str());
        print_diff(d, l.commands[i], v);
    }
    if (fixed) *fixed = edits && !r.timed_out;
    if (edits && !r.timed_out) {
        for (const auto& [i, v] : drifted) {
            const Command& c = l.commands[i];
            bool can = true;
            std::string why_not;
            std::vector<std::string> lines = updated_lines(v, l.indent, o.refresh, &can, &why_not);
            if (!can) {
                std::printf("       not updated: %s\n", why_not.c_str());
                if (fixed) *fixed = false;
                continue;
            }
            // Keep the page's blank lines between this output and the next command.
            size_t end = c.out_end;
            while (end > c.out_begin && trim(d.lines[end - 1]).empty()) --end;
            edits->push_back({c.out_begin, end, lines});
        }
    }
    return "DRIFT";
}

// Applies edits (bottom up, so earlier indices stay valid) and writes the file.
void apply_edits(const Document& d, std::vector<Edit> edits) {
    if (edits.empty()) return;
    std::vector<std::string> lines = d.lines;
    std::sort(edits.begin(), edits.end(), [](const Edit& a, const Edit& b) { return a.begin > b.begin; });
    for (const Edit& e : edits) {
        lines.erase(lines.begin() + (long)e.begin, lines.begin() + (long)e.end);
        lines.insert(lines.begin() + (long)e.begin, e.lines.begin(), e.lines.end());
    }
    std::string text;
    for (size_t i = 0; i < lines.size(); ++i) {
        text += lines[i];
        if (i + 1 < lines.size() || d.final_newline) text += '\n';
    }
    write_file(d.path, text);
}

int check_files(const Options& o) {
    const auto t0 = std::chrono::steady_clock::now();
    Tally t;
    for (const std::string& path : o.files) {
        const Document d = load_document(path, run_dir_of(path));
        if (o.list) {
            for (const Listing& l : d.listings) {
                if (!picked(l, o)) continue;
                std::string note = !l.skip_reason.empty() ? "  [skip: " + l.skip_reason + "]" : "";
                if (!l.needs.empty()) {
                    note += "  [needs";
                    for (const std::string& n : l.needs) note += " " + n;
                    note += "]";
                }
                std::printf("%s  %zu command(s)  $ %s%s\n", where(d, l.commands.front().line).c_str(), l.commands.size(),
                            one_line(l.commands.front().first_line).c_str(), note.c_str());
            }
            continue;
        }
        std::vector<Edit> edits;
        for (const Listing& l : d.listings) {
            if (!picked(l, o)) continue;
            bool fixed = false;
            const std::string s = check_listing(d, l, o, o.update ? &edits : nullptr, &fixed);
            if (s == "OK") ++t.ok;
            if (s == "SKIP") ++t.skip;
            if (s == "DRIFT") ++t.drift, t.unfixed += !fixed;
        }
        if (o.update && !edits.empty()) {
            apply_edits(d, edits);
            std::printf("UPDATED %s: %zu command output(s) rewritten; read `git diff %s` before committing\n", path.c_str(),
                        edits.size(), path.c_str());
        }
    }
    if (o.list) return 0;
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("check_docs: %d listing(s): %d OK, %d DRIFT, %d SKIP, in %.0f s\n", t.ok + t.drift + t.skip, t.ok, t.drift, t.skip, secs);
    if (t.drift > 0 && !o.update)
        std::printf("check_docs: the pages no longer show what the commands print; `make docs` rewrites the outputs "
                    "(then read the diff: the prose may need fixing too)\n");
    if (o.update) return t.unfixed > 0 ? 1 : 0;
    return t.drift > 0 ? 1 : 0;
}

// ---------------------------------------------------------------------------
// --selftest
// ---------------------------------------------------------------------------

// The first number in `line` that the page did not mark, as (offset, length)
// of its digits; {npos, 0} when there is none.
std::pair<size_t, size_t> first_count(const std::string& line) {
    for (size_t i = 0; i < line.size();) {
        if (is_mark(line, i)) {
            i += 1 + number_at(line, i + 1);
            continue;
        }
        if (std::isdigit((unsigned char)line[i]) && (i == 0 || !std::isalnum((unsigned char)line[i - 1]))) {
            size_t j = i;
            while (j < line.size() && std::isdigit((unsigned char)line[j])) ++j;
            if (j - i <= 9) return {i, j - i};
            i = j;
            continue;
        }
        ++i;
    }
    return {std::string::npos, 0};
}

// The comparison's bounds, on made-up listings (no command runs): a long
// listing with one count changed is a DRIFT with exactly that change; a
// "..." between two long runs is OK; two long listings that differ
// throughout take the greedy path and still end; and a page block of 60,000
// lines is refused as malformed (it once ended in std::bad_alloc). Times are
// printed, not judged: they depend on the machine. Returns the failures.
int selftest_alignment() {
    using clock = std::chrono::steady_clock;
    int failures = 0;
    auto report = [&](bool ok, const std::string& what, clock::time_point t0) {
        const double ms = std::chrono::duration<double, std::milli>(clock::now() - t0).count();
        std::printf("selftest: %s  %s (%.0f ms)\n", ok ? "ok  " : "FAIL", what.c_str(), ms);
        failures += !ok;
    };
    auto line = [](const char* what, size_t i) { return std::string(what) + " " + std::to_string(i) + " tokens"; };
    const size_t n = kMaxAlignLines;
    {
        const auto t0 = clock::now();
        std::vector<Pattern> E;
        std::vector<std::string> A;
        for (size_t i = 0; i < n; ++i) {
            E.push_back(compile(line("step", i)));
            A.push_back(line("step", i == n / 2 ? i + 1 : i));
        }
        int cost = 0;
        bool greedy = true;
        const std::vector<Step> steps = align(E, A, &cost, &greedy);
        size_t changed = 0;
        for (const Step& s : steps) changed += s.op != Step::kMatch;
        report(cost == 1 && changed == 1 && !greedy,
               std::to_string(n) + " lines with one count changed in the middle: DRIFT, one changed line", t0);
    }
    {
        const auto t0 = clock::now();
        std::vector<Pattern> E;
        std::vector<std::string> A;
        for (size_t i = 0; i < n / 2; ++i) E.push_back(compile(line("head", i)));
        E.push_back(compile("..."));
        for (size_t i = 0; i < n / 2; ++i) E.push_back(compile(line("tail", i)));
        for (size_t i = 0; i < n / 2; ++i) A.push_back(line("head", i));
        for (size_t i = 0; i < n / 4; ++i) A.push_back(line("cut", i));
        for (size_t i = 0; i < n / 2; ++i) A.push_back(line("tail", i));
        int cost = -1;
        align(E, A, &cost);
        report(cost == 0, std::to_string(E.size()) + " page lines with a \"...\" in the middle over " + std::to_string(A.size()) +
                              " printed: OK", t0);
    }
    {
        const auto t0 = clock::now();
        std::vector<Pattern> E;
        std::vector<std::string> A;
        for (size_t i = 0; i < n; ++i) {
            E.push_back(compile(line("page", i)));
            A.push_back("printed " + std::to_string(i));
        }
        int cost = 0;
        bool greedy = false;
        align(E, A, &cost, &greedy);
        report(cost > 0 && greedy, std::to_string(n) + " lines against " + std::to_string(n) + " others: DRIFT, aligned greedily", t0);
    }
    {
        const auto t0 = clock::now();
        std::string page = "```\n$ seq 60000\n";
        for (int i = 1; i <= 60000; ++i) page += std::to_string(i) + "\n";
        page += "```\n";
        std::string why;
        try {
            parse_document("made-up.md", page, ".");
        } catch (const DocError& e) {
            why = e.what();
        }
        report(why.find("more than the") != std::string::npos, "a 60000-line output block on a page: refused as malformed", t0);
    }
    return failures;
}

int selftest(const Options& o) {
    if (o.files.size() != 1) usage_error("--selftest takes exactly one document");
    if (selftest_alignment() != 0) {
        std::printf("selftest: FAILED: the comparison's bounds\n");
        return 1;
    }
    const std::string path = o.files.front();
    const std::string dir = run_dir_of(path);
    const Document d = load_document(path, dir);
    // The first listing that can run here and prints a count.
    for (size_t li = 0; li < d.listings.size(); ++li) {
        const Listing& l = d.listings[li];
        if (!picked(l, o) || !l.skip_reason.empty() || !unmet_need(l, dir).empty()) continue;
        for (const Command& c : l.commands) {
            for (size_t k = c.out_begin; k < c.out_end; ++k) {
                const std::string& line = d.lines[k];
                if (trim(line) == "...") continue;
                const auto [at, len] = first_count(line);
                if (at == std::string::npos) continue;

                std::printf("selftest: the listing at %s, as the page shows it:\n", where(d, l.commands.front().line).c_str());
                const std::string before = check_listing(d, l, o, nullptr);
                if (before != "OK") {
                    std::printf("selftest: FAILED: that listing must be OK before the test changes it (it is %s)\n", before.c_str());
                    return 1;
                }
                const long value = std::strtol(line.substr(at, len).c_str(), nullptr, 10);
                const std::string changed = line.substr(0, at) + std::to_string(value + 1) + line.substr(at + len);
                std::vector<std::string> lines = d.lines;
                lines[k] = changed;
                std::string text;
                for (const std::string& s : lines) text += s + "\n";
                const std::string copy =
                    (fs::temp_directory_path() / ("check_docs_selftest_" + std::to_string(getpid()) + ".md")).string();
                write_file(copy, text);
                std::printf("selftest: a copy of the page (a temporary file) with line %zu's count %ld changed to %ld:\n       %s\n",
                            k + 1, value, value + 1, trim(changed).c_str());
                // Named "copy-of-NAME" in messages: the temporary path changes every run.
                const Document dc = parse_document("copy-of-" + fs::path(path).filename().string(), text, dir);
                const std::string after = check_listing(dc, dc.listings[li], o, nullptr);
                std::error_code ec;
                fs::remove(copy, ec);
                if (after != "DRIFT") {
                    std::printf("selftest: FAILED: the changed count went unnoticed (%s)\n", after.c_str());
                    return 1;
                }
                std::printf("selftest: passed: the listing is OK as written and DRIFT with one count changed\n");
                return 0;
            }
        }
    }
    std::printf("selftest: FAILED: %s has no runnable listing with a count to change%s\n", path.c_str(),
                o.only.empty() ? "" : " among those --only picks");
    return 1;
}

// ---------------------------------------------------------------------------
// The command line
// ---------------------------------------------------------------------------

void print_help() {
    std::printf(
        "usage: check_docs [--update [--refresh]] [--only TEXT] [--timeout S] [--list] FILE.md...\n"
        "       check_docs --selftest [--only TEXT] FILE.md\n"
        "\n"
        "Runs every listing of the Markdown files that shows a command (a line starting\n"
        "with \"$ \") with its output, in one bash per listing started in the file's\n"
        "project root (the nearest folder at or above the file's that holds a Makefile),\n"
        "and compares what it prints with what the page shows. In the page, \"~\"\n"
        "before a number marks it as varying (a timing: any number matches), and a line\n"
        "that is only \"...\" stands for any number of lines. An HTML comment right above\n"
        "a listing tunes it: <!-- check-docs: skip -- REASON -->, <!-- check-docs: needs\n"
        "gdb -->, <!-- check-docs: timeout 300 -->. tools/check_docs.cpp explains more.\n"
        "\n"
        "  --update      rewrite each drifted command's output in the page with what it\n"
        "                printed, keeping the ~ marks and ... lines where they still fit\n"
        "  --refresh     with --update: also give listings that match new ~ numbers (fresh\n"
        "                timings, say from a quiet machine)\n"
        "  --only TEXT   only the listings with a command that contains TEXT\n"
        "  --timeout S   seconds a listing may run, in 1..86400 (default %d); a listing's\n"
        "                own timeout directive wins\n"
        "  --list        list the listings and their directives; run nothing\n"
        "  --selftest    check the first runnable listing with a count as written (OK),\n"
        "                then a copy with that count increased by one (must be DRIFT)\n"
        "  --help        this text\n"
        "\n"
        "Exit status: 0 nothing drifted (selftest: passed), 1 drift (selftest: failed),\n"
        "2 a bad command line, an unreadable file or a malformed listing.\n",
        kDefaultTimeoutS);
}

Options parse_args(int argc, char** argv) {
    Options o;
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        auto value = [&](const char* flag) -> std::string {
            if (i + 1 >= argc) usage_error(std::string(flag) + " expects a value");
            return argv[++i];
        };
        if (a == "--help" || a == "-h") {
            print_help();
            std::exit(0);
        } else if (a == "--update") {
            o.update = true;
        } else if (a == "--refresh") {
            o.refresh = true;
        } else if (a == "--selftest") {
            o.selftest = true;
        } else if (a == "--list") {
            o.list = true;
        } else if (a == "--only") {
            o.only = value("--only");
            if (o.only.empty()) usage_error("--only expects a non-empty text");
        } else if (a == "--timeout") {
            const std::string v = value("--timeout");
            char* end = nullptr;
            errno = 0;
            const long s = std::strtol(v.c_str(), &end, 10);
            if (v.empty() || *end != '\0' || errno != 0 || s < 1 || s > 86400)
                usage_error("--timeout expects whole seconds in 1..86400, got '" + v + "'");
            o.timeout_s = (int)s;
        } else if (starts_with(a, "-") && a != "-") {
            usage_error("unknown option '" + a + "'");
        } else {
            o.files.push_back(a);
        }
    }
    if (o.files.empty()) usage_error("name at least one Markdown file (make check-docs: TUTORIAL.md lab/LAB.md README.md)");
    if ((int)o.update + (int)o.selftest + (int)o.list > 1) usage_error("--update, --selftest and --list do not go together");
    if (o.refresh && !o.update) usage_error("--refresh goes with --update");
    for (const std::string& f : o.files) {
        std::error_code ec;
        if (!fs::is_regular_file(f, ec)) usage_error("'" + f + "' is not a file");
    }
    return o;
}

}  // namespace

int main(int argc, char** argv) {
    // One line per listing as it finishes, in a CI log too (where stdout is a
    // pipe and would otherwise be written in blocks, at the end).
    std::setvbuf(stdout, nullptr, _IOLBF, 0);
    const Options o = parse_args(argc, argv);
    try {
        return o.selftest ? selftest(o) : check_files(o);
    } catch (const DocError& e) {
        std::fprintf(stderr, "check_docs: %s\n", e.what());
        return 2;
    } catch (const std::exception& e) {
        std::fprintf(stderr, "check_docs: %s\n", e.what());
        return 2;
    }
}

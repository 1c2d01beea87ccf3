// examples/cli.hpp -- the one command-line parser every program uses.
//
// Each program declares its flags once, with the variable each one sets, its
// explicit range (numbers) or choices (names), and a line of help:
//
//   cli::Parser p("overload", "[checkpoint.bin -z tokenizer.bin] [options]", "Many requests on a small KV cache.");
//   p.integer("--num-blocks", &o.num_blocks, 1, 1 << 20, "KV cache blocks");
//   p.real("--temperature", &o.temperature, 0, 100, "0 = greedy");
//   p.choice("--admission", &o.admission, {{"bet", kBet}, {"reserve", kReserve}}, "what admission bets on");
//   p.parse(argc, argv);
//
// and gets, from that one declaration: --help text that states every range
// and every default (read from the variable before parsing), strict parsing
// ("12x", " 12", "1e3" for an integer, "nan" and "inf" for a number are
// errors, never a silent 12 or a silent NaN), range checks done in 64 bits
// before anything is narrowed to an int (so 4294967297 is an error, not 1),
// and one uniform error: "overload: --num-blocks expects an integer in
// 1..1048576, got '4294967297'", exit status 2.
//
// guarded_main() is the other half of "bad input gets a clear error": every
// program's main runs inside it, so a file that cannot be read, a
// configuration the engine refuses, or memory that runs out becomes one line
// on stderr and exit status 1, never an abort with a core dump.
#pragma once

#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <functional>
#include <limits>
#include <new>
#include <string>
#include <utility>
#include <vector>

namespace cli {

// The program name for messages (set by Parser and guarded_main).
inline const char* program = "pagedkv";

// Exit status 2 with "program: msg" and a pointer to --help: the command line
// itself was wrong. For checks that involve several flags at once.
[[noreturn]] inline void bad_usage(const std::string& msg) {
    std::fprintf(stderr, "%s: %s\nRun '%s --help' for the options and their ranges.\n", program, msg.c_str(), program);
    std::exit(2);
}

// ---- the text -> number conversions, strict ---------------------------------

// An integer in [lo, hi], or an error message. Only an optional sign and
// decimal digits: no leading space, no trailing junk, no "1e3".
inline bool to_integer(const char* s, long long lo, long long hi, long long& out) {
    if (!s || !*s || !(s[0] == '-' || s[0] == '+' || (s[0] >= '0' && s[0] <= '9'))) return false;
    errno = 0;
    char* end = nullptr;
    const long long v = std::strtoll(s, &end, 10);
    if (errno == ERANGE || end == s || *end != '\0' || v < lo || v > hi) return false;
    out = v;
    return true;
}
// A finite decimal number in [lo, hi]: NaN, infinities, overflow and hex
// ("0x10", which strtod would read as 16) are refused. An underflow ("4e-320")
// is not an overflow: strtod flags it with ERANGE too, but its value is the
// nearest representable one, and the range decides.
inline bool to_real(const char* s, double lo, double hi, double& out) {
    if (!s || !*s) return false;
    for (const char* c = s; *c; ++c)
        if (!((*c >= '0' && *c <= '9') || *c == '.' || *c == '-' || *c == '+' || *c == 'e' || *c == 'E')) return false;
    errno = 0;
    char* end = nullptr;
    const double v = std::strtod(s, &end);
    if (end == s || *end != '\0' || !std::isfinite(v) || v < lo || v > hi) return false;
    out = v;
    return true;
}

inline std::string range_text(long long lo, long long hi) { return std::to_string(lo) + ".." + std::to_string(hi); }
inline std::string number_text(double v) {
    char b[40];
    if (v == std::floor(v) && std::fabs(v) < 1e15) std::snprintf(b, sizeof b, "%.0f", v);
    else std::snprintf(b, sizeof b, "%g", v);
    return b;
}

// ---- the parser ------------------------------------------------------------------

class Parser {
public:
    Parser(const char* prog, std::string synopsis, std::string description)
        : prog_(prog), synopsis_(std::move(synopsis)), description_(std::move(description)) {
        program = prog;
    }

    // An integer flag of any integral type, in [lo, hi].
    template <class T>
    void integer(const std::string& name, T* dst, long long lo, long long hi, const std::string& help, const char* metavar = "N") {
        const std::string range = range_text(lo, hi);
        add(name, metavar, help + " (" + range + ", default " + std::to_string(*dst) + ")", [=](const char* v) {
            long long x;
            if (!to_integer(v, lo, hi, x)) return name + " expects an integer in " + range + ", got '" + v + "'";
            *dst = (T)x;
            return std::string();
        });
    }
    // A finite real number in [lo, hi].
    template <class T>
    void real(const std::string& name, T* dst, double lo, double hi, const std::string& help, const char* metavar = "X") {
        const std::string range = number_text(lo) + ".." + number_text(hi);
        add(name, metavar, help + " (" + range + ", default " + number_text((double)*dst) + ")", [=](const char* v) {
            double x;
            if (!to_real(v, lo, hi, x)) return name + " expects a finite number in " + range + ", got '" + v + "'";
            *dst = (T)x;
            return std::string();
        });
    }
    // One of a few names, each standing for a value.
    template <class T>
    void choice(const std::string& name, T* dst, std::vector<std::pair<std::string, T>> options, const std::string& help) {
        std::string names, current;
        for (const auto& [n, v] : options) {
            names += (names.empty() ? "" : "|") + n;
            if (v == *dst) current = n;
        }
        add(name, names, help + (current.empty() ? std::string() : " (default " + current + ")"), [=](const char* v) {
            for (const auto& [n, val] : options)
                if (n == v) {
                    *dst = val;
                    return std::string();
                }
            return name + " expects one of " + names + ", got '" + v + "'";
        });
    }
    void on_off(const std::string& name, bool* dst, const std::string& help) {
        choice<bool>(name, dst, {{"on", true}, {"off", false}}, help);
    }
    // Free text (a path, a prompt). `nonempty`: "" is an error.
    void text(const std::string& name, std::string* dst, const char* metavar, const std::string& help, bool nonempty = true) {
        add(name, metavar, help + (dst->empty() ? std::string() : " (default " + *dst + ")"), [=](const char* v) {
            if (nonempty && !*v) return name + " needs a non-empty value";
            *dst = v;
            return std::string();
        });
    }
    // A comma-separated list of integers, each in [lo, hi], at most max_items.
    void int_list(const std::string& name, std::vector<int>* dst, int lo, int hi, size_t max_items, const std::string& help) {
        std::string def;
        for (int x : *dst) def += (def.empty() ? "" : ",") + std::to_string(x);
        const std::string range = range_text(lo, hi);
        add(name, "LIST", help + " (comma-separated, each " + range + ", at most " + std::to_string(max_items) + "; default " + def + ")",
            [=](const char* v) {
                std::vector<int> out;
                const std::string s = v;
                size_t start = 0;
                while (true) {
                    const size_t comma = s.find(',', start);
                    const std::string item = s.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
                    long long x;
                    if (!to_integer(item.c_str(), lo, hi, x))
                        return name + " expects comma-separated integers in " + range + ", got '" + s + "'";
                    out.push_back((int)x);
                    if (out.size() > max_items) return name + " takes at most " + std::to_string(max_items) + " entries";
                    if (comma == std::string::npos) break;
                    start = comma + 1;
                }
                *dst = out;
                return std::string();
            });
    }
    // A flag without a value.
    void flag(const std::string& name, bool* dst, const std::string& help) {
        flags_.push_back({name, "", help, nullptr, dst});
    }
    // At most one positional argument (a checkpoint path).
    void positional(std::string* dst, const std::string& what) {
        positional_ = dst;
        positional_what_ = what;
    }
    // Text printed after the options (notes, examples).
    void epilog(std::string text) { epilog_ = std::move(text); }

    void usage(FILE* out) const {
        std::fprintf(out, "Usage: %s %s\n", prog_, synopsis_.c_str());
        if (!description_.empty()) std::fprintf(out, "%s\n", description_.c_str());
        std::fprintf(out, "Options:\n");
        for (const Flag& f : flags_) {
            const std::string head = f.name + (f.metavar.empty() ? "" : " " + f.metavar);
            std::fprintf(out, "  %-28s %s\n", head.c_str(), f.help.c_str());
        }
        std::fprintf(out, "  %-28s %s\n", "-h, --help", "this text");
        if (!epilog_.empty()) std::fprintf(out, "%s\n", epilog_.c_str());
    }

    // Parses argv or exits: 0 after --help, 2 with a message on any error.
    // Both "--flag value" and "--flag=value" are accepted.
    void parse(int argc, char** argv) {
        bool positional_seen = false;
        for (int i = 1; i < argc; ++i) {
            std::string a = argv[i];
            if (a == "--help" || a == "-h") {
                usage(stdout);
                std::exit(0);
            }
            if (a.empty() || a[0] != '-' || a == "-") {
                if (!positional_ || positional_seen)
                    bad_usage("unexpected argument '" + a + "'" + (positional_ ? " (only one " + positional_what_ + " may be given)" : ""));
                *positional_ = a;
                positional_seen = true;
                continue;
            }
            std::string value;
            bool has_inline_value = false;
            if (const size_t eq = a.find('='); eq != std::string::npos && a.rfind("--", 0) == 0) {
                value = a.substr(eq + 1);
                a = a.substr(0, eq);
                has_inline_value = true;
            }
            const Flag* f = find(a);
            if (!f) bad_usage("unknown option " + a);
            if (f->boolean) {
                if (has_inline_value) bad_usage(a + " takes no value");
                *f->boolean = true;
                continue;
            }
            if (!has_inline_value) {
                if (i + 1 >= argc) bad_usage("option " + a + " needs a value");
                value = argv[++i];
            }
            const std::string err = f->set(value.c_str());
            if (!err.empty()) bad_usage(err);
        }
    }

private:
    struct Flag {
        std::string name, metavar, help;
        std::function<std::string(const char*)> set;  // "" = accepted, else the error
        bool* boolean = nullptr;                      // a flag without a value
    };
    void add(const std::string& name, const std::string& metavar, const std::string& help, std::function<std::string(const char*)> set) {
        flags_.push_back({name, metavar, help, std::move(set), nullptr});
    }
    const Flag* find(const std::string& name) const {
        for (const Flag& f : flags_)
            if (f.name == name) return &f;
        return nullptr;
    }
    const char* prog_;
    std::string synopsis_, description_, epilog_;
    std::vector<Flag> flags_;
    std::string* positional_ = nullptr;
    std::string positional_what_;
};

// ---- the top of every program ------------------------------------------------------

// Runs body() and turns whatever escapes it into one line on stderr:
// running out of memory (bad_alloc: "needs more memory than this machine
// gives it"), and any other exception (a file, a configuration the engine
// refuses, a device that is missing) with its own message. Exit status 1.
inline int guarded_main(const char* prog, const std::function<int()>& body) {
    program = prog;
    try {
        return body();
    } catch (const std::bad_alloc&) {
        std::fprintf(stderr, "%s: out of memory: this configuration needs more memory than the machine gives it; "
                             "use fewer or smaller requests, blocks or swap space\n", prog);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "%s: %s\n", prog, e.what());
    }
    return 1;
}

}  // namespace cli

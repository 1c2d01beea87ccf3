// examples/cli.hpp -- the few command-line helpers every example shares:
// strict number parsing and a uniform "bad usage" exit.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <string>

namespace cli {

// Set by each program: its name and a function printing its usage text.
inline const char* program = "pagedkv";
inline void (*print_usage)(FILE*) = nullptr;

[[noreturn]] inline void bad_usage(const std::string& msg) {
    std::fprintf(stderr, "%s: %s\n", program, msg.c_str());
    if (print_usage) { std::fprintf(stderr, "\n"); print_usage(stderr); }
    std::exit(2);
}

// Strict: "12x" is an error, not 12.
inline long parse_int(const std::string& flag, const char* s) {
    char* end = nullptr;
    long v = std::strtol(s, &end, 10);
    if (end == s || *end != '\0') bad_usage(flag + " expects an integer, got '" + s + "'");
    return v;
}
inline double parse_float(const std::string& flag, const char* s) {
    char* end = nullptr;
    double v = std::strtod(s, &end);
    if (end == s || *end != '\0') bad_usage(flag + " expects a number, got '" + s + "'");
    return v;
}
inline bool parse_on_off(const std::string& flag, const std::string& s) {
    if (s == "on") return true;
    if (s == "off") return false;
    bad_usage(flag + " expects on or off, got '" + s + "'");
}

}  // namespace cli

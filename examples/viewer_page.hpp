// examples/viewer_page.hpp -- the viewer's page: its files (examples/viewer/)
// with a run's data inlined, as one HTML file. build/overload writes it with a
// recorded run (--view); build/serve answers it at /view, in live mode.
//
// The files are built into the program that includes this header: the
// Makefile turns them into C++ constants at build time (examples/viewer/
// embed.sh writes build/gen/viewer_assets.hpp), so a program looks up no file
// when it runs. A program compiled without the Makefile (the course kit
// compiles overload by hand) has no page: embedded_page() then says so, and
// everything else works.
#pragma once

#include <algorithm>
#include <fstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace viewer {

// ============================================================================
// 1. The page: the viewer's files with a run inlined
// ============================================================================
//
// The viewer is three files in examples/viewer/ (HTML, CSS, JavaScript),
// embedded into the program at build time (section 2). page() puts them and a
// run's data into one HTML file that opens offline, from disk, in any current
// browser. The HTML names three places, each exactly once: the style, the
// script, the data.

struct PageAssets {
    std::string_view html, css, js;
};

inline constexpr std::string_view kStyleMark = "/*@STYLE@*/", kScriptMark = "/*@SCRIPT@*/", kDataMark = "/*@DATA@*/";

// JSON that can sit inside <script>...</script>: a "</script>" or "<!--" in
// a token's text would end or bend the element early. '<', '>' and '&' occur
// only inside JSON strings, where \u003c, \u003e and \u0026 mean the same
// characters to JSON.parse.
inline std::string script_safe(std::string_view json) {
    std::string o;
    o.reserve(json.size());
    for (char c : json) {
        if (c == '<') o += "\\u003c";
        else if (c == '>') o += "\\u003e";
        else if (c == '&') o += "\\u0026";
        else o += c;
    }
    return o;
}

// The page draws every block: a pool larger than this would make a page too
// large to be read (build/overload refuses --view for it; --trace has no limit).
inline constexpr int kMaxPageBlocks = 4096;

// Writes `text` to `path`, or throws saying why not.
inline void write_file(const std::string& path, const std::string& text) {
    std::ofstream f(path, std::ios::binary);
    if (f) f << text;
    if (!f) throw std::runtime_error("cannot write " + path);
}

inline std::string page(const PageAssets& a, std::string_view data_json) {
    auto once = [&](std::string_view mark) {
        const size_t at = a.html.find(mark);
        if (at == std::string_view::npos || a.html.find(mark, at + 1) != std::string_view::npos)
            throw std::logic_error("viewer page: the HTML must name " + std::string(mark) + " exactly once");
        return at;
    };
    if (a.css.find("</style") != std::string_view::npos || a.js.find("</script") != std::string_view::npos)
        throw std::logic_error("viewer page: the CSS holds </style or the script </script, which would end its element early");
    // The marks in the template's order; each is replaced by its content.
    std::vector<std::pair<size_t, std::pair<std::string_view, std::string>>> parts = {
        {once(kStyleMark), {kStyleMark, std::string(a.css)}},
        {once(kScriptMark), {kScriptMark, std::string(a.js)}},
        {once(kDataMark), {kDataMark, script_safe(data_json)}}};
    std::sort(parts.begin(), parts.end(), [](const auto& x, const auto& y) { return x.first < y.first; });
    std::string out;
    size_t from = 0;
    for (const auto& [at, mark_and_content] : parts) {
        out.append(a.html.substr(from, at - from));
        out += mark_and_content.second;
        from = at + mark_and_content.first.size();
    }
    out.append(a.html.substr(from));
    return out;
}

}  // namespace viewer

// ============================================================================
// 2. The files, as this build embedded them
// ============================================================================

#if __has_include("build/gen/viewer_assets.hpp")
#include "build/gen/viewer_assets.hpp"
namespace viewer {
inline PageAssets embedded_page() { return {assets::viewer_html, assets::viewer_css, assets::viewer_js}; }
}  // namespace viewer
#else
namespace viewer {
inline PageAssets embedded_page() {
    throw std::runtime_error("this program was compiled without the viewer's page: build it with make, which embeds examples/viewer/ "
                             "(build/gen/viewer_assets.hpp)");
}
}  // namespace viewer
#endif

// examples/svg.hpp -- a tiny SVG chart writer for the studies: line charts and
// bar charts, with axes, ticks, tick labels, axis labels, a title and a
// legend, several series per chart and several charts per figure. No
// dependencies: an SVG file is text, and any browser shows it.
//
//   svg::Chart c;
//   c.title = "throughput"; c.x_label = "max_num_seqs"; c.y_label = "tok/s";
//   c.series.push_back({"useful", {1, 2, 4}, {10, 18, 30}});
//   svg::Figure fig;
//   fig.add(c);
//   std::string err;
//   if (!fig.write("build/x.svg", &err)) ...
//
// A figure stacks its charts top to bottom, each across the full width.
// Coordinates are plain pixels; the y axis grows downwards in SVG, which
// map_y() turns around.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <system_error>
#include <vector>

namespace svg {

// ---- text and numbers ---------------------------------------------------------

// XML needs &, < and > escaped in text, and " in attribute values.
inline std::string escape(const std::string& s) {
    std::string o;
    for (char c : s) {
        if (c == '&') o += "&amp;";
        else if (c == '<') o += "&lt;";
        else if (c == '>') o += "&gt;";
        else if (c == '"') o += "&quot;";
        else o += c;
    }
    return o;
}

// A pixel coordinate: one decimal is plenty.
inline std::string px(double v) {
    char b[32];
    std::snprintf(b, sizeof b, "%.1f", v);
    return b;
}

// A number as a reader wants it on an axis or above a bar: at most 4
// significant digits, no exponent below a million, "-0" never.
inline std::string label(double v) {
    if (std::fabs(v) < 1e-12) return "0";
    char b[32];
    if (std::fabs(v) >= 1e6) std::snprintf(b, sizeof b, "%.3g", v);
    else if (std::fabs(v) >= 1000) std::snprintf(b, sizeof b, "%.0f", v);
    else std::snprintf(b, sizeof b, "%.4g", v);
    return b;
}

// Tick positions covering [lo, hi] at a "nice" step (1, 2 or 5 times a power
// of ten), about `target` of them. The first and last tick enclose the data,
// so they also serve as the axis range.
inline std::vector<double> nice_ticks(double lo, double hi, int target = 5) {
    if (!(hi > lo)) hi = lo + (lo == 0 ? 1.0 : std::fabs(lo) * 0.5);
    const double raw = (hi - lo) / target;
    const double mag = std::pow(10.0, std::floor(std::log10(raw)));
    const double r = raw / mag;
    const double step = (r < 1.5 ? 1.0 : r < 3.0 ? 2.0 : r < 7.0 ? 5.0 : 10.0) * mag;
    std::vector<double> t;
    const double first = std::floor(lo / step + 1e-9) * step;
    for (int i = 0;; ++i) {
        double v = first + i * step;
        if (std::fabs(v) < step * 1e-9) v = 0.0;
        t.push_back(v);
        if (v >= hi - step * 1e-9) break;
    }
    return t;
}

// Colour i of a palette that stays distinguishable in print and for most
// colour-blind readers (the first few are blue, orange, green, red).
inline const char* color(size_t i) {
    static const char* const kPalette[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728",
                                           "#9467bd", "#8c564b", "#e377c2", "#7f7f7f"};
    return kPalette[i % (sizeof kPalette / sizeof kPalette[0])];
}

// ---- what a chart shows ----------------------------------------------------------

struct Series {
    std::string name;       // legend entry
    std::vector<double> x;  // line charts: x of each point (bar charts: unused)
    std::vector<double> y;  // line charts: y of each point; bar charts: one value per category
    bool dashed = false;
    bool markers = true;    // a dot on every point (line charts)
    bool steps = false;     // draw a staircase: y holds until the next x (a count that jumps)
};

struct Chart {
    enum class Kind { kLine, kBar };
    Kind kind = Kind::kLine;
    std::string title, x_label, y_label;
    std::vector<Series> series;
    // Bar charts: one group of bars per category, one bar per series in each
    // group. A '\n' in a category breaks its label into lines.
    std::vector<std::string> categories;
    // Line charts: a log2 x axis (for sweeps over 1, 2, 4, 8, ...), and
    // explicit x ticks (empty: nice ticks chosen automatically).
    bool log2_x = false;
    std::vector<double> x_ticks;
    bool bar_values = true;  // bar charts: print each bar's value above it
    int height = 320;        // pixels, title and axis labels included
};

// ---- drawing -----------------------------------------------------------------------

class Figure {
public:
    explicit Figure(int width = 860) : width_(width) {}

    void add(const Chart& c) { charts_.push_back(c); }

    std::string str() const {
        int total_h = 0;
        for (const Chart& c : charts_) total_h += c.height;
        std::string o = "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" + std::to_string(width_) + "\" height=\"" +
                        std::to_string(total_h) + "\" viewBox=\"0 0 " + std::to_string(width_) + " " + std::to_string(total_h) +
                        "\" font-family=\"DejaVu Sans, Helvetica, Arial, sans-serif\" font-size=\"12\">\n";
        o += "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
        // One legend width for the whole figure, so that stacked charts share
        // their plot area's left and right edges and can be read against each other.
        size_t longest_name = 0;
        for (const Chart& c : charts_)
            for (const Series& s : c.series) longest_name = std::max(longest_name, s.name.size());
        const double legend_w = longest_name == 0 ? 10 : 44 + kCharW * (double)longest_name;
        int y0 = 0;
        for (const Chart& c : charts_) {
            o += draw(c, y0, legend_w);
            y0 += c.height;
        }
        return o + "</svg>\n";
    }

    // Writes the figure, creating the directory if needed. On failure returns
    // false and says why in *err.
    bool write(const std::string& path, std::string* err) const {
        const std::filesystem::path p(path);
        if (p.has_parent_path()) {
            std::error_code ec;
            std::filesystem::create_directories(p.parent_path(), ec);
            if (ec) {
                if (err) *err = "cannot create directory " + p.parent_path().string() + ": " + ec.message();
                return false;
            }
        }
        std::ofstream f(path, std::ios::binary);
        if (f) f << str();
        if (!f) {
            if (err) *err = "cannot write " + path;
            return false;
        }
        return true;
    }

private:
    static constexpr double kCharW = 7.0;  // average glyph width at 12 px, for layout estimates

    static std::string text(double x, double y, const std::string& s, const char* anchor = "middle",
                            const std::string& extra = "") {
        return "<text x=\"" + px(x) + "\" y=\"" + px(y) + "\" text-anchor=\"" + anchor + "\"" +
               (extra.empty() ? "" : " " + extra) + ">" + escape(s) + "</text>\n";
    }
    static std::string line(double x1, double y1, double x2, double y2, const std::string& style) {
        return "<line x1=\"" + px(x1) + "\" y1=\"" + px(y1) + "\" x2=\"" + px(x2) + "\" y2=\"" + px(y2) + "\" " + style + "/>\n";
    }
    static std::vector<std::string> split_lines(const std::string& s) {
        std::vector<std::string> v(1);
        for (char c : s) {
            if (c == '\n') v.emplace_back();
            else v.back() += c;
        }
        return v;
    }

    std::string draw(const Chart& c, int top, double legend_w) const {
        const bool bar = c.kind == Chart::Kind::kBar;
        std::string o = "<g>\n";

        // Layout: title on top, legend on the right, y label and tick labels
        // on the left, tick labels and the x label (or category labels) below.
        size_t cat_lines = 1;
        for (const std::string& k : c.categories) cat_lines = std::max(cat_lines, split_lines(k).size());
        const double left = 78, right = width_ - legend_w - 10;
        const double plot_top = top + 34;
        const double bottom_room = bar ? 18 + 14.0 * (double)cat_lines + (c.x_label.empty() ? 4 : 20) : 52;
        const double plot_bottom = top + c.height - bottom_room;
        if (right - left < 50 || plot_bottom - plot_top < 40) return o + "</g>\n";  // too small to draw anything honest

        // Centred over the plot, but kept inside the figure when it is wider.
        const double title_w = 9.0 * (double)c.title.size();  // bold 14 px, generously
        const double title_x = std::clamp((left + right) / 2, std::min(width_ / 2.0, 5 + title_w / 2),
                                          std::max(width_ / 2.0, width_ - 5 - title_w / 2));
        o += text(title_x, top + 20, c.title, "middle", "font-size=\"14\" font-weight=\"bold\"");

        // y range from the data; 0 is always on the axis (these are counts and
        // rates, and a bar must start at 0 to be read as a length).
        double ylo = 0, yhi = 0;
        bool any = false;
        for (const Series& s : c.series)
            for (double v : s.y)
                if (std::isfinite(v)) {
                    ylo = std::min(ylo, v);
                    yhi = std::max(yhi, v);
                    any = true;
                }
        if (!any) yhi = 1;
        const std::vector<double> yt = nice_ticks(ylo, yhi * (bar && c.bar_values ? 1.08 : 1.0));
        const double y_min = yt.front(), y_max = yt.back();
        auto map_y = [&](double v) { return plot_bottom - (v - y_min) / (y_max - y_min) * (plot_bottom - plot_top); };

        // Grid, y ticks and labels.
        for (double v : yt) {
            const double y = map_y(v);
            o += line(left, y, right, y, "stroke=\"#e4e4e4\"");
            o += line(left - 5, y, left, y, "stroke=\"black\"");
            o += text(left - 8, y + 4, label(v), "end");
        }
        o += "<text transform=\"translate(" + px(left - 58) + "," + px((plot_top + plot_bottom) / 2) +
             ") rotate(-90)\" text-anchor=\"middle\">" + escape(c.y_label) + "</text>\n";

        if (bar) o += draw_bars(c, left, right, plot_bottom, map_y);
        else o += draw_lines(c, left, right, plot_top, plot_bottom, map_y);

        // Axes on top of the grid.
        o += line(left, plot_top, left, plot_bottom, "stroke=\"black\"");
        o += line(left, map_y(std::clamp(0.0, y_min, y_max)), right, map_y(std::clamp(0.0, y_min, y_max)), "stroke=\"black\"");
        if (!c.x_label.empty()) o += text((left + right) / 2, top + c.height - 8, c.x_label);

        // Legend, to the right of the plot, so it never hides data.
        double ly = plot_top + 8;
        for (size_t i = 0; i < c.series.size(); ++i, ly += 20) {
            const Series& s = c.series[i];
            const double lx = right + 14;
            if (bar) {
                o += "<rect x=\"" + px(lx) + "\" y=\"" + px(ly - 6) + "\" width=\"22\" height=\"12\" fill=\"" + color(i) + "\"/>\n";
            } else {
                o += line(lx, ly, lx + 22, ly,
                          std::string("stroke=\"") + color(i) + "\" stroke-width=\"2\"" + (s.dashed ? " stroke-dasharray=\"6,3\"" : ""));
                if (s.markers) o += "<circle cx=\"" + px(lx + 11) + "\" cy=\"" + px(ly) + "\" r=\"3\" fill=\"" + color(i) + "\"/>\n";
            }
            o += text(lx + 28, ly + 4, s.name, "start");
        }
        return o + "</g>\n";
    }

    template <class MapY>
    std::string draw_lines(const Chart& c, double left, double right, double plot_top, double plot_bottom, MapY map_y) const {
        std::string o;
        auto tx = [&](double x) { return c.log2_x ? std::log2(x) : x; };  // x in axis units
        double xlo = 0, xhi = 1;
        bool any = false;
        for (const Series& s : c.series)
            for (double x : s.x)
                if (std::isfinite(x) && (!c.log2_x || x > 0)) {
                    xlo = any ? std::min(xlo, tx(x)) : tx(x);
                    xhi = any ? std::max(xhi, tx(x)) : tx(x);
                    any = true;
                }
        std::vector<double> xt;  // ticks in data units
        if (!c.x_ticks.empty()) {
            xt = c.x_ticks;
        } else if (c.log2_x) {
            for (double e = std::floor(xlo); e <= std::ceil(xhi) + 1e-9; e += 1) xt.push_back(std::pow(2.0, e));
        } else {
            xt = nice_ticks(xlo, xhi, 6);
        }
        for (double v : xt)
            if (!c.log2_x || v > 0) {
                xlo = std::min(xlo, tx(v));
                xhi = std::max(xhi, tx(v));
            }
        if (!(xhi > xlo)) xhi = xlo + 1;
        // A little air at both ends so markers on the first and last x are whole.
        const double pad = 0.03 * (xhi - xlo);
        auto map_x = [&](double x) { return left + (tx(x) - (xlo - pad)) / (xhi - xlo + 2 * pad) * (right - left); };

        for (double v : xt) {
            if (c.log2_x && v <= 0) continue;
            const double x = map_x(v);
            o += line(x, plot_top, x, plot_bottom, "stroke=\"#f0f0f0\"");
            o += line(x, plot_bottom, x, plot_bottom + 5, "stroke=\"black\"");
            o += text(x, plot_bottom + 18, label(v));
        }
        for (size_t i = 0; i < c.series.size(); ++i) {
            const Series& s = c.series[i];
            std::string pts;
            const size_t n = std::min(s.x.size(), s.y.size());
            bool have_prev = false;
            double prev_y = 0;
            for (size_t k = 0; k < n; ++k) {
                if (!std::isfinite(s.x[k]) || !std::isfinite(s.y[k]) || (c.log2_x && s.x[k] <= 0)) continue;
                const double X = map_x(s.x[k]), Y = map_y(s.y[k]);
                if (s.steps && have_prev) pts += px(X) + "," + px(prev_y) + " ";
                pts += px(X) + "," + px(Y) + " ";
                have_prev = true;
                prev_y = Y;
            }
            o += std::string("<polyline fill=\"none\" stroke=\"") + color(i) + "\" stroke-width=\"2\"" +
                 (s.dashed ? " stroke-dasharray=\"6,3\"" : "") + " points=\"" + pts + "\"/>\n";
            if (s.markers)
                for (size_t k = 0; k < n; ++k) {
                    if (!std::isfinite(s.x[k]) || !std::isfinite(s.y[k]) || (c.log2_x && s.x[k] <= 0)) continue;
                    o += "<circle cx=\"" + px(map_x(s.x[k])) + "\" cy=\"" + px(map_y(s.y[k])) + "\" r=\"3\" fill=\"" + color(i) + "\"/>\n";
                }
        }
        return o;
    }

    template <class MapY>
    std::string draw_bars(const Chart& c, double left, double right, double plot_bottom, MapY map_y) const {
        std::string o;
        const size_t n = std::max<size_t>(1, c.categories.size());
        const size_t m = std::max<size_t>(1, c.series.size());
        const double group_w = (right - left) / (double)n;
        const double bar_w = group_w * 0.78 / (double)m;
        for (size_t k = 0; k < c.categories.size(); ++k) {
            const double gx = left + group_w * (double)k;
            const std::vector<std::string> lines = split_lines(c.categories[k]);
            for (size_t l = 0; l < lines.size(); ++l) o += text(gx + group_w / 2, plot_bottom + 16 + 14.0 * (double)l, lines[l]);
            bool any = false;
            for (const Series& s : c.series) any = any || (k < s.y.size() && std::isfinite(s.y[k]));
            if (!any) o += text(gx + group_w / 2, plot_bottom - 8, "no data", "middle", "fill=\"#888888\" font-style=\"italic\"");
            for (size_t i = 0; i < c.series.size(); ++i) {
                if (k >= c.series[i].y.size() || !std::isfinite(c.series[i].y[k])) continue;
                const double v = c.series[i].y[k];
                const double x = gx + group_w * 0.11 + bar_w * (double)i;
                const double y1 = map_y(std::max(0.0, v)), y2 = map_y(std::min(0.0, v));
                o += "<rect x=\"" + px(x) + "\" y=\"" + px(y1) + "\" width=\"" + px(bar_w - 2) + "\" height=\"" +
                     px(std::max(0.5, y2 - y1)) + "\" fill=\"" + color(i) + "\"/>\n";
                if (c.bar_values) o += text(x + (bar_w - 2) / 2, y1 - 4, label(v), "middle", "font-size=\"10\"");
            }
        }
        return o;
    }

    int width_;
    std::vector<Chart> charts_;
};

}  // namespace svg

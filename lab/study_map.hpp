// lab/study_map.hpp -- lab/LAB.md chapters L5 and L7: a claim as a map, not a
// point.
//
// A study's verdict is computed at one point: one GPU, one model, one
// length, one seed. Change one input and a verdict can flip -- the claims of
// chapter L7 do, on the simulated GPUs. So each study declares the inputs
// its claims depend on (its `map`: a few values per axis), and a map run
// (`build/study NAME --map`) runs the study at every combination, on the
// simulated GPU, and reports per claim: the verdict in every cell, how many
// cells it holds in, and where the boundary lies, in words.
//
// The axes an Env can be moved along (study_kit.hpp's Env):
//   gpu, model        presets (cost_model.hpp section 1)
//   scale             every prompt and output length x scale
//   load              the arrival rate, as a multiple of the measured
//                     capacity (studies whose requests arrive over time)
//   pcie_gbps         the host link's bandwidth
//   pcie_background   the share of the link other traffic takes
//   seed              the traffic's seed
//   traffic           synthetic (Poisson, lognormal lengths), or a replay of
//                     an Azure trace, conv or code (traffic.hpp section 2)
// A cell is lighter than a single run (Env::drains): its arrivals last
// kMapDrains drain times instead of 8, and a study may skip variants its
// verdicts do not read (lab/LAB.md chapter L5 lists what each cell runs).
// Cells are independent: they run on `jobs` threads, and the result does
// not depend on how many.
//
// A cell where a claim's premise did not occur (no preemption, no queue at
// the door, no runaway request) reads "not shown" for that claim: "holds in
// X of Y" counts only the cells where the premise occurred, and says how
// many were not shown. A cell that replays a trace whose file is absent
// fails with that message and counts nowhere.
//
// Only the simulated GPU is mapped. On this CPU a single run of a study takes
// seconds to minutes of real compute, so a grid would take hours: the CPU
// keeps its single-point verdicts.
//
// Sections: 1. axes and cells  2. running a map  3. the boundary in words
// 4. output: text, JSON, an SVG heat map.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "lab/studies.hpp"

namespace study {

// ============================================================================
// 1. Axes and cells
// ============================================================================

// One input of a map: its name, its values (as text), and how a value is
// set on an Env. `numeric`: the values are ordered numbers (the boundary
// can then be "above ~x").
struct Axis {
    std::string name;
    std::vector<std::string> values;
    bool numeric = false;
    std::function<void(Env&, const std::string&)> set;
};

inline double axis_number(const std::string& v) {
    size_t used = 0;
    const double x = std::stod(v, &used);
    if (used != v.size()) throw std::invalid_argument("map axis value '" + v + "' is not a number");
    return x;
}

inline Axis axis_gpu(std::vector<std::string> v) {
    return {"gpu", std::move(v), false, [](Env& e, const std::string& x) { e.gpu = x; }};
}
inline Axis axis_model(std::vector<std::string> v) {
    return {"model", std::move(v), false, [](Env& e, const std::string& x) { e.model = x; }};
}
inline Axis axis_scale(std::vector<std::string> v) {
    return {"scale", std::move(v), true, [](Env& e, const std::string& x) { e.scale = axis_number(x); }};
}
inline Axis axis_load(std::vector<std::string> v) {
    return {"load", std::move(v), true, [](Env& e, const std::string& x) { e.load = axis_number(x); }};
}
inline Axis axis_pcie_gbps(std::vector<std::string> v) {
    return {"pcie_gbps", std::move(v), true, [](Env& e, const std::string& x) { e.pcie_bw_override = axis_number(x) * 1e9; }};
}
inline Axis axis_pcie_background(std::vector<std::string> v) {
    return {"pcie_background", std::move(v), true, [](Env& e, const std::string& x) { e.pcie_background = axis_number(x); }};
}
inline Axis axis_seed(std::vector<std::string> v) {
    return {"seed", std::move(v), true, [](Env& e, const std::string& x) { e.seed = (uint64_t)axis_number(x); }};
}
inline Axis axis_traffic(std::vector<std::string> v) {
    return {"traffic", std::move(v), false, [](Env& e, const std::string& x) { e.traffic = x; }};
}

// The grid each study is mapped over: the inputs its claims turned out to
// depend on, two or three values each, 12 to 16 cells, every grid with cells
// replaying a trace. The load spans below and above the capacity where a
// claim's premise depends on it (0.5 or 1, and 2 or 3). Axes a study does
// not list keep the env's value (--gpu, --model, ... on the command line).
inline std::vector<Axis> map_of(const std::string& study) {
    const std::vector<std::string> gpus3 = {"h200", "h100", "a100-40g"};
    const std::vector<std::string> models = {"llama-3-8b", "llama-2-7b"};
    const std::vector<std::string> halves = {"0.5", "1"};
    const std::vector<std::string> conv = {"synthetic", "conv"};
    // thrash: C11/C13 moved with the GPU and the model (KV bytes per token);
    // below capacity the device idles and nothing may be preempted.
    if (study == "thrash") return {axis_gpu({"h200", "a100-40g"}), axis_model(models), axis_load({"0.5", "2"}), axis_traffic(conv)};
    // admission: C1 flipped on an H100 and at half length.
    if (study == "admission") return {axis_gpu(gpus3), axis_scale(halves), axis_traffic(conv)};
    // victim: C3 is a close call: length, and both traces.
    if (study == "victim") return {axis_gpu({"h200", "h100"}), axis_scale(halves), axis_traffic({"synthetic", "conv", "code"})};
    // preemption: C6 is the link (its load) and the KV bytes and context
    // (the model: only Llama-3.1-8B's context reaches L*).
    if (study == "preemption")
        return {axis_model({"llama-3.1-8b", "llama-3-8b", "llama-2-7b"}), axis_pcie_background({"0", "0.5"}), axis_traffic(conv)};
    // fixes and shedding: arrivals over time, at a load; GPU.
    if (study == "fixes" || study == "shedding") return {axis_gpu(gpus3), axis_load({"1", "3"}), axis_traffic(conv)};
    // signals: C7/C10 moved with the GPU and the model.
    if (study == "signals") return {axis_gpu(gpus3), axis_model(models), axis_traffic(conv)};
    // mechanisms: C2/C4 are mechanisms; the map checks they hold everywhere.
    if (study == "mechanisms") return {axis_gpu(gpus3), axis_scale(halves), axis_traffic({"synthetic", "code"})};
    // kv_dtype: C12's FP8 check moved with the GPU (pool size) and model.
    if (study == "kv_dtype") return {axis_gpu({"h200", "h100", "a100-40g", "l4"}), axis_model(models), axis_traffic(conv)};
    throw std::invalid_argument("no map for study '" + study + "'");
}

// One cell: its inputs (one value per axis, in the axes' order), and what
// the study concluded there.
struct Cell {
    std::vector<std::string> params;
    std::vector<ClaimVerdict> verdicts;
    Verdict overall = Verdict::kNotShown;
    std::string error;  // a cell that could not run (a model too big for its GPU, say): why
    double seconds = 0; // wall time of this cell
};

struct MapResult {
    std::string study;
    std::vector<std::string> claims;
    std::vector<Axis> axes;
    std::vector<Cell> cells;
    double seconds = 0;  // wall time of the whole map
    int jobs = 1;
};

// Every combination of the axes' values, the first axis varying slowest.
inline std::vector<std::vector<std::string>> grid_of(const std::vector<Axis>& axes) {
    std::vector<std::vector<std::string>> out(1);
    for (const Axis& a : axes) {
        if (a.values.empty()) throw std::invalid_argument("map axis " + a.name + " has no values");
        std::vector<std::vector<std::string>> next;
        for (const auto& partial : out)
            for (const std::string& v : a.values) {
                next.push_back(partial);
                next.back().push_back(v);
            }
        out.swap(next);
    }
    return out;
}

// ============================================================================
// 2. Running a map
// ============================================================================

// How long a map cell's arrivals last, in drain times (Env::drains; a
// single run: 8). Several, so that an overload builds and holds, and few,
// so that a map of 12 to 16 cells takes at most a minute or so on 2 cores.
constexpr double kMapDrains = 4.0;

// Runs `st` at every cell of `axes` on the simulated GPU of `base` (its other
// settings kept), on `jobs` threads. `progress`, if set, is told each cell
// as it ends (in the order they end).
inline MapResult run_map(const Study& st, const std::vector<Axis>& axes, const Env& base, int jobs,
                         const std::function<void(const Cell&, size_t done, size_t total)>& progress = {}) {
    if (!base.sim() || base.measured)
        throw std::invalid_argument("a map runs on a simulated GPU preset (--device sim); on this CPU each study keeps its single-point "
                                    "verdict (a grid of CPU runs would take hours)");
    MapResult r;
    r.study = st.name;
    r.claims = st.claims;
    r.axes = axes;
    r.jobs = std::max(1, jobs);
    const std::vector<std::vector<std::string>> grid = grid_of(axes);
    r.cells.resize(grid.size());
    auto memo = std::make_shared<MeasureMemo>();
    std::atomic<size_t> next{0}, done{0};
    std::mutex report_mu;
    const auto t0 = std::chrono::steady_clock::now();
    auto worker = [&]() {
        for (size_t i; (i = next++) < grid.size();) {
            Cell& c = r.cells[i];
            c.params = grid[i];
            const auto c0 = std::chrono::steady_clock::now();
            Env env = base;
            env.map_cell = true;
            env.drains = kMapDrains;
            env.memo = memo;
            try {
                for (size_t a = 0; a < axes.size(); ++a) axes[a].set(env, grid[i][a]);
                const StudyResult sr = st.run(env);
                c.verdicts = sr.verdicts;
                c.overall = combine(sr.verdicts);
            } catch (const std::exception& e) {
                c.error = e.what();
            }
            c.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - c0).count();
            const size_t d = ++done;
            if (progress) {
                std::lock_guard<std::mutex> lock(report_mu);
                progress(c, d, grid.size());
            }
        }
    };
    std::vector<std::thread> pool;
    for (int j = 1; j < r.jobs; ++j) pool.emplace_back(worker);
    worker();
    for (std::thread& t : pool) t.join();
    r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return r;
}

// The verdict a cell gives `claim` (not shown if the cell failed or does
// not test it).
inline Verdict cell_verdict(const Cell& c, const std::string& claim) {
    for (const ClaimVerdict& v : c.verdicts)
        if (v.claim == claim) return v.verdict;
    return Verdict::kNotShown;
}
inline const ClaimVerdict* cell_claim(const Cell& c, const std::string& claim) {
    for (const ClaimVerdict& v : c.verdicts)
        if (v.claim == claim) return &v;
    return nullptr;
}
// How many cells `claim` holds in (supported), in how many its premise
// occurred (the cells that count), and in how many it was not shown.
struct Holds {
    int holds = 0, shown = 0, not_shown = 0;
};
inline Holds holds_count(const MapResult& m, const std::string& claim) {
    Holds h;
    for (const Cell& c : m.cells) {
        if (!c.error.empty()) continue;
        const Verdict v = cell_verdict(c, claim);
        if (v == Verdict::kNotShown) {
            h.not_shown++;
            continue;
        }
        h.shown++;
        h.holds += v == Verdict::kSupported;
    }
    return h;
}
// "holds in X of Y cells (N not shown)".
inline std::string holds_text(const Holds& h) {
    return fmt("holds in %d of %d cells%s", h.holds, h.shown, h.not_shown ? fmt(" (%d not shown)", h.not_shown).c_str() : "");
}
// A cell that counts for `claim`: it ran, and the claim's premise occurred.
inline bool counts(const Cell& c, const std::string& claim) { return c.error.empty() && cell_verdict(c, claim) != Verdict::kNotShown; }

// ============================================================================
// 3. The boundary in words
// ============================================================================
//
// Where does a claim hold? We look for the simplest true sentence:
//   - everywhere, or nowhere (then: what it is instead, most often);
//   - one input decides it: the claim holds at some of its values in every
//     cell and at the others in none ("holds exactly when gpu is h200");
//   - a numeric input bounds it: in every slice of the other inputs, the
//     cells where it holds are the values above (or below) one threshold
//     ("holds when pcie_gbps is at least ~12, in every slice");
//   - otherwise: no single input decides it, and the input it turns on most
//     (the largest difference in the share of cells where it holds between
//     two of its values), with the counts per value of every input.

struct AxisTally {
    std::vector<int> holds, total;  // [value]
};

inline AxisTally tally(const MapResult& m, size_t axis, const std::string& claim) {
    AxisTally t;
    const size_t n = m.axes[axis].values.size();
    t.holds.assign(n, 0);
    t.total.assign(n, 0);
    for (const Cell& c : m.cells) {
        if (!counts(c, claim)) continue;
        const size_t v = (size_t)(std::find(m.axes[axis].values.begin(), m.axes[axis].values.end(), c.params[axis]) -
                                  m.axes[axis].values.begin());
        t.total[v]++;
        t.holds[v] += cell_verdict(c, claim) == Verdict::kSupported;
    }
    return t;
}

// For a numeric axis: does the claim hold, in every slice of the other axes,
// exactly on the values from some threshold up (dir = +1) or down (-1)? The
// thresholds found, per slice (NaN where the slice never holds).
inline bool threshold_shape(const MapResult& m, size_t axis, const std::string& claim, int dir, std::vector<double>& thresholds) {
    thresholds.clear();
    std::vector<double> vals;
    for (const std::string& v : m.axes[axis].values) vals.push_back(axis_number(v));
    // Slices: the other axes' values.
    std::map<std::vector<std::string>, std::vector<std::pair<double, bool>>> slices;
    for (const Cell& c : m.cells) {
        if (!c.error.empty()) return false;
        if (!counts(c, claim)) continue;
        std::vector<std::string> key = c.params;
        key.erase(key.begin() + (ptrdiff_t)axis);
        slices[key].push_back({axis_number(c.params[axis]), cell_verdict(c, claim) == Verdict::kSupported});
    }
    bool any_holds = false, any_fails = false, interior = false;
    for (auto& [key, pts] : slices) {
        std::sort(pts.begin(), pts.end());
        if (dir < 0) std::reverse(pts.begin(), pts.end());
        // Holds on a suffix: false...false true...true.
        size_t first = pts.size();
        for (size_t i = pts.size(); i-- > 0 && pts[i].second;) first = i;
        for (size_t i = 0; i < first; ++i)
            if (pts[i].second) return false;
        any_holds = any_holds || first < pts.size();
        any_fails = any_fails || first > 0;
        interior = interior || (first > 0 && first < pts.size());  // a slice that changes along the axis
        thresholds.push_back(first < pts.size() ? pts[first].first : std::nan(""));
    }
    return any_holds && any_fails && interior;
}

inline std::string join(const std::vector<std::string>& v, const char* sep = ", ") {
    std::string s;
    for (const std::string& x : v) s += (s.empty() ? "" : sep) + x;
    return s;
}

// Only the cells where the claim's premise occurred count (counts()).
inline std::string boundary(const MapResult& m, const std::string& claim) {
    const Holds hc = holds_count(m, claim);
    const int holds = hc.holds, total = hc.shown;
    if (total == 0) return hc.not_shown ? "its premise occurred in no cell" : "no cell ran";
    if (holds == total) return "holds in every cell where its premise occurred";
    if (holds == 0) {
        int count[4] = {0, 0, 0, 0};
        for (const Cell& c : m.cells)
            if (counts(c, claim)) count[(int)cell_verdict(c, claim)]++;
        const int most = (int)(std::max_element(count, count + 4) - count);
        return fmt("holds in no cell where its premise occurred (%s in %d of %d)", to_string((Verdict)most), count[most], total);
    }
    // One input decides it.
    for (size_t a = 0; a < m.axes.size(); ++a) {
        const AxisTally t = tally(m, a, claim);
        std::vector<std::string> yes, no;
        bool clean = true;
        for (size_t v = 0; v < t.total.size(); ++v) {
            if (t.total[v] == 0) continue;
            if (t.holds[v] == t.total[v]) yes.push_back(m.axes[a].values[v]);
            else if (t.holds[v] == 0) no.push_back(m.axes[a].values[v]);
            else clean = false;
        }
        if (clean && !yes.empty() && !no.empty())
            return fmt("%s decides it: holds exactly when %s is %s (in all %d such cells), never when it is %s", m.axes[a].name.c_str(),
                       m.axes[a].name.c_str(), join(yes, " or ").c_str(), holds, join(no, " or ").c_str());
    }
    // A few cells: name them.
    auto cells_where = [&](bool want) {
        std::vector<std::string> v;
        for (const Cell& c : m.cells)
            if (counts(c, claim) && (cell_verdict(c, claim) == Verdict::kSupported) == want) v.push_back(join(c.params, " / "));
        return join(v, "; ");
    };
    std::string names;
    for (const Axis& a : m.axes) names += (names.empty() ? "" : " / ") + a.name;
    if (holds <= 3) return fmt("holds only at (%s) %s", names.c_str(), cells_where(true).c_str());
    if (total - holds <= 3) return fmt("holds everywhere but at (%s) %s", names.c_str(), cells_where(false).c_str());
    // A numeric input bounds it, in every slice of the others.
    for (size_t a = 0; a < m.axes.size(); ++a) {
        if (!m.axes[a].numeric || m.axes[a].values.size() < 2) continue;
        for (int dir : {+1, -1}) {
            std::vector<double> th;
            if (!threshold_shape(m, a, claim, dir, th)) continue;
            std::vector<double> finite;
            for (double x : th)
                if (std::isfinite(x)) finite.push_back(x);
            std::sort(finite.begin(), finite.end());
            const double lo = finite.front(), hi = finite.back();
            return fmt("%s bounds it: in every slice of the other inputs it holds only %s a threshold of %s (%s), and in %d of %d "
                       "slices at none",
                       m.axes[a].name.c_str(), dir > 0 ? "at and above" : "at and below", m.axes[a].name.c_str(),
                       lo == hi ? fmt("%g", lo).c_str() : fmt("%g to %g, by slice", lo, hi).c_str(), (int)(th.size() - finite.size()),
                       (int)th.size());
        }
    }
    // Otherwise: what it turns on most, and the counts.
    size_t best = 0;
    double spread = -1;
    std::string detail;
    for (size_t a = 0; a < m.axes.size(); ++a) {
        const AxisTally t = tally(m, a, claim);
        double lo = 2, hi = -1;
        std::string per;
        for (size_t v = 0; v < t.total.size(); ++v) {
            if (t.total[v] == 0) continue;
            const double f = (double)t.holds[v] / t.total[v];
            lo = std::min(lo, f);
            hi = std::max(hi, f);
            per += fmt("%s%s %d/%d", per.empty() ? "" : ", ", m.axes[a].values[v].c_str(), t.holds[v], t.total[v]);
        }
        detail += fmt("%s%s: %s", detail.empty() ? "" : "; ", m.axes[a].name.c_str(), per.c_str());
        if (hi - lo > spread) {
            spread = hi - lo;
            best = a;
        }
    }
    return fmt("no single input decides it; it turns most on %s (cells where it holds, by value: %s)", m.axes[best].name.c_str(), detail.c_str());
}

// ============================================================================
// 4. Output
// ============================================================================

inline char verdict_letter(Verdict v) {
    switch (v) {
        case Verdict::kSupported: return 'S';
        case Verdict::kContradicted: return 'C';
        case Verdict::kMixed: return 'M';
        case Verdict::kNotShown: return '-';
    }
    return '?';
}

// The text: one row per cell (its inputs, a verdict per claim), then per
// claim the count and the boundary.
inline void print_map(const MapResult& m, FILE* out) {
    Table t;
    for (const Axis& a : m.axes) t.headers.push_back(a.name);
    for (const std::string& c : m.claims) t.headers.push_back(c);
    t.headers.push_back("s");
    for (const Cell& c : m.cells) {
        std::vector<std::string> row = c.params;
        for (const std::string& cl : m.claims) row.push_back(c.error.empty() ? to_string(cell_verdict(c, cl)) : "error");
        row.push_back(fmt("%.1f", c.seconds));
        t.rows.push_back(row);
    }
    t.print(out);
    for (const Cell& c : m.cells)
        if (!c.error.empty()) std::fprintf(out, "  cell %s: %s\n", join(c.params, " ").c_str(), c.error.c_str());
    std::fprintf(out, "\n");
    for (const std::string& cl : m.claims) std::fprintf(out, "%s %s: %s\n", cl.c_str(), holds_text(holds_count(m, cl)).c_str(), boundary(m, cl).c_str());
}

inline std::string cell_json(const MapResult& m, const Cell& c, const std::vector<std::string>& claims) {
    Json params;
    for (size_t a = 0; a < m.axes.size(); ++a) {
        if (m.axes[a].numeric) params.num(m.axes[a].name, axis_number(c.params[a]));
        else params.str(m.axes[a].name, c.params[a]);
    }
    Json verdicts, numbers, premise;
    Verdict overall = Verdict::kNotShown;
    std::vector<ClaimVerdict> mine;
    for (const std::string& cl : claims) {
        const ClaimVerdict* v = cell_claim(c, cl);
        if (!v) continue;
        mine.push_back(*v);
        verdicts.str(cl, to_string(v->verdict));
        for (const auto& [k, x] : v->numbers) numbers.num(claims.size() > 1 ? cl + "." + k : k, x);
        for (const auto& [k, x] : v->premise) premise.num(claims.size() > 1 ? cl + "." + k : k, x);
    }
    overall = combine(mine);
    Json j;
    j.raw("params", params.dump());
    j.str("verdict", c.error.empty() ? to_string(overall) : "error");
    if (claims.size() > 1) j.raw("verdicts", verdicts.dump());
    j.raw("numbers", numbers.dump());
    j.raw("premise", premise.dump());
    if (!c.error.empty()) j.str("error", c.error);
    j.num("seconds", c.seconds);
    return j.dump();
}

// The JSON: {"claim", "cells": [{"params", "verdict", "numbers", "premise"}],
// "holds", "total", "not_shown"} for `claims` (one claim, or a study's
// several: then "claim" names them all, a cell's verdict is their
// combination, "verdicts" has each, and "maps" has one object of the same
// shape per claim). "total" counts the cells where the premise occurred,
// "not_shown" those where it did not; a cell that failed is in neither.
inline std::string map_json(const MapResult& m, const std::vector<std::string>& claims) {
    auto one = [&](const std::vector<std::string>& cls) {
        std::vector<std::string> cells;
        int holds = 0, total = 0, not_shown = 0;
        for (const Cell& c : m.cells) {
            cells.push_back(cell_json(m, c, cls));
            if (!c.error.empty()) continue;
            std::vector<ClaimVerdict> mine;
            for (const std::string& cl : cls)
                if (const ClaimVerdict* v = cell_claim(c, cl)) mine.push_back(*v);
            const Verdict v = combine(mine);
            if (v == Verdict::kNotShown) {
                ++not_shown;
                continue;
            }
            ++total;
            holds += v == Verdict::kSupported;
        }
        Json j;
        j.str("study", m.study);
        j.str("claim", join(cls, "+"));
        j.raw("cells", Json::array(cells));
        j.integer("holds", holds);
        j.integer("total", total);
        j.integer("not_shown", not_shown);
        if (cls.size() == 1) j.str("boundary", boundary(m, cls[0]));
        return j;
    };
    Json top = one(claims);
    if (claims.size() > 1) {
        std::vector<std::string> maps;
        for (const std::string& cl : claims) maps.push_back(one({cl}).dump());
        top.raw("maps", Json::array(maps));
    }
    std::vector<std::string> axes;
    for (const Axis& a : m.axes) {
        std::vector<std::string> vs;
        for (const std::string& v : a.values) vs.push_back(Json::quote(v));
        axes.push_back(Json().str("name", a.name).raw("values", Json::array(vs)).dump());
    }
    top.raw("axes", Json::array(axes));
    top.num("seconds", m.seconds);
    top.integer("jobs", m.jobs);
    return top.dump();
}

// An SVG heat map per claim: a row per combination of every axis but the
// last, a column per value of the last; each cell coloured by its verdict
// (supported green, mixed amber, contradicted red, not shown grey) with its
// letter, so that the chart reads without colour too.
inline std::string map_svg(const MapResult& m) {
    const int cw = 64, ch = 22, label_w = 250, title_h = 44, gap = 26;
    const Axis& last = m.axes.back();
    std::vector<std::vector<std::string>> rows;  // the other axes' values, per row
    for (const Cell& c : m.cells) {
        std::vector<std::string> k(c.params.begin(), c.params.end() - 1);
        if (rows.empty() || rows.back() != k) rows.push_back(k);
    }
    std::string rest;
    for (size_t a = 0; a + 1 < m.axes.size(); ++a) rest += (rest.empty() ? "" : " / ") + m.axes[a].name;
    const int block_h = title_h + ch * (int)(rows.size() + 1) + gap;
    const int W = label_w + cw * (int)last.values.size() + 20, H = block_h * (int)m.claims.size() + 30;
    auto color = [](Verdict v) {
        switch (v) {
            case Verdict::kSupported: return "#4caf50";
            case Verdict::kMixed: return "#ffb300";
            case Verdict::kContradicted: return "#e53935";
            case Verdict::kNotShown: return "#bdbdbd";
        }
        return "#bdbdbd";
    };
    std::string o = fmt("<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" font-family=\"sans-serif\" font-size=\"12\">\n", W, H);
    o += fmt("<rect width=\"%d\" height=\"%d\" fill=\"white\"/>\n", W, H);
    for (size_t k = 0; k < m.claims.size(); ++k) {
        const std::string& cl = m.claims[k];
        const int y0 = 10 + block_h * (int)k;
        o += fmt("<text x=\"10\" y=\"%d\" font-weight=\"bold\">%s: study %s, %s</text>\n", y0 + 14, svg::escape(cl).c_str(),
                 svg::escape(m.study).c_str(), svg::escape(holds_text(holds_count(m, cl))).c_str());
        o += fmt("<text x=\"10\" y=\"%d\">rows: %s; columns: %s (S supported, M mixed, C contradicted, - not shown)</text>\n", y0 + 30,
                 svg::escape(rest).c_str(), svg::escape(last.name).c_str());
        const int gy = y0 + title_h;
        for (size_t v = 0; v < last.values.size(); ++v)
            o += fmt("<text x=\"%d\" y=\"%d\" text-anchor=\"middle\">%s</text>\n", label_w + cw * (int)v + cw / 2, gy + 15,
                     svg::escape(last.values[v]).c_str());
        for (size_t r = 0; r < rows.size(); ++r) {
            const int y = gy + ch * (int)(r + 1);
            o += fmt("<text x=\"%d\" y=\"%d\" text-anchor=\"end\">%s</text>\n", label_w - 8, y + 15, svg::escape(join(rows[r], " / ")).c_str());
            for (size_t v = 0; v < last.values.size(); ++v) {
                std::vector<std::string> params = rows[r];
                params.push_back(last.values[v]);
                Verdict vd = Verdict::kNotShown;
                bool err = false;
                for (const Cell& c : m.cells)
                    if (c.params == params) {
                        vd = cell_verdict(c, cl);
                        err = !c.error.empty();
                    }
                const int x = label_w + cw * (int)v;
                o += fmt("<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"%s\" stroke=\"white\"/>\n", x, y, cw, ch,
                         err ? "#ffffff" : color(vd));
                o += fmt("<text x=\"%d\" y=\"%d\" text-anchor=\"middle\">%s</text>\n", x + cw / 2, y + 15, err ? "err" : std::string(1, verdict_letter(vd)).c_str());
            }
        }
    }
    return o + "</svg>\n";
}

}  // namespace study

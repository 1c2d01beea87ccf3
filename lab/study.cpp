// lab/study.cpp -- lab/LAB.md chapter L5: one driver for every study
// (lab/studies.hpp), and for its map (lab/study_map.hpp).
//
//   build/study --list
//   build/study NAME [--device cpu|sim] [--gpu PRESET] [--model PRESET] [--pcie PRESET]
//                    [--pcie-gbps X] [--pcie-background X] [--seed N] [--scale X] [--load X]
//                    [--traffic synthetic|conv|code] [--json] [--svg FILE]
//   build/study NAME --map [--claim ID] [--jobs N] [--json] [--svg FILE]   (simulated GPU only)
//
// A study runs a few variants of one scenario on one device, prints its
// evidence table, and ends with a verdict line per claim and one overall:
//   verdict: supported | contradicted | mixed | not shown -- <the numbers>
// computed from its own numbers. --device cpu (the default) runs the
// built-in model on this machine and measures its CPU time; --device sim runs a
// simulated GPU (sim_runner.hpp) with a model preset and a GPU preset
// (cost_model.hpp) and reports modelled time.
//
// A verdict holds at the inputs it was computed at. --map runs the study
// over its grid of inputs (study_map.hpp's map_of) on the simulated GPU and
// prints the verdict in every cell, "holds in X of Y cells" and the boundary
// in words; --json prints {"claim", "cells": [{"params", "verdict",
// "numbers"}], "holds", "total", ...}; --svg writes a heat map per claim.
// The CPU keeps its single-point verdicts: a grid of CPU runs would take
// hours.
#include <cstdio>
#include <string>
#include <vector>

#ifdef _OPENMP
#include <omp.h>
#endif

#include <fstream>
#include <thread>

#include "examples/cli.hpp"
#include "examples/svg.hpp"
#include "lab/studies.hpp"
#include "lab/study_map.hpp"

namespace {

struct Options {
    std::string name, svg_path, gpu = "h200", model = "llama-3-8b", pcie, claim, traffic = "synthetic";
    double pcie_gbps = 0, pcie_background = 0, scale = 1.0, load = 0;
    long long seed = 1;
    int jobs = 2;
    pkv::Device device = pkv::Device::kCpu;
    bool json = false, list = false, map = false;
};

Options parse(int argc, char** argv) {
    Options o;
    std::string names;
    for (const study::Study& s : study::all_studies()) names += (names.empty() ? "" : ", ") + s.name;
    cli::Parser p("study", "NAME [options] | --list",
                  "Runs one study (" + names + ") and prints its evidence and verdicts.");
    p.positional(&o.name, "study name");
    p.flag("--list", &o.list, "list the studies and the claims each tests");
    p.choice("--device", &o.device, {{"cpu", pkv::Device::kCpu}, {"sim", pkv::Device::kSim}},
             "cpu: the built-in model on this machine (measured); sim: a simulated GPU (modelled)");
    std::vector<std::pair<std::string, std::string>> gpus, models, links;
    for (const auto& g : pkv::gpu_presets()) gpus.push_back({g.name, g.name});
    gpus.push_back({"cpu", "cpu"});  // this machine, measured (sim_runner.hpp section 2)
    for (const auto& m : pkv::model_presets()) models.push_back({m.name, m.name});
    for (const auto& l : pkv::pcie_presets()) links.push_back({l.name, l.name});
    p.choice("--gpu", &o.gpu, gpus, "the simulated GPU; cpu = this machine's measured rates with the built-in model");
    p.choice("--model", &o.model, models, "the simulated model");
    links.push_back({"", ""});
    p.choice("--pcie", &o.pcie, links, "the simulated host link (default: the GPU's own)");
    p.real("--pcie-gbps", &o.pcie_gbps, 0, 1e6, "the simulated host link's bandwidth in GB/s, replacing the preset's; 0 = the preset");
    p.real("--pcie-background", &o.pcie_background, 0, 0.99, "the share of the simulated link other PCIe traffic takes");
    p.integer("--seed", &o.seed, 1, 1000000000, "the traffic's seed (lengths, arrivals, tokens)");
    p.real("--scale", &o.scale, 0.05, 4, "every prompt and output length x this");
    p.real("--load", &o.load, 0, 100,
           "arrival rate as a multiple of the capacity measured on the same requests (every study but preemption); 0 = the study's "
           "own default (2)");
    p.choice("--traffic", &o.traffic, {{"synthetic", "synthetic"}, {"conv", "conv"}, {"code", "code"}},
             "where requests come from: synthetic (Poisson, lognormal lengths) or a replay of the Azure conv or code trace in "
             "../shared/traces, time-scaled to --load");
    p.flag("--map", &o.map, "run the study over its grid of inputs on the simulated GPU: a verdict per cell, holds in X of Y, the boundary "
                            "(the CPU keeps single-point verdicts)");
    p.text("--claim", &o.claim, "ID", "with --map: only this claim's map (one of the study's)");
    p.integer("--jobs", &o.jobs, 1, 64, "with --map: cells run on this many threads (the result does not depend on it)");
    p.flag("--json", &o.json, "one JSON object on stdout: claims, verdicts, table (with --map: the map)");
    p.text("--svg", &o.svg_path, "FILE", "also write the study's charts to FILE (SVG; with --map: a heat map per claim)");
    p.parse(argc, argv);
    if (!o.list && o.name.empty()) cli::bad_usage("name a study (or --list)");
    if (o.map && o.device != pkv::Device::kSim)
        cli::bad_usage("--map runs on the simulated GPU: add --device sim (on this CPU a study keeps its single-point verdict; a grid of CPU "
                       "runs would take hours)");
    if (o.map && o.gpu == "cpu") cli::bad_usage("--map needs a GPU preset, not --gpu cpu (this CPU keeps its single-point verdicts)");
    if (!o.map && (!o.claim.empty() || o.jobs != 2)) cli::bad_usage("--claim and --jobs go with --map");
    return o;
}

std::string claims_of(const study::Study& s) {
    std::string c;
    for (const std::string& id : s.claims) c += (c.empty() ? "" : ", ") + id;
    return c;
}

// --map: the study over its grid (study_map.hpp), printed as a table of
// cells and a line per claim, or as JSON; progress on stderr.
int run_map(const study::Study& st, const study::Env& env, const Options& o) {
    std::vector<std::string> claims = st.claims;
    if (!o.claim.empty()) {
        if (std::find(claims.begin(), claims.end(), o.claim) == claims.end())
            cli::bad_usage("study " + st.name + " tests " + claims_of(st) + ", not '" + o.claim + "'");
        claims = {o.claim};
    }
    const std::vector<study::Axis> axes = study::map_of(st.name);
    study::MapResult m = study::run_map(st, axes, env, o.jobs, [&](const study::Cell& c, size_t done, size_t total) {
        std::fprintf(stderr, "  cell %zu/%zu (%s): %s in %.1f s\n", done, total, study::join(c.params, " ").c_str(),
                     c.error.empty() ? study::to_string(c.overall) : "error", c.seconds);
    });
    m.claims = claims;
    if (!o.svg_path.empty()) {
        std::ofstream f(o.svg_path);
        f << study::map_svg(m);
        if (!f) throw std::runtime_error("cannot write " + o.svg_path);
    }
    if (o.json) {
        std::printf("%s\n", study::map_json(m, claims).c_str());
        return 0;
    }
    std::printf("map of study %s: %s\n", st.name.c_str(), st.title.c_str());
    for (const std::string& id : claims) std::printf("  %s: %s\n", id.c_str(), study::claim_text(id).c_str());
    std::string grid;
    for (const study::Axis& a : axes) grid += (grid.empty() ? "" : " x ") + a.name + " {" + study::join(a.values) + "}";
    std::printf("device: %s, each cell's arrivals lasting %g drain times (lab/LAB.md ch. L5); grid: %s = %zu cells\n\n",
                env.describe().c_str(), study::kMapDrains, grid.c_str(), m.cells.size());
    study::print_map(m, stdout);
    std::printf("map: %zu cells in %.1f s on %d thread%s\n", m.cells.size(), m.seconds, m.jobs, m.jobs == 1 ? "" : "s");
    if (!o.svg_path.empty()) std::printf("heat map: %s\n", o.svg_path.c_str());
    return 0;
}

int run(int argc, char** argv) {
    const Options o = parse(argc, argv);
    if (o.list) {
        for (const study::Study& s : study::all_studies()) {
            std::printf("%-11s %-8s %s\n", s.name.c_str(), claims_of(s).c_str(), s.title.c_str());
            for (const std::string& id : s.claims) std::printf("%-11s   %s: %s\n", "", id.c_str(), study::claim_text(id).c_str());
        }
        return 0;
    }
    const study::Study* st = nullptr;
    for (const study::Study& s : study::all_studies())
        if (s.name == o.name) st = &s;
    if (!st) cli::bad_usage("no study named '" + o.name + "' (build/study --list shows them)");
    if (!o.svg_path.empty()) workload::check_writable(o.svg_path);

    study::Env env;
    env.device = o.device;
    env.gpu = o.gpu;
    env.model = o.model;
    env.pcie = o.pcie;
    env.pcie_bw_override = o.pcie_gbps * 1e9;
    env.pcie_background = o.pcie_background;
    env.seed = (uint64_t)o.seed;
    env.scale = o.scale;
    env.load = o.load;
    env.traffic = o.traffic;
    if (o.map) return run_map(*st, env, o);
    pkv::ModelAndTokenizer builtin;
    pkv::SimConfig measured;
    if (env.sim() && o.gpu == "cpu") {
#ifdef _OPENMP
        omp_set_num_threads(1);  // the preset is measured on one thread
#endif
        builtin = pkv::load_model_and_tokenizer("", "");
        measured = pkv::cpu_sim_config(builtin.model, "builtin");
        env.measured = &measured;
    }
    if (!env.sim()) {
#ifdef _OPENMP
        omp_set_num_threads(1);  // device time is this thread's CPU time (study_kit.hpp)
#endif
        builtin = pkv::load_model_and_tokenizer("", "");
        env.cpu_model = &builtin;
    }
    const study::StudyResult r = st->run(env);
    const study::Verdict overall = study::combine(r.verdicts);
    std::string numbers;
    for (const study::ClaimVerdict& v : r.verdicts) numbers += (numbers.empty() ? "" : "; ") + v.claim + ": " + v.because;

    if (!o.svg_path.empty()) {
        svg::Figure fig;
        for (const svg::Chart& c : r.charts) fig.add(c);
        std::string err;
        if (!fig.write(o.svg_path, &err)) throw std::runtime_error(err);
    }
    if (o.json) {
        std::vector<std::string> jc, jv, je, jn;
        for (const std::string& id : st->claims) jc.push_back(workload::Json().str("id", id).str("text", study::claim_text(id)).dump());
        for (const study::ClaimVerdict& v : r.verdicts)
            jv.push_back(workload::Json().str("claim", v.claim).str("verdict", study::to_string(v.verdict)).str("because", v.because).dump());
        for (const study::Table& t : r.extra) je.push_back(t.json());
        for (const std::string& n : r.notes) jn.push_back(workload::Json::quote(n));
        std::printf("%s\n", workload::Json()
                                .str("study", st->name)
                                .str("title", st->title)
                                .str("device", env.describe())
                                .raw("claims", workload::Json::array(jc))
                                .raw("notes", workload::Json::array(jn))
                                .raw("table", r.table.json())
                                .raw("extra_tables", workload::Json::array(je))
                                .raw("verdicts", workload::Json::array(jv))
                                .str("verdict", study::to_string(overall))
                                .str("verdict_text", numbers)
                                .dump()
                                .c_str());
        return 0;
    }
    std::printf("study %s: %s\n", st->name.c_str(), st->title.c_str());
    for (const std::string& id : st->claims) std::printf("  %s: %s\n", id.c_str(), study::claim_text(id).c_str());
    std::printf("device: %s\n", env.describe().c_str());
    for (const std::string& n : r.notes) std::printf("%s\n", n.c_str());
    std::printf("\n");
    r.table.print(stdout);
    for (const study::Table& t : r.extra) {
        std::printf("\n");
        t.print(stdout);
    }
    std::printf("\n");
    for (const study::ClaimVerdict& v : r.verdicts) std::printf("%s %s -- %s\n", v.claim.c_str(), study::to_string(v.verdict), v.because.c_str());
    std::printf("verdict: %s -- %s\n", study::to_string(overall), numbers.c_str());
    if (!o.svg_path.empty()) std::printf("chart: %s\n", o.svg_path.c_str());
    return 0;
}

}  // namespace

int main(int argc, char** argv) { return cli::guarded_main("study", [&] { return run(argc, argv); }); }

// lab/study.cpp -- lab/LAB.md chapter L5: one driver for every study
// (lab/studies.hpp).
//
//   build/study --list
//   build/study NAME [--device cpu|sim] [--gpu PRESET] [--model PRESET] [--pcie PRESET]
//                    [--json] [--svg FILE]
//
// A study runs a few variants of one scenario on one device, prints its
// evidence table, and ends with a verdict line per claim and one overall:
//   verdict: supported | contradicted | mixed | not shown -- <the numbers>
// computed from its own numbers. --device cpu (the default) runs the
// built-in model on this machine and measures wall time; --device sim runs a
// simulated GPU (sim_runner.hpp) with a model preset and a GPU preset
// (cost_model.hpp) and reports modelled time.
#include <cstdio>
#include <string>
#include <vector>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "examples/cli.hpp"
#include "lab/studies.hpp"
#include "examples/svg.hpp"

namespace {

struct Options {
    std::string name, svg_path, gpu = "h200", model = "llama-3-8b", pcie;
    double pcie_gbps = 0;
    pkv::Device device = pkv::Device::kCpu;
    bool json = false, list = false;
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
    p.flag("--json", &o.json, "one JSON object on stdout: claims, verdicts, table");
    p.text("--svg", &o.svg_path, "FILE", "also write the study's charts to FILE (SVG)");
    p.parse(argc, argv);
    if (!o.list && o.name.empty()) cli::bad_usage("name a study (or --list)");
    return o;
}

std::string claims_of(const study::Study& s) {
    std::string c;
    for (const std::string& id : s.claims) c += (c.empty() ? "" : ", ") + id;
    return c;
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
    if (!o.svg_path.empty()) study::check_writable(o.svg_path);

    study::Env env;
    env.device = o.device;
    env.gpu = o.gpu;
    env.model = o.model;
    env.pcie = o.pcie;
    env.pcie_bw_override = o.pcie_gbps * 1e9;
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
        for (const std::string& id : st->claims) jc.push_back(study::Json().str("id", id).str("text", study::claim_text(id)).dump());
        for (const study::ClaimVerdict& v : r.verdicts)
            jv.push_back(study::Json().str("claim", v.claim).str("verdict", study::to_string(v.verdict)).str("because", v.because).dump());
        for (const study::Table& t : r.extra) je.push_back(t.json());
        for (const std::string& n : r.notes) jn.push_back(study::Json::quote(n));
        std::printf("%s\n", study::Json()
                                .str("study", st->name)
                                .str("title", st->title)
                                .str("device", env.describe())
                                .raw("claims", study::Json::array(jc))
                                .raw("notes", study::Json::array(jn))
                                .raw("table", r.table.json())
                                .raw("extra_tables", study::Json::array(je))
                                .raw("verdicts", study::Json::array(jv))
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

// examples/concurrency_sweep.cpp -- "the inversion": one overloaded workload,
// run again and again with more requests allowed to run at once.
//
// More concurrency means bigger batches, which on a GPU are nearly free, so
// throughput should rise. But with a KV pool that is small for the workload,
// every extra running request is another sequence growing into the same free
// list: past some point the engine preempts, recomputes, and spends its time
// on work it already did. Useful tokens per second then *fall* while the
// tokens through the model stay high: the machine is busy, not productive.
//
// For each max_num_seqs the table shows completed requests per second, useful
// and processed (useful + prompt + recompute) tokens per second, preemptions,
// recomputed tokens, and inter-token latency p50/p99 (wall clock), plus
// useful tokens per engine step. The conclusion line is computed from the
// rows, whatever they show.
//
// On a CPU a step that computes N tokens costs roughly N times one token
// (TUTORIAL chapter 8: batching gains ~1.5x and then stops), so recompute is
// paid at nearly full price and bigger batches buy little. Useful tok/step is
// the view without that cost: a step counted as one unit of time whatever its
// batch, which is closer to a GPU decode step.
#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "examples/cli.hpp"
#include "examples/svg.hpp"
#include "examples/legacy_study.hpp"

namespace {

struct Options {
    study::Setup setup = study::study_setup();
    std::vector<int> seqs = {1, 2, 4, 8, 12, 16, 24, 32, 48};
    int repeat = 1;
    std::string svg_path = "build/concurrency_sweep.svg";
    bool json = false;
};

Options parse(int argc, char** argv) {
    Options o;
    cli::Parser p("concurrency_sweep", "[options]",
                  "One overloaded workload (built-in model, all requests at once), run once per\n"
                  "max_num_seqs: does more concurrency give more useful work, or less?");
    p.int_list("--seqs", &o.seqs, 1, 1 << 16, 64, "max_num_seqs values");
    p.integer("--repeat", &o.repeat, 1, 100, "run each point N times, keep the fastest");
    study::add_workload_flags(p, o.setup);
    p.text("--svg", &o.svg_path, "PATH", "chart to write");
    p.flag("--json", &o.json, "one JSON object on stdout instead of the table");
    p.parse(argc, argv);
    study::check_workload(o.setup);
    std::sort(o.seqs.begin(), o.seqs.end());
    o.seqs.erase(std::unique(o.seqs.begin(), o.seqs.end()), o.seqs.end());
    return o;
}

struct Row {
    int max_num_seqs;
    study::Measurement m;
};

// Two rows ran the same schedule when their step-level outcome is identical:
// then max_num_seqs did not bind (the pool did), and their wall times differ
// only by timing noise.
bool same_schedule(const study::Measurement& a, const study::Measurement& b) {
    return a.engine_steps == b.engine_steps && a.computed_tokens == b.computed_tokens && a.preemptions == b.preemptions &&
           a.recomputed_tokens == b.recomputed_tokens && a.peak_running == b.peak_running;
}

// The conclusion, from the rows alone.
std::vector<std::string> conclude(const std::vector<Row>& rows) {
    std::vector<std::string> out;
    bool any_done = false;
    for (const Row& r : rows) any_done = any_done || r.m.finished > 0;
    if (!any_done) return {"no request completed in any run (every one was rejected: its prompt cannot fit max_model_len), so there is nothing to compare"};
    char b[700];
    size_t peak = 0, step_peak = 0, proc_peak = 0;
    for (size_t i = 0; i < rows.size(); ++i) {
        if (rows[i].m.useful_tok_per_s() > rows[peak].m.useful_tok_per_s()) peak = i;
        if (rows[i].m.useful_tok_per_step() > rows[step_peak].m.useful_tok_per_step()) step_peak = i;
        if (rows[i].m.processed_tok_per_s() > rows[proc_peak].m.processed_tok_per_s()) proc_peak = i;
    }
    const Row& P = rows[peak];
    const Row& L = rows.back();

    // Timing noise, measured where the sweep gives it for free: rows that ran
    // the same schedule did the same work, so their useful tok/s should be
    // equal. Without such rows we do not read differences under 10%.
    size_t first_same = rows.size() - 1;
    while (first_same > 0 && same_schedule(rows[first_same - 1].m, L.m)) --first_same;
    double noise_pct = 10.0;
    std::string noise_from = "an assumed noise, as no two rows ran the same schedule";
    if (first_same + 1 < rows.size()) {
        double lo = L.m.useful_tok_per_s(), hi = lo;
        for (size_t i = first_same; i < rows.size(); ++i) {
            lo = std::min(lo, rows[i].m.useful_tok_per_s());
            hi = std::max(hi, rows[i].m.useful_tok_per_s());
        }
        noise_pct = 100.0 * (hi - lo) / std::max(1e-9, hi);
        std::snprintf(b, sizeof b,
                      "max_num_seqs %d..%d ran the identical schedule (%ld steps, %ld preemptions, at most %d running): there the "
                      "pool, not max_num_seqs, limits concurrency; their useful tok/s differ by %.0f%%: timing noise",
                      rows[first_same].max_num_seqs, L.max_num_seqs, L.m.engine_steps, L.m.preemptions, L.m.peak_running, noise_pct);
        out.push_back(b);
        noise_from = "the spread of those identical schedules";
    }

    // A fall is read as real only above max(5%, the measured noise).
    const double threshold = std::max(noise_pct, 5.0);
    const double fall = 100.0 * (1.0 - L.m.useful_tok_per_s() / std::max(1e-9, P.m.useful_tok_per_s()));
    char why[200];
    std::snprintf(why, sizeof why, "threshold %.0f%%: the larger of 5%% and %s (%.0f%%)", threshold, noise_from.c_str(), noise_pct);
    if (peak + 1 == rows.size())
        std::snprintf(b, sizeof b, "no inversion: useful tok/s is highest at the largest max_num_seqs tried (%d, %.0f tok/s)",
                      P.max_num_seqs, P.m.useful_tok_per_s());
    else if (fall <= threshold)
        std::snprintf(b, sizeof b,
                      "no clear inversion: useful tok/s peaks at max_num_seqs=%d (%.0f tok/s) and is %.0f%% lower at %d, "
                      "within the timing noise (%s)",
                      P.max_num_seqs, P.m.useful_tok_per_s(), fall, L.max_num_seqs, why);
    else
        std::snprintf(b, sizeof b,
                      "inversion: useful tok/s peaks at max_num_seqs=%d (%.0f tok/s) and falls %.0f%% by max_num_seqs=%d "
                      "(%.0f tok/s), more than the timing noise (%s)",
                      P.max_num_seqs, P.m.useful_tok_per_s(), fall, L.max_num_seqs, L.m.useful_tok_per_s(), why);
    out.push_back(b);

    // Where the waste starts, and how big it gets.
    int first_preempt = -1;
    for (const Row& r : rows)
        if (r.m.preemptions > 0) { first_preempt = r.max_num_seqs; break; }
    if (first_preempt < 0) {
        out.push_back("no run preempted: the pool held every running request, so nothing was recomputed");
    } else {
        std::snprintf(b, sizeof b,
                      "preemption starts at max_num_seqs=%d; at %d the engine preempted %ld times and recomputed %ld tokens: "
                      "%.0f%% of the %ld tokens through the model were recompute (useful %.0f tok/s of %.0f processed)",
                      first_preempt, L.max_num_seqs, L.m.preemptions, L.m.recomputed_tokens,
                      100.0 * L.m.recomputed_tokens / std::max(1L, L.m.computed_tokens), L.m.computed_tokens,
                      L.m.useful_tok_per_s(), L.m.processed_tok_per_s());
        out.push_back(b);
    }

    // Why the CPU shape is what it is: what a bigger step costs here.
    const Row& F = rows.front();
    const Row& X = rows[proc_peak];
    auto tok_per_step = [](const study::Measurement& m) { return (double)m.computed_tokens / std::max(1L, m.engine_steps); };
    auto ms_per_step = [](const study::Measurement& m) { return 1e3 * m.wall_s / std::max(1L, m.engine_steps); };
    const double tok_ratio = tok_per_step(X.m) / tok_per_step(F.m), time_ratio = ms_per_step(X.m) / ms_per_step(F.m);
    std::snprintf(b, sizeof b,
                  "batching on this machine: at max_num_seqs=%d (highest processed tok/s, %.0f) a step computed %.1f tokens in "
                  "%.2f ms, against %.1f tokens in %.2f ms at max_num_seqs=%d: %.1fx the tokens for %.1fx the time, so %s",
                  X.max_num_seqs, X.m.processed_tok_per_s(), tok_per_step(X.m), ms_per_step(X.m), tok_per_step(F.m), ms_per_step(F.m),
                  F.max_num_seqs, tok_ratio, time_ratio,
                  time_ratio > 0.5 * tok_ratio ? "a token costs nearly the same in any batch and recompute is paid at nearly full price"
                                               : "bigger batches are much cheaper per token, which pays for part of the recompute");
    out.push_back(b);

    // The same runs counted in steps (a step = one unit of time, whatever its batch).
    const Row& S = rows[step_peak];
    const double step_fall = 100.0 * (1.0 - L.m.useful_tok_per_step() / S.m.useful_tok_per_step());
    if (step_peak + 1 == rows.size() || step_fall < 1.0)
        std::snprintf(b, sizeof b,
                      "per engine step (deterministic; a step costs the same at any batch, roughly a GPU decode step): "
                      "useful tok/step rises to %.2f at max_num_seqs=%d and does not fall (%.2f at %d)",
                      S.m.useful_tok_per_step(), S.max_num_seqs, L.m.useful_tok_per_step(), L.max_num_seqs);
    else
        std::snprintf(b, sizeof b,
                      "per engine step (deterministic; a step costs the same at any batch, roughly a GPU decode step): "
                      "useful tok/step peaks at %.2f at max_num_seqs=%d and falls %.0f%% by %d (%.2f)",
                      S.m.useful_tok_per_step(), S.max_num_seqs, step_fall, L.max_num_seqs, L.m.useful_tok_per_step());
    out.push_back(b);
    return out;
}

// Returns false (after saying why on stderr) when the file could not be written.
bool write_svg(const Options& o, const std::vector<Row>& rows) {
    std::vector<double> x;
    svg::Series useful{"useful tok/s", {}, {}}, processed{"processed tok/s", {}, {}};
    svg::Series pre{"preemptions", {}, {}}, victims{"requests preempted", {}, {}};
    svg::Series p50{"ITL p50", {}, {}}, p99{"ITL p99", {}, {}};
    processed.dashed = true;
    victims.dashed = true;
    for (const Row& r : rows) {
        x.push_back(r.max_num_seqs);
        useful.y.push_back(r.m.useful_tok_per_s());
        processed.y.push_back(r.m.processed_tok_per_s());
        pre.y.push_back((double)r.m.preemptions);
        victims.y.push_back((double)r.m.preempted_requests);
        p50.y.push_back(1e3 * r.m.itl_wall.percentile(50));
        p99.y.push_back(1e3 * r.m.itl_wall.percentile(99));
    }
    for (svg::Series* s : {&useful, &processed, &pre, &victims, &p50, &p99}) s->x = x;
    const study::Setup& w = o.setup;
    svg::Chart a;
    a.title = "Useful vs processed throughput (" + std::to_string(w.requests) + " requests x (" + std::to_string(w.prompt_len) +
              "+" + std::to_string(w.max_tokens) + " tokens), " + std::to_string(w.num_blocks) + " blocks of " +
              std::to_string(w.block_size) + ")";
    a.x_label = "max_num_seqs";
    a.y_label = "tokens per second (wall clock)";
    a.log2_x = true;
    a.x_ticks = x;
    a.series = {useful, processed};
    svg::Chart b = a;
    b.title = "Preemptions";
    b.y_label = "count";
    b.series = {pre, victims};
    b.height = 280;
    svg::Chart c = a;
    c.title = "Inter-token latency (wall clock)";
    c.y_label = "milliseconds";
    c.series = {p50, p99};
    c.height = 280;
    svg::Figure fig;
    fig.add(a);
    fig.add(b);
    fig.add(c);
    std::string err;
    if (fig.write(o.svg_path, &err)) return true;
    std::fprintf(stderr, "concurrency_sweep: %s\n", err.c_str());
    return false;
}

}  // namespace

int run(int argc, char** argv) {
    const Options o = parse(argc, argv);
    const pkv::ModelAndTokenizer mt = pkv::load_model_and_tokenizer("", "");
    study::check_writable(o.svg_path);  // fail now, not after the runs
    const double load = study::load_average();  // before the runs; load_end after them

    std::vector<Row> rows;
    for (int seqs : o.seqs) {
        study::Setup s = o.setup;
        s.max_num_seqs = seqs;
        Row row{seqs, {}};
        for (int k = 0; k < o.repeat; ++k) {
            study::Measurement m;
            try {
                m = study::run(mt, s);
            } catch (const std::exception& e) {
                std::fprintf(stderr, "concurrency_sweep: %s\n", e.what());
                return 1;
            }
            // Scheduling is deterministic, so repeats differ only in timing:
            // keep the fastest, the one least disturbed by other processes.
            if (k == 0 || m.wall_s < row.m.wall_s) row.m = std::move(m);
        }
        rows.push_back(std::move(row));
    }
    const std::vector<std::string> conclusion = conclude(rows);
    const double load_end = study::load_average();
    const std::string warning = study::busy_warning(load, load_end);
    const bool svg_ok = write_svg(o, rows);

    if (o.json) {
        std::vector<std::string> jr, jc;
        for (const Row& r : rows) jr.push_back(study::measurement_json(r.m).integer("max_num_seqs", r.max_num_seqs).dump());
        for (const std::string& c : conclusion) jc.push_back(study::Json::quote(c));
        std::printf("%s\n", study::Json()
                                .str("study", "concurrency_sweep")
                                .raw("workload", study::workload_json(o.setup, mt.name))
                                .integer("repeat", o.repeat)
                                .num("load_average_start", load)
                                .num("load_average_end", load_end)
                                .str("warning", warning)
                                .raw("rows", study::Json::array(jr))
                                .raw("conclusion", study::Json::array(jc))
                                .str("svg", o.svg_path)
                                .dump()
                                .c_str());
        return svg_ok ? 0 : 1;
    }

    const study::Setup& w = o.setup;
    std::printf("concurrency sweep: %d requests x (%d prompt + %d output tokens), all at once; KV cache %d blocks of %d "
                "(%d tokens); admission bet, victim newest; %s, %d CPU thread(s), load average %.1f at start, %.1f at end%s\n\n",
                w.requests, w.prompt_len, w.max_tokens, w.num_blocks, w.block_size, w.num_blocks * w.block_size,
                pkv::to_string(w.device), study::cpu_threads(), load, load_end,
                o.repeat > 1 ? (", fastest of " + std::to_string(o.repeat) + " runs per point").c_str() : "");
    if (!warning.empty()) std::printf("%s\n\n", warning.c_str());
    std::printf("%8s %7s %8s %9s %7s %7s %10s %8s %8s %5s %9s %6s %6s\n", "max_num", "req/s", "useful", "processed", "useful",
                "preempt", "recomputed", "ITL p50", "ITL p99", "peak", "useful", "steps", "wall");
    std::printf("%8s %7s %8s %9s %7s %7s %10s %8s %8s %5s %9s %6s %6s\n", "_seqs", "", "tok/s", "tok/s", "share", "", "tokens", "ms",
                "ms", "run", "tok/step", "", "s");
    for (const Row& r : rows) {
        const study::Measurement& m = r.m;
        std::printf("%8d %7.1f %8.0f %9.0f %6.0f%% %7ld %10ld %8.2f %8.2f %5d %9.2f %6ld %6.2f\n", r.max_num_seqs,
                    m.requests_per_s(), m.useful_tok_per_s(), m.processed_tok_per_s(),
                    100.0 * m.useful_tokens / std::max(1L, m.computed_tokens), m.preemptions, m.recomputed_tokens,
                    1e3 * m.itl_wall.percentile(50), 1e3 * m.itl_wall.percentile(99), m.peak_running, m.useful_tok_per_step(),
                    m.engine_steps, m.wall_s);
    }
    std::printf("\n");
    for (const std::string& c : conclusion) std::printf("conclusion: %s\n", c.c_str());
    if (svg_ok) std::printf("\nchart: %s\n", o.svg_path.c_str());
    return svg_ok ? 0 : 1;
}

int main(int argc, char** argv) { return cli::guarded_main("concurrency_sweep", [&] { return run(argc, argv); }); }

// examples/victim_study.cpp -- who should pay when the KV cache runs out?
//
// Three policies on the same overloaded workload (all requests at once):
//   newest   admission bet, preempt the newest running request (vLLM V1's
//            running.pop()): the oldest keep going and finish
//   oldest   admission bet, preempt the oldest running request: the one with
//            the most computed work is thrown away, and every request stays
//            half-done for longer
//   reserve  reserve prompt + max_tokens at admission and never preempt
//            (TensorRT-LLM's GUARANTEED_NO_EVICT)
//
// The claim to test: finishing the oldest yields more completed work early
// than slowing everyone. Time is counted in engine steps (a pkv::StepClock-like
// clock inside study::run), so the completion curves and step latencies are
// exact and the same on every machine; wall-clock figures are reported next
// to them. The chart plots completed requests against steps and against wall
// seconds for the three policies.
#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "examples/cli.hpp"
#include "examples/svg.hpp"
#include "examples/legacy_study.hpp"

namespace {

struct Policy {
    const char* name;
    pkv::Admission admission;
    pkv::Victim victim;
    const char* what;
};
const Policy kPolicies[] = {
    {"newest", pkv::Admission::kBet, pkv::Victim::kNewest, "bet, preempt newest (vLLM)"},
    {"oldest", pkv::Admission::kBet, pkv::Victim::kOldest, "bet, preempt oldest"},
    {"reserve", pkv::Admission::kReserve, pkv::Victim::kNewest, "reserve, never preempt"},
};

struct Options {
    study::Setup setup = study::study_setup();
    std::string svg_path = "build/victim_study.svg";
    bool json = false;
};

Options parse(int argc, char** argv) {
    Options o;
    cli::Parser p("victim_study", "[options]",
                  "Preempt the newest, preempt the oldest, or reserve and never preempt: the same\n"
                  "overloaded workload (built-in model, all requests at once) under each policy.");
    p.integer("--max-num-seqs", &o.setup.max_num_seqs, 1, 1 << 16, "running requests at most");
    study::add_workload_flags(p, o.setup);
    p.text("--svg", &o.svg_path, "PATH", "chart to write");
    p.flag("--json", &o.json, "one JSON object on stdout instead of the table");
    p.parse(argc, argv);
    study::check_workload(o.setup);
    return o;
}

struct Row {
    const Policy* policy;
    study::Measurement m;
};

// Mean completion time in steps: the area between the completion curve and
// "all done". Lower = work delivered earlier.
double mean_done_step(const study::Measurement& m) {
    double s = 0;
    for (double t : m.done_step) s += t;
    return m.done_step.empty() ? 0.0 : s / (double)m.done_step.size();
}

// The checkpoints of the early-work comparison: fractions of the newest
// policy's run length.
const double kCheckpoints[] = {0.25, 0.5, 0.75};

std::vector<std::string> conclude(const std::vector<Row>& rows) {
    std::vector<std::string> out;
    bool any_done = false;
    for (const Row& r : rows) any_done = any_done || r.m.finished > 0;
    if (!any_done) return {"no request completed in any run (every one was rejected: its prompt cannot fit max_model_len), so there is nothing to compare"};
    char b[700];
    const study::Measurement& N = rows[0].m;  // newest
    const study::Measurement& O = rows[1].m;  // oldest
    const study::Measurement& R = rows[2].m;  // reserve
    // The claim, checked at three points of the newest run.
    int newest_ahead = 0, oldest_ahead = 0, most_ahead = 0;
    std::string at;
    for (double f : kCheckpoints) {
        const double t = f * N.steps;
        const int n = N.completed_by_step(t), o = O.completed_by_step(t), r = R.completed_by_step(t);
        newest_ahead += n > o;
        oldest_ahead += o > n;
        most_ahead = std::max(most_ahead, n - o);
        std::snprintf(b, sizeof b, "%s step %.0f: newest %d, oldest %d, reserve %d", at.empty() ? "" : ";", t, n, o, r);
        at += b;
    }
    const char* verdict = newest_ahead > 0 && oldest_ahead == 0 ? "holds"
                          : oldest_ahead > 0 && newest_ahead == 0 ? "does not hold"
                                                                    : "is not settled";
    std::snprintf(b, sizeof b, "the claim (finishing the oldest delivers more completed work early) %s here%s: completed requests at%s",
                  verdict, newest_ahead > 0 && oldest_ahead == 0 && most_ahead <= 3 ? ", narrowly" : "", at.c_str());
    out.push_back(b);
    std::snprintf(b, sizeof b,
                  "mean completion step: newest %.0f, oldest %.0f, reserve %.0f; all %d done at step %.0f, %.0f and %.0f",
                  mean_done_step(N), mean_done_step(O), mean_done_step(R), N.requests, N.steps, O.steps, R.steps);
    out.push_back(b);
    std::snprintf(b, sizeof b,
                  "the price of the victim choice: oldest-first preempted %ld times and recomputed %ld tokens (%.0f per preemption), "
                  "against %ld and %ld (%.0f) for newest-first; e2e p99 %.0f vs %.0f steps, ITL p99 %.0f vs %.0f steps, "
                  "longest pause %.0f vs %.0f steps",
                  O.preemptions, O.recomputed_tokens, (double)O.recomputed_tokens / std::max(1L, O.preemptions), N.preemptions,
                  N.recomputed_tokens, (double)N.recomputed_tokens / std::max(1L, N.preemptions), O.e2e_steps.percentile(99),
                  N.e2e_steps.percentile(99), O.itl_steps.percentile(99), N.itl_steps.percentile(99), O.itl_steps.percentile(100),
                  N.itl_steps.percentile(100));
    out.push_back(b);
    std::snprintf(b, sizeof b,
                  "reserve never preempts (ITL p99 %.0f steps against %.0f for newest) but runs at most %d requests at once "
                  "against %d, and finishes at step %.0f against %.0f",
                  R.itl_steps.percentile(99), N.itl_steps.percentile(99), R.peak_running, N.peak_running, R.steps, N.steps);
    out.push_back(b);
    // Wall clock: one run each, so read small differences as noise.
    const Row* first = &rows[0];
    for (const Row& r : rows)
        if (r.m.wall_s < first->m.wall_s) first = &r;
    std::snprintf(b, sizeof b,
                  "wall clock on this machine (one run each; identical schedules differ by 10%% or more between runs here): all done after "
                  "%.2f s (newest), %.2f s (oldest), %.2f s (reserve), having computed %ld, %ld and %ld tokens; first done: %s",
                  N.wall_s, O.wall_s, R.wall_s, N.computed_tokens, O.computed_tokens, R.computed_tokens, first->policy->name);
    out.push_back(b);
    return out;
}

// Returns false (after saying why on stderr) when the file could not be written.
bool write_svg(const Options& o, const std::vector<Row>& rows) {
    svg::Chart a;
    const study::Setup& w = o.setup;
    a.title = "Completed requests vs engine steps (" + std::to_string(w.requests) + " x (" + std::to_string(w.prompt_len) + "+" +
              std::to_string(w.max_tokens) + ") tokens, " + std::to_string(w.num_blocks) + " blocks, max_num_seqs " +
              std::to_string(w.max_num_seqs) + ")";
    a.x_label = "engine steps";
    a.y_label = "completed requests";
    svg::Chart b = a;
    b.title = "The same runs against wall-clock time";
    b.x_label = "wall seconds";
    for (const Row& r : rows) {
        svg::Series s{r.policy->what, {0.0}, {0.0}};
        svg::Series t = s;
        s.steps = t.steps = true;
        s.markers = t.markers = false;
        for (size_t k = 0; k < r.m.done_step.size(); ++k) {
            s.x.push_back(r.m.done_step[k]);
            s.y.push_back((double)(k + 1));
            t.x.push_back(r.m.done_wall[k]);
            t.y.push_back((double)(k + 1));
        }
        a.series.push_back(s);
        b.series.push_back(t);
    }
    svg::Figure fig;
    fig.add(a);
    fig.add(b);
    std::string err;
    if (fig.write(o.svg_path, &err)) return true;
    std::fprintf(stderr, "victim_study: %s\n", err.c_str());
    return false;
}

}  // namespace

int run(int argc, char** argv) {
    const Options o = parse(argc, argv);
    const pkv::ModelAndTokenizer mt = pkv::load_model_and_tokenizer("", "");
    study::check_writable(o.svg_path);  // fail now, not after the runs
    const double load = study::load_average();  // before the runs; load_end after them

    std::vector<Row> rows;
    for (const Policy& p : kPolicies) {
        study::Setup s = o.setup;
        s.admission = p.admission;
        s.victim = p.victim;
        try {
            rows.push_back({&p, study::run(mt, s)});
        } catch (const std::exception& e) {
            std::fprintf(stderr, "victim_study: %s\n", e.what());
            return 1;
        }
    }
    const std::vector<std::string> conclusion = conclude(rows);
    const double load_end = study::load_average();
    const std::string warning = study::busy_warning(load, load_end);
    const bool svg_ok = write_svg(o, rows);

    if (o.json) {
        std::vector<std::string> jr, jc;
        for (const Row& r : rows) {
            std::vector<std::string> curve;
            for (double t : r.m.done_step) curve.push_back(std::to_string((long)t));
            study::Json j = study::measurement_json(r.m);
            j.str("policy", r.policy->name).str("admission", pkv::to_string(r.policy->admission));
            j.str("victim", pkv::to_string(r.policy->victim)).num("mean_completion_step", mean_done_step(r.m));
            for (double f : kCheckpoints) {
                char k[48];
                std::snprintf(k, sizeof k, "completed_at_%.0f_pct_of_newest_run", 100 * f);
                j.integer(k, r.m.completed_by_step(f * rows[0].m.steps));
            }
            jr.push_back(j.raw("completion_steps", study::Json::array(curve)).dump());
        }
        for (const std::string& c : conclusion) jc.push_back(study::Json::quote(c));
        std::printf("%s\n", study::Json()
                                .str("study", "victim_study")
                                .raw("workload", study::workload_json(o.setup, mt.name))
                                .integer("max_num_seqs", o.setup.max_num_seqs)
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
    std::printf("victim study: %d requests x (%d prompt + %d output tokens), all at once; KV cache %d blocks of %d; "
                "max_num_seqs %d; %s, %d CPU thread(s), load average %.1f at start, %.1f at end\n",
                w.requests, w.prompt_len, w.max_tokens, w.num_blocks, w.block_size, w.max_num_seqs, pkv::to_string(w.device),
                study::cpu_threads(), load, load_end);
    if (!warning.empty()) std::printf("%s\n\n", warning.c_str());
    std::printf("time in engine steps (deterministic) and in wall-clock ms (this machine, this run)\n\n");
    std::printf("%-8s %7s %18s %6s %7s %10s %8s %8s %8s %8s %8s %9s %8s %7s\n", "policy", "steps", "completed by step", "mean",
                "preempt", "recomputed", "e2e p99", "ITL p99", "ITL max", "e2e p99", "ITL p99", "useful", "peak", "wall");
    char hdr[64];
    std::snprintf(hdr, sizeof hdr, "%.0f/%.0f/%.0f", kCheckpoints[0] * rows[0].m.steps, kCheckpoints[1] * rows[0].m.steps,
                  kCheckpoints[2] * rows[0].m.steps);
    std::printf("%-8s %7s %18s %6s %7s %10s %8s %8s %8s %8s %8s %9s %8s %7s\n", "", "", hdr, "done", "", "tokens", "steps", "steps",
                "steps", "ms", "ms", "tok/s", "running", "s");
    for (const Row& r : rows) {
        const study::Measurement& m = r.m;
        char done[64];
        std::snprintf(done, sizeof done, "%d/%d/%d", m.completed_by_step(kCheckpoints[0] * rows[0].m.steps),
                      m.completed_by_step(kCheckpoints[1] * rows[0].m.steps), m.completed_by_step(kCheckpoints[2] * rows[0].m.steps));
        std::printf("%-8s %7.0f %18s %6.0f %7ld %10ld %8.0f %8.0f %8.0f %8.0f %8.2f %9.0f %8d %7.2f\n", r.policy->name, m.steps, done,
                    mean_done_step(m), m.preemptions, m.recomputed_tokens, m.e2e_steps.percentile(99), m.itl_steps.percentile(99),
                    m.itl_steps.percentile(100), 1e3 * m.e2e_wall.percentile(99), 1e3 * m.itl_wall.percentile(99),
                    m.useful_tok_per_s(), m.peak_running, m.wall_s);
    }
    std::printf("\n");
    for (const std::string& c : conclusion) std::printf("conclusion: %s\n", c.c_str());
    if (svg_ok) std::printf("\nchart: %s\n", o.svg_path.c_str());
    return svg_ok ? 0 : 1;
}

int main(int argc, char** argv) { return cli::guarded_main("victim_study", [&] { return run(argc, argv); }); }

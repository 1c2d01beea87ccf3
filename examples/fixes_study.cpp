// examples/fixes_study.cpp -- "the fixes, bluntest first" (TUTORIAL chapter 7),
// each run against the same overloaded baseline, in one table.
//
//   baseline             the study workload, requests arriving over time
//   cap concurrency      max_num_seqs down to what fits at its longest
//   cap generation       max_tokens halved: less work per request, so read
//                        useful tok/s and completions, not latency alone
//   more cache memory    twice the KV blocks (a stand-in for freeing or
//                        quantizing cache memory)
//   smaller kv_dtype     the baseline's cache bytes stored as int8: more
//                        blocks for the same memory
//   shed at the edge     max_waiting: reject new requests (retryable) while
//                        that many wait; rejections against the latency of
//                        the requests that were accepted
//
// Requests arrive over time, one every --arrival-interval steps, faster than
// the baseline can serve them, so a waiting queue builds up; that is what
// load shedding acts on (with every request arriving at once it would only
// cut the workload). Every figure is computed from the runs; latencies are
// reported in wall-clock ms and, where noted, in engine steps (exact and the
// same on every machine).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <string>
#include <vector>

#include "examples/cli.hpp"
#include "examples/svg.hpp"
#include "examples/legacy_study.hpp"

namespace {

// One request every 8 steps: all 48 arrive within 376 steps, about 3x faster
// than the baseline completes them (48 requests in ~1300 steps when they all
// arrive at once), so the queue builds up. Chosen once, not tuned.
constexpr int kArrivalInterval = 8;

struct Options {
    study::Setup setup = [] {
        study::Setup s = study::study_setup();
        s.arrival_interval = kArrivalInterval;
        return s;
    }();
    int cap_seqs = 0;                  // 0 = the most requests that fit the pool at their longest
    int cap_tokens = 0;                // 0 = half of max_tokens
    int more_blocks = 0;               // 0 = twice num_blocks
    std::vector<int> shed = {16, 4};   // max_waiting values
    int repeat = 1;
    std::string svg_path = "build/fixes_study.svg";
    bool json = false;
};

Options parse(int argc, char** argv) {
    Options o;
    cli::Parser p("fixes_study", "[options]",
                  "The fixes for thrash, bluntest first, each against the same overloaded baseline\n"
                  "(built-in model, requests arriving over time).");
    p.integer("--max-num-seqs", &o.setup.max_num_seqs, 1, 1 << 16, "baseline running requests at most");
    p.integer("--arrival-interval", &o.setup.arrival_interval, 0, 1 << 20, "steps between arrivals; 0 = all at once");
    p.integer("--cap-seqs", &o.cap_seqs, 0, 1 << 16, "the cap-concurrency row's max_num_seqs; 0 = the most requests that fit the pool at their longest");
    p.integer("--cap-tokens", &o.cap_tokens, 0, study::kMaxLen, "the cap-generation row's max_tokens; 0 = half of --max-tokens");
    p.integer("--more-blocks", &o.more_blocks, 0, study::kMaxBlocks, "the more-memory row's num_blocks; 0 = twice --num-blocks");
    p.int_list("--shed", &o.shed, 1, (int)study::kMaxRequests, 16, "max_waiting of the shedding rows");
    p.integer("--repeat", &o.repeat, 1, 100, "run each row N times, keep the fastest");
    study::add_workload_flags(p, o.setup);
    p.text("--svg", &o.svg_path, "PATH", "chart to write");
    p.flag("--json", &o.json, "one JSON object on stdout instead of the table");
    p.parse(argc, argv);
    study::check_workload(o.setup);
    const study::Setup& s = o.setup;
    // Defaults derived from the baseline, so they follow --num-blocks etc.
    // (each flag's range keeps these products far from overflow).
    const int blocks_at_longest = (int)pkv::blocks_for_tokens((int64_t)s.prompt_len + s.max_tokens, s.block_size);
    if (o.cap_seqs == 0) o.cap_seqs = std::max(1, s.num_blocks / blocks_at_longest);
    if (o.cap_tokens == 0) o.cap_tokens = std::max(1, s.max_tokens / 2);
    if (o.more_blocks == 0) o.more_blocks = 2 * s.num_blocks;
    return o;
}

struct Row {
    std::string key;     // for --json
    std::string name;    // table
    std::string label;   // chart, '\n' breaks lines
    bool measured = true;
    std::string note;    // for a row that is not measured
    study::Setup setup;
    study::Measurement m;
};

// The rows, bluntest first. Each changes one thing of the baseline.
std::vector<Row> plan(const Options& o, const pkv::Config& model) {
    const study::Setup& b = o.setup;
    std::vector<Row> rows;
    rows.push_back({"baseline", "baseline", "baseline", true, "", b, {}});
    {
        study::Setup s = b;
        s.max_num_seqs = o.cap_seqs;
        rows.push_back({"cap_concurrency", "max_num_seqs " + std::to_string(o.cap_seqs),
                        "cap seqs\n= " + std::to_string(o.cap_seqs), true, "", s, {}});
    }
    {
        study::Setup s = b;
        s.max_tokens = o.cap_tokens;
        rows.push_back({"cap_generation", "max_tokens " + std::to_string(o.cap_tokens),
                        "cap tokens\n= " + std::to_string(o.cap_tokens), true, "", s, {}});
    }
    {
        study::Setup s = b;
        s.num_blocks = o.more_blocks;
        rows.push_back({"more_memory", "num_blocks " + std::to_string(o.more_blocks),
                        "blocks\n= " + std::to_string(o.more_blocks), true, "", s, {}});
    }
    // A smaller cache dtype at the baseline's memory: the same bytes as the
    // baseline's f32 blocks, stored as int8 (plus a scale per token and KV
    // head), so the pool gets more blocks; what that costs in accuracy is
    // examples/kv_dtype_study's table.
    {
        study::Setup s = b;
        const pkv::KVGeometry f32{model.n_layers, 1, b.block_size, model.n_kv_heads, model.head_dim()};
        s.kv_dtype = pkv::KVDtype::kInt8;
        s.kv_cache_mb = (double)b.num_blocks * f32.bytes_per_block() / 1048576.0;
        rows.push_back({"kv_dtype_int8", "int8, same bytes", "int8\nsame bytes", true, "", s, {}});
    }
    for (int w : o.shed) {
        study::Setup s = b;
        s.max_waiting = w;
        rows.push_back({"shed_max_waiting_" + std::to_string(w), "max_waiting " + std::to_string(w),
                        "max_waiting\n= " + std::to_string(w), true, "", s, {}});
    }
    return rows;
}

double pct_change(double from, double to) { return from != 0 ? 100.0 * (to - from) / from : 0.0; }

std::vector<std::string> conclude(const std::vector<Row>& rows) {
    std::vector<std::string> out;
    bool any_done = false;
    for (const Row& r : rows) any_done = any_done || r.m.finished > 0;
    if (!any_done) return {"no request completed in any run (every one was rejected: its prompt cannot fit max_model_len), so there is nothing to compare"};
    char b[700];
    const Row& B = rows[0];
    const study::Measurement& bm = B.m;
    for (size_t i = 1; i < rows.size(); ++i) {
        const Row& r = rows[i];
        if (!r.measured) {
            out.push_back(r.name + ": " + r.note);
            continue;
        }
        const study::Measurement& m = r.m;
        std::snprintf(b, sizeof b,
                      "%s: preemptions %ld -> %ld, recomputed %ld -> %ld tokens; useful tok/s %+.0f%%; ITL p99 %.1f -> %.1f ms "
                      "(%.0f -> %.0f steps); e2e p99 %.0f -> %.0f steps",
                      r.name.c_str(), bm.preemptions, m.preemptions, bm.recomputed_tokens, m.recomputed_tokens,
                      pct_change(bm.useful_tok_per_s(), m.useful_tok_per_s()), 1e3 * bm.itl_wall.percentile(99),
                      1e3 * m.itl_wall.percentile(99), bm.itl_steps.percentile(99), m.itl_steps.percentile(99),
                      bm.e2e_steps.percentile(99), m.e2e_steps.percentile(99));
        std::string line = b;
        if (r.setup.max_tokens != B.setup.max_tokens) {
            std::snprintf(b, sizeof b, "; but every request got %d of its %d tokens: %ld useful tokens in all against %ld",
                          r.setup.max_tokens, B.setup.max_tokens, m.useful_tokens, bm.useful_tokens);
            line += b;
        }
        if (r.setup.max_waiting != B.setup.max_waiting) {
            std::snprintf(b, sizeof b, "; %d of %d requests rejected (retryable), %d served", m.rejected, m.requests, m.finished);
            line += b;
        }
        out.push_back(line);
    }
    // Among the rows that deliver every request in full, which did best?
    // (Ties are all named: several rows may share an ITL p99 of 1 step.)
    double best_tput = -1, best_itl = 1e300;
    for (const Row& r : rows) {
        if (!r.measured || r.m.finished != r.m.requests || r.setup.max_tokens != B.setup.max_tokens) continue;
        best_tput = std::max(best_tput, r.m.useful_tok_per_s());
        best_itl = std::min(best_itl, r.m.itl_steps.percentile(99));
    }
    if (best_tput >= 0) {
        std::string tput_names, itl_names;
        for (const Row& r : rows) {
            if (!r.measured || r.m.finished != r.m.requests || r.setup.max_tokens != B.setup.max_tokens) continue;
            if (r.m.useful_tok_per_s() == best_tput) tput_names += (tput_names.empty() ? "" : " / ") + r.name;
            if (r.m.itl_steps.percentile(99) == best_itl) itl_names += (itl_names.empty() ? "" : " / ") + r.name;
        }
        std::snprintf(b, sizeof b,
                      "of the rows that serve every request in full: highest useful tok/s %s (%.0f); lowest ITL p99 %s (%.0f step%s)",
                      tput_names.c_str(), best_tput, itl_names.c_str(), best_itl, best_itl == 1 ? "" : "s");
        out.push_back(b);
    }
    return out;
}

// Returns false (after saying why on stderr) when the file could not be written.
bool write_svg(const Options& o, const std::vector<Row>& rows) {
    const double nan = std::numeric_limits<double>::quiet_NaN();
    svg::Chart a;
    a.kind = svg::Chart::Kind::kBar;
    const study::Setup& w = o.setup;
    a.title = "Useful throughput per fix (" + std::to_string(w.requests) + " requests x (" + std::to_string(w.prompt_len) + "+" +
              std::to_string(w.max_tokens) + "), one every " + std::to_string(w.arrival_interval) + " steps, " +
              std::to_string(w.num_blocks) + " blocks)";
    a.y_label = "useful tok/s (wall clock)";
    svg::Series tput{"useful tok/s", {}, {}};
    svg::Series itl_ms{"ITL p99 (ms)", {}, {}};
    svg::Series e2e{"e2e p99 (steps)", {}, {}};
    svg::Series done{"completed", {}, {}};
    svg::Series rej{"rejected", {}, {}};
    for (const Row& r : rows) {
        a.categories.push_back(r.label);
        tput.y.push_back(r.measured ? r.m.useful_tok_per_s() : nan);
        itl_ms.y.push_back(r.measured ? 1e3 * r.m.itl_wall.percentile(99) : nan);
        e2e.y.push_back(r.measured ? r.m.e2e_steps.percentile(99) : nan);
        done.y.push_back(r.measured ? (double)r.m.finished : nan);
        rej.y.push_back(r.measured ? (double)r.m.rejected : nan);
    }
    a.series = {tput};
    svg::Chart b = a;
    b.title = "Inter-token latency p99 per fix (wall clock)";
    b.y_label = "milliseconds";
    b.series = {itl_ms};
    svg::Chart c = a;
    c.title = "End-to-end latency p99 of the accepted requests (engine steps)";
    c.y_label = "engine steps";
    c.series = {e2e};
    svg::Chart d = a;
    d.title = "Requests completed and rejected (of " + std::to_string(w.requests) + ")";
    d.y_label = "requests";
    d.series = {done, rej};
    svg::Figure fig(900);
    fig.add(a);
    fig.add(b);
    fig.add(c);
    fig.add(d);
    std::string err;
    if (fig.write(o.svg_path, &err)) return true;
    std::fprintf(stderr, "fixes_study: %s\n", err.c_str());
    return false;
}

}  // namespace

int run(int argc, char** argv) {
    const Options o = parse(argc, argv);
    const pkv::ModelAndTokenizer mt = pkv::load_model_and_tokenizer("", "");
    study::check_writable(o.svg_path);  // fail now, not after the runs
    const double load = study::load_average();  // before the runs; load_end after them

    std::vector<Row> rows = plan(o, mt.model.cfg);
    for (Row& r : rows) {
        if (!r.measured) continue;
        for (int k = 0; k < o.repeat; ++k) {
            study::Measurement m;
            try {
                m = study::run(mt, r.setup);
            } catch (const std::exception& e) {
                std::fprintf(stderr, "fixes_study: %s: %s\n", r.name.c_str(), e.what());
                return 1;
            }
            // Scheduling is deterministic; repeats differ only in timing.
            if (k == 0 || m.wall_s < r.m.wall_s) r.m = std::move(m);
        }
    }
    const std::vector<std::string> conclusion = conclude(rows);
    const double load_end = study::load_average();
    const std::string warning = study::busy_warning(load, load_end);
    const bool svg_ok = write_svg(o, rows);

    if (o.json) {
        std::vector<std::string> jr, jc;
        for (const Row& r : rows) {
            study::Json j = r.measured ? study::measurement_json(r.m) : study::Json();
            j.str("fix", r.key).str("name", r.name).boolean("measured", r.measured);
            if (!r.measured) j.str("note", r.note);
            j.integer("max_num_seqs", r.setup.max_num_seqs).integer("max_tokens", r.setup.max_tokens);
            j.integer("num_blocks", r.setup.num_blocks).integer("max_waiting", r.setup.max_waiting);
            jr.push_back(j.dump());
        }
        for (const std::string& c : conclusion) jc.push_back(study::Json::quote(c));
        std::printf("%s\n", study::Json()
                                .str("study", "fixes_study")
                                .raw("workload", study::workload_json(o.setup, mt.name))
                                .integer("max_num_seqs", o.setup.max_num_seqs)
                                .integer("arrival_interval_steps", o.setup.arrival_interval)
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
    std::printf("fixes study: %d requests x (%d prompt + %d output tokens), one every %d steps; KV cache %d blocks of %d; "
                "max_num_seqs %d; %s, %d CPU thread(s), load average %.1f at start, %.1f at end%s\n\n",
                w.requests, w.prompt_len, w.max_tokens, w.arrival_interval, w.num_blocks, w.block_size, w.max_num_seqs,
                pkv::to_string(w.device), study::cpu_threads(), load, load_end,
                o.repeat > 1 ? (", fastest of " + std::to_string(o.repeat) + " runs per row").c_str() : "");
    if (!warning.empty()) std::printf("%s\n\n", warning.c_str());
    std::printf("%-19s %5s %5s %8s %7s %10s %8s %8s %8s %8s %8s %7s %6s %6s\n", "fix", "done", "rej", "useful", "preempt",
                "recomputed", "ITL p99", "ITL p99", "ITL max", "e2e p99", "e2e p99", "peak", "steps", "wall");
    std::printf("%-19s %5s %5s %8s %7s %10s %8s %8s %8s %8s %8s %7s %6s %6s\n", "", "", "", "tok/s", "", "tokens", "ms", "steps",
                "steps", "ms", "steps", "waiting", "", "s");
    for (const Row& r : rows) {
        if (!r.measured) {
            std::printf("%-19s %s\n", r.name.c_str(), r.note.c_str());
            continue;
        }
        const study::Measurement& m = r.m;
        std::printf("%-19s %5d %5d %8.0f %7ld %10ld %8.1f %8.0f %8.0f %8.0f %8.0f %7d %6.0f %6.2f\n", r.name.c_str(), m.finished,
                    m.rejected, m.useful_tok_per_s(), m.preemptions, m.recomputed_tokens, 1e3 * m.itl_wall.percentile(99),
                    m.itl_steps.percentile(99), m.itl_steps.percentile(100), 1e3 * m.e2e_wall.percentile(99),
                    m.e2e_steps.percentile(99), m.peak_waiting, m.steps, m.wall_s);
    }
    std::printf("\n");
    for (const std::string& c : conclusion) std::printf("conclusion: %s\n", c.c_str());
    if (svg_ok) std::printf("\nchart: %s\n", o.svg_path.c_str());
    return svg_ok ? 0 : 1;
}

int main(int argc, char** argv) { return cli::guarded_main("fixes_study", [&] { return run(argc, argv); }); }

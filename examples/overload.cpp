// examples/overload.cpp -- what `make run` runs: many requests, a KV cache that
// is deliberately too small for them, and everything that follows.
//
// All requests arrive at once. Admission bets on their prompts; as they grow
// the free list drains, the newest running request is preempted, its stream
// pauses, and later it comes back and recomputes prompt + outputs. Every
// request still finishes. The output shows it three ways:
//   1. lanes: one line per engine step, one column per request
//        p prefill chunk    . token emitted    X preempted this step
//        ~ paused (waiting after preemption)   R resumed: recompute started
//        $ finished         (blank: not admitted yet, or done)
//   2. the streams of a few preempted requests as a client read them, with the
//      pause marked where it happened;
//   3. the metrics table, with the signals: preemptions, recomputed tokens,
//      KV-cache usage, inter-token latency p99 against the median.
//
// --json prints one JSON object instead (every request and the metrics).
// --view FILE.html records the run, step by step, as one page that opens in
// a browser (examples/recorder.hpp, examples/viewer/); --trace FILE.json as
// a trace that Perfetto opens. Both are off unless asked: then nothing is
// recorded and the engine runs exactly as without them.
//
// The program, top to bottom: the options; Streams, what each client saw
// (fed by the engine's events); the lane chart; the run; and the three
// reports. run() at the bottom reads as the list of those steps.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "engine.hpp"
#include "examples/cli.hpp"
#include "examples/recorder.hpp"
#include "examples/trace.hpp"
#include "examples/viewer_page.hpp"
#include "examples/workload.hpp"
#include "tiny_model/builtin.hpp"
#include "tiny_model/tokenizer.hpp"

namespace {

using workload::Json;

// ============================================================================
// The options: the engine's and the workload's knobs (workload::Setup,
// examples/workload.hpp, with this demo's defaults), and this program's own.
// ============================================================================

struct Options : workload::Setup {
    std::string checkpoint, tokenizer, gpu = "h200";
    std::string view_path, trace_path;  // --view, --trace: "" = no recording
    bool json = false, no_lanes = false;
    Options() { swap_space_blocks = 64; }
};

Options parse(int argc, char** argv) {
    Options o;
    cli::Parser p("overload", "[checkpoint.bin -z tokenizer.bin] [options]",
                  "Many requests, all arriving at once, on a deliberately small KV cache (built-in model by default).");
    p.positional(&o.checkpoint, "checkpoint");
    p.text("-z", &o.tokenizer, "FILE", "tokenizer for a checkpoint");
    workload::add_workload_flags(p, o);
    workload::add_engine_flags(p, o);
    std::vector<std::pair<std::string, std::string>> gpus;
    for (const auto& g : pkv::gpu_presets()) gpus.push_back({g.name, g.name});
    p.choice("--gpu", &o.gpu, gpus, "the GPU --device sim simulates (cost_model.hpp); this model's own shape and f32 weights");
    p.real("--temperature", &o.temperature, 0, 100, "0 = greedy; sampling is seeded per request");
    p.real("--log-interval", &o.log_interval, 0, 3600, "seconds between vLLM-style INFO lines on stderr; 0 = off");
    p.flag("--no-lanes", &o.no_lanes, "skip the per-step lanes");
    p.flag("--json", &o.json, "one JSON object on stdout (requests + metrics), nothing else");
    p.text("--view", &o.view_path, "FILE.html", "record the run step by step into one HTML page that opens offline in a browser (make view)");
    p.text("--trace", &o.trace_path, "FILE.json", "record the run as a trace in Chrome's Trace Event Format (ui.perfetto.dev opens it)");
    p.parse(argc, argv);
    if (!o.tokenizer.empty() && o.checkpoint.empty()) cli::bad_usage("-z needs a checkpoint: the built-in model has its own vocabulary");
    workload::check_workload(o);
    return o;
}

// ============================================================================
// What each client saw, fed by the engine's events
// ============================================================================

// Per request: its stream as a client collected it (text, with the pause
// marked), and this step's symbol in the lane chart.
struct Streams {
    const pkv::Tokenizer& tok;
    std::vector<std::string> text;  // [requests] rendered stream, with pause markers
    std::vector<int> prev_token;    // [requests] the token before the next one, for rendering
    std::vector<char> lane;         // [requests] this step's symbol
    std::vector<char> paused;       // [requests] preempted and not resumed yet
    std::vector<long> preempted_at; // [requests] the step of its latest preemption
    long step = 0;                  // the step the engine is running

    Streams(const pkv::Tokenizer& t, int n)
        : tok(t), text((size_t)n), prev_token((size_t)n, -1), lane((size_t)n, ' '), paused((size_t)n, 0), preempted_at((size_t)n, -1) {}

    // Before a step: a running request shows 'p' until it emits a token
    // (then '.'), a paused one '~'.
    void start_step(pkv::Engine& eng) {
        ++step;
        for (size_t i = 0; i < lane.size(); ++i)
            lane[i] = eng.request((int)i)->state == pkv::RequestState::kRunning ? 'p' : (paused[i] ? '~' : ' ');
    }

    void on_event(const pkv::StreamEvent& e) {
        const size_t id = (size_t)e.request_id;
        if (id >= lane.size()) return;
        switch (e.type) {
            case pkv::EventType::kToken:
                text[id] += tok.render(prev_token[id], e.token);
                prev_token[id] = e.token;
                if (lane[id] != 'R') lane[id] = '.';
                break;
            case pkv::EventType::kPreempted:
                lane[id] = 'X';
                paused[id] = 1;
                preempted_at[id] = step;
                break;
            case pkv::EventType::kResumed:
                lane[id] = 'R';
                paused[id] = 0;
                text[id] += " [paused: preempted at step " + std::to_string(preempted_at[id]) + ", resumed at step " +
                            std::to_string(step) + "]";
                break;
            case pkv::EventType::kFinished: lane[id] = '$'; break;
            case pkv::EventType::kRejected: break;
        }
    }
};

// ============================================================================
// The lane chart: one line per step; steps that look exactly like the one
// before are folded into a count
// ============================================================================

class LaneChart {
public:
    explicit LaneChart(int requests) {
        std::printf("lanes: p prefill  . token  X preempted  ~ paused  R resumed (recompute)  $ finished\n");
        std::printf("%5s %4s %4s %4s  ", "step", "kv%", "run", "wait");
        for (int i = 0; i < requests; ++i) std::printf("%d", i / 10 % 10);
        std::printf("\n%5s %4s %4s %4s  ", "", "", "", "");
        for (int i = 0; i < requests; ++i) std::printf("%d", i % 10);
        std::printf("\n");
    }
    void row(long step, const pkv::Metrics& m, const std::vector<char>& lane) {
        std::string r(lane.begin(), lane.end());
        if (r == last_) { ++repeats_; return; }
        flush();
        std::printf("%5ld %3.0f%% %4d %4d  %s\n", step, 100 * m.kv_cache_usage_perc, m.num_requests_running, m.num_requests_waiting,
                    r.c_str());
        last_ = r;
    }
    void flush() {
        if (repeats_ > 0) std::printf("%5s  ... the same for %ld more step%s\n", "", repeats_, repeats_ == 1 ? "" : "s");
        repeats_ = 0;
    }

private:
    std::string last_;
    long repeats_ = 0;
};

// ============================================================================
// The run, and the three reports
// ============================================================================

// Steps until every request is done; returns the seconds it took (modelled
// ones on the simulated GPU). A recorder, when there is one, records each step.
double run_steps(pkv::Engine& eng, Streams& streams, LaneChart* chart, const pkv::VirtualClock* sim_clock, viewer::Recorder* rec) {
    const auto t0 = std::chrono::steady_clock::now();
    while (eng.has_unfinished()) {
        streams.start_step(eng);
        eng.step();
        if (rec) rec->end_step();
        if (chart) chart->row(streams.step, eng.metrics(), streams.lane);
    }
    if (chart) chart->flush();
    return sim_clock ? sim_clock->t : std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// The swap counters of a lab policy that swaps (lab/swap.hpp); zeros otherwise.
pkv::SwapStats swap_stats(const pkv::Engine& eng) {
    const pkv::LabPolicy* lab = pkv::lab_policy(eng.scheduler());
    return lab ? lab->stats() : pkv::SwapStats{};
}

// --json: the configuration, every request (prompt, output, how it ended)
// and the metrics, as one object.
void print_json(pkv::Engine& eng, const Options& opt, const std::string& model_name, const std::vector<std::vector<int32_t>>& prompts,
                double wall) {
    auto ints = [](const std::vector<int32_t>& v) {
        std::vector<std::string> s;
        for (int32_t x : v) s.push_back(std::to_string(x));
        return Json::array(s);
    };
    Json config;
    config.str("model", model_name).integer("num_blocks", opt.num_blocks).integer("block_size", opt.block_size)
        .integer("requests", opt.requests).integer("max_num_seqs", opt.max_num_seqs)
        .integer("max_num_batched_tokens", opt.max_num_batched_tokens).integer("max_tokens", opt.max_tokens)
        .integer("prompt_len", opt.prompt_len).integer("max_model_len", eng.config().sched.max_model_len)
        .boolean("prefix_caching", opt.prefix_caching).str("admission", pkv::to_string(opt.policy.admission))
        .integer("max_waiting", opt.policy.max_waiting).integer("seed", (long)opt.seed);
    std::vector<std::string> requests;
    for (int i = 0; i < opt.requests; ++i) {
        const pkv::Request* r = eng.request(i);
        Json j;
        j.integer("id", i).raw("prompt", ints(prompts[(size_t)i]))
            .raw("output", ints(std::vector<int32_t>(r->tokens.begin() + r->num_prompt_tokens, r->tokens.end())))
            .str("finish_reason", pkv::to_string(r->finish_reason)).str("reject_reason", r->reject_reason)
            .integer("preemptions", r->num_preemptions);
        requests.push_back(j.dump());
    }
    const pkv::Metrics& m = eng.metrics();
    const pkv::SwapStats sw = swap_stats(eng);
    Json mj;
    mj.integer("num_preemptions_total", m.num_preemptions_total).integer("generation_tokens_total", m.generation_tokens_total)
        .integer("prompt_tokens_total", m.prompt_tokens_total).integer("recomputed_tokens_total", m.recomputed_tokens_total)
        .integer("swap_outs", sw.num_swap_outs).integer("swap_ins", sw.num_swap_ins).integer("swap_out_bytes", sw.bytes_out)
        .integer("swap_in_bytes", sw.bytes_in).integer("swap_fallbacks", sw.num_swap_fallbacks)
        .integer("computed_tokens_total", m.computed_tokens_total).integer("prefix_cache_queries", m.prefix_cache_queries)
        .integer("prefix_cache_hits", m.prefix_cache_hits).integer("num_requests_finished", m.num_requests_finished)
        .integer("num_requests_rejected", m.num_requests_rejected).integer("num_steps", m.num_steps)
        .num("max_kv_cache_usage_perc", m.max_kv_cache_usage_perc).num("itl_p50_s", m.inter_token_latency.percentile(50))
        .num("itl_p90_s", m.inter_token_latency.percentile(90)).num("itl_p99_s", m.inter_token_latency.percentile(99))
        .num("ttft_p50_s", m.time_to_first_token.percentile(50)).num("ttft_p99_s", m.time_to_first_token.percentile(99))
        .num("e2e_p50_s", m.e2e_request_latency.percentile(50)).num("e2e_p99_s", m.e2e_request_latency.percentile(99))
        .num("wall_s", wall);
    std::printf("%s\n", Json().raw("config", config.dump()).raw("requests", Json::array(requests)).raw("metrics", mj.dump()).dump().c_str());
}

// A few streams as the client saw them: one unbroken text, one pause.
void print_streams(pkv::Engine& eng, const Streams& streams, bool sim) {
    int shown = 0;
    std::printf("\nwhat a client streaming a preempted request saw (the text never breaks; it pauses):\n");
    if (sim) std::printf("  (the simulated GPU computes no logits: its tokens are hashed ids, so the text is noise)\n");
    for (size_t i = 0; i < streams.text.size() && shown < 3; ++i) {
        const pkv::Request* r = eng.request((int)i);
        if (r->num_preemptions == 0) continue;
        std::printf("  request %zu (%d preemption%s): %s\n", i, r->num_preemptions, r->num_preemptions == 1 ? "" : "s",
                    streams.text[i].c_str());
        ++shown;
    }
    if (shown == 0) std::printf("  (no request was preempted in this run)\n");
}

// The metrics table: the signals of TUTORIAL chapter 6.
void print_metrics(pkv::Engine& eng, const Options& opt, double wall, bool sim) {
    const pkv::Metrics& m = eng.metrics();
    int finished = 0, preempted_reqs = 0, max_pre = 0;
    for (int i = 0; i < opt.requests; ++i) {
        const pkv::Request* r = eng.request(i);
        finished += r->finished() && r->finish_reason != pkv::FinishReason::kRejected;
        preempted_reqs += r->num_preemptions > 0;
        max_pre = std::max(max_pre, r->num_preemptions);
    }
    const auto& itl = m.inter_token_latency;
    if (sim) std::printf("\nmetrics (simulated time on %s: every duration below is modelled, not measured):\n", opt.gpu.c_str());
    else std::printf("\nmetrics (wall clock, %d CPU thread(s)):\n", opt.math == pkv::MathPath::kFast ? workload::cpu_threads() : 1);
    std::printf("  requests                 %d finished, %ld rejected, of %d\n", finished, m.num_requests_rejected, opt.requests);
    std::printf("  num_preemptions_total    %ld  (%d requests preempted at least once, at most %d times)\n", m.num_preemptions_total,
                preempted_reqs, max_pre);
    std::printf("  useful output tokens     %ld\n", m.generation_tokens_total);
    std::printf("  recomputed tokens        %ld  (%.0f%% of the useful output: work done twice)\n", m.recomputed_tokens_total,
                m.generation_tokens_total ? 100.0 * m.recomputed_tokens_total / m.generation_tokens_total : 0.0);
    if (opt.policy.preemption == pkv::Preemption::kSwap) {
        const pkv::SwapStats sw = swap_stats(eng);
        std::printf("  swap                     %ld out, %ld in, %.2f MB out + %.2f MB in, %ld fallbacks to recompute (swap space %d blocks)\n",
                    sw.num_swap_outs, sw.num_swap_ins, sw.bytes_out / 1e6, sw.bytes_in / 1e6, sw.num_swap_fallbacks, opt.swap_space_blocks);
    }
    std::printf("  tokens through the model %ld  (prompt %ld + decode + recompute)\n", m.computed_tokens_total, m.prompt_tokens_total);
    std::printf("  kv_cache_usage_perc      peak %.0f%%\n", 100 * m.max_kv_cache_usage_perc);
    if (opt.prefix_caching)
        std::printf("  prefix cache             %ld hit of %ld queried tokens (%.0f%%)\n", m.prefix_cache_hits, m.prefix_cache_queries,
                    m.prefix_cache_queries ? 100.0 * m.prefix_cache_hits / m.prefix_cache_queries : 0.0);
    std::printf("  inter-token latency      p50 %.2f ms  p90 %.2f ms  p99 %.2f ms  max %.2f ms  (p99 = %.1fx p50)\n",
                1e3 * itl.percentile(50), 1e3 * itl.percentile(90), 1e3 * itl.percentile(99), 1e3 * itl.percentile(100),
                itl.percentile(50) > 0 ? itl.percentile(99) / itl.percentile(50) : 0.0);
    std::printf("  time to first token      p50 %.1f ms  p99 %.1f ms\n", 1e3 * m.time_to_first_token.percentile(50),
                1e3 * m.time_to_first_token.percentile(99));
    std::printf("  end-to-end latency       p50 %.1f ms  p99 %.1f ms\n", 1e3 * m.e2e_request_latency.percentile(50),
                1e3 * m.e2e_request_latency.percentile(99));
    std::printf("  throughput               %.0f useful tok/s, %.0f processed tok/s, %ld steps in %.2f s (%s)\n",
                m.generation_tokens_total / wall, m.computed_tokens_total / wall, m.num_steps, wall, pkv::to_string(opt.device));
}

// On the kernel path: the same workload on the CPU, for the figure beside it,
// and a check: the tokens must be the same (greedy argmax of float32 logits
// could only differ on a near-tie, which this would report).
void compare_with_cpu(pkv::Engine& eng, const Options& opt, const pkv::ModelAndTokenizer& mt, double wall) {
    const std::unique_ptr<pkv::Engine> engine = workload::make_engine(opt, pkv::make_model_runner(pkv::Device::kCpu, mt.model, opt.math));
    pkv::Engine& cpu = *engine;
    workload::add_workload(cpu, mt.tok, opt);
    const auto c0 = std::chrono::steady_clock::now();
    cpu.run_until_done();
    const double cpu_wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - c0).count();
    int same = 0;
    for (int i = 0; i < opt.requests; ++i) same += cpu.request(i)->tokens == eng.request(i)->tokens;
    const double tok_s = eng.metrics().generation_tokens_total / wall, cpu_tok_s = cpu.metrics().generation_tokens_total / cpu_wall;
    std::printf("  same workload on cpu     %.0f useful tok/s (%s is %.3gx the CPU); %d of %d requests token-identical\n", cpu_tok_s,
                pkv::to_string(opt.device), tok_s / cpu_tok_s, same, opt.requests);
}

// --view, --trace: a recorder on the engine, attached before the requests
// arrive (a rejection is recorded too); none when neither is asked for.
// Every file problem shows now, before the run.
std::unique_ptr<viewer::Recorder> make_recorder(pkv::Engine& eng, const Options& opt, const pkv::ModelAndTokenizer& mt) {
    if (opt.view_path.empty() && opt.trace_path.empty()) return nullptr;
    if (!opt.view_path.empty()) {
        if (eng.config().num_blocks > viewer::kMaxPageBlocks)
            cli::bad_usage("--view draws every block of the pool: at most " + std::to_string(viewer::kMaxPageBlocks) + ", and this one has " +
                           std::to_string(eng.config().num_blocks) + " (lower --num-blocks or --kv-cache-mb; --trace has no limit)");
        viewer::embedded_page();  // (throws if this build has no page)
        workload::check_writable(opt.view_path);
    }
    if (!opt.trace_path.empty()) workload::check_writable(opt.trace_path);
    viewer::RunInfo info;
    info.model = mt.name;
    info.device = pkv::to_string(opt.device);
    info.workload = std::to_string(opt.requests) + " requests x (" + std::to_string(opt.prompt_len) + " prompt + " +
                    std::to_string(opt.max_tokens) + " output tokens), all arriving at once";
    info.victim = pkv::to_string(opt.policy.victim);
    info.preemption = pkv::to_string(opt.policy.preemption);
    info.admission = pkv::to_string(opt.policy.admission);
    auto rec = std::make_unique<viewer::Recorder>(mt.tok, info, /*keep=*/true);
    rec->attach(eng);
    return rec;
}

// The recording, written out. What was written goes to stderr: stdout may
// be --json's.
void write_recording(const viewer::Recorder& rec, const Options& opt) {
    std::fflush(stdout);  // (the report first, on a terminal or in a pipe)
    if (!opt.view_path.empty()) {
        const std::string page = viewer::page(viewer::embedded_page(), rec.page_data());
        viewer::write_file(opt.view_path, page);
        std::fprintf(stderr, "overload: wrote %s (%ld steps, %zu KiB): open it in a browser, offline (keys: arrows, space, p)\n",
                     opt.view_path.c_str(), rec.num_records(), page.size() / 1024);
    }
    if (!opt.trace_path.empty()) {
        viewer::write_file(opt.trace_path, viewer::trace(rec));
        std::fprintf(stderr, "overload: wrote %s: open it at ui.perfetto.dev (Open trace file) or chrome://tracing\n", opt.trace_path.c_str());
    }
}

int run(int argc, char** argv) {
    const Options opt = parse(argc, argv);
    const pkv::ModelAndTokenizer mt = pkv::load_model_and_tokenizer(opt.checkpoint, opt.tokenizer);
    // A bad size or a device this build cannot run throws here, with a message
    // that says what to change; guarded_main prints it. On the simulated GPU
    // time is modelled: the engine's clock moves only by the step durations.
    const bool sim = opt.device == pkv::Device::kSim;
    pkv::VirtualClock sim_clock;
    pkv::SimOptions sim_opts;
    sim_opts.gpu = opt.gpu;
    sim_opts.clock = &sim_clock;
    const std::unique_ptr<pkv::Engine> engine =
        workload::make_engine(opt, pkv::make_model_runner(opt.device, mt.model, opt.math, sim_opts), sim ? &sim_clock : nullptr);
    pkv::Engine& eng = *engine;
    const bool show = !opt.json;
    if (show) {
        std::printf("model: %s (dim %d, %d layers, vocab %d)\n", mt.name.c_str(), mt.model.cfg.dim, mt.model.cfg.n_layers,
                    mt.model.cfg.vocab_size);
        std::printf("%s\n", workload::startup_summary(eng).c_str());
        std::printf("workload: %d requests x (%d prompt + %d output tokens), max_num_seqs %d, admission %s, prefix caching %s\n\n",
                    opt.requests, opt.prompt_len, opt.max_tokens, opt.max_num_seqs, pkv::to_string(opt.policy.admission),
                    opt.prefix_caching ? "on" : "off");
        // The periodic log goes to stderr, and only when asked (--log-interval):
        // on a terminal it would land between the lanes.
        eng.on_log = [](const std::string& line) { std::fprintf(stderr, "INFO %s\n", line.c_str()); };
    }
    Streams streams(mt.tok, opt.requests);
    eng.on_event = [&](const pkv::StreamEvent& e) { streams.on_event(e); };
    const std::unique_ptr<viewer::Recorder> rec = make_recorder(eng, opt, mt);

    const std::vector<std::vector<int32_t>> prompts = workload::add_workload(eng, mt.tok, opt);
    for (int i = 0; i < opt.requests; ++i) {
        streams.prev_token[(size_t)i] = prompts[(size_t)i].back();
        if (show && eng.request(i)->finish_reason == pkv::FinishReason::kRejected)
            std::printf("request %d rejected: %s\n", i, eng.request(i)->reject_reason.c_str());
    }
    std::unique_ptr<LaneChart> chart = show && !opt.no_lanes ? std::make_unique<LaneChart>(opt.requests) : nullptr;
    const double wall = run_steps(eng, streams, chart.get(), sim ? &sim_clock : nullptr, rec.get());
    if (opt.json) {
        print_json(eng, opt, mt.name, prompts, wall);
    } else {
        print_streams(eng, streams, sim);
        print_metrics(eng, opt, wall, sim);
        if (opt.device != pkv::Device::kCpu && !sim) compare_with_cpu(eng, opt, mt, wall);
    }
    if (rec) write_recording(*rec, opt);  // last: where the files went is the last thing said
    return 0;
}

}  // namespace

int main(int argc, char** argv) { return cli::guarded_main("overload", [&] { return run(argc, argv); }); }

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
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "engine.hpp"
#include "examples/cli.hpp"
#include "examples/workload.hpp"
#include "tiny_model/builtin.hpp"
#include "tiny_model/tokenizer.hpp"

namespace {

// The engine and workload knobs live in study::Setup (examples/workload.hpp),
// with this demo's defaults; we add what only this program has.
struct Options : study::Setup {
    std::string checkpoint, tokenizer, gpu = "h200";
    bool json = false, no_lanes = false;
    Options() { swap_space_blocks = 64; }
};

Options parse(int argc, char** argv) {
    Options o;
    cli::Parser p("overload", "[checkpoint.bin -z tokenizer.bin] [options]",
                  "Many requests, all arriving at once, on a deliberately small KV cache (built-in model by default).");
    p.positional(&o.checkpoint, "checkpoint");
    p.text("-z", &o.tokenizer, "FILE", "tokenizer for a checkpoint");
    study::add_workload_flags(p, o);
    study::add_engine_flags(p, o);
    std::vector<std::pair<std::string, std::string>> gpus;
    for (const auto& g : pkv::gpu_presets()) gpus.push_back({g.name, g.name});
    p.choice("--gpu", &o.gpu, gpus, "the GPU --device sim simulates (cost_model.hpp); this model's own shape and f32 weights");
    p.real("--temperature", &o.temperature, 0, 100, "0 = greedy; sampling is seeded per request");
    p.real("--log-interval", &o.log_interval, 0, 3600, "seconds between vLLM-style INFO lines on stderr; 0 = off");
    p.flag("--no-lanes", &o.no_lanes, "skip the per-step lanes");
    p.flag("--json", &o.json, "one JSON object on stdout (requests + metrics), nothing else");
    p.parse(argc, argv);
    if (!o.tokenizer.empty() && o.checkpoint.empty()) cli::bad_usage("-z needs a checkpoint: the built-in model has its own vocabulary");
    study::check_workload(o);
    return o;
}

using study::add_workload;
using study::engine_config;

std::string json_escape(const std::string& s) {
    std::string o;
    for (unsigned char c : s) {
        if (c == '"' || c == '\\') { o += '\\'; o += (char)c; }
        else if (c < 0x20) { char b[8]; std::snprintf(b, sizeof b, "\\u%04x", c); o += b; }
        else o += (char)c;
    }
    return o;
}

template <class T>
std::string json_array(const T& v) {
    std::string s = "[";
    for (size_t i = 0; i < v.size(); ++i) s += (i ? "," : "") + std::to_string(v[i]);
    return s + "]";
}

}  // namespace

int run(int argc, char** argv) {
    const Options opt = parse(argc, argv);
    const pkv::ModelAndTokenizer mt = pkv::load_model_and_tokenizer(opt.checkpoint, opt.tokenizer);
    // A bad size or a device this build cannot run throws here, with a message
    // that says what to change; guarded_main prints it.
    // On the simulated GPU time is modelled, so the engine gets a clock that
    // moves only by the modelled step durations.
    const bool sim = opt.device == pkv::Device::kSim;
    pkv::VirtualClock sim_clock;
    pkv::SimOptions sim_opts;
    sim_opts.gpu = opt.gpu;
    pkv::Engine eng(pkv::make_model_runner(opt.device, mt.model, sim_opts), engine_config(opt), sim ? &sim_clock : nullptr);
    const bool show = !opt.json;
    if (show) {
        std::printf("model: %s (dim %d, %d layers, vocab %d)\n", mt.name.c_str(), mt.model.cfg.dim, mt.model.cfg.n_layers,
                    mt.model.cfg.vocab_size);
        std::printf("%s\n", study::startup_summary(eng).c_str());
        std::printf("workload: %d requests x (%d prompt + %d output tokens), max_num_seqs %d, admission %s, prefix caching %s\n\n",
                    opt.requests, opt.prompt_len, opt.max_tokens, opt.max_num_seqs,
                    pkv::to_string(opt.policy.admission), opt.prefix_caching ? "on" : "off");
    }

    // Per-request view of the stream, as a client would collect it.
    const int R = opt.requests;
    std::vector<std::string> text(R);        // rendered stream, with pause markers
    std::vector<int> prev_token(R, -1);
    std::vector<char> lane(R, ' ');          // this step's symbol per request
    std::vector<char> paused(R, 0);
    std::vector<long> step_of_preempt(R, -1);
    long step_no = 0;
    eng.on_event = [&](const pkv::StreamEvent& e) {
        const int id = e.request_id;
        if (id >= R) return;
        switch (e.type) {
            case pkv::EventType::kToken:
                text[id] += mt.tok.render(prev_token[id], e.token);
                prev_token[id] = e.token;
                if (lane[id] != 'R') lane[id] = '.';
                break;
            case pkv::EventType::kPreempted:
                lane[id] = 'X';
                paused[id] = 1;
                step_of_preempt[id] = step_no;
                break;
            case pkv::EventType::kResumed:
                lane[id] = 'R';
                paused[id] = 0;
                text[id] += " [paused: preempted at step " + std::to_string(step_of_preempt[id]) + ", resumed at step " +
                            std::to_string(step_no) + "]";
                break;
            case pkv::EventType::kFinished: lane[id] = '$'; break;
            case pkv::EventType::kRejected: break;
        }
    };
    // The periodic log goes to stderr, and only when asked (--log-interval):
    // on a terminal it would land between the lanes.
    if (show) eng.on_log = [](const std::string& line) { std::fprintf(stderr, "INFO %s\n", line.c_str()); };

    const std::vector<std::vector<int32_t>> prompts = add_workload(eng, mt.tok, opt);
    for (int i = 0; i < R; ++i) prev_token[i] = prompts[i].back();
    if (show) {
        for (int i = 0; i < R; ++i)
            if (eng.request(i)->finish_reason == pkv::FinishReason::kRejected)
                std::printf("request %d rejected: %s\n", i, eng.request(i)->reject_reason.c_str());
    }

    if (show && !opt.no_lanes) {
        std::printf("lanes: p prefill  . token  X preempted  ~ paused  R resumed (recompute)  $ finished\n");
        std::printf("%5s %4s %4s %4s  ", "step", "kv%", "run", "wait");
        for (int i = 0; i < R; ++i) std::printf("%d", i / 10 % 10);
        std::printf("\n%5s %4s %4s %4s  ", "", "", "", "");
        for (int i = 0; i < R; ++i) std::printf("%d", i % 10);
        std::printf("\n");
    }
    std::string last_row;
    long repeats = 0;
    auto flush_repeats = [&]() {
        if (repeats > 0) std::printf("%5s  ... the same for %ld more step%s\n", "", repeats, repeats == 1 ? "" : "s");
        repeats = 0;
    };
    const auto t0 = std::chrono::steady_clock::now();
    while (eng.has_unfinished()) {
        ++step_no;
        for (int i = 0; i < R; ++i) {
            pkv::Request* r = eng.request(i);
            lane[i] = r->state == pkv::RequestState::kRunning ? 'p' : (paused[i] ? '~' : ' ');
        }
        eng.step();
        if (show && !opt.no_lanes) {
            // Steps that look exactly like the one before are folded into a count.
            const pkv::Metrics& m = eng.metrics();
            std::string row(lane.begin(), lane.end());
            if (row == last_row) { ++repeats; continue; }
            flush_repeats();
            std::printf("%5ld %3.0f%% %4d %4d  %s\n", step_no, 100 * m.kv_cache_usage_perc, m.num_requests_running,
                        m.num_requests_waiting, row.c_str());
            last_row = row;
        }
    }
    if (show && !opt.no_lanes) flush_repeats();
    const double wall = sim ? sim_clock.t : std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const pkv::Metrics& m = eng.metrics();

    if (opt.json) {
        std::string s = "{\"config\":{";
        s += "\"model\":\"" + json_escape(mt.name) + "\",\"num_blocks\":" + std::to_string(opt.num_blocks) +
             ",\"block_size\":" + std::to_string(opt.block_size) + ",\"requests\":" + std::to_string(R) +
             ",\"max_num_seqs\":" + std::to_string(opt.max_num_seqs) + ",\"max_num_batched_tokens\":" +
             std::to_string(opt.max_num_batched_tokens) + ",\"max_tokens\":" + std::to_string(opt.max_tokens) +
             ",\"prompt_len\":" + std::to_string(opt.prompt_len) + ",\"max_model_len\":" +
             std::to_string(eng.config().sched.max_model_len) + ",\"prefix_caching\":" + (opt.prefix_caching ? "true" : "false") +
             ",\"admission\":\"" + pkv::to_string(opt.policy.admission) + "\",\"max_waiting\":" +
             std::to_string(opt.policy.max_waiting) + ",\"seed\":" + std::to_string(opt.seed) + "},\"requests\":[";
        for (int i = 0; i < R; ++i) {
            pkv::Request* r = eng.request(i);
            std::vector<int32_t> out(r->tokens.begin() + r->num_prompt_tokens, r->tokens.end());
            s += std::string(i ? "," : "") + "{\"id\":" + std::to_string(i) + ",\"prompt\":" + json_array(prompts[i]) +
                 ",\"output\":" + json_array(out) + ",\"finish_reason\":\"" + pkv::to_string(r->finish_reason) +
                 "\",\"reject_reason\":\"" + json_escape(r->reject_reason) + "\",\"preemptions\":" +
                 std::to_string(r->num_preemptions) + "}";
        }
        char buf[1536];
        std::snprintf(buf, sizeof buf,
                      "],\"metrics\":{\"num_preemptions_total\":%ld,\"generation_tokens_total\":%ld,\"prompt_tokens_total\":%ld,"
                      "\"recomputed_tokens_total\":%ld,\"swap_outs\":%ld,\"swap_ins\":%ld,\"swap_out_bytes\":%ld,\"swap_in_bytes\":%ld,\"swap_fallbacks\":%ld,\"computed_tokens_total\":%ld,\"prefix_cache_queries\":%ld,"
                      "\"prefix_cache_hits\":%ld,\"num_requests_finished\":%ld,\"num_requests_rejected\":%ld,\"num_steps\":%ld,"
                      "\"max_kv_cache_usage_perc\":%.4f,\"itl_p50_s\":%.6f,\"itl_p90_s\":%.6f,\"itl_p99_s\":%.6f,"
                      "\"ttft_p50_s\":%.6f,\"ttft_p99_s\":%.6f,\"e2e_p50_s\":%.6f,\"e2e_p99_s\":%.6f,\"wall_s\":%.4f}}\n",
                      m.num_preemptions_total, m.generation_tokens_total, m.prompt_tokens_total, m.recomputed_tokens_total, m.num_swap_outs,
                      m.num_swap_ins, m.swap_out_bytes, m.swap_in_bytes, m.num_swap_fallbacks,
                      m.computed_tokens_total, m.prefix_cache_queries, m.prefix_cache_hits, m.num_requests_finished,
                      m.num_requests_rejected, m.num_steps, m.max_kv_cache_usage_perc, m.inter_token_latency.percentile(50),
                      m.inter_token_latency.percentile(90), m.inter_token_latency.percentile(99),
                      m.time_to_first_token.percentile(50), m.time_to_first_token.percentile(99),
                      m.e2e_request_latency.percentile(50), m.e2e_request_latency.percentile(99), wall);
        std::fputs((s + buf).c_str(), stdout);
        return 0;
    }

    // A few streams as the client saw them: one unbroken text, one pause.
    int shown = 0;
    std::printf("\nwhat a client streaming a preempted request saw (the text never breaks; it pauses):\n");
    if (sim) std::printf("  (the simulated GPU computes no logits: its tokens are hashed ids, so the text is noise)\n");
    for (int i = 0; i < R && shown < 3; ++i) {
        if (eng.request(i)->num_preemptions == 0) continue;
        std::printf("  request %d (%d preemption%s): %s\n", i, eng.request(i)->num_preemptions,
                    eng.request(i)->num_preemptions == 1 ? "" : "s", text[i].c_str());
        ++shown;
    }
    if (shown == 0) std::printf("  (no request was preempted in this run)\n");

    int finished = 0, preempted_reqs = 0, max_pre = 0;
    for (int i = 0; i < R; ++i) {
        pkv::Request* r = eng.request(i);
        finished += r->finished() && r->finish_reason != pkv::FinishReason::kRejected;
        preempted_reqs += r->num_preemptions > 0;
        max_pre = std::max(max_pre, r->num_preemptions);
    }
    const auto& itl = m.inter_token_latency;
    if (sim) std::printf("\nmetrics (simulated time on %s: every duration below is modelled, not measured):\n", opt.gpu.c_str());
    else
        std::printf("\nmetrics (wall clock, %d CPU thread(s)):\n", 1
#ifdef _OPENMP
            - 1 + omp_get_max_threads()
#endif
        );
    std::printf("  requests                 %d finished, %ld rejected, of %d\n", finished, m.num_requests_rejected, R);
    std::printf("  num_preemptions_total    %ld  (%d requests preempted at least once, at most %d times)\n",
                m.num_preemptions_total, preempted_reqs, max_pre);
    std::printf("  useful output tokens     %ld\n", m.generation_tokens_total);
    std::printf("  recomputed tokens        %ld  (%.0f%% of the useful output: work done twice)\n", m.recomputed_tokens_total,
                m.generation_tokens_total ? 100.0 * m.recomputed_tokens_total / m.generation_tokens_total : 0.0);
    if (opt.policy.preemption == pkv::Preemption::kSwap)
        std::printf("  swap                     %ld out, %ld in, %.2f MB out + %.2f MB in, %ld fallbacks to recompute (swap space %d blocks)\n",
                    m.num_swap_outs, m.num_swap_ins, m.swap_out_bytes / 1e6, m.swap_in_bytes / 1e6, m.num_swap_fallbacks,
                    opt.swap_space_blocks);
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
    if (opt.device != pkv::Device::kCpu && !sim) {
        // The same workload on the CPU, for the figure beside it (and a check:
        // the tokens must be the same; greedy argmax of float32 logits can
        // only differ on a near-tie, which we would report).
        pkv::Engine cpu(pkv::make_model_runner(pkv::Device::kCpu, mt.model), engine_config(opt));
        add_workload(cpu, mt.tok, opt);
        const auto c0 = std::chrono::steady_clock::now();
        cpu.run_until_done();
        const double cpu_wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - c0).count();
        int same = 0;
        for (int i = 0; i < R; ++i) same += cpu.request(i)->tokens == eng.request(i)->tokens;
        std::printf("  same workload on cpu     %.0f useful tok/s (%s is %.3gx the CPU); %d of %d requests token-identical\n",
                    cpu.metrics().generation_tokens_total / cpu_wall, pkv::to_string(opt.device),
                    (m.generation_tokens_total / wall) / (cpu.metrics().generation_tokens_total / cpu_wall), same, R);
    }
    return 0;
}

int main(int argc, char** argv) { return cli::guarded_main("overload", [&] { return run(argc, argv); }); }

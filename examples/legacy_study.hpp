// examples/legacy_study.hpp -- the measuring loop of the five original study
// programs (concurrency_sweep, victim_study, fixes_study, preemption_study,
// kv_dtype_study), kept only until they are replaced by build/study
// (examples/study.cpp). New code uses examples/study_kit.hpp.
#pragma once

#include "examples/workload.hpp"

namespace study {
// The overloaded workload of the studies, chosen once and not tuned
// afterwards:
//   48 requests x (32 prompt + 160 output tokens), 48 blocks of 16.
// Why this shape: outputs are long next to their prompts (5:1, like chat
// answers), so the pool drains through *growth*, which is what the admission
// bet loses on: admission sees 2 blocks per request, but each one grows
// to 12 (192 tokens). The pool (768 token slots) holds exactly 4 requests at
// their longest, while the whole workload would need 576 blocks, 12x the
// pool; and at max_num_seqs 16 the engine runs about 3x more requests than
// fit at the end. 48 requests keep the queue non-empty for most of a run,
// and a run stays short enough for a study to make many of them.
inline Setup study_setup() {
    Setup s;
    s.requests = 48;
    s.prompt_len = 32;
    s.max_tokens = 160;
    s.num_blocks = 48;
    s.block_size = 16;
    s.max_num_seqs = 16;
    return s;
}

// ============================================================================
// 3. run(): one engine, one workload, measured two ways
// ============================================================================
//
// The engine takes one clock. We give it one that counts steps (so every
// latency the engine records is a whole number of steps, the same on every
// machine and every run) and that also notes the wall time of each reading.
// The engine reads its clock once when it samples a step's tokens and then
// streams them, so inside on_event, last_wall is the wall time of the event
// being handled; run() builds the wall-clock latencies from it.
struct StepAndWallClock : pkv::Clock {
    double steps = 0;         // steps completed
    bool in_step = false;     // run() sets it just before Engine::step()
    double last_wall = 0;     // steady_clock seconds at the latest now()
    // During a step the time is the step's number (1 for the first): a token
    // sampled in the step right after its request arrived has TTFT 1, and
    // two tokens of consecutive steps are 1 apart.
    double now() override {
        last_wall = std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
        return steps + (in_step ? 1 : 0);
    }
    void on_step_end() override {
        steps += 1;
        in_step = false;
    }
};

struct Measurement {
    int requests = 0, finished = 0, rejected = 0;
    int preempted_requests = 0, max_preemptions = 0;  // requests preempted at least once; most times one was
    long preemptions = 0;        // num_preemptions_total
    long useful_tokens = 0;      // output tokens emitted (generation_tokens_total)
    long prompt_tokens = 0;      // prompt tokens computed for the first time
    long recomputed_tokens = 0;  // computed again after a preemption
    long computed_tokens = 0;    // everything through the model
    long engine_steps = 0;       // Engine::step() calls
    double steps = 0;            // time in steps at the end (idle gaps between arrivals included)
    double wall_s = 0;           // wall seconds, first step to last
    double peak_kv = 0;          // max kv_cache_usage_perc, 0..1
    int peak_running = 0;        // most requests running after a step
    double mean_running = 0;     // requests running after a step, averaged over engine steps
    int peak_waiting = 0;        // longest waiting queue after a step (new and preempted requests)
    long prefix_cache_hits = 0;  // tokens served by the prefix cache at admission
    // Preemption by swap (Setup::preemption = kSwap); all 0 otherwise.
    long swap_outs = 0, swap_ins = 0, swap_fallbacks = 0;  // victims swapped out / back in / recomputed (swap space full)
    long swap_out_bytes = 0, swap_in_bytes = 0;            // bytes copied each way
    double peak_swap = 0;                                  // max swap_space_usage_perc, 0..1
    // Latencies of every token / accepted request, in seconds and in steps.
    pkv::LatencySamples itl_wall, ttft_wall, e2e_wall;
    pkv::LatencySamples itl_steps, ttft_steps, e2e_steps;
    // One entry per completed request, in completion order: when it
    // completed, in steps and in wall seconds since the run began.
    std::vector<double> done_step, done_wall;

    double requests_per_s() const { return wall_s > 0 ? finished / wall_s : 0.0; }
    double useful_tok_per_s() const { return wall_s > 0 ? useful_tokens / wall_s : 0.0; }
    double processed_tok_per_s() const { return wall_s > 0 ? computed_tokens / wall_s : 0.0; }
    double useful_tok_per_step() const { return engine_steps > 0 ? (double)useful_tokens / engine_steps : 0.0; }
    // Requests completed by time t (in steps).
    int completed_by_step(double t) const {
        return (int)(std::upper_bound(done_step.begin(), done_step.end(), t) - done_step.begin());
    }
};

// Runs the workload of `s` to completion on a fresh engine. Throws what the
// Engine constructor throws for a bad configuration (std::invalid_argument).
inline Measurement run(const pkv::ModelAndTokenizer& mt, const Setup& s) {
    const std::vector<std::vector<int32_t>> prompts = make_prompts(mt.tok, s);
    StepAndWallClock clock;
    pkv::Engine eng(pkv::make_model_runner(s.device, mt.model), engine_config(s), &clock);
    Measurement out;
    out.requests = s.requests;

    std::vector<double> arrival_wall(s.requests, 0.0), last_wall(s.requests, -1.0);
    double t0 = 0;
    eng.on_event = [&](const pkv::StreamEvent& e) {
        const int id = e.request_id;
        if (id < 0 || id >= s.requests) return;
        const double w = clock.last_wall;
        if (e.type == pkv::EventType::kToken) {
            if (last_wall[id] < 0) out.ttft_wall.add(w - arrival_wall[id]);
            else out.itl_wall.add(w - last_wall[id]);
            last_wall[id] = w;
        } else if (e.type == pkv::EventType::kFinished && e.reason != pkv::FinishReason::kAborted) {
            out.e2e_wall.add(w - arrival_wall[id]);
            out.done_step.push_back(e.time);
            out.done_wall.push_back(w - t0);
        }
    };

    int next = 0;  // the next request to arrive
    auto due = [&](int i) { return (double)i * s.arrival_interval; };
    t0 = std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
    while (next < s.requests || eng.has_unfinished()) {
        while (next < s.requests && due(next) <= clock.steps) {
            eng.add_request(prompts[next], sampling_params(s, next));
            arrival_wall[next] = clock.last_wall;  // add_request read the clock
            ++next;
        }
        if (!eng.has_unfinished()) {  // idle until the next arrival: skip ahead
            clock.steps = due(next);
            continue;
        }
        clock.in_step = true;
        eng.step();
        out.peak_swap = std::max(out.peak_swap, eng.metrics().swap_space_usage_perc);
        const int running = (int)eng.scheduler().running().size();
        out.peak_running = std::max(out.peak_running, running);
        out.mean_running += running;
        out.peak_waiting = std::max(out.peak_waiting, (int)eng.scheduler().waiting().size());
    }
    out.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count() - t0;

    const pkv::Metrics& m = eng.metrics();
    out.finished = (int)m.num_requests_finished;
    out.rejected = (int)m.num_requests_rejected;
    out.preemptions = m.num_preemptions_total;
    out.useful_tokens = m.generation_tokens_total;
    out.prompt_tokens = m.prompt_tokens_total;
    out.recomputed_tokens = m.recomputed_tokens_total;
    out.computed_tokens = m.computed_tokens_total;
    out.engine_steps = m.num_steps;
    if (out.engine_steps > 0) out.mean_running /= (double)out.engine_steps;
    out.steps = clock.steps;
    out.peak_kv = m.max_kv_cache_usage_perc;
    out.prefix_cache_hits = m.prefix_cache_hits;
    out.swap_outs = m.num_swap_outs;
    out.swap_ins = m.num_swap_ins;
    out.swap_fallbacks = m.num_swap_fallbacks;
    out.swap_out_bytes = m.swap_out_bytes;
    out.swap_in_bytes = m.swap_in_bytes;
    out.itl_steps = m.inter_token_latency;
    out.ttft_steps = m.time_to_first_token;
    out.e2e_steps = m.e2e_request_latency;
    for (int i = 0; i < s.requests; ++i) {
        const int p = eng.request(i)->num_preemptions;
        out.preempted_requests += p > 0;
        out.max_preemptions = std::max(out.max_preemptions, p);
    }
    return out;
}

// The workload and pool of a Setup, for the "workload" member of --json.
inline std::string workload_json(const Setup& s, const std::string& model) {
    return Json()
        .str("model", model)
        .integer("requests", s.requests)
        .integer("prompt_len", s.prompt_len)
        .integer("max_tokens", s.max_tokens)
        .integer("num_blocks", s.num_blocks)
        .integer("block_size", s.block_size)
        .integer("max_num_batched_tokens", s.max_num_batched_tokens)
        .integer("seed", (long)s.seed)
        .str("device", pkv::to_string(s.device))
        .integer("cpu_threads", cpu_threads())
        .dump();
}

// The measured numbers every study reports, as one JSON object.
inline Json measurement_json(const Measurement& m) {
    Json j;
    j.integer("requests", m.requests)
        .integer("finished", m.finished)
        .integer("rejected", m.rejected)
        .integer("num_preemptions_total", m.preemptions)
        .integer("preempted_requests", m.preempted_requests)
        .integer("useful_tokens", m.useful_tokens)
        .integer("prompt_tokens", m.prompt_tokens)
        .integer("recomputed_tokens", m.recomputed_tokens)
        .integer("computed_tokens", m.computed_tokens)
        .integer("engine_steps", m.engine_steps)
        .num("steps", m.steps)
        .num("wall_s", m.wall_s)
        .num("requests_per_s", m.requests_per_s())
        .num("useful_tok_per_s", m.useful_tok_per_s())
        .num("processed_tok_per_s", m.processed_tok_per_s())
        .num("useful_tok_per_step", m.useful_tok_per_step())
        .num("peak_kv_cache_usage_perc", m.peak_kv)
        .integer("peak_running", m.peak_running)
        .num("mean_running", m.mean_running)
        .integer("peak_waiting", m.peak_waiting)
        .num("itl_p50_s", m.itl_wall.percentile(50))
        .num("itl_p99_s", m.itl_wall.percentile(99))
        .num("ttft_p50_s", m.ttft_wall.percentile(50))
        .num("ttft_p99_s", m.ttft_wall.percentile(99))
        .num("e2e_p50_s", m.e2e_wall.percentile(50))
        .num("e2e_p99_s", m.e2e_wall.percentile(99))
        .num("itl_p50_steps", m.itl_steps.percentile(50))
        .num("itl_p99_steps", m.itl_steps.percentile(99))
        .num("itl_max_steps", m.itl_steps.percentile(100))
        .num("ttft_p99_steps", m.ttft_steps.percentile(99))
        .num("e2e_p50_steps", m.e2e_steps.percentile(50))
        .num("e2e_p99_steps", m.e2e_steps.percentile(99));
    return j;
}

}  // namespace study

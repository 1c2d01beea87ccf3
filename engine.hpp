// engine.hpp -- chapter 3: the step loop, and what the client sees.
//
//   step():  schedule -> build the flat batch -> forward -> sample -> append
//            tokens -> stream them -> finish and free
//
// Everything a reader needs to *observe* preemption lives here too: the stream
// of events a client would see (tokens, and the pauses between them), and the
// metrics an operator would see (preemptions, KV-cache usage, inter-token
// latency percentiles, recomputed tokens), named as vLLM names them.
//
// vLLM V1 splits this loop across processes: the engine core runs
// scheduler.schedule(), then the model executor (which also samples on the
// GPU), then scheduler.update_from_output(), which appends tokens and checks
// stops; a front-end process detokenizes, streams and computes the latency
// metrics. We do all of it in one thread, in one function (step()), so the
// whole life of a token can be read in forty lines. The price: no overlap
// between scheduling and the forward pass, which on a CPU reference costs
// nothing worth measuring.
//
// Sections: 1. time  2. the event stream  3. metrics  4. the engine (config,
// construction, step(), the log line, Prometheus).
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "paged_kv.cuh"
#include "scheduler.hpp"
#include "tiny_model/forward_cpu.hpp"
#include "tiny_model/forward_gpu.cuh"
#include "tiny_model/model.hpp"
#include "tiny_model/sampler.hpp"

namespace pkv {

// ============================================================================
// 1. Time: a clock interface
// ============================================================================
//
// Every timestamp the engine records comes from a Clock. The default is the
// wall clock; tests use a manual clock that advances one unit per step, so
// latencies are counted in steps and are exactly reproducible; a simulated
// backend can advance it by a modelled step time instead.
//
// Why a virtual interface and not a template parameter? One virtual call per
// timestamp is nothing next to a forward pass, and it keeps Engine a plain
// class that every example and test names the same way.

struct Clock {
    virtual ~Clock() = default;
    virtual double now() = 0;           // seconds
    virtual void on_step_end() {}       // a step has finished
};
// steady_clock, not system_clock: every metric is a difference of two
// timestamps, and steady_clock never jumps when the system time is adjusted.
struct WallClock : Clock {
    double now() override {
        return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
    }
};
// Time stands still inside a step and jumps by seconds_per_step at its end.
// Every timestamp of one step is therefore equal, and a preemption pause reads
// as a whole number of steps: what the scheduler tests assert on.
struct StepClock : Clock {
    double t = 0.0, seconds_per_step = 1.0;
    double now() override { return t; }
    void on_step_end() override { t += seconds_per_step; }
};

// ============================================================================
// 2. What a client sees: the event stream
// ============================================================================
//
// A client of an inference server gets a stream: tokens as they are sampled,
// then one end-of-stream. We add the state changes a client never sees
// (kPreempted, kResumed) so that examples/overload can draw the lanes and mark
// where a stream paused; a real server would simply send nothing for a while.
// vLLM V1 records similar per-request events (QUEUED, SCHEDULED, PREEMPTED)
// for its metrics and does not stream them either.
//
// Order within one step: preempted and resumed events first (they are
// decided by schedule(), before the forward pass), then, request by request,
// its token and, if that token stopped it, its kFinished.
// A token event is emitted exactly once, when it is sampled; a recompute
// re-runs positions whose tokens were already streamed and emits nothing.

enum class EventType { kToken, kPreempted, kResumed, kFinished, kRejected };

struct StreamEvent {
    EventType type;
    int request_id;
    double time;
    int token = -1;         // kToken: the token id
    // kToken: its index among the request's outputs. It runs 0, 1, 2, ...
    // without gaps or repeats, preempted or not: a client can check that.
    int output_index = -1;
    FinishReason reason = FinishReason::kNone;  // kFinished / kRejected
};

// ============================================================================
// 3. Metrics
// ============================================================================
//
// Two kinds of numbers, as in Prometheus: counters only ever grow (compare two
// scrapes to get a rate), gauges are "as of now". Chapter 3 of TUTORIAL.md
// reads thrash off them: num_preemptions_total climbing, kv_cache_usage_perc
// pinned at 100%, and inter-token latency p99 far above p50 (25.49 ms against
// 1.24 ms in the overload run), because the first token after a pause carries
// the whole pause.

// Latency samples, kept whole: our runs are small, and exact percentiles read
// better in a tutorial than bucket interpolation.
// vLLM exports histograms, and percentiles are then estimated from buckets at
// query time (histogram_quantile in PromQL): cheap at any scale, approximate.
// Keeping every sample is exact but grows with the run; fine for thousands of
// tokens, not for a server that runs for weeks.
struct LatencySamples {
    std::vector<double> v;  // [count] one entry per observation, arrival order
    void add(double x) { v.push_back(x); }
    size_t count() const { return v.size(); }
    double sum() const { double s = 0; for (double x : v) s += x; return s; }
    // Nearest-rank percentile, p in [0, 100]. 0 when empty.
    // The smallest sample that at least p% of the samples do not exceed: always
    // a value that was really observed, never an interpolation. Sorts a copy on
    // every call: meant for end-of-run reports, not for the step loop.
    double percentile(double p) const {
        if (v.empty()) return 0.0;
        std::vector<double> s = v;
        std::sort(s.begin(), s.end());
        size_t rank = (size_t)std::ceil(p / 100.0 * s.size());
        return s[rank == 0 ? 0 : rank - 1];
    }
};

struct Metrics {
    // Counters (vLLM names, without the vllm: prefix).
    long num_preemptions_total = 0;
    long prompt_tokens_total = 0;      // prompt tokens computed for the first time
    long generation_tokens_total = 0;  // output tokens emitted: the useful work
    long recomputed_tokens_total = 0;  // tokens computed again after a preemption: wasted work
    // The three add up to this one, except that the last output token of each
    // request is sampled but never fed back. Chapter 3's run: 4532 = prompt 768
    // + decode 2280 (2304 outputs - 24 last tokens) + recompute 1484.
    long computed_tokens_total = 0;    // every token through the model (prompt + decode + recompute)
    long prefix_cache_queries = 0;     // tokens
    long prefix_cache_hits = 0;        // tokens
    // vLLM counts finished requests in one counter labelled by finish reason;
    // we keep three counters, so the report needs no label parsing.
    long num_requests_finished = 0;  // completed: stop token or a length limit
    long num_requests_aborted = 0;
    long num_requests_rejected = 0;
    long num_steps = 0;
    // Preemption by swap (SchedulerConfig::preemption = kSwap): the price is
    // bytes over PCIe (or memcpy on the CPU) instead of recomputed tokens.
    long num_swap_outs = 0;        // victims copied to host swap space
    long num_swap_ins = 0;         // swapped victims copied back and resumed
    long swap_out_bytes = 0;       // device -> host
    long swap_in_bytes = 0;        // host -> device
    long num_swap_fallbacks = 0;   // victims recomputed because the swap space was full
    double swap_space_usage_perc = 0.0;  // gauge: fraction of host swap slots in use
    // Gauges, as of the last step.
    // kv_cache_usage_perc is a fraction in [0, 1] despite its name, exactly
    // like vLLM's: multiply by 100 to print it (the log line does).
    double kv_cache_usage_perc = 0.0;
    int num_requests_running = 0;
    int num_requests_waiting = 0;
    // Ours, not vLLM's: a gauge sampled once per step misses the peak between
    // scrapes, and the peak is what tells you the pool ran dry.
    double max_kv_cache_usage_perc = 0.0;
    // Latencies (clock seconds).
    // Only requests that finished normally feed e2e_request_latency and
    // request_preemptions; aborted and rejected ones have their own counters.
    LatencySamples inter_token_latency;
    LatencySamples time_to_first_token;
    LatencySamples e2e_request_latency;
    LatencySamples request_preemptions;  // per finished request
};

// ============================================================================
// 4. The engine
// ============================================================================

struct EngineConfig {
    // KV cache size. vLLM profiles a forward pass at startup and turns the GPU
    // memory left under gpu_memory_utilization into blocks; we take the count
    // directly, so a demo can make the pool exactly as small as it needs.
    int num_blocks = 64;
    int block_size = 16;
    bool enable_prefix_caching = false;
    SchedulerConfig sched;     // sched.max_model_len 0 = derive (see Engine())
    // llama2.c's "</s>". Note that run.c itself (and examples/generate) stops
    // when the model emits BOS (id 1); the engine stops on EOS like vLLM, and
    // examples/overload sets ignore_eos so every request does the same work.
    int eos_token_id = 2;
    double log_interval_s = 5.0;  // periodic log line; <= 0 = never
    // Where the model runs: the CPU forward, or the CUDA kernels (on a GPU in a
    // `make cuda` build, emulated on the CPU otherwise). The scheduler, the
    // pool and everything in this file are the same for all three.
    Device device = Device::kCpu;
    // The KV cache's element type (paged_kv.cuh section 1), and optionally its
    // size as a byte budget: with kv_cache_bytes > 0, num_blocks is derived
    // from it, so a smaller dtype buys more blocks and fewer preemptions.
    KVDtype kv_dtype = KVDtype::kF32;
    size_t kv_cache_bytes = 0;
};

class Engine {
public:
    using StreamCallback = std::function<void(const StreamEvent&)>;
    using LogCallback = std::function<void(const std::string&)>;

    // max_model_len defaults to the model's context, capped to what the pool
    // can hold; an explicit value larger than either is a startup error.
    //
    // Members are initialized in declaration order (see the bottom of the
    // class), and that order is a dependency chain: cfg_ is derived first,
    // then the pool is sized from it, then the scheduler checks max_model_len
    // against the pool, then the model runner allocates the KV cache itself
    // (in host memory for the CPU, in device memory for the kernels).
    Engine(const Model& model, EngineConfig cfg, Clock* clock = nullptr)
        : model_(model), cfg_(derive(model, cfg)),
          geo_{model.cfg.n_layers, cfg_.num_blocks, cfg_.block_size, model.cfg.n_kv_heads, model.cfg.head_dim(), cfg_.kv_dtype},
          pool_(cfg_.num_blocks, cfg_.block_size, cfg_.enable_prefix_caching),
          sched_(cfg_.sched, pool_),
          runner_(make_model_runner(cfg_.device, model_, geo_,
                                    cfg_.sched.preemption == Preemption::kSwap ? cfg_.sched.swap_space_blocks : 0)),
          clock_(clock ? clock : &wall_clock_) {
        last_log_time_ = clock_->now();
    }

    // Both callbacks run synchronously inside step(), add_request() or
    // abort(). on_event may call abort() (for any request, including the one
    // whose token it is handling: the step loop re-checks); it must not call
    // step(), which would reuse the logits of the step still in progress.
    StreamCallback on_event;  // every token and state change, as it happens
    LogCallback on_log;       // the periodic vLLM-style log line

    const EngineConfig& config() const { return cfg_; }
    const Metrics& metrics() const { return metrics_; }
    Scheduler& scheduler() { return sched_; }
    BlockPool& pool() { return pool_; }
    Request* request(int id) { return sched_.request(id); }
    double now() { return clock_->now(); }

    // The line vLLM logs at startup, for our pool.
    // "Maximum concurrency" is pool tokens / max_model_len: how many requests
    // could each reach max_model_len at once. In chapter 3's demo it is 1.00x
    // (max_model_len was capped to the pool), yet 16 requests run at once:
    // everything above 1.00x is the admission bet of scheduler.hpp.
    std::string startup_summary() const {
        const long pool_tokens = (long)cfg_.num_blocks * cfg_.block_size;
        char buf[400];
        std::snprintf(buf, sizeof buf,
                      "KV cache: %d blocks x %d tokens = %ld token slots (%.2f MiB of %s, %d layers, on %s). max_model_len %d. "
                      "Maximum concurrency for %d tokens per request: %.2fx",
                      cfg_.num_blocks, cfg_.block_size, pool_tokens,
                      (double)cfg_.num_blocks * geo_.bytes_per_block() / 1048576.0, to_string(cfg_.kv_dtype), model_.cfg.n_layers,
                      to_string(cfg_.device),
                      cfg_.sched.max_model_len, cfg_.sched.max_model_len, (double)pool_tokens / cfg_.sched.max_model_len);
        return buf;
    }

    // Returns the request id. A rejected request still gets an id; its state
    // is finished(rejected) with a reason, and a kRejected event is emitted.
    // Rejection happens here, at the door, never later: once a request is
    // accepted it will finish (or be aborted by its client).
    int add_request(std::vector<int32_t> prompt, const SamplingParams& params) {
        const double t = clock_->now();
        Request* r = sched_.add_request(std::move(prompt), params, t);
        if (r->finish_reason == FinishReason::kRejected) {
            metrics_.num_requests_rejected++;
            emit({EventType::kRejected, r->id, t, -1, -1, FinishReason::kRejected});
        }
        return r->id;
    }

    // A client hung up. Its blocks are free when this returns, so the next
    // step can already give them to someone else.
    bool abort(int id) {
        const double t = clock_->now();
        if (!sched_.abort(id, t)) return false;
        metrics_.num_requests_aborted++;
        emit({EventType::kFinished, id, t, -1, -1, FinishReason::kAborted});
        return true;
    }

    bool has_unfinished() const { return sched_.has_unfinished(); }

    // One engine step. Returns the number of tokens computed.
    //
    // Read it as four phases: (a) the scheduler decides who runs and who is
    // preempted; (b) we lay every scheduled token side by side in one flat
    // batch and account for what is new work and what is repeated work; (c)
    // one forward pass writes K/V for all of them and returns logits for the
    // last token of each sequence that is fully computed; (d) we sample, stream
    // and finish. Like vLLM V1 there is no separate "prefill step" and "decode
    // step": a step mixes decodes, prefill chunks and recomputes freely.
    int step() {
        SchedulerOutput so = sched_.schedule();
        // Swap copies happen before the forward pass: a victim's freed blocks
        // still hold its K/V until this step's forward writes into them.
        if (!so.swap_out.empty()) runner_->swap_out(so.swap_out);
        if (!so.swap_in.empty()) runner_->swap_in(so.swap_in);
        metrics_.swap_out_bytes += (long)so.swap_out.size() * (long)block_bytes();
        metrics_.swap_in_bytes += (long)so.swap_in.size() * (long)block_bytes();
        const double t_sched = clock_->now();
        for (Request* r : so.preempted) emit({EventType::kPreempted, r->id, t_sched});
        for (Request* r : so.resumed) emit({EventType::kResumed, r->id, t_sched});
        if (so.scheduled.empty() && sched_.has_unfinished())
            // Cannot happen by construction (add_request rejects what can never
            // fit); if it ever does, fail loudly instead of spinning forever.
            throw std::logic_error("engine made no progress with requests pending");

        // Build the flat batch: each request contributes the tokens
        // [num_computed, num_computed + n) of prompt + outputs.
        // A decode contributes one token, a prefill chunk or a recompute many;
        // the forward pass does not care which, because every token carries its
        // own position and block table row (see ForwardBatch).
        ForwardBatch batch;
        std::vector<Request*> sampled;  // requests whose last token is in this step
        for (const ScheduledRequest& s : so.scheduled) {
            Request& r = *s.req;
            const int first = r.num_computed_tokens;
            // Only a chunk that reaches the end of the sequence yields a token:
            // an earlier prefill chunk only fills the cache (chunked prefill).
            const bool reaches_end = first + s.num_new_tokens == r.num_tokens();
            batch.add_sequence(r.block_table.blocks, cfg_.block_size, r.tokens.data() + first, first, s.num_new_tokens, reaches_end);
            if (reaches_end) sampled.push_back(&r);
            // Accounting: what part of this is doing work again?
            // The chunk covers positions [first, first + n). Positions below
            // the high-water mark were computed before a preemption threw
            // their K/V away: recomputed. Prompt positions at or above it are
            // computed for the first time: prompt work. Everything else is
            // decode. Prefix-cache hits are in no chunk at all: they start
            // `first` above zero, which is exactly what they save.
            const int recomputed = std::max(0, std::min(first + s.num_new_tokens, r.num_computed_high_water) - first);
            metrics_.recomputed_tokens_total += recomputed;
            metrics_.computed_tokens_total += s.num_new_tokens;
            const int first_time_prompt = std::max(0, std::min(first + s.num_new_tokens, r.num_prompt_tokens) -
                                                          std::max(first, r.num_computed_high_water));
            metrics_.prompt_tokens_total += first_time_prompt;
        }
        // The forward pass writes K/V of every batch token into its slot and
        // fills logits_ with one row per entry of `sampled`, in the same order
        // (both were appended in the loop above). When every request sampled
        // this step is greedy, only the argmax of each row is needed: the
        // runner computes it where the logits are (on a GPU that saves copying
        // a vocab-sized row per request back to the host).
        bool all_greedy = true;
        for (const Request* r : sampled) all_greedy = all_greedy && r->params.temperature == 0.0f;
        if (batch.num_tokens() > 0) {
            if (all_greedy) runner_->forward_argmax(batch, greedy_);
            else runner_->forward(batch, logits_);
        }
        for (const ScheduledRequest& s : so.scheduled) sched_.on_computed(*s.req, s.num_new_tokens);

        // Sample one token for every request whose sequence is fully computed.
        // One timestamp for all of them: a batched engine delivers every token
        // of a step at the same moment, on a GPU as here.
        const double t_out = clock_->now();
        const int V = model_.cfg.vocab_size;
        for (size_t i = 0; i < sampled.size(); ++i) {
            Request& r = *sampled[i];
            if (r.finished()) continue;  // aborted from an event callback earlier in this loop
            const int out_index = r.num_output_tokens();
            // The coin depends only on (seed, output index), never on the step
            // or the batch: a recomputed request draws the same coin for its
            // k-th token as it would have without preemption (sampler.hpp).
            // Greedy needs no coin, so we skip the hashing.
            int token;
            if (all_greedy) token = greedy_[i];
            else {
                float* row = logits_.data() + i * V;  // [vocab] this request's logits
                const float coin = r.params.temperature == 0.0f ? 0.0f : coin_for(r.params.seed, out_index);
                token = sample_token(row, V, r.params.temperature, r.params.top_p, coin, scratch_);
            }
            r.tokens.push_back(token);
            record_token_latency(r, t_out);
            metrics_.generation_tokens_total++;
            // The token is streamed before the stop check, so a client sees the
            // EOS or stop token itself, then kFinished.
            emit({EventType::kToken, r.id, t_out, token, out_index});
            if (r.finished()) continue;  // the callback aborted it on this very token
            const FinishReason why = stop_reason(r, token);
            if (why != FinishReason::kNone) {
                sched_.finish(r, why, t_out);
                metrics_.num_requests_finished++;
                metrics_.e2e_request_latency.add(t_out - r.arrival_time);
                metrics_.request_preemptions.add(r.num_preemptions);
                emit({EventType::kFinished, r.id, t_out, -1, -1, why});
            }
        }
        // Blocks of finished requests are already back in the pool, so the
        // gauges below (and the next schedule()) see them free.
        update_gauges(so);
        clock_->on_step_end();
        maybe_log();
        return so.num_scheduled_tokens;
    }

    void run_until_done() {
        while (has_unfinished()) step();
    }

    // "" when the block pool agrees with every request's block table.
    // The randomized scheduler test calls this after every step.
    // Also checks the host swap space (every slot free xor held by one swapped request).
    std::string check_invariants() const {
        std::string e = pool_.check_invariants(sched_.all_block_tables());
        return e.empty() ? sched_.check_swap_invariants() : e;
    }

    // Bytes of one block across all layers, K and V: what one swap copy moves.
    size_t block_bytes() const { return geo_.bytes_per_block(); }

    // The vLLM-style periodic line (also available on demand).
    // vLLM's line reads "Avg prompt throughput ... Avg generation throughput
    // ... Running: N reqs, Waiting: N reqs, GPU KV cache usage ..., Prefix
    // cache hit rate ...". We say "KV cache usage" (this cache lives in host
    // memory) and append two fields vLLM does not print, Preemptions (running
    // total) and Recomputed (tokens, running total): with them, one glance at
    // the log tells thrash from honest load.
    //
    // The throughputs are averages since the previous line, so calling this
    // moves that window: on demand calls and the periodic log share it.
    // Prompt throughput counts first-time prompt tokens only; a recompute
    // shows up in Recomputed, not as a burst of prompt work.
    std::string log_line() {
        const double t = clock_->now();
        const double dt = std::max(1e-9, t - last_log_time_);
        const long hits = metrics_.prefix_cache_hits, queries = metrics_.prefix_cache_queries;
        char buf[512];
        std::snprintf(buf, sizeof buf,
                      "Avg prompt throughput: %.1f tokens/s, Avg generation throughput: %.1f tokens/s, Running: %d reqs, "
                      "Waiting: %d reqs, KV cache usage: %.1f%%, Prefix cache hit rate: %.1f%%, Preemptions: %ld, "
                      "Recomputed: %ld tokens",
                      (metrics_.prompt_tokens_total - logged_prompt_) / dt, (metrics_.generation_tokens_total - logged_gen_) / dt,
                      metrics_.num_requests_running, metrics_.num_requests_waiting, 100.0 * metrics_.kv_cache_usage_perc,
                      queries ? 100.0 * hits / queries : 0.0, metrics_.num_preemptions_total, metrics_.recomputed_tokens_total);
        last_log_time_ = t;
        logged_prompt_ = metrics_.prompt_tokens_total;
        logged_gen_ = metrics_.generation_tokens_total;
        return buf;
    }

    // Prometheus text exposition format, pagedkv: instead of vllm:.
    //
    // Each metric family is a "# HELP" line, a "# TYPE" line and its samples.
    // A histogram's buckets are cumulative: bucket le="b" counts samples <= b,
    // and le="+Inf" equals _count. Prometheus reserves colons in names for
    // recording rules by convention; vLLM uses the "vllm:" prefix anyway, and
    // we mirror it so dashboards written for vLLM need only a rename. vLLM
    // also attaches labels (model name, engine); one engine, one model here.
    // Buckets are computed from the kept samples at scrape time, one pass per
    // bucket: simple, and a scrape of a tutorial-sized run is instant.
    std::string prometheus() const {
        std::ostringstream o;
        // A counter or a gauge: one sample, no labels. `v` keeps the type the
        // caller passes (long for counters, double for gauges), because an
        // ostream prints the two differently once a value passes 999999
        // (1234567 vs 1.23457e+06): keep the casts below to keep the output.
        auto scalar = [&](const char* type, const char* name, const char* help, auto v) {
            o << "# HELP pagedkv:" << name << " " << help << "\n# TYPE pagedkv:" << name << " " << type << "\npagedkv:" << name << " " << v << "\n";
        };
        auto histogram = [&](const char* name, const char* help, const LatencySamples& s, const std::vector<double>& buckets) {
            o << "# HELP pagedkv:" << name << " " << help << "\n# TYPE pagedkv:" << name << " histogram\n";
            for (double b : buckets) {
                long n = (long)std::count_if(s.v.begin(), s.v.end(), [&](double x) { return x <= b; });
                o << "pagedkv:" << name << "_bucket{le=\"" << b << "\"} " << n << "\n";
            }
            o << "pagedkv:" << name << "_bucket{le=\"+Inf\"} " << s.count() << "\n";
            o << "pagedkv:" << name << "_sum " << s.sum() << "\npagedkv:" << name << "_count " << s.count() << "\n";
        };
        // 1 ms to 100 s: wide enough that a one-step token gap and a pause of
        // hundreds of steps land in different buckets.
        const std::vector<double> lat = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 25, 50, 100};
        scalar("counter", "num_preemptions_total", "Requests preempted (KV cache out of free blocks).", metrics_.num_preemptions_total);
        scalar("counter", "prompt_tokens_total", "Prompt tokens computed for the first time.", metrics_.prompt_tokens_total);
        scalar("counter", "generation_tokens_total", "Output tokens emitted.", metrics_.generation_tokens_total);
        scalar("counter", "recomputed_tokens_total", "Tokens computed again after a preemption.", metrics_.recomputed_tokens_total);
        scalar("counter", "computed_tokens_total", "All tokens through the model.", metrics_.computed_tokens_total);
        scalar("counter", "swap_outs_total", "Victims copied to host swap space.", metrics_.num_swap_outs);
        scalar("counter", "swap_ins_total", "Swapped victims copied back and resumed.", metrics_.num_swap_ins);
        scalar("counter", "swap_out_bytes_total", "Bytes copied device to host by swap-outs.", metrics_.swap_out_bytes);
        scalar("counter", "swap_in_bytes_total", "Bytes copied host to device by swap-ins.", metrics_.swap_in_bytes);
        scalar("counter", "swap_fallbacks_total", "Victims recomputed because the swap space was full.", metrics_.num_swap_fallbacks);
        scalar("gauge", "swap_space_usage_perc", "Fraction of host swap slots in use (0..1).", metrics_.swap_space_usage_perc);
        scalar("counter", "prefix_cache_queries_total", "Tokens looked up in the prefix cache.", metrics_.prefix_cache_queries);
        scalar("counter", "prefix_cache_hits_total", "Tokens served by the prefix cache.", metrics_.prefix_cache_hits);
        scalar("counter", "request_success_total", "Requests completed (stop token or length limit).", metrics_.num_requests_finished);
        scalar("counter", "request_aborted_total", "Requests aborted by the client.", metrics_.num_requests_aborted);
        scalar("counter", "request_rejected_total", "Requests rejected at admission.", metrics_.num_requests_rejected);
        scalar("gauge", "kv_cache_usage_perc", "Fraction of KV blocks in use (0..1).", metrics_.kv_cache_usage_perc);
        scalar("gauge", "num_requests_running", "Requests in the running set.", (double)metrics_.num_requests_running);
        scalar("gauge", "num_requests_waiting", "Requests waiting (new or preempted).", (double)metrics_.num_requests_waiting);
        histogram("inter_token_latency_seconds", "Time between consecutive tokens of a request.", metrics_.inter_token_latency, lat);
        histogram("time_to_first_token_seconds", "Arrival to first token.", metrics_.time_to_first_token, lat);
        histogram("e2e_request_latency_seconds", "Arrival to finish.", metrics_.e2e_request_latency, lat);
        // Chapter 3's run preempted one request at most 4 times.
        histogram("request_preemptions", "Preemptions per finished request.", metrics_.request_preemptions, {0, 1, 2, 4, 8, 16, 32});
        return o.str();
    }

private:
    // Fill in max_model_len and check the config against the model.
    // vLLM defaults max_model_len to the model's context and refuses to start
    // when the KV cache cannot hold one such sequence. We cap it to the pool
    // instead, and say so in the startup line, so that a demo with a tiny
    // pool still starts; an explicit --max-model-len is never silently changed.
    static EngineConfig derive(const Model& m, EngineConfig c) {
        if (c.block_size <= 0) throw std::invalid_argument("--block-size must be >= 1");
        if (c.kv_cache_bytes > 0) {
            // A byte budget: as many blocks of this dtype as fit. f16 gives
            // twice the blocks of f32, int8 (with its scales) almost four times.
            const KVGeometry g{m.cfg.n_layers, 1, c.block_size, m.cfg.n_kv_heads, m.cfg.head_dim(), c.kv_dtype};
            c.num_blocks = (int)(c.kv_cache_bytes / g.bytes_per_block());
            if (c.num_blocks <= 0)
                throw std::invalid_argument("a KV cache of " + std::to_string(c.kv_cache_bytes) + " bytes holds no block of " +
                                            std::to_string(g.bytes_per_block()) + " bytes: raise the budget");
        }
        if (c.num_blocks <= 0) throw std::invalid_argument("--num-blocks must be >= 1");
        const long pool_tokens = (long)c.num_blocks * c.block_size;
        if (c.sched.max_model_len == 0) c.sched.max_model_len = (int)std::min<long>(m.cfg.seq_len, pool_tokens);
        // Positions past the model's context are untrained, and the forward
        // pass rejects them.
        else if (c.sched.max_model_len > m.cfg.seq_len)
            throw std::invalid_argument("max_model_len " + std::to_string(c.sched.max_model_len) +
                                        " is longer than the model's context " + std::to_string(m.cfg.seq_len) +
                                        ": lower --max-model-len");
        // A max_model_len larger than the pool is caught by the Scheduler.
        return c;
    }

    void emit(const StreamEvent& e) {
        if (on_event) on_event(e);
    }

    // Time to first token is measured from arrival, so it includes queueing:
    // that is where --admission reserve pays (TUTORIAL chapters 3-4: p50
    // 308.6 ms against 135.6 ms for the bet), even though it never preempts.
    void record_token_latency(Request& r, double t) {
        if (r.first_token_time < 0) {
            r.first_token_time = t;
            metrics_.time_to_first_token.add(t - r.arrival_time);
        } else {
            // Across a preemption this gap includes the whole pause: exactly
            // what a client streaming the tokens would feel.
            metrics_.inter_token_latency.add(t - r.last_token_time);
        }
        r.last_token_time = t;
    }

    // Why `r` stops after emitting `token` (kNone: it goes on). A stop token
    // wins over a length limit reached by the same token.
    // vLLM V1's check_stop tests the length limits first, so a token that is
    // both EOS and the max_tokens-th is "length" there and "stop" here; the
    // tokens streamed are the same either way.
    FinishReason stop_reason(const Request& r, int token) const {
        if (token == cfg_.eos_token_id && !r.params.ignore_eos) return FinishReason::kStop;
        for (int32_t s : r.params.stop_token_ids)
            if (token == s) return FinishReason::kStop;
        if (r.num_output_tokens() >= r.params.max_tokens) return FinishReason::kMaxTokens;
        if (r.num_tokens() >= cfg_.sched.max_model_len) return FinishReason::kMaxModelLen;
        return FinishReason::kNone;
    }

    // The scheduler owns the preemption and prefix-cache counters (it is where
    // they happen); we copy them here so that Metrics is one consistent
    // snapshot taken at the end of a step.
    void update_gauges(const SchedulerOutput&) {
        metrics_.num_steps++;
        metrics_.num_preemptions_total = sched_.num_preemptions_total;
        metrics_.prefix_cache_queries = sched_.prefix_cache_queries;
        metrics_.prefix_cache_hits = sched_.prefix_cache_hits;
        metrics_.kv_cache_usage_perc = pool_.kv_cache_usage_perc();
        metrics_.max_kv_cache_usage_perc = std::max(metrics_.max_kv_cache_usage_perc, metrics_.kv_cache_usage_perc);
        metrics_.num_requests_running = (int)sched_.running().size();
        metrics_.num_requests_waiting = (int)(sched_.waiting().size() + sched_.swapped().size());
        metrics_.num_swap_outs = sched_.num_swap_outs;
        metrics_.num_swap_ins = sched_.num_swap_ins;
        metrics_.num_swap_fallbacks = sched_.num_swap_fallbacks;
        const int swap_total = sched_.config().swap_space_blocks;
        metrics_.swap_space_usage_perc = swap_total ? (double)sched_.swap_slots_in_use() / swap_total : 0.0;
    }

    // Checked once per step, on the engine's clock: at most one line per step,
    // and under a StepClock the interval is counted in steps.
    void maybe_log() {
        if (!on_log || cfg_.log_interval_s <= 0) return;
        if (clock_->now() - last_log_time_ >= cfg_.log_interval_s) on_log(log_line());
    }

    // Declaration order is construction order: keep cfg_ before geo_,
    // pool_ and sched_ (the constructor reads the derived cfg_).
    const Model& model_;
    EngineConfig cfg_;
    // The KV cache's shape: K and V per layer, [num_blocks, block_size, n_kv_heads, head_dim].
    KVGeometry geo_;
    BlockPool pool_;     // who owns which of the cache's blocks
    Scheduler sched_;
    // The model and the KV cache memory itself, on the configured device.
    std::unique_ptr<ModelRunner> runner_;
    WallClock wall_clock_;
    Clock* clock_;       // &wall_clock_ unless the caller supplied one
    Metrics metrics_;
    std::vector<float> logits_;                      // [num sampled, vocab]
    std::vector<int32_t> greedy_;                    // [num sampled] argmax, when all are greedy
    // [<= vocab] top-p candidates (probability, id), reused so that sampling
    // allocates nothing per token once it has grown.
    std::vector<std::pair<float, int>> scratch_;     // top-p scratch
    double last_log_time_ = 0;
    long logged_prompt_ = 0, logged_gen_ = 0;  // counters at the last log line
};

}  // namespace pkv

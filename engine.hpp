// engine.hpp -- chapter 3: the step loop, and what the client sees.
//
//   step():  schedule -> build the flat batch -> forward -> sample -> append
//            tokens -> stream them -> finish and free
//
// Everything a reader needs to *observe* preemption lives here too: the stream
// of events a client would see (tokens, and the pauses between them), and the
// metrics an operator would see (preemptions, KV-cache usage, inter-token
// latency percentiles, recomputed tokens), named as vLLM names them.
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

struct Clock {
    virtual ~Clock() = default;
    virtual double now() = 0;           // seconds
    virtual void on_step_end() {}       // a step has finished
};
struct WallClock : Clock {
    double now() override {
        return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
    }
};
struct StepClock : Clock {
    double t = 0.0, seconds_per_step = 1.0;
    double now() override { return t; }
    void on_step_end() override { t += seconds_per_step; }
};

// ============================================================================
// 2. What a client sees: the event stream
// ============================================================================

enum class EventType { kToken, kPreempted, kResumed, kFinished, kRejected };

struct StreamEvent {
    EventType type;
    int request_id;
    double time;
    int token = -1;         // kToken: the token id
    int output_index = -1;  // kToken: its index among the request's outputs
    FinishReason reason = FinishReason::kNone;  // kFinished / kRejected
};

// ============================================================================
// 3. Metrics
// ============================================================================

// Latency samples, kept whole: our runs are small, and exact percentiles read
// better in a tutorial than bucket interpolation.
struct LatencySamples {
    std::vector<double> v;
    void add(double x) { v.push_back(x); }
    size_t count() const { return v.size(); }
    double sum() const { double s = 0; for (double x : v) s += x; return s; }
    // Nearest-rank percentile, p in [0, 100]. 0 when empty.
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
    long computed_tokens_total = 0;    // every token through the model (prompt + decode + recompute)
    long prefix_cache_queries = 0;     // tokens
    long prefix_cache_hits = 0;        // tokens
    long num_requests_finished = 0;  // completed: stop token or a length limit
    long num_requests_aborted = 0;
    long num_requests_rejected = 0;
    long num_steps = 0;
    // Gauges, as of the last step.
    double kv_cache_usage_perc = 0.0;
    int num_requests_running = 0;
    int num_requests_waiting = 0;
    double max_kv_cache_usage_perc = 0.0;
    // Latencies (clock seconds).
    LatencySamples inter_token_latency;
    LatencySamples time_to_first_token;
    LatencySamples e2e_request_latency;
    LatencySamples request_preemptions;  // per finished request
};

// ============================================================================
// 4. The engine
// ============================================================================

struct EngineConfig {
    int num_blocks = 64;
    int block_size = 16;
    bool enable_prefix_caching = false;
    SchedulerConfig sched;     // sched.max_model_len 0 = derive (see Engine())
    int eos_token_id = 2;
    double log_interval_s = 5.0;  // periodic log line; <= 0 = never
};

class Engine {
public:
    using StreamCallback = std::function<void(const StreamEvent&)>;
    using LogCallback = std::function<void(const std::string&)>;

    // max_model_len defaults to the model's context, capped to what the pool
    // can hold; an explicit value larger than either is a startup error.
    Engine(const Model& model, EngineConfig cfg, Clock* clock = nullptr)
        : model_(model), cfg_(derive(model, cfg)),
          cache_(KVGeometry{model.cfg.n_layers, cfg_.num_blocks, cfg_.block_size, model.cfg.n_kv_heads, model.cfg.head_dim()}),
          pool_(cfg_.num_blocks, cfg_.block_size, cfg_.enable_prefix_caching),
          sched_(cfg_.sched, pool_),
          fwd_(model_, cache_),
          clock_(clock ? clock : &wall_clock_) {
        last_log_time_ = clock_->now();
    }

    StreamCallback on_event;  // every token and state change, as it happens
    LogCallback on_log;       // the periodic vLLM-style log line

    const EngineConfig& config() const { return cfg_; }
    const Metrics& metrics() const { return metrics_; }
    Scheduler& scheduler() { return sched_; }
    BlockPool& pool() { return pool_; }
    Request* request(int id) { return sched_.request(id); }
    double now() { return clock_->now(); }

    // The line vLLM logs at startup, for our pool.
    std::string startup_summary() const {
        const long pool_tokens = (long)cfg_.num_blocks * cfg_.block_size;
        char buf[400];
        std::snprintf(buf, sizeof buf,
                      "KV cache: %d blocks x %d tokens = %ld token slots (%.2f MiB, %d layers). max_model_len %d. "
                      "Maximum concurrency for %d tokens per request: %.2fx",
                      cfg_.num_blocks, cfg_.block_size, pool_tokens, cache_.bytes() / 1048576.0, model_.cfg.n_layers,
                      cfg_.sched.max_model_len, cfg_.sched.max_model_len, (double)pool_tokens / cfg_.sched.max_model_len);
        return buf;
    }

    // Returns the request id. A rejected request still gets an id; its state
    // is finished(rejected) with a reason, and a kRejected event is emitted.
    int add_request(std::vector<int32_t> prompt, const SamplingParams& params) {
        const double t = clock_->now();
        Request* r = sched_.add_request(std::move(prompt), params, t);
        if (r->finish_reason == FinishReason::kRejected) {
            metrics_.num_requests_rejected++;
            emit({EventType::kRejected, r->id, t, -1, -1, FinishReason::kRejected});
        }
        return r->id;
    }

    bool abort(int id) {
        const double t = clock_->now();
        if (!sched_.abort(id, t)) return false;
        metrics_.num_requests_aborted++;
        emit({EventType::kFinished, id, t, -1, -1, FinishReason::kAborted});
        return true;
    }

    bool has_unfinished() const { return sched_.has_unfinished(); }

    // One engine step. Returns the number of tokens computed.
    int step() {
        SchedulerOutput so = sched_.schedule();
        const double t_sched = clock_->now();
        for (Request* r : so.preempted) emit({EventType::kPreempted, r->id, t_sched});
        for (Request* r : so.resumed) emit({EventType::kResumed, r->id, t_sched});
        if (so.scheduled.empty() && sched_.has_unfinished())
            // Cannot happen by construction (add_request rejects what can never
            // fit); if it ever does, fail loudly instead of spinning forever.
            throw std::logic_error("engine made no progress with requests pending");

        // Build the flat batch: each request contributes the tokens
        // [num_computed, num_computed + n) of prompt + outputs.
        ForwardBatch batch;
        std::vector<Request*> sampled;  // requests whose last token is in this step
        for (const ScheduledRequest& s : so.scheduled) {
            Request& r = *s.req;
            const int first = r.num_computed_tokens;
            const bool reaches_end = first + s.num_new_tokens == r.num_tokens();
            batch.add_sequence(r.block_table.blocks, cfg_.block_size, r.tokens.data() + first, first, s.num_new_tokens, reaches_end);
            if (reaches_end) sampled.push_back(&r);
            // Accounting: what part of this is doing work again?
            const int recomputed = std::max(0, std::min(first + s.num_new_tokens, r.num_computed_high_water) - first);
            metrics_.recomputed_tokens_total += recomputed;
            metrics_.computed_tokens_total += s.num_new_tokens;
            const int first_time_prompt = std::max(0, std::min(first + s.num_new_tokens, r.num_prompt_tokens) -
                                                          std::max(first, r.num_computed_high_water));
            metrics_.prompt_tokens_total += first_time_prompt;
        }
        if (batch.num_tokens() > 0) fwd_.forward(batch, logits_);
        for (const ScheduledRequest& s : so.scheduled) sched_.on_computed(*s.req, s.num_new_tokens);

        // Sample one token for every request whose sequence is fully computed.
        const double t_out = clock_->now();
        const int V = model_.cfg.vocab_size;
        for (size_t i = 0; i < sampled.size(); ++i) {
            Request& r = *sampled[i];
            if (r.finished()) continue;  // aborted from an event callback earlier in this loop
            const int out_index = r.num_output_tokens();
            float* row = logits_.data() + i * V;
            const float coin = r.params.temperature == 0.0f ? 0.0f : coin_for(r.params.seed, out_index);
            const int token = sample_token(row, V, r.params.temperature, r.params.top_p, coin, scratch_);
            r.tokens.push_back(token);
            record_token_latency(r, t_out);
            metrics_.generation_tokens_total++;
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
        update_gauges(so);
        clock_->on_step_end();
        maybe_log();
        return so.num_scheduled_tokens;
    }

    void run_until_done() {
        while (has_unfinished()) step();
    }

    // "" when the block pool agrees with every request's block table.
    std::string check_invariants() const { return pool_.check_invariants(sched_.all_block_tables()); }

    // The vLLM-style periodic line (also available on demand).
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
    std::string prometheus() const {
        std::ostringstream o;
        auto counter = [&](const char* name, const char* help, long v) {
            o << "# HELP pagedkv:" << name << " " << help << "\n# TYPE pagedkv:" << name << " counter\npagedkv:" << name << " " << v << "\n";
        };
        auto gauge = [&](const char* name, const char* help, double v) {
            o << "# HELP pagedkv:" << name << " " << help << "\n# TYPE pagedkv:" << name << " gauge\npagedkv:" << name << " " << v << "\n";
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
        const std::vector<double> lat = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 25, 50, 100};
        counter("num_preemptions_total", "Requests preempted (KV cache out of free blocks).", metrics_.num_preemptions_total);
        counter("prompt_tokens_total", "Prompt tokens computed for the first time.", metrics_.prompt_tokens_total);
        counter("generation_tokens_total", "Output tokens emitted.", metrics_.generation_tokens_total);
        counter("recomputed_tokens_total", "Tokens computed again after a preemption.", metrics_.recomputed_tokens_total);
        counter("computed_tokens_total", "All tokens through the model.", metrics_.computed_tokens_total);
        counter("prefix_cache_queries_total", "Tokens looked up in the prefix cache.", metrics_.prefix_cache_queries);
        counter("prefix_cache_hits_total", "Tokens served by the prefix cache.", metrics_.prefix_cache_hits);
        counter("request_success_total", "Requests completed (stop token or length limit).", metrics_.num_requests_finished);
        counter("request_aborted_total", "Requests aborted by the client.", metrics_.num_requests_aborted);
        counter("request_rejected_total", "Requests rejected at admission.", metrics_.num_requests_rejected);
        gauge("kv_cache_usage_perc", "Fraction of KV blocks in use (0..1).", metrics_.kv_cache_usage_perc);
        gauge("num_requests_running", "Requests in the running set.", metrics_.num_requests_running);
        gauge("num_requests_waiting", "Requests waiting (new or preempted).", metrics_.num_requests_waiting);
        histogram("inter_token_latency_seconds", "Time between consecutive tokens of a request.", metrics_.inter_token_latency, lat);
        histogram("time_to_first_token_seconds", "Arrival to first token.", metrics_.time_to_first_token, lat);
        histogram("e2e_request_latency_seconds", "Arrival to finish.", metrics_.e2e_request_latency, lat);
        histogram("request_preemptions", "Preemptions per finished request.", metrics_.request_preemptions, {0, 1, 2, 4, 8, 16, 32});
        return o.str();
    }

private:
    static EngineConfig derive(const Model& m, EngineConfig c) {
        if (c.num_blocks <= 0) throw std::invalid_argument("--num-blocks must be >= 1");
        if (c.block_size <= 0) throw std::invalid_argument("--block-size must be >= 1");
        const long pool_tokens = (long)c.num_blocks * c.block_size;
        if (c.sched.max_model_len == 0) c.sched.max_model_len = (int)std::min<long>(m.cfg.seq_len, pool_tokens);
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
    FinishReason stop_reason(const Request& r, int token) const {
        if (token == cfg_.eos_token_id && !r.params.ignore_eos) return FinishReason::kStop;
        for (int32_t s : r.params.stop_token_ids)
            if (token == s) return FinishReason::kStop;
        if (r.num_output_tokens() >= r.params.max_tokens) return FinishReason::kMaxTokens;
        if (r.num_tokens() >= cfg_.sched.max_model_len) return FinishReason::kMaxModelLen;
        return FinishReason::kNone;
    }

    void update_gauges(const SchedulerOutput&) {
        metrics_.num_steps++;
        metrics_.num_preemptions_total = sched_.num_preemptions_total;
        metrics_.prefix_cache_queries = sched_.prefix_cache_queries;
        metrics_.prefix_cache_hits = sched_.prefix_cache_hits;
        metrics_.kv_cache_usage_perc = pool_.kv_cache_usage_perc();
        metrics_.max_kv_cache_usage_perc = std::max(metrics_.max_kv_cache_usage_perc, metrics_.kv_cache_usage_perc);
        metrics_.num_requests_running = (int)sched_.running().size();
        metrics_.num_requests_waiting = (int)sched_.waiting().size();
    }

    void maybe_log() {
        if (!on_log || cfg_.log_interval_s <= 0) return;
        if (clock_->now() - last_log_time_ >= cfg_.log_interval_s) on_log(log_line());
    }

    const Model& model_;
    EngineConfig cfg_;
    KVCache cache_;
    BlockPool pool_;
    Scheduler sched_;
    CpuForward fwd_;
    WallClock wall_clock_;
    Clock* clock_;
    Metrics metrics_;
    std::vector<float> logits_;                      // [num sampled, vocab]
    std::vector<std::pair<float, int>> scratch_;     // top-p scratch
    double last_log_time_ = 0;
    long logged_prompt_ = 0, logged_gen_ = 0;
};

}  // namespace pkv

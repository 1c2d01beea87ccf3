// core/metrics.hpp -- chapter 7: what an operator sees: counters, gauges,
// latency samples, the periodic log line and the Prometheus text. Read with
// engine.hpp (chapters 6 and 7), which fills these numbers in once per step.
//
// Two kinds of numbers, as in Prometheus: counters only ever grow (compare two
// scrapes to get a rate), gauges are "as of now". The TUTORIAL reads thrash off
// them: num_preemptions_total climbing, kv_cache_usage_perc pinned at 100%, and
// inter-token latency p99 far above p50, because the first token after a pause
// carries the whole pause.
//
// Sections: 1. latency samples  2. the scheduler's counters and the Metrics
// snapshot  3. the log line  4. Prometheus text.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace pkv {

// ============================================================================
// 1. Latency samples
// ============================================================================
//
// Kept whole: our runs are small, and exact percentiles read better in a
// tutorial than bucket interpolation. vLLM exports histograms, and
// percentiles are then estimated from buckets at query time
// (histogram_quantile in PromQL): cheap at any scale, approximate. Keeping
// every sample is exact but grows with the run; fine for the runs here, not
// for a server that runs for weeks.
struct LatencySamples {
    std::vector<double> v;  // [count] one entry per observation, arrival order
    void add(double x) { v.push_back(x); }
    size_t count() const { return v.size(); }
    double sum() const { double s = 0; for (double x : v) s += x; return s; }
    // Nearest-rank percentile, p in [0, 100]. 0 when empty.
    // The smallest sample that at least p% of the samples do not exceed: always
    // a value that was really observed, never an interpolation. Selects from
    // a copy on every call (linear time, std::nth_element): meant for
    // end-of-run reports, not for the step loop.
    double percentile(double p) const {
        if (!(p >= 0.0 && p <= 100.0)) throw std::invalid_argument("percentile: p must be in [0, 100]");
        if (v.empty()) return 0.0;
        std::vector<double> s = v;
        const size_t rank = (size_t)std::ceil(p / 100.0 * (double)s.size());
        const size_t k = rank == 0 ? 0 : std::min(rank, s.size()) - 1;
        std::nth_element(s.begin(), s.begin() + (ptrdiff_t)k, s.end());
        return s[k];
    }
};

// ============================================================================
// 2. The scheduler's counters, and the snapshot the engine keeps up to date
// ============================================================================

// Counted where they happen, in the scheduler (Scheduler::stats()), and
// copied into Metrics once per step. vLLM keeps its SchedulerStats beside its
// metrics too (vllm/v1/metrics/stats.py).
struct SchedulerStats {
    long num_preemptions_total = 0;
    // In tokens, as vLLM counts them, for admissions that happened (not once
    // per step spent waiting at the head of the queue).
    long prefix_cache_queries = 0;  // tokens looked up at admission
    long prefix_cache_hits = 0;     // tokens served from cache at admission
};

struct Metrics {
    // Counters (vLLM names, without the vllm: prefix).
    long num_preemptions_total = 0;
    long prompt_tokens_total = 0;      // prompt tokens computed for the first time
    long generation_tokens_total = 0;  // output tokens emitted: the useful work
    long recomputed_tokens_total = 0;  // tokens computed again after a preemption: wasted work
    // The three add up to this one, except that the last output token of each
    // request is sampled but never fed back (tests/test_scheduler.cpp checks
    // the identity).
    long computed_tokens_total = 0;    // every token through the model (prompt + decode + recompute)
    long prefix_cache_queries = 0;     // tokens
    long prefix_cache_hits = 0;        // tokens
    // vLLM counts finished requests in one counter labelled by finish reason;
    // we keep separate counters, so the report needs no label parsing.
    long num_requests_finished = 0;  // completed: stop token or a length limit
    long num_requests_aborted = 0;
    long num_requests_rejected = 0;
    long num_requests_failed = 0;    // finished with an error in their forward pass
    long num_steps = 0;
    // Preemption by swap (a swapping policy, lab/policies.hpp): the price is
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

    // A token reached its client at `t`. Time to first token counts from
    // arrival, queueing included; an inter-token gap across a preemption
    // holds the whole pause, as a client feels it. `last` < 0: the first token.
    void on_token(double t, double arrival, double last) {
        if (last < 0) time_to_first_token.add(t - arrival);
        else inter_token_latency.add(t - last);
        generation_tokens_total++;
    }
    // A request finished normally (a stop token or a length limit).
    void on_finished(double e2e_seconds, int num_preemptions) {
        num_requests_finished++;
        e2e_request_latency.add(e2e_seconds);
        request_preemptions.add(num_preemptions);
    }
    // A step's swap copies (a swapping policy's): blocks each way, block_bytes each.
    void on_swap(size_t blocks_out, size_t blocks_in, size_t block_bytes) {
        swap_out_bytes += (long)(blocks_out * block_bytes);
        swap_in_bytes += (long)(blocks_in * block_bytes);
    }
    // A step ended: the gauges as of now, the peak of KV usage, and the
    // counters the scheduler keeps (it is where preemptions and prefix-cache
    // hits happen), copied in.
    void on_step_end(double kv_usage, int running, int waiting, const SchedulerStats& s) {
        num_steps++;
        kv_cache_usage_perc = kv_usage;
        max_kv_cache_usage_perc = std::max(max_kv_cache_usage_perc, kv_usage);
        num_requests_running = running;
        num_requests_waiting = waiting;
        num_preemptions_total = s.num_preemptions_total;
        prefix_cache_queries = s.prefix_cache_queries;
        prefix_cache_hits = s.prefix_cache_hits;
    }
};

// ============================================================================
// 3. The periodic log line
// ============================================================================
//
// vLLM's line reads "Avg prompt throughput ... Avg generation throughput ...
// Running: N reqs, Waiting: N reqs, GPU KV cache usage ..., Prefix cache hit
// rate ...". We say "KV cache usage" (the cache may live in host memory) and
// append two fields vLLM does not print, Preemptions (running total) and
// Recomputed (tokens, running total): with them, one glance at the log tells
// thrash from honest load.
//
// The throughputs are averages since the previous line, so this object keeps
// the counters and the time of the last line. Prompt throughput counts
// first-time prompt tokens only; a recompute shows up in Recomputed, not as a
// burst of prompt work.
class ThroughputLog {
public:
    explicit ThroughputLog(double start_time = 0.0) : last_time_(start_time) {}
    double last_time() const { return last_time_; }

    std::string line(const Metrics& m, double now) {
        const double dt = std::max(1e-9, now - last_time_);
        const long hits = m.prefix_cache_hits, queries = m.prefix_cache_queries;
        char buf[512];
        std::snprintf(buf, sizeof buf,
                      "Avg prompt throughput: %.1f tokens/s, Avg generation throughput: %.1f tokens/s, Running: %d reqs, "
                      "Waiting: %d reqs, KV cache usage: %.1f%%, Prefix cache hit rate: %.1f%%, Preemptions: %ld, "
                      "Recomputed: %ld tokens",
                      (m.prompt_tokens_total - logged_prompt_) / dt, (m.generation_tokens_total - logged_gen_) / dt,
                      m.num_requests_running, m.num_requests_waiting, 100.0 * m.kv_cache_usage_perc,
                      queries ? 100.0 * hits / queries : 0.0, m.num_preemptions_total, m.recomputed_tokens_total);
        last_time_ = now;
        logged_prompt_ = m.prompt_tokens_total;
        logged_gen_ = m.generation_tokens_total;
        return buf;
    }

private:
    double last_time_;
    long logged_prompt_ = 0, logged_gen_ = 0;  // counters at the last line
};

// ============================================================================
// 4. Prometheus text exposition format, pagedkv: instead of vllm:
// ============================================================================
//
// Each metric family is a "# HELP" line, a "# TYPE" line and its samples.
// A histogram's buckets are cumulative: bucket le="b" counts samples <= b,
// and le="+Inf" equals _count. Prometheus reserves colons in names for
// recording rules by convention; vLLM uses the "vllm:" prefix anyway, and
// we mirror it so dashboards written for vLLM need only a rename. vLLM
// also attaches labels (model name, engine); one engine, one model here.
// Buckets are computed from the kept samples at scrape time, one pass per
// bucket: simple, and a scrape of a tutorial-sized run is instant.
inline std::string prometheus_text(const Metrics& m) {
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
    scalar("counter", "num_preemptions_total", "Requests preempted (KV cache out of free blocks).", m.num_preemptions_total);
    scalar("counter", "prompt_tokens_total", "Prompt tokens computed for the first time.", m.prompt_tokens_total);
    scalar("counter", "generation_tokens_total", "Output tokens emitted.", m.generation_tokens_total);
    scalar("counter", "recomputed_tokens_total", "Tokens computed again after a preemption.", m.recomputed_tokens_total);
    scalar("counter", "computed_tokens_total", "All tokens through the model.", m.computed_tokens_total);
    scalar("counter", "swap_outs_total", "Victims copied to host swap space.", m.num_swap_outs);
    scalar("counter", "swap_ins_total", "Swapped victims copied back and resumed.", m.num_swap_ins);
    scalar("counter", "swap_out_bytes_total", "Bytes copied device to host by swap-outs.", m.swap_out_bytes);
    scalar("counter", "swap_in_bytes_total", "Bytes copied host to device by swap-ins.", m.swap_in_bytes);
    scalar("counter", "swap_fallbacks_total", "Victims recomputed because the swap space was full.", m.num_swap_fallbacks);
    scalar("gauge", "swap_space_usage_perc", "Fraction of host swap slots in use (0..1).", m.swap_space_usage_perc);
    scalar("counter", "prefix_cache_queries_total", "Tokens looked up in the prefix cache.", m.prefix_cache_queries);
    scalar("counter", "prefix_cache_hits_total", "Tokens served by the prefix cache.", m.prefix_cache_hits);
    scalar("counter", "request_success_total", "Requests completed (stop token or length limit).", m.num_requests_finished);
    scalar("counter", "request_aborted_total", "Requests aborted by the client.", m.num_requests_aborted);
    scalar("counter", "request_rejected_total", "Requests rejected at admission.", m.num_requests_rejected);
    scalar("counter", "request_failed_total", "Requests finished by an error in their forward pass.", m.num_requests_failed);
    scalar("gauge", "kv_cache_usage_perc", "Fraction of KV blocks in use (0..1).", m.kv_cache_usage_perc);
    scalar("gauge", "num_requests_running", "Requests in the running set.", (double)m.num_requests_running);
    scalar("gauge", "num_requests_waiting", "Requests waiting (new or preempted).", (double)m.num_requests_waiting);
    histogram("inter_token_latency_seconds", "Time between consecutive tokens of a request.", m.inter_token_latency, lat);
    histogram("time_to_first_token_seconds", "Arrival to first token.", m.time_to_first_token, lat);
    histogram("e2e_request_latency_seconds", "Arrival to finish.", m.e2e_request_latency, lat);
    histogram("request_preemptions", "Preemptions per finished request.", m.request_preemptions, {0, 1, 2, 4, 8, 16, 32});
    return o.str();
}

}  // namespace pkv

// core/metrics.hpp -- chapter 6: what an operator sees: counters, gauges,
// latency samples, the periodic log line and the Prometheus text. Read with
// engine.hpp (chapters 5 and 6), which fills these numbers in once per step.
//
// Two kinds of numbers, as in Prometheus: counters only ever grow (compare two
// scrapes to get a rate), gauges are "as of now". The TUTORIAL reads thrash off
// them: num_preemptions_total climbing, kv_cache_usage_perc pinned at 100%, and
// inter-token latency p99 far above p50, because the first token after a pause
// carries the whole pause.
//
// Sections: 1. latency samples  2. the Metrics snapshot  3. the log line  4. Prometheus text.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>
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
// for a server that runs for weeks. So every observation is also counted into
// fixed histogram buckets, vLLM's, which is all the Prometheus text (section
// 4) needs, and a server turns the samples off (keep = false, through
// EngineConfig::keep_latency_samples): its memory then stays flat.

// A Prometheus histogram: a count per bucket, the buckets fixed at
// construction. Its memory never grows with the observations.
struct Histogram {
    std::vector<double> le;  // [buckets] upper bounds, increasing; +Inf is implied
    std::vector<long> n;     // [buckets + 1] observations per bucket, not cumulative; the last: above every bound
    double sum = 0;
    long count = 0;
    Histogram() : n(1, 0) {}
    explicit Histogram(std::vector<double> bounds) : le(std::move(bounds)), n(le.size() + 1, 0) {}
    void add(double x) {
        // The first bound >= x: bucket le="b" holds the observations <= b.
        n[(size_t)(std::lower_bound(le.begin(), le.end(), x) - le.begin())]++;
        sum += x;
        count++;
    }
};

// vLLM's bucket ladders (vllm/v1/metrics/loggers.py, read at a v0.9-era
// commit, 005a810; not re-read at v0.28), one per kind of latency, so that a
// vLLM dashboard's histogram_quantile reads ours the same way: time to first
// token from 1 ms, the gap between two tokens from 10 ms, whole requests
// (and their queue, prefill and decode phases) from 0.3 s.
inline std::vector<double> ttft_buckets() {
    return {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0};
}
inline std::vector<double> itl_buckets() {
    return {0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0};
}
inline std::vector<double> request_latency_buckets() {
    return {0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0};
}

struct LatencySamples {
    std::vector<double> v;  // [count] one entry per observation, arrival order (only while keep)
    Histogram hist;         // every observation, counted into its buckets
    bool keep = true;       // keep each sample (exact percentiles); false: the histogram alone
    LatencySamples() = default;
    explicit LatencySamples(std::vector<double> buckets) : hist(std::move(buckets)) {}
    void add(double x) {
        if (keep) v.push_back(x);
        hist.add(x);
    }
    size_t count() const { return (size_t)hist.count; }
    double sum() const { return hist.sum; }
    // Nearest-rank percentile, p in [0, 100]. 0 when empty.
    // The smallest sample that at least p% of the samples do not exceed: always
    // a value that was really observed, never an interpolation. Selects from
    // a copy on every call (linear time, std::nth_element): meant for
    // end-of-run reports, not for the step loop. Only kept samples have one.
    double percentile(double p) const {
        if (!(p >= 0.0 && p <= 100.0)) throw std::invalid_argument("percentile: p must be in [0, 100]");
        if (!keep) throw std::logic_error("percentile: these samples are not kept (keep = false): only their histogram is");
        if (v.empty()) return 0.0;
        std::vector<double> s = v;
        const size_t rank = (size_t)std::ceil(p / 100.0 * (double)s.size());
        const size_t k = rank == 0 ? 0 : std::min(rank, s.size()) - 1;
        std::nth_element(s.begin(), s.begin() + (ptrdiff_t)k, s.end());
        return s[k];
    }
};

// ============================================================================
// 2. The snapshot the engine keeps up to date
// ============================================================================

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
    // we keep separate counters, so the report needs no label parsing (the
    // Prometheus text labels them as vLLM does, section 4).
    long num_requests_finished = 0;  // completed: stop token or a length limit
    long num_requests_length = 0;    // of those, ended by a length limit (max_tokens, max_model_len)
    long num_requests_aborted = 0;
    long num_requests_rejected = 0;
    long num_requests_failed = 0;    // finished with an error in their forward pass
    long num_steps = 0;
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
    LatencySamples inter_token_latency{itl_buckets()};
    LatencySamples time_to_first_token{ttft_buckets()};
    LatencySamples e2e_request_latency{request_latency_buckets()};
    LatencySamples request_preemptions{{0, 1, 2, 4, 8, 16, 32}};  // per finished request

    // Keep every latency sample (exact percentiles), or only histogram buckets
    // (flat memory, for a server: section 1).
    void keep_samples(bool keep) {
        for (LatencySamples* l : {&inter_token_latency, &time_to_first_token, &e2e_request_latency, &request_preemptions}) l->keep = keep;
    }

    // A token reached its client at `t`. Time to first token counts from
    // arrival, queueing included; an inter-token gap across a preemption
    // holds the whole pause, as a client feels it. `last` < 0: the first token.
    void on_token(double t, double arrival, double last) {
        if (last < 0) time_to_first_token.add(t - arrival);
        else inter_token_latency.add(t - last);
        generation_tokens_total++;
    }
    // A request finished normally (a stop token, or a length limit: by_length).
    void on_finished(double e2e_seconds, int num_preemptions, bool by_length) {
        num_requests_finished++;
        num_requests_length += by_length;
        e2e_request_latency.add(e2e_seconds);
        request_preemptions.add(num_preemptions);
    }
    // The gauges as of now: at a step's end, and whenever they are read
    // between steps (Engine::prometheus), when an abort may have changed them.
    void set_gauges(double kv_usage, int running, int waiting) {
        kv_cache_usage_perc = kv_usage;
        max_kv_cache_usage_perc = std::max(max_kv_cache_usage_perc, kv_usage);
        num_requests_running = running;
        num_requests_waiting = waiting;
    }
    // A step ended: the gauges as of now, the peak of KV usage, and the
    // counters the scheduler keeps (it is where preemptions and prefix-cache
    // hits happen: Scheduler::stats(), scheduler.hpp), copied in.
    void on_step_end(double kv_usage, int running, int waiting, long preemptions, long prefix_queries, long prefix_hits) {
        num_steps++;
        set_gauges(kv_usage, running, waiting);
        num_preemptions_total = preemptions;
        prefix_cache_queries = prefix_queries;
        prefix_cache_hits = prefix_hits;
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
// labels every sample with the served model's name (model_name, which its
// Grafana dashboard filters on) and the engine's index; we do the first:
// `labels` is a label list such as model_name="built-in" (examples/serve.cpp
// passes it), or "" for none. Finished requests are one family, as in vLLM:
// request_success_total{finished_reason="stop"|"length"|"abort"} (vLLM
// counts aborted requests there too). Histograms are read from their fixed
// buckets (section 1): a scrape costs the same after a billion observations.
// The helpers also write the families a server (examples/serve.cpp) or
// lab/ code adds of its own.

// Two label lists as one: model_name="m" and le="0.1" give model_name="m",le="0.1".
inline std::string label_join(const std::string& a, const std::string& b) { return a.empty() ? b : b.empty() ? a : a + "," + b; }
// A label's value as the text format quotes it: \, " and newline escaped.
inline std::string prometheus_escape(const std::string& v) {
    std::string e;
    for (char c : v) e += c == '\\' ? "\\\\" : c == '"' ? "\\\"" : c == '\n' ? "\\n" : std::string(1, c);
    return e;
}
// A label list as a sample writes it: in braces, or nothing when empty.
inline std::string prometheus_labels(const std::string& l) { return l.empty() ? "" : "{" + l + "}"; }

// A family's "# HELP" and "# TYPE" lines.
inline void prometheus_family(std::ostream& o, const std::string& type, const std::string& name, const std::string& help) {
    o << "# HELP pagedkv:" << name << " " << help << "\n# TYPE pagedkv:" << name << " " << type << "\n";
}

// One sample. `v` keeps the type the caller passes (long for counters,
// double for gauges), because an ostream prints the two differently once a
// value passes 999999 (1234567 vs 1.23457e+06): keep the casts at the call
// sites to keep the output.
template <class T>
inline void prometheus_sample(std::ostream& o, const std::string& name, const std::string& labels, T v) {
    o << "pagedkv:" << name << prometheus_labels(labels) << " " << v << "\n";
}

// A histogram family: cumulative buckets, +Inf, _sum and _count.
inline void prometheus_histogram(std::ostream& o, const std::string& name, const std::string& help, const Histogram& h,
                                 const std::string& labels) {
    prometheus_family(o, "histogram", name, help);
    long below = 0;
    for (size_t k = 0; k < h.le.size(); ++k) {
        below += h.n[k];
        std::ostringstream le;
        le << "le=\"" << h.le[k] << "\"";
        o << "pagedkv:" << name << "_bucket" << prometheus_labels(label_join(labels, le.str())) << " " << below << "\n";
    }
    o << "pagedkv:" << name << "_bucket" << prometheus_labels(label_join(labels, "le=\"+Inf\"")) << " " << h.count << "\n";
    o << "pagedkv:" << name << "_sum" << prometheus_labels(labels) << " " << h.sum << "\n";
    o << "pagedkv:" << name << "_count" << prometheus_labels(labels) << " " << h.count << "\n";
}

inline std::string prometheus_text(const Metrics& m, const std::string& labels = "") {
    std::ostringstream o;
    // A counter or a gauge: one sample.
    auto scalar = [&](const char* type, const char* name, const char* help, auto v) {
        prometheus_family(o, type, name, help);
        prometheus_sample(o, name, labels, v);
    };
    scalar("counter", "num_preemptions_total", "Requests preempted (KV cache out of free blocks).", m.num_preemptions_total);
    scalar("counter", "prompt_tokens_total", "Prompt tokens computed for the first time.", m.prompt_tokens_total);
    scalar("counter", "generation_tokens_total", "Output tokens emitted.", m.generation_tokens_total);
    scalar("counter", "recomputed_tokens_total", "Tokens computed again after a preemption.", m.recomputed_tokens_total);
    scalar("counter", "computed_tokens_total", "All tokens through the model.", m.computed_tokens_total);
    scalar("counter", "prefix_cache_queries_total", "Tokens looked up in the prefix cache.", m.prefix_cache_queries);
    scalar("counter", "prefix_cache_hits_total", "Tokens served by the prefix cache.", m.prefix_cache_hits);
    prometheus_family(o, "counter", "request_success_total", "Requests finished, by reason: stop (a stop token), length (a length limit), abort (the client left).");
    prometheus_sample(o, "request_success_total", label_join(labels, "finished_reason=\"stop\""), m.num_requests_finished - m.num_requests_length);
    prometheus_sample(o, "request_success_total", label_join(labels, "finished_reason=\"length\""), m.num_requests_length);
    prometheus_sample(o, "request_success_total", label_join(labels, "finished_reason=\"abort\""), m.num_requests_aborted);
    scalar("counter", "request_aborted_total", "Requests aborted by the client (request_success_total's abort).", m.num_requests_aborted);
    scalar("counter", "request_rejected_total", "Requests rejected at admission.", m.num_requests_rejected);
    scalar("counter", "request_failed_total", "Requests finished by an error in their forward pass.", m.num_requests_failed);
    scalar("gauge", "kv_cache_usage_perc", "Fraction of KV blocks in use (0..1).", m.kv_cache_usage_perc);
    scalar("gauge", "num_requests_running", "Requests in the running set.", (double)m.num_requests_running);
    scalar("gauge", "num_requests_waiting", "Requests waiting (new or preempted).", (double)m.num_requests_waiting);
    prometheus_histogram(o, "inter_token_latency_seconds", "Time between consecutive tokens of a request.", m.inter_token_latency.hist, labels);
    prometheus_histogram(o, "time_to_first_token_seconds", "Arrival to first token.", m.time_to_first_token.hist, labels);
    prometheus_histogram(o, "e2e_request_latency_seconds", "Arrival to finish.", m.e2e_request_latency.hist, labels);
    prometheus_histogram(o, "request_preemptions", "Preemptions per finished request.", m.request_preemptions.hist, labels);
    return o.str();
}

}  // namespace pkv

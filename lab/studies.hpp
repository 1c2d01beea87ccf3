// lab/studies.hpp -- lab/LAB.md chapter L5 (verdicts: L7). Every study: a
// short table of variants, run on one device (this CPU, or a simulated GPU),
// and a conclusion computed from its own numbers. Each study names the
// claims it tests (study_kit.hpp's list), prints its evidence, and ends with
// a verdict per claim -- supported, contradicted, mixed, or not shown -- that
// the same code would print the other way round if the numbers went the
// other way. Each verdict is decided by a small function of the study's
// numbers (decide_*), so that a test can hand it numbers that go the other
// way; and wherever two arms are compared, a difference inside the draw band
// (kDrawBand) is a draw, never a win.
//
// How the tests were chosen. Each claim is tested as its text reads, and its
// thresholds and workload were chosen from that text and from what the
// claim takes for granted -- its premise -- before any verdict was seen; the
// reason for each sits beside it. A claim about what preemption does needs a
// preemption; one about shedding needs a queue at the door; one about
// capping generation needs a request that runs away. Where the premise did
// not occur, the verdict is "not shown" (verdict_if, study_kit.hpp), never
// "contradicted" because nothing happened, and the numbers that decided it
// travel with the verdict.
//
// The workload (section 1). Requests arrive as a Poisson process at a load,
// a multiple of the capacity the device showed on the same requests, for a
// fixed *time* -- several drain times, long enough for an overload to
// build and hold -- with long-tailed (lognormal) lengths; or they replay an
// Azure production trace (traffic.hpp section 2), time-scaled to the same
// offered load. The arms of a comparison always serve the same requests at
// the same times. Where a study keeps every request arriving at once, it
// says why.
//
// A verdict holds for the inputs it was computed at. Every study reads the
// workload's inputs from its Env -- the traffic, its seed, a scale on every
// length, the load -- and study_map.hpp runs a study over a grid of them to
// show where each claim holds.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "lab/study_kit.hpp"
#include "examples/svg.hpp"

namespace study {

// What a study produces.
struct StudyResult {
    std::vector<std::string> notes;  // lines printed above the table (workload, pool)
    Table table;
    std::vector<Table> extra;        // further tables (e.g. a time series)
    std::vector<ClaimVerdict> verdicts;
    std::vector<svg::Chart> charts;
};

struct Study {
    std::string name, title;
    std::vector<std::string> claims;
    std::function<StudyResult(const Env&)> run;
};

// ============================================================================
// 1. The workload every study starts from
// ============================================================================

// Tokens the scenario's pool holds (per replica).
inline long pool_tokens(const Env& env, const Scenario& sc) {
    if (!env.sim() || sc.num_blocks > 0) return (long)sc.num_blocks * sc.block_size;
    pkv::SimConfig s = env.sim_config_for(sc.pcie);
    if (sc.kv_bytes_override > 0) s.model.kv_bytes = sc.kv_bytes_override;
    if (sc.memory_utilization > 0) s.memory_utilization = sc.memory_utilization;
    const pkv::KVPoolSize k = pkv::kv_pool_size(s.model, s.hw.memory_bytes, s.memory_utilization, sc.block_size,
                                                sc.max_num_batched_tokens, sc.max_num_seqs);
    return (long)k.num_blocks * sc.block_size;
}

// The base: the requests, the pool and the bet's overcommit.
//   lengths   long-tailed: lognormal (sigma 1, traffic.hpp's chat_like
//             shape), each capped at 4x its mean and the whole request at the
//             model's context. Outputs four times longer than prompts, so the
//             pool drains through *growth*, which is what the admission bet
//             loses on. Means: on the CPU 32 + 160 tokens (its pool holds 4
//             such requests); on a simulated GPU 256 + 1024 (x scale), so
//             that a GPU pool holds hundreds of them, the concurrency a GPU
//             serves. Or a trace's own lengths (x scale), each capped at a
//             quarter of the context for the output and the rest for the
//             prompt.
//   pool     on the CPU 48 blocks of 16; on a GPU, vLLM's rule.
//   fit      the requests the pool holds at their mean length; the bet runs
//            max_num_seqs = 4 x fit (vLLM's default of 256 or more is
//            likewise several times what a pool holds of long requests).
struct Base {
    Scenario sc;             // no arrivals yet: with_load() adds them
    int fit = 0;             // requests the pool holds at their mean length
    int fit_longest = 0;     // ... at their longest (capped) length
    double mean_tokens = 0;  // prompt + output, the mean over the requests
    long pool = 0;           // token slots per replica
    std::shared_ptr<const Trace> trace;  // the replayed trace, if any
};

// A length x the env's scale, at least 1.
inline int scaled(const Env& env, double n) { return std::max(1, (int)std::lround(env.scale * n)); }

inline Base base_scenario(const Env& env) {
    Base b;
    Scenario& s = b.sc;
    s.name = "base";
    s.block_size = 16;
    s.traffic.seed = env.seed;
    const bool cpu = !env.sim() || env.measured;
    const int ctx = env.shape().seq_len;
    if (cpu) {
        s.num_blocks = 48;
        s.max_num_batched_tokens = 256;
    } else {
        s.max_num_batched_tokens = 8192;
        s.max_num_seqs = 256;  // for the activation reserve of the pool sizing; set below
    }
    if (env.traffic == "synthetic") {
        const int pm = scaled(env, cpu ? 32 : 256), om = scaled(env, cpu ? 160 : 1024);
        const int phi = std::min(4 * pm, ctx / 2), ohi = std::max(1, std::min(4 * om, ctx - phi - 1));
        s.traffic.prompt = LengthDist::lognormal(pm, 1.0, 2, std::max(2, phi));
        s.traffic.output = LengthDist::lognormal(om, 1.0, 1, ohi);
    } else {
        b.trace = load_trace(env.traffic);
        const int ohi = std::max(1, ctx / 4), phi = std::max(2, ctx - ohi - 1);
        s.traffic.prompt = LengthDist::uniform(2, phi);  // only its lo and hi clamp the trace's lengths
        s.traffic.output = LengthDist::uniform(1, ohi);
    }
    b.pool = pool_tokens(env, s);
    // The mean length, over the first requests the traffic would serve.
    Scenario probe = s;
    probe.traffic.requests = b.trace ? (int)std::min<size_t>(2000, b.trace->rows.size()) : 2000;
    if (b.trace) {
        auto tr = std::make_shared<TraceReplay>();
        tr->trace = b.trace;
        tr->length_scale = env.scale;
        tr->all_at_once = true;
        probe.traffic.trace = tr;
    }
    double total = 0;
    int longest = 0;
    for (const PlannedRequest& p : plan_traffic(probe.traffic, env.shape().vocab_size)) {
        total += (double)p.prompt.size() + p.params.max_tokens;
        longest = std::max(longest, (int)p.prompt.size() + p.params.max_tokens);
    }
    b.mean_tokens = total / probe.traffic.requests;
    b.fit = (int)std::max(1.0, std::floor((double)b.pool / b.mean_tokens));
    b.fit_longest = (int)std::max(1L, b.pool / std::max(1, longest));
    s.max_num_seqs = 4 * b.fit;
    return b;
}

// The trace replay of `n` requests of the base's trace (none for synthetic
// traffic), at `rate` requests per second or all at once.
inline std::shared_ptr<const TraceReplay> replay(const Env& env, const Base& b, double rate) {
    if (!b.trace) return nullptr;
    auto tr = std::make_shared<TraceReplay>();
    tr->trace = b.trace;
    tr->length_scale = env.scale;
    tr->rate = rate;
    tr->all_at_once = rate <= 0;
    return tr;
}
// The lengths in words: the distributions, or the trace's with their caps.
inline std::string lengths_text(const Scenario& s) {
    if (s.traffic.trace)
        return fmt("prompt and output the trace's, capped at %d and %d tokens", s.traffic.prompt.hi, s.traffic.output.hi);
    return fmt("prompt %s + output %s tokens", s.traffic.prompt.describe().c_str(), s.traffic.output.describe().c_str());
}
// `n` requests of the base's traffic, all at once.
inline Scenario all_at_once(const Env& env, const Base& b, int n) {
    Scenario s = b.sc;
    s.traffic.arrivals = Arrivals{};
    s.traffic.requests = b.trace ? std::min(n, (int)b.trace->rows.size()) : n;
    s.traffic.trace = replay(env, b, 0);
    return s;
}

// What the device sustains on the base's requests: 3 x fit of them at once
// with max_num_seqs = fit (everyone fits: no preemption, the best-behaved
// setting). From it, the drain time: how long the device takes to work
// through one pool's worth of tokens.
struct Capacity {
    double rps = 0;      // completed requests per device second
    double tok_s = 0;    // tokens through the model per device second
    double drain_s = 0;  // pool tokens / tok_s
};
inline Capacity capacity(const Env& env, const Base& b) {
    Scenario c = all_at_once(env, b, 3 * b.fit);
    c.max_num_seqs = b.fit;
    const Measurement m = measure_shared(env, c, fmt("capacity|%d|%d", c.traffic.requests, c.max_num_seqs));
    Capacity cap;
    cap.rps = m.makespan_s > 0 ? m.finished / m.makespan_s : 0;
    cap.tok_s = m.processed_tok_per_s();
    cap.drain_s = cap.tok_s > 0 ? (double)b.pool / cap.tok_s : 0;
    return cap;
}

// The base with arrivals: a Poisson process (or the trace, time-scaled) at
// `load` x the capacity, lasting env.drains drain times -- by time, so that
// an overload has the time to build up and hold, whatever the lengths.
inline Scenario with_load(const Env& env, const Base& b, const Capacity& cap, double load, std::string* note = nullptr) {
    Scenario s = b.sc;
    const double rate = load * cap.rps;
    const double window = env.drains * cap.drain_s;
    int n = std::max(b.fit, (int)std::lround(rate * window));
    if (b.trace) n = std::min(n, (int)b.trace->rows.size());
    s.traffic.requests = n;
    s.traffic.arrivals = Arrivals{Arrivals::Kind::kPoisson, rate, 1};
    s.traffic.trace = replay(env, b, rate);
    if (note)
        *note = fmt("%d requests (%s), %s (mean %.0f in all); %.2gx the capacity of %.3g req/s for %.4g s (%g drain times of %.3g s); "
                    "pool %ld token slots (fit %d at the mean length, %d at the longest)",
                    n, s.traffic.describe_arrivals().c_str(), lengths_text(s).c_str(), b.mean_tokens, load, cap.rps, window, env.drains,
                    cap.drain_s, b.pool, b.fit, b.fit_longest);
    return s;
}

inline std::string describe(const Env& env, const Scenario& s) {
    return fmt("%d requests (%s), %s; pool %ld token slots per replica (blocks of %d); max_num_seqs %d", s.traffic.requests,
               s.traffic.describe_arrivals().c_str(), lengths_text(s).c_str(), pool_tokens(env, s), s.block_size, s.max_num_seqs);
}
inline std::string ms(double s) { return fmt("%.1f", s * 1e3); }
inline std::string sec(double s) { return fmt("%.3f", s); }
inline std::string pct(double x) { return fmt("%.0f%%", 100 * x); }
inline double pct_change(double from, double to) { return from != 0 ? 100.0 * (to - from) / from : 0.0; }

// ---- the draw band ---------------------------------------------------------
//
// Two arms within 5% of each other are a draw: neither wins. Five percent is
// about what the cost model's assumed constants move a result by (the step
// overhead, the efficiencies: chapter L6), and about the run-to-run spread
// of a CPU measurement (chapter L5), so a smaller difference says nothing
// about the claim. One constant, for every comparison of two arms.
constexpr double kDrawBand = 5.0;  // percent
// +1 if `a` is more than the band above `b`, -1 if more than the band below,
// 0 inside it (a draw).
inline int compare(double a, double b) {
    const double d = pct_change(b, a);
    return d > kDrawBand ? 1 : d < -kDrawBand ? -1 : 0;
}
// `x` is below `base` by more than the band, measured against `base` -- what
// "fewer" means for a count that a fix may bring to zero (compare() measures
// against its second argument, which must not be 0).
inline bool below_band(double base, double x) { return x < base * (1.0 - kDrawBand / 100.0); }

// ============================================================================
// 2. thrash: the concurrency sweep (C11, C13)
// ============================================================================

// What the thrash deciders read: the best setting of the sweep and its top.
struct SweepEnds {
    int best_seqs = 0, top_seqs = 0;
    bool top_is_best = false;
    double best_tok_s = 0, top_tok_s = 0;              // useful tokens per device second
    double best_processed = 0, top_processed = 0;      // every token through the model, per device second
    long best_preemptions = 0, top_preemptions = 0;
    double top_busy = 0;   // fraction of the top run's time the device spent in steps
    double top_waste = 0;  // recomputed / computed tokens at the top
};
inline Numbers sweep_premise(const SweepEnds& e) {
    return {{"top_preemptions", (double)e.top_preemptions}, {"best_preemptions", (double)e.best_preemptions}};
}
// C13: "raising concurrency while preemptions climb makes throughput worse".
// Premise: preemptions happen at the top of the sweep. Supported: the top is
// past the best, has more preemptions than the best, and delivers less
// useful throughput by more than the draw band (the claim says "worse", not
// by how much; the band is where "worse" begins). Contradicted: the top is
// the best, or within the band of it. Mixed: worse, but the preemptions did
// not climb (something else made it worse).
inline ClaimVerdict decide_c13(const SweepEnds& e) {
    const double drop = pct_change(e.best_tok_s, e.top_tok_s);
    return verdict_if(e.top_preemptions > 0, "no preemption at the top of the sweep", sweep_premise(e),
                      verdict("C13", !e.top_is_best && e.top_preemptions > e.best_preemptions && drop < -kDrawBand,
                              e.top_is_best || drop >= -kDrawBand,
                              fmt("useful throughput peaks at max_num_seqs %d (%.0f tok/s, %ld preemptions); at %d it is %+.0f%% with %ld "
                                  "preemptions",
                                  e.best_seqs, e.best_tok_s, e.best_preemptions, e.top_seqs, drop, e.top_preemptions),
                              {{"best_max_num_seqs", (double)e.best_seqs}, {"top_max_num_seqs", (double)e.top_seqs}, {"best_tok_s", e.best_tok_s},
                               {"top_tok_s", e.top_tok_s}, {"drop_pct", drop}, {"top_preemptions", (double)e.top_preemptions}}));
}
// C11: "sustained preemption is thrash: the device stays busy while useful
// throughput drops". Premise: the top of the sweep preempts. The claim's
// point is that utilisation misleads: at the top the device is busy (>= 95%
// of the time: "stays busy" with a margin for arrival gaps) and it
// processes as many tokens per second as at the best setting or more
// (processed tok/s not lower by more than the draw band), while useful
// tokens per second fall by more than the band. Supported: all three.
// Contradicted: useful throughput does not fall (within the band of the
// best, or the top is the best): no thrash. Mixed: it falls, but the device
// idles or processes fewer tokens too -- slower, not thrashing.
inline ClaimVerdict decide_c11(const SweepEnds& e) {
    const double drop = pct_change(e.best_tok_s, e.top_tok_s), processed = pct_change(e.best_processed, e.top_processed);
    return verdict_if(e.top_preemptions > 0, "no preemption at the top of the sweep", sweep_premise(e),
                      verdict("C11", e.top_busy >= 0.95 && processed >= -kDrawBand && drop < -kDrawBand, e.top_is_best || drop >= -kDrawBand,
                              fmt("at max_num_seqs %d the device is busy %.0f%% of the time and processes %+.0f%% tokens/s against the best "
                                  "setting (%d), %.0f%% of them recomputed, while useful throughput is %+.0f%%",
                                  e.top_seqs, 100 * e.top_busy, processed, e.best_seqs, 100 * e.top_waste, drop),
                              {{"top_busy", e.top_busy}, {"processed_pct", processed}, {"top_recompute_share", e.top_waste}, {"drop_pct", drop}}));
}

// The sweep: max_num_seqs from fit/4 to 8 x fit (a map cell runs fit, 2 x
// fit and 8 x fit only: below fit nothing is preempted, and the best
// setting is at fit or above on a GPU), every setting serving the same
// arrivals: the base at `load` x the capacity (default 2: twice what the
// best-behaved setting sustains, an overload held for the whole window; a
// map also tries 0.5, where a setting that keeps up idles between
// arrivals, so "busy" is a measurement).
inline StudyResult thrash_study(const Env& env) {
    const Base b = base_scenario(env);
    const Capacity cap = capacity(env, b);
    StudyResult r;
    const double load = env.load > 0 ? env.load : 2.0;
    std::string note;
    const Scenario base = with_load(env, b, cap, load, &note);
    r.notes.push_back("base: " + note);
    r.notes.push_back(fmt("sweeping max_num_seqs from %s to 8 x fit (fit = %d)", env.map_cell ? "fit" : "fit/4", b.fit));
    r.table.headers = {"max_num_seqs", "preemptions", "recomputed", "useful tok/s", "processed tok/s", "busy", "ITL p99 ms", "makespan s"};
    std::vector<int> seqs;
    for (double f : env.map_cell ? std::vector<double>{1.0, 2.0, 8.0} : std::vector<double>{0.25, 0.5, 1.0, 2.0, 4.0, 8.0}) {
        const int n = std::max(1, (int)std::lround(f * b.fit));
        if (seqs.empty() || n != seqs.back()) seqs.push_back(n);
    }
    std::vector<Measurement> ms_;
    for (int n : seqs) {
        Scenario s = base;
        s.max_num_seqs = n;
        ms_.push_back(measure(env, s));
        const Measurement& m = ms_.back();
        r.table.rows.push_back({std::to_string(n), std::to_string(m.preemptions), std::to_string(m.recomputed_tokens),
                                fmt("%.0f", m.useful_tok_per_s()), fmt("%.0f", m.processed_tok_per_s()), pct(m.busy_fraction()),
                                ms(m.itl.percentile(99)), sec(m.makespan_s)});
    }
    // The best setting, and what happens above it.
    size_t best = 0;
    for (size_t i = 1; i < ms_.size(); ++i)
        if (ms_[i].useful_tok_per_s() > ms_[best].useful_tok_per_s()) best = i;
    const Measurement& B = ms_[best];
    const Measurement& top = ms_.back();
    SweepEnds e;
    e.best_seqs = seqs[best];
    e.top_seqs = seqs.back();
    e.top_is_best = best + 1 == ms_.size();
    e.best_tok_s = B.useful_tok_per_s();
    e.top_tok_s = top.useful_tok_per_s();
    e.best_processed = B.processed_tok_per_s();
    e.top_processed = top.processed_tok_per_s();
    e.best_preemptions = B.preemptions;
    e.top_preemptions = top.preemptions;
    e.top_busy = top.busy_fraction();
    e.top_waste = top.computed_tokens > 0 ? (double)top.recomputed_tokens / top.computed_tokens : 0;
    r.verdicts.push_back(decide_c13(e));
    r.verdicts.push_back(decide_c11(e));
    // Over time, for the top setting: useful and processed throughput in
    // ten windows of the run.
    Table over;
    over.headers = {"window", "from s", "to s", "useful tok/s", "processed tok/s", "preemptions", "KV usage"};
    const double T = top.makespan_s;
    size_t j = 0;
    Measurement::Point prev{0, 0, 0, 0, 0};
    svg::Chart ct;
    ct.title = fmt("over time at max_num_seqs %d", seqs.back());
    ct.x_label = "device seconds";
    ct.y_label = "tokens/s";
    svg::Series su{"useful", {}, {}}, sp{"processed", {}, {}};
    for (int w = 0; w < 10; ++w) {
        const double t1 = T * (w + 1) / 10;
        Measurement::Point last = prev;
        while (j < top.series.size() && top.series[j].t <= t1) last = top.series[j++];
        const double dt = std::max(1e-12, t1 - T * w / 10);
        over.rows.push_back({std::to_string(w + 1), sec(T * w / 10), sec(t1), fmt("%.0f", (last.useful - prev.useful) / dt),
                             fmt("%.0f", (last.computed - prev.computed) / dt), std::to_string(last.preemptions - prev.preemptions),
                             pct(last.kv)});
        su.x.push_back(t1);
        su.y.push_back((last.useful - prev.useful) / dt);
        sp.x.push_back(t1);
        sp.y.push_back((last.computed - prev.computed) / dt);
        prev = last;
    }
    r.extra.push_back(over);
    ct.series = {su, sp};
    svg::Chart cs;
    cs.title = "useful and processed throughput vs max_num_seqs";
    cs.x_label = "max_num_seqs";
    cs.y_label = "tokens/s";
    cs.log2_x = true;
    svg::Series s1{"useful tok/s", {}, {}}, s2{"processed tok/s", {}, {}};
    for (size_t i = 0; i < seqs.size(); ++i) {
        s1.x.push_back(seqs[i]);
        s1.y.push_back(ms_[i].useful_tok_per_s());
        s2.x.push_back(seqs[i]);
        s2.y.push_back(ms_[i].processed_tok_per_s());
    }
    s2.dashed = true;
    cs.series = {s1, s2};
    r.charts = {cs, ct};
    return r;
}

// ============================================================================
// 3. admission: the bet against reserving (C1)
// ============================================================================

// One concurrency of the admission study: the bet and reserving side by side.
struct AdmissionPoint {
    int max_num_seqs = 0;
    double bet_tok_s = 0, reserve_tok_s = 0;  // useful tokens per device second
    long bet_preemptions = 0;
    int reserve_peak_running = 0, bet_peak_running = 0;
};
// C1: "admitting on blocks needed now beats reserving for the whole
// sequence". Premise: reserving holds requests back that the bet admits --
// at some concurrency the bet runs more requests at once (otherwise the pool
// never binds and there is nothing to beat). "Beats" = more useful tokens per
// second over the whole run, by more than the draw band. Supported if the bet
// wins at every concurrency, contradicted if reserving does, mixed otherwise.
inline ClaimVerdict decide_c1(const std::vector<AdmissionPoint>& pts) {
    int wins = 0, losses = 0;
    bool binds = false;
    std::string per;
    for (const AdmissionPoint& p : pts) {
        const int c = compare(p.bet_tok_s, p.reserve_tok_s);
        wins += c > 0;
        losses += c < 0;
        binds = binds || p.bet_peak_running > p.reserve_peak_running;
        per += fmt("%sat max_num_seqs %d the bet delivers %+.0f%% useful tokens/s (%ld preemptions; it runs up to %d, reserving up to %d)",
                   per.empty() ? "" : "; ", p.max_num_seqs, pct_change(p.reserve_tok_s, p.bet_tok_s), p.bet_preemptions, p.bet_peak_running,
                   p.reserve_peak_running);
    }
    const int n = (int)pts.size();
    Numbers num, premise;
    for (const AdmissionPoint& p : pts) {
        num.push_back({fmt("bet_gain_pct@%d", p.max_num_seqs), pct_change(p.reserve_tok_s, p.bet_tok_s)});
        premise.push_back({fmt("bet_peak_running@%d", p.max_num_seqs), (double)p.bet_peak_running});
        premise.push_back({fmt("reserve_peak_running@%d", p.max_num_seqs), (double)p.reserve_peak_running});
    }
    return verdict_if(binds, "reserving never held a request back (the pool did not bind)", premise,
                      verdict("C1", n > 0 && wins == n, n > 0 && losses == n, per + " against reserving", num));
}

// Admission only matters when requests end before the max_tokens they asked
// for, as real answers do: every client asks for the output cap, and the
// answer ends at its own (long-tailed) length. Reserving then holds blocks
// for tokens that never come. Both policies serve the base at `load` x the
// capacity (default 2: both saturated, so throughput measures them).
inline StudyResult admission_study(const Env& env) {
    const Base b = base_scenario(env);
    const Capacity cap = capacity(env, b);
    StudyResult r;
    std::string note;
    Scenario s0 = with_load(env, b, cap, env.load > 0 ? env.load : 2.0, &note);
    s0.traffic.max_tokens_cap = s0.traffic.output.hi;
    r.notes.push_back("base: " + note + fmt("; every request asks for max_tokens %d", s0.traffic.max_tokens_cap));
    const std::vector<int> ks = env.map_cell ? std::vector<int>{1, 4} : std::vector<int>{1, 2, 4};
    r.notes.push_back(fmt("both policies at max_num_seqs = %s x fit (fit = %d requests at the mean length)", env.map_cell ? "1 and 4" : "1, 2 and 4",
                          b.fit));
    r.table.headers = {"max_num_seqs", "admission", "peak running", "preemptions", "recomputed", "useful tok/s", "TTFT p50 ms", "makespan s"};
    std::vector<AdmissionPoint> pts;
    for (int k : ks) {
        Measurement m[2];
        for (int i = 0; i < 2; ++i) {
            Scenario s = s0;
            s.max_num_seqs = k * b.fit;
            s.policy.admission = i == 0 ? pkv::Admission::kBet : pkv::Admission::kReserve;
            m[i] = measure(env, s);
            r.table.rows.push_back({std::to_string(s.max_num_seqs), pkv::to_string(s.policy.admission), std::to_string(m[i].peak_running),
                                    std::to_string(m[i].preemptions), std::to_string(m[i].recomputed_tokens),
                                    fmt("%.0f", m[i].useful_tok_per_s()), ms(m[i].ttft.percentile(50)), sec(m[i].makespan_s)});
        }
        pts.push_back({k * b.fit, m[0].useful_tok_per_s(), m[1].useful_tok_per_s(), m[0].preemptions, m[1].peak_running, m[0].peak_running});
    }
    r.verdicts.push_back(decide_c1(pts));
    return r;
}

// ============================================================================
// 4. victim: newest-first against oldest-first and a uniform slowdown (C3)
// ============================================================================

// What the C3 decider reads: requests completed by newest-first and by the
// uniform slowdown (fair) at the same checkpoints, and mean completion times.
struct VictimCounts {
    std::vector<int> newest, fair;  // [checkpoint] requests completed by then
    double newest_mean_s = 0, fair_mean_s = 0, oldest_mean_s = 0;
    long newest_preemptions = 0, fair_preemptions = 0;
};
// C3: "preempting the newest first completes more work than slowing everyone
// uniformly". Premise: someone is preempted. Compared checkpoint by
// checkpoint (a quarter, half, three quarters and all of newest-first's
// run): a count is ahead when it exceeds the other by more than the draw
// band (and by more than one request). Supported if newest-first is ahead
// at some checkpoint and behind at none; contradicted the other way round;
// mixed if both happen or every checkpoint is a draw.
inline ClaimVerdict decide_c3(const VictimCounts& v) {
    int ahead = 0, behind = 0;
    std::string counts;
    for (size_t i = 0; i < v.newest.size() && i < v.fair.size(); ++i) {
        const int n = v.newest[i], u = v.fair[i];
        const double margin = std::max(1.0, kDrawBand / 100.0 * std::max(n, u));
        ahead += n - u > margin;
        behind += u - n > margin;
        counts += fmt("%s%d vs %d", counts.empty() ? "" : ", ", n, u);
    }
    return verdict_if(v.newest_preemptions + v.fair_preemptions > 0, "nobody was preempted",
                      {{"newest_preemptions", (double)v.newest_preemptions}, {"fair_preemptions", (double)v.fair_preemptions}},
                      verdict("C3", ahead > 0 && behind == 0, behind > 0 && ahead == 0,
                              fmt("requests completed by 25/50/75/100%% of newest-first's run, newest-first vs fair: %s (a draw within %.0f%%); "
                                  "mean completion %.3f vs %.3f s (oldest-first %.3f s)",
                                  counts.c_str(), kDrawBand, v.newest_mean_s, v.fair_mean_s, v.oldest_mean_s),
                              {{"checkpoints_ahead", (double)ahead}, {"checkpoints_behind", (double)behind}, {"newest_mean_s", v.newest_mean_s},
                               {"fair_mean_s", v.fair_mean_s}}));
}

// The base at `load` x the capacity (default 2), with each victim policy.
inline StudyResult victim_study(const Env& env) {
    const Base b = base_scenario(env);
    const Capacity cap = capacity(env, b);
    StudyResult r;
    std::string note;
    const Scenario base = with_load(env, b, cap, env.load > 0 ? env.load : 2.0, &note);
    r.notes.push_back("base: " + note);
    r.notes.push_back("fair = preempt the request that has generated the most tokens: nobody runs ahead, everyone slows alike");
    const pkv::Victim policies[3] = {pkv::Victim::kNewest, pkv::Victim::kOldest, pkv::Victim::kFair};
    // (A map cell skips oldest-first: the verdict compares newest-first with fair.)
    Measurement m[3];
    for (int i = 0; i < 3; ++i) {
        if (i == 1 && env.map_cell) continue;
        Scenario s = base;
        s.policy.victim = policies[i];
        m[i] = measure(env, s);
    }
    auto mean_done = [](const Measurement& x) {
        double t = 0;
        for (double d : x.done_s) t += d;
        return x.done_s.empty() ? 0.0 : t / (double)x.done_s.size();
    };
    // Work completed by fixed times: a quarter, half and three quarters of
    // the newest-first run's makespan, and its end.
    const double T = m[0].makespan_s;
    r.table.headers = {"victim", "preemptions", "recomputed", "done @25%", "done @50%", "done @75%", "done @100%", "mean done s", "makespan s"};
    for (int i = 0; i < 3; ++i) {
        if (i == 1 && env.map_cell) continue;
        r.table.rows.push_back({pkv::to_string(policies[i]), std::to_string(m[i].preemptions), std::to_string(m[i].recomputed_tokens),
                                std::to_string(m[i].completed_by(0.25 * T)), std::to_string(m[i].completed_by(0.5 * T)),
                                std::to_string(m[i].completed_by(0.75 * T)), std::to_string(m[i].completed_by(T)), sec(mean_done(m[i])),
                                sec(m[i].makespan_s)});
    }
    VictimCounts v;
    for (double f : {0.25, 0.5, 0.75, 1.0}) {
        v.newest.push_back(m[0].completed_by(f * T));
        v.fair.push_back(m[2].completed_by(f * T));
    }
    v.newest_mean_s = mean_done(m[0]);
    v.fair_mean_s = mean_done(m[2]);
    v.oldest_mean_s = mean_done(m[1]);
    v.newest_preemptions = m[0].preemptions;
    v.fair_preemptions = m[2].preemptions;
    r.verdicts.push_back(decide_c3(v));
    return r;
}

// ============================================================================
// 5. preemption: recompute, swap and prefix caching (C5, C6a, C6b, C8)
// ============================================================================

// A link as the tables show it: the preset, the env's bandwidth, or this
// CPU's memcpy.
inline std::string link_name(const Env& env, const std::string& link) {
    if (!env.sim() || env.measured) return "memcpy";
    if (!link.empty()) return link;
    const pkv::SimConfig s = env.sim_config_for("");
    return fmt("%.3g GB/s", s.hw.pcie_bw / 1e9);
}

// C5: "recompute costs one prefill of the current length, and prefix
// caching serves part of it". Premise: a preemption. A recompute redoes what
// the victim had computed (recomputed tokens within 25% of the victims'
// computed tokens: one prefill, not two or half of one), and prefix caching
// recomputes fewer tokens. Token counts are exact, so no draw band: any
// token the cache serves is "part of it".
inline ClaimVerdict decide_c5(long preemptions, long recomputed, long victim_tokens, long recomputed_with_cache) {
    const double ratio = victim_tokens ? (double)recomputed / victim_tokens : 0;
    const bool one_prefill = ratio > 0.75 && ratio < 1.25;
    const bool cache_helps = recomputed_with_cache < recomputed;
    return verdict_if(preemptions > 0, "no preemption", {{"preemptions", (double)preemptions}},
                      verdict("C5", one_prefill && cache_helps, !cache_helps && !one_prefill,
                              fmt("recomputed %ld tokens for victims that had computed %ld (ratio %.2f); with prefix caching %ld", recomputed,
                                  victim_tokens, ratio, recomputed_with_cache),
                              {{"recompute_ratio", ratio}, {"recomputed", (double)recomputed},
                               {"recomputed_with_cache", (double)recomputed_with_cache}}));
}

// C6a: "swap pays PCIe both ways and its host buffer fills; it loses where
// PCIe is scarcer". Premise: victims were swapped. At the workload's own
// lengths: the bytes went out and came back (out == in > 0), a small swap
// space filled (fallbacks to recompute), and on the scarcest link tried
// swap's makespan is longer than recompute's by more than the draw band.
// Supported: all three. Contradicted: swap beats recompute on the scarcest
// link by more than the band. Mixed otherwise (a draw, or the mechanism not
// as described).
struct SwapCost {
    std::string link;
    double swap_s = 0, recompute_s = 0;  // makespans at the workload's lengths
};
inline ClaimVerdict decide_c6a(long swap_outs, double out_bytes, double in_bytes, long small_space_fallbacks, const SwapCost& scarcest) {
    const bool both_ways = out_bytes > 0 && out_bytes == in_bytes, fills = small_space_fallbacks > 0;
    const int c = compare(scarcest.swap_s, scarcest.recompute_s);  // +1: swap slower
    return verdict_if(swap_outs > 0, "no victim was swapped", {{"swap_outs", (double)swap_outs}},
                      verdict("C6a", both_ways && fills && c > 0, c < 0,
                              fmt("swap moved %.1f MB out and %.1f MB in; a small swap space fell back to recompute %ld times; on %s swap's "
                                  "makespan is %+.1f%% against recompute's",
                                  out_bytes / 1e6, in_bytes / 1e6, small_space_fallbacks, scarcest.link.c_str(),
                                  pct_change(scarcest.recompute_s, scarcest.swap_s)),
                              {{"out_mb", out_bytes / 1e6}, {"in_mb", in_bytes / 1e6}, {"small_space_fallbacks", (double)small_space_fallbacks},
                               {"swap_vs_recompute_pct", pct_change(scarcest.recompute_s, scarcest.swap_s)}}));
}

// What the C6b decider reads, per link: swap's makespan against recompute's
// at each length tried (shortest first), and the crossover L* the cost
// model predicts for that link (cost_model.hpp section 4d; -1 where there is
// no model: this CPU).
struct SwapLink {
    std::string name;
    long lstar = -1;
    std::vector<int> lengths;
    std::vector<double> swap_s, recompute_s;
};
// C6b: "swap wins only for very long sequences". Premise: the lengths tried
// reach beyond the crossover L* (on a GPU the tried lengths run from L*/4 to
// 2 L*, so the premise is that the model's context holds 2 L*, on at least
// one link; the others are reported and left out). Supported: on every link
// tried swap loses (by more than the draw band) at the shortest length and
// wins (by more than the band) at the longest. Contradicted: on some link
// swap wins at the shortest length (not "only long") or loses at the
// longest (it never wins). Mixed: draws.
inline ClaimVerdict decide_c6b(const std::vector<SwapLink>& links, int context) {
    bool reach = false, holds = true, against = false;
    std::string txt;
    Numbers numbers, premise{{"context_tokens", (double)context}};
    for (const SwapLink& l : links) {
        if (l.lengths.empty()) {
            txt += fmt("%s%s: L* = %ld tokens, beyond the context of %d", txt.empty() ? "" : "; ", l.name.c_str(), l.lstar, context);
            premise.push_back({"lstar_tokens@" + l.name, (double)l.lstar});
            continue;
        }
        reach = true;
        const int shortest = compare(l.recompute_s.front(), l.swap_s.front()), longest = compare(l.recompute_s.back(), l.swap_s.back());
        holds = holds && shortest < 0 && longest > 0;  // compare(recompute, swap) > 0: recompute slower, swap wins
        against = against || shortest > 0 || longest < 0;
        std::string per;
        for (size_t i = 0; i < l.lengths.size(); ++i) {
            per += fmt("%s%d: %+.1f%%", per.empty() ? "" : ", ", l.lengths[i], pct_change(l.recompute_s[i], l.swap_s[i]));
            numbers.push_back({fmt("swap_vs_recompute_pct@%s@%d", l.name.c_str(), l.lengths[i]), pct_change(l.recompute_s[i], l.swap_s[i])});
        }
        txt += fmt("%s%s: L* %s (swap vs recompute makespan: %s)", txt.empty() ? "" : "; ", l.name.c_str(),
                   l.lstar >= 0 ? fmt("= %ld tokens", l.lstar).c_str() : "not modelled", per.c_str());
        premise.push_back({"lstar_tokens@" + l.name, (double)l.lstar});
        premise.push_back({"longest_tried@" + l.name, (double)l.lengths.back()});
    }
    return verdict_if(reach, "the lengths tried do not reach beyond L*", premise, verdict("C6b", reach && holds, against, txt, numbers));
}

// C8: "recompute does more total work per completed request": tokens through
// the model per completed request, recompute against swap (ample space).
// Premise: a preemption. More than the draw band apart decides it.
inline ClaimVerdict decide_c8(long preemptions, double per_request_recompute, double per_request_swap) {
    const int c = compare(per_request_recompute, per_request_swap);
    return verdict_if(preemptions > 0, "no preemption", {{"preemptions", (double)preemptions}},
                      verdict("C8", c > 0, c < 0,
                              fmt("%.0f tokens computed per completed request with recompute, %.0f with swap", per_request_recompute,
                                  per_request_swap),
                              {{"per_request_recompute", per_request_recompute}, {"per_request_swap", per_request_swap}}));
}

// The swap crossover L* for this env's model on `link` (cost_model.hpp
// section 4d); -1 on this CPU (its preset is measured, not a GPU's).
inline long lstar_for(const Env& env, const std::string& link, int block_size) {
    if (!env.sim() || env.measured) return -1;
    const pkv::SimConfig s = env.sim_config_for(link);
    return pkv::swap_crossover_tokens(s.model, s.hw, s.cost, block_size);
}

// Part one, at the workload's own lengths (C5, C6a, C8): 4 x fit requests
// at once, max_num_seqs 2 x fit. All at once because
// these claims count the work a preemption costs, and a burst is what makes
// preemptions at these lengths; the arrivals are not what they are about.
// Recompute, recompute with prefix caching, swap with ample space on each
// link, and a small swap space on the scarcest: vLLM V0's default, 4 GiB
// (--swap-space; on this CPU, whose pool is 48 blocks, 2 blocks: about the
// share of the pool 4 GiB is of an H200's with Llama-3-8B).
// Part two (C6b): one victim of L tokens, brought back by recompute or by
// swap, as the vLLM paper's microbenchmark of the two (its section 7.3,
// figure 19a) measured them -- at L*/4, L*/2, L* and 2 L* of each link (a
// map cell: L*/4 and 2 L*; where the model puts L* at 0, swap being cheaper
// from the first block, at 1/64 and 1/2 of the context; on this CPU, 32, 128
// and 512 tokens x scale: no model). One victim, because what the claim compares is the cost of
// bringing a victim back, and in a busy run that cost drowns in the decode
// steps around it (long contexts make decode dearer too): every length came
// out a draw (victim_roundtrip says how the one victim is made).
// One victim of about `len` tokens, preempted once and brought back: a
// short request Y (a one-token prompt, 8 tokens of output) arrives first,
// then X (a prompt of `len` tokens rounded to whole blocks, 8 tokens of
// output). The pool holds Y's first block and X's prompt and nothing more,
// so X's first decode, which needs a new block, fails: the newest request,
// X itself, is preempted with its whole prompt computed, and resumes when Y
// ends, by recompute or by swap. The run is X's prefill, a few decode steps
// and X's recovery: the recovery is a large part of it, whatever the length
// (blocks of at least 8 tokens: X's 8 tokens must fit in its last block).
inline Measurement victim_roundtrip(const Env& env, const std::string& link, int len, bool swap, int bs = 16) {
    const int xprompt = (int)std::max<long>(bs, pkv::blocks_for_tokens(len, bs) * bs), outputs = 8;
    if (bs < outputs) throw std::invalid_argument("victim_roundtrip: blocks of at least 8 tokens");
    Scenario s;
    s.name = "roundtrip";
    s.block_size = bs;
    s.max_num_seqs = 2;
    s.max_num_batched_tokens = std::max(xprompt + 1, env.sim() && !env.measured ? 8192 : 256);
    s.num_blocks = (int)(xprompt / bs + 1);
    s.pcie = link;
    s.traffic.requests = 2;
    s.traffic.seed = env.seed;
    // Request 0 is Y, request 1 is X (each drawn from a fixed length).
    s.traffic.prompt = LengthDist::fixed(1);
    s.traffic.output = LengthDist::fixed(outputs);
    std::vector<PlannedRequest> plan = plan_traffic(s.traffic, env.shape().vocab_size);
    Scenario x = s;
    x.traffic.requests = 1;
    x.traffic.prompt = LengthDist::fixed(xprompt);
    x.traffic.seed = env.seed + 1;
    plan[1] = plan_traffic(x.traffic, env.shape().vocab_size)[0];
    s.planned = std::make_shared<const std::vector<PlannedRequest>>(plan);
    if (swap) {
        s.policy.preemption = pkv::Preemption::kSwap;
        s.swap_space_blocks = s.num_blocks;
    }
    return measure(env, s);
}

inline StudyResult preemption_study(const Env& env) {
    const Base b = base_scenario(env);
    StudyResult r;
    const bool gpu = env.sim() && !env.measured;
    const bool both_links = gpu && env.pcie.empty() && env.pcie_bw_override == 0;
    const std::vector<std::string> links = both_links ? std::vector<std::string>{"gen4", "gen5"} : std::vector<std::string>{""};
    Scenario s0 = all_at_once(env, b, 4 * b.fit);
    s0.max_num_seqs = 2 * b.fit;
    r.notes.push_back("part one: " + describe(env, s0));
    r.notes.push_back("modes: recompute; recompute + prefix caching; swap with ample swap space (each link); swap with a small one "
                      "(a quarter of the pool, the scarcest link)");
    r.table.headers = {"part", "length", "link", "mode", "preemptions", "recomputed", "swapped MB", "fallbacks", "computed/req", "makespan s"};
    auto row = [&](const std::string& part, const std::string& len, const std::string& link, const std::string& mode, const Measurement& m) {
        r.table.rows.push_back({part, len, link, mode, std::to_string(m.preemptions), std::to_string(m.recomputed_tokens),
                                fmt("%.1f", (m.swap_out_bytes + m.swap_in_bytes) / 1e6), std::to_string(m.swap_fallbacks),
                                fmt("%.0f", m.finished ? (double)m.computed_tokens / m.finished : 0.0), sec(m.makespan_s)});
    };
    const std::string base_len = b.trace ? "trace" : fmt("mean %.0f", b.mean_tokens);
    // Recompute never crosses the link: cells that differ only in it share the run.
    const std::string key = fmt("preemption|%d|%d", s0.traffic.requests, s0.max_num_seqs);
    const Measurement rc = measure_shared(env, s0, key + "|recompute");
    row("1", base_len, "-", "recompute", rc);
    Scenario pf = s0;
    pf.prefix_caching = true;
    const Measurement pc = measure_shared(env, pf, key + "|prefix");
    row("1", base_len, "-", "recompute+prefix", pc);
    const long ample = pkv::blocks_for_tokens(s0.traffic.output.hi + s0.traffic.prompt.hi, s0.block_size) * s0.traffic.requests;
    std::vector<Measurement> sw;
    for (const std::string& link : links) {
        Scenario v = s0;
        v.pcie = link;
        v.policy.preemption = pkv::Preemption::kSwap;
        v.swap_space_blocks = (int)std::min<long>(ample, 1L << 30);
        sw.push_back(measure(env, v));
        row("1", base_len, link_name(env, link), "swap", sw.back());
    }
    Scenario small = s0;
    small.pcie = links.front();
    small.policy.preemption = pkv::Preemption::kSwap;
    if (gpu) {
        const pkv::SimConfig sc = env.sim_config_for(links.front());
        small.swap_space_blocks = std::max(1, (int)(4.0 * 1073741824.0 / (pkv::kv_bytes_per_token(sc.model) * s0.block_size)));
    } else {
        small.swap_space_blocks = 2;
    }
    const Measurement sm = measure(env, small);
    row("1", base_len, link_name(env, links.front()), "swap (small)", sm);
    r.verdicts.push_back(decide_c5(rc.preemptions, rc.recomputed_tokens, rc.victim_tokens, pc.recomputed_tokens));
    r.verdicts.push_back(decide_c6a(sw.front().swap_outs, (double)sw.front().swap_out_bytes, (double)sw.front().swap_in_bytes, sm.swap_fallbacks,
                                    {link_name(env, links.front()), sw.front().makespan_s, rc.makespan_s}));
    const double per_rc = rc.finished ? (double)rc.computed_tokens / rc.finished : 0;
    const double per_sw = sw.front().finished ? (double)sw.front().computed_tokens / sw.front().finished : 0;
    r.verdicts.push_back(decide_c8(rc.preemptions, per_rc, per_sw));

    // Part two: swap against recompute on both sides of L*.
    const int ctx = env.shape().seq_len;
    std::vector<SwapLink> sl;
    Table lstars;
    lstars.headers = {"gpu", "link", "L* tokens (" + (gpu ? env.model : std::string("this CPU")) + ", blocks of 16)"};
    if (gpu)
        for (const auto& g : pkv::gpu_presets())
            for (const auto& l : pkv::pcie_presets()) {
                Env e = env;
                e.gpu = g.name;
                e.pcie_bw_override = 0;
                long x = -1;
                try {
                    x = lstar_for(e, l.name, 16);
                } catch (const std::exception&) {
                    continue;
                }
                lstars.rows.push_back({g.name, l.name, x < 0 ? "never" : std::to_string(x)});
            }
    if (!b.trace) {  // a trace's lengths are its own: part two is synthetic
        for (const std::string& link : links) {
            SwapLink L;
            L.name = link_name(env, link);
            L.lstar = lstar_for(env, link, 16);
            std::vector<int> lens;
            if (!gpu) lens = {scaled(env, 32), scaled(env, 128), scaled(env, 512)};
            else if (L.lstar == 0) lens = {std::max(64, ctx / 64), ctx / 2};  // swap cheaper from the first block: a short and a long length
            else if (L.lstar > 0 && 2 * L.lstar <= ctx) {
                const std::vector<long> at = env.map_cell ? std::vector<long>{L.lstar / 4, 2 * L.lstar}
                                                          : std::vector<long>{L.lstar / 4, L.lstar / 2, L.lstar, 2 * L.lstar};
                for (long x : at) lens.push_back((int)std::max(20L, x));
            }
            for (int len : lens) {
                if (len > ctx) continue;
                const Measurement m_rc = victim_roundtrip(env, link, len, false), m_sw = victim_roundtrip(env, link, len, true);
                row("2", std::to_string(len), "-", "recompute", m_rc);
                row("2", std::to_string(len), L.name, "swap", m_sw);
                L.lengths.push_back(len);
                L.recompute_s.push_back(m_rc.makespan_s);
                L.swap_s.push_back(m_sw.makespan_s);
            }
            sl.push_back(L);
        }
        r.notes.push_back(fmt("part two: one victim of L tokens preempted and brought back (victim_roundtrip), %s",
                              gpu ? (env.map_cell ? "at L*/4 and 2 L* of each link (where the context holds them)"
                                                  : "at L*/4, L*/2, L* and 2 L* of each link (where the context holds them)")
                                  : "at 32, 128 and 512 tokens x scale"));
    } else {
        r.notes.push_back("part two (C6b) needs lengths of its own: a trace replay keeps the trace's");
    }
    if (!lstars.rows.empty()) r.extra.push_back(lstars);
    ClaimVerdict c6b = b.trace ? verdict_if(false, "a trace replay keeps the trace's lengths", {{"context_tokens", (double)ctx}},
                                            verdict("C6b", false, false, "no lengths of its own"))
                               : decide_c6b(sl, ctx);
    r.verdicts.push_back(c6b);
    return r;
}

// ============================================================================
// 6. fixes: bluntest first (C12)
// ============================================================================

// A fix relieves thrash when, against the baseline, it preempts fewer times
// and the clients' ITL p99 is lower, each by more than the draw band: the
// claim calls them fixes, not cures, so any relief beyond the band counts.
inline bool relieves(long base_preemptions, double base_itl_p99, long preemptions, double itl_p99) {
    return below_band((double)base_preemptions, (double)preemptions) && below_band(base_itl_p99, itl_p99);
}

// One fix of the fixes study: what it relieves and what it costs the clients.
struct FixOutcome {
    std::string name;
    int group = 0;           // its place in the claim's order: 1 cap concurrency, 2 cap generation, 3 free or quantize memory, 4 replicas
    bool relieves = false;   // relieves() against the baseline
    double harm = 0;         // fraction of requests served worse than at baseline (see harm_fraction)
};
// C12 (the fixes study): "the fixes in order of bluntness". Premise: the
// baseline preempts (there is thrash to fix) and runaway requests exist
// (requests longer than the generation cap: without them capping generation
// has nothing to catch). Two parts, both measured:
//   relief     every fix relieves (relieves() above);
//   order      bluntness is how much of the clients' service a fix gives up:
//              the fraction of requests it serves worse than the baseline
//              does -- fewer output tokens than they asked for, or an end-
//              to-end time more than the draw band longer. (What a smaller
//              cache element does to the tokens themselves the simulator
//              cannot see; the kv_dtype study measures it on the CPU.) The
//              claim's order holds when the groups' mean harm does not rise
//              along it by more than 5 points from one group to the next.
// Supported: every fix relieves and the order holds. Contradicted: no fix
// relieves, or the last group harms more than the first by more than 5
// points (the order runs the other way). Mixed otherwise.
inline ClaimVerdict decide_c12_fixes(const std::vector<FixOutcome>& fixes, long base_preemptions, double base_itl_p99_s, long runaways) {
    int helped = 0;
    std::string not_helped;
    double sum[5] = {0, 0, 0, 0, 0};
    int cnt[5] = {0, 0, 0, 0, 0};
    for (const FixOutcome& f : fixes) {
        helped += f.relieves;
        if (!f.relieves) not_helped += (not_helped.empty() ? "" : ", ") + f.name;
        if (f.group >= 1 && f.group <= 4) {
            sum[f.group] += f.harm;
            cnt[f.group]++;
        }
    }
    std::vector<double> harm;  // per group present, in the claim's order
    std::string order;
    const char* names[5] = {"", "cap concurrency", "cap generation", "free or quantize memory", "add replicas"};
    for (int g = 1; g <= 4; ++g)
        if (cnt[g]) {
            harm.push_back(sum[g] / cnt[g]);
            order += fmt("%s%s %.0f%%", order.empty() ? "" : " > ", names[g], 100 * harm.back());
        }
    Numbers num{{"fixes_relieving", (double)helped}, {"fixes", (double)fixes.size()}};
    for (int g = 1, i = 0; g <= 4; ++g)
        if (cnt[g]) num.push_back({fmt("harm_group%d", g), harm[(size_t)i++]});
    bool ordered = !harm.empty();
    for (size_t i = 1; i < harm.size(); ++i) ordered = ordered && harm[i] <= harm[i - 1] + kDrawBand / 100.0;
    const bool reversed = harm.size() >= 2 && harm.back() > harm.front() + kDrawBand / 100.0;
    const int n = (int)fixes.size();
    return verdict_if(base_preemptions > 0 && runaways > 0,
                      base_preemptions == 0 ? "the baseline preempts nothing: no thrash to fix" : "no runaway request for a generation cap to catch",
                      {{"baseline_preemptions", (double)base_preemptions}, {"runaways", (double)runaways}},
                      verdict("C12", n > 0 && helped == n && ordered, helped == 0 || reversed,
                              fmt("%d of %d fixes relieve (fewer preemptions than the baseline's %ld and a lower ITL p99 than its %.1f ms, "
                                  "each by more than %.0f%%)%s; requests served worse than at baseline, the claim's order: %s (%s)",
                                  helped, n, base_preemptions, 1e3 * base_itl_p99_s, kDrawBand,
                                  not_helped.empty() ? "" : ("; not: " + not_helped).c_str(), order.c_str(),
                                  ordered ? "in order" : reversed ? "the other way round" : "out of order"),
                              num));
}

// The fraction of requests `fix` serves worse than `base`: fewer output
// tokens than they asked for (`asked`, per request), or an end-to-end time
// more than the draw band longer than at baseline. With several replicas
// the same requests are served, each by one of them.
inline double harm_fraction(const Measurement& base, const Measurement& fix, const std::vector<int>& asked) {
    const size_t n = std::min(base.e2e_by_request.size(), fix.e2e_by_request.size());
    if (n == 0) return 0;
    long worse = 0;
    for (size_t i = 0; i < n; ++i) {
        const bool cut = fix.tokens_by_request[i] < asked.at(i);
        const double b = base.e2e_by_request[i], f = fix.e2e_by_request[i];
        const bool slower = f < 0 || (b >= 0 && pct_change(b, f) > kDrawBand);
        worse += cut || slower;
    }
    return (double)worse / (double)n;
}

// The base at `load` x the capacity (default 2: sustained overload, a queue
// that builds for the whole window). The generation cap is twice the mean
// output: a limit a service sets to stop answers that run away, not to
// shorten ordinary ones (with these long tails about one request in eight
// is longer; a trace has its own share); those longer requests are the
// runaways.
inline StudyResult fixes_study(const Env& env) {
    const Base b = base_scenario(env);
    const Capacity cap = capacity(env, b);
    StudyResult r;
    std::string note;
    const Scenario base = with_load(env, b, cap, env.load > 0 ? env.load : 2.0, &note);
    std::vector<int> asked;  // the baseline's output lengths: what each client asked for
    double mean_out = 0;
    for (const PlannedRequest& p : plan_traffic(base.traffic, env.shape().vocab_size)) {
        asked.push_back(p.params.stop_after_tokens > 0 ? p.params.stop_after_tokens : p.params.max_tokens);
        mean_out += asked.back();
    }
    mean_out /= std::max<size_t>(1, asked.size());
    const int gen_cap = std::max(1, (int)std::lround(2 * mean_out));
    const long runaways = std::count_if(asked.begin(), asked.end(), [&](int a) { return a > gen_cap; });
    r.notes.push_back("base: " + note);
    r.notes.push_back(fmt("generation cap %d tokens (twice the mean output): %ld of %zu requests run away past it", gen_cap, runaways, asked.size()));
    r.notes.push_back("harm = requests served worse than at baseline: fewer tokens than asked, or end-to-end more than 5% longer");
    struct Fix {
        std::string name;
        int group;
        Scenario s;
    };
    std::vector<Fix> fixes;
    fixes.push_back({"baseline", 0, base});
    {
        Scenario s = base;
        s.max_num_seqs = b.fit;
        fixes.push_back({fmt("cap concurrency (max_num_seqs %d)", b.fit), 1, s});
    }
    {
        Scenario s = base;
        s.traffic.output.hi = std::min(s.traffic.output.hi, gen_cap);
        fixes.push_back({fmt("cap generation (max_tokens %d)", gen_cap), 2, s});
    }
    // Free cache memory: shrink what else holds GPU memory, so that the KV
    // pool gets it -- vLLM's gpu_memory_utilization from 0.9 to 0.95 (on the
    // CPU, the same 0.95 / 0.9 more blocks).
    {
        Scenario s = base;
        if (env.sim() && !env.measured) {
            s.memory_utilization = 0.95;
            fixes.push_back({fmt("free memory (gpu_memory_utilization 0.95: %ld token slots)", pool_tokens(env, s)), 3, s});
        } else {
            s.num_blocks = (int)std::lround(base.num_blocks * 0.95 / 0.9);
            fixes.push_back({fmt("free memory (%d blocks, as 0.95 / 0.9 of the memory)", s.num_blocks), 3, s});
        }
    }
    {
        Scenario s = base;
        if (env.sim() && !env.measured) {
            s.kv_bytes_override = 1;  // FP8 KV: twice the blocks in the same memory
            fixes.push_back({"quantize the cache (FP8 KV)", 3, s});
        } else {
            s.kv_dtype = pkv::KVDtype::kInt8;  // the same bytes as int8: more blocks
            const pkv::Config& c = env.shape();
            const pkv::KVGeometry f32{c.n_layers, 1, s.block_size, c.n_kv_heads, c.head_dim(), pkv::KVDtype::kF32};
            const pkv::KVGeometry i8{c.n_layers, 1, s.block_size, c.n_kv_heads, c.head_dim(), pkv::KVDtype::kInt8};
            s.num_blocks = (int)(base.num_blocks * f32.bytes_per_block() / i8.bytes_per_block());
            fixes.push_back({fmt("quantize the cache (int8, %d blocks)", s.num_blocks), 3, s});
        }
    }
    // (A map cell runs the replicas with round-robin routing only: the
    // claim's last group needs one replica fix.)
    for (Router rt : env.map_cell ? std::vector<Router>{Router::kRoundRobin} : std::vector<Router>{Router::kRoundRobin, Router::kLeastKv}) {
        Scenario s = base;
        s.replicas = 2;
        s.router = rt;
        fixes.push_back({fmt("2 replicas, %s", to_string(rt)), 4, s});
    }
    r.table.headers = {"fix", "preemptions", "recomputed", "useful tok/s", "TTFT p99 ms", "ITL p99 ms", "e2e p99 s", "harm", "makespan s"};
    std::vector<Measurement> ms_;
    std::vector<FixOutcome> outcomes;
    for (const Fix& f : fixes) {
        ms_.push_back(measure(env, f.s));
        const Measurement& m = ms_.back();
        const double harm = f.group == 0 ? 0.0 : harm_fraction(ms_[0], m, asked);
        r.table.rows.push_back({f.name, std::to_string(m.preemptions), std::to_string(m.recomputed_tokens), fmt("%.0f", m.useful_tok_per_s()),
                                ms(m.ttft.percentile(99)), ms(m.itl.percentile(99)), sec(m.e2e.percentile(99)),
                                f.group == 0 ? "-" : pct(harm), sec(m.makespan_s)});
        if (f.group == 0) continue;
        outcomes.push_back({f.name, f.group, relieves(ms_[0].preemptions, ms_[0].itl.percentile(99), m.preemptions, m.itl.percentile(99)), harm});
    }
    r.verdicts.push_back(decide_c12_fixes(outcomes, ms_[0].preemptions, ms_[0].itl.percentile(99), runaways));
    return r;
}

// ============================================================================
// 7. shedding: fast failures instead of stalls (C9)
// ============================================================================

// C9: "shedding at the edge gives fast, retryable failures instead of
// unbounded stalls". Premise: a queue forms at the door -- without a limit
// the waiting queue grows past the limit tested (otherwise shedding never
// acts). With that limit: requests are rejected (retryable), the rejections
// come at least 10x sooner (p99) than the unbounded queue's first tokens
// (p99) -- "fast" next to the stall, an order of magnitude -- and the
// accepted requests' TTFT p99 is lower than unbounded by more than the draw
// band (the stall they no longer sit in). Contradicted: nothing rejected
// although the queue formed, or the rejections come no sooner than the
// stall they avoid. Mixed otherwise.
inline ClaimVerdict decide_c9(int limit, int peak_waiting_unbounded, int rejected, double reject_p99_s, double unbounded_ttft_p99_s,
                              double accepted_ttft_p99_s) {
    return verdict_if(peak_waiting_unbounded > limit, "no queue formed at the door (the unbounded queue never passed the limit)",
                      {{"peak_waiting_unbounded", (double)peak_waiting_unbounded}, {"limit", (double)limit}, {"rejected", (double)rejected}},
                      verdict("C9",
                              rejected > 0 && reject_p99_s * 10 <= unbounded_ttft_p99_s &&
                                  below_band(unbounded_ttft_p99_s, accepted_ttft_p99_s),
                              rejected == 0 || reject_p99_s >= unbounded_ttft_p99_s,
                              fmt("with max_waiting %d, %d requests are rejected within %.1f ms (p99, retryable); unbounded, the queue reaches "
                                  "%d and TTFT p99 is %.1f ms; accepted requests' TTFT p99 falls to %.1f ms",
                                  limit, rejected, 1e3 * reject_p99_s, peak_waiting_unbounded, 1e3 * unbounded_ttft_p99_s,
                                  1e3 * accepted_ttft_p99_s),
                              {{"rejected", (double)rejected}, {"reject_p99_s", reject_p99_s}, {"unbounded_ttft_p99_s", unbounded_ttft_p99_s},
                               {"accepted_ttft_p99_s", accepted_ttft_p99_s}}));
}

// The base at `load` x the capacity (default 2), unbounded and with two
// limits on the waiting queue: 4 x fit and fit (the tightest, the verdict's).
inline StudyResult shedding_study(const Env& env) {
    const Base b = base_scenario(env);
    const Capacity cap = capacity(env, b);
    StudyResult r;
    std::string note;
    const Scenario base = with_load(env, b, cap, env.load > 0 ? env.load : 2.0, &note);
    r.notes.push_back("base: " + note);
    r.table.headers = {"max_waiting", "accepted", "rejected", "reject p99 ms", "peak waiting", "TTFT p50 ms", "TTFT p99 ms", "useful tok/s"};
    const int limits[3] = {0, 4 * b.fit, b.fit};
    Measurement m[3];
    for (int i = 0; i < 3; ++i) {
        Scenario s = base;
        s.policy.max_waiting = limits[i];
        m[i] = measure(env, s);
        r.table.rows.push_back({limits[i] ? std::to_string(limits[i]) : "unbounded", std::to_string(m[i].requests - m[i].rejected),
                                std::to_string(m[i].rejected), m[i].rejected ? ms(m[i].reject_latency.percentile(99)) : "-",
                                std::to_string(m[i].peak_waiting), ms(m[i].ttft.percentile(50)), ms(m[i].ttft.percentile(99)),
                                fmt("%.0f", m[i].useful_tok_per_s())});
    }
    const Measurement& u = m[0];
    const Measurement& t = m[2];
    r.verdicts.push_back(decide_c9(limits[2], u.peak_waiting, t.rejected, t.reject_latency.percentile(99), u.ttft.percentile(99),
                                   t.ttft.percentile(99)));
    return r;
}

// ============================================================================
// 8. signals: what an operator and a client see (C7, C10)
// ============================================================================

// What the C7 and C10 deciders read of one run, its inter-token gaps put
// down to their causes (study_kit.hpp's measure()).
struct SignalRun {
    int requests = 0, finished = 0;
    long preemptions = 0;
    int preempted_streams = 0;          // requests preempted at least once
    int paused_streams = 0;             // ... whose longest gap is >= 10x the decode median
    double full_fraction = 0;           // steps that ended with the pool at >= 99%
    double p50 = 0, p99 = 0;            // ITL over every gap (what an operator's histogram shows)
    double decode_p50 = 0;              // the plain decode gaps' median
    double preemption_share_p99 = 0;    // of the gaps at or above p99, the share that is preemption's
    long gaps_preempted = 0, gaps_recompute = 0, gaps_swap = 0, gaps_prefill = 0, gaps_decode = 0;
    double ratio() const { return p50 > 0 ? p99 / p50 : 0; }
};
// A pause, for a client: a gap ten times the stream's normal cadence (the
// plain decode median) -- long enough to notice against a steady stream, the
// factor the old decider used too.
constexpr double kPauseFactor = 10.0;
inline SignalRun signal_run(const Measurement& m) {
    SignalRun x;
    x.requests = m.requests;
    x.finished = m.finished;
    x.preemptions = m.preemptions;
    x.full_fraction = m.full_fraction;
    x.p50 = m.itl.percentile(50);
    x.p99 = m.itl.percentile(99);
    x.decode_p50 = m.itl_decode.count() ? m.itl_decode.percentile(50) : x.p50;
    for (size_t i = 0; i < m.preemptions_by_request.size(); ++i) {
        if (m.preemptions_by_request[i] == 0) continue;
        x.preempted_streams++;
        x.paused_streams += x.decode_p50 > 0 && m.longest_gap_by_request[i] >= kPauseFactor * x.decode_p50;
    }
    x.preemption_share_p99 = m.itl.count() ? m.preemption_share_at_or_above(x.p99) : 0;
    x.gaps_preempted = (long)m.itl_preempted.count();
    x.gaps_recompute = (long)m.itl_recompute.count();
    x.gaps_swap = (long)m.itl_swap.count();
    x.gaps_prefill = (long)m.itl_prefill.count();
    x.gaps_decode = (long)m.itl_decode.count();
    return x;
}
// C7: "the client sees a pause, a p99 inter-token-latency cliff". Premise:
// preemptions in the overloaded run. Three parts, as the claim reads:
//   pause  per stream, its longest gap: at least half of the preempted
//          streams see a pause (>= 10x the decode median);
//   cliff  the overloaded run's ITL p99 is at least 3x the unpressured
//          run's, both serving the same arrivals (a cliff, not a slope:
//          the factor C10 also reads as "far above");
//   cause  the cliff is preemption's: of the overloaded gaps at or above
//          its p99, at least half waited on a preemption -- the stream's
//          own, or another's recompute or swap (prefill of admissions and
//          plain decode are not preemption's).
// Supported: all three. Contradicted: no pause and no cliff. Mixed otherwise.
inline ClaimVerdict decide_c7(const SignalRun& o, const SignalRun& a) {
    const bool pause = o.preempted_streams > 0 && 2 * o.paused_streams >= o.preempted_streams;
    const bool cliff = a.p99 > 0 && o.p99 >= 3 * a.p99;
    const bool cause = o.preemption_share_p99 >= 0.5;
    return verdict_if(o.preemptions > 0, "no preemption under pressure", {{"preemptions", (double)o.preemptions}},
                      verdict("C7", pause && cliff && cause, !pause && !cliff,
                              fmt("%d of %d preempted streams paused >= %.0fx the decode median (%.1f ms); ITL p99 %.1f ms against %.1f ms "
                                  "unpressured (%.1fx); %.0f%% of the gaps at or above p99 waited on a preemption; gaps: %ld across the "
                                  "stream's own preemption, %ld behind recompute, %ld behind swap, %ld behind admission prefill, %ld decode",
                                  o.paused_streams, o.preempted_streams, kPauseFactor, 1e3 * o.decode_p50, 1e3 * o.p99, 1e3 * a.p99,
                                  a.p99 > 0 ? o.p99 / a.p99 : 0, 100 * o.preemption_share_p99, o.gaps_preempted, o.gaps_recompute,
                                  o.gaps_swap, o.gaps_prefill, o.gaps_decode),
                              {{"paused_share", o.preempted_streams ? (double)o.paused_streams / o.preempted_streams : 0},
                               {"p99_ratio", a.p99 > 0 ? o.p99 / a.p99 : 0}, {"preemption_share_p99", o.preemption_share_p99},
                               {"p99_ms", 1e3 * o.p99}, {"unpressured_p99_ms", 1e3 * a.p99}}));
}
// C10: "the signals: a nonzero preemption counter, cache usage pinned at the
// ceiling, ITL p99 far above the median". Premise: preemptions under
// pressure (the first signal; without it the pool never ran out). The other
// two: KV usage at >= 99% in at least a quarter of the steps ("pinned":
// there for a good part of the run, not a moment), and ITL p99 >= 3x its
// median (every gap, recompute stalls included: what an operator's
// histogram shows). Supported: all three under pressure and none without
// it (the unpressured run). Contradicted: under pressure neither of the two.
// Mixed otherwise -- among them, a signal that also shows without pressure
// (chunked prefill alone can raise p99/p50), which misleads an operator.
inline ClaimVerdict decide_c10(const SignalRun& o, const SignalRun& a) {
    const auto signals = [](const SignalRun& x) { return (x.preemptions > 0) + (x.full_fraction >= 0.25) + (x.ratio() >= 3.0); };
    const int so = signals(o), sa = signals(a);
    return verdict_if(o.preemptions > 0, "no preemption under pressure", {{"preemptions", (double)o.preemptions}},
                      verdict("C10", so == 3 && sa == 0, so == 1,
                              fmt("overloaded shows %d of 3 signals (%ld preemptions, KV >= 99%% in %.0f%% of steps, ITL p99/p50 %.1f); "
                                  "unpressured %d of 3 (%ld preemptions, KV >= 99%% in %.0f%% of steps, p99/p50 %.1f)",
                                  so, o.preemptions, 100 * o.full_fraction, o.ratio(), sa, a.preemptions, 100 * a.full_fraction, a.ratio()),
                              {{"signals_overloaded", (double)so}, {"signals_unpressured", (double)sa}, {"full_fraction", o.full_fraction},
                               {"p99_p50", o.ratio()}, {"unpressured_p99_p50", a.ratio()}}));
}

// Overloaded: the base at `load` x the capacity (default 2), the bet at
// max_num_seqs 4 x fit. Unpressured: the very same arrivals, with
// max_num_seqs capped at what the pool holds at the longest length, so that
// no request can ever be preempted -- the same engine, without pressure.
inline StudyResult signals_study(const Env& env) {
    const Base b = base_scenario(env);
    const Capacity cap = capacity(env, b);
    StudyResult r;
    std::string note;
    const Scenario over = with_load(env, b, cap, env.load > 0 ? env.load : 2.0, &note);
    Scenario calm = over;
    calm.max_num_seqs = b.fit_longest;
    r.notes.push_back("overloaded: " + note + fmt("; max_num_seqs %d", over.max_num_seqs));
    r.notes.push_back(fmt("unpressured: the same arrivals with max_num_seqs %d (the pool holds every running request at its longest)", calm.max_num_seqs));
    r.notes.push_back("ITL gaps by cause: the stream's own preemption / another's recompute / swap / admission prefill / plain decode");
    const Measurement m[2] = {measure(env, calm), measure(env, over)};
    r.table.headers = {"run", "preemptions", "KV peak", "steps at >=99% KV", "ITL p50 ms", "ITL p99 ms", "ITL max ms", "p99/p50",
                       "paused / preempted streams", "gaps pre/recomp/swap/prefill/decode", "completed"};
    const char* names[2] = {"unpressured", "overloaded"};
    SignalRun x[2];
    for (int i = 0; i < 2; ++i) {
        x[i] = signal_run(m[i]);
        r.table.rows.push_back({names[i], std::to_string(m[i].preemptions), pct(m[i].peak_kv), pct(m[i].full_fraction), ms(x[i].p50),
                                ms(x[i].p99), ms(m[i].itl.percentile(100)), fmt("%.1f", x[i].ratio()),
                                fmt("%d/%d", x[i].paused_streams, x[i].preempted_streams),
                                fmt("%ld/%ld/%ld/%ld/%ld", x[i].gaps_preempted, x[i].gaps_recompute, x[i].gaps_swap, x[i].gaps_prefill,
                                    x[i].gaps_decode),
                                fmt("%d/%d", m[i].finished, m[i].requests)});
    }
    r.verdicts.push_back(decide_c7(x[1], x[0]));
    r.verdicts.push_back(decide_c10(x[1], x[0]));
    return r;
}

// ============================================================================
// 9. mechanisms: failure as a designed-for event, and the victim's place (C2, C4)
// ============================================================================

// C2: "an allocation failure is a designed-for event, not a crash". Premise:
// allocations failed (preemptions). Supported: every request still
// completed, none with an error. Contradicted: some request failed or never
// completed. Not a comparison of two arms: counts.
inline ClaimVerdict decide_c2(long preemptions, int requests, int finished, int failed) {
    return verdict_if(preemptions > 0, "no allocation failed", {{"preemptions", (double)preemptions}},
                      verdict("C2", finished == requests && failed == 0, failed > 0 || finished < requests,
                              fmt("%ld block allocations failed into preemptions; %d of %d requests completed, %d failed", preemptions,
                                  finished, requests, failed),
                              {{"finished", (double)finished}, {"failed", (double)failed}}));
}
// C4: "the victim goes to the front of the queue and resumes when blocks
// free". Premise: a preemption. Supported: every victim resumes, in the
// order of a stack of preemptions (the last one pushed to the front of the
// queue resumes first). Contradicted: one out of order, or never back.
inline ClaimVerdict decide_c4(long preemptions, long resumptions, long out_of_order, long never_back) {
    return verdict_if(preemptions > 0, "no preemption", {{"preemptions", (double)preemptions}},
                      verdict("C4", out_of_order == 0 && never_back == 0, out_of_order > 0 || never_back > 0,
                              fmt("%ld resumptions, %ld out of queue order, %ld victims never resumed", resumptions, out_of_order, never_back),
                              {{"resumptions", (double)resumptions}, {"out_of_order", (double)out_of_order}, {"never_back", (double)never_back}}));
}

// The base at `load` x the capacity (default 2).
inline StudyResult mechanisms_study(const Env& env) {
    const Base b = base_scenario(env);
    const Capacity cap = capacity(env, b);
    StudyResult r;
    std::string note;
    const Scenario base = with_load(env, b, cap, env.load > 0 ? env.load : 2.0, &note);
    r.notes.push_back("base: " + note);
    // C4 from the event stream: a victim goes to the front of the waiting
    // queue, so the victims waiting at any moment come back in the order of
    // a stack of preemptions -- the last one pushed to the front resumes
    // first -- and every victim comes back.
    long admissions_checked = 0, out_of_order = 0, never_back = 0;
    std::vector<int> pending;  // victims not resumed yet, front of the queue first
    const Measurement m = measure(env, base, [&](int, const pkv::StreamEvent& e, pkv::Engine&) {
        if (e.type == pkv::EventType::kPreempted) pending.insert(pending.begin(), e.request_id);
        if (e.type == pkv::EventType::kResumed) {
            ++admissions_checked;
            if (pending.empty() || pending.front() != e.request_id) ++out_of_order;
            pending.erase(std::remove(pending.begin(), pending.end(), e.request_id), pending.end());
        }
    });
    never_back = (long)pending.size();
    r.table.headers = {"requests", "completed", "failed", "preemptions", "resumptions", "victims resumed out of queue order", "victims never resumed"};
    r.table.rows.push_back({std::to_string(m.requests), std::to_string(m.finished), std::to_string(m.failed), std::to_string(m.preemptions),
                            std::to_string(admissions_checked), std::to_string(out_of_order), std::to_string(never_back)});
    r.verdicts.push_back(decide_c2(m.preemptions, m.requests, m.finished, m.failed));
    r.verdicts.push_back(decide_c4(m.preemptions, admissions_checked, out_of_order, never_back));
    return r;
}

// ============================================================================
// 10. kv_dtype: what a smaller cache element costs and buys (C12's "quantize")
// ============================================================================

// Greedy-decodes `n` tokens after `prompt` through a cache of `dtype`; with
// `forced` non-empty those tokens are fed instead of the argmax (teacher
// forcing). Fills the logits at every generated position and the tokens.
inline void decode_with(const pkv::Model& m, pkv::KVDtype dtype, const std::vector<int>& prompt, int n, const std::vector<int>& forced,
                        std::vector<std::vector<float>>& logits, std::vector<int>& tokens) {
    const int bs = 16, total = (int)prompt.size() + n;
    pkv::KVCache cache(pkv::KVGeometry{m.cfg.n_layers, (int)pkv::blocks_for_tokens(total, bs), bs, m.cfg.n_kv_heads, m.cfg.head_dim(), dtype});
    pkv::FastCpuMath fast;
    pkv::CpuForward fwd(m, cache, fast);
    pkv::BlockPool pool(cache.geo.num_blocks, bs, false);
    pkv::BlockTable table;
    std::vector<int32_t> seq(prompt.begin(), prompt.end());
    logits.clear();
    tokens.clear();
    std::vector<float> out;
    int pos = 0;
    while ((int)tokens.size() < n) {
        pkv::allocate_slots(pool, table, {}, (int)seq.size());
        pkv::ForwardBatch b;
        b.add_sequence(table.blocks, bs, seq.data() + pos, pos, (int)seq.size() - pos, true);
        fwd.forward(b, out);
        pos = (int)seq.size();
        logits.push_back(out);
        const int next = forced.empty() ? pkv::argmax(out.data(), m.cfg.vocab_size) : forced[tokens.size()];
        tokens.push_back(next);
        seq.push_back(next);
    }
}

// The claim's "quantize cache memory" fix (C12, kv_dtype study): at the same
// bytes the smaller element must relieve thrash as every fix must in the
// fixes study (relieves(): fewer preemptions and a lower ITL p99, each by
// more than the draw band). Premise: the larger element preempts. Supported:
// it relieves. Contradicted: neither fewer preemptions nor a lower p99.
// Mixed: one of the two.
inline ClaimVerdict decide_c12_quantize(const std::string& small_name, long small_slots, long big_slots, long small_preemptions,
                                        long big_preemptions, double small_itl_p99, double big_itl_p99, const std::string& cost) {
    const bool fewer = below_band((double)big_preemptions, (double)small_preemptions), lower = below_band(big_itl_p99, small_itl_p99);
    return verdict_if(big_preemptions > 0, "nothing to relieve: no preemption at the larger element",
                      {{"preemptions_big", (double)big_preemptions}},
                      verdict("C12", fewer && lower, !fewer && !lower,
                              fmt("%s holds %ld token slots against %ld and preempts %ld times against %ld; ITL p99 %.1f against %.1f ms; %s",
                                  small_name.c_str(), small_slots, big_slots, small_preemptions, big_preemptions, 1e3 * small_itl_p99,
                                  1e3 * big_itl_p99, cost.c_str()),
                              {{"preemptions_small", (double)small_preemptions}, {"preemptions_big", (double)big_preemptions},
                               {"itl_p99_small_ms", 1e3 * small_itl_p99}, {"itl_p99_big_ms", 1e3 * big_itl_p99}}));
}

// What it buys: the base at `load` x the capacity (default 2), at the base
// pool's bytes, in the smaller element (more blocks for the same memory).
inline StudyResult kv_dtype_study(const Env& env) {
    const Base b = base_scenario(env);
    const Capacity cap = capacity(env, b);
    StudyResult r;
    std::string note;
    const Scenario base = with_load(env, b, cap, env.load > 0 ? env.load : 2.0, &note);
    Scenario big = base, small = base;
    std::string big_name = "f32", small_name = "int8";
    if (env.sim() && !env.measured) {
        big_name = "bf16";
        small_name = "fp8";
        small.kv_bytes_override = 1;
    } else {
        small.kv_dtype = pkv::KVDtype::kInt8;
        const pkv::Config& c = env.shape();
        const pkv::KVGeometry f32{c.n_layers, 1, base.block_size, c.n_kv_heads, c.head_dim(), pkv::KVDtype::kF32};
        const pkv::KVGeometry i8{c.n_layers, 1, base.block_size, c.n_kv_heads, c.head_dim(), pkv::KVDtype::kInt8};
        small.num_blocks = (int)(base.num_blocks * f32.bytes_per_block() / i8.bytes_per_block());
    }
    const Measurement mb = measure(env, big), ms2 = measure(env, small);
    r.notes.push_back("base: " + note + "; the same bytes of cache in a smaller element");
    r.table.headers = {"cache", "token slots", "preemptions", "recomputed", "useful tok/s", "ITL p99 ms"};
    r.table.rows.push_back({big_name, std::to_string(pool_tokens(env, big)), std::to_string(mb.preemptions), std::to_string(mb.recomputed_tokens),
                            fmt("%.0f", mb.useful_tok_per_s()), ms(mb.itl.percentile(99))});
    r.table.rows.push_back({small_name, std::to_string(pool_tokens(env, small)), std::to_string(ms2.preemptions),
                            std::to_string(ms2.recomputed_tokens), fmt("%.0f", ms2.useful_tok_per_s()), ms(ms2.itl.percentile(99))});
    // What it costs (CPU only: the sim computes no logits): teacher-forced
    // logits against f32 on eight prompts, and how long free-running greedy
    // text stays the same.
    std::string cost = "accuracy not measured (the simulated GPU computes no logits)";
    if (!env.sim()) {
        static const char* const kPrompts[] = {"Once upon a time", "The little dog ran to the park", "One day, a girl named Lily",
                                               "the sun was warm and the sky was blue", "Tom and his friend found a big box",
                                               "She wanted to play with the ball", "a bird sat in the tree and sang", "Mom said"};
        const pkv::Model& m = env.cpu_model->model;
        const int n = 48;
        Table acc;
        acc.headers = {"cache", "max |dlogit|", "greedy agreement (teacher-forced)", "free-running tokens equal to f32"};
        for (pkv::KVDtype dt : {pkv::KVDtype::kF16, pkv::KVDtype::kInt8}) {
            double maxd = 0;
            long agree = 0, positions = 0, free_same = 0, free_total = 0;
            for (const char* p : kPrompts) {
                const std::vector<int> prompt = env.cpu_model->tok.encode(p, true);
                std::vector<std::vector<float>> ref_logits, logits;
                std::vector<int> ref_tokens, tokens;
                decode_with(m, pkv::KVDtype::kF32, prompt, n, {}, ref_logits, ref_tokens);
                decode_with(m, dt, prompt, n, ref_tokens, logits, tokens);
                for (int i = 0; i < n; ++i) {
                    for (int v = 0; v < m.cfg.vocab_size; ++v) maxd = std::max(maxd, (double)std::fabs(logits[i][v] - ref_logits[i][v]));
                    agree += pkv::argmax(logits[i].data(), m.cfg.vocab_size) == ref_tokens[i];
                    positions++;
                }
                decode_with(m, dt, prompt, n, {}, logits, tokens);
                int same = 0;
                while (same < n && tokens[same] == ref_tokens[same]) ++same;
                free_same += same;
                free_total += n;
            }
            acc.rows.push_back({pkv::to_string(dt), fmt("%.4f", maxd), fmt("%.1f%%", 100.0 * agree / positions),
                                fmt("%ld of %ld", free_same, free_total)});
            if (dt == pkv::KVDtype::kInt8)
                cost = fmt("int8 changes logits by at most %.3f and keeps %.1f%% of greedy choices (built-in model)", maxd, 100.0 * agree / positions);
        }
        r.extra.push_back(acc);
    }
    r.verdicts.push_back(decide_c12_quantize(small_name, pool_tokens(env, small), pool_tokens(env, big), ms2.preemptions, mb.preemptions,
                                             ms2.itl.percentile(99), mb.itl.percentile(99), cost));
    return r;
}

// ============================================================================
// 11. The list
// ============================================================================

inline const std::vector<Study>& all_studies() {
    static const std::vector<Study> v = {
        {"thrash", "the concurrency sweep: inversion and thrash over time", {"C11", "C13"}, thrash_study},
        {"admission", "admit on blocks needed now, or reserve for the whole sequence", {"C1"}, admission_study},
        {"victim", "who is preempted: newest, oldest, or everyone slowed alike", {"C3"}, victim_study},
        {"preemption", "recompute, swap and prefix caching, and where swap starts to win", {"C5", "C6a", "C6b", "C8"}, preemption_study},
        {"fixes", "the fixes, bluntest first, replicas included", {"C12"}, fixes_study},
        {"shedding", "shedding at the edge against an unbounded queue", {"C9"}, shedding_study},
        {"signals", "what the client and the operator see", {"C7", "C10"}, signals_study},
        {"mechanisms", "an allocation failure is an event; the victim's place in the queue", {"C2", "C4"}, mechanisms_study},
        {"kv_dtype", "a smaller KV cache element: what it costs and what it buys", {"C12"}, kv_dtype_study},
    };
    return v;
}

}  // namespace study

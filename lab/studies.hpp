// lab/studies.hpp -- lab/LAB.md chapter L5 (verdicts: L7). Every study: a
// short table of variants, run on one
// device (this CPU, or a simulated GPU), and a conclusion computed from its
// own numbers. Each study names the claims it tests (study_kit.hpp's list),
// prints its evidence, and ends with a verdict per claim -- supported,
// contradicted, mixed, or not shown -- that the same code would print the
// other way round if the numbers went the other way. Thresholds are stated
// where they are used, chosen once, and never tuned to a result. Each
// verdict is decided by a small function of the study's numbers (decide_*),
// so that a test can hand it numbers that go the other way; and wherever
// two arms are compared, a difference inside the draw band (kDrawBand) is a
// draw, never a win.
//
// A verdict holds for the inputs it was computed at. Every study reads the
// workload's own inputs from its Env -- the traffic's seed, a scale on every
// length, an arrival load where arrivals matter -- and study_map.hpp runs a
// study over a grid of them (GPU, model, scale, load, link, seed) to show
// where each claim holds.
//
// One overloaded base scenario serves most studies, the same in shape on both
// devices: outputs five times longer than prompts (so the pool drains through
// *growth*, what the admission bet loses on), a pool that holds `fit`
// requests at their longest, and four times that many allowed to run at
// once. On the CPU that is the built-in model, 48 blocks of 16 and
// 48 x (32 + 160) tokens; on the sim, the GPU's whole pool (vLLM's rule) and
// sequences of up to 2560 tokens (both x scale).
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

// ---- the base scenario --------------------------------------------------------

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

// The overloaded base: see the top of this file.
struct Base {
    Scenario sc;
    int fit = 0;  // requests the pool holds at their longest
};
// A run's request count: `full` for a single run, a map cell's fraction of
// it (Env::cell), never fewer than `at_least` (an all-at-once run must
// still reach its max_num_seqs).
inline int cell_requests(const Env& env, int full, int at_least) {
    return std::max(at_least, (int)std::lround(env.cell * full));
}
// A length x the env's scale, at least 1.
inline int scaled(const Env& env, int n) { return std::max(1, (int)std::lround(env.scale * n)); }

inline Base base_scenario(const Env& env) {
    Base b;
    Scenario& s = b.sc;
    s.name = "base";
    s.block_size = 16;
    s.traffic.seed = env.seed;
    // This CPU, measured or modelled (the sim's `cpu` preset): the CPU's base.
    if (!env.sim() || env.measured) {
        s.num_blocks = 48;
        s.max_num_batched_tokens = 256;
        s.traffic.prompt = LengthDist::fixed(scaled(env, 32));
        s.traffic.output = LengthDist::fixed(scaled(env, 160));
        b.fit = (int)std::max(1L, pool_tokens(env, s) / (s.traffic.prompt.lo + s.traffic.output.lo));
        s.max_num_seqs = 4 * b.fit;
        s.traffic.requests = cell_requests(env, 3 * s.max_num_seqs, s.max_num_seqs);
        return b;
    }
    const int longest = std::max(5, std::min(scaled(env, 2560), env.shape().seq_len));
    const int prompt = longest / 5;
    s.max_num_batched_tokens = 8192;
    s.max_num_seqs = 256;  // for the activation reserve of the pool sizing; set below
    s.traffic.prompt = LengthDist::fixed(prompt);
    s.traffic.output = LengthDist::fixed(longest - prompt);
    const long slots = pool_tokens(env, s);
    b.fit = (int)std::max(1L, slots / longest);
    s.max_num_seqs = 4 * b.fit;
    s.traffic.requests = cell_requests(env, 3 * s.max_num_seqs, s.max_num_seqs);
    return b;
}
inline std::string describe(const Env& env, const Scenario& s) {
    return fmt("%d requests (%s), prompt %s + output %s tokens; pool %ld token slots per replica (blocks of %d); max_num_seqs %d",
               s.traffic.requests, s.traffic.arrivals.describe().c_str(), s.traffic.prompt.describe().c_str(),
               s.traffic.output.describe().c_str(), pool_tokens(env, s), s.block_size, s.max_num_seqs);
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

// ============================================================================
// thrash: the concurrency sweep (C11, C13)
// ============================================================================

// The capacity of one replica on a scenario: completed requests per device
// second when every request arrives at once.
inline double capacity_rps(const Env& env, const Scenario& s) {
    Scenario c = s;
    c.traffic.arrivals = Arrivals{};
    const Measurement m = measure(env, c);
    return m.makespan_s > 0 ? m.finished / m.makespan_s : 0;
}

// What the thrash deciders read: the best setting of the sweep and its top.
struct SweepEnds {
    int best_seqs = 0, top_seqs = 0;
    bool top_is_best = false;
    double best_tok_s = 0, top_tok_s = 0;  // useful tokens per device second
    long best_preemptions = 0, top_preemptions = 0;
    double top_busy = 0;   // fraction of the top run's time the device spent in steps
    double top_waste = 0;  // recomputed / computed tokens at the top
};
// C13: raising concurrency while preemptions climb makes throughput worse.
// Supported: the top of the sweep is past the best, has more preemptions,
// and delivers 10% or more less useful throughput. Contradicted: the top is
// the best, or within the draw band of it. Mixed in between.
inline ClaimVerdict decide_c13(const SweepEnds& e) {
    const double drop = pct_change(e.best_tok_s, e.top_tok_s);
    return verdict("C13", !e.top_is_best && e.top_preemptions > e.best_preemptions && drop <= -10.0,
                   e.top_is_best || drop >= -kDrawBand,
                   fmt("useful throughput peaks at max_num_seqs %d (%.0f tok/s, %ld preemptions); at %d it is %+.0f%% with %ld preemptions",
                       e.best_seqs, e.best_tok_s, e.best_preemptions, e.top_seqs, drop, e.top_preemptions),
                   {{"best_max_num_seqs", e.best_seqs}, {"top_max_num_seqs", e.top_seqs}, {"best_tok_s", e.best_tok_s},
                    {"top_tok_s", e.top_tok_s}, {"drop_pct", drop}, {"top_preemptions", (double)e.top_preemptions}});
}
// C11: sustained preemption is thrash -- the device stays busy while useful
// throughput drops. The requests arrive over time (study below), so "busy" is
// a measurement: a setting that keeps up idles between arrivals. Supported:
// at the top the device is busy >= 95% of the time, a fifth or more of what
// it computes is recompute, and useful throughput is 10% or more below the
// best. Contradicted: the top idles (busy < 80%: it keeps up, no thrash) or
// its useful throughput is within the draw band of the best. Mixed otherwise.
inline ClaimVerdict decide_c11(const SweepEnds& e) {
    const double drop = pct_change(e.best_tok_s, e.top_tok_s);
    return verdict("C11", e.top_busy >= 0.95 && e.top_waste >= 0.2 && drop <= -10.0, e.top_busy < 0.8 || drop >= -kDrawBand,
                   fmt("at max_num_seqs %d the device is busy %.0f%% of the time, %.0f%% of the tokens it computes are recomputed, "
                       "and useful throughput is %+.0f%% from the best",
                       e.top_seqs, 100 * e.top_busy, 100 * e.top_waste, drop),
                   {{"top_busy", e.top_busy}, {"top_recompute_share", e.top_waste}, {"drop_pct", drop}});
}

// The sweep: max_num_seqs from fit/4 to 8 x fit (a map cell runs fit, 2 x
// fit and 8 x fit only: below fit nothing is preempted, and the best setting
// is at fit or above on a GPU). The requests arrive in three bursts of 4 x
// fit each (the base's max_num_seqs), the bursts a Poisson process
// whose mean rate is `load` x the capacity measured at max_num_seqs = fit
// (default 1: the rate the best-behaved setting just sustains). A burst is
// what overcommits the pool; between bursts a setting that keeps up drains
// its queue and idles, while one that wastes its capacity on recompute
// falls behind and stays busy. So "busy" is measured, not given.
inline StudyResult thrash_study(const Env& env) {
    const Base b = base_scenario(env);
    StudyResult r;
    Scenario base = b.sc;
    Scenario at_fit = base;
    at_fit.max_num_seqs = b.fit;
    const double load = env.load > 0 ? env.load : 1.0;
    const double cap = capacity_rps(env, at_fit);
    base.traffic.requests = cell_requests(env, 3 * b.sc.max_num_seqs, 1);
    base.traffic.arrivals = Arrivals{Arrivals::Kind::kBursts, load * cap, std::max(1, base.traffic.requests / 3)};
    r.notes.push_back("base: " + describe(env, base) + fmt("; on average %.2gx the capacity at max_num_seqs = fit (%.3g req/s)", load, cap));
    r.notes.push_back(fmt("sweeping max_num_seqs from %s to 8 x fit (fit = %d)", env.map_cell() ? "fit" : "fit/4", b.fit));
    r.table.headers = {"max_num_seqs", "preemptions", "recomputed", "useful tok/s", "processed tok/s", "busy", "ITL p99 ms", "makespan s"};
    std::vector<int> seqs;
    for (double f : env.map_cell() ? std::vector<double>{1.0, 2.0, 8.0} : std::vector<double>{0.25, 0.5, 1.0, 2.0, 4.0, 8.0}) {
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
    cs.title = "useful throughput and preemptions vs max_num_seqs";
    cs.x_label = "max_num_seqs";
    cs.y_label = "useful tokens/s";
    cs.log2_x = true;
    svg::Series s1{"useful tok/s", {}, {}};
    for (size_t i = 0; i < seqs.size(); ++i) {
        s1.x.push_back(seqs[i]);
        s1.y.push_back(ms_[i].useful_tok_per_s());
    }
    cs.series = {s1};
    r.charts = {cs, ct};
    return r;
}

// ============================================================================
// admission: the bet against reserving (C1)
// ============================================================================

// One concurrency of the admission study: the bet and reserving side by side.
struct AdmissionPoint {
    int max_num_seqs = 0;
    double bet_tok_s = 0, reserve_tok_s = 0;  // useful tokens per device second
    long bet_preemptions = 0;
    int reserve_peak_running = 0;
};
// C1: "beats" = more useful tokens per second over the whole run, by more
// than the draw band. Supported if the bet wins at every concurrency,
// contradicted if reserving does, mixed otherwise.
inline ClaimVerdict decide_c1(const std::vector<AdmissionPoint>& pts) {
    int wins = 0, losses = 0;
    std::string per;
    for (const AdmissionPoint& p : pts) {
        const int c = compare(p.bet_tok_s, p.reserve_tok_s);
        wins += c > 0;
        losses += c < 0;
        per += fmt("%sat max_num_seqs %d the bet delivers %+.0f%% useful tokens/s (%ld preemptions; reserving runs at most %d)",
                   per.empty() ? "" : "; ", p.max_num_seqs, pct_change(p.reserve_tok_s, p.bet_tok_s), p.bet_preemptions,
                   p.reserve_peak_running);
    }
    const int n = (int)pts.size();
    Numbers num;
    for (const AdmissionPoint& p : pts) num.push_back({fmt("bet_gain_pct@%d", p.max_num_seqs), pct_change(p.reserve_tok_s, p.bet_tok_s)});
    return verdict("C1", n > 0 && wins == n, n > 0 && losses == n, per + " against reserving", num);
}

inline StudyResult admission_study(const Env& env) {
    const Base b = base_scenario(env);
    StudyResult r;
    // Admission only matters when requests end before the max_tokens they
    // asked for, as real answers do: the base's prompts, outputs drawn
    // long-tailed (lognormal, sigma 1) around the base's output length, and
    // every client asking for up to four times that (capped by the model's
    // context). Reserving then holds blocks for tokens that never come.
    Scenario s0 = b.sc;
    const int mean_out = b.sc.traffic.output.lo, prompt = b.sc.traffic.prompt.lo;
    const int cap = std::max(1, std::min(4 * mean_out, env.shape().seq_len - prompt));
    s0.traffic.output = LengthDist::lognormal(mean_out, 1.0, 1, cap);
    s0.traffic.max_tokens_cap = cap;
    r.notes.push_back("base: " + describe(env, s0) + fmt("; every request asks for max_tokens %d", cap));
    r.notes.push_back(fmt("both policies at max_num_seqs %d, %d and %d (1, 2 and 4 x fit, fit = %d requests at prompt + mean output)", b.fit,
                          2 * b.fit, 4 * b.fit, b.fit));
    r.table.headers = {"max_num_seqs", "admission", "peak running", "preemptions", "recomputed", "useful tok/s", "TTFT p50 ms", "makespan s"};
    std::vector<AdmissionPoint> pts;
    for (int k : env.map_cell() ? std::vector<int>{1, 4} : std::vector<int>{1, 2, 4}) {
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
        pts.push_back({k * b.fit, m[0].useful_tok_per_s(), m[1].useful_tok_per_s(), m[0].preemptions, m[1].peak_running});
    }
    r.verdicts.push_back(decide_c1(pts));
    return r;
}

// ============================================================================
// victim: newest-first against oldest-first and a uniform slowdown (C3)
// ============================================================================

// What the C3 decider reads: requests completed by newest-first and by the
// uniform slowdown (fair) at the same checkpoints, and mean completion times.
struct VictimCounts {
    std::vector<int> newest, fair;  // [checkpoint] requests completed by then
    double newest_mean_s = 0, fair_mean_s = 0, oldest_mean_s = 0;
};
// C3 compares newest-first with the uniform slowdown (fair), checkpoint by
// checkpoint: a count is ahead when it exceeds the other by more than the
// draw band (and by more than one request). Supported if newest-first is
// ahead at some checkpoint and behind at none; contradicted the other way
// round; mixed if both happen or every checkpoint is a draw.
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
    return verdict("C3", ahead > 0 && behind == 0, behind > 0 && ahead == 0,
                   fmt("requests completed by 25/50/75/100%% of newest-first's run, newest-first vs fair: %s (a draw within %.0f%%); "
                       "mean completion %.3f vs %.3f s (oldest-first %.3f s)",
                       counts.c_str(), kDrawBand, v.newest_mean_s, v.fair_mean_s, v.oldest_mean_s),
                   {{"checkpoints_ahead", (double)ahead}, {"checkpoints_behind", (double)behind}, {"newest_mean_s", v.newest_mean_s},
                    {"fair_mean_s", v.fair_mean_s}});
}

inline StudyResult victim_study(const Env& env) {
    const Base b = base_scenario(env);
    StudyResult r;
    r.notes.push_back("base: " + describe(env, b.sc));
    r.notes.push_back("fair = preempt the request that has generated the most tokens: nobody runs ahead, everyone slows alike");
    const pkv::Victim policies[3] = {pkv::Victim::kNewest, pkv::Victim::kOldest, pkv::Victim::kFair};
    // (A map cell skips oldest-first: the verdict compares newest-first with fair.)
    Measurement m[3];
    for (int i = 0; i < 3; ++i) {
        if (i == 1 && env.map_cell()) continue;
        Scenario s = b.sc;
        s.policy.victim = policies[i];
        m[i] = measure(env, s);
    }
    // Work completed by fixed times: a quarter, half and three quarters of
    // the newest-first run's makespan, and its end.
    const double T = m[0].makespan_s;
    r.table.headers = {"victim", "preemptions", "recomputed", "done @25%", "done @50%", "done @75%", "done @100%", "mean done s", "makespan s"};
    for (int i = 0; i < 3; ++i) {
        if (i == 1 && env.map_cell()) continue;
        double mean_done = 0;
        for (double t : m[i].done_s) mean_done += t;
        mean_done /= std::max<size_t>(1, m[i].done_s.size());
        r.table.rows.push_back({pkv::to_string(policies[i]), std::to_string(m[i].preemptions), std::to_string(m[i].recomputed_tokens),
                                std::to_string(m[i].completed_by(0.25 * T)), std::to_string(m[i].completed_by(0.5 * T)),
                                std::to_string(m[i].completed_by(0.75 * T)), std::to_string(m[i].completed_by(T)), sec(mean_done),
                                sec(m[i].makespan_s)});
    }
    auto mean_done = [](const Measurement& x) {
        double t = 0;
        for (double d : x.done_s) t += d;
        return x.done_s.empty() ? 0.0 : t / (double)x.done_s.size();
    };
    VictimCounts v;
    for (double f : {0.25, 0.5, 0.75, 1.0}) {
        v.newest.push_back(m[0].completed_by(f * T));
        v.fair.push_back(m[2].completed_by(f * T));
    }
    v.newest_mean_s = mean_done(m[0]);
    v.fair_mean_s = mean_done(m[2]);
    v.oldest_mean_s = mean_done(m[1]);
    r.verdicts.push_back(decide_c3(v));
    return r;
}

// ============================================================================
// preemption: recompute, swap and prefix caching across lengths (C5, C6, C8)
// ============================================================================

// A link as the tables show it: the preset, the env's bandwidth, or this
// CPU's memcpy.
inline std::string link_name(const Env& env, const std::string& link) {
    if (!env.sim() || env.measured) return "memcpy";
    if (!link.empty()) return link;
    const pkv::SimConfig s = env.sim_config_for("");
    return fmt("%.3g GB/s", s.hw.pcie_bw / 1e9);
}

// C5: a recompute redoes what the victim had computed (recomputed tokens
// within 25% of the victims' computed tokens), and prefix caching
// recomputes fewer tokens. Token counts are exact, so no draw band: any
// token the cache serves is "part of it".
inline ClaimVerdict decide_c5(long preemptions, long recomputed, long victim_tokens, long recomputed_with_cache) {
    const double ratio = victim_tokens ? (double)recomputed / victim_tokens : 0;
    const bool one_prefill = preemptions > 0 && ratio > 0.75 && ratio < 1.25;
    const bool cache_helps = recomputed_with_cache < recomputed;
    return verdict("C5", one_prefill && cache_helps, preemptions > 0 && !cache_helps && (ratio <= 0.75 || ratio >= 1.25),
                   fmt("recomputed %ld tokens for victims that had computed %ld (ratio %.2f); with prefix caching %ld", recomputed,
                       victim_tokens, ratio, recomputed_with_cache),
                   {{"recompute_ratio", ratio}, {"recomputed", (double)recomputed}, {"recomputed_with_cache", (double)recomputed_with_cache}});
}

// What the C6 decider reads, per link: swap's makespan against recompute's
// at each length (shortest first).
struct SwapLink {
    std::string name;
    std::vector<int> lengths;
    std::vector<double> swap_s, recompute_s;
};
struct SwapEvidence {
    std::vector<SwapLink> links;  // the scarcer link first when there are two
    double out_bytes = 0, in_bytes = 0;
    long small_space_fallbacks = 0;
};
// C6: swap copies both ways (bytes out == bytes in > 0), the small swap
// space fills (fallbacks), and swap beats recompute -- makespan shorter by
// more than the draw band -- only from some length on, a length no shorter
// on the scarcer link. Contradicted when swap wins at every length on every
// link, or wins nowhere and loses at the longest length on every link.
// Mixed otherwise (a draw at the longest length, say).
inline ClaimVerdict decide_c6(const SwapEvidence& ev) {
    std::string txt;
    std::vector<int> crossover;  // per link: first length from which swap wins at every longer one; -1 never
    bool wins_all = true, wins_none_loses_long = true, shape = true;
    for (const SwapLink& l : ev.links) {
        std::vector<int> o;
        std::string per;
        for (size_t i = 0; i < l.lengths.size(); ++i) {
            o.push_back(compare(l.recompute_s[i], l.swap_s[i]));  // +1: recompute slower, swap wins
            per += fmt("%s%d: %+.1f%%", per.empty() ? "" : ", ", l.lengths[i], pct_change(l.recompute_s[i], l.swap_s[i]));
        }
        int c = -1;
        for (size_t i = o.size(); i-- > 0 && o[i] > 0;) c = (int)i;
        crossover.push_back(c < 0 ? -1 : l.lengths[(size_t)c]);
        wins_all = wins_all && c == 0;
        wins_none_loses_long = wins_none_loses_long && std::count(o.begin(), o.end(), 1) == 0 && !o.empty() && o.back() < 0;
        shape = shape && c > 0;
        txt += fmt("%s%s: %s (swap vs recompute makespan: %s)", txt.empty() ? "" : "; ", l.name.c_str(),
                   c < 0 ? "never" : c == 0 ? "at every length" : ("from " + std::to_string(l.lengths[(size_t)c]) + " tokens").c_str(),
                   per.c_str());
    }
    Numbers numbers;
    for (size_t k = 0; k < ev.links.size(); ++k) {
        const SwapLink& l = ev.links[k];
        numbers.push_back({"crossover_tokens@" + l.name, (double)crossover[k]});
        for (size_t i = 0; i < l.lengths.size(); ++i)
            numbers.push_back({fmt("swap_vs_recompute_pct@%s@%d", l.name.c_str(), l.lengths[i]), pct_change(l.recompute_s[i], l.swap_s[i])});
    }
    bool scarcer_later = true;  // the scarcer link (first) crosses over no sooner than the other
    if (crossover.size() == 2) scarcer_later = crossover[0] < 0 || (crossover[1] >= 0 && crossover[0] >= crossover[1]);
    const bool both_ways = ev.out_bytes > 0 && ev.out_bytes == ev.in_bytes;
    const bool fills = ev.small_space_fallbacks > 0;
    return verdict("C6", both_ways && fills && shape && scarcer_later, !ev.links.empty() && (wins_all || wins_none_loses_long),
                   fmt("swap moved %.1f MB out and %.1f MB in; the small swap space fell back to recompute %ld times; swap wins (by more "
                       "than %.0f%%) %s",
                       ev.out_bytes / 1e6, ev.in_bytes / 1e6, ev.small_space_fallbacks, kDrawBand, txt.c_str()),
                   numbers);
}

// C8: tokens through the model per completed request, recompute against
// swap; more than the draw band apart decides it.
inline ClaimVerdict decide_c8(double per_request_recompute, double per_request_swap) {
    const int c = compare(per_request_recompute, per_request_swap);
    return verdict("C8", c > 0, c < 0,
                   fmt("%.0f tokens computed per completed request with recompute, %.0f with swap", per_request_recompute, per_request_swap),
                   {{"per_request_recompute", per_request_recompute}, {"per_request_swap", per_request_swap}});
}

struct PreemptionRow {
    std::string link;
    int length;
    std::string mode;
    Measurement m;
};

inline StudyResult preemption_study(const Env& env) {
    const Base b = base_scenario(env);
    StudyResult r;
    // Sequence lengths from 1/32 of the base's longest to all of it, prompt
    // to output 1:4 as in the base, with the pool scaled so that each point
    // has the same pressure (the pool holds `fit` requests at their longest).
    // Half the base's concurrency and requests keep the sweep short.
    const int longest = b.sc.traffic.prompt.lo + b.sc.traffic.output.lo;
    std::vector<int> lengths;  // total tokens per request (a map cell skips the shortest)
    for (int div : env.map_cell() ? std::vector<int>{8, 2, 1} : std::vector<int>{32, 8, 2, 1}) lengths.push_back(std::max(5, longest / div));
    // On a GPU preset both links, unless the env names one (or its bandwidth).
    const bool both_links = env.sim() && !env.measured && env.pcie.empty() && env.pcie_bw_override == 0;
    std::vector<std::string> links = both_links ? std::vector<std::string>{"gen4", "gen5"} : std::vector<std::string>{""};
    const int requests = cell_requests(env, 6 * b.fit, 2 * b.fit);
    r.notes.push_back(fmt("sequence lengths %d..%d tokens (prompt : output = 1 : 4); each point: pool for %d requests at their longest, "
                          "max_num_seqs %d, %d requests all at once",
                          lengths.front(), lengths.back(), b.fit, 2 * b.fit, requests));
    r.notes.push_back("modes: recompute; recompute + prefix caching; swap with ample swap space; swap with a small one "
                      "(a quarter of the pool). Recompute never crosses the link, so it is run once per length.");
    r.table.headers = {"length", "link", "mode", "preemptions", "recomputed", "swapped MB", "fallbacks", "computed/req", "makespan s"};
    std::vector<PreemptionRow> rows;
    for (int len : lengths) {
        Scenario s = b.sc;
        const int prompt = std::max(1, len / 5);
        s.traffic.prompt = LengthDist::fixed(prompt);
        s.traffic.output = LengthDist::fixed(len - prompt);
        s.traffic.requests = requests;
        s.max_num_seqs = 2 * b.fit;
        // The pool: fit requests at their longest, never more than the device holds.
        Scenario whole = s;
        whole.num_blocks = 0;
        const long need = pkv::blocks_for_tokens(len, s.block_size) * b.fit;
        const int blocks = (int)(env.sim() && !env.measured ? std::min<long>(pool_tokens(env, whole) / s.block_size, need) : need);
        s.num_blocks = blocks;
        for (int mode = 0; mode < 4; ++mode)
            for (const std::string& link : (mode < 2 ? std::vector<std::string>{links.front()} : links)) {
                // A map cell runs the small swap space only where C6 reads it: the longest length.
                if (mode == 3 && env.map_cell() && len != lengths.back()) continue;
                Scenario v = s;
                v.pcie = link;
                std::string name = "recompute";
                if (mode == 1) { v.prefix_caching = true; name = "recompute+prefix"; }
                if (mode >= 2) {
                    v.policy.preemption = pkv::Preemption::kSwap;
                    v.swap_space_blocks = mode == 2 ? (int)pkv::blocks_for_tokens(len, s.block_size) * v.traffic.requests : std::max(1, blocks / 4);
                    name = mode == 2 ? "swap" : "swap (small)";
                }
                const std::string shown = mode < 2 ? "-" : link_name(env, link);
                // Recompute never crosses the link: a map's cells that differ only in the link share it.
                const std::string key = mode < 2 ? fmt("preemption|%s|%d|%d|%d|%d|%d", name.c_str(), len, prompt, blocks, v.traffic.requests,
                                                       v.max_num_seqs)
                                                 : "";
                PreemptionRow row{mode < 2 ? "any" : shown, len, name, measure_shared(env, v, key)};
                const Measurement& m = row.m;
                r.table.rows.push_back({std::to_string(len), shown, name, std::to_string(m.preemptions), std::to_string(m.recomputed_tokens),
                                        fmt("%.1f", (m.swap_out_bytes + m.swap_in_bytes) / 1e6), std::to_string(m.swap_fallbacks),
                                        fmt("%.0f", m.finished ? (double)m.computed_tokens / m.finished : 0.0), sec(m.makespan_s)});
                rows.push_back(std::move(row));
            }
    }
    auto find = [&](const std::string& link, int len, const std::string& mode) -> const Measurement& {
        for (const PreemptionRow& x : rows)
            if (x.link == link && x.length == len && x.mode == mode) return x.m;
        throw std::logic_error("preemption_study: missing row");
    };
    const std::string L0 = link_name(env, links.front());
    const Measurement& rc = find("any", lengths.back(), "recompute");
    const Measurement& pc = find("any", lengths.back(), "recompute+prefix");
    r.verdicts.push_back(decide_c5(rc.preemptions, rc.recomputed_tokens, rc.victim_tokens, pc.recomputed_tokens));
    SwapEvidence ev;
    for (const std::string& link : links) {
        SwapLink l;
        l.name = link_name(env, link);
        for (int len : lengths) {
            l.lengths.push_back(len);
            l.swap_s.push_back(find(l.name, len, "swap").makespan_s);
            l.recompute_s.push_back(find("any", len, "recompute").makespan_s);
        }
        ev.links.push_back(l);
    }
    const Measurement& sw = find(L0, lengths.back(), "swap");
    const Measurement& small = find(L0, lengths.back(), "swap (small)");
    ev.out_bytes = (double)sw.swap_out_bytes;
    ev.in_bytes = (double)sw.swap_in_bytes;
    ev.small_space_fallbacks = small.swap_fallbacks;
    r.verdicts.push_back(decide_c6(ev));
    const double per_rc = rc.finished ? (double)rc.computed_tokens / rc.finished : 0;
    const double per_sw = sw.finished ? (double)sw.computed_tokens / sw.finished : 0;
    r.verdicts.push_back(decide_c8(per_rc, per_sw));
    return r;
}

// ============================================================================
// fixes: bluntest first (C12)
// ============================================================================


// One fix of the fixes study: what it relieves and what it costs the clients.
struct FixOutcome {
    std::string name;
    int group = 0;           // its place in the claim's order: 1 cap concurrency, 2 cap generation, 3 free or quantize memory, 4 replicas
    bool relieves = false;   // halves the preemptions and lowers ITL p99 by more than the draw band
    double harm = 0;         // fraction of requests served worse than at baseline (see decide_c12_order)
};
// C12 (the fixes study): "the fixes in order of bluntness". Two parts, both
// measured:
//   relief     each fix halves the baseline's preemptions and lowers its ITL
//              p99 by more than the draw band;
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
inline ClaimVerdict decide_c12_fixes(const std::vector<FixOutcome>& fixes, long base_preemptions, double base_itl_p99_s) {
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
    if (base_preemptions == 0)
        return {"C12", Verdict::kNotShown, fmt("the baseline preempts nothing (ITL p99 %.1f ms): no pressure for a fix to relieve", 1e3 * base_itl_p99_s)};
    return verdict("C12", n > 0 && helped == n && ordered, helped == 0 || reversed,
                   fmt("%d of %d fixes halve the preemptions (baseline %ld) and lower ITL p99 (baseline %.1f ms)%s; requests served worse "
                       "than at baseline, the claim's order: %s (%s)",
                       helped, n, base_preemptions, 1e3 * base_itl_p99_s, not_helped.empty() ? "" : ("; not: " + not_helped).c_str(),
                       order.c_str(), ordered ? "in order" : reversed ? "the other way round" : "out of order"),
                   num);
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

inline StudyResult fixes_study(const Env& env) {
    const Base b = base_scenario(env);
    StudyResult r;
    Scenario base = b.sc;
    // Requests arrive (Poisson) at 1.5x (or the env's load x) what the
    // baseline sustains: a queue builds, and the overload is sustained
    // rather than a one-off burst.
    const double load = env.load > 0 ? env.load : 1.5;
    const double cap = capacity_rps(env, base);
    base.traffic.arrivals = Arrivals{Arrivals::Kind::kPoisson, load * cap, 1};
    r.notes.push_back("base: " + describe(env, base) + fmt("; arrivals at %.2gx the measured capacity of %.3g req/s", load, cap));
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
        s.traffic.output = LengthDist::fixed(std::max(1, base.traffic.output.lo / 2));
        fixes.push_back({"cap generation (half the output)", 2, s});
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
    // claim's last group needs one replica fix, and the run takes a seventh
    // of the cell's time.)
    for (Router rt : env.map_cell() ? std::vector<Router>{Router::kRoundRobin} : std::vector<Router>{Router::kRoundRobin, Router::kLeastKv}) {
        Scenario s = base;
        s.replicas = 2;
        s.router = rt;
        fixes.push_back({fmt("2 replicas, %s", to_string(rt)), 4, s});
    }
    r.table.headers = {"fix", "preemptions", "recomputed", "useful tok/s", "TTFT p99 ms", "ITL p99 ms", "e2e p99 s", "harm", "makespan s"};
    std::vector<Measurement> ms_;
    std::vector<FixOutcome> outcomes;
    std::vector<int> asked;  // the baseline's output lengths: what each client asked for
    for (const PlannedRequest& p : plan_traffic(base.traffic, env.shape().vocab_size))
        asked.push_back(p.params.stop_after_tokens > 0 ? p.params.stop_after_tokens : p.params.max_tokens);
    for (const Fix& f : fixes) {
        ms_.push_back(measure(env, f.s));
        const Measurement& m = ms_.back();
        const double harm = f.group == 0 ? 0.0 : harm_fraction(ms_[0], m, asked);
        r.table.rows.push_back({f.name, std::to_string(m.preemptions), std::to_string(m.recomputed_tokens), fmt("%.0f", m.useful_tok_per_s()),
                                ms(m.ttft.percentile(99)), ms(m.itl.percentile(99)), sec(m.e2e.percentile(99)),
                                f.group == 0 ? "-" : pct(harm), sec(m.makespan_s)});
        if (f.group == 0) continue;
        const bool relieves = m.preemptions * 2 <= ms_[0].preemptions && compare(ms_[0].itl.percentile(99), m.itl.percentile(99)) > 0;
        outcomes.push_back({f.name, f.group, relieves, harm});
    }
    r.verdicts.push_back(decide_c12_fixes(outcomes, ms_[0].preemptions, ms_[0].itl.percentile(99)));
    return r;
}

// ============================================================================
// shedding: fast failures instead of stalls (C9)
// ============================================================================

// C9: with the tightest limit, requests are rejected (retryable), the
// rejections come at least 10x sooner (p99) than an unbounded queue's first
// tokens (p99), and the accepted requests' TTFT p99 is lower than unbounded
// by more than the draw band. Contradicted: nothing is rejected, or the
// rejections come no sooner than the stall they avoid. Mixed otherwise.
inline ClaimVerdict decide_c9(int limit, int rejected, double reject_p99_s, double unbounded_ttft_p99_s, double accepted_ttft_p99_s) {
    return verdict("C9",
                   rejected > 0 && reject_p99_s * 10 <= unbounded_ttft_p99_s && compare(unbounded_ttft_p99_s, accepted_ttft_p99_s) > 0,
                   rejected == 0 || reject_p99_s >= unbounded_ttft_p99_s,
                   fmt("with max_waiting %d, %d requests are rejected within %.1f ms (p99, retryable); unbounded, TTFT p99 is %.1f ms; "
                       "accepted requests' TTFT p99 falls to %.1f ms",
                       limit, rejected, 1e3 * reject_p99_s, 1e3 * unbounded_ttft_p99_s, 1e3 * accepted_ttft_p99_s),
                   {{"rejected", (double)rejected}, {"reject_p99_s", reject_p99_s}, {"unbounded_ttft_p99_s", unbounded_ttft_p99_s},
                    {"accepted_ttft_p99_s", accepted_ttft_p99_s}});
}

inline StudyResult shedding_study(const Env& env) {
    const Base b = base_scenario(env);
    StudyResult r;
    Scenario base = b.sc;
    const double load = env.load > 0 ? env.load : 2.0;
    const double cap = capacity_rps(env, base);
    base.traffic.arrivals = Arrivals{Arrivals::Kind::kPoisson, load * cap, 1};
    r.notes.push_back("base: " + describe(env, base) + fmt("; arrivals at %.2gx the measured capacity of %.3g req/s", load, cap));
    r.table.headers = {"max_waiting", "accepted", "rejected", "reject p99 ms", "TTFT p50 ms", "TTFT p99 ms", "useful tok/s"};
    const int limits[3] = {0, 4 * b.fit, b.fit};
    Measurement m[3];
    for (int i = 0; i < 3; ++i) {
        Scenario s = base;
        s.policy.max_waiting = limits[i];
        m[i] = measure(env, s);
        r.table.rows.push_back({limits[i] ? std::to_string(limits[i]) : "unbounded", std::to_string(m[i].requests - m[i].rejected),
                                std::to_string(m[i].rejected), m[i].rejected ? ms(m[i].reject_latency.percentile(99)) : "-",
                                ms(m[i].ttft.percentile(50)), ms(m[i].ttft.percentile(99)), fmt("%.0f", m[i].useful_tok_per_s())});
    }
    const Measurement& u = m[0];
    const Measurement& t = m[2];
    r.verdicts.push_back(
        decide_c9(limits[2], t.rejected, t.reject_latency.percentile(99), u.ttft.percentile(99), t.ttft.percentile(99)));
    return r;
}

// ============================================================================
// signals: what an operator and a client see (C7, C10)
// ============================================================================

// What the C7 and C10 deciders read of one run, its inter-token gaps put
// down to their causes (study_kit.hpp's measure()).
struct SignalRun {
    int requests = 0, finished = 0;
    long preemptions = 0;
    double full_fraction = 0;           // steps that ended with the pool at >= 99%
    double p50 = 0, p99 = 0;            // ITL, every gap (what an operator's histogram shows)
    double p50_np = 0, p99_np = 0;      // ITL without the prefill stalls: decode and preempted gaps
    double decode_p50 = 0;              // the plain decode gaps' median
    double longest_preempted = 0;       // the longest gap across a preemption
    long gaps_preempted = 0, gaps_prefill = 0, gaps_decode = 0;
    double ratio() const { return p50 > 0 ? p99 / p50 : 0; }
    double ratio_np() const { return p50_np > 0 ? p99_np / p50_np : 0; }
};
inline SignalRun signal_run(const Measurement& m) {
    SignalRun x;
    x.requests = m.requests;
    x.finished = m.finished;
    x.preemptions = m.preemptions;
    x.full_fraction = m.full_fraction;
    x.p50 = m.itl.percentile(50);
    x.p99 = m.itl.percentile(99);
    const pkv::LatencySamples np = m.itl_without_prefill();
    x.p50_np = np.percentile(50);
    x.p99_np = np.percentile(99);
    x.decode_p50 = m.itl_decode.count() ? m.itl_decode.percentile(50) : x.p50;
    x.longest_preempted = m.itl_preempted.percentile(100);
    x.gaps_preempted = (long)m.itl_preempted.count();
    x.gaps_prefill = (long)m.itl_prefill.count();
    x.gaps_decode = (long)m.itl_decode.count();
    return x;
}
// C7: the client sees a pause and a p99 cliff *from preemption*. Gaps spent
// waiting behind another request's prefill chunk are set aside: chunked
// prefill makes a p99 cliff of its own with no preemption at all.
//   pause  under pressure every stream completes, and the longest gap
//          across a preemption is at least 10x the plain decode median;
//   cliff  p99/p50 of the gaps without prefill stalls is at least 3x the
//          unpressured run's (and at least 3).
// Supported: both. Contradicted: neither. Mixed: one.
inline ClaimVerdict decide_c7(const SignalRun& o, const SignalRun& a) {
    const bool pause = o.finished == o.requests && o.decode_p50 > 0 && o.longest_preempted >= 10 * o.decode_p50;
    const bool cliff = o.ratio_np() >= 3 * std::max(1.0, a.ratio_np());
    return verdict("C7", pause && cliff, !pause && !cliff,
                   fmt("overloaded: %d of %d streams complete, longest gap across a preemption %.1f ms = %.0fx the decode median; "
                       "p99/p50 without prefill stalls %.1f (unpressured %.1f); with them %.1f (unpressured %.1f); gaps: %ld across "
                       "preemptions, %ld behind prefill chunks, %ld decode",
                       o.finished, o.requests, 1e3 * o.longest_preempted, o.decode_p50 > 0 ? o.longest_preempted / o.decode_p50 : 0,
                       o.ratio_np(), a.ratio_np(), o.ratio(), a.ratio(), o.gaps_preempted, o.gaps_prefill, o.gaps_decode),
                   {{"pause_x_decode", o.decode_p50 > 0 ? o.longest_preempted / o.decode_p50 : 0}, {"p99_p50_np", o.ratio_np()},
                    {"unpressured_p99_p50_np", a.ratio_np()}, {"p99_p50_raw", o.ratio()}, {"unpressured_p99_p50_raw", a.ratio()}});
}
// C10: the three signals of a pool that has run out, present under pressure
// and absent without it: preemptions > 0, KV usage at >= 99% in at least a
// quarter of the steps, and ITL p99 >= 3x the median -- counted from the
// gaps without prefill stalls, so that chunked prefill alone does not raise
// it (the raw ratio is printed too: it is what an operator's histogram
// shows, and where it is high without pressure the signal misleads).
// Supported: 3 of 3 under pressure, 0 of 3 without. Contradicted: 0 of 3
// under pressure. Mixed otherwise.
inline ClaimVerdict decide_c10(const SignalRun& o, const SignalRun& a) {
    const auto signals = [](const SignalRun& x) { return (x.preemptions > 0) + (x.full_fraction >= 0.25) + (x.ratio_np() >= 3.0); };
    return verdict("C10", signals(o) == 3 && signals(a) == 0, signals(o) == 0,
                   fmt("overloaded shows %d of 3 signals (%ld preemptions, KV >= 99%% in %.0f%% of steps, p99/p50 %.1f without prefill "
                       "stalls, %.1f raw); unpressured %d of 3 (p99/p50 %.1f without prefill stalls, %.1f raw)",
                       signals(o), o.preemptions, 100 * o.full_fraction, o.ratio_np(), o.ratio(), signals(a), a.ratio_np(), a.ratio()),
                   {{"signals_overloaded", (double)signals(o)}, {"signals_unpressured", (double)signals(a)},
                    {"full_fraction", o.full_fraction}, {"p99_p50_np", o.ratio_np()}});
}

inline StudyResult signals_study(const Env& env) {
    const Base b = base_scenario(env);
    StudyResult r;
    Scenario ample = b.sc;
    ample.max_num_seqs = b.fit;  // everyone fits at their longest: no pressure
    r.notes.push_back("overloaded: " + describe(env, b.sc));
    r.notes.push_back(fmt("unpressured: the same with max_num_seqs %d (the pool holds every running request at its longest)", b.fit));
    r.notes.push_back("ITL gaps by cause: across a preemption / behind a prefill chunk / plain decode; 'np' = without the prefill stalls");
    const Measurement m[2] = {measure(env, ample), measure(env, b.sc)};
    r.table.headers = {"run", "preemptions", "KV peak", "steps at >=99% KV", "ITL p50 ms", "ITL p99 ms", "ITL max ms", "p99/p50",
                       "p99/p50 np", "gaps pre/prefill/decode", "completed"};
    const char* names[2] = {"unpressured", "overloaded"};
    SignalRun x[2];
    for (int i = 0; i < 2; ++i) {
        x[i] = signal_run(m[i]);
        r.table.rows.push_back({names[i], std::to_string(m[i].preemptions), pct(m[i].peak_kv), pct(m[i].full_fraction), ms(x[i].p50),
                                ms(x[i].p99), ms(m[i].itl.percentile(100)), fmt("%.1f", x[i].ratio()), fmt("%.1f", x[i].ratio_np()),
                                fmt("%ld/%ld/%ld", x[i].gaps_preempted, x[i].gaps_prefill, x[i].gaps_decode),
                                fmt("%d/%d", m[i].finished, m[i].requests)});
    }
    r.verdicts.push_back(decide_c7(x[1], x[0]));
    r.verdicts.push_back(decide_c10(x[1], x[0]));
    return r;
}

// ============================================================================
// mechanisms: failure as a designed-for event, and the victim's place (C2, C4)
// ============================================================================

// C2: allocation failed (preemptions happened) and every request still
// completed, none with an error. Contradicted: allocations failed and some
// request failed or never completed. Not a comparison of two arms: counts.
inline ClaimVerdict decide_c2(long preemptions, int requests, int finished, int failed) {
    return verdict("C2", preemptions > 0 && finished == requests && failed == 0, preemptions > 0 && (failed > 0 || finished < requests),
                   fmt("%ld block allocations failed into preemptions; %d of %d requests completed, %d failed", preemptions, finished,
                       requests, failed),
                   {{"preemptions", (double)preemptions}, {"finished", (double)finished}, {"failed", (double)failed}});
}
// C4: every victim resumes, in the order of a stack of preemptions (the
// last one pushed to the front of the queue resumes first).
inline ClaimVerdict decide_c4(long preemptions, long resumptions, long out_of_order, long never_back) {
    return verdict("C4", preemptions > 0 && out_of_order == 0 && never_back == 0, out_of_order > 0 || never_back > 0,
                   fmt("%ld resumptions, %ld out of queue order, %ld victims never resumed", resumptions, out_of_order, never_back),
                   {{"resumptions", (double)resumptions}, {"out_of_order", (double)out_of_order}, {"never_back", (double)never_back}});
}

inline StudyResult mechanisms_study(const Env& env) {
    const Base b = base_scenario(env);
    StudyResult r;
    r.notes.push_back("base: " + describe(env, b.sc));
    // C4 from the event stream: a victim goes to the front of the waiting
    // queue, so the victims waiting at any moment come back in the order of
    // a stack of preemptions -- the last one pushed to the front resumes
    // first -- and every victim comes back.
    long admissions_checked = 0, out_of_order = 0, never_back = 0;
    std::vector<int> pending;  // victims not resumed yet, front of the queue first
    const Measurement m = measure(env, b.sc, [&](int, const pkv::StreamEvent& e, pkv::Engine&) {
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
// kv_dtype: what a smaller cache element costs and buys (C12's "quantize")
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
// bytes the smaller element must preempt half as often or less; contradicted
// if it preempts as much or more; mixed in between. Preemption counts are
// exact: no draw band.
inline ClaimVerdict decide_c12_quantize(const std::string& small_name, long small_slots, long big_slots, long small_preemptions,
                                        long big_preemptions, const std::string& cost) {
    const std::string because = fmt("%s holds %ld token slots against %ld and preempts %ld times against %ld; %s", small_name.c_str(),
                                    small_slots, big_slots, small_preemptions, big_preemptions, cost.c_str());
    if (big_preemptions == 0) return {"C12", Verdict::kNotShown, because + " (nothing to relieve: no preemption at the larger element)"};
    return verdict("C12", small_preemptions * 2 <= big_preemptions, small_preemptions >= big_preemptions, because,
                   {{"preemptions_small", (double)small_preemptions}, {"preemptions_big", (double)big_preemptions}});
}

inline StudyResult kv_dtype_study(const Env& env) {
    const Base b = base_scenario(env);
    StudyResult r;
    // What it buys: the base workload at the base pool's bytes, in the
    // smaller element (more blocks for the same memory).
    Scenario big = b.sc, small = b.sc;
    std::string big_name = "f32", small_name = "int8";
    if (env.sim() && !env.measured) {
        big_name = "bf16";
        small_name = "fp8";
        small.kv_bytes_override = 1;
    } else {
        small.kv_dtype = pkv::KVDtype::kInt8;
        const pkv::Config& c = env.shape();
        const pkv::KVGeometry f32{c.n_layers, 1, b.sc.block_size, c.n_kv_heads, c.head_dim(), pkv::KVDtype::kF32};
        const pkv::KVGeometry i8{c.n_layers, 1, b.sc.block_size, c.n_kv_heads, c.head_dim(), pkv::KVDtype::kInt8};
        small.num_blocks = (int)(b.sc.num_blocks * f32.bytes_per_block() / i8.bytes_per_block());
    }
    const Measurement mb = measure(env, big), ms2 = measure(env, small);
    r.notes.push_back("base: " + describe(env, b.sc) + "; the same bytes of cache in a smaller element");
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
    r.verdicts.push_back(decide_c12_quantize(small_name, pool_tokens(env, small), pool_tokens(env, big), ms2.preemptions, mb.preemptions, cost));
    return r;
}

// ============================================================================
// The list
// ============================================================================

inline const std::vector<Study>& all_studies() {
    static const std::vector<Study> v = {
        {"thrash", "the concurrency sweep: inversion and thrash over time", {"C11", "C13"}, thrash_study},
        {"admission", "admit on blocks needed now, or reserve for the whole sequence", {"C1"}, admission_study},
        {"victim", "who is preempted: newest, oldest, or everyone slowed alike", {"C3"}, victim_study},
        {"preemption", "recompute, swap and prefix caching across sequence length", {"C5", "C6", "C8"}, preemption_study},
        {"fixes", "the fixes, bluntest first, replicas included", {"C12"}, fixes_study},
        {"shedding", "shedding at the edge against an unbounded queue", {"C9"}, shedding_study},
        {"signals", "what the client and the operator see", {"C7", "C10"}, signals_study},
        {"mechanisms", "an allocation failure is an event; the victim's place in the queue", {"C2", "C4"}, mechanisms_study},
        {"kv_dtype", "a smaller KV cache element: what it costs and what it buys", {"C12"}, kv_dtype_study},
    };
    return v;
}

}  // namespace study

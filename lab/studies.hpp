// lab/studies.hpp -- lab/LAB.md chapter L5 (verdicts: L7). Every study: a
// short table of variants, run on one
// device (this CPU, or a simulated GPU), and a conclusion computed from its
// own numbers. Each study names the claims it tests (study_kit.hpp's list),
// prints its evidence, and ends with a verdict per claim -- supported,
// contradicted, mixed, or not shown -- that the same code would print the
// other way round if the numbers went the other way. Thresholds are stated
// where they are used, chosen once, and never tuned to a result.
//
// One overloaded base scenario serves most studies, the same in shape on both
// devices: outputs five times longer than prompts (so the pool drains through
// *growth*, what the admission bet loses on), a pool that holds `fit`
// requests at their longest, and four times that many allowed to run at
// once. On the CPU that is the built-in model, 48 blocks of 16 and
// 48 x (32 + 160) tokens; on the sim, the GPU's whole pool (vLLM's rule) and
// sequences of up to 2560 tokens.
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
    const pkv::KVPoolSize k = pkv::kv_pool_size(s.model, s.hw.memory_bytes, s.memory_utilization, sc.block_size,
                                                sc.max_num_batched_tokens, sc.max_num_seqs);
    return (long)k.num_blocks * sc.block_size;
}

// The overloaded base: see the top of this file.
struct Base {
    Scenario sc;
    int fit = 0;  // requests the pool holds at their longest
};
inline Base base_scenario(const Env& env) {
    Base b;
    Scenario& s = b.sc;
    s.name = "base";
    s.block_size = 16;
    // This CPU, measured or modelled (the sim's `cpu` preset): the CPU's base.
    if (!env.sim() || env.measured) {
        s.num_blocks = 48;
        s.max_num_batched_tokens = 256;
        s.traffic.prompt = LengthDist::fixed(32);
        s.traffic.output = LengthDist::fixed(160);
        b.fit = 4;
        s.max_num_seqs = 16;
        s.traffic.requests = 48;
        return b;
    }
    const int longest = std::min(2560, env.shape().seq_len);
    const int prompt = longest / 5;
    s.max_num_batched_tokens = 8192;
    s.max_num_seqs = 256;  // for the activation reserve of the pool sizing; set below
    s.traffic.prompt = LengthDist::fixed(prompt);
    s.traffic.output = LengthDist::fixed(longest - prompt);
    const long slots = pool_tokens(env, s);
    b.fit = (int)std::max(1L, slots / longest);
    s.max_num_seqs = 4 * b.fit;
    s.traffic.requests = 3 * s.max_num_seqs;
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

// ============================================================================
// thrash: the concurrency sweep (C11, C13)
// ============================================================================

inline StudyResult thrash_study(const Env& env) {
    const Base b = base_scenario(env);
    StudyResult r;
    r.notes.push_back("base: " + describe(env, b.sc) + "; sweeping max_num_seqs from fit/4 to 8 x fit (fit = " + std::to_string(b.fit) + ")");
    r.table.headers = {"max_num_seqs", "preemptions", "recomputed", "useful tok/s", "processed tok/s", "busy", "ITL p99 ms", "makespan s"};
    std::vector<int> seqs;
    for (double f : {0.25, 0.5, 1.0, 2.0, 4.0, 8.0}) {
        const int n = std::max(1, (int)std::lround(f * b.fit));
        if (seqs.empty() || n != seqs.back()) seqs.push_back(n);
    }
    std::vector<Measurement> ms_;
    for (int n : seqs) {
        Scenario s = b.sc;
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
    const double drop = pct_change(B.useful_tok_per_s(), top.useful_tok_per_s());
    // C13: more concurrency with more preemptions, less useful throughput.
    // A drop of 10% or more at the top of the sweep, with more preemptions
    // than at the best point, supports it; the top within 10% of the best
    // (or still the best) contradicts it.
    const bool more_pre = top.preemptions > B.preemptions;
    r.verdicts.push_back(verdict("C13", best + 1 < ms_.size() && more_pre && drop <= -10.0, best + 1 == ms_.size() || drop > -10.0,
                                 fmt("useful throughput peaks at max_num_seqs %d (%.0f tok/s, %ld preemptions); at %d it is %+.0f%% "
                                     "with %ld preemptions",
                                     seqs[best], B.useful_tok_per_s(), B.preemptions, seqs.back(), drop, top.preemptions)));
    // C11: at the top of the sweep the device is busy (>= 95% of the time in
    // steps), a fifth or more of what it computes is recompute, and useful
    // throughput is down >= 10% from the best.
    const double waste = top.computed_tokens > 0 ? (double)top.recomputed_tokens / top.computed_tokens : 0;
    const bool busy = top.busy_fraction() >= 0.95;
    r.verdicts.push_back(verdict("C11", busy && waste >= 0.2 && drop <= -10.0, drop > -10.0,
                                 fmt("at max_num_seqs %d the device is busy %.0f%% of the time, %.0f%% of the tokens it computes are "
                                     "recomputed, and useful throughput is %+.0f%% from the best",
                                     seqs.back(), 100 * top.busy_fraction(), 100 * waste, drop)));
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
    // "Beats" = more useful tokens per second over the whole run; within 5%
    // either way is a draw. Supported if the bet wins at every concurrency,
    // contradicted if reserving does, mixed otherwise.
    int wins = 0, losses = 0;
    std::string per;
    for (int k : {1, 2, 4}) {
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
        const double d = pct_change(m[1].useful_tok_per_s(), m[0].useful_tok_per_s());
        wins += d >= 5.0;
        losses += d <= -5.0;
        per += fmt("%sat max_num_seqs %d the bet delivers %+.0f%% useful tokens/s (%ld preemptions; reserving runs at most %d)",
                   per.empty() ? "" : "; ", k * b.fit, d, m[0].preemptions, m[1].peak_running);
    }
    r.verdicts.push_back(verdict("C1", wins == 3, losses == 3, per + " against reserving"));
    return r;
}

// ============================================================================
// victim: newest-first against oldest-first and a uniform slowdown (C3)
// ============================================================================

inline StudyResult victim_study(const Env& env) {
    const Base b = base_scenario(env);
    StudyResult r;
    r.notes.push_back("base: " + describe(env, b.sc));
    r.notes.push_back("fair = preempt the request that has generated the most tokens: nobody runs ahead, everyone slows alike");
    const pkv::Victim policies[3] = {pkv::Victim::kNewest, pkv::Victim::kOldest, pkv::Victim::kFair};
    Measurement m[3];
    for (int i = 0; i < 3; ++i) {
        Scenario s = b.sc;
        s.policy.victim = policies[i];
        m[i] = measure(env, s);
    }
    // Work completed by fixed times: a quarter, half and three quarters of
    // the newest-first run's makespan, and its end.
    const double T = m[0].makespan_s;
    r.table.headers = {"victim", "preemptions", "recomputed", "done @25%", "done @50%", "done @75%", "done @100%", "mean done s", "makespan s"};
    for (int i = 0; i < 3; ++i) {
        double mean_done = 0;
        for (double t : m[i].done_s) mean_done += t;
        mean_done /= std::max<size_t>(1, m[i].done_s.size());
        r.table.rows.push_back({pkv::to_string(policies[i]), std::to_string(m[i].preemptions), std::to_string(m[i].recomputed_tokens),
                                std::to_string(m[i].completed_by(0.25 * T)), std::to_string(m[i].completed_by(0.5 * T)),
                                std::to_string(m[i].completed_by(0.75 * T)), std::to_string(m[i].completed_by(T)), sec(mean_done),
                                sec(m[i].makespan_s)});
    }
    // C3 compares newest-first with the uniform slowdown (fair). Supported if
    // newest-first has completed at least as many requests at every
    // checkpoint and more at one; contradicted if fair has at every
    // checkpoint at least as many and more at one.
    int ahead = 0, behind = 0;
    for (double f : {0.25, 0.5, 0.75, 1.0}) {
        const int n = m[0].completed_by(f * T), u = m[2].completed_by(f * T);
        ahead += n > u;
        behind += n < u;
    }
    auto mean_done = [](const Measurement& x) {
        double t = 0;
        for (double d : x.done_s) t += d;
        return x.done_s.empty() ? 0.0 : t / (double)x.done_s.size();
    };
    std::string counts;
    for (double f : {0.25, 0.5, 0.75, 1.0})
        counts += fmt("%s%d vs %d", counts.empty() ? "" : ", ", m[0].completed_by(f * T), m[2].completed_by(f * T));
    r.verdicts.push_back(verdict("C3", ahead > 0 && behind == 0, behind > 0 && ahead == 0,
                                 fmt("requests completed by 25/50/75/100%% of newest-first's run, newest-first vs fair: %s; mean "
                                     "completion %.3f vs %.3f s (oldest-first %.3f s)",
                                     counts.c_str(), mean_done(m[0]), mean_done(m[2]), mean_done(m[1]))));
    return r;
}

// ============================================================================
// preemption: recompute, swap and prefix caching across lengths (C5, C6, C8)
// ============================================================================

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
    std::vector<int> lengths;  // total tokens per request
    for (int div : {32, 8, 2, 1}) lengths.push_back(std::max(5, longest / div));
    std::vector<std::string> links = env.sim() && !env.measured ? std::vector<std::string>{"gen4", "gen5"} : std::vector<std::string>{""};
    r.notes.push_back(fmt("sequence lengths %d..%d tokens (prompt : output = 1 : 4); each point: pool for %d requests at their longest, "
                          "max_num_seqs %d, %d requests all at once",
                          lengths.front(), lengths.back(), b.fit, 2 * b.fit, 6 * b.fit));
    r.notes.push_back("modes: recompute; recompute + prefix caching; swap with ample swap space; swap with a small one "
                      "(a quarter of the pool). Recompute never crosses the link, so it is run once per length.");
    r.table.headers = {"length", "link", "mode", "preemptions", "recomputed", "swapped MB", "fallbacks", "computed/req", "makespan s"};
    std::vector<PreemptionRow> rows;
    for (int len : lengths) {
        Scenario s = b.sc;
        const int prompt = std::max(1, len / 5);
        s.traffic.prompt = LengthDist::fixed(prompt);
        s.traffic.output = LengthDist::fixed(len - prompt);
        s.traffic.requests = 6 * b.fit;
        s.max_num_seqs = 2 * b.fit;
        // The pool: fit requests at their longest, never more than the device holds.
        Scenario whole = s;
        whole.num_blocks = 0;
        const long need = pkv::blocks_for_tokens(len, s.block_size) * b.fit;
        const int blocks = (int)(env.sim() && !env.measured ? std::min<long>(pool_tokens(env, whole) / s.block_size, need) : need);
        s.num_blocks = blocks;
        for (int mode = 0; mode < 4; ++mode)
            for (const std::string& link : (mode < 2 ? std::vector<std::string>{links.front()} : links)) {
                Scenario v = s;
                v.pcie = link;
                std::string name = "recompute";
                if (mode == 1) { v.prefix_caching = true; name = "recompute+prefix"; }
                if (mode >= 2) {
                    v.policy.preemption = pkv::Preemption::kSwap;
                    v.swap_space_blocks = mode == 2 ? (int)pkv::blocks_for_tokens(len, s.block_size) * v.traffic.requests : std::max(1, blocks / 4);
                    name = mode == 2 ? "swap" : "swap (small)";
                }
                const std::string shown = mode < 2 ? "-" : (link.empty() ? "memcpy" : link);
                PreemptionRow row{mode < 2 ? "any" : shown, len, name, measure(env, v)};
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
    const std::string L0 = links.front().empty() ? "memcpy" : links.front();
    // C5: a recompute redoes what the victim had computed (recomputed
    // tokens within 25% of the victims' computed tokens), and prefix caching
    // recomputes fewer tokens, at the longest length.
    const Measurement& rc = find("any", lengths.back(), "recompute");
    const Measurement& pc = find("any", lengths.back(), "recompute+prefix");
    const double ratio = rc.victim_tokens ? (double)rc.recomputed_tokens / rc.victim_tokens : 0;
    const bool one_prefill = rc.preemptions > 0 && ratio > 0.75 && ratio < 1.25;
    const bool cache_helps = pc.recomputed_tokens < rc.recomputed_tokens;
    r.verdicts.push_back(verdict("C5", one_prefill && cache_helps, rc.preemptions > 0 && !cache_helps && (ratio <= 0.75 || ratio >= 1.25),
                                 fmt("recomputed %ld tokens for victims that had computed %ld (ratio %.2f); with prefix caching %ld",
                                     rc.recomputed_tokens, rc.victim_tokens, ratio, pc.recomputed_tokens)));
    // C6: swap copies both ways (bytes out == bytes in > 0), the small swap
    // space fills (fallbacks), and swap beats recompute (shorter makespan)
    // only from some length on, a length no shorter on the slower link.
    // Contradicted when swap wins at every length, or at none.
    std::string cross_txt;
    std::vector<int> crossover;  // per link: length from which swap wins for good; -1 never
    bool wins_all = true, wins_none = true;
    for (const std::string& link : links) {
        const std::string L = link.empty() ? "memcpy" : link;
        int c = -1;
        std::string per;
        for (int len : lengths) {
            const double sw_t = find(L, len, "swap").makespan_s, rc_t = find("any", len, "recompute").makespan_s;
            const bool wins = sw_t < rc_t;
            wins_all = wins_all && wins;
            wins_none = wins_none && !wins;
            if (wins && c < 0) c = len;
            if (!wins) c = -1;
            per += fmt("%s%d: %+.1f%%", per.empty() ? "" : ", ", len, pct_change(rc_t, sw_t));
        }
        crossover.push_back(c);
        cross_txt += fmt("%s%s: %s (swap vs recompute makespan: %s)", cross_txt.empty() ? "" : "; ", L.c_str(),
                         c < 0 ? "never" : ("from " + std::to_string(c) + " tokens").c_str(), per.c_str());
    }
    const Measurement& sw = find(L0, lengths.back(), "swap");
    const Measurement& small = find(L0, lengths.back(), "swap (small)");
    const bool both_ways = sw.swap_out_bytes > 0 && sw.swap_out_bytes == sw.swap_in_bytes;
    const bool fills = small.swap_fallbacks > 0;
    bool scarcer_later = true;
    if (crossover.size() == 2) scarcer_later = crossover[0] < 0 || (crossover[1] >= 0 && crossover[0] >= crossover[1]);
    const bool long_only = !wins_all && !wins_none && crossover.front() > 0;
    r.verdicts.push_back(verdict("C6", both_ways && fills && long_only && scarcer_later, wins_all || wins_none,
                                 fmt("swap moved %.1f MB out and %.1f MB in; the small swap space fell back to recompute %ld times; "
                                     "swap wins %s",
                                     sw.swap_out_bytes / 1e6, sw.swap_in_bytes / 1e6, small.swap_fallbacks, cross_txt.c_str())));
    // C8: tokens through the model per completed request, recompute vs swap,
    // at the longest length.
    const double per_rc = rc.finished ? (double)rc.computed_tokens / rc.finished : 0;
    const double per_sw = sw.finished ? (double)sw.computed_tokens / sw.finished : 0;
    r.verdicts.push_back(verdict("C8", per_rc > per_sw * 1.01, per_rc < per_sw * 0.99,
                                 fmt("%.0f tokens computed per completed request with recompute, %.0f with swap", per_rc, per_sw)));
    return r;
}

// ============================================================================
// fixes: bluntest first (C12)
// ============================================================================

// The capacity of one replica on the base workload: completed requests per
// device second when every request arrives at once.
inline double capacity_rps(const Env& env, const Scenario& s) {
    Scenario c = s;
    c.traffic.arrivals = Arrivals{};
    const Measurement m = measure(env, c);
    return m.makespan_s > 0 ? m.finished / m.makespan_s : 0;
}

inline StudyResult fixes_study(const Env& env) {
    const Base b = base_scenario(env);
    StudyResult r;
    Scenario base = b.sc;
    // Requests arrive (Poisson) at 1.5x what the baseline sustains: a queue
    // builds, and the overload is sustained rather than a one-off burst.
    const double cap = capacity_rps(env, base);
    base.traffic.arrivals = Arrivals{Arrivals::Kind::kPoisson, 1.5 * cap, 1};
    r.notes.push_back("base: " + describe(env, base) + fmt("; arrivals at 1.5x the measured capacity of %.3g req/s", cap));
    struct Fix {
        std::string name;
        Scenario s;
    };
    std::vector<Fix> fixes;
    fixes.push_back({"baseline", base});
    {
        Scenario s = base;
        s.max_num_seqs = b.fit;
        fixes.push_back({fmt("cap concurrency (max_num_seqs %d)", b.fit), s});
    }
    {
        Scenario s = base;
        s.traffic.output = LengthDist::fixed(std::max(1, base.traffic.output.lo / 2));
        fixes.push_back({"cap generation (half the output)", s});
    }
    {
        Scenario s = base;
        if (env.sim() && !env.measured) {
            s.kv_bytes_override = 1;  // FP8 KV: twice the blocks in the same memory
            fixes.push_back({"quantize the cache (FP8 KV)", s});
        } else {
            s.kv_dtype = pkv::KVDtype::kInt8;  // the same bytes as int8: more blocks
            const pkv::Config& c = env.shape();
            const pkv::KVGeometry f32{c.n_layers, 1, s.block_size, c.n_kv_heads, c.head_dim(), pkv::KVDtype::kF32};
            const pkv::KVGeometry i8{c.n_layers, 1, s.block_size, c.n_kv_heads, c.head_dim(), pkv::KVDtype::kInt8};
            s.num_blocks = (int)(base.num_blocks * f32.bytes_per_block() / i8.bytes_per_block());
            fixes.push_back({fmt("quantize the cache (int8, %d blocks)", s.num_blocks), s});
        }
    }
    for (Router rt : {Router::kRoundRobin, Router::kLeastKv}) {
        Scenario s = base;
        s.replicas = 2;
        s.router = rt;
        fixes.push_back({fmt("2 replicas, %s", to_string(rt)), s});
    }
    r.table.headers = {"fix", "preemptions", "recomputed", "useful tok/s", "TTFT p99 ms", "ITL p99 ms", "e2e p99 s", "makespan s"};
    std::vector<Measurement> ms_;
    for (const Fix& f : fixes) {
        ms_.push_back(measure(env, f.s));
        const Measurement& m = ms_.back();
        r.table.rows.push_back({f.name, std::to_string(m.preemptions), std::to_string(m.recomputed_tokens), fmt("%.0f", m.useful_tok_per_s()),
                                ms(m.ttft.percentile(99)), ms(m.itl.percentile(99)), sec(m.e2e.percentile(99)), sec(m.makespan_s)});
    }
    // Each fix must cut preemptions (at least in half) and the ITL p99 cliff
    // against the baseline. Supported if every fix does; contradicted if none.
    int helped = 0;
    std::string which;
    for (size_t i = 1; i < ms_.size(); ++i) {
        const bool h = ms_[i].preemptions * 2 <= ms_[0].preemptions && ms_[i].itl.percentile(99) < ms_[0].itl.percentile(99);
        helped += h;
        if (!h) which += (which.empty() ? "" : ", ") + fixes[i].name;
    }
    const int n = (int)ms_.size() - 1;
    r.verdicts.push_back(verdict("C12", helped == n, helped == 0,
                                 fmt("%d of %d fixes halve the preemptions (baseline %ld) and lower ITL p99 (baseline %.1f ms)%s", helped, n,
                                     ms_[0].preemptions, 1e3 * ms_[0].itl.percentile(99),
                                     which.empty() ? "" : ("; not: " + which).c_str())));
    return r;
}

// ============================================================================
// shedding: fast failures instead of stalls (C9)
// ============================================================================

inline StudyResult shedding_study(const Env& env) {
    const Base b = base_scenario(env);
    StudyResult r;
    Scenario base = b.sc;
    const double cap = capacity_rps(env, base);
    base.traffic.arrivals = Arrivals{Arrivals::Kind::kPoisson, 2.0 * cap, 1};
    r.notes.push_back("base: " + describe(env, base) + fmt("; arrivals at 2x the measured capacity of %.3g req/s", cap));
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
    // Supported: the tightest limit rejects, its rejections come at least 10x
    // sooner (p99) than an unbounded queue's first tokens (p99), and it cuts
    // the accepted requests' TTFT p99. Contradicted: rejections come no
    // sooner than the stall they avoid, or nothing is rejected.
    const Measurement& u = m[0];
    const Measurement& t = m[2];
    const double rej = t.reject_latency.percentile(99), stall = u.ttft.percentile(99);
    r.verdicts.push_back(verdict("C9", t.rejected > 0 && rej * 10 <= stall && t.ttft.percentile(99) < stall,
                                 t.rejected == 0 || rej >= stall,
                                 fmt("with max_waiting %d, %d requests are rejected within %.1f ms (p99, retryable); unbounded, "
                                     "TTFT p99 is %.1f ms; accepted requests' TTFT p99 falls to %.1f ms",
                                     limits[2], t.rejected, 1e3 * rej, 1e3 * stall, 1e3 * t.ttft.percentile(99))));
    return r;
}

// ============================================================================
// signals: what an operator and a client see (C7, C10)
// ============================================================================

inline StudyResult signals_study(const Env& env) {
    const Base b = base_scenario(env);
    StudyResult r;
    Scenario ample = b.sc;
    ample.max_num_seqs = b.fit;  // everyone fits at their longest: no pressure
    r.notes.push_back("overloaded: " + describe(env, b.sc));
    r.notes.push_back(fmt("unpressured: the same with max_num_seqs %d (the pool holds every running request at its longest)", b.fit));
    const Measurement m[2] = {measure(env, ample), measure(env, b.sc)};
    r.table.headers = {"run", "preemptions", "KV peak", "steps at >=99% KV", "ITL p50 ms", "ITL p99 ms", "ITL max ms", "p99/p50", "completed"};
    const char* names[2] = {"unpressured", "overloaded"};
    for (int i = 0; i < 2; ++i) {
        const double p50 = m[i].itl.percentile(50), p99 = m[i].itl.percentile(99);
        r.table.rows.push_back({names[i], std::to_string(m[i].preemptions), pct(m[i].peak_kv), pct(m[i].full_fraction), ms(p50), ms(p99),
                                ms(m[i].itl.percentile(100)), fmt("%.1f", p50 > 0 ? p99 / p50 : 0), fmt("%d/%d", m[i].finished, m[i].requests)});
    }
    auto ratio = [](const Measurement& x) { return x.itl.percentile(50) > 0 ? x.itl.percentile(99) / x.itl.percentile(50) : 0.0; };
    const Measurement& o = m[1];
    const Measurement& a = m[0];
    // C7: under pressure every stream completes (it pauses, never breaks),
    // the longest gap is at least 10x the median, and p99/p50 is at least
    // 3x the unpressured run's.
    const bool pause = o.finished == o.requests && o.itl.percentile(100) >= 10 * o.itl.percentile(50);
    const bool cliff = ratio(o) >= 3 * std::max(1.0, ratio(a));
    r.verdicts.push_back(verdict("C7", pause && cliff, !pause && !cliff,
                                 fmt("overloaded: all %d streams complete, longest gap %.1f ms = %.0fx the median, p99/p50 %.1f "
                                     "(unpressured %.1f)",
                                     o.finished, 1e3 * o.itl.percentile(100), o.itl.percentile(50) > 0 ? o.itl.percentile(100) / o.itl.percentile(50) : 0,
                                     ratio(o), ratio(a))));
    // C10: the three signals present under pressure and absent without it:
    // preemptions > 0, KV usage at >= 99% for at least a quarter of the
    // steps, ITL p99 >= 3x the median.
    const auto signals = [&](const Measurement& x) {
        return (x.preemptions > 0) + (x.full_fraction >= 0.25) + (ratio(x) >= 3.0);
    };
    r.verdicts.push_back(verdict("C10", signals(o) == 3 && signals(a) == 0, signals(o) == 0,
                                 fmt("overloaded shows %d of 3 signals (%ld preemptions, KV >= 99%% in %.0f%% of steps, p99/p50 %.1f); "
                                     "unpressured %d of 3",
                                     signals(o), o.preemptions, 100 * o.full_fraction, ratio(o), signals(a))));
    return r;
}

// ============================================================================
// mechanisms: failure as a designed-for event, and the victim's place (C2, C4)
// ============================================================================

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
    // C2: allocation failed (preemptions happened) and every request still
    // completed, none with an error.
    r.verdicts.push_back(verdict("C2", m.preemptions > 0 && m.finished == m.requests && m.failed == 0,
                                 m.preemptions > 0 && (m.failed > 0 || m.finished < m.requests),
                                 fmt("%ld block allocations failed into preemptions; %d of %d requests completed, %d failed",
                                     m.preemptions, m.finished, m.requests, m.failed)));
    r.verdicts.push_back(verdict("C4", m.preemptions > 0 && out_of_order == 0 && never_back == 0, out_of_order > 0 || never_back > 0,
                                 fmt("%ld resumptions, %ld out of queue order, %ld victims never resumed", admissions_checked, out_of_order,
                                     never_back)));
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
    // The claim's "quantize cache memory" fix: at the same bytes the smaller
    // element must hold more tokens and preempt less (half as often or
    // better); contradicted if it preempts as much or more.
    r.verdicts.push_back(verdict("C12", ms2.preemptions * 2 <= mb.preemptions, ms2.preemptions >= mb.preemptions,
                                 fmt("%s holds %ld token slots against %ld and preempts %ld times against %ld; %s", small_name.c_str(),
                                     pool_tokens(env, small), pool_tokens(env, big), ms2.preemptions, mb.preemptions, cost.c_str())));
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

// lab/traffic.hpp -- lab/LAB.md chapters L5 and L6: synthetic traffic for
// the studies and the simulated GPU: when requests arrive, how long their
// prompts and outputs are, and how many share a prompt prefix.
//
//   arrivals   all at once | Poisson at `rate` requests/s | bursts of `burst`
//              requests, the bursts themselves Poisson so the mean rate is
//              still `rate`
//   lengths    fixed | uniform in [lo, hi] | lognormal (long-tailed, like
//              chat), each clamped to [lo, hi]
//   prefix     a fraction of requests starts with the same `shared_prefix_len`
//              tokens (a system prompt), which prefix caching can serve
//   trace      or all three from real traffic: a window of one of the
//              Azure LLM inference traces in ../shared/traces (section 2),
//              its arrival times stretched or squeezed to a chosen rate
//
// Every random choice for request i comes from its own generator, seeded by
// (seed, i): changing the arrival rate does not change any request's lengths
// or tokens, so two configurations of a study serve the very same requests.
// Every request sets ignore_eos: its output length is what the workload drew
// (the simulated GPU never emits EOS anyway), so a run is a fixed amount of
// useful work.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include "scheduler.hpp"
#include "tiny_model/model.hpp"

namespace study {

// ============================================================================
// 1. Synthetic traffic: arrivals and lengths
// ============================================================================

// A double uniform in [0, 1) with 53 random bits.
inline double uniform_double(uint64_t& state) { return (double)(pkv::splitmix64(state) >> 11) * (1.0 / 9007199254740992.0); }
// A standard normal (Box-Muller); u1 is kept away from 0, where log explodes.
inline double normal_double(uint64_t& state) {
    const double u1 = uniform_double(state) + 1e-12, u2 = uniform_double(state);
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
}

// How long a prompt or an output is.
struct LengthDist {
    enum class Kind { kFixed, kUniform, kLogNormal };
    Kind kind = Kind::kFixed;
    double a = 32, b = 0;  // fixed: a; uniform: [a, b]; lognormal: mean a, sigma b of the underlying normal
    int lo = 1, hi = 1 << 20;

    static LengthDist fixed(int n) { return {Kind::kFixed, (double)n, 0, n, n}; }
    static LengthDist uniform(int lo, int hi) { return {Kind::kUniform, (double)lo, (double)hi, lo, hi}; }
    // A lognormal with this *mean* (not median): exp(N(mu, sigma^2)) has mean
    // exp(mu + sigma^2 / 2), so mu = ln(mean) - sigma^2 / 2.
    static LengthDist lognormal(double mean, double sigma, int lo, int hi) { return {Kind::kLogNormal, mean, sigma, lo, hi}; }

    int sample(uint64_t& rng) const {
        double x = a;
        if (kind == Kind::kUniform) x = a + std::floor(uniform_double(rng) * (b - a + 1));
        if (kind == Kind::kLogNormal) x = std::exp(std::log(a) - b * b / 2 + b * normal_double(rng));
        return (int)std::clamp(std::round(x), (double)lo, (double)hi);
    }
    std::string describe() const {
        char buf[96];
        if (kind == Kind::kFixed) std::snprintf(buf, sizeof buf, "%d", lo);
        else if (kind == Kind::kUniform) std::snprintf(buf, sizeof buf, "uniform %d..%d", lo, hi);
        else std::snprintf(buf, sizeof buf, "lognormal mean %.0f sigma %.2f in %d..%d", a, b, lo, hi);
        return buf;
    }
};

struct Arrivals {
    enum class Kind { kAllAtOnce, kPoisson, kBursts };
    Kind kind = Kind::kAllAtOnce;
    double rate = 0;  // requests per second (device seconds: wall on the CPU, simulated on the sim)
    int burst = 1;    // requests per burst (kBursts)
    std::string describe() const {
        char buf[80];
        if (kind == Kind::kAllAtOnce) return "all at once";
        if (kind == Kind::kPoisson) std::snprintf(buf, sizeof buf, "Poisson, %.3g req/s", rate);
        else std::snprintf(buf, sizeof buf, "bursts of %d, %.3g req/s on average", burst, rate);
        return buf;
    }
};

// ============================================================================
// 2. Real traffic: the Azure LLM inference traces
// ============================================================================
//
// ../shared/traces holds one hour (2023-11-16, 18:15-19:14 UTC) of two
// production LLM services on Azure, as the Azure Public Dataset publishes
// them (CC-BY 4.0; Patel et al., "Splitwise", ISCA 2024; see that folder's
// README): `conv`, a conversation service (19,366 requests, prompt median
// 1,020 tokens, output median 129) and `code`, a code-completion service
// (8,819 requests, prompt median 1,469, output median 13). Each row is one
// request: `TIMESTAMP,ContextTokens,GeneratedTokens`, the timestamp as
// `YYYY-MM-DD HH:MM:SS.fffffff`, in arrival order. The files are not part of
// the repository: programs find them relative to the repository root
// (where they run) and say so, and skip, when they are absent.

struct TraceRow {
    double t;     // seconds after the trace's first request
    int prompt;   // ContextTokens
    int output;   // GeneratedTokens
};
struct Trace {
    std::string name, path;
    std::vector<TraceRow> rows;
};

inline const char* kTraceDir = "../shared/traces";
inline std::string trace_path(const std::string& name) { return std::string(kTraceDir) + "/AzureLLMInferenceTrace_" + name + ".csv"; }

// Seconds since midnight of "YYYY-MM-DD HH:MM:SS.fffffff" (the hour is all
// one day; a day boundary would add 86400 and is refused). -1 if malformed.
inline double trace_seconds(const std::string& ts, std::string* day) {
    int Y, Mo, D, h, mi;
    double sec;
    char tail;
    if (std::sscanf(ts.c_str(), "%4d-%2d-%2d %2d:%2d:%lf%c", &Y, &Mo, &D, &h, &mi, &sec, &tail) != 6) return -1;
    if (h < 0 || h > 23 || mi < 0 || mi > 59 || !(sec >= 0 && sec < 61)) return -1;
    if (day) *day = ts.substr(0, 10);
    return 3600.0 * h + 60.0 * mi + sec;
}

// Reads one trace (`conv` or `code`), or throws naming the file and what was
// wrong: missing, no header, a malformed row (with its line number). Each
// file is read once per process.
inline std::shared_ptr<const Trace> load_trace(const std::string& name) {
    static std::mutex mu;
    static std::map<std::string, std::shared_ptr<const Trace>> cache;
    std::lock_guard<std::mutex> lock(mu);
    if (auto it = cache.find(name); it != cache.end()) return it->second;
    if (name != "conv" && name != "code") throw std::invalid_argument("unknown trace '" + name + "' (known: conv, code)");
    auto t = std::make_shared<Trace>();
    t->name = name;
    t->path = trace_path(name);
    std::ifstream f(t->path);
    if (!f) throw std::runtime_error("trace " + t->path + " not found (the Azure traces live in ../shared/traces, beside the repository)");
    std::string line;
    if (!std::getline(f, line) || line.rfind("TIMESTAMP,ContextTokens,GeneratedTokens", 0) != 0)
        throw std::runtime_error(t->path + ": expected the header TIMESTAMP,ContextTokens,GeneratedTokens");
    std::string day0;
    double t0 = -1;
    for (int ln = 2; std::getline(f, line); ++ln) {
        if (!line.empty() && line.back() == '\r') line.pop_back();
        if (line.empty()) continue;
        const size_t a = line.find(','), b = a == std::string::npos ? a : line.find(',', a + 1);
        std::string day;
        const double sec = a == std::string::npos ? -1 : trace_seconds(line.substr(0, a), &day);
        int p = -1, o = -1;
        if (b != std::string::npos) {
            try {
                p = std::stoi(line.substr(a + 1, b - a - 1));
                o = std::stoi(line.substr(b + 1));
            } catch (const std::exception&) {
                p = -1;
            }
        }
        if (sec < 0 || p < 0 || o < 0) throw std::runtime_error(t->path + " line " + std::to_string(ln) + ": malformed row '" + line + "'");
        if (t0 < 0) { t0 = sec; day0 = day; }
        if (day != day0) throw std::runtime_error(t->path + " line " + std::to_string(ln) + ": the trace crosses midnight");
        t->rows.push_back({sec - t0, p, o});
    }
    if (t->rows.empty()) throw std::runtime_error(t->path + ": no requests");
    cache[name] = t;
    return t;
}

// A replay of a trace window: `requests` rows from row `first`, arrival
// times scaled so their mean rate is `rate` requests per second (the window's
// own rate x rate / own rate), prompt and output lengths x `length_scale`,
// clamped to the Traffic's [lo, hi] (a model's context is finite; an empty
// output becomes one token). The scale is a choice of offered load, not a
// change of the traffic's shape: the gaps keep their order and proportions.
struct TraceReplay {
    std::shared_ptr<const Trace> trace;
    int first = 0;
    double rate = 0;          // requests per second; 0 = the trace's own timing
    double length_scale = 1;  // every length x this
    bool all_at_once = false; // every request at time 0 (a capacity measurement), the timing ignored
    // The window's own mean arrival rate (requests / span).
    double own_rate(int requests) const {
        const int n = std::min(requests, (int)trace->rows.size() - first);
        if (n < 2) return 0;
        const double span = trace->rows[(size_t)(first + n - 1)].t - trace->rows[(size_t)first].t;
        return span > 0 ? (n - 1) / span : 0;
    }
    std::string describe(int requests) const {
        char b[200];
        if (all_at_once)
            std::snprintf(b, sizeof b, "Azure %s trace, rows %d..%d all at once, lengths x %.3g", trace->name.c_str(), first, first + requests - 1,
                          length_scale);
        else
            std::snprintf(b, sizeof b, "Azure %s trace, rows %d..%d (own rate %.3g req/s), replayed at %.3g req/s, lengths x %.3g",
                          trace->name.c_str(), first, first + requests - 1, own_rate(requests), rate > 0 ? rate : own_rate(requests),
                          length_scale);
        return b;
    }
};

// ============================================================================
// 3. Traffic, and its plan: every request's arrival, prompt and parameters
// ============================================================================

// What a study or a test serves: synthetic (section 1) or a trace replay.
struct Traffic {
    int requests = 24;
    Arrivals arrivals;
    LengthDist prompt = LengthDist::fixed(32), output = LengthDist::fixed(96);
    // The max_tokens every client asks for; 0 = the drawn output length
    // itself. When set, a request still ends at its drawn length (as if the
    // model said EOS there: SamplingParams::stop_after_tokens), but admission
    // only sees max_tokens, as a server only sees what the client asked.
    int max_tokens_cap = 0;
    double shared_prefix_fraction = 0.0;  // of requests that start with the shared prefix
    int shared_prefix_len = 0;            // tokens (BOS included)
    uint64_t seed = 1;
    double temperature = 0.0;
    // Real traffic instead of the arrivals and lengths above (section 2):
    // set, it gives every request's arrival, prompt and output length;
    // `prompt` and `output` then only clamp the lengths (their lo and hi).
    std::shared_ptr<const TraceReplay> trace;
    std::string describe_arrivals() const { return trace ? trace->describe(requests) : arrivals.describe(); }
};

// Chat-like lengths: long-tailed, with the means the vLLM paper reports for
// ShareGPT conversations (Kwon et al., SOSP 2023, section 6.1: prompts 8.4x
// and outputs 5.8x longer than Alpaca's, about 161 and 338 tokens on average).
// The sigma of 1.0 is ours: it gives a median of 0.61x the mean and a tail
// that reaches several times it, the shape those histograms show; we have no
// fitted value to cite.
inline Traffic chat_like(int requests, int max_prompt, int max_output) {
    Traffic t;
    t.requests = requests;
    t.prompt = LengthDist::lognormal(161, 1.0, 2, max_prompt);
    t.output = LengthDist::lognormal(338, 1.0, 1, max_output);
    return t;
}

struct PlannedRequest {
    double arrival_s = 0;            // device seconds after the start
    std::vector<int32_t> prompt;     // [prompt length] token ids, BOS first
    pkv::SamplingParams params;
};

// The requests of `t` for a model with `vocab` tokens. Token ids are drawn in
// [3, vocab) (never <unk>, BOS or EOS), BOS first; the shared prefix is the
// same for every request that has it.
inline std::vector<PlannedRequest> plan_traffic(const Traffic& t, int vocab) {
    if (vocab < 4) throw std::invalid_argument("plan_traffic: vocabulary too small");
    std::vector<PlannedRequest> out((size_t)t.requests);
    uint64_t arrivals_rng = t.seed * 0x9e3779b97f4a7c15ull + 17, shared_rng = t.seed + 99;
    std::vector<int32_t> shared((size_t)std::max(0, t.shared_prefix_len));
    for (size_t j = 0; j < shared.size(); ++j) shared[j] = j == 0 ? 1 : 3 + (int32_t)(pkv::splitmix64(shared_rng) % (uint64_t)(vocab - 3));
    double clock = 0;
    const TraceReplay* tr = t.trace.get();
    if (tr) {
        if (tr->first < 0 || tr->first + t.requests > (int)tr->trace->rows.size())
            throw std::invalid_argument("plan_traffic: trace " + tr->trace->name + " has " + std::to_string(tr->trace->rows.size()) +
                                        " requests, not rows " + std::to_string(tr->first) + ".." + std::to_string(tr->first + t.requests - 1));
        if (!(tr->length_scale > 0)) throw std::invalid_argument("plan_traffic: trace length scale must be > 0");
    }
    const double time_scale = tr && tr->rate > 0 && tr->own_rate(t.requests) > 0 ? tr->own_rate(t.requests) / tr->rate : 1.0;
    auto clamp_len = [](double x, const LengthDist& d) { return (int)std::clamp(std::round(x), (double)d.lo, (double)d.hi); };
    for (int i = 0; i < t.requests; ++i) {
        PlannedRequest& r = out[(size_t)i];
        uint64_t rng = (t.seed * 1000003ull + (uint64_t)i) * 0xbf58476d1ce4e5b9ull;
        int plen = t.prompt.sample(rng), olen = t.output.sample(rng);
        if (tr) {
            const TraceRow& row = tr->trace->rows[(size_t)(tr->first + i)];
            plen = clamp_len(row.prompt * tr->length_scale, t.prompt);
            olen = clamp_len(row.output * tr->length_scale, t.output);
        }
        const bool share = t.shared_prefix_len > 0 && uniform_double(rng) < t.shared_prefix_fraction;
        r.prompt.resize((size_t)plen);
        for (int j = 0; j < plen; ++j)
            r.prompt[(size_t)j] = (share && j < (int)shared.size()) ? shared[(size_t)j]
                                  : j == 0                          ? 1
                                                                    : 3 + (int32_t)(pkv::splitmix64(rng) % (uint64_t)(vocab - 3));
        r.params.max_tokens = t.max_tokens_cap > 0 ? std::max(t.max_tokens_cap, olen) : olen;
        r.params.stop_after_tokens = t.max_tokens_cap > 0 ? olen : 0;
        r.params.ignore_eos = true;
        r.params.temperature = (float)t.temperature;
        r.params.seed = t.seed * 7919 + (uint64_t)i;
        // Arrivals: the trace's own gaps, scaled; or exponential gaps for a
        // Poisson process (one gap per burst).
        if (tr) {
            clock = tr->all_at_once ? 0.0 : (tr->trace->rows[(size_t)(tr->first + i)].t - tr->trace->rows[(size_t)tr->first].t) * time_scale;
        } else if (t.arrivals.kind != Arrivals::Kind::kAllAtOnce && t.arrivals.rate > 0) {
            const int burst = t.arrivals.kind == Arrivals::Kind::kBursts ? std::max(1, t.arrivals.burst) : 1;
            if (i % burst == 0 && i > 0) clock += -std::log(1.0 - uniform_double(arrivals_rng)) * burst / t.arrivals.rate;
        }
        r.arrival_s = clock;
    }
    return out;
}

}  // namespace study

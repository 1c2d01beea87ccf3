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
#include <stdexcept>
#include <string>
#include <vector>

#include "scheduler.hpp"
#include "tiny_model/model.hpp"

namespace study {

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
    for (int i = 0; i < t.requests; ++i) {
        PlannedRequest& r = out[(size_t)i];
        uint64_t rng = (t.seed * 1000003ull + (uint64_t)i) * 0xbf58476d1ce4e5b9ull;
        const int plen = t.prompt.sample(rng), olen = t.output.sample(rng);
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
        // Arrivals: exponential gaps for a Poisson process (one gap per burst).
        if (t.arrivals.kind != Arrivals::Kind::kAllAtOnce && t.arrivals.rate > 0) {
            const int burst = t.arrivals.kind == Arrivals::Kind::kBursts ? std::max(1, t.arrivals.burst) : 1;
            if (i % burst == 0 && i > 0) clock += -std::log(1.0 - uniform_double(arrivals_rng)) * burst / t.arrivals.rate;
        }
        r.arrival_s = clock;
    }
    return out;
}

}  // namespace study

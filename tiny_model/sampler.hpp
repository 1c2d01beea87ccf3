// tiny_model/sampler.hpp -- from logits to one token: greedy, temperature,
// top-p (nucleus), as llama2.c's run.c does it.
//
// The one random number a sample needs (the "coin", uniform in [0,1)) is passed
// in by the caller. That keeps where randomness comes from a caller's decision:
//   - examples/generate draws coins from run.c's xorshift stream, so a seed
//     gives the same story as run.c;
//   - the engine derives each coin from (request seed, output index) alone, so a
//     preempted and recomputed request draws exactly the same coins again.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

namespace pkv {

// Index of the largest logit; the lowest index wins a tie.
inline int argmax(const float* x, int n) {
    int best = 0;
    for (int i = 1; i < n; ++i)
        if (x[i] > x[best]) best = i;
    return best;
}

inline void softmax_inplace(float* x, int n) {
    float max_val = x[0];
    for (int i = 1; i < n; ++i)
        if (x[i] > max_val) max_val = x[i];
    float sum = 0.0f;
    for (int i = 0; i < n; ++i) {
        x[i] = std::exp(x[i] - max_val);
        sum += x[i];
    }
    for (int i = 0; i < n; ++i) x[i] /= sum;
}

// Sample from probabilities `p` with coin in [0,1): walk the CDF.
inline int sample_multinomial(const float* p, int n, float coin) {
    float cdf = 0.0f;
    for (int i = 0; i < n; ++i) {
        cdf += p[i];
        if (coin < cdf) return i;
    }
    return n - 1;  // rounding: the coin landed past the last bucket
}

// Top-p: sample among the smallest set of most likely tokens whose probability
// mass exceeds top_p. Tokens below (1 - top_p) / (n - 1) cannot be in that set,
// so they are dropped before the sort (run.c's speed trick, same result).
inline int sample_top_p(const float* p, int n, float top_p, float coin, std::vector<std::pair<float, int>>& scratch) {
    scratch.clear();
    if (n == 1) return 0;
    const float cutoff = (1.0f - top_p) / (float)(n - 1);
    for (int i = 0; i < n; ++i)
        if (p[i] >= cutoff) scratch.push_back({p[i], i});
    // Nearly uniform distributions can leave nothing above the cutoff (p =
    // {0.5, 0.5} with top_p 0.01); run.c would then read out of bounds. The
    // nucleus of such a distribution is its most likely token.
    if (scratch.empty()) return argmax(p, n);
    std::stable_sort(scratch.begin(), scratch.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
    float cum = 0.0f;
    int last = (int)scratch.size() - 1;
    for (int i = 0; i < (int)scratch.size(); ++i) {
        cum += scratch[i].first;
        if (cum > top_p) {
            last = i;
            break;
        }
    }
    const float r = coin * cum;
    float cdf = 0.0f;
    for (int i = 0; i <= last; ++i) {
        cdf += scratch[i].first;
        if (r < cdf) return scratch[i].second;
    }
    return scratch[last].second;
}

// One token from `logits` (modified in place). temperature 0 = greedy.
inline int sample_token(float* logits, int n, float temperature, float top_p, float coin,
                        std::vector<std::pair<float, int>>& scratch) {
    if (temperature == 0.0f) return argmax(logits, n);
    for (int i = 0; i < n; ++i) logits[i] /= temperature;
    softmax_inplace(logits, n);
    if (top_p <= 0.0f || top_p >= 1.0f) return sample_multinomial(logits, n, coin);
    return sample_top_p(logits, n, top_p, coin, scratch);
}

// run.c's xorshift* generator, for examples/generate's llama2.c compatibility.
inline float runc_random_f32(uint64_t& state) {
    state ^= state >> 12;
    state ^= state << 25;
    state ^= state >> 27;
    const uint32_t u = (uint32_t)((state * 0x2545F4914F6CDD1Dull) >> 32);
    return (float)(u >> 8) / 16777216.0f;
}

// The engine's coin: a pure function of (seed, output index), so a request's
// k-th sampled token sees the same coin however often it is recomputed.
inline float coin_for(uint64_t seed, int output_index) {
    uint64_t s = seed * 0x9e3779b97f4a7c15ull + (uint64_t)output_index;
    uint64_t z = s ^ (s >> 31);
    z *= 0xbf58476d1ce4e5b9ull;
    z ^= z >> 27;
    z *= 0x94d049bb133111ebull;
    z ^= z >> 31;
    return (float)(z >> 40) * (1.0f / 16777216.0f);
}

}  // namespace pkv

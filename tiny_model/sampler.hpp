// tiny_model/sampler.hpp -- chapter 7: from logits to one token: greedy,
// temperature, top-p (nucleus), as llama2.c's run.c does it.
//
// The one random number a sample needs (the "coin", uniform in [0,1)) is passed
// in by the caller. That keeps where randomness comes from a caller's decision:
//   - examples/generate draws coins from run.c's xorshift stream, so a seed
//     gives the same story as run.c;
//   - the engine derives each coin from (request seed, output index) alone, so a
//     preempted and recomputed request draws exactly the same coins again.
//
// Why not one generator for everything, as run.c has? run.c generates one
// sequence, so its single stream is that sequence's. An engine samples many
// requests per step; a shared stream would hand out coins in batch order, and
// a request's tokens would then depend on who else ran in the same step, and
// so on every preemption. A generator per request would fix that but is state
// to carry and restore; a pure function of (seed, output index) carries none,
// and a test can compute the coin of any token directly.
//
// vLLM's sampler offers far more (top-k, min-p, penalties, logprobs) and runs
// batched on the GPU; we keep run.c's three modes, one request at a time.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace pkv {

// Per-request generation settings, a small subset of vLLM's SamplingParams
// (same default max_tokens of 16). The engine checks them at the door
// (Engine::add_request, with check_request below): a NaN temperature
// is a rejection, not a mystery.
struct SamplingParams {
    int max_tokens = 16;
    float temperature = 0.0f;  // 0 = greedy
    float top_p = 1.0f;        // 1 = off
    uint64_t seed = 0;         // with (output index), the only source of randomness
    std::vector<int32_t> stop_token_ids;  // besides EOS
    bool ignore_eos = false;
    // Synthetic workloads only: stop after this many output tokens, as if the
    // model had emitted EOS there (0 = never). A random model (or lab/'s
    // stand-ins for one) never says EOS on cue, and a study of admission
    // needs requests that end before their max_tokens, as real answers do.
    // Admission looks only at max_tokens.
    int stop_after_tokens = 0;
};

// "" when `p` can be sampled with, else what is wrong with it. (max_tokens is
// the scheduler's to judge: it knows max_model_len.)
inline std::string check_sampling_params(const SamplingParams& p) {
    if (!(std::isfinite(p.temperature) && p.temperature >= 0.0f))
        return "temperature must be a finite number >= 0 (0 = greedy), got " + std::to_string(p.temperature);
    if (!std::isfinite(p.top_p)) return "top_p must be a finite number (outside (0, 1) = off)";
    if (p.stop_after_tokens < 0) return "stop_after_tokens must be >= 0 (0 = off)";
    return "";
}

// "" when a request can be run, else the first thing wrong with it: its
// sampling parameters, or a prompt token that is no id of this vocabulary
// (the forward pass would fail on it, for the whole batch).
inline std::string check_request(const std::vector<int32_t>& prompt, const SamplingParams& p, int vocab_size) {
    if (std::string e = check_sampling_params(p); !e.empty()) return e;
    for (size_t i = 0; i < prompt.size(); ++i)
        if (prompt[i] < 0 || prompt[i] >= vocab_size)
            return "prompt token " + std::to_string(i) + " is " + std::to_string(prompt[i]) + ", not a token id in 0.." +
                   std::to_string(vocab_size - 1);
    return "";
}

// Index of the largest logit; the lowest index wins a tie.
// Greedy decoding. Strict ">" gives the tie rule, as in run.c's sample_argmax,
// so greedy output is a function of the logits alone.
// The best value so far lives in a local, not re-read as x[best]: the
// compiler cannot keep x[best] in a register (it must assume the load may
// change), and on a 32000-entry vocabulary that load chain is most of the
// time. Same comparisons, same result, NaN included (nothing is > NaN).
inline int argmax(const float* x, int n) {
    int best = 0;
    float best_val = x[0];
    for (int i = 1; i < n; ++i)
        if (x[i] > best_val) {
            best_val = x[i];
            best = i;
        }
    return best;
}

// Probabilities from logits, in place. Subtracting the max first keeps exp()
// from overflowing and changes nothing mathematically: the common factor
// exp(-max) cancels in the division. Summed in index order, as run.c does, so
// the result is the same bits on every run.
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
// Inverse-CDF sampling: token i is chosen when the coin lands in its slice
// [p0 + ... + p(i-1), p0 + ... + pi), whose width is exactly pi. O(vocab) per
// token, nothing sorted: fine next to a forward pass that is O(params).
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
// `scratch` is [<= n] (probability, id) candidates, passed in so that the
// engine reuses one buffer for every token instead of allocating per sample.
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
    // Most likely first. stable_sort keeps equal probabilities in id order,
    // so the nucleus is a function of the probabilities alone; run.c's qsort
    // leaves the order of ties to the C library.
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
    // Scale the coin to the nucleus mass instead of renormalizing every
    // probability in it: the same distribution, one multiply (run.c's way).
    const float r = coin * cum;
    float cdf = 0.0f;
    for (int i = 0; i <= last; ++i) {
        cdf += scratch[i].first;
        if (r < cdf) return scratch[i].second;
    }
    return scratch[last].second;  // rounding, as in sample_multinomial
}

// One token from `logits` (modified in place). temperature 0 = greedy.
// Temperature divides the logits: below 1 it sharpens the distribution, above
// 1 it flattens it, and 0 is its limit, always the top token. top_p outside
// (0, 1) means "no nucleus", the same convention as run.c.
inline int sample_token(float* logits, int n, float temperature, float top_p, float coin,
                        std::vector<std::pair<float, int>>& scratch) {
    if (temperature == 0.0f) return argmax(logits, n);
    for (int i = 0; i < n; ++i) logits[i] /= temperature;
    softmax_inplace(logits, n);
    if (top_p <= 0.0f || top_p >= 1.0f) return sample_multinomial(logits, n, coin);
    return sample_top_p(logits, n, top_p, coin, scratch);
}

// run.c's xorshift* generator, for examples/generate's llama2.c compatibility.
// One state, advanced once per coin, so the k-th coin depends on every coin
// drawn before it: right for one sequence, the wrong tool for an engine (see
// the top of this file). The top 24 bits of the output become the float,
// because a float holds 24 significant bits exactly.
inline float runc_random_f32(uint64_t& state) {
    state ^= state >> 12;
    state ^= state << 25;
    state ^= state >> 27;
    const uint32_t u = (uint32_t)((state * 0x2545F4914F6CDD1Dull) >> 32);
    return (float)(u >> 8) / 16777216.0f;
}

// The engine's coin: a pure function of (seed, output index), so a request's
// k-th sampled token sees the same coin however often it is recomputed.
// Multiplying the seed by splitmix64's golden-ratio constant spreads nearby
// seeds far apart before the index is added, and the xor-shifts and
// multiplies then mix the input bits into the top 24 bits that become the
// coin. Two requests with the same seed draw the same coins, so identical
// prompts give identical outputs (the forward pass is batch-invariant, so
// their neighbours in the batch do not matter).
inline float coin_for(uint64_t seed, int output_index) {
    // ---- exercise 8 begin: a coin that survives preemption ----
    // A pure function: no state, no global generator. The engine's coin is
    // this exact mix (seeded outputs depend on its bits): s = seed times
    // 0x9e3779b97f4a7c15 plus the index (64 bits, wrapping); splitmix64's
    // finaliser on s, with 31 as its first shift: z = s ^ (s >> 31), times
    // 0xbf58476d1ce4e5b9, z ^ (z >> 27), times 0x94d049bb133111eb, z ^ (z >>
    // 31). Keep the top 24 bits of z and scale by 2^-24 into [0, 1).
    uint64_t s = seed * 0x9e3779b97f4a7c15ull + (uint64_t)output_index;
    uint64_t z = s ^ (s >> 31);
    z *= 0xbf58476d1ce4e5b9ull;
    z ^= z >> 27;
    z *= 0x94d049bb133111ebull;
    z ^= z >> 31;
    return (float)(z >> 40) * (1.0f / 16777216.0f);
    // ---- exercise 8 end ----
}

// A request's output_index-th token from its logits row (modified in place),
// as the engine samples it: with the request's own coin for that index, never
// the step's or the batch's, so a recomputed request draws the same coin for
// its k-th token as it would have without preemption. Greedy needs no coin.
inline int sample_request_token(float* logits, int n, const SamplingParams& p, int output_index,
                                std::vector<std::pair<float, int>>& scratch) {
    const float coin = p.temperature == 0.0f ? 0.0f : coin_for(p.seed, output_index);
    return sample_token(logits, n, p.temperature, p.top_p, coin, scratch);
}

}  // namespace pkv

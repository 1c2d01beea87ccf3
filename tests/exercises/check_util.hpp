// tests/exercises/check_util.hpp -- helpers that more than one check file uses.
//
// Only what is really the same in the files that need it lives here:
//   1. block ids and runs of tokens (exercises 2, 3, 4, 6, 7, 13), and the free list
//      read from head to tail (exercises 2, 3 and 6);
//   2. a Scheduler driven step by step without a model (exercises 4, 5, 6
//      and the lab's 11, 12, 13): requests named by letter, the engine's part
//      of a step, the pool check, and CheckPolicy, a policy of the checks' own
//      at scheduler.hpp's seam, so that the core exercises' checks can pick
//      another victim, take a victim over or answer admission otherwise
//      without lab/ code;
//   3. attention problems with a dense answer (exercises 9 and 10): sequences
//      scattered over shuffled blocks, attention over the same numbers laid
//      out contiguously, and the comparison of the two.
// What belongs to one exercise's story (exercise 5's victim situation,
// exercise 6's two victims, exercise 9's batch order, exercise 10's tiles)
// stays in that file, next to the checks it explains. The lab exercises'
// helpers (LabPolicy, the swap copier) are in lab_util.hpp: nothing here
// includes lab/.
//
// A check file includes this after its own headers and says `using namespace
// pkv_check;`. Nothing here computes an expected value from an exercise's
// code: the helpers build inputs, play the engine's part (complete()) or
// read a data structure back (the free list, check_invariants), and the
// checks keep their own arithmetic.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <deque>
#include <functional>
#include <memory>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include "core/block_pool.hpp"
#include "core/block_pool_check.hpp"
#include "paged_kv.cuh"
#include "scheduler.hpp"

// doctest last, after every header with an exercise region (main.cpp says why).
#include <doctest/doctest.h>

// How doctest prints a list of block ids or tokens in a failed check: without
// this, `CHECK(first(8) == Ids{2})` would report `CHECK( {?} == {?} )`, and the
// student would not see what their code produced. With it: `CHECK( {2, 5} ==
// {2} )`.
template <>
struct doctest::StringMaker<std::vector<int32_t>> {
    static doctest::String convert(const std::vector<int32_t>& v) {
        std::string s = "{";
        for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
        return (s + "}").c_str();
    }
};

namespace pkv_check {

using namespace pkv;

// ============================================================================
// 1. Block ids and tokens
// ============================================================================

// A list of block ids (a block table's blocks, a free list) or of tokens.
using Ids = std::vector<int32_t>;

// n tokens: first, first + 1, ...
inline Ids run_of(int first, int n) {
    Ids v;
    for (int i = 0; i < n; ++i) v.push_back(first + i);
    return v;
}

// The free list from front to back, following next(). We stop at an id
// that is out of range and at a list longer than the pool (a cycle), so a
// broken list fails the check instead of crashing it. The back links are not
// looked at here: exercise 2 checks those itself, on top of this walk.
inline Ids walk_free_list(const BlockPool& pool) {
    Ids order;
    for (int32_t b = pool.free_list().front(); b != -1; b = pool.free_list().next(b)) {
        REQUIRE(b >= 0);
        REQUIRE(b < pool.num_blocks());
        REQUIRE((int)order.size() < pool.num_blocks());  // no cycle
        order.push_back(b);
    }
    return order;
}

// ============================================================================
// 2. A Scheduler without a model
// ============================================================================
//
// The scheduler checks drive a Scheduler over a small BlockPool and play the
// engine's part themselves. Requests are named by letter in the order they
// were added (id 0 = A, 1 = B, ...), so a queue or a step reads as "ABC".

inline std::string names(const std::vector<Request*>& v) {
    std::string s;
    for (const Request* r : v) s += (char)('A' + r->id);
    return s;
}
inline std::string names(const std::deque<Request*>& v) { return names(std::vector<Request*>(v.begin(), v.end())); }
inline std::string names(const std::vector<ScheduledRequest>& v) {
    std::string s;
    for (const ScheduledRequest& r : v) s += (char)('A' + r.req->id);
    return s;
}

// The tokens each scheduled request got, in step order, e.g. "1,4".
inline std::string counts(const std::vector<ScheduledRequest>& v) {
    std::string s;
    for (size_t i = 0; i < v.size(); ++i) s += (i ? "," : "") + std::to_string(v[i].num_new_tokens);
    return s;
}

// A scheduler configuration for the admission checks (exercises 4 and 13):
// max_model_len and the step's token budget; everything else the default.
inline SchedulerConfig admission_config(int max_model_len, int budget = 256) {
    SchedulerConfig c;
    c.max_model_len = max_model_len;
    c.max_num_batched_tokens = budget;
    return c;
}

// The tokens `r` was scheduled for in `out` (0: it was not scheduled).
inline int scheduled_tokens(const SchedulerOutput& out, const Request* r) {
    for (const ScheduledRequest& sr : out.scheduled)
        if (sr.req == r) return sr.num_new_tokens;
    return 0;
}

// Sampling for exactly n output tokens: EOS is ignored, so a request stops
// at max_tokens (or max_model_len) and nowhere else.
inline SamplingParams tokens(int n) {
    SamplingParams p;
    p.max_tokens = n;
    p.ignore_eos = true;
    return p;
}

// The engine's part of a step, without a model (what Engine::step does after
// schedule()): mark every scheduled token computed, append an output token
// (always 3: no check reads its value) to each request whose computation
// reached the end of its sequence, and finish those at max_tokens or
// max_model_len.
inline void complete(Scheduler& s, const SchedulerOutput& out) {
    std::vector<Request*> sampled;
    for (const ScheduledRequest& sr : out.scheduled) {
        const bool reaches_end = sr.req->num_computed_tokens + sr.num_new_tokens == sr.req->num_tokens();
        s.on_computed(*sr.req, sr.num_new_tokens);
        if (reaches_end) sampled.push_back(sr.req);
    }
    for (Request* r : sampled) {
        r->tokens.push_back(3);
        if (r->num_output_tokens() >= r->params.max_tokens) s.finish(*r, FinishReason::kMaxTokens, 0);
        else if (r->num_tokens() >= s.config().max_model_len) s.finish(*r, FinishReason::kMaxModelLen, 0);
    }
}

// "" when the pool agrees with every block table the scheduler knows of
// (reference counts, the free list, the cache), else what is wrong.
inline std::string consistent(const Scheduler& s, const BlockPool& pool) { return check_invariants(pool, s.all_block_tables()); }

// A policy of the checks' own, at scheduler.hpp's seam: it answers as the
// card does (SchedulerPolicy's defaults) unless told otherwise, so a core
// exercise is checked under each answer the seam can give without any lab/
// code. What the scheduler's regions must get right under those answers:
//   pick_front  pick_victim names the oldest running request, which may stand
//               before the running loop's cursor, scheduled already;
//   take_over   take_victim keeps the victim: it frees the blocks itself and
//               holds the request (a swap that copies nothing), so preempt()
//               must neither free nor requeue it; it is never given back;
//   admit       rewrites the card's admission answer (reserve more, keep some
//               blocks free); `cards` records each card answer it was shown.
// It records, for each victim, what the scheduler had done to it by the time
// take_victim saw it (`seen`).
struct CheckPolicy : SchedulerPolicy {
    bool pick_front = false, take_over = false;
    std::function<Admit(const Scheduler&, const Request&, Admit)> admit;

    struct Seen {
        int id = -1;
        bool in_running = false, in_waiting = false;
        RequestState state = RequestState::kWaiting;
        int num_preemptions = 0, num_computed_tokens = 0;
        long num_preemptions_total = 0;
        std::vector<int32_t> blocks;  // its table
        bool blocks_held = false;     // every block of its table still has a reference
    };
    std::vector<Seen> seen;
    std::vector<Admit> cards;
    std::deque<Request*> held;  // victims taken over, newest victim first

    Request* pick_victim(const std::vector<Request*>& running) override { return pick_front ? running.front() : running.back(); }
    bool take_victim(Scheduler& s, Request& v) override {
        Seen w;
        w.id = v.id;
        w.in_running = std::find(s.running().begin(), s.running().end(), &v) != s.running().end();
        w.in_waiting = std::find(s.waiting().begin(), s.waiting().end(), &v) != s.waiting().end();
        w.state = v.state;
        w.num_preemptions = v.num_preemptions;
        w.num_computed_tokens = v.num_computed_tokens;
        w.num_preemptions_total = s.stats().num_preemptions_total;
        w.blocks = v.block_table.blocks;
        w.blocks_held = !v.block_table.blocks.empty();
        for (int32_t b : v.block_table.blocks) w.blocks_held = w.blocks_held && s.pool().block(b).ref_cnt > 0;
        seen.push_back(w);
        if (!take_over) return false;
        free_blocks(s.pool(), v.block_table);
        held.push_front(&v);
        return true;
    }
    bool resume(Scheduler&, SchedulerOutput&, int&) override { return held.empty(); }
    Admit admission(const Scheduler& s, const Request& r, Admit card) override {
        cards.push_back(card);
        return admit ? admit(s, r, card) : card;
    }
    bool forget(Request& r) override {
        const auto it = std::find(held.begin(), held.end(), &r);
        if (it == held.end()) return false;
        held.erase(it);
        return true;
    }
    size_t num_held() const override { return held.size(); }
};

// A config whose scheduler runs a CheckPolicy set up by `setup`, and that
// policy in a running scheduler.
inline void use_check_policy(SchedulerConfig& c, std::function<void(CheckPolicy&)> setup) {
    c.policy = [setup](const SchedulerConfig&) {
        auto p = std::make_unique<CheckPolicy>();
        if (setup) setup(*p);
        return p;
    };
}
inline CheckPolicy& check_policy(Scheduler& s) {
    auto* p = dynamic_cast<CheckPolicy*>(&s.policy());
    REQUIRE(p != nullptr);
    return *p;
}
inline std::string names_held(Scheduler& s) { return names(check_policy(s).held); }

// ============================================================================
// 3. Attention problems with a dense answer
// ============================================================================
//
// An attention check draws each sequence's keys and values as plain
// contiguous arrays, computes causal attention over those arrays in double
// (dense_attention: nothing paged about it), then scatters the same vectors
// into a paged cache through shuffled block tables and asks the paged code
// for the same numbers. Cache slots that belong to no sequence hold NaN, so
// reading one shows.

// splitmix64: the same numbers on every platform, which std:: distributions
// do not promise.
struct Rand {
    uint64_t s;
    explicit Rand(uint64_t seed) : s(seed) {}
    uint64_t next() {
        uint64_t z = (s += 0x9e3779b97f4a7c15ull);
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
        return z ^ (z >> 31);
    }
    float uniform(float lo, float hi) { return lo + (hi - lo) * (float)((next() >> 40) * (1.0 / 16777216.0)); }
    int below(int n) { return (int)(next() % (uint64_t)n); }
    // Fisher-Yates, back to front.
    template <class T>
    void shuffle(std::vector<T>& v) {
        for (size_t i = v.size(); i > 1; --i) std::swap(v[i - 1], v[(size_t)below((int)i)]);
    }
};

// What the paged code reads, and the same numbers laid out densely.
struct Problem {
    AttentionShape s;
    int num_blocks = 0;
    std::vector<std::vector<float>> keys, values;  // [seq][len, n_kv_heads, head_dim], contiguous
    std::vector<float> q;                          // [num_tokens, n_heads, head_dim]
    std::vector<int32_t> block_tables;             // [num_seqs, max_blocks_per_seq], -1 padded
    std::vector<int32_t> token_seq, positions;     // [num_tokens]
    int num_tokens() const { return (int)positions.size(); }
};

// The sequences of a problem, without query tokens yet: each `seqs[i].len`
// keys long (any spec with a `len` will do). Blocks come from a shuffled pool
// with `spare_blocks` more than the sequences need (blocks nobody owns), a
// table row is one column wider than the longest sequence needs (-1 padded).
// Keys are in [-1, 1] times key_scale(position), values in [-1, 1]. The
// caller then adds its query tokens (token_seq, positions) in the order it
// wants them and calls draw_queries.
template <class Seq, class F>
Problem paged_sequences(Rand& rng, int block_size, int n_kv_heads, int group, int head_dim, const std::vector<Seq>& seqs,
                        int spare_blocks, F key_scale) {
    Problem p;
    int need = 0, widest = 0;
    for (const Seq& sp : seqs) {
        const int nb = (sp.len + block_size - 1) / block_size;
        need += nb;
        widest = std::max(widest, nb);
    }
    p.num_blocks = need + spare_blocks;
    p.s = AttentionShape{n_kv_heads * group, n_kv_heads, head_dim, block_size, widest + 1};
    std::vector<int32_t> ids(p.num_blocks);
    std::iota(ids.begin(), ids.end(), 0);
    rng.shuffle(ids);
    p.block_tables.assign(seqs.size() * (size_t)p.s.max_blocks_per_seq, -1);
    size_t next = 0;
    const size_t vec = (size_t)n_kv_heads * head_dim;
    for (size_t si = 0; si < seqs.size(); ++si) {
        for (int b = 0; b < (seqs[si].len + block_size - 1) / block_size; ++b)
            p.block_tables[si * p.s.max_blocks_per_seq + b] = ids[next++];
        std::vector<float> k(seqs[si].len * vec), v(seqs[si].len * vec);
        for (size_t i = 0; i < k.size(); ++i) k[i] = key_scale((int)(i / vec)) * rng.uniform(-1.0f, 1.0f);
        for (float& x : v) x = rng.uniform(-1.0f, 1.0f);
        p.keys.push_back(k);
        p.values.push_back(v);
    }
    return p;
}

// Every query vector, in [-3, 3], once all query tokens are in.
inline void draw_queries(Rand& rng, Problem& p) {
    p.q.resize((size_t)p.num_tokens() * p.s.n_heads * p.s.head_dim);
    for (float& x : p.q) x = rng.uniform(-3.0f, 3.0f);
}

// The physical slot of position pos of sequence si, computed here from the
// table without slot_of (exercise 1).
inline int64_t slot_at(const Problem& p, int si, int pos) {
    return (int64_t)p.block_tables[(size_t)si * p.s.max_blocks_per_seq + pos / p.s.block_size] * p.s.block_size + pos % p.s.block_size;
}

// The f32 caches, NaN wherever no sequence wrote.
inline void scatter_f32(const Problem& p, std::vector<float>& kc, std::vector<float>& vc) {
    const size_t vec = (size_t)p.s.n_kv_heads * p.s.head_dim;
    kc.assign((size_t)p.num_blocks * p.s.block_size * vec, NAN);
    vc.assign(kc.size(), NAN);
    for (size_t si = 0; si < p.keys.size(); ++si)
        for (size_t pos = 0; pos < p.keys[si].size() / vec; ++pos) {
            const size_t slot = (size_t)slot_at(p, (int)si, (int)pos);
            std::copy_n(p.keys[si].begin() + pos * vec, vec, kc.begin() + slot * vec);
            std::copy_n(p.values[si].begin() + pos * vec, vec, vc.begin() + slot * vec);
        }
}

// A one-layer host cache of dtype `dt` (f16 or int8) holding every
// sequence's keys and values, written with kv_store. Unused f16 slots are
// NaN bit patterns, unused int8 slots have NaN scales. p's keys and values
// then become what kv_load reads back, so that dense_attention(p) is
// attention over the values the cache really holds.
inline KVCache store_in_cache(Problem& p, KVDtype dt) {
    KVCache cache(KVGeometry{1, p.num_blocks, p.s.block_size, p.s.n_kv_heads, p.s.head_dim, dt});
    std::memset(cache.k.data(), 0xFF, cache.k.size());
    std::memset(cache.v.data(), 0xFF, cache.v.size());
    std::fill(cache.k_scale.begin(), cache.k_scale.end(), NAN);
    std::fill(cache.v_scale.begin(), cache.v_scale.end(), NAN);
    const KVView kv = cache.k_view(0), vv = cache.v_view(0);
    const int nkv = p.s.n_kv_heads, hd = p.s.head_dim;
    for (size_t si = 0; si < p.keys.size(); ++si)
        for (int pos = 0; pos < (int)(p.keys[si].size() / ((size_t)nkv * hd)); ++pos) {
            const int64_t slot = slot_at(p, (int)si, pos);
            for (int h = 0; h < nkv; ++h) {
                float* k = p.keys[si].data() + ((size_t)pos * nkv + h) * hd;
                float* v = p.values[si].data() + ((size_t)pos * nkv + h) * hd;
                kv_store(kv, slot, h, k);
                kv_store(vv, slot, h, v);
                for (int d = 0; d < hd; ++d) {
                    k[d] = kv_load(kv, slot, h, d);
                    v[d] = kv_load(vv, slot, h, d);
                }
            }
        }
    return cache;
}

// Causal attention over the contiguous arrays, in double: each query token
// sees positions 0 .. its own. kv_head_of(h) picks the kv head that query
// head h reads; without it, h / group (GQA).
template <class F>
std::vector<double> dense_attention(const Problem& p, F kv_head_of) {
    const int H = p.s.n_heads, hd = p.s.head_dim, nkv = p.s.n_kv_heads;
    std::vector<double> out((size_t)p.num_tokens() * H * hd, 0.0);
    for (int t = 0; t < p.num_tokens(); ++t) {
        const std::vector<float>& K = p.keys[p.token_seq[t]];
        const std::vector<float>& V = p.values[p.token_seq[t]];
        const int ctx = p.positions[t] + 1;
        for (int h = 0; h < H; ++h) {
            const int kvh = kv_head_of(h);
            const float* qh = p.q.data() + ((size_t)t * H + h) * hd;
            std::vector<double> w(ctx);
            double mx = -INFINITY;
            for (int j = 0; j < ctx; ++j) {
                double dot = 0;
                for (int d = 0; d < hd; ++d) dot += (double)qh[d] * K[((size_t)j * nkv + kvh) * hd + d];
                w[j] = dot / std::sqrt((double)hd);
                mx = std::max(mx, w[j]);
            }
            double sum = 0;
            for (double& x : w) sum += (x = std::exp(x - mx));
            double* o = out.data() + ((size_t)t * H + h) * hd;
            for (int j = 0; j < ctx; ++j)
                for (int d = 0; d < hd; ++d) o[d] += w[j] / sum * V[((size_t)j * nkv + kvh) * hd + d];
        }
    }
    return out;
}
inline std::vector<double> dense_attention(const Problem& p) {
    const int group = p.s.n_heads / p.s.n_kv_heads;
    return dense_attention(p, [group](int h) { return h / group; });
}

// "" when every element is within tol (relative to the values' scale of 1),
// else where the first one is not.
inline std::string compare(const std::vector<float>& got, const std::vector<double>& want, const AttentionShape& s,
                           double tol = 1e-5) {
    if (got.size() != want.size()) return "size " + std::to_string(got.size()) + " != " + std::to_string(want.size());
    for (size_t i = 0; i < got.size(); ++i)
        if (!(std::fabs((double)got[i] - want[i]) <= tol * std::max(1.0, std::fabs(want[i])))) {
            const size_t per_tok = (size_t)s.n_heads * s.head_dim;
            return "token " + std::to_string(i / per_tok) + " head " + std::to_string(i % per_tok / s.head_dim) + " d " +
                   std::to_string(i % s.head_dim) + ": got " + std::to_string(got[i]) + ", dense attention says " +
                   std::to_string(want[i]);
        }
    return "";
}

}  // namespace pkv_check

// tests/exercises/ex08.cpp -- grades exercise 8, "paged attention on the
// CPU" (paged_attention_ref in paged_kv.cuh).
//
// Every check builds sequences whose keys and values are first drawn as
// plain contiguous arrays, computes causal attention over those arrays in
// double precision (dense_attention below: nothing paged about it), then
// scatters the same vectors into a paged cache through shuffled block tables
// and asks paged_attention_ref for the same numbers. A correct two-pass
// softmax and a correct online softmax both land within the tolerance
// (1e-5 relative to the values' scale); cache slots that belong to no
// sequence hold NaN, so reading one shows.
//
//   - one decode over a scattered block table matches dense attention;
//   - GQA: query head h reads kv head h / (n_heads / n_kv_heads), not h % n_kv_heads;
//   - a prefill chunk: each query sees only its own causal context, position + 1 keys;
//   - a flat batch of several sequences, in shuffled order, each through its own row;
//   - block sizes 1, 3, 8 and 16 all give the dense answer;
//   - scores in the hundreds do not overflow the softmax;
//   - f16 and int8 caches are read as their stored values (through kv_load).
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "block_pool.hpp"
#include "paged_kv.cuh"

using namespace pkv;

namespace {

// splitmix64: the same numbers on every platform.
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
};

struct SeqSpec {
    int len;          // keys cached at positions 0 .. len - 1
    int num_queries;  // query tokens at the last num_queries positions
};

// What the paged kernel reads, and the same numbers laid out densely.
struct Problem {
    AttentionShape s;
    int num_blocks = 0;
    std::vector<std::vector<float>> keys, values;  // [seq][len, n_kv_heads, head_dim], contiguous
    std::vector<float> q;                          // [num_tokens, n_heads, head_dim]
    std::vector<int32_t> block_tables;             // [num_seqs, max_blocks_per_seq], -1 padded
    std::vector<int32_t> token_seq, positions;     // [num_tokens]
    int num_tokens() const { return (int)positions.size(); }
};

// Keys in [-1, 1] times key_scale, values in [-1, 1], queries in [-3, 3].
Problem make_problem(Rand& rng, int block_size, int n_kv_heads, int group, int head_dim, const std::vector<SeqSpec>& seqs,
                     float key_scale = 1.0f) {
    Problem p;
    int need = 0, widest = 0;
    for (const SeqSpec& sp : seqs) {
        const int nb = (sp.len + block_size - 1) / block_size;
        need += nb;
        widest = std::max(widest, nb);
    }
    p.num_blocks = need + 3;  // three blocks nobody owns
    p.s = AttentionShape{n_kv_heads * group, n_kv_heads, head_dim, block_size, widest + 1};
    std::vector<int32_t> ids(p.num_blocks);
    std::iota(ids.begin(), ids.end(), 0);
    for (size_t i = ids.size(); i > 1; --i) std::swap(ids[i - 1], ids[(size_t)rng.below((int)i)]);
    p.block_tables.assign(seqs.size() * (size_t)p.s.max_blocks_per_seq, -1);
    size_t next = 0;
    const size_t vec = (size_t)n_kv_heads * head_dim;
    for (size_t si = 0; si < seqs.size(); ++si) {
        for (int b = 0; b < (seqs[si].len + block_size - 1) / block_size; ++b)
            p.block_tables[si * p.s.max_blocks_per_seq + b] = ids[next++];
        std::vector<float> k(seqs[si].len * vec), v(seqs[si].len * vec);
        for (float& x : k) x = key_scale * rng.uniform(-1.0f, 1.0f);
        for (float& x : v) x = rng.uniform(-1.0f, 1.0f);
        p.keys.push_back(k);
        p.values.push_back(v);
    }
    // Sequences in shuffled order; each one's queries side by side.
    std::vector<int> order(seqs.size());
    std::iota(order.begin(), order.end(), 0);
    for (size_t i = order.size(); i > 1; --i) std::swap(order[i - 1], order[(size_t)rng.below((int)i)]);
    for (int si : order)
        for (int i = 0; i < seqs[si].num_queries; ++i) {
            p.token_seq.push_back(si);
            p.positions.push_back(seqs[si].len - seqs[si].num_queries + i);
        }
    p.q.resize((size_t)p.num_tokens() * p.s.n_heads * head_dim);
    for (float& x : p.q) x = rng.uniform(-3.0f, 3.0f);
    return p;
}

// The physical slot of position pos of sequence si, computed here from the
// table without slot_of.
int64_t slot_at(const Problem& p, int si, int pos) {
    return (int64_t)p.block_tables[(size_t)si * p.s.max_blocks_per_seq + pos / p.s.block_size] * p.s.block_size + pos % p.s.block_size;
}

// The f32 caches, NaN wherever no sequence wrote.
void scatter_f32(const Problem& p, std::vector<float>& kc, std::vector<float>& vc) {
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

// Causal attention over the contiguous arrays, in double. kv_head_of(h)
// picks the kv head a query head reads.
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
std::vector<double> dense_attention(const Problem& p) {
    const int group = p.s.n_heads / p.s.n_kv_heads;
    return dense_attention(p, [group](int h) { return h / group; });
}

std::vector<float> run_ref(const Problem& p) {
    std::vector<float> kc, vc;
    scatter_f32(p, kc, vc);
    std::vector<float> out((size_t)p.num_tokens() * p.s.n_heads * p.s.head_dim, NAN);
    paged_attention_ref(out.data(), p.q.data(), kc.data(), vc.data(), p.block_tables.data(), p.token_seq.data(),
                        p.positions.data(), p.num_tokens(), p.s);
    return out;
}

// "" when every element is within tol (relative to the values' scale of 1),
// else where the first one is not.
std::string compare(const std::vector<float>& got, const std::vector<double>& want, const AttentionShape& s, double tol = 1e-5) {
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

double max_diff(const std::vector<double>& a, const std::vector<double>& b) {
    double m = 0;
    for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::fabs(a[i] - b[i]));
    return m;
}

}  // namespace

// One sequence of 11 keys in blocks of 4 (3 scattered blocks), one decode
// query at position 10, 2 heads over 2 kv heads.
TEST_CASE("one decode over a scattered block table matches dense attention") {
    Rand rng(801);
    const Problem p = make_problem(rng, 4, 2, 1, 8, {{11, 1}});
    REQUIRE(p.positions[0] == 10);
    CHECK(compare(run_ref(p), dense_attention(p), p.s) == "");
}

// 6 query heads over 2 kv heads: heads 0, 1, 2 read kv head 0 and 3, 4, 5
// kv head 1. The h % n_kv_heads mapping gives clearly different numbers here.
TEST_CASE("query heads of a group share the kv head h over group") {
    Rand rng(802);
    const Problem p = make_problem(rng, 4, 2, 3, 8, {{13, 1}, {7, 2}});
    const std::vector<double> right = dense_attention(p);
    const std::vector<double> wrong = dense_attention(p, [](int h) { return h % 2; });
    REQUIRE(max_diff(right, wrong) > 0.05);  // the problem tells the two mappings apart
    CHECK(compare(run_ref(p), right, p.s) == "");
}

// A 20-token sequence with 15 query tokens at positions 5 .. 19: each sees
// positions 0 .. its own, although the cache holds all 20.
TEST_CASE("each prefill query sees only its causal context") {
    Rand rng(803);
    const Problem p = make_problem(rng, 4, 1, 2, 8, {{20, 15}});
    CHECK(compare(run_ref(p), dense_attention(p), p.s) == "");
    // The first query's answer really depends on stopping at position 5.
    Problem all_keys = p;
    for (int32_t& pos : all_keys.positions) pos = 19;
    const std::vector<double> causal = dense_attention(p), full = dense_attention(all_keys);
    CHECK(std::fabs(causal[0] - full[0]) + std::fabs(causal[1] - full[1]) > 1e-3);
}

// Five sequences of different lengths, decodes and prefill chunks mixed, in
// shuffled batch order: every token reads its own block table row.
TEST_CASE("a flat batch of several sequences reads each one's own row") {
    Rand rng(804);
    const Problem p = make_problem(rng, 4, 2, 2, 8, {{1, 1}, {9, 1}, {17, 4}, {6, 6}, {30, 2}});
    REQUIRE(p.num_tokens() == 14);
    CHECK(compare(run_ref(p), dense_attention(p), p.s) == "");
}

// The same kind of batch in blocks of 1, 3, 8 and 16 positions.
TEST_CASE("block sizes from one to sixteen give the dense answer") {
    for (int bs : {1, 3, 8, 16}) {
        CAPTURE(bs);
        Rand rng(805 + bs);
        const Problem p = make_problem(rng, bs, 2, 2, 12, {{25, 3}, {16, 1}, {5, 2}});
        CHECK(compare(run_ref(p), dense_attention(p), p.s) == "");
    }
}

// Keys scaled by 60: scores reach several hundred, and exp(score) alone
// overflows a float (above about 88). Subtracting the max -- once, or as a
// running max -- keeps every weight finite. The tolerance is looser: a float
// score of a few hundred carries an absolute error of ~1e-5.
TEST_CASE("scores in the hundreds do not overflow the softmax") {
    Rand rng(806);
    const Problem p = make_problem(rng, 4, 2, 2, 16, {{24, 3}, {10, 1}}, 60.0f);
    const std::vector<float> got = run_ref(p);
    for (float x : got) REQUIRE(std::isfinite(x));
    CHECK(compare(got, dense_attention(p), p.s, 1e-3) == "");
}

// An f16 cache and an int8 cache, written with kv_store: attention over them
// equals dense attention over the values kv_load reads back. Unused f16
// slots are NaN bit patterns, unused int8 slots have NaN scales.
TEST_CASE("f16 and int8 caches are read as their stored values") {
    for (KVDtype dt : {KVDtype::kF16, KVDtype::kInt8}) {
        CAPTURE(to_string(dt));
        Rand rng(807);
        Problem p = make_problem(rng, 4, 2, 2, 8, {{18, 2}, {7, 1}});
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
                    // The dense copy keeps what the cache really holds.
                    for (int d = 0; d < hd; ++d) {
                        k[d] = kv_load(kv, slot, h, d);
                        v[d] = kv_load(vv, slot, h, d);
                    }
                }
            }
        std::vector<float> out((size_t)p.num_tokens() * p.s.n_heads * hd, NAN);
        paged_attention_ref(out.data(), p.q.data(), kv, vv, p.block_tables.data(), p.token_seq.data(), p.positions.data(),
                            p.num_tokens(), p.s);
        CHECK(compare(out, dense_attention(p), p.s) == "");
    }
}

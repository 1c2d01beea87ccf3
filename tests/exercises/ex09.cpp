// tests/exercises/ex09.cpp -- grades exercise 9, "the paged-attention kernel"
// (the tile loop of paged_attention_kernel in paged_kv.cuh: scores, the
// online softmax, the rescaled accumulation, and the barriers between them).
//
// The kernel runs through paged_attention(...), which under g++ emulates the
// CUDA launch with one real thread per CUDA thread. Every check compares it
// with causal attention computed here in double precision over plain
// contiguous K/V arrays (dense_attention), to 1e-5 relative to the values'
// scale; cache slots that belong to no sequence are NaN. Contexts are sized
// from attention_tile_keys(), the kernel's own tile length, so they really
// cross tile boundaries.
//
//   - a decode over three tiles (the last one partial) and one over exactly
//     two full tiles;
//   - GQA: a group of 3 query heads sharing each tile of one kv head, with a
//     partial last tile (each head's scores live in its own row of tk);
//   - prefill queries on both sides of tile boundaries (contexts of tk - 1,
//     tk, tk + 1, 2 tk ... keys);
//   - scores that jump up in a later tile, and down, so the running max moves
//     and the earlier tiles' sums and outputs must be rescaled;
//   - block sizes 1 and 16 under the same tiles;
//   - f16 and int8 caches (the tile loop sees only their dequantized floats).
//
// kit: tsan
// The line above makes the kit build this file once more under
// ThreadSanitizer: a missing syncthreads() between the steps of the tile
// loop is a data race on shared memory, and TSan reports it. The shapes are
// small so that the TSan build still runs in seconds.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "block_pool.hpp"
#include "cuda_shim.hpp"
#include "paged_kv.cuh"

using namespace pkv;

namespace {

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

// One sequence: keys at positions 0 .. len - 1, query tokens at `queries`.
struct SeqSpec {
    int len;
    std::vector<int> queries;
};
// A decode: one query at the last position.
SeqSpec decode(int len) { return {len, {len - 1}}; }

struct Problem {
    AttentionShape s;
    int num_blocks = 0;
    std::vector<std::vector<float>> keys, values;  // [seq][len, n_kv_heads, head_dim]
    std::vector<float> q;                          // [num_tokens, n_heads, head_dim]
    std::vector<int32_t> block_tables, token_seq, positions;
    int num_tokens() const { return (int)positions.size(); }
};

// key_scale(pos) multiplies the keys at that position (all heads).
template <class F>
Problem make_problem(Rand& rng, int block_size, int n_kv_heads, int group, int head_dim, const std::vector<SeqSpec>& seqs,
                     F key_scale) {
    Problem p;
    int need = 0, widest = 0;
    for (const SeqSpec& sp : seqs) {
        const int nb = (sp.len + block_size - 1) / block_size;
        need += nb;
        widest = std::max(widest, nb);
    }
    p.num_blocks = need + 2;  // two blocks nobody owns
    p.s = AttentionShape{n_kv_heads * group, n_kv_heads, head_dim, block_size, widest + 1};
    std::vector<int32_t> ids(p.num_blocks);
    std::iota(ids.begin(), ids.end(), 0);
    for (size_t i = ids.size(); i > 1; --i) std::swap(ids[i - 1], ids[(size_t)rng.below((int)i)]);
    p.block_tables.assign(seqs.size() * (size_t)p.s.max_blocks_per_seq, -1);
    const size_t vec = (size_t)n_kv_heads * head_dim;
    size_t next = 0;
    for (size_t si = 0; si < seqs.size(); ++si) {
        for (int b = 0; b < (seqs[si].len + block_size - 1) / block_size; ++b)
            p.block_tables[si * p.s.max_blocks_per_seq + b] = ids[next++];
        std::vector<float> k(seqs[si].len * vec), v(seqs[si].len * vec);
        for (size_t i = 0; i < k.size(); ++i) k[i] = key_scale((int)(i / vec)) * rng.uniform(-1.0f, 1.0f);
        for (float& x : v) x = rng.uniform(-1.0f, 1.0f);
        p.keys.push_back(k);
        p.values.push_back(v);
        for (int pos : seqs[si].queries) {
            p.token_seq.push_back((int32_t)si);
            p.positions.push_back(pos);
        }
    }
    p.q.resize((size_t)p.num_tokens() * p.s.n_heads * head_dim);
    for (float& x : p.q) x = rng.uniform(-3.0f, 3.0f);
    return p;
}
Problem make_problem(Rand& rng, int block_size, int n_kv_heads, int group, int head_dim, const std::vector<SeqSpec>& seqs) {
    return make_problem(rng, block_size, n_kv_heads, group, head_dim, seqs, [](int) { return 1.0f; });
}

int64_t slot_at(const Problem& p, int si, int pos) {
    return (int64_t)p.block_tables[(size_t)si * p.s.max_blocks_per_seq + pos / p.s.block_size] * p.s.block_size + pos % p.s.block_size;
}

// Causal attention over the contiguous arrays, in double; query head h reads
// kv head h / group.
std::vector<double> dense_attention(const Problem& p) {
    const int H = p.s.n_heads, hd = p.s.head_dim, nkv = p.s.n_kv_heads, group = H / nkv;
    std::vector<double> out((size_t)p.num_tokens() * H * hd, 0.0);
    for (int t = 0; t < p.num_tokens(); ++t) {
        const std::vector<float>& K = p.keys[p.token_seq[t]];
        const std::vector<float>& V = p.values[p.token_seq[t]];
        const int ctx = p.positions[t] + 1;
        for (int h = 0; h < H; ++h) {
            const int kvh = h / group;
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

template <class T>
DeviceBuffer<T> to_device(const std::vector<T>& v) {
    DeviceBuffer<T> b(v.size());
    b.upload(v);
    return b;
}

// Runs the kernel over caches already on the device.
std::vector<float> run_kernel(const Problem& p, const KVView& k_cache, const KVView& v_cache) {
    const size_t n = (size_t)p.num_tokens() * p.s.n_heads * p.s.head_dim;
    auto dq = to_device(p.q);
    auto dtables = to_device(p.block_tables);
    auto dseq = to_device(p.token_seq);
    auto dpos = to_device(p.positions);
    DeviceBuffer<float> dout(n);
    paged_attention(dout.data(), dq.data(), k_cache, v_cache, dtables.data(), dseq.data(), dpos.data(), p.num_tokens(), p.s);
    std::vector<float> out(n);
    dout.download(out.data(), n);
    return out;
}

// The kernel over f32 caches, NaN wherever no sequence wrote.
std::vector<float> run_kernel_f32(const Problem& p) {
    const size_t vec = (size_t)p.s.n_kv_heads * p.s.head_dim;
    std::vector<float> kc((size_t)p.num_blocks * p.s.block_size * vec, NAN), vc(kc.size(), NAN);
    for (size_t si = 0; si < p.keys.size(); ++si)
        for (size_t pos = 0; pos < p.keys[si].size() / vec; ++pos) {
            const size_t slot = (size_t)slot_at(p, (int)si, (int)pos);
            std::copy_n(p.keys[si].begin() + pos * vec, vec, kc.begin() + slot * vec);
            std::copy_n(p.values[si].begin() + pos * vec, vec, vc.begin() + slot * vec);
        }
    auto dk = to_device(kc);
    auto dv = to_device(vc);
    return run_kernel(p, f32_view(dk.data(), p.s), f32_view(dv.data(), p.s));
}

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

}  // namespace

// 2 heads over 2 kv heads, head_dim 8: one decode whose context is two full
// tiles and a partial third, one whose context is exactly two tiles.
TEST_CASE("a decode over several tiles matches dense attention") {
    const int tk = attention_tile_keys(1, 8);
    REQUIRE(tk >= 8);
    Rand rng(901);
    const Problem p = make_problem(rng, 4, 2, 1, 8, {decode(2 * tk + tk / 3 + 1), decode(2 * tk)});
    CHECK(compare(run_kernel_f32(p), dense_attention(p), p.s) == "");
}

// 6 query heads over 2 kv heads (groups of 3), contexts ending in partial
// tiles of different lengths.
TEST_CASE("a GQA group shares each tile across its query heads") {
    const int tk = attention_tile_keys(3, 8);
    Rand rng(902);
    const Problem p = make_problem(rng, 8, 2, 3, 8, {decode(tk + 5), decode(2 * tk - 3), decode(3)});
    CHECK(compare(run_kernel_f32(p), dense_attention(p), p.s) == "");
}

// Prefill queries whose contexts are tk - 1, tk, tk + 1, 2 tk - 1, 2 tk and
// 2 tk + 1 keys long: the last tile has tk - 1, tk or 1 keys.
TEST_CASE("prefill queries on both sides of a tile boundary") {
    const int tk = attention_tile_keys(2, 8);
    Rand rng(903);
    const std::vector<int> at = {tk - 2, tk - 1, tk, 2 * tk - 2, 2 * tk - 1, 2 * tk};
    const Problem p = make_problem(rng, 4, 1, 2, 8, {{2 * tk + 1, at}});
    CHECK(compare(run_kernel_f32(p), dense_attention(p), p.s) == "");
}

// Keys of the second tile are scaled by 8, so scores jump by tens there: the
// running max moves and everything summed over the first tile must be
// scaled down by exp(old max - new max). A second sequence has its large
// keys in the first tile, so later tiles bring nothing larger.
TEST_CASE("scores that jump between tiles rescale the earlier tiles") {
    const int tk = attention_tile_keys(2, 8);
    Rand rng(904);
    const Problem up = make_problem(rng, 4, 1, 2, 8, {decode(2 * tk + 7)},
                                    [tk](int pos) { return pos >= tk && pos < 2 * tk ? 8.0f : 1.0f; });
    CHECK(compare(run_kernel_f32(up), dense_attention(up), up.s) == "");
    const Problem down = make_problem(rng, 4, 1, 2, 8, {decode(2 * tk + 7)}, [tk](int pos) { return pos < tk ? 8.0f : 1.0f; });
    CHECK(compare(run_kernel_f32(down), dense_attention(down), down.s) == "");
}

// The same tiles read through block tables of one position per block and of
// sixteen.
TEST_CASE("block sizes one and sixteen under the same tiles") {
    const int tk = attention_tile_keys(2, 8);
    for (int bs : {1, 16}) {
        CAPTURE(bs);
        Rand rng(905 + bs);
        const Problem p = make_problem(rng, bs, 2, 2, 8, {decode(tk + tk / 2 + 1), {tk + 3, {tk - 1, tk + 2}}});
        CHECK(compare(run_kernel_f32(p), dense_attention(p), p.s) == "");
    }
}

// f16 and int8 caches: the kernel's loads turn them into floats before the
// tile loop, and its answer is dense attention over the values kv_load
// reads back from the cache.
TEST_CASE("f16 and int8 caches through the kernel") {
    const int tk = attention_tile_keys(2, 8);
    for (KVDtype dt : {KVDtype::kF16, KVDtype::kInt8}) {
        CAPTURE(to_string(dt));
        Rand rng(906);
        Problem p = make_problem(rng, 4, 2, 2, 8, {decode(tk + 9), {tk, {tk - 1}}});
        KVCache host(KVGeometry{1, p.num_blocks, p.s.block_size, p.s.n_kv_heads, p.s.head_dim, dt});
        std::memset(host.k.data(), 0xFF, host.k.size());
        std::memset(host.v.data(), 0xFF, host.v.size());
        std::fill(host.k_scale.begin(), host.k_scale.end(), NAN);
        std::fill(host.v_scale.begin(), host.v_scale.end(), NAN);
        const KVView hk = host.k_view(0), hv = host.v_view(0);
        const int nkv = p.s.n_kv_heads, hd = p.s.head_dim;
        for (size_t si = 0; si < p.keys.size(); ++si)
            for (int pos = 0; pos < (int)(p.keys[si].size() / ((size_t)nkv * hd)); ++pos)
                for (int h = 0; h < nkv; ++h) {
                    const int64_t slot = slot_at(p, (int)si, pos);
                    float* k = p.keys[si].data() + ((size_t)pos * nkv + h) * hd;
                    float* v = p.values[si].data() + ((size_t)pos * nkv + h) * hd;
                    kv_store(hk, slot, h, k);
                    kv_store(hv, slot, h, v);
                    for (int d = 0; d < hd; ++d) {
                        k[d] = kv_load(hk, slot, h, d);
                        v[d] = kv_load(hv, slot, h, d);
                    }
                }
        // The same bytes on the device.
        DeviceBuffer<unsigned char> dk(host.k.size()), dv(host.v.size());
        dk.upload(reinterpret_cast<const unsigned char*>(host.k.data()), host.k.size());
        dv.upload(reinterpret_cast<const unsigned char*>(host.v.data()), host.v.size());
        DeviceBuffer<float> dks, dvs;
        if (dt == KVDtype::kInt8) {
            dks.upload(host.k_scale);
            dvs.upload(host.v_scale);
        }
        const KVView k_dev{dt, dk.data(), dks.data(), nkv, hd}, v_dev{dt, dv.data(), dvs.data(), nkv, hd};
        CHECK(compare(run_kernel(p, k_dev, v_dev), dense_attention(p), p.s) == "");
    }
}

// tests/exercises/ex10.cpp -- grades exercise 10, "the paged-attention kernel"
// (the tile loop of paged_attention_kernel in paged_kv.cuh: scores, the
// online softmax, the rescaled accumulation, and the barriers between them).
//
// The kernel runs through paged_attention(...), which under g++ emulates the
// CUDA launch with one real thread per CUDA thread. Every check compares it
// with causal attention computed here in double precision over plain
// contiguous K/V arrays (dense_attention in check_util.hpp), to 1e-5
// relative to the values' scale; cache slots that belong to no sequence are
// NaN. Contexts are sized from attention_tile_keys(), the kernel's own tile
// length, so they really cross tile boundaries.
//
//   - a decode over three tiles (the last one partial) and one over exactly
//     two full tiles;
//   - GQA: a group of 3 query heads sharing each tile of one kv head, with a
//     partial last tile (each head's scores live in its own row of tk);
//   - prefill queries on both sides of tile boundaries (contexts of tk - 1,
//     tk, tk + 1, 2 tk ... keys);
//   - scores that jump up in a later tile, and down, so the running max moves
//     and the earlier tiles' sums and outputs must be rescaled;
//   - scores in the hundreds (keys scaled by 60) over several tiles: exp of
//     a score overflows a float unless the running max is subtracted;
//   - block sizes 1 and 16 under the same tiles;
//   - f16 and int8 caches (the tile loop sees only their dequantized floats);
//   - head_dim 128 with 2 query heads per kv head: 256 (head, d) outputs for
//     128 threads, so each thread accumulates two (acc[0] and acc[1]), as in
//     a real model; the shapes above give each thread at most one.
//
// kit: tsan
// The line above makes the kit build this file once more under
// ThreadSanitizer: a missing syncthreads() between the steps of the tile
// loop is a data race on shared memory, and TSan reports it. The shapes are
// small so that the TSan build still runs in seconds.
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "core/block_pool.hpp"
#include "core/emu/cuda_shim.hpp"
#include "paged_kv.cuh"
#include "tests/exercises/check_util.hpp"

// doctest last, after every header with an exercise region (main.cpp says why).
#include <doctest/doctest.h>

using namespace pkv;
using namespace pkv_check;

namespace {

// One sequence: keys at positions 0 .. len - 1, query tokens at `queries`.
struct SeqSpec {
    int len;
    std::vector<int> queries;
};
// A decode: one query at the last position.
SeqSpec decode(int len) { return {len, {len - 1}}; }

// key_scale(pos) multiplies the keys at that position (all heads); two blocks
// nobody owns; the query tokens in sequence order.
template <class F>
Problem make_problem(Rand& rng, int block_size, int n_kv_heads, int group, int head_dim, const std::vector<SeqSpec>& seqs,
                     F key_scale) {
    Problem p = paged_sequences(rng, block_size, n_kv_heads, group, head_dim, seqs, 2, key_scale);
    for (size_t si = 0; si < seqs.size(); ++si)
        for (int pos : seqs[si].queries) {
            p.token_seq.push_back((int32_t)si);
            p.positions.push_back(pos);
        }
    draw_queries(rng, p);
    return p;
}
Problem make_problem(Rand& rng, int block_size, int n_kv_heads, int group, int head_dim, const std::vector<SeqSpec>& seqs) {
    return make_problem(rng, block_size, n_kv_heads, group, head_dim, seqs, [](int) { return 1.0f; });
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
    paged_attention(AttentionArgs{dout.data(), dq.data(), k_cache, v_cache, dtables.data(), dseq.data(), dpos.data(), p.num_tokens(), p.s});
    std::vector<float> out(n);
    dout.download(out.data(), n);
    return out;
}

// The kernel over f32 caches, NaN wherever no sequence wrote.
std::vector<float> run_kernel_f32(const Problem& p) {
    std::vector<float> kc, vc;
    scatter_f32(p, kc, vc);
    auto dk = to_device(kc);
    auto dv = to_device(vc);
    return run_kernel(p, f32_view(dk.data(), p.s), f32_view(dv.data(), p.s));
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

// Keys scaled by 60: scores reach several hundred, and exp(score) alone
// overflows a float (above about 88), in the first tile and in every later
// one. The online softmax subtracts its running max before each exp, so
// every weight stays finite. The tolerance is that of exercise 9's check of
// the same kind: a float score of a few hundred carries an absolute error
// of ~1e-5.
TEST_CASE("scores in the hundreds do not overflow the online softmax") {
    const int tk = attention_tile_keys(2, 8);
    Rand rng(907);
    const Problem p = make_problem(rng, 4, 1, 2, 8, {decode(2 * tk + 5), decode(tk - 1)}, [](int) { return 60.0f; });
    const std::vector<float> got = run_kernel_f32(p);
    int nonfinite = 0;
    for (float x : got) nonfinite += !std::isfinite(x);
    CHECK(nonfinite == 0);
    CHECK(compare(got, dense_attention(p), p.s, 1e-3) == "");
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
        CAPTURE(std::string(to_string(dt)));
        Rand rng(906);
        Problem p = make_problem(rng, 4, 2, 2, 8, {decode(tk + 9), {tk, {tk - 1}}});
        KVCache host = store_in_cache(p, dt);
        const int nkv = p.s.n_kv_heads, hd = p.s.head_dim;
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

// A real model's head: head_dim 128, 2 query heads per kv head, 256 (head, d)
// outputs for the block's 128 threads: each thread owns two of them, acc[0]
// and acc[1]. A decode and a short prefill, over more than one tile.
TEST_CASE("head dim 128 gives each thread several outputs") {
    const int tk = attention_tile_keys(2, 128);
    REQUIRE(2 * 128 > kAttnThreads);
    Rand rng(908);
    const Problem p = make_problem(rng, 16, 1, 2, 128, {decode(tk + 7), {tk + 2, {tk - 1, tk + 1}}});
    CHECK(compare(run_kernel_f32(p), dense_attention(p), p.s) == "");
}

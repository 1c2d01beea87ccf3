// tests/exercises/ex09.cpp -- grades exercise 9, "paged attention on the
// CPU" (paged_attention_ref in paged_kv.cuh).
//
// Every check builds sequences whose keys and values are first drawn as
// plain contiguous arrays, computes causal attention over those arrays in
// double precision (dense_attention in check_util.hpp: nothing paged about
// it), then
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
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <string>
#include <vector>

#include "core/block_pool.hpp"
#include "paged_kv.cuh"
#include "tests/exercises/check_util.hpp"

// doctest last, after every header with an exercise region (main.cpp says why).
#include <doctest/doctest.h>

using namespace pkv;
using namespace pkv_check;

namespace {

struct SeqSpec {
    int len;          // keys cached at positions 0 .. len - 1
    int num_queries;  // query tokens at the last num_queries positions
};

// Keys in [-1, 1] times key_scale, values in [-1, 1], queries in [-3, 3];
// three blocks nobody owns.
Problem make_problem(Rand& rng, int block_size, int n_kv_heads, int group, int head_dim, const std::vector<SeqSpec>& seqs,
                     float key_scale = 1.0f) {
    Problem p = paged_sequences(rng, block_size, n_kv_heads, group, head_dim, seqs, 3, [key_scale](int) { return key_scale; });
    // Sequences in shuffled order; each one's queries side by side.
    std::vector<int> order(seqs.size());
    std::iota(order.begin(), order.end(), 0);
    rng.shuffle(order);
    for (int si : order)
        for (int i = 0; i < seqs[si].num_queries; ++i) {
            p.token_seq.push_back(si);
            p.positions.push_back(seqs[si].len - seqs[si].num_queries + i);
        }
    draw_queries(rng, p);
    return p;
}

std::vector<float> run_ref(const Problem& p) {
    std::vector<float> kc, vc;
    scatter_f32(p, kc, vc);
    std::vector<float> out((size_t)p.num_tokens() * p.s.n_heads * p.s.head_dim, NAN);
    paged_attention_ref(out.data(), p.q.data(), kc.data(), vc.data(), p.block_tables.data(), p.token_seq.data(),
                        p.positions.data(), p.num_tokens(), p.s);
    return out;
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
        CAPTURE(std::string(to_string(dt)));
        Rand rng(807);
        Problem p = make_problem(rng, 4, 2, 2, 8, {{18, 2}, {7, 1}});
        KVCache cache = store_in_cache(p, dt);
        const KVView kv = cache.k_view(0), vv = cache.v_view(0);
        std::vector<float> out((size_t)p.num_tokens() * p.s.n_heads * p.s.head_dim, NAN);
        paged_attention_ref(out.data(), p.q.data(), kv, vv, p.block_tables.data(), p.token_seq.data(), p.positions.data(),
                            p.num_tokens(), p.s);
        CHECK(compare(out, dense_attention(p), p.s) == "");
    }
}

// tests/exercises/ex01.cpp -- grades exercise 1, "slot and offset math"
// (paged_kv.cuh: slot_of and kv_offset).
//
// The checks, and what each one proves:
//   - "slot of walks the block table": every position of two sequences (block
//     sizes 4 and 3, scattered tables) lands in the physical block its table
//     names, at its offset inside the block; the expected slots are written
//     out by hand.
//   - "slot of does not overflow with a big pool": a block id times the block
//     size past 2^31 still gives the exact slot, so the product is formed in
//     64 bits.
//   - "kv offset is slot major then head then dim": the head vectors of one
//     slot sit side by side, and the (slot, head) pairs of a small cache tile
//     its float array exactly, with no gap and no overlap.
//   - "kv offset does not overflow past two billion floats": a slot beyond
//     2^31 / (heads * dim) gives the exact 64-bit offset.
//   - "kv store and load follow the documented four dimensional layout":
//     kv_store through a KVView writes position p of a sequence into
//     cache[block][offset][kv head][d] of a plain C array, and kv_load reads
//     back the same values.
//   - "reshape and cache fills the slots of a scattered table": the emulated
//     reshape_and_cache kernel, fed the slots slot_of computes, puts every
//     token's K and V where the layout says and leaves every other float alone.
#include <cstdint>
#include <vector>

#include "paged_kv.cuh"

// doctest last, after every header with an exercise region (main.cpp says why).
#include <doctest/doctest.h>

using namespace pkv;

TEST_CASE("slot of walks the block table") {
    // block_size 4, table [7, 2, 5]: positions 0..3 in block 7, 4..7 in block
    // 2, 8..9 in block 5.
    const int32_t t4[] = {7, 2, 5};
    const int64_t want4[10] = {28, 29, 30, 31, 8, 9, 10, 11, 20, 21};
    for (int p = 0; p < 10; ++p) {
        CAPTURE(p);
        CHECK(slot_of(t4, p, 4) == want4[p]);
    }
    // block_size 3, table [4, 0, 9, 1]: blocks start at slots 12, 0, 27, 3.
    const int32_t t3[] = {4, 0, 9, 1};
    const int64_t want3[11] = {12, 13, 14, 0, 1, 2, 27, 28, 29, 3, 4};
    for (int p = 0; p < 11; ++p) {
        CAPTURE(p);
        CHECK(slot_of(t3, p, 3) == want3[p]);
    }
    // block_size 1: the table is the slot list itself.
    const int32_t t1[] = {6, 3, 8, 0};
    for (int p = 0; p < 4; ++p) CHECK(slot_of(t1, p, 1) == t1[p]);
}

TEST_CASE("slot of does not overflow with a big pool") {
    // 300,000,000 blocks of 16 slots: block 299,999,999 starts at slot
    // 4,799,999,984, far past INT32_MAX.
    const int32_t table[] = {3, 299999999, 200000000};
    CHECK(slot_of(table, 0, 16) == 48);
    CHECK(slot_of(table, 16, 16) == INT64_C(4799999984));
    CHECK(slot_of(table, 31, 16) == INT64_C(4799999999));
    CHECK(slot_of(table, 37, 16) == INT64_C(3200000005));
    // A big block size and a position deep into the sequence.
    const int32_t big[] = {1, 2, 1000000, 5};
    CHECK(slot_of(big, 2 * 4096 + 17, 4096) == INT64_C(4096000017));
}

TEST_CASE("kv offset is slot major then head then dim") {
    // 3 kv heads of dim 4: slot s, head h starts at (3 s + h) * 4.
    CHECK(kv_offset(0, 0, 3, 4) == 0);
    CHECK(kv_offset(0, 1, 3, 4) == 4);
    CHECK(kv_offset(0, 2, 3, 4) == 8);
    CHECK(kv_offset(1, 0, 3, 4) == 12);
    CHECK(kv_offset(5, 2, 3, 4) == 68);
    CHECK(kv_offset(21, 1, 2, 8) == 344);
    // 6 slots, 3 kv heads, head_dim 5: every float of the 90 is covered by
    // exactly one (slot, head) vector, in (slot, head) order.
    const int slots = 6, heads = 3, dim = 5;
    std::vector<int> owner(slots * heads * dim, -1);
    int64_t expect_next = 0;
    for (int s = 0; s < slots; ++s)
        for (int h = 0; h < heads; ++h) {
            const int64_t off = kv_offset(s, h, heads, dim);
            CHECK(off == expect_next);  // contiguous, in order
            expect_next += dim;
            REQUIRE(off >= 0);
            REQUIRE(off + dim <= (int64_t)owner.size());
            for (int d = 0; d < dim; ++d) {
                CHECK(owner[(size_t)(off + d)] == -1);  // no overlap
                owner[(size_t)(off + d)] = s * heads + h;
            }
        }
    for (int o : owner) CHECK(o != -1);  // no gap
}

TEST_CASE("kv offset does not overflow past two billion floats") {
    // slot 3,000,000,000 with 8 kv heads of 128 floats: 3e9 * 1024 + 5 * 128.
    CHECK(kv_offset(INT64_C(3000000000), 5, 8, 128) == INT64_C(3072000000640));
    // Just past 2^31 floats: slot 2^21 with 8 x 128 floats per slot.
    CHECK(kv_offset(INT64_C(2097152), 0, 8, 128) == INT64_C(2147483648));
    CHECK(kv_offset(INT64_C(2097152), 7, 8, 128) == INT64_C(2147483648) + 7 * 128);
}

TEST_CASE("kv store and load follow the documented four dimensional layout") {
    // [num_blocks 4][block_size 3][kv heads 2][head_dim 4], as a plain array.
    constexpr int NB = 4, BS = 3, H = 2, D = 4;
    float cache[NB][BS][H][D];
    for (auto& a : cache)
        for (auto& b : a)
            for (auto& c : b)
                for (float& x : c) x = -1.0f;
    const KVView view{KVDtype::kF32, &cache[0][0][0][0], nullptr, H, D};
    const int32_t table[] = {3, 0, 2};  // a 7-token sequence: blocks 3, 0 and 2
    const int len = 7;
    for (int p = 0; p < len; ++p)
        for (int h = 0; h < H; ++h) {
            float x[D];
            for (int d = 0; d < D; ++d) x[d] = (float)(100 * p + 10 * h + d);
            kv_store(view, slot_of(table, p, BS), h, x);
        }
    for (int p = 0; p < len; ++p)
        for (int h = 0; h < H; ++h)
            for (int d = 0; d < D; ++d) {
                CAPTURE(p);
                CAPTURE(h);
                CAPTURE(d);
                const float want = (float)(100 * p + 10 * h + d);
                CHECK(cache[table[p / BS]][p % BS][h][d] == want);
                CHECK(kv_load(view, slot_of(table, p, BS), h, d) == want);
            }
    // Block 1 is in nobody's table, and block 2 holds only position 6.
    for (int o = 0; o < BS; ++o)
        for (int h = 0; h < H; ++h)
            for (int d = 0; d < D; ++d) CHECK(cache[1][o][h][d] == -1.0f);
    for (int o = 1; o < BS; ++o)
        for (int h = 0; h < H; ++h)
            for (int d = 0; d < D; ++d) CHECK(cache[2][o][h][d] == -1.0f);
}

TEST_CASE("reshape and cache fills the slots of a scattered table") {
    // 6 blocks of 2 slots, 2 kv heads of dim 4 (the kernels need a multiple of 4).
    constexpr int NB = 6, BS = 2, H = 2, D = 4;
    std::vector<float> kc((size_t)NB * BS * H * D, 0.5f), vc(kc.size(), 0.5f);
    const int32_t table[] = {4, 1, 5};
    const int n = 5;  // positions 0..4: blocks 4, 1 and half of 5
    std::vector<float> k((size_t)n * H * D), v(k.size());
    for (int t = 0; t < n; ++t)
        for (int i = 0; i < H * D; ++i) {
            k[(size_t)t * H * D + i] = (float)(1000 + 16 * t + i);
            v[(size_t)t * H * D + i] = -(float)(1000 + 16 * t + i);
        }
    std::vector<int64_t> slots;
    for (int p = 0; p < n; ++p) slots.push_back(slot_of(table, p, BS));
    CHECK(slots == std::vector<int64_t>{8, 9, 2, 3, 10});
    reshape_and_cache(k.data(), v.data(), kc.data(), vc.data(), slots.data(), n, H, D);
    std::vector<int> written(kc.size(), 0);
    for (int p = 0; p < n; ++p)
        for (int h = 0; h < H; ++h)
            for (int d = 0; d < D; ++d) {
                // [block][offset][head][d], flattened by hand.
                const size_t at = (((size_t)table[p / BS] * BS + p % BS) * H + h) * D + d;
                CAPTURE(p);
                CAPTURE(h);
                CAPTURE(d);
                CHECK(kc[at] == (float)(1000 + 16 * p + h * D + d));
                CHECK(vc[at] == -(float)(1000 + 16 * p + h * D + d));
                written[at] = 1;
            }
    for (size_t i = 0; i < kc.size(); ++i)
        if (!written[i]) {
            CAPTURE(i);
            CHECK(kc[i] == 0.5f);
            CHECK(vc[i] == 0.5f);
        }
}

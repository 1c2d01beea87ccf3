// Tests for paged_kv.cuh: the block pool (free list = LRU queue, reference
// counts, invariant checker), prefix caching (chained hashes, collision guard,
// lazy eviction), block tables (growth, tail-first free) and the CPU reference
// paged attention, which is checked against a plain dense attention written
// here from scratch.
#include "core/prefix_cache.hpp"
#include "paged_kv.cuh"

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "tests/test_util.hpp"

using namespace pkv;
using pkv_test::all_finite;
using pkv_test::kNaN;

// Print block-id lists in failure messages instead of "{?}".
namespace doctest {
template <>
struct StringMaker<std::vector<int32_t>> {
    static String convert(const std::vector<int32_t>& v) {
        std::string s = "[";
        for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
        return (s + "]").c_str();
    }
};
}  // namespace doctest

namespace {

using Ids = std::vector<int32_t>;

// The free list from head to tail, following next(). Also verifies each
// back link on the way, so a broken prev() link fails the test that walks it.
Ids walk_free_list(const BlockPool& pool) {
    Ids order;
    int32_t prev = -1;
    for (int32_t b = pool.free_list().front(); b != -1; b = pool.free_list().next(b)) {
        REQUIRE(b >= 0);
        REQUIRE(b < pool.num_blocks());
        REQUIRE((int)order.size() < pool.num_blocks());  // no cycle
        CHECK(pool.free_list().prev(b) == prev);
        order.push_back(b);
        prev = b;
    }
    return order;
}

// check_invariants over plain id lists.
std::string invariants(const BlockPool& pool, std::initializer_list<const Ids*> tables) {
    return check_invariants(pool, std::vector<const Ids*>(tables));
}

// check_invariants over block tables.
std::string invariants_bt(const BlockPool& pool, const std::vector<const BlockTable*>& tables) {
    std::vector<const Ids*> lists;
    for (const BlockTable* t : tables) lists.push_back(&t->blocks);
    return check_invariants(pool, lists);
}

Ids iota_ids(int first, int count) {
    Ids v(count);
    std::iota(v.begin(), v.end(), first);
    return v;
}

// Put the pool's free list into exactly `order` (which must list every block):
// take all blocks, then release them in that order.
void set_free_order(BlockPool& pool, const Ids& order) {
    Ids all;
    REQUIRE(pool.allocate(pool.num_blocks(), all));
    pool.release(order);
    REQUIRE(walk_free_list(pool) == order);
}

// Tokens 0, 1, 2, ... offset by `base`, handy distinct prompts.
Ids tokens_from(int base, int n) { return iota_ids(base, n); }

// Allocate a fresh table for `toks[0..num_tokens)` with prefix-cache lookup,
// "compute" it and register its full blocks, as the engine does for a prefill.
BlockTable prefill(BlockPool& pool, const Ids& toks, int num_tokens) {
    BlockTable t;
    Ids hits = find_cached_prefix(pool, toks.data(), num_tokens);
    REQUIRE(allocate_slots(pool, t, hits, num_tokens));
    cache_full_blocks(pool, t, toks.data(), num_tokens);
    return t;
}

}  // namespace

TEST_SUITE("paged_kv") {

// ---------------------------------------------------------------------------
// 1. Geometry and addressing
// ---------------------------------------------------------------------------

// slot_of/kv_offset reproduce the worked example drawn in the header:
// block_table [7, 2, 5], block_size 4, position 9 -> slot 5*4+1 = 21.
TEST_CASE("slot_of and kv_offset follow the header's worked example") {
    const int32_t table[] = {7, 2, 5};
    CHECK(slot_of(table, 9, 4) == 21);
    // Every position lands in its logical block's physical block, in order.
    const int64_t expected[10] = {28, 29, 30, 31, 8, 9, 10, 11, 20, 21};
    for (int p = 0; p < 10; ++p) CHECK(slot_of(table, p, 4) == expected[p]);
    // K of (slot 21, kv head 1) with 2 kv heads of dim 8 starts at (21*2+1)*8.
    CHECK(kv_offset(21, 1, 2, 8) == 344);
    CHECK(kv_offset(21, 0, 2, 8) + 8 == kv_offset(21, 1, 2, 8));  // heads adjacent
    CHECK(kv_offset(22, 0, 2, 8) == kv_offset(21, 1, 2, 8) + 8);  // then next slot

    CHECK(blocks_for_tokens(0, 4) == 0);
    CHECK(blocks_for_tokens(1, 4) == 1);
    CHECK(blocks_for_tokens(4, 4) == 1);
    CHECK(blocks_for_tokens(5, 4) == 2);
    CHECK(blocks_for_tokens(10, 4) == 3);

    KVGeometry g{2, 10, 4, 3, 8};
    CHECK(g.elems_per_slot() == 24u);
    CHECK(g.elems_per_block() == 96u);
    CHECK(g.elems_per_layer() == 960u);
    KVCache cache(g);
    CHECK(cache.k.size() == 1920u * sizeof(float));
    CHECK(cache.k_layer(1) - cache.k_layer(0) == 960 * (std::ptrdiff_t)sizeof(float));
    CHECK(cache.bytes() == 2u * 1920u * sizeof(float));
}

// ---------------------------------------------------------------------------
// 2. Block pool: operations, usage, invariants
// ---------------------------------------------------------------------------

// A fresh pool has every block free, linked in id order, and is consistent.
// The queue alone (core/free_block_queue.hpp): both ends, a block taken out
// of the middle with its neighbours relinked, and the two misuses it refuses
// (a block linked twice, a block removed that is not in it) with the queue
// left as it was.
TEST_CASE("FreeBlockQueue: both ends, removal from the middle, misuse refused") {
    FreeBlockQueue q(6);
    auto order = [&] {
        Ids ids;
        for (int32_t b = q.front(), prev = -1; b != -1; prev = b, b = q.next(b)) {
            CHECK(q.prev(b) == prev);
            ids.push_back(b);
        }
        return ids;
    };
    CHECK(q.front() == -1);
    CHECK(q.back() == -1);
    for (int32_t b : {2, 3, 4}) q.push_back(b);
    q.push_front(1);
    q.push_front(0);
    CHECK(order() == Ids{0, 1, 2, 3, 4});
    CHECK(q.size() == 5);
    q.remove(2);  // the middle
    CHECK(order() == Ids{0, 1, 3, 4});
    CHECK_FALSE(q.contains(2));
    CHECK(q.next(2) == -1);
    CHECK(q.prev(2) == -1);
    q.remove(0);  // the front
    q.remove(4);  // the back
    CHECK(order() == Ids{1, 3});
    CHECK(q.front() == 1);
    CHECK(q.back() == 3);
    CHECK_THROWS_AS(q.push_back(3), std::logic_error);
    CHECK_THROWS_AS(q.push_front(1), std::logic_error);
    CHECK_THROWS_AS(q.remove(5), std::logic_error);
    CHECK_THROWS_AS(q.remove(6), std::out_of_range);
    CHECK_THROWS_AS(q.push_back(-1), std::out_of_range);
    CHECK(order() == Ids{1, 3});
    CHECK(q.size() == 2);
    q.remove(1);
    q.remove(3);
    CHECK(q.size() == 0);
    CHECK(q.front() == -1);
    CHECK(q.back() == -1);
}

TEST_CASE("fresh pool: all blocks free in id order") {
    BlockPool pool(6, 4, true);
    CHECK(pool.num_blocks() == 6);
    CHECK(pool.block_size() == 4);
    CHECK(pool.num_free_blocks() == 6);
    CHECK(pool.kv_cache_usage_perc() == 0.0);
    CHECK(walk_free_list(pool) == iota_ids(0, 6));
    CHECK(invariants(pool, {}) == "");
    BlockPool empty;
    CHECK(empty.kv_cache_usage_perc() == 0.0);
    CHECK(check_invariants(empty, {}) == "");
}

// allocate/touch/release keep ref counts, the free count and the usage gauge
// consistent with the tables that hold blocks.
TEST_CASE("allocate, touch and release keep counts and usage consistent") {
    BlockPool pool(8, 4, false);
    Ids a, b;
    REQUIRE(pool.allocate(3, a));
    CHECK(a == Ids{0, 1, 2});
    for (int32_t id : a) CHECK(pool.block(id).ref_cnt == 1);
    CHECK(pool.num_free_blocks() == 5);
    CHECK(pool.kv_cache_usage_perc() == doctest::Approx(3.0 / 8.0));
    CHECK(invariants(pool, {&a}) == "");

    // `allocate` appends to `out`.
    REQUIRE(pool.allocate(2, b));
    CHECK(b == Ids{3, 4});
    REQUIRE(pool.allocate(0, b));
    CHECK(b == Ids{3, 4});

    // Share a's first two blocks with b (as a prefix hit would).
    pool.touch({0, 1});
    b.insert(b.begin(), {0, 1});
    CHECK(pool.block(0).ref_cnt == 2);
    CHECK(pool.block(1).ref_cnt == 2);
    CHECK(pool.num_free_blocks() == 3);  // touching held blocks takes nothing
    CHECK(invariants(pool, {&a, &b}) == "");

    // Releasing a: shared blocks stay held by b, block 2 becomes free.
    pool.release(a);
    a.clear();
    CHECK(pool.block(0).ref_cnt == 1);
    CHECK(pool.block(2).ref_cnt == 0);
    CHECK(pool.free_list().contains(2));
    CHECK(pool.num_free_blocks() == 4);
    CHECK(pool.kv_cache_usage_perc() == doctest::Approx(0.5));
    CHECK(invariants(pool, {&b}) == "");

    Ids rest;
    REQUIRE(pool.allocate(4, rest));
    CHECK(pool.num_free_blocks() == 0);
    CHECK(pool.kv_cache_usage_perc() == 1.0);
    CHECK(pool.free_list().front() == -1);
    CHECK(invariants(pool, {&b, &rest}) == "");

    pool.release(b);
    pool.release(rest);
    CHECK(pool.num_free_blocks() == 8);
    CHECK(pool.kv_cache_usage_perc() == 0.0);
    CHECK(invariants(pool, {}) == "");
}

// allocate is all or nothing: asking for more than is free changes nothing.
TEST_CASE("allocate is all-or-nothing") {
    BlockPool pool(5, 4, false);
    Ids held;
    REQUIRE(pool.allocate(3, held));
    const Ids free_before = walk_free_list(pool);

    Ids out{42};  // pre-existing content must be left alone
    CHECK_FALSE(pool.allocate(3, out));
    CHECK(out == Ids{42});
    CHECK(pool.num_free_blocks() == 2);
    CHECK(walk_free_list(pool) == free_before);
    for (int32_t id : free_before) CHECK(pool.block(id).ref_cnt == 0);
    CHECK(invariants(pool, {&held}) == "");

    CHECK(pool.allocate(2, out));  // exactly what is free still works
    CHECK(out == Ids{42, 3, 4});
    CHECK(pool.num_free_blocks() == 0);
    Ids none;
    CHECK_FALSE(pool.allocate(1, none));
    CHECK(none.empty());
}

// check_invariants says "" for the true holders and names a problem whenever
// the tables it is given disagree with the pool, or the pool is corrupted.
TEST_CASE("check_invariants detects inconsistent inputs") {
    BlockPool pool(6, 4, false);
    Ids a, b;
    REQUIRE(pool.allocate(2, a));  // {0, 1}
    REQUIRE(pool.allocate(1, b));  // {2}
    pool.touch({0});
    b.push_back(0);  // block 0 held twice, by a and b
    REQUIRE(invariants(pool, {&a, &b}) == "");

    SUBCASE("a table that omits a holder") {
        const Ids b_short{2};
        CHECK(invariants(pool, {&a, &b_short}) != "");
        CHECK(invariants(pool, {&a}) != "");  // b missing entirely
    }
    SUBCASE("a table that lists a block twice") {
        const Ids a_dup{0, 1, 1};
        CHECK(invariants(pool, {&a_dup, &b}) != "");
        pool.touch({1});  // now ref_cnt 2 matches the count: only the dup check can see it
        CHECK(invariants(pool, {&a_dup, &b}) != "");
    }
    SUBCASE("a table that holds a free block") {
        const Ids a_extra{0, 1, 5};
        CHECK(invariants(pool, {&a_extra, &b}) != "");
    }
    SUBCASE("a table with an out-of-range id") {
        const Ids bad_hi{0, 1, 6};
        const Ids bad_lo{0, 1, -1};
        CHECK(invariants(pool, {&bad_hi, &b}) != "");
        CHECK(invariants(pool, {&bad_lo, &b}) != "");
    }
    SUBCASE("a release of a block that is already free is refused, changing nothing") {
        CHECK_THROWS_AS(pool.release({5}), std::logic_error);
        CHECK_THROWS_AS(pool.release({2, 2}), std::logic_error);  // held once, released twice
        CHECK_THROWS_AS(pool.release({6}), std::out_of_range);
        CHECK(pool.block(5).ref_cnt == 0);
        CHECK(pool.block(2).ref_cnt == 1);
        CHECK(invariants(pool, {&a, &b}) == "");
    }
}

// ---------------------------------------------------------------------------
// 3. LRU order of the free list
// ---------------------------------------------------------------------------

// allocate pops from the head. A released block with no cached contents goes
// to the head (it is worth nothing, so it is reused first); a block with a
// prefix-cache hash goes to the tail, so cached blocks leave in LRU order.
// Several released at once keep the order given, at either end.
TEST_CASE("free list order: uncached blocks to the head, cached ones to the tail") {
    BlockPool pool(6, 4, false);
    Ids a;
    REQUIRE(pool.allocate(2, a));
    CHECK(a == Ids{0, 1});
    CHECK(pool.free_list().front() == 2);
    CHECK(walk_free_list(pool) == Ids{2, 3, 4, 5});

    pool.release({1});
    CHECK(walk_free_list(pool) == Ids{1, 2, 3, 4, 5});
    pool.release({0});
    CHECK(walk_free_list(pool) == Ids{0, 1, 2, 3, 4, 5});

    Ids b;
    REQUIRE(pool.allocate(5, b));
    CHECK(b == Ids{0, 1, 2, 3, 4});  // the just-freed first
    CHECK(walk_free_list(pool) == Ids{5});
    CHECK(invariants(pool, {&b}) == "");
    pool.release({4, 2});
    CHECK(walk_free_list(pool) == Ids{4, 2, 5});

    // With prefix caching: 9 tokens fill blocks 0 and 1 (cached) and start
    // block 2 (not full, so not cached).
    BlockPool pc(6, 4, true);
    const Ids toks = tokens_from(50, 9);
    BlockTable t = prefill(pc, toks, 9);
    REQUIRE(t.blocks == Ids{0, 1, 2});
    CHECK(walk_free_list(pc) == Ids{3, 4, 5});
    free_blocks(pc, t);  // released 2, 1, 0: 2 to the head, then 1 and 0 to the tail
    CHECK(walk_free_list(pc) == Ids{2, 3, 4, 5, 1, 0});
    CHECK(invariants(pc, {}) == "");
    // Five allocations take everything uncached first, then the least
    // recently freed cached block (1); block 0, the prompt's head, survives.
    Ids c;
    REQUIRE(pc.allocate(5, c));
    CHECK(c == Ids{2, 3, 4, 5, 1});
    CHECK(find_cached_prefix(pc, toks.data(), 9) == Ids{0});
}

// free_blocks releases a table's last logical block first, so it sits nearer
// the head of the free list and is reallocated (evicted) before the table's
// first blocks, which are the ones other requests might share.
TEST_CASE("free_blocks frees tail first, so tails are reused first") {
    BlockPool pool(8, 4, true);
    set_free_order(pool, {5, 2, 7, 0, 3, 6, 1, 4});  // scatter ids

    const Ids toks = tokens_from(100, 13);
    BlockTable a = prefill(pool, toks, 12);  // 3 full blocks, all cached
    CHECK(a.blocks == Ids{5, 2, 7});
    CHECK(walk_free_list(pool) == Ids{0, 3, 6, 1, 4});

    free_blocks(pool, a);
    CHECK(a.blocks.empty());
    CHECK(walk_free_list(pool) == Ids{0, 3, 6, 1, 4, 7, 2, 5});  // 7 (tail) before 5 (head)
    CHECK(invariants(pool, {}) == "");
    CHECK(find_cached_prefix(pool, toks.data(), 13) == Ids{5, 2, 7});

    // Taking the untouched blocks plus one more evicts the tail block 7 first:
    // the prompt's first two blocks stay cached.
    Ids other;
    REQUIRE(pool.allocate(6, other));
    CHECK(other.back() == 7);
    CHECK(find_cached_prefix(pool, toks.data(), 13) == Ids{5, 2});
}

// touch() on a free cached block (a prefix hit) unlinks it from anywhere in
// the free list in O(1): the neighbours are relinked, the count drops, the
// block keeps its hash, and head/tail pointers stay right.
TEST_CASE("touch pulls a free cached block out of the middle of the free list") {
    BlockPool pool(6, 4, true);
    const Ids toks = tokens_from(7, 17);
    BlockTable a = prefill(pool, toks, 17);  // blocks 0..4, four full ones cached
    REQUIRE(a.blocks == Ids{0, 1, 2, 3, 4});
    REQUIRE(pool.prefix_index().num_cached_blocks() == 4);
    free_blocks(pool, a);  // 4 (partial, uncached) to the head, 3..0 to the tail
    REQUIRE(walk_free_list(pool) == Ids{4, 5, 3, 2, 1, 0});

    Ids held;
    pool.touch({2});  // middle
    held.push_back(2);
    CHECK(walk_free_list(pool) == Ids{4, 5, 3, 1, 0});
    CHECK(pool.num_free_blocks() == 5);
    CHECK(pool.block(2).ref_cnt == 1);
    CHECK_FALSE(pool.free_list().contains(2));
    CHECK(pool.free_list().prev(2) == -1);
    CHECK(pool.free_list().next(2) == -1);
    CHECK(pool.prefix_index().cached(2));  // a hit keeps its cached contents
    CHECK(pool.prefix_index().num_cached_blocks() == 4);
    CHECK(invariants(pool, {&held}) == "");

    pool.touch({4});  // head
    held.push_back(4);
    CHECK(pool.free_list().front() == 5);
    CHECK(walk_free_list(pool) == Ids{5, 3, 1, 0});
    pool.touch({0});  // tail
    held.push_back(0);
    CHECK(walk_free_list(pool) == Ids{5, 3, 1});
    CHECK(invariants(pool, {&held}) == "");  // also checks the tail pointer

    // Touching a held block only adds a reference.
    pool.touch({2});
    CHECK(pool.block(2).ref_cnt == 2);
    CHECK(pool.num_free_blocks() == 3);
    const Ids again{2};
    CHECK(invariants(pool, {&held, &again}) == "");

    // And the list keeps working afterwards: 0 is cached, so it goes to the tail.
    pool.release({0});
    CHECK(walk_free_list(pool) == Ids{5, 3, 1, 0});
    Ids got;
    REQUIRE(pool.allocate(2, got));
    CHECK(got == Ids{5, 3});
}

// ---------------------------------------------------------------------------
// 4. Prefix caching
// ---------------------------------------------------------------------------

// A block's hash names its whole prefix: same tokens under a different parent
// hash differently, and lookups only match chains that agree from block 0.
TEST_CASE("hash chaining: a block's hash depends on its parent") {
    const int bs = 4;
    const Ids x = tokens_from(10, bs), y = tokens_from(20, bs), z = tokens_from(30, bs);
    const uint64_t hx = hash_block_tokens(kRootHash, x.data(), bs, ~0ull);
    const uint64_t hy = hash_block_tokens(kRootHash, y.data(), bs, ~0ull);
    CHECK(hx != hy);
    CHECK(hash_block_tokens(hx, z.data(), bs, ~0ull) != hash_block_tokens(hy, z.data(), bs, ~0ull));
    CHECK(hash_block_tokens(hx, z.data(), bs, ~0ull) != hash_block_tokens(kRootHash, z.data(), bs, ~0ull));
    CHECK(hash_block_tokens(hx, z.data(), bs, ~0ull) == hash_block_tokens(hx, z.data(), bs, ~0ull));
    CHECK(hash_block_tokens(hx, z.data(), bs, 0x3) <= 0x3u);

    BlockPool pool(16, bs, true);
    // Chain A = [x, y, z] + 1 token, fully cached (3 blocks).
    Ids a_toks = x;
    a_toks.insert(a_toks.end(), y.begin(), y.end());
    a_toks.insert(a_toks.end(), z.begin(), z.end());
    a_toks.push_back(99);
    BlockTable a = prefill(pool, a_toks, 13);
    REQUIRE(pool.prefix_index().num_cached_blocks() == 3);
    CHECK(pool.prefix_index().entry(a.blocks[0]).parent_hash == kRootHash);
    CHECK(pool.prefix_index().entry(a.blocks[0]).block_hash == hx);
    CHECK(pool.prefix_index().entry(a.blocks[1]).parent_hash == hx);
    CHECK(pool.prefix_index().entry(a.blocks[2]).parent_hash == pool.prefix_index().entry(a.blocks[1]).block_hash);
    CHECK(pool.prefix_index().entry(a.blocks[1]).tokens == y);

    auto query = [&](std::initializer_list<Ids> blocks) {
        Ids q;
        for (const Ids& b : blocks) q.insert(q.end(), b.begin(), b.end());
        q.push_back(1);  // one extra token so the hit cap never bites
        return find_cached_prefix(pool, q.data(), (int)q.size());
    };
    CHECK(query({x, y, z}) == Ids{a.blocks[0], a.blocks[1], a.blocks[2]});
    CHECK(query({x, y}) == Ids{a.blocks[0], a.blocks[1]});
    CHECK(query({x, y, x}) == Ids{a.blocks[0], a.blocks[1]});  // diverges at block 2
    CHECK(query({x, z, z}) == Ids{a.blocks[0]});               // diverges at block 1
    CHECK(query({y, y, z}).empty());                           // same tail, other head
    CHECK(query({z}).empty());  // z is cached, but only as the child of [x, y]

    // A second request that shares the first two blocks continues the chain
    // from the last hit; its own third block is registered under that chain.
    Ids b_toks = x;
    b_toks.insert(b_toks.end(), y.begin(), y.end());
    b_toks.insert(b_toks.end(), x.begin(), x.end());
    b_toks.push_back(5);
    BlockTable b = prefill(pool, b_toks, 13);
    REQUIRE(b.blocks.size() == 4u);
    CHECK(b.blocks[0] == a.blocks[0]);
    CHECK(b.blocks[1] == a.blocks[1]);
    CHECK(b.blocks[2] != a.blocks[2]);
    CHECK(pool.prefix_index().cached(b.blocks[2]));
    CHECK(pool.prefix_index().entry(b.blocks[2]).parent_hash == pool.prefix_index().entry(a.blocks[1]).block_hash);
    CHECK(query({x, y, x}) == Ids{a.blocks[0], a.blocks[1], b.blocks[2]});
    CHECK(invariants_bt(pool, {&a, &b}) == "");
}

// The last prompt token is always recomputed: a hit covers at most
// num_tokens - 1 tokens, so 32 tokens with block_size 16 hit one block even
// when two are cached, and 33 tokens hit two.
TEST_CASE("prefix hits are capped at num_tokens - 1") {
    BlockPool pool(8, 16, true);
    const Ids toks = tokens_from(500, 48);
    BlockTable a = prefill(pool, toks, 40);  // two full blocks cached
    REQUIRE(pool.prefix_index().num_cached_blocks() == 2);
    const Ids both{a.blocks[0], a.blocks[1]};

    CHECK(find_cached_prefix(pool, toks.data(), 32) == Ids{a.blocks[0]});
    CHECK(find_cached_prefix(pool, toks.data(), 33) == both);
    CHECK(find_cached_prefix(pool, toks.data(), 48) == both);  // third block not cached
    CHECK(find_cached_prefix(pool, toks.data(), 17) == Ids{a.blocks[0]});
    CHECK(find_cached_prefix(pool, toks.data(), 16).empty());
    CHECK(find_cached_prefix(pool, toks.data(), 1).empty());
    CHECK(find_cached_prefix(pool, toks.data(), 0).empty());

    // The same cap applies end to end: a 32-token request computes block 1 again.
    BlockTable b = prefill(pool, toks, 32);
    CHECK(b.blocks.size() == 2u);
    CHECK(b.blocks[0] == a.blocks[0]);
    CHECK(b.blocks[1] != a.blocks[1]);
    CHECK(pool.block(a.blocks[0]).ref_cnt == 2);
    CHECK(invariants_bt(pool, {&a, &b}) == "");
}

// Only blocks full of computed tokens are registered, incrementally, and one
// hash maps to one block: a second block with identical contents stays uncached.
TEST_CASE("cache_full_blocks registers only full blocks, once") {
    BlockPool pool(8, 4, true);
    const Ids toks = tokens_from(1, 16);
    BlockTable a;
    REQUIRE(allocate_slots(pool, a, {}, 10));
    REQUIRE(a.blocks.size() == 3u);

    cache_full_blocks(pool, a, toks.data(), 3);  // nothing full yet
    CHECK(pool.prefix_index().num_cached_blocks() == 0u);
    for (int32_t id : a.blocks) CHECK_FALSE(pool.prefix_index().registered(id));

    cache_full_blocks(pool, a, toks.data(), 10);  // blocks 0, 1 full; 2 partial
    CHECK(pool.prefix_index().num_cached_blocks() == 2u);
    CHECK(pool.prefix_index().cached(a.blocks[0]));
    CHECK(pool.prefix_index().cached(a.blocks[1]));
    CHECK_FALSE(pool.prefix_index().cached(a.blocks[2]));
    CHECK(pool.prefix_index().entry(a.blocks[0]).tokens == Ids{1, 2, 3, 4});
    const uint64_t h1 = pool.prefix_index().entry(a.blocks[1]).block_hash;

    cache_full_blocks(pool, a, toks.data(), 10);  // idempotent
    CHECK(pool.prefix_index().num_cached_blocks() == 2u);
    CHECK(pool.prefix_index().entry(a.blocks[1]).block_hash == h1);

    cache_full_blocks(pool, a, toks.data(), 12);  // block 2 fills up
    CHECK(pool.prefix_index().num_cached_blocks() == 3u);
    CHECK(pool.prefix_index().entry(a.blocks[2]).parent_hash == h1);
    CHECK(pool.prefix_index().entry(a.blocks[2]).block_hash ==
          hash_block_tokens(h1, toks.data() + 8, 4, ~0ull));

    // Same prompt computed by a second table without lookup (e.g. scheduled in
    // the same step): its blocks do not replace the cached ones.
    BlockTable b;
    REQUIRE(allocate_slots(pool, b, {}, 12));
    cache_full_blocks(pool, b, toks.data(), 12);
    CHECK(pool.prefix_index().num_cached_blocks() == 3u);
    for (int32_t id : b.blocks) CHECK_FALSE(pool.prefix_index().cached(id));
    for (int32_t id : b.blocks) CHECK(pool.prefix_index().entry(id).state == PrefixState::kTwin);  // the chain goes on
    CHECK(find_cached_prefix(pool, toks.data(), 13) == a.blocks);
    CHECK(invariants_bt(pool, {&a, &b}) == "");
}

// With the hash truncated to force collisions, a lookup whose hash matches
// but whose tokens or parent differ must miss rather than return the block
// holding other contents.
TEST_CASE("collision guard: equal hashes with other contents miss") {
    const int bs = 2;
    SUBCASE("mask 0: every block hashes to 0, tokens decide") {
        BlockPool pool(8, bs, true);
        pool.prefix_index().hash_mask = 0;
        const Ids xa{1, 2, 3}, ya{4, 5, 6};
        BlockTable a = prefill(pool, xa, 3);
        REQUIRE(pool.prefix_index().num_cached_blocks() == 1u);
        REQUIRE(pool.prefix_index().entry(a.blocks[0]).block_hash == 0u);
        CHECK(hash_block_tokens(kRootHash, ya.data(), bs, 0) == 0u);  // a collision
        CHECK(find_cached_prefix(pool, ya.data(), 3).empty());
        CHECK(find_cached_prefix(pool, xa.data(), 3) == Ids{a.blocks[0]});
        // Direct lookups: right tokens under the wrong parent miss too.
        CHECK(pool.prefix_index().lookup(0, kRootHash, xa.data()) == a.blocks[0]);
        CHECK(pool.prefix_index().lookup(0, kRootHash, ya.data()) == -1);
        CHECK(pool.prefix_index().lookup(0, 0, xa.data()) == -1);
        CHECK(pool.prefix_index().lookup(1, kRootHash, xa.data()) == -1);  // absent hash
        // y's own block collides with x's entry, so it stays uncached.
        BlockTable b = prefill(pool, ya, 3);
        CHECK_FALSE(pool.prefix_index().cached(b.blocks[0]));
        CHECK(pool.prefix_index().entry(b.blocks[0]).state == PrefixState::kBroken);
        CHECK(find_cached_prefix(pool, ya.data(), 3).empty());
        CHECK(invariants_bt(pool, {&a, &b}) == "");
    }
    SUBCASE("mask 0x3: same tokens and hash, different parent") {
        // Search (deterministically) for tokens with this shape, 2-bit hashes:
        //   chain A = [X, Z]: A0 hash ha, A1 hash hb = H(ha, Z)
        //   chain C = [Y]:    C0 hash hc, with ha, hb, hc distinct
        //   H(hc, Z) == hb, so the query [Y, Z] reaches A1's hash entry
        // A1 holds Z after X; the query has Z after Y: the lookup must miss.
        // First a Z under which two parents collide, then X and Y for them.
        const uint64_t m = 0x3;
        auto H = [&](uint64_t parent, const Ids& t) { return hash_block_tokens(parent, t.data(), bs, m); };
        Ids X, Y, Z;
        uint64_t ha = 0, hc = 0;
        for (int z = 1; z < 20000 && Z.empty(); ++z)
            for (uint64_t p1 = 0; p1 < 4 && Z.empty(); ++p1)
                for (uint64_t p2 = 0; p2 < 4 && Z.empty(); ++p2) {
                    const Ids zz{z, z + 300};
                    const uint64_t hb = H(p1, zz);
                    if (p1 != p2 && H(p2, zz) == hb && hb != p1 && hb != p2) Z = zz, ha = p1, hc = p2;
                }
        REQUIRE_FALSE(Z.empty());
        for (int v = 1; v < 1000 && (X.empty() || Y.empty()); ++v) {
            const Ids cand{v, v + 100};
            if (X.empty() && H(kRootHash, cand) == ha) X = cand;
            else if (Y.empty() && H(kRootHash, cand) == hc) Y = cand;
        }
        const bool found = !X.empty() && !Y.empty();
        REQUIRE(found);

        BlockPool pool(8, bs, true);
        pool.prefix_index().hash_mask = m;
        const Ids a_toks{X[0], X[1], Z[0], Z[1], 7};
        const Ids c_toks{Y[0], Y[1], 8};
        BlockTable a = prefill(pool, a_toks, 5);
        BlockTable c = prefill(pool, c_toks, 3);
        REQUIRE(pool.prefix_index().num_cached_blocks() == 3u);

        const Ids q{Y[0], Y[1], Z[0], Z[1], 9};
        CHECK(find_cached_prefix(pool, q.data(), 5) == Ids{c.blocks[0]});
        const uint64_t hb = pool.prefix_index().entry(a.blocks[1]).block_hash;
        CHECK(pool.prefix_index().lookup(hb, pool.prefix_index().entry(c.blocks[0]).block_hash, Z.data()) == -1);
        CHECK(pool.prefix_index().lookup(hb, pool.prefix_index().entry(a.blocks[0]).block_hash, Z.data()) == a.blocks[1]);
        CHECK(find_cached_prefix(pool, a_toks.data(), 5) == Ids{a.blocks[0], a.blocks[1]});  // A still hits
        CHECK(invariants_bt(pool, {&a, &c}) == "");
    }
}

// Lazy eviction: a freed cached block keeps its hash and can still be hit
// until the moment it is handed out again; then it is forgotten.
TEST_CASE("lazy eviction: freed blocks stay cached until reallocated") {
    BlockPool pool(4, 4, true);
    const Ids toks = tokens_from(40, 9);
    BlockTable a = prefill(pool, toks, 9);
    REQUIRE(a.blocks == Ids{0, 1, 2});
    free_blocks(pool, a);  // 2 (partial) to the head, 1 and 0 (cached) to the tail
    REQUIRE(walk_free_list(pool) == Ids{2, 3, 1, 0});

    CHECK(pool.num_free_blocks() == 4);
    CHECK(pool.kv_cache_usage_perc() == 0.0);  // cached-but-free counts as free
    CHECK(pool.prefix_index().cached(0));
    CHECK(pool.prefix_index().cached(1));
    CHECK(pool.prefix_index().num_cached_blocks() == 2u);
    CHECK(find_cached_prefix(pool, toks.data(), 9) == Ids{0, 1});
    CHECK(invariants(pool, {}) == "");

    Ids other;
    REQUIRE(pool.allocate(2, other));  // 2 and 3: neither was cached
    CHECK(other == Ids{2, 3});
    CHECK(find_cached_prefix(pool, toks.data(), 9) == Ids{0, 1});

    REQUIRE(pool.allocate(1, other));  // block 1: evicted now
    CHECK(other.back() == 1);
    CHECK_FALSE(pool.prefix_index().cached(1));
    CHECK(pool.prefix_index().entry(1).tokens.empty());
    CHECK(pool.prefix_index().num_cached_blocks() == 1u);
    CHECK(find_cached_prefix(pool, toks.data(), 9) == Ids{0});
    CHECK(invariants(pool, {&other}) == "");

    REQUIRE(pool.allocate(1, other));  // block 0
    CHECK(pool.prefix_index().num_cached_blocks() == 0u);
    CHECK(find_cached_prefix(pool, toks.data(), 9).empty());
    CHECK(invariants(pool, {&other}) == "");

    // A re-allocated block can be cached again with new contents.
    pool.release(other);
    const Ids toks2 = tokens_from(900, 5);
    BlockTable b = prefill(pool, toks2, 5);
    CHECK(find_cached_prefix(pool, toks2.data(), 5) == Ids{b.blocks[0]});
    CHECK(find_cached_prefix(pool, toks.data(), 9).empty());
}

// A hit on a block sitting in the free list consumes a free block when it is
// touched, so allocate_slots must count such hits against free capacity.
// Here 2 free hits + 2 new blocks need 4 free blocks, and only 3 exist; without
// that accounting it would report success with a table that is too short.
TEST_CASE("allocate_slots counts free prefix hits against capacity") {
    BlockPool pool(3, 4, true);
    const Ids toks = tokens_from(70, 13);
    {
        BlockTable a = prefill(pool, toks, 8);  // 2 full blocks, both cached
        free_blocks(pool, a);
    }
    REQUIRE(pool.num_free_blocks() == 3);
    const Ids free_before = walk_free_list(pool);

    const Ids hits = find_cached_prefix(pool, toks.data(), 13);
    REQUIRE(hits.size() == 2u);
    CHECK(num_free_hits(pool, hits) == 2);

    BlockTable b;
    CHECK_FALSE(allocate_slots(pool, b, hits, 13));  // needs 2 hits + 2 new > 3 free
    CHECK(b.blocks.empty());
    CHECK(pool.num_free_blocks() == 3);
    CHECK(walk_free_list(pool) == free_before);
    for (int32_t id : hits) CHECK(pool.block(id).ref_cnt == 0);
    CHECK(pool.prefix_index().num_cached_blocks() == 2u);
    CHECK(find_cached_prefix(pool, toks.data(), 13) == hits);
    CHECK(invariants(pool, {}) == "");

    // 12 tokens: 2 hits + 1 new block = 3 = exactly what is free.
    CHECK(allocate_slots(pool, b, hits, 12));
    CHECK(b.blocks.size() == 3u);
    CHECK(b.blocks[0] == hits[0]);
    CHECK(b.blocks[1] == hits[1]);
    CHECK(pool.num_free_blocks() == 0);
    CHECK(pool.prefix_index().num_cached_blocks() == 2u);  // the hits were not evicted
    CHECK(invariants_bt(pool, {&b}) == "");

    // Hits on blocks that are already held cost nothing extra.
    BlockPool pool2(3, 4, true);
    BlockTable held = prefill(pool2, toks, 8);  // holds 2 cached blocks
    const Ids hits2 = find_cached_prefix(pool2, toks.data(), 9);
    CHECK(num_free_hits(pool2, hits2) == 0);
    BlockTable c;
    CHECK(allocate_slots(pool2, c, hits2, 9));  // 2 shared + 1 new = the 1 free block
    CHECK(pool2.num_free_blocks() == 0);
    CHECK(invariants_bt(pool2, {&held, &c}) == "");
}

// Proves the block-table functions refuse arguments that would corrupt the
// pool or read past a table, and change nothing when they do: a hit list
// naming one block twice (a table would hold it twice, its ref_cnt counted
// twice), and cache_full_blocks told of more computed tokens than the table
// has blocks for (it indexed past the table).
TEST_CASE("allocate_slots and cache_full_blocks refuse impossible arguments") {
    BlockPool pool(4, 4, true);
    const Ids toks = tokens_from(71, 12);
    {
        BlockTable a = prefill(pool, toks, 8);  // 2 full blocks, both cached
        free_blocks(pool, a);
    }
    const Ids hits = find_cached_prefix(pool, toks.data(), 12);
    REQUIRE(hits.size() == 2u);
    const Ids before = walk_free_list(pool);
    BlockTable b;
    CHECK_THROWS_WITH_AS(allocate_slots(pool, b, {hits[0], hits[0]}, 9), doctest::Contains("names block"), std::invalid_argument);
    CHECK(b.blocks.empty());
    CHECK(walk_free_list(pool) == before);
    CHECK(invariants(pool, {}) == "");

    BlockTable c;
    REQUIRE(allocate_slots(pool, c, {}, 4));  // one block
    CHECK_THROWS_WITH_AS(cache_full_blocks(pool, c, toks.data(), 12), doctest::Contains("the table holds 1 blocks"),
                         std::invalid_argument);
    CHECK_THROWS_AS(cache_full_blocks(pool, c, toks.data(), -1), std::invalid_argument);
    CHECK_FALSE(pool.prefix_index().registered(c.blocks[0]));
    CHECK(invariants_bt(pool, {&c}) == "");
}

// With prefix caching off nothing is ever registered or hit.
TEST_CASE("prefix caching disabled: no hashes, no hits") {
    BlockPool pool(8, 4, false);
    CHECK_FALSE(pool.prefix_caching());
    const Ids toks = tokens_from(3, 17);
    BlockTable a = prefill(pool, toks, 17);
    CHECK(pool.prefix_index().num_cached_blocks() == 0u);
    for (int32_t id : a.blocks) CHECK_FALSE(pool.prefix_index().cached(id));
    CHECK(find_cached_prefix(pool, toks.data(), 17).empty());
    free_blocks(pool, a);
    CHECK(find_cached_prefix(pool, toks.data(), 17).empty());
    BlockTable b = prefill(pool, toks, 17);  // same prompt: fresh blocks, no sharing
    for (int32_t id : b.blocks) CHECK(pool.block(id).ref_cnt == 1);
    CHECK(invariants_bt(pool, {&b}) == "");
}

// A small random "engine": requests from shared prompt families are admitted
// with prefix lookup, grow one token at a time, are preempted when the pool is
// full and finish at random. After every step the pool must be consistent, and
// every prefix hit must name a block whose K/V was computed for exactly the
// same whole prefix (tracked here per block, independently of the hashes).
// Run with full 64-bit hashes and with 2-bit hashes (constant collisions).
TEST_CASE("random schedule keeps invariants and hits only identical prefixes") {
    struct Req {
        Ids toks;
        int computed = 0;
        BlockTable t;
    };
    const int bs = 4, num_blocks = 24;
    for (uint64_t mask : {~0ull, 0x3ull}) for (uint32_t seed = 1; seed <= 40; ++seed) {
        CAPTURE(mask);
        CAPTURE(seed);
        std::mt19937 rng(seed);
        auto uni = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
        BlockPool pool(num_blocks, bs, true);
        pool.prefix_index().hash_mask = mask;
        std::vector<Ids> computed_prefix(num_blocks);  // block -> tokens 0..end of block it holds
        std::vector<Ids> families;
        for (int f = 0; f < 3; ++f) {
            Ids fam(20);
            for (int32_t& tok : fam) tok = uni(0, 5);
            families.push_back(fam);
        }
        std::vector<Req> reqs;
        int total_hits = 0;

        // Record what each newly allocated block of r holds once computed.
        auto note_new_blocks = [&](const Req& r, size_t first_new) {
            for (size_t i = first_new; i < r.t.blocks.size(); ++i) {
                const size_t end = std::min(r.toks.size(), (i + 1) * bs);
                computed_prefix[r.t.blocks[i]] = Ids(r.toks.begin(), r.toks.begin() + end);
            }
        };

        for (int step = 0; step < 300; ++step) {
            CAPTURE(step);
            const int action = uni(0, 9);
            if (action <= 2 && reqs.size() < 5) {  // admit
                Req r;
                const Ids& fam = families[uni(0, 2)];
                r.toks.assign(fam.begin(), fam.begin() + uni(0, 20));
                const int prompt_len = (int)r.toks.size() + uni(1, 6);
                while ((int)r.toks.size() < prompt_len + 8) r.toks.push_back(uni(0, 5));
                const Ids hits = find_cached_prefix(pool, r.toks.data(), prompt_len);
                for (size_t i = 0; i < hits.size(); ++i)
                    CHECK(computed_prefix[hits[i]] == Ids(r.toks.begin(), r.toks.begin() + (i + 1) * bs));
                const int free_before = pool.num_free_blocks();
                if (allocate_slots(pool, r.t, hits, prompt_len)) {
                    total_hits += (int)hits.size();
                    note_new_blocks(r, hits.size());
                    r.computed = prompt_len;
                    cache_full_blocks(pool, r.t, r.toks.data(), r.computed);
                    reqs.push_back(std::move(r));
                } else {
                    CHECK(r.t.blocks.empty());
                    CHECK(pool.num_free_blocks() == free_before);
                }
            } else if (action <= 7 && !reqs.empty()) {  // decode one token
                const size_t i = (size_t)uni(0, (int)reqs.size() - 1);
                Req& r = reqs[i];
                if (r.computed == (int)r.toks.size()) {
                    free_blocks(pool, r.t);  // finished
                    reqs.erase(reqs.begin() + (long)i);
                } else {
                    const size_t before = r.t.blocks.size();
                    if (allocate_slots(pool, r.t, {}, r.computed + 1)) {
                        note_new_blocks(r, before);
                        r.computed++;
                        cache_full_blocks(pool, r.t, r.toks.data(), r.computed);
                    } else {
                        CHECK(r.t.blocks.size() == before);
                        free_blocks(pool, r.t);  // preempt (recompute later)
                        reqs.erase(reqs.begin() + (long)i);
                    }
                }
            } else if (!reqs.empty()) {  // abort a random request
                const size_t i = (size_t)uni(0, (int)reqs.size() - 1);
                free_blocks(pool, reqs[i].t);
                reqs.erase(reqs.begin() + (long)i);
            }
            std::vector<const BlockTable*> tables;
            for (const Req& r : reqs) {
                tables.push_back(&r.t);
                CHECK((int)r.t.blocks.size() == blocks_for_tokens(r.computed, bs));
            }
            REQUIRE(invariants_bt(pool, tables) == "");
            const double u = pool.kv_cache_usage_perc();
            CHECK(u >= 0.0);
            CHECK(u <= 1.0);
        }
        CHECK(total_hits > 0);  // the schedule did exercise prefix sharing
    }
}

// ---------------------------------------------------------------------------
// 5. Paged attention against dense attention
// ---------------------------------------------------------------------------

namespace {

// One test batch: a paged cache whose unused slots are NaN, the same K/V as
// contiguous per-sequence arrays, and a flat batch of query tokens.
struct AttnBatch {
    AttentionShape s;
    int num_blocks = 0;
    std::vector<int> seq_len;          // [num_seqs]
    std::vector<std::vector<float>> dense_k, dense_v;  // [seq][pos][kv head][dim]
    std::vector<float> k_cache, v_cache;               // paged, NaN where unused
    Ids block_tables;                                  // [num_seqs, max_blocks_per_seq]
    int spare_block = -1;                              // an all-NaN block
    Ids token_seq, positions;                          // [num_tokens]
    std::vector<float> q;                              // [num_tokens, n_heads, head_dim]
    int num_tokens() const { return (int)token_seq.size(); }
};

AttnBatch make_batch(std::mt19937& rng, int block_size, int ratio, int n_kv_heads, int head_dim,
                     float q_scale = 3.0f) {
    auto uni = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
    std::uniform_real_distribution<float> val(-1.0f, 1.0f);
    AttnBatch b;
    b.s.n_kv_heads = n_kv_heads;
    b.s.n_heads = ratio * n_kv_heads;
    b.s.head_dim = head_dim;
    b.s.block_size = block_size;

    const int num_seqs = uni(1, 4);
    int needed = 0, max_blocks = 0;
    for (int i = 0; i < num_seqs; ++i) {
        b.seq_len.push_back(uni(1, 40));
        const int nb = blocks_for_tokens(b.seq_len.back(), block_size);
        needed += nb;
        max_blocks = std::max(max_blocks, nb);
    }
    b.s.max_blocks_per_seq = max_blocks + uni(1, 2);  // padding columns
    b.num_blocks = needed + uni(1, 4);                // some blocks nobody uses

    // Physical blocks in shuffled order, handed out in that order.
    Ids perm = iota_ids(0, b.num_blocks);
    std::shuffle(perm.begin(), perm.end(), rng);
    b.spare_block = perm.back();
    const size_t slot_floats = (size_t)n_kv_heads * head_dim;
    const size_t cache_floats = (size_t)b.num_blocks * block_size * slot_floats;
    b.k_cache.assign(cache_floats, kNaN);
    b.v_cache.assign(cache_floats, kNaN);
    // Padding entries point at a NaN block: reading one poisons the output.
    b.block_tables.assign((size_t)num_seqs * b.s.max_blocks_per_seq, b.spare_block);

    size_t next = 0;
    for (int sq = 0; sq < num_seqs; ++sq) {
        int32_t* row = b.block_tables.data() + (size_t)sq * b.s.max_blocks_per_seq;
        for (int lb = 0; lb < blocks_for_tokens(b.seq_len[sq], block_size); ++lb) row[lb] = perm[next++];
        std::vector<float> dk((size_t)b.seq_len[sq] * slot_floats), dv(dk.size());
        for (float& x : dk) x = val(rng);
        for (float& x : dv) x = val(rng);
        for (int p = 0; p < b.seq_len[sq]; ++p)
            for (int h = 0; h < n_kv_heads; ++h) {
                const int64_t off = kv_offset(slot_of(row, p, block_size), h, n_kv_heads, head_dim);
                const size_t src = ((size_t)p * n_kv_heads + h) * head_dim;
                std::copy_n(dk.begin() + (long)src, head_dim, b.k_cache.begin() + off);
                std::copy_n(dv.begin() + (long)src, head_dim, b.v_cache.begin() + off);
            }
        b.dense_k.push_back(std::move(dk));
        b.dense_v.push_back(std::move(dv));
    }
    REQUIRE(next < perm.size());  // the spare block was not handed out

    // Query tokens: sequences in random order; each contributes either one
    // decode token (the last position), a whole prefill (positions 0..len-1)
    // or a chunked prefill (positions start..len-1), each at its own position.
    Ids order = iota_ids(0, num_seqs);
    std::shuffle(order.begin(), order.end(), rng);
    for (int sq : order) {
        const int len = b.seq_len[sq];
        const int kind = uni(0, 2);
        const int start = kind == 0 ? len - 1 : kind == 1 ? 0 : uni(0, len - 1);
        for (int p = start; p < len; ++p) {
            b.token_seq.push_back(sq);
            b.positions.push_back(p);
        }
    }
    // Queries in [-q_scale, q_scale]; the default 3 makes softmaxes peaked,
    // not near uniform.
    b.q.resize((size_t)b.num_tokens() * b.s.n_heads * head_dim);
    for (float& x : b.q) x = q_scale * val(rng);
    return b;
}

// Textbook attention over contiguous K/V, in double: for query token t and
// head h, softmax over keys 0..pos of q.k/sqrt(d), then the weighted sum of V.
std::vector<double> dense_attention(const AttnBatch& b) {
    const AttentionShape& s = b.s;
    const int group = s.n_heads / s.n_kv_heads;
    std::vector<double> out((size_t)b.num_tokens() * s.n_heads * s.head_dim, 0.0);
    for (int t = 0; t < b.num_tokens(); ++t) {
        const std::vector<float>& K = b.dense_k[b.token_seq[t]];
        const std::vector<float>& V = b.dense_v[b.token_seq[t]];
        const int ctx = b.positions[t] + 1;
        for (int h = 0; h < s.n_heads; ++h) {
            const int kvh = h / group;
            const float* qh = b.q.data() + ((size_t)t * s.n_heads + h) * s.head_dim;
            std::vector<double> w(ctx);
            double mx = -INFINITY;
            for (int j = 0; j < ctx; ++j) {
                const float* kj = K.data() + ((size_t)j * s.n_kv_heads + kvh) * s.head_dim;
                double dot = 0.0;
                for (int d = 0; d < s.head_dim; ++d) dot += (double)qh[d] * kj[d];
                w[j] = dot / std::sqrt((double)s.head_dim);
                mx = std::max(mx, w[j]);
            }
            double sum = 0.0;
            for (double& x : w) sum += (x = std::exp(x - mx));
            double* oh = out.data() + ((size_t)t * s.n_heads + h) * s.head_dim;
            for (int j = 0; j < ctx; ++j) {
                const float* vj = V.data() + ((size_t)j * s.n_kv_heads + kvh) * s.head_dim;
                for (int d = 0; d < s.head_dim; ++d) oh[d] += w[j] / sum * vj[d];
            }
        }
    }
    return out;
}

std::vector<float> run_paged(const AttnBatch& b) {
    std::vector<float> out(b.q.size(), kNaN);  // every element must be written
    paged_attention_ref(out.data(), b.q.data(), b.k_cache.data(), b.v_cache.data(), b.block_tables.data(),
                        b.token_seq.data(), b.positions.data(), b.num_tokens(), b.s);
    return out;
}

}  // namespace

// Paged attention equals dense attention over block sizes 1/4/16, GQA ratios
// 1/2/4/8 and head dims 8/48/64, with shuffled non-contiguous block tables and
// mixed prefill/chunked-prefill/decode tokens of several sequences in one flat
// batch. Every slot no sequence owns (tail of last blocks, spare blocks, table
// padding) is NaN, so a single read through a wrong address makes the output
// non-finite. Each token's output also equals running that token alone.
//
// Tolerance: inputs lie in [-1, 1] (queries in [-3, 3]) and head_dim <= 64, so
// scores are O(10) and float32 dot products are off by ~1e-6 relative; softmax
// weights then carry ~1e-6 relative error and the output, a convex combination
// of values in [-1, 1], is off by a few 1e-6 at most. 1e-4 (abs + rel) leaves
// a wide margin yet is far below any indexing, scaling or causality error,
// which changes outputs by O(0.1).
TEST_CASE("paged attention matches dense attention on shuffled block tables") {
    int cases = 0;
    double worst = 0.0;
    for (int block_size : {1, 4, 16})
        for (int ratio : {1, 2, 4, 8})
            for (int head_dim : {8, 48, 64})
                for (int trial = 0; trial < 2; ++trial) {
                    std::mt19937 rng(1000u * block_size + 100u * ratio + 2u * head_dim + trial);
                    const int n_kv_heads = std::uniform_int_distribution<int>(1, 4)(rng);
                    CAPTURE(block_size);
                    CAPTURE(ratio);
                    CAPTURE(head_dim);
                    CAPTURE(n_kv_heads);
                    CAPTURE(trial);
                    const AttnBatch b = make_batch(rng, block_size, ratio, n_kv_heads, head_dim);
                    const std::vector<float> out = run_paged(b);
                    const std::vector<double> ref = dense_attention(b);
                    REQUIRE(all_finite(out));
                    for (size_t i = 0; i < out.size(); ++i) {
                        const double err = std::fabs(out[i] - ref[i]);
                        worst = std::max(worst, err);
                        if (err > 1e-4 + 1e-4 * std::fabs(ref[i])) {
                            FAIL_CHECK("element " << i << ": paged " << out[i] << " dense " << ref[i]);
                            break;
                        }
                    }
                    // Batch invariance: a token run alone gives bit-identical output.
                    const size_t per_tok = (size_t)b.s.n_heads * b.s.head_dim;
                    std::vector<float> one(per_tok);
                    for (int t = 0; t < b.num_tokens(); ++t) {
                        paged_attention_ref(one.data(), b.q.data() + t * per_tok, b.k_cache.data(), b.v_cache.data(),
                                            b.block_tables.data(), b.token_seq.data() + t, b.positions.data() + t, 1,
                                            b.s);
                        if (!std::equal(one.begin(), one.end(), out.begin() + (long)(t * per_tok))) {
                            FAIL_CHECK("token " << t << " differs when run alone");
                            break;
                        }
                    }
                    ++cases;
                }
    CHECK(cases == 72);
    CHECK(worst > 0.0);  // the comparison really compared float vs double
    CHECK(worst < 1e-4);
}

// Softmax subtracts the running max before exp: with queries scaled so that
// scores spread over hundreds (exp overflows float above ~88), outputs stay
// finite and still match the dense reference. Scores of size S carry float
// rounding of ~S * 1e-6, hence the looser 1e-3 tolerance here.
TEST_CASE("paged attention is stable for large scores") {
    std::mt19937 rng(11);
    double worst = 0.0;
    for (int trial = 0; trial < 4; ++trial) {
        const AttnBatch b = make_batch(rng, 4, 2, 2, 64, 100.0f);
        const std::vector<float> out = run_paged(b);
        const std::vector<double> ref = dense_attention(b);
        REQUIRE(all_finite(out));
        for (size_t i = 0; i < out.size(); ++i) worst = std::max(worst, std::fabs(out[i] - ref[i]));
    }
    CHECK(worst < 1e-3);
}

// The NaN poisoning above really detects bad addressing: point one logical
// block of a sequence at the spare (NaN) block, or read one position past the
// causal context, and the outputs that depend on it stop being finite.
TEST_CASE("NaN-filled unused slots expose wrong addresses") {
    std::mt19937 rng(7);
    AttnBatch b = make_batch(rng, 4, 2, 2, 8);
    REQUIRE(all_finite(run_paged(b)));

    SUBCASE("block table entry redirected to an unused block") {
        b.block_tables[(size_t)b.token_seq[0] * b.s.max_blocks_per_seq] = b.spare_block;
        CHECK_FALSE(all_finite(run_paged(b)));
    }
    SUBCASE("context one past the last written position") {
        // A decode token at the sequence's length reads slot len, never written.
        const int sq = b.token_seq[0];
        const int len = b.seq_len[sq];
        for (int t = 0; t < b.num_tokens(); ++t)
            if (b.token_seq[t] == sq && b.positions[t] == len - 1) b.positions[t] = len;
        CHECK_FALSE(all_finite(run_paged(b)));
    }
}

// The collision guard checks a hit's own tokens and its parent *hash*, not the
// parent's contents. So when a block's hash collides with a cached block of
// other contents, cache_full_blocks must stop the chain there: registering the
// next block under the borrowed hash would let a request whose first block
// really is the cached one hit K/V computed after different tokens. Forced
// here with a 2-bit hash; vanishingly rare at 64 bits.
TEST_CASE("collision guard: a colliding parent must not let a child hit") {
    const int bs = 2;
    const uint64_t m = 0x3;
    // X and Y: different first blocks with the same 2-bit hash.
    const Ids X{1, 1};
    Ids Y;
    const uint64_t hx = hash_block_tokens(kRootHash, X.data(), bs, m);
    for (int y = 2; y < 100 && Y.empty(); ++y) {
        const Ids cand{y, y};
        if (hash_block_tokens(kRootHash, cand.data(), bs, m) == hx) Y = cand;
    }
    REQUIRE_FALSE(Y.empty());

    BlockPool pool(8, bs, true);
    pool.prefix_index().hash_mask = m;
    const Ids p_toks{X[0], X[1], 50};
    BlockTable p = prefill(pool, p_toks, 3);  // caches [X]
    const Ids r_toks{Y[0], Y[1], 7, 8, 60};
    // [Y]'s hash is taken by [X], so r's block 0 stays uncached; today its
    // block 1 ([Z] after Y) is still registered, chained from that hash.
    BlockTable r = prefill(pool, r_toks, 5);
    const Ids q_toks{X[0], X[1], 7, 8, 61};  // [X, Z]
    const Ids hits = find_cached_prefix(pool, q_toks.data(), 5);
    // r's second block holds Z computed after Y, not after X.
    CHECK(hits == Ids{p.blocks[0]});
    CHECK(invariants_bt(pool, {&p, &r}) == "");
}

}  // TEST_SUITE

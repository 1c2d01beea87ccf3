// tests/exercises/ex07.cpp -- grades exercise 7, "chained hashes and the
// prefix lookup" (core/prefix_cache.hpp: find_cached_prefix and cache_full_blocks).
//
// The lookup checks fill the prefix cache by hand (BlockPool::cache_block with
// hashes computed here by hash_block_tokens), so they do not depend on
// cache_full_blocks; the registration checks compare what cache_full_blocks
// stored with hashes computed here the same way.
//
// The checks, and what each one proves:
//   - "a cached chain is found block by block in logical order": the hits are
//     the physical ids of the matching blocks, in logical order, and the walk
//     stops at the first block that differs or is no longer cached, even when
//     a later block of the same chain still is.
//   - "the block holding the last token is never a hit": with two blocks of 4
//     cached, 8 tokens hit one block, 9 hit two; 4, 1 and 0 tokens hit none.
//   - "a block matches only after the same prefix": the hash of a block
//     names everything before it: a block cached as the child of one prefix is
//     not found after another prefix, nor at the start of a sequence, and a
//     block cached at the start is not found as a child.
//   - "nothing is found or cached without prefix caching": a pool with prefix
//     caching off answers no lookup even when a block carries a hash, and
//     cache_full_blocks registers nothing.
//   - "cache full blocks registers only full computed blocks": partial blocks
//     and uncomputed tokens are never registered; each full block gets the
//     chained hash of its tokens under the previous block's hash, in
//     logical order; a repeated call changes nothing.
//   - "a duplicate of a cached block continues the chain": a second table
//     holding the same tokens names none of them (one block per hash), they
//     are twins, and its next, new block is named under the chain.
//   - "a hash collision breaks the chain for good": with hash_mask 0 every
//     hash collides; a block whose hash names other contents is kBroken,
//     named nothing, and nothing after it is named even once the colliding
//     entry is gone.
#include <cstdint>
#include <string>
#include <vector>

#include "core/block_pool.hpp"
#include "core/block_pool_check.hpp"
#include "core/prefix_cache.hpp"
#include "tests/exercises/check_util.hpp"

// doctest last, after every header with an exercise region (main.cpp says why).
#include <doctest/doctest.h>

using namespace pkv;
using namespace pkv_check;

namespace {

Ids concat(std::initializer_list<Ids> parts) {
    Ids v;
    for (const Ids& p : parts) v.insert(v.end(), p.begin(), p.end());
    return v;
}

// The chained hash of `blocks` (each one block of tokens), from the root.
uint64_t chain_hash(std::initializer_list<Ids> blocks, int bs, uint64_t mask = ~0ull) {
    uint64_t h = kRootHash;
    for (const Ids& b : blocks) h = hash_block_tokens(h, b.data(), bs, mask);
    return h;
}

// Register `id` as a cached block holding `toks` after `parent`.
void put(BlockPool& pool, int32_t id, uint64_t parent, const Ids& toks) {
    const uint64_t h = hash_block_tokens(parent, toks.data(), pool.block_size(), pool.prefix_index().hash_mask);
    pool.prefix_index().cache_block(id, h, parent, toks.data());
    REQUIRE(pool.prefix_index().cached(id));
}

// What registering table block `i` recorded (core/prefix_index.hpp).
PrefixState state_of(const BlockPool& pool, const BlockTable& t, size_t i) { return pool.prefix_index().entry(t.blocks.at(i)).state; }
// How many of the table's blocks are registered (they lead the table).
int num_registered(const BlockPool& pool, const BlockTable& t) {
    int n = 0;
    for (int32_t b : t.blocks) n += pool.prefix_index().registered(b);
    return n;
}

Ids hits_of(const BlockPool& pool, const Ids& toks) { return find_cached_prefix(pool, toks.data(), (int)toks.size()); }

const Ids A{11, 12, 13, 14}, B{21, 22, 23, 24}, C{31, 32, 33, 34}, X{41, 42, 43, 44};

}  // namespace

TEST_CASE("a cached chain is found block by block in logical order") {
    BlockPool pool(6, 4, true);
    Ids held;
    REQUIRE(pool.allocate(6, held));
    // The chain [A, B, C] lives in blocks 3, 0, 4 (scattered on purpose).
    put(pool, 3, kRootHash, A);
    put(pool, 0, chain_hash({A}, 4), B);
    put(pool, 4, chain_hash({A, B}, 4), C);

    CHECK(hits_of(pool, concat({A, B, C, {7}})) == Ids{3, 0, 4});
    CHECK(hits_of(pool, concat({A, B, C, X, {7}})) == Ids{3, 0, 4});
    CHECK(hits_of(pool, concat({A, B, X, {7}})) == Ids{3, 0});  // differs at block 2
    CHECK(hits_of(pool, concat({A, X, C, {7}})) == Ids{3});     // differs at block 1
    CHECK(hits_of(pool, concat({X, B, C, {7}})).empty());       // differs at block 0
    // One token different in the middle of block 1 is a miss too.
    Ids near = concat({A, B, C, {7}});
    near[5] = 99;
    CHECK(hits_of(pool, near) == Ids{3});

    // Evict block 0 (B): C's block is still cached, but the walk stops at B.
    pool.release({0});
    Ids again;
    REQUIRE(pool.allocate(1, again));
    REQUIRE(again == Ids{0});
    REQUIRE(pool.prefix_index().cached(4));
    CHECK(hits_of(pool, concat({A, B, C, {7}})) == Ids{3});
}

TEST_CASE("the block holding the last token is never a hit") {
    BlockPool pool(4, 4, true);
    Ids held;
    REQUIRE(pool.allocate(4, held));
    put(pool, 2, kRootHash, A);
    put(pool, 1, chain_hash({A}, 4), B);
    const Ids toks = concat({A, B, C});
    auto first = [&](int n) { return find_cached_prefix(pool, toks.data(), n); };
    CHECK(first(12) == Ids{2, 1});  // block 2 is not cached anyway
    CHECK(first(9) == Ids{2, 1});   // token 8 is computed, blocks 0 and 1 are not
    CHECK(first(8) == Ids{2});      // token 7 must be computed: block 1 is not a hit
    CHECK(first(5) == Ids{2});
    CHECK(first(4).empty());        // token 3 must be computed
    CHECK(first(1).empty());
    CHECK(first(0).empty());
}

TEST_CASE("a block matches only after the same prefix") {
    BlockPool pool(6, 4, true);
    Ids held;
    REQUIRE(pool.allocate(6, held));
    put(pool, 0, kRootHash, A);            // [A]
    put(pool, 1, chain_hash({A}, 4), B);   // [A, B]: B as the child of A
    put(pool, 2, kRootHash, C);            // [C]
    put(pool, 3, kRootHash, X);            // [X] at the start of a sequence

    CHECK(hits_of(pool, concat({A, B, {7}})) == Ids{0, 1});
    CHECK(hits_of(pool, concat({C, B, {7}})) == Ids{2});  // B after C: never cached
    CHECK(hits_of(pool, concat({B, {7}})).empty());       // B at the start: never cached
    CHECK(hits_of(pool, concat({A, X, {7}})) == Ids{0});  // X is cached only at the start
    CHECK(hits_of(pool, concat({X, {7}})) == Ids{3});
}

TEST_CASE("nothing is found or cached without prefix caching") {
    BlockPool pool(4, 4, false);
    Ids held;
    REQUIRE(pool.allocate(2, held));
    put(pool, 0, kRootHash, A);  // a hash by hand: the pool still says "off"
    CHECK(hits_of(pool, concat({A, B, {7}})).empty());

    BlockTable t;
    REQUIRE(pool.allocate(2, t.blocks));  // blocks 2 and 3
    const Ids toks = concat({B, C});
    cache_full_blocks(pool, t, toks.data(), 8);
    CHECK(num_registered(pool, t) == 0);
    CHECK_FALSE(pool.prefix_index().cached(2));
    CHECK_FALSE(pool.prefix_index().cached(3));
    CHECK(pool.prefix_index().num_cached_blocks() == 1u);
}

TEST_CASE("cache full blocks registers only full computed blocks") {
    BlockPool pool(5, 4, true);
    Ids other;
    REQUIRE(pool.allocate(1, other));  // block 0 elsewhere: the table starts at 1
    BlockTable t;
    REQUIRE(pool.allocate(4, t.blocks));  // 1, 2, 3, 4
    const Ids toks = concat({A, B, C, {51, 52}});  // 14 tokens, 4 blocks

    cache_full_blocks(pool, t, toks.data(), 3);  // block 0 not full yet
    CHECK(pool.prefix_index().num_cached_blocks() == 0u);
    CHECK(num_registered(pool, t) == 0);

    cache_full_blocks(pool, t, toks.data(), 7);  // block 0 full, block 1 not
    const uint64_t h0 = chain_hash({A}, 4);
    CHECK(pool.prefix_index().num_cached_blocks() == 1u);
    CHECK(num_registered(pool, t) == 1);
    CHECK(state_of(pool, t, 0) == PrefixState::kNamed);
    CHECK(pool.prefix_index().cached(1));
    CHECK(pool.prefix_index().entry(1).block_hash == h0);
    CHECK(pool.prefix_index().entry(1).parent_hash == kRootHash);
    CHECK(pool.prefix_index().entry(1).tokens == A);
    CHECK_FALSE(pool.prefix_index().cached(2));

    cache_full_blocks(pool, t, toks.data(), 14);  // blocks 1 and 2 fill; block 3 is partial
    const uint64_t h1 = chain_hash({A, B}, 4), h2 = chain_hash({A, B, C}, 4);
    CHECK(pool.prefix_index().num_cached_blocks() == 3u);
    CHECK(num_registered(pool, t) == 3);
    CHECK(pool.prefix_index().entry(2).block_hash == h1);
    CHECK(pool.prefix_index().entry(2).parent_hash == h0);
    CHECK(pool.prefix_index().entry(2).tokens == B);
    CHECK(pool.prefix_index().entry(3).block_hash == h2);
    CHECK(pool.prefix_index().entry(3).parent_hash == h1);
    CHECK(pool.prefix_index().entry(3).tokens == C);
    CHECK_FALSE(pool.prefix_index().registered(4));

    cache_full_blocks(pool, t, toks.data(), 14);  // again: nothing new
    CHECK(pool.prefix_index().num_cached_blocks() == 3u);
    CHECK(num_registered(pool, t) == 3);
    CHECK(pool.prefix_index().entry(3).block_hash == h2);
    // And the lookup finds the chain, capped below the last token.
    CHECK(hits_of(pool, toks) == Ids{1, 2, 3});
    std::vector<const Ids*> tables{&other, &t.blocks};
    CHECK(check_invariants(pool, tables) == "");
}

TEST_CASE("a duplicate of a cached block continues the chain") {
    BlockPool pool(8, 4, true);
    BlockTable a, b;
    REQUIRE(pool.allocate(2, a.blocks));  // 0, 1
    REQUIRE(pool.allocate(3, b.blocks));  // 2, 3, 4
    const Ids ta = concat({A, B}), tb = concat({A, B, X, {9}});
    cache_full_blocks(pool, a, ta.data(), 8);
    REQUIRE(pool.prefix_index().num_cached_blocks() == 2u);

    // b computed the same two blocks itself: they stay uncached (one block per
    // hash), twins, yet b's chain goes on from the same hashes.
    cache_full_blocks(pool, b, tb.data(), 8);
    CHECK(state_of(pool, b, 0) == PrefixState::kTwin);
    CHECK(state_of(pool, b, 1) == PrefixState::kTwin);
    CHECK(pool.prefix_index().entry(3).block_hash == chain_hash({A, B}, 4));
    CHECK_FALSE(pool.prefix_index().cached(2));
    CHECK_FALSE(pool.prefix_index().cached(3));
    CHECK(pool.prefix_index().num_cached_blocks() == 2u);

    // Its third block is new: registered, as the child of [A, B].
    cache_full_blocks(pool, b, tb.data(), 12);
    CHECK(num_registered(pool, b) == 3);
    CHECK(state_of(pool, b, 2) == PrefixState::kNamed);
    CHECK(pool.prefix_index().cached(4));
    CHECK(pool.prefix_index().entry(4).parent_hash == chain_hash({A, B}, 4));
    CHECK(pool.prefix_index().entry(4).block_hash == chain_hash({A, B, X}, 4));
    CHECK(hits_of(pool, tb) == Ids{0, 1, 4});
}

TEST_CASE("a hash collision breaks the chain for good") {
    BlockPool pool(6, 2, true);
    pool.prefix_index().hash_mask = 0;  // every block hashes to 0
    BlockTable a, b;
    REQUIRE(pool.allocate(1, a.blocks));  // 0
    REQUIRE(pool.allocate(2, b.blocks));  // 1, 2
    const Ids ta{1, 2, 9}, tb{3, 4, 5, 6};
    cache_full_blocks(pool, a, ta.data(), 2);
    REQUIRE(pool.prefix_index().cached(0));
    REQUIRE(pool.prefix_index().entry(0).block_hash == 0u);

    // b's first block hashes to 0 too, with other tokens: a collision.
    cache_full_blocks(pool, b, tb.data(), 4);
    CHECK(state_of(pool, b, 0) == PrefixState::kBroken);
    CHECK_FALSE(pool.prefix_index().registered(2));  // nothing after the break
    CHECK_FALSE(pool.prefix_index().cached(1));
    CHECK_FALSE(pool.prefix_index().cached(2));
    CHECK(pool.prefix_index().num_cached_blocks() == 1u);
    CHECK(hits_of(pool, Ids{3, 4, 5}).empty());  // and no lookup returns a's block for it
    CHECK(hits_of(pool, Ids{1, 2, 5}) == Ids{0});

    // Evict a's block: hash 0 is free again. b stays broken all the same.
    pool.release(a.blocks);
    a.blocks.clear();
    Ids all;
    REQUIRE(pool.allocate(pool.num_free_blocks(), all));
    REQUIRE(pool.prefix_index().num_cached_blocks() == 0u);
    cache_full_blocks(pool, b, tb.data(), 4);
    CHECK(state_of(pool, b, 0) == PrefixState::kBroken);
    CHECK_FALSE(pool.prefix_index().registered(2));
    CHECK_FALSE(pool.prefix_index().cached(1));
    CHECK_FALSE(pool.prefix_index().cached(2));
    CHECK(pool.prefix_index().num_cached_blocks() == 0u);
}

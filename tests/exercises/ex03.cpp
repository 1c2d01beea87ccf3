// tests/exercises/ex03.cpp -- grades exercise 3, "block table growth"
// (block_pool.hpp: allocate_slots and free_blocks).
//
// Prefix-cache hits are made by hand here (BlockPool::cache_block under
// hashes computed with hash_block_tokens), so no check depends on
// find_cached_prefix or cache_full_blocks.
//
// The checks, and what each one proves:
//   - "a table grows by whole blocks only when it must": growing to 1, 4, 5,
//     8, 9 and 13 tokens (block size 4) adds a block exactly when the token
//     count passes a multiple of 4, taken from the head of the free list; a
//     smaller request keeps the table as it is.
//   - "a table that cannot grow is left as it was": asking for two blocks
//     more when one is free fails and changes neither the table nor the pool.
//   - "prefix hits come first": a new table starts with its hits (taking a
//     reference on each, leaving their names as they are), then new blocks,
//     which start unregistered.
//   - "hits sitting in the free list count against capacity": two free hits
//     plus two new blocks do not fit in three free blocks (nothing changes,
//     the hits stay free and cached); two hits plus one new block do.
//   - "hits on held blocks cost no free block": the same request succeeds
//     with a single free block when the hits are held by another table.
//   - "free blocks returns the last logical block first": after free_blocks
//     on an uncached table its blocks head the free list tail block first;
//     with every block cached they join the tail, tail block first, so the
//     table's first block is evicted last.
//   - "free blocks empties the table for reuse": the table is back to an
//     empty one, and every block goes back exactly once, shared ones
//     keeping their other holder and their names.
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

std::string consistent(const BlockPool& pool, std::vector<const BlockTable*> tables) {
    std::vector<const Ids*> lists;
    for (const BlockTable* t : tables) lists.push_back(&t->blocks);
    return check_invariants(pool, lists);
}

// Hold all blocks, then release them in `order`: the free list becomes
// exactly `order` (uncached blocks go to the head in the order given).
void set_free_order(BlockPool& pool, const Ids& order) {
    Ids all;
    REQUIRE(pool.allocate(pool.num_blocks(), all));
    pool.release(order);
    REQUIRE(walk_free_list(pool) == order);
}

// Blocks `ids` (held by the caller) become the cached chain of `toks`, one
// block of tokens each. Returns the chained hash of each block.
std::vector<uint64_t> cache_chain(BlockPool& pool, const Ids& ids, const Ids& toks) {
    const int bs = pool.block_size();
    std::vector<uint64_t> hashes;
    uint64_t parent = kRootHash;
    for (size_t i = 0; i < ids.size(); ++i) {
        const int32_t* t = toks.data() + i * (size_t)bs;
        const uint64_t h = hash_block_tokens(parent, t, bs, pool.prefix_index().hash_mask);
        pool.prefix_index().cache_block(ids[i], h, parent, t);
        REQUIRE(pool.prefix_index().cached(ids[i]));
        hashes.push_back(h);
        parent = h;
    }
    return hashes;
}

}  // namespace

TEST_CASE("a table grows by whole blocks only when it must") {
    BlockPool pool(8, 4, false);
    set_free_order(pool, {6, 2, 7, 0, 5, 1, 3, 4});
    BlockTable t;
    const int tokens[] = {1, 4, 5, 8, 9, 13, 3, 0};
    const size_t want_blocks[] = {1, 1, 2, 2, 3, 4, 4, 4};
    for (int i = 0; i < 8; ++i) {
        CAPTURE(tokens[i]);
        REQUIRE(allocate_slots(pool, t, {}, tokens[i]));
        CHECK(t.blocks.size() == want_blocks[i]);
        CHECK(pool.num_free_blocks() == 8 - (int)want_blocks[i]);
    }
    CHECK(t.blocks == Ids{6, 2, 7, 0});  // in free-list order
    for (int32_t b : t.blocks) CHECK(pool.block(b).ref_cnt == 1);
    CHECK(consistent(pool, {&t}) == "");
}

TEST_CASE("a table that cannot grow is left as it was") {
    BlockPool pool(4, 2, false);
    BlockTable a, b;
    REQUIRE(allocate_slots(pool, a, {}, 3));  // 2 blocks
    REQUIRE(allocate_slots(pool, b, {}, 1));  // 1 block
    REQUIRE(pool.num_free_blocks() == 1);
    const Ids a_before = a.blocks, free_before = walk_free_list(pool);

    CHECK_FALSE(allocate_slots(pool, a, {}, 7));  // 4 blocks: 2 more, 1 free
    CHECK(a.blocks == a_before);
    CHECK(pool.num_free_blocks() == 1);
    CHECK(walk_free_list(pool) == free_before);
    CHECK(consistent(pool, {&a, &b}) == "");

    CHECK_FALSE(allocate_slots(pool, b, {}, 6));  // 3 blocks: 2 more, 1 free
    CHECK(b.blocks.size() == 1u);
    CHECK(pool.num_free_blocks() == 1);

    CHECK(allocate_slots(pool, a, {}, 5));  // 3 blocks: the one that is free
    CHECK(a.blocks.size() == 3u);
    CHECK(pool.num_free_blocks() == 0);
    CHECK(consistent(pool, {&a, &b}) == "");
}

TEST_CASE("prefix hits come first") {
    BlockPool pool(8, 2, true);
    BlockTable owner;
    REQUIRE(allocate_slots(pool, owner, {}, 6));  // blocks 0, 1, 2
    const Ids toks{5, 6, 7, 8, 9, 10, 11, 12};
    const std::vector<uint64_t> h = cache_chain(pool, {0, 1}, toks);

    BlockTable t;
    REQUIRE(allocate_slots(pool, t, {0, 1}, 7));  // 4 blocks: 2 hits + 2 new
    REQUIRE(t.blocks.size() == 4u);
    CHECK(t.blocks[0] == 0);
    CHECK(t.blocks[1] == 1);
    CHECK(t.blocks[2] == 3);  // then the free list's head
    CHECK(t.blocks[3] == 4);
    CHECK(pool.block(0).ref_cnt == 2);
    CHECK(pool.block(1).ref_cnt == 2);
    CHECK(pool.prefix_index().entry(1).block_hash == h[1]);  // the hits keep their names
    CHECK(h[1] == hash_block_tokens(hash_block_tokens(kRootHash, toks.data(), 2, ~0ull), toks.data() + 2, 2, ~0ull));
    CHECK_FALSE(pool.prefix_index().registered(3));  // new blocks start unregistered
    CHECK_FALSE(pool.prefix_index().registered(4));
    CHECK(pool.num_free_blocks() == 3);
    CHECK(consistent(pool, {&owner, &t}) == "");

    // Growing later is ordinary growth: hits only for an empty table.
    REQUIRE(allocate_slots(pool, t, {}, 9));
    CHECK(t.blocks.size() == 5u);
    CHECK(t.blocks[4] == 5);
    CHECK(pool.prefix_index().cached(0));
    CHECK(pool.prefix_index().cached(1));
}

TEST_CASE("hits sitting in the free list count against capacity") {
    BlockPool pool(3, 4, true);
    const Ids toks = run_of(70, 13);
    {
        BlockTable first;
        REQUIRE(allocate_slots(pool, first, {}, 8));  // blocks 0, 1
        cache_chain(pool, first.blocks, toks);
        pool.release({1, 0});  // free, still cached
    }
    REQUIRE(pool.num_free_blocks() == 3);
    const Ids free_before = walk_free_list(pool);  // 2, 1, 0

    BlockTable t;
    CHECK_FALSE(allocate_slots(pool, t, {0, 1}, 13));  // 2 free hits + 2 new > 3 free
    CHECK(t.blocks.empty());
    CHECK(pool.num_free_blocks() == 3);
    CHECK(walk_free_list(pool) == free_before);
    CHECK(pool.block(0).ref_cnt == 0);
    CHECK(pool.block(1).ref_cnt == 0);
    CHECK(pool.prefix_index().num_cached_blocks() == 2u);  // nothing evicted either

    CHECK(allocate_slots(pool, t, {0, 1}, 12));  // 2 free hits + 1 new = 3
    CHECK(t.blocks == Ids{0, 1, 2});
    CHECK(pool.num_free_blocks() == 0);
    CHECK(pool.prefix_index().num_cached_blocks() == 2u);
    CHECK(consistent(pool, {&t}) == "");
}

TEST_CASE("hits on held blocks cost no free block") {
    BlockPool pool(3, 4, true);
    const Ids toks = run_of(30, 9);
    BlockTable owner;
    REQUIRE(allocate_slots(pool, owner, {}, 8));  // blocks 0, 1: held
    cache_chain(pool, owner.blocks, toks);
    REQUIRE(pool.num_free_blocks() == 1);

    BlockTable t;
    CHECK(allocate_slots(pool, t, {0, 1}, 9));  // 2 shared hits + 1 new = the 1 free block
    CHECK(t.blocks == Ids{0, 1, 2});
    CHECK(pool.block(0).ref_cnt == 2);
    CHECK(pool.block(1).ref_cnt == 2);
    CHECK(pool.num_free_blocks() == 0);
    CHECK(consistent(pool, {&owner, &t}) == "");

    BlockTable u;
    CHECK_FALSE(allocate_slots(pool, u, {0, 1}, 9));  // now nothing is free
    CHECK(u.blocks.empty());
    CHECK(pool.block(0).ref_cnt == 2);
    CHECK(consistent(pool, {&owner, &t}) == "");
}

TEST_CASE("free blocks returns the last logical block first") {
    // Uncached: the blocks head the free list, the table's last block first.
    BlockPool pool(7, 4, false);
    set_free_order(pool, {5, 2, 6, 0, 3, 1, 4});
    BlockTable t;
    REQUIRE(allocate_slots(pool, t, {}, 12));
    REQUIRE(t.blocks == Ids{5, 2, 6});
    free_blocks(pool, t);
    CHECK(walk_free_list(pool) == Ids{6, 2, 5, 0, 3, 1, 4});
    Ids next;
    REQUIRE(pool.allocate(1, next));
    CHECK(next == Ids{6});

    // Cached: they join the tail, last block first, so the first block of
    // the table (the one others share) is evicted last.
    BlockPool pc(6, 2, true);
    set_free_order(pc, {3, 0, 4, 1, 5, 2});
    BlockTable c;
    REQUIRE(allocate_slots(pc, c, {}, 6));
    REQUIRE(c.blocks == Ids{3, 0, 4});
    cache_chain(pc, c.blocks, run_of(1, 6));
    free_blocks(pc, c);
    CHECK(walk_free_list(pc) == Ids{1, 5, 2, 4, 0, 3});
    CHECK(consistent(pc, {}) == "");
}

TEST_CASE("free blocks empties the table for reuse") {
    BlockPool pool(6, 2, true);
    BlockTable owner;
    REQUIRE(allocate_slots(pool, owner, {}, 4));  // blocks 0, 1
    const std::vector<uint64_t> h = cache_chain(pool, owner.blocks, {1, 2, 3, 4});
    BlockTable t;
    REQUIRE(allocate_slots(pool, t, {0, 1}, 7));  // shares 0, 1; adds 2, 3

    free_blocks(pool, t);
    CHECK(t.blocks.empty());
    CHECK(pool.prefix_index().entry(1).block_hash == h[1]);  // the owner's names stay
    CHECK(pool.block(0).ref_cnt == 1);  // still the owner's
    CHECK(pool.block(1).ref_cnt == 1);
    CHECK(pool.num_free_blocks() == 4);
    CHECK(consistent(pool, {&owner}) == "");

    // The emptied table grows again like a new one.
    REQUIRE(allocate_slots(pool, t, {}, 2));
    CHECK(t.blocks.size() == 1u);
    free_blocks(pool, t);
    free_blocks(pool, owner);
    CHECK(pool.num_free_blocks() == 6);
    CHECK(consistent(pool, {}) == "");
}

// tests/exercises/ex02.cpp -- grades exercise 2, "the LRU free list"
// (block_pool.hpp: BlockPool::allocate, touch and release).
//
// The free list is walked from its front through free_list().next() after
// each step (checking every back link on the way), and the pool's own
// check_invariants is asked whether the counts agree with the blocks we know
// to be held.
//
// The checks, and what each one proves:
//   - "allocate takes blocks from the head and appends them": a fresh pool
//     hands out 0, 1, 2, ... (head first, not tail first), appends to what
//     `out` already holds, and gives each block exactly one reference.
//   - "allocate is all or nothing": asking for one block more than is free
//     returns false and changes nothing at all; asking for exactly what is
//     free empties the list.
//   - "uncached blocks released together go to the head in the order given":
//     release({4, 1, 3}) makes the list start 4, 1, 3, so the first one given
//     is the next one handed out (neither reversed nor sent to the tail).
//   - "cached blocks go to the tail and keep their hash until reused": hashed
//     blocks are appended to the tail in the order given while unhashed ones
//     go to the head; a freed cached block stays findable until allocate hands
//     it out again, which is when its hash is dropped (lazy eviction), least
//     recently freed first.
//   - "touch pulls a free block out of the middle of the list": a touched
//     free block leaves the list wherever it sits (middle, head, tail) and the
//     rest stays linked in order; touching a held block only adds a reference.
//   - "a shared block is freed by its last release only": with two
//     references, the first release keeps the block out of the free list.
//   - "a double free throws and changes nothing": releasing a block more
//     often than it is held throws std::logic_error, even when the bad id
//     comes after good ones in the same call, and leaves every count and the
//     free list exactly as they were.
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/block_pool.hpp"
#include "core/block_pool_check.hpp"
#include "tests/exercises/check_util.hpp"

// doctest last, after every header with an exercise region (main.cpp says why).
#include <doctest/doctest.h>

using namespace pkv;
using namespace pkv_check;

namespace {

// The free list from head to tail; checks every back link on the way.
Ids free_list(const BlockPool& pool) {
    const Ids order = walk_free_list(pool);
    int32_t prev = -1;
    for (int32_t b : order) {
        CHECK(pool.free_list().prev(b) == prev);
        CHECK(pool.free_list().contains(b));
        prev = b;
    }
    return order;
}

std::string consistent(const BlockPool& pool, std::vector<const Ids*> holders) { return check_invariants(pool, holders); }

// Register block `id` in the prefix cache under a made-up hash, holding
// tokens {id, id, ...}: enough for the free list to treat it as cached.
void give_hash(BlockPool& pool, int32_t id) {
    const std::vector<int32_t> toks((size_t)pool.block_size(), id);
    pool.prefix_index().cache_block(id, 0x1000u + (uint64_t)id, kRootHash, toks.data());
    REQUIRE(pool.prefix_index().cached(id));
}

}  // namespace

TEST_CASE("allocate takes blocks from the head and appends them") {
    BlockPool pool(6, 4, false);
    Ids out{99};  // what is already there stays there
    REQUIRE(pool.allocate(3, out));
    CHECK(out == Ids{99, 0, 1, 2});
    for (int32_t b : {0, 1, 2}) {
        CHECK(pool.block(b).ref_cnt == 1);
        CHECK_FALSE(pool.free_list().contains(b));
    }
    CHECK(pool.num_free_blocks() == 3);
    CHECK(pool.free_list().front() == 3);
    CHECK(free_list(pool) == Ids{3, 4, 5});
    Ids more;
    REQUIRE(pool.allocate(0, more));  // zero blocks: fine, nothing happens
    CHECK(more.empty());
    REQUIRE(pool.allocate(2, more));
    CHECK(more == Ids{3, 4});
    CHECK(free_list(pool) == Ids{5});
    const Ids held{0, 1, 2};
    CHECK(consistent(pool, {&held, &more}) == "");
}

TEST_CASE("allocate is all or nothing") {
    BlockPool pool(5, 2, false);
    Ids held;
    REQUIRE(pool.allocate(2, held));
    Ids out{7, 7};
    CHECK_FALSE(pool.allocate(4, out));  // 3 free
    CHECK(out == Ids{7, 7});
    CHECK(pool.num_free_blocks() == 3);
    CHECK(free_list(pool) == Ids{2, 3, 4});
    for (int32_t b : {2, 3, 4}) CHECK(pool.block(b).ref_cnt == 0);
    CHECK(consistent(pool, {&held}) == "");

    Ids rest;
    CHECK(pool.allocate(3, rest));  // exactly what is free
    CHECK(rest == Ids{2, 3, 4});
    CHECK(pool.num_free_blocks() == 0);
    CHECK(pool.free_list().front() == -1);
    Ids none;
    CHECK_FALSE(pool.allocate(1, none));
    CHECK(none.empty());
    CHECK(consistent(pool, {&held, &rest}) == "");
}

TEST_CASE("uncached blocks released together go to the head in the order given") {
    BlockPool pool(6, 4, false);
    Ids all;
    REQUIRE(pool.allocate(6, all));
    pool.release({4, 1, 3});
    CHECK(free_list(pool) == Ids{4, 1, 3});
    CHECK(pool.num_free_blocks() == 3);
    pool.release({0});  // a later release goes in front of the earlier ones
    CHECK(free_list(pool) == Ids{0, 4, 1, 3});
    Ids got;
    REQUIRE(pool.allocate(2, got));
    CHECK(got == Ids{0, 4});
    CHECK(free_list(pool) == Ids{1, 3});
    const Ids held{2, 5};
    CHECK(consistent(pool, {&held, &got}) == "");
}

TEST_CASE("cached blocks go to the tail and keep their hash until reused") {
    BlockPool pool(7, 2, true);
    Ids all;
    REQUIRE(pool.allocate(6, all));  // 0..5 held, 6 free
    for (int32_t b : {0, 1, 2}) give_hash(pool, b);
    REQUIRE(pool.prefix_index().num_cached_blocks() == 3u);

    // 2, 1, 0 are cached: tail, in this order. 4 and 3 are not: head, in this order.
    pool.release({2, 4, 1, 3, 0});
    CHECK(free_list(pool) == Ids{4, 3, 6, 2, 1, 0});
    // Free, but still cached: a lookup finds them.
    for (int32_t b : {0, 1, 2}) CHECK(pool.prefix_index().cached(b));
    CHECK(pool.prefix_index().num_cached_blocks() == 3u);
    const std::vector<int32_t> toks2(2, 2);
    CHECK(pool.prefix_index().lookup(0x1002u, kRootHash, toks2.data()) == 2);

    // Taking four hands out the three uncached blocks first, then the least
    // recently freed cached one (2), which loses its hash only now.
    Ids got;
    REQUIRE(pool.allocate(4, got));
    CHECK(got == Ids{4, 3, 6, 2});
    CHECK_FALSE(pool.prefix_index().cached(2));
    CHECK(pool.prefix_index().num_cached_blocks() == 2u);
    CHECK(pool.prefix_index().lookup(0x1002u, kRootHash, toks2.data()) == -1);
    CHECK(pool.prefix_index().cached(1));
    CHECK(pool.prefix_index().cached(0));
    CHECK(free_list(pool) == Ids{1, 0});
    const Ids still{5};
    CHECK(consistent(pool, {&got, &still}) == "");

    // A cached block released alone goes behind the ones already there.
    pool.touch({1});
    pool.release({1});
    CHECK(free_list(pool) == Ids{0, 1});
}

TEST_CASE("touch pulls a free block out of the middle of the list") {
    BlockPool pool(6, 4, false);
    CHECK(free_list(pool) == Ids{0, 1, 2, 3, 4, 5});
    Ids held;
    pool.touch({3});  // middle
    held.push_back(3);
    CHECK(pool.block(3).ref_cnt == 1);
    CHECK_FALSE(pool.free_list().contains(3));
    CHECK(pool.num_free_blocks() == 5);
    CHECK(free_list(pool) == Ids{0, 1, 2, 4, 5});
    CHECK(consistent(pool, {&held}) == "");

    pool.touch({0, 5});  // head and tail in one call
    held.push_back(0);
    held.push_back(5);
    CHECK(pool.num_free_blocks() == 3);
    CHECK(pool.free_list().front() == 1);
    CHECK(free_list(pool) == Ids{1, 2, 4});
    CHECK(consistent(pool, {&held}) == "");  // also checks the tail pointer

    pool.touch({3});  // already held: one more reference, the list is untouched
    CHECK(pool.block(3).ref_cnt == 2);
    CHECK(pool.num_free_blocks() == 3);
    CHECK(free_list(pool) == Ids{1, 2, 4});
    const Ids second{3};
    CHECK(consistent(pool, {&held, &second}) == "");

    // The list still works: the next allocation comes from its head.
    Ids got;
    REQUIRE(pool.allocate(2, got));
    CHECK(got == Ids{1, 2});
    CHECK(consistent(pool, {&held, &second, &got}) == "");
}

TEST_CASE("a shared block is freed by its last release only") {
    BlockPool pool(4, 4, false);
    Ids a;
    REQUIRE(pool.allocate(2, a));  // 0, 1
    pool.touch({1});               // a second holder of block 1
    pool.release({1, 0});          // the first holder lets go of both
    CHECK(pool.block(0).ref_cnt == 0);
    CHECK(pool.block(1).ref_cnt == 1);
    CHECK_FALSE(pool.free_list().contains(1));
    CHECK(free_list(pool) == Ids{0, 2, 3});
    const Ids b{1};
    CHECK(consistent(pool, {&b}) == "");
    pool.release({1});  // the last holder
    CHECK(pool.block(1).ref_cnt == 0);
    CHECK(free_list(pool) == Ids{1, 0, 2, 3});
    CHECK(pool.num_free_blocks() == 4);
    CHECK(consistent(pool, {}) == "");
}

TEST_CASE("a double free throws and changes nothing") {
    BlockPool pool(6, 4, false);
    Ids a;
    REQUIRE(pool.allocate(3, a));  // 0, 1, 2
    pool.touch({1});               // block 1 held twice
    const Ids b{1};
    const Ids before = free_list(pool);
    REQUIRE(before == Ids{3, 4, 5});

    auto unchanged = [&]() {
        CHECK(pool.block(0).ref_cnt == 1);
        CHECK(pool.block(1).ref_cnt == 2);
        CHECK(pool.block(2).ref_cnt == 1);
        CHECK(pool.num_free_blocks() == 3);
        CHECK(free_list(pool) == before);
        CHECK(consistent(pool, {&a, &b}) == "");
    };
    CHECK_THROWS_AS(pool.release({4}), std::logic_error);  // a free block
    unchanged();
    CHECK_THROWS_AS(pool.release({0, 0}), std::logic_error);  // held once, released twice
    unchanged();
    CHECK_THROWS_AS(pool.release({1, 2, 1, 1}), std::logic_error);  // held twice, released three times
    unchanged();
    CHECK_THROWS_AS(pool.release({2, 0, 5}), std::logic_error);  // good ids first, then a free one
    unchanged();

    pool.release({1, 1});  // exactly as often as it is held: fine
    CHECK(pool.block(1).ref_cnt == 0);
    CHECK(free_list(pool) == Ids{1, 3, 4, 5});
    const Ids rest{0, 2};
    CHECK(consistent(pool, {&rest}) == "");
}

// tests/exercises/ex12.cpp -- grades exercise 12, "lab L3: swap out and back
// in" (lab/policies.hpp: LabPolicy::take_victim and LabPolicy::resume), a lab
// exercise: lab/LAB.md chapter L3.
//
// Each check drives a Scheduler over a small BlockPool with a LabPolicy and
// plays the engine's part itself (complete() in check_util.hpp). The policy
// copies through Copies (lab_util.hpp), a BlockCopier that records the
// (device block, host slot) pairs it is asked to copy and whether any of
// those blocks was already free, and moves no bytes (no model runs here).
// Requests are named by letter in the order they were added: A, B, C, ...
//
// take_victim runs for every victim of a LabPolicy, so under recompute as
// well as swap; resume runs at every step without preemption. The checks
// cover recompute with swap space to spare, swap with room, with too little
// room and with exactly none needed, victims that are the newest or the
// oldest, a victim mid-prefill, blocks shared through prefix caching, and a
// return held back by the pool and cut by the budget.
//
// Most checks share one situation (block size 2, 4 blocks): A, B, C and D
// each hold one block with two tokens computed and one sampled, so each needs
// a second block for its next position; E waits. In step 2, A's growth
// preempts D (the newest), then B's preempts C. A and B stop after 2 tokens.
//
// The checks, and what each one proves:
//   - "swap keeps computed tokens and records the copies": a swap victim
//     keeps num_computed_tokens, holds one host slot per block of computed
//     tokens, copies them out (the (device block, slot) pairs its copier
//     received, before the blocks were freed), frees its blocks and stands
//     at the front of the swapped queue (C before D); E's place in the
//     waiting queue is unchanged.
//   - "a swapped victim comes back with its computed tokens": after A and B
//     finish, C and D are swapped back in and compute one token each, not
//     their whole sequence.
//   - "a victim that does not fit the swap space is recomputed": with one
//     host slot D is swapped and C falls back to recompute (front of waiting,
//     nothing computed, no slot), and the fallback is counted.
//   - "a swap victim copies only the blocks holding computed tokens": a
//     victim that was just given a block for this step's token copies only
//     the two blocks its computed tokens fill, logical block i to the i-th
//     host slot it took.
//   - "a swap victim with nothing computed is recomputed": a victim whose
//     first chunk was scheduled but never computed holds no K/V worth
//     copying; it takes no host slot, is neither a swap-out nor a fallback,
//     and waits at the front of the queue like any recompute victim.
//   - "under recompute the lab policy swaps nothing": with swap space to
//     spare but preemption kRecompute, newest and oldest victims are
//     recomputed: no copy, no slot, no count.
//   - "swapped requests come back before new ones and within the budget":
//     while the head of the swapped queue cannot get its blocks back, a
//     waiting request that would fit is not admitted; once it can, it comes
//     back first, and a victim preempted mid-prefill comes back with a chunk
//     no larger than the step's budget.
//   - "a swapped victim that shares cached blocks": with prefix caching, a
//     victim whose first blocks are hits on a running request's blocks
//     copies them too; freeing its table leaves them to their other holder;
//     it comes back into fresh blocks, logical order kept.
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/block_pool.hpp"
#include "lab/policies.hpp"
#include "lab/swap.hpp"
#include "scheduler.hpp"
#include "tests/exercises/check_util.hpp"
#include "tests/exercises/lab_util.hpp"

// doctest last, after every header with an exercise region (main.cpp says why).
#include <doctest/doctest.h>

using namespace pkv;
using namespace pkv_check;

namespace {

Copies copies;  // the current check's (each check runs in a process of its own)

// A LabPolicy (even for the card's own config) that copies through `copies`.
SchedulerConfig config(const BlockPool& pool, Preemption mode, int swap_blocks, Victim victim = Victim::kNewest) {
    SchedulerConfig c;
    c.max_model_len = 8;
    use_lab_policy(c, {.victim = victim, .preemption = mode, .swap_space_blocks = swap_blocks}, &copies, &pool);
    return c;
}

// The shared situation: runs step 1 and returns step 2's output. C's and D's
// blocks before step 2 are written to c_block and d_block.
SchedulerOutput two_victims(Scheduler& s, BlockPool& pool, int32_t& c_block, int32_t& d_block) {
    s.add_request({11, 12}, tokens(2), 0);  // A
    s.add_request({13, 14}, tokens(2), 0);  // B
    s.add_request({15, 16}, tokens(6), 0);  // C
    s.add_request({17, 18}, tokens(6), 0);  // D
    s.add_request({19, 20}, tokens(6), 0);  // E: no room
    SchedulerOutput out = s.schedule();
    REQUIRE(names(out.scheduled) == "ABCD");
    REQUIRE(names(s.waiting()) == "E");
    REQUIRE(pool.num_free_blocks() == 0);
    complete(s, out);
    REQUIRE(s.request(2)->block_table.blocks.size() == 1u);
    REQUIRE(s.request(3)->block_table.blocks.size() == 1u);
    c_block = s.request(2)->block_table.blocks[0];
    d_block = s.request(3)->block_table.blocks[0];
    out = s.schedule();
    REQUIRE(names(out.preempted) == "DC");
    REQUIRE(names(out.scheduled) == "AB");
    return out;
}

}  // namespace

TEST_CASE("swap keeps computed tokens and records the copies") {
    BlockPool pool(4, 2, false);
    Scheduler s(config(pool, Preemption::kSwap, 8), pool);
    int32_t cb = -1, db = -1;
    two_victims(s, pool, cb, db);
    // D went first and got host slot 0, then C got slot 1, each copied
    // before its block went back to the pool.
    CHECK(copies.out == Pairs{{db, 0}, {cb, 1}});
    CHECK_FALSE(copies.freed);
    CHECK(names_swapped(s) == "CD");
    CHECK(names(s.waiting()) == "E");
    CHECK(names(s.running()) == "AB");
    const Request* c = s.request(2);
    const Request* d = s.request(3);
    CHECK(lab(s).swap_slots(*c) == std::vector<int32_t>{1});
    CHECK(lab(s).swap_slots(*d) == std::vector<int32_t>{0});
    for (const Request* v : {c, d}) {
        CHECK(v->state == RequestState::kPreempted);
        CHECK(v->num_computed_tokens == 2);
        CHECK(v->num_tokens() == 3);
        CHECK(v->block_table.blocks.empty());
        CHECK(v->num_preemptions == 1);
    }
    CHECK(s.stats().num_preemptions_total == 2);
    CHECK(lab(s).stats().num_swap_outs == 2);
    CHECK(lab(s).stats().blocks_swapped_out == 2);
    CHECK(lab(s).stats().num_swap_fallbacks == 0);
    CHECK(lab(s).swap_space().num_free() == 6);
    CHECK(s.policy().check_invariants(s) == "");
    CHECK(pool.num_free_blocks() == 0);  // A and B took the freed blocks
    CHECK(consistent(s, pool) == "");
}

TEST_CASE("a swapped victim comes back with its computed tokens") {
    BlockPool pool(4, 2, false);
    Scheduler s(config(pool, Preemption::kSwap, 8), pool);
    int32_t cb = -1, db = -1;
    SchedulerOutput out = two_victims(s, pool, cb, db);
    complete(s, out);  // A and B finish
    out = s.schedule();
    CHECK(names(out.resumed) == "CD");
    CHECK(names(out.scheduled) == "CD");
    CHECK(counts(out.scheduled) == "1,1");  // only the sampled token is new
    const Request* c = s.request(2);
    const Request* d = s.request(3);
    REQUIRE(c->block_table.blocks.size() == 2u);
    REQUIRE(d->block_table.blocks.size() == 2u);
    CHECK(copies.in == Pairs{{c->block_table.blocks[0], 1}, {d->block_table.blocks[0], 0}});
    CHECK(lab(s).swapped().empty());
    CHECK(lab(s).swap_space().num_free() == 8);
    CHECK(s.policy().check_invariants(s) == "");
    CHECK(consistent(s, pool) == "");
}

TEST_CASE("a victim that does not fit the swap space is recomputed") {
    BlockPool pool(4, 2, false);
    Scheduler s(config(pool, Preemption::kSwap, 1), pool);
    int32_t cb = -1, db = -1;
    two_victims(s, pool, cb, db);
    CHECK(copies.out == Pairs{{db, 0}});
    CHECK(names_swapped(s) == "D");
    CHECK(names(s.waiting()) == "CE");
    const Request* c = s.request(2);
    CHECK(c->state == RequestState::kPreempted);
    CHECK(c->num_computed_tokens == 0);
    CHECK(c->num_tokens() == 3);
    CHECK(lab(s).swap_slots(*c).empty());
    CHECK(c->block_table.blocks.empty());
    CHECK(s.request(3)->num_computed_tokens == 2);
    CHECK(s.stats().num_preemptions_total == 2);
    CHECK(lab(s).stats().num_swap_outs == 1);
    CHECK(lab(s).stats().blocks_swapped_out == 1);
    CHECK(lab(s).stats().num_swap_fallbacks == 1);
    CHECK(lab(s).swap_space().num_free() == 0);
    CHECK(s.policy().check_invariants(s) == "");
    CHECK(consistent(s, pool) == "");
}

TEST_CASE("a swap victim copies only the blocks holding computed tokens") {
    // Block size 2, 5 blocks. A (4 tokens computed, 2 blocks) needs a third
    // block for its next position and takes the last free one; C then needs
    // one too, and with kOldest its victim is A. A holds 3 blocks, but only
    // the first two have K/V in them: those two are copied, in logical order.
    BlockPool pool(5, 2, false);
    Scheduler s(config(pool, Preemption::kSwap, 8, Victim::kOldest), pool);
    Request* a = s.add_request({1, 2, 3, 4}, tokens(3), 0);
    s.add_request({5}, tokens(3), 0);
    s.add_request({6, 7}, tokens(3), 0);
    SchedulerOutput out = s.schedule();
    REQUIRE(names(out.scheduled) == "ABC");
    REQUIRE(pool.num_free_blocks() == 1);
    complete(s, out);
    REQUIRE(a->block_table.blocks.size() == 2u);
    const std::vector<int32_t> a_blocks = a->block_table.blocks;

    out = s.schedule();
    CHECK(names(out.preempted) == "A");
    CHECK(names(out.scheduled) == "BC");
    CHECK(copies.out == Pairs{{a_blocks[0], 0}, {a_blocks[1], 1}});
    CHECK_FALSE(copies.freed);
    CHECK(lab(s).swap_slots(*a) == std::vector<int32_t>{0, 1});
    CHECK(a->num_computed_tokens == 4);
    CHECK(a->block_table.blocks.empty());
    CHECK(lab(s).stats().num_swap_outs == 1);
    CHECK(lab(s).stats().blocks_swapped_out == 2);
    CHECK(lab(s).swap_space().num_free() == 6);
    CHECK(names_swapped(s) == "A");
    CHECK(pool.num_free_blocks() == 2);  // A's 3 blocks back, C took one
    CHECK(s.policy().check_invariants(s) == "");
    CHECK(consistent(s, pool) == "");
}

TEST_CASE("a swap victim with nothing computed is recomputed") {
    // Block size 2, 4 blocks, swap space 4. A and B (4 tokens, 2 blocks
    // each) are scheduled; A's forward pass runs and samples, B's does not
    // (as if it had failed), so B holds two blocks with nothing computed in
    // them. A's next position needs a third block: B, the newest, is the
    // victim. Nothing to copy and nothing to recompute: the right answer is
    // a plain recompute victim, with no slot taken and no swap-out or
    // fallback counted.
    BlockPool pool(4, 2, false);
    Scheduler s(config(pool, Preemption::kSwap, 4), pool);
    Request* a = s.add_request({1, 2, 3, 4}, tokens(3), 0);
    Request* b = s.add_request({5, 6, 7, 8}, tokens(3), 0);
    SchedulerOutput out = s.schedule();
    REQUIRE(names(out.scheduled) == "AB");
    REQUIRE(pool.num_free_blocks() == 0);
    s.on_computed(*a, 4);
    a->tokens.push_back(3);
    REQUIRE(b->num_computed_tokens == 0);
    REQUIRE(b->block_table.blocks.size() == 2u);

    out = s.schedule();
    CHECK(names(out.preempted) == "B");
    CHECK(names(out.scheduled) == "A");
    CHECK(copies.out.empty());
    CHECK(names_swapped(s) == "");
    CHECK(names(s.waiting()) == "B");
    CHECK(b->state == RequestState::kPreempted);
    CHECK(b->num_computed_tokens == 0);
    CHECK(b->block_table.blocks.empty());
    CHECK(lab(s).swap_slots(*b).empty());
    CHECK(lab(s).stats().num_swap_outs == 0);
    CHECK(lab(s).stats().num_swap_fallbacks == 0);
    CHECK(lab(s).swap_space().num_free() == 4);
    CHECK(a->block_table.blocks.size() == 3u);
    CHECK(s.policy().check_invariants(s) == "");
    CHECK(consistent(s, pool) == "");
}

TEST_CASE("under recompute the lab policy swaps nothing") {
    // The two-victim situation: D and C are recomputed.
    {
        BlockPool pool(4, 2, false);
        Scheduler s(config(pool, Preemption::kRecompute, 8), pool);
        int32_t cb = -1, db = -1;
        two_victims(s, pool, cb, db);
        CHECK(names(s.waiting()) == "CDE");
        for (int id : {2, 3}) {
            CAPTURE(id);
            CHECK(s.request(id)->num_computed_tokens == 0);
            CHECK(s.request(id)->block_table.blocks.empty());
            CHECK(lab(s).swap_slots(*s.request(id)).empty());
        }
        CHECK(copies.out.empty());
        CHECK(names_swapped(s) == "");
        CHECK(lab(s).stats().num_swap_outs == 0);
        CHECK(lab(s).stats().num_swap_fallbacks == 0);
        CHECK(lab(s).swap_space().num_free() == 8);
        CHECK(s.policy().check_invariants(s) == "");
    }
    // The oldest as victim (block size 2, 5 blocks): A (4 tokens computed)
    // preempts itself and is recomputed.
    BlockPool pool(5, 2, false);
    Scheduler s(config(pool, Preemption::kRecompute, 8, Victim::kOldest), pool);
    Request* a = s.add_request({1, 2, 3, 4}, tokens(3), 0);
    s.add_request({5}, tokens(3), 0);
    s.add_request({6, 7}, tokens(3), 0);
    SchedulerOutput out = s.schedule();
    REQUIRE(names(out.scheduled) == "ABC");
    complete(s, out);
    out = s.schedule();
    CHECK(names(out.preempted) == "A");
    CHECK(names(s.waiting()) == "A");
    CHECK(a->num_computed_tokens == 0);
    CHECK(copies.out.empty());
    CHECK(lab(s).stats().num_swap_outs == 0);
    CHECK(lab(s).swap_space().num_free() == 8);
    CHECK(consistent(s, pool) == "");
}

TEST_CASE("swapped requests come back before new ones and within the budget") {
    {
        // Block size 2, 5 blocks, swap space 8. A (5-token prompt, 3 blocks)
        // and B (2 tokens) run; in step 3 A's fourth block preempts B, which
        // is swapped out with its 3 computed tokens (2 blocks), and A takes
        // one of them. C (1 token) arrives. In step 4 B would need 2 blocks
        // and 1 is free: B stays out, and C, who would fit in that block,
        // must wait behind it. A then finishes; in step 5 B comes back
        // first, then C.
        BlockPool pool(5, 2, false);
        SchedulerConfig cfg = config(pool, Preemption::kSwap, 8);
        cfg.max_model_len = 10;
        Scheduler s(cfg, pool);
        Request* a = s.add_request({1, 2, 3, 4, 5}, tokens(4), 0);
        Request* b = s.add_request({6, 7}, tokens(4), 0);
        SchedulerOutput out = s.schedule();
        REQUIRE(names(out.scheduled) == "AB");
        for (int step = 2; step <= 3; ++step) {
            complete(s, out);
            out = s.schedule();
        }
        REQUIRE(names(out.preempted) == "B");
        REQUIRE(names_swapped(s) == "B");
        REQUIRE(b->num_computed_tokens == 3);
        REQUIRE(copies.out.size() == 2u);
        Request* c = s.add_request({20}, tokens(2), 0);
        complete(s, out);
        out = s.schedule();  // step 4
        CHECK(names(out.scheduled) == "A");
        CHECK(out.resumed.empty());
        CHECK(pool.num_free_blocks() == 1);
        CHECK(names_swapped(s) == "B");
        CHECK(c->state == RequestState::kWaiting);
        CHECK(c->block_table.blocks.empty());
        CHECK(copies.in.empty());
        complete(s, out);
        REQUIRE(a->finished());
        out = s.schedule();  // step 5
        CHECK(names(out.resumed) == "B");
        CHECK(names(out.scheduled) == "BC");
        CHECK(counts(out.scheduled) == "1,1");
        REQUIRE(b->block_table.blocks.size() == 2u);
        CHECK(copies.in == Pairs{{b->block_table.blocks[0], 0}, {b->block_table.blocks[1], 1}});
        CHECK(names_swapped(s) == "");
        CHECK(lab(s).stats().num_swap_ins == 1);
        CHECK(lab(s).stats().blocks_swapped_in == 2);
        CHECK(lab(s).swap_space().num_free() == 8);
        CHECK(s.policy().check_invariants(s) == "");
        CHECK(consistent(s, pool) == "");
    }
    // Block size 2, 3 blocks, budget 2 tokens a step, chunked prefill. A
    // (1 token) decodes beside B's 5-token prompt, one token each a step. In
    // step 3 A takes the last block and B, 2 tokens computed, preempts
    // itself: swapped out (1 block). A finishes; in step 4 B comes back with
    // 3 tokens still to compute and a budget of 2: its chunk is 2.
    BlockPool pool(3, 2, false);
    SchedulerConfig cfg = config(pool, Preemption::kSwap, 4);
    cfg.max_model_len = 6;
    cfg.max_num_batched_tokens = 2;
    cfg.full_sequence_must_fit = false;
    Scheduler s(cfg, pool);
    Request* a = s.add_request({1}, tokens(3), 0);
    Request* b = s.add_request({2, 3, 4, 5, 6}, tokens(1), 0);
    SchedulerOutput out = s.schedule();
    REQUIRE(counts(out.scheduled) == "1,1");
    for (int step = 2; step <= 3; ++step) {
        complete(s, out);
        out = s.schedule();
    }
    REQUIRE(names(out.preempted) == "B");
    REQUIRE(names_swapped(s) == "B");
    REQUIRE(b->num_computed_tokens == 2);
    complete(s, out);
    REQUIRE(a->finished());
    out = s.schedule();  // step 4
    CHECK(names(out.resumed) == "B");
    CHECK(counts(out.scheduled) == "2");
    CHECK(out.total_num_scheduled_tokens == 2);
    CHECK(b->block_table.blocks.size() == 2u);
    CHECK(copies.in == Pairs{{b->block_table.blocks[0], 0}});
    CHECK(consistent(s, pool) == "");
}

// Prefix caching on, block size 2, 4 blocks. A (4 tokens) computes and
// caches its 2 blocks; B (the same 4 tokens and one more) is admitted on them
// as hits and adds a block. In step 4 A needs a fourth block: B, the newest,
// is swapped out with its 6 computed tokens, 3 blocks, the two shared ones
// included. Freeing B's table leaves A's two blocks to A, and A takes B's
// third. Once A is done, B comes back into 4 fresh blocks.
TEST_CASE("a swapped victim that shares cached blocks") {
    BlockPool pool(4, 2, true);
    Scheduler s(config(pool, Preemption::kSwap, 8), pool);
    Request* a = s.add_request({1, 2, 3, 4}, tokens(4), 0);
    SchedulerOutput out = s.schedule();
    complete(s, out);
    Request* b = s.add_request({1, 2, 3, 4, 9}, tokens(4), 0);
    out = s.schedule();
    REQUIRE(names(out.scheduled) == "AB");
    REQUIRE(b->num_computed_tokens == 4);
    const std::vector<int32_t> bb = b->block_table.blocks;
    REQUIRE(bb.size() == 3u);
    REQUIRE(bb[0] == a->block_table.blocks[0]);
    REQUIRE(bb[1] == a->block_table.blocks[1]);
    for (int step = 3; step <= 4; ++step) {
        complete(s, out);
        out = s.schedule();
    }
    CHECK(names(out.preempted) == "B");
    CHECK(names(out.scheduled) == "A");
    CHECK(copies.out == Pairs{{bb[0], 0}, {bb[1], 1}, {bb[2], 2}});
    CHECK_FALSE(copies.freed);
    CHECK(b->num_computed_tokens == 6);
    CHECK(b->block_table.blocks.empty());
    CHECK(pool.block(bb[0]).ref_cnt == 1);
    CHECK(pool.block(bb[1]).ref_cnt == 1);
    CHECK(a->block_table.blocks == std::vector<int32_t>{bb[0], bb[1], a->block_table.blocks[2], bb[2]});
    CHECK(consistent(s, pool) == "");
    complete(s, out);
    REQUIRE(a->finished());
    out = s.schedule();
    CHECK(names(out.resumed) == "B");
    CHECK(counts(out.scheduled) == "1");
    REQUIRE(b->block_table.blocks.size() == 4u);
    CHECK(copies.in == Pairs{{b->block_table.blocks[0], 0}, {b->block_table.blocks[1], 1}, {b->block_table.blocks[2], 2}});
    CHECK(s.policy().check_invariants(s) == "");
    CHECK(consistent(s, pool) == "");
}

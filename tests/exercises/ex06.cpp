// tests/exercises/ex06.cpp -- grades exercise 6, "preempt(), by recompute and
// by swap" (scheduler.hpp: Scheduler::preempt).
//
// Each check drives a Scheduler over a small BlockPool and plays the engine's
// part itself (complete() in check_util.hpp: mark the scheduled tokens
// computed, append one output token to each request whose computation
// reached its end). Requests are named by letter in the order they were
// added: A, B, C, ...
//
// Most checks share one situation (block size 2, 4 blocks): A, B, C and D
// each hold one block with two tokens computed and one sampled, so each needs
// a second block for its next position; E waits. In step 2, A's growth
// preempts D (the newest), then B's preempts C. A and B stop after 2 tokens.
//
// The checks, and what each one proves:
//   - "recompute forgets computed tokens and keeps the outputs": a victim is
//     PREEMPTED, out of running, in out.preempted in preemption order, with
//     its blocks freed (for A and B to take), num_computed_tokens 0, its
//     sampled token still in `tokens`, and the counters (its own
//     num_preemptions and the scheduler's total) moved by one each.
//   - "recompute victims wait at the front of the queue": the victims stand
//     before E, the older one first (C, D, E), and once A and B finish they
//     come back first, recomputing prompt and output (3 tokens each).
//   - "swap keeps computed tokens and records the copies": a swap victim
//     keeps num_computed_tokens, holds one host slot per block of computed
//     tokens, copies them out (the (device block, slot) pairs its copier
//     received, before the blocks were freed), frees its
//     blocks and stands at the front of the swapped queue (C before D); E's
//     place in the waiting queue is unchanged.
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
//   - "a victim scheduled earlier in the step gives its tokens back": with
//     Victim::kOldest, victims already scheduled in the step leave
//     out.scheduled, and their tokens return to the step's budget, which the
//     prefill chunk after them gets.
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "lab/policies.hpp"
#include "scheduler.hpp"
#include "tests/exercises/check_util.hpp"

// doctest last, after every header with an exercise region (main.cpp says why).
#include <doctest/doctest.h>

using namespace pkv;
using namespace pkv_check;

namespace {

using Pairs = std::vector<std::pair<int32_t, int32_t>>;

// The copies a swapping policy asked for (lab/swap.hpp's BlockCopier), in
// order; it moves no bytes (there are none: no model runs here). `freed`
// records, at each copy_out, whether any of its blocks was already free: a
// copy must happen before the blocks go back to the pool.
struct Copies : BlockCopier {
    const BlockPool* pool = nullptr;
    Pairs out, in;
    bool freed = false;
    void copy_out(const BlockSlotPairs& p) override {
        for (const auto& [block, slot] : p) freed = freed || pool->block(block).ref_cnt == 0;
        out.insert(out.end(), p.begin(), p.end());
    }
    void copy_in(const BlockSlotPairs& p) override { in.insert(in.end(), p.begin(), p.end()); }
    uint64_t bytes_per_block() const override { return 1; }
};
Copies copies;  // the current check's (each check runs in a process of its own)

SchedulerConfig config(const BlockPool& pool, Preemption mode, int swap_blocks, Victim victim = Victim::kNewest) {
    SchedulerConfig c;
    c.max_model_len = 8;
    copies = Copies{};
    copies.pool = &pool;
    auto target = std::make_shared<SwapTarget>();
    target->copier = &copies;
    c.policy = make_policy({.victim = victim, .preemption = mode, .swap_space_blocks = swap_blocks}, target);
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

TEST_CASE("recompute forgets computed tokens and keeps the outputs") {
    BlockPool pool(4, 2, false);
    Scheduler s(config(pool, Preemption::kRecompute, 0), pool);
    int32_t cb = -1, db = -1;
    const SchedulerOutput out = two_victims(s, pool, cb, db);
    CHECK(names(s.running()) == "AB");
    for (int id : {2, 3}) {
        CAPTURE(id);
        const Request* v = s.request(id);
        CHECK(v->state == RequestState::kPreempted);
        CHECK(v->num_computed_tokens == 0);
        CHECK(v->num_tokens() == 3);  // prompt + the sampled token
        CHECK(v->num_output_tokens() == 1);
        CHECK(v->tokens.back() == 3);
        CHECK(v->block_table.blocks.empty());
        CHECK(v->num_preemptions == 1);
        CHECK(lab(s).swap_slots(*v).empty());
    }
    CHECK(s.stats().num_preemptions_total == 2);
    CHECK(lab(s).stats().num_swap_outs == 0);
    CHECK(copies.out.empty());
    CHECK(out.total_num_scheduled_tokens == 2);
    // D's and C's blocks went to A and B.
    CHECK(s.request(0)->block_table.blocks == std::vector<int32_t>{0, db});
    CHECK(s.request(1)->block_table.blocks == std::vector<int32_t>{1, cb});
    CHECK(pool.num_free_blocks() == 0);
    CHECK(consistent(s, pool) == "");
}

TEST_CASE("recompute victims wait at the front of the queue") {
    BlockPool pool(4, 2, false);
    Scheduler s(config(pool, Preemption::kRecompute, 0), pool);
    int32_t cb = -1, db = -1;
    SchedulerOutput out = two_victims(s, pool, cb, db);
    CHECK(names(s.waiting()) == "CDE");
    CHECK(lab(s).swapped().empty());

    complete(s, out);  // A and B reach 2 tokens and finish
    REQUIRE(s.request(0)->finished());
    REQUIRE(s.request(1)->finished());
    out = s.schedule();
    CHECK(names(out.resumed) == "CD");
    CHECK(names(out.scheduled) == "CD");
    CHECK(counts(out.scheduled) == "3,3");  // prompt and output, computed again
    CHECK(names(s.waiting()) == "E");
    CHECK(consistent(s, pool) == "");
}

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
    SchedulerConfig cfg = config(pool, Preemption::kSwap, 8, Victim::kOldest);
    Scheduler s(cfg, pool);
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

TEST_CASE("a victim scheduled earlier in the step gives its tokens back") {
    // Block size 2, 3 blocks, budget 4 tokens a step, chunked prefill.
    BlockPool pool(3, 2, false);
    SchedulerConfig cfg = config(pool, Preemption::kRecompute, 0, Victim::kOldest);
    cfg.max_model_len = 6;
    cfg.max_num_batched_tokens = 4;
    cfg.full_sequence_must_fit = false;
    Scheduler s(cfg, pool);
    Request* a = s.add_request({1}, tokens(4), 0);
    Request* b = s.add_request({2, 3}, tokens(4), 0);
    Request* c = s.add_request({4, 5, 6, 7, 8}, tokens(1), 0);
    SchedulerOutput out = s.schedule();  // A 1, B 2, C's first chunk 1: one block each
    REQUIRE(names(out.scheduled) == "ABC");
    REQUIRE(counts(out.scheduled) == "1,2,1");
    REQUIRE(pool.num_free_blocks() == 0);
    complete(s, out);

    // A decodes (budget 4 -> 3). B needs a block: its victim is A, already
    // scheduled, whose token comes back (-> 4); B decodes (-> 3). C's next
    // chunk is 3 tokens (it would be 2 had A kept its token), needs a
    // block, and preempts B, now the oldest.
    out = s.schedule();
    CHECK(names(out.preempted) == "AB");
    CHECK(names(out.scheduled) == "C");
    CHECK(counts(out.scheduled) == "3");
    CHECK(out.total_num_scheduled_tokens == 3);
    CHECK(names(s.waiting()) == "BA");  // each victim went to the front
    for (const Request* v : {a, b}) {
        CHECK(v->state == RequestState::kPreempted);
        CHECK(v->num_computed_tokens == 0);
        CHECK(v->block_table.blocks.empty());
    }
    CHECK(c->block_table.blocks.size() == 2u);
    CHECK(pool.num_free_blocks() == 1);
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

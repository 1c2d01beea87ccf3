// tests/exercises/ex05.cpp -- grades exercise 5, "the running loop of
// schedule()" (scheduler.hpp: the loop over running requests in
// Scheduler::schedule()). TUTORIAL chapter 3.
//
// Each check drives a Scheduler over a small BlockPool and plays the engine's
// part itself (complete() in check_util.hpp: mark the scheduled tokens
// computed, append one output token to each request whose computation
// reached its end). Requests are named by letter in the order they were
// added: A, B, C, ...
//
// The loop runs under every answer scheduler.hpp's seam can give: the card's
// (the newest victim, recomputed), a victim that stands before the cursor
// (scheduled already), and a victim the policy takes over instead of having
// it recomputed (what a swap does). The checks give those answers with
// CheckPolicy (check_util.hpp), a policy of their own: no lab/ code. Which
// victim lab/policies.hpp's LabPolicy picks is the lab's exercise 11.
//
// The "victim" checks share one situation (block size 2, 5 blocks): A and B
// run from step 1, C joins at step 3, so at step 5 A and B have 4 output
// tokens and C has 2; the pool is full and A's next token needs a block.
//
// The checks, and what each one proves:
//   - "running requests decode one token each oldest first": every running
//     request gets exactly one token per step, in admission order, and its
//     table gains a block exactly when its next position starts one.
//   - "a running prefill is cut to what is left of the budget": a long prompt
//     admitted with a first chunk is continued by the running loop in chunks
//     of the budget left after the decodes before it, never past its end.
//   - "the newest running request is the default victim": at step 5 A's
//     growth preempts C (the newest), then B cannot grow and, now the newest,
//     preempts itself: only A runs.
//   - "a victim at the front of the running queue: the rest go on": with a
//     policy that picks the oldest, A preempts itself, and the loop goes on
//     with B and C, which grow into A's blocks (a cursor that skips ahead
//     would miss B).
//   - "a victim before the cursor does not make the loop skip anyone": with
//     the oldest as victim, later requests preempt earlier ones that were
//     already scheduled in the same step; those leave the step, and every
//     request still running is served exactly once.
//   - "victims a policy takes over leave the loop as recompute victims do":
//     the situations above again, with a policy that takes each victim over
//     (frees its blocks itself and holds it): the same requests are
//     preempted and scheduled, and no victim is put in the waiting queue.
#include <cstdint>
#include <string>
#include <vector>

#include "scheduler.hpp"
#include "tests/exercises/check_util.hpp"

// doctest last, after every header with an exercise region (main.cpp says why).
#include <doctest/doctest.h>

using namespace pkv;
using namespace pkv_check;

namespace {

// The card's config, or (pick_front, take_over) answers from a CheckPolicy.
SchedulerConfig config(int max_model_len, bool pick_front = false, bool take_over = false) {
    SchedulerConfig c;
    c.max_model_len = max_model_len;
    if (pick_front || take_over)
        use_check_policy(c, [pick_front, take_over](CheckPolicy& p) {
            p.pick_front = pick_front;
            p.take_over = take_over;
        });
    return c;
}

// The shared victim situation: returns the output of step 5's schedule().
SchedulerOutput victim_step(Scheduler& s, BlockPool& pool) {
    Request* a = s.add_request({1}, tokens(9), 0);
    Request* b = s.add_request({2}, tokens(9), 0);
    SchedulerOutput out = s.schedule();  // step 1: A and B prefill one token each
    REQUIRE(names(out.scheduled) == "AB");
    complete(s, out);
    out = s.schedule();  // step 2: both decode inside their first block
    REQUIRE(names(out.scheduled) == "AB");
    complete(s, out);
    Request* c = s.add_request({4}, tokens(9), 0);
    out = s.schedule();  // step 3: A and B take a second block, C is admitted
    REQUIRE(names(out.scheduled) == "ABC");
    complete(s, out);
    out = s.schedule();  // step 4: nobody needs a block
    REQUIRE(names(out.scheduled) == "ABC");
    REQUIRE(out.preempted.empty());
    complete(s, out);
    REQUIRE(pool.num_free_blocks() == 0);
    REQUIRE(a->num_output_tokens() == 4);
    REQUIRE(b->num_output_tokens() == 4);
    REQUIRE(c->num_output_tokens() == 2);
    REQUIRE(a->num_computed_tokens == 4);  // position 4 starts A's third block
    REQUIRE(b->num_computed_tokens == 4);  // and B's
    REQUIRE(c->num_computed_tokens == 2);  // and C's second
    return s.schedule();                   // step 5
}

}  // namespace

TEST_CASE("running requests decode one token each oldest first") {
    BlockPool pool(12, 4, false);
    Scheduler s(config(32), pool);
    Request* a = s.add_request({1, 2, 3}, tokens(20), 0);
    Request* b = s.add_request({4, 5, 6, 7, 8}, tokens(20), 0);
    Request* c = s.add_request({9}, tokens(20), 0);
    SchedulerOutput out = s.schedule();  // admission: the prompts
    REQUIRE(names(out.scheduled) == "ABC");
    complete(s, out);

    std::string order, blocks;
    for (int step = 0; step < 6; ++step) {
        out = s.schedule();
        CHECK(out.preempted.empty());
        order += names(out.scheduled) + " ";
        CHECK(counts(out.scheduled) == "1,1,1");
        CHECK(out.total_num_scheduled_tokens == 3);
        blocks += std::to_string(a->block_table.blocks.size()) + std::to_string(b->block_table.blocks.size()) +
                  std::to_string(c->block_table.blocks.size()) + " ";
        complete(s, out);
        CHECK(consistent(s, pool) == "");
    }
    CHECK(order == "ABC ABC ABC ABC ABC ABC ");
    // Positions computed in the 6 steps: A 3..8, B 5..10, C 1..6; a table holds
    // blocks for its positions so far plus the one of this step (4 per block).
    CHECK(blocks == "121 221 221 232 232 332 ");
    CHECK(a->num_computed_tokens == 9);
    CHECK(b->num_computed_tokens == 11);
    CHECK(c->num_computed_tokens == 7);
    CHECK(pool.num_free_blocks() == 12 - 3 - 3 - 2);
}

TEST_CASE("a running prefill is cut to what is left of the budget") {
    BlockPool pool(16, 4, false);
    SchedulerConfig cfg = config(32);
    cfg.max_num_batched_tokens = 5;
    cfg.full_sequence_must_fit = false;
    Scheduler s(cfg, pool);
    Request* a = s.add_request({1, 2}, tokens(20), 0);
    Request* b = s.add_request(std::vector<int32_t>(12, 6), tokens(20), 0);
    SchedulerOutput out = s.schedule();  // admission: A's 2 tokens, B's first 3
    REQUIRE(names(out.scheduled) == "AB");
    REQUIRE(counts(out.scheduled) == "2,3");
    complete(s, out);

    std::string chunks, b_blocks;
    for (int step = 0; step < 4; ++step) {
        out = s.schedule();
        CHECK(names(out.scheduled) == "AB");
        CHECK(out.total_num_scheduled_tokens <= 5);
        chunks += counts(out.scheduled) + " ";
        complete(s, out);
        b_blocks += std::to_string(b->block_table.blocks.size()) + " ";
    }
    // B: 3 computed, then 4 (budget 5 - A's 1), 4, what is left (1), then decodes.
    CHECK(chunks == "1,4 1,4 1,1 1,1 ");
    CHECK(b_blocks == "2 3 3 4 ");
    CHECK(b->num_computed_tokens == 13);
    CHECK(b->num_output_tokens() == 2);
    CHECK(a->num_output_tokens() == 5);
    CHECK(consistent(s, pool) == "");
}

TEST_CASE("the newest running request is the default victim") {
    BlockPool pool(5, 2, false);
    Scheduler s(config(10), pool);  // the card's: the newest is the victim
    const SchedulerOutput out = victim_step(s, pool);
    CHECK(names(out.preempted) == "CB");
    CHECK(names(out.scheduled) == "A");
    CHECK(counts(out.scheduled) == "1");
    CHECK(names(s.running()) == "A");
    CHECK(s.request(0)->block_table.blocks.size() == 3u);
    CHECK(s.request(1)->block_table.blocks.empty());
    CHECK(s.request(2)->block_table.blocks.empty());
    CHECK(pool.num_free_blocks() == 2);
    CHECK(consistent(s, pool) == "");
}

TEST_CASE("a victim at the front of the running queue: the rest go on") {
    BlockPool pool(5, 2, false);
    Scheduler s(config(10, true), pool);  // the oldest is the victim
    const SchedulerOutput out = victim_step(s, pool);
    CHECK(names(out.preempted) == "A");
    CHECK(names(out.scheduled) == "BC");
    CHECK(counts(out.scheduled) == "1,1");
    CHECK(names(s.running()) == "BC");
    CHECK(s.request(0)->block_table.blocks.empty());
    CHECK(s.request(1)->block_table.blocks.size() == 3u);
    CHECK(s.request(2)->block_table.blocks.size() == 2u);
    CHECK(pool.num_free_blocks() == 0);
    CHECK(consistent(s, pool) == "");
}

TEST_CASE("a victim before the cursor does not make the loop skip anyone") {
    // Block size 2, 4 blocks, one each: A and B decode inside their block,
    // C and D need a second one.
    BlockPool pool(4, 2, false);
    Scheduler s(config(8, true), pool);  // the oldest is the victim
    s.add_request({1}, tokens(6), 0);
    s.add_request({2}, tokens(6), 0);
    s.add_request({3, 4}, tokens(6), 0);
    s.add_request({5, 6}, tokens(6), 0);
    SchedulerOutput out = s.schedule();
    REQUIRE(names(out.scheduled) == "ABCD");
    REQUIRE(pool.num_free_blocks() == 0);
    complete(s, out);

    // A and B are scheduled; C's growth preempts A (the oldest, scheduled
    // already), D's preempts B. C and D both run.
    out = s.schedule();
    CHECK(names(out.preempted) == "AB");
    CHECK(names(out.scheduled) == "CD");
    CHECK(counts(out.scheduled) == "1,1");
    CHECK(out.total_num_scheduled_tokens == 2);
    CHECK(names(s.running()) == "CD");
    CHECK(s.request(2)->block_table.blocks.size() == 2u);
    CHECK(s.request(3)->block_table.blocks.size() == 2u);
    CHECK(pool.num_free_blocks() == 0);
    CHECK(consistent(s, pool) == "");
}

// The situations of the victim checks above, with a policy that takes each
// victim over: the loop cannot tell, the same requests are preempted and
// scheduled, and none of them goes to the waiting queue (the policy holds
// them, the newest victim first).
TEST_CASE("victims a policy takes over leave the loop as recompute victims do") {
    for (bool front : {false, true}) {
        CAPTURE(front);
        BlockPool pool(5, 2, false);
        Scheduler s(config(10, front, true), pool);
        const SchedulerOutput out = victim_step(s, pool);
        CHECK(names(out.preempted) == (front ? "A" : "CB"));
        CHECK(names(out.scheduled) == (front ? "BC" : "A"));
        CHECK(counts(out.scheduled) == (front ? "1,1" : "1"));
        CHECK(names(s.running()) == (front ? "BC" : "A"));
        CHECK(names_held(s) == (front ? "A" : "BC"));
        CHECK(s.waiting().empty());
        CHECK(pool.num_free_blocks() == (front ? 0 : 2));
        CHECK(consistent(s, pool) == "");
    }
    BlockPool pool(4, 2, false);
    Scheduler s(config(8, true, true), pool);
    s.add_request({1}, tokens(6), 0);
    s.add_request({2}, tokens(6), 0);
    s.add_request({3, 4}, tokens(6), 0);
    s.add_request({5, 6}, tokens(6), 0);
    SchedulerOutput out = s.schedule();
    REQUIRE(names(out.scheduled) == "ABCD");
    complete(s, out);
    out = s.schedule();
    CHECK(names(out.preempted) == "AB");
    CHECK(names(out.scheduled) == "CD");
    CHECK(out.total_num_scheduled_tokens == 2);
    CHECK(names(s.running()) == "CD");
    CHECK(names_held(s) == "BA");
    CHECK(s.waiting().empty());
    CHECK(consistent(s, pool) == "");
}

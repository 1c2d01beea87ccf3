// tests/exercises/ex06.cpp -- grades exercise 6, "preempt(): free, forget,
// requeue" (scheduler.hpp: Scheduler::preempt). TUTORIAL chapter 3.
//
// Each check drives a Scheduler over a small BlockPool and plays the engine's
// part itself (complete() in check_util.hpp: mark the scheduled tokens
// computed, append one output token to each request whose computation
// reached its end). Requests are named by letter in the order they were
// added: A, B, C, ...
//
// preempt() runs under every answer scheduler.hpp's seam can give: the card's
// (the newest victim, recomputed), a victim scheduled earlier in the step
// (another policy's pick), and a victim the policy takes over (what a swap
// does: lab/policies.hpp, the lab's exercise 12). The checks give those
// answers with CheckPolicy (check_util.hpp), a policy of their own: no lab/
// code. Prefix caching on and off both reach the region (free_blocks puts
// cached blocks at the other end of the free list).
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
//   - "a victim scheduled earlier in the step gives its tokens back": with
//     the oldest as victim, victims already scheduled in the step leave
//     out.scheduled, and their tokens return to the step's budget, which the
//     prefill chunk after them gets; whether they are recomputed or taken
//     over by the policy.
//   - "a victim the policy takes over is counted and keeps its blocks": when
//     take_victim is asked, the victim has left running, is PREEMPTED and
//     counted (its num_preemptions, the total, out.preempted), and still
//     holds every block with its computed tokens (a swap copies them now);
//     once taken over, preempt() neither frees, forgets nor requeues it.
//   - "a recompute victim's blocks go back last block first": with prefix
//     caching off (to the head of the free list) and on (to its tail), the
//     victim's last block comes before its first, so its first block, the
//     one most likely shared, is the last to be reused.
#include <cstdint>
#include <string>
#include <vector>

#include "core/block_pool.hpp"
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
    Scheduler s(config(8), pool);
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
    }
    CHECK(s.stats().num_preemptions_total == 2);
    CHECK(out.total_num_scheduled_tokens == 2);
    // D's and C's blocks went to A and B.
    CHECK(s.request(0)->block_table.blocks == std::vector<int32_t>{0, db});
    CHECK(s.request(1)->block_table.blocks == std::vector<int32_t>{1, cb});
    CHECK(pool.num_free_blocks() == 0);
    CHECK(consistent(s, pool) == "");
}

TEST_CASE("recompute victims wait at the front of the queue") {
    BlockPool pool(4, 2, false);
    Scheduler s(config(8), pool);
    int32_t cb = -1, db = -1;
    SchedulerOutput out = two_victims(s, pool, cb, db);
    CHECK(names(s.waiting()) == "CDE");

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

TEST_CASE("a victim scheduled earlier in the step gives its tokens back") {
    // Block size 2, 3 blocks, budget 4 tokens a step, chunked prefill; the
    // oldest running request is the victim. Recomputed, then taken over.
    for (bool take_over : {false, true}) {
        CAPTURE(take_over);
        BlockPool pool(3, 2, false);
        SchedulerConfig cfg = config(6, true, take_over);
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
        if (take_over) {
            CHECK(s.waiting().empty());
            CHECK(names_held(s) == "BA");
        } else {
            CHECK(names(s.waiting()) == "BA");  // each victim went to the front
            for (const Request* v : {a, b}) CHECK(v->num_computed_tokens == 0);
        }
        for (const Request* v : {a, b}) {
            CHECK(v->state == RequestState::kPreempted);
            CHECK(v->block_table.blocks.empty());
        }
        CHECK(c->block_table.blocks.size() == 2u);
        CHECK(pool.num_free_blocks() == 1);
        CHECK(consistent(s, pool) == "");
    }
}

// The two-victim situation with a policy that takes each victim over (frees
// its blocks itself and holds it, as a swap does after its copy). When
// take_victim runs, D and then C must already be out of running, PREEMPTED
// and counted, and still hold their block with 2 computed tokens.
TEST_CASE("a victim the policy takes over is counted and keeps its blocks") {
    BlockPool pool(4, 2, false);
    Scheduler s(config(8, false, true), pool);
    int32_t cb = -1, db = -1;
    const SchedulerOutput out = two_victims(s, pool, cb, db);
    const std::vector<CheckPolicy::Seen>& seen = check_policy(s).seen;
    REQUIRE(seen.size() == 2u);
    const int32_t blocks[2] = {db, cb};
    for (int k = 0; k < 2; ++k) {
        CAPTURE(k);
        CHECK(seen[k].id == 3 - k);  // D, then C
        CHECK_FALSE(seen[k].in_running);
        CHECK_FALSE(seen[k].in_waiting);
        CHECK(seen[k].state == RequestState::kPreempted);
        CHECK(seen[k].num_preemptions == 1);
        CHECK(seen[k].num_preemptions_total == k + 1);
        CHECK(seen[k].num_computed_tokens == 2);
        CHECK(seen[k].blocks == std::vector<int32_t>{blocks[k]});
        CHECK(seen[k].blocks_held);
    }
    // Taken over: preempt() left the rest to the policy.
    CHECK(names(out.preempted) == "DC");
    CHECK(names(s.waiting()) == "E");
    CHECK(names_held(s) == "CD");
    for (int id : {2, 3}) {
        CAPTURE(id);
        CHECK(s.request(id)->num_computed_tokens == 2);  // not forgotten
        CHECK(s.request(id)->num_preemptions == 1);
    }
    CHECK(s.stats().num_preemptions_total == 2);
    CHECK(names(s.running()) == "AB");
    CHECK(pool.num_free_blocks() == 0);
    CHECK(consistent(s, pool) == "");
}

// Block size 2, 4 blocks. A (2 tokens), B (4 tokens, 2 blocks) and C (2
// tokens) fill the pool; each samples a token and needs one more block. In
// step 2 A's growth preempts C (the newest) and takes its block; B cannot
// grow and preempts itself. B's two blocks are then the whole free list: its
// second block at the front, its first at the back. Without prefix caching
// they went to the head of the list, with it to the tail (full computed
// blocks are cached): the same order either way.
TEST_CASE("a recompute victim's blocks go back last block first") {
    for (bool caching : {false, true}) {
        CAPTURE(caching);
        BlockPool pool(4, 2, caching);
        Scheduler s(config(8), pool);
        s.add_request({1, 2}, tokens(4), 0);        // A
        s.add_request({3, 4, 5, 6}, tokens(4), 0);  // B
        s.add_request({7, 8}, tokens(4), 0);        // C
        SchedulerOutput out = s.schedule();
        REQUIRE(names(out.scheduled) == "ABC");
        REQUIRE(pool.num_free_blocks() == 0);
        complete(s, out);
        const std::vector<int32_t> b_blocks = s.request(1)->block_table.blocks;
        REQUIRE(b_blocks.size() == 2u);
        out = s.schedule();
        CHECK(names(out.preempted) == "CB");
        CHECK(names(out.scheduled) == "A");
        CHECK(s.request(1)->block_table.blocks.empty());
        CHECK(walk_free_list(pool) == Ids{b_blocks[1], b_blocks[0]});
        CHECK(consistent(s, pool) == "");
    }
}

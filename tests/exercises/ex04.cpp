// tests/exercises/ex04.cpp -- grades exercise 4, "admission and the
// full-sequence gate" (scheduler.hpp: Scheduler::try_admit). TUTORIAL
// chapter 2.
//
// Every check drives a Scheduler over a small BlockPool directly and plays
// the engine's part itself (complete() in check_util.hpp: mark the scheduled
// tokens computed, append a token to whoever reached the end of its sequence,
// finish at max_tokens or max_model_len). The expected block counts are
// worked out in the comments.
//
// try_admit runs with the full-sequence gate on and off, prefix caching off
// and on (no hit, hits on held blocks, hits on free blocks), for new and
// resumed requests, under a budget that cuts the chunk or not, and with the
// card's admission answer or a policy's other answer (scheduler.hpp's seam:
// reserve more, keep blocks free). The policy's answers come from
// CheckPolicy (check_util.hpp), a policy of the checks' own: no lab/ code.
// lab/policies.hpp's reservation and watermark are the lab's exercise 13.
//
//   - a new prompt gets a chunk capped by the step's token budget, and only
//     that chunk's blocks are allocated (bet admission);
//   - the full-sequence gate: with full_sequence_must_fit a prompt waits until
//     its whole sequence fits, without it a first chunk is enough;
//   - the gate counts a preempted request's outputs, not just its prompt;
//   - a resumed request looks up its whole sequence, outputs included, so
//     the prefix-cache queries grow by all its tokens (vLLM's count);
//   - prefix-cache hits on blocks a running request holds skip their tokens
//     (num_computed_tokens, the chunk, the stats) and cost no free capacity;
//   - the policy is shown the card's answer (what must fit, what to
//     allocate, nothing kept free) and its own answer is obeyed: more to
//     hold, more to allocate (but only the chunk is scheduled), blocks kept
//     free;
//   - hits on blocks that sit in the free list cost free capacity at the gate
//     (the whole sequence must fit with them), and next to the blocks a
//     policy keeps free.
#include <cstdint>
#include <vector>

#include "core/block_pool.hpp"
#include "scheduler.hpp"
#include "tests/exercises/check_util.hpp"

// doctest last, after every header with an exercise region (main.cpp says why).
#include <doctest/doctest.h>

using namespace pkv;
using namespace pkv_check;

// Budget 10: A (6 tokens) takes 6, B (9 tokens) gets the 4 that are left.
// The gate checks B's whole prompt (3 blocks) but allocates only its chunk
// (1 block); C gets nothing in a step whose budget is spent.
TEST_CASE("a new prompt gets a chunk capped by the budget and only its blocks") {
    BlockPool pool(16, 4, true);  // caching on: queries are counted, nothing is hit
    Scheduler s(admission_config(64, 10), pool);
    Request* a = s.add_request(run_of(10, 6), tokens(4), 0);
    Request* b = s.add_request(run_of(20, 9), tokens(4), 0);
    Request* c = s.add_request(run_of(30, 3), tokens(4), 0);
    const SchedulerOutput out = s.schedule();
    REQUIRE(out.scheduled.size() == 2);
    CHECK(scheduled_tokens(out, a) == 6);
    CHECK(scheduled_tokens(out, b) == 4);
    CHECK(out.total_num_scheduled_tokens == 10);
    CHECK(a->block_table.blocks.size() == 2);
    CHECK(b->block_table.blocks.size() == 1);  // the chunk's block, not the whole prompt's 3
    CHECK(a->num_computed_tokens == 0);
    CHECK(b->num_computed_tokens == 0);
    CHECK(c->state == RequestState::kWaiting);
    CHECK(c->block_table.blocks.empty());
    CHECK(pool.num_free_blocks() == 13);
    CHECK(s.stats().prefix_cache_queries == 6 + 9);
    CHECK(s.stats().prefix_cache_hits == 0);
    CHECK(consistent(s, pool) == "");
}

// 4 blocks of 4, budget 9. A (8 tokens, 2 blocks) runs; B (12 tokens) would
// get a 1-token chunk (1 block, and 2 are free) but its whole prompt needs 3.
TEST_CASE("the full sequence gate waits for the whole prompt and a chunk suffices without it") {
    for (bool gate : {true, false}) {
        CAPTURE(gate);
        BlockPool pool(4, 4, true);  // caching on: queries are counted, nothing is hit
        SchedulerConfig cfg = admission_config(16, 9);
        cfg.full_sequence_must_fit = gate;
        Scheduler s(cfg, pool);
        Request* a = s.add_request(run_of(10, 8), tokens(1), 0);
        Request* b = s.add_request(run_of(30, 12), tokens(2), 0);
        SchedulerOutput out = s.schedule();
        CHECK(scheduled_tokens(out, a) == 8);
        if (gate) {
            CHECK(out.scheduled.size() == 1);
            CHECK(b->state == RequestState::kWaiting);
            CHECK(b->block_table.blocks.empty());
            CHECK(pool.num_free_blocks() == 2);
            CHECK(s.stats().prefix_cache_queries == 8);  // B was not admitted: not counted
            // A finishes and frees its blocks: now B's 12 tokens fit, and it
            // starts with a full 9-token chunk (3 blocks).
            complete(s, out);
            REQUIRE(a->finished());
            out = s.schedule();
            CHECK(b->state == RequestState::kRunning);
            CHECK(scheduled_tokens(out, b) == 9);
            CHECK(b->block_table.blocks.size() == 3);
            CHECK(pool.num_free_blocks() == 1);
        } else {
            CHECK(out.scheduled.size() == 2);
            CHECK(b->state == RequestState::kRunning);
            CHECK(scheduled_tokens(out, b) == 1);
            CHECK(b->block_table.blocks.size() == 1);
            CHECK(pool.num_free_blocks() == 1);
            CHECK(s.stats().prefix_cache_queries == 8 + 12);
        }
        CHECK(consistent(s, pool) == "");
    }
}

// 4 blocks of 4, budget 5. A and B (4-token prompts) grow side by side until
// A needs a third block and preempts B, which then waits with 8 tokens (its
// prompt and 4 outputs) and nothing computed. One block is free: enough for a
// 4-token chunk, and for B's prompt alone, but not for B's whole sequence.
TEST_CASE("a preempted request must fit with its outputs") {
    BlockPool pool(4, 4, false);
    Scheduler s(admission_config(16, 5), pool);
    Request* a = s.add_request(run_of(10, 4), tokens(10), 0);
    Request* b = s.add_request(run_of(20, 4), tokens(10), 0);
    SchedulerOutput out = s.schedule();
    REQUIRE(out.scheduled.size() == 2);
    for (int guard = 0; b->num_preemptions == 0; ++guard) {
        REQUIRE(guard < 20);
        complete(s, out);
        out = s.schedule();
    }
    REQUIRE(b->state == RequestState::kPreempted);
    REQUIRE(b->num_tokens() == 8);
    REQUIRE(b->num_computed_tokens == 0);
    REQUIRE(pool.num_free_blocks() == 1);
    // The next steps: A decodes into its third block, B stays out.
    for (int step = 0; step < 3; ++step) {
        complete(s, out);
        out = s.schedule();
        CAPTURE(step);
        CHECK(b->state == RequestState::kPreempted);
        CHECK(b->block_table.blocks.empty());
        CHECK(scheduled_tokens(out, b) == 0);
        CHECK(pool.num_free_blocks() == 1);
    }
    // Once A is done B comes back, its whole sequence to recompute.
    for (int guard = 0; !a->finished(); ++guard) {
        REQUIRE(guard < 20);
        complete(s, out);
        out = s.schedule();
    }
    CHECK(b->state == RequestState::kRunning);
    CHECK(scheduled_tokens(out, b) == 5);
    CHECK(consistent(s, pool) == "");
}

// Prefix caching on, otherwise the situation of the check above: B is
// preempted with 8 tokens (its 4-token prompt and 4 outputs) and comes back
// once A is done. Both prompts were queries when they were admitted (8
// tokens); B's return looks up its whole sequence, so 8 more -- not only its
// 4 prompt tokens. A request that is not admitted is not a query.
TEST_CASE("a resumed request looks up its whole sequence in the prefix cache") {
    BlockPool pool(4, 4, true);
    Scheduler s(admission_config(16, 5), pool);
    Request* a = s.add_request(run_of(10, 4), tokens(10), 0);
    Request* b = s.add_request(run_of(20, 4), tokens(10), 0);
    SchedulerOutput out = s.schedule();
    REQUIRE(out.scheduled.size() == 2);
    CHECK(s.stats().prefix_cache_queries == 8);
    for (int guard = 0; b->num_preemptions == 0; ++guard) {
        REQUIRE(guard < 20);
        complete(s, out);
        out = s.schedule();
    }
    REQUIRE(b->num_tokens() == 8);
    CHECK(s.stats().prefix_cache_queries == 8);
    for (int guard = 0; b->state != RequestState::kRunning; ++guard) {
        REQUIRE(guard < 40);
        complete(s, out);
        out = s.schedule();
    }
    CHECK(a->finished());
    CHECK(b->num_tokens() == 8);
    CHECK(s.stats().prefix_cache_queries == 8 + 8);
    CHECK(s.stats().prefix_cache_hits <= 4);  // at most its first block: never the last token's
    CHECK(consistent(s, pool) == "");
}




// Prefix caching, 8 blocks of 4. A (17 tokens, 5 blocks) is computed: its 4
// full blocks are cached and A keeps holding them while it decodes. B shares
// A's first 16 tokens and adds 12: 28 tokens, 7 blocks, 4 of them hits. Its
// 3 new blocks are exactly the 3 free ones (hits on held blocks are free of
// charge), it computes only the 12 tokens after the hits, and the stats
// count every token looked up and the 16 served.
TEST_CASE("prefix hits on held blocks skip their tokens and cost no free block") {
    BlockPool pool(8, 4, true);
    Scheduler s(admission_config(32), pool);
    Request* a = s.add_request(run_of(3, 17), tokens(10), 0);
    SchedulerOutput out = s.schedule();
    REQUIRE(scheduled_tokens(out, a) == 17);
    complete(s, out);
    REQUIRE(pool.num_free_blocks() == 3);
    std::vector<int32_t> prompt = run_of(3, 16);
    const std::vector<int32_t> tail = run_of(100, 12);
    prompt.insert(prompt.end(), tail.begin(), tail.end());
    Request* b = s.add_request(prompt, tokens(4), 0);
    out = s.schedule();
    CHECK(scheduled_tokens(out, a) == 1);
    CHECK(b->state == RequestState::kRunning);
    CHECK(scheduled_tokens(out, b) == 12);
    CHECK(b->num_computed_tokens == 16);
    REQUIRE(b->block_table.blocks.size() == 7);
    for (int i = 0; i < 4; ++i) CHECK(b->block_table.blocks[i] == a->block_table.blocks[i]);
    for (int i = 0; i < 4; ++i) CHECK(pool.block(a->block_table.blocks[i]).ref_cnt == 2);
    CHECK(pool.num_free_blocks() == 0);
    CHECK(s.stats().prefix_cache_queries == 17 + 28);
    CHECK(s.stats().prefix_cache_hits == 16);
    CHECK(consistent(s, pool) == "");
}


// The card's answer, as the policy sees it, and the policy's answer obeyed.
// Blocks of 4, budget 6. A lone A (10 tokens): with the gate the card must
// hold 10 tokens, without it only its 6-token chunk; it allocates the chunk
// and keeps nothing free. Then Z (4 tokens, decoding: 2 blocks, 6 free) runs
// and A comes with answers other than the card's; its chunk is 5 tokens (the
// budget after Z's decode), and the card's would hold 10 tokens (3 blocks)
// and allocate 5 (2 blocks). Hold 28 tokens: 7 blocks > 6, A waits; hold 24:
// 6 fit. Allocate 16 tokens: 4 blocks, but only the 5-token chunk is
// scheduled. Keep 4 blocks free: 3 + 4 > 6, A waits; keep 3: it fits.
TEST_CASE("the policy sees the card's answer and its own answer is obeyed") {
    for (bool gate : {true, false}) {
        CAPTURE(gate);
        BlockPool pool(8, 4, false);
        SchedulerConfig cfg = admission_config(32, 6);
        cfg.full_sequence_must_fit = gate;
        use_check_policy(cfg, nullptr);
        Scheduler s(cfg, pool);
        s.add_request(run_of(10, 10), tokens(2), 0);
        s.schedule();
        const std::vector<SchedulerPolicy::Admit>& cards = check_policy(s).cards;
        REQUIRE(cards.size() == 1u);
        CHECK(cards[0].must_hold == (gate ? 10 : 6));
        CHECK(cards[0].alloc_tokens == 6);
        CHECK(cards[0].keep_free == 0);
    }
    struct Case {
        std::string what;
        SchedulerPolicy::Admit answer;
        bool admitted;
        size_t blocks;
    };
    const Case cases[] = {
        {"the card's", {10, 5, 0}, true, 2},
        {"hold 28 tokens", {28, 5, 0}, false, 0},
        {"hold 24 tokens", {24, 5, 0}, true, 2},
        {"allocate 16 tokens", {10, 16, 0}, true, 4},
        {"keep 4 blocks free", {10, 5, 4}, false, 0},
        {"keep 3 blocks free", {10, 5, 3}, true, 2},
    };
    for (const Case& k : cases) {
        CAPTURE(k.what);
        BlockPool pool(8, 4, false);
        SchedulerConfig cfg = admission_config(32, 6);
        use_check_policy(cfg, [k](CheckPolicy& p) {
            p.admit = [k](const Scheduler&, const Request& r, SchedulerPolicy::Admit card) {
                return r.tokens[0] == 10 ? k.answer : card;  // A's answer; Z gets the card's
            };
        });
        Scheduler s(cfg, pool);
        Request* z = s.add_request(run_of(50, 4), tokens(20), 0);
        complete(s, s.schedule());
        Request* a = s.add_request(run_of(10, 10), tokens(2), 0);
        const SchedulerOutput out = s.schedule();
        REQUIRE(z->block_table.blocks.size() == 2u);
        const std::vector<SchedulerPolicy::Admit>& cards = check_policy(s).cards;
        REQUIRE(cards.size() == 2u);
        CHECK(cards[1].must_hold == 10);
        CHECK(cards[1].alloc_tokens == 5);
        CHECK(cards[1].keep_free == 0);
        CHECK((a->state == RequestState::kRunning) == k.admitted);
        CHECK(scheduled_tokens(out, a) == (k.admitted ? 5 : 0));
        CHECK(a->block_table.blocks.size() == k.blocks);
        CHECK(a->num_computed_tokens == 0);
        CHECK(pool.num_free_blocks() == 6 - (int)k.blocks);
        CHECK(consistent(s, pool) == "");
    }
}

// Prefix caching, 12 blocks of 4, budget 5. Z computes 16 tokens and
// finishes: its 4 cached blocks sit in the free list. A (19 tokens, 5
// blocks) runs, leaving 7 free, Z's 4 among them. B = Z's 16 tokens + 16
// more (32 tokens, 8 blocks) hits Z's 4. Its chunk is 4 tokens (the budget
// after A's decode): 1 new block beside the 4 hits. With the gate, its whole
// sequence must fit: 4 new blocks + the 4 hits taken off the free list = 8 >
// 7, so B waits. Without the gate its chunk is enough: 1 + 4 <= 7, and it
// runs, leaving 2 free. Then the same through a policy that keeps 3 blocks
// free (no gate): 1 + 4 + 3 = 8 > 7, B waits; keeping 2, it runs.
TEST_CASE("prefix hits on free blocks count against the full sequence gate") {
    struct Case {
        bool gate;
        int64_t keep_free;  // < 0: the card's answer
        bool admitted;
    };
    for (const Case& k : {Case{true, -1, false}, Case{false, -1, true}, Case{false, 3, false}, Case{false, 2, true}}) {
        CAPTURE(k.gate);
        CAPTURE(k.keep_free);
        BlockPool pool(12, 4, true);
        SchedulerConfig cfg = admission_config(48, 5);
        cfg.full_sequence_must_fit = k.gate;
        if (k.keep_free >= 0)
            use_check_policy(cfg, [k](CheckPolicy& p) {
                p.admit = [k](const Scheduler& s, const Request&, SchedulerPolicy::Admit a) {
                    if (!s.running().empty()) a.keep_free = k.keep_free;
                    return a;
                };
            });
        Scheduler s(cfg, pool);
        Request* z = s.add_request(run_of(3, 16), tokens(1), 0);
        for (int guard = 0; !z->finished(); ++guard) {
            REQUIRE(guard < 10);
            complete(s, s.schedule());
        }
        REQUIRE(pool.num_free_blocks() == 12);
        Request* a = s.add_request(run_of(200, 19), tokens(8), 0);
        for (int guard = 0; a->num_computed_tokens < 19; ++guard) {
            REQUIRE(guard < 10);
            complete(s, s.schedule());
        }
        REQUIRE(a->state == RequestState::kRunning);
        REQUIRE(a->block_table.blocks.size() == 5u);
        REQUIRE(pool.num_free_blocks() == 7);
        std::vector<int32_t> prompt = run_of(3, 16);
        const std::vector<int32_t> tail = run_of(300, 16);
        prompt.insert(prompt.end(), tail.begin(), tail.end());
        Request* b = s.add_request(prompt, tokens(4), 0);
        const long queries = s.stats().prefix_cache_queries, hits = s.stats().prefix_cache_hits;
        const SchedulerOutput out = s.schedule();
        CHECK(scheduled_tokens(out, a) == 1);
        if (!k.admitted) {
            CHECK(b->state == RequestState::kWaiting);
            CHECK(b->block_table.blocks.empty());
            CHECK(b->num_computed_tokens == 0);
            CHECK(pool.num_free_blocks() == 7);
            CHECK(s.stats().prefix_cache_queries == queries);
            CHECK(s.stats().prefix_cache_hits == hits);
        } else {
            CHECK(b->state == RequestState::kRunning);
            CHECK(scheduled_tokens(out, b) == 4);
            CHECK(b->num_computed_tokens == 16);
            CHECK(b->block_table.blocks.size() == 5u);
            CHECK(pool.num_free_blocks() == 2);
            CHECK(s.stats().prefix_cache_queries == queries + 32);
            CHECK(s.stats().prefix_cache_hits == hits + 16);
        }
        CHECK(consistent(s, pool) == "");
    }
}

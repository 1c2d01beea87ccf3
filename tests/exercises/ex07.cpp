// tests/exercises/ex07.cpp -- grades exercise 7, "admission, the watermark and
// the full-sequence gate" (Scheduler::try_admit in scheduler.hpp).
//
// Every check drives a Scheduler over a small BlockPool directly and plays
// the engine's part itself (complete() in check_util.hpp: mark the scheduled
// tokens computed, append a token to whoever reached the end of its sequence,
// finish at max_tokens or max_model_len). The expected block counts are
// worked out in the comments.
//
//   - a new prompt gets a chunk capped by the step's token budget, and only
//     that chunk's blocks are allocated (bet admission);
//   - the full-sequence gate: with full_sequence_must_fit a prompt waits until
//     its whole sequence fits, without it a first chunk is enough;
//   - the gate counts a preempted request's outputs, not just its prompt;
//   - a resumed request looks up its whole sequence, outputs included, so
//     the prefix-cache queries grow by all its tokens (vLLM's count);
//   - reserve admission allocates prompt + max_tokens, capped at
//     max_model_len, at once;
//   - the watermark keeps its share of all blocks free while something runs
//     (exactly that share may remain), and a request that waits is not counted
//     as a prefix-cache query;
//   - the watermark never keeps a request out of an idle scheduler;
//   - prefix-cache hits on blocks a running request holds skip their tokens
//     (num_computed_tokens, the chunk, the stats) and cost no free capacity;
//   - hits on blocks that sit in the free list do cost free capacity.
#include <cstdint>
#include <vector>

#include "core/block_pool.hpp"
#include "lab/policies.hpp"
#include "scheduler.hpp"
#include "tests/exercises/check_util.hpp"

// doctest last, after every header with an exercise region (main.cpp says why).
#include <doctest/doctest.h>

using namespace pkv;
using namespace pkv_check;

namespace {

SchedulerConfig config(int max_model_len, int budget = 256) {
    SchedulerConfig c;
    c.max_model_len = max_model_len;
    c.max_num_batched_tokens = budget;
    return c;
}

int scheduled_tokens(const SchedulerOutput& out, const Request* r) {
    for (const ScheduledRequest& sr : out.scheduled)
        if (sr.req == r) return sr.num_new_tokens;
    return 0;
}

}  // namespace

// Budget 10: A (6 tokens) takes 6, B (9 tokens) gets the 4 that are left.
// The gate checks B's whole prompt (3 blocks) but allocates only its chunk
// (1 block); C gets nothing in a step whose budget is spent.
TEST_CASE("a new prompt gets a chunk capped by the budget and only its blocks") {
    BlockPool pool(16, 4, true);  // caching on: queries are counted, nothing is hit
    Scheduler s(config(64, 10), pool);
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
        SchedulerConfig cfg = config(16, 9);
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
    Scheduler s(config(16, 5), pool);
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
    Scheduler s(config(16, 5), pool);
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

// Reserve admission: A holds 3 + 10 = 13 tokens (4 blocks) from the start;
// B asks for 2 + 100 tokens, capped at max_model_len 24 (6 blocks): exactly
// the 6 that are left. C finds nothing free.
TEST_CASE("reserve admission allocates prompt plus max tokens capped at max model len") {
    BlockPool pool(10, 4, false);
    SchedulerConfig cfg = config(24);
    use_policy(cfg, {.admission = Admission::kReserve});
    Scheduler s(cfg, pool);
    Request* a = s.add_request(run_of(10, 3), tokens(10), 0);
    Request* b = s.add_request(run_of(20, 2), tokens(100), 0);
    Request* c = s.add_request(run_of(30, 1), tokens(1), 0);
    SchedulerOutput out = s.schedule();
    CHECK(scheduled_tokens(out, a) == 3);
    CHECK(scheduled_tokens(out, b) == 2);
    CHECK(a->block_table.blocks.size() == 4);
    CHECK(b->block_table.blocks.size() == 6);
    CHECK(c->state == RequestState::kWaiting);
    CHECK(pool.num_free_blocks() == 0);
    CHECK(consistent(s, pool) == "");
    // The reservation is what the request grows into: no step allocates more.
    for (int step = 0; step < 6; ++step) {
        complete(s, out);
        out = s.schedule();
        CHECK(out.preempted.empty());
        CHECK(a->block_table.blocks.size() == 4);
    }
}

// 8 blocks of 4, watermark 0.25: 2 blocks stay free while anything runs.
// A (12 tokens, 3 blocks) enters an idle scheduler; B (3 blocks) leaves
// exactly 2 free, which is allowed; C (1 block) would leave 1 and waits.
// Without the watermark C runs at once.
TEST_CASE("the watermark keeps its share of all blocks free next to running requests") {
    for (double wm : {0.25, 0.0}) {
        CAPTURE(wm);
        BlockPool pool(8, 4, true);  // caching on: queries are counted, nothing is hit
        SchedulerConfig cfg = config(32);
        use_policy(cfg, {.watermark = wm});
        Scheduler s(cfg, pool);
        Request* a = s.add_request(run_of(10, 12), tokens(2), 0);
        Request* b = s.add_request(run_of(30, 12), tokens(2), 0);
        Request* c = s.add_request(run_of(50, 2), tokens(2), 0);
        const SchedulerOutput out = s.schedule();
        CHECK(a->state == RequestState::kRunning);
        CHECK(b->state == RequestState::kRunning);
        if (wm > 0) {
            CHECK(out.scheduled.size() == 2);
            CHECK(c->state == RequestState::kWaiting);
            CHECK(c->block_table.blocks.empty());
            CHECK(pool.num_free_blocks() == 2);
            CHECK(s.stats().prefix_cache_queries == 24);  // C waits: not a query
        } else {
            CHECK(out.scheduled.size() == 3);
            CHECK(c->state == RequestState::kRunning);
            CHECK(pool.num_free_blocks() == 1);
            CHECK(s.stats().prefix_cache_queries == 26);
        }
        CHECK(consistent(s, pool) == "");
    }
}

// Watermark 0.5 of 8 blocks. A (20 tokens, 5 blocks) enters an idle
// scheduler although 3 free blocks are less than the cushion; B (1 block)
// must then wait for the cushion, until A is gone and the scheduler is idle.
TEST_CASE("the watermark never keeps a request out of an idle scheduler") {
    BlockPool pool(8, 4, false);
    SchedulerConfig cfg = config(32);
    use_policy(cfg, {.watermark = 0.5});
    Scheduler s(cfg, pool);
    Request* a = s.add_request(run_of(10, 20), tokens(2), 0);
    Request* b = s.add_request(run_of(40, 3), tokens(2), 0);
    SchedulerOutput out = s.schedule();
    CHECK(a->state == RequestState::kRunning);
    CHECK(scheduled_tokens(out, a) == 20);
    CHECK(a->block_table.blocks.size() == 5);
    CHECK(b->state == RequestState::kWaiting);
    CHECK(pool.num_free_blocks() == 3);
    for (int guard = 0; !a->finished(); ++guard) {
        REQUIRE(guard < 10);
        complete(s, out);
        out = s.schedule();
        if (!a->finished()) CHECK(b->state == RequestState::kWaiting);
    }
    CHECK(b->state == RequestState::kRunning);
    CHECK(scheduled_tokens(out, b) == 3);
    CHECK(pool.num_free_blocks() == 7);
}

// Prefix caching, 8 blocks of 4. A (17 tokens, 5 blocks) is computed: its 4
// full blocks are cached and A keeps holding them while it decodes. B shares
// A's first 16 tokens and adds 12: 28 tokens, 7 blocks, 4 of them hits. Its
// 3 new blocks are exactly the 3 free ones (hits on held blocks are free of
// charge), it computes only the 12 tokens after the hits, and the stats
// count every token looked up and the 16 served.
TEST_CASE("prefix hits on held blocks skip their tokens and cost no free block") {
    BlockPool pool(8, 4, true);
    Scheduler s(config(32), pool);
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

// Prefix caching, 12 blocks of 4, watermark 0.25 (3 blocks). Z computes 16
// tokens and finishes: its 4 cached blocks sit in the free list. A (19
// tokens, 5 blocks) runs, leaving 7 free, Z's 4 among them. B = Z's tokens +
// 2 (18 tokens, 5 blocks) hits Z's 4 and needs 1 new: 1 + 4 hits taken off
// the free list + 3 of cushion = 8 > 7, so B waits. Without the watermark
// it runs and leaves 2 free.
TEST_CASE("prefix hits on free blocks count against free capacity") {
    for (double wm : {0.25, 0.0}) {
        CAPTURE(wm);
        BlockPool pool(12, 4, true);
        SchedulerConfig cfg = config(48);
        use_policy(cfg, {.watermark = wm});
        Scheduler s(cfg, pool);
        Request* z = s.add_request(run_of(3, 16), tokens(1), 0);
        complete(s, s.schedule());
        REQUIRE(z->finished());
        REQUIRE(pool.num_free_blocks() == 12);
        Request* a = s.add_request(run_of(200, 19), tokens(8), 0);
        complete(s, s.schedule());
        REQUIRE(a->state == RequestState::kRunning);
        REQUIRE(pool.num_free_blocks() == 7);
        std::vector<int32_t> prompt = run_of(3, 16);
        prompt.push_back(300);
        prompt.push_back(301);
        Request* b = s.add_request(prompt, tokens(4), 0);
        const long queries = s.stats().prefix_cache_queries, hits = s.stats().prefix_cache_hits;
        const SchedulerOutput out = s.schedule();
        if (wm > 0) {
            CHECK(b->state == RequestState::kWaiting);
            CHECK(b->block_table.blocks.empty());
            CHECK(b->num_computed_tokens == 0);
            CHECK(pool.num_free_blocks() == 7);
            CHECK(s.stats().prefix_cache_queries == queries);
            CHECK(s.stats().prefix_cache_hits == hits);
        } else {
            CHECK(b->state == RequestState::kRunning);
            CHECK(scheduled_tokens(out, b) == 2);
            CHECK(b->num_computed_tokens == 16);
            CHECK(pool.num_free_blocks() == 2);
            CHECK(s.stats().prefix_cache_queries == queries + 18);
            CHECK(s.stats().prefix_cache_hits == hits + 16);
        }
        CHECK(consistent(s, pool) == "");
    }
}

// tests/exercises/ex13.cpp -- grades exercise 13, "lab L3: reservation and
// the watermark" (lab/policies.hpp: LabPolicy::admission), a lab exercise:
// lab/LAB.md chapter L3.
//
// LabPolicy::admission answers scheduler.hpp's try_admit (exercise 4) with
// other numbers: what must fit, what to allocate, what to keep free. It runs
// for every admission under a LabPolicy, so under every combination of its
// fields: bet or reserve, a watermark or none, any victim, recompute or swap,
// with a waiting-queue cap or not; with the scheduler idle or not; and with
// the card's answer for a gate on or off, with or without prefix hits.
//
// Every scheduler check drives a Scheduler over a small BlockPool directly
// and plays the engine's part itself (complete() in check_util.hpp). The
// expected block counts are worked out in the comments.
//
//   - reserve admission allocates prompt + max_tokens, capped at
//     max_model_len, at once;
//   - the watermark keeps its share of all blocks free while something runs
//     (exactly that share may remain), and a request that waits is not counted
//     as a prefix-cache query;
//   - the watermark never keeps a request out of an idle scheduler;
//   - hits on blocks that sit in the free list count against free capacity,
//     next to the watermark;
//   - admission asked directly, under every combination of the policy's
//     fields, idle and busy, for the card's answers with the gate on and off:
//     reserve replaces what must fit and what is allocated by the request's
//     longest sequence (whatever the card said), the watermark adds its
//     share, rounded down, while something runs, and nothing else changes;
//   - reserve and a watermark together: the reservation must fit beside the
//     watermark's cushion.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/block_pool.hpp"
#include "lab/policies.hpp"
#include "scheduler.hpp"
#include "tests/exercises/check_util.hpp"
#include "tests/exercises/lab_util.hpp"

// doctest last, after every header with an exercise region (main.cpp says why).
#include <doctest/doctest.h>

using namespace pkv;
using namespace pkv_check;

// Reserve admission: A holds 3 + 10 = 13 tokens (4 blocks) from the start;
// B asks for 2 + 100 tokens, capped at max_model_len 24 (6 blocks): exactly
// the 6 that are left. C finds nothing free.
TEST_CASE("reserve admission allocates prompt plus max tokens capped at max model len") {
    BlockPool pool(10, 4, false);
    SchedulerConfig cfg = admission_config(24);
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
        SchedulerConfig cfg = admission_config(32);
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
    SchedulerConfig cfg = admission_config(32);
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
        SchedulerConfig cfg = admission_config(48);
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

// LabPolicy::admission asked directly. 10 blocks of 4, max_model_len 40. The
// request: a 6-token prompt, max_tokens 20 (its longest sequence: 26); a
// second one with max_tokens 100 is capped at 40. The card's answers: the
// gate's for a whole prompt (hold 6, allocate 6), a first chunk's without
// the gate (hold 5, allocate 5), and the gate's for a longer sequence whose
// chunk is short (hold 10, allocate 4). Idle, nothing
// is kept free; with something running the watermark keeps floor(0.3 x 10) =
// 3 blocks, or floor(0.25 x 10) = 2.
TEST_CASE("the admission answer under every combination of the policy's fields") {
    const SchedulerPolicy::Admit cards[] = {{6, 6, 0}, {5, 5, 0}, {10, 4, 0}};
    for (bool busy : {false, true}) {
        BlockPool pool(10, 4, false);
        Scheduler s(admission_config(40), pool);
        if (busy) {
            s.add_request(run_of(90, 3), tokens(30), 0);
            complete(s, s.schedule());
            REQUIRE(s.running().size() == 1u);
        }
        const Request* r = s.add_request(run_of(10, 6), tokens(20), 0);
        const Request* big = s.add_request(run_of(30, 6), tokens(100), 0);
        for (Victim v : {Victim::kNewest, Victim::kOldest, Victim::kFair})
            for (PolicyConfig cfg : every_config_with(v)) {
                for (double wm : {0.0, 0.25, 0.3}) {
                    cfg.watermark = wm;
                    const int64_t keep = !busy ? 0 : wm == 0.3 ? 3 : wm == 0.25 ? 2 : 0;
                    LabPolicy policy(cfg, std::make_shared<SwapTarget>());
                    for (const SchedulerPolicy::Admit& card : cards) {
                        CAPTURE(describe(cfg));
                        CAPTURE(busy);
                        CAPTURE(card.must_hold);
                        CAPTURE(card.alloc_tokens);
                        const bool reserve = cfg.admission == Admission::kReserve;
                        const SchedulerPolicy::Admit a = policy.admission(s, *r, card);
                        CHECK(a.must_hold == (reserve ? 26 : card.must_hold));
                        CHECK(a.alloc_tokens == (reserve ? 26 : card.alloc_tokens));
                        CHECK(a.keep_free == keep);
                        const SchedulerPolicy::Admit b = policy.admission(s, *big, card);
                        CHECK(b.must_hold == (reserve ? 40 : card.must_hold));
                        CHECK(b.alloc_tokens == (reserve ? 40 : card.alloc_tokens));
                        CHECK(b.keep_free == keep);
                    }
                }
            }
    }
}

// Reserve admission with a watermark of 0.2 (2 of 10 blocks). A holds 3 +
// 10 = 13 tokens (4 blocks) from the start: the scheduler was idle, nothing
// kept free. B would reserve 2 + 100 capped at 24 tokens: 6 blocks, exactly
// the 6 left -- enough without the watermark (the reserve check above), but
// the watermark keeps 2 free next to A, so B waits until A is done.
TEST_CASE("reserve and a watermark together") {
    BlockPool pool(10, 4, false);
    SchedulerConfig cfg = admission_config(24);
    use_policy(cfg, {.admission = Admission::kReserve, .watermark = 0.2});
    Scheduler s(cfg, pool);
    Request* a = s.add_request(run_of(10, 3), tokens(10), 0);
    Request* b = s.add_request(run_of(20, 2), tokens(100), 0);
    SchedulerOutput out = s.schedule();
    CHECK(scheduled_tokens(out, a) == 3);
    CHECK(a->block_table.blocks.size() == 4);
    CHECK(b->state == RequestState::kWaiting);
    CHECK(pool.num_free_blocks() == 6);
    for (int guard = 0; !a->finished(); ++guard) {
        REQUIRE(guard < 20);
        complete(s, out);
        out = s.schedule();
        if (!a->finished()) CHECK(b->state == RequestState::kWaiting);
    }
    CHECK(b->state == RequestState::kRunning);
    CHECK(b->block_table.blocks.size() == 6);
    CHECK(consistent(s, pool) == "");
}

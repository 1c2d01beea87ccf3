// tests/exercises/ex11.cpp -- grades exercise 11, "lab L3: choosing the
// victim" (lab/policies.hpp: LabPolicy::pick_victim), a lab exercise:
// lab/LAB.md chapter L3.
//
// pick_victim runs whenever a LabPolicy is the scheduler's policy, so under
// every combination of its fields, not only the victim's: recompute or swap,
// bet or reserve, with a watermark or without, with a waiting-queue cap or
// without. The victim must depend on the victim field and on the running
// requests alone. (The programs make no LabPolicy for the card's own config,
// kNewest with nothing else: lab_util.hpp's use_lab_policy builds one
// anyway, so the kNewest branch is LabPolicy's own code here.)
//
// The scheduler checks share exercise 5's situation (block size 2, 5
// blocks): A and B run from step 1, C joins at step 3, so at step 5 A and B
// have 4 output tokens and C has 2; the pool is full and A's next token
// needs a block.
//
// The checks, and what each one proves:
//   - "victim oldest preempts the front of the running queue": A is the
//     oldest, so A preempts itself, and the loop goes on with B and C.
//   - "victim fair preempts the request furthest ahead": A and B tie with the
//     most output tokens and the tie goes to the newer, B; A and C then run.
//   - "every victim choice under every other policy field": pick_victim
//     asked directly, for each victim under recompute and swap, bet and
//     reserve, watermark and max_waiting on and off, over running queues
//     where the newest, the oldest or one in the middle is furthest ahead
//     and where two tie.
//   - "under swap each victim choice preempts the same requests": the
//     situation above with swap: newest, oldest and fair pick what they pick
//     under recompute, and those are the requests swapped out.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "lab/policies.hpp"
#include "scheduler.hpp"
#include "tests/exercises/check_util.hpp"
#include "tests/exercises/lab_util.hpp"

// doctest last, after every header with an exercise region (main.cpp says why).
#include <doctest/doctest.h>

using namespace pkv;
using namespace pkv_check;

namespace {

SchedulerConfig config(int max_model_len, Victim victim) {
    SchedulerConfig c;
    c.max_model_len = max_model_len;
    use_policy(c, {.victim = victim});
    return c;
}

// Exercise 5's victim situation: returns the output of step 5's schedule().
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
    return s.schedule();  // step 5
}

// A running queue of requests (admission order) with these output counts.
struct Running {
    std::vector<std::unique_ptr<Request>> owned;
    std::vector<Request*> running;
    explicit Running(const std::vector<int>& outputs) {
        for (size_t i = 0; i < outputs.size(); ++i) {
            auto r = std::make_unique<Request>();
            r->id = (int)i;
            r->tokens.assign(3 + (size_t)outputs[i], 7);  // a 3-token prompt and the outputs
            r->num_prompt_tokens = 3;
            r->state = RequestState::kRunning;
            running.push_back(r.get());
            owned.push_back(std::move(r));
        }
    }
};

}  // namespace

TEST_CASE("victim oldest preempts the front of the running queue") {
    BlockPool pool(5, 2, false);
    Scheduler s(config(10, Victim::kOldest), pool);
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

TEST_CASE("victim fair preempts the request furthest ahead") {
    BlockPool pool(5, 2, false);
    Scheduler s(config(10, Victim::kFair), pool);
    const SchedulerOutput out = victim_step(s, pool);
    CHECK(names(out.preempted) == "B");  // 4 outputs like A, and newer
    CHECK(names(out.scheduled) == "AC");
    CHECK(counts(out.scheduled) == "1,1");
    CHECK(names(s.running()) == "AC");
    CHECK(s.request(0)->block_table.blocks.size() == 3u);
    CHECK(s.request(1)->block_table.blocks.empty());
    CHECK(s.request(2)->block_table.blocks.size() == 2u);
    CHECK(pool.num_free_blocks() == 0);
    CHECK(consistent(s, pool) == "");
}

// Running queues A B C D (oldest first) by output tokens, and whom each
// victim choice names: newest D, oldest A, fair the most outputs, the newer
// of a tie.
TEST_CASE("every victim choice under every other policy field") {
    struct Queue {
        std::vector<int> outputs;
        std::string fair;
    };
    const Queue queues[] = {
        {{3, 5, 5, 1}, "C"},  // B and C tie: the newer
        {{1, 2, 3, 4}, "D"},  // the newest is furthest ahead
        {{6, 2, 2, 2}, "A"},  // the oldest is
        {{0, 0, 0, 0}, "D"},  // everyone ties
        {{2}, "A"},           // one request: the victim whatever the choice
    };
    for (const Queue& q : queues) {
        Running r(q.outputs);
        const std::string newest(1, (char)('A' + q.outputs.size() - 1));
        for (Victim v : {Victim::kNewest, Victim::kOldest, Victim::kFair}) {
            const std::string want = v == Victim::kNewest ? newest : v == Victim::kOldest ? "A" : q.fair;
            for (const PolicyConfig& cfg : every_config_with(v)) {
                CAPTURE(describe(cfg));
                CAPTURE(q.outputs.size());
                CAPTURE(q.fair);
                LabPolicy policy(cfg, std::make_shared<SwapTarget>());
                Request* got = policy.pick_victim(r.running);
                REQUIRE(got != nullptr);
                CHECK(std::string(1, (char)('A' + got->id)) == want);
            }
        }
    }
}

// Exercise 5's situation under swap (8 host slots): the same victims as under
// recompute (newest: C, then B itself; oldest: A itself; fair: B), now swapped
// out, front of the swapped queue first.
TEST_CASE("under swap each victim choice preempts the same requests") {
    struct Case {
        Victim victim;
        std::string preempted, scheduled, swapped;
    };
    for (const Case& k : {Case{Victim::kNewest, "CB", "A", "BC"}, Case{Victim::kOldest, "A", "BC", "A"},
                          Case{Victim::kFair, "B", "AC", "B"}}) {
        CAPTURE(std::string(to_string(k.victim)));
        BlockPool pool(5, 2, false);
        SchedulerConfig cfg;
        cfg.max_model_len = 10;
        Copies copies;
        use_lab_policy(cfg, {.victim = k.victim, .preemption = Preemption::kSwap, .swap_space_blocks = 8}, &copies, &pool);
        Scheduler s(cfg, pool);
        const SchedulerOutput out = victim_step(s, pool);
        CHECK(names(out.preempted) == k.preempted);
        CHECK(names(out.scheduled) == k.scheduled);
        CHECK(names(s.running()) == k.scheduled);
        CHECK(names_swapped(s) == k.swapped);
        CHECK(s.waiting().empty());
        CHECK(lab(s).stats().num_swap_outs == (long)k.preempted.size());
        CHECK(s.policy().check_invariants(s) == "");
        CHECK(consistent(s, pool) == "");
    }
}

// tests/test_scheduler.cpp -- the scheduler (scheduler.hpp) and the engine's
// step loop (engine.hpp) under memory pressure, with vLLM V1 semantics:
//
//   - block tables grow by one block exactly at block boundaries;
//   - preemption picks the newest running request first, victims go to the
//     front of the waiting queue, a request may preempt itself, and nothing is
//     admitted in a step that preempted;
//   - with another victim (lab/policies.hpp, Victim::kOldest) the oldest goes
//     first, and a victim already scheduled in the step leaves it again, its
//     tokens back in the budget;
//   - requests that can never run are rejected at add_request with a reason;
//   - chunked prefill stays inside the token budget;
//   - abort frees every block from every state;
//   - a resumed request gets prefix-cache hits on its own surviving blocks;
//   - output tokens do not depend on preemption (greedy and seeded sampling);
//   - a randomized stress run keeps the block pool consistent after every step;
//   - metrics agree with the event stream;
//   - reserve admission never preempts, the watermark never starves an idle
//     engine (both lab/policies.hpp, through scheduler.hpp's seam).
//
// Scheduler-only tests drive Scheduler + BlockPool directly and play the
// engine's part themselves (simulate_step); the rest run the Engine with a tiny
// random model and a StepClock, so every run is exactly reproducible.
#include "engine.hpp"
#include "lab/policies.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <deque>
#include <memory>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "tests/test_util.hpp"

using namespace pkv;
using namespace pkv_test;

namespace {

// ---------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------

// Requests named by letter in the order they were added: id 0 = A, 1 = B, ...
std::string names(const std::vector<Request*>& v) {
    std::string s;
    for (const Request* r : v) s += (char)('A' + r->id);
    return s;
}
std::string names(const std::deque<Request*>& v) { return names(std::vector<Request*>(v.begin(), v.end())); }
std::string names(const std::vector<ScheduledRequest>& v) {
    std::string s;
    for (const ScheduledRequest& r : v) s += (char)('A' + r.req->id);
    return s;
}

std::string join(const std::vector<int>& v) {
    std::string s;
    for (size_t i = 0; i < v.size(); ++i) s += (i ? "," : "") + std::to_string(v[i]);
    return s;
}

// The engine tests' model (tiny_model() below) has 40 tokens.
constexpr int kTinyVocab = 40;

// A prompt for tiny_model(): ids 3..39, never one of the special ids 0..2
// (<unk>, BOS, EOS in llama2.c vocabularies).
std::vector<int32_t> random_prompt(Rng& rng, int n) { return random_tokens(rng, n, kTinyVocab, 3); }

std::string invariants(const Scheduler& s, const BlockPool& pool) { return check_invariants(pool, s.all_block_tables()); }

SchedulerConfig sched_config(int max_model_len) {
    SchedulerConfig c;
    c.max_model_len = max_model_len;
    return c;
}

SamplingParams max_tokens(int n) {
    SamplingParams p;
    p.max_tokens = n;
    p.ignore_eos = true;
    return p;
}

// What Engine::step does after schedule(), minus the model: mark the scheduled
// tokens computed, append an output token to every request whose computation
// reached its end, and finish those at max_tokens / max_model_len.
void simulate_step(Scheduler& s, const SchedulerOutput& out, int32_t token = 7, double now = 0.0) {
    std::vector<Request*> sampled;
    for (const ScheduledRequest& sr : out.scheduled) {
        const bool reaches_end = sr.req->num_computed_tokens + sr.num_new_tokens == sr.req->num_tokens();
        s.on_computed(*sr.req, sr.num_new_tokens);
        if (reaches_end) sampled.push_back(sr.req);
    }
    for (Request* r : sampled) {
        r->tokens.push_back(token);
        if (r->num_output_tokens() >= r->params.max_tokens) s.finish(*r, FinishReason::kMaxTokens, now);
        else if (r->num_tokens() >= s.config().max_model_len) s.finish(*r, FinishReason::kMaxModelLen, now);
    }
}

// Completes `out` and then schedules and completes step after step until
// nothing is unfinished, checking the pool after every step. Returns the
// outputs of those later steps, in order.
std::vector<SchedulerOutput> run_to_end(Scheduler& s, const BlockPool& pool, SchedulerOutput out, int max_steps) {
    std::vector<SchedulerOutput> steps;
    for (int guard = 0; s.has_unfinished(); ++guard) {
        REQUIRE(guard < max_steps);
        simulate_step(s, out);
        out = s.schedule();
        REQUIRE(invariants(s, pool) == "");
        steps.push_back(out);
    }
    return steps;
}

// The "several victims" setup, on a pool of 5 blocks of one token: A {10, 11}
// and B {12, 13} take 2 blocks each, C {14} the last one, D {15} waits. Runs
// and completes that first step.
void run_first_step_of_abcd(Scheduler& s, const BlockPool& pool) {
    for (const std::vector<int32_t>& prompt : {std::vector<int32_t>{10, 11}, {12, 13}, {14}, {15}})
        s.add_request(prompt, max_tokens(3), 0);
    const SchedulerOutput out = s.schedule();
    CHECK(names(out.scheduled) == "ABC");
    CHECK(names(s.waiting()) == "D");
    CHECK(pool.num_free_blocks() == 0);
    simulate_step(s, out);
}

// The engine tests' model: tiny, so hundreds of runs take seconds. dim 16,
// hidden 32, 1 layer, 2 query heads over 1 kv head, context 256.
const Model& tiny_model() {
    static const Model m = make_random_model(config_of(16, 32, 1, 2, 1, kTinyVocab, 256, false), 20240601);
    return m;
}

EngineConfig engine_config(int num_blocks, int block_size) {
    EngineConfig ec;
    ec.num_blocks = num_blocks;
    ec.block_size = block_size;
    ec.log_interval_s = 0;
    return ec;
}

// What the std::invalid_argument says that building an Engine on tiny_model()
// with `ec` throws; "" when it builds.
std::string construction_error(const EngineConfig& ec) {
    try {
        (void)Engine(pkv_test::runner(tiny_model()), ec);
    } catch (const std::invalid_argument& e) {
        return e.what();
    }
    return "";
}

// Every event an engine emits, in order.
struct Recorder {
    std::vector<StreamEvent> events;
    void attach(Engine& e) {
        e.on_event = [this](const StreamEvent& ev) { events.push_back(ev); };
    }
    long count(EventType t, int id = -1) const {
        return (long)std::count_if(events.begin(), events.end(),
                                   [&](const StreamEvent& e) { return e.type == t && (id < 0 || e.request_id == id); });
    }
    long count_finished(FinishReason r) const {
        return (long)std::count_if(events.begin(), events.end(),
                                   [&](const StreamEvent& e) { return e.type == EventType::kFinished && e.reason == r; });
    }
};

// A batch of requests to replay against several engine configurations.
struct Workload {
    std::vector<std::vector<int32_t>> prompts;
    std::vector<SamplingParams> params;
};

// n greedy requests: prompt length in [prompt_lo, prompt_hi], max_tokens in
// [tokens_lo, tokens_hi].
Workload random_workload(Rng& rng, int n, int prompt_lo, int prompt_hi, int tokens_lo, int tokens_hi) {
    Workload w;
    for (int i = 0; i < n; ++i) {
        w.prompts.push_back(random_prompt(rng, rng.uniform(prompt_lo, prompt_hi)));
        w.params.push_back(max_tokens(rng.uniform(tokens_lo, tokens_hi)));
    }
    return w;
}

struct RunResult {
    std::vector<std::vector<int32_t>> outputs;
    std::vector<int> preemptions;
    std::vector<FinishReason> reasons;
    Metrics metrics;
    int max_running = 0;
};

// Add every request at once, step to completion, checking the pool after each step.
RunResult run_workload(const Workload& w, const EngineConfig& ec) {
    StepClock clock;
    Engine eng(pkv_test::runner(tiny_model()), ec, &clock);
    for (size_t i = 0; i < w.prompts.size(); ++i) eng.add_request(w.prompts[i], w.params[i]);
    RunResult res;
    long steps = 0;
    while (eng.has_unfinished()) {
        eng.step();
        REQUIRE(eng.check_invariants() == "");
        res.max_running = std::max(res.max_running, (int)eng.scheduler().running().size());
        REQUIRE(++steps < 20000);
    }
    for (size_t i = 0; i < w.prompts.size(); ++i) {
        const Request* r = eng.request((int)i);
        res.outputs.emplace_back(r->tokens.begin() + r->num_prompt_tokens, r->tokens.end());
        res.preemptions.push_back(r->num_preemptions);
        res.reasons.push_back(r->finish_reason);
    }
    res.metrics = eng.metrics();
    CHECK(eng.pool().num_free_blocks() == ec.num_blocks);
    return res;
}

// 8 requests: prompts of 4..16 tokens, every other one behind a shared
// 8-token prefix, max_tokens 20..28; greedy, or sampled at temperature 0.8 /
// top_p 0.9 with a seed per request.
Workload determinism_workload(bool sampled) {
    Rng rng(sampled ? 11 : 10);
    Workload w;
    const std::vector<int32_t> common = random_prompt(rng, 8);
    for (int i = 0; i < 8; ++i) {
        std::vector<int32_t> p = random_prompt(rng, rng.uniform(4, 16));
        if (i % 2 == 0) p.insert(p.begin(), common.begin(), common.end());  // shared prefix
        SamplingParams sp = max_tokens(rng.uniform(20, 28));
        if (sampled) {
            sp.temperature = 0.8f;
            sp.top_p = 0.9f;
            sp.seed = 1000 + (uint64_t)i;
        }
        w.prompts.push_back(p);
        w.params.push_back(sp);
    }
    return w;
}

// Calls f(workload, ample) for determinism_workload greedy and sampled, each
// with prefix caching off and on. `ample` has room for the whole workload at
// its longest, so nobody is preempted; the same with 14 blocks preempts about
// once per request.
template <class F>
void for_each_determinism_case(F f) {
    for (bool sampled : {false, true}) {
        const Workload w = determinism_workload(sampled);
        for (bool caching : {false, true}) {
            CAPTURE(sampled);
            CAPTURE(caching);
            EngineConfig ample = engine_config(256, 4);
            ample.sched.max_model_len = 56;
            ample.enable_prefix_caching = caching;
            f(w, ample);
        }
    }
}

}  // namespace

TEST_SUITE("scheduler") {

// ---------------------------------------------------------------------------
// 1. Block growth
// ---------------------------------------------------------------------------

// Proves a block table gains one block exactly when computed + new tokens crosses a multiple of block_size.
TEST_CASE("block table grows exactly at block boundaries") {
    SUBCASE("decode from a 1-token prompt") {
        BlockPool pool(16, 4, false);
        Scheduler s(sched_config(64), pool);
        Request* r = s.add_request({5}, max_tokens(20), 0);
        std::vector<int> covered, blocks, used;
        for (int step = 0; step < 13; ++step) {
            const SchedulerOutput out = s.schedule();
            REQUIRE(out.scheduled.size() == 1);
            CHECK(out.scheduled[0].num_new_tokens == 1);
            covered.push_back(r->num_computed_tokens + out.scheduled[0].num_new_tokens);
            blocks.push_back((int)r->block_table.blocks.size());
            used.push_back(16 - pool.num_free_blocks());
            simulate_step(s, out);
            REQUIRE(invariants(s, pool) == "");
        }
        CHECK(join(covered) == "1,2,3,4,5,6,7,8,9,10,11,12,13");
        CHECK(join(blocks) == "1,1,1,1,2,2,2,2,3,3,3,3,4");
        CHECK(join(used) == "1,1,1,1,2,2,2,2,3,3,3,3,4");
    }
    SUBCASE("a prompt that fills its last block exactly") {
        BlockPool pool(16, 4, false);
        Scheduler s(sched_config(64), pool);
        Request* r = s.add_request({5, 6, 7, 8}, max_tokens(20), 0);
        SchedulerOutput out = s.schedule();
        CHECK(out.scheduled[0].num_new_tokens == 4);
        CHECK(r->block_table.blocks.size() == 1);
        simulate_step(s, out);
        out = s.schedule();  // position 4: the first token of block 2
        CHECK(out.scheduled[0].num_new_tokens == 1);
        CHECK(r->block_table.blocks.size() == 2);
        CHECK(pool.num_free_blocks() == 14);
    }
    SUBCASE("chunked prefill allocates per chunk") {
        BlockPool pool(16, 4, false);
        SchedulerConfig cfg = sched_config(64);
        cfg.max_num_batched_tokens = 3;
        cfg.full_sequence_must_fit = false;
        Scheduler s(cfg, pool);
        Request* r = s.add_request(std::vector<int32_t>(10, 9), max_tokens(20), 0);
        std::vector<int> covered, blocks;
        for (int step = 0; step < 7; ++step) {
            const SchedulerOutput out = s.schedule();
            REQUIRE(out.scheduled.size() == 1);
            covered.push_back(r->num_computed_tokens + out.scheduled[0].num_new_tokens);
            blocks.push_back((int)r->block_table.blocks.size());
            simulate_step(s, out);
        }
        CHECK(join(covered) == "3,6,9,10,11,12,13");
        CHECK(join(blocks) == "1,2,3,3,3,3,4");
    }
}

// ---------------------------------------------------------------------------
// 2-4. Preemption
// ---------------------------------------------------------------------------

// Proves victims are taken newest first (C before B) and pushed to the waiting front, leaving [B, C, D].
TEST_CASE("preemption takes the newest running request first; victims go to the waiting front") {
    // A, B, C run and D waits on a full pool. A's growth preempts C (not B); then
    // B cannot grow and, being the newest now, preempts itself.
    BlockPool pool(3, 4, false);
    Scheduler s(sched_config(12), pool);
    for (int i = 0; i < 4; ++i) s.add_request({10, 11, 12, 13}, max_tokens(8), 0);  // A B C D, one block each
    SchedulerOutput out = s.schedule();
    CHECK(names(out.scheduled) == "ABC");
    CHECK(names(s.waiting()) == "D");
    CHECK(pool.num_free_blocks() == 0);
    simulate_step(s, out);  // each of A, B, C now has 5 tokens: the next one needs a second block

    out = s.schedule();
    CHECK(names(out.preempted) == "CB");
    CHECK(names(out.scheduled) == "A");
    CHECK(names(s.running()) == "A");
    CHECK(names(s.waiting()) == "BCD");
    CHECK(out.resumed.empty());
    for (int id : {1, 2}) {
        const Request* v = s.request(id);
        CHECK(v->state == RequestState::kPreempted);
        CHECK(v->num_preemptions == 1);
        CHECK(v->num_computed_tokens == 0);
        CHECK(v->block_table.blocks.empty());
        CHECK(v->num_tokens() == 5);  // its output token is kept, to be recomputed
    }
    CHECK(s.stats().num_preemptions_total == 2);
    CHECK(s.request(0)->block_table.blocks.size() == 2);
    CHECK(pool.num_free_blocks() == 1);
    CHECK(invariants(s, pool) == "");

    // Run to the end: B, then C, then D are admitted, in that order.
    std::vector<Request*> admitted;
    for (const SchedulerOutput& later : run_to_end(s, pool, out, 200))
        for (const ScheduledRequest& sr : later.scheduled)
            if (std::find(admitted.begin(), admitted.end(), sr.req) == admitted.end() && sr.req->id != 0) admitted.push_back(sr.req);
    CHECK(names(admitted) == "BCD");
    for (int id = 0; id < 4; ++id) CHECK(s.request(id)->finish_reason == FinishReason::kMaxTokens);
    CHECK(pool.num_free_blocks() == 3);
}

// Proves the victim loop keeps preempting newest first (C, then B) while the requester still cannot grow.
TEST_CASE("one requester can preempt several victims, newest first") {
    // A decode needs one block and every victim frees at least one, so this needs
    // a requester that wants two blocks at once: A gets two uncomputed tokens
    // (as a multi-token step would). C's one block is not enough, so B goes too.
    BlockPool pool(5, 1, false);  // block_size 1: every token is a block
    Scheduler s(sched_config(5), pool);
    run_first_step_of_abcd(s, pool);
    Request* a = s.request(0);
    a->tokens.push_back(8);  // A now has two uncomputed tokens: it needs two new blocks
    SchedulerOutput out = s.schedule();
    CHECK(names(out.preempted) == "CB");
    CHECK(names(out.scheduled) == "A");
    REQUIRE(out.scheduled.size() == 1);
    CHECK(out.scheduled[0].num_new_tokens == 2);
    CHECK(a->block_table.blocks.size() == 4);
    CHECK(names(s.waiting()) == "BCD");
    CHECK(pool.num_free_blocks() == 1);
    CHECK(invariants(s, pool) == "");
}

// Proves the newest request preempts itself when it cannot grow, and the step goes on without it.
TEST_CASE("the newest request preempts itself when it cannot grow") {
    BlockPool pool(2, 4, false);
    Scheduler s(sched_config(8), pool);
    Request* a = s.add_request({10, 11}, max_tokens(6), 0);
    Request* b = s.add_request({12, 13, 14, 15}, max_tokens(4), 0);
    SchedulerOutput out = s.schedule();
    CHECK(names(out.scheduled) == "AB");
    simulate_step(s, out);  // A: 3 tokens (fits in its block); B: 5 tokens (needs a second)
    out = s.schedule();
    CHECK(names(out.preempted) == "B");
    CHECK(names(out.scheduled) == "A");
    CHECK(out.total_num_scheduled_tokens == 1);
    CHECK(names(s.running()) == "A");
    CHECK(names(s.waiting()) == "B");
    CHECK(b->state == RequestState::kPreempted);
    CHECK(b->num_preemptions == 1);
    CHECK(b->num_tokens() == 5);
    CHECK(b->block_table.blocks.empty());
    CHECK(a->block_table.blocks.size() == 1);
    CHECK(pool.num_free_blocks() == 1);
    CHECK(invariants(s, pool) == "");
    // B resumes once A is done, and finishes.
    run_to_end(s, pool, out, 100);
    CHECK(a->finish_reason == FinishReason::kMaxTokens);
    CHECK(b->finish_reason == FinishReason::kMaxTokens);
    CHECK(b->num_output_tokens() == 4);
}

// Proves nothing is admitted in a step that preempted, even when the victim would fit again at once.
TEST_CASE("no admission in a step with a preemption") {
    BlockPool pool(4, 4, false);
    SchedulerConfig cfg = sched_config(16);
    cfg.max_num_batched_tokens = 8;
    cfg.full_sequence_must_fit = false;  // admission needs only the first chunk's blocks
    Scheduler s(cfg, pool);
    Request* a = s.add_request({10, 11, 12, 13}, max_tokens(8), 0);
    Request* b = s.add_request(std::vector<int32_t>(12, 20), max_tokens(2), 0);
    SchedulerOutput out = s.schedule();
    CHECK(names(out.scheduled) == "AB");  // A whole, B's first chunk of 4
    CHECK(pool.num_free_blocks() == 2);
    simulate_step(s, out);

    // A grows into block 2; B's next chunk (7 tokens) needs 2 more blocks, only
    // one is left, and B is the newest: it preempts itself.
    out = s.schedule();
    CHECK(names(out.preempted) == "B");
    CHECK(names(out.scheduled) == "A");
    CHECK(names(s.waiting()) == "B");
    // B's first chunk under the budget left this step would fit right now...
    const int budget_left = cfg.max_num_batched_tokens - out.total_num_scheduled_tokens;
    CHECK(blocks_for_tokens(std::min(b->num_tokens(), budget_left), 4) <= pool.num_free_blocks());
    // ...but it was not admitted.
    CHECK(b->state == RequestState::kPreempted);
    CHECK(out.resumed.empty());
    CHECK(pool.num_free_blocks() == 2);

    simulate_step(s, out);
    out = s.schedule();
    CHECK(out.preempted.empty());
    CHECK(names(out.resumed) == "B");
    CHECK(names(out.scheduled) == "AB");
    CHECK(b->state == RequestState::kRunning);
    CHECK(a->state == RequestState::kRunning);
    CHECK(invariants(s, pool) == "");
}

// Proves full_sequence_must_fit waits for the whole sequence's blocks; without it the first chunk's suffice.
TEST_CASE("full_sequence_must_fit admits only what fits whole") {
    for (bool must_fit : {true, false}) {
        CAPTURE(must_fit);
        BlockPool pool(4, 4, false);
        SchedulerConfig cfg = sched_config(16);
        cfg.max_num_batched_tokens = 9;
        cfg.full_sequence_must_fit = must_fit;
        Scheduler s(cfg, pool);
        Request* a = s.add_request(std::vector<int32_t>(8, 3), max_tokens(4), 0);   // 2 blocks
        Request* b = s.add_request(std::vector<int32_t>(12, 4), max_tokens(2), 0);  // 3 blocks whole, 1 for a chunk of 1
        const SchedulerOutput out = s.schedule();
        CHECK(a->state == RequestState::kRunning);
        if (must_fit) {
            CHECK(names(out.scheduled) == "A");
            CHECK(b->state == RequestState::kWaiting);
            CHECK(pool.num_free_blocks() == 2);
        } else {
            CHECK(names(out.scheduled) == "AB");
            REQUIRE(out.scheduled.size() == 2);
            CHECK(out.scheduled[1].num_new_tokens == 1);
            CHECK(b->block_table.blocks.size() == 1);
            CHECK(pool.num_free_blocks() == 1);
        }
        CHECK(invariants(s, pool) == "");
    }
}

// ---------------------------------------------------------------------------
// 4b. Victim::kOldest
// ---------------------------------------------------------------------------
//
// The contrast to vLLM's choice: the victim is running_.front(), the request
// admitted earliest. It stands *before* the cursor of schedule()'s running
// loop, so unlike a kNewest victim it may already have been given tokens in
// this very step; preempt() then takes them out of the step again.

// Proves kOldest preempts the oldest running request first, even one already scheduled this step, and how the waiting queue orders its victims.
TEST_CASE("victim oldest: the oldest running request goes first, even one scheduled earlier in the step") {
    // The first scenario of "preemption takes the newest ..." with A and B
    // growing later than C: A, B and C run, D waits on a full pool.
    for (Victim victim : {Victim::kOldest, Victim::kNewest}) {
        CAPTURE((int)victim);
        BlockPool pool(3, 4, false);
        SchedulerConfig cfg = sched_config(12);
        use_policy(cfg, {.victim = victim});
        Scheduler s(cfg, pool);
        s.add_request({10, 11}, max_tokens(8), 0);          // A: 1 block, the next position (2) still fits
        s.add_request({12, 13}, max_tokens(8), 0);          // B: the same
        s.add_request({14, 15, 16, 17}, max_tokens(8), 0);  // C: its next position (4) needs a second block
        s.add_request({18, 19}, max_tokens(8), 0);          // D: waits
        SchedulerOutput out = s.schedule();
        CHECK(names(out.scheduled) == "ABC");
        CHECK(names(s.waiting()) == "D");
        CHECK(pool.num_free_blocks() == 0);
        simulate_step(s, out);

        out = s.schedule();
        CHECK(out.total_num_scheduled_tokens <= cfg.max_num_batched_tokens);
        CHECK(out.resumed.empty());
        CHECK(invariants(s, pool) == "");
        if (victim == Victim::kNewest) {
            // For contrast: A and B go on, C (the newest) preempts itself.
            CHECK(names(out.preempted) == "C");
            CHECK(names(out.scheduled) == "AB");
            CHECK(names(s.waiting()) == "CD");
        } else {
            // A was given its decode token before C asked for a block; as C's
            // victim it is taken out of the step again, and its block is C's.
            CHECK(names(out.preempted) == "A");
            CHECK(names(out.scheduled) == "BC");
            CHECK(out.total_num_scheduled_tokens == 2);
            CHECK(names(s.running()) == "BC");
            CHECK(names(s.waiting()) == "AD");
            const Request* a = s.request(0);
            CHECK(a->state == RequestState::kPreempted);
            CHECK(a->num_preemptions == 1);
            CHECK(a->num_computed_tokens == 0);
            CHECK(a->block_table.blocks.empty());
            CHECK(a->num_tokens() == 3);  // its output token is kept, to be recomputed
            CHECK(s.request(2)->block_table.blocks.size() == 2);

            // Two steps later B, now the oldest, reaches its block boundary:
            // being the front of running_, it preempts itself and C goes on.
            simulate_step(s, out);
            out = s.schedule();
            CHECK(out.preempted.empty());
            simulate_step(s, out);
            out = s.schedule();
            CHECK(names(out.preempted) == "B");
            CHECK(names(out.scheduled) == "C");
            // Each victim goes to the front: the later victim B now stands
            // before the older A. (kNewest victims leave newest first, so
            // there the queue stays in arrival order.)
            CHECK(names(s.waiting()) == "BAD");
            CHECK(invariants(s, pool) == "");
        }

        // Run to the end. Who comes back, in order, and who paid: with kOldest
        // B and A resume together as B, A, which makes B the oldest again, and
        // B is the victim twice more; with kNewest each request but A pays once.
        std::string resumed;
        for (const SchedulerOutput& later : run_to_end(s, pool, out, 200)) resumed += names(later.resumed);
        std::vector<int> preemptions;
        for (int id = 0; id < 4; ++id) {
            CHECK(s.request(id)->finish_reason == FinishReason::kMaxTokens);
            preemptions.push_back(s.request(id)->num_preemptions);
        }
        if (victim == Victim::kOldest) {
            CHECK(resumed == "BABB");
            CHECK(join(preemptions) == "1,3,0,0");
        } else {
            CHECK(resumed == "BCD");
            CHECK(join(preemptions) == "0,1,1,1");
        }
        CHECK(pool.num_free_blocks() == 3);
    }
}

// Proves one kOldest requester preempts oldest first, itself too when it is the oldest, and that a victim scheduled earlier in the step leaves SchedulerOutput::scheduled.
TEST_CASE("victim oldest: one requester can preempt several victims, oldest first") {
    // The setup of "one requester can preempt several victims, newest first",
    // with the newest request, C, wanting two blocks at once.
    BlockPool pool(5, 1, false);  // block_size 1: every token is a block
    SchedulerConfig cfg = sched_config(5);
    use_policy(cfg, {.victim = Victim::kOldest});
    Scheduler s(cfg, pool);
    run_first_step_of_abcd(s, pool);
    Request* c = s.request(2);
    c->tokens.push_back(8);  // C now has two uncomputed tokens: it needs two new blocks

    // A is first in the loop and cannot grow: as the oldest it is its own
    // victim (kOldest never looks behind the requester). Its 2 blocks let B
    // grow, so B is scheduled. C then needs 2 blocks, 1 is free: the oldest
    // running request is now B, which is taken out of the step again.
    const SchedulerOutput out = s.schedule();
    CHECK(names(out.preempted) == "AB");
    CHECK(names(out.scheduled) == "C");
    REQUIRE(out.scheduled.size() == 1);
    CHECK(out.scheduled[0].num_new_tokens == 2);
    CHECK(out.total_num_scheduled_tokens == 2);
    CHECK(c->block_table.blocks.size() == 3);
    CHECK(s.request(1)->block_table.blocks.empty());
    CHECK(s.request(1)->num_computed_tokens == 0);
    CHECK(names(s.running()) == "C");
    CHECK(names(s.waiting()) == "BAD");
    CHECK(pool.num_free_blocks() == 2);
    CHECK(invariants(s, pool) == "");
    run_to_end(s, pool, out, 100);
    for (int id = 0; id < 4; ++id) CHECK(s.request(id)->finish_reason == FinishReason::kMaxTokens);
}

// Proves the tokens of a kOldest victim that was scheduled earlier in the step go back to the step's budget: a later prefill chunk gets them.
TEST_CASE("victim oldest: a victim's tokens are refunded to the step's budget") {
    // Budget 9, chunked prefill. Step 1: A's 7-token prompt and 2 tokens of
    // B's 4. Step 2: A decodes, B finishes its prompt, C is admitted with a
    // chunk of 6 (2 blocks), leaving 1 free block. Step 3 is the one we watch.
    for (Victim victim : {Victim::kOldest, Victim::kNewest}) {
        CAPTURE((int)victim);
        BlockPool pool(6, 4, false);
        SchedulerConfig cfg = sched_config(24);
        cfg.max_num_batched_tokens = 9;
        cfg.full_sequence_must_fit = false;
        use_policy(cfg, {.victim = victim});
        Scheduler s(cfg, pool);
        Request* a = s.add_request(std::vector<int32_t>(7, 5), max_tokens(8), 0);
        Request* b = s.add_request(std::vector<int32_t>(4, 6), max_tokens(8), 0);
        Request* c = s.add_request(std::vector<int32_t>(16, 7), max_tokens(8), 0);
        SchedulerOutput out = s.schedule();
        CHECK(names(out.scheduled) == "AB");
        simulate_step(s, out);
        out = s.schedule();
        CHECK(names(out.scheduled) == "ABC");
        REQUIRE(out.scheduled.size() == 3);
        CHECK(out.scheduled[2].num_new_tokens == 6);
        CHECK(pool.num_free_blocks() == 1);
        simulate_step(s, out);
        REQUIRE(a->num_computed_tokens == 8);  // its next position, 8, needs a third block
        REQUIRE(b->num_computed_tokens == 4);  // its next position, 4, needs a second block

        // A takes the last free block for position 8 and is scheduled
        // (budget 9 -> 8). B cannot grow.
        out = s.schedule();
        CHECK(out.total_num_scheduled_tokens <= cfg.max_num_batched_tokens);
        CHECK(invariants(s, pool) == "");
        if (victim == Victim::kOldest) {
            // B's victim is A: A's 3 blocks (the one it just got included) go
            // back, and so does its token (budget 8 -> 9). B takes 1 (-> 8),
            // and C's chunk is what is left of its prompt within the budget:
            // 8 tokens, where 7 would mean A's token had not come back.
            CHECK(names(out.preempted) == "A");
            CHECK(names(out.scheduled) == "BC");
            REQUIRE(out.scheduled.size() == 2);
            CHECK(out.scheduled[0].num_new_tokens == 1);
            CHECK(out.scheduled[1].num_new_tokens == 8);
            CHECK(out.total_num_scheduled_tokens == cfg.max_num_batched_tokens);
            CHECK(a->block_table.blocks.empty());
            CHECK(c->block_table.blocks.size() == 4);
            CHECK(pool.num_free_blocks() == 0);
        } else {
            // B's victim is C, behind the cursor and not yet scheduled.
            CHECK(names(out.preempted) == "C");
            CHECK(names(out.scheduled) == "AB");
            CHECK(out.total_num_scheduled_tokens == 2);
        }
        run_to_end(s, pool, out, 200);
        for (const Request* r : {a, b, c}) CHECK(r->finish_reason == FinishReason::kMaxTokens);
    }
}

// ---------------------------------------------------------------------------
// 5. Rejection and startup validation
// ---------------------------------------------------------------------------

// Proves requests that can never run are rejected at add_request with a reason, and the rest still finish.
TEST_CASE("requests that can never run are rejected at add_request") {
    StepClock clock;
    Engine eng(pkv_test::runner(tiny_model()), engine_config(4, 4), &clock);  // 16 token slots: max_model_len 16
    REQUIRE(eng.config().sched.max_model_len == 16);
    Recorder rec;
    rec.attach(eng);
    Rng rng(5);
    const int ok1 = eng.add_request(random_prompt(rng, 5), max_tokens(4));
    const int too_long = eng.add_request(random_prompt(rng, 20), max_tokens(4));     // longer than the pool
    const int exactly = eng.add_request(random_prompt(rng, 16), max_tokens(1));      // prompt == max_model_len
    const int empty = eng.add_request({}, max_tokens(4));
    const int zero_tokens = eng.add_request(random_prompt(rng, 3), max_tokens(0));
    const int capped = eng.add_request(random_prompt(rng, 15), max_tokens(10));      // room for exactly one token
    const int ok2 = eng.add_request(random_prompt(rng, 6), max_tokens(5));
    for (int id : {too_long, exactly, empty, zero_tokens}) {
        CAPTURE(id);
        const Request* r = eng.request(id);
        CHECK(r->finished());
        CHECK(r->finish_reason == FinishReason::kRejected);
        CHECK(!r->reject_reason.empty());
        CHECK(!r->retryable);
        CHECK(rec.count(EventType::kRejected, id) == 1);
    }
    CHECK(eng.request(too_long)->reject_reason.find("max_model_len") != std::string::npos);
    CHECK(eng.metrics().num_requests_rejected == 4);
    CHECK(eng.scheduler().waiting().size() == 3);
    eng.run_until_done();
    CHECK(eng.request(ok1)->finish_reason == FinishReason::kMaxTokens);
    CHECK(eng.request(ok1)->num_output_tokens() == 4);
    CHECK(eng.request(ok2)->finish_reason == FinishReason::kMaxTokens);
    CHECK(eng.request(ok2)->num_output_tokens() == 5);
    CHECK(eng.request(capped)->finish_reason == FinishReason::kMaxModelLen);
    CHECK(eng.request(capped)->num_tokens() == 16);
    CHECK(rec.count(EventType::kToken, too_long) == 0);
    CHECK(eng.check_invariants() == "");
    CHECK(eng.pool().num_free_blocks() == 4);
}

// Proves max_waiting sheds the overflow with a retryable rejection, and a later retry is accepted.
TEST_CASE("max_waiting rejects the overflow as retryable") {
    StepClock clock;
    EngineConfig ec = engine_config(16, 4);
    use_policy(ec.sched, {.max_waiting = 2});
    Engine eng(pkv_test::runner(tiny_model()), ec, &clock);
    Rng rng(6);
    const int a = eng.add_request(random_prompt(rng, 4), max_tokens(3));
    const int b = eng.add_request(random_prompt(rng, 4), max_tokens(3));
    const int c = eng.add_request(random_prompt(rng, 4), max_tokens(3));
    CHECK(eng.request(a)->state == RequestState::kWaiting);
    CHECK(eng.request(b)->state == RequestState::kWaiting);
    CHECK(eng.request(c)->finish_reason == FinishReason::kRejected);
    CHECK(eng.request(c)->retryable);
    CHECK(!eng.request(c)->reject_reason.empty());
    CHECK(eng.metrics().num_requests_rejected == 1);
    eng.step();  // both admitted: the queue is empty again
    const int retry = eng.add_request(random_prompt(rng, 4), max_tokens(3));
    CHECK(eng.request(retry)->state == RequestState::kWaiting);
    eng.run_until_done();
    for (int id : {a, b, retry}) CHECK(eng.request(id)->finish_reason == FinishReason::kMaxTokens);
}

// Proves an impossible max_model_len fails at startup with std::invalid_argument naming the flag to change.
TEST_CASE("engine construction validates max_model_len") {
    SUBCASE("larger than the pool") {
        EngineConfig ec = engine_config(4, 4);
        ec.sched.max_model_len = 17;  // needs 5 blocks
        const std::string msg = construction_error(ec);
        CHECK(!msg.empty());
        CHECK(msg.find("--num-blocks") != std::string::npos);
        ec.sched.max_model_len = 16;  // exactly fits
        CHECK_NOTHROW((void)Engine(pkv_test::runner(tiny_model()), ec));
    }
    SUBCASE("larger than the model's context") {
        EngineConfig ec = engine_config(128, 4);  // 512 slots, the model has 256
        ec.sched.max_model_len = 257;
        const std::string msg = construction_error(ec);
        CHECK(!msg.empty());
        CHECK(msg.find("--max-model-len") != std::string::npos);
    }
    SUBCASE("derived from the smaller of pool and context") {
        CHECK(Engine(pkv_test::runner(tiny_model()), engine_config(128, 4)).config().sched.max_model_len == 256);
        CHECK(Engine(pkv_test::runner(tiny_model()), engine_config(10, 4)).config().sched.max_model_len == 40);
    }
}

// ---------------------------------------------------------------------------
// 6. Chunked prefill
// ---------------------------------------------------------------------------

// Proves every step stays within max_num_batched_tokens and no token is emitted before a prompt's last chunk.
TEST_CASE("chunked prefill respects the token budget") {
    StepClock clock;
    EngineConfig ec = engine_config(64, 4);
    ec.sched.max_num_batched_tokens = 5;
    Engine eng(pkv_test::runner(tiny_model()), ec, &clock);
    int bad_token_events = 0;
    eng.on_event = [&](const StreamEvent& e) {
        if (e.type != EventType::kToken) return;
        const Request* r = eng.request(e.request_id);
        // The sampled token was appended after every earlier position was computed.
        if (r->num_computed_tokens != r->num_tokens() - 1 || r->num_computed_tokens < r->num_prompt_tokens) ++bad_token_events;
    };
    Rng rng(7);
    const int alone = eng.add_request(random_prompt(rng, 23), max_tokens(3));
    eng.step();
    CHECK(eng.request(alone)->num_computed_tokens == 5);
    CHECK(eng.request(alone)->num_output_tokens() == 0);
    eng.run_until_done();
    // 23 tokens at 5 per step: the first token comes out of step 5 (t = 4).
    CHECK(eng.request(alone)->first_token_time == doctest::Approx(4.0));

    std::vector<int> ids;
    for (int len : {23, 7, 12, 1, 30, 5}) ids.push_back(eng.add_request(random_prompt(rng, len), max_tokens(6)));
    int saturated = 0;
    for (int guard = 0; eng.has_unfinished(); ++guard) {
        REQUIRE(guard < 500);
        const int n = eng.step();
        CHECK(n <= 5);
        CHECK(n >= 1);
        saturated += n == 5;
        REQUIRE(eng.check_invariants() == "");
    }
    CHECK(saturated > 5);
    CHECK(bad_token_events == 0);
    for (int id : ids) CHECK(eng.request(id)->num_output_tokens() == 6);
    CHECK(eng.metrics().prompt_tokens_total == 23 + 23 + 7 + 12 + 1 + 30 + 5);
}

// ---------------------------------------------------------------------------
// 7. Abort
// ---------------------------------------------------------------------------

// Proves abort from every state frees all the request's blocks before returning and emits kFinished(aborted).
TEST_CASE("abort from every state frees the request's blocks at once") {
    const int kBlocks = 12;
    for (bool caching : {false, true}) {
        CAPTURE(caching);
        StepClock clock;
        EngineConfig ec = engine_config(kBlocks, 4);  // max_model_len 48
        ec.sched.max_num_batched_tokens = 4;
        ec.enable_prefix_caching = caching;
        Engine eng(pkv_test::runner(tiny_model()), ec, &clock);
        Recorder rec;
        rec.attach(eng);
        Rng rng(8);
        // Blocks that aborting `id` must give back: those only it holds.
        auto private_blocks = [&](int id) {
            int n = 0;
            for (int32_t b : eng.request(id)->block_table.blocks) n += eng.pool().block(b).ref_cnt == 1;
            return n;
        };
        auto abort_and_check = [&](int id, RequestState expected_state) {
            REQUIRE(eng.request(id)->state == expected_state);
            const int expect_free = eng.pool().num_free_blocks() + private_blocks(id);
            const long events_before = rec.count_finished(FinishReason::kAborted);
            CHECK(eng.abort(id));
            CHECK(eng.pool().num_free_blocks() == expect_free);
            CHECK(eng.request(id)->block_table.blocks.empty());
            CHECK(eng.request(id)->finish_reason == FinishReason::kAborted);
            CHECK(eng.check_invariants() == "");
            CHECK(rec.count_finished(FinishReason::kAborted) == events_before + 1);
            REQUIRE(!rec.events.empty());
            CHECK(rec.events.back().request_id == id);
            const auto& w = eng.scheduler().waiting();
            const auto& run = eng.scheduler().running();
            CHECK(std::find(w.begin(), w.end(), eng.request(id)) == w.end());
            CHECK(std::find(run.begin(), run.end(), eng.request(id)) == run.end());
        };

        // Waiting.
        const int waiting = eng.add_request(random_prompt(rng, 6), max_tokens(20));
        abort_and_check(waiting, RequestState::kWaiting);

        // Running, mid-prefill, next to a request that shares its prefix (with
        // caching, the shared blocks have two holders and must stay allocated).
        const std::vector<int32_t> shared = random_prompt(rng, 10);
        std::vector<int32_t> sibling_prompt = shared, prefill_prompt = shared;
        for (int32_t t : random_prompt(rng, 2)) sibling_prompt.push_back(t);
        for (int32_t t : random_prompt(rng, 10)) prefill_prompt.push_back(t);
        const int holder = eng.add_request(shared, max_tokens(2));
        eng.run_until_done();  // with caching, leaves `shared`'s two full blocks cached
        const int sibling = eng.add_request(sibling_prompt, max_tokens(20));
        const int prefill = eng.add_request(prefill_prompt, max_tokens(10));
        for (int guard = 0; eng.request(prefill)->state != RequestState::kRunning; ++guard) {
            REQUIRE(guard < 20);
            eng.step();
        }
        REQUIRE(eng.request(prefill)->num_computed_tokens < eng.request(prefill)->num_prompt_tokens);
        REQUIRE(eng.request(sibling)->state == RequestState::kRunning);
        if (caching) {
            CHECK(private_blocks(prefill) < (int)eng.request(prefill)->block_table.blocks.size());
            CHECK(eng.request(prefill)->block_table.blocks[0] == eng.request(sibling)->block_table.blocks[0]);
        }
        abort_and_check(prefill, RequestState::kRunning);
        CHECK(eng.request(sibling)->block_table.blocks.size() >= 3);
        eng.run_until_done();
        CHECK(eng.request(sibling)->finish_reason == FinishReason::kMaxTokens);
        CHECK(eng.pool().num_free_blocks() == kBlocks);

        // Running, decoding.
        const int decode = eng.add_request(random_prompt(rng, 3), max_tokens(20));
        eng.step();
        eng.step();
        REQUIRE(eng.request(decode)->num_output_tokens() == 2);
        abort_and_check(decode, RequestState::kRunning);
        CHECK(eng.pool().num_free_blocks() == kBlocks);

        // Preempted, back in the waiting queue: two requests of 8 blocks each outgrow 12.
        const int older = eng.add_request(random_prompt(rng, 4), max_tokens(27));
        const int newer = eng.add_request(random_prompt(rng, 4), max_tokens(27));
        for (int guard = 0; eng.request(newer)->state != RequestState::kPreempted; ++guard) {
            REQUIRE(guard < 100);
            eng.step();
        }
        CHECK(eng.request(older)->state == RequestState::kRunning);
        abort_and_check(newer, RequestState::kPreempted);
        CHECK(rec.count(EventType::kPreempted, newer) == 1);

        // Finished (naturally, and aborted already): false, no event.
        eng.run_until_done();
        CHECK(eng.request(older)->finish_reason == FinishReason::kMaxTokens);
        const size_t events = rec.events.size();
        for (int id : {holder, sibling, older, waiting, prefill, decode, newer}) CHECK_FALSE(eng.abort(id));
        CHECK_FALSE(eng.abort(12345));
        CHECK_FALSE(eng.abort(-1));
        CHECK(rec.events.size() == events);
        CHECK(eng.pool().num_free_blocks() == kBlocks);
        CHECK(rec.count_finished(FinishReason::kAborted) == 4);
    }
}

// Proves an abort from inside on_event ends the request at once: no later token or event, reason stays kAborted.
TEST_CASE("abort from inside the event callback ends the request at once") {
    StepClock clock;
    Engine eng(pkv_test::runner(tiny_model()), engine_config(16, 4), &clock);
    Recorder rec;
    Rng rng(16);
    const int a = eng.add_request(random_prompt(rng, 3), max_tokens(3));
    const int b = eng.add_request(random_prompt(rng, 3), max_tokens(3));
    eng.on_event = [&](const StreamEvent& e) {
        rec.events.push_back(e);
        if (e.type != EventType::kToken || e.request_id != a) return;
        if (e.output_index == 0) eng.abort(b);  // another request sampled in the same step
        if (e.output_index == 2) eng.abort(a);  // itself, on what would be its last token
    };
    eng.run_until_done();
    for (int id : {a, b}) {
        CAPTURE(id);
        CHECK(eng.request(id)->finish_reason == FinishReason::kAborted);
        CHECK(rec.count(EventType::kFinished, id) == 1);
        // Nothing for this request after its kFinished.
        const auto fin = std::find_if(rec.events.begin(), rec.events.end(), [&](const StreamEvent& e) {
            return e.type == EventType::kFinished && e.request_id == id;
        });
        REQUIRE(fin != rec.events.end());
        CHECK(std::none_of(fin + 1, rec.events.end(), [&](const StreamEvent& e) { return e.request_id == id; }));
    }
    CHECK(eng.request(b)->num_output_tokens() == 0);
    CHECK(eng.metrics().num_requests_finished == 0);
    CHECK(eng.check_invariants() == "");
    CHECK(eng.pool().num_free_blocks() == 16);
}

// Proves Scheduler::abort removes preempted and never-run requests from the waiting queue and frees everything.
TEST_CASE("scheduler abort removes requests from the queues") {
    BlockPool pool(2, 4, false);
    Scheduler s(sched_config(8), pool);
    Request* a = s.add_request({10, 11}, max_tokens(6), 0);
    Request* b = s.add_request({12, 13, 14, 15}, max_tokens(4), 0);
    Request* c = s.add_request({16}, max_tokens(4), 0);
    SchedulerOutput out = s.schedule();
    simulate_step(s, out);
    out = s.schedule();
    REQUIRE(b->state == RequestState::kPreempted);
    CHECK(names(s.waiting()) == "BC");
    CHECK(s.abort(b->id, 1.0));
    CHECK(names(s.waiting()) == "C");
    CHECK(s.abort(c->id, 1.0));
    CHECK(s.waiting().empty());
    CHECK(s.abort(a->id, 1.0));
    CHECK(pool.num_free_blocks() == 2);
    CHECK_FALSE(s.has_unfinished());
    CHECK_FALSE(s.abort(a->id, 2.0));
    CHECK(a->finish_time == doctest::Approx(1.0));
    CHECK(invariants(s, pool) == "");
}

// ---------------------------------------------------------------------------
// 8. Resume with prefix caching
// ---------------------------------------------------------------------------

// Proves a resumed request hits its own surviving cached blocks and recomputes only the evicted ones.
TEST_CASE("a resumed request hits its own surviving blocks in the prefix cache") {
    BlockPool pool(5, 4, true);
    Scheduler s(sched_config(20), pool);
    Request* a = s.add_request({1, 2, 3, 4}, max_tokens(6), 0);
    Request* b = s.add_request({20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31}, max_tokens(3), 0);
    SchedulerOutput out = s.schedule();
    CHECK(names(out.scheduled) == "AB");
    const std::vector<int32_t> b_blocks = b->block_table.blocks;
    REQUIRE(b_blocks.size() == 3);
    simulate_step(s, out);  // B's three blocks are full and cached; B has 13 tokens

    out = s.schedule();  // A takes the last free block; B cannot grow and preempts itself
    CHECK(names(out.preempted) == "B");
    CHECK(pool.num_free_blocks() == 3);
    long hits_before = s.stats().prefix_cache_hits;
    // A grows until it takes one block from the free list: B's last block
    // (freed first), which loses its cached contents.
    for (int guard = 0; a->block_table.blocks.size() < 3; ++guard) {
        REQUIRE(guard < 20);
        simulate_step(s, out);
        out = s.schedule();
        CHECK(b->state == RequestState::kPreempted);  // does not fit next to A yet
    }
    CHECK(a->block_table.blocks.back() == b_blocks[2]);
    CHECK_FALSE(pool.prefix_index().cached(b_blocks[2]));  // evicted when A took it
    simulate_step(s, out);  // A reaches max_tokens and frees its blocks
    REQUIRE(a->finished());

    out = s.schedule();
    CHECK(names(out.resumed) == "B");
    REQUIRE(b->block_table.blocks.size() == 4);
    CHECK(b->block_table.blocks[0] == b_blocks[0]);
    CHECK(b->block_table.blocks[1] == b_blocks[1]);
    CHECK(b->num_computed_tokens == 8);
    CHECK(s.stats().prefix_cache_hits - hits_before == 8);
    REQUIRE(out.scheduled.size() == 1);
    CHECK(out.scheduled[0].num_new_tokens == 5);  // positions 8..12; 8..11 are recomputed
    CHECK(invariants(s, pool) == "");
    while (s.has_unfinished()) {
        simulate_step(s, out);
        out = s.schedule();
    }
    CHECK(b->finish_reason == FinishReason::kMaxTokens);
}

// Proves prefix caching cuts recomputed tokens after preemption, with the same preemptions and outputs.
TEST_CASE("prefix caching reduces recomputation after preemption") {
    Rng rng(9);
    Workload w;
    for (int i = 0; i < 6; ++i) {
        w.prompts.push_back(random_prompt(rng, 16));
        w.params.push_back(max_tokens(24));
    }
    EngineConfig ec = engine_config(16, 4);
    const RunResult off = run_workload(w, ec);
    ec.enable_prefix_caching = true;
    const RunResult on = run_workload(w, ec);
    CHECK(off.metrics.num_preemptions_total > 0);
    CHECK(on.metrics.num_preemptions_total == off.metrics.num_preemptions_total);
    CHECK(off.metrics.prefix_cache_hits == 0);
    CHECK(on.metrics.prefix_cache_hits > 0);
    CHECK(off.metrics.recomputed_tokens_total > 0);
    CHECK(on.metrics.recomputed_tokens_total < off.metrics.recomputed_tokens_total);
    CHECK(on.outputs == off.outputs);
}

// ---------------------------------------------------------------------------
// 9. Determinism under preemption
// ---------------------------------------------------------------------------

// Proves outputs do not depend on preemption: greedy and seeded sampling, caching on/off, reserve admission.
TEST_CASE("outputs are identical with and without preemption") {
    for_each_determinism_case([](const Workload& w, const EngineConfig& ample) {
        EngineConfig small = ample;
        small.num_blocks = 14;
        EngineConfig reserve = small;
        use_policy(reserve.sched, {.admission = Admission::kReserve});
        const RunResult ra = run_workload(w, ample);
        const RunResult rs = run_workload(w, small);
        const RunResult rr = run_workload(w, reserve);
        CHECK(ra.metrics.num_preemptions_total == 0);
        CHECK(rs.metrics.num_preemptions_total >= (long)w.prompts.size());  // one per request on average
        CHECK(*std::max_element(rs.preemptions.begin(), rs.preemptions.end()) >= 2);
        CHECK(rr.metrics.num_preemptions_total == 0);
        for (size_t i = 0; i < w.prompts.size(); ++i) {
            CAPTURE(i);
            CHECK(ra.reasons[i] == FinishReason::kMaxTokens);
            CHECK((int)ra.outputs[i].size() == w.params[i].max_tokens);
            CHECK(rs.outputs[i] == ra.outputs[i]);
            CHECK(rr.outputs[i] == ra.outputs[i]);
        }
        // Not a degenerate model: outputs vary.
        std::set<int32_t> distinct;
        for (const auto& o : ra.outputs) distinct.insert(o.begin(), o.end());
        CHECK(distinct.size() >= 5);
    });
}

// Proves outputs do not depend on preemption with Victim::kOldest either: greedy and seeded sampling, caching on/off.
TEST_CASE("victim oldest: outputs are identical to a run without preemption") {
    for_each_determinism_case([](const Workload& w, const EngineConfig& ample) {
        EngineConfig oldest = ample;
        oldest.num_blocks = 14;
        use_policy(oldest.sched, {.victim = Victim::kOldest});
        EngineConfig newest = oldest;
        use_policy(newest.sched, {.victim = Victim::kNewest});
        const RunResult ra = run_workload(w, ample);
        const RunResult ro = run_workload(w, oldest);
        const RunResult rn = run_workload(w, newest);
        CHECK(ra.metrics.num_preemptions_total == 0);
        CHECK(ro.metrics.num_preemptions_total >= (long)w.prompts.size() / 2);
        // On this workload kOldest preempts no more often than kNewest, yet
        // recomputes more: its victims are the ones that had done the most.
        CHECK(ro.metrics.num_preemptions_total <= rn.metrics.num_preemptions_total);
        CHECK(ro.metrics.recomputed_tokens_total > rn.metrics.recomputed_tokens_total);
        for (size_t i = 0; i < w.prompts.size(); ++i) {
            CAPTURE(i);
            CHECK(ro.reasons[i] == FinishReason::kMaxTokens);
            CHECK(ro.outputs[i] == ra.outputs[i]);
        }
    });
}

// ---------------------------------------------------------------------------
// 10. Randomized stress
// ---------------------------------------------------------------------------

// Proves pool invariants after every step and clean termination over hundreds of random workloads.
TEST_CASE("randomized stress: invariants after every step") {
    const int kWorkloads = 400;
    long workloads_with_preemption = 0;
    long total_steps = 0, total_preemptions = 0, total_aborts = 0, total_rejected = 0, total_hits = 0;
    long oldest_workloads_with_preemption = 0, oldest_preemptions = 0;
    int max_per_request = 0;
    for (int wi = 0; wi < kWorkloads; ++wi) {
        CAPTURE(wi);
        Rng rng(0xC0FFEE + (uint64_t)wi * 7919);
        EngineConfig ec;
        ec.log_interval_s = 0;
        ec.block_size = rng.pick(std::vector<int>{1, 2, 4, 8, 16});
        const int min_blocks = std::max(1, (4 + ec.block_size - 1) / ec.block_size);
        ec.num_blocks = rng.uniform(min_blocks, std::max(min_blocks, 80 / ec.block_size));
        ec.enable_prefix_caching = rng.chance(0.5);
        ec.sched.max_num_seqs = rng.uniform(1, 8);
        ec.sched.max_num_batched_tokens = rng.uniform(1, 48);
        PolicyConfig pol;
        pol.watermark = rng.chance(0.5) ? 0.0 : 0.1;
        pol.admission = rng.chance(0.3) ? Admission::kReserve : Admission::kBet;
        ec.sched.full_sequence_must_fit = rng.chance(0.5);
        pol.max_waiting = rng.chance(0.2) ? rng.uniform(1, 6) : 0;
        pol.victim = rng.chance(0.5) ? Victim::kOldest : Victim::kNewest;
        use_policy(ec.sched, pol);
        const int pool_tokens = ec.num_blocks * ec.block_size;
        if (rng.chance(0.3)) ec.sched.max_model_len = rng.uniform(2, std::min(pool_tokens, 256));
        CAPTURE(ec.block_size);
        CAPTURE(ec.num_blocks);
        CAPTURE(ec.enable_prefix_caching);
        CAPTURE(ec.sched.max_num_seqs);
        CAPTURE(ec.sched.max_num_batched_tokens);
        CAPTURE(pol.watermark);
        CAPTURE((int)pol.admission);
        CAPTURE(ec.sched.full_sequence_must_fit);
        CAPTURE(pol.max_waiting);
        CAPTURE((int)pol.victim);

        StepClock clock;
        Engine eng(pkv_test::runner(tiny_model()), ec, &clock);
        const int mml = eng.config().sched.max_model_len;
        CAPTURE(mml);
        long token_events = 0, finished_events = 0, rejected_events = 0, preempted_events = 0;
        // A victim leaves the step it was preempted in (with kOldest possibly
        // after being scheduled in it): no token of this step may be its.
        std::set<int> step_victims;
        long tokens_to_victims = 0;
        eng.on_event = [&](const StreamEvent& e) {
            token_events += e.type == EventType::kToken;
            finished_events += e.type == EventType::kFinished;
            rejected_events += e.type == EventType::kRejected;
            preempted_events += e.type == EventType::kPreempted;
            if (e.type == EventType::kPreempted) step_victims.insert(e.request_id);
            tokens_to_victims += e.type == EventType::kToken && step_victims.count(e.request_id) > 0;
        };

        const std::vector<int32_t> shared_prefix = random_prompt(rng, rng.uniform(1, 24));
        const int num_requests = rng.uniform(1, 14);
        std::vector<std::vector<int32_t>> prompts;
        std::vector<SamplingParams> params;
        for (int i = 0; i < num_requests; ++i) {
            // Mostly prompts that fit; some at or past max_model_len, a few empty.
            // With prefix caching, half start with a piece of a shared prefix.
            const int len = rng.chance(0.08) ? rng.uniform(mml - 1, mml + 3)
                            : rng.chance(0.03) ? 0 : rng.uniform(1, std::max(1, std::min(40, mml - 1)));
            std::vector<int32_t> p;
            if (ec.enable_prefix_caching && rng.chance(0.5))
                p.assign(shared_prefix.begin(), shared_prefix.begin() + std::min(len, rng.uniform(1, (int)shared_prefix.size())));
            const std::vector<int32_t> tail = random_prompt(rng, len - (int)p.size());
            p.insert(p.end(), tail.begin(), tail.end());
            SamplingParams sp;
            sp.max_tokens = rng.chance(0.03) ? 0 : rng.uniform(1, 40);
            sp.ignore_eos = rng.chance(0.7);
            if (rng.chance(0.2)) sp.stop_token_ids = {rng.uniform(3, 39)};
            if (rng.chance(0.4)) {
                sp.temperature = 0.8f;
                sp.top_p = rng.chance(0.5) ? 0.9f : 1.0f;
                sp.seed = rng.next();
            }
            prompts.push_back(p);
            params.push_back(sp);
        }

        std::vector<bool> aborted(num_requests, false);
        int next = 0;
        long steps = 0;
        const long step_limit = 20000;
        while (next < num_requests || eng.has_unfinished()) {
            // Arrivals: a few requests may show up before each step.
            for (int k = rng.uniform(0, 2); k > 0 && next < num_requests; --k, ++next) {
                const int id = eng.add_request(prompts[next], params[next]);
                REQUIRE(id == next);
            }
            if (!eng.has_unfinished()) {
                if (next < num_requests) continue;
                break;
            }
            // Random aborts, including of requests that are already finished.
            if (next > 0 && rng.chance(0.04)) {
                const int id = rng.uniform(0, next - 1);
                const bool was_unfinished = !eng.request(id)->finished();
                CHECK(eng.abort(id) == was_unfinished);
                if (was_unfinished) aborted[id] = true;
                REQUIRE(eng.check_invariants() == "");
                if (!eng.has_unfinished()) continue;
            }
            int n = 0;
            step_victims.clear();
            try {
                n = eng.step();
            } catch (const std::exception& e) {
                FAIL("step threw: " << e.what());
            }
            ++steps;
            REQUIRE(eng.check_invariants() == "");
            CHECK(n <= ec.sched.max_num_batched_tokens);
            CHECK(n >= 1);
            CHECK(tokens_to_victims == 0);
            CHECK((int)eng.scheduler().running().size() <= ec.sched.max_num_seqs);
            if (pol.admission == Admission::kReserve) CHECK(eng.metrics().num_preemptions_total == 0);
            for (const Request* r : eng.scheduler().running()) {
                CHECK(r->state == RequestState::kRunning);
                CHECK((int)r->block_table.blocks.size() >= blocks_for_tokens(r->num_computed_tokens, ec.block_size));
                CHECK(r->num_tokens() <= mml);
            }
            for (const Request* r : eng.scheduler().waiting()) {
                CHECK(r->block_table.blocks.empty());
                CHECK(r->num_computed_tokens == 0);
            }
            REQUIRE(steps < step_limit);
        }
        total_steps += steps;

        // Every request finished, with a valid reason; every block is free.
        int finished_not_rejected = 0;
        for (int id = 0; id < num_requests; ++id) {
            CAPTURE(id);
            const Request* r = eng.request(id);
            REQUIRE(r->finished());
            CHECK(r->block_table.blocks.empty());
            switch (r->finish_reason) {
                case FinishReason::kStop:
                    CHECK(!aborted[id]);
                    break;
                case FinishReason::kMaxTokens:
                    CHECK(r->num_output_tokens() == r->params.max_tokens);
                    CHECK(!aborted[id]);
                    break;
                case FinishReason::kMaxModelLen:
                    CHECK(r->num_tokens() == mml);
                    CHECK(!aborted[id]);
                    break;
                case FinishReason::kAborted: CHECK(aborted[id]); break;
                case FinishReason::kRejected:
                    CHECK(!r->reject_reason.empty());
                    CHECK(r->num_output_tokens() == 0);
                    ++total_rejected;
                    break;
                case FinishReason::kNone: FAIL("finished without a reason"); break;
                case FinishReason::kError: FAIL("a forward pass failed: " << r->reject_reason); break;
            }
            finished_not_rejected += r->finish_reason != FinishReason::kRejected;
            CHECK(r->num_tokens() <= std::max(mml, r->num_prompt_tokens));
            max_per_request = std::max(max_per_request, r->num_preemptions);
        }
        CHECK(eng.pool().num_free_blocks() == ec.num_blocks);
        CHECK_FALSE(eng.has_unfinished());
        const Metrics& m = eng.metrics();
        CHECK(token_events == m.generation_tokens_total);
        CHECK(preempted_events == m.num_preemptions_total);
        CHECK(finished_events == finished_not_rejected);
        CHECK(rejected_events == m.num_requests_rejected);
        total_preemptions += m.num_preemptions_total;
        workloads_with_preemption += m.num_preemptions_total > 0;
        if (pol.victim == Victim::kOldest) {
            oldest_preemptions += m.num_preemptions_total;
            oldest_workloads_with_preemption += m.num_preemptions_total > 0;
        }
        total_hits += m.prefix_cache_hits;
        for (bool a : aborted) total_aborts += a;

        // Outputs match a preemption-free reference run of the accepted requests:
        // equal when they finished on their own, a prefix when aborted.
        EngineConfig ref_cfg = engine_config(16 * 256, 1);  // room for every request at its longest
        ref_cfg.sched.max_model_len = mml;
        ref_cfg.sched.max_num_seqs = 64;
        ref_cfg.sched.max_num_batched_tokens = 4096;
        StepClock ref_clock;
        Engine ref(pkv_test::runner(tiny_model()), ref_cfg, &ref_clock);
        std::vector<int> ref_id(num_requests, -1);
        for (int id = 0; id < num_requests; ++id)
            if (eng.request(id)->finish_reason != FinishReason::kRejected) ref_id[id] = ref.add_request(prompts[id], params[id]);
        ref.run_until_done();
        CHECK(ref.metrics().num_preemptions_total == 0);
        for (int id = 0; id < num_requests; ++id) {
            if (ref_id[id] < 0) continue;
            CAPTURE(id);
            const Request* r = eng.request(id);
            const Request* q = ref.request(ref_id[id]);
            REQUIRE(q->finish_reason != FinishReason::kRejected);
            if (r->finish_reason == FinishReason::kAborted) {
                CHECK(r->num_tokens() <= q->num_tokens());
                CHECK(std::equal(r->tokens.begin(), r->tokens.end(), q->tokens.begin()));
            } else {
                CHECK(r->tokens == q->tokens);
                CHECK(r->finish_reason == q->finish_reason);
            }
        }
    }
    MESSAGE("stress: " << kWorkloads << " workloads (" << workloads_with_preemption << " with preemptions), " << total_steps
                       << " steps, " << total_preemptions << " preemptions (max "
                       << max_per_request << " per request), " << total_aborts << " aborts, " << total_rejected
                       << " rejections, " << total_hits << " prefix-cache hit tokens; victim oldest: "
                       << oldest_workloads_with_preemption << " workloads with " << oldest_preemptions << " preemptions");
    // The generator really exercises what it claims to.
    CHECK(workloads_with_preemption > kWorkloads / 5);
    CHECK(total_preemptions > 300);
    CHECK(max_per_request >= 3);
    CHECK(total_aborts > 20);
    CHECK(total_rejected > 20);
    CHECK(total_hits > 0);
    CHECK(oldest_workloads_with_preemption > kWorkloads / 10);
    CHECK(oldest_preemptions > 100);
}

// ---------------------------------------------------------------------------
// 11. Metrics vs events
// ---------------------------------------------------------------------------

// Proves the metrics (and the Prometheus text) agree with the events a client saw.
TEST_CASE("metrics agree with the event stream") {
    StepClock clock;
    EngineConfig ec = engine_config(12, 4);
    use_policy(ec.sched, {.max_waiting = 9});
    Engine eng(pkv_test::runner(tiny_model()), ec, &clock);
    Recorder rec;
    rec.attach(eng);
    Rng rng(12);
    for (int i = 0; i < 12; ++i) eng.add_request(random_prompt(rng, rng.uniform(3, 14)), max_tokens(rng.uniform(8, 30)));
    eng.add_request(random_prompt(rng, 60), max_tokens(4));  // rejected: longer than max_model_len (48)
    for (int i = 0; i < 6; ++i) eng.step();
    const bool aborted_while_preempted = eng.request(3)->state == RequestState::kPreempted;
    CHECK(eng.abort(3));
    eng.run_until_done();
    const Metrics& m = eng.metrics();
    const int n = eng.scheduler().num_requests();

    long per_request_preemptions = 0, first_tokens = 0, finished = 0, natural = 0, rejected = 0;
    long high_water = 0, prompt_high_water = 0;
    for (int id = 0; id < n; ++id) {
        const Request* r = eng.request(id);
        per_request_preemptions += r->num_preemptions;
        first_tokens += r->first_token_time >= 0;
        finished += r->finish_reason != FinishReason::kRejected;
        natural += r->finish_reason != FinishReason::kRejected && r->finish_reason != FinishReason::kAborted;
        rejected += r->finish_reason == FinishReason::kRejected;
        high_water += r->num_computed_high_water;
        prompt_high_water += std::min(r->num_computed_high_water, r->num_prompt_tokens);
    }
    CHECK(m.num_preemptions_total > 0);
    CHECK(rec.count(EventType::kToken) == m.generation_tokens_total);
    CHECK(rec.count(EventType::kPreempted) == m.num_preemptions_total);
    CHECK(per_request_preemptions == m.num_preemptions_total);
    // Every victim came back, except one aborted while it waited.
    CHECK(rec.count(EventType::kResumed) == m.num_preemptions_total - (aborted_while_preempted ? 1 : 0));
    CHECK(rec.count(EventType::kFinished) == finished);
    CHECK(rec.count_finished(FinishReason::kAborted) == 1);
    CHECK(m.num_requests_finished == natural);
    CHECK(m.num_requests_aborted == 1);
    CHECK(rec.count(EventType::kRejected) == m.num_requests_rejected);
    CHECK(m.num_requests_rejected == rejected);
    CHECK(rejected == 4);  // three over max_waiting, one too long
    CHECK((long)m.time_to_first_token.count() == first_tokens);
    CHECK((long)m.inter_token_latency.count() == m.generation_tokens_total - first_tokens);
    CHECK((long)m.e2e_request_latency.count() == natural);
    CHECK((long)m.request_preemptions.count() == natural);
    // Every computed token is either new (it raised a high-water mark) or recomputed.
    CHECK(m.computed_tokens_total == high_water + m.recomputed_tokens_total);
    CHECK(m.prompt_tokens_total == prompt_high_water);
    CHECK(m.recomputed_tokens_total > 0);
    const std::string prom = eng.prometheus();
    CHECK(prom.find("\npagedkv:num_preemptions_total " + std::to_string(m.num_preemptions_total) + "\n") != std::string::npos);
    CHECK(prom.find("\npagedkv:generation_tokens_total " + std::to_string(m.generation_tokens_total) + "\n") != std::string::npos);
    CHECK(prom.find("\npagedkv:request_rejected_total " + std::to_string(rejected) + "\n") != std::string::npos);
    CHECK(prom.find("pagedkv:inter_token_latency_seconds_count " + std::to_string(m.generation_tokens_total - first_tokens) + "\n") !=
          std::string::npos);
}

// ---------------------------------------------------------------------------
// 12. Reserve admission and the watermark
// ---------------------------------------------------------------------------

// Proves reserve admission holds prompt + max_tokens up front, never preempts, and still completes.
TEST_CASE("reserve admission never preempts and completes") {
    Rng rng(13);
    const Workload w = random_workload(rng, 10, 4, 12, 16, 30);
    EngineConfig ec = engine_config(16, 4);
    const RunResult bet = run_workload(w, ec);
    use_policy(ec.sched, {.admission = Admission::kReserve});
    const RunResult reserve = run_workload(w, ec);
    CHECK(bet.metrics.num_preemptions_total > 0);
    CHECK(reserve.metrics.num_preemptions_total == 0);
    CHECK(reserve.metrics.recomputed_tokens_total == 0);
    CHECK(reserve.max_running < bet.max_running);
    for (size_t i = 0; i < w.prompts.size(); ++i) {
        CHECK(reserve.reasons[i] == FinishReason::kMaxTokens);
        CHECK(reserve.outputs[i] == bet.outputs[i]);
    }

    // The reservation itself: blocks for prompt + max_tokens at admission.
    BlockPool pool(10, 4, false);
    SchedulerConfig cfg = sched_config(40);
    use_policy(cfg, {.admission = Admission::kReserve});
    Scheduler s(cfg, pool);
    Request* a = s.add_request({1, 2, 3}, max_tokens(10), 0);  // 13 tokens: 4 blocks
    Request* b = s.add_request({4, 5}, max_tokens(39), 0);     // capped at 40: 10 blocks, must wait
    SchedulerOutput out = s.schedule();
    CHECK(names(out.scheduled) == "A");
    CHECK(a->block_table.blocks.size() == 4);
    CHECK(b->state == RequestState::kWaiting);
    for (int guard = 0; s.has_unfinished(); ++guard) {
        REQUIRE(guard < 100);
        CHECK(out.preempted.empty());
        if (a->state == RequestState::kRunning) CHECK(a->block_table.blocks.size() == 4);  // never grows
        simulate_step(s, out);
        out = s.schedule();
    }
    CHECK(a->finish_reason == FinishReason::kMaxTokens);
    CHECK(b->finish_reason == FinishReason::kMaxModelLen);
    CHECK(s.stats().num_preemptions_total == 0);
}

// Proves the watermark keeps its cushion free at admission but never keeps a request out of an idle engine.
TEST_CASE("watermark keeps blocks free at admission but never blocks an idle engine") {
    SUBCASE("admission next to running requests keeps the cushion") {
        BlockPool pool(10, 4, false);
        SchedulerConfig cfg = sched_config(40);
        use_policy(cfg, {.watermark = 0.2});  // 2 blocks
        Scheduler s(cfg, pool);
        s.add_request(std::vector<int32_t>(16, 5), max_tokens(4), 0);  // A: 4 blocks
        s.add_request(std::vector<int32_t>(16, 6), max_tokens(4), 0);  // B: 4 blocks, leaves exactly 2
        Request* c = s.add_request({7, 8, 9}, max_tokens(4), 0);      // C: 1 block would leave 1
        const SchedulerOutput out = s.schedule();
        CHECK(names(out.scheduled) == "AB");
        CHECK(pool.num_free_blocks() == 2);
        CHECK(c->state == RequestState::kWaiting);

        // The same without a watermark admits C.
        BlockPool pool0(10, 4, false);
        Scheduler s0(sched_config(40), pool0);
        s0.add_request(std::vector<int32_t>(16, 5), max_tokens(4), 0);
        s0.add_request(std::vector<int32_t>(16, 6), max_tokens(4), 0);
        s0.add_request({7, 8, 9}, max_tokens(4), 0);
        CHECK(names(s0.schedule().scheduled) == "ABC");
    }
    SUBCASE("prefix hits on free blocks count against the cushion") {
        for (double wm : {0.2, 0.0}) {
            CAPTURE(wm);
            BlockPool pool(10, 4, true);
            SchedulerConfig cfg = sched_config(40);
            use_policy(cfg, {.watermark = wm});
            Scheduler s(cfg, pool);
            std::vector<int32_t> z_prompt(16);
            for (int i = 0; i < 16; ++i) z_prompt[i] = 3 + i;
            Request* z = s.add_request(z_prompt, max_tokens(1), 0);
            simulate_step(s, s.schedule());  // Z computes 16 tokens (4 cached blocks) and finishes
            REQUIRE(z->finished());
            s.add_request(std::vector<int32_t>(15, 30), max_tokens(8), 0);  // A: 4 blocks, for 16 tokens too
            simulate_step(s, s.schedule());
            REQUIRE(pool.num_free_blocks() == 6);  // Z's 4 cached blocks + 2 more
            std::vector<int32_t> b_prompt = z_prompt;
            b_prompt.push_back(31);
            Request* b = s.add_request(b_prompt, max_tokens(4), 0);  // 4 hits (all free) + 1 new block
            const SchedulerOutput out = s.schedule();
            if (wm > 0) {
                CHECK(b->state == RequestState::kWaiting);  // 5 blocks would leave 1 < 2
                CHECK(pool.num_free_blocks() == 6);
            } else {
                CHECK(out.resumed.empty());
                CHECK(b->state == RequestState::kRunning);
                CHECK(b->num_computed_tokens == 16);
                CHECK(pool.num_free_blocks() == 1);
            }
            CHECK(invariants(s, pool) == "");
        }
    }
    SUBCASE("an idle engine admits a request that needs every block") {
        StepClock clock;
        EngineConfig ec = engine_config(8, 4);  // max_model_len 32
        use_policy(ec.sched, {.watermark = 0.5});
        Engine eng(pkv_test::runner(tiny_model()), ec, &clock);
        Rng rng(14);
        const int big = eng.add_request(random_prompt(rng, 29), max_tokens(3));  // 32 tokens: all 8 blocks
        const int small = eng.add_request(random_prompt(rng, 2), max_tokens(2));
        eng.step();
        CHECK(eng.request(big)->state == RequestState::kRunning);
        CHECK(eng.request(small)->state == RequestState::kWaiting);  // no block left, let alone the cushion
        eng.run_until_done();
        CHECK(eng.request(big)->finish_reason == FinishReason::kMaxTokens);
        CHECK(eng.request(small)->finish_reason == FinishReason::kMaxTokens);
        CHECK(eng.metrics().num_preemptions_total == 0);
        CHECK(eng.metrics().max_kv_cache_usage_perc == doctest::Approx(1.0));
    }
    SUBCASE("a watermark run still completes under pressure") {
        Rng rng(15);
        const Workload w = random_workload(rng, 8, 4, 12, 10, 30);
        EngineConfig ec = engine_config(16, 4);
        const RunResult plain = run_workload(w, ec);
        use_policy(ec.sched, {.watermark = 0.25});
        const RunResult wm = run_workload(w, ec);
        for (size_t i = 0; i < w.prompts.size(); ++i) {
            CHECK(wm.reasons[i] == FinishReason::kMaxTokens);
            CHECK(wm.outputs[i] == plain.outputs[i]);
        }
        CHECK(wm.max_running <= plain.max_running);
    }
}

}  // TEST_SUITE("scheduler")

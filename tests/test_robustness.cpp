// Tests for the library's half of "bad input gets a clear error and nothing is
// lost" (the programs' half is test_bad_input.cpp):
//   - the classes that hold references into themselves cannot be copied or
//     moved (checked at compile time);
//   - the door: invalid token ids and sampling parameters are rejected with a
//     reason, and the other requests run exactly as if the bad one never came;
//   - checked errors instead of silent corruption: a NaN watermark or log
//     interval, finish() on a waiting request, percentile(101);
//   - an abort from inside on_event, for every event type, ends the stream at
//     once, keeps every invariant, and leaves the other requests' tokens
//     exactly as in a run without it;
//   - a request whose forward pass fails is finished with an error, alone:
//     the others complete with the tokens they would have had anyway
//     (forward_isolating and ForwardBatch::sequence, which find it).
#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <memory>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "engine.hpp"
#include "lab/fast_cpu.hpp"
#include "tests/test_util.hpp"
#include "tiny_model/forward_gpu.cuh"

using namespace pkv;
using pkv_test::Rng;

namespace {

// Objects that refer to their own members or to each other: a copy or a move
// would leave those references pointing at the original.
static_assert(!std::is_copy_constructible_v<Engine> && !std::is_move_constructible_v<Engine>);
static_assert(!std::is_copy_assignable_v<Engine> && !std::is_move_assignable_v<Engine>);
static_assert(!std::is_copy_constructible_v<Scheduler> && !std::is_move_constructible_v<Scheduler>);
static_assert(!std::is_copy_assignable_v<Scheduler> && !std::is_move_assignable_v<Scheduler>);
static_assert(!std::is_copy_constructible_v<CpuRunner> && !std::is_move_constructible_v<CpuRunner>);
static_assert(!std::is_copy_constructible_v<GpuRunner> && !std::is_move_constructible_v<GpuRunner>);
static_assert(!std::is_copy_constructible_v<CpuForward> && !std::is_move_constructible_v<CpuForward>);
static_assert(!std::is_copy_assignable_v<CpuForward> && !std::is_move_assignable_v<CpuForward>);

constexpr int kVocab = 40;

// dim 16, 1 layer, 2 query heads over 1 kv head: runs take milliseconds.
const Model& model() {
    static const Model m = make_random_model(pkv_test::config_of(16, 32, 1, 2, 1, kVocab, 256, false), 77);
    return m;
}

EngineConfig small_config(int num_blocks = 12, int block_size = 4) {
    EngineConfig ec;
    ec.num_blocks = num_blocks;
    ec.block_size = block_size;
    ec.sched.max_num_seqs = 6;
    ec.sched.max_num_batched_tokens = 32;
    ec.log_interval_s = 0;
    return ec;
}

SamplingParams params(int max_tokens, float temperature = 0.0f, uint64_t seed = 0) {
    SamplingParams p;
    p.max_tokens = max_tokens;
    p.temperature = temperature;
    p.seed = seed;
    p.ignore_eos = true;
    return p;
}

// n prompts of ids 3..39 (never BOS/EOS), lengths 3..9.
std::vector<std::vector<int32_t>> prompts(int n, uint64_t seed) {
    Rng rng(seed);
    std::vector<std::vector<int32_t>> out;
    for (int i = 0; i < n; ++i) out.push_back(pkv_test::random_tokens(rng, rng.uniform(3, 9), kVocab, 3));
    return out;
}

// Steps to the end, checking the pool and the swap space after every step.
void run_checked(Engine& eng) {
    for (int steps = 0; eng.has_unfinished(); ++steps) {
        REQUIRE(steps < 5000);
        eng.step();
        const std::string inv = eng.check_invariants();
        REQUIRE_MESSAGE(inv.empty(), "after step " << steps << ": " << inv);
    }
}

// Output tokens of every request of a finished engine.
std::vector<std::vector<int32_t>> outputs(Engine& eng, int n) {
    std::vector<std::vector<int32_t>> out;
    for (int i = 0; i < n; ++i) {
        const Request* r = eng.request(i);
        out.emplace_back(r->tokens.begin() + r->num_prompt_tokens, r->tokens.end());
    }
    return out;
}

}  // namespace

TEST_SUITE("robustness") {

// Proves a request with an out-of-range token id, or a non-finite temperature or top_p, is rejected at the door with a reason naming the problem, and the other requests complete with exactly the tokens of a run without it.
TEST_CASE("the door rejects bad token ids and sampling parameters; the rest runs unchanged") {
    const auto ps = prompts(4, 5);
    StepClock c0;
    Engine clean(pkv_test::runner(model()), small_config(), &c0);
    for (const auto& p : ps) clean.add_request(p, params(12, 0.8f, 3));
    run_checked(clean);

    struct Bad {
        std::vector<int32_t> prompt;
        SamplingParams sp;
        const char* reason;
    };
    const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
    const std::vector<Bad> bad = {
        {{1, 5, kVocab}, params(12), "not a token id in 0..39"},
        {{1, -1, 5}, params(12), "is -1, not a token id"},
        {{1, 5, 6}, params(12, nan), "temperature must be a finite number"},
        {{1, 5, 6}, params(12, inf), "temperature must be a finite number"},
        {{1, 5, 6}, params(12, -0.5f), "temperature must be a finite number >= 0"},
        {{1, 5, 6}, [&] { SamplingParams p = params(12, 0.7f); p.top_p = nan; return p; }(), "top_p must be a finite number"},
    };
    for (const Bad& b : bad) {
        CAPTURE(b.reason);
        StepClock clock;
        Engine eng(pkv_test::runner(model()), small_config(), &clock);
        int rejected_events = 0;
        eng.on_event = [&](const StreamEvent& e) { rejected_events += e.type == EventType::kRejected; };
        // The bad request arrives between good ones: ids shift, tokens must not.
        eng.add_request(ps[0], params(12, 0.8f, 3));
        eng.add_request(ps[1], params(12, 0.8f, 3));
        const int bad_id = eng.add_request(b.prompt, b.sp);
        eng.add_request(ps[2], params(12, 0.8f, 3));
        eng.add_request(ps[3], params(12, 0.8f, 3));
        CHECK(eng.request(bad_id)->finish_reason == FinishReason::kRejected);
        CHECK(eng.request(bad_id)->reject_reason.find(b.reason) != std::string::npos);
        CHECK(rejected_events == 1);
        run_checked(eng);
        const auto got = outputs(eng, 5), want = outputs(clean, 4);
        CHECK(got[0] == want[0]);
        CHECK(got[1] == want[1]);
        CHECK(got[3] == want[2]);
        CHECK(got[4] == want[3]);
        CHECK(eng.metrics().num_requests_finished == 4);
        CHECK(eng.metrics().num_requests_rejected == 1);
    }
}

// Proves configuration values that are not numbers, and calls that would corrupt state, are checked errors.
TEST_CASE("NaN configuration and misuse are checked errors") {
    EngineConfig ec = small_config();
    pkv_test::use_policy(ec.sched, {.watermark = std::numeric_limits<double>::quiet_NaN()});
    CHECK_THROWS_AS(Engine(pkv_test::runner(model()), ec), std::invalid_argument);
    ec = small_config();
    ec.log_interval_s = std::numeric_limits<double>::quiet_NaN();
    CHECK_THROWS_AS(Engine(pkv_test::runner(model()), ec), std::invalid_argument);
    ec = small_config();
    ec.block_size = kMaxBlockSize + 1;
    CHECK_THROWS_AS(Engine(pkv_test::runner(model()), ec), std::invalid_argument);
    ec = small_config();
    ec.kv_cache_bytes = ~0ull;  // 2^64 bytes: refused with what it needs, before allocating
    try {
        Engine e(pkv_test::runner(model()), ec);
        FAIL("an impossible KV cache was accepted");
    } catch (const std::invalid_argument& e) {
        CHECK(std::string(e.what()).find("2^31 blocks") != std::string::npos);
    }
    ec = small_config(1 << 22, 4096);  // 4M blocks of 4096 slots: terabytes
    try {
        Engine e(pkv_test::runner(model()), ec);
        FAIL("a KV cache larger than the machine was accepted");
    } catch (const std::invalid_argument& e) {
        CHECK(std::string(e.what()).find("needs") != std::string::npos);
        CHECK(std::string(e.what()).find("TiB") != std::string::npos);
    }
    CHECK_THROWS_AS(Engine(nullptr, small_config()), std::invalid_argument);

    // finish() is for running requests; a waiting one must be aborted.
    BlockPool pool(4, 4, false);
    SchedulerConfig sc;
    sc.max_model_len = 16;
    Scheduler s(sc, pool);
    Request* r = s.add_request({1, 5, 6}, params(4), 0.0);
    CHECK_THROWS_AS(s.finish(*r, FinishReason::kStop, 1.0), std::logic_error);
    CHECK(r->state == RequestState::kWaiting);
    CHECK(s.waiting().size() == 1);
    CHECK(s.running().empty());
    CHECK(s.abort(r->id, 1.0));

    // A 2^31-token max_tokens must not overflow the reserve arithmetic.
    SamplingParams huge = params(std::numeric_limits<int>::max());
    Request* h = s.add_request({1, 5, 6}, huge, 0.0);
    CHECK(sequence_cap(s, *h) == 16);

    LatencySamples l;
    l.add(1.0);
    CHECK(l.percentile(100) == 1.0);
    CHECK_THROWS_AS((void)l.percentile(101), std::invalid_argument);
    CHECK_THROWS_AS((void)l.percentile(-1), std::invalid_argument);
    CHECK_THROWS_AS((void)l.percentile(std::numeric_limits<double>::quiet_NaN()), std::invalid_argument);
}

// Proves an abort from inside on_event works for every event type: the aborted request gets exactly one kFinished(aborted) and nothing after it, invariants hold after every step, and every other request's tokens equal a run without the abort.
TEST_CASE("abort from inside on_event, for every event type") {
    // A pool too small for 6 requests of up to 9 + 16 tokens: preemptions,
    // resumes, finishes; one request rejected (an empty prompt).
    const auto ps = prompts(6, 11);
    auto submit = [&](Engine& eng) {
        for (const auto& p : ps) eng.add_request(p, params(16));
        eng.add_request({}, params(4));  // rejected: empty prompt
    };
    for (Preemption mode : {Preemption::kRecompute, Preemption::kSwap}) {
        const EngineConfig ec = small_config(8, 4);
        const PolicyConfig policy{.preemption = mode, .swap_space_blocks = 64};
        StepClock c0;
        const auto clean_engine = pkv_test::engine_with(ec, policy, pkv_test::runner(model()), &c0);
        Engine& clean = *clean_engine;
        submit(clean);
        run_checked(clean);
        REQUIRE(clean.metrics().num_preemptions_total > 0);
        const SwapStats sw = pkv_test::swap_stats(clean);
        REQUIRE(sw.num_swap_ins == (mode == Preemption::kSwap ? sw.num_swap_outs : 0));
        const auto want = outputs(clean, 6);

        for (EventType trigger : {EventType::kToken, EventType::kPreempted, EventType::kResumed, EventType::kFinished}) {
            // Self: abort the request the event is about (a finished one cannot be).
            // Other: abort the next unfinished request, whatever its state.
            for (bool self : {true, false}) {
                if (trigger == EventType::kFinished && self) continue;
                CAPTURE((int)mode);
                CAPTURE((int)trigger);
                CAPTURE(self);
                StepClock clock;
                const auto engine = pkv_test::engine_with(ec, policy, pkv_test::runner(model()), &clock);
                Engine& eng = *engine;
                std::vector<StreamEvent> events;
                int victim = -1;
                eng.on_event = [&](const StreamEvent& e) {
                    events.push_back(e);
                    if (victim >= 0 || e.type != trigger || e.request_id >= 6) return;
                    int target = e.request_id;
                    if (!self)
                        for (int k = 1; k <= 6; ++k) {
                            const int id = (e.request_id + k) % 6;
                            if (!eng.request(id)->finished()) { target = id; break; }
                        }
                    if (!self && target == e.request_id) return;
                    victim = target;
                    CHECK(eng.abort(target));
                    CHECK_FALSE(eng.abort(target));  // a second abort of the same request is refused
                };
                submit(eng);
                run_checked(eng);
                REQUIRE(victim >= 0);
                CHECK(eng.request(victim)->finish_reason == FinishReason::kAborted);
                CHECK(eng.metrics().num_requests_aborted == 1);
                // Exactly one kFinished for the victim, and no event after it.
                int finished = 0;
                size_t at = 0;
                for (size_t i = 0; i < events.size(); ++i)
                    if (events[i].request_id == victim && events[i].type == EventType::kFinished) ++finished, at = i;
                CHECK(finished == 1);
                for (size_t i = at + 1; i < events.size(); ++i) CHECK(events[i].request_id != victim);
                // Everyone else: as if nothing happened (batch invariance).
                const auto got = outputs(eng, 6);
                for (int id = 0; id < 6; ++id) {
                    if (id == victim) continue;
                    CAPTURE(id);
                    CHECK(got[id] == want[id]);
                    CHECK(eng.request(id)->finish_reason == FinishReason::kMaxTokens);
                }
                CHECK(eng.pool().num_free_blocks() == eng.pool().num_blocks());
                CHECK(pkv_test::swap_slots_in_use(eng.scheduler()) == 0);
            }
        }
    }
}

// A runner whose forward pass fails for any batch holding the "poison" token
// at position 2: a stand-in for one request's input breaking the model.
// (Position 2 is always a prompt position here, so no sampled token can
// poison a request by chance.)
class PoisonRunner : public CpuRunner {
public:
    PoisonRunner(const Model& m, int32_t poison) : CpuRunner(m), poison_(poison) {}
    void forward(const ForwardBatch& b, std::vector<float>& logits) override {
        for (int i = 0; i < b.num_tokens(); ++i)
            if (b.token_ids[i] == poison_ && b.positions[i] == 2) throw std::runtime_error("poisoned token " + std::to_string(poison_));
        CpuRunner::forward(b, logits);
    }

private:
    int32_t poison_;
};

// Proves a request whose forward pass fails is finished with kError and its reason, alone: the other requests (decoding in the same batches) complete with exactly the tokens of a run without it, and every block comes back; greedy (argmax rows) and sampled (logits rows) alike.
TEST_CASE("a failing forward pass fails its own request, not the batch") {
    const int32_t poison = 39;
    auto ps = prompts(4, 21);
    for (auto& p : ps)
        if (p[2] == poison) p[2] = 38;  // the clean prompts never hold it at position 2
    for (const float temperature : {0.0f, 0.8f}) {
        CAPTURE(temperature);
        StepClock c0;
        Engine clean(std::make_unique<PoisonRunner>(model(), poison), small_config(), &c0);
        for (size_t i = 0; i < ps.size(); ++i) clean.add_request(ps[i], params(10, temperature, 100 + i));
        run_checked(clean);
        REQUIRE(clean.metrics().num_requests_finished == 4);

        StepClock clock;
        Engine eng(std::make_unique<PoisonRunner>(model(), poison), small_config(), &clock);
        std::vector<StreamEvent> events;
        eng.on_event = [&](const StreamEvent& e) { events.push_back(e); };
        eng.add_request(ps[0], params(10, temperature, 100));
        eng.add_request(ps[1], params(10, temperature, 101));
        const int bad = eng.add_request({1, 7, poison, 8}, params(10, temperature, 7));  // a valid id the model chokes on
        eng.add_request(ps[2], params(10, temperature, 102));
        eng.add_request(ps[3], params(10, temperature, 103));
        run_checked(eng);
        const Request* b = eng.request(bad);
        CHECK(b->finish_reason == FinishReason::kError);
        CHECK(b->reject_reason.find("poisoned token 39") != std::string::npos);
        CHECK(b->num_output_tokens() == 0);
        CHECK(eng.metrics().num_requests_failed == 1);
        CHECK(eng.metrics().num_requests_finished == 4);
        const auto got = outputs(eng, 5), want = outputs(clean, 4);
        CHECK(got[0] == want[0]);
        CHECK(got[1] == want[1]);
        CHECK(got[3] == want[2]);
        CHECK(got[4] == want[3]);
        int error_events = 0;
        for (const StreamEvent& e : events) error_events += e.type == EventType::kFinished && e.reason == FinishReason::kError;
        CHECK(error_events == 1);
        CHECK(eng.pool().num_free_blocks() == eng.pool().num_blocks());
    }
}

// Proves ForwardBatch::sequence copies one sequence exactly (tokens, positions, slots, its table row, its logits row), and forward_isolating returns, after a failed batch, the very rows the good sequences have in a batch that does not fail.
TEST_CASE("forward_isolating: one sequence alone has its rows of the batch") {
    const int bs = 4;
    ForwardBatch b;
    const std::vector<int32_t> t0{0, 1}, t1{2}, t2{3, 4, 5};
    const std::vector<int32_t> k0{1, 7, 9, 3, 5, 6}, k1{2, 8, 4}, k2{1, 4, 39, 2, 6, 8, 9, 3, 1};
    b.add_sequence(t0, bs, k0.data(), 0, 6, true);
    b.add_sequence(t1, bs, k1.data(), 0, 3, false);  // a prefill chunk: no logits row
    b.add_sequence(t2, bs, k2.data(), 0, 9, true);
    const ForwardBatch one = b.sequence(2);
    CHECK(one.num_seqs() == 1);
    CHECK(one.token_ids == k2);
    CHECK(one.positions == std::vector<int32_t>{0, 1, 2, 3, 4, 5, 6, 7, 8});
    CHECK(one.slot_mapping == std::vector<int64_t>(b.slot_mapping.begin() + 9, b.slot_mapping.end()));
    CHECK(one.token_seq == std::vector<int32_t>(9, 0));
    CHECK(one.max_blocks_per_seq == 3);
    CHECK(one.block_tables == t2);
    CHECK(one.logits_indices == std::vector<int32_t>{8});
    CHECK(b.sequence(1).logits_indices.empty());
    CHECK(b.sequence(1).block_tables == std::vector<int32_t>{2, -1, -1});
    CHECK_THROWS_AS(b.sequence(3), std::out_of_range);

    // Sequence 2 holds the poison at position 2: the batch fails, the others keep their rows.
    for (const bool tokens_only : {false, true}) {
        CAPTURE(tokens_only);
        auto fine = std::make_unique<CpuRunner>(model());
        PoisonRunner poisoned(model(), 39);
        const KVGeometry geo{model().cfg.n_layers, 12, bs, model().cfg.n_kv_heads, model().cfg.head_dim(), KVDtype::kF32};
        fine->init_kv_cache(geo);
        poisoned.init_kv_cache(geo);
        std::vector<float> want_logits, got_logits;
        std::vector<int32_t> want_tokens, got_tokens;
        CHECK(forward_isolating(*fine, b, tokens_only, want_logits, want_tokens) == std::vector<std::string>(3));
        const auto why = forward_isolating(poisoned, b, tokens_only, got_logits, got_tokens);
        CHECK(why[0].empty());
        CHECK(why[1].empty());
        CHECK(why[2].find("poisoned token 39") != std::string::npos);
        const size_t V = (size_t)model().cfg.vocab_size;
        if (tokens_only) {
            REQUIRE(got_tokens.size() == 2u);
            CHECK(got_tokens[0] == want_tokens[0]);
            CHECK(got_tokens[1] == 0);
        } else {
            REQUIRE(got_logits.size() == 2 * V);
            CHECK(std::vector<float>(got_logits.begin(), got_logits.begin() + (ptrdiff_t)V) ==
                  std::vector<float>(want_logits.begin(), want_logits.begin() + (ptrdiff_t)V));
            CHECK(std::vector<float>(got_logits.begin() + (ptrdiff_t)V, got_logits.end()) == std::vector<float>(V, 0.0f));
        }
    }
}

// Proves ThreadPolicy measures both modes first, then keeps the faster one, probes the other at growing intervals (32, 64, ...) while probes confirm the choice, and switches within one probe when the machine changes; size classes are independent.
TEST_CASE("ThreadPolicy follows whichever mode is faster") {
    if (ThreadPolicy::max_threads() < 2) {
        MESSAGE("one OpenMP thread: the policy never goes parallel");
        CHECK_FALSE(ThreadPolicy().use_parallel(1L << 30));
        return;
    }
    ThreadPolicy p;
    const long big = 1L << 24, small = ThreadPolicy::kMinParallelMacs - 1;
    CHECK_FALSE(p.use_parallel(small));  // too small to be worth a parallel region
    // Warm-up: two serial, then two parallel measurements.
    std::vector<bool> first;
    for (int i = 0; i < 4; ++i) {
        const bool par = p.use_parallel(big);
        first.push_back(par);
        p.record(par, big, par ? 3e-3 : 1e-3);  // parallel is 3x slower: a busy machine
    }
    CHECK(first == std::vector<bool>{false, false, true, true});
    CHECK(p.ns_per_mac(big, false) < p.ns_per_mac(big, true));
    // Serial wins; the parallel probes come after 32, then 64 more calls.
    std::vector<int> probes;
    for (int call = 0; call < 200; ++call) {
        const bool par = p.use_parallel(big);
        if (par) probes.push_back(call);
        p.record(par, big, par ? 3e-3 : 1e-3);
    }
    CHECK(probes == std::vector<int>{31, 95});
    // The machine becomes idle: parallel is now 2x faster. The next probe
    // sees it and the policy switches at once.
    int switched_at = -1;
    for (int call = 0; call < 200 && switched_at < 0; ++call) {
        const bool par = p.use_parallel(big);
        p.record(par, big, par ? 0.5e-3 : 1e-3);
        if (par && p.use_parallel(big)) switched_at = call;
    }
    CHECK(switched_at >= 0);
    CHECK(switched_at <= 128);
    // Another size class has measured nothing yet.
    CHECK(p.ns_per_mac(1L << 20, false) < 0);
    CHECK_FALSE(p.use_parallel(1L << 20));  // starts by measuring serial
}

}  // TEST_SUITE

// engine.hpp -- chapters 6 and 7: the step loop, and what the client sees.
//
//   step():  schedule -> (swap copies) -> build the flat batch -> forward ->
//            sample -> append tokens -> stream them -> finish and free
//
// Everything a reader needs to *observe* preemption lives here too: the stream
// of events a client would see (tokens, and the pauses between them), and the
// metrics an operator would see (core/metrics.hpp: preemptions, KV-cache
// usage, inter-token latency percentiles, recomputed tokens), named as vLLM
// names them.
//
// vLLM V1 splits this loop across processes: the engine core runs
// scheduler.schedule(), then the model executor (which also samples on the
// GPU), then scheduler.update_from_output(), which appends tokens and checks
// stops; a front-end process detokenizes, streams and computes the latency
// metrics. We do all of it in one thread, in one function (step()), whose
// phases are named functions below, so the whole life of a token can be read
// in one sitting. The price: no overlap between scheduling and the forward pass.
//
// The engine never touches weights or KV memory: a ModelRunner
// (tiny_model/runner.hpp) owns both, and the caller chooses which one
// (examples/devices.hpp turns --device into one).
//
// Sections: 1. the event stream  2. the engine (config, construction, the
// door: add_request and abort, step() and its phases).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/block_pool.hpp"
#include "core/clock.hpp"
#include "core/metrics.hpp"
#include "paged_kv.cuh"
#include "scheduler.hpp"
#include "tiny_model/forward_batch.hpp"
#include "tiny_model/runner.hpp"
#include "tiny_model/sampler.hpp"

namespace pkv {

// ============================================================================
// 1. What a client sees: the event stream
// ============================================================================
//
// A client of an inference server gets a stream: tokens as they are sampled,
// then one end-of-stream. We add the state changes a client never sees
// (kPreempted, kResumed) so that examples/overload can draw the lanes and mark
// where a stream paused; a real server simply sends nothing for a while
// (examples/serve.cpp). vLLM V1 records similar per-request events (QUEUED,
// SCHEDULED, PREEMPTED) for its metrics and does not stream them either.
//
// Order within one step: preempted and resumed events first (decided by
// schedule(), before the forward pass), then, request by request, its token
// and, if that token stopped it, its kFinished. A token event is emitted
// exactly once, when it is sampled; a recompute re-runs positions whose tokens
// were already streamed and emits nothing.

enum class EventType { kToken, kPreempted, kResumed, kFinished, kRejected };

struct StreamEvent {
    EventType type;
    int request_id;
    double time;
    int token = -1;         // kToken: the token id
    // kToken: its index among the request's outputs. It runs 0, 1, 2, ...
    // without gaps or repeats, preempted or not: a client can check that.
    int output_index = -1;
    FinishReason reason = FinishReason::kNone;  // kFinished / kRejected
};

// ============================================================================
// 2. The engine
// ============================================================================

struct EngineConfig {
    // KV cache size. vLLM profiles a forward pass at startup and turns the GPU
    // memory left under gpu_memory_utilization into blocks; we take the count
    // directly, so a demo can make the pool exactly as small as it needs.
    int num_blocks = 64;
    int block_size = 16;
    bool enable_prefix_caching = false;
    SchedulerConfig sched;     // sched.max_model_len 0 = derive (see derive())
    // llama2.c's "</s>". run.c itself (and examples/generate) stops when the
    // model emits BOS (id 1); the engine stops on EOS like vLLM, and
    // examples/overload sets ignore_eos so every request does the same work.
    int eos_token_id = 2;
    double log_interval_s = 5.0;  // periodic log line (on_log); <= 0 = never
    // The cache's element type (core/kv_dtype.hpp), and optionally its size as
    // a byte budget: with kv_cache_bytes > 0, num_blocks is derived from it,
    // so a smaller dtype buys more blocks and fewer preemptions.
    KVDtype kv_dtype = KVDtype::kF32;
    uint64_t kv_cache_bytes = 0;
};

class Engine {
public:
    using StreamCallback = std::function<void(const StreamEvent&)>;
    using LogCallback = std::function<void(const std::string&)>;

    // Members are initialized in declaration order (the bottom of the class),
    // and that order is a dependency chain: the runner first (it knows the
    // model's shape and its memory), then cfg_ is derived and checked against
    // it, then the pool is sized from it, then the scheduler checks
    // max_model_len against the pool, and last the runner allocates the KV
    // cache itself (host memory for the CPU, device memory for the kernels).
    Engine(std::unique_ptr<ModelRunner> runner, EngineConfig cfg, Clock* clock = nullptr)
        : runner_(require(std::move(runner))), cfg_(derive(*runner_, cfg)),
          geo_{model().n_layers, cfg_.num_blocks, cfg_.block_size, model().n_kv_heads, model().head_dim(), cfg_.kv_dtype},
          pool_(cfg_.num_blocks, cfg_.block_size, cfg_.enable_prefix_caching),
          sched_(cfg_.sched, pool_),
          clock_(clock ? clock : &wall_clock_),
          log_(clock_->now()) {
        runner_->init_kv_cache(geo_, cfg_.sched.swap_space_blocks);
    }
    // The scheduler holds a reference to pool_, requests point into each
    // other's queues: a copied or moved engine would point into the old one.
    Engine(const Engine&) = delete;
    Engine& operator=(const Engine&) = delete;

    // Both callbacks run synchronously inside step(), add_request() or
    // abort(). on_event may call abort() for any request, whatever the event
    // (including the request whose token it is handling); it must not call
    // step() or add_request().
    StreamCallback on_event;  // every token and state change, as it happens
    LogCallback on_log;       // the periodic vLLM-style log line

    const EngineConfig& config() const { return cfg_; }
    const Metrics& metrics() const { return metrics_; }
    const Config& model() const { return runner_->model_config(); }
    const Scheduler& scheduler() const { return sched_; }
    Scheduler& scheduler() { return sched_; }
    const BlockPool& pool() const { return pool_; }
    ModelRunner& runner() { return *runner_; }
    Request* request(int id) { return sched_.request(id); }
    double now() { return clock_->now(); }
    bool has_unfinished() const { return sched_.has_unfinished(); }
    // Bytes of one block across all layers, K and V: what one swap copy moves.
    size_t block_bytes() const { return geo_.bytes_per_block(); }

    // The line vLLM logs at startup, for our pool. "Maximum concurrency" is
    // pool tokens / max_model_len: how many requests could each reach
    // max_model_len at once. Everything above 1.00x is the admission bet.
    std::string startup_summary() const {
        const long pool_tokens = (long)cfg_.num_blocks * cfg_.block_size;
        char buf[400];
        std::snprintf(buf, sizeof buf,
                      "KV cache: %d blocks x %d tokens = %ld token slots (%.2f MiB of %s, %d layers, on %s). max_model_len %d. "
                      "Maximum concurrency for %d tokens per request: %.2fx",
                      cfg_.num_blocks, cfg_.block_size, pool_tokens,
                      (double)cfg_.num_blocks * geo_.bytes_per_block() / 1048576.0, to_string(cfg_.kv_dtype), model().n_layers,
                      to_string(runner_->device()), cfg_.sched.max_model_len, cfg_.sched.max_model_len,
                      (double)pool_tokens / cfg_.sched.max_model_len);
        return buf;
    }

    // ---- the door ---------------------------------------------------------------

    // Returns the request id. A rejected request still gets an id; its state
    // is finished(rejected) with a reason, and a kRejected event is emitted.
    // Rejection happens here, at the door, never later: once a request is
    // accepted it will finish (or be aborted by its client, or fail alone).
    // We check what only the engine knows (every prompt token is a valid id,
    // or the forward pass would fail every step for the whole batch;
    // temperature and top_p are numbers); the scheduler adds the rest.
    int add_request(std::vector<int32_t> prompt, const SamplingParams& params) {
        const double t = clock_->now();
        const std::string invalid = check_request(prompt, params);
        Request* r = sched_.add_request(std::move(prompt), params, t, invalid);
        if (r->finish_reason == FinishReason::kRejected) {
            metrics_.num_requests_rejected++;
            emit({EventType::kRejected, r->id, t, -1, -1, FinishReason::kRejected});
        }
        return r->id;
    }

    // A client hung up. Between steps, its blocks are free when this returns.
    // From inside a step (an on_event callback), the stream ends at once --
    // kFinished now, no later event -- and the scheduler applies the abort
    // when the step ends: the step's batch was built with this request's
    // blocks. vLLM likewise applies aborts between steps. Returns false for
    // a request that is finished, already aborted, or unknown.
    bool abort(int id) {
        const double t = clock_->now();
        Request* r = sched_.request(id);
        if (!r || r->finished() || abort_pending(id)) return false;
        if (in_step_) pending_aborts_.push_back(id);
        else sched_.abort(id, t);
        metrics_.num_requests_aborted++;
        emit({EventType::kFinished, id, t, -1, -1, FinishReason::kAborted});
        return true;
    }

    // ---- one engine step -----------------------------------------------------------
    //
    // Read it as its phases: (a) the scheduler decides who runs and who is
    // preempted; (b) we lay every scheduled token side by side in one flat
    // batch; (c) one forward pass writes K/V for all of them and returns
    // logits for the last token of each sequence that is fully computed; (d)
    // we sample, stream and finish. Like vLLM V1 there is no separate
    // "prefill step" and "decode step": a step mixes decodes, prefill chunks
    // and recomputes freely. Returns the number of tokens computed.
    int step() {
        StepScope scope(*this);
        SchedulerOutput so = sched_.schedule();
        copy_swapped_blocks(so);
        announce_state_changes(so);
        if (so.scheduled.empty() && sched_.has_unfinished())
            // Cannot happen by construction (add_request rejects what can never
            // fit); if it ever does, fail loudly instead of spinning forever.
            throw std::logic_error("engine made no progress with requests pending");
        StepBatch sb = build_batch(so);
        run_forward(sb);
        // A modelled runner's step took simulated time: the tokens are
        // sampled (and timestamped) at its end.
        if (const double d = runner_->take_modelled_seconds(); d >= 0) clock_->advance(d);
        account_and_commit(sb);
        sample_and_stream(sb);
        apply_pending_aborts();
        scope.close();
        end_step();
        return so.total_num_scheduled_tokens;
    }

    void run_until_done() {
        while (has_unfinished()) step();
    }

    // "" when the block pool agrees with every request's block table, and the
    // scheduling policy with itself. The randomized tests call it every step.
    std::string check_invariants() const {
        std::string e = pool_.check_invariants(sched_.all_block_tables());
        return e.empty() ? sched_.policy().check_invariants(sched_) : e;
    }

    // The vLLM-style periodic line and the Prometheus text (core/metrics.hpp).
    // The line's throughputs are averages since the previous line, so calling
    // it moves that window: on-demand calls and the periodic log share it.
    std::string log_line() { return log_.line(metrics_, clock_->now()); }
    std::string prometheus() const { return prometheus_text(metrics_); }

private:
    // ---- construction -------------------------------------------------------------

    static std::unique_ptr<ModelRunner> require(std::unique_ptr<ModelRunner> r) {
        if (!r) throw std::invalid_argument("Engine: no model runner");
        return r;
    }

    // Fill in num_blocks (from a byte budget) and max_model_len, and check the
    // whole configuration against the model and the memory the runner has,
    // before anything is allocated. vLLM defaults max_model_len to the
    // model's context and refuses to start when the KV cache cannot hold one
    // such sequence. We cap it to the pool instead, and say so in the
    // startup line, so that a demo with a tiny pool still starts; an explicit
    // max_model_len is never silently changed.
    static EngineConfig derive(const ModelRunner& runner, EngineConfig c) {
        const Config& m = runner.model_config();
        if (c.block_size < 1 || c.block_size > kMaxBlockSize)
            throw std::invalid_argument("block_size must be in 1.." + std::to_string(kMaxBlockSize) + ", got " + std::to_string(c.block_size));
        if (!std::isfinite(c.log_interval_s)) throw std::invalid_argument("log_interval_s must be a finite number of seconds");
        if (c.sched.swap_space_blocks < 0) throw std::invalid_argument("swap_space_blocks must be >= 0");
        const uint64_t block_bytes = KVGeometry{m.n_layers, 1, c.block_size, m.n_kv_heads, m.head_dim(), c.kv_dtype}.bytes_per_block();
        if (c.kv_cache_bytes > 0) {
            // A byte budget: as many blocks of this dtype as fit. f16 gives
            // twice the blocks of f32, int8 (with its scales) almost four times.
            const uint64_t n = c.kv_cache_bytes / block_bytes;
            if (n == 0)
                throw std::invalid_argument("a KV cache of " + format_bytes(c.kv_cache_bytes) + " holds no block of " +
                                            format_bytes(block_bytes) + ": raise the budget");
            if (n > (uint64_t)INT32_MAX)
                throw std::invalid_argument("a KV cache of " + format_bytes(c.kv_cache_bytes) + " would be more than 2^31 blocks");
            c.num_blocks = (int)n;
        }
        if (c.num_blocks < 1) throw std::invalid_argument("num_blocks must be >= 1");
        runner.check_memory(c.num_blocks, block_bytes, c.sched.swap_space_blocks);  // the memory it will take, before it is taken
        const int64_t pool_tokens = (int64_t)c.num_blocks * c.block_size;
        if (c.sched.max_model_len == 0) c.sched.max_model_len = (int)std::min<int64_t>(m.seq_len, pool_tokens);
        // Positions past the model's context are untrained, and the forward
        // pass rejects them. (One larger than the pool: the Scheduler says so.)
        else if (c.sched.max_model_len > m.seq_len)
            throw std::invalid_argument("max_model_len " + std::to_string(c.sched.max_model_len) +
                                        " is longer than the model's context " + std::to_string(m.seq_len) +
                                        ": lower --max-model-len");
        return c;
    }

    // What the door checks that only the engine can (it knows the vocabulary).
    // "" = fine.
    std::string check_request(const std::vector<int32_t>& prompt, const SamplingParams& p) const {
        const int V = model().vocab_size;
        for (size_t i = 0; i < prompt.size(); ++i)
            if (prompt[i] < 0 || prompt[i] >= V)
                return "prompt token " + std::to_string(i) + " is " + std::to_string(prompt[i]) + ", not a token id in 0.." +
                       std::to_string(V - 1);
        if (!(std::isfinite(p.temperature) && p.temperature >= 0.0f))
            return "temperature must be a finite number >= 0 (0 = greedy), got " + std::to_string(p.temperature);
        if (!std::isfinite(p.top_p)) return "top_p must be a finite number (outside (0, 1) = off)";
        if (p.stop_after_tokens < 0) return "stop_after_tokens must be >= 0 (0 = off)";
        return "";
    }

    // ---- step phases ---------------------------------------------------------------

    // in_step_ is true while a step runs, so that abort() from a callback is
    // deferred; this resets it even when a phase throws.
    struct StepScope {
        Engine& e;
        explicit StepScope(Engine& eng) : e(eng) { e.in_step_ = true; }
        void close() { e.in_step_ = false; }
        ~StepScope() { e.in_step_ = false; }
    };

    // The step's batch, and which requests it samples for.
    struct StepBatch {
        const SchedulerOutput& so;
        ForwardBatch batch;
        std::vector<Request*> sampled;  // requests whose last token is in this step, in logits-row order
        std::vector<char> failed;       // [so.scheduled.size()] its forward pass failed (isolated)
        bool all_greedy = true;         // then greedy_ holds the argmax of each row, not logits_
    };

    // (a) A policy that swaps (lab/policies.hpp) asks for block copies; they
    // happen before the forward pass, because a victim's freed blocks still
    // hold its K/V until this step's forward writes into them.
    void copy_swapped_blocks(const SchedulerOutput& so) {
        if (!so.swap_out.empty()) runner_->swap_out(so.swap_out);
        if (!so.swap_in.empty()) runner_->swap_in(so.swap_in);
        metrics_.swap_out_bytes += (long)so.swap_out.size() * (long)block_bytes();
        metrics_.swap_in_bytes += (long)so.swap_in.size() * (long)block_bytes();
    }

    void announce_state_changes(const SchedulerOutput& so) {
        const double t = clock_->now();
        // A callback may abort a request announced later in these loops.
        for (Request* r : so.preempted)
            if (!abort_pending(r->id)) emit({EventType::kPreempted, r->id, t});
        for (Request* r : so.resumed)
            if (!abort_pending(r->id)) emit({EventType::kResumed, r->id, t});
    }

    // (b) Build the flat batch: each request contributes the tokens
    // [num_computed, num_computed + n) of prompt + outputs. A decode
    // contributes one token, a prefill chunk or a recompute many; the forward
    // pass does not care which, because every token carries its own position
    // and block table row (see ForwardBatch).
    StepBatch build_batch(const SchedulerOutput& so) {
        StepBatch sb{so, {}, {}, {}, true};
        sb.failed.assign(sb.so.scheduled.size(), 0);
        sb.batch.with_tables = runner_->needs_block_tables();
        size_t width = 0;
        for (const ScheduledRequest& s : sb.so.scheduled) width = std::max(width, s.req->block_table.blocks.size());
        sb.batch.reserve((int)sb.so.scheduled.size(), (int)width);
        for (const ScheduledRequest& s : sb.so.scheduled)
            if (add_to_batch(sb.batch, s)) sb.sampled.push_back(s.req);
        // When every request sampled this step is greedy, only the argmax of
        // each row is needed: the runner computes it where the logits are (on
        // a GPU that saves copying a vocab-sized row per request back). A
        // runner that produces tokens itself is asked the same way, and its
        // answers are the tokens.
        for (const Request* r : sb.sampled) sb.all_greedy = sb.all_greedy && r->params.temperature == 0.0f;
        sb.all_greedy = sb.all_greedy || runner_->produces_tokens();
        return sb;
    }
    // One scheduled request's tokens into `b`; true if its last token is
    // sampled this step. Only a chunk that reaches the end of the sequence
    // yields a token: an earlier prefill chunk only fills the cache.
    bool add_to_batch(ForwardBatch& b, const ScheduledRequest& s) const {
        const Request& r = *s.req;
        const int first = r.num_computed_tokens;
        const bool reaches_end = first + s.num_new_tokens == r.num_tokens();
        b.add_sequence(r.block_table.blocks, cfg_.block_size, r.tokens.data() + first, first, s.num_new_tokens, reaches_end);
        if (reaches_end) {
            b.logits_seed.push_back(r.params.seed);
            b.logits_output_index.push_back(r.num_output_tokens());
        }
        return reaches_end;
    }

    // (c) The forward pass writes K/V of every batch token into its slot and
    // fills logits_ (or greedy_) with one row per entry of `sampled`, in the
    // same order. If it throws, one request's input may be at fault: we run
    // each request alone to find which, finish those with an error, and keep
    // the rows of the others. Batch invariance makes the rows of a request
    // run alone the very rows it would have had in the batch.
    void run_forward(StepBatch& sb) {
        if (sb.batch.num_tokens() == 0) return;
        try {
            forward(sb.batch, sb.all_greedy, logits_, greedy_);
        } catch (const std::exception&) {
            isolate_failures(sb);
        }
    }
    void forward(const ForwardBatch& b, bool greedy, std::vector<float>& logits, std::vector<int32_t>& argmax) {
        if (greedy) runner_->forward_argmax(b, argmax);
        else runner_->forward(b, logits);
    }
    void isolate_failures(StepBatch& sb) {
        const int V = model().vocab_size;
        logits_.assign(sb.sampled.size() * (size_t)V, 0.0f);
        greedy_.assign(sb.sampled.size(), 0);
        std::vector<float> one_logits;
        std::vector<int32_t> one_argmax;
        size_t row = 0;  // this request's row among sampled
        for (size_t i = 0; i < sb.so.scheduled.size(); ++i) {
            ForwardBatch alone;
            const bool reaches_end = add_to_batch(alone, sb.so.scheduled[i]);
            try {
                forward(alone, sb.all_greedy, one_logits, one_argmax);
                if (reaches_end && sb.all_greedy) greedy_[row] = one_argmax[0];
                if (reaches_end && !sb.all_greedy) std::copy_n(one_logits.begin(), V, logits_.begin() + (ptrdiff_t)(row * V));
            } catch (const std::exception& e) {
                sb.failed[i] = 1;
                sb.so.scheduled[i].req->reject_reason = std::string("forward pass failed: ") + e.what();
            }
            row += reaches_end;
        }
    }

    // Accounting, and telling the scheduler what was computed. A chunk covers
    // positions [first, first + n). Positions below the high-water mark were
    // computed before a preemption threw their K/V away: recomputed.
    // Prompt positions at or above it are computed for the first time: prompt
    // work. Everything else is decode. Prefix-cache hits are in no chunk at
    // all: they start `first` above zero, which is exactly what they save.
    void account_and_commit(StepBatch& sb) {
        const double t = clock_->now();
        for (size_t i = 0; i < sb.so.scheduled.size(); ++i) {
            const ScheduledRequest& s = sb.so.scheduled[i];
            Request& r = *s.req;
            if (sb.failed[i]) {
                fail(r, t);
                continue;
            }
            const int first = r.num_computed_tokens, n = s.num_new_tokens;
            metrics_.recomputed_tokens_total += std::max(0, std::min(first + n, r.num_computed_high_water) - first);
            metrics_.computed_tokens_total += n;
            metrics_.prompt_tokens_total += std::max(0, std::min(first + n, r.num_prompt_tokens) - std::max(first, r.num_computed_high_water));
            sched_.on_computed(r, n);
        }
    }

    // (d) Sample one token for every request whose sequence is fully
    // computed. One timestamp for all of them: a batched engine delivers every
    // token of a step at the same moment, on a GPU as here.
    void sample_and_stream(StepBatch& sb) {
        const double t_out = clock_->now();
        const int V = model().vocab_size;
        for (size_t i = 0; i < sb.sampled.size(); ++i) {
            Request& r = *sb.sampled[i];
            // Failed, or aborted from an event callback earlier in this step.
            if (r.finished() || abort_pending(r.id)) continue;
            const int out_index = r.num_output_tokens();
            // The coin depends only on (seed, output index), never on the step
            // or the batch: a recomputed request draws the same coin for its
            // k-th token as it would have without preemption (sampler.hpp).
            int token;
            if (sb.all_greedy) token = greedy_[i];
            else {
                float* row = logits_.data() + i * V;  // [vocab] this request's logits
                const float coin = r.params.temperature == 0.0f ? 0.0f : coin_for(r.params.seed, out_index);
                token = sample_token(row, V, r.params.temperature, r.params.top_p, coin, scratch_);
            }
            r.tokens.push_back(token);
            record_token_latency(r, t_out);
            metrics_.generation_tokens_total++;
            // Streamed before the stop check: a client sees the stop token itself, then kFinished.
            emit({EventType::kToken, r.id, t_out, token, out_index});
            if (abort_pending(r.id)) continue;  // the callback aborted it on this very token
            const FinishReason why = stop_reason(r, token);
            if (why != FinishReason::kNone) {
                sched_.finish(r, why, t_out);
                metrics_.num_requests_finished++;
                metrics_.e2e_request_latency.add(t_out - r.arrival_time);
                metrics_.request_preemptions.add(r.num_preemptions);
                emit({EventType::kFinished, r.id, t_out, -1, -1, why});
            }
        }
    }

    // A request whose forward pass failed alone: finished with its reason,
    // blocks freed, so it cannot fail again and starve the others.
    void fail(Request& r, double t) {
        if (abort_pending(r.id)) return;  // the client already hung up
        sched_.finish(r, FinishReason::kError, t);
        metrics_.num_requests_failed++;
        emit({EventType::kFinished, r.id, t, -1, -1, FinishReason::kError});
    }

    bool abort_pending(int id) const { return std::find(pending_aborts_.begin(), pending_aborts_.end(), id) != pending_aborts_.end(); }
    void apply_pending_aborts() {
        const double t = clock_->now();
        for (int id : pending_aborts_) sched_.abort(id, t);
        pending_aborts_.clear();
    }

    void emit(const StreamEvent& e) {
        if (on_event) on_event(e);
    }

    // Time to first token is measured from arrival, so it includes queueing.
    // Across a preemption the inter-token gap includes the whole pause:
    // exactly what a client streaming the tokens would feel.
    void record_token_latency(Request& r, double t) {
        if (r.first_token_time < 0) {
            r.first_token_time = t;
            metrics_.time_to_first_token.add(t - r.arrival_time);
        } else {
            metrics_.inter_token_latency.add(t - r.last_token_time);
        }
        r.last_token_time = t;
    }

    // Why `r` stops after emitting `token` (kNone: it goes on). A stop token
    // wins over a length limit reached by the same token. vLLM V1's
    // check_stop tests the length limits first, so a token that is both EOS
    // and the max_tokens-th is "length" there and "stop" here; the tokens
    // streamed are the same either way.
    FinishReason stop_reason(const Request& r, int token) const {
        if (token == cfg_.eos_token_id && !r.params.ignore_eos) return FinishReason::kStop;
        for (int32_t s : r.params.stop_token_ids)
            if (token == s) return FinishReason::kStop;
        if (r.params.stop_after_tokens > 0 && r.num_output_tokens() >= r.params.stop_after_tokens) return FinishReason::kStop;
        if (r.num_output_tokens() >= r.params.max_tokens) return FinishReason::kMaxTokens;
        if (r.num_tokens() >= cfg_.sched.max_model_len) return FinishReason::kMaxModelLen;
        return FinishReason::kNone;
    }

    // Blocks of finished requests are already back in the pool, so the gauges
    // (and the next schedule()) see them free. The scheduler owns the
    // preemption and prefix-cache counters (it is where they happen); we copy
    // them here so that Metrics is one consistent snapshot per step. The
    // periodic log line is checked once per step, on the engine's clock.
    void end_step() {
        const SchedulerStats& s = sched_.stats();
        metrics_.num_steps++;
        metrics_.num_preemptions_total = s.num_preemptions_total;
        metrics_.prefix_cache_queries = s.prefix_cache_queries;
        metrics_.prefix_cache_hits = s.prefix_cache_hits;
        metrics_.kv_cache_usage_perc = pool_.kv_cache_usage_perc();
        metrics_.max_kv_cache_usage_perc = std::max(metrics_.max_kv_cache_usage_perc, metrics_.kv_cache_usage_perc);
        metrics_.num_requests_running = (int)sched_.running().size();
        metrics_.num_requests_waiting = (int)(sched_.waiting().size() + sched_.policy().num_held());
        sched_.policy().report(metrics_);
        clock_->on_step_end();
        if (on_log && cfg_.log_interval_s > 0 && clock_->now() - log_.last_time() >= cfg_.log_interval_s) on_log(log_line());
    }

    // Declaration order is construction order: keep runner_ first and cfg_
    // before geo_, pool_ and sched_ (the constructor reads the derived cfg_).
    std::unique_ptr<ModelRunner> runner_;  // the model and the KV cache memory itself, on its device
    EngineConfig cfg_;
    // The KV cache's shape: K and V per layer, [num_blocks, block_size, n_kv_heads, head_dim].
    KVGeometry geo_;
    BlockPool pool_;     // who owns which of the cache's blocks
    Scheduler sched_;
    WallClock wall_clock_;
    Clock* clock_;       // &wall_clock_ unless the caller supplied one
    Metrics metrics_;
    ThroughputLog log_;
    bool in_step_ = false;
    std::vector<int> pending_aborts_;                // request ids aborted from a callback during this step
    std::vector<float> logits_;                      // [num sampled, vocab]
    std::vector<int32_t> greedy_;                    // [num sampled] argmax, when all are greedy
    // [<= vocab] top-p candidates (probability, id), reused so that sampling
    // allocates nothing per token once it has grown.
    std::vector<std::pair<float, int>> scratch_;
};

}  // namespace pkv

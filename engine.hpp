// engine.hpp -- chapters 5 and 6: the step loop, and what the client sees.
//
//   step():  schedule -> build the flat batch -> forward -> sample ->
//            append tokens -> stream them -> finish and free
//
// Here too is what lets you *observe* preemption: the events a client would
// see (tokens, and pauses) and an operator's metrics (core/metrics.hpp).
//
// vLLM V1 splits this loop across processes: the engine core runs schedule(),
// the model executor the forward pass and sampling, the scheduler's
// update_from_output() appends tokens and checks stops, and a front-end
// process detokenizes and streams. We do it all in one thread, in step(), so
// the life of a token reads in one sitting; the price is no overlap.
//
// The engine never touches weights or KV memory: a ModelRunner
// (tiny_model/runner.hpp) owns both; examples/devices.hpp makes one.
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
#include "core/block_pool_check.hpp"
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
// A client gets tokens as they are sampled, then an end of stream. We add what
// a client never sees (kPreempted, kResumed) to mark where a stream paused
// (OpenAI's stream has no such event). Within a step: preempted and resumed
// first, then per request its token and, if it stopped it, its kFinished. A
// token is emitted once, when sampled; a recompute re-runs it silently.

enum class EventType { kToken, kPreempted, kResumed, kFinished, kRejected };

struct StreamEvent {
    EventType type;
    int request_id;
    double time;
    int token = -1;         // kToken: the token id
    int output_index = -1;  // kToken: 0, 1, 2, ... among its outputs, no gap or repeat, preempted or not
    FinishReason reason = FinishReason::kNone;  // kFinished / kRejected
};

// ============================================================================
// 2. The engine
// ============================================================================

struct EngineConfig {
    // A block count, not vLLM's fraction of GPU memory: a demo can make the
    // pool exactly as small as it needs (size_kv_cache, tiny_model/runner.hpp).
    int num_blocks = 64;
    int block_size = 16;
    bool enable_prefix_caching = false;
    SchedulerConfig sched;     // sched.max_model_len 0 = derive
    int eos_token_id = 2;  // llama2.c's "</s>" (run.c stops on BOS; examples/overload ignores EOS)
    double log_interval_s = 5.0;  // periodic log line (on_log); <= 0 = never
    // The cache's element type (core/kv_dtype.hpp); kv_cache_bytes > 0 derives
    // num_blocks from a byte budget (vLLM's kv_cache_memory_bytes).
    KVDtype kv_dtype = KVDtype::kF32;
    uint64_t kv_cache_bytes = 0;
    // Every latency sample kept (exact percentiles), or false: histogram
    // buckets only, for a server whose memory must stay flat (core/metrics.hpp).
    bool keep_latency_samples = true;
};

class Engine {
public:
    using StreamCallback = std::function<void(const StreamEvent&)>;
    using LogCallback = std::function<void(const std::string&)>;

    // Members are built in declaration order, a dependency chain: the runner,
    // cfg_ derived from it, the pool sized from cfg_, the scheduler checked
    // against the pool; last, the runner allocates the KV cache itself.
    Engine(std::unique_ptr<ModelRunner> runner, EngineConfig cfg, Clock* clock = nullptr)
        : runner_(std::move(runner)), cfg_(derive(runner_.get(), cfg)),
          geo_{model().n_layers, cfg_.num_blocks, cfg_.block_size, model().n_kv_heads, model().head_dim(), cfg_.kv_dtype},
          pool_(cfg_.num_blocks, cfg_.block_size, cfg_.enable_prefix_caching), sched_(cfg_.sched, pool_),
          clock_(clock ? clock : &wall_clock_), log_(clock_->now()) {
        runner_->init_kv_cache(geo_);
        metrics_.keep_samples(cfg_.keep_latency_samples);
    }
    // The scheduler refers to pool_, requests into its queues: no copies.
    Engine(const Engine&) = delete;
    Engine& operator=(const Engine&) = delete;

    // Both run inside step(), add_request() or abort(). on_event may abort any
    // request, even the one whose token it handles; never step() or add_request().
    StreamCallback on_event;  // every token and state change, as it happens
    LogCallback on_log;       // the periodic vLLM-style log line
    // An observer of each step's decision, right after schedule(); empty
    // unless something records the run (examples/recorder.hpp). It may read
    // the engine, not change it.
    std::function<void(const SchedulerOutput&)> on_schedule;

    // What examples and tests read; nothing here changes state.
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
    const KVGeometry& geometry() const { return geo_; }  // the cache's shape: blocks, layers, heads, dtype

    // ---- the door ---------------------------------------------------------------

    // Returns the request id; a rejected request gets one too, with a reason
    // and a kRejected event. Rejection happens here, never later. We check the
    // token ids against the vocabulary and the sampling parameters
    // (check_request, tiny_model/sampler.hpp); the scheduler checks the rest.
    int add_request(std::vector<int32_t> prompt, const SamplingParams& params) {
        const double t = clock_->now();
        const std::string invalid = check_request(prompt, params, model().vocab_size);
        Request* r = sched_.add_request(std::move(prompt), params, t, invalid);
        if (r->finish_reason == FinishReason::kRejected) {
            metrics_.num_requests_rejected++;
            emit({EventType::kRejected, r->id, t, -1, -1, FinishReason::kRejected});
        }
        return r->id;
    }

    // A client hung up. Between steps its blocks are free when this returns.
    // From inside a step (an on_event callback) the stream ends at once and
    // the blocks are freed when the step ends: this step's batch uses them.
    // (vLLM can see an abort while a batch runs too; update_from_output then
    // drops that request's output.) false for one finished or unknown.
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
    // (a) The scheduler decides who runs and who is preempted; (b) every
    // scheduled token goes into one flat batch; (c) one forward pass writes
    // K/V for all of them and gives logits for each sequence fully computed;
    // (d) we sample, stream and finish. As in vLLM V1 a step mixes decodes,
    // prefill chunks and recomputes. Returns the tokens computed.
    int step() {
        in_step_ = true;  // abort() from a callback now defers (see abort)
        struct Reset { bool& f; ~Reset() { f = false; } } reset{in_step_};  // even if a phase throws
        SchedulerOutput so = sched_.schedule();
        if (on_schedule) on_schedule(so);
        const double t = clock_->now();
        for (const auto& [list, type] : {std::pair{&so.preempted, EventType::kPreempted}, std::pair{&so.resumed, EventType::kResumed}})
            for (Request* r : *list)
                if (!abort_pending(r->id)) emit({type, r->id, t});  // a callback may abort one announced later
        // Cannot happen (add_request rejects what can never fit): fail loudly.
        if (so.scheduled.empty() && sched_.has_unfinished()) throw std::logic_error("engine made no progress with requests pending");
        StepBatch sb = build_batch(so);
        run_forward(sb);
        account_and_commit(sb);
        sample_and_stream(sb);
        // (e) Aborts asked for during the step free their blocks now, when no
        // batch refers to them; end_step's log callback may abort directly.
        for (int id : pending_aborts_) sched_.abort(id, clock_->now());
        pending_aborts_.clear();
        in_step_ = false;
        end_step();
        return so.total_num_scheduled_tokens;
    }

    // The offline loop (examples/overload); a server steps as requests arrive.
    void run_until_done() { while (has_unfinished()) step(); }

    // "" when the pool agrees with every block table and the policy with itself.
    std::string check_invariants() const {
        std::string e = pkv::check_invariants(pool_, sched_.all_block_tables());
        return e.empty() ? sched_.policy().check_invariants(sched_) : e;
    }

    // The caller is done with a finished request: forget it (Scheduler::release).
    bool release(int id) { return sched_.release(id); }

    // The periodic line (throughputs since the previous line) and the
    // Prometheus text (core/metrics.hpp), labelled with `labels`
    // (model_name="..."). Gauges are read as of the call: an idle engine takes
    // no step to notice an abort or a new request.
    std::string log_line() { return log_.line(metrics_, clock_->now()); }
    std::string prometheus(const std::string& labels = "") {
        refresh_gauges();
        return prometheus_text(metrics_, labels);
    }

private:
    // Size the KV cache before anything is allocated (size_kv_cache,
    // tiny_model/runner.hpp): num_blocks, and max_model_len when 0.
    static EngineConfig derive(const ModelRunner* runner, EngineConfig c) {
        if (!runner) throw std::invalid_argument("Engine: no model runner");
        if (!std::isfinite(c.log_interval_s)) throw std::invalid_argument("log_interval_s must be a finite number of seconds");
        const KVCacheSpec kv = size_kv_cache(*runner, {c.num_blocks, c.block_size, c.kv_dtype, c.kv_cache_bytes, c.sched.max_model_len});
        c.num_blocks = kv.num_blocks;
        c.sched.max_model_len = kv.max_model_len;
        return c;
    }

    // ---- step phases ---------------------------------------------------------------

    // One step's working set: the decision, the flat batch built from it, and
    // the requests that get a logits row (their chunk ends their sequence).
    struct StepBatch {
        const SchedulerOutput& so;
        ForwardBatch batch;
        std::vector<Request*> sampled;  // requests whose last token is in this step, in logits-row order
        std::vector<char> failed;       // [so.scheduled.size()] its forward pass failed (isolated)
        bool all_greedy = true;         // then greedy_ holds the argmax of each row, not logits_
    };

    // (b) Each request contributes tokens [num_computed, num_computed + n):
    // one for a decode, many for a prefill chunk or a recompute. The forward
    // pass cannot tell which: every token carries its position and table row.
    StepBatch build_batch(const SchedulerOutput& so) {
        StepBatch sb{so, {}, {}, std::vector<char>(so.scheduled.size(), 0), true};
        // Block-table rows as wide as the longest table: one allocation a step.
        size_t width = 0;
        for (const ScheduledRequest& s : so.scheduled) width = std::max(width, s.req->block_table.blocks.size());
        sb.batch.reserve((int)so.scheduled.size(), (int)width);
        for (const ScheduledRequest& s : so.scheduled) {
            // Only a chunk that reaches the end of its sequence yields a token.
            Request* r = s.req;
            const int first = r->num_computed_tokens;
            const bool reaches_end = first + s.num_new_tokens == r->num_tokens();
            sb.batch.add_sequence(r->block_table.blocks, cfg_.block_size, r->tokens.data() + first, first, s.num_new_tokens, reaches_end);
            if (!reaches_end) continue;
            sb.sampled.push_back(r);
        }
        // All greedy: the runner returns each row's argmax, computed where the
        // logits are (from a GPU, one int per row instead of a row).
        for (const Request* r : sb.sampled) sb.all_greedy = sb.all_greedy && r->params.temperature == 0.0f;
        return sb;
    }

    // (c) The forward pass fills logits_ (or greedy_), one row per `sampled`.
    // If it fails, forward_isolating (tiny_model/runner.hpp) runs each request
    // alone: the culprit finishes with the error, the others keep their rows.
    void run_forward(StepBatch& sb) {
        if (sb.batch.num_tokens() == 0) return;
        const std::vector<std::string> why = forward_isolating(*runner_, sb.batch, sb.all_greedy, logits_, greedy_);
        for (size_t i = 0; i < why.size(); ++i)  // sequence i of the batch is so.scheduled[i]
            if (!why[i].empty()) {
                sb.failed[i] = 1;
                sb.so.scheduled[i].req->reject_reason = "forward pass failed: " + why[i];
            }
    }

    // Accounting, and telling the scheduler what was computed. Of a chunk's
    // positions [first, first + n), those below the high-water mark are
    // recomputed; prompt positions above it are prompt work; the rest decode.
    // Prefix-cache hits are in no chunk: they start `first` above zero.
    void account_and_commit(StepBatch& sb) {
        const double t = clock_->now();
        for (size_t i = 0; i < sb.so.scheduled.size(); ++i) {
            const ScheduledRequest& s = sb.so.scheduled[i];
            Request& r = *s.req;
            if (sb.failed[i]) {  // failed alone: finished with its reason, blocks freed
                if (abort_pending(r.id)) continue;  // the client already hung up
                sched_.finish(r, FinishReason::kError, t);
                metrics_.num_requests_failed++;
                emit({EventType::kFinished, r.id, t, -1, -1, FinishReason::kError});
                continue;
            }
            const int first = r.num_computed_tokens, n = s.num_new_tokens;
            metrics_.recomputed_tokens_total += std::max(0, std::min(first + n, r.num_computed_high_water) - first);
            metrics_.computed_tokens_total += n;
            metrics_.prompt_tokens_total += std::max(0, std::min(first + n, r.num_prompt_tokens) - std::max(first, r.num_computed_high_water));
            sched_.on_computed(r, n);
        }
    }

    // (d) One token for every request whose sequence is fully computed, all
    // with one timestamp: a batched engine delivers a step's tokens at once.
    void sample_and_stream(StepBatch& sb) {
        const double t = clock_->now();
        const int V = model().vocab_size;
        for (size_t i = 0; i < sb.sampled.size(); ++i) {
            Request& r = *sb.sampled[i];
            if (r.finished() || abort_pending(r.id)) continue;  // failed, or aborted earlier in this step
            const int out_index = r.num_output_tokens();
            // The coin depends only on (seed, output index), never on the step
            // or the batch: preempted or not, the k-th token draws the same coin.
            const int token = sb.all_greedy ? greedy_[i] : sample_request_token(logits_.data() + i * V, V, r.params, out_index, scratch_);
            r.tokens.push_back(token);
            metrics_.on_token(t, r.arrival_time, r.last_token_time);  // TTFT, or the gap (a pause included)
            if (r.first_token_time < 0) r.first_token_time = t;
            r.last_token_time = t;
            emit({EventType::kToken, r.id, t, token, out_index});  // before the stop check: the client sees the stop token
            if (abort_pending(r.id)) continue;                     // the callback aborted it on this very token
            const FinishReason why = stop_reason(r, token);
            if (why == FinishReason::kNone) continue;
            sched_.finish(r, why, t);
            metrics_.on_finished(t - r.arrival_time, r.num_preemptions, why != FinishReason::kStop);
            emit({EventType::kFinished, r.id, t, -1, -1, why});
        }
    }

    // Why `r` stops after `token` (kNone: it goes on). A stop token wins over
    // a length limit reached by the same token, as vLLM's check_stop decides
    // (vLLM 0.9 tested the lengths first, and called it "length").
    FinishReason stop_reason(const Request& r, int token) const {
        if (token == cfg_.eos_token_id && !r.params.ignore_eos) return FinishReason::kStop;
        if (std::find(r.params.stop_token_ids.begin(), r.params.stop_token_ids.end(), token) != r.params.stop_token_ids.end())
            return FinishReason::kStop;
        if (r.params.stop_after_tokens > 0 && r.num_output_tokens() >= r.params.stop_after_tokens) return FinishReason::kStop;
        if (r.num_output_tokens() >= r.params.max_tokens) return FinishReason::kMaxTokens;
        if (r.num_tokens() >= cfg_.sched.max_model_len) return FinishReason::kMaxModelLen;
        return FinishReason::kNone;
    }

    int num_waiting() const { return (int)(sched_.waiting().size() + sched_.policy().num_held()); }
    void refresh_gauges() { metrics_.set_gauges(pool_.kv_cache_usage_perc(), (int)sched_.running().size(), num_waiting()); }

    bool abort_pending(int id) const { return std::find(pending_aborts_.begin(), pending_aborts_.end(), id) != pending_aborts_.end(); }
    void emit(const StreamEvent& e) { if (on_event) on_event(e); }

    // Metrics as one snapshot per step, once finished requests' blocks are
    // back in the pool; requests a policy holds count as waiting.
    void end_step() {
        const SchedulerStats& s = sched_.stats();
        metrics_.on_step_end(pool_.kv_cache_usage_perc(), (int)sched_.running().size(), num_waiting(), s.num_preemptions_total,
                             s.prefix_cache_queries, s.prefix_cache_hits);
        clock_->on_step_end();
        if (on_log && cfg_.log_interval_s > 0 && clock_->now() - log_.last_time() >= cfg_.log_interval_s) on_log(log_line());
    }

    // Declaration order is construction order (see the constructor).
    std::unique_ptr<ModelRunner> runner_;  // the model and the KV cache memory, on its device
    EngineConfig cfg_;
    KVGeometry geo_;     // the cache's shape: K and V per layer, [num_blocks, block_size, n_kv_heads, head_dim]
    BlockPool pool_;     // who owns which of the cache's blocks
    Scheduler sched_;
    WallClock wall_clock_;
    Clock* clock_;       // &wall_clock_ unless the caller supplied one
    Metrics metrics_;
    ThroughputLog log_;
    bool in_step_ = false;                         // while step() runs: abort() defers
    std::vector<int> pending_aborts_;              // ids aborted from a callback during this step
    std::vector<float> logits_;                    // [num sampled, vocab]
    std::vector<int32_t> greedy_;                  // [num sampled] argmax, when all are greedy
    std::vector<std::pair<float, int>> scratch_;   // [<= vocab] top-p candidates, reused: no allocation per token
};

}  // namespace pkv

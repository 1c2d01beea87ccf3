// scheduler.hpp -- chapters 3, 4 and 5: who runs this step, and what happens
// when the KV cache runs out of free blocks.
//
// A paged engine admits a request on the blocks it needs *now* (its prompt), not
// on the blocks it will need when it finishes. Admission is a bet: as every
// running sequence grows by one token per step, the free list drains, and one
// step a block allocation fails. That is not an error. The scheduler picks a
// victim -- the newest running request, vLLM V1's `running.pop()` -- frees its
// blocks, and puts it at the *front* of the waiting queue. When it is admitted
// again, prefill re-runs over its prompt plus every token it already generated
// (recompute); prefix caching can serve the blocks that were not evicted yet.
//
// Sections: 1. requests and their states  2. configuration  3. the seam
// where other policies plug in  4. the scheduler: add_request, schedule()
// (running first, preemption, then admission), finish and abort.
//
// The model for this file is vLLM V1's vllm/v1/core/sched/scheduler.py, with
// the block work of its kv_cache_manager.py done by core/block_pool.hpp's
// allocate_slots / free_blocks / find_cached_prefix. Same loop shape, same
// victim, same "no admission in a preempting step". Left out: the priority
// policy (vLLM then preempts the lowest priority, latest arrival instead of
// simply the newest), speculative decoding, multimodal encoders, LoRA. Other
// engines' answers -- vLLM V0's swap, TensorRT-LLM's reservation, other
// victims, a watermark, shedding -- are lab/policies.hpp's, through section 3.
//
// Where this differs from vLLM V1 (scheduler.py, kv_cache_manager.py and
// block_pool.py as of late 2026) and from nano-vllm:
//   - When num_computed_tokens advances: here after the forward pass
//     (on_computed). vLLM advances it at the end of schedule()
//     (_update_after_schedule), so that the next step can be scheduled
//     while this one runs, and walks it back for rejected speculative tokens.
//   - When a full block enters the prefix cache: here after its K/V are
//     computed (on_computed -> cache_full_blocks). vLLM registers it in
//     allocate_slots, before the forward pass, trusting every layer to write
//     K/V before reading them; so in vLLM two identical prompts admitted in
//     the same step share blocks, and here they share nothing (the second
//     computes its own copy). nano-vllm also hashes after compute.
//   - One block per hash here (BlockPool::cache_block keeps the first);
//     vLLM keeps every block that carries a hash, so no block table ever
//     has to change when a duplicate appears.
//   - Budget caps: we apply max_num_batched_tokens and max_num_seqs. vLLM also
//     caps one request's chunk (long_prefill_token_threshold), caps new tokens
//     at max_model_len inside schedule(), and has encoder and LoRA budgets.
//   - A request that preempts itself: vLLM `break`s out of the running loop,
//     so nobody after it is scheduled this step. We `continue`: with newest-
//     first victims that is the same thing (everyone after it was preempted
//     first); with another victim policy it lets the rest of running_ proceed.
//   - vLLM's SchedulerOutput has num_scheduled_tokens as a per-request map
//     plus total_num_scheduled_tokens; ours keeps each request's count in
//     `scheduled` and the sum in total_num_scheduled_tokens.
//   - finish() takes only a running request (a stop token, a length limit);
//     vLLM's finish_requests accepts a request in any state, which here is
//     abort()'s job.
//
// Try it: `build/overload --max-num-seqs 4` runs `make run`'s workload with
// no preemption at all (4 requests of at most 8 blocks each fit the 40-block
// pool even at their longest), at the price of a longer queue and a later
// first token; `--max-num-seqs 8` lands in between. The lanes show why.
#pragma once

#include <algorithm>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "core/block_pool.hpp"

namespace pkv {

// ============================================================================
// 1. Requests
// ============================================================================
//
//   add_request --> WAITING --admit--> RUNNING --stop/length--> FINISHED
//        |             ^                  |
//        |             +---- PREEMPTED <--+  blocks freed,
//        |             (front of waiting)    num_computed_tokens = 0
//        +--> FINISHED(rejected)     abort: any state --> FINISHED(aborted)
//
// PREEMPTED is a waiting state: the request sits in the waiting queue like a
// new one. It is kept apart only so that schedule() can report who *resumed*.
// vLLM's RequestStatus has the same WAITING / RUNNING / PREEMPTED core and
// several FINISHED_* states; its "length" finish covers both of our
// kMaxTokens and kMaxModelLen. vLLM V0 marked a prompt that could never run
// FINISHED_IGNORED; V1 refuses it with an error before it reaches the
// scheduler. We reject it here, so the client gets the reason as an event.
// kError is a request whose forward pass failed (engine.hpp): it is finished,
// with its reason, so the others go on.

enum class RequestState { kWaiting, kRunning, kPreempted, kFinished };
enum class FinishReason { kNone, kStop, kMaxTokens, kMaxModelLen, kAborted, kRejected, kError };

inline const char* to_string(RequestState s) {
    static const char* const names[] = {"waiting", "running", "preempted", "finished"};
    return names[(int)s];
}
inline const char* to_string(FinishReason r) {
    static const char* const names[] = {"none", "stop", "max_tokens", "max_model_len", "aborted", "rejected", "error"};
    return names[(int)r];
}

// Per-request generation settings, a small subset of vLLM's SamplingParams
// (same default max_tokens of 16). The engine checks them at the door
// (Engine::add_request): a NaN temperature is a rejection, not a mystery.
struct SamplingParams {
    int max_tokens = 16;
    float temperature = 0.0f;  // 0 = greedy
    float top_p = 1.0f;        // 1 = off
    uint64_t seed = 0;         // with (output index), the only source of randomness
    std::vector<int32_t> stop_token_ids;  // besides EOS
    bool ignore_eos = false;
    // Synthetic workloads only: stop after this many output tokens, as if the
    // model had emitted EOS there (0 = never). A random model (or the
    // simulated GPU) never says EOS on cue, and a study of admission needs
    // requests that end before their max_tokens, as real answers do.
    // Admission looks only at max_tokens.
    int stop_after_tokens = 0;
};

// One request and everything the scheduler knows about it. Prompt and output
// share one token vector, so that "what the model must have computed" is
// always a prefix of `tokens` and progress is one number, num_computed_tokens.
// That is vLLM V1's central idea: there is no prefill phase and no decode
// phase, only num_computed_tokens catching up with num_tokens. A fresh prompt,
// a chunk of a long one and a recompute after preemption are then the same
// operation, just with a different gap to close.
struct Request {
    int id = -1;  // arrival order: ids are handed out by add_request
    std::vector<int32_t> tokens;  // prompt followed by every output token so far
    int num_prompt_tokens = 0;
    SamplingParams params;

    RequestState state = RequestState::kWaiting;
    FinishReason finish_reason = FinishReason::kNone;
    std::string reject_reason;  // why, when finish_reason is kRejected or kError
    bool retryable = false;     // a rejection the client may retry (queue full)

    // How many of `tokens` have their K/V in the cache. Preemption resets it
    // to 0. Between steps it is num_tokens() - 1 for a decoding request: the
    // token just sampled has no K/V yet, and computing it is the next step's work.
    int num_computed_tokens = 0;
    // The most tokens ever computed at once: positions below it that get
    // computed again are *recomputed* work, the price of preemption.
    int num_computed_high_water = 0;
    // Empty while waiting (new or preempted): only running requests hold blocks.
    BlockTable block_table;
    int num_preemptions = 0;  // how often this request was a victim

    // Timestamps (engine clock, seconds).
    double arrival_time = 0, first_token_time = -1, last_token_time = -1, finish_time = -1;

    int num_tokens() const { return (int)tokens.size(); }
    int num_output_tokens() const { return num_tokens() - num_prompt_tokens; }
    bool finished() const { return state == RequestState::kFinished; }
};

// ============================================================================
// 2. Configuration
// ============================================================================

class Scheduler;
struct SchedulerPolicy;

// The knobs, with vLLM's names. Every one of them trades concurrency
// (throughput, queueing) against the risk of preemption (recompute, pauses).
struct SchedulerConfig {
    // The bluntest fix for thrash: fewer sequences growing at once means fewer
    // block boundaries crossed per step.
    int max_num_seqs = 16;              // most requests running at once
    // Caps the work of one step, so a long prompt is cut into chunks and
    // cannot stall the decodes sharing its step (chunked prefill). In `make
    // run`, 256 holds 8 prompts of 32 tokens: why step 1 admits exactly 8.
    int max_num_batched_tokens = 256;   // token budget of one step (all requests)
    int max_model_len = 0;              // longest sequence (prompt + output); 0 = derive
    // Admit only if the whole current sequence (prompt + outputs for a resumed
    // request) fits in free blocks, not just its first prefill chunk. Without
    // it a long prompt is admitted on its first chunk and its later chunks
    // preempt the requests that were already running: thrash at admission.
    // It is a check, not a reservation: only this step's chunk is allocated.
    // tests/test_scheduler.cpp shows both settings.
    bool full_sequence_must_fit = true;
    // Host swap space, in blocks, that the runner allocates (vLLM's
    // CacheConfig.swap_space). Only a policy that swaps uses it.
    int swap_space_blocks = 0;
    // Another policy (section 3), made fresh for every scheduler: a factory,
    // so that a config can be copied. Empty = the card's.
    std::function<std::unique_ptr<SchedulerPolicy>(const SchedulerConfig&)> policy;
};

// What schedule() decided for one step. The engine builds the batch in the
// order of `scheduled`, so that order is also the order of the logits rows.
struct ScheduledRequest {
    Request* req;
    int num_new_tokens;  // tokens to compute this step: 1 for decode, a chunk for prefill
};
struct SchedulerOutput {
    // Running requests first (oldest first), then those a policy brought back,
    // then admissions from the waiting queue (resumed victims among them).
    std::vector<ScheduledRequest> scheduled;
    std::vector<Request*> preempted;          // victims of this step, in preemption order
    std::vector<Request*> resumed;            // previously preempted requests running again
    int total_num_scheduled_tokens = 0;       // the sum of scheduled[i].num_new_tokens
    // Block copies the engine makes before the forward pass, as (device block,
    // host swap slot) pairs: swap_out first, then swap_in. Only a policy that
    // swaps (lab/policies.hpp) asks for any.
    std::vector<std::pair<int32_t, int32_t>> swap_out, swap_in;
};

// The scheduler's counters, read by the engine through Scheduler::stats().
struct SchedulerStats {
    long num_preemptions_total = 0;
    // In tokens, not lookups, as vLLM counts them, and only for admissions
    // that happened: a request that waits at the head of the queue for many
    // steps is not counted once per step.
    long prefix_cache_queries = 0;  // tokens looked up at admission
    long prefix_cache_hits = 0;     // tokens served from cache at admission
};

// ============================================================================
// 3. The seam: where other policies plug in
// ============================================================================
//
// The card's scheduler answers four questions one way each, and this struct's
// default methods are those answers:
//   who is preempted?            the newest running request (pick_victim)
//   what becomes of its KV?      freed, recomputed on resume (take_victim: no)
//   what must be free to admit?  the blocks of its whole current sequence
//   whom do we refuse at once?   nobody who can ever fit (shed)
// Other engines answer differently -- vLLM V0 swapped victims to host memory,
// TensorRT-LLM can reserve a request's worst case, an operating system spreads
// memory pressure fairly, a server sheds load at its door -- and
// lab/policies.hpp's LabPolicy overrides these methods to answer their way.
// The scheduler calls them at exactly the marked places below and nowhere
// else; a hook gets the Scheduler to read its queues and pool.
struct Metrics;  // core/metrics.hpp: report() writes the policy's own counters
struct SchedulerPolicy {
    virtual ~SchedulerPolicy() = default;
    // add_request: "" to queue the request, or why it is refused now. Such a
    // refusal is retryable (the same request may be accepted a moment later).
    virtual std::string shed(const Scheduler&, const Request&) { return ""; }
    // Growth failed: whom to preempt, among `running` (not empty, admission order).
    virtual Request* pick_victim(const std::vector<Request*>& running) { return running.back(); }
    // The victim has left running_ and still holds its blocks: true if the
    // policy takes it over (say, copies its blocks out and queues it itself);
    // false, and the scheduler frees its blocks for recompute.
    virtual bool take_victim(Scheduler&, Request&, SchedulerOutput&) { return false; }
    // In a step without preemption, before admitting anyone: bring back the
    // requests the policy holds. false holds back new admissions this step.
    virtual bool resume(Scheduler&, SchedulerOutput&, int& /*budget*/) { return true; }
    // Admission of `req`: tokens' worth of blocks that must be free
    // (must_hold), tokens to allocate now (alloc_tokens), and blocks to leave
    // free beyond them (keep_free). The argument is the card's answer.
    struct Admit {
        int must_hold, alloc_tokens;
        int64_t keep_free;
    };
    virtual Admit admission(const Scheduler&, const Request&, Admit card) { return card; }
    // abort(): let go of a request the policy holds (true if it held it).
    virtual bool forget(Request&) { return false; }
    virtual size_t num_held() const { return 0; }  // held requests count as waiting
    virtual std::string check_invariants(const Scheduler&) const { return ""; }  // "" = fine
    virtual void report(Metrics&) const {}  // its counters, into the engine's metrics
};

// ============================================================================
// 4. The scheduler
// ============================================================================

class Scheduler {
public:
    // Checks the config against the pool once, so that schedule() never has to.
    // The last check matters most: with max_model_len guaranteed to fit an
    // empty pool, "can this request ever run?" becomes a question about its
    // prompt alone, answered in add_request.
    Scheduler(const SchedulerConfig& cfg, BlockPool& pool)
        : cfg_(cfg), pool_(pool), policy_(cfg.policy ? cfg.policy(cfg) : std::make_unique<SchedulerPolicy>()) {
        if (cfg_.max_num_seqs <= 0) throw std::invalid_argument("max_num_seqs must be >= 1");
        if (cfg_.max_num_batched_tokens <= 0) throw std::invalid_argument("max_num_batched_tokens must be >= 1");
        if (cfg_.max_model_len <= 0) throw std::invalid_argument("max_model_len must be >= 1 (the engine derives it)");
        if (cfg_.swap_space_blocks < 0) throw std::invalid_argument("swap_space_blocks must be >= 0");
        if (!policy_) throw std::invalid_argument("SchedulerConfig::policy made no policy");
        const int64_t need = blocks_for_tokens(cfg_.max_model_len, pool_.block_size());
        if (need > pool_.num_blocks())
            throw std::invalid_argument("max_model_len " + std::to_string(cfg_.max_model_len) + " needs " + std::to_string(need) +
                                        " blocks but the KV cache has only " + std::to_string(pool_.num_blocks()) +
                                        ": raise --num-blocks or lower --max-model-len");
    }
    // It holds a reference to the pool and pointers into its own requests:
    // a copy or a move would leave those pointing at the original.
    Scheduler(const Scheduler&) = delete;
    Scheduler& operator=(const Scheduler&) = delete;

    const SchedulerConfig& config() const { return cfg_; }
    const SchedulerStats& stats() const { return stats_; }
    const std::vector<Request*>& running() const { return running_; }
    const std::deque<Request*>& waiting() const { return waiting_; }
    BlockPool& pool() { return pool_; }
    const BlockPool& pool() const { return pool_; }
    SchedulerPolicy& policy() { return *policy_; }
    const SchedulerPolicy& policy() const { return *policy_; }
    Request* request(int id) { return id >= 0 && id < (int)requests_.size() ? requests_[id].get() : nullptr; }
    int num_requests() const { return (int)requests_.size(); }
    bool has_unfinished() const { return !running_.empty() || !waiting_.empty() || policy_->num_held() > 0; }

    // The longest sequence a request may reach: prompt + max_tokens, capped.
    // What the bet hopes not to need. In 64 bits: max_tokens may be as large
    // as an int goes.
    int sequence_cap(const Request& r) const {
        return (int)std::min<int64_t>((int64_t)r.num_prompt_tokens + r.params.max_tokens, cfg_.max_model_len);
    }

    // Register a request. It is rejected at once, with a reason, when the
    // caller already found it invalid (`invalid`, non-empty: the engine checks
    // token ids and sampling parameters), when it can never run, or when the
    // policy sheds it.
    //
    // "Can never run" means: alone in an empty pool, its longest sequence
    // would still not fit -- it would preempt everyone, then itself, forever.
    // Its longest sequence is prompt + max_tokens capped at max_model_len, and
    // the constructor guarantees max_model_len fits the pool, so a capped
    // sequence always fits. What cannot run is a prompt that leaves no room
    // under max_model_len: it is rejected, naming the pool that sets the cap.
    // requests_ keeps every request, finished or not, so that the report at
    // the end can read them; a server would drop them.
    Request* add_request(std::vector<int32_t> prompt, const SamplingParams& params, double now, const std::string& invalid = "") {
        auto r = std::make_unique<Request>();
        r->id = (int)requests_.size();
        if (prompt.size() > (size_t)INT32_MAX) throw std::length_error("add_request: a prompt of more than 2^31 - 1 tokens");
        r->tokens = std::move(prompt);
        r->num_prompt_tokens = (int)r->tokens.size();
        r->params = params;
        r->arrival_time = now;
        Request* req = r.get();
        requests_.push_back(std::move(r));
        std::string shed;
        if (!invalid.empty()) reject(*req, invalid, false, now);
        else if (req->num_prompt_tokens == 0) reject(*req, "empty prompt", false, now);
        else if (params.max_tokens <= 0) reject(*req, "max_tokens must be >= 1", false, now);
        else if (req->num_prompt_tokens >= cfg_.max_model_len)
            reject(*req, "prompt of " + std::to_string(req->num_prompt_tokens) + " tokens needs " +
                             std::to_string(blocks_for_tokens((int64_t)req->num_prompt_tokens + 1, pool_.block_size())) +
                             " KV blocks to generate even one token, but max_model_len is " + std::to_string(cfg_.max_model_len) +
                             " (KV cache: " + std::to_string(pool_.num_blocks()) + " blocks of " +
                             std::to_string(pool_.block_size()) + "); it can never fit", false, now);
        else if (!(shed = policy_->shed(*this, *req)).empty()) reject(*req, shed, true, now);  // [seam]
        else waiting_.push_back(req);
        return req;
    }

    // ---- one step's decision --------------------------------------------------
    SchedulerOutput schedule() {
        SchedulerOutput out;
        int budget = cfg_.max_num_batched_tokens;

        // ---- exercise 5 begin: the running loop of schedule() ----
        // (1) Running requests, oldest first. Each gets what it still needs:
        //     1 token for a decode, a budget-limited chunk for a prefill that
        //     has not finished (chunked prefill). Work in progress gets its
        //     blocks before a newcomer does; it is also vLLM V1's order.
        //     "Oldest" means admitted earliest: a resumed request re-enters
        //     running_ at the back, as the newest, the first victim next time.
        // (2) While allocate_slots cannot grow a request's table to
        //     num_computed_tokens + n, preempt the policy's pick_victim() (it
        //     may be the request itself: then it gets nothing this step). Mind
        //     the cursor when a victim stood before it, and record what you
        //     schedule in out.scheduled, charging the budget.
        for (size_t i = 0; i < running_.size() && budget > 0;) {
            Request* req = running_[i];
            const int n = std::min(req->num_tokens() - req->num_computed_tokens, budget);
            // Never true in Engine::step(), where a running request always has
            // its last sampled token to compute.
            if (n <= 0) { ++i; continue; }
            // (2) Grow its block table; while that fails, preempt a victim --
            //     the newest running request, unless a policy says otherwise.
            //     Why not just skip `req` and let it keep its blocks? When every
            //     running request sits at a block boundary, nobody can grow and
            //     nobody gives a block back: a deadlock. Freeing a victim is
            //     what guarantees the oldest requests progress.
            bool self_preempted = false;
            while (!allocate_slots(pool_, req->block_table, {}, (int64_t)req->num_computed_tokens + n)) {
                Request* victim = policy_->pick_victim(running_);  // [seam]
                const size_t vi = (size_t)(std::find(running_.begin(), running_.end(), victim) - running_.begin());
                preempt(victim, out, budget);
                if (victim == req) { self_preempted = true; break; }
                // A victim behind the cursor (newest first: always) changes
                // nothing; one before it (another policy) shifts it left.
                if (vi < i) --i;
            }
            // `req` left running_, so index i already names the next request.
            if (self_preempted) continue;
            out.scheduled.push_back({req, n});
            budget -= n;
            ++i;
        }
        // ---- exercise 5 end ----

        // (3) Admit waiting requests, front first -- but only if nobody was
        //     preempted this step: admitting now would take the very blocks the
        //     victims just gave up, and preempt again next step.
        //     Admission is first come, first served, and the head of the queue
        //     blocks it: a big request at the front is not overtaken by small
        //     ones behind it. Skipping ahead would use the pool better and
        //     could starve the big request forever; vLLM's FCFS policy stops
        //     at the head too.
        if (out.preempted.empty() && policy_->resume(*this, out, budget)) {  // [seam]
            while (!waiting_.empty() && budget > 0 && (int)running_.size() < cfg_.max_num_seqs) {
                Request* req = waiting_.front();
                const int admitted_tokens = try_admit(req, budget);
                if (admitted_tokens == 0) break;  // FCFS: the head blocks the queue
                waiting_.pop_front();
                start_running(req, admitted_tokens, out, budget);
            }
        }
        for (const auto& s : out.scheduled) out.total_num_scheduled_tokens += s.num_new_tokens;
        return out;
    }

    // A request joins running_ (at the back: the newest) with n tokens this step.
    void start_running(Request* req, int n, SchedulerOutput& out, int& budget) {
        if (req->state == RequestState::kPreempted) out.resumed.push_back(req);
        req->state = RequestState::kRunning;
        running_.push_back(req);
        out.scheduled.push_back({req, n});
        budget -= n;
    }

    // ---- after the forward pass -----------------------------------------------
    // The engine calls this for each scheduled request once its K/V are written.
    // Full blocks enter the prefix cache only now, never at allocation: a
    // block may be found by another request only once its K/V really exist.
    void on_computed(Request& req, int num_new_tokens) {
        req.num_computed_tokens += num_new_tokens;
        req.num_computed_high_water = std::max(req.num_computed_high_water, req.num_computed_tokens);
        cache_full_blocks(pool_, req.block_table, req.tokens.data(), req.num_computed_tokens);
    }

    // Finish a running request (stop token, max_tokens, max_model_len, or an
    // error in its forward pass). Its blocks go back tail first
    // (free_blocks), so with prefix caching the prompt's head, the part most
    // likely shared, is evicted last.
    void finish(Request& req, FinishReason reason, double now) {
        if (req.state != RequestState::kRunning)
            throw std::logic_error("Scheduler::finish: request " + std::to_string(req.id) + " is " + to_string(req.state) +
                                   ", not running (use abort)");
        retire(req, reason, now);
    }

    // Abort from any state: its blocks (and whatever a policy held for it)
    // are free before this returns. Returns false when the request was
    // already finished (or unknown).
    bool abort(int id, double now) {
        Request* req = request(id);
        if (!req || req->finished()) return false;
        waiting_.erase(std::remove(waiting_.begin(), waiting_.end(), req), waiting_.end());
        policy_->forget(*req);  // [seam]
        retire(*req, FinishReason::kAborted, now);
        return true;
    }

    // Every block table that holds blocks, for BlockPool::check_invariants.
    std::vector<const std::vector<int32_t>*> all_block_tables() const {
        std::vector<const std::vector<int32_t>*> t;
        for (const auto& r : requests_)
            if (!r->block_table.blocks.empty()) t.push_back(&r->block_table.blocks);
        return t;
    }

private:
    void reject(Request& req, const std::string& why, bool retryable, double now) {
        req.state = RequestState::kFinished;
        req.finish_reason = FinishReason::kRejected;
        req.reject_reason = why;
        req.retryable = retryable;
        req.finish_time = now;
    }

    // Leave running_ (if there) and free every block. The caller has taken
    // the request out of the waiting queue.
    void retire(Request& req, FinishReason reason, double now) {
        running_.erase(std::remove(running_.begin(), running_.end(), &req), running_.end());
        free_blocks(pool_, req.block_table);
        req.state = RequestState::kFinished;
        req.finish_reason = reason;
        req.finish_time = now;
    }

    // Preempt `victim`: leave running_, count it, report it; free everything,
    // forget computed tokens, keep the output tokens (they are part of what
    // gets recomputed), go to the front of the waiting queue so the victim is
    // the first to come back. As in vLLM V1's _preempt_request. Victims leave
    // newest first and each goes to the front, so victims 15, 14, 13 of one
    // step line up as 13, 14, 15, ahead of 16..23: running and waiting
    // together stay in arrival order, which keeps completion order close to it.
    void preempt(Request* victim, SchedulerOutput& out, int& budget) {
        // ---- exercise 6 begin: preempt(): free, forget, requeue ----
        // Leave running_; take back tokens the victim was given earlier in this
        // step (only a victim another policy picked can have any); set state
        // and counters (victim->num_preemptions, stats_); report it in
        // out.preempted. Unless the policy takes the victim over
        // (take_victim), free its blocks, forget its computed tokens (keep
        // the outputs) and put it at the front of waiting_.
        running_.erase(std::find(running_.begin(), running_.end(), victim));
        for (auto it = out.scheduled.begin(); it != out.scheduled.end(); ++it)
            if (it->req == victim) {
                budget += it->num_new_tokens;
                out.scheduled.erase(it);
                break;
            }
        victim->state = RequestState::kPreempted;
        victim->num_preemptions++;
        stats_.num_preemptions_total++;
        out.preempted.push_back(victim);
        if (policy_->take_victim(*this, *victim, out)) return;  // [seam]
        free_blocks(pool_, victim->block_table);
        victim->num_computed_tokens = 0;
        waiting_.push_front(victim);
        // ---- exercise 6 end ----
    }

    // Try to admit `req` with at most `budget` new tokens this step. Returns the
    // number of tokens scheduled (0 = not admitted; nothing changed).
    int try_admit(Request* req, int budget) {
        // ---- exercise 7 begin: admission and the full-sequence gate ----
        // Find the cached prefix (find_cached_prefix); this step's chunk is
        // what is not cached, capped by the budget. Decide how many tokens'
        // worth of blocks must be free (the chunk, or the whole current
        // sequence with full_sequence_must_fit) and let the policy adjust it.
        // Free hits count against capacity. Allocate, count prefix-cache
        // queries and hits, set num_computed_tokens.
        // Prefix cache: the longest cached prefix of prompt + outputs (a resumed
        // request usually finds its own blocks that were not evicted yet).
        // [num hit blocks] physical ids in logical order, empty without
        // prefix caching; capped so the last token is always computed.
        std::vector<int32_t> hits = find_cached_prefix(pool_, req->tokens.data(), req->num_tokens());
        const int num_cached = (int)hits.size() * pool_.block_size();
        const int n = std::min(req->num_tokens() - num_cached, budget);

        // How many tokens' worth of blocks must exist for the bet we make: the
        // whole current sequence, or (full_sequence_must_fit off) this chunk.
        SchedulerPolicy::Admit need{cfg_.full_sequence_must_fit ? req->num_tokens() : num_cached + n, num_cached + n, 0};
        need = policy_->admission(*this, *req, need);  // [seam]
        const int64_t new_blocks = std::max<int64_t>(0, blocks_for_tokens(need.must_hold, pool_.block_size()) - (int64_t)hits.size());
        // A hit on a block that sits in the free list takes that block out of
        // it, so such hits count against free capacity like new blocks do.
        if (new_blocks + num_free_hits(pool_, hits) + need.keep_free > pool_.num_free_blocks()) return 0;
        if (!allocate_slots(pool_, req->block_table, hits, need.alloc_tokens)) return 0;
        stats_.prefix_cache_queries += req->num_tokens();
        stats_.prefix_cache_hits += num_cached;
        req->num_computed_tokens = num_cached;
        return n;
        // ---- exercise 7 end ----
    }

    SchedulerConfig cfg_;
    BlockPool& pool_;
    std::unique_ptr<SchedulerPolicy> policy_;  // the card's answers unless cfg_.policy made another
    SchedulerStats stats_;
    std::vector<std::unique_ptr<Request>> requests_;  // [num requests] by id, never shrinks
    std::deque<Request*> waiting_;                    // front = next to admit
    std::vector<Request*> running_;                   // admission order: back = newest
};

}  // namespace pkv

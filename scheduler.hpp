// scheduler.hpp -- chapters 2, 3 and 4: who runs this step, and what happens
// when the KV cache runs out of free blocks.
//
// A paged engine admits a request on the blocks it needs *now* (its prompt),
// not on those it will need when it finishes. Admission is a bet: as every
// running sequence grows by one token per step, the free list drains, and one
// step a block allocation fails. That is not an error. The scheduler picks a
// victim -- the newest running request, vLLM V1's `running.pop()` -- frees its
// blocks and puts it at the *front* of the waiting queue. When it is admitted
// again, prefill re-runs over its prompt plus every token it already generated
// (recompute); prefix caching can serve the blocks not evicted yet.
//
// In this project's comments "vLLM" means vLLM v0.28.0 (tagged August 2026,
// commit 2cf0a69) unless a comment names another version; "V0" means its
// older engine as of v0.10.2, the last release we checked that shipped it.
// The model here is vLLM's vllm/v1/core/sched/scheduler.py: same loop shape,
// same victim, no admission in a step that preempted. Left out: priorities,
// speculative decoding, encoders, LoRA. Other answers -- V0's swap,
// TensorRT-LLM's reservation, other victims, shedding -- plug in at section 3.
//
// Where we differ from vLLM V1:
//   - num_computed_tokens advances after the forward pass (on_computed); vLLM
//     advances it at the end of schedule(), to schedule the next step early.
//   - A full block enters the prefix cache once its K/V are computed, not when
//     allocate_slots hands it out; one block per hash, not every copy.
//   - Budgets: max_num_batched_tokens and max_num_seqs; no per-request chunk
//     cap (long_prefill_token_threshold).
//   - A request that preempts itself: we `continue`, vLLM `break`s; the same
//     with newest-first victims (everyone after it went first).
//   - finish() takes a running request only; abort() takes any.
//   - SchedulerOutput lists (request, tokens) pairs; vLLM's keeps a map.
//
// Sections: 1. requests  2. configuration and output  3. the policy seam
// 4. the scheduler.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "core/prefix_cache.hpp"  // find_cached_prefix, cache_full_blocks (and core/block_pool.hpp)
#include "tiny_model/sampler.hpp"  // SamplingParams

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
// PREEMPTED is a waiting state, kept apart so that schedule() can report who
// *resumed*. vLLM's RequestStatus has the same core; its FINISHED_LENGTH_CAPPED
// covers our kMaxTokens and kMaxModelLen. A prompt that can never run is
// rejected here, with its reason as an event. kError: its forward pass failed
// (engine.hpp) and it finished alone, so the others go on.

enum class RequestState { kWaiting, kRunning, kPreempted, kFinished };
enum class FinishReason { kNone, kStop, kMaxTokens, kMaxModelLen, kAborted, kRejected, kError };

inline const char* to_string(RequestState s) { return std::array{"waiting", "running", "preempted", "finished"}[(size_t)s]; }
inline const char* to_string(FinishReason r) {
    return std::array{"none", "stop", "max_tokens", "max_model_len", "aborted", "rejected", "error"}[(size_t)r];
}

// Prompt and output share one token vector, and progress is one number,
// num_computed_tokens. That is vLLM V1's central idea: no prefill phase and no
// decode phase, only num_computed_tokens catching up with num_tokens. A fresh
// prompt, a chunk of a long one and a recompute are the same operation.
struct Request {
    int id = -1;  // arrival order: ids are handed out by add_request
    std::vector<int32_t> tokens;  // prompt followed by every output token so far
    int num_prompt_tokens = 0;
    SamplingParams params;

    RequestState state = RequestState::kWaiting;
    FinishReason finish_reason = FinishReason::kNone;
    std::string reject_reason;  // why, when finish_reason is kRejected or kError
    bool retryable = false;     // a rejection the client may retry (queue full)

    // How many of `tokens` have their K/V in the cache; preemption resets it.
    // A decoding request has num_tokens() - 1: the token just sampled is next.
    int num_computed_tokens = 0;
    int num_computed_high_water = 0;  // positions below it computed again are *recomputed*
    BlockTable block_table;           // empty while waiting: only running requests hold blocks
    int num_preemptions = 0;          // how often this request was a victim
    double arrival_time = 0, first_token_time = -1, last_token_time = -1, finish_time = -1;  // engine clock, seconds

    int num_tokens() const { return (int)tokens.size(); }
    int num_output_tokens() const { return num_tokens() - num_prompt_tokens; }
    bool finished() const { return state == RequestState::kFinished; }
};

// ============================================================================
// 2. Configuration
// ============================================================================

class Scheduler;
struct SchedulerPolicy;

// The knobs, with vLLM's names: each trades concurrency against preemption.
struct SchedulerConfig {
    int max_num_seqs = 16;              // most requests running at once: the bluntest fix for thrash
    // The work of one step: a long prompt is cut into chunks (chunked
    // prefill). In `make run`, 256 holds 8 prompts of 32 tokens: step 1 admits 8.
    int max_num_batched_tokens = 256;   // token budget of one step (all requests)
    int max_model_len = 0;              // longest sequence (prompt + output); 0 = derive
    // Admit only if the whole current sequence fits in free blocks, not just
    // its first chunk, or its later chunks preempt the running requests. A
    // check, not a reservation: only this step's chunk is allocated.
    bool full_sequence_must_fit = true;
    // Another policy (section 3), made for each scheduler. Empty = the card's.
    std::function<std::unique_ptr<SchedulerPolicy>(const SchedulerConfig&)> policy;
};

// What schedule() decided for one step; the batch follows `scheduled`'s order.
struct ScheduledRequest {
    Request* req;
    int num_new_tokens;  // tokens to compute this step: 1 for decode, a chunk for prefill
};
struct SchedulerOutput {
    // Running requests (oldest first), those a policy brought back, admissions.
    std::vector<ScheduledRequest> scheduled;
    std::vector<Request*> preempted;          // victims of this step, in preemption order
    std::vector<Request*> resumed;            // previously preempted requests running again
    int total_num_scheduled_tokens = 0;       // the sum of scheduled[i].num_new_tokens
};

// What the scheduler counts; the engine copies it into its metrics once per
// step. vLLM's SchedulerStats lives beside its metrics (vllm/v1/metrics/stats.py).
struct SchedulerStats {
    long num_preemptions_total = 0;
    long prefix_cache_queries = 0;  // tokens looked up, once per admission (as vLLM counts)
    long prefix_cache_hits = 0;     // tokens served from cache at admission
};

// ============================================================================
// 3. The seam: where other policies plug in
// ============================================================================
//
// The card answers four questions one way each, in these default methods:
//   who is preempted?            the newest running request (pick_victim)
//   what becomes of its KV?      freed, recomputed on resume (take_victim)
//   what must be free to admit?  its whole current sequence (admission)
//   whom do we refuse at once?   nobody who can ever fit (shed)
// lab/policies.hpp answers otherwise (swap, reservation, fair victims,
// shedding). The scheduler calls them only at the places marked [seam].
struct SchedulerPolicy {
    virtual ~SchedulerPolicy() = default;
    // add_request: "" to queue the request, or why it is refused now (retryable).
    virtual std::string shed(const Scheduler&, const Request&) { return ""; }
    // Growth failed: whom to preempt, among `running` (not empty, admission order).
    virtual Request* pick_victim(const std::vector<Request*>& running) { return running.back(); }
    // The victim has left running_, blocks still held: true if the policy
    // takes it over (copies its blocks out, queues it itself); false: recompute.
    virtual bool take_victim(Scheduler&, Request&) { return false; }
    // Before admitting anyone (in a step without preemption): bring back the
    // requests it holds; false holds back new admissions this step.
    virtual bool resume(Scheduler&, SchedulerOutput&, int& /*budget*/) { return true; }
    // Admitting `req`: tokens' worth of blocks that must be free, tokens to
    // allocate now, blocks to leave free beyond them. `card` is the card's answer.
    struct Admit { int must_hold, alloc_tokens; int64_t keep_free; };
    virtual Admit admission(const Scheduler&, const Request&, Admit card) { return card; }
    // abort(): let go of a request the policy holds (true if it held it).
    virtual bool forget(Request&) { return false; }
    virtual size_t num_held() const { return 0; }  // held requests count as waiting
    virtual std::string check_invariants(const Scheduler&) const { return ""; }  // "" = fine
};

// ============================================================================
// 4. The scheduler
// ============================================================================

class Scheduler {
public:
    // Checks the config against the pool once: with max_model_len fitting an
    // empty pool, "can this request ever run?" asks about its prompt alone.
    Scheduler(const SchedulerConfig& cfg, BlockPool& pool)
        : cfg_(cfg), pool_(pool), policy_(cfg.policy ? cfg.policy(cfg) : std::make_unique<SchedulerPolicy>()) {
        if (cfg_.max_num_seqs <= 0) throw std::invalid_argument("max_num_seqs must be >= 1");
        if (cfg_.max_num_batched_tokens <= 0) throw std::invalid_argument("max_num_batched_tokens must be >= 1");
        if (cfg_.max_model_len <= 0) throw std::invalid_argument("max_model_len must be >= 1 (the engine derives it)");
        if (!policy_) throw std::invalid_argument("SchedulerConfig::policy made no policy");
        const int64_t need = blocks_for_tokens(cfg_.max_model_len, pool_.block_size());
        if (need > pool_.num_blocks())
            throw std::invalid_argument("max_model_len " + std::to_string(cfg_.max_model_len) + " needs " + std::to_string(need) +
                                        " blocks but the KV cache has only " + std::to_string(pool_.num_blocks()) +
                                        ": raise --num-blocks or lower --max-model-len");
    }
    // It refers to the pool and into its own requests: no copies.
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
    Request* request(int id) {
        const auto it = requests_.find(id);
        return it == requests_.end() ? nullptr : it->second.get();
    }
    // Requests added so far: ids run 0 .. num_requests() - 1.
    int num_requests() const { return next_id_; }
    bool has_unfinished() const { return !running_.empty() || !waiting_.empty() || policy_->num_held() > 0; }

    // Register a request, or reject it at once with a reason: the caller found
    // it invalid (`invalid`), it can never run (alone in an empty pool it would
    // preempt itself forever: a prompt with no room under max_model_len), or
    // the policy sheds it. requests_ keeps every request until release().
    Request* add_request(std::vector<int32_t> prompt, const SamplingParams& params, double now, const std::string& invalid = "") {
        auto r = std::make_unique<Request>();
        r->id = next_id_;
        if (prompt.size() > (size_t)INT32_MAX) throw std::length_error("add_request: a prompt of more than 2^31 - 1 tokens");
        r->tokens = std::move(prompt);
        r->num_prompt_tokens = (int)r->tokens.size();
        r->params = params;
        r->arrival_time = now;
        Request* req = r.get();
        requests_.emplace(next_id_++, std::move(r));
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
    //
    // (1) Running requests, oldest first, each what it still needs: 1 token
    //     for a decode, a budget-limited chunk of a prefill. Work in progress
    //     gets blocks before a newcomer, as in vLLM V1. A resumed request
    //     re-enters running_ at the back: the first victim next time.
    // (2) While allocate_slots cannot grow a request's table to
    //     num_computed_tokens + n, preempt the policy's pick_victim() (it may
    //     be the request itself: then it gets nothing this step).
    // (3) Admit from the waiting queue, unless somebody was preempted.
    SchedulerOutput schedule() {
        SchedulerOutput out;
        int budget = cfg_.max_num_batched_tokens;

        // ---- exercise 5 begin: the running loop of schedule() ----
        // Steps (1) and (2). Mind the cursor when a victim stood before it;
        // record what you schedule in out.scheduled, charging the budget.
        for (size_t i = 0; i < running_.size() && budget > 0;) {
            Request* req = running_[i];
            const int n = std::min(req->num_tokens() - req->num_computed_tokens, budget);
            // Never true in Engine::step(), where a running request always has
            // its last sampled token to compute.
            if (n <= 0) { ++i; continue; }
            // (2) Why not just skip `req`, letting it keep its blocks? When every
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

        // (3) Admit waiting requests, front first -- only if nobody was
        //     preempted: admitting now would take the blocks the victims just
        //     gave up. A big request at the head is not overtaken by small ones
        //     (that could starve it forever); vLLM's FCFS policy stops there too.
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
    // For each scheduled request once its K/V are written: only now may its
    // full blocks be found in the prefix cache.
    void on_computed(Request& req, int num_new_tokens) {
        req.num_computed_tokens += num_new_tokens;
        req.num_computed_high_water = std::max(req.num_computed_high_water, req.num_computed_tokens);
        cache_full_blocks(pool_, req.block_table, req.tokens.data(), req.num_computed_tokens);
    }

    // Finish a running request (a stop, a length limit, a failed forward
    // pass). Its blocks go back tail first (free_blocks).
    void finish(Request& req, FinishReason reason, double now) {
        if (req.state != RequestState::kRunning)
            throw std::logic_error("Scheduler::finish: request " + std::to_string(req.id) + " is " + to_string(req.state) +
                                   ", not running (use abort)");
        retire(req, reason, now);
    }

    // Abort from any state: its blocks (and whatever a policy held for it) are
    // free when this returns. false when already finished (or unknown).
    bool abort(int id, double now) {
        Request* req = request(id);
        if (!req || req->finished()) return false;
        waiting_.erase(std::remove(waiting_.begin(), waiting_.end(), req), waiting_.end());
        policy_->forget(*req);  // [seam]
        retire(*req, FinishReason::kAborted, now);
        return true;
    }

    // Forget a finished request (request(id) is nullptr from now on), so a
    // server's memory does not grow with the requests served. false, changing
    // nothing, for an unfinished or unknown id.
    bool release(int id) {
        const auto it = requests_.find(id);
        if (it == requests_.end() || !it->second->finished()) return false;
        requests_.erase(it);
        return true;
    }

    // Every block table that holds blocks (core/block_pool_check.hpp).
    std::vector<const std::vector<int32_t>*> all_block_tables() const {
        std::vector<const std::vector<int32_t>*> t;
        for (const auto& [id, r] : requests_)
            if (!r->block_table.blocks.empty()) t.push_back(&r->block_table.blocks);
        return t;
    }

private:
    void reject(Request& req, const std::string& why, bool retryable, double now) {
        req.reject_reason = why;
        req.retryable = retryable;
        retire(req, FinishReason::kRejected, now);  // it holds no blocks yet
    }

    // Leave running_ (if there) and free every block; waiting_ is the caller's.
    void retire(Request& req, FinishReason reason, double now) {
        running_.erase(std::remove(running_.begin(), running_.end(), &req), running_.end());
        free_blocks(pool_, req.block_table);
        req.state = RequestState::kFinished;
        req.finish_reason = reason;
        req.finish_time = now;
    }

    // Preempt `victim`, as vLLM V1's _preempt_request: free everything, forget
    // the computed tokens, keep the outputs (they are recomputed too), go to
    // the front of waiting_. Victims 15, 14, 13 of one step line up as 13, 14,
    // 15, ahead of 16..23: running and waiting stay in arrival order.
    void preempt(Request* victim, SchedulerOutput& out, int& budget) {
        // ---- exercise 6 begin: preempt(): free, forget, requeue ----
        // Leave running_; take back tokens it was given earlier in this step
        // (only a victim another policy picked can have any); count it
        // (num_preemptions, stats_, out.preempted); unless the policy takes it
        // over (take_victim): free, forget, front of waiting_.
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
        if (policy_->take_victim(*this, *victim)) return;  // [seam]
        free_blocks(pool_, victim->block_table);
        victim->num_computed_tokens = 0;
        waiting_.push_front(victim);
        // ---- exercise 6 end ----
    }

    // Admit `req` with at most `budget` new tokens: the tokens scheduled, or 0
    // (nothing changed). Its cached prefix counts as computed.
    int try_admit(Request* req, int budget) {
        // ---- exercise 4 begin: admission and the full-sequence gate ----
        // find_cached_prefix; how many tokens' worth of blocks must be free
        // (the chunk, or the whole current sequence with
        // full_sequence_must_fit), adjusted by the policy; free hits count
        // against capacity. Allocate, count queries and hits, set
        // num_computed_tokens.
        // [num hit blocks] of prompt + outputs: a resumed request finds its
        // own blocks not evicted yet.
        std::vector<int32_t> hits = find_cached_prefix(pool_, req->tokens.data(), req->num_tokens());
        const int num_cached = (int)hits.size() * pool_.block_size();
        const int n = std::min(req->num_tokens() - num_cached, budget);

        SchedulerPolicy::Admit need{cfg_.full_sequence_must_fit ? req->num_tokens() : num_cached + n, num_cached + n, 0};
        need = policy_->admission(*this, *req, need);  // [seam]
        const int64_t new_blocks = std::max<int64_t>(0, blocks_for_tokens(need.must_hold, pool_.block_size()) - (int64_t)hits.size());
        // A hit on a block in the free list takes it out: it costs capacity too.
        if (new_blocks + num_free_hits(pool_, hits) + need.keep_free > pool_.num_free_blocks()) return 0;
        if (!allocate_slots(pool_, req->block_table, hits, need.alloc_tokens)) return 0;
        stats_.prefix_cache_queries += req->num_tokens();
        stats_.prefix_cache_hits += num_cached;
        req->num_computed_tokens = num_cached;
        return n;
        // ---- exercise 4 end ----
    }

    SchedulerConfig cfg_;
    BlockPool& pool_;
    std::unique_ptr<SchedulerPolicy> policy_;  // the card's answers unless cfg_.policy made another
    SchedulerStats stats_;
    std::map<int, std::unique_ptr<Request>> requests_;  // by id: every request not released
    int next_id_ = 0;                                   // the id add_request hands out next
    std::deque<Request*> waiting_;                    // front = next to admit
    std::vector<Request*> running_;                   // admission order: back = newest
};

}  // namespace pkv

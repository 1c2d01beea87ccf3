// scheduler.hpp -- chapter 2: who runs this step, and what happens when the
// KV cache runs out of free blocks.
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
// Sections: 1. requests and their states  2. configuration  3. admission checks
// 4. schedule() -- running first, preemption, then waiting  5. finishing/abort.
#pragma once

#include <algorithm>
#include <cstdint>
#include <deque>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "paged_kv.cuh"

namespace pkv {

// ============================================================================
// 1. Requests
// ============================================================================
//
//   add_request --> WAITING --admit--> RUNNING --stop/length--> FINISHED
//        |             ^                  |
//        |             +---- PREEMPTED <--+  (blocks freed, num_computed = 0,
//        |                  (front of waiting)  output tokens kept)
//        +--> FINISHED(rejected)     abort: any state --> FINISHED(aborted)

enum class RequestState { kWaiting, kRunning, kPreempted, kFinished };
enum class FinishReason { kNone, kStop, kMaxTokens, kMaxModelLen, kAborted, kRejected };

inline const char* to_string(RequestState s) {
    switch (s) {
        case RequestState::kWaiting: return "waiting";
        case RequestState::kRunning: return "running";
        case RequestState::kPreempted: return "preempted";
        case RequestState::kFinished: return "finished";
    }
    return "?";
}
inline const char* to_string(FinishReason r) {
    switch (r) {
        case FinishReason::kNone: return "none";
        case FinishReason::kStop: return "stop";
        case FinishReason::kMaxTokens: return "max_tokens";
        case FinishReason::kMaxModelLen: return "max_model_len";
        case FinishReason::kAborted: return "aborted";
        case FinishReason::kRejected: return "rejected";
    }
    return "?";
}

struct SamplingParams {
    int max_tokens = 16;
    float temperature = 0.0f;  // 0 = greedy
    float top_p = 1.0f;        // 1 = off
    uint64_t seed = 0;         // with (output index), the only source of randomness
    std::vector<int32_t> stop_token_ids;  // besides EOS
    bool ignore_eos = false;
};

struct Request {
    int id = -1;
    std::vector<int32_t> tokens;  // prompt followed by every output token so far
    int num_prompt_tokens = 0;
    SamplingParams params;

    RequestState state = RequestState::kWaiting;
    FinishReason finish_reason = FinishReason::kNone;
    std::string reject_reason;  // set when finish_reason == kRejected
    bool retryable = false;     // a rejection the client may retry (queue full)

    // How many of `tokens` have their K/V in the cache. Reset to 0 on preemption.
    int num_computed_tokens = 0;
    // The most tokens ever computed at once: positions below it that get
    // computed again are *recomputed* work, the price of preemption.
    int num_computed_high_water = 0;
    BlockTable block_table;
    int num_preemptions = 0;

    // Timestamps (engine clock, seconds).
    double arrival_time = 0, first_token_time = -1, last_token_time = -1, finish_time = -1;

    int num_tokens() const { return (int)tokens.size(); }
    int num_output_tokens() const { return num_tokens() - num_prompt_tokens; }
    bool finished() const { return state == RequestState::kFinished; }
};

// ============================================================================
// 2. Configuration
// ============================================================================

enum class Admission {
    // Page on demand: admit on the blocks the current sequence needs now and
    // preempt when growth fails. Packs the most requests, risks recompute.
    kBet,
    // Reserve prompt + max_tokens (capped at max_model_len) at admission and
    // never preempt (TensorRT-LLM's GUARANTEED_NO_EVICT). Nothing is ever
    // recomputed, but blocks sit reserved and empty for most of a request's
    // life, so far fewer requests run at once.
    kReserve,
};

struct SchedulerConfig {
    int max_num_seqs = 16;              // most requests running at once
    int max_num_batched_tokens = 256;   // token budget of one step (all requests)
    int max_model_len = 0;              // longest sequence (prompt + output); 0 = derive
    // Admit only if the whole current sequence (prompt + outputs for a resumed
    // request) fits in free blocks, not just its first prefill chunk. Without
    // it a long prompt is admitted on its first chunk and its later chunks
    // preempt the requests that were already running: thrash at admission.
    bool full_sequence_must_fit = true;
    // Keep this fraction of all blocks free when admitting (0 = off). A
    // cushion for running requests to grow into before anyone is preempted,
    // paid for with lower concurrency. Never blocks an admission into an idle
    // engine (otherwise a big request could wait forever).
    double watermark = 0.0;
    Admission admission = Admission::kBet;
    // Shedding at the edge: reject new requests at once (retryable) while this
    // many are already waiting. 0 = unbounded queue. A fast "try again" instead
    // of a stream that stalls behind a queue the engine cannot drain.
    int max_waiting = 0;
};

// What schedule() decided for one step.
struct ScheduledRequest {
    Request* req;
    int num_new_tokens;  // tokens to compute this step: 1 for decode, a chunk for prefill
};
struct SchedulerOutput {
    std::vector<ScheduledRequest> scheduled;  // running first (oldest first), then new admissions
    std::vector<Request*> preempted;          // victims of this step, in preemption order
    std::vector<Request*> resumed;            // previously preempted requests admitted again
    int num_scheduled_tokens = 0;
};

// ============================================================================
// 3. The scheduler
// ============================================================================

class Scheduler {
public:
    Scheduler(const SchedulerConfig& cfg, BlockPool& pool) : cfg_(cfg), pool_(pool) {
        if (cfg_.max_num_seqs <= 0) throw std::invalid_argument("max_num_seqs must be >= 1");
        if (cfg_.max_num_batched_tokens <= 0) throw std::invalid_argument("max_num_batched_tokens must be >= 1");
        if (cfg_.max_model_len <= 0) throw std::invalid_argument("max_model_len must be >= 1 (the engine derives it)");
        if (cfg_.watermark < 0.0 || cfg_.watermark >= 1.0) throw std::invalid_argument("watermark must be in [0, 1)");
        if (blocks_for_tokens(cfg_.max_model_len, pool_.block_size()) > pool_.num_blocks())
            throw std::invalid_argument("max_model_len " + std::to_string(cfg_.max_model_len) + " needs " +
                                        std::to_string(blocks_for_tokens(cfg_.max_model_len, pool_.block_size())) +
                                        " blocks but the KV cache has only " + std::to_string(pool_.num_blocks()) +
                                        ": raise --num-blocks or lower --max-model-len");
    }

    const SchedulerConfig& config() const { return cfg_; }
    const std::vector<Request*>& running() const { return running_; }
    const std::deque<Request*>& waiting() const { return waiting_; }
    Request* request(int id) { return id >= 0 && id < (int)requests_.size() ? requests_[id].get() : nullptr; }
    int num_requests() const { return (int)requests_.size(); }
    bool has_unfinished() const { return !running_.empty() || !waiting_.empty(); }

    // Counters the engine turns into metrics.
    long num_preemptions_total = 0;
    long prefix_cache_queries = 0;  // tokens looked up at admission
    long prefix_cache_hits = 0;     // tokens served from cache at admission

    // The longest sequence a request may reach: prompt + max_tokens, capped.
    int sequence_cap(const Request& r) const {
        return std::min(r.num_prompt_tokens + r.params.max_tokens, cfg_.max_model_len);
    }

    // Register a request. It is rejected at once, with a reason, when it can
    // never run or the queue is full.
    //
    // "Can never run" means: alone in an empty pool, its longest sequence
    // would still not fit -- it would preempt everyone, then itself, forever.
    // Its longest sequence is prompt + max_tokens capped at max_model_len, and
    // the constructor guarantees max_model_len fits the pool, so a capped
    // sequence always fits. What cannot run is a prompt that leaves no room
    // under max_model_len: it is rejected, naming the pool that sets the cap.
    Request* add_request(std::vector<int32_t> prompt, const SamplingParams& params, double now) {
        auto r = std::make_unique<Request>();
        r->id = (int)requests_.size();
        r->tokens = std::move(prompt);
        r->num_prompt_tokens = (int)r->tokens.size();
        r->params = params;
        r->arrival_time = now;
        Request* req = r.get();
        requests_.push_back(std::move(r));
        if (req->num_prompt_tokens == 0) reject(*req, "empty prompt", false, now);
        else if (params.max_tokens <= 0) reject(*req, "max_tokens must be >= 1", false, now);
        else if (req->num_prompt_tokens >= cfg_.max_model_len)
            reject(*req, "prompt of " + std::to_string(req->num_prompt_tokens) + " tokens needs " +
                             std::to_string(blocks_for_tokens(req->num_prompt_tokens + 1, pool_.block_size())) +
                             " KV blocks to generate even one token, but max_model_len is " + std::to_string(cfg_.max_model_len) +
                             " (KV cache: " + std::to_string(pool_.num_blocks()) + " blocks of " +
                             std::to_string(pool_.block_size()) + "); it can never fit", false, now);
        else if (cfg_.max_waiting > 0 && (int)waiting_.size() >= cfg_.max_waiting)
            reject(*req, "waiting queue is full (" + std::to_string(cfg_.max_waiting) + "); retry later", true, now);
        else waiting_.push_back(req);
        return req;
    }

    // ---- one step's decision --------------------------------------------------
    SchedulerOutput schedule() {
        SchedulerOutput out;
        int budget = cfg_.max_num_batched_tokens;

        // (1) Running requests, oldest first. Each gets what it still needs:
        //     1 token for a decode, a budget-limited chunk for a prefill that
        //     has not finished (chunked prefill).
        for (size_t i = 0; i < running_.size() && budget > 0;) {
            Request* req = running_[i];
            const int n = std::min(req->num_tokens() - req->num_computed_tokens, budget);
            if (n <= 0) { ++i; continue; }
            // (2) Grow its block table; while that fails, preempt the newest
            //     running request. The victim may be `req` itself when it is
            //     the newest, and then it simply waits for the next step.
            bool self_preempted = false;
            while (!allocate_slots(pool_, req->block_table, {}, req->num_computed_tokens + n)) {
                Request* victim = running_.back();
                preempt(victim, out);
                if (victim == req) { self_preempted = true; break; }
            }
            if (self_preempted) break;  // `req` was the last running request
            out.scheduled.push_back({req, n});
            budget -= n;
            ++i;
        }

        // (3) Admit waiting requests, front first -- but only if nobody was
        //     preempted this step: admitting now would take the very blocks the
        //     victims just gave up, and preempt again next step.
        if (out.preempted.empty()) {
            while (!waiting_.empty() && budget > 0 && (int)running_.size() < cfg_.max_num_seqs) {
                Request* req = waiting_.front();
                const int admitted_tokens = try_admit(req, budget);
                if (admitted_tokens == 0) break;  // FCFS: the head blocks the queue
                waiting_.pop_front();
                if (req->state == RequestState::kPreempted) out.resumed.push_back(req);
                req->state = RequestState::kRunning;
                running_.push_back(req);
                out.scheduled.push_back({req, admitted_tokens});
                budget -= admitted_tokens;
            }
        }
        for (const auto& s : out.scheduled) out.num_scheduled_tokens += s.num_new_tokens;
        return out;
    }

    // ---- after the forward pass -----------------------------------------------
    // The engine calls this for each scheduled request once its K/V are written.
    void on_computed(Request& req, int num_new_tokens) {
        req.num_computed_tokens += num_new_tokens;
        req.num_computed_high_water = std::max(req.num_computed_high_water, req.num_computed_tokens);
        cache_full_blocks(pool_, req.block_table, req.tokens.data(), req.num_computed_tokens);
    }

    // Finish a running request (stop token, max_tokens, max_model_len).
    void finish(Request& req, FinishReason reason, double now) {
        running_.erase(std::remove(running_.begin(), running_.end(), &req), running_.end());
        free_blocks(pool_, req.block_table);
        req.state = RequestState::kFinished;
        req.finish_reason = reason;
        req.finish_time = now;
    }

    // Abort from any state: blocks are back in the pool before this returns.
    // Returns false when the request was already finished (or unknown).
    bool abort(int id, double now) {
        Request* req = request(id);
        if (!req || req->finished()) return false;
        waiting_.erase(std::remove(waiting_.begin(), waiting_.end(), req), waiting_.end());
        finish(*req, FinishReason::kAborted, now);
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

    // Preemption by recompute: free everything, forget computed tokens, keep
    // the output tokens (they are part of what gets recomputed), go to the
    // front of the queue so the victim is the first to come back.
    void preempt(Request* victim, SchedulerOutput& out) {
        running_.pop_back();
        free_blocks(pool_, victim->block_table);
        victim->num_computed_tokens = 0;
        victim->state = RequestState::kPreempted;
        victim->num_preemptions++;
        num_preemptions_total++;
        waiting_.push_front(victim);
        out.preempted.push_back(victim);
    }

    // Try to admit `req` with at most `budget` new tokens this step. Returns the
    // number of tokens scheduled (0 = not admitted; nothing changed).
    int try_admit(Request* req, int budget) {
        // Prefix cache: the longest cached prefix of prompt + outputs (a resumed
        // request usually finds its own blocks that were not evicted yet).
        std::vector<int32_t> hits = find_cached_prefix(pool_, req->tokens.data(), req->num_tokens());
        const int num_cached = (int)hits.size() * pool_.block_size();
        const int n = std::min(req->num_tokens() - num_cached, budget);

        // How many tokens' worth of blocks must exist for the bet we make.
        int must_hold = num_cached + n;  // just this step's chunk
        if (cfg_.full_sequence_must_fit) must_hold = req->num_tokens();
        if (cfg_.admission == Admission::kReserve) must_hold = sequence_cap(*req);
        const int new_blocks = std::max(0, blocks_for_tokens(must_hold, pool_.block_size()) - (int)hits.size());
        int reserve_free = 0;
        if (!running_.empty()) reserve_free = (int)(cfg_.watermark * pool_.num_blocks());
        if (new_blocks + num_free_hits(pool_, hits) + reserve_free > pool_.num_free_blocks()) return 0;

        // Allocate: the whole reservation in reserve mode, else this chunk only.
        const int alloc_tokens = cfg_.admission == Admission::kReserve ? must_hold : num_cached + n;
        if (!allocate_slots(pool_, req->block_table, hits, alloc_tokens)) return 0;
        prefix_cache_queries += req->num_tokens();
        prefix_cache_hits += num_cached;
        req->num_computed_tokens = num_cached;
        return n;
    }

    SchedulerConfig cfg_;
    BlockPool& pool_;
    std::vector<std::unique_ptr<Request>> requests_;  // [num requests] by id, never shrinks
    std::deque<Request*> waiting_;                    // front = next to admit
    std::vector<Request*> running_;                   // admission order: back = newest
};

}  // namespace pkv

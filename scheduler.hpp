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
//
// The model for this file is vLLM V1's vllm/v1/core/sched/scheduler.py, with
// the block work of its kv_cache_manager.py done by paged_kv.cuh's
// allocate_slots / free_blocks / find_cached_prefix. Same loop shape, same
// victim, same "no admission in a preempting step". What we left out: the
// priority policy (vLLM then preempts the lowest priority, latest arrival
// instead of simply the newest), speculative decoding, multimodal encoders,
// and any swap space: vLLM V0 could also preempt by *swapping* a victim's
// blocks to CPU memory and back, trading copy bandwidth for recompute; V1
// dropped it, and on our CPU engine the cache already lives in host memory, so
// there is nowhere cheaper to swap to.
//
// Try it: `build/overload --max-num-seqs 4` runs the chapter 3 workload with
// no preemption at all (4 requests of at most 8 blocks each fit the 40-block
// pool even at their longest), at the price of a longer queue and a later
// first token; `--max-num-seqs 8` lands in between. The lanes show why.
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
//
// PREEMPTED is a waiting state: the request sits in the waiting queue like a
// new one. It is kept apart only so that schedule() can report who *resumed*.
// vLLM's RequestStatus has the same WAITING / RUNNING / PREEMPTED core and
// several FINISHED_* states; its "length" finish covers both of our
// kMaxTokens and kMaxModelLen. vLLM V0 marked a prompt that could never run
// FINISHED_IGNORED; V1 refuses it with an error before it reaches the
// scheduler. We reject it here, so the client gets the reason as an event.

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

// Per-request generation settings, a small subset of vLLM's SamplingParams
// (same default max_tokens of 16).
struct SamplingParams {
    int max_tokens = 16;
    float temperature = 0.0f;  // 0 = greedy
    float top_p = 1.0f;        // 1 = off
    uint64_t seed = 0;         // with (output index), the only source of randomness
    std::vector<int32_t> stop_token_ids;  // besides EOS
    bool ignore_eos = false;
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
    std::string reject_reason;  // set when finish_reason == kRejected
    bool retryable = false;     // a rejection the client may retry (queue full)

    // How many of `tokens` have their K/V in the cache. Reset to 0 on preemption.
    // Between steps it is num_tokens() - 1 for a decoding request: the token
    // just sampled has no K/V yet, and computing it is the next step's work.
    int num_computed_tokens = 0;
    // The most tokens ever computed at once: positions below it that get
    // computed again are *recomputed* work, the price of preemption.
    int num_computed_high_water = 0;
    // Empty while waiting (new or preempted): only running requests hold blocks.
    BlockTable block_table;
    int num_preemptions = 0;  // how often this request was a victim
    // Preemption by swap: the host swap slots that hold copies of its blocks
    // (logical order), while it waits to be swapped back in. Empty otherwise.
    std::vector<int32_t> swap_slots;

    // Timestamps (engine clock, seconds).
    double arrival_time = 0, first_token_time = -1, last_token_time = -1, finish_time = -1;

    int num_tokens() const { return (int)tokens.size(); }
    int num_output_tokens() const { return num_tokens() - num_prompt_tokens; }
    bool finished() const { return state == RequestState::kFinished; }
};

// ============================================================================
// 2. Configuration
// ============================================================================

// What admission bets on. Both modes run the same schedule(); they differ only
// in how many blocks try_admit() demands before letting a request in.
enum class Admission {
    // Page on demand: admit on the blocks the current sequence needs now and
    // preempt when growth fails. Packs the most requests, risks recompute.
    // vLLM's only mode; TensorRT-LLM calls it MAX_UTILIZATION.
    kBet,
    // Reserve prompt + max_tokens (capped at max_model_len) at admission and
    // never preempt (TensorRT-LLM's GUARANTEED_NO_EVICT). Nothing is ever
    // recomputed, but blocks sit reserved and empty for most of a request's
    // life, so far fewer requests run at once. Chapters 3 and 4 of
    // TUTORIAL.md run both on the same workload: no preemption, but time to
    // first token p50 308.6 ms against 135.6 ms for the bet.
    kReserve,
};

// The knobs; the first three carry vLLM's names. Every one of them trades
// concurrency (throughput, queueing) against the risk of preemption
// (recompute, pauses).
enum class Victim { kNewest, kOldest };

// What happens to a victim's KV cache.
enum class Preemption {
    // vLLM V1's only mode: drop it, recompute prompt + outputs on resume.
    // Costs compute (the recomputed tokens), no memory, no copies.
    kRecompute,
    // vLLM V0's other mode: copy the victim's blocks to a host "swap space"
    // of fixed size, copy them back into fresh blocks on resume, keeping
    // num_computed_tokens. Costs PCIe bytes both ways and host memory, no
    // recompute. When the swap space is full we fall back to recompute for
    // that victim and count it; vLLM V0 raised an error and stopped instead.
    kSwap,
};

struct SchedulerConfig {
    // The bluntest fix for thrash: fewer sequences growing at once means fewer
    // block boundaries crossed per step.
    int max_num_seqs = 16;              // most requests running at once
    // Caps the work of one step, so a long prompt is cut into chunks and
    // cannot stall the decodes sharing its step (chunked prefill). Chapter 3's
    // 256 holds 8 prompts of 32 tokens: why step 1 admits exactly 8.
    int max_num_batched_tokens = 256;   // token budget of one step (all requests)
    int max_model_len = 0;              // longest sequence (prompt + output); 0 = derive
    // Admit only if the whole current sequence (prompt + outputs for a resumed
    // request) fits in free blocks, not just its first prefill chunk. Without
    // it a long prompt is admitted on its first chunk and its later chunks
    // preempt the requests that were already running: thrash at admission.
    // It is a check, not a reservation: only this step's chunk is allocated,
    // and the rest may be taken by running requests before the later chunks
    // arrive. tests/test_scheduler.cpp shows both settings.
    bool full_sequence_must_fit = true;
    // Keep this fraction of all blocks free when admitting (0 = off). A
    // cushion for running requests to grow into before anyone is preempted,
    // paid for with lower concurrency. Never blocks an admission into an idle
    // engine (otherwise a big request could wait forever).
    // vLLM V0's block manager had the same idea, a watermark of 1% by default,
    // "to avoid frequent cache eviction".
    double watermark = 0.0;
    Admission admission = Admission::kBet;
    // Shedding at the edge: reject new requests at once (retryable) while this
    // many are already waiting. 0 = unbounded queue. A fast "try again" instead
    // of a stream that stalls behind a queue the engine cannot drain.
    int max_waiting = 0;
    // Who is preempted when a block allocation fails. kNewest is vLLM's
    // running.pop(): the request with the least work to lose, so the oldest
    // ones keep going and finish. kOldest exists as the contrast studied in
    // examples/victim_study: it throws away the most work and keeps every
    // request half-done for longer.
    Victim victim = Victim::kNewest;
    Preemption preemption = Preemption::kRecompute;
    int swap_space_blocks = 0;  // host swap space, in blocks (kSwap only)
};

// What schedule() decided for one step. The engine builds the batch in the
// order of `scheduled`, so that order is also the order of the logits rows.
struct ScheduledRequest {
    Request* req;
    int num_new_tokens;  // tokens to compute this step: 1 for decode, a chunk for prefill
};
struct SchedulerOutput {
    std::vector<ScheduledRequest> scheduled;  // running first (oldest first), then new admissions
    std::vector<Request*> preempted;          // victims of this step, in preemption order
    std::vector<Request*> resumed;            // previously preempted requests admitted again
    int num_scheduled_tokens = 0;
    // Copies the engine must make before the forward pass, as (device block,
    // host swap slot) pairs: swap_out first (the victims' blocks still hold
    // their K/V until a forward pass writes them), then swap_in.
    std::vector<std::pair<int32_t, int32_t>> swap_out, swap_in;
};

// ============================================================================
// 3. The scheduler
// ============================================================================

class Scheduler {
public:
    // Checks the config against the pool once, so that schedule() never has to.
    // The last check matters most: with max_model_len guaranteed to fit an
    // empty pool, "can this request ever run?" becomes a question about its
    // prompt alone, answered in add_request.
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
        if (cfg_.swap_space_blocks < 0) throw std::invalid_argument("swap_space_blocks must be >= 0");
        for (int i = cfg_.swap_space_blocks - 1; i >= 0; --i) free_swap_slots_.push_back(i);  // pop_back hands out 0 first
    }

    const SchedulerConfig& config() const { return cfg_; }
    const std::vector<Request*>& running() const { return running_; }
    const std::deque<Request*>& waiting() const { return waiting_; }
    const std::deque<Request*>& swapped() const { return swapped_; }
    Request* request(int id) { return id >= 0 && id < (int)requests_.size() ? requests_[id].get() : nullptr; }
    int num_requests() const { return (int)requests_.size(); }
    bool has_unfinished() const { return !running_.empty() || !waiting_.empty() || !swapped_.empty(); }

    // Counters the engine turns into metrics.
    long num_preemptions_total = 0;
    // In tokens, not lookups, as vLLM counts them. Chapter 5 of TUTORIAL.md:
    // 224 hit of 2289 queried tokens (10%), and those hits are victims finding
    // their own blocks again.
    long prefix_cache_queries = 0;  // tokens looked up at admission
    long prefix_cache_hits = 0;     // tokens served from cache at admission
    // Swap (Preemption::kSwap): victims swapped out / back in, blocks copied
    // each way, and victims that found the swap space full (recomputed instead).
    long num_swap_outs = 0, num_swap_ins = 0, blocks_swapped_out = 0, blocks_swapped_in = 0, num_swap_fallbacks = 0;
    int swap_slots_in_use() const { return cfg_.swap_space_blocks - (int)free_swap_slots_.size(); }

    // The longest sequence a request may reach: prompt + max_tokens, capped.
    // What reserve admission reserves, and what the bet hopes not to need.
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
    //
    // A queue-full rejection is the only retryable one: the same request may
    // succeed a moment later. Load shedding at the door is cheaper than
    // admitting work that will stall: a fast "try again" lets a client or a
    // router go elsewhere. requests_ keeps every request, finished or not, so
    // that the report at the end can read them; a server would drop them.
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
        //     Serving running requests before waiting ones means work in
        //     progress always gets its blocks before a newcomer does; it is
        //     also vLLM V1's order. "Oldest" means admitted earliest: a
        //     resumed request re-enters running_ at the back, as the newest,
        //     and is therefore the first victim next time (in chapter 3 one
        //     request was preempted 4 times).
        for (size_t i = 0; i < running_.size() && budget > 0;) {
            Request* req = running_[i];
            const int n = std::min(req->num_tokens() - req->num_computed_tokens, budget);
            // Never true in Engine::step(), where a running request always has
            // its last sampled token to compute; vLLM has the same skip for
            // pipeline parallelism and asynchronous scheduling.
            if (n <= 0) { ++i; continue; }
            // (2) Grow its block table; while that fails, preempt a victim:
            //     the newest running request (Victim::kNewest, the default),
            //     or the oldest (kOldest). The victim may be `req` itself, and
            //     then it simply waits for the next step.
            //     Why not just skip `req` and let it keep its blocks? When every
            //     running request sits at a block boundary, nobody can grow and
            //     nobody gives a block back: a deadlock. Freeing a victim is
            //     what guarantees the oldest requests progress.
            //     With kNewest victims come from the back, behind the cursor
            //     `i`, so a victim was never given tokens earlier in this step.
            //     With kOldest it may have been: preempt() takes its tokens back
            //     (vLLM's priority policy has the same case).
            bool self_preempted = false;
            while (!allocate_slots(pool_, req->block_table, {}, req->num_computed_tokens + n)) {
                Request* victim = cfg_.victim == Victim::kNewest ? running_.back() : running_.front();
                const size_t vi = (size_t)(std::find(running_.begin(), running_.end(), victim) - running_.begin());
                preempt(victim, out, budget);
                if (victim == req) { self_preempted = true; break; }
                if (vi < i) --i;  // (kOldest) the victim stood before the cursor
            }
            // `req` left running_, so index i already names the next request
            // (with kNewest there is none: everything behind it went first).
            if (self_preempted) continue;
            out.scheduled.push_back({req, n});
            budget -= n;
            ++i;
        }

        // (3) Admit waiting requests, front first -- but only if nobody was
        //     preempted this step: admitting now would take the very blocks the
        //     victims just gave up, and preempt again next step.
        //     Admission is first come, first served, and the head of the queue
        //     blocks it: a big request at the front is not overtaken by small
        //     ones behind it. Skipping ahead would use the pool better and
        //     could starve the big request forever; vLLM's FCFS policy stops
        //     at the head too.
        //     Swapped-out requests come back before anything new is admitted
        //     (vLLM V0's order): their K/V are waiting in host memory, and a
        //     queue head that cannot come back yet blocks new admissions too.
        bool swapped_blocked = false;
        if (out.preempted.empty()) {
            while (!swapped_.empty() && budget > 0 && (int)running_.size() < cfg_.max_num_seqs) {
                Request* req = swapped_.front();
                const int n = std::min(req->num_tokens() - req->num_computed_tokens, budget);
                if (!allocate_slots(pool_, req->block_table, {}, req->num_computed_tokens + n)) break;
                for (size_t b = 0; b < req->swap_slots.size(); ++b) {
                    out.swap_in.push_back({req->block_table.blocks[b], req->swap_slots[b]});
                    free_swap_slots_.push_back(req->swap_slots[b]);
                }
                num_swap_ins++;
                blocks_swapped_in += (long)req->swap_slots.size();
                req->swap_slots.clear();
                swapped_.pop_front();
                out.resumed.push_back(req);
                req->state = RequestState::kRunning;
                running_.push_back(req);
                out.scheduled.push_back({req, n});
                budget -= n;
            }
            swapped_blocked = !swapped_.empty();
        }
        if (out.preempted.empty() && !swapped_blocked) {
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
    // Full blocks enter the prefix cache only now, never at allocation: a
    // block may be found by another request only once its K/V really exist.
    void on_computed(Request& req, int num_new_tokens) {
        req.num_computed_tokens += num_new_tokens;
        req.num_computed_high_water = std::max(req.num_computed_high_water, req.num_computed_tokens);
        cache_full_blocks(pool_, req.block_table, req.tokens.data(), req.num_computed_tokens);
    }

    // Finish a running request (stop token, max_tokens, max_model_len).
    // Its blocks go back tail first (free_blocks), so with prefix caching the
    // prompt's head, the part most likely shared, is evicted last.
    void finish(Request& req, FinishReason reason, double now) {
        running_.erase(std::remove(running_.begin(), running_.end(), &req), running_.end());
        free_blocks(pool_, req.block_table);
        req.state = RequestState::kFinished;
        req.finish_reason = reason;
        req.finish_time = now;
    }

    // Abort from any state: blocks are back in the pool before this returns.
    // Returns false when the request was already finished (or unknown).
    // A waiting request holds no blocks, so for it finish() frees nothing.
    bool abort(int id, double now) {
        Request* req = request(id);
        if (!req || req->finished()) return false;
        waiting_.erase(std::remove(waiting_.begin(), waiting_.end(), req), waiting_.end());
        swapped_.erase(std::remove(swapped_.begin(), swapped_.end(), req), swapped_.end());
        free_swap_slots_.insert(free_swap_slots_.end(), req->swap_slots.begin(), req->swap_slots.end());
        req->swap_slots.clear();
        finish(*req, FinishReason::kAborted, now);
        return true;
    }

    // The host swap space's own invariant: every slot is free xor held by
    // exactly one swapped-out request, and only swapped-out requests hold any.
    std::string check_swap_invariants() const {
        std::vector<int> holders(cfg_.swap_space_blocks, 0);
        for (int32_t s : free_swap_slots_) {
            if (s < 0 || s >= cfg_.swap_space_blocks) return "free swap slot out of range";
            holders[s]++;
        }
        for (const auto& r : requests_) {
            const bool swapped = std::find(swapped_.begin(), swapped_.end(), r.get()) != swapped_.end();
            if (!r->swap_slots.empty() && !swapped) return "request " + std::to_string(r->id) + " holds swap slots but is not swapped out";
            for (int32_t s : r->swap_slots) {
                if (s < 0 || s >= cfg_.swap_space_blocks) return "swap slot out of range";
                holders[s]++;
            }
        }
        for (int s = 0; s < cfg_.swap_space_blocks; ++s)
            if (holders[s] != 1) return "swap slot " + std::to_string(s) + " is held " + std::to_string(holders[s]) + " times";
        return "";
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
    // As in vLLM V1's _preempt_request: free, num_computed_tokens = 0,
    // PREEMPTED, prepend to waiting. Victims leave newest first and each goes
    // to the front, so chapter 3's victims of step 3 (15, 14, 13) line up as
    // 13, 14, 15, ahead of 16..23: with kNewest, running and waiting together
    // stay in arrival order, which keeps completion order close to it. (With
    // kOldest a later victim queues ahead of older ones.)
    // With Victim::kOldest the victim may already have been given tokens this
    // step: they are taken back (removed from `out`, refunded to `budget`).
    void preempt(Request* victim, SchedulerOutput& out, int& budget) {
        running_.erase(std::find(running_.begin(), running_.end(), victim));
        for (auto it = out.scheduled.begin(); it != out.scheduled.end(); ++it)
            if (it->req == victim) {
                budget += it->num_new_tokens;
                out.scheduled.erase(it);
                break;
            }
        victim->state = RequestState::kPreempted;
        victim->num_preemptions++;
        num_preemptions_total++;
        out.preempted.push_back(victim);
        // Swap: copy the blocks that hold computed K/V to host slots, keep
        // num_computed_tokens, wait in the swapped queue. A victim whose
        // blocks do not fit in the free swap slots falls back to recompute.
        const int nblk = blocks_for_tokens(victim->num_computed_tokens, pool_.block_size());
        if (cfg_.preemption == Preemption::kSwap && nblk > 0) {
            if (nblk <= (int)free_swap_slots_.size()) {
                for (int b = 0; b < nblk; ++b) {
                    const int32_t slot = free_swap_slots_.back();
                    free_swap_slots_.pop_back();
                    victim->swap_slots.push_back(slot);
                    out.swap_out.push_back({victim->block_table.blocks[b], slot});
                }
                num_swap_outs++;
                blocks_swapped_out += nblk;
                free_blocks(pool_, victim->block_table);
                swapped_.push_front(victim);
                return;
            }
            num_swap_fallbacks++;
        }
        // Recompute: drop the K/V, start over from token 0 on resume.
        free_blocks(pool_, victim->block_table);
        victim->num_computed_tokens = 0;
        waiting_.push_front(victim);
    }

    // Try to admit `req` with at most `budget` new tokens this step. Returns the
    // number of tokens scheduled (0 = not admitted; nothing changed).
    int try_admit(Request* req, int budget) {
        // Prefix cache: the longest cached prefix of prompt + outputs (a resumed
        // request usually finds its own blocks that were not evicted yet).
        // [num hit blocks] physical ids in logical order, empty without
        // prefix caching; capped so the last token is always computed.
        std::vector<int32_t> hits = find_cached_prefix(pool_, req->tokens.data(), req->num_tokens());
        const int num_cached = (int)hits.size() * pool_.block_size();
        const int n = std::min(req->num_tokens() - num_cached, budget);

        // How many tokens' worth of blocks must exist for the bet we make.
        // Three answers, from boldest to safest: this step's chunk; the whole
        // current sequence (full_sequence_must_fit); the longest the request
        // may ever grow (reserve mode).
        int must_hold = num_cached + n;  // just this step's chunk
        if (cfg_.full_sequence_must_fit) must_hold = req->num_tokens();
        if (cfg_.admission == Admission::kReserve) must_hold = sequence_cap(*req);
        const int new_blocks = std::max(0, blocks_for_tokens(must_hold, pool_.block_size()) - (int)hits.size());
        int reserve_free = 0;
        if (!running_.empty()) reserve_free = (int)(cfg_.watermark * pool_.num_blocks());
        // A hit on a block that sits in the free list takes that block out of
        // it, so such hits count against free capacity like new blocks do.
        if (new_blocks + num_free_hits(pool_, hits) + reserve_free > pool_.num_free_blocks()) return 0;

        // Allocate: the whole reservation in reserve mode, else this chunk only.
        const int alloc_tokens = cfg_.admission == Admission::kReserve ? must_hold : num_cached + n;
        if (!allocate_slots(pool_, req->block_table, hits, alloc_tokens)) return 0;
        // Counted only for an admission that happened: a request that waits
        // at the head for many steps is not counted once per step.
        prefix_cache_queries += req->num_tokens();
        prefix_cache_hits += num_cached;
        req->num_computed_tokens = num_cached;
        return n;
    }

    SchedulerConfig cfg_;
    BlockPool& pool_;
    std::vector<std::unique_ptr<Request>> requests_;  // [num requests] by id, never shrinks
    std::deque<Request*> swapped_;                    // swapped out, front = next to swap in
    std::vector<int32_t> free_swap_slots_;            // [swap slots free] host swap slot ids
    std::deque<Request*> waiting_;                    // front = next to admit
    std::vector<Request*> running_;                   // admission order: back = newest
};

}  // namespace pkv

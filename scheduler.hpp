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
// Or, vLLM V0's other answer, its blocks are copied to a host *swap space* and
// copied back when it resumes (Preemption::kSwap).
//
// Sections: 1. requests and their states  2. configuration  3. the swap
// space  4. the scheduler: add_request, schedule() (running first,
// preemption, then swapped and waiting), finish and abort.
//
// The model for this file is vLLM V1's vllm/v1/core/sched/scheduler.py, with
// the block work of its kv_cache_manager.py done by block_pool.hpp's
// allocate_slots / free_blocks / find_cached_prefix. Same loop shape, same
// victim, same "no admission in a preempting step". Left out: the priority
// policy (vLLM then preempts the lowest priority, latest arrival instead of
// simply the newest), speculative decoding, multimodal encoders, LoRA.
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
//     first); with oldest-first it lets the rest of running_ proceed.
//   - The free list's order (block_pool.hpp) matches current vLLM: uncached
//     blocks go to the head, cached ones to the tail. Older V1 versions and
//     nano-vllm append every freed block to the tail.
//   - vLLM's SchedulerOutput has num_scheduled_tokens as a per-request map
//     plus total_num_scheduled_tokens; ours keeps each request's count in
//     `scheduled` and the sum in total_num_scheduled_tokens.
//   - Swap: vLLM V1 has none; V0 swapped (by default only groups of several
//     sequences, e.g. beam search) and raised an error when its swap space
//     was full, where we fall back to recompute.
//
// Try it: `build/overload --max-num-seqs 4` runs `make run`'s workload with
// no preemption at all (4 requests of at most 8 blocks each fit the 40-block
// pool even at their longest), at the price of a longer queue and a later
// first token; `--max-num-seqs 8` lands in between. The lanes show why.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <deque>
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
//        |             +---- PREEMPTED <--+  recompute: blocks freed,
//        |             (front of waiting)    num_computed_tokens = 0;
//        |                                   swap: blocks copied to host,
//        |                                   num_computed_tokens kept
//        +--> FINISHED(rejected)     abort: any state --> FINISHED(aborted)
//
// PREEMPTED is a waiting state: the request sits in the waiting queue (or, when
// swapped, the swapped queue) like a new one. It is kept apart only so that
// schedule() can report who *resumed*. vLLM's RequestStatus has the same
// WAITING / RUNNING / PREEMPTED core and several FINISHED_* states; its
// "length" finish covers both of our kMaxTokens and kMaxModelLen. vLLM V0
// marked a prompt that could never run FINISHED_IGNORED; V1 refuses it with an
// error before it reaches the scheduler. We reject it here, so the client gets
// the reason as an event. kError is a request whose forward pass failed
// (engine.hpp): it is finished, with its reason, so the others go on.

enum class RequestState { kWaiting, kRunning, kPreempted, kFinished };
enum class FinishReason { kNone, kStop, kMaxTokens, kMaxModelLen, kAborted, kRejected, kError };

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
        case FinishReason::kError: return "error";
    }
    return "?";
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
    // model had emitted EOS there (0 = never). A real request does not know
    // its length in advance; a study of admission needs requests that end
    // before the max_tokens a client asked for, as real answers do, and a
    // random model (or the simulated GPU) never says EOS on cue. Admission
    // looks only at max_tokens.
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

    // How many of `tokens` have their K/V in the cache. Preemption by
    // recompute resets it to 0; preemption by swap keeps it (the K/V wait in
    // host memory). Between steps it is num_tokens() - 1 for a decoding
    // request: the token just sampled has no K/V yet, and computing it is the
    // next step's work.
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
    // life, so far fewer requests run at once and the queue is longer: the
    // TUTORIAL runs both on the same workload and compares their time to
    // first token.
    kReserve,
};

// Who is preempted when a block allocation fails. kNewest is vLLM's
// running.pop(): the request admitted last, so the oldest ones keep going
// and finish. The other two exist as contrasts the victim study measures:
// kOldest throws away the most work; kFair preempts the request that has
// generated the most tokens so far, so no request runs ahead of the others
// and everyone is slowed alike (processor sharing, the "slow everyone down
// uniformly" answer an operating system gives to memory pressure).
enum class Victim { kNewest, kOldest, kFair };

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

// The names the command lines use, and back. Each parse_* throws
// std::invalid_argument naming the choices.
inline const char* to_string(Admission a) { return a == Admission::kBet ? "bet" : "reserve"; }
inline const char* to_string(Victim v) { return v == Victim::kNewest ? "newest" : v == Victim::kOldest ? "oldest" : "fair"; }
inline const char* to_string(Preemption p) { return p == Preemption::kRecompute ? "recompute" : "swap"; }
inline Admission parse_admission(const std::string& s) {
    if (s == "bet") return Admission::kBet;
    if (s == "reserve") return Admission::kReserve;
    throw std::invalid_argument("admission must be bet or reserve, got '" + s + "'");
}
inline Victim parse_victim(const std::string& s) {
    if (s == "newest") return Victim::kNewest;
    if (s == "oldest") return Victim::kOldest;
    if (s == "fair") return Victim::kFair;
    throw std::invalid_argument("victim must be newest, oldest or fair, got '" + s + "'");
}
inline Preemption parse_preemption(const std::string& s) {
    if (s == "recompute") return Preemption::kRecompute;
    if (s == "swap") return Preemption::kSwap;
    throw std::invalid_argument("preemption must be recompute or swap, got '" + s + "'");
}

// The knobs; the first three carry vLLM's names. Every one of them trades
// concurrency (throughput, queueing) against the risk of preemption
// (recompute, pauses).
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
    int total_num_scheduled_tokens = 0;       // the sum of scheduled[i].num_new_tokens
    // Copies the engine must make before the forward pass, as (device block,
    // host swap slot) pairs: swap_out first (the victims' blocks still hold
    // their K/V until a forward pass writes them), then swap_in.
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
    // Swap (Preemption::kSwap): victims swapped out / back in, blocks copied
    // each way, and victims that found the swap space full (recomputed instead).
    long num_swap_outs = 0, num_swap_ins = 0, blocks_swapped_out = 0, blocks_swapped_in = 0, num_swap_fallbacks = 0;
};

// ============================================================================
// 3. The swap space: which host slots are free
// ============================================================================
//
// The host memory itself belongs to the model runner; this is only the
// bookkeeping of its slots, exactly as the block pool is the bookkeeping of
// the device blocks. A swapped-out request holds one slot per block it had.
class SwapSpace {
public:
    explicit SwapSpace(int num_slots) : num_slots_(num_slots) {
        if (num_slots < 0) throw std::invalid_argument("swap_space_blocks must be >= 0");
        // pop_back hands out slot 0 first.
        for (int i = num_slots - 1; i >= 0; --i) free_.push_back(i);
    }
    int num_slots() const { return num_slots_; }
    int num_free() const { return (int)free_.size(); }
    int in_use() const { return num_slots_ - num_free(); }

    // n slots, or {} (and nothing taken) when fewer than n are free.
    std::vector<int32_t> take(int n) {
        std::vector<int32_t> out;
        if (n > num_free()) return out;
        for (int i = 0; i < n; ++i) {
            out.push_back(free_.back());
            free_.pop_back();
        }
        return out;
    }
    void give_back(const std::vector<int32_t>& slots) { free_.insert(free_.end(), slots.begin(), slots.end()); }

    // Every slot is free xor held exactly once by one of `held` (the swapped
    // requests' slot lists). "" when that holds.
    std::string check_invariants(const std::vector<const std::vector<int32_t>*>& held) const {
        std::vector<int> holders((size_t)num_slots_, 0);
        for (int32_t s : free_) {
            if (s < 0 || s >= num_slots_) return "free swap slot out of range";
            holders[s]++;
        }
        for (const std::vector<int32_t>* v : held)
            for (int32_t s : *v) {
                if (s < 0 || s >= num_slots_) return "swap slot out of range";
                holders[s]++;
            }
        for (int s = 0; s < num_slots_; ++s)
            if (holders[s] != 1) return "swap slot " + std::to_string(s) + " is held " + std::to_string(holders[s]) + " times";
        return "";
    }

private:
    int num_slots_;
    std::vector<int32_t> free_;  // [free slots] host swap slot ids
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
    Scheduler(const SchedulerConfig& cfg, BlockPool& pool) : cfg_(cfg), pool_(pool), swap_(cfg.swap_space_blocks) {
        if (cfg_.max_num_seqs <= 0) throw std::invalid_argument("max_num_seqs must be >= 1");
        if (cfg_.max_num_batched_tokens <= 0) throw std::invalid_argument("max_num_batched_tokens must be >= 1");
        if (cfg_.max_model_len <= 0) throw std::invalid_argument("max_model_len must be >= 1 (the engine derives it)");
        if (cfg_.max_waiting < 0) throw std::invalid_argument("max_waiting must be >= 0 (0 = unbounded)");
        // Written so that NaN fails too: every comparison with NaN is false.
        if (!(cfg_.watermark >= 0.0 && cfg_.watermark < 1.0)) throw std::invalid_argument("watermark must be in [0, 1)");
        if (blocks_for_tokens(cfg_.max_model_len, pool_.block_size()) > pool_.num_blocks())
            throw std::invalid_argument("max_model_len " + std::to_string(cfg_.max_model_len) + " needs " +
                                        std::to_string(blocks_for_tokens(cfg_.max_model_len, pool_.block_size())) +
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
    const std::deque<Request*>& swapped() const { return swapped_; }
    const SwapSpace& swap_space() const { return swap_; }
    Request* request(int id) { return id >= 0 && id < (int)requests_.size() ? requests_[id].get() : nullptr; }
    int num_requests() const { return (int)requests_.size(); }
    bool has_unfinished() const { return !running_.empty() || !waiting_.empty() || !swapped_.empty(); }

    // The longest sequence a request may reach: prompt + max_tokens, capped.
    // What reserve admission reserves, and what the bet hopes not to need.
    // Summed in 64 bits: max_tokens may be as large as an int goes.
    int sequence_cap(const Request& r) const {
        return (int)std::min<int64_t>((int64_t)r.num_prompt_tokens + r.params.max_tokens, cfg_.max_model_len);
    }

    // Register a request. It is rejected at once, with a reason, when the
    // caller already found it invalid (`invalid`, non-empty: the engine checks
    // token ids and sampling parameters), when it can never run, or when the
    // queue is full.
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
        if (!invalid.empty()) reject(*req, invalid, false, now);
        else if (req->num_prompt_tokens == 0) reject(*req, "empty prompt", false, now);
        else if (params.max_tokens <= 0) reject(*req, "max_tokens must be >= 1", false, now);
        else if (req->num_prompt_tokens >= cfg_.max_model_len)
            reject(*req, "prompt of " + std::to_string(req->num_prompt_tokens) + " tokens needs " +
                             std::to_string(blocks_for_tokens((int64_t)req->num_prompt_tokens + 1, pool_.block_size())) +
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

        // ---- exercise 5 begin: the running loop of schedule() ----
        // (1) Running requests, oldest first. Each gets what it still needs:
        //     1 token for a decode, a budget-limited chunk for a prefill that
        //     has not finished (chunked prefill).
        //     Serving running requests before waiting ones means work in
        //     progress always gets its blocks before a newcomer does; it is
        //     also vLLM V1's order. "Oldest" means admitted earliest: a
        //     resumed request re-enters running_ at the back, as the newest,
        //     and is therefore the first victim next time.
        // (2) While allocate_slots cannot grow a request's table to
        //     num_computed_tokens + n, preempt pick_victim() (it may be the
        //     request itself: then it gets nothing this step). Mind the cursor
        //     when a victim stood before it, and record what you schedule in
        //     out.scheduled, charging the budget.
        for (size_t i = 0; i < running_.size() && budget > 0;) {
            Request* req = running_[i];
            const int n = std::min(req->num_tokens() - req->num_computed_tokens, budget);
            // Never true in Engine::step(), where a running request always has
            // its last sampled token to compute; vLLM has the same skip for
            // pipeline parallelism and asynchronous scheduling.
            if (n <= 0) { ++i; continue; }
            // (2) Grow its block table; while that fails, preempt a victim:
            //     the newest running request (Victim::kNewest, the default),
            //     the oldest (kOldest) or the one furthest ahead (kFair). The
            //     victim may be `req` itself, and then it simply waits for the
            //     next step.
            //     Why not just skip `req` and let it keep its blocks? When every
            //     running request sits at a block boundary, nobody can grow and
            //     nobody gives a block back: a deadlock. Freeing a victim is
            //     what guarantees the oldest requests progress.
            //     With kNewest victims come from the back, behind the cursor
            //     `i`, so a victim was never given tokens earlier in this step.
            //     With kOldest or kFair it may have been: preempt() takes its
            //     tokens back (vLLM's priority policy has the same case).
            bool self_preempted = false;
            while (!allocate_slots(pool_, req->block_table, {}, (int64_t)req->num_computed_tokens + n)) {
                Request* victim = pick_victim();
                const size_t vi = (size_t)(std::find(running_.begin(), running_.end(), victim) - running_.begin());
                preempt(victim, out, budget);
                if (victim == req) { self_preempted = true; break; }
                if (vi < i) --i;  // (kOldest, kFair) the victim stood before the cursor
            }
            // `req` left running_, so index i already names the next request
            // (with kNewest there is none: everything behind it went first).
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
        //     Swapped-out requests come back before anything new is admitted
        //     (vLLM V0's order): their K/V are waiting in host memory, and a
        //     queue head that cannot come back yet blocks new admissions too.
        bool swapped_blocked = false;
        if (out.preempted.empty()) {
            while (!swapped_.empty() && budget > 0 && (int)running_.size() < cfg_.max_num_seqs) {
                Request* req = swapped_.front();
                const int n = std::min(req->num_tokens() - req->num_computed_tokens, budget);
                if (!allocate_slots(pool_, req->block_table, {}, (int64_t)req->num_computed_tokens + n)) break;
                for (size_t b = 0; b < req->swap_slots.size(); ++b)
                    out.swap_in.push_back({req->block_table.blocks[b], req->swap_slots[b]});
                swap_.give_back(req->swap_slots);
                stats_.num_swap_ins++;
                stats_.blocks_swapped_in += (long)req->swap_slots.size();
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
        for (const auto& s : out.scheduled) out.total_num_scheduled_tokens += s.num_new_tokens;
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

    // Finish a running request (stop token, max_tokens, max_model_len, or an
    // error in its forward pass). Its blocks go back tail first
    // (free_blocks), so with prefix caching the prompt's head, the part most
    // likely shared, is evicted last. Only a running request can finish this
    // way; a waiting one would be put back into running by retire().
    void finish(Request& req, FinishReason reason, double now) {
        if (req.state != RequestState::kRunning)
            throw std::logic_error("Scheduler::finish: request " + std::to_string(req.id) + " is " + to_string(req.state) +
                                   ", not running (use abort)");
        retire(req, reason, now);
    }

    // Abort from any state: blocks (and swap slots) are free before this
    // returns. Returns false when the request was already finished (or unknown).
    bool abort(int id, double now) {
        Request* req = request(id);
        if (!req || req->finished()) return false;
        waiting_.erase(std::remove(waiting_.begin(), waiting_.end(), req), waiting_.end());
        swapped_.erase(std::remove(swapped_.begin(), swapped_.end(), req), swapped_.end());
        swap_.give_back(req->swap_slots);
        req->swap_slots.clear();
        retire(*req, FinishReason::kAborted, now);
        return true;
    }

    // The host swap space's own invariant: every slot is free xor held by
    // exactly one swapped-out request, and only swapped-out requests hold any.
    std::string check_swap_invariants() const {
        std::vector<const std::vector<int32_t>*> held;
        for (const Request* r : swapped_) held.push_back(&r->swap_slots);
        for (const auto& r : requests_)
            if (!r->swap_slots.empty() && std::find(swapped_.begin(), swapped_.end(), r.get()) == swapped_.end())
                return "request " + std::to_string(r->id) + " holds swap slots but is not swapped out";
        return swap_.check_invariants(held);
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
    // the request out of the waiting and swapped queues.
    void retire(Request& req, FinishReason reason, double now) {
        running_.erase(std::remove(running_.begin(), running_.end(), &req), running_.end());
        free_blocks(pool_, req.block_table);
        req.state = RequestState::kFinished;
        req.finish_reason = reason;
        req.finish_time = now;
    }

    // Preempt `victim`. Both modes: leave running_, count it, report it.
    // Recompute: free everything, forget computed tokens, keep the output
    // tokens (they are part of what gets recomputed), go to the front of the
    // waiting queue so the victim is the first to come back. As in vLLM V1's
    // _preempt_request: free, num_computed_tokens = 0, PREEMPTED, prepend to
    // waiting. Victims leave newest first and each goes to the front, so
    // victims 15, 14, 13 of one step line up as 13, 14, 15, ahead of 16..23:
    // with kNewest, running and waiting together stay in arrival order, which
    // keeps completion order close to it. (With kOldest a later victim queues
    // ahead of older ones.)
    // Swap: copy the blocks that hold computed K/V to host slots, keep
    // num_computed_tokens, wait at the front of the swapped queue. A victim
    // whose blocks do not fit in the free swap slots falls back to recompute.
    // With Victim::kOldest the victim may already have been given tokens this
    // step: they are taken back (removed from `out`, refunded to `budget`).
    void preempt(Request* victim, SchedulerOutput& out, int& budget) {
        // ---- exercise 6 begin: preempt(), by recompute and by swap ----
        // Both modes: leave running_, take back tokens given this step, set
        // state and counters (victim->num_preemptions, stats_), report it in
        // out.preempted. Swap: take host slots for the blocks holding computed
        // tokens; if you get them, record out.swap_out pairs, keep
        // num_computed_tokens, free the blocks, go to the front of swapped_
        // (and count stats_.num_swap_outs, blocks_swapped_out). Otherwise, or
        // for recompute: free the blocks, forget the computed tokens (keep the
        // outputs), front of waiting_ (count stats_.num_swap_fallbacks when a
        // swap fell back).
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
        const int nblk = (int)blocks_for_tokens(victim->num_computed_tokens, pool_.block_size());
        if (cfg_.preemption == Preemption::kSwap && nblk > 0) {
            std::vector<int32_t> slots = swap_.take(nblk);
            if (!slots.empty()) {
                for (int b = 0; b < nblk; ++b) out.swap_out.push_back({victim->block_table.blocks[b], slots[b]});
                victim->swap_slots = std::move(slots);
                stats_.num_swap_outs++;
                stats_.blocks_swapped_out += nblk;
                free_blocks(pool_, victim->block_table);
                swapped_.push_front(victim);
                return;
            }
            stats_.num_swap_fallbacks++;
        }
        free_blocks(pool_, victim->block_table);
        victim->num_computed_tokens = 0;
        waiting_.push_front(victim);
        // ---- exercise 6 end ----
    }

    // The victim of the policy in cfg_.victim, among running_ (not empty).
    // kFair: the most output tokens; on a tie the newest, as vLLM would.
    Request* pick_victim() const {
        // ---- exercise 5 begin: the running loop of schedule() ----
        // kNewest: the back of running_ (vLLM's running.pop()); kOldest: the
        // front; kFair: the most output tokens, the newest on a tie.
        if (cfg_.victim == Victim::kNewest) return running_.back();
        if (cfg_.victim == Victim::kOldest) return running_.front();
        Request* v = running_.back();
        for (auto it = running_.rbegin(); it != running_.rend(); ++it)
            if ((*it)->num_output_tokens() > v->num_output_tokens()) v = *it;
        return v;
        // ---- exercise 5 end ----
    }

    // Try to admit `req` with at most `budget` new tokens this step. Returns the
    // number of tokens scheduled (0 = not admitted; nothing changed).
    int try_admit(Request* req, int budget) {
        // ---- exercise 7 begin: admission, the watermark and the full-sequence gate ----
        // Find the cached prefix (find_cached_prefix); this step's chunk is
        // what is not cached, capped by the budget. Decide how many tokens'
        // worth of blocks must be free: the chunk, the whole current sequence
        // (full_sequence_must_fit) or sequence_cap (reserve). Keep the
        // watermark's share of the pool free, but only while something runs.
        // Free hits count against capacity. Allocate (reserve: everything),
        // count prefix-cache queries and hits, set num_computed_tokens.
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
        const int64_t new_blocks = std::max<int64_t>(0, blocks_for_tokens(must_hold, pool_.block_size()) - (int64_t)hits.size());
        int64_t reserve_free = 0;
        if (!running_.empty()) reserve_free = (int64_t)(cfg_.watermark * pool_.num_blocks());
        // A hit on a block that sits in the free list takes that block out of
        // it, so such hits count against free capacity like new blocks do.
        if (new_blocks + num_free_hits(pool_, hits) + reserve_free > pool_.num_free_blocks()) return 0;

        // Allocate: the whole reservation in reserve mode, else this chunk only.
        const int alloc_tokens = cfg_.admission == Admission::kReserve ? must_hold : num_cached + n;
        if (!allocate_slots(pool_, req->block_table, hits, alloc_tokens)) return 0;
        stats_.prefix_cache_queries += req->num_tokens();
        stats_.prefix_cache_hits += num_cached;
        req->num_computed_tokens = num_cached;
        return n;
        // ---- exercise 7 end ----
    }

    SchedulerConfig cfg_;
    BlockPool& pool_;
    SchedulerStats stats_;
    std::vector<std::unique_ptr<Request>> requests_;  // [num requests] by id, never shrinks
    SwapSpace swap_;                                  // which host swap slots are free
    std::deque<Request*> swapped_;                    // swapped out, front = next to swap in
    std::deque<Request*> waiting_;                    // front = next to admit
    std::vector<Request*> running_;                   // admission order: back = newest
};

}  // namespace pkv

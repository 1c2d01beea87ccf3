// lab/policies.hpp -- lab/LAB.md chapter L3: the other answers: swap, other
// victims, reservation, a watermark and load shedding, behind scheduler.hpp's
// seam.
//
// scheduler.hpp answers the card's four questions one way each (newest
// victim, recompute, the whole current sequence must fit, refuse nobody who
// can ever fit). Engines and operating systems have answered differently, and
// the studies (lab/studies.hpp) measure what each answer costs. LabPolicy is
// all of those answers in one SchedulerPolicy, chosen by a PolicyConfig:
//
//   victim      kNewest (the card's), kOldest, kFair           pick_victim
//   preemption  kRecompute (the card's), kSwap (vLLM V0)       take_victim, resume
//   admission   kBet (the card's), kReserve (TensorRT-LLM)     admission
//   watermark   blocks kept free when admitting (vLLM V0)      admission
//   max_waiting shed new requests while the queue is this long shed
//
// A config with every field at its default makes no policy at all
// (make_policy returns an empty factory), so the card's scheduler runs
// untouched. Nothing here changes what a request computes: its tokens are the
// same bits under every policy (tests/test_swap.cpp, test_scheduler.cpp).
//
// Swap's host memory, its copies and its counters are lab/swap.hpp's; this
// file decides when to swap and what becomes of the request.
//
// Sections: 1. the choices  2. LabPolicy.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/block_pool.hpp"
#include "lab/swap.hpp"
#include "scheduler.hpp"

namespace pkv {

// ============================================================================
// 1. The choices
// ============================================================================

// What admission bets on.
enum class Admission {
    // Page on demand: admit on the blocks the current sequence needs now and
    // preempt when growth fails. Packs the most requests, risks recompute.
    // vLLM's only mode; TensorRT-LLM calls it MAX_UTILIZATION.
    kBet,
    // Reserve prompt + max_tokens (capped at max_model_len) at admission and
    // never preempt (TensorRT-LLM's GUARANTEED_NO_EVICT). Nothing is ever
    // recomputed, but blocks sit reserved and empty for most of a request's
    // life, so far fewer requests run at once and the queue is longer.
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
    kRecompute,
    // vLLM V0's other mode: copy the victim's blocks to a host "swap space"
    // of fixed size (PolicyConfig::swap_space_blocks), copy them back into
    // fresh blocks on resume, keeping num_computed_tokens. Costs PCIe bytes
    // both ways and host memory, no recompute. When the swap space is full we
    // fall back to recompute for that victim and count it; vLLM V0 raised an
    // error and stopped instead. vLLM V0 swapped only groups of several
    // sequences by default (beam search); V1 has no swap at all.
    kSwap,
};

inline const char* to_string(Admission a) { return a == Admission::kBet ? "bet" : "reserve"; }
inline const char* to_string(Victim v) { return v == Victim::kNewest ? "newest" : v == Victim::kOldest ? "oldest" : "fair"; }
inline const char* to_string(Preemption p) { return p == Preemption::kRecompute ? "recompute" : "swap"; }

struct PolicyConfig {
    Admission admission = Admission::kBet;
    Victim victim = Victim::kNewest;
    Preemption preemption = Preemption::kRecompute;
    // Keep this fraction of all blocks free when admitting (0 = off): a
    // cushion for running requests to grow into before anyone is preempted,
    // paid for with lower concurrency. Never blocks an admission into an idle
    // engine (otherwise a big request could wait forever). vLLM V0's block
    // manager had the same idea, a watermark of 1% by default, "to avoid
    // frequent cache eviction".
    double watermark = 0.0;
    // Shedding at the edge: reject new requests at once (retryable) while this
    // many are already waiting. 0 = unbounded queue. A fast "try again"
    // instead of a stream that stalls behind a queue the engine cannot drain.
    int max_waiting = 0;
    // Host swap space, in blocks (vLLM V0's CacheConfig.swap_space), for kSwap.
    int swap_space_blocks = 0;

    bool is_card() const {
        return admission == Admission::kBet && victim == Victim::kNewest && preemption == Preemption::kRecompute &&
               watermark == 0.0 && max_waiting == 0;
    }
};

// The longest sequence a request may reach (what the bet hopes not to need,
// and what reserve admission holds): prompt + max_tokens, in 64 bits, capped
// at max_model_len.
inline int sequence_cap(const Scheduler& s, const Request& r) {
    return (int)std::min<int64_t>((int64_t)r.num_prompt_tokens + r.params.max_tokens, s.config().max_model_len);
}

// ============================================================================
// 2. LabPolicy
// ============================================================================

// Where a swapping LabPolicy finds whoever moves the bytes (lab/swap.hpp).
// The copier needs the KV cache, which exists only once the engine does, so
// it is set after the engine is built (examples/workload.hpp, make_engine):
// `owned` when this object owns it (HostSwapMemory), or only `copier` when the
// engine's runner is the copier itself (the simulated GPU).
struct SwapTarget {
    std::unique_ptr<BlockCopier> owned;
    BlockCopier* copier = nullptr;
};

class LabPolicy : public SchedulerPolicy {
public:
    LabPolicy(const PolicyConfig& c, std::shared_ptr<SwapTarget> target = nullptr)
        : cfg_(c), swap_(c.swap_space_blocks), target_(std::move(target)) {
        if (c.max_waiting < 0) throw std::invalid_argument("max_waiting must be >= 0 (0 = unbounded)");
        // Written so that NaN fails too: every comparison with NaN is false.
        if (!(c.watermark >= 0.0 && c.watermark < 1.0)) throw std::invalid_argument("watermark must be in [0, 1)");
    }

    const PolicyConfig& config() const { return cfg_; }
    // The swap counters, as of now (lab/swap.hpp section 3).
    SwapStats stats() const {
        SwapStats s = stats_;
        s.slots_in_use = swap_.in_use();
        s.num_slots = swap_.num_slots();
        return s;
    }
    const std::deque<Request*>& swapped() const { return swapped_; }  // front = next to swap in
    const SwapSpace& swap_space() const { return swap_; }
    // The host slots holding `r`'s blocks (logical order) while it is swapped out.
    const std::vector<int32_t>& swap_slots(const Request& r) const {
        static const std::vector<int32_t> none;
        const auto it = slots_.find(r.id);
        return it == slots_.end() ? none : it->second;
    }

    std::string shed(const Scheduler& s, const Request&) override {
        if (cfg_.max_waiting > 0 && (int)s.waiting().size() >= cfg_.max_waiting)
            return "waiting queue is full (" + std::to_string(cfg_.max_waiting) + "); retry later";
        return "";
    }

    // kNewest: the back of running (vLLM's running.pop()); kOldest: the front;
    // kFair: the most output tokens, the newest on a tie, as vLLM would.
    Request* pick_victim(const std::vector<Request*>& running) override {
        // ---- exercise 11 begin: lab L3: choosing the victim ----
        // kNewest: the back of `running`; kOldest: the front; kFair: the most
        // output tokens, the newest on a tie.
        if (cfg_.victim == Victim::kNewest) return running.back();
        if (cfg_.victim == Victim::kOldest) return running.front();
        Request* v = running.back();
        for (auto it = running.rbegin(); it != running.rend(); ++it)
            if ((*it)->num_output_tokens() > v->num_output_tokens()) v = *it;
        return v;
        // ---- exercise 11 end ----
    }

    // Swap: copy the blocks that hold computed K/V to host slots, keep
    // num_computed_tokens, wait at the front of the swapped queue. A victim
    // whose blocks do not fit in the free swap slots falls back to recompute.
    bool take_victim(Scheduler& s, Request& victim) override {
        // ---- exercise 12 begin: lab L3: swap out and back in ----
        // Swap: take host slots for the blocks holding computed tokens; if you
        // get them, copy those blocks out now (copy_out: before they are
        // freed, before anything can write them), keep num_computed_tokens,
        // free the blocks, go to the front of swapped_ (count
        // stats_.num_swap_outs, blocks_swapped_out) and return true. Otherwise
        // count stats_.num_swap_fallbacks and return false (the scheduler
        // recomputes).
        // A victim with no computed token (its first chunk never ran) has
        // nothing to copy and nothing to recompute: return false at once,
        // taking no slot and counting neither a swap-out nor a fallback.
        if (cfg_.preemption != Preemption::kSwap) return false;
        const int nblk = (int)blocks_for_tokens(victim.num_computed_tokens, s.pool().block_size());
        if (nblk == 0) return false;  // nothing computed: nothing to copy, nothing to recompute
        std::vector<int32_t> slots = swap_.take(nblk);
        if (slots.empty()) {
            stats_.num_swap_fallbacks++;
            return false;
        }
        BlockSlotPairs pairs;
        for (int b = 0; b < nblk; ++b) pairs.push_back({victim.block_table.blocks[(size_t)b], slots[(size_t)b]});
        copier().copy_out(pairs);
        stats_.bytes_out += (long)(nblk * copier().bytes_per_block());
        slots_[victim.id] = std::move(slots);
        stats_.num_swap_outs++;
        stats_.blocks_swapped_out += nblk;
        free_blocks(s.pool(), victim.block_table);
        swapped_.push_front(&victim);
        return true;
        // ---- exercise 12 end ----
    }

    // Swapped-out requests come back before anything new is admitted (vLLM
    // V0's order): their K/V are waiting in host memory, and a queue head that
    // cannot come back yet blocks new admissions too.
    bool resume(Scheduler& s, SchedulerOutput& out, int& budget) override {
        // ---- exercise 12 begin: lab L3: swap out and back in ----
        // Back in: front of swapped_ first, while budget and max_num_seqs
        // allow. Grow its empty table to num_computed_tokens + n (n: what it
        // still needs, capped by the budget); if the pool cannot, stop (it
        // stays at the front). Copy its host slots into the new blocks
        // (copy_in, logical order), give the slots back, count stats_
        // (num_swap_ins, blocks_swapped_in, bytes_in), s.start_running it.
        // Return true only when nobody is left swapped out: until then no new
        // request is admitted.
        while (!swapped_.empty() && budget > 0 && (int)s.running().size() < s.config().max_num_seqs) {
            Request* req = swapped_.front();
            const int n = std::min(req->num_tokens() - req->num_computed_tokens, budget);
            if (!allocate_slots(s.pool(), req->block_table, {}, (int64_t)req->num_computed_tokens + n)) break;
            std::vector<int32_t>& slots = slots_[req->id];
            BlockSlotPairs pairs;
            for (size_t b = 0; b < slots.size(); ++b) pairs.push_back({req->block_table.blocks[b], slots[b]});
            copier().copy_in(pairs);  // into the fresh blocks, before this step's forward pass reads them
            swap_.give_back(slots);
            stats_.num_swap_ins++;
            stats_.blocks_swapped_in += (long)slots.size();
            stats_.bytes_in += (long)(slots.size() * copier().bytes_per_block());
            slots_.erase(req->id);
            swapped_.pop_front();
            s.start_running(req, n, out, budget);
        }
        return swapped_.empty();
        // ---- exercise 12 end ----
    }

    Admit admission(const Scheduler& s, const Request& req, Admit a) override {
        // ---- exercise 13 begin: lab L3: reservation and the watermark ----
        // Reserve: must_hold and alloc_tokens are the request's longest
        // sequence (sequence_cap). The watermark keeps its share of
        // the pool free, but only while something runs.
        if (cfg_.admission == Admission::kReserve) a.must_hold = a.alloc_tokens = sequence_cap(s, req);
        if (!s.running().empty()) a.keep_free = (int64_t)(cfg_.watermark * s.pool().num_blocks());
        return a;
        // ---- exercise 13 end ----
    }

    bool forget(Request& r) override {
        const auto it = std::find(swapped_.begin(), swapped_.end(), &r);
        if (it == swapped_.end()) return false;
        swapped_.erase(it);
        swap_.give_back(slots_[r.id]);
        slots_.erase(r.id);
        return true;
    }
    size_t num_held() const override { return swapped_.size(); }

    // Every slot is free xor held by exactly one swapped-out request, and
    // only swapped-out requests hold any.
    std::string check_invariants(const Scheduler&) const override {
        std::vector<const std::vector<int32_t>*> held;
        for (const auto& [id, slots] : slots_) {
            const int rid = id;  // (a lambda may not capture a structured binding before C++20's fix, P1091, in clang 14)
            if (std::none_of(swapped_.begin(), swapped_.end(), [&](const Request* r) { return r->id == rid; }))
                return "request " + std::to_string(id) + " holds swap slots but is not swapped out";
            held.push_back(&slots);
        }
        if (held.size() != swapped_.size()) return "a swapped-out request holds no swap slots";
        return swap_.check_invariants(held);
    }

private:
    BlockCopier& copier() const {
        if (!target_ || !target_->copier)
            throw std::logic_error("LabPolicy: swap has no copier; build the engine with make_engine (examples/workload.hpp), "
                                   "which gives it one");
        return *target_->copier;
    }
    PolicyConfig cfg_;
    SwapStats stats_;                                         // counted as they happen; stats() adds the slots
    SwapSpace swap_;                                          // which host swap slots are free
    std::shared_ptr<SwapTarget> target_;                      // who copies (kSwap only)
    std::deque<Request*> swapped_;                            // swapped out, front = next to swap in
    std::unordered_map<int, std::vector<int32_t>> slots_;     // request id -> its host slots, logical order
};

// The SchedulerConfig::policy for `c`: empty when `c` is the card's, so that
// the card's scheduler runs without any policy object of ours. A swapping
// policy copies through `target` (set once the engine exists: SwapTarget).
inline std::function<std::unique_ptr<SchedulerPolicy>(const SchedulerConfig&)> make_policy(const PolicyConfig& c,
                                                                                           std::shared_ptr<SwapTarget> target = nullptr) {
    if (c.is_card()) return {};
    return [c, target](const SchedulerConfig&) { return std::make_unique<LabPolicy>(c, target); };
}

// The LabPolicy a scheduler runs, or nullptr (the card's).
inline LabPolicy* lab_policy(Scheduler& s) { return dynamic_cast<LabPolicy*>(&s.policy()); }
inline const LabPolicy* lab_policy(const Scheduler& s) { return dynamic_cast<const LabPolicy*>(&s.policy()); }

}  // namespace pkv

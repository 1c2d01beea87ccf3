// tests/exercises/lab_util.hpp -- what the lab exercises' checks (11, 12 and
// 13: lab/policies.hpp's LabPolicy, lab/LAB.md chapter L3) share, on top of
// check_util.hpp. The core exercises' checks never include it: they use no
// lab/ code (`kit selftest` checks that).
//
//   - a config that runs a LabPolicy: use_policy goes through make_policy as
//     the programs do (so the card's own config runs no policy object at
//     all), use_lab_policy builds a LabPolicy whatever the config, so that
//     even the card's answers are LabPolicy's own code;
//   - the scheduler's LabPolicy, and the names of the requests it holds;
//   - Copies: a BlockCopier (lab/swap.hpp) that records the copies a swapping
//     policy asks for instead of moving bytes (no model runs here).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "lab/policies.hpp"
#include "lab/swap.hpp"
#include "scheduler.hpp"
#include "tests/exercises/check_util.hpp"

// doctest last, after every header with an exercise region (main.cpp says why).
#include <doctest/doctest.h>

namespace pkv_check {

using namespace pkv;

// (device block, host slot) pairs, in the order a copier received them.
using Pairs = std::vector<std::pair<int32_t, int32_t>>;

// The copies a swapping policy asked for, in order; it moves no bytes.
// `freed` records, at each copy_out, whether any of its blocks was already
// free: a copy must happen before the blocks go back to the pool.
struct Copies : BlockCopier {
    const BlockPool* pool = nullptr;
    Pairs out, in;
    bool freed = false;
    void copy_out(const BlockSlotPairs& p) override {
        for (const auto& [block, slot] : p) freed = freed || pool->block(block).ref_cnt == 0;
        out.insert(out.end(), p.begin(), p.end());
    }
    void copy_in(const BlockSlotPairs& p) override { in.insert(in.end(), p.begin(), p.end()); }
    uint64_t bytes_per_block() const override { return 1; }
};

// A config that runs `p` as the programs do (make_policy: nothing at all for
// the card's config).
inline void use_policy(SchedulerConfig& c, const PolicyConfig& p) { c.policy = make_policy(p); }
// A config that runs a LabPolicy for `p`, even the card's, copying through
// `copies` (which it resets and points at `pool`) when it swaps.
inline void use_lab_policy(SchedulerConfig& c, const PolicyConfig& p, Copies* copies = nullptr, const BlockPool* pool = nullptr) {
    auto target = std::make_shared<SwapTarget>();
    if (copies) {
        *copies = Copies{};
        copies->pool = pool;
        target->copier = copies;
    }
    c.policy = [p, target](const SchedulerConfig&) { return std::make_unique<LabPolicy>(p, target); };
}

// The scheduler's LabPolicy (the check fails if it runs none).
inline const LabPolicy& lab(const Scheduler& s) {
    const LabPolicy* p = lab_policy(s);
    REQUIRE(p != nullptr);
    return *p;
}
inline std::string names_swapped(const Scheduler& s) { return names(lab(s).swapped()); }

// "newest/recompute/bet/wm 0", for CAPTURE.
inline std::string describe(const PolicyConfig& p) {
    return std::string(to_string(p.victim)) + "/" + to_string(p.preemption) + "/" + to_string(p.admission) + "/wm " +
           std::to_string(p.watermark) + "/max_waiting " + std::to_string(p.max_waiting);
}

// Every PolicyConfig with the given victim, over the fields that must not
// change what a LabPolicy method computes unless it is about them:
// preemption x admission x watermark x max_waiting.
inline std::vector<PolicyConfig> every_config_with(Victim v, int swap_space_blocks = 8) {
    std::vector<PolicyConfig> all;
    for (Preemption pre : {Preemption::kRecompute, Preemption::kSwap})
        for (Admission adm : {Admission::kBet, Admission::kReserve})
            for (double wm : {0.0, 0.3})
                for (int mw : {0, 3})
                    all.push_back({.admission = adm, .victim = v, .preemption = pre, .watermark = wm, .max_waiting = mw,
                                   .swap_space_blocks = swap_space_blocks});
    return all;
}

}  // namespace pkv_check

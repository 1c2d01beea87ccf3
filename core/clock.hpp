// core/clock.hpp -- chapter 6: where the engine's timestamps come from.
//
// Every timestamp the engine records comes from a Clock. The default is the
// wall clock; tests use a manual clock that advances one unit per step, so
// latencies are counted in steps and are exactly reproducible. The seam:
// any Clock plugs in (Engine's constructor takes one); lab/LAB.md chapter L6
// plugs in one of modelled time.
//
// Why a virtual interface and not a template parameter? One virtual call per
// timestamp is nothing next to a forward pass, and it keeps Engine a plain
// class that every example and test names the same way.
#pragma once

#include <chrono>

namespace pkv {

struct Clock {
    virtual ~Clock() = default;
    virtual double now() = 0;             // seconds
    virtual void on_step_end() {}         // a step has finished
};
// steady_clock, not system_clock: every metric is a difference of two
// timestamps, and steady_clock never jumps when the system time is adjusted.
struct WallClock : Clock {
    double now() override {
        return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
    }
};
// Time stands still inside a step and jumps by seconds_per_step at its end.
// Every timestamp of one step is therefore equal, and a preemption pause reads
// as a whole number of steps: what the scheduler tests assert on.
struct StepClock : Clock {
    double t = 0.0, seconds_per_step = 1.0;
    double now() override { return t; }
    void on_step_end() override { t += seconds_per_step; }
};

}  // namespace pkv

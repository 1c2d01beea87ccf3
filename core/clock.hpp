// core/clock.hpp -- chapter 7: where the engine's timestamps come from.
//
// Every timestamp the engine records comes from a Clock. The default is the
// wall clock; tests use a manual clock that advances one unit per step, so
// latencies are counted in steps and are exactly reproducible; a simulated
// backend (lab/sim_runner.hpp) advances it by a modelled step time instead.
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
    // A modelled runner (the simulated GPU) reports how long its work would
    // have taken; a clock of simulated time moves forward by it.
    virtual void advance(double /*seconds*/) {}
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
// Simulated time: it moves only when a modelled runner says its work took
// time, so inside a step everything before the forward pass happens at the
// step's start and every token at its end.
struct VirtualClock : Clock {
    double t = 0.0;
    double now() override { return t; }
    void advance(double seconds) override { t += seconds; }
};

}  // namespace pkv

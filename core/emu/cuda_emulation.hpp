// core/emu/cuda_emulation.hpp -- the CUDA emulator, part 2 (skip on a first reading; TUTORIAL
// appendix A walks it): how the emulated launch runs a block's CUDA threads on one CPU thread.
//
// cuda_shim.hpp lets a kernel written in CUDA C++ run on the CPU: under g++ its
// `launch(...)` runs every thread block of the grid, one after another, and
// the threads of each block must run *as if* at the same time: they meet at
// syncthreads(), they exchange values with shfl_xor, they share the block's
// shared memory. This header is the machine under that launch: what runs the
// blockDim threads of a block, and how a barrier stops and restarts them.
//
// The obvious design, and the one we had first: one OS thread per CUDA thread,
// a std::barrier per syncthreads(). It is honest (the threads really run
// concurrently) but slow, and the cost is in the wrong place: a barrier of a
// 128-thread block puts 127 threads to sleep in the kernel (a futex wait) and
// wakes them all again, two system calls and a trip through the OS scheduler
// per thread per barrier, on a machine with two cores. A generation with the
// 260K-parameter story model spent almost all of its time that way, as system
// time (the TUTORIAL has the figures, before and after).
//
// What we do instead: the threads of a block are *fibers* -- each has its own
// stack, but all of them run on the host thread that called launch(), one at a
// time, and a fiber gives up the CPU only where a CUDA thread would wait for
// others: at syncthreads() and at a shuffle. A barrier then costs what a
// function call costs. Concretely (the block runner, below):
//
//   - the host thread runs a *scheduler loop* over the block's fibers in
//     threadIdx order: it resumes each fiber that can go on; the fiber runs
//     the kernel until it arrives at a barrier, marks itself waiting and
//     switches back. The last fiber to arrive opens the barrier and runs on;
//     the loop resumes the others on its next pass. When every fiber has
//     returned from the kernel, the block is done;
//   - switching fibers is saving six registers and the stack pointer and
//     loading another fiber's (fibers.hpp, section 1): a few dozen instructions and no
//     system call. The C library's swapcontext() would also do, but it saves and
//     restores the signal mask with a system call on every switch, which is
//     exactly the cost we are leaving behind; it remains the fallback where we
//     have no hand-written switch (other CPUs than x86-64);
//   - each fiber's stack is a separate mapping with an unmapped guard page
//     below it (fibers.hpp, section 2), made once and reused by every later launch: a
//     fiber is created the first time a launch needs a CUDA thread with its
//     index, exactly like the OS threads of the old design;
//   - the scheduler is per host thread (a thread_local), so two host threads
//     may launch at the same time, each running its own blocks.
//
// What this keeps, and why it is enough: the index space, per-block shared
// memory, shuffles, and barrier *semantics* are exactly CUDA's (a fiber cannot
// leave a barrier before every thread of its block has arrived), and a kernel
// runs the same instructions in the same order within each thread. What it
// changes is the interleaving: it is now always the same one (fiber 0 to its
// first barrier, fiber 1 to its first barrier, ...), where OS threads gave a
// different one each run. For results that changes nothing (our kernels are
// deterministic by construction); for the bugs a barrier prevents it changes
// how we find them:
//
//   - a missing syncthreads() no longer races *in time*: fiber 0 runs both
//     sides of the missing barrier before fiber 1 starts. ThreadSanitizer
//     still finds it, because it does not look at time but at the
//     happens-before order, and we tell it that order (fibers.hpp, section 3): each fiber
//     is a TSan "fiber" (its own vector clock, like a thread), switching
//     between them is declared to synchronize nothing, and a barrier is
//     declared as what it is, every arrival a release and every departure an
//     acquire. So a write in one fiber and a read in another that no barrier
//     orders is reported as the data race it would be on a GPU, every run,
//     not only when the timing is unlucky (`make tsan`, tools/tsan_demo.sh);
//   - a thread that skips a barrier the others wait at used to hang the
//     program. Now the scheduler sees it: a pass over the block in which no
//     fiber can go on, with some still waiting, is a deadlock, and launch()
//     throws a std::logic_error naming who waits where and who has returned;
//   - AddressSanitizer is told about every stack switch (fibers.hpp, section 3), or it
//     would take a throw on a fiber's stack for a corrupted stack;
//   - gdb sees one thread, not blockDim of them; a breakpoint in a kernel
//     stops in whichever fiber gets there first (in threadIdx order), the
//     built-ins (threadIdx, blockIdx) are those of that fiber, and a backtrace
//     ends at the fiber's entry. `next` over a syncthreads() works: the other
//     fibers run through the barrier meanwhile, and gdb stops when this
//     fiber's own frame returns from it.
//
// An exception must never unwind across a fiber boundary (the other side of
// the switch is another stack: the unwinder would walk into garbage). So each
// fiber's entry function catches everything its kernel throws, stores it, and
// only then switches back; launch() rethrows the first one on the host.
//
// The low-level pieces (switching stacks, fiber stacks, the sanitizers' fiber
// calls) are in fibers.hpp; this file is the block runner built on them.
#pragma once

#ifdef __CUDACC__
#error "cuda_emulation.hpp is the CPU stand-in for a GPU; under nvcc include cuda_shim.hpp"
#endif

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <initializer_list>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "fibers.hpp"  // context_switch, FiberStack, the TSan/ASan fiber calls

namespace pkv {

// CUDA's dim3, with its defaults of 1: dim3(T) is a one-dimensional grid of T.
// It lives in namespace pkv (CUDA's is global), which is why test_kernels.cpp
// spells it Dim3. The constructor is constexpr so that the thread_local
// built-ins below are initialized at compile time: reading one is then a
// plain load, not a call that first checks whether it was initialized.
struct dim3 {
    unsigned x = 1, y = 1, z = 1;
    constexpr dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};

// The built-in variables. On a GPU they are special registers; here they are
// thread_local globals of the host thread that runs the launch, which every
// fiber of the block shares: the scheduler writes threadIdx before it resumes
// a fiber (the block runner), launch() writes the others. Kernel code reads
// threadIdx.x unchanged, and so does gdb (`print threadIdx`).
inline thread_local dim3 threadIdx, blockIdx, blockDim, gridDim;

namespace emu {

// ============================================================================
// The block runner
// ============================================================================

// A barrier, counted as CUDA counts it: `expected` threads take part, and the
// phase ends when that many have arrived. The block has one (syncthreads()),
// each warp one (shfl_xor). A thread that leaves the launch by throwing is
// dropped: it no longer counts, for this phase and every later one, so the
// others do not wait for it forever (std::barrier's arrive_and_drop).
// A fiber that waits remembers the phase it waits for; the phase number moving
// on is what lets it go.
//
// TSan's sync addresses alternate by phase parity: a fiber leaving phase k
// acquires only what was released *into phase k* (a fiber that already
// arrived at phase k + 1 released into the other address, and nothing of
// that may leak to a thread still leaving phase k). Two suffice: nobody can
// arrive at phase k + 2 before everybody has left phase k.
struct Barrier {
    unsigned expected = 0;  // threads taking part
    unsigned arrived = 0;   // arrived in this phase
    unsigned phase = 0;     // phases completed so far
    char sync[2] = {};      // [phase parity]: addresses for TSan's release/acquire
    void* sync_of(unsigned ph) { return &sync[ph & 1u]; }
    void reset(unsigned n) { expected = n; arrived = 0; phase = 0; }
};

// One warp, for shfl_xor (cuda_shim.hpp): its barrier, and a mailbox per lane.
// Two mailboxes, used in turn by successive shuffles: a lane that leaves
// shuffle k early (the last to arrive, which runs on at once) writes its next
// value into the other mailbox while the others still read shuffle k's, and
// it cannot come back to this one before every lane has arrived at shuffle
// k + 1, i.e. finished reading. So one barrier per shuffle suffices.
constexpr int kWarpLanes = 32;
constexpr size_t kMailBytes = 256;  // the most one shuffle may move per lane (shfl_xor_n)
struct Warp {
    Barrier bar;
    int lanes = 0;               // 32, or fewer in a partial last warp
    unsigned parity[kWarpLanes];  // [lane]: which mailbox the lane's next shuffle uses
    alignas(16) unsigned char mail[2][kWarpLanes][kMailBytes];  // [parity, lane, bytes of the values]
};

// What a fiber throws into itself when the scheduler gives up on a deadlocked
// block: it unwinds the kernel's frames and is caught by fiber_main, never
// seen by anyone else.
struct Cancelled {};

class BlockRunner;

// One emulated CUDA thread: its stack and context, its TSan context, and what
// the scheduler knows about it.
struct Fiber {
    BlockRunner* runner = nullptr;
    unsigned tid = 0;  // threadIdx's linear index
    dim3 idx;          // threadIdx in the current launch
    Warp* warp = nullptr;
    unsigned lane = 0;
    FiberStack stack;
    Context ctx;
    void* fake_stack = nullptr;  // ASan's, while suspended
    void* tsan = nullptr;        // TSan's context for this fiber
    std::string name;            // ...and the name its reports give the fiber
    // The scheduler's view, written by the fiber and the scheduler alone.
    Barrier* waiting = nullptr;  // the barrier it waits at, or null
    unsigned wait_phase = 0;     // ...until this phase has completed
    bool done = false;           // returned from this block (or dropped)
    bool dropped = false;        // threw: out of the rest of the launch
    unsigned error_order = 0;    // when it threw, for "the first exception"
    std::exception_ptr error;    // what it threw
};

// The fiber running now on this host thread (null on the host's own stack).
inline thread_local Fiber* current = nullptr;

// Runs blocks of CUDA threads as fibers, one block at a time, on the thread
// that calls it. One per host thread (runner(), below).
//
// launch() (cuda_shim.hpp) uses it as: start_launch(block shape); then
// run_block(blockIdx) for each block, which returns when every thread of the
// block has returned from the kernel; then finish_launch(), which rethrows the
// first exception a thread threw.
class BlockRunner {
public:
    // The kernel call every thread makes: body(arg), with the built-ins set.
    struct Body {
        void (*fn)(void*) = nullptr;
        void* arg = nullptr;
    };

    BlockRunner() {
#ifdef PKV_EMU_TSAN
        host_tsan_ = __tsan_get_current_fiber();
#endif
    }
    BlockRunner(const BlockRunner&) = delete;
    BlockRunner& operator=(const BlockRunner&) = delete;
    ~BlockRunner() {
#ifdef PKV_EMU_TSAN
        for (auto& f : fibers_) __tsan_destroy_fiber(f->tsan);
#endif
        // Every fiber is suspended in fiber_main's loop with nothing to
        // destroy on its stack, so dropping the stacks is all there is to do.
    }

    // Prepare a launch of blocks of `block` threads running `body`: the
    // fibers (created the first time a thread index is needed), their
    // built-ins, the block's barrier and the warps.
    void start_launch(dim3 block, Body body) {
        // A kernel that launches a kernel (CUDA's dynamic parallelism) would
        // run it on this very runner, in the middle of its own block.
        if (current) throw std::logic_error("launch: called from inside a kernel (dynamic parallelism), which the emulation does not model");
        n_ = block.x * block.y * block.z;
        while (fibers_.size() < n_) add_fiber();
        for (unsigned tid = 0; tid < n_; ++tid) {
            Fiber& f = *fibers_[tid];
            f.idx = dim3(tid % block.x, tid / block.x % block.y, tid / (block.x * block.y));
            f.warp = &warps_[tid / kWarpLanes];
            f.lane = tid % kWarpLanes;
            f.dropped = false;
            f.error = nullptr;
        }
        for (unsigned w = 0; w * kWarpLanes < n_; ++w) {
            Warp& wp = warps_[w];
            wp.lanes = (int)std::min<unsigned>(kWarpLanes, n_ - w * kWarpLanes);
            wp.bar.reset((unsigned)wp.lanes);
            std::memset(wp.parity, 0, sizeof(wp.parity));
        }
        block_bar_.reset(n_);
        body_ = body;
        errors_ = 0;
        live_ = n_;
        cancelling_ = false;
        deadlock_.clear();
    }

    // Run one block to its end. `ordered`: the block's end happens before the
    // host's next step (launch() asks for it when it refills shared memory
    // between blocks; otherwise blocks stay as unordered as on a GPU, where
    // they may run at the same time, and only the launch's end is ordered).
    // Returns false when the launch cannot go on: every thread has thrown, or
    // this block deadlocked.
    PKV_EMU_UNTRACKED bool run_block(dim3 block_idx, bool ordered) {
        blockIdx = block_idx;
        tsan_release(&start_sync_);
        unsigned left = 0;
        for (unsigned i = 0; i < n_; ++i) {
            Fiber& f = *fibers_[i];
            f.done = f.dropped;
            f.waiting = nullptr;
            left += !f.done;
        }
        // The scheduler loop: one pass resumes, in threadIdx order, every
        // fiber that can go on -- one that has not started, or whose barrier
        // has opened since it arrived. Each runs until it waits again or
        // returns. A pass that resumes nobody while some have not returned
        // means that they wait for a thread that will never come.
        while (left > 0) {
            bool progress = false;
            for (unsigned i = 0; i < n_; ++i) {
                Fiber& f = *fibers_[i];
                if (f.done || (f.waiting && f.waiting->phase == f.wait_phase)) continue;
                resume(f);
                progress = true;
                left -= f.done;
            }
            if (!progress) {
                cancel_deadlocked(block_idx);
                break;
            }
        }
        if (ordered) tsan_acquire(&end_sync_);
        return live_ > 0 && deadlock_.empty();
    }

    // After the last block: the launch's end happens before the host goes on,
    // and the first exception a thread threw (or the deadlock) is rethrown.
    void finish_launch() {
        tsan_acquire(&end_sync_);
        Fiber* first = nullptr;
        for (unsigned i = 0; i < n_; ++i) {
            Fiber* f = fibers_[i].get();
            if (f->error && (!first || f->error_order < first->error_order)) first = f;
        }
        if (first) {
            std::exception_ptr e = first->error;
            for (unsigned i = 0; i < n_; ++i) fibers_[i]->error = nullptr;
            std::rethrow_exception(e);
        }
        if (!deadlock_.empty()) throw std::logic_error(deadlock_);
    }

    // Called by a fiber: arrive at barrier b and return once the phase it
    // arrived in has completed. The last to arrive completes it and runs on.
    PKV_EMU_UNTRACKED void wait(Barrier& b) {
        Fiber& f = *current;
        if (cancelling_) throw Cancelled{};
        tsan_release(b.sync_of(b.phase));
        if (++b.arrived == b.expected) {
            b.arrived = 0;
            tsan_acquire(b.sync_of(b.phase++));
            return;
        }
        f.waiting = &b;
        f.wait_phase = b.phase;
        yield(f);
        f.waiting = nullptr;
        if (cancelling_) throw Cancelled{};
        tsan_acquire(b.sync_of(f.wait_phase));
    }

    Barrier& block_barrier() { return block_bar_; }

private:
    // The host's side of a switch: set the built-ins this fiber sees, tell
    // the sanitizers, switch, and come back when the fiber waits or returns.
    PKV_EMU_UNTRACKED void resume(Fiber& f) {
        threadIdx = f.idx;
        current = &f;
#ifdef PKV_EMU_TSAN
        __tsan_switch_to_fiber(f.tsan, __tsan_switch_to_fiber_no_sync);
#endif
        asan_start_switch(&host_fake_stack_, StackRange{f.stack.lo(), f.stack.size()});
        context_switch(host_, f.ctx);
        asan_finish_switch(host_fake_stack_, nullptr);
        current = nullptr;
    }
    // The fiber's side: back to the scheduler loop, until resumed.
    PKV_EMU_UNTRACKED void yield(Fiber& f) {
#ifdef PKV_EMU_TSAN
        __tsan_switch_to_fiber(host_tsan_, __tsan_switch_to_fiber_no_sync);
#endif
        asan_start_switch(&f.fake_stack, host_stack_);
        context_switch(f.ctx, host_);
        asan_finish_switch(f.fake_stack, &host_stack_);
    }

    // Every fiber starts here, the first time it is resumed, and stays in
    // this loop for the rest of the program: run the kernel for this block,
    // switch back, and again for the next block (or the next launch) when
    // resumed. Whatever the kernel throws is caught here, on the fiber's own
    // stack, and switched back only as a stored exception_ptr -- after the
    // catch block has ended, so no exception is in flight across the switch.
    PKV_EMU_UNTRACKED static void fiber_main() {
        Fiber& f = *current;
        BlockRunner& r = *f.runner;
        asan_finish_switch(nullptr, &r.host_stack_);  // learns the host's stack
        for (;;) {
            bool threw = false;
            tsan_acquire(&r.start_sync_);
            try {
                r.body_.fn(r.body_.arg);
            } catch (const Cancelled&) {
            } catch (...) {
                f.error = std::current_exception();
                threw = true;
            }
            if (threw) r.drop(f);
            tsan_release(&r.end_sync_);
            f.done = true;
            r.yield(f);
        }
    }

    // A thread that threw leaves the launch: it no longer counts at its
    // block's barrier nor at its warp's, now or later (CUDA has no such thing;
    // it keeps the others from waiting forever, as after a GPU fault the
    // launch's results are garbage anyway).
    PKV_EMU_UNTRACKED void drop(Fiber& f) {
        f.dropped = true;
        f.error_order = errors_++;
        --live_;
        for (Barrier* b : {&block_bar_, &f.warp->bar}) {
            tsan_release(b->sync_of(b->phase));
            --b->expected;
            if (b->arrived > 0 && b->arrived == b->expected) {
                b->arrived = 0;
                ++b->phase;
            }
        }
    }

    // No fiber can go on, yet some wait: a thread skipped a barrier that the
    // others wait at (returned early, or waits at another barrier). On a GPU
    // that hangs or computes garbage; here we say who waits where, then
    // resume the waiting fibers with cancelling_ set, so that each unwinds its
    // kernel frames (Cancelled) and the fibers are clean for the next launch.
    void cancel_deadlocked(dim3 b) {
        std::string waits_block, waits_warp, returned;
        unsigned n_block = 0, n_warp = 0, n_returned = 0;
        auto add = [](std::string& list, unsigned& count, unsigned tid) {
            if (count++ < 8) list += (list.empty() ? "" : ", ") + std::to_string(tid);
            else if (count == 9) list += ", ...";
        };
        for (unsigned i = 0; i < n_; ++i) {
            const Fiber& f = *fibers_[i];
            if (f.dropped) continue;
            if (!f.waiting) add(returned, n_returned, i);
            else if (f.waiting == &block_bar_) add(waits_block, n_block, i);
            else add(waits_warp, n_warp, i);
        }
        deadlock_ = "launch: block (" + std::to_string(b.x) + ", " + std::to_string(b.y) + ", " + std::to_string(b.z) +
                    ") can go no further:";
        if (n_block) deadlock_ += " " + std::to_string(n_block) + " thread(s) wait at syncthreads() (threads " + waits_block + ");";
        if (n_warp) deadlock_ += " " + std::to_string(n_warp) + " thread(s) wait at a shfl_xor (threads " + waits_warp + ");";
        if (n_returned) deadlock_ += " " + std::to_string(n_returned) + " returned from the kernel (threads " + returned + ");";
        deadlock_ += " every thread of a block must reach every syncthreads(), and every lane of a warp make the same "
                     "shfl_xor calls (on a GPU this hangs or computes garbage)";
        cancelling_ = true;
        for (unsigned i = 0; i < n_; ++i)
            if (!fibers_[i]->done) resume(*fibers_[i]);
        cancelling_ = false;
    }

    void add_fiber() {
        auto f = std::make_unique<Fiber>();
        f->runner = this;
        f->tid = (unsigned)fibers_.size();
        context_init(f->ctx, f->stack.lo(), f->stack.size(), &BlockRunner::fiber_main);
#ifdef PKV_EMU_TSAN
        f->tsan = __tsan_create_fiber(0);
        f->name = "emulated CUDA thread " + std::to_string(f->tid);
        __tsan_set_fiber_name(f->tsan, f->name.c_str());
#endif
        if (fibers_.size() % kWarpLanes == 0) warps_.resize(fibers_.size() / kWarpLanes + 1);
        fibers_.push_back(std::move(f));
    }

    std::vector<std::unique_ptr<Fiber>> fibers_;  // [widest block so far]
    std::vector<Warp> warps_;                     // [ceil(widest block / 32)]
    Barrier block_bar_;                           // syncthreads()
    unsigned n_ = 0;                              // threads per block in this launch
    Body body_;
    Context host_;                  // the host thread, while a fiber runs
    StackRange host_stack_;         // its stack, as ASan reported it
    void* host_fake_stack_ = nullptr;
    [[maybe_unused]] void* host_tsan_ = nullptr;  // used under TSan only
    unsigned errors_ = 0;           // threads that threw in this launch
    unsigned live_ = 0;             // threads that did not
    bool cancelling_ = false;       // unwinding a deadlocked block
    std::string deadlock_;          // what deadlocked, if anything
    char start_sync_ = 0, end_sync_ = 0;  // TSan's addresses for a block's start and end
};

// This host thread's runner, made on its first launch and kept until the
// thread ends (its fibers with it).
inline BlockRunner& runner() {
    static thread_local BlockRunner r;
    return r;
}

}  // namespace emu
}  // namespace pkv

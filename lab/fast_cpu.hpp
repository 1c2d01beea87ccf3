// lab/fast_cpu.hpp -- lab/LAB.md chapter L1: the CPU forward pass made fast,
// bit for bit the same.
//
// tiny_model/forward_cpu.hpp is the forward pass to read: run.c's loops. This
// file is where its speed comes from, and a reader may skip it. It overrides
// the three expensive operations of that pass through its one seam (CpuMath):
//
//   1. matmul: a register-blocked microkernel on the best instruction set the
//      CPU has (SSE2, AVX2, AVX-512VL, chosen at run time), every output still
//      summed in dot()'s exact order;
//   2. threads: a worker pool that never makes the caller wait for a thread
//      that has not started, and a per-pass policy that measures whether
//      threads pay on this machine right now;
//   3. attention: paged_attention_cpu, which locates each cache row once and
//      runs eight q.k chains side by side, bit-identical to
//      paged_attention_ref (paged_kv.cuh);
//
// and section 4 puts them together as FastCpuMath, which the device factory
// (examples/devices.hpp) hands every CpuRunner. Speed comes from *how* the
// same arithmetic is scheduled, never from changing it: every token comes out
// bit-identical whatever the batch, the instruction set or the number of
// threads (tests/test_cpu_speed.cpp checks each level this CPU has).
// lab/LAB.md chapter L1 measures it against run.c.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <initializer_list>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "paged_kv.cuh"
#include "tiny_model/forward_batch.hpp"
#include "tiny_model/forward_cpu.hpp"

namespace pkv {

// ============================================================================
// 1. matmul: thousands of dot()s, each in dot()'s order
// ============================================================================
//
// A matmul is T x d dot products: each of T tokens' inputs against each of d
// rows of W. Calling dot() for each one is correct, and slow in two ways:
//   - each step of a dot() loads 8 weights and 8 inputs for 8 multiplies and
//     8 adds, so the CPU spends as long loading as computing, and the weight
//     it loaded for token 0 it loads again for token 1;
//   - a dot()'s 8 partial sums are one chain: every add waits for the
//     previous add into the same partial sum to finish.
// The usual cure is a register-blocked *microkernel*: take a tile of R rows of
// W and C tokens and compute its R x C outputs together, each in its own
// accumulator, all of them held in registers. One step loads R weight vectors
// and C input vectors and does R x C multiplies and adds: each loaded weight
// serves C tokens, each loaded input serves R rows, and R x C independent
// chains keep the arithmetic units busy.
//
// What must not change is a single bit of any output. A tile changes which
// outputs are computed *together*, never the operations *inside* one: output
// (r, c) has its own 8 partial sums, lane l of which receives the terms j = l,
// l+8, l+16, ... in increasing j, each a multiply and then an add, exactly as
// in dot(); then the same combine8() and the same in-order tail. So tile
// shapes, vector widths and thread counts are free to differ between
// machines, and the tokens are not.
//
// The 8 partial sums are the 8 lanes of a vector. We write vectors with the
// GCC/clang vector extension: a `float __attribute__((vector_size(32)))` holds
// 8 floats, and a + b, a * b work lane by lane, each lane the very IEEE
// single-precision operation the scalar code does. Which registers hold the
// lanes depends on the instruction set:
//   - baseline x86-64 (SSE2, what the Makefile builds for) has 16 registers of
//     4 floats, so one output's 8 partial sums take two registers;
//   - AVX2 has 16 registers of 8 floats: one register per output;
//   - AVX-512 with its VL extension still has 8-float registers (we keep 8
//     lanes, because 16 lanes would be 16 partial sums: another order), but
//     32 of them: room for a bigger tile.
// No fused multiply-add anywhere: an FMA rounds once where a multiply then an
// add rounds twice, so it would change bits. We never write one, the
// Makefile's -ffp-contract=off forbids the compiler to fuse on its own, and
// target("avx2") does not even enable FMA instructions. The CUDA path is built
// with --fmad=false for the same reason.

#if defined(__x86_64__) || defined(__i386__)
#define PKV_CPU_X86 1
#else
#define PKV_CPU_X86 0
#endif

// The microkernel's small loops (over the R rows, C tokens, vector halves)
// must be unrolled completely, or its accumulators cannot live in registers.
// GCC does so when asked; clang has its own spelling. nvcc's front end does
// not know GCC's pragma (it passes it on to the host compiler, which does),
// so under nvcc we silence its "unrecognized pragma" warning, for the kernels
// below only (nv_diagnostic pop after matmul_rows_simd).
#if defined(__clang__)
#define PKV_UNROLL _Pragma("unroll")
#elif defined(__GNUC__)
#define PKV_UNROLL _Pragma("GCC unroll 16")
#else
#define PKV_UNROLL
#endif
#if defined(__NVCC__)
#pragma nv_diagnostic push
#pragma nv_diag_suppress 1675
#endif

typedef float f32x4 __attribute__((vector_size(16)));
typedef float f32x8 __attribute__((vector_size(32)));

// Which instruction set matmul uses. The default build targets baseline
// x86-64, so its binaries run anywhere; a function marked
// __attribute__((target("avx2"))) is compiled for AVX2 inside that same
// binary, and may only be called on a CPU that has AVX2 (and an operating
// system that saves its registers), which __builtin_cpu_supports() checks at
// run time. We choose once per process. PKV_SIMD=baseline (or avx2, avx512)
// in the environment asks for a lower level, to compare paths.
enum class CpuSimd { kBaseline, kAvx2, kAvx512 };

inline const char* to_string(CpuSimd s) {
    switch (s) {
        case CpuSimd::kBaseline: return "baseline";
        case CpuSimd::kAvx2: return "avx2";
        case CpuSimd::kAvx512: return "avx512";
    }
    return "?";
}

// The best level this CPU supports.
inline CpuSimd cpu_simd_supported() {
#if PKV_CPU_X86
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl")) return CpuSimd::kAvx512;
    if (__builtin_cpu_supports("avx2")) return CpuSimd::kAvx2;
#endif
    return CpuSimd::kBaseline;
}

// The level in use: the best supported, or lower if PKV_SIMD says so. A
// reference, so that a test can switch levels (never above
// cpu_simd_supported()) and compare the bits of every path.
// An unknown value, or a level this CPU lacks, is refused with the valid
// ones: a typo must not quietly measure another path.
inline CpuSimd simd_from_env(const char* env, CpuSimd best) {
    if (!env || !*env) return best;
    for (CpuSimd s : {CpuSimd::kBaseline, CpuSimd::kAvx2, CpuSimd::kAvx512})
        if (std::string(env) == to_string(s)) {
            if (s > best)
                throw std::invalid_argument(std::string("PKV_SIMD=") + env + ", but this CPU supports at most " + to_string(best));
            return s;
        }
    throw std::invalid_argument(std::string("PKV_SIMD must be baseline, avx2 or avx512 (or unset), got '") + env + "'");
}
inline CpuSimd& cpu_simd() {
    static CpuSimd level = simd_from_env(std::getenv("PKV_SIMD"), cpu_simd_supported());
    return level;
}

// Inlined into its caller whatever the optimisation level: the kernels below
// are compiled once per instruction set, *as part of* the target("...")
// function that calls them, so that function's instruction set is theirs.
#define PKV_ALWAYS_INLINE [[gnu::always_inline]] inline

// An unaligned load of one vector. memcpy is the legal way to view floats as
// a vector; the compiler turns it into one load instruction. (It fills a
// reference rather than returning the vector: a function returning an AVX
// vector has a different calling convention with and without AVX, and GCC
// warns about that even where the call is always inlined.)
template <class V>
PKV_ALWAYS_INLINE void load_vec(V& v, const float* p) {
    std::memcpy(&v, p, sizeof v);
}

// One tile: R rows x C tokens. The rows are o0, o0 + os, ..., o0 + (R-1) os
// of W [d][n]; the tokens are rows 0..C-1 of x [.][n]; the results go where
// matmul puts them, out[c * d + row].
template <class V, int R, int C>
PKV_ALWAYS_INLINE void matmul_tile(float* out, const float* x, const float* W, int n, int d, int o0, int os) {
    constexpr int L = sizeof(V) / sizeof(float);  // lanes per vector: 4 or 8
    constexpr int H = 8 / L;                       // vectors per output's 8 partial sums: 2 or 1
    V acc[R][C][H] = {};                           // dot()'s a[8], one set per output, all zero
    const int n8 = n - n % 8;
    for (int j = 0; j < n8; j += 8) {
        V xv[C][H];
        PKV_UNROLL
        for (int c = 0; c < C; ++c) {
            PKV_UNROLL
            for (int h = 0; h < H; ++h) load_vec(xv[c][h], x + (size_t)c * n + j + h * L);
        }
        PKV_UNROLL
        for (int r = 0; r < R; ++r) {
            const float* w = W + (size_t)(o0 + r * os) * n + j;
            PKV_UNROLL
            for (int h = 0; h < H; ++h) {
                V wv;
                load_vec(wv, w + h * L);  // loaded once, used by C tokens
                PKV_UNROLL
                for (int c = 0; c < C; ++c) acc[r][c][h] += wv * xv[c][h];  // lane l: a[l] += w[j+l] * x[j+l]
            }
        }
    }
    // dot()'s ending, output by output: the fixed tree, then the tail in order.
    for (int r = 0; r < R; ++r) {
        const float* w = W + (size_t)(o0 + r * os) * n;
        for (int c = 0; c < C; ++c) {
            float a[8];
            std::memcpy(a, acc[r][c], sizeof a);
            float sum = combine8(a);
            for (int j = n8; j < n; ++j) sum += w[j] * x[(size_t)c * n + j];
            out[(size_t)c * d + o0 + r * os] = sum;
        }
    }
}

// All T tokens against one set of R rows: whole tiles of C tokens, then the
// last T % C tokens with a narrower tile (this same function with C - 1). The
// R rows stay in the L1 cache while every token passes over them.
template <class V, int R, int C>
PKV_ALWAYS_INLINE void matmul_tokens(float* out, const float* x, const float* W, int T, int n, int d, int o0, int os) {
    int t = 0;
    for (; t + C <= T; t += C) matmul_tile<V, R, C>(out + (size_t)t * d, x + (size_t)t * n, W, n, d, o0, os);
    if constexpr (C > 1)
        if (t < T) matmul_tokens<V, R, C - 1>(out + (size_t)t * d, x + (size_t)t * n, W, T - t, n, d, o0, os);
}

// Rows [ob, oe) of W for all T tokens. Which R rows share a tile? Not R
// neighbours: we cut the range into R equal stretches and a tile takes one
// row from each, so the tile reads memory as R sequential streams far apart.
// R neighbouring rows read side by side are R streams one row apart, and on
// the machine this project grew on the hardware prefetcher followed those much
// worse: the weights of a decode step come from memory, so that mattered more
// than anything else here. Leftover rows (fewer than R) get tiles of one row.
template <class V, int R, int C>
PKV_ALWAYS_INLINE void matmul_rows(float* out, const float* x, const float* W, int T, int n, int d, int ob, int oe) {
    const int per_stream = (oe - ob) / R;
    for (int i = 0; i < per_stream; ++i) matmul_tokens<V, R, C>(out, x, W, T, n, d, ob + i, per_stream);
    for (int o = ob + R * per_stream; o < oe; ++o) matmul_tokens<V, 1, C>(out, x, W, T, n, d, o, 0);
}

// The same kernel compiled for each instruction set, with a tile that
// (nearly) fits its registers: R x C accumulators, C inputs and a weight, in
// 16 registers (32 with AVX-512). A single token (decode of one sequence)
// gets two rows per tile: it is limited by reading the weights, and two
// streams read faster than one. Any shape gives the same bits; these were
// simply the fastest of the shapes we measured on a stories15M-shaped model.
inline void matmul_rows_baseline(float* out, const float* x, const float* W, int T, int n, int d, int ob, int oe) {
    if (T == 1) matmul_rows<f32x4, 2, 1>(out, x, W, T, n, d, ob, oe);
    else matmul_rows<f32x4, 2, 3>(out, x, W, T, n, d, ob, oe);
}
#if PKV_CPU_X86
__attribute__((target("avx2"))) inline void matmul_rows_avx2(float* out, const float* x, const float* W, int T, int n, int d, int ob,
                                                             int oe) {
    if (T == 1) matmul_rows<f32x8, 2, 1>(out, x, W, T, n, d, ob, oe);
    else matmul_rows<f32x8, 4, 3>(out, x, W, T, n, d, ob, oe);
}
__attribute__((target("avx512f,avx512vl"))) inline void matmul_rows_avx512(float* out, const float* x, const float* W, int T, int n,
                                                                           int d, int ob, int oe) {
    if (T == 1) matmul_rows<f32x8, 2, 1>(out, x, W, T, n, d, ob, oe);
    else matmul_rows<f32x8, 4, 6>(out, x, W, T, n, d, ob, oe);
}
#endif

// out[t][o] = dot(W[o], x[t]) for rows [ob, oe), on the instruction set cpu_simd() names.
inline void matmul_rows_simd(float* out, const float* x, const float* W, int T, int n, int d, int ob, int oe) {
#if PKV_CPU_X86
    switch (cpu_simd()) {
        case CpuSimd::kAvx512: return matmul_rows_avx512(out, x, W, T, n, d, ob, oe);
        case CpuSimd::kAvx2: return matmul_rows_avx2(out, x, W, T, n, d, ob, oe);
        case CpuSimd::kBaseline: break;
    }
#endif
    matmul_rows_baseline(out, x, W, T, n, d, ob, oe);
}
#if defined(__NVCC__)
#pragma nv_diagnostic pop
#endif

// ============================================================================
// 2. Threads
// ============================================================================

// Whether a forward pass should use every core. Threads never change a bit
// of a result (each output is computed whole by one thread, in its fixed
// order), only how long it takes, and the answer depends on the machine right
// now:
//   - a tiny product is all overhead: starting the threads and waiting for
//     them costs more than the work saves;
//   - on a machine busy with other work, the threads compete with it for
//     the cores: measured on the project's 2-core machine with another
//     process running, single-sequence decode with 2 OpenMP threads was 2-4x
//     *slower* than with 1. (WorkerPool, below, takes the worst of that away;
//     a busy machine is still no place for a second thread.)
// So we measure instead of guessing, and we decide for a whole forward pass
// at a time, not product by product. Between two parallel jobs the idle
// worker threads keep spinning on their cores for a while, ready for the next
// job (WorkerPool, below); with jobs a few microseconds apart they never stop.
// On a busy machine that spinning takes a core that our own main thread or
// another process needs, so every part of the pass is slowed, serial parts
// included, and only passes with no parallel job at all let the workers go to
// sleep. A choice made per product cannot see that; a choice per pass can.
// Passes of different sizes behave differently (one token is mostly reading
// weights and overhead, a big batch mostly arithmetic), so we keep separate
// figures per size class (a power of two of multiply-adds): the time per
// multiply-add of serial and of parallel passes. Each mode is measured twice
// first (the very first parallel pass also pays for starting the worker
// threads), then we use the faster one (threads only if faster by
// kParallelMargin), keeping its figure as a moving average, and now and then
// measure the other mode again, taking that fresh figure as it is. A probe of
// the losing mode costs time, so while probes keep
// confirming the choice we probe less and less often (every 32, 64, ... up to
// 1024 passes of that size class), and start again at 32 when one changes it.
// A machine that becomes busy (or idle again) is followed within a few steps.
// Below kMinParallelMacs we do not even measure: that little work cannot pay
// for a parallel region (and inside a parallel pass, a product or an attention
// smaller than that runs on one thread). One policy per process, because it
// describes the machine, not one model.
class ThreadPolicy {
public:
    static constexpr long kMinParallelMacs = 1L << 16;
    static constexpr int kMinProbeInterval = 32, kMaxProbeInterval = 1024;
    // Threads must be clearly faster to be chosen: by this factor. On a
    // machine where both modes take about as long on average, the parallel
    // one is the riskier (now and then a worker is descheduled mid-chunk and
    // the pass waits for it), so a tie goes to one thread.
    static constexpr double kParallelMargin = 1.15;

    // kMeasure is the policy above; kSerial and kParallel force one mode, for
    // tests that must see both and for experiments (kParallel also splits
    // work too small to pay for it, so that small test models are split).
    enum class Force { kMeasure, kSerial, kParallel };
    Force force = Force::kMeasure;

    static ThreadPolicy& instance() {
        static ThreadPolicy p;
        return p;
    }
    bool use_parallel(long macs) {
        if (max_threads() < 2 || force == Force::kSerial) return false;
        if (force == Force::kParallel) return true;
        if (macs < kMinParallelMacs) return false;
        Class& c = cls(macs);
        if (c.samples[0] < 2) return false;  // measure each mode twice first
        if (c.samples[1] < 2) return true;
        const bool best = parallel_wins(c);
        if (++c.since_probe < c.interval) return best;
        c.since_probe = 0;
        c.probing = true;
        return !best;
    }
    // Whether a piece of a parallel pass (one product, the attention) is
    // big enough to split.
    bool worth_splitting(long macs) const { return force == Force::kParallel || macs >= kMinParallelMacs; }
    void record(bool parallel, long macs, double seconds) {
        if (macs < kMinParallelMacs || max_threads() < 2 || force != Force::kMeasure) return;
        Class& c = cls(macs);
        const double x = seconds * 1e9 / (double)macs;
        double& fig = c.ns_per_mac[parallel];
        if (c.samples[parallel]++ < 2) {  // the first two: keep the better
            fig = c.samples[parallel] == 1 ? x : std::min(fig, x);
            return;
        }
        const bool best_before = parallel_wins(c);
        if (!c.probing) {
            fig = 0.875 * fig + 0.125 * x;  // a moving average over about eight passes
            return;
        }
        fig = x;
        c.probing = false;
        const bool best_after = parallel_wins(c);
        c.interval = best_after == best_before ? std::min(2 * c.interval, kMaxProbeInterval) : kMinProbeInterval;
    }
    // The current figures of the size class of `macs`, for bench_cpu and the
    // tests: nanoseconds per multiply-add, serial or parallel; < 0 = not yet.
    double ns_per_mac(long macs, bool parallel) const {
        const Class& c = classes_[class_of(macs)];
        return c.samples[parallel] ? c.ns_per_mac[parallel] : -1.0;
    }
    static int max_threads() {
#ifdef _OPENMP
        return omp_get_max_threads();
#else
        return 1;
#endif
    }

private:
    struct Class {
        double ns_per_mac[2] = {0.0, 0.0};  // [serial, parallel]
        int samples[2] = {0, 0};
        int interval = kMinProbeInterval, since_probe = 0;
        bool probing = false;
    };
    static bool parallel_wins(const Class& c) { return c.ns_per_mac[1] * kParallelMargin < c.ns_per_mac[0]; }
    static int class_of(long macs) {
        int k = 0;
        while (k < 63 && (macs >> (k + 1)) > 0) ++k;
        return k;
    }
    Class& cls(long macs) { return classes_[class_of(macs)]; }
    Class classes_[64];  // [floor(log2(macs))]
};

// A CPU's polite busy-wait: tells the core we are spinning (on x86 the pause
// instruction), which saves power and lets a sibling hyperthread run.
inline void spin_pause() {
#if PKV_CPU_X86
    __builtin_ia32_pause();
#else
    std::this_thread::yield();
#endif
}

// Worker threads that the caller never waits for.
//
// OpenMP's `#pragma omp parallel` is a fork and a join: every thread of the
// team must arrive at the end before the caller goes on. On an idle machine
// that costs microseconds. On a busy one, a thread that the OS has
// descheduled -- or one that was asleep and waits to be woken -- holds up the
// whole region: we measured single regions of a decode step that took many
// times as long as the whole step should. So the forward pass uses this small
// pool instead, with one rule: the caller never waits for a thread that has
// not started working.
//
// A job is cut into chunks (a stretch of rows, a run of tokens). The caller
// publishes the job, wakes the workers, and takes chunks itself, one at a
// time, from a shared counter. A worker that wakes in time takes chunks too;
// one that is late finds none left and goes back to waiting. At the end the
// caller waits only for chunks a worker has already taken, which are short.
// Which thread computes a chunk changes nothing: every output is computed
// whole, by one thread, in its fixed order.
//
// Between jobs a worker spins for a while, because during a forward pass the
// next job comes within microseconds and waking a sleeping thread takes much
// longer; then it sleeps on a condition variable until the next job.
class WorkerPool {
public:
    // The process's pool, made on first use and never destroyed: its threads
    // just end with the process. (A destructor would have to stop and join
    // them while other static objects are already being destroyed.)
    static WorkerPool& instance() {
        static WorkerPool* pool = new WorkerPool;
        return *pool;
    }

    // Calls chunk(i) once for each i in [0, chunks), on this thread and on up
    // to `threads - 1` workers, and returns when every call has returned. The
    // first exception a call throws is rethrown here once all calls are done
    // (an exception must not escape a worker thread: the program would end).
    template <class F>
    void run(int threads, int chunks, const F& chunk) {
        auto job = std::make_shared<Job>();
        job->call = [](const void* f, int i) { (*static_cast<const F*>(f))(i); };
        job->fn = &chunk;
        job->chunks = chunks;
        job->workers_wanted = threads - 1;
        {
            std::lock_guard<std::mutex> lock(mutex_);
            while ((int)started_ < threads - 1) {
                std::thread(&WorkerPool::worker_loop, this, generation_.load()).detach();
                ++started_;
            }
            job_ = job;
            generation_.fetch_add(1, std::memory_order_release);
        }
        wake_.notify_all();
        work(*job);
        // Every chunk is taken; wait for those a worker is still computing.
        for (int spins = 0; job->done.load(std::memory_order_acquire) < chunks; ++spins)
            if (spins < 4096) spin_pause();
            else std::this_thread::yield();
        if (job->error) std::rethrow_exception(job->error);
    }

private:
    struct Job {
        void (*call)(const void*, int) = nullptr;  // calls *fn with a chunk index
        const void* fn = nullptr;
        int chunks = 0, workers_wanted = 0;
        std::atomic<int> next{0}, done{0}, workers{0};
        std::mutex error_mutex;
        std::exception_ptr error;
    };

    // Take chunks from the job until none are left.
    static void work(Job& job) {
        for (int i; (i = job.next.fetch_add(1, std::memory_order_relaxed)) < job.chunks;) {
            try {
                job.call(job.fn, i);
            } catch (...) {
                std::lock_guard<std::mutex> lock(job.error_mutex);
                if (!job.error) job.error = std::current_exception();
            }
            job.done.fetch_add(1, std::memory_order_release);  // publishes the chunk's outputs
        }
    }

    // A worker's life: wait for a job newer than the last one seen, take its
    // chunks (if this job wants another worker), repeat.
    void worker_loop(uint64_t seen) {
        for (;;) {
            wait_for_job(seen);
            std::shared_ptr<Job> job;
            {
                std::lock_guard<std::mutex> lock(mutex_);
                seen = generation_.load(std::memory_order_relaxed);
                job = job_;
            }
            if (job->workers.fetch_add(1, std::memory_order_relaxed) < job->workers_wanted) work(*job);
        }
    }
    void wait_for_job(uint64_t seen) {
        const auto give_up = std::chrono::steady_clock::now() + std::chrono::microseconds(kSpinMicroseconds);
        for (int spins = 1; generation_.load(std::memory_order_acquire) == seen; ++spins) {
            spin_pause();
            if (spins % 256 == 0 && std::chrono::steady_clock::now() > give_up) {
                std::unique_lock<std::mutex> lock(mutex_);
                wake_.wait(lock, [&] { return generation_.load(std::memory_order_relaxed) != seen; });
                return;
            }
        }
    }

    static constexpr int kSpinMicroseconds = 1000;  // how long an idle worker stays awake
    std::mutex mutex_;                  // guards job_ and started_; generation_ changes under it
    std::condition_variable wake_;      // a new job, for sleeping workers
    std::shared_ptr<Job> job_;          // the latest job (a late worker may still hold an older one)
    std::atomic<uint64_t> generation_{0};  // how many jobs have been published
    unsigned started_ = 0;              // workers started
};

// Runs body(i, n) for each chunk i of n = `chunks` on this thread and the pool's
// workers when `parallel` (and there are threads to share with), else once, on
// this thread, as body(0, 1): the whole range in one piece.
template <class Body>
inline void for_each_chunk(bool parallel, int chunks, const Body& body) {
    const int threads = ThreadPolicy::max_threads();
    if (!parallel || threads < 2 || chunks < 2) {
        body(0, 1);
        return;
    }
    WorkerPool::instance().run(threads, chunks, [&](int i) { body(i, chunks); });
}

// How many chunks to cut `macs` multiply-adds of work into. Several per
// thread, so that a thread that comes late, or is slowed by another process,
// leaves its share to the others; but none much smaller than kChunkMacs,
// because a chunk of a single token's matmul is a stretch of weight rows read
// from memory, and every new stretch makes the hardware prefetcher start
// over: one token's products are split in as few pieces as there are threads.
inline int parallel_chunks(long macs) {
    constexpr long kChunkMacs = 1L << 17;
    const int threads = ThreadPolicy::max_threads();
    return (int)std::clamp<long>(macs / kChunkMacs, threads, 4L * threads);
}

// matmul_parts (forward_cpu.hpp), fast: out_p[t][o] = dot(W_p[o], x[t]) for each part.
// Wq, Wk and Wv all read the same normed x, and so do W1 and W3; handing them
// over together makes one parallel job (one start, one wait) instead of
// three. With `parallel` the rows of all parts, taken end to end, are cut into
// chunks (for_each_chunk): each a contiguous stretch, so each thread reads
// its own share of the weights.
inline void matmul_parts_fast(const float* x, int T, int n, std::initializer_list<MatmulPart> parts, bool parallel = false) {
    long rows = 0;
    for (const MatmulPart& p : parts) rows += p.d;
    for_each_chunk(parallel, parallel_chunks((long)T * n * rows), [&](int chunk, int chunks) {
        const long lo = rows * chunk / chunks, hi = rows * (chunk + 1) / chunks;  // this chunk's rows
        long first = 0;                                                               // the part's first row
        for (const MatmulPart& p : parts) {
            const long b = std::max(lo, first), e = std::min(hi, first + p.d);
            if (b < e) matmul_rows_simd(p.out, x, p.W, T, n, p.d, (int)(b - first), (int)(e - first));
            first += p.d;
        }
    });
}

// out[t][o] = dot(W[o], x[t]) for every token t: W is [d][n], x is [T][n], out [T][d].
inline void matmul_fast(float* out, const float* x, const float* W, int T, int n, int d, bool parallel = false) {
    matmul_parts_fast(x, T, n, {{out, W, d}}, parallel);
}


// ============================================================================
// 3. Paged attention, fast
// ============================================================================

// ---- paged attention, fast and bit-identical to paged_attention_ref ----------
//
// paged_attention_ref (paged_kv.cuh) is the attention to read: every element
// through kv_load, one dot product at a time. It is also slow where it need
// not be. Each q.k is a chain of head_dim dependent additions, so the CPU
// waits on each add's latency; kv_load re-derives the slot offset and
// re-tests the dtype for every element; and for GQA every query head of a
// group converts the same f16/int8 rows again. At batch 64 that made
// attention cost about as much as all the matmuls, for a few percent of
// their multiply-adds.
//
// This version changes where the numbers come from, never how they are
// summed, so its output is the reference's, bit for bit (test_cpu_speed.cpp
// compares them with memcmp over dtypes, group sizes, block sizes, contexts):
//   - per (token, kv head), each key's and value's row is located once: a
//     pointer straight into an f32 cache, or for f16/int8 the row converted
//     once into scratch with the very expression kv_load uses, shared by the
//     group's query heads;
//   - eight keys' dot products run side by side: eight independent chains,
//     each still summed d = 0, 1, 2, ... as in the reference;
//   - p . V keeps the reference's order over j for every d, four values per
//     pass, and its inner loop over d is element-wise, which the compiler
//     vectorises without reassociating anything.
inline void paged_attention_cpu(float* out,                   // [num_tokens, n_heads, head_dim]
                                const float* q,               // [num_tokens, n_heads, head_dim]
                                const KVView& k_cache,        // [num_blocks, block_size, n_kv_heads, head_dim]
                                const KVView& v_cache,        // [num_blocks, block_size, n_kv_heads, head_dim]
                                const int32_t* block_tables,  // [num_seqs, max_blocks_per_seq]
                                const int32_t* token_seq,     // [num_tokens]
                                const int32_t* positions,     // [num_tokens]
                                int num_tokens, const AttentionShape& s) {
    const int hd = s.head_dim, group = s.n_heads / s.n_kv_heads;
    const float scale_div = std::sqrt((float)hd);
    std::vector<const float*> krow, vrow;  // [ctx] where key / value j's floats are
    std::vector<float> kconv, vconv;       // [ctx, hd] converted rows (f16, int8 only)
    std::vector<float> score;              // [ctx]
    // Row j of one cache as floats: a pointer into it for f32, else converted.
    auto rows = [&](const KVView& v, int kvh, const int32_t* table, int ctx, std::vector<const float*>& ptr,
                    std::vector<float>& conv) {
        ptr.resize(ctx);
        if (v.dtype != KVDtype::kF32) conv.resize((size_t)ctx * hd);
        for (int j = 0; j < ctx; ++j) {
            const int64_t slot = slot_of(table, j, s.block_size);
            const int64_t base = kv_offset(slot, kvh, v.n_kv_heads, v.head_dim);
            if (v.dtype == KVDtype::kF32) {
                ptr[j] = static_cast<const float*>(v.data) + base;
                continue;
            }
            float* dst = conv.data() + (size_t)j * hd;
            if (v.dtype == KVDtype::kF16) {
                const uint16_t* src = static_cast<const uint16_t*>(v.data) + base;
                for (int d = 0; d < hd; ++d) dst[d] = half_to_float(src[d]);
            } else {
                const int8_t* src = static_cast<const int8_t*>(v.data) + base;
                const float sc = v.scale[slot * v.n_kv_heads + kvh];
                for (int d = 0; d < hd; ++d) dst[d] = src[d] * sc;
            }
            ptr[j] = dst;
        }
    };
    for (int t = 0; t < num_tokens; ++t) {
        const int32_t* table = block_tables + (size_t)token_seq[t] * s.max_blocks_per_seq;
        const int ctx = positions[t] + 1;
        score.resize(ctx);
        for (int kvh = 0; kvh < s.n_kv_heads; ++kvh) {
            rows(k_cache, kvh, table, ctx, krow, kconv);
            rows(v_cache, kvh, table, ctx, vrow, vconv);
            for (int h = kvh * group; h < (kvh + 1) * group; ++h) {
                const float* qh = q + ((size_t)t * s.n_heads + h) * hd;  // [hd]
                float* oh = out + ((size_t)t * s.n_heads + h) * hd;       // [hd]
                // Scores, eight keys at a time, then the rest one by one.
                int j = 0;
                // (Spelled out as eight named sums: written as an array
                // indexed in an inner loop, they lived in memory, not registers.)
                for (; j + 8 <= ctx; j += 8) {
                    const float *k0 = krow[j], *k1 = krow[j + 1], *k2 = krow[j + 2], *k3 = krow[j + 3];
                    const float *k4 = krow[j + 4], *k5 = krow[j + 5], *k6 = krow[j + 6], *k7 = krow[j + 7];
                    float a0 = 0.0f, a1 = 0.0f, a2 = 0.0f, a3 = 0.0f, a4 = 0.0f, a5 = 0.0f, a6 = 0.0f, a7 = 0.0f;
                    for (int d = 0; d < hd; ++d) {
                        const float qd = qh[d];
                        a0 += qd * k0[d]; a1 += qd * k1[d]; a2 += qd * k2[d]; a3 += qd * k3[d];
                        a4 += qd * k4[d]; a5 += qd * k5[d]; a6 += qd * k6[d]; a7 += qd * k7[d];
                    }
                    score[j] = a0 / scale_div; score[j + 1] = a1 / scale_div;
                    score[j + 2] = a2 / scale_div; score[j + 3] = a3 / scale_div;
                    score[j + 4] = a4 / scale_div; score[j + 5] = a5 / scale_div;
                    score[j + 6] = a6 / scale_div; score[j + 7] = a7 / scale_div;
                }
                for (; j < ctx; ++j) {
                    float a = 0.0f;
                    for (int d = 0; d < hd; ++d) a += qh[d] * krow[j][d];
                    score[j] = a / scale_div;
                }
                // The softmax exactly as the reference: max, exp, sum, divide.
                float max_score = -INFINITY;
                for (j = 0; j < ctx; ++j)
                    if (score[j] > max_score) max_score = score[j];
                float sum = 0.0f;
                for (j = 0; j < ctx; ++j) {
                    score[j] = std::exp(score[j] - max_score);
                    sum += score[j];
                }
                for (j = 0; j < ctx; ++j) score[j] /= sum;
                // p . V: four values per pass over oh. For each d the sum is
                // still ((oh + p_j v_j) + p_j+1 v_j+1) + ..., in order of j;
                // oh is read and written a quarter as often, four d at a time
                // in a 4-lane vector (baseline x86-64 has them; the compiler
                // did not vectorise the plain loop at -O2 by itself).
                float* __restrict o = oh;
                for (int d = 0; d < hd; ++d) o[d] = 0.0f;
                for (j = 0; j + 4 <= ctx; j += 4) {
                    const float p0 = score[j], p1 = score[j + 1], p2 = score[j + 2], p3 = score[j + 3];
                    const float *v0 = vrow[j], *v1 = vrow[j + 1], *v2 = vrow[j + 2], *v3 = vrow[j + 3];
                    int d = 0;
                    for (; d + 4 <= hd; d += 4) {  // four d per f32x4: lane-wise, the same sums
                        f32x4 acc, a, b, c, e;
                        std::memcpy(&acc, o + d, sizeof acc);
                        std::memcpy(&a, v0 + d, sizeof a);
                        std::memcpy(&b, v1 + d, sizeof b);
                        std::memcpy(&c, v2 + d, sizeof c);
                        std::memcpy(&e, v3 + d, sizeof e);
                        acc = acc + p0 * a + p1 * b + p2 * c + p3 * e;
                        std::memcpy(o + d, &acc, sizeof acc);
                    }
                    for (; d < hd; ++d) o[d] = o[d] + p0 * v0[d] + p1 * v1[d] + p2 * v2[d] + p3 * v3[d];
                }
                for (; j < ctx; ++j) {
                    const float p = score[j], *vr = vrow[j];
                    for (int d = 0; d < hd; ++d) o[d] += p * vr[d];
                }
            }
        }
    }
}

// Chunk `chunk` of `chunks` of the batch's paged attention (for_each_chunk
// runs the chunks on the threads). Each (token, head) is computed whole by one
// call of paged_attention_cpu, so how we split changes no bit:
//   - by tokens, when there are several: each chunk is a contiguous run
//     of tokens holding about an equal share of keys (a prefill token late
//     in its prompt reads many more keys than an early one);
//   - by kv heads, for a single token (decode of one sequence): the chunk
//     gets a view of the cache that starts at its first kv head. A KVView
//     carries its own layout (its n_kv_heads is the stride from one slot to
//     the next), so a view whose data starts hb heads in, with the same
//     n_kv_heads, holds kv head hb + h as its head h: every slot, every dtype,
//     int8 scales included. The query heads of those kv heads come along.
inline void attention_part(int chunk, int chunks, float* out, const float* q, const KVView& kc, const KVView& vc, const ForwardBatch& b,
                           const AttentionShape& s) {
    const int T = b.num_tokens();
    const size_t row = (size_t)s.n_heads * s.head_dim;  // q and out floats per token
    if (chunks == 1) {
        paged_attention_cpu(out, q, kc, vc, b.block_tables.data(), b.token_seq.data(), b.positions.data(), T, s);
    } else if (T > 1 || s.n_kv_heads < 2) {
        // Tokens [tb, te): those whose keys, counted from the batch's start,
        // begin inside this chunk's share of all the keys.
        long keys = 0;
        for (int t = 0; t < T; ++t) keys += b.positions[t] + 1;
        int tb = 0, te = 0;
        long before = 0;
        for (int t = 0; t < T; ++t) {
            const long share = before * chunks / keys;  // the chunk whose share token t starts in
            if (share < chunk) tb = t + 1;
            if (share <= chunk) te = t + 1;
            before += b.positions[t] + 1;
        }
        if (tb < te)
            paged_attention_cpu(out + tb * row, q + tb * row, kc, vc, b.block_tables.data(), b.token_seq.data() + tb,
                                b.positions.data() + tb, te - tb, s);
    } else {
        // kv heads [hb, he) and their query heads: a smaller model over the same cache.
        const int hb = s.n_kv_heads * chunk / chunks, he = s.n_kv_heads * (chunk + 1) / chunks;
        if (hb == he) return;
        const int group = s.n_heads / s.n_kv_heads;
        auto from_head_hb = [&](KVView v) {
            v.data = static_cast<char*>(v.data) + (size_t)hb * s.head_dim * kv_dtype_bytes(v.dtype);
            if (v.scale) v.scale += hb;
            return v;
        };
        AttentionShape sub = s;
        sub.n_heads = (he - hb) * group;
        sub.n_kv_heads = he - hb;
        const size_t first = (size_t)hb * group * s.head_dim;
        paged_attention_cpu(out + first, q + first, from_head_hb(kc), from_head_hb(vc), b.block_tables.data(), b.token_seq.data(),
                            b.positions.data(), 1, sub);
    }
}

// The multiply-adds of the batch's attention: per key, q.k and p * v over head_dim, per head.
inline long attention_macs(const ForwardBatch& b, const AttentionShape& s) {
    long keys = 0;
    for (int t = 0; t < b.num_tokens(); ++t) keys += b.positions[t] + 1;
    return keys * s.n_heads * s.head_dim * 2;
}

// Paged attention for the whole batch; with `parallel`, in chunks on every core.
inline void attention_fast(float* out, const float* q, const KVView& kc, const KVView& vc, const ForwardBatch& b, const AttentionShape& s,
                      bool parallel = false) {
    for_each_chunk(parallel, parallel_chunks(attention_macs(b, s)), [&](int chunk, int chunks) { attention_part(chunk, chunks, out, q, kc, vc, b, s); });
}


// ============================================================================
// 4. FastCpuMath: the three pieces behind forward_cpu.hpp's seam
// ============================================================================
//
// One decision per forward pass (ThreadPolicy, by the pass's multiply-adds),
// then each piece of the pass too small to pay for a split runs on one
// thread. It also keeps a profile of where the time goes, which bench_cpu
// prints (a clock read costs nanoseconds, the smallest piece we time
// microseconds).
class FastCpuMath : public CpuMath {
public:
    // The instruction set is chosen (and PKV_SIMD checked) now, so that a bad
    // PKV_SIMD stops the program before it serves anything.
    FastCpuMath() { (void)cpu_simd(); }
    // Where forward() spends its time, summed over passes (zero it to start again).
    struct Profile {
        double matmul_s = 0, attention_s = 0, total_s = 0;
        long passes = 0, parallel_passes = 0;
    } profile;

    void begin_pass(long macs) override {
        macs_ = macs;
        parallel_ = ThreadPolicy::instance().use_parallel(macs);
        start_ = std::chrono::steady_clock::now();
    }
    void end_pass() override {
        const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
        ThreadPolicy::instance().record(parallel_, macs_, seconds);
        profile.total_s += seconds;
        profile.passes++;
        profile.parallel_passes += parallel_;
    }
    void matmul_parts(const float* x, int T, int n, std::initializer_list<MatmulPart> parts) override {
        long rows = 0;
        for (const MatmulPart& p : parts) rows += p.d;
        timed(profile.matmul_s, [&] { matmul_parts_fast(x, T, n, parts, split((long)T * n * rows)); });
    }
    void attention(float* out, const float* q, const KVView& kc, const KVView& vc, const ForwardBatch& b,
                   const AttentionShape& s) override {
        timed(profile.attention_s, [&] { attention_fast(out, q, kc, vc, b, s, split(attention_macs(b, s))); });
    }
    // silu's exp() per element is the costliest elementwise work of the pass
    // (we count one as some 16 multiply-adds), so a big batch splits it too.
    void swiglu(float* hb, const float* hb2, size_t n) override {
        const long macs = (long)n * 16;
        for_each_chunk(split(macs), parallel_chunks(macs), [&](int chunk, int chunks) {
            const size_t b = n * chunk / chunks, e = n * (chunk + 1) / chunks;
            pkv::swiglu(hb + b, hb2 + b, e - b);
        });
    }

private:
    // Inside a parallel pass, whether a piece of `macs` multiply-adds is worth splitting.
    bool split(long macs) const { return parallel_ && ThreadPolicy::instance().worth_splitting(macs); }
    template <class Work>
    static void timed(double& seconds, const Work& work) {
        const auto t0 = std::chrono::steady_clock::now();
        work();
        seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    }
    long macs_ = 0;
    bool parallel_ = false;
    std::chrono::steady_clock::time_point start_;
};

}  // namespace pkv

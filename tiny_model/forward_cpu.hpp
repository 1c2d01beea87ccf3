// tiny_model/forward_cpu.hpp -- the transformer's forward pass on the CPU, over
// a flat batch, reading and writing the KV cache only through block tables.
//
// The batch is vLLM V1's shape: no [batch, seq] padding, just a list of tokens.
// Each token carries its id, its position in its own sequence, the slot its K/V
// go to, and which sequence (row of block_tables) it belongs to. A prefill of
// 100 tokens, 30 decodes and a recompute chunk all travel in one list, through
// the same code.
//
// Notice what this file never sees: a request, a scheduler, a block pool. The
// engine turns its scheduled requests into a ForwardBatch, and from then on a
// sequence is nothing but a row of block ids. vLLM's model runner prepares
// the same inputs (input ids, positions, slot_mapping, block tables) but
// finds a sequence's queries by where they start in the flat list
// (query_start_loc); we give every token its row (token_seq) instead, which
// keeps attention's indexing one lookup deep.
//
// The arithmetic follows llama2.c's run.c, because run.c is our oracle:
// build/generate prints its stories260K story byte for byte (TUTORIAL.md
// chapter 2). Speed comes from *how* the same arithmetic is scheduled, never
// from changing it: a register-blocked matmul on the best instruction set the
// CPU has, and threads that split work without the caller ever waiting for
// one that has not started. Every token comes out bit-identical whatever the
// batch, the instruction set or the number of threads.
//
// Sections: 1. the flat batch  2. building blocks (dot; matmul: its
// microkernel, instruction sets and threads; rmsnorm; RoPE)  3. the forward
// pass (and attention split among threads).
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

#include "block_pool.hpp"
#include "paged_kv.cuh"
#include "tiny_model/model.hpp"

namespace pkv {

// ============================================================================
// 1. The flat batch
// ============================================================================

// The step's input, built on the host. slot_mapping is computed here, once
// per token, so that the model's one write to the cache is a plain scatter.
// Rows of block_tables are padded with -1 to a common width so a kernel can
// index them as a matrix; the padding is never read, because a token's
// context ends inside its own blocks.
struct ForwardBatch {
    std::vector<int32_t> token_ids;     // [num_tokens]
    std::vector<int32_t> positions;     // [num_tokens] position within its sequence
    std::vector<int64_t> slot_mapping;  // [num_tokens] where its K/V are written
    std::vector<int32_t> token_seq;     // [num_tokens] its row in block_tables
    std::vector<int32_t> block_tables;  // [num_seqs, max_blocks_per_seq], rows padded with -1
    int max_blocks_per_seq = 0;
    std::vector<int32_t> logits_indices;  // [num_logits] tokens whose logits are wanted
    // For a runner that produces tokens itself (ModelRunner::produces_tokens,
    // the simulated GPU): each logits row's request seed and output index.
    std::vector<uint64_t> logits_seed;         // [num_logits]
    std::vector<int32_t> logits_output_index;  // [num_logits]

    // False for a runner that never reads block tables (the simulated GPU,
    // ModelRunner::needs_block_tables): rows are then not stored, which saves
    // copying batch x table-length ids every step of a large simulation.
    bool with_tables = true;

    int num_tokens() const { return (int)token_ids.size(); }
    int num_seqs() const { return num_seqs_; }

    // Optional, before the first add_sequence: the batch will hold `seqs`
    // sequences whose tables are at most `width` blocks long. Rows then never
    // need widening (repad), which matters for batches of hundreds.
    void reserve(int seqs, int width) {
        if (!with_tables || num_seqs_ > 0) return;
        max_blocks_per_seq = std::max(max_blocks_per_seq, width);
        block_tables.reserve((size_t)seqs * max_blocks_per_seq);
    }

    // Append `n` tokens of one sequence that start at position `first_pos`.
    // `table` must already cover positions up to first_pos + n - 1. With
    // want_logits, the last of these tokens gets a row of logits. Only a token
    // whose next token will be sampled needs one: a 100-token prefill costs
    // one classifier row, not 100.
    void add_sequence(const std::vector<int32_t>& table, int block_size, const int32_t* tokens, int first_pos, int n,
                      bool want_logits) {
        if (blocks_for_tokens((int64_t)first_pos + n, block_size) > (int64_t)table.size())
            throw std::logic_error("add_sequence: block table too short for its tokens");
        const int seq = num_seqs_++;
        if (with_tables) {
            if ((int)table.size() > max_blocks_per_seq) repad((int)table.size());
            block_tables.resize(block_tables.size() + max_blocks_per_seq, -1);
            std::copy(table.begin(), table.end(), block_tables.end() - max_blocks_per_seq);
        }
        for (int i = 0; i < n; ++i) {
            token_ids.push_back(tokens[i]);
            positions.push_back(first_pos + i);
            slot_mapping.push_back(slot_of(table.data(), first_pos + i, block_size));
            token_seq.push_back(seq);
        }
        if (want_logits) logits_indices.push_back(num_tokens() - 1);
    }

private:
    // Widen every row to `width` columns (a longer table arrived). vLLM
    // avoids the copy with a table as wide as max_model_len can ever need.
    void repad(int width) {
        const int rows = num_seqs_ - 1;  // the rows stored so far (the new one is counted already)
        std::vector<int32_t> wide((size_t)rows * width, -1);
        for (int r = 0; r < rows; ++r)
            std::copy_n(block_tables.begin() + (size_t)r * max_blocks_per_seq, max_blocks_per_seq, wide.begin() + (size_t)r * width);
        block_tables.swap(wide);
        max_blocks_per_seq = width;
    }
    int num_seqs_ = 0;
};

// ============================================================================
// 2. Building blocks, computed as llama2.c's run.c does (dot's order aside)
// ============================================================================
//
// Each output element depends on one token's row only, summed in an order
// fixed by the vector length: nothing a neighbour in the batch does can change
// a bit of it. Batch invariance is built here, and the GPU kernels copy each order.

// Dot product of two contiguous rows with eight independent accumulators.
// Eight partial sums let the CPU keep several multiply-adds in flight (and let
// the compiler use one 8-wide vector register) instead of waiting on one long
// dependency chain. The order of additions is fixed by n alone -- never by the
// batch -- which is what batch invariance rests on. Partial sum l takes the
// terms j = l, l+8, l+16, ... in increasing j; then combine8() folds the eight
// in one fixed tree; then the n % 8 leftover terms are added in order. The GPU
// GEMM (forward_gpu.cuh) follows exactly this order, so it computes the very
// same floats. run.c's matmul sums in plain index order instead, so our logits
// may differ from run.c's in the last bits; tests/test_model.cpp's run.c-style
// oracle calls dot() for that reason, and generate's stories260K text still matches.
PKV_HD inline float combine8(const float a[8]) {
    return ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]));
}

inline float dot(const float* w, const float* x, int n) {
    float a[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int j = 0;
    for (; j + 8 <= n; j += 8)
        for (int l = 0; l < 8; ++l) a[l] += w[j + l] * x[j + l];
    float sum = combine8(a);
    for (; j < n; ++j) sum += w[j] * x[j];
    return sum;
}

// ----------------------------------------------------------------------------
// matmul: thousands of dot()s, each in dot()'s order
// ----------------------------------------------------------------------------
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
// in the environment asks for a lower level, to compare paths; a level the
// CPU lacks is never used.
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
inline CpuSimd& cpu_simd() {
    static CpuSimd level = [] {
        const CpuSimd best = cpu_simd_supported();
        const char* env = std::getenv("PKV_SIMD");
        for (CpuSimd s : {CpuSimd::kBaseline, CpuSimd::kAvx2, CpuSimd::kAvx512})
            if (env && std::string(env) == to_string(s)) return std::min(s, best);
        return best;
    }();
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

// ----------------------------------------------------------------------------
// Threads
// ----------------------------------------------------------------------------

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

// One matrix of a matmul: out [T, d] = x [T, n] times W [d, n] transposed.
struct MatmulPart {
    float* out;
    const float* W;
    int d;
};

// Several matrices applied to the same input x [T, n]: out_p[t][o] = dot(W_p[o], x[t]).
// Wq, Wk and Wv all read the same normed x, and so do W1 and W3; handing them
// over together makes one parallel job (one start, one wait) instead of
// three. With `parallel` the rows of all parts, taken end to end, are cut into
// chunks (for_each_chunk): each a contiguous stretch, so each thread reads
// its own share of the weights.
inline void matmul_parts(const float* x, int T, int n, std::initializer_list<MatmulPart> parts, bool parallel = false) {
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
inline void matmul(float* out, const float* x, const float* W, int T, int n, int d, bool parallel = false) {
    matmul_parts(x, T, n, {{out, W, d}}, parallel);
}

// RMSNorm with eps 1e-5: o = w * x / sqrt(mean(x^2) + eps).
// As run.c: a float sum of squares in index order, one reciprocal square
// root. LayerNorm would also subtract the mean and add a bias; Llama skips both.
inline void rmsnorm(float* o, const float* x, const float* weight, int n) {
    float ss = 0.0f;
    for (int j = 0; j < n; ++j) ss += x[j] * x[j];
    ss /= n;
    ss += 1e-5f;
    ss = 1.0f / std::sqrt(ss);
    for (int j = 0; j < n; ++j) o[j] = weight[j] * (ss * x[j]);
}

// RoPE on interleaved pairs (2i, 2i+1) of each head, theta 10000: rotate the
// pair that starts at index i of a head (i even) at position pos by the angle
// pos * 10000^(-i/head_dim). Computed exactly as run.c does (powf, then cosf and
// sinf of a float angle); the GPU path gets these same numbers from a table the
// host fills with this function.
// Interleaved pairs are Meta's original layout, which llama2.c keeps. Hugging
// Face's Llama rotates the two halves of a head instead (rotate_half), and
// checkpoints converted between the two conventions permute the rows of wq
// and wk: a classic source of a model that loads fine and talks nonsense.
// vLLM precomputes a cos/sin table per position (cos_sin_cache); we fill a
// table for the batch's positions at the start of each forward pass (see
// rope_from_table), and the GPU runner fills its own with this same
// function, so bits agree.
inline void rope_cos_sin(int pos, int i, int head_dim, float& fcr, float& fci) {
    const float freq = 1.0f / std::pow(10000.0f, i / (float)head_dim);
    const float val = pos * freq;
    fcr = std::cos(val);
    fci = std::sin(val);
}
PKV_HD inline void rope_rotate(float* pair, float fcr, float fci) {
    const float v0 = pair[0], v1 = pair[1];
    pair[0] = v0 * fcr - v1 * fci;
    pair[1] = v0 * fci + v1 * fcr;
}
// Rotate every pair of `vec` (n floats: all heads of one token).
inline void rope(float* vec, int n, int head_dim, int pos) {
    for (int i = 0; i < n; i += 2) {
        float fcr, fci;
        rope_cos_sin(pos, i % head_dim, head_dim, fcr, fci);
        rope_rotate(vec + i, fcr, fci);
    }
}
// The same rotation with the angles looked up: cs[i], cs[i + 1] = (cos, sin)
// for the pair at index i of a head, i = 0, 2, ..., head_dim - 2. They depend
// on the position and on i only, so one table per token serves every head, q
// and k alike, in every layer: head_dim / 2 calls of rope_cos_sin per token
// instead of a cos, a sin and a pow per pair per layer (the same function on
// the same inputs, so the same bits). The GPU runner builds the same table.
inline void rope_from_table(float* vec, int n, int head_dim, const float* cs) {
    for (int i = 0; i < n; i += 2) rope_rotate(vec + i, cs[i % head_dim], cs[i % head_dim + 1]);
}

// ============================================================================
// 3. The forward pass
// ============================================================================
//
// Per layer, for all T tokens at once:
//   xb = rmsnorm(x)                        [T, dim]
//   q, k, v = xb Wq^T, xb Wk^T, xb Wv^T     [T, dim], [T, kv_dim], [T, kv_dim]
//   rope(q), rope(k) at each token's position
//   K/V cache[slot_mapping[t]] = k[t], v[t]  <- the only write to the cache
//   att = paged_attention(q, cache, block tables)   <- the only read
//   x += att Wo^T
//   x += W2 (silu(xb2 W1^T) * xb2 W3^T)      with xb2 = rmsnorm(x)
// then logits = rmsnorm(x) Wcls^T for the tokens in logits_indices only.

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
inline void attention(float* out, const float* q, const KVView& kc, const KVView& vc, const ForwardBatch& b, const AttentionShape& s,
                      bool parallel = false) {
    for_each_chunk(parallel, parallel_chunks(attention_macs(b, s)), [&](int chunk, int chunks) { attention_part(chunk, chunks, out, q, kc, vc, b, s); });
}

// No state but scratch: everything a sequence remembers lives in the KV
// cache, addressed through the batch's block tables. That is what lets the
// scheduler preempt, resume and mix requests freely between two calls.
struct CpuForward {
    const Model& model;
    KVCache& cache;
    // Scratch, sized for the largest batch seen. [T, ...] each:
    //   x  [T, dim]         the residual stream, token embeddings at first
    //   xb [T, dim]         a normed copy of x, later a projection's output
    //   q  [T, dim]         queries (n_heads x head_dim); never cached
    //   k, v [T, kv_dim]    this step's keys and values, on their way to slots
    //   att [T, dim]        attention output, all heads side by side
    //   hb, hb2 [T, hidden_dim]  the two SwiGLU branches
    //   cs [T, head_dim]    RoPE's (cos, sin) per pair of a head, at each token's position
    std::vector<float> x, xb, q, k, v, att, hb, hb2, cs;

    // Where forward() spends its time, summed over calls (bench_cpu prints
    // it; zero it to start again). A clock read costs nanoseconds, the
    // smallest call we time microseconds.
    struct Profile {
        double matmul_s = 0, attention_s = 0, total_s = 0;
        long passes = 0, parallel_passes = 0;
    } profile;

    CpuForward(const Model& m, KVCache& c) : model(m), cache(c) {}
    // It refers to a model and a cache it does not own: copying it would give
    // two objects writing one cache, so we forbid it (and moving with it).
    CpuForward(const CpuForward&) = delete;
    CpuForward& operator=(const CpuForward&) = delete;

    // Runs the batch; fills logits [num_logits, vocab_size].
    void forward(const ForwardBatch& b, std::vector<float>& logits) {
        const Config& c = model.cfg;
        const Weights& w = model.w;
        const int T = b.num_tokens(), D = c.dim, KV = c.kv_dim(), H = c.hidden_dim, hd = c.head_dim();
        if (cache.geo.num_kv_heads != c.n_kv_heads || cache.geo.head_dim != hd || cache.geo.num_layers != c.n_layers)
            throw std::logic_error("KV cache geometry does not match the model");
        for (int t = 0; t < T; ++t)
            if (b.token_ids[t] < 0 || b.token_ids[t] >= c.vocab_size || b.positions[t] < 0 || b.positions[t] >= c.seq_len)
                throw std::out_of_range("forward: token id or position out of range");
        const int NL = (int)b.logits_indices.size();
        AttentionShape shape{c.n_heads, c.n_kv_heads, hd, cache.geo.block_size, b.max_blocks_per_seq};

        // One decision for the whole pass (see ThreadPolicy), by its size in
        // multiply-adds: the layers' matmuls, attention, the classifier.
        ThreadPolicy& policy = ThreadPolicy::instance();
        const long macs = c.n_layers * ((long)T * D * (2L * D + 2L * KV + 3L * H) + attention_macs(b, shape)) + (long)NL * D * c.vocab_size;
        const bool parallel = policy.use_parallel(macs);
        // Inside a parallel pass, a piece too small to pay for a split runs on one thread.
        auto split = [&](long piece_macs) { return parallel && policy.worth_splitting(piece_macs); };
        const bool split_qkv = split((long)T * D * (D + 2L * KV)), split_wo = split((long)T * D * D), split_ffn = split((long)T * D * 2 * H),
                   split_w2 = split((long)T * H * D), split_attention = split(attention_macs(b, shape)),
                   split_classifier = split((long)NL * D * c.vocab_size);
        const auto start = std::chrono::steady_clock::now();
        auto timed = [](double& seconds, auto&& work) {
            const auto t0 = std::chrono::steady_clock::now();
            work();
            seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        };

        x.resize((size_t)T * D); xb.resize((size_t)T * D); q.resize((size_t)T * D);
        k.resize((size_t)T * KV); v.resize((size_t)T * KV); att.resize((size_t)T * D);
        hb.resize((size_t)T * H); hb2.resize((size_t)T * H); cs.resize((size_t)T * hd);
        for (int t = 0; t < T; ++t)
            for (int i = 0; i < hd; i += 2) rope_cos_sin(b.positions[t], i, hd, cs[(size_t)t * hd + i], cs[(size_t)t * hd + i + 1]);

        for (int t = 0; t < T; ++t)
            std::copy_n(w.token_embedding.data() + (size_t)b.token_ids[t] * D, D, x.data() + (size_t)t * D);

        for (int l = 0; l < c.n_layers; ++l) {
            // Attention block.
            for (int t = 0; t < T; ++t) rmsnorm(&xb[(size_t)t * D], &x[(size_t)t * D], &w.rms_att[(size_t)l * D], D);
            timed(profile.matmul_s, [&] {
                matmul_parts(xb.data(), T, D,
                             {{q.data(), &w.wq[(size_t)l * D * D], D}, {k.data(), &w.wk[(size_t)l * KV * D], KV}, {v.data(), &w.wv[(size_t)l * KV * D], KV}},
                             split_qkv);
            });
            const KVView kc = cache.k_view(l);  // [num_blocks, block_size, n_kv_heads, head_dim] of the cache's dtype
            const KVView vc = cache.v_view(l);
            for (int t = 0; t < T; ++t) {
                rope_from_table(&q[(size_t)t * D], D, hd, &cs[(size_t)t * hd]);
                rope_from_table(&k[(size_t)t * KV], KV, hd, &cs[(size_t)t * hd]);
                // The write comes before attention because a prefill token
                // attends to earlier tokens of the same batch, and to itself.
                // reshape_and_cache: one slot holds all kv heads of one token;
                // kv_store converts to the cache's dtype, as the kernel does.
                for (int h = 0; h < c.n_kv_heads; ++h) {
                    kv_store(kc, b.slot_mapping[t], h, &k[(size_t)t * KV + (size_t)h * hd]);
                    kv_store(vc, b.slot_mapping[t], h, &v[(size_t)t * KV + (size_t)h * hd]);
                }
            }
            // The only read: token t sees positions 0..positions[t] of its own
            // sequence, whatever else is in the batch.
            timed(profile.attention_s, [&] { attention(att.data(), q.data(), kc, vc, b, shape, split_attention); });
            timed(profile.matmul_s, [&] { matmul(xb.data(), att.data(), &w.wo[(size_t)l * D * D], T, D, D, split_wo); });
            for (size_t i = 0; i < (size_t)T * D; ++i) x[i] += xb[i];

            // Feed-forward block (SwiGLU): w2(silu(w1 x) * w3 x), silu as run.c
            // writes it. Its exp() per element is the costliest elementwise
            // work of the pass (we count one as some 16 multiply-adds), so a
            // big batch splits it among the threads too.
            for (int t = 0; t < T; ++t) rmsnorm(&xb[(size_t)t * D], &x[(size_t)t * D], &w.rms_ffn[(size_t)l * D], D);
            timed(profile.matmul_s, [&] {
                matmul_parts(xb.data(), T, D, {{hb.data(), &w.w1[(size_t)l * H * D], H}, {hb2.data(), &w.w3[(size_t)l * H * D], H}}, split_ffn);
            });
            const size_t TH = (size_t)T * H;
            for_each_chunk(split((long)TH * 16), parallel_chunks((long)TH * 16), [&](int chunk, int chunks) {
                for (size_t i = TH * chunk / chunks; i < TH * (chunk + 1) / chunks; ++i) {
                    float val = hb[i];
                    val *= (1.0f / (1.0f + std::exp(-val)));  // silu
                    hb[i] = val * hb2[i];
                }
            });
            timed(profile.matmul_s, [&] { matmul(xb.data(), hb.data(), &w.w2[(size_t)l * D * H], T, H, D, split_w2); });
            for (size_t i = 0; i < (size_t)T * D; ++i) x[i] += xb[i];
        }

        // Final norm and classifier, only where logits are wanted.
        std::vector<float> xl((size_t)NL * D);  // [num_logits, dim]
        for (int i = 0; i < NL; ++i)
            rmsnorm(&xl[(size_t)i * D], &x[(size_t)b.logits_indices[i] * D], w.rms_final.data(), D);
        logits.resize((size_t)NL * c.vocab_size);
        timed(profile.matmul_s, [&] { matmul(logits.data(), xl.data(), model.classifier(), NL, D, c.vocab_size, split_classifier); });

        const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        policy.record(parallel, macs, seconds);
        profile.total_s += seconds;
        profile.passes++;
        profile.parallel_passes += parallel;
    }
};

}  // namespace pkv

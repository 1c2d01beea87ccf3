// tiny_model/forward_gpu.cuh -- the same transformer as forward_cpu.hpp, as
// CUDA kernels, plus the choice of where a model runs (--device).
//
// Under nvcc these kernels run on the GPU; under g++ they run emulated on the
// CPU (cuda_shim.hpp), so every line here is exercised by `make test` on a
// laptop. The forward pass is forward_cpu.hpp's, step for step; only the
// loops became kernel launches:
//
//   embedding -> per layer: rmsnorm, q/k/v gemm, rope, reshape_and_cache,
//   paged_attention, o gemm, residual add, rmsnorm, w1/w3 gemm, swiglu, w2 gemm,
//   residual add -> rmsnorm of the rows that want logits -> classifier gemm
//
// Numerics. Every reduction here runs in a fixed order that depends only on
// the vector length, never on the batch, so the GPU path is batch-invariant
// on its own terms: a recomputed request reproduces its tokens bit for bit.
// Against the CPU path: the GEMM and RMSNorm use exactly the CPU's order, and
// RoPE angles come from the CPU's own function, so those are bit-identical
// (nvcc must not fuse multiply-adds: the Makefile passes --fmad=false). What
// differs on a real GPU is expf (CUDA's is not glibc's, in SwiGLU and in
// attention's softmax) and attention's online softmax, which rounds in
// another order than the CPU's two-pass one. So logits agree within 2e-5 of
// the row's scale (test_kernels.cpp's kLogitTol), not exactly. Emulated,
// expf is glibc's; only the softmax order differs.
//
// The GEMM comes in two versions (section 1): gemm_simple_kernel, the first
// one, short and slow, kept as the baseline; and gemm_kernel, tiled and
// double-buffered with several threads per output, which the forward pass
// runs through gemm(). Both sum in dot()'s order, so both give the CPU's bits.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "cuda_shim.hpp"
#include "paged_kv.cuh"
#include "tiny_model/forward_cpu.hpp"
#include "tiny_model/model.hpp"
#include "tiny_model/runner.hpp"
#include "tiny_model/sampler.hpp"

namespace pkv {

// ============================================================================
// 1. Kernels
// ============================================================================

// A note on the launch shapes below. Most kernels use one thread block per
// token (grid = T) with a block-strided loop over the row: a row of a tiny
// model is a few hundred floats, far fewer than a GPU could spread over many
// blocks, and one block per row keeps each kernel obviously correct. With
// T = 1 (decode) that leaves most of a GPU idle; for a tiny model the launch
// overhead (a few microseconds each, ~15 launches per layer) dominates
// anyway. A production engine fuses these small kernels (RMSNorm into the
// GEMM that follows, RoPE into reshape_and_cache) and captures the whole step
// in a CUDA graph; we keep them separate so each can be read and tested alone.

// grid (T), block (128): x[t] = embedding row of token t.
// Consecutive threads copy consecutive floats: coalesced reads and writes.
template <class = void>
PKV_KERNEL void embedding_kernel(float* x, const float* emb, const int32_t* tokens, int dim) {
    const float* row = emb + (size_t)tokens[blockIdx.x] * dim;  // [dim]
    for (int i = threadIdx.x; i < dim; i += blockDim.x) x[(size_t)blockIdx.x * dim + i] = row[i];
}

// grid (R), block (128): out[r] = rmsnorm(x[rows ? rows[r] : r]) * w.
// The sum of squares is summed by *every* thread, sequentially, in the CPU's
// order: dim multiply-adds of redundant work buy an exact match with the CPU
// and no barrier (a tree reduction would reorder the sum).
template <class = void>
PKV_KERNEL void rmsnorm_kernel(float* out, const float* x, const float* w, const int32_t* rows, int dim) {
    const int r = blockIdx.x;
    const float* xr = x + (size_t)(rows ? rows[r] : r) * dim;  // [dim]
    float ss = 0.0f;
    for (int j = 0; j < dim; ++j) ss += xr[j] * xr[j];
    ss /= dim;
    ss += 1e-5f;
    ss = 1.0f / sqrtf(ss);
    for (int i = threadIdx.x; i < dim; i += blockDim.x) out[(size_t)r * dim + i] = w[i] * (ss * xr[i]);
}

// ---- the GEMM ------------------------------------------------------------------
// out[t][o] = W[o] . x[t]; W is [d][n] (llama2.c's [out][in]), x [T][n], out [T][d].
//
// The one rule both versions below obey: an output is summed exactly as the
// CPU's dot() sums it. Partial sum l (l = 0..7) takes the terms k = l, l+8,
// l+16, ... in increasing k, each a multiply and then an add; combine8() folds
// the eight in its fixed tree; the n % 8 leftover terms follow in order.
// Nothing in that recipe mentions T, a tile size or which block computed the
// output, so the GEMM is bit-identical to the CPU's matmul() and
// batch-invariant by construction -- which leaves the host free to pick any
// launch shape for any batch, as gemm() does below.
//
// Why not cuBLAS? cuBLAS picks its algorithm (tile shape, split-K, the order in
// which partial products are reduced) from the problem shape, so the logits of
// a token can change in the last bits when the batch around it changes size --
// and a recomputed request could then sample a different token. A GEMM whose
// reduction order is fixed is the simplest way to rule that out. (It is also
// slower than cuBLAS on large matrices, which may split K and use tensor
// cores; the design card asks for our own kernels, and a fixed order is the
// price of invariance.)

// ---- version 1: gemm_simple_kernel, the first one we wrote ---------------------
// grid (ceil(d / 128), ceil(T / 4)), block (128). A block computes 128 outputs
// for 4 tokens. The K dimension is walked in tiles of 32: the block copies a
// 128 x 32 tile of W and a 4 x 32 tile of x into shared memory; then each
// thread, owning one output row, multiplies its W row against the 4 token rows
// with 8 partial sums per token. Each W element fetched from global memory is
// used 4 times, each x element 128 times.
//
// It is correct and easy to follow, and it is slow. I keep it as the baseline
// that gemm_kernel is measured and tested against. What is wrong with it:
//   - each thread makes 32 scalar loads per tile, one after another in a loop
//     with a runtime bound and a branch, then waits at the barrier for all of
//     them: memory latency is paid once per tile, with nothing to hide it;
//   - two barriers per 32-column tile, and no work overlaps a tile's loads;
//   - one thread per output row: at decode (T = 1..4) the 288-row matrices of
//     stories15M make 3 blocks, 3 of a large GPU's 100+ multiprocessors;
//   - 4 tokens per block: a W element serves at most 4 tokens, so a batch of
//     64 reads all the weights 16 times (from L2, but still).
constexpr int kGemmSimpleRows = 128, kGemmSimpleTokens = 4, kGemmSimpleK = 32;

template <class = void>
PKV_KERNEL void gemm_simple_kernel(float* out, const float* x, const float* W, int T, int n, int d) {
    float* ws = shared_memory<float>();                 // [kGemmSimpleRows, kGemmSimpleK + 1] (padded: no bank conflicts)
    float* xs = ws + kGemmSimpleRows * (kGemmSimpleK + 1);  // [kGemmSimpleTokens, kGemmSimpleK]
    const int tid = threadIdx.x;
    const int o0 = blockIdx.x * kGemmSimpleRows, t0 = blockIdx.y * kGemmSimpleTokens;
    const int o = o0 + tid;
    const int n8 = n - n % 8;  // the part summed into the 8 partials
    float acc[kGemmSimpleTokens][8];  // [tokens, 8]: dot()'s a[8] for each token
    for (int tt = 0; tt < kGemmSimpleTokens; ++tt)
        for (int l = 0; l < 8; ++l) acc[tt][l] = 0.0f;

    for (int k0 = 0; k0 < n8; k0 += kGemmSimpleK) {
        const int kn = n8 - k0 < kGemmSimpleK ? n8 - k0 : kGemmSimpleK;  // a multiple of 8
        for (int i = tid; i < kGemmSimpleRows * kGemmSimpleK; i += blockDim.x) {
            const int row = i / kGemmSimpleK, col = i % kGemmSimpleK;
            if (col < kn && o0 + row < d) ws[row * (kGemmSimpleK + 1) + col] = W[(size_t)(o0 + row) * n + k0 + col];
        }
        for (int i = tid; i < kGemmSimpleTokens * kGemmSimpleK; i += blockDim.x) {
            const int tt = i / kGemmSimpleK, col = i % kGemmSimpleK;
            xs[i] = (col < kn && t0 + tt < T) ? x[(size_t)(t0 + tt) * n + k0 + col] : 0.0f;
        }
        syncthreads();
        if (o < d) {
            const float* wr = ws + tid * (kGemmSimpleK + 1);  // [kGemmSimpleK]: this thread's W row
            for (int kk = 0; kk < kn; kk += 8)
                for (int l = 0; l < 8; ++l) {
                    const float wv = wr[kk + l];
                    for (int tt = 0; tt < kGemmSimpleTokens; ++tt) acc[tt][l] += wv * xs[tt * kGemmSimpleK + kk + l];
                }
        }
        syncthreads();
    }
    if (o >= d) return;
    for (int tt = 0; tt < kGemmSimpleTokens && t0 + tt < T; ++tt) {
        const float* xr = x + (size_t)(t0 + tt) * n;  // [n]
        float sum = combine8(acc[tt]);
        for (int j = n8; j < n; ++j) sum += W[(size_t)o * n + j] * xr[j];
        out[(size_t)(t0 + tt) * d + o] = sum;
    }
}

// Host side: the grid covers d outputs in groups of 128 and T tokens in
// groups of 4; the last group of each may be partial (the kernel guards it).
inline void gemm_simple(float* out, const float* x, const float* W, int T, int n, int d) {
    const size_t smem = (size_t)(kGemmSimpleRows * (kGemmSimpleK + 1) + kGemmSimpleTokens * kGemmSimpleK) * sizeof(float);
    launch(gemm_simple_kernel<>, dim3((d + kGemmSimpleRows - 1) / kGemmSimpleRows, (T + kGemmSimpleTokens - 1) / kGemmSimpleTokens),
           dim3(kGemmSimpleRows), smem, out, x, W, T, n, d);
}

// ---- version 2: gemm_kernel, what the forward pass runs ------------------------
// template <ROWS, TOK, P>; grid (ceil(d / ROWS), ceil(T / TOK)), block (ROWS * 8 / P).
// A block computes ROWS outputs for TOK tokens, and G = 8 / P threads share
// each output row: thread g of a row owns P of dot()'s 8 partial sums, lanes
// g*P .. g*P+P-1, for all TOK tokens of the block (P x TOK accumulators in
// registers). What each change from version 1 buys, as reasoning (this
// project has measured neither kernel on a GPU; tests/gpu_check.sh is where
// such numbers would come from):
//
//   - Several threads per row. At decode a GEMM reads every weight once and
//     does one multiply-add with it per token: it is limited by how many
//     bytes the GPU has in flight, and so by how many threads and blocks are
//     issuing loads. With 8 rows per block and 8 threads per row, the
//     288-row matrices of stories15M make 36 blocks instead of 3.
//   - float4 tile loads, unrolled. A tile is 64 columns: a row of it is 16
//     float4s, and consecutive threads take consecutive float4s, so a warp
//     reads two 256-byte stretches of W and uses every byte it fetches. The
//     loop over a thread's 2P float4s has a trip count known at compile time,
//     so it unrolls into 2P independent 16-byte loads issued back to back:
//     a quarter of version 1's load instructions per byte, all in flight at once.
//   - Double buffering. The loads of tile i+1 go into registers *before* the
//     block computes on tile i from shared memory, and land in the second
//     shared buffer after: the latency of global memory overlaps arithmetic
//     instead of being waited out at a barrier. Two buffers also mean one
//     barrier per tile instead of two (see the loop below for why it is safe).
//   - Register blocking over tokens. Each W value read from shared memory
//     feeds TOK tokens; with P = 4 it arrives as one 16-byte load that feeds
//     4 partial sums, so in the biggest shape (ROWS 32, TOK 16) a step of 17
//     shared loads feeds 64 multiply-adds, where version 1 needed 5 loads
//     for 4. Large batches should then be bound by arithmetic rather than by
//     shared memory (the x loads are broadcasts, one bank access each).
//   - A launch table by T (gemm() below): small blocks for decode, big ones
//     for batches, and T = 1 and 2 blocks that hold no empty token slots.
//     Since the order of every sum is fixed, the choice cannot change a bit.
//   - Padding. A shared row is 72 floats, not 64: 72 = 8 (mod 32 banks), so
//     the 4 rows that one shared-memory access reads at once -- a warp's
//     floats (P = 1), a half-warp's float2s (P = 2), a quarter-warp's float4s
//     (P = 4) -- fall in disjoint banks.
//     The x tile is read as a broadcast (all threads of a warp with the same
//     g read the same word), which costs one bank access, conflicts or not.
//
// At the end each thread folds its P partials with tree_sum<P>() -- exactly
// the subtree of combine8() over its lanes -- and the G subtotals of a row
// meet in shared memory, where tree_sum<G>() applies the top of the tree.
// combine8() = tree_sum<8>() is a balanced tree, so splitting it that way
// changes no operation and no order. (A warp shuffle would do this without
// shared memory; cuda_shim.hpp's rules keep reductions in shared memory.)
//
// Not done, and why: cp.async (Ampere's asynchronous copy straight into
// shared memory) would skip the staging registers; tensor cores need another
// summation order altogether (and TF32 or BF16 inputs); split-K would cut a
// partial sum across blocks and add the pieces in another order. Fusing
// RMSNorm into the GEMM, and one GEMM for wq/wk/wv (or w1/w3) sharing the x
// tile, would save launches and x traffic without changing any order: good
// next steps.

// The sum of a[0..N-1] as a balanced tree, left half first: tree_sum<8> is
// combine8(), and tree_sum<8>(a) == tree_sum<G>(s) with s[g] = tree_sum<P>(a
// + g * P) whenever G * P = 8 -- the split gemm_kernel makes between threads.
template <int N>
PKV_HD inline float tree_sum(const float* a) {
    if constexpr (N == 1) return a[0];
    else return tree_sum<N / 2>(a) + tree_sum<N / 2>(a + N / 2);
}

// On the GPU these are single 16-, 8- or 4-byte loads and stores, and the
// address must be aligned to the width: a misaligned float4 load faults the
// kernel. Emulated they are plain loops of float loads, which would run
// happily from any address -- so the emulation checks the alignment the GPU
// needs and throws (launch() rethrows it on the host), and a wrong `vec`
// decision fails `make test` instead of the first run on a GPU.
inline void gemm_check_aligned(const float* p, int bytes) {
    if (reinterpret_cast<uintptr_t>(p) % (uintptr_t)bytes != 0)
        throw std::logic_error("gemm: a " + std::to_string(bytes) + "-byte vector access at a misaligned address");
}
template <int P>
PKV_HD inline void gemm_load(float* r, const float* p) {  // r [P] = p[0 .. P-1]
#ifdef __CUDA_ARCH__
    if constexpr (P == 4) {
        const float4 v = *reinterpret_cast<const float4*>(p);
        r[0] = v.x; r[1] = v.y; r[2] = v.z; r[3] = v.w;
    } else if constexpr (P == 2) {
        const float2 v = *reinterpret_cast<const float2*>(p);
        r[0] = v.x; r[1] = v.y;
    } else {
        r[0] = p[0];
    }
#else
    gemm_check_aligned(p, 4 * P);
    for (int i = 0; i < P; ++i) r[i] = p[i];
#endif
}
PKV_HD inline void gemm_store4(float* p, const float* r) {  // p[0..3] = r [4]
#ifdef __CUDA_ARCH__
    *reinterpret_cast<float4*>(p) = make_float4(r[0], r[1], r[2], r[3]);
#else
    gemm_check_aligned(p, 16);
    for (int i = 0; i < 4; ++i) p[i] = r[i];
#endif
}

// Four consecutive floats of a tile, base[off .. off+3], into r [4]: zeros
// where the tile hangs over the matrix (a row past d, a token past T, columns
// past n8), one float4 load where `vec` says the address is 16-byte aligned,
// four scalar loads where it is not. The load width changes no value, so the
// two paths give the same bits.
PKV_HD inline void gemm_fetch4(float* r, const float* base, size_t off, bool inside, bool vec) {
    if (!inside) {
        r[0] = r[1] = r[2] = r[3] = 0.0f;
    } else if (vec) {
        gemm_load<4>(r, base + off);
    } else {
        for (int i = 0; i < 4; ++i) r[i] = base[off + i];
    }
}

constexpr int kGemmTileK = 64;                 // columns of K per tile: 16 float4s per row
constexpr int kGemmStride = kGemmTileK + 8;    // floats from one shared row to the next (padding: see above)

#if defined(__CUDACC__)
#define PKV_GEMM_UNROLL _Pragma("unroll")
#else
#define PKV_GEMM_UNROLL PKV_UNROLL
#endif

// `vec`: x and W are 16-byte aligned and n % 4 == 0, so every tile row starts
// on a 16-byte boundary and may be read as float4s (gemm_launch decides).
template <int ROWS, int TOK, int P>
PKV_KERNEL void gemm_kernel(float* out, const float* x, const float* W, int T, int n, int d, bool vec) {
    static_assert(P == 1 || P == 2 || P == 4, "a thread owns 1, 2 or 4 of the 8 partial sums");
    constexpr int G = 8 / P;                      // threads per output row
    constexpr int NT = ROWS * G;                  // threads per block
    constexpr int V4 = kGemmTileK / 4;            // float4s per tile row
    constexpr int WL = ROWS * V4 / NT;            // float4s of each W tile a thread loads (= 2P)
    constexpr int XL = (TOK * V4 + NT - 1) / NT;  // float4s of each x tile a thread loads (some idle when TOK is small)
    float* ws = shared_memory<float>();           // [2, ROWS, kGemmStride]: W tiles, two buffers
    float* xs = ws + 2 * ROWS * kGemmStride;      // [2, TOK, kGemmStride]: x tiles, two buffers
    float* red = xs + 2 * TOK * kGemmStride;      // [TOK, ROWS, G]: each thread's subtotal of combine8()
    const int tid = threadIdx.x, r = tid / G, g = tid % G;  // my row in the block, my group of lanes
    const int o0 = blockIdx.x * ROWS, t0 = blockIdx.y * TOK;
    const int n8 = n - n % 8;  // columns summed into the 8 partials; the rest is dot()'s tail
    const int tiles = (n8 + kGemmTileK - 1) / kGemmTileK;

    // The next tile on its way from global memory: staged in registers, so
    // that the loads can be in flight while this block computes.
    float wreg[WL][4];  // [WL, 4]: my float4s of the W tile
    float xreg[XL][4];  // [XL, 4]: my float4s of the x tile
    // Issue the loads of the tile starting at column k0. Float4 v of a tile
    // is row v / 16, columns (v % 16) * 4 .. +3; thread tid takes v = tid,
    // tid + NT, ...: consecutive threads, consecutive addresses.
    auto fetch = [&](int k0) {
        const int kn = n8 - k0 < kGemmTileK ? n8 - k0 : kGemmTileK;  // a multiple of 8: a float4 is all in or all out
        PKV_GEMM_UNROLL
        for (int i = 0; i < WL; ++i) {
            const int v = tid + i * NT, row = v / V4, col = v % V4 * 4;
            gemm_fetch4(wreg[i], W, (size_t)(o0 + row) * n + k0 + col, o0 + row < d && col < kn, vec);
        }
        PKV_GEMM_UNROLL
        for (int i = 0; i < XL; ++i) {
            const int v = tid + i * NT, tok = v / V4, col = v % V4 * 4;
            if (v < TOK * V4) gemm_fetch4(xreg[i], x, (size_t)(t0 + tok) * n + k0 + col, t0 + tok < T && col < kn, vec);
        }
    };
    // Write the staged tile into shared buffer `buf` (0 or 1).
    auto stash = [&](int buf) {
        PKV_GEMM_UNROLL
        for (int i = 0; i < WL; ++i) {
            const int v = tid + i * NT;
            gemm_store4(ws + (size_t)(buf * ROWS + v / V4) * kGemmStride + v % V4 * 4, wreg[i]);
        }
        PKV_GEMM_UNROLL
        for (int i = 0; i < XL; ++i) {
            const int v = tid + i * NT;
            if (v < TOK * V4) gemm_store4(xs + (size_t)(buf * TOK + v / V4) * kGemmStride + v % V4 * 4, xreg[i]);
        }
    };

    float acc[TOK][P];  // [TOK, P]: partial sums g*P .. g*P+P-1 of my row, per token
    PKV_GEMM_UNROLL
    for (int t = 0; t < TOK; ++t)
        PKV_GEMM_UNROLL
        for (int p = 0; p < P; ++p) acc[t][p] = 0.0f;

    if (tiles > 0) {
        fetch(0);
        stash(0);
    }
    syncthreads();
    for (int it = 0; it < tiles; ++it) {
        const int k0 = it * kGemmTileK, kn = n8 - k0 < kGemmTileK ? n8 - k0 : kGemmTileK;
        const bool more = it + 1 < tiles;
        if (more) fetch(k0 + kGemmTileK);  // in flight during the arithmetic below
        // Step kk covers columns k0+kk .. k0+kk+7, one term for each of the 8
        // partials; mine are columns k0+kk+g*P+p. Partial g*P+p thus receives
        // columns = g*P+p (mod 8) in increasing order: dot()'s a[g*P+p].
        const float* wr = ws + (size_t)((it & 1) * ROWS + r) * kGemmStride + g * P;  // my lanes of my W row
        const float* xr = xs + (size_t)(it & 1) * TOK * kGemmStride + g * P;         // my lanes of token 0's row
        for (int kk = 0; kk < kn; kk += 8) {
            float wv[P];  // [P]
            gemm_load<P>(wv, wr + kk);
            PKV_GEMM_UNROLL
            for (int t = 0; t < TOK; ++t) {
                float xv[P];  // [P]
                gemm_load<P>(xv, xr + t * kGemmStride + kk);
                PKV_GEMM_UNROLL
                for (int p = 0; p < P; ++p) acc[t][p] += wv[p] * xv[p];
            }
        }
        // One barrier per tile is enough. The buffer `stash` writes now,
        // (it + 1) & 1, was last read in iteration it - 1, and every thread
        // finished that before the barrier that ended it - 1. The buffer read
        // above was written before that same barrier. After the last tile
        // nothing writes a tile buffer again (`red` has memory of its own),
        // so the last tile needs no barrier at all.
        if (more) {
            stash((it + 1) & 1);
            syncthreads();
        }
    }

    // combine8(), split between the G threads of a row: my subtree here, the
    // top of the tree after the barrier, then dot()'s tail in order. Thread i
    // finishes output i = t * ROWS + row, so neighbouring threads write
    // neighbouring outputs.
    PKV_GEMM_UNROLL
    for (int t = 0; t < TOK; ++t) red[(t * ROWS + r) * G + g] = tree_sum<P>(acc[t]);
    syncthreads();
    for (int i = tid; i < TOK * ROWS; i += NT) {
        const int t = t0 + i / ROWS, o = o0 + i % ROWS;
        if (t >= T || o >= d) continue;
        const float* wr = W + (size_t)o * n;  // [n]
        const float* xr = x + (size_t)t * n;  // [n]
        float sum = tree_sum<G>(red + i * G);
        for (int j = n8; j < n; ++j) sum += wr[j] * xr[j];
        out[(size_t)t * d + o] = sum;
    }
}

// One launch of gemm_kernel<ROWS, TOK, P>. Shared memory: two W tiles, two x
// tiles and the subtotals, at most 31 KiB (ROWS 32, TOK 16). float4 loads
// need every tile row 16-byte aligned: x and W themselves (cudaMalloc gives
// 256 bytes, but a layer's weights or a batch's rows may start anywhere) and
// n a multiple of 4; otherwise the kernel loads floats one by one.
template <int ROWS, int TOK, int P>
void gemm_launch(float* out, const float* x, const float* W, int T, int n, int d) {
    constexpr int G = 8 / P;
    const size_t smem = (size_t)(2 * (ROWS + TOK) * kGemmStride + TOK * ROWS * G) * sizeof(float);
    const bool vec = n % 4 == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0 && reinterpret_cast<uintptr_t>(W) % 16 == 0;
    launch(gemm_kernel<ROWS, TOK, P>, dim3((d + ROWS - 1) / ROWS, (T + TOK - 1) / TOK), dim3(ROWS * G), smem, out, x, W, T, n,
           d, vec);
}

// The launch table: out [T, d] = x [T, n] times W [d, n] transposed. Every row
// gives the same bits (see above), so it is chosen by T (and d) for speed alone:
//   T = 1, 2, 3..4  <8, 1|2|4, 1>  64 threads, 8 per row; d = 288 makes 36 blocks.
//                              Decode: bound by reading W, so many small blocks.
//   T = 5..16       <16, 8, 2> 64 threads, 4 per row; each W value feeds 8 tokens.
//   T > 16          <32, 16, 4> 64 threads, 2 per row; each W value feeds 16 tokens
//                              (a 16-byte shared load feeding 64 multiply-adds),
//                              as long as that still makes at least
//                              kGemmWantBlocks blocks; otherwise <16, 8, 2>.
// kGemmWantBlocks is about one block per multiprocessor of a large GPU (an
// H100 or H200 has 132): below that, a bigger tile leaves multiprocessors idle.
// Emulated, the trade runs the other way: the emulation pays for every
// barrier of every block once per thread, so more blocks and more threads per
// output make an emulated forward pass slower than with version 1. These
// shapes are chosen for the GPU; the emulation is for correctness.
constexpr int kGemmWantBlocks = 128;
inline void gemm(float* out, const float* x, const float* W, int T, int n, int d) {
    if (T <= 1) return gemm_launch<8, 1, 1>(out, x, W, T, n, d);
    if (T == 2) return gemm_launch<8, 2, 1>(out, x, W, T, n, d);
    if (T <= 4) return gemm_launch<8, 4, 1>(out, x, W, T, n, d);
    const long big_blocks = (long)((d + 31) / 32) * ((T + 15) / 16);
    if (T > 16 && big_blocks >= kGemmWantBlocks) return gemm_launch<32, 16, 4>(out, x, W, T, n, d);
    gemm_launch<16, 8, 2>(out, x, W, T, n, d);
}

// grid (T), block (128): rotate q's and k's pairs with the host-made table
// cs [T, head_dim / 2, 2] of (cos, sin).
// Why a table from the host instead of cosf/sinf on the device? CUDA's
// transcendental functions are accurate to a few ulp but are not glibc's, so
// device-computed angles would differ from the CPU path in the last bits.
// The table costs T * head_dim floats per step and makes RoPE bit-identical.
// One thread rotates one (even, odd) pair; q's pairs come first, then k's.
template <class = void>
PKV_KERNEL void rope_kernel(float* q, float* k, const float* cs, int q_dim, int k_dim, int head_dim) {
    const int t = blockIdx.x, half = head_dim / 2;
    const float* cst = cs + (size_t)t * half * 2;
    for (int p = threadIdx.x; p < (q_dim + k_dim) / 2; p += blockDim.x) {
        const int i = 2 * p;  // index into q, then k
        float* pair = i < q_dim ? q + (size_t)t * q_dim + i : k + (size_t)t * k_dim + (i - q_dim);
        const int c = (i < q_dim ? i : i - q_dim) % head_dim / 2;
        rope_rotate(pair, cst[2 * c], cst[2 * c + 1]);
    }
}

// grid (ceil(n / 256)), block (256): hb = silu(hb) * hb2, elementwise.
// One of two places the model calls expf on the device (attention's softmax
// is the other). On a GPU that is CUDA's expf, not glibc's: this kernel's
// output then matches the CPU's within 1e-6 relative (test_kernels.cpp checks
// it); emulated it is glibc's and the match is exact.
template <class = void>
PKV_KERNEL void swiglu_kernel(float* hb, const float* hb2, int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float val = hb[i];
    val *= (1.0f / (1.0f + expf(-val)));
    hb[i] = val * hb2[i];
}

// grid (ceil(n / 256)), block (256): x += y (the residual connections).
// A flat index over [T, dim]: elementwise kernels do not care about rows.
template <class = void>
PKV_KERNEL void add_kernel(float* x, const float* y, int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] += y[i];
}

// grid (R), block (256): out[r] = argmax of row r, the lowest index on ties
// (like pkv::argmax). Each thread scans a strided slice, then a shared-memory
// tree halves the candidates 8 times; a tie keeps the lower index, so the
// result does not depend on which thread saw what.
constexpr int kArgmaxThreads = 256;
template <class = void>
PKV_KERNEL void argmax_kernel(int32_t* out, const float* logits, int V) {
    float* sval = shared_memory<float>();                              // [256]
    int32_t* sidx = reinterpret_cast<int32_t*>(sval + kArgmaxThreads);  // [256]
    const float* row = logits + (size_t)blockIdx.x * V;
    const int tid = threadIdx.x;
    float best = -INFINITY;
    int32_t best_i = V;  // "none yet": larger than any index
    for (int i = tid; i < V; i += kArgmaxThreads)
        if (row[i] > best || best_i == V) { best = row[i]; best_i = i; }
    sval[tid] = best;
    sidx[tid] = best_i;
    syncthreads();
    for (int stride = kArgmaxThreads / 2; stride > 0; stride /= 2) {
        if (tid < stride) {
            const float v = sval[tid + stride];
            const int32_t vi = sidx[tid + stride];
            if (vi != V && (sidx[tid] == V || v > sval[tid] || (v == sval[tid] && vi < sidx[tid]))) {
                sval[tid] = v;
                sidx[tid] = vi;
            }
        }
        syncthreads();
    }
    if (tid == 0) out[blockIdx.x] = sidx[0];
}

// Host side: one block per logits row; shared memory holds 256 (value, index) pairs.
inline void argmax_rows(int32_t* out, const float* logits, int rows, int V) {
    launch(argmax_kernel<>, dim3(rows), dim3(kArgmaxThreads), kArgmaxThreads * (sizeof(float) + sizeof(int32_t)), out, logits, V);
}

// ============================================================================
// 2. GpuRunner: the model on the kernels
// ============================================================================
//
// The kernel path: weights and KV cache in device memory (host memory when
// emulated). All weights are uploaded once, at construction; per step only
// the batch (token ids, positions, slot_mapping, block tables: a few KB) goes
// up and the logits (or just the argmax) come back. Activation buffers grow
// to the largest batch seen and are reused, so a steady decode loop
// allocates nothing.
class GpuRunner : public ModelRunner {
public:
    // `attention` picks which of paged_kv.cuh's two decode-attention kernels
    // every step uses: the partitioned one (the default, built to reach the
    // memory roof) or the one-pass baseline (the one chapter 10's gdb walk
    // and exercise 9 follow). One choice for the runner's whole life: a
    // choice per batch would make a token's bits depend on its batch.
    explicit GpuRunner(const Model& m, AttentionKernel attention = AttentionKernel::kPartitioned) : model_(m), attention_(attention) {
        const Config& c = m.cfg;
        if (c.head_dim() % 4 != 0 || c.head_dim() > 256)
            throw std::invalid_argument("the kernel path needs head_dim a multiple of 4, at most 256 (this model: " +
                                        std::to_string(c.head_dim()) + ")");
        if (c.n_heads / c.n_kv_heads * c.head_dim() > kAttnThreads * kAttnMaxPairsPerThread)
            throw std::invalid_argument("the kernel path needs (n_heads / n_kv_heads) * head_dim <= " +
                                        std::to_string(kAttnThreads * kAttnMaxPairsPerThread));
        const Weights& w = m.w;
        emb_.upload(w.token_embedding); rms_att_.upload(w.rms_att); wq_.upload(w.wq); wk_.upload(w.wk);
        wv_.upload(w.wv); wo_.upload(w.wo); rms_ffn_.upload(w.rms_ffn); w1_.upload(w.w1); w2_.upload(w.w2);
        w3_.upload(w.w3); rms_final_.upload(w.rms_final);
        if (!c.shared_classifier) wcls_.upload(w.wcls);
    }
    const Config& model_config() const override { return model_.cfg; }
    Device device() const override { return std::string(kDeviceKind) == "cuda" ? Device::kCuda : Device::kEmulated; }
    bool kv_in_host_memory() const override { return std::string(kDeviceKind) != "cuda"; }
    uint64_t memory_for_kv_cache() const override {
        const uint64_t free_bytes = device_memory_free();  // 0 when emulated: device memory is host memory
        return free_bytes ? free_bytes : host_memory_bytes();
    }
    void init_kv_cache(const KVGeometry& geo, int swap_blocks) override {
        geo_ = geo;
        const size_t cache_bytes = (size_t)geo.num_layers * KVCache::layer_bytes(geo);
        k_cache_ = DeviceBuffer<std::byte>(cache_bytes);  // [num_layers, layer_bytes]: KVCache's layout, in device memory
        v_cache_ = DeviceBuffer<std::byte>(cache_bytes);
        device_memset(k_cache_.data(), 0, cache_bytes);
        device_memset(v_cache_.data(), 0, cache_bytes);
        const size_t scales = (size_t)geo.num_layers * geo.num_blocks * geo.scales_per_block();
        k_scale_ = DeviceBuffer<float>(scales);  // [num_layers, num_blocks, block_size, n_kv_heads], int8 only
        v_scale_ = DeviceBuffer<float>(scales);
        swap_ = std::make_unique<PinnedHostBuffer>((size_t)swap_blocks * geo.bytes_per_block());
    }

    void forward(const ForwardBatch& b, std::vector<float>& logits) override {
        run(b);
        const size_t n = b.logits_indices.size() * (size_t)model_.cfg.vocab_size;
        logits.resize(n);
        logits_.download(logits.data(), n);
    }
    void forward_argmax(const ForwardBatch& b, std::vector<int32_t>& tokens) override {
        run(b);
        const int rows = (int)b.logits_indices.size();
        argmax_.reserve(rows);
        argmax_rows(argmax_.data(), logits_.data(), rows, model_.cfg.vocab_size);
        tokens.resize(rows);
        argmax_.download(tokens.data(), rows);
    }

    // One cudaMemcpyAsync per (block, layer, K or V) to or from pinned host
    // memory, all queued on the default stream, then one wait: the copies
    // stream back to back on the copy engine, and the forward pass that
    // follows cannot start before they are done. (Overlapping the copies with
    // compute would need a second stream and an event.)
    void swap_out(const std::vector<std::pair<int32_t, int32_t>>& pairs) override { swap(pairs, true); }
    void swap_in(const std::vector<std::pair<int32_t, int32_t>>& pairs) override { swap(pairs, false); }

private:
    void swap(const std::vector<std::pair<int32_t, int32_t>>& pairs, bool out) {
        for (const auto& [block, slot] : pairs)
            for (int l = 0; l < geo_.num_layers; ++l)
                for (int kv = 0; kv < 2; ++kv)
                    copy_block_part(geo_, view(l, kv), block, swap_->data() + swap_slot_offset(geo_, slot, l, kv), out, copy_async);
        device_synchronize();
    }
    // Layer `layer`'s K (kv = 0) or V (kv = 1) in device memory.
    KVView view(int layer, int kv) const {
        std::byte* data = (kv ? v_cache_.data() : k_cache_.data()) + (size_t)layer * KVCache::layer_bytes(geo_);
        float* sc = geo_.scales_per_block() ? (kv ? v_scale_.data() : k_scale_.data()) + (size_t)layer * geo_.num_blocks * geo_.scales_per_block()
                                            : nullptr;
        return KVView{geo_.dtype, data, sc, geo_.num_kv_heads, geo_.head_dim};
    }

    // The forward pass; leaves logits_ [num_logits, vocab] on the device.
    void run(const ForwardBatch& b) {
        const Config& c = model_.cfg;
        const int T = b.num_tokens(), D = c.dim, KV = c.kv_dim(), H = c.hidden_dim, hd = c.head_dim(), V = c.vocab_size;
        const int NL = (int)b.logits_indices.size();
        for (int t = 0; t < T; ++t)
            if (b.token_ids[t] < 0 || b.token_ids[t] >= V || b.positions[t] < 0 || b.positions[t] >= c.seq_len)
                throw std::out_of_range("forward: token id or position out of range");
        // The batch, and RoPE's (cos, sin) table made by the CPU's own function.
        // Uploads are synchronous copies of a few kilobytes; on a real engine
        // they would go through a pinned staging buffer and one async copy.
        std::vector<float> cs((size_t)T * hd);  // [T, hd / 2, 2]
        for (int t = 0; t < T; ++t)
            for (int i = 0; i < hd; i += 2) rope_cos_sin(b.positions[t], i, hd, cs[(size_t)t * hd + i], cs[(size_t)t * hd + i + 1]);
        tokens_.upload(b.token_ids); positions_.upload(b.positions); slots_.upload(b.slot_mapping);
        token_seq_.upload(b.token_seq); tables_.upload(b.block_tables); logit_rows_.upload(b.logits_indices);
        rope_cs_.upload(cs);
        for (DeviceBuffer<float>* buf : {&x_, &xb_, &q_, &att_}) buf->reserve((size_t)T * D);
        k_.reserve((size_t)T * KV); v_.reserve((size_t)T * KV);
        hb_.reserve((size_t)T * H); hb2_.reserve((size_t)T * H);
        xl_.reserve((size_t)NL * D); logits_.reserve((size_t)NL * V);

        // From here on every line is one launch, in the order of forward_cpu.hpp's
        // loop body; reading the two side by side is the best way to check
        // that the kernel path computes the same model. All launches go to the
        // default stream, so each starts after the previous one finished, and
        // nothing in this function waits for the GPU: the only host-device
        // synchronisation of a step is the download of the logits at the end.
        launch(embedding_kernel<>, dim3(T), dim3(128), 0, x_.data(), emb_.data(), tokens_.data(), D);
        const AttentionShape shape{c.n_heads, c.n_kv_heads, hd, geo_.block_size, b.max_blocks_per_seq};
        const int elt_blocks_d = (T * D + 255) / 256, elt_blocks_h = (T * H + 255) / 256;
        for (int l = 0; l < c.n_layers; ++l) {
            const KVView kc = view(l, 0), vc = view(l, 1);
            launch(rmsnorm_kernel<>, dim3(T), dim3(128), 0, xb_.data(), x_.data(), rms_att_.data() + (size_t)l * D, (const int32_t*)nullptr, D);
            gemm(q_.data(), xb_.data(), wq_.data() + (size_t)l * D * D, T, D, D);
            gemm(k_.data(), xb_.data(), wk_.data() + (size_t)l * KV * D, T, D, KV);
            gemm(v_.data(), xb_.data(), wv_.data() + (size_t)l * KV * D, T, D, KV);
            launch(rope_kernel<>, dim3(T), dim3(128), 0, q_.data(), k_.data(), rope_cs_.data(), D, KV, hd);
            // The only write to the KV cache, then the only read: exactly the
            // pair of kernels vLLM has (reshape_and_cache, paged_attention).
            // Both go through block tables and slot_mapping, never through a
            // contiguous per-sequence buffer.
            reshape_and_cache(k_.data(), v_.data(), kc, vc, slots_.data(), T);
            paged_attention(att_.data(), q_.data(), kc, vc, tables_.data(), token_seq_.data(), positions_.data(), T, shape, attention_);
            gemm(xb_.data(), att_.data(), wo_.data() + (size_t)l * D * D, T, D, D);
            launch(add_kernel<>, dim3(elt_blocks_d), dim3(256), 0, x_.data(), (const float*)xb_.data(), T * D);
            launch(rmsnorm_kernel<>, dim3(T), dim3(128), 0, xb_.data(), x_.data(), rms_ffn_.data() + (size_t)l * D, (const int32_t*)nullptr, D);
            gemm(hb_.data(), xb_.data(), w1_.data() + (size_t)l * H * D, T, D, H);
            gemm(hb2_.data(), xb_.data(), w3_.data() + (size_t)l * H * D, T, D, H);
            launch(swiglu_kernel<>, dim3(elt_blocks_h), dim3(256), 0, hb_.data(), (const float*)hb2_.data(), T * H);
            gemm(xb_.data(), hb_.data(), w2_.data() + (size_t)l * D * H, T, H, D);
            launch(add_kernel<>, dim3(elt_blocks_d), dim3(256), 0, x_.data(), (const float*)xb_.data(), T * D);
        }
        // Logits only for the rows that want them (the last token of each
        // sequence that reaches its end this step): for a 256-token prefill
        // chunk that is one classifier row instead of 256. The rows index
        // array lets the final RMSNorm gather them without a copy.
        launch(rmsnorm_kernel<>, dim3(NL), dim3(128), 0, xl_.data(), x_.data(), rms_final_.data(), (const int32_t*)logit_rows_.data(), D);
        gemm(logits_.data(), xl_.data(), c.shared_classifier ? emb_.data() : wcls_.data(), NL, D, V);
    }

    const Model& model_;
    AttentionKernel attention_;  // which attention kernel every step launches
    KVGeometry geo_;
    // Weights, llama2.c layout (see model.hpp for shapes).
    DeviceBuffer<float> emb_, rms_att_, wq_, wk_, wv_, wo_, rms_ffn_, w1_, w2_, w3_, rms_final_, wcls_;
    DeviceBuffer<std::byte> k_cache_, v_cache_;  // [num_layers, layer_bytes] each: per layer [num_blocks, block_size, n_kv_heads, head_dim] of geo_.dtype
    DeviceBuffer<float> k_scale_, v_scale_;  // [num_layers, num_blocks, block_size, n_kv_heads], int8 only
    // The batch: [T] each, block tables [num_seqs, max_blocks_per_seq], rope_cs [T, hd/2, 2].
    DeviceBuffer<int32_t> tokens_, positions_, token_seq_, tables_, logit_rows_, argmax_;
    DeviceBuffer<int64_t> slots_;
    DeviceBuffer<float> rope_cs_;
    // Activations: x, xb, q, att [T, dim]; k, v [T, kv_dim]; hb, hb2 [T, hidden]; xl [NL, dim]; logits [NL, vocab].
    DeviceBuffer<float> x_, xb_, q_, k_, v_, att_, hb_, hb2_, xl_, logits_;
    std::unique_ptr<PinnedHostBuffer> swap_;  // host swap space [swap_blocks, bytes_per_block], pinned
};

}  // namespace pkv

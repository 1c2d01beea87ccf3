// lab/gemm_tiled.cuh -- lab/LAB.md chapter L2: the GPU GEMM made fast, bit for
// bit the same.
//
// tiny_model/forward_gpu.cuh's gemm_simple is the GEMM to read: one thread per
// output row, a tile of W and x through shared memory, two barriers a tile.
// This is the one the programs run (lab/fast_gpu.cuh wraps it, and
// examples/devices.hpp chooses that), and a reader may skip it. It obeys the
// one rule of every GEMM here: each output summed exactly as the CPU's dot()
// sums it (forward_gpu.cuh explains), so it gives the CPU's bits for any
// launch shape (tests/test_gpu_gemm.cpp checks every shape of the table).
//
// Sections: 1. the kernel and what each change from gemm_simple buys  2. the
// launch table (gemm_tiled).
#pragma once

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "core/emu/cuda_shim.hpp"
#include "tiny_model/forward_cpu.hpp"
#include "tiny_model/forward_gpu.cuh"

namespace pkv {

// ============================================================================
// 1. gemm_kernel
// ============================================================================
//
// template <ROWS, TOK, P>; grid (ceil(d / ROWS), ceil(T / TOK)), block (ROWS * 8 / P).
// A block computes ROWS outputs for TOK tokens, and G = 8 / P threads share
// each output row: thread g of a row owns P of dot()'s 8 partial sums, lanes
// g*P .. g*P+P-1, for all TOK tokens of the block (P x TOK accumulators in
// registers). What each change from gemm_simple buys, as reasoning (this
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
//     a quarter of gemm_simple's load instructions per byte, all in flight at once.
//   - Double buffering. The loads of tile i+1 go into registers *before* the
//     block computes on tile i from shared memory, and land in the second
//     shared buffer after: the latency of global memory overlaps arithmetic
//     instead of being waited out at a barrier. Two buffers also mean one
//     barrier per tile instead of two (see the loop below for why it is safe).
//   - Register blocking over tokens. Each W value read from shared memory
//     feeds TOK tokens; with P = 4 it arrives as one 16-byte load that feeds
//     4 partial sums, so in the biggest shape (ROWS 32, TOK 16) a step of 17
//     shared loads feeds 64 multiply-adds, where gemm_simple needed 5 loads
//     for 4. Large batches should then be bound by arithmetic rather than by
//     shared memory (the x loads are broadcasts, one bank access each).
//   - A launch table by T (gemm_tiled() below): small blocks for decode, big ones
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

// Loops the compiler must unroll completely, so their accumulators live in
// registers: nvcc and clang spell it "unroll", GCC "GCC unroll".
#if defined(__CUDACC__) || defined(__clang__)
#define PKV_GEMM_UNROLL _Pragma("unroll")
#elif defined(__GNUC__)
#define PKV_GEMM_UNROLL _Pragma("GCC unroll 16")
#else
#define PKV_GEMM_UNROLL
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
// ============================================================================
// 2. The launch table
// ============================================================================

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
// output make an emulated forward pass slower than with gemm_simple. These
// shapes are chosen for the GPU; the emulation is for correctness.
constexpr int kGemmWantBlocks = 128;
inline void gemm_tiled(float* out, const float* x, const float* W, int T, int n, int d) {
    if (T <= 1) return gemm_launch<8, 1, 1>(out, x, W, T, n, d);
    if (T == 2) return gemm_launch<8, 2, 1>(out, x, W, T, n, d);
    if (T <= 4) return gemm_launch<8, 4, 1>(out, x, W, T, n, d);
    const long big_blocks = (long)((d + 31) / 32) * ((T + 15) / 16);
    if (T > 16 && big_blocks >= kGemmWantBlocks) return gemm_launch<32, 16, 4>(out, x, W, T, n, d);
    gemm_launch<16, 8, 2>(out, x, W, T, n, d);
}

}  // namespace pkv

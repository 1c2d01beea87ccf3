// paged_kv.cuh -- where keys and values live, and how attention reads them
// through block tables (TUTORIAL.md chapters 1, 7 and 8).
//
// The block pool (core/block_pool.hpp) decides *which* block a token position
// uses; this header is about the bytes inside those blocks:
//
//   1. the geometry and layout of the KV cache, and the one place that turns
//      a token position into an address (used by the CPU reference and the
//      CUDA kernels alike); how each element type is stored (f32, f16, int8)
//      is core/kv_dtype.hpp's business;
//   2. the KV cache in host memory (what the CPU forward pass uses);
//   3. the CPU reference paged attention: what forward_cpu.hpp runs by
//      default, and the oracle every faster kernel is tested against;
//   4. the CUDA kernels: reshape_and_cache and paged_attention, a
//      straightforward single-pass kernel to learn from (they also run on the
//      CPU, emulated, through core/emu/cuda_shim.hpp).
//
// The faster readers of the cache live in lab/ and are chosen by the device
// factory (examples/devices.hpp): paged_attention_cpu (lab/fast_cpu.hpp),
// bit-identical to section 3, and the partition + merge pair of vLLM's
// paged_attention v2 (lab/attention_partitioned.cuh).
//
// Read it top to bottom; each section only uses what came before it.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/emu/cuda_shim.hpp"
#include "core/kv_dtype.hpp"

namespace pkv {

// ============================================================================
// 1. Geometry, layout and the address of a K/V vector
// ============================================================================
//
// The cache is cut into fixed-size *blocks* of `block_size` token positions,
// and a sequence's *block table* (chapter 1) lists the physical blocks that
// hold its positions. Position p lives in logical block p / block_size, which
// the block table maps to some physical block anywhere in the pool:
//
//   sequence positions   0 1 2 3 | 4 5 6 7 | 8 9            (block_size = 4)
//   logical block        ---0--- | ---1--- | -2-
//                           |         |       |
//   block_table[]        [  7   ,     2   ,   5  ]          (one per sequence)
//                           |         |       |
//   physical blocks   0 1 2 3 4 5 6 7 ...   pool of num_blocks blocks
//                         ^     ^   ^
//                         |     |   +--- logical 0 (positions 0..3)
//                         |     +------- logical 2 (positions 8..9, 2 slots unused)
//                         +------------- logical 1 (positions 4..7)
//
//   slot  = block_table[p / block_size] * block_size + p % block_size
//           e.g. p = 9 -> 5 * 4 + 1 = slot 21
//   K of (slot, kv head h) = k_cache + (slot * num_kv_heads + h) * head_dim
//                            -> head_dim contiguous floats (d = 0 .. head_dim-1)
//
// Per layer, K and V are each laid out as
//   [num_blocks, block_size, num_kv_heads, head_dim]
// so one token's vectors for all kv heads sit next to each other, and one head
// vector (head_dim floats) is contiguous: the unit every attention loop reads.
// vLLM's legacy CUDA kernels (paged_attention v1/v2) split head_dim further
// ("x" packing) for 16-byte loads; we keep the plain layout because it reads
// the same on paper and in code.

struct KVGeometry {
    int num_layers = 0;
    int num_blocks = 0;
    int block_size = 0;
    int num_kv_heads = 0;
    int head_dim = 0;
    KVDtype dtype = KVDtype::kF32;

    // Elements (of dtype) in one token slot (all kv heads) and in one block.
    size_t elems_per_slot() const { return (size_t)num_kv_heads * head_dim; }
    size_t elems_per_block() const { return (size_t)block_size * elems_per_slot(); }
    // Elements of K (or of V) for one layer: [num_blocks, block_size, num_kv_heads, head_dim].
    size_t elems_per_layer() const { return (size_t)num_blocks * elems_per_block(); }
    // Bytes of K (or V) data, and of int8 scales, for one block of one layer.
    size_t data_bytes_per_block() const { return elems_per_block() * kv_dtype_bytes(dtype); }
    size_t scales_per_block() const { return dtype == KVDtype::kInt8 ? (size_t)block_size * num_kv_heads : 0; }
    // Everything one block holds: every layer, K and V, data and scales: what
    // copying a block moves, and what a byte budget is divided by.
    size_t bytes_per_block() const {
        return 2 * (size_t)num_layers * (data_bytes_per_block() + scales_per_block() * sizeof(float));
    }
};

// The slot of position `pos` of a sequence whose block table is `block_table`.
// This is the only place in pagedkv that maps a position to memory.
PKV_HD inline int64_t slot_of(const int32_t* block_table, int pos, int block_size) {
    // ---- exercise 1 begin: slot and offset math ----
    // Logical block pos / block_size holds the position; the block table names
    // its physical block; inside it the position sits at pos % block_size.
    // Compute in 64 bits: block id x block_size overflows an int in a big pool.
    return (int64_t)block_table[pos / block_size] * block_size + pos % block_size;
    // ---- exercise 1 end ----
}

// Offset (in floats) of the head vector of kv head `kv_head` stored in `slot`,
// inside one layer's K or V array.
PKV_HD inline int64_t kv_offset(int64_t slot, int kv_head, int num_kv_heads, int head_dim) {
    // ---- exercise 1 begin: slot and offset math ----
    // The layout is [slot][kv head][head_dim]: a slot holds num_kv_heads head
    // vectors of head_dim floats each, one after the other.
    return (slot * num_kv_heads + kv_head) * head_dim;
    // ---- exercise 1 end ----
}

// ---- reading and writing one element of any dtype -------------------------
//
// core/kv_dtype.hpp knows how each dtype is stored (float <-> half, int8 with
// its scale) and what a KVView is; the two functions below add the address.

// Element d of kv head h in `slot`, as a float. This and kv_store are the only
// places that know how each dtype is laid out.
PKV_HD inline float kv_load(const KVView& v, int64_t slot, int h, int d) {
    const int64_t i = kv_offset(slot, h, v.n_kv_heads, v.head_dim) + d;
    if (v.dtype == KVDtype::kF32) return static_cast<const float*>(v.data)[i];
    if (v.dtype == KVDtype::kF16) return half_to_float(static_cast<const uint16_t*>(v.data)[i]);
    return static_cast<const int8_t*>(v.data)[i] * v.scale[slot * v.n_kv_heads + h];
}

// Store one head vector x[head_dim] into kv head h of `slot`. For int8 the
// scale is max|x| / 127, so the largest element maps to +-127 exactly.
PKV_HD inline void kv_store(const KVView& v, int64_t slot, int h, const float* x) {
    const int64_t base = kv_offset(slot, h, v.n_kv_heads, v.head_dim);
    if (v.dtype == KVDtype::kF32) {
        for (int d = 0; d < v.head_dim; ++d) static_cast<float*>(v.data)[base + d] = x[d];
    } else if (v.dtype == KVDtype::kF16) {
        for (int d = 0; d < v.head_dim; ++d) static_cast<uint16_t*>(v.data)[base + d] = float_to_half(x[d]);
    } else {
        float amax = 0.0f;
        for (int d = 0; d < v.head_dim; ++d) amax = fmaxf(amax, fabsf(x[d]));
        const float scale = amax > 0.0f ? amax / 127.0f : 1.0f;
        v.scale[slot * v.n_kv_heads + h] = scale;
        for (int d = 0; d < v.head_dim; ++d) {
            float q = floorf(x[d] / scale + 0.5f);
            q = fminf(127.0f, fmaxf(-127.0f, q));
            static_cast<int8_t*>(v.data)[base + d] = (int8_t)q;
        }
    }
}

// ============================================================================
// 2. The KV cache in host memory
// ============================================================================
//
// What the CPU forward pass reads and writes (the kernel path keeps the same
// layout in device memory, tiny_model/forward_gpu.cuh). The data is raw bytes,
// not floats: an f16 or int8 cache is not an array of floats, and reading one
// through a float pointer would break C++'s aliasing rules. Only kv_load and
// kv_store (section 1) know what the bytes mean.

struct KVCache {
    KVGeometry geo;
    // [num_layers, layer_bytes]: per layer [num_blocks, block_size, num_kv_heads, head_dim] elements of geo.dtype
    std::vector<std::byte> k, v;
    std::vector<float> k_scale, v_scale;  // [num_layers, num_blocks, block_size, num_kv_heads], int8 only

    KVCache() = default;
    explicit KVCache(const KVGeometry& g)
        : geo(g), k((size_t)g.num_layers * layer_bytes(g)), v(k.size()),
          k_scale((size_t)g.num_layers * g.num_blocks * g.scales_per_block()), v_scale(k_scale.size()) {}

    // Bytes of K (or V) data per layer, rounded up to 16 so that every layer
    // starts 16-byte aligned, as the kernels' vector loads need.
    static size_t layer_bytes(const KVGeometry& g) { return (g.elems_per_layer() * kv_dtype_bytes(g.dtype) + 15) / 16 * 16; }
    std::byte* k_layer(int layer) { return k.data() + (size_t)layer * layer_bytes(geo); }
    std::byte* v_layer(int layer) { return v.data() + (size_t)layer * layer_bytes(geo); }
    KVView k_view(int layer) { return view(k_layer(layer), k_scale, layer); }
    KVView v_view(int layer) { return view(v_layer(layer), v_scale, layer); }
    size_t bytes() const { return k.size() + v.size() + (k_scale.size() + v_scale.size()) * sizeof(float); }

private:
    KVView view(std::byte* data, std::vector<float>& scales, int layer) {
        float* sc = scales.empty() ? nullptr : scales.data() + (size_t)layer * geo.num_blocks * geo.scales_per_block();
        return KVView{geo.dtype, data, sc, geo.num_kv_heads, geo.head_dim};
    }
};

// ============================================================================
// 3. Reference paged attention (CPU)
// ============================================================================
//
// Input is a *flat batch* of query tokens, vLLM V1 style: prefill tokens,
// decode tokens and recomputed tokens of many sequences side by side. For each
// query token t:
//   - its sequence's row of `block_tables` says where that sequence's keys are;
//   - its own causal context length ctx = position + 1 says how many keys it
//     sees (a prefill token at position 5 sees 6 keys, not the whole prompt);
//   - query head h reads kv head h / (n_heads / n_kv_heads)   (GQA).
//
// Math, per (token, head), in float32, two-pass softmax exactly as llama2.c:
//   score[j] = (q . k_j) / sqrt(head_dim)           j = 0 .. ctx-1
//   p[j]     = exp(score[j] - max) / sum_j exp(...)
//   out      = sum_j p[j] * v_j                     accumulated in order of j
// The order of every sum is fixed and depends on nothing but this token's own
// context, so the result does not depend on what else is in the batch. That is
// what makes the whole engine batch-invariant.
//
// The caller must already have written this step's K/V into the cache (the
// model does so with slot_mapping before calling), because a prefill token
// attends to tokens of the same batch.

struct AttentionShape {
    int n_heads = 0;
    int n_kv_heads = 0;
    int head_dim = 0;
    int block_size = 0;
    int max_blocks_per_seq = 0;  // row stride of block_tables
};

inline void paged_attention_ref(float* out,                   // [num_tokens, n_heads, head_dim]
                                const float* q,               // [num_tokens, n_heads, head_dim]
                                const KVView& k_cache,        // [num_blocks, block_size, n_kv_heads, head_dim]
                                const KVView& v_cache,        // [num_blocks, block_size, n_kv_heads, head_dim]
                                const int32_t* block_tables,  // [num_seqs, max_blocks_per_seq]
                                const int32_t* token_seq,     // [num_tokens] row of block_tables
                                const int32_t* positions,     // [num_tokens] ctx = position + 1
                                int num_tokens, const AttentionShape& s) {
    // ---- exercise 9 begin: paged attention on the CPU ----
    // For each token t and query head h: its sequence's row of block_tables,
    // ctx = positions[t] + 1 keys, kv head h / (n_heads / n_kv_heads). Read
    // key and value j through slot_of and kv_load. Then exactly the math
    // above: scores q.k / sqrt(head_dim), their max, exp(score - max), the
    // sum, divide, and the weighted sum of values in order of j, in floats.
    const int group = s.n_heads / s.n_kv_heads;  // query heads per kv head
    const float scale_div = std::sqrt((float)s.head_dim);
    std::vector<float> score;  // [ctx] scratch
    for (int t = 0; t < num_tokens; ++t) {
        const int32_t* table = block_tables + (size_t)token_seq[t] * s.max_blocks_per_seq;
        const int ctx = positions[t] + 1;
        score.resize(ctx);
        for (int h = 0; h < s.n_heads; ++h) {
            const int kvh = h / group;
            const float* qh = q + ((size_t)t * s.n_heads + h) * s.head_dim;
            float* oh = out + ((size_t)t * s.n_heads + h) * s.head_dim;
            // Pass 1: scores and their max.
            float max_score = -INFINITY;
            for (int j = 0; j < ctx; ++j) {
                const int64_t slot = slot_of(table, j, s.block_size);
                float dot = 0.0f;
                for (int d = 0; d < s.head_dim; ++d) dot += qh[d] * kv_load(k_cache, slot, kvh, d);
                score[j] = dot / scale_div;
                if (score[j] > max_score) max_score = score[j];
            }
            // Pass 2: normalised exponentials.
            float sum = 0.0f;
            for (int j = 0; j < ctx; ++j) {
                score[j] = std::exp(score[j] - max_score);
                sum += score[j];
            }
            for (int j = 0; j < ctx; ++j) score[j] /= sum;
            // Weighted sum of values.
            for (int d = 0; d < s.head_dim; ++d) oh[d] = 0.0f;
            for (int j = 0; j < ctx; ++j) {
                const int64_t slot = slot_of(table, j, s.block_size);
                for (int d = 0; d < s.head_dim; ++d) oh[d] += score[j] * kv_load(v_cache, slot, kvh, d);
            }
        }
    }
    // ---- exercise 9 end ----
}

// The same over plain float32 caches.
inline KVView f32_view(const float* cache, const AttentionShape& s) {
    return KVView{KVDtype::kF32, const_cast<float*>(cache), nullptr, s.n_kv_heads, s.head_dim};
}
inline void paged_attention_ref(float* out, const float* q, const float* k_cache, const float* v_cache,
                                const int32_t* block_tables, const int32_t* token_seq, const int32_t* positions, int num_tokens,
                                const AttentionShape& s) {
    paged_attention_ref(out, q, f32_view(k_cache, s), f32_view(v_cache, s), block_tables, token_seq, positions, num_tokens, s);
}

// ============================================================================
// 4. The CUDA kernels
// ============================================================================
//
// Two operations touch the cache, as in vLLM's legacy kernels: one writes it
// (reshape_and_cache), one reads it (paged_attention). Both are ordinary CUDA;
// under g++ they run emulated (core/emu/cuda_shim.hpp), which is how `make test`
// checks them against section 3 on a machine with no GPU. Each is a function
// template, most with nothing to template on: core/emu/cuda_shim.hpp's rules say
// why a kernel defined in a header must be one.

// Elements d..d+3 of kv head h in `slot`, for any dtype, as one load on a GPU
// (kv_load4_at, core/kv_dtype.hpp).
// d is a multiple of 4.
PKV_HD inline void kv_load4(const KVView& v, int64_t slot, int h, int d, float& a, float& b, float& c, float& e) {
    const int64_t i = kv_offset(slot, h, v.n_kv_heads, v.head_dim) + d;
    kv_load4_at(v, i, slot * v.n_kv_heads + h, a, b, c, e);
}

// ---- reshape_and_cache ---------------------------------------------------------
// grid (num_tokens), block (32): token t's K and V vectors (all kv heads) go to
// slot slot_mapping[t], one thread per kv head vector (kv_store converts it to
// the cache's dtype; int8 needs the whole vector for its scale). A slot < 0
// means "do not cache" (vLLM's padding rule). No shared memory, no barrier.
template <class = void>
PKV_KERNEL void reshape_and_cache_kernel(const float* k,        // [num_tokens, n_kv_heads * head_dim]
                                                const float* v,        // [num_tokens, n_kv_heads * head_dim]
                                                KVView k_cache,        // [num_blocks, block_size, n_kv_heads, head_dim]
                                                KVView v_cache,        // [num_blocks, block_size, n_kv_heads, head_dim]
                                                const int64_t* slot_mapping) {  // [num_tokens]
    const int t = blockIdx.x;
    const int64_t slot = slot_mapping[t];
    if (slot < 0) return;
    const int kv_dim = k_cache.n_kv_heads * k_cache.head_dim;
    for (int h = threadIdx.x; h < k_cache.n_kv_heads; h += blockDim.x) {
        kv_store(k_cache, slot, h, k + (size_t)t * kv_dim + (size_t)h * k_cache.head_dim);
        kv_store(v_cache, slot, h, v + (size_t)t * kv_dim + (size_t)h * v_cache.head_dim);
    }
}

inline void reshape_and_cache(const float* k, const float* v, const KVView& k_cache, const KVView& v_cache,
                              const int64_t* slot_mapping, int num_tokens) {
    launch(reshape_and_cache_kernel<>, dim3(num_tokens), dim3(32), 0, k, v, k_cache, v_cache, slot_mapping);
}
// The same into plain float32 caches.
inline void reshape_and_cache(const float* k, const float* v, float* k_cache, float* v_cache, const int64_t* slot_mapping,
                              int num_tokens, int n_kv_heads, int head_dim) {
    const KVView kc{KVDtype::kF32, k_cache, nullptr, n_kv_heads, head_dim}, vc{KVDtype::kF32, v_cache, nullptr, n_kv_heads, head_dim};
    reshape_and_cache(k, v, kc, vc, slot_mapping, num_tokens);
}

// ---- paged_attention -----------------------------------------------------------
//
// What every attention kernel takes: paged_attention_ref's arguments in one
// struct, passed by value (a kernel's parameters are copied to the GPU with
// the launch). All pointers are device pointers.
struct AttentionArgs {
    float* out;                   // [num_tokens, n_heads, head_dim]
    const float* q;               // [num_tokens, n_heads, head_dim]
    KVView k_cache, v_cache;      // [num_blocks, block_size, n_kv_heads, head_dim] each
    const int32_t* block_tables;  // [num_seqs, max_blocks_per_seq]
    const int32_t* token_seq;     // [num_tokens] row of block_tables
    const int32_t* positions;     // [num_tokens] ctx = position + 1
    int num_tokens;
    AttentionShape s;
};

// One kernel for prefill, decode and recompute: every query token carries its
// own causal context (position + 1) and its sequence's block table, exactly as
// paged_attention_ref takes them.
//
// grid (num_tokens, n_kv_heads), block (128 threads). One thread block serves
// one query token and one KV head, i.e. the whole GQA *group* of G = n_heads /
// n_kv_heads query heads that read that KV head: every K/V vector is loaded
// from global memory once and used by all G heads. (One block per query head
// would load each K/V G times.)
//
// The context is walked in tiles of TK keys. Per tile:
//   1. all threads copy the tile's K and V head vectors into shared memory with
//      16-byte loads; consecutive threads read consecutive floats of a head
//      vector, so a warp's loads coalesce into full 128-byte lines;
//   2. each (query head, key) pair of the tile gets its score q.k / sqrt(hd),
//      summed in order of d, like the reference;
//   3. one thread per query head folds the tile into that head's *online
//      softmax*: new running max m' = max(m, tile max), the old sum and output
//      are rescaled by exp(m - m'), p_j = exp(s_j - m'), sum += p_j. This is
//      what lets the context be any length: nothing grows with it but the loop.
//      (A serial step of TK exps per head: short next to the tile's loads.)
//   4. each thread owns some (head, d) output elements and adds sum_j p_j v_j[d]
//      into its registers, in order of j.
// At the end, out = acc / sum. Everything is float32.
//
// What production kernels add on top: vLLM's legacy paged_attention v2
// splits a long context across thread blocks ("split-KV", then a reduction)
// so a single decode fills the GPU, and uses warp shuffles for the dot
// products. Both are in lab/attention_partitioned.cuh, which the programs run
// by default (examples/devices.hpp chooses it); this kernel is the one to read
// first, and the one the gdb walk and exercise 10 follow. Beyond both: fp16/bf16 arithmetic and fp8 caches; FlashInfer
// pipelines tiles with cp.async (on Hopper, TMA) so the next tile loads while
// this one computes, and uses tensor cores for the QK^T and PV products of
// prefill. We do none of that: synchronous loads, CUDA cores, float32 --
// straightforward, not naive.

constexpr int kAttnThreads = 128;
constexpr int kAttnMaxPairsPerThread = 16;  // (head, d) outputs per thread: G * head_dim <= 2048

// Floats of shared memory the kernel needs for a tile of tk keys.
PKV_HD inline int attention_smem_floats(int group, int head_dim, int tk) {
    return group * head_dim          // q of the group's heads      [G, hd]
           + tk * (head_dim + 1)     // K tile, rows padded by one   [TK, hd+1]
           + tk * head_dim           // V tile                       [TK, hd]
           + group * tk              // scores, then p               [G, TK]
           + 3 * group;              // m, l, rescale factor          [3, G]
}

// The largest tile (power of two, at most 64 keys) that fits in 48 KiB, the
// shared memory every CUDA GPU gives a block without opting in.
inline int attention_tile_keys(int group, int head_dim) {
    int tk = 64;
    while (tk > 1 && attention_smem_floats(group, head_dim, tk) * 4 > 48 * 1024) tk /= 2;
    return tk;
}

template <class = void>
PKV_KERNEL void paged_attention_kernel(AttentionArgs args, int tk) {
    const AttentionShape& s = args.s;
    const int t = blockIdx.x, kvh = blockIdx.y, tid = threadIdx.x, nthr = blockDim.x;
    const int hd = s.head_dim, G = s.n_heads / s.n_kv_heads;
    const int ctx = args.positions[t] + 1;
    const int32_t* table = args.block_tables + (size_t)args.token_seq[t] * s.max_blocks_per_seq;
    const float scale_div = sqrtf((float)hd);

    float* sq = shared_memory<float>();         // [G, hd]
    float* sk = sq + G * hd;                    // [tk, hd + 1]
    float* sv = sk + tk * (hd + 1);             // [tk, hd]
    float* sp = sv + tk * hd;                   // [G, tk]
    float* sm = sp + G * tk;                    // [G] running max
    float* sl = sm + G;                         // [G] running sum
    float* sa = sl + G;                         // [G] rescale factor of this tile

    // The group's query vectors; heads kvh*G .. kvh*G+G-1 are contiguous.
    const float* qg = args.q + ((size_t)t * s.n_heads + (size_t)kvh * G) * hd;
    for (int i = tid; i < G * hd; i += nthr) sq[i] = qg[i];
    if (tid < G) { sm[tid] = -INFINITY; sl[tid] = 0.0f; }
    // This thread's (head, d) outputs: pair = r * nthr + tid. The r loops below
    // have constant bounds and are unrolled, so acc[] lives in registers.
    float acc[kAttnMaxPairsPerThread];
    for (int r = 0; r < kAttnMaxPairsPerThread; ++r) acc[r] = 0.0f;
    syncthreads();

    for (int start = 0; start < ctx; start += tk) {
        const int n = ctx - start < tk ? ctx - start : tk;  // keys in this tile
        // 1. K and V tile -> shared memory, four floats per load.
        const int vec_per_key = hd / 4;
        for (int i = tid; i < n * vec_per_key; i += nthr) {
            const int j = i / vec_per_key, d = (i % vec_per_key) * 4;
            const int64_t slot = slot_of(table, start + j, s.block_size);
            float a, b, c, e;
            kv_load4(args.k_cache, slot, kvh, d, a, b, c, e);
            float* kr = sk + j * (hd + 1) + d;  // padded row: scalar stores
            kr[0] = a; kr[1] = b; kr[2] = c; kr[3] = e;
            kv_load4(args.v_cache, slot, kvh, d, a, b, c, e);
            float* vr = sv + j * hd + d;
            vr[0] = a; vr[1] = b; vr[2] = c; vr[3] = e;
        }
        syncthreads();
        // ---- exercise 10 begin: the paged-attention kernel ----
        // The tile's K and V are in shared memory (sk rows padded to hd + 1,
        // sv), q in sq. 2: every (head, key) score into sp[h * tk + j], with
        // the loop over pairs strided by the block's threads. 3: one thread per
        // head folds the tile into its online softmax (sm, sl; the rescale
        // factor into sa). 4: each thread rescales and accumulates its own
        // (head, d) pairs in acc[r]. A step may only read what an earlier
        // step wrote once every thread has finished writing it: syncthreads().
        // And the next tile's step 1 overwrites sk, sv and sp: end each tile
        // with one more syncthreads(), after step 4 has read them.
        // 2. Scores for every (head, key) pair of the tile.
        for (int i = tid; i < G * n; i += nthr) {
            const int h = i / n, j = i % n;
            const float* qh = sq + h * hd;
            const float* kj = sk + j * (hd + 1);
            float dot = 0.0f;
            for (int d = 0; d < hd; ++d) dot += qh[d] * kj[d];
            sp[h * tk + j] = dot / scale_div;
        }
        syncthreads();
        // 3. Online softmax, one thread per query head.
        if (tid < G) {
            float* ph = sp + tid * tk;
            float m_new = sm[tid];
            for (int j = 0; j < n; ++j) m_new = fmaxf(m_new, ph[j]);
            const float alpha = expf(sm[tid] - m_new);  // exp(-inf) = 0 on the first tile
            float sum = sl[tid] * alpha;
            for (int j = 0; j < n; ++j) {
                ph[j] = expf(ph[j] - m_new);
                sum += ph[j];
            }
            sm[tid] = m_new;
            sl[tid] = sum;
            sa[tid] = alpha;
        }
        syncthreads();
        // 4. Rescale and accumulate p . V for this thread's (head, d) pairs.
        for (int r = 0; r < kAttnMaxPairsPerThread; ++r) {
            const int pair = r * nthr + tid, h = pair / hd, d = pair % hd;
            if (pair >= G * hd) break;
            float a = acc[r] * sa[h];
            const float* ph = sp + h * tk;
            for (int j = 0; j < n; ++j) a += ph[j] * sv[j * hd + d];
            acc[r] = a;
        }
        syncthreads();  // the next tile overwrites sk, sv, sp
        // ---- exercise 10 end ----
    }
    float* og = args.out + ((size_t)t * s.n_heads + (size_t)kvh * G) * hd;
    for (int r = 0; r < kAttnMaxPairsPerThread; ++r) {
        const int pair = r * nthr + tid;
        if (pair >= G * hd) break;
        og[pair] = acc[r] / sl[pair / hd];
    }
}

// ---- the host side of paged_attention ----------------------------------------------

// The shapes the kernel accepts, checked before anything is launched (both
// attention kernels accept the same; lab/attention_partitioned.cuh calls this
// too). `who` starts the message: the kernel's name.
inline void check_attention_shape(const AttentionShape& s, const std::string& who) {
    if (s.head_dim % 4 != 0 || s.head_dim <= 0 || s.head_dim > 256)
        throw std::invalid_argument(who + "head_dim " + std::to_string(s.head_dim) +
                                    " is not supported: it must be a multiple of 4 (16-byte loads), 4..256");
    if (s.n_kv_heads <= 0 || s.n_heads % s.n_kv_heads != 0)
        throw std::invalid_argument(who + "n_heads " + std::to_string(s.n_heads) + " must be a positive multiple of n_kv_heads " +
                                    std::to_string(s.n_kv_heads));
    const int G = s.n_heads / s.n_kv_heads;
    // The baseline keeps each head's softmax state in one thread (step 3).
    if (G > kAttnThreads)
        throw std::invalid_argument(who + "n_heads / n_kv_heads = " + std::to_string(G) +
                                    " query heads per kv head; at most 128 (the threads of a block) are supported");
    if (G * s.head_dim > kAttnThreads * kAttnMaxPairsPerThread)
        throw std::invalid_argument(who + "(n_heads / n_kv_heads) * head_dim = " + std::to_string(G * s.head_dim) +
                                    "; at most 2048 are supported (fewer query heads per kv head, or a smaller head_dim)");
}

// Host side: check the shape, size the tile, launch. All pointers are device
// pointers (host memory under emulation).
inline void paged_attention(const AttentionArgs& a) {
    check_attention_shape(a.s, "paged_attention: ");
    if (a.num_tokens <= 0) return;
    const int G = a.s.n_heads / a.s.n_kv_heads;
    const int tk = attention_tile_keys(G, a.s.head_dim);
    launch(paged_attention_kernel<>, dim3(a.num_tokens, a.s.n_kv_heads), dim3(kAttnThreads),
           (size_t)attention_smem_floats(G, a.s.head_dim, tk) * sizeof(float), a, tk);
}

}  // namespace pkv

// paged_kv.cuh -- chapter 3: paged attention, i.e. where keys and values live
// and how attention reads them through block tables.
//
// Chapter 1 (block_pool.hpp) decides *which* block a token position uses; this
// header is about the bytes inside those blocks:
//
//   1. the geometry and layout of the KV cache, the element types it can be
//      stored in (f32, f16, int8), and the one place that turns a token
//      position into an address (used by the CPU reference and the CUDA
//      kernels alike);
//   2. the KV cache in host memory (what the CPU forward pass uses);
//   3. the CPU reference paged attention, which the model uses on the CPU and
//      which is the oracle every faster kernel is tested against;
//   4. the CUDA kernels: reshape_and_cache and paged_attention -- a
//      straightforward single-pass kernel to learn from, and a partitioned
//      ("split-KV") pair that is the default (they also run on the CPU,
//      emulated, through cuda_shim.hpp).
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

#include "cuda_shim.hpp"

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
// vLLM's CUDA backend splits head_dim further ("x" packing) for 16-byte loads;
// we keep the plain layout because it reads the same on paper and in code.

// The element type of the cache. A smaller type means more blocks in the same
// memory, so fewer preemptions -- paid for with precision:
//   kF32   4 bytes, exact (what the model computed)
//   kF16   2 bytes, IEEE half: ~3 significant digits, range +-65504
//   kInt8  1 byte + one float scale per (token, kv head): each head vector is
//          stored as round(x / s) with s = max|x| / 127 (symmetric, per-token,
//          per-head; vLLM's fp8/int8 caches use per-tensor or per-head scales).
enum class KVDtype : int32_t { kF32 = 0, kF16 = 1, kInt8 = 2 };

PKV_HD inline int kv_dtype_bytes(KVDtype t) { return t == KVDtype::kF32 ? 4 : t == KVDtype::kF16 ? 2 : 1; }
inline const char* to_string(KVDtype t) { return t == KVDtype::kF32 ? "f32" : t == KVDtype::kF16 ? "f16" : "int8"; }
inline KVDtype parse_kv_dtype(const std::string& s) {
    if (s == "f32") return KVDtype::kF32;
    if (s == "f16") return KVDtype::kF16;
    if (s == "int8") return KVDtype::kInt8;
    throw std::invalid_argument("kv_dtype must be f32, f16 or int8, got '" + s + "'");
}

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
    // Everything one block holds: every layer, K and V, data and scales. What
    // a swap copies, and what a byte budget is divided by.
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
// float <-> IEEE half, by bit manipulation (round to nearest even), so the CPU,
// the emulated kernels and the GPU produce the very same bits.
PKV_HD inline uint16_t float_to_half(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    const uint32_t sign = (x >> 16) & 0x8000u;
    const uint32_t absx = x & 0x7FFFFFFFu;
    if (absx >= 0x7F800000u) return (uint16_t)(sign | 0x7C00u | (absx > 0x7F800000u ? 0x200u : 0));  // inf, nan
    if (absx >= 0x477FF000u) return (uint16_t)(sign | 0x7C00u);  // rounds above 65504: inf
    if (absx < 0x38800000u) {                                     // a half subnormal (or zero)
        // The value in units of the smallest subnormal (2^-24) is
        // mant24 * 2^(e - 126): shift right by 126 - e, rounding to even.
        const uint32_t mant = (absx & 0x7FFFFFu) | 0x800000u;
        const int shift = 126 - (int)(absx >> 23);                // 14..24; more rounds to 0
        if (shift > 24) return (uint16_t)sign;
        const uint32_t half = mant >> shift, rem = mant & ((1u << shift) - 1), mid = 1u << (shift - 1);
        return (uint16_t)(sign | (half + (rem > mid || (rem == mid && (half & 1)))));
    }
    const uint32_t r = absx - 0x38000000u;  // rebias exponent 127 -> 15, keep 23 mantissa bits
    const uint32_t half = r >> 13, rem = r & 0x1FFFu;
    return (uint16_t)(sign | (half + (rem > 0x1000u || (rem == 0x1000u && (half & 1)))));
}
PKV_HD inline float half_to_float(uint16_t h) {
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1Fu, mant = h & 0x3FFu;
    uint32_t x;
    if (exp == 0x1F) x = sign | 0x7F800000u | (mant << 13);                // inf, nan
    else if (exp != 0) x = sign | ((exp + 112) << 23) | (mant << 13);      // normal
    else if (mant == 0) x = sign;                                           // zero
    else {                                                                  // subnormal: normalise
        int e = -1;
        uint32_t m = mant;
        do { m <<= 1; ++e; } while (!(m & 0x400u));
        x = sign | ((uint32_t)(112 - e) << 23) | ((m & 0x3FFu) << 13);
    }
    float f;
    memcpy(&f, &x, 4);
    return f;
}

// One layer's K (or V) as the kernels see it: typed data, plus int8 scales.
struct KVView {
    KVDtype dtype = KVDtype::kF32;
    void* data = nullptr;    // [num_blocks, block_size, n_kv_heads, head_dim] elements of dtype
    float* scale = nullptr;  // [num_blocks, block_size, n_kv_heads], kInt8 only
    int n_kv_heads = 0, head_dim = 0;
};

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
    // ---- exercise 8 begin: paged attention on the CPU ----
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
    // ---- exercise 8 end ----
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
// Two operations touch the cache, exactly as in vLLM: one writes it
// (reshape_and_cache), one reads it (paged_attention, in two versions: the
// baseline kernel, and the partition + merge pair). All are ordinary CUDA;
// under g++ they run emulated (cuda_shim.hpp), which is how `make test` checks
// them against section 3 on a machine with no GPU. Each is a function
// template, most with nothing to template on: cuda_shim.hpp's rules say why a
// kernel defined in a header must be one.

// Load four consecutive floats. On the GPU one 16-byte load instruction (the
// address must be 16-byte aligned: head vectors start at multiples of head_dim
// floats, which is why head_dim must be a multiple of 4); emulated, four loads.
PKV_HD inline void load4(const float* p, float& a, float& b, float& c, float& d) {
#ifdef __CUDA_ARCH__
    const float4 v = *reinterpret_cast<const float4*>(p);
    a = v.x; b = v.y; c = v.z; d = v.w;
#else
    a = p[0]; b = p[1]; c = p[2]; d = p[3];
#endif
}

// One half to float on the GPU: the hardware's conversion instruction
// (cvt.f32.f16), which is exact -- every half is a float -- so it gives the
// very bits half_to_float computes with integer arithmetic on the host.
#ifdef __CUDA_ARCH__
__device__ inline float half_bits_to_float(unsigned short h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}
#endif

// Elements i..i+3 of a K or V array, as floats, for any dtype; `head` is the
// head vector's index (slot * n_kv_heads + kv head), which only int8 needs,
// for its scale. On the GPU each is one load: 16 bytes of f32, 8 bytes of
// four halves (then four exact hardware conversions), 4 bytes of int8 (then
// four exact int-to-float conversions, times the vector's scale). Emulated,
// element by element, the same values. i is a multiple of 4 and the array
// 16-byte aligned (KVCache::layer_bytes, cudaMalloc), so the loads are aligned.
PKV_HD inline void kv_load4_at(const KVView& v, int64_t i, int64_t head, float& a, float& b, float& c, float& e) {
    if (v.dtype == KVDtype::kF32) {
        load4(static_cast<const float*>(v.data) + i, a, b, c, e);
    } else if (v.dtype == KVDtype::kF16) {
        const uint16_t* p = static_cast<const uint16_t*>(v.data) + i;
#ifdef __CUDA_ARCH__
        const uint2 w = *reinterpret_cast<const uint2*>(p);  // halves 0,1 in w.x; 2,3 in w.y (little-endian)
        a = half_bits_to_float((unsigned short)(w.x & 0xFFFFu)); b = half_bits_to_float((unsigned short)(w.x >> 16));
        c = half_bits_to_float((unsigned short)(w.y & 0xFFFFu)); e = half_bits_to_float((unsigned short)(w.y >> 16));
#else
        a = half_to_float(p[0]); b = half_to_float(p[1]); c = half_to_float(p[2]); e = half_to_float(p[3]);
#endif
    } else {
        const int8_t* p = static_cast<const int8_t*>(v.data) + i;
        const float sc = v.scale[head];
#ifdef __CUDA_ARCH__
        const char4 w = *reinterpret_cast<const char4*>(p);
        a = (float)w.x * sc; b = (float)w.y * sc; c = (float)w.z * sc; e = (float)w.w * sc;
#else
        a = p[0] * sc; b = p[1] * sc; c = p[2] * sc; e = p[3] * sc;
#endif
    }
}

// Elements d..d+3 of kv head h in `slot`, for any dtype (kv_load4_at above).
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
// What production kernels add on top: vLLM's paged_attention v2 splits a long
// context across several thread blocks ("split-KV", then a reduction kernel)
// so a single decode fills the GPU, and uses warp shuffles for the dot
// products. Both are in this file too: paged_attention_partition_kernel and
// paged_attention_merge_kernel below, the default of paged_attention(); this
// kernel stays as the teaching baseline (AttentionKernel::kBaseline), the one
// to read first. Beyond both: fp16/bf16 arithmetic and fp8 caches; FlashInfer
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
PKV_KERNEL void paged_attention_kernel(float* out,                   // [num_tokens, n_heads, head_dim]
                                       const float* q,               // [num_tokens, n_heads, head_dim]
                                       KVView k_cache,               // [num_blocks, block_size, n_kv_heads, head_dim]
                                       KVView v_cache,               // [num_blocks, block_size, n_kv_heads, head_dim]
                                       const int32_t* block_tables,  // [num_seqs, max_blocks_per_seq]
                                       const int32_t* token_seq,     // [num_tokens]
                                       const int32_t* positions,     // [num_tokens]
                                       AttentionShape s, int tk) {
    const int t = blockIdx.x, kvh = blockIdx.y, tid = threadIdx.x, nthr = blockDim.x;
    const int hd = s.head_dim, G = s.n_heads / s.n_kv_heads;
    const int ctx = positions[t] + 1;
    const int32_t* table = block_tables + (size_t)token_seq[t] * s.max_blocks_per_seq;
    const float scale_div = sqrtf((float)hd);

    float* sq = shared_memory<float>();         // [G, hd]
    float* sk = sq + G * hd;                    // [tk, hd + 1]
    float* sv = sk + tk * (hd + 1);             // [tk, hd]
    float* sp = sv + tk * hd;                   // [G, tk]
    float* sm = sp + G * tk;                    // [G] running max
    float* sl = sm + G;                         // [G] running sum
    float* sa = sl + G;                         // [G] rescale factor of this tile

    // The group's query vectors; heads kvh*G .. kvh*G+G-1 are contiguous.
    const float* qg = q + ((size_t)t * s.n_heads + (size_t)kvh * G) * hd;
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
            kv_load4(k_cache, slot, kvh, d, a, b, c, e);
            float* kr = sk + j * (hd + 1) + d;  // padded row: scalar stores
            kr[0] = a; kr[1] = b; kr[2] = c; kr[3] = e;
            kv_load4(v_cache, slot, kvh, d, a, b, c, e);
            float* vr = sv + j * hd + d;
            vr[0] = a; vr[1] = b; vr[2] = c; vr[3] = e;
        }
        syncthreads();
        // ---- exercise 9 begin: the paged-attention kernel ----
        // The tile's K and V are in shared memory (sk rows padded to hd + 1,
        // sv), q in sq. 2: every (head, key) score into sp[h * tk + j], with
        // the loop over pairs strided by the block's threads. 3: one thread per
        // head folds the tile into its online softmax (sm, sl; the rescale
        // factor into sa). 4: each thread rescales and accumulates its own
        // (head, d) pairs in acc[r]. A step may only read what an earlier
        // step wrote once every thread has finished writing it: syncthreads().
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
        // ---- exercise 9 end ----
    }
    float* og = out + ((size_t)t * s.n_heads + (size_t)kvh * G) * hd;
    for (int r = 0; r < kAttnMaxPairsPerThread; ++r) {
        const int pair = r * nthr + tid;
        if (pair >= G * hd) break;
        og[pair] = acc[r] / sl[pair / hd];
    }
}

// ---- paged_attention, partitioned ("split-KV") -----------------------------------
//
// The baseline kernel gives one thread block the whole context of one (token,
// kv head). A decode batch of a few sequences is then a few dozen blocks on a
// GPU with 132 multiprocessors, each block walking thousands of keys one tile
// after another: most of the GPU idles while a handful of blocks are busy for
// a long time. vLLM's paged_attention v2 answers with two kernels, and so do
// we:
//
//   paged_attention_partition_kernel, grid (num_tokens, n_kv_heads,
//     max_partitions), block (128 threads = 4 warps): block (t, kvh, p) reads
//     only keys p * P .. p * P + P - 1 of token t's context (P =
//     kPartitionKeys = 512) and computes, for each query head of the GQA group,
//     the partition's softmax *state*: its running max m, its sum
//     l = sum_j exp(s_j - m), and its unnormalised output
//     acc[d] = sum_j exp(s_j - m) v_j[d]. A context of 2000 keys keeps 4 blocks
//     busy instead of 1.
//   paged_attention_merge_kernel, grid (num_tokens, n_heads): combines a
//     token's partitions, in the fixed order 0, 1, 2, ..., into
//     out = sum_p exp(m_p - M) acc_p / sum_p exp(m_p - M) l_p, M = max_p m_p.
//
// Why a *fixed* partition size. The split could adapt to the batch (fewer,
// longer partitions when many tokens already fill the GPU, as some kernels do),
// but then a token's sums would be grouped differently depending on which other
// tokens share the launch, and its output would change in the last bits with
// the batch. Our engine promises batch invariance (a recomputed request
// reproduces its tokens), so a token's partitions depend only on its own
// context length: P is a compile-time constant. The same holds for everything
// inside a partition: which thread reads which key is a function of the key's
// index in the partition, never of the launch's shape. (The table width
// max_blocks_per_seq does set how many partition blocks are *launched*; the
// ones past a token's context return at once, so it changes nothing either.)
// 512 keys is vLLM v2's choice; it keeps every block busy for a while (the
// fixed cost of a block -- q into registers, the slot table, the final merge
// -- is shared by 512 keys), and costs one workspace row per 512 keys.
//
// Why the merge order is fixed. Floating-point sums depend on their order. The
// merge kernel adds the partitions in index order, always, and inside a
// partition block the four warps' states are merged in warp order by the same
// threads every time. Nothing is combined with atomics, whose order would be
// whatever the hardware's timing was.
//
// A token whose context fits in one partition (ctx <= 512, every token of a
// short sequence) needs no merge: its single partition block divides acc / l
// and writes the output itself, and the merge kernel skips the token. That
// rule depends only on the token's own context, so it is deterministic; and
// it gives the bits a merge of one partition would (exp(0) = 1 exactly). When
// no token of the launch can have a second partition (max_blocks_per_seq *
// block_size <= 512) the merge kernel is not launched at all.
//
// Inside a partition block: a *key group* of KG lanes shares each key, KG =
// min(32, head_dim / 4) rounded down to a power of two, so each lane owns
// head_dim / KG elements of the head vectors, in float4 chunks: chunk c
// (elements 4c .. 4c+3) belongs to lane c % KG of the group.
//   - q in registers: each lane loads its chunks of the group's query heads
//     once; no shared-memory round trip, no barrier before the first key.
//   - K and V with one vector load per chunk (kv_load4_at: 16 bytes of f32,
//     8 of f16, 4 of int8, with the hardware's exact conversions). A group's
//     lanes read consecutive 16-byte chunks of one key's vector, so for
//     head_dim 128 a warp reads one whole 512-byte K row per instruction.
//   - the dot product: each lane sums its own products, then the group adds its
//     lanes' partial sums with butterfly shuffles (shfl_xor with lane masks
//     1, 2, .. KG/2): log2(KG) register-to-register steps instead of a trip
//     through shared memory and a block-wide barrier. After a butterfly every
//     lane holds the same sum, bit for bit (a + b == b + a in IEEE).
//   - the online softmax per lane, per head, key after key, with one exp per
//     (key, head): a key above the running max rescales the state by
//     exp(m - s) and enters with weight exp(0) = 1; any other key enters with
//     exp(s - m). No thread ever folds a whole tile alone (the baseline's
//     serial step 3), and there is no barrier inside the key loop at all.
//   - at the end of the partition the groups' states merge: inside a warp by
//     shuffles (lane masks KG .. 16, each step combining two states with the
//     usual rescaling), then the four warps' states through shared memory, in
//     warp order, by one thread per (head, element).
//   - slot addresses: the partition's slots are computed once, through slot_of
//     and kv_offset (the only place a position becomes an address), one per
//     key, into a shared table of 512 offsets. The per-element index math of
//     the baseline (divisions by head_dim, per element, per tile) is gone: the
//     kernel is a template on head_dim (8, 16, 32, 64, 128, and 0 = any other
//     multiple of 4 up to 256, a generic instantiation with run-time bounds),
//     so chunk loops unroll and their bounds are constants.
//   - at most PartLayout::kHeadsPerPass = 4 query heads are held in registers
//     at once: a larger GQA group is done in several passes over the
//     partition's keys, which re-reads K and V (from L1/L2, mostly) but keeps
//     q and acc in registers, never spilled to local memory.
//   - each group takes kKeysPerRound keys (4; 2 above head_dim 128) per round:
//     their K and V loads are in flight together, and the group's butterfly
//     sums all (head, key) dot products of the round in the same steps.
//
// What each buys, as estimates rather than measurements (this repository
// reports no GPU timings in comments; examples/bench_attention.cpp measures):
// the split raises the number of busy blocks for a long decode by ctx / 512;
// shuffles remove the baseline's 4 block barriers per tile and its serial
// softmax step; register-resident q and acc remove the shared-memory reads of
// q and of the V tile, so a decode's time should approach what its K/V bytes
// cost at memory bandwidth. The price: a workspace and a second, small launch
// for contexts above 512 keys, and a different rounding order than both the
// reference and the baseline (within the tests' tolerance; the model's greedy
// tokens are unchanged).
//
// Accuracy. Scores are q.k summed in another order than the reference (per
// lane, then a tree across the group), then divided by sqrtf(head_dim) as the
// reference does. The baseline sums in the reference's order, so its scores are
// bit-identical; ours may differ in the last bit, and exp(s - m) passes that
// on as a relative error of about 2^-24 * |s| to each weight: with scores of
// size 10, ~1e-6. The softmax then rescales as often as the running max rises.
// Emulated, the tests see outputs within ~1e-5 of the reference (the
// baseline: ~2e-6) against a tolerance of 1e-5 + 1e-4 |out|; through a model
// that stays far inside kLogitTol (test_kernels.cpp).

constexpr int kPartitionKeys = 512;  // keys per partition: fixed, see above
constexpr int kPartThreads = 128;    // 4 warps per partition block
constexpr int kMergeThreads = 128;   // threads of a merge block: one per output element (strided)

// The compile-time layout of a partition block for head_dim HD (0: generic).
// HD == 0 sizes its arrays for the largest head_dim, 256, and keeps run-time
// bounds; the specialised ones are exact.
template <int HD>
struct PartLayout {
    static constexpr int kChunks = (HD ? HD : 256) / 4;  // float4 chunks per head vector
    // Lanes per key: the largest power of two <= min(32, chunks).
    static constexpr int kLanes = kChunks >= 32 ? 32 : kChunks >= 16 ? 16 : kChunks >= 8 ? 8 : kChunks >= 4 ? 4 : kChunks >= 2 ? 2 : 1;
    // Chunks per lane (at most 2 for any head_dim <= 256).
    static constexpr int kChunksPerLane = HD ? (kChunks + kLanes - 1) / kLanes : 2;
    // Query heads per pass: their q and acc take 2 * 4 * kChunksPerLane floats
    // each. 4 covers Llama-3-8B's group (32 / 8) in one pass. Registers decide
    // it: with 4 heads and 4 keys per round, CUDA 13's ptxas (sm_90) gives the
    // kernel about 120 registers, so 4 blocks (16 warps) fit on a
    // multiprocessor; with 8 heads about 240 -- no spills, but half the warps.
    static constexpr int kHeadsPerPass = 4;
    // Keys a group takes per round: their K and V take 2 * 4 * kChunksPerLane
    // floats each (32 in all), and their loads are in flight together.
    static constexpr int kKeysPerRound = kChunksPerLane == 1 ? 4 : 2;
    // Floats of one head's softmax state in a lane: m, l, acc chunks.
    static constexpr int kStateFloats = 2 + 4 * kChunksPerLane;
};

// Lanes per key for a run-time head_dim (the generic instantiation), the same
// rule as PartLayout::kLanes.
PKV_HD inline int part_lanes_for(int head_dim) {
    const int chunks = head_dim / 4;
    int lanes = 1;
    while (lanes * 2 <= chunks && lanes < 32) lanes *= 2;
    return lanes;
}

// Shared memory of a partition block, in bytes (all fit in 48 KiB: at most
// 8 KiB of offsets + 4 warps x 4 heads x (256 + 2) floats).
PKV_HD inline size_t partition_smem_bytes(int heads_per_pass, int head_dim) {
    return 2 * kPartitionKeys * sizeof(int64_t)                                 // offsets, head indices  [2, P]
           + (size_t)(kPartThreads / 32) * heads_per_pass * (head_dim + 2) * sizeof(float);  // warp states [4, GH, 2 + hd]
}

// Combine softmax state (m2, l2, a2) into (m, l, a): the larger max wins and
// each side is rescaled to it. An empty state has m = -inf, l = 0, a = 0 and
// weight 0 (not exp(-inf - -inf) = NaN). Symmetric: combining x into y gives
// the same bits as y into x, which is what lets both lanes of a shuffle agree.
PKV_HD inline float softmax_weight(float m, float m_max) { return m == -INFINITY ? 0.0f : expf(m - m_max); }

template <int HD>
PKV_KERNEL void paged_attention_partition_kernel(float* out,                   // [num_tokens, n_heads, head_dim]
                                                 float* ws_ml,                 // [num_tokens, n_heads, max_parts, 2] (m, l)
                                                 float* ws_acc,                // [num_tokens, n_heads, max_parts, head_dim]
                                                 const float* q,               // [num_tokens, n_heads, head_dim]
                                                 KVView k_cache,               // [num_blocks, block_size, n_kv_heads, head_dim]
                                                 KVView v_cache,               // [num_blocks, block_size, n_kv_heads, head_dim]
                                                 const int32_t* block_tables,  // [num_seqs, max_blocks_per_seq]
                                                 const int32_t* token_seq,     // [num_tokens]
                                                 const int32_t* positions,     // [num_tokens]
                                                 AttentionShape s, int max_parts) {
    using L = PartLayout<HD>;
    constexpr int NC = L::kChunksPerLane, GH = L::kHeadsPerPass, U = L::kKeysPerRound, S = L::kStateFloats;
    const int hd = HD ? HD : s.head_dim;
    const int chunks = hd / 4;
    const int KG = HD ? L::kLanes : part_lanes_for(hd);  // lanes per key
    const int t = blockIdx.x, kvh = blockIdx.y, part = blockIdx.z;
    const int tid = threadIdx.x, nthr = blockDim.x, nwarps = nthr / 32;
    const int ctx = positions[t] + 1;
    const int start = part * kPartitionKeys;
    if (start >= ctx) return;  // past this token's context: the whole block leaves
    const int n = ctx - start < kPartitionKeys ? ctx - start : kPartitionKeys;  // keys here
    int nparts = (ctx + kPartitionKeys - 1) / kPartitionKeys;
    if (nparts > max_parts) nparts = max_parts;  // a context longer than its table row: stay inside the workspace
    const int G = s.n_heads / s.n_kv_heads;
    const int grp = tid / KG, gl = tid % KG, ngroups = nthr / KG;  // key group, lane in it, groups
    const int warp = tid / 32, lane = tid % 32;
    const int32_t* table = block_tables + (size_t)token_seq[t] * s.max_blocks_per_seq;
    const float scale_div = sqrtf((float)hd);

    int64_t* s_off = shared_memory<int64_t>();    // [P] element offset of key j's head vector
    int64_t* s_head = s_off + kPartitionKeys;     // [P] its head index (slot * n_kv_heads + kvh): int8 scales
    float* s_ws = reinterpret_cast<float*>(s_head + kPartitionKeys);  // [nwarps, GH, 2 + hd]: m, l, acc

    // The partition's addresses, once per key.
    for (int j = tid; j < n; j += nthr) {
        const int64_t slot = slot_of(table, start + j, s.block_size);
        s_off[j] = kv_offset(slot, kvh, s.n_kv_heads, hd);
        s_head[j] = slot * s.n_kv_heads + kvh;
    }
    syncthreads();

    for (int h0 = 0; h0 < G; h0 += GH) {  // passes over the group's heads (one when G <= GH)
        // q of heads h0 .. h0 + GH - 1 of the group, this lane's chunks.
        float qr[GH][NC][4];                  // [GH, NC, 4] q chunks c = gl + r * KG of each head
        float m[GH], l[GH], acc[GH][NC][4];   // [GH] max, [GH] sum, [GH, NC, 4] unnormalised output
        for (int hh = 0; hh < GH; ++hh) {
            const float* qh = q + ((size_t)t * s.n_heads + (size_t)kvh * G + h0 + hh) * hd;
            m[hh] = -INFINITY;
            l[hh] = 0.0f;
            for (int r = 0; r < NC; ++r) {
                const int c = gl + r * KG;
                for (int e = 0; e < 4; ++e) { qr[hh][r][e] = 0.0f; acc[hh][r][e] = 0.0f; }
                if (h0 + hh < G && c < chunks) load4(qh + 4 * c, qr[hh][r][0], qr[hh][r][1], qr[hh][r][2], qr[hh][r][3]);
            }
        }
        // Rounds of U keys per group: group grp takes keys base + u * ngroups
        // + grp. Every lane runs the same rounds (the shuffles need the whole
        // warp); a group past the end computes zeros and drops them.
        const int heads = G - h0 < GH ? G - h0 : GH;  // heads of this pass
        for (int base = 0; base < n; base += ngroups * U) {
            float kf[U][NC][4], vf[U][NC][4];  // [U, NC, 4] this lane's chunks of the round's keys and values
            bool valid[U];                     // [U] key inside the partition
            for (int u = 0; u < U; ++u) {
                const int j = base + u * ngroups + grp;
                valid[u] = j < n;
                for (int r = 0; r < NC; ++r) {
                    const int c = gl + r * KG;
                    for (int e = 0; e < 4; ++e) { kf[u][r][e] = 0.0f; vf[u][r][e] = 0.0f; }
                    if (valid[u] && c < chunks) {
                        kv_load4_at(k_cache, s_off[j] + 4 * c, s_head[j], kf[u][r][0], kf[u][r][1], kf[u][r][2], kf[u][r][3]);
                        kv_load4_at(v_cache, s_off[j] + 4 * c, s_head[j], vf[u][r][0], vf[u][r][1], vf[u][r][2], vf[u][r][3]);
                    }
                }
            }
            // This lane's share of every (head, key) dot product, then the
            // group's sum: a butterfly over its KG lanes, all products at once.
            float dot[GH * U], other[GH * U];  // [GH, U] per (head, key)
            for (int hh = 0; hh < GH; ++hh)
                for (int u = 0; u < U; ++u) {
                    float acc_dot = 0.0f;
                    for (int r = 0; r < NC; ++r)
                        for (int e = 0; e < 4; ++e) acc_dot += qr[hh][r][e] * kf[u][r][e];
                    dot[hh * U + u] = acc_dot;
                }
            for (int mask = 1; mask < KG; mask <<= 1) {
                shfl_xor_n(dot, other, heads * U, mask);
                for (int i = 0; i < GH * U; ++i) dot[i] += other[i];
            }
            // The online softmax, key by key in order, one exp per (key, head).
            for (int u = 0; u < U; ++u) {
                if (!valid[u]) continue;
                for (int hh = 0; hh < GH; ++hh) {
                    if (hh >= heads) break;
                    const float sc = dot[hh * U + u] / scale_div;
                    if (sc > m[hh]) {  // a new max: rescale what we have, this key weighs exp(0) = 1
                        const float alpha = expf(m[hh] - sc);  // exp(-inf) = 0 for the first key
                        m[hh] = sc;
                        l[hh] = l[hh] * alpha + 1.0f;
                        for (int r = 0; r < NC; ++r)
                            for (int e = 0; e < 4; ++e) acc[hh][r][e] = acc[hh][r][e] * alpha + vf[u][r][e];
                    } else {
                        const float p = expf(sc - m[hh]);
                        l[hh] += p;
                        for (int r = 0; r < NC; ++r)
                            for (int e = 0; e < 4; ++e) acc[hh][r][e] += p * vf[u][r][e];
                    }
                }
            }
        }
        // Merge the warp's key groups: lanes with the same gl, lane masks KG ..
        // 16, every head's state in one exchange.
        for (int mask = KG; mask < 32; mask <<= 1) {
            float mine[GH * S], theirs[GH * S];  // [GH, S]: per head m, l, acc chunks
            for (int hh = 0; hh < GH; ++hh) {
                mine[hh * S] = m[hh];
                mine[hh * S + 1] = l[hh];
                for (int r = 0; r < NC; ++r)
                    for (int e = 0; e < 4; ++e) mine[hh * S + 2 + 4 * r + e] = acc[hh][r][e];
            }
            shfl_xor_n(mine, theirs, heads * S, mask);
            for (int hh = 0; hh < GH; ++hh) {
                if (hh >= heads) break;
                const float m2 = theirs[hh * S], mm = fmaxf(m[hh], m2);
                const float w1 = softmax_weight(m[hh], mm), w2 = softmax_weight(m2, mm);
                l[hh] = l[hh] * w1 + theirs[hh * S + 1] * w2;
                for (int r = 0; r < NC; ++r)
                    for (int e = 0; e < 4; ++e) acc[hh][r][e] = acc[hh][r][e] * w1 + theirs[hh * S + 2 + 4 * r + e] * w2;
                m[hh] = mm;
            }
        }
        // Lanes 0 .. KG-1 of each warp now hold the warp's state: to shared memory.
        for (int hh = 0; hh < GH; ++hh) {
            if (hh >= heads) break;
            float* ws = s_ws + ((size_t)warp * GH + hh) * (2 + hd);
            if (lane == 0) { ws[0] = m[hh]; ws[1] = l[hh]; }
            if (lane < KG)
                for (int r = 0; r < NC; ++r) {
                    const int c = gl + r * KG;
                    if (c < chunks)
                        for (int e = 0; e < 4; ++e) ws[2 + 4 * c + e] = acc[hh][r][e];
                }
        }
        syncthreads();
        // The warps' states, merged in warp order: one thread per (head, element).
        for (int i = tid; i < heads * hd; i += nthr) {
            const int hh = i / hd, d = i % hd;  // hd is a constant in the specialised kernels
            float mm = -INFINITY;
            for (int w = 0; w < nwarps; ++w) mm = fmaxf(mm, s_ws[((size_t)w * GH + hh) * (2 + hd)]);
            float lsum = 0.0f, a = 0.0f;
            for (int w = 0; w < nwarps; ++w) {
                const float* ws = s_ws + ((size_t)w * GH + hh) * (2 + hd);
                const float wt = softmax_weight(ws[0], mm);
                lsum += ws[1] * wt;
                a += ws[2 + d] * wt;
            }
            const size_t head = (size_t)t * s.n_heads + (size_t)kvh * G + h0 + hh;  // global query head row
            if (nparts == 1) {
                out[head * hd + d] = a / lsum;  // the whole context was here: no merge
            } else {
                ws_acc[(head * max_parts + part) * hd + d] = a;
                if (d == 0) {
                    ws_ml[(head * max_parts + part) * 2] = mm;
                    ws_ml[(head * max_parts + part) * 2 + 1] = lsum;
                }
            }
        }
        syncthreads();  // the next pass rewrites s_ws
    }
}

// grid (num_tokens, n_heads), block (kMergeThreads): token t, query head h.
// A token with one partition was finished by its partition block. Every
// thread recomputes M and the weights itself (a few exps per partition): no
// shared memory, no barrier, and the same order for every element.
template <class = void>
PKV_KERNEL void paged_attention_merge_kernel(float* out,              // [num_tokens, n_heads, head_dim]
                                             const float* ws_ml,      // [num_tokens, n_heads, max_parts, 2] (m, l)
                                             const float* ws_acc,     // [num_tokens, n_heads, max_parts, head_dim]
                                             const int32_t* positions,  // [num_tokens]
                                             int n_heads, int head_dim, int max_parts) {
    const int t = blockIdx.x, h = blockIdx.y;
    const int ctx = positions[t] + 1;
    int nparts = (ctx + kPartitionKeys - 1) / kPartitionKeys;
    if (nparts > max_parts) nparts = max_parts;  // a context longer than its table: never read past the workspace
    if (nparts <= 1) return;
    const size_t head = (size_t)t * n_heads + h;
    const float* ml = ws_ml + head * max_parts * 2;              // [max_parts, 2]
    const float* acc = ws_acc + head * max_parts * head_dim;     // [max_parts, head_dim]
    float mm = -INFINITY;
    for (int p = 0; p < nparts; ++p) mm = fmaxf(mm, ml[2 * p]);
    float lsum = 0.0f;
    for (int p = 0; p < nparts; ++p) lsum += ml[2 * p + 1] * softmax_weight(ml[2 * p], mm);
    for (int d = threadIdx.x; d < head_dim; d += blockDim.x) {
        float a = 0.0f;
        for (int p = 0; p < nparts; ++p) a += acc[(size_t)p * head_dim + d] * softmax_weight(ml[2 * p], mm);
        out[head * head_dim + d] = a / lsum;
    }
}

// ---- the host side of paged_attention ----------------------------------------------

// Which kernel paged_attention() runs. kPartitioned is the default; kBaseline
// is the single-pass teaching kernel above (and what exercise 9 grades).
enum class AttentionKernel { kBaseline, kPartitioned };
inline const char* to_string(AttentionKernel k) { return k == AttentionKernel::kBaseline ? "baseline" : "partitioned"; }

// The partition kernels' workspace, grown to the largest launch so far and
// kept for the program's life (device memory is allocated rarely: see
// cuda_shim.hpp's device_malloc). Layout, in floats:
//   m and l  [num_tokens, n_heads, max_parts, 2], then
//   acc      [num_tokens, n_heads, max_parts, head_dim].
// One per program, like the emulation's launch(): paged_attention is called
// from one host thread (the engine's step), never from two at once.
inline DeviceBuffer<float>& attention_workspace() {
    static DeviceBuffer<float> ws;
    return ws;
}

// Host side: check the shape (before anything is launched), pick the kernel,
// launch. All pointers are device pointers (host memory under emulation).
inline void paged_attention(float* out, const float* q, const KVView& k_cache, const KVView& v_cache,
                            const int32_t* block_tables, const int32_t* token_seq, const int32_t* positions, int num_tokens,
                            const AttentionShape& s, AttentionKernel kernel = AttentionKernel::kPartitioned) {
    const std::string who = std::string("paged_attention (") + to_string(kernel) + "): ";
    if (s.head_dim % 4 != 0 || s.head_dim <= 0 || s.head_dim > 256)
        throw std::invalid_argument(who + "head_dim " + std::to_string(s.head_dim) +
                                    " is not supported: it must be a multiple of 4 (16-byte loads), 4..256");
    if (s.n_kv_heads <= 0 || s.n_heads % s.n_kv_heads != 0)
        throw std::invalid_argument(who + "n_heads " + std::to_string(s.n_heads) + " must be a positive multiple of n_kv_heads " +
                                    std::to_string(s.n_kv_heads));
    const int G = s.n_heads / s.n_kv_heads;
    // The baseline keeps each head's softmax state in one thread (step 3); the
    // partitioned kernel needs no such thread, but both take the same shapes.
    if (G > kAttnThreads)
        throw std::invalid_argument(who + "n_heads / n_kv_heads = " + std::to_string(G) +
                                    " query heads per kv head; at most 128 (the threads of a block) are supported");
    if (G * s.head_dim > kAttnThreads * kAttnMaxPairsPerThread)
        throw std::invalid_argument(who + "(n_heads / n_kv_heads) * head_dim = " + std::to_string(G * s.head_dim) +
                                    "; at most 2048 are supported (fewer query heads per kv head, or a smaller head_dim)");
    if (kernel == AttentionKernel::kBaseline) {
        const int tk = attention_tile_keys(G, s.head_dim);
        launch(paged_attention_kernel<>, dim3(num_tokens, s.n_kv_heads), dim3(kAttnThreads),
               (size_t)attention_smem_floats(G, s.head_dim, tk) * sizeof(float), out, q, k_cache, v_cache, block_tables,
               token_seq, positions, s, tk);
        return;
    }
    // Partitioned. The host cannot see the contexts (positions is device
    // memory), but a context never exceeds its block-table row:
    // max_blocks_per_seq * block_size keys bounds every token's partitions.
    const long long max_ctx = (long long)s.max_blocks_per_seq * s.block_size;
    const long long max_parts_ll = max_ctx <= 0 ? 1 : (max_ctx + kPartitionKeys - 1) / kPartitionKeys;
    if (max_parts_ll > (long long)kMaxGridYZ)
        throw std::invalid_argument(who + "max_blocks_per_seq * block_size = " + std::to_string(max_ctx) +
                                    " keys would need more than 65535 partitions of 512 (the grid's z limit)");
    const int max_parts = (int)max_parts_ll;
    if (num_tokens <= 0) return;
    float* ws_ml = nullptr;
    float* ws_acc = nullptr;
    if (max_parts > 1) {
        const size_t rows = (size_t)num_tokens * s.n_heads * max_parts;  // [num_tokens, n_heads, max_parts]
        DeviceBuffer<float>& ws = attention_workspace();
        ws.reserve(rows * (2 + (size_t)s.head_dim));
        ws_ml = ws.data();
        ws_acc = ws.data() + rows * 2;
    }
    const dim3 grid(num_tokens, s.n_kv_heads, max_parts), block(kPartThreads);
    const int hd = s.head_dim;
    auto go = [&](auto kern, int heads_per_pass) {
        launch(kern, grid, block, partition_smem_bytes(heads_per_pass, hd), out, ws_ml, ws_acc, q, k_cache, v_cache, block_tables,
               token_seq, positions, s, max_parts);
    };
    switch (hd) {  // the head dims of our models and tests get their own kernel; any other, the generic one
        case 8: go(paged_attention_partition_kernel<8>, PartLayout<8>::kHeadsPerPass); break;
        case 16: go(paged_attention_partition_kernel<16>, PartLayout<16>::kHeadsPerPass); break;
        case 32: go(paged_attention_partition_kernel<32>, PartLayout<32>::kHeadsPerPass); break;
        case 64: go(paged_attention_partition_kernel<64>, PartLayout<64>::kHeadsPerPass); break;
        case 128: go(paged_attention_partition_kernel<128>, PartLayout<128>::kHeadsPerPass); break;
        default: go(paged_attention_partition_kernel<0>, PartLayout<0>::kHeadsPerPass); break;
    }
    if (max_parts > 1)
        launch(paged_attention_merge_kernel<>, dim3(num_tokens, s.n_heads), dim3(kMergeThreads), 0, out, (const float*)ws_ml,
               (const float*)ws_acc, positions, s.n_heads, hd, max_parts);
}

// The same over plain float32 caches.
inline void paged_attention(float* out, const float* q, const float* k_cache, const float* v_cache,
                            const int32_t* block_tables, const int32_t* token_seq, const int32_t* positions, int num_tokens,
                            const AttentionShape& s, AttentionKernel kernel = AttentionKernel::kPartitioned) {
    paged_attention(out, q, f32_view(k_cache, s), f32_view(v_cache, s), block_tables, token_seq, positions, num_tokens, s, kernel);
}

}  // namespace pkv

// core/kv_dtype.hpp -- chapter 1: what the bytes of a KV cache mean, its
// element types (lab/LAB.md chapter L4 measures the smaller ones).
//
// paged_kv.cuh decides *where* a key or value vector lives (slot math); this
// header decides how its numbers are stored there. The reference attention
// and the kernels read every element through kv_load / kv_load4 (paged_kv.cuh),
// which come down to the functions here, so the CPU, the emulated kernels and
// a GPU produce the very same bits for every dtype.
//
// Sections: 1. the element types  2. float <-> IEEE half, and the view a
// kernel gets of one layer  3. four elements at once, as a GPU loads them.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>

#include "core/emu/cuda_shim.hpp"

namespace pkv {

// ============================================================================
// 1. The element types
// ============================================================================

// The element type of the cache. A smaller type means more blocks in the same
// memory, so fewer preemptions -- paid for with precision:
//   kF32   4 bytes, exact (what the model computed)
//   kF16   2 bytes, IEEE half: ~3 significant digits, range +-65504
//   kInt8  1 byte + one float scale per (token, kv head): each head vector is
//          stored as round(x / s) with s = max|x| / 127 (symmetric, per-token,
//          per-head; vLLM's fp8 cache scales per tensor, and recent vLLM adds
//          per-token-head int8/fp8 caches like this one).
enum class KVDtype : int32_t { kF32 = 0, kF16 = 1, kInt8 = 2 };

PKV_HD inline int kv_dtype_bytes(KVDtype t) { return t == KVDtype::kF32 ? 4 : t == KVDtype::kF16 ? 2 : 1; }
inline const char* to_string(KVDtype t) { return t == KVDtype::kF32 ? "f32" : t == KVDtype::kF16 ? "f16" : "int8"; }
inline KVDtype parse_kv_dtype(const std::string& s) {
    if (s == "f32") return KVDtype::kF32;
    if (s == "f16") return KVDtype::kF16;
    if (s == "int8") return KVDtype::kInt8;
    throw std::invalid_argument("kv_dtype must be f32, f16 or int8, got '" + s + "'");
}


// ============================================================================
// 2. float <-> half, and one layer's view
// ============================================================================
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

// ============================================================================
// 3. Four elements at once
// ============================================================================

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

}  // namespace pkv

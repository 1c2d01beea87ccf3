// lab/fast_gpu.cuh -- lab/LAB.md chapter L2: the kernel path's fast set, the
// tiled GEMM and the partitioned attention behind forward_gpu.cuh's seam
// (GpuMath).
//
// GpuRunner launches whatever GpuMath it was given; without one it runs the
// straightforward kernels (gemm_simple, paged_kv.cuh's paged_attention).
// FastGpuMath is what examples/devices.hpp gives every program: gemm_tiled
// (lab/gemm_tiled.cuh) and, by default, the partitioned attention
// (lab/attention_partitioned.cuh), whose workspace it owns -- so each runner
// has its own, and two runners on two host threads never share one. The
// attention can be switched back to the baseline kernel (--attention-kernel
// baseline), for the TUTORIAL's gdb walk and to compare the two.
#pragma once

#include <stdexcept>
#include <string>

#include "lab/attention_partitioned.cuh"
#include "lab/gemm_tiled.cuh"
#include "paged_kv.cuh"
#include "tiny_model/forward_gpu.cuh"

namespace pkv {

// Which attention kernel a FastGpuMath launches.
enum class AttentionKernel { kBaseline, kPartitioned };
inline const char* to_string(AttentionKernel k) { return k == AttentionKernel::kBaseline ? "baseline" : "partitioned"; }

class FastGpuMath : public GpuMath {
public:
    explicit FastGpuMath(AttentionKernel attention = AttentionKernel::kPartitioned) : attention_(attention) {}
    void gemm(float* out, const float* x, const float* W, int T, int n, int d) override { gemm_tiled(out, x, W, T, n, d); }
    void attention(const AttentionArgs& a) override {
        if (attention_ == AttentionKernel::kBaseline) paged_attention(a);
        else partitioned_(a);
    }

private:
    AttentionKernel attention_;
    PartitionedAttention partitioned_;  // owns the partition kernels' workspace
};

// Either kernel for one call, with the argument list of paged_attention_ref:
// for tests and benches that launch attention alone. The partitioned one gets
// a workspace of its own for the call (allocated and freed here).
inline void paged_attention(float* out, const float* q, const KVView& k_cache, const KVView& v_cache, const int32_t* block_tables,
                            const int32_t* token_seq, const int32_t* positions, int num_tokens, const AttentionShape& s,
                            AttentionKernel kernel = AttentionKernel::kPartitioned) {
    const AttentionArgs a{out, q, k_cache, v_cache, block_tables, token_seq, positions, num_tokens, s};
    if (kernel == AttentionKernel::kBaseline) return paged_attention(a);
    PartitionedAttention once;
    once(a);
}
// The same over plain float32 caches.
inline void paged_attention(float* out, const float* q, const float* k_cache, const float* v_cache, const int32_t* block_tables,
                            const int32_t* token_seq, const int32_t* positions, int num_tokens, const AttentionShape& s,
                            AttentionKernel kernel = AttentionKernel::kPartitioned) {
    paged_attention(out, q, f32_view(k_cache, s), f32_view(v_cache, s), block_tables, token_seq, positions, num_tokens, s, kernel);
}

}  // namespace pkv

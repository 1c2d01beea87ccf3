// tiny_model/forward_gpu.cuh -- the same transformer as forward_cpu.hpp, as
// CUDA kernels (TUTORIAL.md chapter 8).
//
// Under nvcc these kernels run on the GPU; under g++ they run emulated on the
// CPU (core/emu/cuda_shim.hpp), so every line here is exercised by `make test` on
// a laptop. The forward pass is forward_cpu.hpp's, step for step; only the
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
// As on the CPU, the two operations that take the time -- the GEMM and
// attention -- go through one seam (section 2, GpuMath): by default the
// straightforward kernels, gemm_simple here and paged_kv.cuh's
// paged_attention; lab/fast_gpu.cuh offers a tiled, double-buffered GEMM and
// the partitioned attention, which examples/devices.hpp chooses for every
// program. Both GEMMs sum in dot()'s order, so both give the CPU's bits.
//
// Sections: 1. kernels  2. the seam: GpuMath  3. GpuRunner.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/emu/cuda_shim.hpp"
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
// The one rule every GEMM here and in lab/gemm_tiled.cuh obeys: an output is
// summed exactly as the CPU's dot() sums it. Partial sum l (l = 0..7) takes the terms k = l, l+8,
// l+16, ... in increasing k, each a multiply and then an add; combine8() folds
// the eight in its fixed tree; the n % 8 leftover terms follow in order.
// Nothing in that recipe mentions T, a tile size or which block computed the
// output, so the GEMM is bit-identical to the CPU's matmul() and
// batch-invariant by construction -- which leaves the host free to pick any
// launch shape for any batch, as lab/gemm_tiled.cuh's gemm_tiled() does.
//
// Why not cuBLAS? cuBLAS picks its algorithm (tile shape, split-K, the order in
// which partial products are reduced) from the problem shape, so the logits of
// a token can change in the last bits when the batch around it changes size --
// and a recomputed request could then sample a different token. A GEMM whose
// reduction order is fixed is the simplest way to rule that out. (It is also
// slower than cuBLAS on large matrices, which may split K and use tensor
// cores; the design card asks for our own kernels, and a fixed order is the
// price of invariance.)

// ---- gemm_simple_kernel ---------------------------------------------------------
// grid (ceil(d / 128), ceil(T / 4)), block (128). A block computes 128 outputs
// for 4 tokens. The K dimension is walked in tiles of 32: the block copies a
// 128 x 32 tile of W and a 4 x 32 tile of x into shared memory; then each
// thread, owning one output row, multiplies its W row against the 4 token rows
// with 8 partial sums per token. Each W element fetched from global memory is
// used 4 times, each x element 128 times.
//
// It is correct and easy to follow, and it is slow. It is the baseline that
// lab/gemm_tiled.cuh's gemm_kernel is measured and tested against. What is
// wrong with it (and what the tiled one changes):
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
// 2. The seam: GpuMath, what a faster path may replace
// ============================================================================
//
// The GEMMs and attention take nearly all of a step. Each is a virtual
// function whose default is the straightforward kernel; lab/fast_gpu.cuh's
// FastGpuMath overrides both. A GEMM must keep dot()'s order (the tests hold
// every one to the CPU's bits); an attention kernel must agree with
// paged_attention_ref within the tests' tolerance. A GpuMath may own device
// memory (the partitioned attention's workspace): each runner has its own.
struct GpuMath {
    virtual ~GpuMath() = default;
    // out [T, d] = x [T, n] times W [d, n] transposed; device pointers.
    virtual void gemm(float* out, const float* x, const float* W, int T, int n, int d) { gemm_simple(out, x, W, T, n, d); }
    virtual void attention(const AttentionArgs& a) { paged_attention(a); }
};

// ============================================================================
// 3. GpuRunner: the model on the kernels
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
    // `math` picks the GEMM and attention kernels every step uses: the
    // straightforward ones when none is given (what the gdb walk and exercise
    // 10 follow), or a faster set (lab/fast_gpu.cuh). One choice for the
    // runner's whole life: a choice per batch would make a token's bits
    // depend on its batch.
    explicit GpuRunner(const Model& m, std::unique_ptr<GpuMath> math = nullptr)
        : model_(m), math_(math ? std::move(math) : std::make_unique<GpuMath>()) {
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
    std::string device_name() const override { return kDeviceKind; }
    uint64_t memory_for_kv_cache() const override {
        const uint64_t free_bytes = device_memory_free();  // 0 when emulated: device memory is host memory
        return free_bytes ? free_bytes : host_memory_bytes();
    }
    void init_kv_cache(const KVGeometry& geo) override {
        geo_ = geo;
        const size_t cache_bytes = (size_t)geo.num_layers * KVCache::layer_bytes(geo);
        k_cache_ = DeviceBuffer<std::byte>(cache_bytes);  // [num_layers, layer_bytes]: KVCache's layout, in device memory
        v_cache_ = DeviceBuffer<std::byte>(cache_bytes);
        device_memset(k_cache_.data(), 0, cache_bytes);
        device_memset(v_cache_.data(), 0, cache_bytes);
        const size_t scales = (size_t)geo.num_layers * geo.num_blocks * geo.scales_per_block();
        k_scale_ = DeviceBuffer<float>(scales);  // [num_layers, num_blocks, block_size, n_kv_heads], int8 only
        v_scale_ = DeviceBuffer<float>(scales);
    }
    // Layer `layer`'s K (kv = 0) or V (kv = 1) in device memory.
    KVView kv_view(int layer, int kv) override { return view(layer, kv); }

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

private:
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
            math_->gemm(q_.data(), xb_.data(), wq_.data() + (size_t)l * D * D, T, D, D);
            math_->gemm(k_.data(), xb_.data(), wk_.data() + (size_t)l * KV * D, T, D, KV);
            math_->gemm(v_.data(), xb_.data(), wv_.data() + (size_t)l * KV * D, T, D, KV);
            launch(rope_kernel<>, dim3(T), dim3(128), 0, q_.data(), k_.data(), rope_cs_.data(), D, KV, hd);
            // The only write to the KV cache, then the only read: exactly the
            // pair of vLLM's legacy kernels (reshape_and_cache, paged_attention).
            // Both go through block tables and slot_mapping, never through a
            // contiguous per-sequence buffer.
            reshape_and_cache(k_.data(), v_.data(), kc, vc, slots_.data(), T);
            math_->attention({att_.data(), q_.data(), kc, vc, tables_.data(), token_seq_.data(), positions_.data(), T, shape});
            math_->gemm(xb_.data(), att_.data(), wo_.data() + (size_t)l * D * D, T, D, D);
            launch(add_kernel<>, dim3(elt_blocks_d), dim3(256), 0, x_.data(), (const float*)xb_.data(), T * D);
            launch(rmsnorm_kernel<>, dim3(T), dim3(128), 0, xb_.data(), x_.data(), rms_ffn_.data() + (size_t)l * D, (const int32_t*)nullptr, D);
            math_->gemm(hb_.data(), xb_.data(), w1_.data() + (size_t)l * H * D, T, D, H);
            math_->gemm(hb2_.data(), xb_.data(), w3_.data() + (size_t)l * H * D, T, D, H);
            launch(swiglu_kernel<>, dim3(elt_blocks_h), dim3(256), 0, hb_.data(), (const float*)hb2_.data(), T * H);
            math_->gemm(xb_.data(), hb_.data(), w2_.data() + (size_t)l * D * H, T, H, D);
            launch(add_kernel<>, dim3(elt_blocks_d), dim3(256), 0, x_.data(), (const float*)xb_.data(), T * D);
        }
        // Logits only for the rows that want them (the last token of each
        // sequence that reaches its end this step): for a 256-token prefill
        // chunk that is one classifier row instead of 256. The rows index
        // array lets the final RMSNorm gather them without a copy.
        launch(rmsnorm_kernel<>, dim3(NL), dim3(128), 0, xl_.data(), x_.data(), rms_final_.data(), (const int32_t*)logit_rows_.data(), D);
        math_->gemm(logits_.data(), xl_.data(), c.shared_classifier ? emb_.data() : wcls_.data(), NL, D, V);
    }

    const Model& model_;
    std::unique_ptr<GpuMath> math_;  // the GEMM and attention kernels every step launches
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
};

}  // namespace pkv

// tiny_model/forward_cpu.hpp -- chapter 7: the transformer's forward pass on
// the CPU, over a flat batch (forward_batch.hpp), reading and writing the KV
// cache only through block tables.
//
// Notice what this file never uses: a request, a scheduler, a block pool. The
// engine turns its scheduled requests into a ForwardBatch, and from then on a
// sequence is nothing but a row of block ids.
//
// It reads like llama2.c's run.c forward(), because run.c is our oracle:
// build/generate prints its stories260K story byte for byte (TUTORIAL.md
// chapter 7). dot, matmul, rmsnorm, RoPE, paged attention (the reference one,
// paged_kv.cuh), SwiGLU, one loop over the layers. No intrinsics, no threads.
//
// Speed lives elsewhere, behind one seam (section 2, CpuMath). The three
// operations that take the time -- the matmuls, attention and SwiGLU's
// elementwise step -- are virtual, and lab/fast_cpu.hpp overrides them with
// versions that compute the very same bits faster (a register-blocked SIMD
// matmul, a worker pool, an attention that locates each cache row once). The
// caller chooses: CpuRunner takes a CpuMath, and examples/devices.hpp hands
// every program the fast one; without one, the plain loops below run. Each
// output is summed in the same order either way, so every token comes out
// bit-identical, whatever the path, the batch or the number of threads.
//
// Sections: 1. building blocks (dot, matmul, rmsnorm, RoPE, SwiGLU)  2. the
// seam: CpuMath  3. the forward pass.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <stdexcept>
#include <vector>

#include "paged_kv.cuh"
#include "tiny_model/forward_batch.hpp"
#include "tiny_model/model.hpp"

namespace pkv {

// ============================================================================
// 1. Building blocks, computed as llama2.c's run.c does (dot's order aside)
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


// out[t][o] = dot(W[o], x[t]) for every token t: W is [d][n], x is [T][n],
// out [T][d]. run.c's matmul, for T tokens at once. Each output is one dot(),
// whatever T is: this is where a batch of 64 and a batch of 1 agree bit for bit.
inline void matmul(float* out, const float* x, const float* W, int T, int n, int d) {
    for (int t = 0; t < T; ++t)
        for (int o = 0; o < d; ++o) out[(size_t)t * d + o] = dot(W + (size_t)o * n, x + (size_t)t * n, n);
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

// SwiGLU's elementwise step, as run.c writes it: hb = silu(hb) * hb2, with
// silu(v) = v / (1 + exp(-v)). Element by element, so any split of the range
// gives the same bits.
inline void swiglu(float* hb, const float* hb2, size_t n) {
    for (size_t i = 0; i < n; ++i) {
        float val = hb[i];
        val *= (1.0f / (1.0f + std::exp(-val)));  // silu
        hb[i] = val * hb2[i];
    }
}

// ============================================================================
// 2. The seam: CpuMath, what a faster path may replace
// ============================================================================
//
// The forward pass below spends nearly all its time in three places. Each is
// a virtual function of CpuMath whose default is the plain code of section 1;
// lab/fast_cpu.hpp's FastCpuMath overrides all three (and the two pass hooks,
// to choose threads per pass and to time it). A replacement must compute the
// very same floats: tests/test_cpu_speed.cpp compares them bit for bit. One
// virtual call per matmul is nothing next to the matmul.

// One matrix of a product: out [T, d] = x [T, n] times W [d, n] transposed.
struct MatmulPart {
    float* out;
    const float* W;
    int d;
};

struct CpuMath {
    virtual ~CpuMath() = default;
    // A forward pass of `macs` multiply-adds begins, and ends. The plain
    // loops need neither; a faster path decides here whether this pass is
    // worth its threads, and times it.
    virtual void begin_pass(long /*macs*/) {}
    virtual void end_pass() {}
    // Several matrices applied to the same input: out_p = x W_p^T. Wq, Wk and
    // Wv read the same normed x, and so do W1 and W3; handing them over
    // together lets a faster path run them as one parallel job.
    virtual void matmul_parts(const float* x, int T, int n, std::initializer_list<MatmulPart> parts) {
        for (const MatmulPart& p : parts) pkv::matmul(p.out, x, p.W, T, n, p.d);
    }
    // The batch's paged attention: out [T, n_heads * head_dim] for q of the
    // same shape, each token over its own context (paged_kv.cuh section 3).
    virtual void attention(float* out, const float* q, const KVView& kc, const KVView& vc, const ForwardBatch& b,
                           const AttentionShape& s) {
        paged_attention_ref(out, q, kc, vc, b.block_tables.data(), b.token_seq.data(), b.positions.data(), b.num_tokens(), s);
    }
    virtual void swiglu(float* hb, const float* hb2, size_t n) { pkv::swiglu(hb, hb2, n); }
};

// The plain path, shared: it has no state.
inline CpuMath& plain_cpu_math() {
    static CpuMath math;
    return math;
}

// The multiply-adds of one forward pass: per layer the seven matmuls and the
// attention (per key, q.k and p * v over head_dim, per head), then the
// classifier for the rows that want logits. A faster path uses it to decide
// whether a pass is big enough for threads.
inline long forward_macs(const Config& c, const ForwardBatch& b) {
    long keys = 0;
    for (int t = 0; t < b.num_tokens(); ++t) keys += b.positions[t] + 1;
    const long D = c.dim, KV = c.kv_dim(), H = c.hidden_dim;
    return c.n_layers * ((long)b.num_tokens() * D * (2 * D + 2 * KV + 3 * H) + keys * c.n_heads * c.head_dim() * 2) +
           (long)b.logits_indices.size() * D * c.vocab_size;
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


// No state but scratch: everything a sequence remembers lives in the KV
// cache, addressed through the batch's block tables. That is what lets the
// scheduler preempt, resume and mix requests freely between two calls.
struct CpuForward {
    const Model& model;
    KVCache& cache;
    CpuMath& math;  // the plain loops (plain_cpu_math) or a faster path
    // Scratch, sized for the largest batch seen. [T, ...] each:
    //   x  [T, dim]         the residual stream, token embeddings at first
    //   xb [T, dim]         a normed copy of x, later a projection's output
    //   q  [T, dim]         queries (n_heads x head_dim); never cached
    //   k, v [T, kv_dim]    this step's keys and values, on their way to slots
    //   att [T, dim]        attention output, all heads side by side
    //   hb, hb2 [T, hidden_dim]  the two SwiGLU branches
    //   cs [T, head_dim]    RoPE's (cos, sin) per pair of a head, at each token's position
    //   xl [num_logits, dim]  the final norm of the rows that want logits
    std::vector<float> x, xb, q, k, v, att, hb, hb2, cs, xl;

    CpuForward(const Model& m, KVCache& c, CpuMath& mth = plain_cpu_math()) : model(m), cache(c), math(mth) {}
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
        const AttentionShape shape{c.n_heads, c.n_kv_heads, hd, cache.geo.block_size, b.max_blocks_per_seq};
        math.begin_pass(forward_macs(c, b));

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
            math.matmul_parts(xb.data(), T, D,
                              {{q.data(), &w.wq[(size_t)l * D * D], D}, {k.data(), &w.wk[(size_t)l * KV * D], KV}, {v.data(), &w.wv[(size_t)l * KV * D], KV}});
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
            math.attention(att.data(), q.data(), kc, vc, b, shape);
            math.matmul_parts(att.data(), T, D, {{xb.data(), &w.wo[(size_t)l * D * D], D}});
            for (size_t i = 0; i < (size_t)T * D; ++i) x[i] += xb[i];

            // Feed-forward block (SwiGLU): w2(silu(w1 x) * w3 x).
            for (int t = 0; t < T; ++t) rmsnorm(&xb[(size_t)t * D], &x[(size_t)t * D], &w.rms_ffn[(size_t)l * D], D);
            math.matmul_parts(xb.data(), T, D, {{hb.data(), &w.w1[(size_t)l * H * D], H}, {hb2.data(), &w.w3[(size_t)l * H * D], H}});
            math.swiglu(hb.data(), hb2.data(), (size_t)T * H);
            math.matmul_parts(hb.data(), T, H, {{xb.data(), &w.w2[(size_t)l * D * H], D}});
            for (size_t i = 0; i < (size_t)T * D; ++i) x[i] += xb[i];
        }

        // Final norm and classifier, only where logits are wanted.
        xl.resize((size_t)NL * D);
        for (int i = 0; i < NL; ++i)
            rmsnorm(&xl[(size_t)i * D], &x[(size_t)b.logits_indices[i] * D], w.rms_final.data(), D);
        logits.resize((size_t)NL * c.vocab_size);
        math.matmul_parts(xl.data(), NL, D, {{logits.data(), model.classifier(), c.vocab_size}});
        math.end_pass();
    }
};

}  // namespace pkv

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
// chapter 2).
//
// Sections: 1. the flat batch  2. building blocks (dot, matmul, rmsnorm, RoPE)
// 3. the forward pass.
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <stdexcept>
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

// Whether a matmul should use every core. Threads never change a bit of a
// result (each output is one dot() by one thread), only how long it takes,
// and the answer depends on the machine right now:
//   - below ~256K multiply-adds a parallel region costs more than it saves;
//   - on a machine busy with other work, a parallel region waits for its
//     slowest thread, and a thread the OS has descheduled is very slow:
//     measured on the project's 2-core machine with another process running,
//     single-sequence decode with 2 threads was 2-4x *slower* than with 1.
// So above the size threshold we measure instead of guessing. Matmuls of
// different sizes behave differently (a small one is all overhead, a large
// one all bandwidth), so we keep separate figures per size class (a power of
// two of multiply-adds): the time per multiply-add of serial and of parallel
// calls. Each mode is measured twice first (the very first parallel region
// also pays for creating OpenMP's threads), then we use the faster one,
// keeping its figure as a moving average, and now and then measure the other
// mode again, taking that fresh figure as it is. A probe of the losing mode
// costs time, so while probes keep confirming the choice we probe less and
// less often (every 32, 64, ... up to 1024 calls of that size class), and
// start again at 32 when one changes it. A machine that becomes busy (or idle
// again) is followed within a few steps. One policy per process, because it
// describes the machine, not one model.
class ThreadPolicy {
public:
    static constexpr long kMinParallelMacs = 1L << 18;
    static constexpr int kMinProbeInterval = 32, kMaxProbeInterval = 1024;

    static ThreadPolicy& instance() {
        static ThreadPolicy p;
        return p;
    }
    bool use_parallel(long macs) {
        if (macs < kMinParallelMacs || max_threads() < 2) return false;
        Class& c = cls(macs);
        if (c.samples[0] < 2) return false;  // measure each mode twice first
        if (c.samples[1] < 2) return true;
        const bool best = c.ns_per_mac[1] < c.ns_per_mac[0];
        if (++c.since_probe < c.interval) return best;
        c.since_probe = 0;
        c.probing = true;
        return !best;
    }
    void record(bool parallel, long macs, double seconds) {
        if (macs < kMinParallelMacs || max_threads() < 2) return;
        Class& c = cls(macs);
        const double x = seconds * 1e9 / (double)macs;
        double& fig = c.ns_per_mac[parallel];
        if (c.samples[parallel]++ < 2) {  // the first two: keep the better
            fig = c.samples[parallel] == 1 ? x : std::min(fig, x);
            return;
        }
        const bool best_before = c.ns_per_mac[1] < c.ns_per_mac[0];
        if (!c.probing) {
            fig = 0.75 * fig + 0.25 * x;
            return;
        }
        fig = x;
        c.probing = false;
        const bool best_after = c.ns_per_mac[1] < c.ns_per_mac[0];
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
    static int class_of(long macs) {
        int k = 0;
        while (k < 63 && (macs >> (k + 1)) > 0) ++k;
        return k;
    }
    Class& cls(long macs) { return classes_[class_of(macs)]; }
    Class classes_[64];  // [floor(log2(macs))]
};

// out[t][o] = W[o] . x[t] for every token t: W is [d][n], x is [T][n], out [T][d].
// Output rows are split across OpenMP threads when ThreadPolicy says so.
// Looping tokens inside the row keeps that row of W hot in L1 while every
// token of the batch uses it -- the reason batching is cheaper per token
// (the TUTORIAL's performance chapter measures it).
inline void matmul(float* out, const float* x, const float* W, int T, int n, int d) {
    ThreadPolicy& policy = ThreadPolicy::instance();
    const long macs = (long)T * n * d;
    const bool parallel = policy.use_parallel(macs);
    const auto t0 = std::chrono::steady_clock::now();
#pragma omp parallel for schedule(static) if (parallel)
    for (int o = 0; o < d; ++o) {
        const float* row = W + (size_t)o * n;
        for (int t = 0; t < T; ++t) out[(size_t)t * d + o] = dot(row, x + (size_t)t * n, n);
    }
    policy.record(parallel, macs, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
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
// vLLM precomputes a cos/sin table per position (cos_sin_cache); we recompute
// on the CPU, and build the GPU's table with this function, so bits agree.
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
    // Scratch, sized for the largest batch seen. [T, ...] each:
    //   x  [T, dim]         the residual stream, token embeddings at first
    //   xb [T, dim]         a normed copy of x, later a projection's output
    //   q  [T, dim]         queries (n_heads x head_dim); never cached
    //   k, v [T, kv_dim]    this step's keys and values, on their way to slots
    //   att [T, dim]        attention output, all heads side by side
    //   hb, hb2 [T, hidden_dim]  the two SwiGLU branches
    std::vector<float> x, xb, q, k, v, att, hb, hb2;

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
        x.resize((size_t)T * D); xb.resize((size_t)T * D); q.resize((size_t)T * D);
        k.resize((size_t)T * KV); v.resize((size_t)T * KV); att.resize((size_t)T * D);
        hb.resize((size_t)T * H); hb2.resize((size_t)T * H);

        for (int t = 0; t < T; ++t)
            std::copy_n(w.token_embedding.data() + (size_t)b.token_ids[t] * D, D, x.data() + (size_t)t * D);

        AttentionShape shape{c.n_heads, c.n_kv_heads, hd, cache.geo.block_size, b.max_blocks_per_seq};
        for (int l = 0; l < c.n_layers; ++l) {
            // Attention block.
            for (int t = 0; t < T; ++t) rmsnorm(&xb[(size_t)t * D], &x[(size_t)t * D], &w.rms_att[(size_t)l * D], D);
            matmul(q.data(), xb.data(), &w.wq[(size_t)l * D * D], T, D, D);
            matmul(k.data(), xb.data(), &w.wk[(size_t)l * KV * D], T, D, KV);
            matmul(v.data(), xb.data(), &w.wv[(size_t)l * KV * D], T, D, KV);
            const KVView kc = cache.k_view(l);  // [num_blocks, block_size, n_kv_heads, head_dim] of the cache's dtype
            const KVView vc = cache.v_view(l);
            for (int t = 0; t < T; ++t) {
                rope(&q[(size_t)t * D], D, hd, b.positions[t]);
                rope(&k[(size_t)t * KV], KV, hd, b.positions[t]);
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
            // sequence, whatever else is in the batch. One core; only matmul is parallel.
            paged_attention_ref(att.data(), q.data(), kc, vc, b.block_tables.data(), b.token_seq.data(), b.positions.data(), T, shape);
            matmul(xb.data(), att.data(), &w.wo[(size_t)l * D * D], T, D, D);
            for (size_t i = 0; i < (size_t)T * D; ++i) x[i] += xb[i];

            // Feed-forward block (SwiGLU): w2(silu(w1 x) * w3 x), silu as run.c writes it.
            for (int t = 0; t < T; ++t) rmsnorm(&xb[(size_t)t * D], &x[(size_t)t * D], &w.rms_ffn[(size_t)l * D], D);
            matmul(hb.data(), xb.data(), &w.w1[(size_t)l * H * D], T, D, H);
            matmul(hb2.data(), xb.data(), &w.w3[(size_t)l * H * D], T, D, H);
            for (size_t i = 0; i < (size_t)T * H; ++i) {
                float val = hb[i];
                val *= (1.0f / (1.0f + std::exp(-val)));  // silu
                hb[i] = val * hb2[i];
            }
            matmul(xb.data(), hb.data(), &w.w2[(size_t)l * D * H], T, H, D);
            for (size_t i = 0; i < (size_t)T * D; ++i) x[i] += xb[i];
        }

        // Final norm and classifier, only where logits are wanted.
        const int NL = (int)b.logits_indices.size();
        std::vector<float> xl((size_t)NL * D);  // [num_logits, dim]
        for (int i = 0; i < NL; ++i)
            rmsnorm(&xl[(size_t)i * D], &x[(size_t)b.logits_indices[i] * D], w.rms_final.data(), D);
        logits.resize((size_t)NL * c.vocab_size);
        matmul(logits.data(), xl.data(), model.classifier(), NL, D, c.vocab_size);
    }
};

}  // namespace pkv

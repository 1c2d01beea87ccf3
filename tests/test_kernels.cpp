// tests/test_kernels.cpp -- every CUDA kernel against its CPU reference.
//
// The kernels are compiled twice: by g++/clang++, where cuda_shim.hpp runs them
// emulated (each block's threads as fibers on the calling thread, switched at
// every barrier: cuda_emulation.hpp), and by nvcc (`make cuda`), where they run on a GPU. This file
// is compiled both ways, so it only ever hands kernels *device* pointers
// (DeviceBuffer) and reads results back with download(). Under a `make cuda`
// binary on a machine without a GPU every test skips with a MESSAGE.
//
//   1. reshape_and_cache: exact, negative slots skipped;
//   2. paged_attention, both kernels: against paged_attention_ref on random
//      paged batches (block sizes, GQA ratios, head dims, multi-tile and
//      multi-partition contexts, f32/f16/int8 caches, NaN-poisoned unused
//      slots), the partitioned kernel's batch invariance, the shape checks;
//      then the shim itself: shfl_xor and CUDA's launch limits;
//   3. the GEMM against matmul(): bit for bit;
//   4. rmsnorm, embedding, rope, add, swiglu kernels against the CPU;
//   5. argmax_rows against argmax(), ties and -inf included;
//   6. GpuRunner against CpuRunner (built-in and a small random model), and
//      make_model_runner's choice of device;
//   7. batch invariance of the kernel path, bit for bit;
//   8. build/generate: --device emulated (or cuda) prints what --device cpu does.
//
// Emulation is slow next to the CPU forward (every barrier is a round of fiber
// switches, and far slower under TSan), so shapes are small; the suite also
// runs under ASan and TSan.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <initializer_list>
#include <memory>
#include <numeric>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "core/emu/cuda_shim.hpp"
#include "engine.hpp"
#include "paged_kv.cuh"
#include "tiny_model/forward_cpu.hpp"
#include "lab/fast_gpu.cuh"
#include "tiny_model/forward_gpu.cuh"
#include "tiny_model/model.hpp"
#include "tiny_model/sampler.hpp"
#include "tiny_model/builtin.hpp"
#include "tiny_model/tokenizer.hpp"

#include "tests/test_util.hpp"

namespace {

using namespace pkv_test;

// ---------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------

// CUDA's dim3 is global; the emulation's lives in pkv.
#ifdef __CUDACC__
using Dim3 = ::dim3;
#else
using Dim3 = pkv::dim3;
#endif

// True (after saying why) when this binary has no device to run kernels on:
// only possible for a `make cuda` binary on a machine without a GPU.
bool no_device() {
    std::string why;
    if (pkv::device_available(&why)) return false;
    skip(SkipKind::kGpu, "no GPU: " + why);
    return true;
}

// The kernel path of this build: emulated under g++/clang++, cuda under nvcc.
pkv::Device kernel_device() {
    return std::string(pkv::kDeviceKind) == "cuda" ? pkv::Device::kCuda : pkv::Device::kEmulated;
}

std::vector<float> random_floats(Rng& rng, size_t n, float lo, float hi) {
    std::vector<float> v(n);
    for (float& x : v) x = rng.uniform(lo, hi);
    return v;
}

template <class T>
pkv::DeviceBuffer<T> to_device(const std::vector<T>& v) {
    pkv::DeviceBuffer<T> b(v.size());
    b.upload(v);
    return b;
}

template <class T>
std::vector<T> to_host(const pkv::DeviceBuffer<T>& b, size_t n) {
    std::vector<T> v(n);
    b.download(v.data(), n);
    return v;
}

// ---------------------------------------------------------------------------
// Paged attention problems
// ---------------------------------------------------------------------------

// One sequence of an attention batch: keys at positions 0..len-1 are cached,
// and its query tokens sit at the last num_queries positions (num_queries > 1:
// a prefill chunk; 1: a decode).
struct SeqSpec {
    int len;
    int num_queries;
};

struct AttnProblem {
    pkv::AttentionShape s;
    int num_blocks = 0;
    int num_tokens = 0;
    std::vector<float> q;                 // [num_tokens, n_heads, head_dim]
    std::vector<float> k_cache, v_cache;  // [num_blocks, block_size, n_kv_heads, head_dim]
    std::vector<int32_t> block_tables;    // [num_seqs, max_blocks_per_seq], padded with -1
    std::vector<int32_t> token_seq, positions;
};

// A random paged batch. Every sequence's blocks are drawn from a shuffled pool,
// so block tables are scattered; 3 blocks belong to no one. Every cache float
// that no sequence wrote (those 3 blocks, the tails of last blocks) is NaN: a
// kernel that reads one produces NaN. With spike_fraction > 0, that share of
// the keys is scaled by 8, so scores jump by tens between tiles and the online
// softmax's rescaling factor gets far from 1.
AttnProblem make_attention_problem(Rng& rng, int block_size, int n_kv_heads, int group, int head_dim,
                                   const std::vector<SeqSpec>& seqs, float spike_fraction) {
    AttnProblem p;
    int need = 0, widest = 0;
    for (const SeqSpec& sp : seqs) {
        const int nb = pkv::blocks_for_tokens(sp.len, block_size);
        need += nb;
        widest = std::max(widest, nb);
    }
    p.num_blocks = need + 3;
    const int width = widest + 1;  // one -1 column, as ForwardBatch pads
    p.s = pkv::AttentionShape{n_kv_heads * group, n_kv_heads, head_dim, block_size, width};
    std::vector<int32_t> ids((size_t)p.num_blocks);
    std::iota(ids.begin(), ids.end(), 0);
    shuffle(ids, rng);
    const size_t cache_floats = (size_t)p.num_blocks * block_size * n_kv_heads * head_dim;
    p.k_cache.assign(cache_floats, kNaN);
    p.v_cache.assign(cache_floats, kNaN);
    p.block_tables.assign(seqs.size() * (size_t)width, -1);
    size_t next = 0;
    for (size_t si = 0; si < seqs.size(); ++si) {
        int32_t* row = p.block_tables.data() + si * width;
        for (int b = 0; b < pkv::blocks_for_tokens(seqs[si].len, block_size); ++b) row[b] = ids[next++];
        for (int pos = 0; pos < seqs[si].len; ++pos) {
            const float scale = rng.uniform(0.0f, 1.0f) < spike_fraction ? 8.0f : 1.0f;
            const int64_t slot = pkv::slot_of(row, pos, block_size);
            for (int h = 0; h < n_kv_heads; ++h)
                for (int d = 0; d < head_dim; ++d) {
                    const int64_t off = pkv::kv_offset(slot, h, n_kv_heads, head_dim) + d;
                    p.k_cache[(size_t)off] = scale * rng.uniform(-1.0f, 1.0f);
                    p.v_cache[(size_t)off] = rng.uniform(-1.0f, 1.0f);
                }
        }
    }
    // The flat batch: sequences in shuffled order, each one's queries together
    // at consecutive positions (a prefill chunk) or alone (a decode).
    std::vector<int> order(seqs.size());
    std::iota(order.begin(), order.end(), 0);
    shuffle(order, rng);
    for (int si : order)
        for (int i = 0; i < seqs[si].num_queries; ++i) {
            p.token_seq.push_back(si);
            p.positions.push_back(seqs[si].len - seqs[si].num_queries + i);
        }
    p.num_tokens = (int)p.positions.size();
    // q in [-3, 3], k in [-1, 1]: each score q.k / sqrt(hd) has a standard
    // deviation of about 1, so the softmax is far from uniform.
    p.q = random_floats(rng, (size_t)p.num_tokens * p.s.n_heads * head_dim, -3.0f, 3.0f);
    return p;
}

std::vector<float> run_paged_attention_kernel(const AttnProblem& p, pkv::AttentionKernel kernel) {
    const size_t n = (size_t)p.num_tokens * p.s.n_heads * p.s.head_dim;
    auto dq = to_device(p.q);
    auto dk = to_device(p.k_cache);
    auto dv = to_device(p.v_cache);
    auto dtables = to_device(p.block_tables);
    auto dseq = to_device(p.token_seq);
    auto dpos = to_device(p.positions);
    pkv::DeviceBuffer<float> dout(n);
    pkv::paged_attention(dout.data(), dq.data(), dk.data(), dv.data(), dtables.data(), dseq.data(), dpos.data(),
                         p.num_tokens, p.s, kernel);
    return to_host(dout, n);
}

constexpr pkv::AttentionKernel kBothKernels[] = {pkv::AttentionKernel::kBaseline, pkv::AttentionKernel::kPartitioned};

// The problem's caches stored in `dtype` (kv_store, as reshape_and_cache
// would), with every slot no sequence wrote poisoned: f16 NaN, int8 a NaN
// scale. Host arrays; KVViews onto them for the reference.
struct TypedCaches {
    pkv::KVDtype dtype;
    std::vector<std::byte> k, v;   // [num_blocks, block_size, n_kv_heads, head_dim] elements of dtype
    std::vector<float> ks, vs;     // [num_blocks, block_size, n_kv_heads], int8 only
    int nkv = 0, hd = 0;
    pkv::KVView k_view() { return {dtype, k.data(), ks.empty() ? nullptr : ks.data(), nkv, hd}; }
    pkv::KVView v_view() { return {dtype, v.data(), vs.empty() ? nullptr : vs.data(), nkv, hd}; }
};
TypedCaches typed_caches(const AttnProblem& p, pkv::KVDtype dtype) {
    TypedCaches c;
    c.dtype = dtype;
    c.nkv = p.s.n_kv_heads;
    c.hd = p.s.head_dim;
    const int64_t slots = (int64_t)p.num_blocks * p.s.block_size;
    const size_t elems = (size_t)slots * c.nkv * c.hd;
    c.k.resize(elems * pkv::kv_dtype_bytes(dtype));
    c.v.resize(c.k.size());
    if (dtype == pkv::KVDtype::kInt8) {
        c.ks.resize((size_t)slots * c.nkv);
        c.vs.resize(c.ks.size());
    }
    for (int64_t slot = 0; slot < slots; ++slot)
        for (int h = 0; h < c.nkv; ++h) {
            const size_t off = (size_t)pkv::kv_offset(slot, h, c.nkv, c.hd);
            for (int kv = 0; kv < 2; ++kv) {
                const float* x = (kv ? p.v_cache : p.k_cache).data() + off;
                const pkv::KVView view = kv ? c.v_view() : c.k_view();
                if (!std::isnan(x[0])) {
                    pkv::kv_store(view, slot, h, x);
                } else if (dtype == pkv::KVDtype::kF16) {
                    for (int d = 0; d < c.hd; ++d) static_cast<uint16_t*>(view.data)[off + d] = 0x7E00;  // NaN
                } else if (dtype == pkv::KVDtype::kInt8) {
                    view.scale[slot * c.nkv + h] = kNaN;
                } else {
                    for (int d = 0; d < c.hd; ++d) static_cast<float*>(view.data)[off + d] = kNaN;
                }
            }
        }
    return c;
}

// The kernel over typed caches, through device memory.
std::vector<float> run_paged_attention_typed(const AttnProblem& p, TypedCaches& c, pkv::AttentionKernel kernel,
                                             const std::vector<int32_t>& token_seq, const std::vector<int32_t>& positions,
                                             const std::vector<int32_t>& block_tables, int max_blocks_per_seq,
                                             const std::vector<float>& q) {
    const int T = (int)positions.size();
    const size_t n = (size_t)T * p.s.n_heads * p.s.head_dim;
    pkv::DeviceBuffer<std::byte> dk(c.k.size()), dv(c.v.size());
    dk.upload(c.k);
    dv.upload(c.v);
    pkv::DeviceBuffer<float> dks, dvs;
    pkv::KVView kview = c.k_view(), vview = c.v_view();
    kview.data = dk.data();
    vview.data = dv.data();
    if (!c.ks.empty()) {
        dks.upload(c.ks);
        dvs.upload(c.vs);
        kview.scale = dks.data();
        vview.scale = dvs.data();
    }
    auto dq = to_device(q);
    auto dtables = to_device(block_tables);
    auto dseq = to_device(token_seq);
    auto dpos = to_device(positions);
    pkv::DeviceBuffer<float> dout(n);
    pkv::AttentionShape s = p.s;
    s.max_blocks_per_seq = max_blocks_per_seq;
    pkv::paged_attention(dout.data(), dq.data(), kview, vview, dtables.data(), dseq.data(), dpos.data(), T, s, kernel);
    return to_host(dout, n);
}

// ---------------------------------------------------------------------------
// Model runners
// ---------------------------------------------------------------------------

// The small awkward model (test_util.hpp) with its own classifier.
pkv::Model small_random_model(uint64_t seed) { return pkv::make_random_model(small_config(false), seed); }

// Runs the same batches through a CpuRunner and the kernel runner: sequence A
// prefills 20 tokens and B 6 in one batch, then both decode `decode_steps`
// tokens, and C's 5-token prefill joins the third decode batch. Checks every
// logits row against the CPU's within `tol` (scaled by the row's largest
// logit), the greedy choices, and forward_argmax against forward's logits
// (after the last step; with all_argmax_checks also after the two prefills).
void compare_cpu_and_kernel_runners(const pkv::Model& m, int block_size, int decode_steps, uint64_t seed, double tol,
                                    bool all_argmax_checks, const pkv_test::KernelMath& math) {
    const pkv::Config& c = m.cfg;
    Rng rng(seed);
    const int num_blocks = 3 * pkv::blocks_for_tokens(20 + decode_steps + 1, block_size) + 2;
    const pkv::KVGeometry geo{c.n_layers, num_blocks, block_size, c.n_kv_heads, c.head_dim()};
    auto cpu = pkv_test::runner(m, pkv::Device::kCpu, geo);
    auto gpu = pkv_test::kernel_runner(m, geo, math);
    pkv::BlockPool pool = shuffled_pool(num_blocks, block_size, rng);
    std::vector<Seq> seqs(3);
    seqs[0].tokens = random_tokens(rng, 20, c.vocab_size);
    seqs[1].tokens = random_tokens(rng, 6, c.vocab_size);
    seqs[2].tokens = random_tokens(rng, 5, c.vocab_size);
    double worst = 0.0;  // largest |cpu - kernel| / max(1, max |logit| of the row)
    int greedy_compared = 0, near_ties = 0;
    for (int step = 0; step <= decode_steps; ++step) {
        pkv::ForwardBatch b;
        std::vector<int> rows;  // sequence of each logits row
        if (step == 0) {
            add_chunk(b, pool, seqs[0], 20);
            add_chunk(b, pool, seqs[1], 6);
            rows = {0, 1};
        } else {
            // Decodes of B then A (a different order than the prefill), and C's
            // prefill between them on step 3, then C decodes too.
            add_chunk(b, pool, seqs[1], 1);
            rows.push_back(1);
            if (step == 3) {
                add_chunk(b, pool, seqs[2], 5);
                rows.push_back(2);
            } else if (step > 3) {
                add_chunk(b, pool, seqs[2], 1);
                rows.push_back(2);
            }
            add_chunk(b, pool, seqs[0], 1);
            rows.push_back(0);
        }
        std::vector<float> lc, lg;
        cpu->forward(b, lc);
        gpu->forward(b, lg);
        const int V = c.vocab_size;
        REQUIRE(lc.size() == rows.size() * (size_t)V);
        REQUIRE(lg.size() == lc.size());
        std::vector<int32_t> greedy(rows.size());
        for (size_t r = 0; r < rows.size(); ++r) {
            const float* a = lc.data() + r * V;
            const float* g = lg.data() + r * V;
            float scale = 1.0f, diff = 0.0f;
            bool finite = true;
            for (int i = 0; i < V; ++i) {
                scale = std::max(scale, std::fabs(a[i]));
                diff = std::max(diff, std::fabs(a[i] - g[i]));
                finite = finite && std::isfinite(g[i]);
            }
            INFO("step " << step << ", logits row " << r << " (sequence " << rows[r] << ")");
            CHECK(finite);
            CHECK(diff <= tol * scale);
            worst = std::max(worst, (double)diff / scale);
            // Greedy: the same token, unless the CPU's top two are within
            // twice the tolerance (then either answer is right).
            const int ac = pkv::argmax(a, V), ag = pkv::argmax(g, V);
            float second = -kInf;
            for (int i = 0; i < V; ++i)
                if (i != ac) second = std::max(second, a[i]);
            if (a[ac] - second > 2 * tol * scale) {
                CHECK(ag == ac);
                ++greedy_compared;
            } else {
                ++near_ties;
                MESSAGE("near tie at step " << step << ": top-2 gap " << a[ac] - second << ", greedy not compared");
            }
            greedy[r] = ac;
        }
        // forward_argmax on the same batch (it rewrites the same K/V into the
        // same slots, so the cache does not change) must pick exactly argmax()
        // of forward's logits, on both runners.
        if (step == decode_steps || (all_argmax_checks && (step == 0 || step == 3))) {
            std::vector<int32_t> tg, tc;
            gpu->forward_argmax(b, tg);
            cpu->forward_argmax(b, tc);
            REQUIRE(tg.size() == rows.size());
            REQUIRE(tc.size() == rows.size());
            for (size_t r = 0; r < rows.size(); ++r) {
                CHECK(tg[r] == pkv::argmax(lg.data() + r * V, V));
                CHECK(tc[r] == greedy[r]);
            }
        }
        for (size_t r = 0; r < rows.size(); ++r) seqs[(size_t)rows[r]].tokens.push_back(greedy[r]);
    }
    CHECK(greedy_compared > 0);
    MESSAGE(std::string(pkv::kDeviceKind) << " vs cpu: largest logit difference " << worst << " x max(1, |max logit|); "
                                          << greedy_compared << " greedy choices compared, " << near_ties
                                          << " near ties skipped");
}

}  // namespace

TEST_SUITE("kernels") {

// ===========================================================================
// 1. reshape_and_cache
// ===========================================================================

// Proves reshape_and_cache puts every kv head of every token exactly where slot_of/kv_offset say, for several head counts and dims (incl. kv_dim > 128 threads), and leaves the cache untouched for slots < 0.
TEST_CASE("reshape_and_cache writes each token's K/V at its slot and skips negative slots") {
    if (no_device()) return;
    struct Shape {
        int n_kv_heads, head_dim;
    };
    const Shape shapes[] = {{1, 4}, {2, 8}, {3, 48}, {4, 64}, {2, 100}, {1, 256}};
    Rng rng(11);
    for (const Shape& sh : shapes) {
        const int nkv = sh.n_kv_heads, hd = sh.head_dim, kv_dim = nkv * hd;
        const int block_size = 4, num_blocks = 7, T = 12;
        INFO("n_kv_heads " << nkv << ", head_dim " << hd);
        std::vector<int32_t> table((size_t)num_blocks);
        std::iota(table.begin(), table.end(), 0);
        shuffle(table, rng);
        // Tokens at scattered positions of one sequence -> distinct slots.
        std::vector<int> positions((size_t)num_blocks * block_size);
        std::iota(positions.begin(), positions.end(), 0);
        shuffle(positions, rng);
        std::vector<int64_t> slots((size_t)T);
        for (int t = 0; t < T; ++t) slots[(size_t)t] = pkv::slot_of(table.data(), positions[(size_t)t], block_size);
        slots[0] = -1;  // vLLM's padding marker
        slots[5] = -7;  // any negative value means "skip"
        slots[(size_t)T - 1] = -1;
        const std::vector<float> k = random_floats(rng, (size_t)T * kv_dim, -1.0f, 1.0f);
        const std::vector<float> v = random_floats(rng, (size_t)T * kv_dim, -1.0f, 1.0f);
        // Sentinels no K/V value can equal: whatever is still there was not written.
        const size_t cache_floats = (size_t)num_blocks * block_size * kv_dim;
        std::vector<float> kc(cache_floats), vc(cache_floats);
        for (size_t i = 0; i < cache_floats; ++i) {
            kc[i] = 100.0f + (float)i;
            vc[i] = -100.0f - (float)i;
        }
        std::vector<float> want_k = kc, want_v = vc;
        for (int t = 0; t < T; ++t) {
            if (slots[(size_t)t] < 0) continue;
            for (int h = 0; h < nkv; ++h)
                for (int d = 0; d < hd; ++d) {
                    const size_t dst = (size_t)pkv::kv_offset(slots[(size_t)t], h, nkv, hd) + d;
                    want_k[dst] = k[(size_t)t * kv_dim + h * hd + d];
                    want_v[dst] = v[(size_t)t * kv_dim + h * hd + d];
                }
        }
        auto dk = to_device(k), dv = to_device(v), dkc = to_device(kc), dvc = to_device(vc);
        auto dslots = to_device(slots);
        pkv::reshape_and_cache(dk.data(), dv.data(), dkc.data(), dvc.data(), dslots.data(), T, nkv, hd);
        CHECK(first_bit_diff(to_host(dkc, cache_floats), want_k) == -1);
        CHECK(first_bit_diff(to_host(dvc, cache_floats), want_v) == -1);
        // A batch of no tokens launches nothing and changes nothing.
        pkv::reshape_and_cache(dk.data(), dv.data(), dkc.data(), dvc.data(), dslots.data(), 0, nkv, hd);
        CHECK(first_bit_diff(to_host(dkc, cache_floats), want_k) == -1);
    }
}

// ===========================================================================
// 2. paged_attention
// ===========================================================================

// Outputs of a kernel against the reference: how many are outside
// abs_tol + rel_tol * |reference| (written !(err <= tol), so a NaN or an inf
// counts as outside), the first of them, how many are not finite; worst_abs
// keeps the largest finite difference seen, across calls.
namespace {
struct Mismatches {
    size_t bad = 0, first_bad = 0, nonfinite = 0;
};
Mismatches compare_outputs(const std::vector<float>& got, const std::vector<float>& want, float abs_tol, float rel_tol,
                           float& worst_abs) {
    Mismatches m;
    for (size_t i = 0; i < got.size(); ++i) {
        if (!std::isfinite(got[i])) ++m.nonfinite;
        const float err = std::fabs(got[i] - want[i]);
        if (!(err <= abs_tol + rel_tol * std::fabs(want[i])) && m.bad++ == 0) m.first_bad = i;
        if (std::isfinite(err)) worst_abs = std::max(worst_abs, err);
    }
    return m;
}
}  // namespace

// Proves both paged_attention kernels (baseline, then partitioned) match paged_attention_ref on random mixed batches (prefill chunks + decodes, shuffled block tables) for block sizes 1/4/16, GQA 1/2/4/8, head dims 8/48/64 (and 4/128/256: the partitioned kernel's generic instantiation for 4, 48, 256), with contexts spanning several tiles and NaN in every unused cache slot.
TEST_CASE("paged_attention kernel matches paged_attention_ref") {
    if (no_device()) return;
    // Tolerance. Scores are bit-identical (both sum q.k in order of d and
    // divide by the same sqrtf). The rest differs only in rounding order: the
    // kernel's online softmax forms exp(s - m_tile) * exp(m_tile - m) where the
    // reference forms exp(s - m), and divides the accumulated sum_j p_j v_j by
    // the sum once at the end where the reference normalises each p_j first.
    // Each output is a convex combination of |v| <= 1 values, so those
    // reorderings cost a few ulp per term: for contexts of ~150 keys at most
    // ~150 * 6e-8 = 1e-5 in the worst case, ~1e-6 typically. A GPU's expf
    // (<= 2 ulp) adds ulps of the same size. 1e-5 absolute + 1e-4 relative
    // passes all of that and still catches any wrong key, scale or weight
    // (those move outputs by ~1e-2 and more).
    const float kAbsTol = 1e-5f, kRelTol = 1e-4f;
    struct Case {
        int block_size, n_kv_heads, group, head_dim;
        std::vector<SeqSpec> seqs;
        float spikes;
    };
    std::vector<Case> cases;
    Rng rng(2024);
    const int block_sizes[] = {1, 4, 16}, groups[] = {1, 2, 4, 8}, dims[] = {8, 48, 64};
    for (int di = 0; di < 3; ++di)
        for (int gi = 0; gi < 4; ++gi) {
            // Every head dim meets every block size, and so does every group.
            const int bs = block_sizes[(di + gi) % 3];
            const int tk = pkv::attention_tile_keys(groups[gi], dims[di]);
            // A prefill chunk crossing the first tile boundary, a decode 2
            // tiles and a bit in, a decode exactly at a tile boundary, and a
            // decode at position 0 or 1.
            cases.push_back({bs, 1 + rng.below(2), groups[gi], dims[di],
                             {{tk + 4, 7}, {2 * tk + 3, 1}, {tk, 1}, {1 + rng.below(2), 1}},
                             (di + gi) % 2 ? 0.1f : 0.0f});
        }
    // The other head dims, few tokens each. 256 with G = 8 is the largest
    // group the kernel takes (G * head_dim = 2048: 16 outputs per thread).
    cases.push_back({4, 3, 2, 4, {{70, 3}, {129, 1}}, 0.1f});
    cases.push_back({16, 1, 4, 128, {{40, 2}, {75, 1}}, 0.1f});
    cases.push_back({4, 2, 8, 256, {{37, 1}, {20, 2}}, 0.1f});
    cases.push_back({1, 1, 1, 256, {{35, 2}}, 0.0f});

    float worst_abs = 0.0f;
    for (size_t ci = 0; ci < cases.size(); ++ci) {
        const Case& cs = cases[ci];
        const int tk = pkv::attention_tile_keys(cs.group, cs.head_dim);
        INFO("case " << ci << ": block_size " << cs.block_size << ", n_kv_heads " << cs.n_kv_heads << ", group "
                     << cs.group << ", head_dim " << cs.head_dim << ", tile " << tk);
        int longest = 0;
        for (const SeqSpec& sp : cs.seqs) longest = std::max(longest, sp.len);
        CHECK(longest > tk);  // at least one context takes more than one tile
        const AttnProblem p =
            make_attention_problem(rng, cs.block_size, cs.n_kv_heads, cs.group, cs.head_dim, cs.seqs, cs.spikes);
        std::vector<float> want(p.q.size());
        pkv::paged_attention_ref(want.data(), p.q.data(), p.k_cache.data(), p.v_cache.data(), p.block_tables.data(),
                                 p.token_seq.data(), p.positions.data(), p.num_tokens, p.s);
        // The baseline first: tools/tsan_demo.sh runs this test to find its barrier.
        for (const pkv::AttentionKernel kernel : kBothKernels) {
            INFO("kernel " << std::string(pkv::to_string(kernel)));
            const std::vector<float> got = run_paged_attention_kernel(p, kernel);
            REQUIRE(got.size() == want.size());
            const Mismatches m = compare_outputs(got, want, kAbsTol, kRelTol, worst_abs);
            INFO("first bad element " << m.first_bad << ": kernel " << got[m.first_bad] << ", reference " << want[m.first_bad]);
            CHECK(m.nonfinite == 0);
            CHECK(m.bad == 0);
        }
    }
    MESSAGE(std::string(pkv::kDeviceKind) << " paged_attention (both kernels) vs reference: largest abs difference " << worst_abs
                                          << " over " << cases.size() << " cases");
}

// Proves paged_attention refuses shapes it cannot run (head_dim not a multiple of 4 or above 256, G * head_dim > 2048, n_heads not a multiple of n_kv_heads) with std::invalid_argument before launching anything.
TEST_CASE("paged_attention rejects unsupported shapes") {
    if (no_device()) return;
    // {n_heads, n_kv_heads, head_dim, block_size, max_blocks_per_seq}. The
    // pointers are null: the check must come before any launch.
    const pkv::AttentionShape bad_shapes[] = {
        {2, 1, 6, 4, 1},      // head_dim not a multiple of 4
        {2, 2, 2, 4, 1},      // head_dim 2
        {1, 1, 260, 4, 1},    // multiple of 4 but above 256
        {16, 1, 132, 4, 1},   // G * head_dim = 2112 > 2048
        {16, 2, 260, 4, 1},   // both
        {6, 4, 8, 4, 1},      // n_heads not a multiple of n_kv_heads
    };
    for (const pkv::AttentionKernel kernel : kBothKernels)
        for (const pkv::AttentionShape& s : bad_shapes) {
            INFO(std::string(pkv::to_string(kernel)) << ": n_heads " << s.n_heads << ", n_kv_heads " << s.n_kv_heads << ", head_dim " << s.head_dim);
            CHECK_THROWS_AS(pkv::paged_attention(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, 1, s, kernel),
                            std::invalid_argument);
        }
    // More query heads per kv head than a block has threads (G * head_dim =
    // 1032 is fine, so this is the G check alone), and a table too wide for
    // the partitioned grid; each message says what was wrong.
    for (const pkv::AttentionKernel kernel : kBothKernels)
        CHECK_THROWS_WITH_AS(pkv::paged_attention(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, 1,
                                                  pkv::AttentionShape{129, 1, 8, 4, 1}, kernel),
                             doctest::Contains("at most 128"), std::invalid_argument);
    CHECK_THROWS_WITH_AS(pkv::paged_attention(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, 1,
                                              pkv::AttentionShape{2, 1, 8, 512, 65536}),
                         doctest::Contains("65535 partitions"), std::invalid_argument);
    CHECK_THROWS_WITH_AS(pkv::paged_attention(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, 1,
                                              pkv::AttentionShape{2, 1, 6, 4, 1}),
                         doctest::Contains("head_dim 6"), std::invalid_argument);
    CHECK(std::string(pkv::to_string(pkv::AttentionKernel::kBaseline)) == "baseline");
    CHECK(std::string(pkv::to_string(pkv::AttentionKernel::kPartitioned)) == "partitioned");
}

// Proves the partitioned kernel matches paged_attention_ref over f32, f16 and int8 caches, GQA groups 1/2/4/8/16 (16: two passes over the heads), head dims 8/16/32/64/128, block sizes 1/4/16, for contexts of 1, 511, 512, 513 and (head_dim <= 32) 2000 keys -- one partition, exactly one, one key into a second, four ragged -- and a prefill chunk straddling the partition boundary, with NaN in every unused slot.
TEST_CASE("partitioned paged_attention matches paged_attention_ref across partitions and dtypes") {
    if (no_device()) return;
    // The same tolerance as the test above, for the same reasons; the
    // reference reads the dequantized values the kernel reads, so the cache's
    // dtype changes the numbers, not the agreement.
    const float kAbsTol = 1e-5f, kRelTol = 1e-4f;
    REQUIRE(pkv::kPartitionKeys == 512);  // the contexts below are chosen around it
    struct Case {
        int group, head_dim, block_size;
        pkv::KVDtype dtype;
    };
    const Case cases[] = {
        {1, 128, 16, pkv::KVDtype::kF32}, {2, 64, 4, pkv::KVDtype::kF16},  {4, 16, 16, pkv::KVDtype::kInt8},
        {8, 8, 1, pkv::KVDtype::kF32},    {2, 32, 16, pkv::KVDtype::kInt8}, {16, 8, 4, pkv::KVDtype::kF16},
    };
    // Decodes at contexts 1, 511, 512 and a 3-token chunk at positions
    // 510..512 (contexts 511, 512, 513); a decode at 2000 (four partitions,
    // the last ragged) where the head_dim is small: emulated, a key costs
    // log2(head_dim / 4) meetings of a warp, and head_dim 64 and 128 have
    // the most.
    Rng rng(4242);
    float worst_abs = 0.0f;
    for (const Case& cs : cases) {
        INFO("group " << cs.group << ", head_dim " << cs.head_dim << ", block_size " << cs.block_size << ", dtype "
                      << pkv::to_string(cs.dtype));
        std::vector<SeqSpec> seqs = {{1, 1}, {511, 1}, {512, 1}, {513, 3}};
        if (cs.head_dim <= 32) seqs.push_back({2000, 1});
        const AttnProblem p = make_attention_problem(rng, cs.block_size, 1, cs.group, cs.head_dim, seqs, 0.05f);
        TypedCaches c = typed_caches(p, cs.dtype);
        std::vector<float> want(p.q.size());
        pkv::paged_attention_ref(want.data(), p.q.data(), c.k_view(), c.v_view(), p.block_tables.data(), p.token_seq.data(),
                                 p.positions.data(), p.num_tokens, p.s);
        const std::vector<float> got = run_paged_attention_typed(p, c, pkv::AttentionKernel::kPartitioned, p.token_seq,
                                                                 p.positions, p.block_tables, p.s.max_blocks_per_seq, p.q);
        REQUIRE(got.size() == want.size());
        const Mismatches m = compare_outputs(got, want, kAbsTol, kRelTol, worst_abs);
        INFO("first bad element " << m.first_bad << ": kernel " << got[m.first_bad] << ", reference " << want[m.first_bad]);
        CHECK(m.nonfinite == 0);
        CHECK(m.bad == 0);
    }
    MESSAGE(std::string(pkv::kDeviceKind) << " partitioned paged_attention vs reference, 1..2000 keys: largest abs difference "
                                          << worst_abs);
}

// Proves a token's partitioned attention output is bit-identical whether it is computed alone, inside a batch of other tokens (decodes and a prefill chunk, other contexts, another order), or with a wider block table (more partition blocks launched), for contexts of 1 partition, exactly 2, and ragged 3 and 4.
TEST_CASE("partitioned paged_attention is batch-invariant bit for bit") {
    if (no_device()) return;
    Rng rng(777);
    // Contexts: 1, 300 (one partition), 1024 (exactly two), 1100 and 1537
    // (ragged), and a chunk of 3 queries at positions 697..699.
    const std::vector<SeqSpec> seqs = {{1, 1}, {300, 1}, {1024, 1}, {1100, 1}, {1537, 1}, {700, 3}};
    const AttnProblem p = make_attention_problem(rng, 16, 2, 2, 16, seqs, 0.05f);
    TypedCaches c = typed_caches(p, pkv::KVDtype::kF32);
    const auto K = pkv::AttentionKernel::kPartitioned;
    const size_t per_tok = (size_t)p.s.n_heads * p.s.head_dim;
    const std::vector<float> batch =
        run_paged_attention_typed(p, c, K, p.token_seq, p.positions, p.block_tables, p.s.max_blocks_per_seq, p.q);
    // The same batch with every table row 40 blocks wider (-1 padded): more
    // partitions are launched, and the extra ones must change nothing.
    const int wide = p.s.max_blocks_per_seq + 40;
    std::vector<int32_t> wide_tables(seqs.size() * (size_t)wide, -1);
    for (size_t si = 0; si < seqs.size(); ++si)
        std::copy_n(&p.block_tables[si * p.s.max_blocks_per_seq], p.s.max_blocks_per_seq, &wide_tables[si * wide]);
    const std::vector<float> batch_wide = run_paged_attention_typed(p, c, K, p.token_seq, p.positions, wide_tables, wide, p.q);
    CHECK(first_bit_diff(batch, batch_wide) == -1);
    int compared = 0;
    for (int t = 0; t < p.num_tokens; ++t) {
        INFO("token " << t << " at position " << p.positions[(size_t)t]);
        const std::vector<float> q1(p.q.begin() + (std::ptrdiff_t)(t * per_tok), p.q.begin() + (std::ptrdiff_t)((t + 1) * per_tok));
        const std::vector<float> alone = run_paged_attention_typed(p, c, K, {p.token_seq[(size_t)t]}, {p.positions[(size_t)t]},
                                                                   p.block_tables, p.s.max_blocks_per_seq, q1);
        const std::vector<float> in_batch(batch.begin() + (std::ptrdiff_t)(t * per_tok), batch.begin() + (std::ptrdiff_t)((t + 1) * per_tok));
        CHECK(first_bit_diff(alone, in_batch) == -1);
        ++compared;
    }
    CHECK(compared == 8);
    // The rows are real: different tokens give different outputs.
    CHECK(first_bit_diff(std::vector<float>(batch.begin(), batch.begin() + (std::ptrdiff_t)per_tok),
                         std::vector<float>(batch.begin() + (std::ptrdiff_t)per_tok, batch.begin() + (std::ptrdiff_t)(2 * per_tok))) != -1);
}

// ===========================================================================
// 2b. The shim: warp shuffles and launch limits
// ===========================================================================

// Every lane of the block runs every shuffle: xor partners for each lane mask,
// the same inside segments of 8 lanes (a later segment gives a lane its own
// value back), and a butterfly sum of floats whose bits every lane must share.
template <class = void>
PKV_KERNEL void shuffle_test_kernel(int* xor_out,    // [5, nthreads]   lane masks 1, 2, 4, 8, 16
                                    int* seg_out,    // [2, nthreads]   width 8, lane masks 8 and 2
                                    float* sum_out) {  // [nthreads]      butterfly sum over the warp
    using namespace pkv;
    const int tid = (int)(threadIdx.x + threadIdx.y * blockDim.x), n = (int)(blockDim.x * blockDim.y);
    for (int k = 0; k < 5; ++k) xor_out[k * n + tid] = shfl_xor(tid * 10, 1 << k);
    seg_out[tid] = shfl_xor(tid * 10, 8, 8);
    seg_out[n + tid] = shfl_xor(tid * 10, 2, 8);
    // Values whose sum depends on the order of addition.
    float v = 1.0f / (float)(tid + 3) + (tid % 7 == 0 ? 1e4f : 0.0f);
    for (int mask = 16; mask >= 1; mask >>= 1) v += shfl_xor(v, mask);
    sum_out[tid] = v;
}

// Proves shfl_xor gives each lane its xor partner's value for every lane mask (and its own value when the partner lies in a later segment of `width` lanes), separately per warp of a 2-D block, and that a butterfly sum leaves bit-identical totals in all 32 lanes, as CUDA's __shfl_xor_sync does.
TEST_CASE("shfl_xor exchanges values as __shfl_xor_sync does") {
    if (no_device()) return;
    const int bx = 32, by = 3, n = bx * by;  // three warps, in a 2-D block: lanes follow the linear thread index
    pkv::DeviceBuffer<int> dx(5 * (size_t)n), ds(2 * (size_t)n);
    pkv::DeviceBuffer<float> dsum((size_t)n);
    pkv::launch(shuffle_test_kernel<>, Dim3(1), Dim3(bx, by), 0, dx.data(), ds.data(), dsum.data());
    const std::vector<int> x = to_host(dx, 5 * (size_t)n), sg = to_host(ds, 2 * (size_t)n);
    const std::vector<float> sum = to_host(dsum, (size_t)n);
    int wrong = 0;
    for (int tid = 0; tid < n; ++tid) {
        for (int k = 0; k < 5; ++k) wrong += x[(size_t)(k * n + tid)] != (tid ^ (1 << k)) * 10;
        const int lane = tid % 32;
        // width 8, mask 8: segments 0, 2 reach into 1, 3 (later: own value); 1, 3 into 0, 2 (earlier: allowed).
        const int want8 = (lane / 8) % 2 == 0 ? tid * 10 : (tid ^ 8) * 10;
        wrong += sg[(size_t)tid] != want8;
        wrong += sg[(size_t)(n + tid)] != (tid ^ 2) * 10;  // inside the segment
        wrong += first_bit_diff(std::vector<float>{sum[(size_t)tid]}, std::vector<float>{sum[(size_t)(tid / 32 * 32)]}) != -1;
    }
    CHECK(wrong == 0);
    // The warps summed separately: warp 0's total is not warp 1's.
    CHECK(sum[0] != sum[32]);
}

template <int Tag>
PKV_KERNEL void touch_shared_kernel(int* out, int bytes) {  // every thread writes and reads back its share of shared memory
    unsigned char* sm = pkv::shared_memory<unsigned char>();
    using namespace pkv;
    const int tid = (int)(threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z));
    const int n = (int)(blockDim.x * blockDim.y * blockDim.z);
    for (int i = tid; i < bytes; i += n) sm[i] = (unsigned char)(i * 7);
    pkv::syncthreads();
    int bad = 0;
    for (int i = tid; i < bytes; i += n) bad += sm[(i + 1) % bytes] != (unsigned char)(((i + 1) % bytes) * 7);
    if (bad) out[0] = 1;
}

// Proves launch() refuses, in both worlds and before running anything, what a GPU would refuse -- more than 1024 threads per block, block x or y above 1024 or z above 64, an empty block, grid x at 2^31 or y/z above 65535, and dynamic shared memory above 48 KiB without an opt-in -- naming the limit; that the limits themselves launch; and that set_max_dynamic_shared_memory lets exactly the kernel that opted in use more, up to the device's ceiling.
TEST_CASE("launch enforces CUDA's launch limits in both worlds") {
    using pkv::launch;
    auto k0 = touch_shared_kernel<0>;
    int* none = nullptr;
    struct Bad {
        Dim3 grid, block;
        size_t shared;
        const char* says;
    };
    const Bad bad[] = {
        {Dim3(1), Dim3(1025), 0, "at most 1024"},          // too many threads
        {Dim3(1), Dim3(1024, 2), 0, "1..1024 threads"},    // 2048 threads
        {Dim3(1), Dim3(1, 1025), 0, "y at most 1024"},     // y too large (and too many)
        {Dim3(1), Dim3(1, 1, 65), 0, "z at most 64"},      // z too large
        {Dim3(1), Dim3(0), 0, "1..1024 threads"},          // no thread at all
        {Dim3(2147483648u), Dim3(32), 0, "2^31 - 1"},      // grid x
        {Dim3(1, 65536), Dim3(32), 0, "65535"},            // grid y
        {Dim3(1, 1, 65536), Dim3(32), 0, "65535"},         // grid z
        {Dim3(1), Dim3(32), 48 * 1024 + 1, "opt-in"},      // shared memory
    };
    for (const Bad& b : bad) {
        INFO("grid (" << b.grid.x << ", " << b.grid.y << ", " << b.grid.z << "), block (" << b.block.x << ", " << b.block.y << ", "
                      << b.block.z << "), shared " << b.shared);
        CHECK_THROWS_WITH_AS(launch(k0, b.grid, b.block, b.shared, none, 0), doctest::Contains(b.says), std::invalid_argument);
    }
    if (no_device()) return;
    pkv::DeviceBuffer<int> flag(1);
    const int zero = 0;
    flag.upload(&zero, 1);
    // At the limits: 48 KiB exactly, z = 64, grid y = 65535 (blocks of one thread, nothing to do).
    launch(k0, Dim3(1), Dim3(128), 48 * 1024, flag.data(), 48 * 1024);
    launch(k0, Dim3(1), Dim3(1, 1, 64), 64, flag.data(), 64);
    launch(k0, Dim3(1, 65535), Dim3(1), 0, flag.data(), 0);
    // An opt-in lets this kernel (and only it) take 64 KiB; more than any
    // device's ceiling is refused at the opt-in.
    auto k1 = touch_shared_kernel<1>;
    CHECK_THROWS_AS(pkv::set_max_dynamic_shared_memory(k1, 1 << 20), std::invalid_argument);
    pkv::set_max_dynamic_shared_memory(k1, 64 * 1024);
    CHECK(pkv::max_dynamic_shared_bytes(reinterpret_cast<const void*>(k1)) == 64 * 1024);
    launch(k1, Dim3(2), Dim3(128), 64 * 1024, flag.data(), 64 * 1024);
    CHECK_THROWS_AS(launch(k1, Dim3(1), Dim3(128), 64 * 1024 + 1, flag.data(), 0), std::invalid_argument);
    CHECK_THROWS_AS(launch(k0, Dim3(1), Dim3(128), 64 * 1024, flag.data(), 0), std::invalid_argument);
    int got = -1;
    flag.download(&got, 1);
    CHECK(got == 0);  // every launch that ran read back what it wrote
}

#ifndef __CUDACC__
// Emulation only (a GPU thread cannot throw): a kernel in which some threads
// throw between two barriers. Those threads leave the block's barriers, the
// others run to the end instead of waiting forever, and the first exception
// comes back to the host from launch().
PKV_KERNEL void throwing_kernel(int* out, int thrower) {
    const int tid = (int)pkv::threadIdx.x;
    pkv::syncthreads();
    if (tid % 4 == thrower) throw std::runtime_error("thread " + std::to_string(tid) + " threw");
    pkv::syncthreads();
    out[tid] = 1;
}

// Proves a throwing emulated kernel thread neither hangs the launch nor ends
// the program: launch() rethrows on the host, the threads that did not throw
// finished, and the next launch runs normally.
TEST_CASE("a kernel thread that throws: the launch rethrows it on the host") {
    std::vector<int> out(32, 0);
    CHECK_THROWS_WITH_AS(pkv::launch(throwing_kernel, pkv::dim3(2), pkv::dim3(32), 64, out.data(), 1),
                         doctest::Contains("threw"), std::runtime_error);
    int finished = 0;
    for (int i = 0; i < 32; ++i) finished += out[i];
    CHECK(finished == 24);  // every thread but 1, 5, 9, ..., 29
    std::fill(out.begin(), out.end(), 0);
    pkv::launch(throwing_kernel, pkv::dim3(2), pkv::dim3(32), 64, out.data(), -1);  // nobody throws
    CHECK(std::count(out.begin(), out.end(), 1) == 32);
}

// Proves the emulated shfl_xor refuses a block whose last warp is partial
// (CUDA's full mask would name lanes that do not exist) with a message, and
// that a launch of whole warps afterwards shuffles normally.
TEST_CASE("emulated shfl_xor needs whole warps") {
    const int n = 48;
    std::vector<int> x(5 * n), sg(2 * n);
    std::vector<float> sum(n);
    CHECK_THROWS_WITH_AS(pkv::launch(shuffle_test_kernel<>, pkv::dim3(1), pkv::dim3(n), 0, x.data(), sg.data(), sum.data()),
                         doctest::Contains("multiple of 32"), std::logic_error);
    std::vector<int> x2(5 * 32), sg2(2 * 32);
    std::vector<float> sum2(32);
    pkv::launch(shuffle_test_kernel<>, pkv::dim3(1), pkv::dim3(32), 0, x2.data(), sg2.data(), sum2.data());
    CHECK(x2[0] == 10);  // lane 0's partner under mask 1 is lane 1
}

// Breaks the barrier rule on purpose: threads from `quit` on return before the
// block's barrier; with `shuffle`, lane 0 of each warp skips the shuffle.
PKV_KERNEL void skip_barrier_kernel(int* out, int quit, int shuffle) {
    const int tid = (int)pkv::threadIdx.x;
    if (shuffle) {
        if (tid % 32 != 0) out[tid] = pkv::shfl_xor(tid, 1);
        return;
    }
    if (tid >= quit) return;
    pkv::syncthreads();
    out[tid] = 1;
}

// Proves a thread that skips a barrier the others wait at makes the emulated launch throw a logic_error that names the waiting threads and the returned ones (the thread-per-CUDA-thread emulation hung there), for syncthreads() and for shfl_xor, and that the next launch runs normally.
TEST_CASE("a skipped barrier: the emulated launch throws instead of hanging") {
    std::vector<int> out(64, 0);
    CHECK_THROWS_WITH_AS(pkv::launch(skip_barrier_kernel, pkv::dim3(3), pkv::dim3(64), 0, out.data(), 48, 0),
                         doctest::Contains("block (0, 0, 0) can go no further: 48 thread(s) wait at syncthreads() "
                                           "(threads 0, 1, 2, 3, 4, 5, 6, 7, ...); 16 returned from the kernel (threads 48, 49,"),
                         std::logic_error);
    CHECK_THROWS_WITH_AS(pkv::launch(skip_barrier_kernel, pkv::dim3(1), pkv::dim3(64), 0, out.data(), 64, 1),
                         doctest::Contains("62 thread(s) wait at a shfl_xor (threads 1, 2, 3,"), std::logic_error);
    std::fill(out.begin(), out.end(), 0);
    pkv::launch(skip_barrier_kernel, pkv::dim3(3), pkv::dim3(64), 0, out.data(), 64, 0);  // nobody skips
    CHECK(std::count(out.begin(), out.end(), 1) == 64);
}

// Each block reverses its blockDim.x values through shared memory.
PKV_KERNEL void reverse_block_kernel(int* data) {
    int* sm = pkv::shared_memory<int>();
    const unsigned t = pkv::threadIdx.x, n = pkv::blockDim.x, base = pkv::blockIdx.x * n;
    sm[t] = data[base + t];
    pkv::syncthreads();
    data[base + t] = sm[n - 1 - t];
}

// Proves two host threads may launch emulated kernels at the same time (each runs its blocks on its own fibers, barriers and shared memory) and each gets exactly its own result: 51 reversals of every block, with blocks of 64 and 96 threads.
TEST_CASE("two host threads launch emulated kernels at the same time") {
    const int blocks = 5, reps = 51;
    auto worker = [&](unsigned n, std::vector<int>* data) {
        for (int r = 0; r < reps; ++r) pkv::launch(reverse_block_kernel, pkv::dim3(blocks), pkv::dim3(n), n * sizeof(int), data->data());
    };
    std::vector<int> a(blocks * 64), b(blocks * 96);
    std::iota(a.begin(), a.end(), 0);
    std::iota(b.begin(), b.end(), 1000);
    std::thread ta(worker, 64u, &a), tb(worker, 96u, &b);
    ta.join();
    tb.join();
    int wrong = 0;
    for (int i = 0; i < blocks * 64; ++i) wrong += a[(size_t)i] != i / 64 * 64 + (63 - i % 64);
    for (int i = 0; i < blocks * 96; ++i) wrong += b[(size_t)i] != 1000 + i / 96 * 96 + (95 - i % 96);
    CHECK(wrong == 0);
}
#endif

// ===========================================================================
// 3. The GEMM
// ===========================================================================

// Proves gemm_tiled() computes bit for bit what matmul()/dot() do, for token counts 1/3/4/5/9 and widths that are not multiples of 8, 32 or 128 (and that a naive in-order sum would differ, so the check has teeth).
TEST_CASE("gemm is bit-identical to matmul") {
    if (no_device()) return;
    // {T, n (input width), d (outputs)}. n % 8 != 0 exercises the leftover
    // terms, n % 32 != 0 a short last K tile, n < 8 no tile at all; d % 128 != 0
    // a partly idle block, T % 4 != 0 a partly empty token group.
    const int shapes[][3] = {{1, 1, 1},    {1, 7, 5},     {3, 8, 3},    {4, 13, 129}, {5, 32, 128},
                             {9, 33, 127}, {1, 40, 300},  {3, 100, 17}, {5, 257, 130}, {9, 72, 256},
                             {4, 31, 1},   {1, 128, 300}, {3, 384, 128}};
    Rng rng(7);
    int naive_differs = 0;
    for (const auto& sh : shapes) {
        const int T = sh[0], n = sh[1], d = sh[2];
        INFO("T " << T << ", n " << n << ", d " << d);
        const std::vector<float> x = random_floats(rng, (size_t)T * n, -1.0f, 1.0f);
        const std::vector<float> W = random_floats(rng, (size_t)d * n, -1.0f, 1.0f);
        std::vector<float> want((size_t)T * d);
        pkv::matmul(want.data(), x.data(), W.data(), T, n, d);
        auto dx = to_device(x), dW = to_device(W);
        pkv::DeviceBuffer<float> dout((size_t)T * d);
        pkv::gemm_tiled(dout.data(), dx.data(), dW.data(), T, n, d);
        // Exact under emulation (same C++ operations in the same order) and on
        // a GPU built with --fmad=false (IEEE adds and multiplies, no fusing).
        const long diff = first_bit_diff(to_host(dout, want.size()), want);
        CHECK(diff == -1);
        for (int t = 0; t < T; ++t)
            for (int o = 0; o < d; ++o) {
                float s = 0.0f;
                for (int j = 0; j < n; ++j) s += W[(size_t)o * n + j] * x[(size_t)t * n + j];
                naive_differs += s != want[(size_t)t * d + o];
            }
    }
    CHECK(naive_differs > 0);  // summation order shows in the bits: exactness is not luck
}

// ===========================================================================
// 4. Elementwise and row kernels
// ===========================================================================

// Proves rmsnorm_kernel is bit-identical to rmsnorm(), both on consecutive rows and on rows picked by an index array (the final norm of logits rows), for dims below and above the 128-thread block.
TEST_CASE("rmsnorm_kernel is bit-identical to rmsnorm") {
    if (no_device()) return;
    Rng rng(3);
    for (int dim : {1, 7, 48, 128, 300}) {
        INFO("dim " << dim);
        const int R = 5;
        const std::vector<float> x = random_floats(rng, (size_t)R * dim, -4.0f, 4.0f);
        const std::vector<float> w = random_floats(rng, (size_t)dim, 0.5f, 1.5f);
        auto dx = to_device(x), dw = to_device(w);
        // All rows, in order.
        std::vector<float> want((size_t)R * dim);
        for (int r = 0; r < R; ++r) pkv::rmsnorm(&want[(size_t)r * dim], &x[(size_t)r * dim], w.data(), dim);
        pkv::DeviceBuffer<float> dout((size_t)R * dim);
        pkv::launch(pkv::rmsnorm_kernel<>, Dim3(R), Dim3(128), 0, dout.data(), (const float*)dx.data(),
                    (const float*)dw.data(), (const int32_t*)nullptr, dim);
        CHECK(first_bit_diff(to_host(dout, want.size()), want) == -1);
        // Rows by index: repeated, out of order, a subset.
        const std::vector<int32_t> rows = {3, 0, 3, 4};
        const int NR = (int)rows.size();
        std::vector<float> want_rows((size_t)NR * dim);
        for (int i = 0; i < NR; ++i) pkv::rmsnorm(&want_rows[(size_t)i * dim], &x[(size_t)rows[(size_t)i] * dim], w.data(), dim);
        auto drows = to_device(rows);
        pkv::DeviceBuffer<float> dout_rows((size_t)NR * dim);
        pkv::launch(pkv::rmsnorm_kernel<>, Dim3(NR), Dim3(128), 0, dout_rows.data(), (const float*)dx.data(),
                    (const float*)dw.data(), (const int32_t*)drows.data(), dim);
        CHECK(first_bit_diff(to_host(dout_rows, want_rows.size()), want_rows) == -1);
    }
}

// Proves embedding_kernel copies exactly the embedding row of each token id (first, last, repeated ids; dim above 128).
TEST_CASE("embedding_kernel copies the token rows") {
    if (no_device()) return;
    Rng rng(5);
    const int V = 37, dim = 200;
    const std::vector<float> emb = random_floats(rng, (size_t)V * dim, -1.0f, 1.0f);
    const std::vector<int32_t> tokens = {0, V - 1, 5, 5, 17, 0, 36, 2};
    const int T = (int)tokens.size();
    std::vector<float> want((size_t)T * dim);
    for (int t = 0; t < T; ++t) std::copy_n(&emb[(size_t)tokens[(size_t)t] * dim], dim, &want[(size_t)t * dim]);
    auto demb = to_device(emb);
    auto dtok = to_device(tokens);
    pkv::DeviceBuffer<float> dx((size_t)T * dim);
    pkv::launch(pkv::embedding_kernel<>, Dim3(T), Dim3(128), 0, dx.data(), (const float*)demb.data(),
                (const int32_t*)dtok.data(), dim);
    CHECK(first_bit_diff(to_host(dx, want.size()), want) == -1);
}

// Proves rope_kernel, fed the (cos, sin) table GpuRunner builds with rope_cos_sin, rotates q and k bit-identically to rope() at each token's position, for head dims 4/8/16/64 and GQA shapes (pairs beyond 128 threads included).
TEST_CASE("rope_kernel is bit-identical to rope") {
    if (no_device()) return;
    struct Shape {
        int n_heads, n_kv_heads, head_dim;
    };
    const Shape shapes[] = {{6, 2, 8}, {8, 4, 16}, {8, 4, 64}, {3, 3, 4}};
    Rng rng(9);
    for (const Shape& sh : shapes) {
        const int hd = sh.head_dim, q_dim = sh.n_heads * hd, k_dim = sh.n_kv_heads * hd;
        INFO("n_heads " << sh.n_heads << ", n_kv_heads " << sh.n_kv_heads << ", head_dim " << hd);
        const std::vector<int32_t> positions = {0, 1, 7, 100, 1023, 5};
        const int T = (int)positions.size();
        const std::vector<float> q = random_floats(rng, (size_t)T * q_dim, -2.0f, 2.0f);
        const std::vector<float> k = random_floats(rng, (size_t)T * k_dim, -2.0f, 2.0f);
        // The table exactly as GpuRunner::run makes it: [T, hd / 2, 2].
        std::vector<float> cs((size_t)T * hd);
        for (int t = 0; t < T; ++t)
            for (int i = 0; i < hd; i += 2)
                pkv::rope_cos_sin(positions[(size_t)t], i, hd, cs[(size_t)t * hd + i], cs[(size_t)t * hd + i + 1]);
        std::vector<float> want_q = q, want_k = k;
        for (int t = 0; t < T; ++t) {
            pkv::rope(&want_q[(size_t)t * q_dim], q_dim, hd, positions[(size_t)t]);
            pkv::rope(&want_k[(size_t)t * k_dim], k_dim, hd, positions[(size_t)t]);
        }
        auto dq = to_device(q), dk = to_device(k), dcs = to_device(cs);
        pkv::launch(pkv::rope_kernel<>, Dim3(T), Dim3(128), 0, dq.data(), dk.data(), (const float*)dcs.data(), q_dim, k_dim, hd);
        CHECK(first_bit_diff(to_host(dq, want_q.size()), want_q) == -1);
        CHECK(first_bit_diff(to_host(dk, want_k.size()), want_k) == -1);
        CHECK(first_bit_diff(q, want_q) != -1);  // the rotation did something
    }
}

// Proves add_kernel adds exactly and swiglu_kernel computes the CPU forward's silu(a) * b (bit for bit emulated, within 1e-6 relative on a GPU), over lengths with a partial last block and extreme inputs.
TEST_CASE("add_kernel and swiglu_kernel match the CPU") {
    if (no_device()) return;
    Rng rng(13);
    for (int n : {1, 255, 256, 777}) {
        INFO("n " << n);
        const int blocks = (n + 255) / 256;
        std::vector<float> x = random_floats(rng, (size_t)n, -10.0f, 10.0f);
        const std::vector<float> y = random_floats(rng, (size_t)n, -10.0f, 10.0f);
        // Extremes: expf(100) overflows to inf (silu -> -0), expf(-100) underflows.
        x[0] = -100.0f;
        if (n > 2) { x[1] = 100.0f; x[2] = 0.0f; }
        // add: x + y, one IEEE add per element, exact in both worlds.
        std::vector<float> want_add((size_t)n);
        for (int i = 0; i < n; ++i) want_add[(size_t)i] = x[(size_t)i] + y[(size_t)i];
        auto dx = to_device(x), dy = to_device(y);
        pkv::launch(pkv::add_kernel<>, Dim3(blocks), Dim3(256), 0, dx.data(), (const float*)dy.data(), n);
        CHECK(first_bit_diff(to_host(dx, (size_t)n), want_add) == -1);
        // swiglu: exactly CpuForward's loop.
        std::vector<float> want((size_t)n);
        for (int i = 0; i < n; ++i) {
            float val = x[(size_t)i];
            val *= (1.0f / (1.0f + std::exp(-val)));
            want[(size_t)i] = val * y[(size_t)i];
        }
        auto dhb = to_device(x);
        pkv::launch(pkv::swiglu_kernel<>, Dim3(blocks), Dim3(256), 0, dhb.data(), (const float*)dy.data(), n);
        const std::vector<float> got = to_host(dhb, (size_t)n);
#ifdef __CUDACC__
        // CUDA's expf is within 2 ulp of the exact value, glibc's within 1:
        // after one divide and two multiplies that is < 1e-6 relative.
        size_t bad = 0;
        for (int i = 0; i < n; ++i)
            bad += !(std::fabs(got[(size_t)i] - want[(size_t)i]) <= 1e-6f * std::fabs(want[(size_t)i]) + 1e-30f);
        CHECK(bad == 0);
#else
        // Emulated, the kernel calls the very same glibc expf.
        CHECK(first_bit_diff(got, want) == -1);
#endif
    }
}

// ===========================================================================
// 5. argmax_rows
// ===========================================================================

// Proves argmax_rows equals argmax() (lowest index wins ties) on random rows, ties inside one thread's strided slice and across threads, all-equal and all -inf rows, for vocab sizes below and above the 256-thread block.
TEST_CASE("argmax_rows matches argmax, ties and -inf included") {
    if (no_device()) return;
    Rng rng(17);
    for (int V : {1, 5, 255, 256, 257, 1000, 3000}) {
        INFO("V " << V);
        std::vector<std::vector<float>> rows;
        for (int r = 0; r < 3; ++r) rows.push_back(random_floats(rng, (size_t)V, -5.0f, 5.0f));
        // Ties at the given indices (those < V), with the maximum value 9.
        auto tie_row = [&](std::initializer_list<int> at) {
            std::vector<float> row = random_floats(rng, (size_t)V, -5.0f, 5.0f);
            for (int i : at)
                if (i >= 0 && i < V) row[(size_t)i] = 9.0f;
            rows.push_back(row);
        };
        tie_row({700, 444, 188});   // one thread's slice (all = 188 mod 256): 188 wins
        tie_row({513, 2});          // threads 1 and 2: the higher thread holds the lower index
        tie_row({256, 255});        // threads 0 and 255: 255 wins
        tie_row({2999, 999, 4, 3}); // far apart, 3 wins
        tie_row({V - 1, V - 2});    // at the end
        rows.push_back(std::vector<float>((size_t)V, 0.0f));    // all equal: 0
        rows.push_back(std::vector<float>((size_t)V, -kInf));   // all -inf: 0, like argmax()
        {
            std::vector<float> row((size_t)V, -kInf);  // -inf except one finite value at the end
            row[(size_t)V - 1] = -1e30f;
            rows.push_back(row);
        }
        {
            std::vector<float> row = random_floats(rng, (size_t)V, -5.0f, -1.0f);  // all negative, some -inf
            for (int i = 0; i < V; i += 3) row[(size_t)i] = -kInf;
            rows.push_back(row);
        }
        const int R = (int)rows.size();
        std::vector<float> flat;
        for (const auto& row : rows) flat.insert(flat.end(), row.begin(), row.end());
        auto dlogits = to_device(flat);
        pkv::DeviceBuffer<int32_t> dout((size_t)R);
        pkv::argmax_rows(dout.data(), dlogits.data(), R, V);
        const std::vector<int32_t> got = to_host(dout, (size_t)R);
        for (int r = 0; r < R; ++r) {
            INFO("row " << r);
            CHECK(got[(size_t)r] == pkv::argmax(rows[(size_t)r].data(), V));
        }
        if (V >= 1000) {  // spot-check that the tie rows test what they claim
            CHECK(got[3] == 188);
            CHECK(got[4] == 2);
            CHECK(got[5] == 255);
            CHECK(got[6] == 3);
        }
    }
}

// ===========================================================================
// 6. GpuRunner against CpuRunner, and make_model_runner
// ===========================================================================

// Tolerance for logits, relative to max(1, the row's largest |logit|). The two
// paths share every GEMM, RMSNorm and RoPE bit for bit; they differ in
// attention's rounding order (online vs two-pass softmax, ~1e-7..1e-6 per
// attention output, see above) and, on a GPU, in expf (a few ulp, in softmax
// and SwiGLU). Those differences pass through the layers' matmuls with gains
// of order 1: emulated, the largest logit difference measured is ~8e-7 of the
// scale. 2e-5 leaves 25x for a GPU's expf and still sits far below what any
// real mistake (a wrong key, position or weight) does to logits (>1e-2).
// Greedy choices are compared where the CPU's top two logits are more than
// twice this apart (a closer pair may legitimately swap).
constexpr double kLogitTol = 2e-5;

// Proves the kernel runner (emulated or CUDA; the reference GpuMath and FastGpuMath with either attention kernel) reproduces CpuRunner's logits within kLogitTol and its greedy tokens on the built-in model, over a mixed batch (prefills + decodes of 3 sequences, scattered tables), and forward_argmax == argmax(forward).
TEST_CASE("kernel runner matches CpuRunner on the built-in model") {
    if (no_device()) return;
    const pkv::ModelAndTokenizer mt = pkv::load_model_and_tokenizer("", "");
    // Under ThreadSanitizer (make tsan) 4 decode steps, still past C's join at
    // step 3: each kernel runs on every layer all the same, in half the time.
    const int decode_steps = pkv_test::kThreadSanitized ? 4 : 8;
    for (const pkv_test::KernelMath& math : pkv_test::kernel_maths()) {
        INFO("kernel math: " << math.name);
        compare_cpu_and_kernel_runners(mt.model, 16, decode_steps, 101, kLogitTol, false, math);
    }
}

// Proves the same (logits within kLogitTol, greedy tokens, forward_argmax after prefills and decodes) on a small random model: head_dim 8, GQA 3, hidden 100, vocab 300, block size 4.
TEST_CASE("kernel runner matches CpuRunner on a small random model") {
    if (no_device()) return;
    const pkv::Model m = small_random_model(77);
    REQUIRE(m.cfg.head_dim() == 8);
    for (const pkv_test::KernelMath& math : pkv_test::kernel_maths()) {
        INFO("kernel math: " << math.name);
        compare_cpu_and_kernel_runners(m, 4, 10, 202, kLogitTol, true, math);
    }
}

// Runs six requests on the kernel path through an engine small enough to
// preempt (12 blocks of 4 tokens), sampled with per-request seeds that depend
// on `salt`; returns every request's tokens and the preemption count.
std::pair<std::vector<std::vector<int32_t>>, long> kernel_engine_run(int salt) {
    pkv::EngineConfig ec;
    ec.num_blocks = 12;
    ec.block_size = 4;
    ec.sched.max_num_seqs = 6;
    ec.sched.max_num_batched_tokens = 32;
    ec.log_interval_s = 0;
    pkv::StepClock clock;
    pkv::Engine eng(pkv_test::runner(small_engine_model(5), kernel_device()), ec, &clock);
    for (int i = 0; i < 6; ++i) {
        pkv::SamplingParams sp;
        sp.max_tokens = 16;
        sp.temperature = 0.8f;
        sp.seed = (uint64_t)(salt * 10 + i);
        sp.ignore_eos = true;
        eng.add_request(random_tokens(5 + i, 64, (uint64_t)(salt * 100 + i)), sp);
    }
    eng.run_until_done();
    std::vector<std::vector<int32_t>> tokens;
    for (int i = 0; i < 6; ++i) tokens.push_back(eng.request(i)->tokens);
    return {tokens, eng.metrics().num_preemptions_total};
}

// Proves two model runners on two host threads share no kernel state (the
// partitioned kernel's workspace belongs to its runner; each host thread runs
// its own fibers): two engines on the kernel path, each on its own thread and
// each preempting, produce exactly the tokens each produces alone.
TEST_CASE("two kernel runners on two host threads each get the tokens they get alone") {
    if (no_device()) return;
    const auto alone_a = kernel_engine_run(1), alone_b = kernel_engine_run(2);
    REQUIRE(alone_a.second > 0);  // the runs preempt: recompute goes through the kernels too
    REQUIRE(alone_b.second > 0);
    REQUIRE(alone_a.first != alone_b.first);  // different work on each thread
    std::pair<std::vector<std::vector<int32_t>>, long> a, b;
    std::exception_ptr ea, eb;  // doctest's asserts stay on this thread
    std::thread ta([&] { try { a = kernel_engine_run(1); } catch (...) { ea = std::current_exception(); } });
    std::thread tb([&] { try { b = kernel_engine_run(2); } catch (...) { eb = std::current_exception(); } });
    ta.join();
    tb.join();
    if (ea) std::rethrow_exception(ea);
    if (eb) std::rethrow_exception(eb);
    CHECK(a.first == alone_a.first);
    CHECK(b.first == alone_b.first);
    CHECK(a.second == alone_a.second);
    CHECK(b.second == alone_b.second);
}

// Proves make_model_runner gives a CpuRunner for cpu and a GpuRunner for this build's kernel kind, refuses the other kernel kind with a message naming the right build, and the kernel path refuses head_dim not a multiple of 4.
TEST_CASE("make_model_runner picks the device and names the right build") {
    if (no_device()) return;
    const pkv::Model m = small_random_model(1);
    const pkv::Config& c = m.cfg;
    const pkv::KVGeometry geo{c.n_layers, 4, 4, c.n_kv_heads, c.head_dim()};
    auto cpu = pkv_test::runner(m, pkv::Device::kCpu, geo);
    CHECK(dynamic_cast<pkv::CpuRunner*>(cpu.get()) != nullptr);
    auto gpu = pkv_test::runner(m, kernel_device(), geo);
    CHECK(dynamic_cast<pkv::GpuRunner*>(gpu.get()) != nullptr);
    CHECK(gpu->model_config().vocab_size == c.vocab_size);

    const bool is_cuda = kernel_device() == pkv::Device::kCuda;
    const pkv::Device other = is_cuda ? pkv::Device::kEmulated : pkv::Device::kCuda;
    std::string msg;
    try {
        (void)pkv::make_model_runner(other, m);
    } catch (const std::invalid_argument& e) {
        msg = e.what();
    }
    INFO("message: " << msg);
    REQUIRE(!msg.empty());
    if (is_cuda) CHECK(msg.find("CPU build") != std::string::npos);
    else CHECK(msg.find("make cuda") != std::string::npos);

    pkv::Config c6 = c;
    c6.dim = 36;  // 6 heads of head_dim 6: fine for the CPU, not for 16-byte loads
    c6.n_kv_heads = 6;
    const pkv::Model m6 = pkv::make_random_model(c6, 2);
    const pkv::KVGeometry geo6{c6.n_layers, 4, 4, c6.n_kv_heads, c6.head_dim()};
    CHECK_NOTHROW((void)pkv_test::runner(m6, pkv::Device::kCpu, geo6));
    CHECK_THROWS_AS((void)pkv::make_model_runner(kernel_device(), m6), std::invalid_argument);
    CHECK_THROWS_AS(pkv::parse_device("gpu"), std::invalid_argument);
}

// ===========================================================================
// 7. Batch invariance of the kernel path
// ===========================================================================

// The kernel path's logits for a token with `math`: decoded alone, inside
// one long prefill, and inside chunked prefills mixed with other sequences'
// prefills and decodes must be bit-identical (the test below).
void check_kernel_batch_invariance(const pkv_test::KernelMath& math) {
    const pkv::Model m = small_random_model(55);
    const pkv::Config& c = m.cfg;
    Rng rng(99);
    const std::vector<int32_t> S = random_tokens(rng, 14, c.vocab_size);
    const std::vector<int32_t> X = random_tokens(rng, 12, c.vocab_size);
    const std::vector<int32_t> Y = random_tokens(rng, 6, c.vocab_size);
    const int V = c.vocab_size;
    // Logits of S's positions 11, 12 and 13 in each scenario.
    auto row = [&](const std::vector<float>& logits, int r) {
        return std::vector<float>(logits.begin() + (std::ptrdiff_t)r * V, logits.begin() + (std::ptrdiff_t)(r + 1) * V);
    };
    auto make = [&](int block_size, int num_blocks) {
        const pkv::KVGeometry geo{c.n_layers, num_blocks, block_size, c.n_kv_heads, c.head_dim()};
        return pkv_test::kernel_runner(m, geo, math);
    };
    std::vector<std::vector<float>> alone, one_prefill, mixed;

    {  // (a) prefill 0..11, then decode 12 and 13 alone. Block size 4.
        auto r = make(4, 8);
        pkv::BlockPool pool = shuffled_pool(8, 4, rng);
        Seq s{S, {}, 0};
        std::vector<float> logits;
        pkv::ForwardBatch b0;
        add_chunk(b0, pool, s, 12);
        r->forward(b0, logits);
        alone.push_back(row(logits, 0));
        for (int i = 0; i < 2; ++i) {
            pkv::ForwardBatch b;
            add_chunk(b, pool, s, 1);
            r->forward(b, logits);
            alone.push_back(row(logits, 0));
        }
    }
    {  // (b) one prefill of all 14 tokens, logits for positions 11, 12, 13. Block size 1.
        auto r = make(1, 20);
        pkv::BlockPool pool = shuffled_pool(20, 1, rng);
        Seq s{S, {}, 0};
        pkv::ForwardBatch b;
        add_chunk(b, pool, s, 14);
        b.logits_indices = {11, 12, 13};
        std::vector<float> logits;
        r->forward(b, logits);
        for (int i = 0; i < 3; ++i) one_prefill.push_back(row(logits, i));
    }
    {  // (c) S chunked 0..6 | 7..12 | 13, each chunk beside other sequences. Block size 16.
        auto r = make(16, 6);
        pkv::BlockPool pool = shuffled_pool(6, 16, rng);
        Seq s{S, {}, 0}, x{X, {}, 0}, y{Y, {}, 0};
        std::vector<float> logits;
        pkv::ForwardBatch b1;  // X prefill, S's first chunk, Y prefill
        add_chunk(b1, pool, x, 9);
        add_chunk(b1, pool, s, 7);
        add_chunk(b1, pool, y, 3);
        r->forward(b1, logits);
        pkv::ForwardBatch b2;  // Y decode, S's second chunk (logits at 11 and 12), X decode
        add_chunk(b2, pool, y, 1);
        const int s_first = b2.num_tokens();
        add_chunk(b2, pool, s, 6);
        add_chunk(b2, pool, x, 1);
        // Rows: Y, S@11, S@12, X.
        b2.logits_indices = {b2.logits_indices[0], s_first + 4, s_first + 5, b2.logits_indices[2]};
        r->forward(b2, logits);
        mixed.push_back(row(logits, 1));
        mixed.push_back(row(logits, 2));
        pkv::ForwardBatch b3;  // X and Y decodes around S's decode of 13, Y's a 2-token chunk
        add_chunk(b3, pool, x, 1);
        add_chunk(b3, pool, y, 2);
        add_chunk(b3, pool, s, 1);
        r->forward(b3, logits);
        mixed.push_back(row(logits, 2));
    }
    for (int i = 0; i < 3; ++i) {
        INFO("S position " << 11 + i);
        CHECK(first_bit_diff(alone[(size_t)i], one_prefill[(size_t)i]) == -1);
        CHECK(first_bit_diff(alone[(size_t)i], mixed[(size_t)i]) == -1);
    }
    // The three positions' logits are different from each other: the rows are real.
    CHECK(first_bit_diff(alone[0], alone[1]) != -1);
}

// Proves the kernel path's logits for a token are bit-identical whether it is decoded alone, computed inside one long prefill, or inside chunked prefills mixed with other sequences' prefills and decodes (separate runners, different block sizes and tables), with the reference GpuMath and with FastGpuMath's two attention kernels.
TEST_CASE("kernel path is batch-invariant bit for bit") {
    if (no_device()) return;
    for (const pkv_test::KernelMath& math : pkv_test::kernel_maths()) {
        INFO("kernel math: " << math.name);
        check_kernel_batch_invariance(math);
    }
}

// ===========================================================================
// 8. build/generate: kernels vs CPU
// ===========================================================================

// Proves build/generate prints byte-identical greedy text with --device emulated (or, for a `make cuda` build, cuda) and --device cpu, each with --math reference (the default) and --math fast, on the built-in model and on stories260K when its files are present.
TEST_CASE("generate prints the same text on the kernel path as on the CPU") {
    if (no_device()) return;
    const std::string exe = need_program("generate");  // of this build: build/ or build/cuda/
    if (exe.empty()) return;
    struct Run {
        std::string name, args;
    };
    std::vector<Run> runs = {{"built-in", "-t 0 -n 24 -i 'once upon a time'"}};
    const std::string dir = models_dir();
    const std::string ckpt = dir + "/stories260K.bin", tok = dir + "/tok512.bin";
    if (need_model_files({"stories260K.bin", "tok512.bin"}))
        runs.push_back({"stories260K", shell_quote(ckpt) + " -z " + shell_quote(tok) + " -t 0 -n 24 -i 'Once upon a time'"});
    for (const Run& run : runs) {
        INFO(run.name);
        const auto [cpu_out, cpu_status] = run_command(shell_quote(exe) + " " + run.args + " --device cpu 2>/dev/null");
        CHECK(cpu_status == 0);
        CHECK(cpu_out.size() > 20);
        for (const std::string& device : {std::string("cpu"), std::string(pkv::kDeviceKind)})
            for (const char* math : {"reference", "fast"}) {
                INFO("--device " << device << " --math " << math);
                const auto [out, status] = run_command(shell_quote(exe) + " " + run.args + " --device " + device + " --math " + math + " 2>/dev/null");
                CHECK(status == 0);
                CHECK(out == cpu_out);
            }
    }
}

}  // TEST_SUITE("kernels")

// tests/test_cpu_speed.cpp -- the CPU forward's fast paths compute exactly what
// the plain ones do.
//
// lab/fast_cpu.hpp makes matmul fast three ways -- a register-blocked
// microkernel, an instruction set chosen at run time (baseline x86-64, AVX2,
// AVX-512), threads -- and splits attention across threads. None of them may
// change a bit of a result. Here we prove it:
//   1. matmul on every instruction set this CPU has, for odd widths (n not a
//      multiple of 8: dot()'s tail) and every token count from 1 to 70 (every
//      tile shape and remainder), against dot() itself, bit for bit; any
//      split of the rows among threads too;
//   2. attention cut into chunks (as the threads share it), each chunk by
//      the fast paged_attention_cpu, put together, against one whole call of
//      paged_attention_ref, for token splits and head splits, in all three KV
//      cache dtypes (contexts below, at and past the 8-key blocks);
//   3. a whole model's logits on every instruction set, on one thread and
//      split among threads, against the plain path (forward_cpu.hpp's loops
//      and paged_attention_ref, no FastCpuMath);
//   4. the worker pool runs each chunk once, and an exception thrown in a
//      chunk reaches the caller.
//
// The suite is named model_cpu so that `-ts=model*` runs it with the model tests.
#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "lab/fast_cpu.hpp"
#include "paged_kv.cuh"
#include "tiny_model/forward_cpu.hpp"
#include "tiny_model/model.hpp"

#include "tests/test_util.hpp"

namespace {

using namespace pkv_test;

// Every instruction set this CPU can run, from baseline up.
std::vector<pkv::CpuSimd> simd_levels() {
    std::vector<pkv::CpuSimd> v;
    for (pkv::CpuSimd s : {pkv::CpuSimd::kBaseline, pkv::CpuSimd::kAvx2, pkv::CpuSimd::kAvx512})
        if (s <= pkv::cpu_simd_supported()) v.push_back(s);
    return v;
}

// Sets cpu_simd() for one scope, and puts the old level back on the way out
// (a failed CHECK must not leave the rest of the suite on another path).
struct SimdScope {
    pkv::CpuSimd saved = pkv::cpu_simd();
    explicit SimdScope(pkv::CpuSimd s) { pkv::cpu_simd() = s; }
    ~SimdScope() { pkv::cpu_simd() = saved; }
};

// Forces the process's ThreadPolicy for one scope.
struct ForceScope {
    pkv::ThreadPolicy::Force saved = pkv::ThreadPolicy::instance().force;
    explicit ForceScope(pkv::ThreadPolicy::Force f) { pkv::ThreadPolicy::instance().force = f; }
    ~ForceScope() { pkv::ThreadPolicy::instance().force = saved; }
};

// At least `n` OpenMP threads for one scope (the forward's thread count), so
// that the split paths run even on a one-core machine. Without OpenMP the
// forward always runs on one thread, and this does nothing.
struct ThreadsScope {
#ifdef _OPENMP
    int saved = omp_get_max_threads();
    explicit ThreadsScope(int n) { omp_set_num_threads(std::max(n, saved)); }
    ~ThreadsScope() { omp_set_num_threads(saved); }
#else
    explicit ThreadsScope(int) {}
#endif
};

std::vector<float> random_floats(Rng& rng, size_t n) {
    std::vector<float> v(n);
    for (float& x : v) x = rng.uniform(-1.0f, 1.0f);
    return v;
}

// The definition of matmul: one dot() per output.
std::vector<float> dot_matmul(const std::vector<float>& x, const std::vector<float>& W, int T, int n, int d) {
    std::vector<float> out((size_t)T * d);
    for (int t = 0; t < T; ++t)
        for (int o = 0; o < d; ++o) out[(size_t)t * d + o] = pkv::dot(&W[(size_t)o * n], &x[(size_t)t * n], n);
    return out;
}

// A KV cache of `dtype` filled with random keys and values (written through
// kv_store, as the forward pass writes them), and a batch of `seqs` sequences
// whose last `tokens_per_seq` positions are the queries.
struct AttentionProblem {
    pkv::KVGeometry geo;
    pkv::KVCache cache;
    pkv::ForwardBatch batch;
    pkv::AttentionShape shape;
    std::vector<float> q;

    AttentionProblem(pkv::KVDtype dtype, int n_heads, int n_kv_heads, int head_dim, int seqs, int tokens_per_seq, int ctx, Rng& rng)
        : geo{1, seqs * (int)pkv::blocks_for_tokens(ctx, 4), 4, n_kv_heads, head_dim, dtype}, cache(geo) {
        pkv::BlockPool pool = shuffled_pool(geo.num_blocks, geo.block_size, rng);
        std::vector<float> head((size_t)head_dim);
        for (int s = 0; s < seqs; ++s) {
            pkv::BlockTable table;
            REQUIRE(pkv::allocate_slots(pool, table, {}, ctx));
            for (int pos = 0; pos < ctx; ++pos) {
                const int64_t slot = pkv::slot_of(table.blocks.data(), pos, geo.block_size);
                for (int h = 0; h < n_kv_heads; ++h) {
                    for (float& e : head) e = rng.uniform(-2.0f, 2.0f);
                    pkv::kv_store(cache.k_view(0), slot, h, head.data());
                    for (float& e : head) e = rng.uniform(-2.0f, 2.0f);
                    pkv::kv_store(cache.v_view(0), slot, h, head.data());
                }
            }
            const std::vector<int32_t> ids((size_t)tokens_per_seq, 3);
            batch.add_sequence(table.blocks, geo.block_size, ids.data(), ctx - tokens_per_seq, tokens_per_seq, false);
        }
        shape = {n_heads, n_kv_heads, head_dim, geo.block_size, batch.max_blocks_per_seq};
        q = random_floats(rng, (size_t)batch.num_tokens() * n_heads * head_dim);
    }
    std::vector<float> whole() {
        std::vector<float> out(q.size(), kNaN);
        pkv::paged_attention_ref(out.data(), q.data(), cache.k_view(0), cache.v_view(0), batch.block_tables.data(),
                                 batch.token_seq.data(), batch.positions.data(), batch.num_tokens(), shape);
        return out;
    }
    // Every chunk, one after the other; NaN wherever no chunk wrote.
    std::vector<float> in_chunks(int chunks) {
        std::vector<float> out(q.size(), kNaN);
        for (int i = 0; i < chunks; ++i)
            pkv::attention_part(i, chunks, out.data(), q.data(), cache.k_view(0), cache.v_view(0), batch, shape);
        return out;
    }
};

}  // namespace

TEST_SUITE("model_cpu") {

// Proves matmul computes bit for bit one dot() per output on every instruction set this CPU has, for widths n that are not multiples of 8 (and smaller than 8), d of any size, and every T from 1 to 70; that any split of the rows (as threads split them) changes nothing; and that a plain in-order sum differs, so the check has teeth.
TEST_CASE("matmul is bit-identical to dot() on every instruction set, tile shape and row split") {
    const std::vector<pkv::CpuSimd> levels = simd_levels();
    MESSAGE("instruction sets checked: " << levels.size() << " (best here: " << std::string(pkv::to_string(pkv::cpu_simd_supported())) << ")");
    Rng rng(12);
    const int shapes[][2] = {{1, 1}, {5, 3}, {8, 2}, {13, 7}, {37, 17}, {100, 9}, {291, 29}};  // {n, d}
    int naive_differs = 0;
    for (const auto& sh : shapes) {
        const int n = sh[0], d = sh[1];
        const std::vector<float> W = random_floats(rng, (size_t)d * n), x = random_floats(rng, (size_t)70 * n);
        const std::vector<float> want_all = dot_matmul(x, W, 70, n, d);
        for (int T = 1; T <= 70; ++T) {
            const std::vector<float> want(want_all.begin(), want_all.begin() + (size_t)T * d);
            for (pkv::CpuSimd level : levels) {
                INFO("n " << n << ", d " << d << ", T " << T << ", " << std::string(pkv::to_string(level)));
                SimdScope scope(level);
                std::vector<float> got((size_t)T * d, kNaN);
                pkv::matmul_fast(got.data(), x.data(), W.data(), T, n, d);
                CHECK(first_bit_diff(want, got) == -1);
                // The rows cut into 2, 3 and 4 stretches, as chunks of a parallel job are.
                for (int parts = 2; parts <= 4; ++parts) {
                    std::vector<float> split((size_t)T * d, kNaN);
                    for (int p = 0; p < parts; ++p) pkv::matmul_rows_simd(split.data(), x.data(), W.data(), T, n, d, d * p / parts, d * (p + 1) / parts);
                    CHECK(first_bit_diff(want, split) == -1);
                }
            }
        }
        // Teeth: plain index order (run.c's) gives other bits somewhere.
        for (int o = 0; o < d; ++o) {
            float s = 0.0f;
            for (int j = 0; j < n; ++j) s += W[(size_t)o * n + j] * x[j];
            naive_differs += std::memcmp(&s, &want_all[(size_t)o], sizeof s) != 0;
        }
    }
    CHECK(naive_differs > 0);
}

// Proves matmul_parts_fast (several matrices over one input, as Wq/Wk/Wv and W1/W3 are applied) gives each matrix exactly what its own matmul gives.
TEST_CASE("matmul_parts_fast equals one matmul per part") {
    Rng rng(13);
    const int T = 11, n = 45;
    const std::vector<float> x = random_floats(rng, (size_t)T * n);
    const std::vector<float> W1 = random_floats(rng, (size_t)21 * n), W2 = random_floats(rng, (size_t)5 * n), W3 = random_floats(rng, (size_t)34 * n);
    std::vector<float> o1((size_t)T * 21, kNaN), o2((size_t)T * 5, kNaN), o3((size_t)T * 34, kNaN);
    pkv::matmul_parts_fast(x.data(), T, n, {{o1.data(), W1.data(), 21}, {o2.data(), W2.data(), 5}, {o3.data(), W3.data(), 34}});
    CHECK(first_bit_diff(o1, dot_matmul(x, W1, T, n, 21)) == -1);
    CHECK(first_bit_diff(o2, dot_matmul(x, W2, T, n, 5)) == -1);
    CHECK(first_bit_diff(o3, dot_matmul(x, W3, T, n, 34)) == -1);
}

// Proves every chunk of attention_part (paged_attention_cpu: eight keys at a time, rows located once), put together, equals one whole paged_attention_ref call bit for bit: split by tokens (prefill-like and decode-like batches, more chunks than tokens) and by kv heads (a single token, GQA and not, more chunks than kv heads), for f32, f16 and int8 caches.
TEST_CASE("attention cut into chunks is bit-identical to one call") {
    Rng rng(14);
    struct Case {
        const char* name;
        int n_heads, n_kv_heads, head_dim, seqs, tokens_per_seq, ctx;
    };
    const Case cases[] = {
        {"one token, 6 heads over 6 kv heads", 6, 6, 8, 1, 1, 37},
        {"one token, GQA 3:1", 6, 2, 8, 1, 1, 23},
        {"one token, one kv head (token split)", 4, 1, 8, 1, 1, 9},
        {"a prefill of 20", 4, 2, 8, 1, 20, 20},
        {"decodes of 5 sequences", 6, 3, 12, 5, 1, 30},
        {"two chunks beside each other", 6, 6, 8, 2, 7, 19},
        {"a first token (context 1), head_dim 48", 6, 6, 48, 3, 1, 1},
        {"exactly 16 keys, GQA 4:1", 8, 2, 16, 2, 1, 16},
    };
    for (pkv::KVDtype dtype : {pkv::KVDtype::kF32, pkv::KVDtype::kF16, pkv::KVDtype::kInt8}) {
        for (const Case& c : cases) {
            AttentionProblem p(dtype, c.n_heads, c.n_kv_heads, c.head_dim, c.seqs, c.tokens_per_seq, c.ctx, rng);
            const std::vector<float> want = p.whole();
            REQUIRE(all_finite(want));
            for (int chunks : {1, 2, 3, 4, 7, 16}) {
                INFO(std::string(c.name) << ", " << std::string(pkv::to_string(dtype)) << ", " << chunks << " chunks");
                CHECK(first_bit_diff(want, p.in_chunks(chunks)) == -1);
            }
        }
    }
}

// Proves a small random model (dim 48, GQA 3:1, odd widths) gives bit-identical logits for prefills and decode batches (single-sequence decodes too, whose attention splits by heads) on every instruction set this CPU has, on one thread and split among threads (forced, with at least two threads, whatever the machine), and all of them equal the plain path (forward_cpu.hpp without FastCpuMath).
TEST_CASE("model logits are identical on every instruction set and thread split") {
    const pkv::Config c = small_config(false);
    const pkv::Model m = pkv::make_random_model(c, 31);
    const std::vector<int32_t> tokens = random_tokens(40, c.vocab_size, 32);
    ThreadsScope two(2);
    std::vector<std::vector<float>> runs;
    // Run 0: the plain path (no FastCpuMath), what every fast run must equal.
    std::vector<pkv::CpuSimd> levels = simd_levels();
    levels.insert(levels.begin(), pkv::CpuSimd::kBaseline);
    for (size_t li = 0; li < levels.size(); ++li) {
        const pkv::CpuSimd level = levels[li];
        for (auto force : {pkv::ThreadPolicy::Force::kSerial, pkv::ThreadPolicy::Force::kParallel}) {
            const bool plain = li == 0;
            if (plain && force == pkv::ThreadPolicy::Force::kParallel) continue;
            SimdScope scope(level);
            ForceScope forced(force);
            const int bs = 8, blocks = 4 * (int)pkv::blocks_for_tokens(40, bs);
            pkv::KVCache cache({c.n_layers, blocks, bs, c.n_kv_heads, c.head_dim()});
            pkv::BlockPool pool(blocks, bs, false);
            pkv::FastCpuMath fast;
            pkv::CpuForward fwd(m, cache, plain ? pkv::plain_cpu_math() : fast);
            std::vector<float> all, logits;
            // Three sequences: a 25-token prefill each, logits for every
            // position; then 5 single-sequence decodes of sequence 0; then 10
            // decode steps of all three side by side.
            std::vector<Seq> seqs(3);
            for (int s = 0; s < 3; ++s) {
                seqs[(size_t)s].tokens = tokens;
                seqs[(size_t)s].tokens[0] = s + 1;  // each its own sequence
                pkv::ForwardBatch b;
                add_chunk(b, pool, seqs[(size_t)s], 25, true);
                fwd.forward(b, logits);
                all.insert(all.end(), logits.begin(), logits.end());
            }
            for (int step = 0; step < 5; ++step) {
                pkv::ForwardBatch b;
                add_chunk(b, pool, seqs[0], 1);
                fwd.forward(b, logits);
                all.insert(all.end(), logits.begin(), logits.end());
            }
            for (int step = 0; step < 10; ++step) {
                pkv::ForwardBatch b;
                for (Seq& s : seqs) add_chunk(b, pool, s, 1);
                fwd.forward(b, logits);
                all.insert(all.end(), logits.begin(), logits.end());
            }
            REQUIRE(all_finite(all));
            if (!plain)
                CHECK(fast.profile.parallel_passes == (force == pkv::ThreadPolicy::Force::kParallel && pkv::ThreadPolicy::max_threads() > 1 ? fast.profile.passes : 0));
            runs.push_back(all);
        }
    }
    for (size_t i = 1; i < runs.size(); ++i) {
        INFO("run " << i << " (instruction set " << (i + 1) / 2 - 1 << ", " << (i % 2 ? "one thread" : "threads") << ") against the plain path");
        CHECK(first_bit_diff(runs[0], runs[i]) == -1);
    }
}

// Proves the worker pool runs every chunk exactly once, job after job, whatever the number of threads asked for; that an exception thrown in one chunk comes back to the caller as itself after the other chunks finished (an exception leaving a worker thread would end the program); and that the serial path throws it too.
TEST_CASE("the worker pool runs each chunk once and hands exceptions back") {
    for (int threads : {2, 3, 5}) {
        for (int job = 0; job < 200; ++job) {
            const int chunks = 1 + job % 37;
            std::vector<std::atomic<int>> runs((size_t)chunks);
            pkv::WorkerPool::instance().run(threads, chunks, [&](int i) { runs[(size_t)i].fetch_add(1); });
            int wrong = 0;
            for (const auto& r : runs) wrong += r.load() != 1;
            REQUIRE(wrong == 0);
        }
    }
    for (bool parallel : {false, true}) {
        INFO("parallel " << parallel);
        std::atomic<int> finished{0};
        CHECK_THROWS_WITH_AS(pkv::for_each_chunk(parallel, 16,
                                                 [&](int chunk, int chunks) {
                                                     if (chunk == chunks - 1) throw std::runtime_error("chunk " + std::to_string(chunk) + " failed");
                                                     finished.fetch_add(1);
                                                 }),
                             doctest::Contains("failed"), std::runtime_error);
        if (parallel && pkv::ThreadPolicy::max_threads() > 1) CHECK(finished.load() == 15);
    }
}

}  // TEST_SUITE("model_cpu")

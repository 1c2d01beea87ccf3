// tests/test_kv_dtype.cpp -- the KV cache's element type: f32, f16, int8.
//
// What we prove: the half conversion rounds like the hardware's; int8 keeps
// every element within half a quantization step; attention over a smaller
// dtype equals attention over its dequantized values (the only change is the
// stored numbers); the kernels read each dtype as the reference does; the
// engine stays deterministic under preemption and swap with any dtype; a byte
// budget buys more blocks of a smaller dtype.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "engine.hpp"
#include "lab/fast_gpu.cuh"
#include "tests/test_util.hpp"

using namespace pkv;

namespace {

const Model& dtype_model() { return pkv_test::small_engine_model(11); }  // tests/test_util.hpp

// A cache of `dtype` filled through kv_store from random vectors, plus the
// float32 cache holding exactly what kv_load reads back.
struct FilledCaches {
    KVCache typed, dequant;
};
FilledCaches fill(KVDtype dtype, int num_blocks, int block_size, int nkv, int hd, std::mt19937& rng) {
    KVGeometry g{1, num_blocks, block_size, nkv, hd, dtype};
    KVGeometry gf = g;
    gf.dtype = KVDtype::kF32;
    FilledCaches c{KVCache(g), KVCache(gf)};
    std::normal_distribution<float> nd(0.0f, 1.5f);
    std::vector<float> x(hd);
    for (int64_t slot = 0; slot < (int64_t)num_blocks * block_size; ++slot)
        for (int h = 0; h < nkv; ++h)
            for (int kv = 0; kv < 2; ++kv) {
                for (float& e : x) e = nd(rng);
                const KVView t = kv ? c.typed.v_view(0) : c.typed.k_view(0);
                const KVView f = kv ? c.dequant.v_view(0) : c.dequant.k_view(0);
                kv_store(t, slot, h, x.data());
                for (int d = 0; d < hd; ++d) x[d] = kv_load(t, slot, h, d);
                kv_store(f, slot, h, x.data());
            }
    return c;
}

struct EngineRun {
    std::vector<std::vector<int32_t>> tokens;
    Metrics metrics;
    long swap_outs = 0;  // victims the swap policy copied out
};
EngineRun run_engine(KVDtype dtype, int num_blocks, Preemption mode, Device device = Device::kCpu, int n = 8, int max_tokens = 32) {
    EngineConfig ec;
    ec.num_blocks = num_blocks;
    ec.block_size = 4;
    ec.kv_dtype = dtype;
    ec.sched.max_num_seqs = 8;
    ec.sched.max_num_batched_tokens = 64;
    ec.log_interval_s = 0;
    StepClock clock;
    const auto engine = pkv_test::engine_with(ec, {.preemption = mode, .swap_space_blocks = mode == Preemption::kSwap ? 200 : 0},
                                              pkv_test::runner(dtype_model(), device), &clock);
    Engine& eng = *engine;
    for (int i = 0; i < n; ++i) {
        std::vector<int32_t> prompt(5 + i % 4);
        for (size_t j = 0; j < prompt.size(); ++j) prompt[j] = (int32_t)((i * 13 + j * 5 + 1) % 64);
        SamplingParams sp;
        sp.max_tokens = max_tokens;
        sp.temperature = i % 2 ? 0.7f : 0.0f;
        sp.seed = 77 + i;
        sp.ignore_eos = true;
        eng.add_request(prompt, sp);
    }
    int steps = 0;
    while (eng.has_unfinished()) {
        eng.step();
        REQUIRE(eng.check_invariants() == "");
        REQUIRE(++steps < 4000);
    }
    EngineRun r;
    for (int i = 0; i < n; ++i) r.tokens.push_back(eng.request(i)->tokens);
    r.metrics = eng.metrics();
    r.swap_outs = pkv_test::swap_stats(eng).num_swap_outs;
    return r;
}

}  // namespace

TEST_SUITE("kv_dtype") {

// Known values, and round-to-nearest-even at the half's precision.
TEST_CASE("float_to_half and half_to_float on known values") {
    CHECK(float_to_half(0.0f) == 0x0000);
    CHECK(float_to_half(-0.0f) == 0x8000);
    CHECK(float_to_half(1.0f) == 0x3C00);
    CHECK(float_to_half(-2.0f) == 0xC000);
    CHECK(float_to_half(65504.0f) == 0x7BFF);            // the largest half
    CHECK(float_to_half(65520.0f) == 0x7C00);            // rounds up to infinity
    CHECK(float_to_half(5.9604645e-8f) == 0x0001);       // the smallest subnormal
    CHECK(float_to_half(1e-9f) == 0x0000);               // underflows to zero
    CHECK(float_to_half(1.0f + 1.0f / 2048) == 0x3C00);  // halfway: ties to even (down)
    CHECK(float_to_half(1.0f + 3.0f / 2048) == 0x3C02);  // halfway: ties to even (up)
    CHECK(std::isinf(half_to_float(0x7C00)));
    CHECK(std::isnan(half_to_float(0x7E00)));
    CHECK(half_to_float(0x0001) == 5.9604645e-8f);
    CHECK(half_to_float(0x3555) == doctest::Approx(0.33325195).epsilon(1e-7));
    // Every half survives half -> float -> half unchanged.
    for (uint32_t h = 0; h < 0x10000; ++h) {
        if ((h & 0x7C00) == 0x7C00 && (h & 0x3FF)) continue;  // nan payloads
        REQUIRE(float_to_half(half_to_float((uint16_t)h)) == h);
    }
}

#ifdef __FLT16_MAX__
// Against the compiler's own _Float16 conversion (IEEE round to nearest even).
TEST_CASE("float_to_half matches _Float16 on random floats") {
    std::mt19937 rng(5);
    std::uniform_int_distribution<uint32_t> bits;
    for (int i = 0; i < 200000; ++i) {
        uint32_t u = bits(rng);
        if (i % 2) u = (u & 0x8FFFFFFFu) | 0x30000000u;  // bias toward the half's range
        float f;
        std::memcpy(&f, &u, 4);
        if (std::isnan(f)) continue;
        const _Float16 h = (_Float16)f;
        uint16_t hb;
        std::memcpy(&hb, &h, 2);
        REQUIRE_MESSAGE(float_to_half(f) == hb, "f = " << f);
    }
}
#endif

// int8: the largest |x| of a vector maps to +-127, every element within half a step.
TEST_CASE("int8 store keeps each element within half a quantization step") {
    std::mt19937 rng(3);
    std::normal_distribution<float> nd(0.0f, 2.0f);
    KVGeometry g{1, 2, 4, 3, 16, KVDtype::kInt8};
    KVCache c(g);
    std::vector<float> x(16);
    for (int64_t slot = 0; slot < 8; ++slot)
        for (int h = 0; h < 3; ++h) {
            for (float& e : x) e = nd(rng);
            kv_store(c.k_view(0), slot, h, x.data());
            float amax = 0;
            for (float e : x) amax = std::max(amax, std::fabs(e));
            const float step = amax / 127.0f;
            for (int d = 0; d < 16; ++d) CHECK(std::fabs(kv_load(c.k_view(0), slot, h, d) - x[d]) <= step * 0.5f + 1e-6f);
        }
    // An all-zero vector stores zeros (scale 1, no division by zero).
    std::fill(x.begin(), x.end(), 0.0f);
    kv_store(c.k_view(0), 0, 0, x.data());
    for (int d = 0; d < 16; ++d) CHECK(kv_load(c.k_view(0), 0, 0, d) == 0.0f);
}

// Attention over f16/int8 is attention over the dequantized numbers, bit for
// bit (the reference reads through kv_load); both emulated or GPU kernels
// (baseline and partitioned) read each dtype to the same tolerance as f32
// (online vs two-pass softmax order).
TEST_CASE("attention over each dtype equals attention over its dequantized values") {
    std::mt19937 rng(9);
    for (KVDtype dt : {KVDtype::kF32, KVDtype::kF16, KVDtype::kInt8}) {
        INFO("kv dtype " << std::string(to_string(dt)));
        const int nb = 12, bs = 4, nkv = 2, hd = 16, nh = 4, T = 6;
        FilledCaches c = fill(dt, nb, bs, nkv, hd, rng);
        std::vector<int32_t> tables = {3, 7, 1, 9, 0, 5, 11, 2, 4, 6, 8, 10};  // 2 sequences x 6 blocks
        std::vector<int32_t> seq = {0, 0, 0, 1, 1, 1}, pos = {0, 7, 22, 3, 12, 23};
        std::vector<float> q((size_t)T * nh * hd), out_t(q.size()), out_f(q.size());
        std::normal_distribution<float> nd;
        for (float& e : q) e = nd(rng);
        const AttentionShape s{nh, nkv, hd, bs, 6};
        paged_attention_ref(out_t.data(), q.data(), c.typed.k_view(0), c.typed.v_view(0), tables.data(), seq.data(), pos.data(), T, s);
        paged_attention_ref(out_f.data(), q.data(), c.dequant.k_view(0), c.dequant.v_view(0), tables.data(), seq.data(), pos.data(), T, s);
        CHECK(std::memcmp(out_t.data(), out_f.data(), out_t.size() * sizeof(float)) == 0);

        std::string why;
        if (!device_available(&why)) continue;
        // The kernel, through device memory.
        const size_t bytes = KVCache::layer_bytes(c.typed.geo);
        DeviceBuffer<std::byte> dk, dv;
        DeviceBuffer<float> dks, dvs, dq, dout(q.size());
        DeviceBuffer<int32_t> dt_tab, dseq, dpos;
        dk.upload(c.typed.k.data(), bytes);
        dv.upload(c.typed.v.data(), bytes);
        KVView kview{dt, dk.data(), nullptr, nkv, hd}, vview{dt, dv.data(), nullptr, nkv, hd};
        if (dt == KVDtype::kInt8) {
            dks.upload(c.typed.k_scale);
            dvs.upload(c.typed.v_scale);
            kview.scale = dks.data();
            vview.scale = dvs.data();
        }
        dq.upload(q);
        dt_tab.upload(tables);
        dseq.upload(seq);
        dpos.upload(pos);
        for (AttentionKernel kernel : {AttentionKernel::kBaseline, AttentionKernel::kPartitioned}) {
            INFO("kernel " << std::string(to_string(kernel)));
            paged_attention(dout.data(), dq.data(), kview, vview, dt_tab.data(), dseq.data(), dpos.data(), T, s, kernel);
            std::vector<float> out_k(q.size());
            dout.download(out_k.data(), out_k.size());
            size_t bad = 0;
            for (size_t i = 0; i < out_k.size(); ++i) bad += !(out_k[i] == doctest::Approx(out_f[i]).epsilon(1e-4).scale(1.0));
            CHECK(bad == 0);
        }
    }
}

// The model with a smaller cache stays close to f32; greedy tokens mostly agree.
TEST_CASE("model logits with f16 and int8 caches stay close to f32") {
    const Model& m = dtype_model();
    std::vector<int32_t> prompt = {1, 5, 9, 13, 17, 21, 25, 29, 33, 37, 41, 45};
    std::vector<std::vector<float>> logits(3);
    int k = 0;
    for (KVDtype dt : {KVDtype::kF32, KVDtype::kF16, KVDtype::kInt8}) {
        KVCache cache(KVGeometry{m.cfg.n_layers, 8, 4, m.cfg.n_kv_heads, m.cfg.head_dim(), dt});
        CpuForward fwd(m, cache);
        std::vector<int32_t> table = {6, 2, 7, 0};
        ForwardBatch b;
        for (int i = 0; i < (int)prompt.size(); ++i) b.add_sequence(table, 4, &prompt[i], i, 1, true);
        fwd.forward(b, logits[k++]);
    }
    float d16 = 0, d8 = 0;
    for (size_t i = 0; i < logits[0].size(); ++i) {
        d16 = std::max(d16, std::fabs(logits[1][i] - logits[0][i]));
        d8 = std::max(d8, std::fabs(logits[2][i] - logits[0][i]));
    }
    MESSAGE("max |logit - f32 logit|: f16 " << d16 << ", int8 " << d8);
    CHECK(d16 > 0.0f);  // the cache really changed precision
    CHECK(d16 < 0.01f);
    CHECK(d8 < 0.1f);
    CHECK(d8 > d16);
}

// A byte budget buys blocks: f16 exactly twice f32; int8 pays for its scales.
TEST_CASE("a byte budget sizes the pool by dtype") {
    const Config& c = dtype_model().cfg;
    const size_t budget = 1 << 20;
    int blocks[3];
    int k = 0;
    for (KVDtype dt : {KVDtype::kF32, KVDtype::kF16, KVDtype::kInt8}) {
        EngineConfig ec;
        ec.block_size = 4;
        ec.kv_dtype = dt;
        ec.kv_cache_bytes = budget;
        Engine eng(pkv_test::runner(dtype_model()), ec);
        blocks[k++] = eng.config().num_blocks;
    }
    const size_t f32_block = 2 * (size_t)c.n_layers * 4 * c.n_kv_heads * c.head_dim() * 4;
    CHECK(blocks[0] == (int)(budget / f32_block));
    CHECK(blocks[1] == 2 * blocks[0]);
    const size_t int8_block = 2 * (size_t)c.n_layers * (4 * c.n_kv_heads * c.head_dim() + 4 * c.n_kv_heads * 4);
    CHECK(blocks[2] == (int)(budget / int8_block));
    // head_dim 8: 8 bytes of data + a 4-byte scale per (token, head) against
    // 32 bytes in f32, so int8 buys 2.67x the blocks, not 4x.
    CHECK(blocks[2] > 2 * blocks[0]);
    EngineConfig tiny;
    tiny.kv_cache_bytes = 10;
    CHECK_THROWS_AS(Engine(pkv_test::runner(dtype_model()), tiny), std::invalid_argument);
}

// Determinism holds per dtype: preempted (recompute or swap) == ample cache.
TEST_CASE("preemption and swap reproduce an ample run with f16 and int8 caches") {
    for (KVDtype dt : {KVDtype::kF16, KVDtype::kInt8}) {
        INFO("kv dtype " << std::string(to_string(dt)));
        const EngineRun ample = run_engine(dt, 300, Preemption::kRecompute);
        CHECK(ample.metrics.num_preemptions_total == 0);
        const EngineRun rec = run_engine(dt, 20, Preemption::kRecompute);
        CHECK(rec.metrics.num_preemptions_total > 0);
        CHECK(rec.tokens == ample.tokens);
        const EngineRun sw = run_engine(dt, 20, Preemption::kSwap);
        CHECK(sw.swap_outs > 0);
        CHECK(sw.tokens == ample.tokens);
    }
}

// The kernel path with each dtype gives the CPU's tokens.
TEST_CASE("kernel path matches the CPU for each dtype") {
    std::string why;
    if (!device_available(&why)) {
        pkv_test::skip(pkv_test::SkipKind::kGpu, "no GPU: " + why);
        return;
    }
    const Device kernels = std::string(kDeviceKind) == "cuda" ? Device::kCuda : Device::kEmulated;
    for (KVDtype dt : {KVDtype::kF16, KVDtype::kInt8}) {
        INFO("kv dtype " << std::string(to_string(dt)));
        const EngineRun cpu = run_engine(dt, 40, Preemption::kRecompute, Device::kCpu, 3, 8);
        const EngineRun dev = run_engine(dt, 40, Preemption::kRecompute, kernels, 3, 8);
        CHECK(dev.tokens == cpu.tokens);
    }
}

}  // TEST_SUITE

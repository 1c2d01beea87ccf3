// examples/bench_attention.cpp -- how close does paged_attention get to the
// GPU's memory bandwidth?
//
// Decode attention is memory-bound: each query token reads its whole context's
// K and V once and does ~2 flops per byte. So the figure of merit is bytes of
// K/V read per second, against the GPU's peak (H200: 4.8 TB/s HBM3e).
//
// Shapes (float32 KV cache, block size 16, shuffled block tables):
//   A. batch 64 x context 4096, 32 query heads / 8 KV heads, head_dim 128
//   B. batch 1 x context 32768, same heads
// Each run is timed with CUDA events after flushing the 50 MB L2 (by writing a
// 256 MB buffer), so K/V come from HBM, not cache. A few output rows are
// checked against paged_attention_ref on the CPU.
//
//   build/cuda/bench_attention [--iters N]      (needs `make cuda` and a GPU)
//   build/bench_attention                       (CPU build: a small emulated run,
//                                                correctness only; times mean nothing)
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "block_pool.hpp"
#include "examples/cli.hpp"
#include "paged_kv.cuh"

namespace {

struct Shape {
    const char* name;
    int batch, ctx, n_heads, n_kv_heads, head_dim, block_size;
};

constexpr double kPeakBytesPerSec = 4.8e12;  // H200 HBM3e

double run_shape(const Shape& sh, int iters, bool emulated) {
    const int blocks_per_seq = (int)pkv::blocks_for_tokens(sh.ctx, sh.block_size);
    const int num_blocks = sh.batch * blocks_per_seq;
    const size_t cache_floats = (size_t)num_blocks * sh.block_size * sh.n_kv_heads * sh.head_dim;
    std::mt19937 rng(1234);
    std::uniform_real_distribution<float> uni(-1.0f, 1.0f);

    // K/V: random values, generated on the host in chunks to bound host memory.
    pkv::DeviceBuffer<float> k(cache_floats), v(cache_floats);  // [num_blocks, block_size, n_kv_heads, head_dim]
    {
        std::vector<float> chunk(std::min<size_t>(cache_floats, (size_t)1 << 24));
        for (size_t off = 0; off < cache_floats; off += chunk.size()) {
            const size_t n = std::min(chunk.size(), cache_floats - off);
            for (size_t i = 0; i < n; ++i) chunk[i] = uni(rng);
            pkv::copy_to_device(k.data() + off, chunk.data(), n * sizeof(float));
            for (size_t i = 0; i < n; ++i) chunk[i] = uni(rng);
            pkv::copy_to_device(v.data() + off, chunk.data(), n * sizeof(float));
        }
    }
    // Block tables: a random permutation of all blocks, so no sequence is contiguous.
    std::vector<int32_t> perm(num_blocks);
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    std::vector<int32_t> token_seq(sh.batch), positions(sh.batch, sh.ctx - 1);
    std::iota(token_seq.begin(), token_seq.end(), 0);
    std::vector<float> q((size_t)sh.batch * sh.n_heads * sh.head_dim);
    for (float& x : q) x = uni(rng);
    pkv::DeviceBuffer<int32_t> d_tables, d_seq, d_pos;
    pkv::DeviceBuffer<float> d_q, d_out(q.size());
    d_tables.upload(perm);
    d_seq.upload(token_seq);
    d_pos.upload(positions);
    d_q.upload(q);
    const pkv::AttentionShape s{sh.n_heads, sh.n_kv_heads, sh.head_dim, sh.block_size, blocks_per_seq};
    auto attend = [&]() {
        pkv::paged_attention(d_out.data(), d_q.data(), k.data(), v.data(), d_tables.data(), d_seq.data(), d_pos.data(), sh.batch, s);
    };

    // Timing.
    const double bytes = 2.0 * sh.batch * (double)sh.ctx * sh.n_kv_heads * sh.head_dim * sizeof(float);
    double ms = 0;
#ifdef __CUDACC__
    (void)emulated;
    pkv::DeviceBuffer<char> flush((size_t)256 << 20);
    cudaEvent_t e0, e1;
    pkv::cuda_check(cudaEventCreate(&e0), "event");
    pkv::cuda_check(cudaEventCreate(&e1), "event");
    attend();  // warm-up
    std::vector<float> times;
    for (int i = 0; i < iters; ++i) {
        pkv::device_memset(flush.data(), i & 0xFF, flush.size());  // evict K/V from L2
        cudaEventRecord(e0);
        attend();
        cudaEventRecord(e1);
        pkv::cuda_check(cudaEventSynchronize(e1), "event sync");
        float t = 0;
        cudaEventElapsedTime(&t, e0, e1);
        times.push_back(t);
    }
    std::sort(times.begin(), times.end());
    ms = times[times.size() / 2];  // median
#else
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < iters; ++i) attend();
    ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() / iters;
#endif

    // Check two rows against the CPU reference (on host copies).
    std::vector<float> out(q.size()), hk(cache_floats), hv(cache_floats);
    d_out.download(out.data(), out.size());
    k.download(hk.data(), cache_floats);
    v.download(hv.data(), cache_floats);
    double max_err = 0;
    for (int t : {0, sh.batch - 1}) {
        std::vector<float> ref((size_t)sh.n_heads * sh.head_dim);
        const int32_t seq0 = 0;
        pkv::paged_attention_ref(ref.data(), q.data() + (size_t)t * ref.size(), hk.data(), hv.data(),
                                 perm.data() + (size_t)t * blocks_per_seq, &seq0, &positions[t], 1, s);
        // A NaN anywhere must fail the check: std::max would drop it.
        for (size_t i = 0; i < ref.size(); ++i) {
            const double e = std::fabs((double)ref[i] - out[(size_t)t * ref.size() + i]);
            max_err = (std::isnan(e) || std::isnan(max_err)) ? NAN : std::max(max_err, e);
        }
    }
    const double gbps = bytes / (ms * 1e-3) / 1e9;
    if (emulated)
        std::printf("  %-40s emulated in %.0f ms (K/V %.1f MB; max |err| vs CPU reference %.1e)\n", sh.name, ms, bytes / 1e6, max_err);
    else
        std::printf("  %-40s %9.3f ms  %8.1f GB/s  %5.1f%% of %.1f TB/s  (K/V %.0f MB; max |err| vs CPU %.1e)\n", sh.name, ms, gbps,
                    100.0 * gbps * 1e9 / kPeakBytesPerSec, kPeakBytesPerSec / 1e12, bytes / 1e6, max_err);
    return max_err;
}

}  // namespace

// The larger error, NaN counting as the largest.
double worst(double a, double b) { return std::isnan(a) || std::isnan(b) ? NAN : std::max(a, b); }

int run(int argc, char** argv) {
    int iters = 20;
    cli::Parser p("bench_attention", "[options]",
                  "Decode paged attention, float32 KV: time (CUDA events, L2 flushed), GB/s of K/V read,\n"
                  "% of the H200's 4.8 TB/s. Built by `make cuda`, run on a GPU. The CPU build runs small\n"
                  "shapes through the emulated kernel: a correctness smoke test, not a benchmark.");
    p.integer("--iters", &iters, 1, 10000, "timed runs per shape (the median is reported)");
    p.parse(argc, argv);
    std::string why;
    if (!pkv::device_available(&why)) {
        std::fprintf(stderr, "bench_attention: no usable GPU here (%s)\n", why.c_str());
        return 1;
    }
    const bool emulated = std::string(pkv::kDeviceKind) == "emulated";
    double err = 0;
    if (emulated) {
        std::printf("bench_attention (CPU build: kernels emulated; small shapes, timings are not GPU figures)\n");
        err = worst(err, run_shape({"batch 4 x ctx 256, 8q/2kv, hd 64", 4, 256, 8, 2, 64, 16}, 1, true));
        err = worst(err, run_shape({"batch 1 x ctx 1024, 8q/2kv, hd 128", 1, 1024, 8, 2, 128, 16}, 1, true));
    } else {
        std::printf("bench_attention (GPU, float32 KV, block size 16, median of %d runs after an L2 flush)\n", iters);
        err = worst(err, run_shape({"A: batch 64 x ctx 4096, 32q/8kv, hd 128", 64, 4096, 32, 8, 128, 16}, iters, false));
        err = worst(err, run_shape({"B: batch 1 x ctx 32768, 32q/8kv, hd 128", 1, 32768, 32, 8, 128, 16}, iters, false));
    }
    if (!(err <= 1e-4)) {  // also true for NaN
        std::fprintf(stderr, "bench_attention: kernel output differs from the CPU reference by %.2e\n", err);
        return 1;
    }
    return 0;
}

int main(int argc, char** argv) { return cli::guarded_main("bench_attention", [&] { return run(argc, argv); }); }

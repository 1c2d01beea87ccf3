// lab/bench_attention.cpp -- lab/LAB.md chapter L2: how close does
// paged_attention get to the GPU's memory bandwidth, and is every number it
// writes right?
//
// Decode attention is memory-bound: each query token reads its whole context's
// K and V once and does ~2 flops per byte. So the figure of merit is bytes
// moved per second, set beside two ceilings: the GPU's peak bandwidth (from
// the device itself, or a datasheet table) and what a plain device-to-device
// cudaMemcpy reaches on the same GPU, which is the honest "100%".
//
// Shapes (block size 16, shuffled block tables so no sequence is contiguous):
//   A_b64_ctx4096   batch 64 x context 4096, 32 query heads / 8 KV heads, head_dim 128
//   B_b1_ctx32768   batch 1 x context 32768, same heads
//   S1, S2          two small shapes, for the CPU build (emulated kernels)
// each with an f32, an f16 and an int8 cache. Every run is timed with CUDA
// events after flushing the L2 (by writing a 256 MB buffer), so K/V come from
// HBM, not from cache; the median of --iters runs is reported.
//
// Correctness is not sampled: every output element of every token is compared
// with paged_attention_ref on the CPU, which reads the very same cache bytes
// (f16 halves and int8 codes included), so the only honest difference is the
// order of float sums. A NaN or an infinity anywhere fails the check.
//
// The kernels run come from one table, kernel_table() below: a name and a call.
// Each (kernel, shape, dtype) ends in exactly one line
//   RESULT <shape> <dtype> <kernel> <GB/s> <%peak> <%copy> PASS|FAIL
// (under emulation the three figures are "-": a CPU pretending to be a GPU has
// no bandwidth worth printing, but PASS/FAIL is as real as on the GPU). The exit
// status is 1 when any RESULT is FAIL. --inject-nan proves that it can be:
// after each checked run it writes one NaN into the output, and the run must
// fail.
//
//   build/cuda/bench_attention [--iters N] [--shapes S] [--dtype D]   (`make cuda`, a GPU)
//   build/bench_attention                                              (CPU build: small shapes)
#include <algorithm>
#include <atomic>
#include <cctype>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "core/block_pool.hpp"
#include "lab/cost_model.hpp"
#include "examples/cli.hpp"
#include "lab/fast_gpu.cuh"
#include "paged_kv.cuh"

namespace {

// ---------------------------------------------------------------------------
// What is run: shapes, dtypes, kernels
// ---------------------------------------------------------------------------

struct Shape {
    const char* name;  // one word: it is a column of the RESULT line
    int batch, ctx, n_heads, n_kv_heads, head_dim, block_size;
};
// The GPU shapes of the issue, and two small ones the emulation runs in
// seconds. The small ones still have GQA (4 query heads per kv head) and many
// tiles; S1's 250 keys also end in a half-full block and a part tile, the
// edge the large shapes (whole blocks, whole tiles) never reach.
const std::vector<Shape> kSmallShapes = {{"S1_b4_ctx250", 4, 250, 8, 2, 64, 16}, {"S2_b1_ctx1024", 1, 1024, 8, 2, 128, 16}};
const std::vector<Shape> kLargeShapes = {{"A_b64_ctx4096", 64, 4096, 32, 8, 128, 16}, {"B_b1_ctx32768", 1, 32768, 32, 8, 128, 16}};

// One attention problem, all pointers in device memory: what every kernel of
// the table is handed.
struct Problem {
    float* out;                // [batch, n_heads, head_dim]
    const float* q;            // [batch, n_heads, head_dim]
    pkv::KVView k, v;          // [num_blocks, block_size, n_kv_heads, head_dim] (+ int8 scales)
    const int32_t* tables;     // [batch, blocks_per_seq]
    const int32_t* token_seq;  // [batch] token t belongs to sequence t
    const int32_t* positions;  // [batch] ctx - 1: each token attends to the whole context
    int batch;
    pkv::AttentionShape shape;
};

struct Kernel {
    std::string name;  // the RESULT line's <kernel> column
    std::function<void(const Problem&)> run;
};

// The problem as every attention kernel takes it.
pkv::AttentionArgs args_of(const Problem& p) {
    return {p.out, p.q, p.k, p.v, p.tables, p.token_seq, p.positions, p.batch, p.shape};
}

// THE list of kernels this program measures. Everything below loops over it,
// so a kernel added here is checked, timed and reported like the others, and
// cannot be measured without also being checked.
// Two today: the teaching baseline (paged_kv.cuh: one thread block per token
// and kv head) and the partitioned pair (lab/attention_partitioned.cuh: long
// contexts split across blocks), whose workspace is allocated once, at the
// first call, and kept for the timed ones.
std::vector<Kernel> kernel_table() {
    auto partitioned = std::make_shared<pkv::PartitionedAttention>();
    return {
        {pkv::to_string(pkv::AttentionKernel::kBaseline), [](const Problem& p) { pkv::paged_attention(args_of(p)); }},
        {pkv::to_string(pkv::AttentionKernel::kPartitioned), [partitioned](const Problem& p) { (*partitioned)(args_of(p)); }},
    };
}

// ---------------------------------------------------------------------------
// The device: its name, its peak bandwidth, what a copy reaches
// ---------------------------------------------------------------------------

struct DeviceInfo {
    std::string name;
    bool emulated = false;
    double peak_bw = 0;       // bytes/s
    std::string peak_source;  // where peak_bw came from
    double copy_bw = 0;       // bytes/s of a D2D cudaMemcpy, read + write counted; 0 = not measured
    const pkv::GpuSpec* preset = nullptr;  // the cost model's GPU for this device
    std::string preset_note;
};

// The cost model's preset for a device name: a word of the name equal to the
// preset's name before any '-' ("NVIDIA H200" -> h200, "NVIDIA A100-SXM4-80GB"
// -> a100-80g). Whole words, so an L40S is not taken for an L4.
const pkv::GpuSpec* preset_for(const std::string& device_name) {
    std::vector<std::string> words(1);
    for (char c : device_name) {
        if (std::isalnum((unsigned char)c)) words.back() += (char)std::tolower((unsigned char)c);
        else if (!words.back().empty()) words.emplace_back();
    }
    for (const pkv::GpuSpec& g : pkv::gpu_presets()) {
        const std::string key = g.name.substr(0, g.name.find('-'));
        if (std::find(words.begin(), words.end(), key) != words.end()) return &g;
    }
    return nullptr;
}

DeviceInfo probe_device() {
    DeviceInfo d;
    const pkv::GpuSpec& h200 = pkv::find_preset(pkv::gpu_presets(), "h200", "GPU");
#ifdef __CUDACC__
    int dev = 0;
    pkv::cuda_check(cudaGetDevice(&dev), "cudaGetDevice");
    cudaDeviceProp prop{};
    pkv::cuda_check(cudaGetDeviceProperties(&prop, dev), "cudaGetDeviceProperties");
    d.name = prop.name;
    d.preset = preset_for(d.name);
    d.preset_note = d.preset ? "matched the device name" : "no preset matches the device name, so h200";
    if (!d.preset) d.preset = &h200;
    // Peak bandwidth from the device itself. cudaDeviceProp's memoryClockRate
    // and memoryBusWidth are gone from CUDA 13, the attributes are not: memory
    // clock (kHz) x 2 (double data rate) x bus width (bits) / 8.
    int clock_khz = 0, bus_bits = 0;
    if (cudaDeviceGetAttribute(&clock_khz, cudaDevAttrMemoryClockRate, dev) == cudaSuccess &&
        cudaDeviceGetAttribute(&bus_bits, cudaDevAttrGlobalMemoryBusWidth, dev) == cudaSuccess && clock_khz > 0 && bus_bits > 0) {
        d.peak_bw = 2.0 * clock_khz * 1e3 * bus_bits / 8.0;
        d.peak_source = "device attributes: " + std::to_string(clock_khz / 1000) + " MHz x 2 (DDR) x " + std::to_string(bus_bits) + "-bit bus";
    } else {
        (void)cudaGetLastError();  // clear the failed query's error
        d.peak_bw = d.preset->memory_bw;
        d.peak_source = "datasheet table (" + d.preset->source + "): the device did not report its memory clock";
    }
    // What a plain copy reaches: 1 GiB device to device, the median of 9 after
    // a warm-up, timed with events. It reads 1 GiB and writes 1 GiB, so 2 GiB
    // moved: the same counting as the kernels' bytes (read + written).
    {
        const size_t bytes = (size_t)1 << 30;
        pkv::DeviceBuffer<char> src(bytes), dst(bytes);
        pkv::device_memset(src.data(), 1, bytes);
        pkv::device_memset(dst.data(), 2, bytes);
        cudaEvent_t e0, e1;
        pkv::cuda_check(cudaEventCreate(&e0), "cudaEventCreate");
        pkv::cuda_check(cudaEventCreate(&e1), "cudaEventCreate");
        std::vector<float> ms;
        for (int i = 0; i < 10; ++i) {
            pkv::cuda_check(cudaEventRecord(e0), "cudaEventRecord");
            pkv::cuda_check(cudaMemcpy(dst.data(), src.data(), bytes, cudaMemcpyDeviceToDevice), "cudaMemcpy D2D");
            pkv::cuda_check(cudaEventRecord(e1), "cudaEventRecord");
            pkv::cuda_check(cudaEventSynchronize(e1), "cudaEventSynchronize");
            float t = 0;
            pkv::cuda_check(cudaEventElapsedTime(&t, e0, e1), "cudaEventElapsedTime");
            if (i > 0) ms.push_back(t);  // the first is the warm-up
        }
        cudaEventDestroy(e0);
        cudaEventDestroy(e1);
        std::sort(ms.begin(), ms.end());
        d.copy_bw = 2.0 * (double)bytes / (ms[ms.size() / 2] * 1e-3);
    }
#else
    d.name = "emulated CPU";
    d.emulated = true;
    d.preset = preset_for(d.name) ? preset_for(d.name) : &h200;  // (no preset is a CPU: always h200)
    d.preset_note = "no GPU here; h200, to show what the model expects there";
    d.peak_source = "none: the kernels run emulated, as CPU threads";
#endif
    return d;
}

// ---------------------------------------------------------------------------
// One problem: cache, tables, queries, the CPU reference
// ---------------------------------------------------------------------------

// Runs fn(0) .. fn(n-1) on every hardware thread (plain std::thread, so the
// sanitizer builds without OpenMP parallelize too). The CPU reference for
// shape A is ~4 GFLOP: split this way it takes seconds, not a minute.
void parallel_for(int n, const std::function<void(int)>& fn) {
    const int workers = std::max(1, std::min(n, (int)std::thread::hardware_concurrency()));
    std::atomic<int> next{0};
    std::vector<std::thread> pool;
    for (int w = 0; w < workers; ++w)
        pool.emplace_back([&] {
            for (int i = next++; i < n; i = next++) fn(i);
        });
    for (std::thread& t : pool) t.join();
}

// Bytes one run of the kernel must move, the "bytes" of every GB/s printed:
//   per token, K and V of all ctx positions and kv heads (ctx x n_kv_heads x
//   head_dim elements each, at the dtype's size), the int8 scales of those
//   positions (ctx x n_kv_heads floats each), its query (read) and its output
//   (written), n_heads x head_dim floats each.
// Not counted: the block table (4 bytes per 16 positions, under 0.1%), the
// positions and token_seq entries. Each K/V vector is counted once per token,
// as the kernel reads it once for the whole GQA group.
double bytes_moved(const Shape& sh, pkv::KVDtype dt) {
    const double kv_elems = (double)sh.ctx * sh.n_kv_heads * sh.head_dim;
    const double scales = dt == pkv::KVDtype::kInt8 ? (double)sh.ctx * sh.n_kv_heads * sizeof(float) : 0.0;
    const double per_token = 2.0 * (kv_elems * pkv::kv_dtype_bytes(dt) + scales) + 2.0 * sh.n_heads * sh.head_dim * sizeof(float);
    return per_token * sh.batch;
}

// The cost model's attention time for this shape (cost_model.hpp step_cost on
// a one-layer "model" with these heads and this KV element size): batch
// requests, each decoding one token with ctx keys. Its bytes leave out the
// int8 scales and add one token's write per request, both under 3% here; it
// assumes kernels reach CostParams::bw_efficiency (80%) of peak bandwidth.
double predicted_seconds(const Shape& sh, pkv::KVDtype dt, const pkv::GpuSpec& gpu) {
    const pkv::ModelSpec m{"bench", pkv::shape_of(sh.n_heads * sh.head_dim, 1, 1, sh.n_heads, sh.n_kv_heads, 1, sh.ctx, true), 4,
                           pkv::kv_dtype_bytes(dt), "bench_attention shape"};
    const pkv::Hardware hw = pkv::hardware_of(gpu, pkv::find_preset(pkv::pcie_presets(), gpu.pcie, "PCIe link"));
    const std::vector<pkv::StepItem> items(sh.batch, pkv::StepItem{1, sh.ctx});
    return pkv::step_cost(m, hw, pkv::CostParams{}, items, 0, 0.0).attention_s;
}

// A NaN in one output element, written after the real kernel (--inject-nan):
// the check must catch it.
template <class = void>
PKV_KERNEL void write_nan_kernel(float* out, int64_t i) {
    out[i] = NAN;
}

// Element-wise tolerance: |got - want| <= kAtol + kRtol x |want|. Both paths
// read the same cache values, so they differ only by float rounding in sums of
// up to 32768 terms (a few 1e-6 of outputs that are ~1e-2); a real bug (one
// 16-key block skipped or read twice) moves outputs by ~1e-3.
constexpr double kAtol = 2e-5, kRtol = 1e-3;

struct CheckResult {
    size_t bad = 0, first_bad = 0;  // elements out of tolerance, NaN and inf included
    double max_err = 0;             // the largest |error| among the good ones
    float got = 0, want = 0;        // at first_bad
};
CheckResult compare(const std::vector<float>& got, const std::vector<float>& want) {
    CheckResult r;
    for (size_t i = 0; i < want.size(); ++i) {
        const double err = std::fabs((double)got[i] - (double)want[i]);
        // Written so that NaN fails: every comparison with NaN is false, so
        // !(err <= tol) is true for it, where (err > tol) would be false.
        if (!(err <= kAtol + kRtol * std::fabs((double)want[i]))) {
            if (r.bad++ == 0) { r.first_bad = i; r.got = got[i]; r.want = want[i]; }
        } else if (err > r.max_err) {
            r.max_err = err;
        }
    }
    return r;
}

struct Options {
    int iters = 20;
    enum Shapes { kAuto, kSmall, kLarge, kAll } shapes = kAuto;
    enum Dtypes { kAllDtypes, kF32, kF16, kInt8 } dtype = kAllDtypes;
    bool inject_nan = false;
};

std::string fixed(double x, const char* fmt) {
    char b[64];
    std::snprintf(b, sizeof b, fmt, x);
    return b;
}

// Runs every kernel of the table on one (shape, dtype); prints one detail line
// and one RESULT line per kernel; returns how many FAILed.
int run_case(const Shape& sh, pkv::KVDtype dt, const std::vector<Kernel>& kernels, const DeviceInfo& dev, const Options& o) {
    const int blocks_per_seq = (int)pkv::blocks_for_tokens(sh.ctx, sh.block_size);
    const int num_blocks = sh.batch * blocks_per_seq;
    const int hd = sh.head_dim;

    // The cache, in host memory first: random values in [-1, 1), stored
    // through kv_store (so f16 rounds and int8 quantizes exactly as the engine
    // does). Block b draws from its own seed, so the values do not depend on
    // how the blocks are shared out among threads, and every dtype quantizes
    // the same numbers.
    const pkv::KVGeometry geo{1, num_blocks, sh.block_size, sh.n_kv_heads, hd, dt};
    pkv::KVCache host(geo);  // k, v: [num_blocks, block_size, n_kv_heads, head_dim] of dt; scales [.., n_kv_heads]
    const pkv::KVView hk = host.k_view(0), hv = host.v_view(0);
    parallel_for(num_blocks, [&](int b) {
        uint64_t state = 0x9E3779B97F4A7C15ull * (uint64_t)(b + 1);
        std::vector<float> x(hd);  // [head_dim] one head vector
        for (int slot = b * sh.block_size; slot < (b + 1) * sh.block_size; ++slot)
            for (int h = 0; h < sh.n_kv_heads; ++h)
                for (const pkv::KVView* view : {&hk, &hv}) {
                    for (float& e : x) e = 2.0f * pkv::uniform01(state) - 1.0f;
                    pkv::kv_store(*view, slot, h, x.data());
                }
    });
    pkv::DeviceBuffer<std::byte> d_k, d_v;       // the same bytes on the device
    pkv::DeviceBuffer<float> d_kscale, d_vscale;  // [num_blocks, block_size, n_kv_heads], int8 only
    d_k.upload(host.k);
    d_v.upload(host.v);
    d_kscale.upload(host.k_scale);
    d_vscale.upload(host.v_scale);
    const bool int8 = dt == pkv::KVDtype::kInt8;
    const pkv::KVView dk{dt, d_k.data(), int8 ? d_kscale.data() : nullptr, sh.n_kv_heads, hd};
    const pkv::KVView dv{dt, d_v.data(), int8 ? d_vscale.data() : nullptr, sh.n_kv_heads, hd};

    // Block tables: a random permutation of all blocks, so no sequence is contiguous.
    std::mt19937 rng(1234);
    std::vector<int32_t> tables(num_blocks);  // [batch, blocks_per_seq]
    std::iota(tables.begin(), tables.end(), 0);
    std::shuffle(tables.begin(), tables.end(), rng);
    std::vector<int32_t> token_seq(sh.batch), positions(sh.batch, sh.ctx - 1);  // [batch] each
    std::iota(token_seq.begin(), token_seq.end(), 0);
    std::uniform_real_distribution<float> uni(-1.0f, 1.0f);
    std::vector<float> q((size_t)sh.batch * sh.n_heads * hd);  // [batch, n_heads, head_dim]
    for (float& x : q) x = uni(rng);
    pkv::DeviceBuffer<int32_t> d_tables, d_seq, d_pos;
    pkv::DeviceBuffer<float> d_q, d_out(q.size());
    d_tables.upload(tables);
    d_seq.upload(token_seq);
    d_pos.upload(positions);
    d_q.upload(q);
    const Problem prob{d_out.data(), d_q.data(), dk, dv, d_tables.data(), d_seq.data(), d_pos.data(), sh.batch,
                       pkv::AttentionShape{sh.n_heads, sh.n_kv_heads, hd, sh.block_size, blocks_per_seq}};

    // The CPU reference for every output, split over (token, kv head) pairs so
    // that batch 1 parallelizes too. One pair is a problem of its own: one
    // token whose G query heads all read kv head g. paged_attention_ref finds
    // kv head h / G = 0 for each, so we hand it views whose data (and int8
    // scales) start at kv head g, keeping n_kv_heads as the row stride.
    std::vector<float> ref(q.size());  // [batch, n_heads, head_dim]
    const int G = sh.n_heads / sh.n_kv_heads;
    const pkv::AttentionShape one_group{G, 1, hd, sh.block_size, blocks_per_seq};
    parallel_for(sh.batch * sh.n_kv_heads, [&](int task) {
        const int t = task / sh.n_kv_heads, g = task % sh.n_kv_heads;
        pkv::KVView k = hk, v = hv;
        const size_t head_bytes = (size_t)g * hd * pkv::kv_dtype_bytes(dt);
        k.data = static_cast<std::byte*>(hk.data) + head_bytes;
        v.data = static_cast<std::byte*>(hv.data) + head_bytes;
        if (int8) { k.scale += g; v.scale += g; }
        const size_t off = ((size_t)t * sh.n_heads + (size_t)g * G) * hd;
        const int32_t row0 = 0;
        pkv::paged_attention_ref(ref.data() + off, q.data() + off, k, v, tables.data() + (size_t)t * blocks_per_seq, &row0,
                                 &positions[t], 1, one_group);
    });

    const double bytes = bytes_moved(sh, dt);
    const double model_s = predicted_seconds(sh, dt, *dev.preset);
    int failed = 0;
    for (const Kernel& kern : kernels) {
        // Checked run. The output starts as all-ones bytes (a NaN in every
        // float), so an element the kernel forgets to write fails the check.
        pkv::device_memset(d_out.data(), 0xFF, d_out.size() * sizeof(float));
        kern.run(prob);
        if (o.inject_nan) {
            // Through launch(), as a real kernel would be: the NaN lands in
            // device memory, after the attention kernel (one stream, in order),
            // and comes back only through the download below.
            using namespace pkv;  // dim3 is CUDA's own under nvcc, pkv's when emulated
            launch(write_nan_kernel<>, dim3(1), dim3(1), 0, d_out.data(), (int64_t)((size_t)(sh.batch / 2) * sh.n_heads * hd + hd + 1));
        }
        std::vector<float> out(q.size());
        d_out.download(out.data(), out.size());
        const CheckResult c = compare(out, ref);

        // Timed runs: each after an L2 flush, the median reported.
        //  - The checked run above doubles as the warm-up: the first launch of
        //    a kernel pays for loading its module, which no later one does.
        //  - CUDA events are recorded into the stream on each side of the
        //    kernel, so they time the GPU's work, not the host's launch call
        //    (a launch returns long before the kernel ends).
        //  - The flush writes 256 MB, five times an H200's 50 MB L2, so no K/V
        //    of the previous run is still in cache: we measure HBM, as a real
        //    decode step (whose last touch of this layer's K/V was a whole
        //    forward pass ago) would see it.
        //  - The median, not the mean: one slow run (a clock ramping up, a
        //    neighbour on the machine) moves a mean but not a median.
        double seconds = 0;
#ifdef __CUDACC__
        pkv::DeviceBuffer<char> flush((size_t)256 << 20);
        cudaEvent_t e0, e1;
        pkv::cuda_check(cudaEventCreate(&e0), "cudaEventCreate");
        pkv::cuda_check(cudaEventCreate(&e1), "cudaEventCreate");
        std::vector<float> ms;
        for (int i = 0; i < o.iters; ++i) {
            pkv::device_memset(flush.data(), i & 0xFF, flush.size());  // evict K/V from L2
            pkv::cuda_check(cudaEventRecord(e0), "cudaEventRecord");
            kern.run(prob);
            pkv::cuda_check(cudaEventRecord(e1), "cudaEventRecord");
            pkv::cuda_check(cudaEventSynchronize(e1), "cudaEventSynchronize");
            float t = 0;
            pkv::cuda_check(cudaEventElapsedTime(&t, e0, e1), "cudaEventElapsedTime");
            ms.push_back(t);
        }
        cudaEventDestroy(e0);
        cudaEventDestroy(e1);
        std::sort(ms.begin(), ms.end());
        seconds = ms[ms.size() / 2] * 1e-3;
#endif
        const bool pass = c.bad == 0;
        failed += !pass;

        // The detail line, then the RESULT line.
        std::printf("%s %s %s: %s, %.1f MB moved; model (%s) %.1f us = %.0f GB/s; ", sh.name, pkv::to_string(dt), kern.name.c_str(),
                    dev.emulated ? "emulated" : fixed(seconds * 1e3, "%.3f ms").c_str(), bytes / 1e6, dev.preset->name.c_str(),
                    model_s * 1e6, bytes / model_s / 1e9);
        if (pass)
            std::printf("all %zu outputs within %.0e + %.0e|ref| (max |err| %.1e)\n", ref.size(), kAtol, kRtol, c.max_err);
        else {
            const size_t per_tok = (size_t)sh.n_heads * hd, i = c.first_bad;
            std::printf("%zu of %zu outputs off, first at token %zu head %zu d %zu: got %g, want %g\n", c.bad, ref.size(), i / per_tok,
                        i % per_tok / hd, i % hd, (double)c.got, (double)c.want);
        }
        const double bw = seconds > 0 ? bytes / seconds : 0;
        const bool timed = !dev.emulated && bw > 0;
        std::printf("RESULT %s %s %s %s %s %s %s\n", sh.name, pkv::to_string(dt), kern.name.c_str(),
                    timed ? fixed(bw / 1e9, "%.1f").c_str() : "-", timed ? fixed(100.0 * bw / dev.peak_bw, "%.1f").c_str() : "-",
                    timed && dev.copy_bw > 0 ? fixed(100.0 * bw / dev.copy_bw, "%.1f").c_str() : "-", pass ? "PASS" : "FAIL");
        std::fflush(stdout);
    }
    return failed;
}

}  // namespace

int run(int argc, char** argv) {
    Options o;
    cli::Parser p("bench_attention", "[options]",
                  "Decode paged attention on f32, f16 and int8 caches: every output checked against the CPU\n"
                  "reference, and on a GPU the time (CUDA events, L2 flushed), the bytes moved per second, and\n"
                  "that as a % of peak bandwidth and of a device-to-device copy. One line per (shape, dtype,\n"
                  "kernel): RESULT <shape> <dtype> <kernel> <GB/s> <%peak> <%copy> PASS|FAIL; exit status 1\n"
                  "if any FAILs. The CPU build emulates the kernels: correctness only, no figures.");
    p.integer("--iters", &o.iters, 1, 10000, "timed runs per shape (the median is reported; GPU only)");
    p.choice("--shapes", &o.shapes,
             {{"auto", Options::kAuto}, {"small", Options::kSmall}, {"large", Options::kLarge}, {"all", Options::kAll}},
             "small: S1, S2; large: A (batch 64 x ctx 4096), B (batch 1 x ctx 32768); auto: large on a GPU, small emulated "
             "(large emulated takes many minutes)");
    p.choice("--dtype", &o.dtype,
             {{"all", Options::kAllDtypes}, {"f32", Options::kF32}, {"f16", Options::kF16}, {"int8", Options::kInt8}},
             "KV cache element types to run");
    p.flag("--inject-nan", &o.inject_nan, "test the check: write a NaN into one output after each checked run (must FAIL, exit 1)");
    p.parse(argc, argv);

    // A CUDA build on a machine without a usable GPU stops here, with the
    // driver's own reason (tests/gpu_check.sh shows it in its log).
    std::string why;
    if (!pkv::device_available(&why)) {
        std::fprintf(stderr, "bench_attention: no usable GPU here (%s)\n", why.c_str());
        return 1;
    }
    const DeviceInfo dev = probe_device();
    std::printf("device: %s\n", dev.name.c_str());
    if (dev.emulated) {
        std::printf("peak bandwidth: - (%s)\ncopy bandwidth: - (no device to copy on)\n", dev.peak_source.c_str());
    } else {
        std::printf("peak bandwidth: %.0f GB/s (%s)\n", dev.peak_bw / 1e9, dev.peak_source.c_str());
        std::printf("copy bandwidth: %.0f GB/s (cudaMemcpy device to device of 1 GiB, median of 9; read + write counted)\n",
                    dev.copy_bw / 1e9);
    }
    std::printf("cost model: GPU preset %s (%s)\n", dev.preset->name.c_str(), dev.preset_note.c_str());
    if (!dev.emulated) std::printf("timing: median of %d runs, each after a 256 MB L2 flush\n", o.iters);

    std::vector<Shape> shapes;
    const bool small = o.shapes == Options::kSmall || o.shapes == Options::kAll || (o.shapes == Options::kAuto && dev.emulated);
    const bool large = o.shapes == Options::kLarge || o.shapes == Options::kAll || (o.shapes == Options::kAuto && !dev.emulated);
    if (small) shapes.insert(shapes.end(), kSmallShapes.begin(), kSmallShapes.end());
    if (large) shapes.insert(shapes.end(), kLargeShapes.begin(), kLargeShapes.end());
    std::vector<pkv::KVDtype> dtypes;
    const std::pair<pkv::KVDtype, Options::Dtypes> all_dtypes[] = {
        {pkv::KVDtype::kF32, Options::kF32}, {pkv::KVDtype::kF16, Options::kF16}, {pkv::KVDtype::kInt8, Options::kInt8}};
    for (const auto& [d, opt] : all_dtypes)
        if (o.dtype == Options::kAllDtypes || o.dtype == opt) dtypes.push_back(d);

    // Every (shape, dtype): the cache is built and the reference computed once,
    // then every kernel of the table runs against them.
    const std::vector<Kernel> kernels = kernel_table();
    int failed = 0, total = 0;
    for (const Shape& sh : shapes)
        for (pkv::KVDtype dt : dtypes) {
            failed += run_case(sh, dt, kernels, dev, o);
            total += (int)kernels.size();
        }
    if (failed > 0) {
        std::fprintf(stderr, "bench_attention: %d of %d results FAIL (outputs differ from the CPU reference)\n", failed, total);
        return 1;
    }
    return 0;
}

int main(int argc, char** argv) { return cli::guarded_main("bench_attention", [&] { return run(argc, argv); }); }

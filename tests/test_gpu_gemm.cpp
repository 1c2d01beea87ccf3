// tests/test_gpu_gemm.cpp -- the tiled GEMM (lab/gemm_tiled.cuh's gemm_kernel)
// against the CPU's matmul(), bit for bit.
//
// The GEMM promises more than "close": every output is summed in exactly
// dot()'s order, so it must equal matmul() in every bit, for every T, n and d,
// whichever launch shape gemm_tiled() picked and whichever block computed it. These
// tests hold it to that:
//
//   1. tree_sum(), the split of combine8() between a row's threads;
//   2. gemm_tiled() against matmul() over a grid of shapes (T, n, d), chosen to hit
//      every edge: n % 8 != 0 (dot()'s tail), n % 4 != 0 (rows that are not
//      16-byte aligned: the scalar-load path), n < one tile and n > many,
//      d not a multiple of any block's rows, T not a multiple of any block's
//      tokens;
//   3. every row of the launch table, forced, on shapes of its own and on a
//      base pointer that is not 16-byte aligned; and version 1, gemm_simple;
//   4. batch invariance: a token's outputs are the same bits whatever batch
//      it is computed in, and wherever in the batch it sits.
//
// Like test_kernels.cpp this file is compiled by g++ (kernels emulated) and by
// nvcc (kernels on a GPU), so kernels only ever see DeviceBuffers and results
// come back through download(). Emulation is slow (each block barrier is a
// round trip through the OS scheduler for each thread) and the suite also
// runs under ASan and TSan, so the shapes are chosen for coverage, not size.
#include <doctest/doctest.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/emu/cuda_shim.hpp"
#include "tiny_model/forward_cpu.hpp"
#include "lab/gemm_tiled.cuh"
#include "tiny_model/forward_gpu.cuh"

#include "tests/test_util.hpp"

namespace {

using namespace pkv_test;

// ---------------------------------------------------------------------------
// Helpers (test_kernels.cpp has its own copies; each file stands alone)
// ---------------------------------------------------------------------------

bool no_device() {
    std::string why;
    if (pkv::device_available(&why)) return false;
    skip(SkipKind::kGpu, "no GPU: " + why);
    return true;
}

std::vector<float> random_floats(Rng& rng, size_t n) {
    std::vector<float> v(n);
    for (float& f : v) f = rng.uniform(-1.0f, 1.0f);
    return v;
}

pkv::DeviceBuffer<float> to_device(const std::vector<float>& v) {
    pkv::DeviceBuffer<float> b(v.size());
    b.upload(v);
    return b;
}

std::vector<float> to_host(const pkv::DeviceBuffer<float>& b, size_t n) {
    std::vector<float> v(n);
    b.download(v.data(), n);
    return v;
}

// The CPU's answer for the first T rows of x [., n] and the first d rows of
// W [., n]: out [T, d].
std::vector<float> cpu_matmul(const std::vector<float>& x, const std::vector<float>& W, int T, int n, int d) {
    std::vector<float> out((size_t)T * d);  // [T, d]
    pkv::matmul(out.data(), x.data(), W.data(), T, n, d);
    return out;
}

// A GEMM entry point: gemm_tiled(), one forced row of its launch table, or gemm_simple.
using GemmFn = void (*)(float*, const float*, const float*, int, int, int);

// Run `fn` on device copies and return out [T, d]. The output buffer starts
// as NaN, so an output the kernel forgot to write cannot pass by luck.
std::vector<float> run_gemm(GemmFn fn, const pkv::DeviceBuffer<float>& dx, size_t x_off, const pkv::DeviceBuffer<float>& dW, int T,
                            int n, int d) {
    const size_t size = (size_t)T * d;
    pkv::DeviceBuffer<float> dout(size ? size : 1);  // [T, d]
    pkv::device_memset(dout.data(), 0xFF, dout.size() * sizeof(float));
    fn(dout.data(), dx.data() + x_off, dW.data(), T, n, d);
    return to_host(dout, size);
}

}  // namespace

TEST_SUITE("kernels") {

// ===========================================================================
// 1. tree_sum: combine8, split between threads
// ===========================================================================

// Proves tree_sum<8> is combine8() bit for bit, and that splitting it as gemm_kernel does (G threads x P partials, subtotals then the top of the tree) changes no bit, for P = 1, 2, 4.
TEST_CASE("gemm: tree_sum is combine8, however the 8 partials are split") {
    Rng rng(11);
    for (int trial = 0; trial < 200; ++trial) {
        float a[8];
        // Magnitudes spread over many binades so that a different order would round differently.
        for (float& v : a) v = rng.uniform(-1.0f, 1.0f) * (float)(1 << rng.below(20));
        const float want = pkv::combine8(a);
        const float s1[8] = {a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7]};  // P = 1: G = 8 subtotals
        const float s2[4] = {pkv::tree_sum<2>(a), pkv::tree_sum<2>(a + 2), pkv::tree_sum<2>(a + 4), pkv::tree_sum<2>(a + 6)};
        const float s4[2] = {pkv::tree_sum<4>(a), pkv::tree_sum<4>(a + 4)};
        for (float got : {pkv::tree_sum<8>(a), pkv::tree_sum<8>(s1), pkv::tree_sum<4>(s2), pkv::tree_sum<2>(s4)})
            CHECK(std::memcmp(&got, &want, sizeof got) == 0);
    }
}

// ===========================================================================
// 2. gemm_tiled() against matmul(), over a grid of shapes
// ===========================================================================

// Proves gemm_tiled() equals matmul() bit for bit on shapes (T, n, d) drawn from T in {1,2,3,4,5,7,8,16,33,64}, n in {8,15,16,36,288,768,770}, d in {1,31,288,513} so that every pair of values meets (every T with every n, every T and every n with every d), and that a naive in-order sum differs (the check has teeth).
TEST_CASE("gemm: bit-identical to matmul over T, n, d") {
    if (no_device()) return;
    const int Ts[] = {1, 2, 3, 4, 5, 7, 8, 16, 33, 64};
    const int ns[] = {8, 15, 16, 36, 288, 768, 770};
    // Which shapes? Emulation pays for every block (a barrier per tile, each
    // a round trip through the OS for each of the block's threads), so the
    // whole 10 x 7 x 4 grid would take far too long under TSan. Every T meets
    // every n at d = 1 and d = 31 (one or a few blocks of rows: cheap); at
    // d = 288 and 513 each T meets one n, cycling through them so that every
    // n meets both as well. The expensive corner, large T, n and d at once,
    // has no edge that these lack.
    std::vector<std::array<int, 3>> shapes;  // {T, n, d}
    for (int T : Ts)
        for (int n : ns)
            for (int d : {1, 31}) shapes.push_back({T, n, d});
    for (int j = 0; j < 2; ++j)
        for (int i = 0; i < 10; ++i) shapes.push_back({Ts[i], ns[(6 - i + 3 * j + 7) % 7], j ? 513 : 288});
    Rng rng(2024);
    // One random x and W at the largest shape; a smaller shape uses the
    // first T * n and d * n floats (x and W rows are contiguous, so that is a
    // valid [T, n] and [d, n] matrix).
    const std::vector<float> x = random_floats(rng, (size_t)64 * 770), W = random_floats(rng, (size_t)513 * 770);
    const auto dx = to_device(x), dW = to_device(W);
    int naive_differs = 0;
    for (const auto& sh : shapes) {
        const int T = sh[0], n = sh[1], d = sh[2];  // plain ints: INFO captures them in a lambda, which clang refuses for a structured binding
        INFO("T " << T << ", n " << n << ", d " << d);
        const std::vector<float> want = cpu_matmul(x, W, T, n, d);
        CHECK(first_bit_diff(run_gemm(pkv::gemm_tiled, dx, 0, dW, T, n, d), want) == -1);
        if (T == 1 && d == 31) {
            for (int o = 0; o < d; ++o) {
                float s = 0.0f;
                for (int j = 0; j < n; ++j) s += W[(size_t)o * n + j] * x[j];
                naive_differs += s != want[(size_t)o];
            }
        }
    }
    CHECK(shapes.size() == 160);
    CHECK(naive_differs > 0);  // summation order shows in the bits: exactness is not luck
}

// ===========================================================================
// 3. Every launch shape, aligned and not; and version 1
// ===========================================================================

// Proves each row of gemm_tiled()'s launch table (forced through gemm_launch, whatever T gemm_tiled() would pick it for), and gemm_simple, equal matmul() bit for bit, on T that do and do not fill a block, with x 16-byte aligned (float4 loads) and offset by one float (the scalar fallback).
TEST_CASE("gemm: every launch shape and gemm_simple are bit-identical to matmul") {
    if (no_device()) return;
    struct Entry {
        const char* name;
        GemmFn fn;
    };
    const Entry entries[] = {
        {"<8, 1, 1>", pkv::gemm_launch<8, 1, 1>},   {"<8, 2, 1>", pkv::gemm_launch<8, 2, 1>},
        {"<8, 4, 1>", pkv::gemm_launch<8, 4, 1>},   {"<16, 8, 2>", pkv::gemm_launch<16, 8, 2>},
        {"<32, 16, 4>", pkv::gemm_launch<32, 16, 4>}, {"gemm_simple", pkv::gemm_simple},
    };
    // {T, n, d}: a single token, a partial token group, a full one and more;
    // n with a tail (n % 8), unaligned rows (n % 4), one tile, several tiles
    // and a short last one; d one row, a partial block, several blocks.
    const int shapes[][3] = {{1, 288, 31}, {3, 36, 33}, {5, 770, 20}, {16, 15, 17}, {17, 100, 40}, {2, 7, 3}};
    Rng rng(99);
    const std::vector<float> x = random_floats(rng, (size_t)17 * 770 + 1), W = random_floats(rng, (size_t)65 * 770);
    const auto dx = to_device(x), dW = to_device(W);
    for (const Entry& e : entries)
        for (const auto& sh : shapes)
            for (size_t x_off : {0, 1}) {  // dx.data() + 1 is 4 bytes past a 16-byte boundary
                const int T = sh[0], n = sh[1], d = sh[2];
                INFO(e.name << ": T " << T << ", n " << n << ", d " << d << ", x offset " << x_off);
                const std::vector<float> xs(x.begin() + (long)x_off, x.end());
                CHECK(first_bit_diff(run_gemm(e.fn, dx, x_off, dW, T, n, d), cpu_matmul(xs, W, T, n, d)) == -1);
            }
}

// Proves the emulation holds gemm_kernel to the GPU's alignment rule: told (wrongly) that x is 16-byte aligned, the launch throws instead of quietly computing what a GPU would fault on; gemm_tiled() itself, given that pointer, takes the scalar path and gets the bits right. Emulated builds only: on a GPU the misaligned load would fault the whole context.
#ifndef __CUDACC__
TEST_CASE("gemm: emulated, a misaligned float4 load throws") {
    Rng rng(3);
    const int T = 2, n = 16, d = 8;
    const std::vector<float> xbuf = random_floats(rng, (size_t)T * n + 1), W = random_floats(rng, (size_t)d * n);
    const auto dx = to_device(xbuf), dW = to_device(W);
    pkv::DeviceBuffer<float> dout((size_t)T * d);  // [T, d]
    const size_t smem = (size_t)(2 * (8 + 2) * pkv::kGemmStride + 2 * 8 * 8) * sizeof(float);  // gemm_launch's sum for <8, 2, 1>
    // vec = true, x = dx + 1: rows of 16 floats starting 4 bytes past a 16-byte boundary.
    CHECK_THROWS_AS(pkv::launch(pkv::gemm_kernel<8, 2, 1>, pkv::dim3(1, 1), pkv::dim3(64), smem, dout.data(),
                                (const float*)(dx.data() + 1), (const float*)dW.data(), T, n, d, true),
                    std::logic_error);
    const std::vector<float> x(xbuf.begin() + 1, xbuf.end());  // [T, n]: what the kernel sees at dx + 1
    CHECK(first_bit_diff(run_gemm(pkv::gemm_tiled, dx, 1, dW, T, n, d), cpu_matmul(x, W, T, n, d)) == -1);
}
#endif

// ===========================================================================
// 4. Batch invariance
// ===========================================================================

// Proves a token's GEMM outputs are the same bits whatever batch it is in: rows s .. s+T'-1 of a T = 64 gemm_tiled() equal a separate gemm_tiled() of just those T' rows, for T' in {1,2,3,4,5,7,8,16,33} at several offsets s (so each T' runs with a launch shape of its own, and offsets that break 16-byte alignment take the scalar path).
TEST_CASE("gemm: a token's outputs do not depend on the batch it is in") {
    if (no_device()) return;
    Rng rng(5);
    for (const int n : {36, 770}) {
        const int d = 40, T = 64;
        const std::vector<float> x = random_floats(rng, (size_t)T * n), W = random_floats(rng, (size_t)d * n);
        const auto dx = to_device(x), dW = to_device(W);
        const std::vector<float> all = run_gemm(pkv::gemm_tiled, dx, 0, dW, T, n, d);  // [64, d]
        CHECK(first_bit_diff(all, cpu_matmul(x, W, T, n, d)) == -1);
        for (const int sub : {1, 2, 3, 4, 5, 7, 8, 16, 33})
            for (const int s : {0, 1, T - sub}) {
                INFO("n " << n << ": rows " << s << " .. " << s + sub - 1 << " alone");
                const std::vector<float> part = run_gemm(pkv::gemm_tiled, dx, (size_t)s * n, dW, sub, n, d);  // [sub, d]
                const std::vector<float> same(all.begin() + (long)s * d, all.begin() + (long)(s + sub) * d);
                CHECK(first_bit_diff(part, same) == -1);
            }
    }
}

}  // TEST_SUITE("kernels")

// core/emu/cuda_shim.hpp -- the CUDA emulator, part 1 (skip on a first reading: chapter 8 says
// what you need of it): the one seam between our kernels and where they run.
//
// Every kernel in pagedkv is written once, in CUDA C++. This header lets that
// same source run in two places:
//
//   - under nvcc (__CUDACC__ defined): `launch(...)` is `kernel<<<...>>>`, device
//     memory is cudaMalloc'd, copies are cudaMemcpy. Nothing else.
//   - under g++/clang++: the kernels are plain C++ functions, and `launch(...)`
//     *emulates* a launch on the CPU, on the thread that calls it. Blocks run
//     one after another; the blockDim threads of a block run as fibers (each
//     with its own stack, switched only where a CUDA thread waits for others:
//     at the block barrier and at a shuffle; cuda_emulation.hpp explains
//     why and how), and each block gets its own dynamic shared memory.
//     Device memory is host memory; copies are memcpy.
//
// What the emulation models honestly: the thread/block index space, the
// barrier, per-block shared memory, warp shuffles (shfl_xor), CUDA's launch
// limits, and the order a barrier gives the threads of a block -- declared to
// ThreadSanitizer, so a missing barrier is a data race that TSan reports
// (`make tsan`; TUTORIAL.md chapter 8 shows one). What it
// does not model: timing, warp lockstep and scheduling, memory coalescing,
// bank conflicts, caches, occupancy, or concurrency *between* blocks. It is
// for correctness and for stepping through a kernel in gdb, not for speed.
//
// Rules our kernels follow so both worlds agree:
//   - a kernel is written `template <class = void> PKV_KERNEL void name(...)`
//     and launched as launch(name<>, ...). PKV_KERNEL is __global__ under nvcc
//     and nothing under g++. Why a template with nothing to template on? This
//     header-only project defines every kernel in a header that many .cpp
//     files include, and a function defined in several files must be inline
//     or a template. nvcc ignores `inline` on a __global__ function, and a
//     `static` kernel called from an inline host function gives every file a
//     different kernel behind the same inline function (a one-definition-rule
//     violation). A template is the one kind of kernel C++ lets every file
//     define;
//   - shared memory is only the dynamic kind, reached through
//     `shared_memory<T>()` (sized by launch's shared_bytes), never a static
//     `__shared__` array (which the emulation could not give each block);
//   - the block barrier is spelled `syncthreads()` (pkv's name for CUDA's
//     __syncthreads, which the emulation cannot define: names with a double
//     underscore belong to the compiler);
//   - the one warp intrinsic is the butterfly shuffle, spelled
//     `shfl_xor(v, lane_mask)` (CUDA's __shfl_xor_sync over the full warp,
//     for the same reserved-name reason; shfl_xor_n for several values at
//     once), and only in blocks of whole warps
//     (blockDim a multiple of 32); every lane of the warp calls it, the same
//     number of times. No votes, no __syncwarp: anything else that crosses
//     threads goes through shared memory and syncthreads();
//   - every thread of a block reaches every syncthreads(). CUDA allows the
//     barrier in conditional code only when the condition is the same for the
//     whole block; here a thread that skips one makes launch() throw, naming
//     the threads that wait and those that returned, instead of computing
//     wrong numbers.
//
// Why a shim and not a second implementation: vLLM runs on CPUs through a
// separate backend with kernels of its own. We want the opposite trade: one
// kernel source, so that a test passing on a laptop has run the very index
// math, tile loops and barriers that nvcc compiles. The price is speed --
// emulation runs many times slower than our plain CPU forward (TUTORIAL.md
// appendix A measures it) -- and blindness to everything listed above as not
// modelled. Correctness is proved here; speed only on a GPU (tests/gpu_check.sh).
//
// Sections: 0. CUDA's launch limits (both worlds)  1. real CUDA (thin
// wrappers)  2. the emulation  3. DeviceBuffer, the owning array both worlds
// share.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <map>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#ifdef __CUDACC__
#include <cuda_runtime.h>
#else
#include <type_traits>

#include "cuda_emulation.hpp"  // the fibers that run a block's threads; dim3 and the built-ins
#endif

// Functions that both the host and a kernel call are marked PKV_HD: under
// nvcc `__host__ __device__`, under g++/clang++ nothing, so the very same
// index math compiles into plain C++. PKV_KERNEL marks a kernel (see the rules
// above). These two macros are the only keywords the shim adds.
#ifdef __CUDACC__
#define PKV_HD __host__ __device__
#define PKV_KERNEL __global__
#else
#define PKV_HD
#define PKV_KERNEL
#endif

// What the course kit (COURSE.md, tools/kit.cpp) writes in a student's copy
// where it cut an exercise out of code that may run on a GPU. On the host,
// and in an emulated kernel, it throws (launch() rethrows a kernel thread's
// exception on the host); on a GPU a thread cannot throw, so it prints and
// traps, which fails the launch. Headers that never reach a GPU get a plain
// throw instead.
#if defined(__CUDA_ARCH__)
#define PKV_EXERCISE_TODO(n, title)                                     \
    do {                                                                \
        printf("exercise %d (%s): not implemented\n", (int)(n), title); \
        __trap();                                                       \
    } while (0)
#else
#define PKV_EXERCISE_TODO(n, title) \
    throw std::logic_error("exercise " + std::to_string(n) + " (" + std::string(title) + "): not implemented")
#endif

namespace pkv {

// ============================================================================
// 0. CUDA's launch limits, checked on the host in both worlds
// ============================================================================
//
// A GPU refuses a launch whose shape it cannot run: more than 1024 threads in
// a block, a grid too tall, more dynamic shared memory than the kernel was
// allowed. The emulation would happily run any of them, so a kernel could pass
// every test on a laptop and fail on its first GPU. launch() therefore checks
// the same limits before it runs anything, in both worlds: under nvcc too, so
// that the error is the same exception with the same words, thrown before the
// launch instead of arriving as a cudaError afterwards.
//
// The limits are the same on every GPU since compute capability 3.0 (Kepler):
//   block  x, y <= 1024, z <= 64, and x * y * z <= 1024 threads;
//   grid   x <= 2^31 - 1, y and z <= 65535;
//   dynamic shared memory <= 48 KiB per block, unless the kernel opted in to
//   more with cudaFuncSetAttribute(MaxDynamicSharedMemorySize) -- here
//   set_max_dynamic_shared_memory() -- up to the device's ceiling (227 KiB on
//   H100/H200; the emulation assumes that figure).
// A zero-sized grid is not refused: launch() returns at once (section 1 says
// why), but the block and shared-memory checks still apply.
constexpr size_t kMaxSharedBytes = 48 * 1024;              // without an opt-in
constexpr size_t kMaxSharedBytesOptInEmulated = 227 * 1024;  // H100/H200's opt-in ceiling
constexpr unsigned kMaxBlockThreads = 1024, kMaxBlockXY = 1024, kMaxBlockZ = 64;
constexpr unsigned long long kMaxGridX = 2147483647ull;
constexpr unsigned kMaxGridYZ = 65535;
constexpr int kWarpSize = 32;

namespace detail {
// The opt-ins so far: kernel (its address) -> bytes it may use. One per
// program, as cudaFuncSetAttribute's setting lives as long as the CUDA context.
struct SharedOptIns {
    std::mutex mu;
    std::map<const void*, size_t> bytes;
};
inline SharedOptIns& shared_opt_ins() {
    static SharedOptIns r;
    return r;
}
}  // namespace detail

// The dynamic shared memory `kernel` may ask for: 48 KiB, or what it opted in to.
inline size_t max_dynamic_shared_bytes(const void* kernel) {
    detail::SharedOptIns& r = detail::shared_opt_ins();
    std::lock_guard<std::mutex> lock(r.mu);
    const auto it = r.bytes.find(kernel);
    return it == r.bytes.end() || it->second < kMaxSharedBytes ? kMaxSharedBytes : it->second;
}

// Throws std::invalid_argument naming the limit a launch of this shape breaks.
inline void check_launch_limits(const void* kernel, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                                unsigned bz, size_t shared_bytes) {
    auto dims = [](unsigned x, unsigned y, unsigned z) {
        return "(" + std::to_string(x) + ", " + std::to_string(y) + ", " + std::to_string(z) + ")";
    };
    const unsigned long long nthreads = (unsigned long long)bx * by * bz;
    if (bx == 0 || by == 0 || bz == 0 || bx > kMaxBlockXY || by > kMaxBlockXY || bz > kMaxBlockZ || nthreads > kMaxBlockThreads)
        throw std::invalid_argument("launch: block " + dims(bx, by, bz) + " has " + std::to_string(nthreads) +
                                    " threads; CUDA allows 1..1024 threads per block, with x and y at most 1024 and z at most 64");
    if (gx > kMaxGridX || gy > kMaxGridYZ || gz > kMaxGridYZ)
        throw std::invalid_argument("launch: grid " + dims(gx, gy, gz) +
                                    " is larger than CUDA allows (x at most 2^31 - 1, y and z at most 65535)");
    const size_t limit = max_dynamic_shared_bytes(kernel);
    if (shared_bytes > limit)
        throw std::invalid_argument("launch: " + std::to_string(shared_bytes) + " bytes of dynamic shared memory, but this kernel may use " +
                                    std::to_string(limit) + (limit == kMaxSharedBytes
                                        ? " (48 KiB); more needs an opt-in: set_max_dynamic_shared_memory(kernel, bytes)"
                                        : " (its opt-in)"));
}

#ifdef __CUDACC__
// ============================================================================
// 1. Real CUDA
// ============================================================================
//
// Deliberately thin. We use the legacy default stream only, so every launch
// and every copy runs in the order it was issued, and a cudaMemcpy to the host
// returns only when the data is there: DeviceBuffer::download() is our one
// synchronization point, and an engine step stays a plain sequence of calls.
// A production engine overlaps work instead (vLLM replays a decode step's
// launches as a CUDA graph and copies inputs asynchronously from pinned
// memory); that changes when things happen, never what a kernel computes.

// A kernel's errors arrive late. cudaGetLastError() right after a launch
// catches a bad configuration (too many threads, too much shared memory); a
// fault *inside* the kernel surfaces at the next synchronizing call, usually
// the download. So "CUDA error in cudaMemcpy D2H" may well be a kernel's
// fault: compute-sanitizer (tests/gpu_check.sh runs it) names the kernel.
inline void cuda_check(cudaError_t e, const char* what) {
    if (e != cudaSuccess) throw std::runtime_error(std::string("CUDA error in ") + what + ": " + cudaGetErrorString(e));
}

// Is there a GPU to run on? (A binary built by `make cuda` may run on a machine without one.)
inline bool device_available(std::string* why = nullptr) {
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n == 0) {
        if (why) *why = e != cudaSuccess ? cudaGetErrorString(e) : "no CUDA device found";
        return false;
    }
    return true;
}
constexpr const char* kDeviceKind = "cuda";

// Dynamic shared memory: every extern __shared__ array of a kernel names the
// same bytes, as many as launch()'s shared_bytes, and the kernel carves them
// up itself (paged_attention_kernel: query, K tile, V tile, scores). More
// than 48 KiB per block needs an opt-in (set_max_dynamic_shared_memory, below);
// our kernels never ask for it, because attention_tile_keys (paged_kv.cuh)
// shrinks the tile instead.
template <class T>
__device__ inline T* shared_memory() {
    extern __shared__ unsigned char pkv_dynamic_smem[];
    return reinterpret_cast<T*>(pkv_dynamic_smem);
}
// The block barrier, under pkv's name (see the rules at the top).
__device__ __forceinline__ void syncthreads() { __syncthreads(); }
// The butterfly shuffle, under pkv's name: lane i gets v of lane i ^ lane_mask,
// all 32 lanes taking part (the full mask). With width < 32 the warp acts as
// 32 / width independent segments (CUDA's rule for a partner outside the
// segment: a later segment gives the caller its own v).
template <class T>
__device__ __forceinline__ T shfl_xor(T v, int lane_mask, int width = kWarpSize) {
    return __shfl_xor_sync(0xffffffffu, v, lane_mask, width);
}
// The same for the first `count` values of an array (count the same in every
// lane): out[i] = shfl_xor(v[i], ...) for i < count, out[i] = v[i] beyond.
// On a GPU simply one shuffle per value; it exists for the emulation, which
// exchanges them all in one meeting of the warp (section 2).
template <class T, int N>
__device__ __forceinline__ void shfl_xor_n(const T (&v)[N], T (&out)[N], int count, int lane_mask, int width = kWarpSize) {
    for (int i = 0; i < N; ++i) out[i] = i < count ? __shfl_xor_sync(0xffffffffu, v[i], lane_mask, width) : v[i];
}

// Let `kernel` use up to `bytes` of dynamic shared memory (above 48 KiB),
// cudaFuncSetAttribute's opt-in; launch() then checks against this figure.
template <class... KernelArgs>
void set_max_dynamic_shared_memory(void (*kernel)(KernelArgs...), size_t bytes) {
    int dev = 0, ceiling = 0;
    cuda_check(cudaGetDevice(&dev), "cudaGetDevice");
    cuda_check(cudaDeviceGetAttribute(&ceiling, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev), "cudaDeviceGetAttribute");
    if (bytes > (size_t)ceiling)
        throw std::invalid_argument("set_max_dynamic_shared_memory: " + std::to_string(bytes) + " bytes, but this GPU allows at most " +
                                    std::to_string(ceiling) + " per block");
    cuda_check(cudaFuncSetAttribute(reinterpret_cast<const void*>(kernel), cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes),
               "cudaFuncSetAttribute");
    detail::SharedOptIns& r = detail::shared_opt_ins();
    std::lock_guard<std::mutex> lock(r.mu);
    r.bytes[reinterpret_cast<const void*>(kernel)] = bytes;
}

// The limits of section 0 are checked first, exactly as the emulation does.
// An empty grid then returns at once: CUDA rejects a zero-sized grid as an
// invalid configuration, while for us a batch with nothing in it is normal
// (test_kernels.cpp runs reshape_and_cache on 0 tokens).
template <class... KernelArgs, class... Args>
void launch(void (*kernel)(KernelArgs...), dim3 grid, dim3 block, size_t shared_bytes, Args... args) {
    check_launch_limits(reinterpret_cast<const void*>(kernel), grid.x, grid.y, grid.z, block.x, block.y, block.z, shared_bytes);
    if (grid.x == 0 || grid.y == 0 || grid.z == 0) return;
    kernel<<<grid, block, shared_bytes>>>(args...);
    cuda_check(cudaGetLastError(), "kernel launch");
}

// cudaMalloc and cudaFree cost far more than a launch and may synchronize the
// device, so we allocate rarely: weights and the KV cache once at startup (as
// vLLM sizes its whole cache once), scratch buffers only when a batch is the
// largest yet (DeviceBuffer::reserve). Zero bytes become one, so even an empty
// buffer has a real, distinct address, in both worlds.
inline void* device_malloc(size_t bytes) {
    void* p = nullptr;
    cuda_check(cudaMalloc(&p, bytes ? bytes : 1), "cudaMalloc");
    return p;
}
inline void device_free(void* p) { cudaFree(p); }
// Free device memory in bytes, what a KV cache may still take.
inline uint64_t device_memory_free() {
    size_t free_b = 0, total_b = 0;
    cuda_check(cudaMemGetInfo(&free_b, &total_b), "cudaMemGetInfo");
    return free_b;
}
inline void copy_to_device(void* dst, const void* src, size_t bytes) {
    cuda_check(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice), "cudaMemcpy H2D");
}
inline void copy_to_host(void* dst, const void* src, size_t bytes) {
    cuda_check(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy D2H");
}
inline void device_memset(void* dst, int value, size_t bytes) { cuda_check(cudaMemset(dst, value, bytes), "cudaMemset"); }
// With one stream nothing needs this for correctness (see above); it is the
// fence to put before reading a host-side clock around GPU work.
inline void device_synchronize() { cuda_check(cudaDeviceSynchronize(), "cudaDeviceSynchronize"); }
// Pinned (page-locked) host memory: the DMA engine copies it directly, so
// cudaMemcpyAsync from or to it is truly asynchronous and runs at full PCIe
// speed; pageable memory goes through a staging buffer. The swap space uses it.
inline void* host_pinned_malloc(size_t bytes) {
    void* p = nullptr;
    cuda_check(cudaMallocHost(&p, bytes ? bytes : 1), "cudaMallocHost");
    return p;
}
inline void host_pinned_free(void* p) { cudaFreeHost(p); }
// Queue a copy on the default stream; device_synchronize() waits for all of them.
inline void copy_async(void* dst, const void* src, size_t bytes) {
    cuda_check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault), "cudaMemcpyAsync");
}

#else
// ============================================================================
// 2. Emulated CUDA on the CPU
// ============================================================================

// PKV_KERNEL is empty here, so a kernel is an ordinary function template and
// PKV_HD helpers ordinary inline functions. That is all it takes for g++ to
// compile kernel source; the rest of this section gives those functions the
// world they expect: built-in indices, a barrier, shared memory, shuffles, a
// launch. What runs the threads of a block -- fibers on the calling thread,
// switched at barriers -- is the subject of cuda_emulation.hpp, which also
// defines dim3 and the built-ins (threadIdx, blockIdx, blockDim, gridDim).
static_assert(emu::kWarpLanes == kWarpSize, "the emulation's warps are CUDA's");

namespace emu {
// This launch's shared memory: every thread of the block sees the same bytes.
inline thread_local unsigned char* block_shared = nullptr;
}  // namespace emu

// __syncthreads(): all blockDim threads arrive before any leaves, CUDA's
// contract. The barrier also orders memory: every write made before it is
// visible to every thread after it, the other half of what __syncthreads()
// promises, and the half ThreadSanitizer checks (cuda_emulation.hpp declares
// it to TSan; the TUTORIAL's TSan section deletes one barrier and gets its
// report). A thread that skips a barrier the others wait at makes launch()
// throw, naming who waits where.
inline void syncthreads() {
    emu::Fiber& f = *emu::current;
    f.runner->wait(f.runner->block_barrier());
}

template <class T>
inline T* shared_memory() {
    return reinterpret_cast<T*>(emu::block_shared);
}

// __shfl_xor_sync(0xffffffff, v, lane_mask, width): every lane posts v in its
// mailbox, the warp meets at its barrier (which, like syncthreads(), also
// orders the memory: TSan sees the exchange as synchronised), and each lane
// reads its partner's. A real shuffle promises nothing about *memory*, only
// about the value exchanged: a kernel must not lean on a shuffle to publish a
// shared-memory write to its warp (that needs syncthreads() here; the
// emulation would not catch it). A kernel that shuffles must run whole warps:
// with a partial warp CUDA's full mask names lanes that do not exist
// (undefined behaviour), so here it throws.
//
// shfl_xor_n does count shuffles of as many values in one meeting of the warp
// (on a GPU it is simply count shuffles): each meeting is a round of fiber
// switches, so a kernel that reduces several values at once pays for one
// instead of count.
template <class T, int N>
inline void shfl_xor_n(const T (&v)[N], T (&out)[N], int count, int lane_mask, int width = kWarpSize) {
    static_assert(std::is_trivially_copyable_v<T> && N * sizeof(T) <= emu::kMailBytes, "shfl_xor_n moves at most 256 bytes per lane");
    emu::Fiber& f = *emu::current;
    emu::Warp& w = *f.warp;
    if (w.lanes != kWarpSize)
        throw std::logic_error("shfl_xor: the block has a partial warp (" + std::to_string(w.lanes) +
                               " lanes); a kernel that shuffles needs blockDim a multiple of 32");
    if (width < 1 || width > kWarpSize || (width & (width - 1)) != 0)
        throw std::logic_error("shfl_xor: width must be a power of two, 1..32");
    if (count < 0 || count > N) throw std::logic_error("shfl_xor_n: count out of range");
    const unsigned me = f.lane, p = w.parity[me];
    w.parity[me] ^= 1u;
    std::memcpy(w.mail[p][me], v, (size_t)count * sizeof(T));
    f.runner->wait(w.bar);
    // CUDA: a partner in a later segment of `width` lanes is out of reach, and
    // the caller gets its own value back; an earlier segment is fine.
    const unsigned src = (me ^ (unsigned)lane_mask) & 31u;
    const bool reach = src < (me / (unsigned)width + 1) * (unsigned)width;
    for (int i = 0; i < N; ++i) out[i] = v[i];
    if (reach) std::memcpy(out, w.mail[p][src], (size_t)count * sizeof(T));
}
template <class T>
inline T shfl_xor(T v, int lane_mask, int width = kWarpSize) {
    const T in[1] = {v};
    T out[1];
    shfl_xor_n(in, out, 1, lane_mask, width);
    return out[0];
}

// The opt-in to more than 48 KiB of dynamic shared memory (section 0): the
// emulation has no device to ask, so it allows what an H100/H200 allows.
template <class... KernelArgs>
void set_max_dynamic_shared_memory(void (*kernel)(KernelArgs...), size_t bytes) {
    if (bytes > kMaxSharedBytesOptInEmulated)
        throw std::invalid_argument("set_max_dynamic_shared_memory: " + std::to_string(bytes) +
                                    " bytes, but the emulated GPU (an H100/H200) allows at most " +
                                    std::to_string(kMaxSharedBytesOptInEmulated) + " per block");
    detail::SharedOptIns& r = detail::shared_opt_ins();
    std::lock_guard<std::mutex> lock(r.mu);
    r.bytes[reinterpret_cast<const void*>(kernel)] = bytes;
}

inline bool device_available(std::string* = nullptr) { return true; }
constexpr const char* kDeviceKind = "emulated";

// Run `kernel(args...)` over the whole grid, on the calling thread: block
// after block, each block's threads as fibers (cuda_emulation.hpp). Between
// blocks, shared memory is refilled with 0xFF bytes (NaN as float, -1 as
// int32): a kernel that reads shared memory it never wrote gets NaN, not a
// lucky leftover of the previous block.
//
// CUDA's launch limits (section 0) are checked first, because nothing else
// would: a launch that the emulation ran happily must not fail on the first
// real GPU. Thread tid of a block has x varying fastest, then y, then z:
// CUDA's linear order; warps are the block's threads in that order, 32 to a
// warp (the last one partial when blockDim is not a multiple of 32).
// kernel(args...) copies the arguments into the kernel's by-value parameters,
// one private copy per thread, as a GPU gives every thread the launch's
// parameters.
//
// A kernel thread that throws (a GPU thread cannot; here a bounds check or an
// exercise stub can) leaves the launch: it drops out of its barriers, so the
// block's other threads are not left waiting for it, it runs no later block,
// and its exception is rethrown here once every other thread has finished.
// The launch's results are garbage then, as after a GPU fault. A block in
// which no thread can go on (one skipped a barrier) ends the launch with a
// std::logic_error that says who waits where.
template <class... KernelArgs, class... Args>
void launch(void (*kernel)(KernelArgs...), dim3 grid, dim3 block, size_t shared_bytes, Args... args) {
    check_launch_limits(reinterpret_cast<const void*>(kernel), grid.x, grid.y, grid.z, block.x, block.y, block.z, shared_bytes);
    const unsigned long long nblocks = (unsigned long long)grid.x * grid.y * grid.z;
    if (nblocks == 0) return;
    std::vector<unsigned char> shared(shared_bytes + 16, 0xFF);  // [shared_bytes] (+16: never a null pointer)
    auto call = [&] { kernel(args...); };
    emu::BlockRunner& r = emu::runner();
    r.start_launch(block, emu::BlockRunner::Body{[](void* c) { (*static_cast<decltype(call)*>(c))(); }, &call});
    blockDim = block;
    gridDim = grid;
    emu::block_shared = shared.data();
    for (unsigned long long b = 0; b < nblocks; ++b) {
        const dim3 idx((unsigned)(b % grid.x), (unsigned)(b / grid.x % grid.y), (unsigned)(b / ((unsigned long long)grid.x * grid.y)));
        if (!r.run_block(idx, shared_bytes > 0)) break;
        if (shared_bytes > 0 && b + 1 < nblocks) std::memset(shared.data(), 0xFF, shared.size());
    }
    r.finish_launch();
}

// Device memory is host memory. A kernel reads it as on a GPU, but so could
// the host, and a host-side read through a device pointer crashes on a GPU: a
// bug emulation cannot show. Hence the rule in test_kernels.cpp that results
// come back only through download().
inline void* device_malloc(size_t bytes) { return ::operator new(bytes ? bytes : 1); }
inline void device_free(void* p) { ::operator delete(p); }
// 0 = "ask the host": emulated device memory is host memory.
inline uint64_t device_memory_free() { return 0; }
inline void copy_to_device(void* dst, const void* src, size_t bytes) { if (bytes) std::memcpy(dst, src, bytes); }
inline void copy_to_host(void* dst, const void* src, size_t bytes) { if (bytes) std::memcpy(dst, src, bytes); }
inline void device_memset(void* dst, int value, size_t bytes) { std::memset(dst, value, bytes); }
inline void device_synchronize() {}
inline void* host_pinned_malloc(size_t bytes) { return ::operator new(bytes ? bytes : 1); }
inline void host_pinned_free(void* p) { ::operator delete(p); }
inline void copy_async(void* dst, const void* src, size_t bytes) { if (bytes) std::memcpy(dst, src, bytes); }

#endif

// ============================================================================
// 3. Device buffers (both worlds), and pinned host buffers
// ============================================================================

// An owning array of pinned host memory (plain host memory when emulated).
class PinnedHostBuffer {
public:
    explicit PinnedHostBuffer(size_t bytes) : n_(bytes), p_(static_cast<unsigned char*>(host_pinned_malloc(bytes))) {}
    PinnedHostBuffer(const PinnedHostBuffer&) = delete;
    PinnedHostBuffer& operator=(const PinnedHostBuffer&) = delete;
    ~PinnedHostBuffer() { host_pinned_free(p_); }
    unsigned char* data() const { return p_; }
    size_t size() const { return n_; }

private:
    size_t n_;
    unsigned char* p_;
};

// An owning array in device memory (host memory under emulation). Move-only.
// Our own type rather than thrust::device_vector: nothing beyond the CUDA
// runtime, the same type in both worlds, and no hidden copies (copying a
// device_vector copies device memory; copying a DeviceBuffer does not compile).
// The moved-from buffer is left empty, so its destructor frees nothing.
template <class T>
class DeviceBuffer {
public:
    DeviceBuffer() = default;
    explicit DeviceBuffer(size_t n) : n_(n), p_(static_cast<T*>(device_malloc(n * sizeof(T)))) {}
    DeviceBuffer(const DeviceBuffer&) = delete;
    DeviceBuffer& operator=(const DeviceBuffer&) = delete;
    DeviceBuffer(DeviceBuffer&& o) noexcept : n_(o.n_), p_(o.p_) { o.n_ = 0; o.p_ = nullptr; }
    DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
        if (this != &o) { release(); n_ = o.n_; p_ = o.p_; o.n_ = 0; o.p_ = nullptr; }
        return *this;
    }
    ~DeviceBuffer() { release(); }

    T* data() const { return p_; }
    size_t size() const { return n_; }

    // Grow (never shrink) to hold n elements; contents are not kept.
    // GpuRunner calls it every step with that batch's sizes, so once the
    // largest batch has been seen no step allocates; scratch is rewritten
    // every step, so nothing is lost by not copying.
    void reserve(size_t n) {
        if (n > n_) *this = DeviceBuffer(n);
    }
    void upload(const T* src, size_t n) {
        reserve(n);
        copy_to_device(p_, src, n * sizeof(T));
    }
    // Any contiguous range of T with data() and size(): a std::vector, or a
    // model's Tensor (tiny_model/model.hpp), which may be a mapped file.
    template <class Range>
    void upload(const Range& r) {
        upload(r.data(), r.size());
    }
    // Sizes are in elements. Under CUDA, download waits for every kernel
    // launched before it (one stream, section 1).
    void download(T* dst, size_t n) const { copy_to_host(dst, p_, n * sizeof(T)); }

private:
    void release() {
        if (p_) device_free(p_);
        p_ = nullptr;
        n_ = 0;
    }
    size_t n_ = 0;
    T* p_ = nullptr;
};

}  // namespace pkv

// cuda_shim.hpp -- the one seam between our kernels and where they run.
//
// Every kernel in pagedkv is written once, in CUDA C++. This header lets that
// same source run in two places:
//
//   - under nvcc (__CUDACC__ defined): `launch(...)` is `kernel<<<...>>>`, device
//     memory is cudaMalloc'd, copies are cudaMemcpy. Nothing else.
//   - under g++/clang++: the kernels are plain C++ functions, and `launch(...)`
//     *emulates* a launch on the CPU. Each thread block runs as blockDim real
//     std::threads (one per CUDA thread), `__syncthreads()` is a std::barrier,
//     and each block gets its own dynamic shared memory. Blocks run one after
//     another. Device memory is host memory; copies are memcpy.
//
// What the emulation models honestly: the thread/block index space, the
// barrier, per-block shared memory, and real concurrency between the threads of
// a block -- so a missing __syncthreads() is a real data race that
// ThreadSanitizer reports (`make tsan`; TUTORIAL.md chapter 10 shows one).
// What it does not model: timing, warps and their scheduling, memory
// coalescing, bank conflicts, caches, occupancy, or concurrency *between*
// blocks. It is for correctness and for stepping through a kernel in gdb, not
// for speed: a 128-thread block costs ~0.2 ms per __syncthreads on two cores.
//
// Rules our kernels follow so both worlds agree:
//   - shared memory is only the dynamic kind, reached through
//     `shared_memory<T>()` (sized by launch's shared_bytes), never a static
//     `__shared__` array (which the emulation could not give each block);
//   - no warp intrinsics (shuffles, votes): reductions go through shared memory
//     with __syncthreads, so the shim has none to emulate.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#ifdef __CUDACC__
#include <cuda_runtime.h>
#else
#include <atomic>
#include <barrier>
#include <functional>
#include <memory>
#include <semaphore>
#include <thread>
#endif

namespace pkv {

#ifdef __CUDACC__
// ============================================================================
// Real CUDA
// ============================================================================

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

template <class T>
__device__ inline T* shared_memory() {
    extern __shared__ unsigned char pkv_dynamic_smem[];
    return reinterpret_cast<T*>(pkv_dynamic_smem);
}

template <class... KernelArgs, class... Args>
void launch(void (*kernel)(KernelArgs...), dim3 grid, dim3 block, size_t shared_bytes, Args... args) {
    if (grid.x == 0 || grid.y == 0 || grid.z == 0) return;
    kernel<<<grid, block, shared_bytes>>>(args...);
    cuda_check(cudaGetLastError(), "kernel launch");
}

inline void* device_malloc(size_t bytes) {
    void* p = nullptr;
    cuda_check(cudaMalloc(&p, bytes ? bytes : 1), "cudaMalloc");
    return p;
}
inline void device_free(void* p) { cudaFree(p); }
inline void copy_to_device(void* dst, const void* src, size_t bytes) {
    cuda_check(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice), "cudaMemcpy H2D");
}
inline void copy_to_host(void* dst, const void* src, size_t bytes) {
    cuda_check(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy D2H");
}
inline void device_memset(void* dst, int value, size_t bytes) { cuda_check(cudaMemset(dst, value, bytes), "cudaMemset"); }
inline void device_synchronize() { cuda_check(cudaDeviceSynchronize(), "cudaDeviceSynchronize"); }

#else
// ============================================================================
// Emulated CUDA on the CPU
// ============================================================================

#define __global__
#define __device__

struct dim3 {
    unsigned x = 1, y = 1, z = 1;
    dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};

// The built-in variables, one copy per emulated thread.
inline thread_local dim3 threadIdx, blockIdx, blockDim, gridDim;

namespace emu {
// What runs once each time all threads of a block have reached the barrier at
// the end of a block: refill shared memory with 0xFF bytes for the next block.
struct RefillShared {
    std::vector<unsigned char>* mem;
    void operator()() noexcept { std::memset(mem->data(), 0xFF, mem->size()); }
};
inline thread_local std::barrier<>* block_barrier = nullptr;  // this block's __syncthreads
inline thread_local unsigned char* block_shared = nullptr;    // this block's shared memory
}  // namespace emu

inline void __syncthreads() { emu::block_barrier->arrive_and_wait(); }

template <class T>
inline T* shared_memory() {
    return reinterpret_cast<T*>(emu::block_shared);
}

inline bool device_available(std::string* = nullptr) { return true; }
constexpr const char* kDeviceKind = "emulated";

namespace emu {
// The emulated threads. Creating 128 std::threads per launch would cost more
// than most of our kernels, so worker i is created once, the first time a
// launch needs a CUDA thread i, and then serves as thread i of every later
// launch. Each worker waits on its own semaphore; a launch releases exactly the
// workers it needs and waits until each has reported back.
class ThreadPool {
public:
    ~ThreadPool() {
        stop_ = true;
        for (auto& w : workers_) w->go.release();
        for (auto& w : workers_) w->thread.join();
    }
    // Run job(i) on workers 0..n-1 concurrently; returns when all are done.
    void run(unsigned n, const std::function<void(unsigned)>& job) {
        while (workers_.size() < n) {
            auto w = std::make_unique<Worker>();
            w->thread = std::thread(&ThreadPool::loop, this, (unsigned)workers_.size(), w.get());
            workers_.push_back(std::move(w));
        }
        job_ = &job;
        for (unsigned i = 0; i < n; ++i) workers_[i]->go.release();
        for (unsigned i = 0; i < n; ++i) done_.acquire();
    }

private:
    struct Worker {
        std::binary_semaphore go{0};
        std::thread thread;
    };
    void loop(unsigned i, Worker* w) {
        for (;;) {
            w->go.acquire();
            if (stop_) return;
            (*job_)(i);
            done_.release();
        }
    }
    std::vector<std::unique_ptr<Worker>> workers_;
    const std::function<void(unsigned)>* job_ = nullptr;
    std::counting_semaphore<> done_{0};
    std::atomic<bool> stop_{false};
};
inline ThreadPool& pool() {
    static ThreadPool p;
    return p;
}
}  // namespace emu

// Run `kernel(args...)` over the whole grid. Emulated thread i of the block
// runs on pool worker i; all of them walk the blocks in the same order and meet
// at the end of every block, where shared memory is refilled with 0xFF bytes
// (NaN as float) for the next block: a kernel that reads shared memory it never
// wrote gets NaN, not a lucky leftover. Kernels without shared memory have no
// cross-thread state, so their threads do not wait for each other at all.
template <class... KernelArgs, class... Args>
void launch(void (*kernel)(KernelArgs...), dim3 grid, dim3 block, size_t shared_bytes, Args... args) {
    const unsigned nthreads = block.x * block.y * block.z;
    if (nthreads == 0 || nthreads > 1024) throw std::invalid_argument("launch: block must have 1..1024 threads");
    const unsigned nblocks = grid.x * grid.y * grid.z;
    if (nblocks == 0) return;
    std::vector<unsigned char> shared(shared_bytes + 16, 0xFF);  // [shared_bytes] (+16: never a null pointer)
    std::barrier<> sync_bar((std::ptrdiff_t)nthreads);                                   // __syncthreads
    std::barrier<emu::RefillShared> end_bar((std::ptrdiff_t)nthreads, emu::RefillShared{&shared});  // end of a block
    const std::function<void(unsigned)> body = [&](unsigned tid) {
        threadIdx = dim3(tid % block.x, tid / block.x % block.y, tid / (block.x * block.y));
        blockDim = block;
        gridDim = grid;
        emu::block_barrier = &sync_bar;
        emu::block_shared = shared.data();
        for (unsigned b = 0; b < nblocks; ++b) {
            blockIdx = dim3(b % grid.x, b / grid.x % grid.y, b / (grid.x * grid.y));
            kernel(args...);
            if (shared_bytes > 0) end_bar.arrive_and_wait();
        }
    };
    emu::pool().run(nthreads, body);
}

inline void* device_malloc(size_t bytes) { return ::operator new(bytes ? bytes : 1); }
inline void device_free(void* p) { ::operator delete(p); }
inline void copy_to_device(void* dst, const void* src, size_t bytes) { if (bytes) std::memcpy(dst, src, bytes); }
inline void copy_to_host(void* dst, const void* src, size_t bytes) { if (bytes) std::memcpy(dst, src, bytes); }
inline void device_memset(void* dst, int value, size_t bytes) { std::memset(dst, value, bytes); }
inline void device_synchronize() {}

#endif

// ============================================================================
// Device buffers (both worlds)
// ============================================================================

// An owning array in device memory (host memory under emulation). Move-only.
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
    void reserve(size_t n) {
        if (n > n_) *this = DeviceBuffer(n);
    }
    void upload(const T* src, size_t n) {
        reserve(n);
        copy_to_device(p_, src, n * sizeof(T));
    }
    void upload(const std::vector<T>& v) { upload(v.data(), v.size()); }
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

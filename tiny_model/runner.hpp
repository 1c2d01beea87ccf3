// tiny_model/runner.hpp -- chapter 7: where the model runs, the ModelRunner
// interface the engine talks to, and the CPU runner.
//
// The engine (engine.hpp) never touches weights or KV memory. It owns one
// ModelRunner, hands it a flat batch each step and gets logits back.
// Everything above this interface (scheduler, block pool, metrics) is the
// same whatever runs the model; everything below it owns the weights and the
// KV cache bytes. The block *ids* live in the scheduler; the block *contents*
// live here.
//
// The seam: a runner is anything that implements ModelRunner. The reference
// has two, CpuRunner (this file: the CPU forward pass, forward_cpu.hpp, in
// host memory) and GpuRunner (tiny_model/forward_gpu.cuh: the CUDA kernels,
// on a GPU in a `make cuda` build and emulated on the CPU otherwise);
// lab/LAB.md chapter L6 plugs a third in here. examples/devices.hpp turns a
// --device name into one of them.
//
// A runner's life has vLLM's three steps: build it with the model's weights;
// the engine sizes the KV cache (from its config and what memory_for_kv_cache()
// says is available) and calls init_kv_cache() once; then forward() every step.
//
// Sections: 1. the machine's memory  2. the interface, a step's forward pass
// with failures isolated (forward_isolating), and sizing the KV cache
// (size_kv_cache)  3. CpuRunner.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include <unistd.h>

#include "paged_kv.cuh"
#include "tiny_model/forward_cpu.hpp"
#include "tiny_model/model.hpp"
#include "tiny_model/sampler.hpp"

namespace pkv {

// ============================================================================
// 1. How much memory the machine has
// ============================================================================

// The host memory this process may use, in bytes: the machine's physical
// memory, or a container's limit when one is set (cgroup v2's memory.max, or
// v1's limit_in_bytes). Used to refuse a configuration that cannot fit
// *before* allocating it, so that the user reads "needs 8.4 GB, have 2 GB"
// instead of a bad_alloc or the out-of-memory killer.
inline uint64_t host_memory_bytes() {
    uint64_t total = 0;
    const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
    if (pages > 0 && page > 0) total = (uint64_t)pages * (uint64_t)page;
    for (const char* path : {"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"}) {
        if (FILE* f = std::fopen(path, "r")) {
            unsigned long long limit = 0;
            if (std::fscanf(f, "%llu", &limit) == 1 && limit > 0 && (total == 0 || limit < total)) total = limit;
            std::fclose(f);  // "max" (no limit) does not parse as a number: the machine's size stands
        }
    }
    return total ? total : UINT64_MAX;  // unknown: do not refuse on our guess
}

// "1.25 MiB", "8.40 GiB": byte counts for messages.
inline std::string format_bytes(uint64_t b) {
    char buf[48];
    if (b < 1024) std::snprintf(buf, sizeof buf, "%llu bytes", (unsigned long long)b);
    else if (b < (1ull << 20)) std::snprintf(buf, sizeof buf, "%.2f KiB", b / 1024.0);
    else if (b < (1ull << 30)) std::snprintf(buf, sizeof buf, "%.2f MiB", b / 1048576.0);
    else if (b < (1ull << 40)) std::snprintf(buf, sizeof buf, "%.2f GiB", b / 1073741824.0);
    else if (b == UINT64_MAX) std::snprintf(buf, sizeof buf, "more than 16 EiB");
    else std::snprintf(buf, sizeof buf, "%.2f TiB", b / 1099511627776.0);
    return buf;
}

// a * b, or UINT64_MAX when the product does not fit: sizes computed from
// user input must not wrap around into a small, "affordable" number.
inline uint64_t mul_sat(uint64_t a, uint64_t b) {
    uint64_t r;
    return __builtin_mul_overflow(a, b, &r) ? UINT64_MAX : r;
}
inline uint64_t add_sat(uint64_t a, uint64_t b) { return a > UINT64_MAX - b ? UINT64_MAX : a + b; }

// ============================================================================
// 2. The interface
// ============================================================================

struct ModelRunner {
    ModelRunner() = default;
    // A runner owns device memory and is referred to by the engine: never copied.
    ModelRunner(const ModelRunner&) = delete;
    ModelRunner& operator=(const ModelRunner&) = delete;
    virtual ~ModelRunner() = default;

    // The model's shape: what the engine needs to size the KV cache (layers,
    // kv heads, head_dim), to bound sequences (seq_len) and to sample (vocab).
    virtual const Config& model_config() const = 0;
    // Where it runs, for messages: "cpu", "emulated" or "cuda".
    virtual std::string device_name() const = 0;
    // Bytes this runner could give the KV cache (host memory for the CPU,
    // free device memory for a GPU). The engine checks its configuration
    // against it before calling init_kv_cache.
    virtual uint64_t memory_for_kv_cache() const { return host_memory_bytes(); }
    // Refuse a KV cache that cannot fit, before anything is allocated:
    // num_blocks blocks of block_bytes. The user then reads "needs 8.40 GiB,
    // the cpu runner can give 2.00 GiB" instead of a bad_alloc or the OOM killer.
    void check_memory(int num_blocks, uint64_t block_bytes) const {
        const uint64_t kv = mul_sat((uint64_t)num_blocks, block_bytes), have = memory_for_kv_cache();
        if (kv <= have) return;
        throw std::invalid_argument("this configuration needs " + format_bytes(kv) + " of KV cache (" + std::to_string(num_blocks) +
                                    " blocks of " + format_bytes(block_bytes) + "), but the " + device_name() +
                                    " runner can give the KV cache " + format_bytes(have) + ": lower the number of blocks or the block size");
    }
    // Allocate the KV cache for `geo`. Called once, before the first forward.
    virtual void init_kv_cache(const KVGeometry& geo) = 0;
    // One layer's K (kv = 0) or V (kv = 1) of the cache, in the runner's own
    // memory (device memory on a GPU): for code that reads or copies whole
    // blocks, such as the tests and lab's swap (lab/swap.hpp).
    virtual KVView kv_view(int layer, int kv) = 0;

    // Fills logits [num_logits, vocab_size] for the batch's logits_indices.
    virtual void forward(const ForwardBatch& b, std::vector<float>& logits) = 0;
    // Greedy shortcut: only the argmax of each logits row. A GPU computes it
    // where the logits are and copies back one int per row instead of a row
    // of vocab_size floats.
    virtual void forward_argmax(const ForwardBatch& b, std::vector<int32_t>& tokens) {
        forward(b, argmax_scratch_);
        const int V = model_config().vocab_size;
        tokens.resize(b.logits_indices.size());
        for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = argmax(argmax_scratch_.data() + i * V, V);
    }

private:
    std::vector<float> argmax_scratch_;  // [num_logits, vocab] logits for the default forward_argmax
};

// One step's forward pass as the engine runs it: logits rows [num_logits,
// vocab], or with `tokens_only` just each row's token (forward_argmax). If
// the pass throws, one sequence's input may be at fault, and one bad request
// must not fail the others: we run each sequence alone
// (ForwardBatch::sequence) and return, per sequence of `b`, "" or why its
// pass failed; a failed sequence's row stays zero. Batch invariance makes a
// sequence's rows alone the very rows it would have had in the batch.
inline std::vector<std::string> forward_isolating(ModelRunner& runner, const ForwardBatch& b, bool tokens_only,
                                                  std::vector<float>& logits, std::vector<int32_t>& tokens) {
    auto run = [&](const ForwardBatch& x, std::vector<float>& l, std::vector<int32_t>& t) {
        if (tokens_only) runner.forward_argmax(x, t);
        else runner.forward(x, l);
    };
    std::vector<std::string> failed((size_t)b.num_seqs());
    try {
        run(b, logits, tokens);
        return failed;
    } catch (const std::exception&) {
        // Which sequence? Each one alone says, below.
    }
    const size_t V = (size_t)runner.model_config().vocab_size;
    logits.assign(b.logits_indices.size() * V, 0.0f);
    tokens.assign(b.logits_indices.size(), 0);
    std::vector<float> one_logits;
    std::vector<int32_t> one_tokens;
    for (int s = 0, row = 0; s < b.num_seqs(); ++s) {  // row: its logits row, when it has one
        const ForwardBatch one = b.sequence(s);
        try {
            run(one, one_logits, one_tokens);
            if (!one.logits_indices.empty() && tokens_only) tokens[(size_t)row] = one_tokens.at(0);
            if (!one.logits_indices.empty() && !tokens_only) std::copy_n(one_logits.begin(), V, logits.begin() + (ptrdiff_t)(row * V));
        } catch (const std::exception& e) {
            failed[(size_t)s] = e.what();
            if (failed[(size_t)s].empty()) failed[(size_t)s] = "unknown error";
        }
        row += (int)one.logits_indices.size();
    }
    return failed;
}

// Sizing the KV cache, before anything is allocated. vLLM turns the GPU
// memory left after profiling into blocks; we take a block count, or a byte
// budget (kv_cache_bytes > 0: f16 then gets twice the blocks of f32), and
// check it against what the runner can give. vLLM defaults max_model_len to
// the model's context and, unless told to fit it, refuses to start when the
// cache cannot hold one such sequence; we cap it to the pool instead (the
// startup line says so), so a demo with a tiny pool still starts. An
// explicit max_model_len is never changed, only checked against the model's
// context.
struct KVCacheSpec {
    int num_blocks, block_size;
    KVDtype dtype;
    uint64_t kv_cache_bytes;  // > 0: derive num_blocks from it
    int max_model_len;        // 0: derive
};
inline KVCacheSpec size_kv_cache(const ModelRunner& runner, KVCacheSpec c) {
    const Config& m = runner.model_config();
    if (c.block_size < 1 || c.block_size > kMaxBlockSize)
        throw std::invalid_argument("block_size must be in 1.." + std::to_string(kMaxBlockSize) + ", got " + std::to_string(c.block_size));
    const uint64_t block_bytes = KVGeometry{m.n_layers, 1, c.block_size, m.n_kv_heads, m.head_dim(), c.dtype}.bytes_per_block();
    if (c.kv_cache_bytes > 0) {
        const uint64_t n = c.kv_cache_bytes / block_bytes;
        if (n == 0 || n > (uint64_t)INT32_MAX)
            throw std::invalid_argument("a KV cache of " + format_bytes(c.kv_cache_bytes) +
                                        (n ? " would be more than 2^31 blocks" : " holds no block of " + format_bytes(block_bytes) + ": raise the budget"));
        c.num_blocks = (int)n;
    }
    if (c.num_blocks < 1) throw std::invalid_argument("num_blocks must be >= 1");
    runner.check_memory(c.num_blocks, block_bytes);
    const int64_t pool_tokens = (int64_t)c.num_blocks * c.block_size;
    if (c.max_model_len == 0) c.max_model_len = (int)std::min<int64_t>(m.seq_len, pool_tokens);
    else if (c.max_model_len > m.seq_len)  // untrained positions: the forward pass rejects them
        throw std::invalid_argument("max_model_len " + std::to_string(c.max_model_len) + " is longer than the model's context " +
                                    std::to_string(m.seq_len) + ": lower --max-model-len");
    return c;
}

// ============================================================================
// 3. CpuRunner: the CPU forward pass, with its KV cache in host memory
// ============================================================================
//
// The arithmetic comes from a CpuMath (forward_cpu.hpp section 2): the plain
// loops when none is given, or a faster one such as lab/fast_cpu.hpp's
// FastCpuMath, which examples/devices.hpp passes with --math fast. Same bits
// either way.
class CpuRunner : public ModelRunner {
public:
    explicit CpuRunner(const Model& m, std::unique_ptr<CpuMath> math = nullptr)
        : model_(m), math_(math ? std::move(math) : std::make_unique<CpuMath>()), fwd_(m, cache_, *math_) {}
    const Config& model_config() const override { return model_.cfg; }
    std::string device_name() const override { return "cpu"; }
    void init_kv_cache(const KVGeometry& geo) override { cache_ = KVCache(geo); }  // fwd_ refers to cache_, which stays the same object
    KVView kv_view(int layer, int kv) override { return kv ? cache_.v_view(layer) : cache_.k_view(layer); }
    void forward(const ForwardBatch& b, std::vector<float>& logits) override { fwd_.forward(b, logits); }

private:
    const Model& model_;
    KVCache cache_;
    std::unique_ptr<CpuMath> math_;  // declared before fwd_, which refers to it
    CpuForward fwd_;                 // reads and writes cache_
};

}  // namespace pkv

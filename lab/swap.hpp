// lab/swap.hpp -- lab/LAB.md chapter L3: preemption by swap, vLLM V0's other
// mode, the parts that are not scheduling: the host swap space (which slots
// are free), the copies, and what they are counted as.
//
// The card (scheduler.hpp) recomputes a victim. vLLM V0 could instead copy
// the victim's blocks to a host "swap space" of fixed size and copy them back
// into fresh blocks on resume, keeping num_computed_tokens: no recompute, but
// PCIe bytes both ways and host memory. The decision lives in LabPolicy
// (lab/policies.hpp, behind scheduler.hpp's seam); this header is what the
// decision needs underneath it, split as the KV cache itself is split:
//   SwapSpace      which host slots are free: bookkeeping, as the block pool
//                  is for device blocks (section 1);
//   BlockCopier    who moves the bytes (section 2): HostSwapMemory for a
//                  runner that holds real K/V (the CPU, the kernels), reached
//                  through ModelRunner::kv_view; the simulated GPU
//                  (lab/sim_runner.hpp) prices the copies instead;
//   SwapStats      the counters, and their Prometheus families (section 3).
// The copies happen when the policy decides, inside schedule(): a victim's
// blocks are copied out before they are freed, and a resumed request's are
// copied in as soon as it has fresh blocks, both before the step's forward
// pass writes anything.
//
// Sections: 1. the host slots  2. the copies  3. the counters.
#pragma once

#include <cstdint>
#include <cstring>
#include <memory>
#include <ostream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "core/emu/cuda_shim.hpp"
#include "core/metrics.hpp"
#include "paged_kv.cuh"
#include "tiny_model/runner.hpp"

namespace pkv {

// ============================================================================
// 1. The host swap space: which host slots are free
// ============================================================================
//
// A swapped-out request holds one slot per block it had, exactly as a running
// request holds blocks.
class SwapSpace {
public:
    explicit SwapSpace(int num_slots) : num_slots_(num_slots) {
        if (num_slots < 0) throw std::invalid_argument("swap space blocks must be >= 0");
        // pop_back hands out slot 0 first.
        for (int i = num_slots - 1; i >= 0; --i) free_.push_back(i);
    }
    int num_slots() const { return num_slots_; }
    int num_free() const { return (int)free_.size(); }
    int in_use() const { return num_slots_ - num_free(); }

    // n slots, or {} (and nothing taken) when fewer than n are free.
    std::vector<int32_t> take(int n) {
        std::vector<int32_t> out;
        if (n > num_free()) return out;
        for (int i = 0; i < n; ++i) {
            out.push_back(free_.back());
            free_.pop_back();
        }
        return out;
    }
    void give_back(const std::vector<int32_t>& slots) { free_.insert(free_.end(), slots.begin(), slots.end()); }

    // Every slot is free xor held exactly once by one of `held` (the swapped
    // requests' slot lists). "" when that holds.
    std::string check_invariants(const std::vector<const std::vector<int32_t>*>& held) const {
        std::vector<int> holders((size_t)num_slots_, 0);
        for (int32_t s : free_) {
            if (s < 0 || s >= num_slots_) return "free swap slot out of range";
            holders[(size_t)s]++;
        }
        for (const std::vector<int32_t>* v : held)
            for (int32_t s : *v) {
                if (s < 0 || s >= num_slots_) return "swap slot out of range";
                holders[(size_t)s]++;
            }
        for (int s = 0; s < num_slots_; ++s)
            if (holders[(size_t)s] != 1) return "swap slot " + std::to_string(s) + " is held " + std::to_string(holders[(size_t)s]) + " times";
        return "";
    }

private:
    int num_slots_;
    std::vector<int32_t> free_;  // [free slots] host swap slot ids
};

// ============================================================================
// 2. The copies
// ============================================================================

// (device block, host slot) pairs: one pair per block moved.
using BlockSlotPairs = std::vector<std::pair<int32_t, int32_t>>;

// Whoever moves a swapped block's bytes, both ways, for LabPolicy.
struct BlockCopier {
    virtual ~BlockCopier() = default;
    virtual void copy_out(const BlockSlotPairs& block_to_slot) = 0;   // device blocks -> host slots
    virtual void copy_in(const BlockSlotPairs& block_from_slot) = 0;  // host slots -> device blocks
    virtual uint64_t bytes_per_block() const = 0;                     // every layer, K and V, of one block
};

// A slot holds everything one block holds, geo.bytes_per_block() bytes:
//   [num_layers, 2 (K then V), data_bytes_per_block + scales_per_block * 4]
// Byte offset of layer l's K (kv = 0) or V (kv = 1) part inside slot `slot`.
inline size_t swap_slot_offset(const KVGeometry& g, int32_t slot, int layer, int kv) {
    const size_t part = g.data_bytes_per_block() + g.scales_per_block() * sizeof(float);
    return (((size_t)slot * g.num_layers + layer) * 2 + kv) * part;
}

// Copy block `block` of one layer's K or V (`view`) to or from `host` (a slot
// part): data bytes, then the int8 scales. `copy` is memcpy-like (dst, src,
// bytes), host->device or device->host as the caller needs.
template <class Copy>
inline void copy_block_part(const KVGeometry& g, const KVView& view, int32_t block, unsigned char* host, bool out, Copy copy) {
    unsigned char* data = static_cast<unsigned char*>(view.data) + (size_t)block * g.data_bytes_per_block();
    if (out) copy(host, data, g.data_bytes_per_block()); else copy(data, host, g.data_bytes_per_block());
    if (g.scales_per_block() == 0) return;
    unsigned char* sc = reinterpret_cast<unsigned char*>(view.scale + (size_t)block * g.scales_per_block());
    unsigned char* hs = host + g.data_bytes_per_block();
    const size_t n = g.scales_per_block() * sizeof(float);
    if (out) copy(hs, sc, n); else copy(sc, hs, n);
}

// Real host memory for a runner that holds real K/V, reached through
// ModelRunner::kv_view. On a GPU it is pinned (page-locked), so copies run at
// the link's full speed: one cudaMemcpyAsync per (block, layer, K or V), all
// queued on the default stream, then one wait; the forward pass that follows
// cannot start before they are done. On the CPU a copy is a memcpy: the same
// bookkeeping, without the PCIe link that makes swapping expensive there.
class HostSwapMemory : public BlockCopier {
public:
    // `geo` is the cache's shape (its num_blocks is not used); `runner` must
    // outlive this object (the engine owns both, the runner longer).
    HostSwapMemory(ModelRunner& runner, const KVGeometry& geo, int num_slots)
        : runner_(runner), geo_(geo), on_device_(runner.device_name() == "cuda") {
        if (num_slots < 0) throw std::invalid_argument("swap space blocks must be >= 0");
        const uint64_t bytes = mul_sat((uint64_t)num_slots, geo.bytes_per_block());
        // The KV cache of a CPU or emulated runner lives in host memory too.
        const uint64_t kv = on_device_ ? 0 : mul_sat((uint64_t)geo.num_blocks, geo.bytes_per_block());
        if (add_sat(bytes, kv) > host_memory_bytes())
            throw std::invalid_argument("a host swap space of " + std::to_string(num_slots) + " blocks needs " + format_bytes(bytes) +
                                        (kv ? " beside the KV cache's " + format_bytes(kv) : std::string()) + ", but this machine has " +
                                        format_bytes(host_memory_bytes()) + " of host memory: lower the swap space");
        // Pinned only where a GPU copies from it: a CUDA build without a
        // GPU (CI's) runs CPU and emulated runners, and cudaMallocHost fails.
        if (on_device_) pinned_ = std::make_unique<PinnedHostBuffer>((size_t)bytes);
        else plain_.resize((size_t)bytes);
    }
    void copy_out(const BlockSlotPairs& pairs) override { copy(pairs, true); }
    void copy_in(const BlockSlotPairs& pairs) override { copy(pairs, false); }
    uint64_t bytes_per_block() const override { return geo_.bytes_per_block(); }

private:
    // The swap space: whichever of the two buffers below holds it.
    unsigned char* host() { return pinned_ ? pinned_->data() : plain_.data(); }
    void copy(const BlockSlotPairs& pairs, bool out) {
        auto host_copy = [](void* dst, const void* src, size_t n) { std::memcpy(dst, src, n); };
        for (const auto& [block, slot] : pairs)
            for (int l = 0; l < geo_.num_layers; ++l)
                for (int kv = 0; kv < 2; ++kv) {
                    unsigned char* host = this->host() + swap_slot_offset(geo_, slot, l, kv);
                    if (on_device_) copy_block_part(geo_, runner_.kv_view(l, kv), block, host, out, copy_async);
                    else copy_block_part(geo_, runner_.kv_view(l, kv), block, host, out, host_copy);
                }
        if (on_device_) device_synchronize();
    }
    ModelRunner& runner_;
    KVGeometry geo_;
    bool on_device_;                            // the cache is in device memory (a CUDA GpuRunner)
    std::unique_ptr<PinnedHostBuffer> pinned_;  // [num_slots, bytes_per_block] host swap space, on a GPU
    std::vector<unsigned char> plain_;          // [num_slots, bytes_per_block] the same, otherwise
};

// ============================================================================
// 3. The counters
// ============================================================================

// Victims swapped out and back in, blocks copied each way, victims that found
// the swap space full (they fell back to recompute), and the slots in use.
struct SwapStats {
    long num_swap_outs = 0, num_swap_ins = 0, blocks_swapped_out = 0, blocks_swapped_in = 0, num_swap_fallbacks = 0;
    long bytes_out = 0, bytes_in = 0;  // blocks x bytes per block
    int slots_in_use = 0, num_slots = 0;
    double usage() const { return num_slots ? (double)slots_in_use / num_slots : 0.0; }
};

// Their Prometheus families, beside the engine's (core/metrics.hpp section 4),
// with the same labels (examples/serve.cpp appends them under swap).
inline std::string prometheus_swap_text(const SwapStats& s, const std::string& labels = "") {
    std::ostringstream o;
    auto scalar = [&](const char* type, const char* name, const char* help, auto v) {
        prometheus_family(o, type, name, help);
        prometheus_sample(o, name, labels, v);
    };
    scalar("counter", "swap_outs_total", "Victims copied to host swap space.", s.num_swap_outs);
    scalar("counter", "swap_ins_total", "Swapped victims copied back and resumed.", s.num_swap_ins);
    scalar("counter", "swap_out_bytes_total", "Bytes copied device to host by swap-outs.", s.bytes_out);
    scalar("counter", "swap_in_bytes_total", "Bytes copied host to device by swap-ins.", s.bytes_in);
    scalar("counter", "swap_fallbacks_total", "Victims recomputed because the swap space was full.", s.num_swap_fallbacks);
    scalar("gauge", "swap_space_usage_perc", "Fraction of host swap slots in use (0..1).", s.usage());
    return o.str();
}

}  // namespace pkv

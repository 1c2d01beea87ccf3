// lab/cost_model.hpp -- lab/LAB.md chapter L6: what one engine step costs on a
// GPU we do not have.
//
// The earlier chapters run a real model: a tiny one, on a CPU. That proves the
// *mechanisms* (who is preempted, what is recomputed, what a client sees), but
// not the *economics* the tutorial teaches, because a 2-core CPU is not a GPU
// server: batching is not free there, prefill is not compute-efficient, and
// there is no PCIe link for swap to cross. Serving teams answer "what would
// this do on an H200 with Llama-3-8B?" the way this chapter does: keep the
// real scheduler, block pool and metrics, and replace only the forward pass
// (and the copies) by a *modelled* duration, charged to a virtual clock.
// sim_runner.hpp is that replacement; this header is the model.
//
// The model is a roofline. A step's work splits into two phases that run one
// after the other on the GPU:
//   linear layers  every weight is read from HBM once per step, whatever the
//                  batch (that is why batching is nearly free while decode is
//                  memory-bound); 2 FLOPs per parameter per token;
//   attention      every request reads its whole context's K/V (all layers)
//                  once per step; 4 FLOPs per (query token, context position,
//                  head, head dimension) for QK^T and PV.
// Each phase takes max(bytes / bandwidth, FLOPs / peak), each scaled by an
// efficiency we state; a fixed overhead per step (scheduling, input
// preparation, kernel launches) comes on top. Swap copies cross PCIe, block
// by block and layer by layer, sharing the link with other traffic.
//
// What a roofline leaves out, and so where it is wrong: kernel launch gaps and
// tails, caches (a small model's weights may live in L2), the non-GEMM
// kernels (norms, RoPE, sampling), attention kernels that re-read K/V for
// long prefills, and contention between copies and compute. The fidelity
// program (lab/sim_fidelity.cpp) measures how far off the model is where
// we can measure: on this CPU, against the real engine.
//
// Sections: 1. presets (GPUs, PCIe links, models), each number with its
// source  2. sizes derived from a model  3. the KV pool a GPU holds, vLLM's way
// 4. the cost of one step  4b. what a swap costs  5. a worked example: one
// Llama-3-8B decode step on an H200, by hand.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "tiny_model/model.hpp"

namespace pkv {

// ============================================================================
// 1. Presets
// ============================================================================

// A GPU, by the numbers its datasheet gives. FLOPs are dense tensor-core
// throughput: datasheets often print the "with sparsity" figure, twice the
// dense one, which a transformer's dense GEMMs never see.
//
// Memory. A datasheet's "80 GB" is a marketing round number; what a serving
// engine sizes its KV cache from is what the device reports, the total that
// nvidia-smi prints (and torch.cuda.mem_get_info returns) in MiB. On an H100
// that is 81,559 MiB = 85.5e9 bytes, 7% more than "80 GB" read as decimal;
// on an H200 143,771 MiB = 150.8e9 bytes against "141 GB" (the datasheets'
// GB are nearly GiB). We take the reported figure: the KV pool is what is
// left after the weights, so those 7% of capacity are ~9% of the pool.
struct GpuSpec {
    std::string name;
    double memory_bytes;     // the capacity the device reports (nvidia-smi's total, MiB x 2^20)
    double memory_bw;        // bytes/s, peak
    double peak_flops;       // FLOP/s, dense BF16 tensor cores
    double fp8_flops;        // FLOP/s, dense FP8 tensor cores; 0 = no FP8 units (FP8 weights then run at the BF16 rate)
    std::string pcie;        // the host link it ships with (a PcieSpec name)
    std::string source;
};

// MiB, as nvidia-smi prints them, in bytes.
constexpr double mib(double n) { return n * 1048576.0; }

inline const std::vector<GpuSpec>& gpu_presets() {
    // The reported capacities (nvidia-smi's "Memory-Usage" total): H100 SXM
    // 81559MiB, A100 80GB 81920MiB, A100 40GB 40960MiB, L4 23034MiB, as listed
    // in modal-labs/modal-client pull request #2797 ("nvidia quotes GB on
    // their GPUs not GiB", 2025); H200 SXM 143771MiB, as nvidia-smi prints it
    // on H200 hosts (public nvidia-smi logs, e.g. in GPU operator guides).
    static const std::vector<GpuSpec> v = {
        // NVIDIA H200 Tensor Core GPU datasheet (2024), SXM: 141 GB HBM3e,
        // 4.8 TB/s, BF16 1,979 TFLOPS "with sparsity", so 989 dense; FP8
        // 3,958 with sparsity, 1,979 dense; PCIe Gen5.
        {"h200", mib(143771), 4.8e12, 989e12, 1979e12, "gen5",
         "NVIDIA H200 datasheet (SXM): 141 GB HBM3e (reports 143771 MiB), 4.8 TB/s, 989 TFLOPS dense BF16, 1979 dense FP8"},
        // NVIDIA H100 Tensor Core GPU datasheet, SXM: 80 GB HBM3, 3.35 TB/s,
        // BF16 1,979 TFLOPS with sparsity (989 dense), FP8 3,958 (1,979
        // dense); PCIe Gen5.
        {"h100", mib(81559), 3.35e12, 989e12, 1979e12, "gen5",
         "NVIDIA H100 datasheet (SXM): 80 GB HBM3 (reports 81559 MiB), 3.35 TB/s, 989 TFLOPS dense BF16, 1979 dense FP8"},
        // NVIDIA A100 Tensor Core GPU datasheet, 80GB SXM: 2,039 GB/s HBM2e,
        // BF16 312 TFLOPS dense (624 with sparsity); no FP8; PCIe Gen4.
        {"a100-80g", mib(81920), 2.039e12, 312e12, 0, "gen4",
         "NVIDIA A100 datasheet (80GB SXM): 80 GB HBM2e (reports 81920 MiB), 2,039 GB/s, 312 TFLOPS dense BF16"},
        // NVIDIA L4 datasheet: 24 GB GDDR6, 300 GB/s, BF16 242 TFLOPS with
        // sparsity (121 dense), FP8 485 with sparsity (242.5 dense); PCIe
        // Gen4 x16.
        {"l4", mib(23034), 300e9, 121e12, 242.5e12, "gen4",
         "NVIDIA L4 datasheet: 24 GB GDDR6 (reports 23034 MiB), 300 GB/s, 121 TFLOPS dense BF16, 242.5 dense FP8"},
        // The same A100 datasheet, 40GB SXM: 1,555 GB/s HBM2, 312 TFLOPS
        // dense BF16; PCIe Gen4. (After the 80 GB one: a program that
        // matches a device name's first word finds "a100" there first.)
        {"a100-40g", mib(40960), 1.555e12, 312e12, 0, "gen4",
         "NVIDIA A100 datasheet (40GB SXM): 40 GB HBM2 (reports 40960 MiB), 1,555 GB/s, 312 TFLOPS dense BF16"},
        // One Blackwell GPU of a GB200 NVL72 (the GB200 variant of B200, at
        // 1,200 W): 8 TB/s HBM3e, 2,500 TFLOPS dense BF16 and 5,000 dense FP8
        // (the "Matrix" column of NVIDIA's Blackwell figures as tabulated at
        // glennklockwood.com/garden/processors/B200); 192 GB, as
        // TensorRT-LLM's performance overview names it ("GB200 192GB (GB200
        // NVL72)"). What the device reports in MiB we have not seen, so the
        // capacity is 192e9 bytes; the one anchor row on it (vLLM pull
        // request #44594) fixes its KV pool at 16 GiB, so the capacity does
        // not enter it. Its host link is NVLink-C2C to the Grace CPU.
        {"gb200", 192e9, 8e12, 2500e12, 5000e12, "c2c",
         "NVIDIA GB200 (B200 in GB200 NVL72): 192 GB HBM3e, 8 TB/s, 2500 TFLOPS dense BF16, 5000 dense FP8; NVLink-C2C to Grace"},
    };
    return v;
}

// A host link: the one-direction rate a pinned-memory cudaMemcpyAsync
// reaches, not the raw signalling rate. PCIe Gen4 x16 signals 16 GT/s on 16
// lanes with 128b/130b encoding, 31.5 GB/s each way; copies of large pinned
// buffers reach about 25 GB/s (CUDA's bandwidthTest sample on Gen4 hosts).
// Gen5 doubles the signalling rate (63 GB/s raw); we take 50 GB/s achieved,
// the same 80% ratio.
//
// Each copy call also costs a fixed time before its bytes move: submitting
// one cudaMemcpyAsync costs about 5-7 us when many small chunks are copied
// (measured by Wu et al., "DualPath: Breaking the Storage Bandwidth
// Bottleneck in Agentic LLM Inference", arXiv 2602.21548, 2026, section 5.2);
// we take the low end, 5 us, for both links. It matters because vLLM V0
// swaps a block as many small copies (section 4b).
struct PcieSpec {
    std::string name;
    double bw;  // bytes/s, one direction
    double copy_overhead_s;  // per copy call
    std::string source;
};
inline const std::vector<PcieSpec>& pcie_presets() {
    static const std::vector<PcieSpec> v = {
        {"gen4", 25e9, 5e-6, "PCIe 4.0 x16: 31.5 GB/s raw per direction; ~25 GB/s for pinned copies; 5 us per copy call"},
        {"gen5", 50e9, 5e-6, "PCIe 5.0 x16: 63 GB/s raw per direction; ~50 GB/s for pinned copies (assumed 80%, as Gen4); 5 us per copy call"},
        // GB200's GPU reaches its Grace CPU's memory over NVLink-C2C, 900
        // GB/s in both directions together (NVIDIA's Grace Blackwell
        // material): 450 GB/s each way, of which we take the same 80%.
        {"c2c", 360e9, 5e-6, "NVLink-C2C: 900 GB/s both ways (450 each way); ~360 GB/s for copies (assumed 80%); 5 us per copy call"},
    };
    return v;
}

// A model: its shape (a Config, as our own checkpoints have) and the bytes of
// one weight and of one KV element as it is served.
struct ModelSpec {
    std::string name;
    Config shape;
    int weight_bytes;  // per parameter: 2 for BF16, 4 for our f32 checkpoints
    int kv_bytes;      // per K or V element
    std::string source;
};

inline Config shape_of(int dim, int hidden, int layers, int heads, int kv_heads, int vocab, int seq_len, bool shared) {
    Config c;
    c.dim = dim; c.hidden_dim = hidden; c.n_layers = layers; c.n_heads = heads; c.n_kv_heads = kv_heads;
    c.vocab_size = vocab; c.seq_len = seq_len; c.shared_classifier = shared;
    return c;
}

inline const std::vector<ModelSpec>& model_presets() {
    static const std::vector<ModelSpec> v = {
        // meta-llama/Meta-Llama-3-8B config.json: hidden 4096, intermediate
        // 14336, 32 layers, 32 attention heads, 8 key/value heads (GQA),
        // vocab 128256, max_position_embeddings 8192, untied embeddings; BF16.
        {"llama-3-8b", shape_of(4096, 14336, 32, 32, 8, 128256, 8192, false), 2, 2,
         "meta-llama/Meta-Llama-3-8B config.json (GQA 32q/8kv, 8.03B parameters), BF16"},
        // meta-llama/Llama-2-7b-hf config.json: hidden 4096, intermediate
        // 11008, 32 layers, 32 heads and 32 key/value heads (multi-head
        // attention: 4x Llama-3-8B's KV bytes per token), vocab 32000, 4096
        // positions, untied; BF16.
        {"llama-2-7b", shape_of(4096, 11008, 32, 32, 32, 32000, 4096, false), 2, 2,
         "meta-llama/Llama-2-7b-hf config.json (MHA 32q/32kv, 6.74B parameters), BF16"},
        // The same shape served as NVIDIA's TensorRT-LLM performance tables
        // serve it: nvidia/Llama-3.1-8B-Instruct-FP8 (ModelOpt FP8 weights;
        // Llama-3.1-8B's config.json has Llama-3-8B's shape with 131072
        // positions). The KV cache in FP8 too is our assumption: the tables
        // do not say which KV dtype their runs used. (We count every weight
        // at 1 byte; the checkpoint keeps its embeddings and lm_head in BF16,
        // 1 GB more, 6% of the weight bytes.)
        {"llama-3.1-8b-fp8", shape_of(4096, 14336, 32, 32, 8, 128256, 131072, false), 1, 1,
         "nvidia/Llama-3.1-8B-Instruct-FP8 (Llama-3.1-8B config.json shape), FP8 weights, FP8 KV (assumed)"},
        // The same Llama-3.1-8B shape in BF16 with its full 131072-token
        // context (its config.json: max_position_embeddings 131072): the
        // long-context preset, for sequences long enough to reach swap's
        // crossover length (section 4d), which Llama-3-8B's 8192 do not.
        {"llama-3.1-8b", shape_of(4096, 14336, 32, 32, 8, 128256, 131072, false), 2, 2,
         "meta-llama/Llama-3.1-8B config.json (GQA 32q/8kv, 131072 positions), BF16"},
        // Qwen/Qwen2.5-7B-Instruct config.json: hidden 3584, intermediate
        // 18944, 28 layers, 28 heads, 4 key/value heads (head_dim 128), vocab
        // 152064, 32768 positions, untied; BF16. Its KV is 57,344 bytes per
        // token: vLLM pull request #44594's "16 GiB -> 299,584 tokens".
        {"qwen2.5-7b", shape_of(3584, 18944, 28, 28, 4, 152064, 32768, false), 2, 2,
         "Qwen/Qwen2.5-7B-Instruct config.json (GQA 28q/4kv, 7.6B parameters), BF16"},
        // nvidia/Llama-3.3-70B-Instruct-FP8: Llama-3.3-70B's shape (hidden
        // 8192, intermediate 28672, 80 layers, 64 heads, 8 key/value heads,
        // vocab 128256, 131072 positions, untied) with ModelOpt FP8 weights;
        // FP8 KV assumed, as for the 8B FP8 preset (the checkpoint's
        // embeddings and lm_head stay BF16: 2 GB more than we count).
        {"llama-3.3-70b-fp8", shape_of(8192, 28672, 80, 64, 8, 128256, 131072, false), 1, 1,
         "nvidia/Llama-3.3-70B-Instruct-FP8 (Llama-3.3-70B config.json shape, 70.6B parameters), FP8 weights, FP8 KV (assumed)"},
        // facebook/opt-13b, the vLLM paper's model for its swap/recompute
        // comparison (section 7.3): hidden 5120, 40 layers, 40 heads (MHA),
        // a ReLU MLP of two 5120 x 20480 matrices, vocab 50272, 2048
        // positions, tied embeddings; FP16. Our shape has three MLP matrices
        // (SwiGLU), so `hidden` is 20480 x 2 / 3 = 13653: the same MLP
        // parameters (2 x 5120 x 20480), the same FLOPs and bytes. Its KV is
        // 800 KB per token, the paper's figure.
        {"opt-13b", shape_of(5120, 13653, 40, 40, 40, 50272, 2048, true), 2, 2,
         "facebook/opt-13b config.json (MHA 40 heads, 12.9B parameters; MLP as 3 x 13653 = 2 x 20480), FP16"},
        // llama2.c's stories15M.bin header: dim 288, hidden 768, 6 layers, 6
        // heads, 6 kv heads, vocab 32000, seq_len 256, shared classifier; f32.
        {"stories15M", shape_of(288, 768, 6, 6, 6, 32000, 256, true), 4, 4, "llama2.c stories15M.bin header, f32 as llama2.c serves it"},
        // tiny_model/model.hpp builtin_config with the built-in vocabulary.
        {"builtin", shape_of(128, 384, 4, 8, 4, 994, 1024, false), 4, 4, "tiny_model/model.hpp builtin_config (994-token vocabulary), f32"},
    };
    return v;
}

template <class T>
const T& find_preset(const std::vector<T>& presets, const std::string& name, const char* what) {
    std::string names;
    for (const T& p : presets) {
        if (p.name == name) return p;
        names += (names.empty() ? "" : ", ") + p.name;
    }
    throw std::invalid_argument(std::string("unknown ") + what + " '" + name + "' (known: " + names + ")");
}

// ============================================================================
// 2. Sizes that follow from a model's shape
// ============================================================================

// Parameters of the linear layers of all transformer layers: per layer q
// [n_heads*hd, dim], k and v [kv_heads*hd, dim], o [dim, n_heads*hd] and the
// three SwiGLU matrices [hidden, dim] (norm gains are a rounding error).
inline double layer_params(const Config& c) {
    const double d = c.dim, hd = c.head_dim(), q = c.n_heads * hd, kv = c.n_kv_heads * hd;
    return (double)c.n_layers * (d * q + 2.0 * d * kv + q * d + 3.0 * d * c.hidden_dim);
}
// The classifier's parameters (vocab x dim), read once per step whenever a
// step produces logits.
inline double classifier_params(const Config& c) { return (double)c.vocab_size * c.dim; }
// Every parameter, embedding included (one table when the classifier shares it).
inline double total_params(const Config& c) {
    return layer_params(c) + classifier_params(c) * (c.shared_classifier ? 1.0 : 2.0) + (2.0 * c.n_layers + 1.0) * c.dim;
}
// Bytes of K and V for one token, all layers.
inline double kv_bytes_per_token(const ModelSpec& m) {
    return 2.0 * m.shape.n_layers * m.shape.n_kv_heads * m.shape.head_dim() * m.kv_bytes;
}

// ============================================================================
// 3. The KV pool a GPU holds (vLLM's rule)
// ============================================================================
//
// vLLM sizes its KV cache once, at startup: it profiles one forward pass of
// the largest batch allowed, and gives the KV cache whatever is left of
// gpu_memory_utilization x total memory after the weights and that pass's
// peak activations:
//   kv_bytes = utilization x capacity - weights - activation reserve
//   num_blocks = kv_bytes / (block_size x KV bytes per token)
// We do not profile; the activation reserve is an estimate: a fixed 1 GiB
// (CUDA context, library workspaces) plus one chunk's hidden states
// (max_num_batched_tokens x (4 x dim + 2 x hidden) BF16 values) plus the
// logits of one row per running request (max_num_seqs x vocab floats).
struct KVPoolSize {
    double weight_bytes, reserve_bytes, kv_budget_bytes, block_bytes;
    int64_t num_blocks;
};
inline KVPoolSize kv_pool_size(const ModelSpec& m, double memory_bytes, double utilization, int block_size,
                               int max_num_batched_tokens, int max_num_seqs) {
    KVPoolSize k;
    k.weight_bytes = total_params(m.shape) * m.weight_bytes;
    k.reserve_bytes = 1073741824.0 + (double)max_num_batched_tokens * (4.0 * m.shape.dim + 2.0 * m.shape.hidden_dim) * 2.0 +
                      (double)max_num_seqs * m.shape.vocab_size * 4.0;
    k.kv_budget_bytes = utilization * memory_bytes - k.weight_bytes - k.reserve_bytes;
    k.block_bytes = kv_bytes_per_token(m) * block_size;
    if (!(k.block_bytes > 0))
        throw std::invalid_argument("kv_pool_size: model " + m.name + " stores no KV bytes per token (kv_bytes " +
                                    std::to_string(m.kv_bytes) + ", " + std::to_string(m.shape.n_kv_heads) + " kv heads)");
    if (!(utilization > 0 && utilization <= 1))
        throw std::invalid_argument("gpu_memory_utilization must be in (0, 1], got " + std::to_string(utilization));
    // The budget in blocks, capped where an int64 still holds it (a pool that
    // large is refused later, with its size, by the engine).
    k.num_blocks = k.kv_budget_bytes > 0 ? (int64_t)std::min(k.kv_budget_bytes / k.block_bytes, 9.0e18) : 0;
    return k;
}

// ============================================================================
// 4. The cost of one step
// ============================================================================

// How well kernels use the hardware. Assumptions, not measurements: tuned
// GEMM and attention kernels reach most of HBM bandwidth on large reads; a
// decode step rarely reaches the tensor cores' peak. The overhead is what a
// step costs beyond its kernels (scheduling, preparing inputs, launching,
// sampling): vLLM V1 was rebuilt largely to cut it, and replays a decode
// step as a CUDA graph; one millisecond is our round assumption for it.
struct CostParams {
    double bw_efficiency = 0.8;      // fraction of peak memory bandwidth reached
    double flops_efficiency = 0.6;   // fraction of peak tensor FLOP/s reached by the GEMMs
    double attn_flops_efficiency = 0.4;  // ... and by attention (softmax, masking, smaller tiles)
    double step_overhead_s = 1e-3;   // fixed cost of a step
    double per_token_s = 0;          // per batch token, beyond the roofline (norms, RoPE; the CPU preset measures it)
    double per_logit_s = 0;          // per sampled row, beyond its classifier FLOPs (the argmax; the CPU preset measures it)
    // vLLM V0 waited for swap copies before the step's kernels ran (they were
    // issued on the same stream); true models that. False lets them overlap
    // with compute, so only what exceeds the step's compute time is paid.
    bool swap_stalls = true;
};

// One request's share of a step: `new_tokens` computed at positions
// [context_end - new_tokens, context_end).
struct StepItem {
    int new_tokens;
    int context_end;
};

// The modelled time of one step, and its parts (seconds), so that a study or
// a test can say which phase dominates.
struct StepCost {
    double linear_s = 0, attention_s = 0, swap_s = 0, overhead_s = 0, total_s = 0;
    double host_s = 0;  // the engine's host work the GPU waits for (section 4c; SimRunner adds it)
    double linear_bytes = 0, linear_flops = 0, attention_bytes = 0, attention_flops = 0;
    bool linear_memory_bound = true, attention_memory_bound = true;
};

// The hardware the cost is computed for: a GPU preset, or this CPU (the
// `cpu` preset, measured: sim_runner.hpp's calibrate_cpu).
struct Hardware {
    std::string name;
    double memory_bytes = 0, memory_bw = 0, peak_flops = 0;
    double attn_peak_flops = 0;  // 0 = peak_flops
    double pcie_bw = 0;          // bytes/s each way, for swap
    std::string source;
    // What a swap pays beyond bytes / pcie_bw (section 4b, swap_seconds):
    double copy_overhead_s = 0;  // per copy call (cudaMemcpyAsync); 0 for this CPU's memcpy
    double pcie_background = 0;  // share of the link other traffic takes, [0, 1)
};
inline Hardware hardware_of(const GpuSpec& g, const PcieSpec& p) {
    return {g.name, g.memory_bytes, g.memory_bw, g.peak_flops, 0, p.bw, g.source + "; " + p.source, p.copy_overhead_s, 0};
}
// The hardware as a model with `weight_bytes` per parameter sees it: FP8
// weights (1 byte) run their GEMMs on the FP8 tensor cores where the GPU has
// them (Hopper, Ada), at twice the BF16 rate; attention stays at the BF16
// rate (we do not model FP8 attention kernels).
inline Hardware hardware_for(const GpuSpec& g, const PcieSpec& p, int weight_bytes) {
    Hardware h = hardware_of(g, p);
    if (weight_bytes == 1 && g.fp8_flops > 0) {
        h.peak_flops = g.fp8_flops;
        h.attn_peak_flops = g.peak_flops;
    }
    return h;
}

// ---- the doors: every number of a preset, checked where it comes in ----------
//
// A GPU with no memory bandwidth (or no FLOPs, or a link of 0 bytes/s) would
// make a step infinitely long; a NaN or a negative rate would leave the
// simulated clock at 0 for hundreds of steps. Each is refused where a preset
// is built or handed in (SimRunner's constructor, step_cost), naming the field
// and what would work.
inline void require_number(double v, const std::string& field, double lo, double hi, bool lo_open) {
    // Written so that NaN fails: every comparison with NaN is false.
    const bool ok = std::isfinite(v) && (lo_open ? v > lo : v >= lo) && v <= hi;
    if (!ok)
        throw std::invalid_argument(field + " must be a finite number in " + (lo_open ? "(" : "[") + std::to_string(lo) + ", " +
                                    std::to_string(hi) + "], got " + std::to_string(v));
}
// The rates step_cost divides by (the link only when something is copied).
inline void validate_rates(const Hardware& hw, bool copies) {
    const std::string w = "hardware " + hw.name + ": ";
    require_number(hw.memory_bw, w + "memory_bw (bytes/s)", 0, 1e15, true);
    require_number(hw.peak_flops, w + "peak_flops (FLOP/s)", 0, 1e18, true);
    require_number(hw.attn_peak_flops, w + "attn_peak_flops (FLOP/s, 0 = peak_flops)", 0, 1e18, false);
    if (copies) {
        require_number(hw.pcie_bw, w + "pcie_bw (bytes/s)", 0, 1e13, true);
        require_number(hw.copy_overhead_s, w + "copy_overhead_s (seconds per copy call)", 0, 1, false);
        require_number(hw.pcie_background, w + "pcie_background (share of the link other traffic takes)", 0, 0.99, false);
    }
}
inline void validate(const Hardware& hw) {
    validate_rates(hw, true);
    require_number(hw.memory_bytes, "hardware " + hw.name + ": memory_bytes", 0, 1e21, true);
}
inline void validate(const CostParams& p) {
    require_number(p.bw_efficiency, "cost bw_efficiency", 0, 1, true);
    require_number(p.flops_efficiency, "cost flops_efficiency", 0, 1, true);
    require_number(p.attn_flops_efficiency, "cost attn_flops_efficiency", 0, 1, true);
    require_number(p.step_overhead_s, "cost step_overhead_s", 0, 3600, false);
    require_number(p.per_token_s, "cost per_token_s", 0, 3600, false);
    require_number(p.per_logit_s, "cost per_logit_s", 0, 3600, false);
}
inline void validate(const ModelSpec& m) {
    if (std::string p = m.shape.problem(); !p.empty()) throw std::invalid_argument("model " + m.name + ": " + p);
    // ids 0..2 are special (unk, BOS, EOS): a simulated token is one of the others.
    if (m.shape.vocab_size < 4) throw std::invalid_argument("model " + m.name + ": vocab_size must be >= 4, got " + std::to_string(m.shape.vocab_size));
    for (const auto& [bytes, what] : {std::pair{m.weight_bytes, "weight_bytes"}, std::pair{m.kv_bytes, "kv_bytes"}})
        if (bytes != 1 && bytes != 2 && bytes != 4)
            throw std::invalid_argument("model " + m.name + ": " + what + " must be 1, 2 or 4 (FP8/INT8, BF16, FP32), got " +
                                        std::to_string(bytes));
}

inline StepCost step_cost(const ModelSpec& m, const Hardware& hw, const CostParams& p, const std::vector<StepItem>& items,
                          int num_logits, double swap_bytes) {
    validate_rates(hw, swap_bytes != 0);
    validate(p);
    require_number(swap_bytes, "step_cost: swap_bytes", 0, 1e18, false);
    // ---- exercise 14 begin: lab L6: the cost of a step ----
    // Linear layers read every weight once (the classifier only when some
    // row wants logits) and do 2 FLOPs per weight per token (per logit for
    // the classifier): time = max(bytes / effective bandwidth, FLOPs /
    // effective peak). Attention: per request, read the context's K/V and
    // write the new tokens'; 4 x n_heads x head_dim x n_layers FLOPs per
    // (query, key) pair, n x e - n(n - 1)/2 pairs. Add the overheads; swap
    // time stalls the step or hides behind compute (p.swap_stalls).
    const Config& c = m.shape;
    StepCost s;
    double tokens = 0;
    for (const StepItem& it : items) tokens += it.new_tokens;
    if (tokens > 0 || num_logits > 0) {
        // Linear layers: all weights once; the classifier only if some row wants logits.
        const double cls = num_logits > 0 ? classifier_params(c) : 0.0;
        s.linear_bytes = (layer_params(c) + cls) * m.weight_bytes;
        s.linear_flops = 2.0 * layer_params(c) * tokens + 2.0 * classifier_params(c) * num_logits;
        const double t_mem = s.linear_bytes / (hw.memory_bw * p.bw_efficiency);
        const double t_cmp = s.linear_flops / (hw.peak_flops * p.flops_efficiency);
        s.linear_memory_bound = t_mem >= t_cmp;
        s.linear_s = std::max(t_mem, t_cmp);
        // Attention: each request reads its context's K/V once (and writes
        // its new tokens' K/V); a query at position q attends to q + 1 keys,
        // so n new tokens ending at e attend to sum_{q=e-n}^{e-1} (q + 1)
        // = n * e - n * (n - 1) / 2 keys in all.
        const double kv_tok = kv_bytes_per_token(m);
        const double per_key = 4.0 * c.n_heads * c.head_dim() * c.n_layers;  // FLOPs per (query, key)
        for (const StepItem& it : items) {
            const double n = it.new_tokens, e = it.context_end;
            s.attention_bytes += kv_tok * (e + n);  // read the context, write the new tokens
            s.attention_flops += per_key * (n * e - n * (n - 1.0) / 2.0);
        }
        const double attn_peak = hw.attn_peak_flops > 0 ? hw.attn_peak_flops : hw.peak_flops;
        const double a_mem = s.attention_bytes / (hw.memory_bw * p.bw_efficiency);
        const double a_cmp = s.attention_flops / (attn_peak * p.attn_flops_efficiency);
        s.attention_memory_bound = a_mem >= a_cmp;
        s.attention_s = std::max(a_mem, a_cmp);
        s.overhead_s = p.step_overhead_s + p.per_token_s * tokens + p.per_logit_s * num_logits;
    }
    const double compute = s.linear_s + s.attention_s;
    if (swap_bytes > 0) {
        const double t = swap_bytes / hw.pcie_bw;
        s.swap_s = p.swap_stalls ? t : std::max(0.0, t - compute);
    }
    s.total_s = s.overhead_s + compute + s.swap_s;
    return s;
    // ---- exercise 14 end ----
}

// ============================================================================
// 4b. What a swap costs: copies, not just bytes
// ============================================================================
//
// step_cost's swap_bytes term is the first-order model: bytes over the
// link's bandwidth. The simulated GPU (sim_runner.hpp) prices its swaps here
// instead, with what that term leaves out, each part from how vLLM V0 swaps:
//   copies      V0 moves a block as many small copies, not one: its cache
//               engine swaps layer by layer, the key and the value cache
//               separately (vllm/worker/cache_engine.py swap_in/swap_out,
//               the attention backend's swap_blocks), and the swap_blocks
//               op (csrc/cache_kernels.cu) issues one cudaMemcpyAsync per
//               block. So a block is 2 x n_layers copies (64 for Llama-3-8B,
//               of 32 KiB each), and each copy call costs copy_overhead_s
//               (5 us, section 1) before its bytes move: for a Llama-3-8B
//               block (2 MiB) that is 320 us of calls against 84 us of
//               bytes on Gen4 (42 on Gen5). We add the two; a driver that
//               overlapped each call with the previous copy's bytes would
//               pay only the larger, a fifth less on Gen4.
//   contention  the link is not ours alone: other GPUs behind the same PCIe
//               switch, the host's own I/O and checkpoint or data loading
//               share it. pcie_background is the share they take; a swap
//               gets the rest.
//   direction   out (device to host) and in (host to device) are both paid.
//               PCIe is full duplex, but V0 issues both on the stream the
//               step runs on, one after the other, so they add.
//   stalls      V0 issues the step's swaps before its kernels, on the same
//               stream: the step waits for all of them (CostParams::
//               swap_stalls, the default). With swap_stalls false the
//               copies go to a side stream: swap-outs then hide behind the
//               step's compute, but a swap-in still must finish before the
//               step runs, because the resumed request's attention reads
//               the K/V it brings back.

// The time to copy `bytes` in `copies` calls over hw's link, as the rest of
// the traffic leaves it.
inline double swap_seconds(const Hardware& hw, double copies, double bytes) {
    if (copies <= 0 && bytes <= 0) return 0.0;
    require_number(copies, "swap_seconds: copies", 0, 1e15, false);
    require_number(bytes, "swap_seconds: bytes", 0, 1e18, false);
    const double bw = hw.pcie_bw * (1.0 - hw.pcie_background);
    return copies * hw.copy_overhead_s + bytes / bw;
}

// One step's swaps, both ways.
struct SwapTraffic {
    double out_copies = 0, out_bytes = 0;  // device -> host (victims leaving)
    double in_copies = 0, in_bytes = 0;    // host -> device (victims resuming)
};

// How long the step waits for its swaps, given the step's compute time
// (linear + attention): everything before the kernels when copies stall the
// step (V0); otherwise the swap-ins, plus what of the swap-outs exceeds the
// compute they overlap.
inline double swap_stall_seconds(const Hardware& hw, const CostParams& p, const SwapTraffic& t, double compute_s) {
    const double out = swap_seconds(hw, t.out_copies, t.out_bytes), in = swap_seconds(hw, t.in_copies, t.in_bytes);
    if (p.swap_stalls) return out + in;
    return in + std::max(0.0, out - compute_s);
}

// ============================================================================
// 4c. The host's share of a step: an engine's CPU work
// ============================================================================
//
// A GPU step is not all a serving engine does. Between steps its host code
// gathers the last step's tokens, detokenizes and streams them, checks
// stop conditions, schedules the next batch and prepares its inputs -- much
// of it per running sequence. vLLM's v0.6.0 performance post
// (blog.vllm.ai/2024/09/05/perf-update.html, "Performance Diagnosis")
// measured it for Llama 3 8B on one H100 under light load: the HTTP API
// server took 33% of the time, scheduling and input preparation 29%, and
// only 38% went to GPU execution, at about 13 ms per token; vLLM's
// multi-step scheduling RFC (github.com/vllm-project/vllm issue #6854)
// saw "about 4ms of GPU bubble" per decode step from it. Engines fight it
// in three ways, and a profile (HostProfile) says which an engine uses:
//   overlap     run host work while the GPU computes: TensorRT-LLM's overlap
//               scheduler (on by default in its PyTorch backend) does so for
//               all of it, the next step's scheduling included; vLLM V1 moves
//               the per-request work -- detokenizing, streaming -- out of its
//               engine loop into other processes ("greater overlap of
//               CPU-intensive tasks -- such as tokenization, ...,
//               de-tokenization, and request streaming -- with the core
//               execution loop", the V1 announcement,
//               blog.vllm.ai/2025/01/27/v1-alpha-release.html), while its
//               scheduler and input preparation still run between steps;
//               vLLM 0.6 had moved the API server out and made output
//               processing asynchronous already (the v0.6.0 post);
//   multi-step  schedule once for several decode steps (vLLM 0.6's
//               --num-scheduler-steps): the per-step work is divided by
//               their number.
// What is not overlapped adds to the step; what is overlapped shows only
// where it outlasts the step. What the host work costs is two numbers,
// `per_step` and `per_seq` (each scheduled sequence of a step), and those
// we could not read off any source for each engine: lab/sim_anchors.cpp
// chooses them on its `fit` rows (--fit shows the search), and its
// `holdout` rows, never used to choose anything, say how well they carry.
struct HostProfile {
    std::string name;
    double per_step_s = 0;   // host seconds per engine step
    double per_seq_s = 0;    // host seconds per scheduled sequence per step
    bool step_overlaps = false;  // the per-step work hides behind the GPU's step
    bool seq_overlaps = false;   // the per-sequence work does
    int steps_per_schedule = 1;  // > 1: the per-step work is paid once per this many steps (multi-step)
    std::string source;
};

// The two host costs, one pair for every engine (a pair per engine would
// have more numbers to choose than the fit rows could pin down): chosen on
// lab/sim_anchors.cpp's fit rows, by `build/sim_anchors --fit`, a grid
// search printed in full. What the sources above measured, for scale: ~4 ms
// per decode step in vLLM 0.5 (issue #6854), 29% of ~13 ms per token for
// vLLM's scheduling in the same era (the v0.6.0 post).
// The search was run twice, on the fit rows both times. First with every
// vLLM profile's host work between steps (none overlapped but
// TensorRT-LLM's): it chose 1 ms and 40 us too (fit rows 10.8% / 32.7%),
// and the holdout missed (median 12.4%, worst 50.2%: vLLM V1 on the GB200
// came out 37% slow). The V1 announcement then said what we had not read
// first -- that V1's per-request work runs beside its engine loop -- and the
// profiles below follow it; the second search, on the fit rows alone, chose
// the same pair (10.6% / 33.2%). Both are in lab/LAB.md chapter L6.
constexpr double kHostPerStepS = 1e-3;
constexpr double kHostPerSeqS = 40e-6;

// The engines the anchor rows ran, by how they hide host work. The studies'
// engine is vLLM's (the card follows vLLM V1), host work included.
inline const std::vector<HostProfile>& host_profiles() {
    static const std::vector<HostProfile> v = {
        {"none", 0, 0, false, false, 1, "no host work: the GPU's step alone"},
        {"vllm", kHostPerStepS, kHostPerSeqS, false, true, 1,
         "vLLM V1: scheduling between steps; per-request output work in other processes, overlapped"},
        {"vllm-multistep", kHostPerStepS, kHostPerSeqS, false, true, 10,
         "vLLM 0.6 with --num-scheduler-steps 10: scheduling once per 10 steps; output processing asynchronous"},
        {"trtllm", kHostPerStepS, kHostPerSeqS, true, true, 1, "TensorRT-LLM PyTorch backend: overlap scheduler on (its default)"},
    };
    return v;
}
inline const HostProfile& study_host_profile() { return find_preset(host_profiles(), "vllm", "host profile"); }

// The seconds a step's host work adds to a GPU step of `gpu_s` with
// `num_seqs` scheduled sequences.
inline double host_seconds(const HostProfile& h, int num_seqs, double gpu_s) {
    require_number(h.per_step_s, "host per_step_s", 0, 1, false);
    require_number(h.per_seq_s, "host per_seq_s", 0, 1, false);
    if (h.steps_per_schedule < 1) throw std::invalid_argument("host steps_per_schedule must be >= 1");
    const double step = h.per_step_s / h.steps_per_schedule, seq = h.per_seq_s * std::max(0, num_seqs);
    const double exposed = (h.step_overlaps ? 0.0 : step) + (h.seq_overlaps ? 0.0 : seq);
    const double hidden = (h.step_overlaps ? step : 0.0) + (h.seq_overlaps ? seq : 0.0);
    return exposed + std::max(0.0, hidden - gpu_s - exposed);
}

// ============================================================================
// 4d. Where swap starts to beat recompute: the crossover length L*
// ============================================================================
//
// A victim of L tokens costs, to bring back,
//   recompute  its L tokens' prefill, inside a batch that is running anyway:
//              the marginal work is FLOPs (the weights are read for the
//              batch regardless), 2 x layer parameters per token for the
//              linear layers and, for attention, every (query, key) pair
//              of an L-token prefill, L (L + 1) / 2 of them -- a cost that
//              grows as L squared;
//   swap       its blocks out and back in (section 4b), copies and bytes,
//              a cost that grows as L.
// So below some length recompute is cheaper and above it swap is: L*. It
// depends on the GPU (FLOPs), the model (FLOPs and KV bytes per token), the
// link and the block size (copies per token). It is a marginal cost in a
// busy batch: a short recompute in a step that is memory-bound anyway (a
// small batch) costs even less than its FLOPs, so near L* and below it the
// engine's own runs, not this formula, decide (the preemption study runs
// them). The claim that swap "wins
// only for very long sequences" is a claim about L*; the preemption study
// prints it and tests lengths on both sides of it.
inline double recompute_seconds(const ModelSpec& m, const Hardware& hw, const CostParams& p, double L) {
    const Config& c = m.shape;
    const double attn_peak = hw.attn_peak_flops > 0 ? hw.attn_peak_flops : hw.peak_flops;
    const double linear = 2.0 * layer_params(c) * L / (hw.peak_flops * p.flops_efficiency);
    const double per_key = 4.0 * c.n_heads * c.head_dim() * c.n_layers;
    return linear + per_key * L * (L + 1.0) / 2.0 / (attn_peak * p.attn_flops_efficiency);
}
inline double swap_roundtrip_seconds(const ModelSpec& m, const Hardware& hw, double L, int block_size) {
    const double blocks = std::ceil(L / block_size);
    const double copies = blocks * 2.0 * m.shape.n_layers, bytes = blocks * block_size * kv_bytes_per_token(m);
    return 2.0 * swap_seconds(hw, copies, bytes);  // out, then in
}
// L*: the shortest length (in tokens, to the block) from which swap costs
// less than recompute; 0 if swap is cheaper from the first block, -1 if not
// below `limit` tokens.
inline long swap_crossover_tokens(const ModelSpec& m, const Hardware& hw, const CostParams& p, int block_size, long limit = 1L << 24) {
    auto swap_wins = [&](long L) { return swap_roundtrip_seconds(m, hw, (double)L, block_size) < recompute_seconds(m, hw, p, (double)L); };
    if (swap_wins(block_size)) return 0;
    if (!swap_wins(limit)) return -1;
    long lo = block_size, hi = limit;  // recompute - swap grows with L (quadratic against linear): one crossing
    while (hi - lo > block_size) {
        const long mid = lo + (hi - lo) / 2;
        (swap_wins(mid) ? hi : lo) = mid;
    }
    return (hi + block_size - 1) / block_size * block_size;
}

// ============================================================================
// 5. Worked by hand: one decode step of Llama-3-8B on an H200
// ============================================================================
//
// 64 requests, each decoding one token with 1024 tokens of context before it
// (so context_end = 1025), no swap, BF16 everywhere.
//
// Linear layers. Per layer: q and o are 4096 x 4096 (16.78M each), k and v
// are 1024 x 4096 (4.19M each: 8 kv heads x 128), the three MLP matrices
// 14336 x 4096 (58.72M each): 218.10M per layer, 6.979B for 32 layers; the
// classifier is 128256 x 4096 = 525.3M (the embedding is a separate table of
// the same size, but a lookup reads only 64 rows of it).
//   bytes  = (6.979e9 + 0.525e9) x 2           = 15.01 GB
//   FLOPs  = 2 x 6.979e9 x 64 + 2 x 0.525e9 x 64 = 960.6 GFLOP
//   memory = 15.01e9 / (4.8e12 x 0.8)          = 3.909 ms
//   compute= 960.6e9 / (989e12 x 0.6)          = 1.619 ms  -> memory-bound: 3.909 ms
// Attention. K and V of one token, all layers: 2 x 32 x 8 x 128 x 2 bytes
// = 131,072 bytes (128 KiB). Each request reads 1025 tokens' worth and writes
// 1 (the new token), 64 requests:
//   bytes  = 131072 x 1026 x 64                = 8.607 GB
//   FLOPs  = 4 x 32 heads x 128 x 32 layers x 1025 keys x 64 = 34.39 GFLOP
//   memory = 8.607e9 / (4.8e12 x 0.8)          = 2.241 ms
//   compute= 34.39e9 / (989e12 x 0.4)          = 0.087 ms  -> memory-bound: 2.241 ms
// Step: 1 ms overhead + 3.909 + 2.241 = 7.150 ms, i.e. 64 tokens in 7.15 ms,
// 8,950 output tokens/s for this batch. At batch 1 the same step is 1 +
// 3.909 + 0.035 = 4.94 ms: 64x the tokens for 1.45x the time, the whole case
// for batching, and at 64 x 1025 tokens of context, attention already costs
// more than half as much as the weights.
// tests/test_sim.cpp recomputes these numbers with step_cost().

}  // namespace pkv

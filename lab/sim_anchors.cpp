// lab/sim_anchors.cpp -- lab/LAB.md chapter L6: the simulator against the
// world, on rows it never saw; and chapter L7's claims against the world.
//
//   build/sim_anchors [--set fit|holdout|all] [--jobs N] [--json]
//   build/sim_anchors --fit [--jobs N]       the search that chose the host costs
//   build/sim_anchors --world [--json]       each claim against what a real engine showed
//
// sim_fidelity checks the cost model against the one machine we can run,
// this CPU. This program checks it against GPUs we cannot run: published
// measurements of real serving engines, each row with its source (where we
// read it: URL and the table or paragraph), the configuration it was
// measured in (GPU, model and dtype, lengths, request count, concurrency or
// rate, engine limits, scheduler) and its figure. For each we run the
// simulator -- the real scheduler and block pool on a SimRunner, the recipe
// of the studies (study_kit.hpp) -- on that configuration, *with that
// engine's own scheduler* (TensorRT-LLM's default capacity scheduler,
// GUARANTEED_NO_EVICT, never evicts: its rows reserve each request's whole
// sequence at admission; vLLM's bet and preempt), and print predicted /
// published. Where a row reports preemptions, they are compared too.
//
// The rows are split, before anything was chosen on them, into two sets:
//   fit      the rows the host costs (cost_model.hpp section 4c) were
//            chosen on, by --fit: TensorRT-LLM's Llama-3.1-8B table on an
//            H200, SGLang's vLLM 0.6.0 rows on an A100, a vLLM 0.23 sweep
//            on an A100-40GB, vLLM's nightly H200 latency test;
//   holdout  rows never used to choose anything: the same TensorRT-LLM
//            table on an H100 (another GPU), its Llama-3.3-70B table on an
//            H200 (another model, 9x the weights), vLLM pull request #44594
//            on a GB200 (another GPU, another model, a KV pool under
//            pressure: the rows that preempt), and TensorRT-LLM issue
//            #16827 (a 70B model evicting, or not, under KV pressure).
// The goal is the holdout's error: median within 10%, worst within 25%.
//
// What we match and what we cannot:
//   - the GPU, the model's shape and its dtypes, the lengths, the request
//     count, how requests arrive (all at once, a Poisson rate, or a client
//     concurrency, which an engine with max_num_seqs = C reproduces), the
//     engine's batch limits and KV sizing where the source gives them or the
//     engine's documented defaults where it does not (said per row);
//   - not the engine's own kernels: every row is priced by the same roofline
//     (cost_model.hpp) with the same assumed efficiencies; the engines
//     differ only in how their host work is paid (section 4c's profiles).
// Where a source's number had to be derived (a mean output length from two
// published totals; a throughput from a published rate and a published
// gain), the row says how.
//
// Sections: 1. the rows  2. running one  3. the fit  4. the world  5. main.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "examples/cli.hpp"
#include "lab/studies.hpp"

namespace {

// ============================================================================
// 1. The rows
// ============================================================================

enum class Metric { kOutputTokPerS, kMedianTpotMs, kBatchLatencyMs };
const char* metric_name(Metric m) {
    switch (m) {
        case Metric::kOutputTokPerS: return "output tok/s";
        case Metric::kMedianTpotMs: return "median TPOT ms";
        case Metric::kBatchLatencyMs: return "batch latency ms";
    }
    return "?";
}

// How an engine sizes its KV pool.
enum class KvRule {
    kVllm,    // gpu_memory_utilization x capacity - weights - activations (cost_model.hpp section 3)
    kTrtllm,  // kv_cache_free_gpu_mem_fraction x (capacity - weights - activations): a share of what is *free*
    kFixed,   // the row gives the pool in tokens
};

struct Anchor {
    std::string id, set;   // set: "fit" or "holdout"
    std::string source;    // where the figure is published: URL (and commit) + table or paragraph
    std::string engine;    // what was measured
    std::string host = "vllm";  // its host profile (cost_model.hpp section 4c)
    std::string gpu, model;
    // The workload: lengths (fixed, uniform in [lo, hi], or lognormal with
    // these means), how requests arrive, and the engine's limits.
    int prompt = 0, output = 0;
    int prompt_hi = 0, output_hi = 0;  // > 0: uniform in [prompt, prompt_hi] (and output)
    bool lognormal = false;    // ShareGPT-like: lognormal lengths with these means (sigma 1, traffic.hpp's chat_like)
    int requests = 0;
    double rate = 0;           // Poisson requests/s; 0 = all at once
    int max_num_seqs = 256, max_num_batched_tokens = 8192, max_model_len = 0, block_size = 16;
    KvRule kv = KvRule::kVllm;
    double kv_fraction = 0.9;  // gpu_memory_utilization, or TensorRT-LLM's free-memory fraction
    long kv_tokens = 0;        // KvRule::kFixed
    pkv::Admission admission = pkv::Admission::kBet;
    double watermark = 0;
    Metric metric = Metric::kOutputTokPerS;
    double published = 0;
    long published_preemptions = -1;  // >= 0: the source reports them
    std::string config;        // the configuration in words, as the source states it
    std::string note;          // how the row was matched, where it needed a choice
};

// TensorRT-LLM's performance overview (docs/source/performance/perf-overview.md,
// github.com/NVIDIA/TensorRT-LLM at commit 00f37686aa85): trtllm-bench
// throughput, "a local inference client is fed requests at an infinite rate",
// "Total Output Throughput (tokens/sec)", synthetic fixed lengths
// (token-norm-dist with stdev 0), the request counts of its "Preparing a
// Dataset" table. Engine: the PyTorch backend with its defaults, so the
// GUARANTEED_NO_EVICT capacity scheduler (reserve), KV blocks of 32 tokens
// (TensorRT-LLM's "Number of tokens per block: 32", in the logs its users
// post, e.g. issue #6294), KV memory 0.9 of what is free (the page: "the
// default setting of 0.90"; "in many cases" 0.95 -- which rows, it does not
// say), max_batch_size 2048 and max_num_tokens 8192 (the LLM API's defaults
// as we read them; trtllm-bench may tune its own).
struct TrtTable {
    std::string gpu_col, gpu, model, model_name, set;
};
int trt_requests(int isl, int osl) {
    static const std::map<std::pair<int, int>, int> n = {{{128, 128}, 30000}, {{128, 2048}, 3000}, {{128, 4096}, 1500},
                                                         {{1000, 2000}, 1500}, {{2048, 128}, 3000}, {{2048, 2048}, 1500},
                                                         {{5000, 500}, 1500},  {{1000, 1000}, 3000}, {{500, 2000}, 3000},
                                                         {{20000, 2000}, 1000}};
    return n.at({isl, osl});
}
Anchor trtllm(const TrtTable& t, const std::string& table, int isl, int osl, double figure) {
    Anchor a;
    a.id = "trtllm-" + t.gpu + (t.model == "llama-3.3-70b-fp8" ? "-70b-" : "-") + std::to_string(isl) + "/" + std::to_string(osl);
    a.set = t.set;
    a.source = "github.com/NVIDIA/TensorRT-LLM docs/source/performance/perf-overview.md (commit 00f37686aa85), table \"" + table +
               "\", column " + t.gpu_col + ", row " + std::to_string(isl) + "/" + std::to_string(osl);
    a.engine = "TensorRT-LLM (PyTorch backend), trtllm-bench throughput";
    a.host = "trtllm";
    a.gpu = t.gpu;
    a.model = t.model;
    a.prompt = isl;
    a.output = osl;
    a.requests = trt_requests(isl, osl);
    a.max_num_seqs = 2048;
    a.max_num_batched_tokens = 8192;
    a.block_size = 32;
    a.kv = KvRule::kTrtllm;
    a.admission = pkv::Admission::kReserve;
    a.metric = Metric::kOutputTokPerS;
    a.published = figure;
    a.config = std::to_string(a.requests) + " requests of " + std::to_string(isl) + " in / " + std::to_string(osl) + " out tokens, all queued at once, " +
               t.model_name + " on one " + t.gpu_col;
    a.note = "GUARANTEED_NO_EVICT (reserve); blocks of 32; KV 0.9 of free memory; max_batch_size 2048 / max_num_tokens 8192 assumed (LLM "
             "API defaults); FP8 KV assumed";
    return a;
}

std::vector<Anchor> anchors() {
    std::vector<Anchor> v;
    // ---- fit ----
    // TensorRT-LLM, Llama 3.1 8B (FP8), H200 TP1: every row of the table.
    const TrtTable h200_8b{"H200 TP1 (FP8)", "h200", "llama-3.1-8b-fp8", "nvidia/Llama-3.1-8B-Instruct-FP8", "fit"};
    const std::vector<std::tuple<int, int, double, double>> t8 = {
        {128, 128, 27911, 28312},   {128, 2048, 26221, 22714},  {128, 4096, 18027, 14325}, {500, 2000, 20770, 17660},
        {1000, 1000, 17744, 15220}, {1000, 2000, 16828, 13899}, {2048, 128, 3538, 3450},   {2048, 2048, 12194, 9305},
        {5000, 500, 3902, 3459},    {20000, 2000, 1804, 1351}};
    for (const auto& [isl, osl, h200, h100] : t8) v.push_back(trtllm(h200_8b, "Llama 3.1 8B", isl, osl, h200));
    // SGLang's reproduction of vLLM 0.6.0 (its benchmark/benchmark_vllm_060
    // README, "Offline benchmark results", Llama 3.1 8B Instruct on 1 x A100
    // 80G): 5000 ShareGPT prompts at an infinite rate; vLLM 21.27 req/s and
    // 4132.37 output tok/s, so its outputs average 4132.37 / 21.27 = 194
    // tokens. vLLM ran with --max_model_len 4096 and --num-scheduler-steps 10
    // (the v0.6.0 post's setting; host profile vllm-multistep) and its
    // defaults otherwise (max_num_seqs 256; no chunked prefill at that
    // length, so a prefill batch holds up to max_model_len tokens;
    // gpu_memory_utilization 0.9). The ShareGPT prompts' mean is not printed
    // there: we take the vLLM paper's ShareGPT mean, 161 tokens, and
    // lognormal lengths (sigma 1, traffic.hpp's chat_like).
    {
        Anchor a;
        a.id = "vllm060-a100-offline";
        a.set = "fit";
        a.source = "github.com/sgl-project/sglang benchmark/benchmark_vllm_060/README.md, \"Offline benchmark results\", "
                   "Llama 3.1 8B Instruct 1 x A100 80G, row inf / 5000 / vLLM";
        a.engine = "vLLM 0.6.0 (--num-scheduler-steps 10), measured by SGLang's bench_serving";
        a.host = "vllm-multistep";
        a.gpu = "a100-80g";
        a.model = "llama-3-8b";
        a.prompt = 161;
        a.output = 194;
        a.lognormal = true;
        a.requests = 5000;
        a.max_num_seqs = 256;
        a.max_num_batched_tokens = 4096;
        a.max_model_len = 4096;
        a.metric = Metric::kOutputTokPerS;
        a.published = 4132.37;
        a.config = "5000 ShareGPT requests at once, Llama-3.1-8B-Instruct BF16 on one A100-SXM4-80GB";
        a.note = "output mean 194 derived (4132.37 tok/s / 21.27 req/s); prompt mean 161 from the vLLM paper's ShareGPT; lognormal sigma 1";
        v.push_back(a);
    }
    // The same README, "Online benchmark results": 1200 (2400) ShareGPT
    // prompts at 4 (8) requests/s, Poisson; vLLM's median TPOT.
    for (const auto& [rps, n, tpot] : {std::tuple{4, 1200, 14.14}, std::tuple{8, 2400, 17.09}}) {
        Anchor a;
        a.id = "vllm060-a100-rps" + std::to_string(rps);
        a.set = "fit";
        a.source = "github.com/sgl-project/sglang benchmark/benchmark_vllm_060/README.md, \"Online benchmark results\", "
                   "Llama 3.1 8B Instruct 1 x A100 80G, row " + std::to_string(rps) + " / " + std::to_string(n) + " / vLLM, Median TPOT";
        a.engine = "vLLM 0.6.0 (--num-scheduler-steps 10), measured by SGLang's bench_serving";
        a.host = "vllm-multistep";
        a.gpu = "a100-80g";
        a.model = "llama-3-8b";
        a.prompt = 161;
        a.output = 194;
        a.lognormal = true;
        a.requests = n;
        a.rate = rps;
        a.max_num_seqs = 256;
        a.max_num_batched_tokens = 4096;
        a.max_model_len = 4096;
        a.metric = Metric::kMedianTpotMs;
        a.published = tpot;
        a.config = std::to_string(n) + " ShareGPT requests, Poisson at " + std::to_string(rps) + " req/s, Llama-3.1-8B-Instruct BF16 on one A100-SXM4-80GB";
        a.note = "lengths as the offline row (means 161 / 194, lognormal); TPOT per request = (last token - first token) / (tokens - 1)";
        v.push_back(a);
    }
    // A vLLM user's concurrency sweep on an A100 40GB ("vLLM throughput-
    // latency sweep on NVIDIA A100", johnmusgrave.com, vLLM 0.23.0,
    // Llama-3.1-8B-Instruct BF16, `vllm bench serve --dataset-name random
    // --random-input-len 1024 --random-output-len 128 --ignore-eos
    // --max-concurrency C --num-prompts 20C`): "decode at one request per
    // time runs at about 75 tokens/sec", and concurrency 8 gives "a 6.6x
    // gain", so about 495 tok/s. A client that keeps C requests in flight is
    // an engine with max_num_seqs C and every request queued at once. vLLM
    // V1's OpenAI-server default on an A100 is 2048 tokens per step
    // (vllm/engine/arg_utils.py, get_batch_defaults).
    for (const auto& [c, figure] : {std::pair{1, 75.0}, std::pair{8, 6.6 * 75.0}}) {
        Anchor a;
        a.id = "vllm023-a100-40g-c" + std::to_string(c);
        a.set = "fit";
        a.source = "johnmusgrave.com/p/vllm-throughput-latency-sweep-on (vLLM throughput-latency sweep on NVIDIA A100), summary: "
                   "\"about 75 tokens/sec\" at one request, \"a 6.6x gain\" at concurrency 8";
        a.engine = "vLLM 0.23.0, vllm bench serve";
        a.gpu = "a100-40g";
        a.model = "llama-3-8b";
        a.prompt = 1024;
        a.output = 128;
        a.requests = 20 * c;
        a.max_num_seqs = c;
        a.max_num_batched_tokens = 2048;
        a.metric = Metric::kOutputTokPerS;
        a.published = figure;
        a.config = std::to_string(20 * c) + " requests of 1024 in / 128 out, " + std::to_string(c) +
                   " in flight at a time, Llama-3.1-8B-Instruct BF16 on one A100 40GB";
        a.note = c == 1 ? "the blog's rounded figure" : "derived: 6.6 x 75 (both figures the blog's, rounded)";
        v.push_back(a);
    }
    // vLLM's nightly performance benchmark (Buildkite), latency test
    // llama8B_tp1 on an H200: one batch of 8 prompts of 32 tokens, 128
    // output tokens each; mean latency of the batch 833.421 ms. The LLM
    // class on a GPU of >= 70 GiB: 16384 tokens per step by default.
    {
        Anchor a;
        a.id = "vllm-nightly-h200-latency";
        a.set = "fit";
        a.source = "buildkite.com/vllm/performance-benchmark/builds/9515, \"Latency tests\" table, latency_llama8B_tp1 on H200, "
                   "mean latency";
        a.engine = "vLLM nightly (benchmark_latency)";
        a.gpu = "h200";
        a.model = "llama-3-8b";
        a.prompt = 32;
        a.output = 128;
        a.requests = 8;
        a.max_num_seqs = 8;
        a.max_num_batched_tokens = 16384;
        a.metric = Metric::kBatchLatencyMs;
        a.published = 833.421;
        a.config = "one batch of 8 requests of 32 in / 128 out tokens, Llama-3.1-8B BF16 on one H200";
        a.note = "the batch's latency = the simulated run's makespan";
        v.push_back(a);
    }
    // ---- holdout ----
    // TensorRT-LLM, Llama 3.1 8B (FP8), H100 TP1: every row.
    const TrtTable h100_8b{"H100 TP1 (FP8)", "h100", "llama-3.1-8b-fp8", "nvidia/Llama-3.1-8B-Instruct-FP8", "holdout"};
    for (const auto& [isl, osl, h200, h100] : t8) v.push_back(trtllm(h100_8b, "Llama 3.1 8B", isl, osl, h100));
    // TensorRT-LLM, Llama 3.3 70B (FP8), H200 TP1: every row.
    const TrtTable h200_70b{"H200 TP1 (FP8)", "h200", "llama-3.3-70b-fp8", "nvidia/Llama-3.3-70B-Instruct-FP8", "holdout"};
    const std::vector<std::tuple<int, int, double>> t70 = {{128, 128, 3803},   {128, 2048, 4336}, {128, 4096, 2872}, {500, 2000, 3666},
                                                           {1000, 1000, 2909}, {1000, 2000, 2994}, {2048, 128, 442}, {2048, 2048, 2003},
                                                           {5000, 500, 566},   {20000, 2000, 283}};
    for (const auto& [isl, osl, fig] : t70) v.push_back(trtllm(h200_70b, "Llama 3.3 70B", isl, osl, fig));
    // vLLM pull request #44594 ("[Core] Add kvcache watermark to reduce
    // preemptions", github.com/vllm-project/vllm/pull/44594, description,
    // "Benchmark Config" and "Results"): Qwen/Qwen2.5-7B-Instruct, TP=1, one
    // GB200; "KV cache: 16 GiB -> 299,584 tokens", prefix caching off;
    // --max-model-len 8192, --max-num-seqs 256, chunked prefill on; random
    // dataset, input ~1000 / output ~5000 with --random-range-ratio 0.2
    // (uniform within 20% either side), --ignore-eos, 450 prompts,
    // --max-concurrency 128. Five watermarks, each with its preemptions and
    // output tok/s. vLLM's OpenAI-server default on a GPU of >= 70 GiB: 8192
    // tokens per step (arg_utils.py get_batch_defaults).
    for (const auto& [wm, pre, tok] : {std::tuple{0.0, 1065L, 11582.0}, std::tuple{0.02, 400L, 12134.0}, std::tuple{0.05, 187L, 12167.0},
                                       std::tuple{0.10, 168L, 11835.0}, std::tuple{0.15, 168L, 11635.0}}) {
        Anchor a;
        a.id = wm == 0 ? std::string("vllm44594-gb200-wm-off") : study::fmt("vllm44594-gb200-wm-%.2f", wm);
        a.set = "holdout";
        a.source = "github.com/vllm-project/vllm/pull/44594 (description: Benchmark Config, Results table), row watermark " +
                   (wm == 0 ? std::string("off") : study::fmt("%.2f", wm)) + ": preempt and out tok/s";
        a.engine = "vLLM (V1, main as of 2026-06) with the pull request's KV-cache watermark";
        a.gpu = "gb200";
        a.model = "qwen2.5-7b";
        a.prompt = 800;
        a.prompt_hi = 1200;
        a.output = 4000;
        a.output_hi = 6000;
        a.requests = 450;
        a.max_num_seqs = 128;
        a.max_num_batched_tokens = 8192;
        a.max_model_len = 8192;
        a.kv = KvRule::kFixed;
        a.kv_tokens = 299584;
        a.watermark = wm;
        a.metric = Metric::kOutputTokPerS;
        a.published = tok;
        a.published_preemptions = pre;
        a.config = study::fmt("450 random requests (~1000 in / ~5000 out, +-20%%), 128 in flight, Qwen2.5-7B-Instruct BF16 on one GB200, "
                              "KV pool 299,584 tokens, watermark %s",
                              wm == 0 ? "off" : study::fmt("%.2f", wm).c_str());
        a.note = "128 in flight = max_num_seqs 128; lengths uniform in [800, 1200] and [4000, 6000]; 8192 tokens per step (vLLM's default)";
        v.push_back(a);
    }
    // TensorRT-LLM issue #16827 ("MAX_UTILIZATION causes a 40.6%
    // output-throughput drop ...", github.com/NVIDIA/TensorRT-LLM/issues/16827,
    // Summary and workload W-C): Llama-3.3-70B-FP8 on one H200, TensorRT-LLM
    // 1.2.1 (PyTorch backend, trtllm-serve); "128 requests, each exactly
    // 16,384 input tokens and up to 512 output tokens (ignore_eos on),
    // closed-loop concurrency 32"; output-token throughput 161.0 tok/s with
    // GUARANTEED_NO_EVICT and 95.7 with MAX_UTILIZATION ("96.2" with nominal
    // token counts, the figure we use: our tokens are nominal too). The
    // issue gives no KV settings: TensorRT-LLM's defaults assumed (0.9 of
    // free memory, blocks of 32, max_num_tokens 8192). MAX_UTILIZATION is the
    // bet with eviction, which we model as the card's preemption (recompute).
    for (const auto& [policy, tok] : {std::pair{"GUARANTEED_NO_EVICT", 161.0}, std::pair{"MAX_UTILIZATION", 96.2}}) {
        Anchor a;
        const bool evict = std::string(policy) == "MAX_UTILIZATION";
        a.id = std::string("trtllm16827-h200-70b-") + (evict ? "max-util" : "no-evict");
        a.set = "holdout";
        a.source = std::string("github.com/NVIDIA/TensorRT-LLM/issues/16827 (Summary; workload W-C; token-counting note), ") + policy +
                   " output-token throughput";
        a.engine = std::string("TensorRT-LLM 1.2.1 (PyTorch backend, trtllm-serve), capacity_scheduler_policy ") + policy;
        a.host = "trtllm";
        a.gpu = "h200";
        a.model = "llama-3.3-70b-fp8";
        a.prompt = 16384;
        a.output = 512;
        a.requests = 128;
        a.max_num_seqs = 32;
        a.max_num_batched_tokens = 8192;
        a.block_size = 32;
        a.kv = KvRule::kTrtllm;
        a.admission = evict ? pkv::Admission::kBet : pkv::Admission::kReserve;
        a.metric = Metric::kOutputTokPerS;
        a.published = tok;
        a.config = std::string("128 requests of 16,384 in / 512 out, 32 in flight, Llama-3.3-70B-Instruct-FP8 on one H200, ") + policy;
        a.note = std::string(evict ? "the bet with recompute on eviction; " : "reserve; ") +
                 "32 in flight = max_num_seqs 32; KV 0.9 of free memory, blocks of 32, max_num_tokens 8192 assumed (defaults)";
        v.push_back(a);
    }
    return v;
}

// ============================================================================
// 2. Running one
// ============================================================================

struct Outcome {
    double predicted = 0;
    long preemptions = 0;
    int peak_running = 0;
    long pool_tokens = 0;
    std::string error;
};

// The pool in blocks by the row's KV rule (0 = vLLM's, which the runner
// applies itself).
int pool_blocks(const Anchor& a) {
    if (a.kv == KvRule::kFixed) return (int)(a.kv_tokens / a.block_size);
    if (a.kv == KvRule::kVllm) return 0;
    pkv::SimConfig s = pkv::sim_config(a.gpu, a.model);
    s.max_num_batched_tokens = a.max_num_batched_tokens;
    s.max_num_seqs = a.max_num_seqs;
    // What vLLM's rule would give at utilization 1, plus the weights and the
    // reserve, is the memory left free of both: TensorRT-LLM takes its
    // fraction of that.
    const pkv::KVPoolSize k = pkv::kv_pool_size(s.model, s.hw.memory_bytes, 1.0, a.block_size, a.max_num_batched_tokens, a.max_num_seqs);
    return (int)std::max(0.0, a.kv_fraction * k.kv_budget_bytes / k.block_bytes);
}

// The env and scenario that run a row: its GPU and model, the engine's
// host profile, its pool, limits, scheduler and traffic.
struct RowSetup {
    study::Env env;
    study::Scenario sc;
};
RowSetup setup(const Anchor& a, const pkv::HostProfile& host) {
    RowSetup r;
    study::Env& env = r.env;
    env.device = pkv::Device::kSim;
    env.gpu = a.gpu;
    env.model = a.model;
    env.host = host;
    study::Scenario& sc = r.sc;
    sc.block_size = a.block_size;
    sc.num_blocks = pool_blocks(a);
    sc.max_num_seqs = a.max_num_seqs;
    sc.max_num_batched_tokens = a.max_num_batched_tokens;
    sc.max_model_len = a.max_model_len;
    // vLLM's rule sizes the pool itself; for the others the runner must let
    // the whole device's memory be asked for (the row's own rule sized it).
    sc.memory_utilization = a.kv == KvRule::kVllm ? a.kv_fraction : 1.0;
    sc.policy.admission = a.admission;
    sc.policy.watermark = a.watermark;
    sc.traffic.requests = a.requests;
    sc.traffic.seed = 1;
    if (a.lognormal) {
        const int cap = a.max_model_len > 0 ? a.max_model_len : 4096;
        // Prompt and output each at most half the context, so no request is refused.
        sc.traffic.prompt = study::LengthDist::lognormal(a.prompt, 1.0, 2, cap / 2);
        sc.traffic.output = study::LengthDist::lognormal(a.output, 1.0, 1, cap / 2);
    } else if (a.prompt_hi > 0) {
        sc.traffic.prompt = study::LengthDist::uniform(a.prompt, a.prompt_hi);
        sc.traffic.output = study::LengthDist::uniform(a.output, a.output_hi);
    } else {
        sc.traffic.prompt = study::LengthDist::fixed(a.prompt);
        sc.traffic.output = study::LengthDist::fixed(a.output);
    }
    if (a.rate > 0) sc.traffic.arrivals = study::Arrivals{study::Arrivals::Kind::kPoisson, a.rate, 1};
    return r;
}

Outcome run_anchor(const Anchor& a, const pkv::HostProfile& host) {
    const RowSetup rs = setup(a, host);
    const study::Env& env = rs.env;
    const study::Scenario& sc = rs.sc;
    // Per request: when its first and its last token came (single replica:
    // the engine's request id is the traffic's index).
    std::vector<double> first((size_t)a.requests, -1), last((size_t)a.requests, -1);
    std::vector<int> count((size_t)a.requests, 0);
    Outcome o;
    try {
        const study::Measurement m = study::measure(env, sc, [&](int, const pkv::StreamEvent& e, pkv::Engine&) {
            if (e.type != pkv::EventType::kToken) return;
            const size_t i = (size_t)e.request_id;
            if (first[i] < 0) first[i] = e.time;
            last[i] = e.time;
            count[i]++;
        });
        if (m.finished != a.requests)
            throw std::runtime_error(a.id + ": only " + std::to_string(m.finished) + " of " + std::to_string(a.requests) + " requests finished");
        o.preemptions = m.preemptions;
        o.peak_running = m.peak_running;
        switch (a.metric) {
            case Metric::kOutputTokPerS: o.predicted = m.useful_tok_per_s(); break;
            case Metric::kBatchLatencyMs: o.predicted = 1e3 * m.makespan_s; break;
            case Metric::kMedianTpotMs: {
                pkv::LatencySamples tpot;
                for (size_t i = 0; i < count.size(); ++i)
                    if (count[i] > 1) tpot.add((last[i] - first[i]) / (count[i] - 1));
                o.predicted = 1e3 * tpot.percentile(50);
                break;
            }
        }
    } catch (const std::exception& e) {
        o.error = e.what();
    }
    return o;
}

// Runs f(i) for i in [0, n) on `jobs` threads (each i on one thread; the
// results do not depend on how many).
void parallel_for(size_t n, int jobs, const std::function<void(size_t)>& f) {
    std::atomic<size_t> next{0};
    auto worker = [&]() {
        for (size_t i; (i = next++) < n;) f(i);
    };
    std::vector<std::thread> pool;
    for (int j = 1; j < jobs; ++j) pool.emplace_back(worker);
    worker();
    for (std::thread& t : pool) t.join();
}

const pkv::HostProfile& host_of(const Anchor& a) { return pkv::find_preset(pkv::host_profiles(), a.host, "host profile"); }

// |predicted / published - 1| per row.
double abs_error(const Anchor& a, const Outcome& o) { return o.error.empty() ? std::fabs(o.predicted / a.published - 1.0) : INFINITY; }

struct Summary {
    int n = 0;
    double median = 0, worst = 0;
};
Summary summarize(std::vector<double> errs) {
    Summary s;
    s.n = (int)errs.size();
    if (errs.empty()) return s;
    std::sort(errs.begin(), errs.end());
    const size_t n = errs.size();
    s.median = n % 2 ? errs[n / 2] : 0.5 * (errs[n / 2 - 1] + errs[n / 2]);
    s.worst = errs.back();
    return s;
}

// ============================================================================
// 3. The fit: how the host costs were chosen
// ============================================================================
//
// A grid over the two host costs every engine shares (cost_model.hpp
// section 4c): per step 0 to 4 ms, per scheduled sequence 0 to 160 us, each
// engine keeping its own way of paying them (overlap, multi-step). Every
// point runs the fit rows only; the one with the smallest median |error|
// (ties: the smaller worst) is the choice. The holdout rows are not run.
int run_fit(int jobs) {
    const std::vector<Anchor> all = anchors();
    std::vector<Anchor> rows;
    for (const Anchor& a : all)
        if (a.set == "fit") rows.push_back(a);
    // (The first grid stopped at 40 us per sequence and chose its edge; the
    // grid was widened once, to 160 us, so that it holds its minimum.)
    const std::vector<double> steps = {0, 0.5e-3, 1e-3, 1.5e-3, 2e-3, 3e-3, 4e-3}, seqs = {0, 5e-6, 10e-6, 20e-6, 40e-6, 80e-6, 160e-6};
    std::printf("sim_anchors --fit: %zu fit rows, host cost per step x per sequence (every engine's profile keeps its overlap / multi-step)\n\n",
                rows.size());
    study::Table t;
    t.headers = {"per step ms", "per seq us", "median |error|", "worst |error|"};
    double best_med = INFINITY, best_worst = INFINITY, best_step = 0, best_seq = 0;
    for (double st : steps)
        for (double sq : seqs) {
            std::vector<Outcome> out(rows.size());
            parallel_for(rows.size(), jobs, [&](size_t i) {
                pkv::HostProfile h = host_of(rows[i]);
                if (h.name != "none") {
                    h.per_step_s = st;
                    h.per_seq_s = sq;
                }
                out[i] = run_anchor(rows[i], h);
            });
            std::vector<double> errs;
            for (size_t i = 0; i < rows.size(); ++i) errs.push_back(abs_error(rows[i], out[i]));
            const Summary s = summarize(errs);
            t.rows.push_back({study::fmt("%g", 1e3 * st), study::fmt("%g", 1e6 * sq), study::fmt("%.1f%%", 100 * s.median),
                              study::fmt("%.1f%%", 100 * s.worst)});
            if (s.median < best_med - 1e-12 || (std::fabs(s.median - best_med) <= 1e-12 && s.worst < best_worst)) {
                best_med = s.median;
                best_worst = s.worst;
                best_step = st;
                best_seq = sq;
            }
        }
    t.print(stdout);
    std::printf("\nchosen: per step %g ms, per sequence %g us (fit rows: median %.1f%%, worst %.1f%%); cost_model.hpp section 4c holds them\n",
                1e3 * best_step, 1e6 * best_seq, 100 * best_med, 100 * best_worst);
    return 0;
}

// ============================================================================
// 4. Each claim against the world
// ============================================================================
//
// Where a real engine's published figures speak to a claim, the simulator
// runs that configuration (the anchor rows above, or the vLLM paper's) and
// judges it by the same test the studies use; beside it, what the real
// engine showed, judged by the same test. The tests:
//   C1   the bet's output tok/s against reserving's, beyond the draw band;
//   C13  raising concurrency (admitting more, so preempting more) makes
//        throughput worse by more than the draw band;
//   C11  with more preemptions, useful throughput falls by more than the
//        band (the device's busy time and processed tokens the sources do
//        not publish; the simulator's side prints them);
//   C7   the ITL p99 of the run with more preemptions is at least 3x the
//        other's (decide_c7's cliff);
//   C10  the run with more preemptions shows the counter and an ITL p99
//        at least 3x the other's (the other signals are not published);
//   C6a/C6b  the vLLM paper, section 7.3, on OPT-13B on an A100-40GB:
//        swapping "incurs excessive overhead with small block sizes";
//        "swapping is more efficient when the block size is large, though
//        recomputation overhead is never higher than 20% of swapping's
//        latency"; "for medium block sizes from 16 to 64, the two methods
//        exhibit comparable end-to-end performance". The paper's figure 19a
//        is a microbenchmark of the two operations; the simulator's are its
//        formulas for them (cost_model.hpp section 4d: recompute_seconds,
//        swap_roundtrip_seconds), for a victim of 1024 tokens (a long
//        ShareGPT conversation) at block sizes 1, 16 and 256 -- and at 16,
//        where the study runs it, the engine's own round trip too
//        (studies.hpp victim_roundtrip). "Comparable": within the draw band.
struct WorldRow {
    std::string claim, source, world, sim;
    int world_verdict = 0, sim_verdict = 0;  // +1 holds, -1 does not, 0 neither
    std::string why;
};
const char* word(int v) { return v > 0 ? "holds" : v < 0 ? "does not hold" : "neither"; }

// The ITL p99 and useful tok/s of one anchor's configuration (simulated).
struct Run {
    double itl_p99 = 0, useful = 0, processed = 0, busy = 0;
    long preemptions = 0;
};
Run run_config(const Anchor& a) {
    const RowSetup rs = setup(a, host_of(a));
    const study::Measurement m = study::measure(rs.env, rs.sc);
    return {m.itl.percentile(99), m.useful_tok_per_s(), m.processed_tok_per_s(), m.busy_fraction(), m.preemptions};
}

std::vector<WorldRow> world_rows(int jobs) {
    const std::vector<Anchor> all = anchors();
    auto find = [&](const std::string& id) -> const Anchor& {
        for (const Anchor& a : all)
            if (a.id == id) return a;
        throw std::logic_error("no anchor " + id);
    };
    const Anchor& wm_off = find("vllm44594-gb200-wm-off");
    const Anchor& wm_05 = find("vllm44594-gb200-wm-0.05");
    const Anchor& mu = find("trtllm16827-h200-70b-max-util");
    const Anchor& gne = find("trtllm16827-h200-70b-no-evict");
    Run r[4];
    const Anchor* cfg[4] = {&wm_off, &wm_05, &mu, &gne};
    parallel_for(4, jobs, [&](size_t i) { r[i] = run_config(*cfg[i]); });
    // The vLLM paper's comparison: one victim of 1024 tokens on OPT-13B, A100-40GB, Gen4.
    study::Env paper;
    paper.device = pkv::Device::kSim;
    paper.gpu = "a100-40g";
    paper.model = "opt-13b";
    const pkv::SimConfig pc = paper.sim_config_for("");
    const int bss[3] = {1, 16, 256};
    double rc[3], sw[3];
    for (int i = 0; i < 3; ++i) {
        rc[i] = pkv::recompute_seconds(pc.model, pc.hw, pc.cost, 1024);
        sw[i] = pkv::swap_roundtrip_seconds(pc.model, pc.hw, 1024, bss[i]);
    }
    const study::Measurement rt_rc = study::victim_roundtrip(paper, "", 1024, false, 16), rt_sw = study::victim_roundtrip(paper, "", 1024, true, 16);
    using study::compare;
    using study::fmt;
    using study::pct_change;
    std::vector<WorldRow> w;
    const std::string pr = "vLLM #44594 (GB200, Qwen2.5-7B), watermark off vs 0.05";
    const std::string ti = "TensorRT-LLM #16827 (H200, Llama-3.3-70B-FP8), MAX_UTILIZATION vs GUARANTEED_NO_EVICT";
    {
        const double wd = pct_change(12167, 11582), sd = pct_change(r[1].useful, r[0].useful);
        w.push_back({"C13", pr,
                     fmt("admitting without the watermark: 1065 preemptions against 187, output tok/s %+.1f%%", wd),
                     fmt("%ld preemptions against %ld, output tok/s %+.1f%%", r[0].preemptions, r[1].preemptions, sd),
                     compare(11582, 12167) < 0 ? 1 : -1, compare(r[0].useful, r[1].useful) < 0 ? 1 : -1, ""});
        w.push_back({"C11", pr, fmt("useful (output) tok/s %+.1f%% with 5.7x the preemptions; busy time and processed tokens not published", wd),
                     fmt("useful tok/s %+.1f%%, processed %+.1f%%, busy %.0f%% vs %.0f%%", sd, pct_change(r[1].processed, r[0].processed),
                         100 * r[0].busy, 100 * r[1].busy),
                     compare(11582, 12167) < 0 ? 1 : -1,
                     compare(r[0].useful, r[1].useful) < 0 && compare(r[0].processed, r[1].processed) >= 0 ? 1 : -1, ""});
        const double wr = 40.62 / 17.70, sr = r[1].itl_p99 > 0 ? r[0].itl_p99 / r[1].itl_p99 : 0;
        w.push_back({"C7", pr, fmt("ITL p99 40.62 ms against 17.70 ms: %.2fx", wr),
                     fmt("ITL p99 %.2f ms against %.2f ms: %.2fx", 1e3 * r[0].itl_p99, 1e3 * r[1].itl_p99, sr), wr >= 3 ? 1 : -1,
                     sr >= 3 ? 1 : -1, ""});
        w.push_back({"C10", pr, fmt("the counter at 1065 (against 187) and ITL p99 %.2fx; KV usage not published", wr),
                     fmt("the counter at %ld (against %ld) and ITL p99 %.2fx", r[0].preemptions, r[1].preemptions, sr),
                     wr >= 3 ? 1 : -1, r[0].preemptions > 0 && sr >= 3 ? 1 : -1, ""});
    }
    {
        const double wd = pct_change(161.0, 96.2), sd = pct_change(r[3].useful, r[2].useful);
        w.push_back({"C1", ti, fmt("the bet (MAX_UTILIZATION) %+.1f%% output tok/s against reserving", wd),
                     fmt("the bet %+.1f%% useful tok/s against reserving (%ld preemptions)", sd, r[2].preemptions),
                     compare(96.2, 161.0) > 0 ? 1 : -1, compare(r[2].useful, r[3].useful) > 0 ? 1 : -1, ""});
        w.push_back({"C13", ti, fmt("admitting more, with evictions: output tok/s %+.1f%%", wd),
                     fmt("output tok/s %+.1f%% with %ld preemptions", sd, r[2].preemptions), compare(96.2, 161.0) < 0 ? 1 : -1,
                     compare(r[2].useful, r[3].useful) < 0 && r[2].preemptions > 0 ? 1 : -1, ""});
    }
    {
        const std::string src = "vLLM paper (SOSP'23) section 7.3, OPT-13B on A100, one 1024-token victim";
        auto rel = [&](int i) { return pct_change(rc[i], sw[i]); };  // swap's time against recompute's, + = swap slower
        w.push_back({"C6a", src, "block size 1: swapping \"incurs excessive overhead with small block sizes\" (recompute is faster)",
                     fmt("block size 1: swap %+.0f%% against recompute", rel(0)), 1, compare(sw[0], rc[0]) > 0 ? 1 : -1, ""});
        w.push_back({"C6b", src,
                     "block size 256: swapping \"is more efficient\", and recomputation is \"never higher than 20%\" above it",
                     fmt("block size 256: recompute takes %.2fx swap's time", sw[2] > 0 ? rc[2] / sw[2] : 0), 1,
                     rc[2] > sw[2] && rc[2] <= 1.2 * sw[2] ? 1 : -1, ""});
        w.push_back({"C6a/C6b", src, "block size 16: \"the two methods exhibit comparable end-to-end performance\"",
                     fmt("block size 16: swap %+.0f%% against recompute (the engine's round trip: %+.0f%%)", rel(1),
                         pct_change(rt_rc.makespan_s, rt_sw.makespan_s)),
                     1, compare(sw[1], rc[1]) == 0 ? 1 : -1, ""});
    }
    // Why, where they disagree (or agree for another reason): each note reads
    // the numbers above, so it stays true when they move.
    for (WorldRow& x : w) {
        const bool pr44594 = x.source == pr, ti16827 = x.source == ti;
        if (pr44594 && (x.claim == "C13" || x.claim == "C11") && x.world_verdict != x.sim_verdict)
            x.why = fmt("both fall with the preemptions (the real engine %+.1f%%, the simulator %+.1f%%): the 5%% draw band lies between them",
                        pct_change(12167, 11582), pct_change(r[1].useful, r[0].useful));
        if (pr44594 && (x.claim == "C7" || x.claim == "C10") && x.world_verdict != x.sim_verdict)
            x.why = fmt("with the watermark the simulator's ITL p99 is %.1f ms against the real engine's 17.7: a roofline step has no tail "
                        "(launch jitter, host stalls, streaming), so the stalls preemption adds stand out more (the simulator's ratio is "
                        "%.1fx the real one)",
                        1e3 * r[1].itl_p99, (r[1].itl_p99 > 0 ? r[0].itl_p99 / r[1].itl_p99 : 0) / (40.62 / 17.70));
        if (ti16827 && r[2].preemptions == 0)
            x.why = std::string(x.world_verdict == x.sim_verdict ? "for another reason: " : "") +
                    "the simulator never evicts here -- 16,384-token prompts prefilled 8192 tokens a step keep the running set below what "
                    "the pool holds, so the bet and reserving run the same schedule; the real MAX_UTILIZATION evicts (its reporters suspect "
                    "it admits more prefills than the pool sustains), which our bet does not reproduce";
        if (x.claim == "C6b" && x.world_verdict != x.sim_verdict)
            x.why = fmt("the cost model recomputes a token in %.1fx the time it swaps one at large blocks (linear layers at 60%% of the "
                        "A100's peak, against 25 GB/s of link): the paper's A100 recomputed faster against its link than our constants say",
                        sw[2] > 0 ? rc[2] / sw[2] : 0);
        if (x.claim == "C6a/C6b" && x.world_verdict != x.sim_verdict)
            x.why = fmt("by the formulas swap saves %.0f%% of a 16-token-block round trip; the paper compared end-to-end throughput, where "
                        "a difference that size is diluted -- as the engine's own round trip here shows (%+.1f%%)",
                        -pct_change(rc[1], sw[1]), pct_change(rt_rc.makespan_s, rt_sw.makespan_s));
    }
    return w;
}

// ============================================================================
// 5. main
// ============================================================================

int run(int argc, char** argv) {
    bool json = false, fit = false, world = false;
    std::string set = "all";
    long long jobs = 2;
    cli::Parser p("sim_anchors", "[--set fit|holdout|all] [--jobs N] [--json] | --fit | --world",
                  "Runs the simulated GPU on published measurements of real serving engines and prints predicted / published per row, "
                  "with the median and the largest |error| of the fit and the holdout rows.");
    p.choice("--set", &set, {{"all", "all"}, {"fit", "fit"}, {"holdout", "holdout"}}, "which rows to run");
    p.integer("--jobs", &jobs, 1, 64, "rows run on this many threads (the results do not depend on it)");
    p.flag("--json", &json, "one JSON object: {\"rows\": [...], \"fit\": {...}, \"holdout\": {...}} (with --world: the world table)");
    p.flag("--fit", &fit, "search the host costs on the fit rows (a grid, printed in full; minutes)");
    p.flag("--world", &world, "each claim against what a real engine showed, the simulator at the same configuration beside it");
    p.parse(argc, argv);
    if (fit && world) cli::bad_usage("--fit and --world are two different runs: give one");
    if (fit) return run_fit((int)jobs);
    if (world) {
        const std::vector<WorldRow> w = world_rows((int)jobs);
        if (json) {
            std::vector<std::string> js;
            for (const WorldRow& x : w)
                js.push_back(workload::Json()
                                 .str("claim", x.claim)
                                 .str("source", x.source)
                                 .str("world", x.world)
                                 .str("world_verdict", word(x.world_verdict))
                                 .str("simulator", x.sim)
                                 .str("simulator_verdict", word(x.sim_verdict))
                                 .boolean("agree", x.world_verdict == x.sim_verdict)
                                 .str("why", x.why)
                                 .dump());
            std::printf("%s\n", workload::Json().raw("rows", workload::Json::array(js)).dump().c_str());
            return 0;
        }
        std::printf("sim_anchors --world: each claim against a real engine's published figures, and the simulator at that configuration\n\n");
        int agree = 0;
        for (const WorldRow& x : w) {
            agree += x.world_verdict == x.sim_verdict;
            std::printf("%s  %s\n  world:     %s -> %s\n  simulator: %s -> %s\n  %s%s%s\n\n", x.claim.c_str(), x.source.c_str(), x.world.c_str(),
                        word(x.world_verdict), x.sim.c_str(), word(x.sim_verdict), x.world_verdict == x.sim_verdict ? "agree" : "DISAGREE",
                        x.why.empty() ? "" : ": ", x.why.c_str());
        }
        std::printf("%d of %zu agree\n", agree, w.size());
        return 0;
    }

    std::vector<Anchor> rows;
    for (const Anchor& a : anchors())
        if (set == "all" || a.set == set) rows.push_back(a);
    std::vector<Outcome> out(rows.size());
    parallel_for(rows.size(), (int)jobs, [&](size_t i) { out[i] = run_anchor(rows[i], host_of(rows[i])); });
    std::vector<double> fit_errs, hold_errs;
    for (size_t i = 0; i < rows.size(); ++i) (rows[i].set == "fit" ? fit_errs : hold_errs).push_back(abs_error(rows[i], out[i]));
    const Summary sf = summarize(fit_errs), sh = summarize(hold_errs);
    int compared = 0;
    for (const Anchor& a : rows) compared += a.published_preemptions >= 0;

    if (json) {
        std::vector<std::string> js;
        for (size_t i = 0; i < rows.size(); ++i) {
            const Anchor& a = rows[i];
            workload::Json j;
            j.str("id", a.id).str("set", a.set).str("source", a.source).str("engine", a.engine).str("host_profile", a.host);
            j.str("config", a.config).str("gpu", a.gpu).str("model", a.model).str("metric", metric_name(a.metric));
            j.num("published", a.published).num("predicted", out[i].predicted).num("ratio", out[i].predicted / a.published);
            j.num("abs_error", abs_error(a, out[i]));
            if (a.published_preemptions >= 0) j.integer("published_preemptions", a.published_preemptions);
            j.integer("predicted_preemptions", out[i].preemptions);
            j.str("note", a.note);
            if (!out[i].error.empty()) j.str("error", out[i].error);
            js.push_back(j.dump());
        }
        auto set_json = [](const Summary& s) { return workload::Json().integer("rows", s.n).num("median_abs_error", s.median).num("max_abs_error", s.worst).dump(); };
        std::printf("%s\n", workload::Json()
                                .raw("rows", workload::Json::array(js))
                                .raw("fit", set_json(sf))
                                .raw("holdout", set_json(sh))
                                .integer("rows_comparing_preemptions", compared)
                                .dump()
                                .c_str());
        return 0;
    }
    std::printf("sim_anchors: the simulated GPU (cost_model.hpp's roofline and host costs) against %zu published measurements\n\n", rows.size());
    study::Table t;
    t.headers = {"row", "set", "workload", "metric", "published", "predicted", "ratio", "preemptions (published)"};
    for (size_t i = 0; i < rows.size(); ++i) {
        const Anchor& a = rows[i];
        // Lengths: fixed, "mean" (lognormal) or a range (uniform; no "~", which the docs checker reads as a timing).
        const std::string lin = a.prompt_hi ? study::fmt("%d-%d", a.prompt, a.prompt_hi) : std::to_string(a.prompt);
        const std::string lout = a.output_hi ? study::fmt("%d-%d", a.output, a.output_hi) : std::to_string(a.output);
        const std::string wl = study::fmt("%d x %s%s/%s%s", a.requests, a.lognormal ? "mean " : "", lin.c_str(), lout.c_str(),
                                          a.rate > 0 ? study::fmt(" @%g/s", a.rate).c_str() : study::fmt(" c%d", std::min(a.max_num_seqs, a.requests)).c_str());
        t.rows.push_back({a.id, a.set, wl, metric_name(a.metric), study::fmt("%.6g", a.published),
                          out[i].error.empty() ? study::fmt("%.6g", out[i].predicted) : "error",
                          out[i].error.empty() ? study::fmt("%.2f", out[i].predicted / a.published) : "-",
                          study::fmt("%ld", out[i].preemptions) + (a.published_preemptions >= 0 ? study::fmt(" (%ld)", a.published_preemptions) : "")});
    }
    t.print(stdout);
    for (size_t i = 0; i < rows.size(); ++i)
        if (!out[i].error.empty()) std::printf("  %s: %s\n", rows[i].id.c_str(), out[i].error.c_str());
    std::printf("\n|predicted / published - 1|:\n");
    if (sf.n) std::printf("  fit      %2d rows: median %.1f%%, worst %.1f%% (the host costs were chosen on these)\n", sf.n, 100 * sf.median, 100 * sf.worst);
    if (sh.n)
        std::printf("  holdout  %2d rows: median %.1f%%, worst %.1f%% (never used to choose anything; goal: median <= 10%%, worst <= 25%%)\n", sh.n,
                    100 * sh.median, 100 * sh.worst);
    std::printf("  %d rows compare preemptions\n", compared);
    std::printf("\nSources (and how each row was matched):\n");
    for (const Anchor& a : rows) std::printf("  %s: %s\n      %s; %s. %s\n", a.id.c_str(), a.source.c_str(), a.engine.c_str(), a.config.c_str(), a.note.c_str());
    return 0;
}

}  // namespace

int main(int argc, char** argv) { return cli::guarded_main("sim_anchors", [&] { return run(argc, argv); }); }

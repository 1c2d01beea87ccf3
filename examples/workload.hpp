// examples/workload.hpp -- what examples/overload and the studies share:
//
//   make_prompt     a prompt of random words, exactly `len` tokens
//   EngineKnobs     the engine's knobs; engine_config() makes the one
//                   pkv::EngineConfig every program and study runs
//   Setup           the knobs plus one synthetic workload
//   add_workload    every request at once (what overload does)
//   run()           one engine, one workload, measured: requests may arrive
//                   spread over steps, and every latency is recorded twice,
//                   in engine steps (deterministic) and in wall seconds
//   study_setup()   the overloaded workload the studies share
//   a few helpers for the studies' command lines and their --json output
//
// Every request sets ignore_eos and generates exactly max_tokens tokens, so a
// run is a fixed amount of useful work and two configurations can be
// compared on how they get it done.
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "engine.hpp"
#include "examples/devices.hpp"
#include "examples/cli.hpp"
#include "tiny_model/builtin.hpp"
#include "tiny_model/tokenizer.hpp"

namespace workload {

// ============================================================================
// 1. The knobs
// ============================================================================

// The engine's knobs, as flags and studies set them; engine_config() is the
// one place they become a pkv::EngineConfig. Defaults are `make run`'s demo.
struct EngineKnobs {
    int num_blocks = 40, block_size = 16, max_num_seqs = 16, max_num_batched_tokens = 256;
    int max_model_len = 0;  // 0 = derive (the model's context capped to the pool)
    bool prefix_caching = false;
    // The card's scheduler unless changed (lab/policies.hpp): the victim,
    // swap or recompute, bet or reserve, a watermark, max_waiting shedding.
    pkv::PolicyConfig policy;
    int swap_space_blocks = 0;  // host swap space in blocks, used with policy.preemption == kSwap
    // The cache's element type, and optionally a byte budget that sizes the
    // pool instead of num_blocks (a smaller dtype then buys more blocks).
    pkv::KVDtype kv_dtype = pkv::KVDtype::kF32;
    double kv_cache_mb = 0.0;   // 0 = use num_blocks
    double log_interval = 0.0;  // the engine's periodic log line; 0 = off
    bool keep_latency_samples = true;  // false: histograms only (a server's flat memory)
};

// The knobs' policy, with its swap space when it swaps.
inline pkv::PolicyConfig policy_of(const EngineKnobs& k) {
    pkv::PolicyConfig p = k.policy;
    p.swap_space_blocks = p.preemption == pkv::Preemption::kSwap ? k.swap_space_blocks : 0;
    return p;
}

inline pkv::EngineConfig engine_config(const EngineKnobs& k) {
    pkv::EngineConfig ec;
    ec.num_blocks = k.num_blocks;
    ec.block_size = k.block_size;
    ec.enable_prefix_caching = k.prefix_caching;
    ec.sched.max_num_seqs = k.max_num_seqs;
    ec.sched.max_num_batched_tokens = k.max_num_batched_tokens;
    ec.sched.max_model_len = k.max_model_len;
    ec.sched.policy = pkv::make_policy(policy_of(k));
    ec.kv_dtype = k.kv_dtype;
    ec.kv_cache_bytes = (uint64_t)(k.kv_cache_mb * 1048576.0);
    ec.log_interval_s = k.log_interval;
    ec.keep_latency_samples = k.keep_latency_samples;
    return ec;
}

// An engine of config `ec` and lab policy `policy` on `runner`, timed by
// `clock` (the wall clock when null). A swapping policy gets whoever copies
// its blocks here, once the engine, and so the KV cache, exists
// (lab/policies.hpp's SwapTarget): the simulated GPU prices its own copies;
// any other runner gets real host memory (lab/swap.hpp's HostSwapMemory,
// checked against the machine's memory).
inline std::unique_ptr<pkv::Engine> make_engine(pkv::EngineConfig ec, const pkv::PolicyConfig& policy, std::unique_ptr<pkv::ModelRunner> runner,
                                                pkv::Clock* clock = nullptr) {
    const bool swap = policy.preemption == pkv::Preemption::kSwap;
    auto target = std::make_shared<pkv::SwapTarget>();
    ec.sched.policy = pkv::make_policy(policy, swap ? target : nullptr);
    auto eng = std::make_unique<pkv::Engine>(std::move(runner), ec, clock);
    if (!swap) return eng;
    if (auto* sim = dynamic_cast<pkv::SimRunner*>(&eng->runner())) {
        target->copier = sim;
    } else {
        target->owned = std::make_unique<pkv::HostSwapMemory>(eng->runner(), eng->geometry(), policy.swap_space_blocks);
        target->copier = target->owned.get();
    }
    return eng;
}
// The same, for the knobs every program shares.
inline std::unique_ptr<pkv::Engine> make_engine(const EngineKnobs& k, std::unique_ptr<pkv::ModelRunner> runner, pkv::Clock* clock = nullptr) {
    return make_engine(engine_config(k), policy_of(k), std::move(runner), clock);
}

// One engine configuration plus one synthetic workload, as a flat set of
// knobs (the command-line flags map onto it).
struct Setup : EngineKnobs {
    pkv::Device device = pkv::Device::kCpu;
    pkv::MathPath math = pkv::MathPath::kReference;  // the reference's arithmetic, or lab's (--math)
    // The workload.
    int requests = 24, prompt_len = 32, max_tokens = 96;
    double temperature = 0.0;
    uint64_t seed = 1;
    // run() only: request i arrives before step i * arrival_interval
    // (0 = all before the first step). add_workload() ignores it.
    int arrival_interval = 0;
};

// ============================================================================
// 2. The workload and the engine
// ============================================================================

// A prompt: BOS, then words drawn with `seed`, cut to exactly `len` tokens.
// Works with any tokenizer; the words come from the built-in list.
//
// It is the first `len` tokens of encode("w1 w2 w3 ..."), built in time
// linear in `len`: when no merge can cross a space
// (Tokenizer::merges_stay_within_words, true for the built-in vocabulary and
// for llama2.c's), that encoding is BOS followed by encode_raw(" w") of each
// word in turn, and each distinct word is encoded once. For a tokenizer where
// a merge could cross a space we encode the growing text instead, doubling
// the number of words each time, which is still O(len log len).
inline std::vector<int32_t> make_prompt(const pkv::Tokenizer& tok, int len, uint64_t seed) {
    const int num_words = (int)(sizeof(pkv::kBuiltinWords) / sizeof(pkv::kBuiltinWords[0]));
    uint64_t rng = seed;
    auto next_word = [&]() { return pkv::kBuiltinWords[pkv::splitmix64(rng) % num_words]; };
    std::vector<int> ids;
    if (tok.merges_stay_within_words() && tok.lookup(" ") >= 0) {
        std::vector<std::vector<int>> cache((size_t)num_words);  // [word index] encode_raw(" " + word)
        ids.push_back(pkv::kBosId);
        while ((int)ids.size() < len) {
            const uint64_t r = pkv::splitmix64(rng) % num_words;
            std::vector<int>& piece = cache[r];
            if (piece.empty()) piece = tok.encode_raw(std::string(" ") + pkv::kBuiltinWords[r]);
            ids.insert(ids.end(), piece.begin(), piece.end());
        }
    } else {
        std::string text;
        ids = tok.encode(text, true);
        for (int words = 1; (int)ids.size() < len; words *= 2) {
            for (int w = 0; w < words; ++w) text += (text.empty() ? "" : " ") + std::string(next_word());
            ids = tok.encode(text, true);
        }
    }
    ids.resize((size_t)len);
    return std::vector<int32_t>(ids.begin(), ids.end());
}

// vLLM's startup line, for an engine's pool. "Maximum concurrency" is pool
// tokens / max_model_len: how many requests could each reach max_model_len
// at once. Everything above 1.00x is the admission bet (scheduler.hpp).
inline std::string startup_summary(pkv::Engine& eng) {
    const pkv::EngineConfig& c = eng.config();
    const long pool_tokens = (long)c.num_blocks * c.block_size;
    char buf[400];
    std::snprintf(buf, sizeof buf,
                  "KV cache: %d blocks x %d tokens = %ld token slots (%.2f MiB of %s, %d layers, on %s). max_model_len %d. "
                  "Maximum concurrency for %d tokens per request: %.2fx",
                  c.num_blocks, c.block_size, pool_tokens, (double)c.num_blocks * eng.geometry().bytes_per_block() / 1048576.0, pkv::to_string(c.kv_dtype),
                  eng.model().n_layers, eng.runner().device_name().c_str(), c.sched.max_model_len, c.sched.max_model_len,
                  (double)pool_tokens / c.sched.max_model_len);
    return buf;
}

// Request i's prompt and sampling parameters. The seeds depend only on
// (s.seed, i), so every configuration of a study serves the same requests.
inline std::vector<std::vector<int32_t>> make_prompts(const pkv::Tokenizer& tok, const Setup& s) {
    std::vector<std::vector<int32_t>> prompts(s.requests);
    for (int i = 0; i < s.requests; ++i) prompts[i] = make_prompt(tok, s.prompt_len, s.seed * 1000003 + i);
    return prompts;
}
inline pkv::SamplingParams sampling_params(const Setup& s, int i) {
    pkv::SamplingParams sp;
    sp.max_tokens = s.max_tokens;
    sp.temperature = (float)s.temperature;
    sp.ignore_eos = true;  // every request generates exactly max_tokens: a fixed amount of work
    sp.seed = s.seed * 7919 + i;
    return sp;
}

// All requests arrive at once; returns their prompts.
inline std::vector<std::vector<int32_t>> add_workload(pkv::Engine& eng, const pkv::Tokenizer& tok, const Setup& s) {
    std::vector<std::vector<int32_t>> prompts = make_prompts(tok, s);
    for (int i = 0; i < s.requests; ++i) eng.add_request(prompts[i], sampling_params(s, i));
    return prompts;
}

// ============================================================================
// 4. Command lines and output, shared by the studies
// ============================================================================

// The ranges of the flags below. Wide enough for any experiment a tutorial
// suggests (and for the production-scale runs of the simulated GPU); narrow
// enough that no combination overflows an int or asks for terabytes before
// the engine's own memory check (Engine::derive) has a say.
constexpr long long kMaxRequests = 1000000, kMaxLen = 1 << 20, kMaxBlocks = 1 << 22;
// Prompts are built before the run, all of them: requests x prompt_len
// tokens must stay below this many (4 bytes each).
constexpr long long kMaxWorkloadTokens = 1LL << 28;

// The workload and pool flags every study (and overload) accepts.
inline void add_workload_flags(cli::Parser& p, Setup& s) {
    p.integer("--requests", &s.requests, 1, kMaxRequests, "requests");
    p.integer("--prompt-len", &s.prompt_len, 1, kMaxLen, "prompt tokens per request, incl. BOS");
    p.integer("--max-tokens", &s.max_tokens, 1, kMaxLen, "output tokens per request");
    p.integer("--num-blocks", &s.num_blocks, 1, kMaxBlocks, "KV cache blocks");
    p.integer("--block-size", &s.block_size, 1, pkv::kMaxBlockSize, "tokens per block");
    p.integer("--max-num-batched-tokens", &s.max_num_batched_tokens, 1, kMaxLen, "token budget per step");
    p.integer("--seed", &s.seed, 0, std::numeric_limits<int64_t>::max(), "workload and sampling seed");
    p.choice("--device", &s.device,
             {{"cpu", pkv::Device::kCpu}, {"emulated", pkv::Device::kEmulated}, {"cuda", pkv::Device::kCuda}, {"sim", pkv::Device::kSim}},
             "where the model runs (emulated: the CUDA kernels on the CPU, slow; cuda: a `make cuda` build on a GPU; "
             "sim: a simulated GPU, --gpu, timed by cost_model.hpp)");
    pkv::add_math_flag(p, &s.math);
}

// The engine flags only overload exposes (the studies vary these per row).
inline void add_engine_flags(cli::Parser& p, Setup& s) {
    p.integer("--max-num-seqs", &s.max_num_seqs, 1, 1 << 16, "running requests at most");
    p.integer("--max-model-len", &s.max_model_len, 0, kMaxLen, "longest sequence; 0 = the model's context capped to the pool");
    p.on_off("--prefix-caching", &s.prefix_caching, "reuse cached blocks of identical prompt prefixes");
    p.choice("--admission", &s.policy.admission, {{"bet", pkv::Admission::kBet}, {"reserve", pkv::Admission::kReserve}},
             "page on demand, or reserve prompt + max_tokens at admission");
    p.integer("--max-waiting", &s.policy.max_waiting, 0, kMaxRequests, "shed load: reject while this many wait; 0 = never");
    p.choice("--victim", &s.policy.victim, {{"newest", pkv::Victim::kNewest}, {"oldest", pkv::Victim::kOldest}, {"fair", pkv::Victim::kFair}},
             "who is preempted when the cache runs out");
    p.choice("--preemption", &s.policy.preemption, {{"recompute", pkv::Preemption::kRecompute}, {"swap", pkv::Preemption::kSwap}},
             "what happens to a victim's KV cache");
    p.integer("--swap-space", &s.swap_space_blocks, 0, kMaxBlocks, "host swap space in blocks, for --preemption swap");
    p.choice("--kv-dtype", &s.kv_dtype, {{"f32", pkv::KVDtype::kF32}, {"f16", pkv::KVDtype::kF16}, {"int8", pkv::KVDtype::kInt8}},
             "the KV cache's element type");
    p.real("--kv-cache-mb", &s.kv_cache_mb, 0, 1 << 20, "size the pool from this many MiB instead of --num-blocks; 0 = off");
}

// Fails now, before a long run, when the chart cannot be written at `path`
// (its folder is created if missing). A file problem: exit status 1.
inline void check_writable(const std::string& path) {
    const std::filesystem::path p(path);
    std::error_code ec;
    if (p.has_parent_path()) std::filesystem::create_directories(p.parent_path(), ec);
    if (ec) throw std::runtime_error("cannot create the folder of " + path + ": " + ec.message());
    std::ofstream f(path, std::ios::app);
    if (!f) throw std::runtime_error("cannot write " + path + " (a folder that is a file, or no permission?)");
}

// Checks that involve several flags. The engine checks the pool itself.
inline void check_workload(const Setup& s) {
    if ((long long)s.requests * s.prompt_len > kMaxWorkloadTokens)
        cli::bad_usage("--requests x --prompt-len = " + std::to_string((long long)s.requests * s.prompt_len) +
                       " prompt tokens, more than the " + std::to_string(kMaxWorkloadTokens) + " this program builds in memory");
}

// The OpenMP threads the fast CPU path (lab/fast_cpu.hpp, which --device cpu
// runs) may use; 1 without OpenMP. The reference forward uses one.
inline int cpu_threads() {
#ifdef _OPENMP
    return omp_get_max_threads();
#else
    return 1;
#endif
}

// The 1-minute load average (Linux), or -1 where it cannot be read. Wall-clock
// figures from a machine that is busy with other work are not comparable with
// a quiet one's, so the studies print it next to them.
inline double load_average() {
    FILE* f = std::fopen("/proc/loadavg", "r");
    if (!f) return -1.0;
    double v = -1.0;
    if (std::fscanf(f, "%lf", &v) != 1) v = -1.0;
    std::fclose(f);
    return v;
}

// A warning when other processes probably competed for the CPU during the
// runs ("" when not), judged from the load average before and after them.
// It matters more than it seems: a busy machine slows every step unevenly
// (the CPU forward's ThreadPolicy falls back to one thread when parallel
// regions get slow, but only after measuring it), and wall-clock latencies
// then describe the machine, not the engine. Step counts are unaffected.
inline std::string busy_warning(double load_start, double load_end) {
    const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
    // Our own threads add up to `cores` to the 1-minute average (and a study
    // run just before this one may still show in load_start).
    if (load_start < 0 || (load_start <= cores && load_end <= cores + 1.0)) return "";
    char b[400];
    std::snprintf(b, sizeof b,
                  "warning: load average %.1f before and %.1f after the runs on %u cores: other processes competed for the "
                  "CPU, so wall-clock figures (tok/s, ms) are unreliable; step, token and preemption counts are exact. "
                  "On a shared machine, OMP_NUM_THREADS=1 is steadier",
                  load_start, load_end, cores);
    return b;
}

// A flat JSON object, keys in insertion order. Non-finite numbers become
// null (JSON has no NaN).
class Json {
public:
    Json& num(const std::string& k, double v) {
        char b[40];
        if (std::isfinite(v)) std::snprintf(b, sizeof b, "%.6g", v);
        else std::snprintf(b, sizeof b, "null");
        return raw(k, b);
    }
    Json& integer(const std::string& k, long v) { return raw(k, std::to_string(v)); }
    Json& str(const std::string& k, const std::string& v) { return raw(k, quote(v)); }
    Json& boolean(const std::string& k, bool v) { return raw(k, v ? "true" : "false"); }
    Json& raw(const std::string& k, const std::string& json) {
        s_ += (s_.empty() ? "" : ",") + quote(k) + ":" + json;
        return *this;
    }
    std::string dump() const { return "{" + s_ + "}"; }

    static std::string quote(const std::string& s) {
        std::string o = "\"";
        for (unsigned char c : s) {
            if (c == '"' || c == '\\') { o += '\\'; o += (char)c; }
            else if (c < 0x20) { char b[8]; std::snprintf(b, sizeof b, "\\u%04x", c); o += b; }
            else o += (char)c;
        }
        return o + "\"";
    }
    template <class T>
    static std::string array(const std::vector<T>& v) {
        std::string s = "[";
        for (size_t i = 0; i < v.size(); ++i) s += (i ? "," : "") + v[i];
        return s + "]";
    }

private:
    std::string s_;
};

}  // namespace workload

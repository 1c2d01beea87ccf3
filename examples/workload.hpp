// examples/workload.hpp -- what examples/overload and the studies share:
//
//   Setup           one engine configuration plus one synthetic workload, as
//                   a flat set of knobs (the command-line flags map onto it)
//   make_prompt     a prompt of random words, exactly `len` tokens
//   engine_config   Setup -> pkv::EngineConfig
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
#include <string>
#include <thread>
#include <vector>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "engine.hpp"
#include "tiny_model/devices.hpp"
#include "examples/cli.hpp"
#include "tiny_model/tokenizer.hpp"

namespace study {

// ============================================================================
// 1. The knobs
// ============================================================================

struct Setup {
    // The engine. Defaults are `make run`'s demo (examples/overload).
    int num_blocks = 40, block_size = 16, max_num_seqs = 16, max_num_batched_tokens = 256;
    int max_model_len = 0;  // 0 = derive (the model's context capped to the pool)
    int max_waiting = 0;    // 0 = unbounded waiting queue
    bool prefix_caching = false;
    pkv::Admission admission = pkv::Admission::kBet;
    pkv::Victim victim = pkv::Victim::kNewest;
    // What a victim's KV cache becomes: dropped (recompute, vLLM V1) or
    // copied to a host swap space of swap_space_blocks blocks (vLLM V0).
    pkv::Preemption preemption = pkv::Preemption::kRecompute;
    int swap_space_blocks = 0;
    // The cache's element type, and optionally a byte budget that sizes the
    // pool instead of num_blocks (a smaller dtype then buys more blocks).
    pkv::KVDtype kv_dtype = pkv::KVDtype::kF32;
    double kv_cache_mb = 0.0;  // 0 = use num_blocks
    double log_interval = 0.0;  // the engine's periodic log line; 0 = off
    pkv::Device device = pkv::Device::kCpu;
    // The workload.
    int requests = 24, prompt_len = 32, max_tokens = 96;
    double temperature = 0.0;
    uint64_t seed = 1;
    // run() only: request i arrives before step i * arrival_interval
    // (0 = all before the first step). add_workload() ignores it.
    int arrival_interval = 0;
};

// The overloaded workload of the studies, chosen once and not tuned
// afterwards:
//   48 requests x (32 prompt + 160 output tokens), 48 blocks of 16.
// Why this shape: outputs are long next to their prompts (5:1, like chat
// answers), so the pool drains through *growth*, which is what the admission
// bet loses on: admission sees 2 blocks per request, but each one grows
// to 12 (192 tokens). The pool (768 token slots) holds exactly 4 requests at
// their longest, while the whole workload would need 576 blocks, 12x the
// pool; and at max_num_seqs 16 the engine runs about 3x more requests than
// fit at the end. 48 requests keep the queue non-empty for most of a run,
// and a run stays short enough for a study to make many of them.
inline Setup study_setup() {
    Setup s;
    s.requests = 48;
    s.prompt_len = 32;
    s.max_tokens = 160;
    s.num_blocks = 48;
    s.block_size = 16;
    s.max_num_seqs = 16;
    return s;
}


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

inline pkv::EngineConfig engine_config(const Setup& s) {
    pkv::EngineConfig ec;
    ec.num_blocks = s.num_blocks;
    ec.block_size = s.block_size;
    ec.enable_prefix_caching = s.prefix_caching;
    ec.sched.max_num_seqs = s.max_num_seqs;
    ec.sched.max_num_batched_tokens = s.max_num_batched_tokens;
    ec.sched.max_model_len = s.max_model_len;
    ec.sched.admission = s.admission;
    ec.sched.max_waiting = s.max_waiting;
    ec.sched.victim = s.victim;
    ec.sched.preemption = s.preemption;
    ec.sched.swap_space_blocks = s.swap_space_blocks;
    ec.kv_dtype = s.kv_dtype;
    ec.kv_cache_bytes = (uint64_t)(s.kv_cache_mb * 1048576.0);
    ec.log_interval_s = s.log_interval;
    return ec;
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
// 3. run(): one engine, one workload, measured two ways
// ============================================================================
//
// The engine takes one clock. We give it one that counts steps (so every
// latency the engine records is a whole number of steps, the same on every
// machine and every run) and that also notes the wall time of each reading.
// The engine reads its clock once when it samples a step's tokens and then
// streams them, so inside on_event, last_wall is the wall time of the event
// being handled; run() builds the wall-clock latencies from it.
struct StepAndWallClock : pkv::Clock {
    double steps = 0;         // steps completed
    bool in_step = false;     // run() sets it just before Engine::step()
    double last_wall = 0;     // steady_clock seconds at the latest now()
    // During a step the time is the step's number (1 for the first): a token
    // sampled in the step right after its request arrived has TTFT 1, and
    // two tokens of consecutive steps are 1 apart.
    double now() override {
        last_wall = std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
        return steps + (in_step ? 1 : 0);
    }
    void on_step_end() override {
        steps += 1;
        in_step = false;
    }
};

struct Measurement {
    int requests = 0, finished = 0, rejected = 0;
    int preempted_requests = 0, max_preemptions = 0;  // requests preempted at least once; most times one was
    long preemptions = 0;        // num_preemptions_total
    long useful_tokens = 0;      // output tokens emitted (generation_tokens_total)
    long prompt_tokens = 0;      // prompt tokens computed for the first time
    long recomputed_tokens = 0;  // computed again after a preemption
    long computed_tokens = 0;    // everything through the model
    long engine_steps = 0;       // Engine::step() calls
    double steps = 0;            // time in steps at the end (idle gaps between arrivals included)
    double wall_s = 0;           // wall seconds, first step to last
    double peak_kv = 0;          // max kv_cache_usage_perc, 0..1
    int peak_running = 0;        // most requests running after a step
    double mean_running = 0;     // requests running after a step, averaged over engine steps
    int peak_waiting = 0;        // longest waiting queue after a step (new and preempted requests)
    long prefix_cache_hits = 0;  // tokens served by the prefix cache at admission
    // Preemption by swap (Setup::preemption = kSwap); all 0 otherwise.
    long swap_outs = 0, swap_ins = 0, swap_fallbacks = 0;  // victims swapped out / back in / recomputed (swap space full)
    long swap_out_bytes = 0, swap_in_bytes = 0;            // bytes copied each way
    double peak_swap = 0;                                  // max swap_space_usage_perc, 0..1
    // Latencies of every token / accepted request, in seconds and in steps.
    pkv::LatencySamples itl_wall, ttft_wall, e2e_wall;
    pkv::LatencySamples itl_steps, ttft_steps, e2e_steps;
    // One entry per completed request, in completion order: when it
    // completed, in steps and in wall seconds since the run began.
    std::vector<double> done_step, done_wall;

    double requests_per_s() const { return wall_s > 0 ? finished / wall_s : 0.0; }
    double useful_tok_per_s() const { return wall_s > 0 ? useful_tokens / wall_s : 0.0; }
    double processed_tok_per_s() const { return wall_s > 0 ? computed_tokens / wall_s : 0.0; }
    double useful_tok_per_step() const { return engine_steps > 0 ? (double)useful_tokens / engine_steps : 0.0; }
    // Requests completed by time t (in steps).
    int completed_by_step(double t) const {
        return (int)(std::upper_bound(done_step.begin(), done_step.end(), t) - done_step.begin());
    }
};

// Runs the workload of `s` to completion on a fresh engine. Throws what the
// Engine constructor throws for a bad configuration (std::invalid_argument).
inline Measurement run(const pkv::ModelAndTokenizer& mt, const Setup& s) {
    const std::vector<std::vector<int32_t>> prompts = make_prompts(mt.tok, s);
    StepAndWallClock clock;
    pkv::Engine eng(pkv::make_model_runner(s.device, mt.model), engine_config(s), &clock);
    Measurement out;
    out.requests = s.requests;

    std::vector<double> arrival_wall(s.requests, 0.0), last_wall(s.requests, -1.0);
    double t0 = 0;
    eng.on_event = [&](const pkv::StreamEvent& e) {
        const int id = e.request_id;
        if (id < 0 || id >= s.requests) return;
        const double w = clock.last_wall;
        if (e.type == pkv::EventType::kToken) {
            if (last_wall[id] < 0) out.ttft_wall.add(w - arrival_wall[id]);
            else out.itl_wall.add(w - last_wall[id]);
            last_wall[id] = w;
        } else if (e.type == pkv::EventType::kFinished && e.reason != pkv::FinishReason::kAborted) {
            out.e2e_wall.add(w - arrival_wall[id]);
            out.done_step.push_back(e.time);
            out.done_wall.push_back(w - t0);
        }
    };

    int next = 0;  // the next request to arrive
    auto due = [&](int i) { return (double)i * s.arrival_interval; };
    t0 = std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
    while (next < s.requests || eng.has_unfinished()) {
        while (next < s.requests && due(next) <= clock.steps) {
            eng.add_request(prompts[next], sampling_params(s, next));
            arrival_wall[next] = clock.last_wall;  // add_request read the clock
            ++next;
        }
        if (!eng.has_unfinished()) {  // idle until the next arrival: skip ahead
            clock.steps = due(next);
            continue;
        }
        clock.in_step = true;
        eng.step();
        out.peak_swap = std::max(out.peak_swap, eng.metrics().swap_space_usage_perc);
        const int running = (int)eng.scheduler().running().size();
        out.peak_running = std::max(out.peak_running, running);
        out.mean_running += running;
        out.peak_waiting = std::max(out.peak_waiting, (int)eng.scheduler().waiting().size());
    }
    out.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count() - t0;

    const pkv::Metrics& m = eng.metrics();
    out.finished = (int)m.num_requests_finished;
    out.rejected = (int)m.num_requests_rejected;
    out.preemptions = m.num_preemptions_total;
    out.useful_tokens = m.generation_tokens_total;
    out.prompt_tokens = m.prompt_tokens_total;
    out.recomputed_tokens = m.recomputed_tokens_total;
    out.computed_tokens = m.computed_tokens_total;
    out.engine_steps = m.num_steps;
    if (out.engine_steps > 0) out.mean_running /= (double)out.engine_steps;
    out.steps = clock.steps;
    out.peak_kv = m.max_kv_cache_usage_perc;
    out.prefix_cache_hits = m.prefix_cache_hits;
    out.swap_outs = m.num_swap_outs;
    out.swap_ins = m.num_swap_ins;
    out.swap_fallbacks = m.num_swap_fallbacks;
    out.swap_out_bytes = m.swap_out_bytes;
    out.swap_in_bytes = m.swap_in_bytes;
    out.itl_steps = m.inter_token_latency;
    out.ttft_steps = m.time_to_first_token;
    out.e2e_steps = m.e2e_request_latency;
    for (int i = 0; i < s.requests; ++i) {
        const int p = eng.request(i)->num_preemptions;
        out.preempted_requests += p > 0;
        out.max_preemptions = std::max(out.max_preemptions, p);
    }
    return out;
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
    p.choice("--device", &s.device, {{"cpu", pkv::Device::kCpu}, {"emulated", pkv::Device::kEmulated}, {"cuda", pkv::Device::kCuda}},
             "where the model runs (emulated: the CUDA kernels on the CPU, slow; cuda: a `make cuda` build on a GPU)");
}

// The engine flags only overload exposes (the studies vary these per row).
inline void add_engine_flags(cli::Parser& p, Setup& s) {
    p.integer("--max-num-seqs", &s.max_num_seqs, 1, 1 << 16, "running requests at most");
    p.integer("--max-model-len", &s.max_model_len, 0, kMaxLen, "longest sequence; 0 = the model's context capped to the pool");
    p.on_off("--prefix-caching", &s.prefix_caching, "reuse cached blocks of identical prompt prefixes");
    p.choice("--admission", &s.admission, {{"bet", pkv::Admission::kBet}, {"reserve", pkv::Admission::kReserve}},
             "page on demand, or reserve prompt + max_tokens at admission");
    p.integer("--max-waiting", &s.max_waiting, 0, kMaxRequests, "shed load: reject while this many wait; 0 = never");
    p.choice("--victim", &s.victim, {{"newest", pkv::Victim::kNewest}, {"oldest", pkv::Victim::kOldest}},
             "who is preempted when the cache runs out");
    p.choice("--preemption", &s.preemption, {{"recompute", pkv::Preemption::kRecompute}, {"swap", pkv::Preemption::kSwap}},
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

// The OpenMP threads the CPU forward pass uses (1 without OpenMP).
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

// The workload and pool of a Setup, for the "workload" member of --json.
inline std::string workload_json(const Setup& s, const std::string& model) {
    return Json()
        .str("model", model)
        .integer("requests", s.requests)
        .integer("prompt_len", s.prompt_len)
        .integer("max_tokens", s.max_tokens)
        .integer("num_blocks", s.num_blocks)
        .integer("block_size", s.block_size)
        .integer("max_num_batched_tokens", s.max_num_batched_tokens)
        .integer("seed", (long)s.seed)
        .str("device", pkv::to_string(s.device))
        .integer("cpu_threads", cpu_threads())
        .dump();
}

// The measured numbers every study reports, as one JSON object.
inline Json measurement_json(const Measurement& m) {
    Json j;
    j.integer("requests", m.requests)
        .integer("finished", m.finished)
        .integer("rejected", m.rejected)
        .integer("num_preemptions_total", m.preemptions)
        .integer("preempted_requests", m.preempted_requests)
        .integer("useful_tokens", m.useful_tokens)
        .integer("prompt_tokens", m.prompt_tokens)
        .integer("recomputed_tokens", m.recomputed_tokens)
        .integer("computed_tokens", m.computed_tokens)
        .integer("engine_steps", m.engine_steps)
        .num("steps", m.steps)
        .num("wall_s", m.wall_s)
        .num("requests_per_s", m.requests_per_s())
        .num("useful_tok_per_s", m.useful_tok_per_s())
        .num("processed_tok_per_s", m.processed_tok_per_s())
        .num("useful_tok_per_step", m.useful_tok_per_step())
        .num("peak_kv_cache_usage_perc", m.peak_kv)
        .integer("peak_running", m.peak_running)
        .num("mean_running", m.mean_running)
        .integer("peak_waiting", m.peak_waiting)
        .num("itl_p50_s", m.itl_wall.percentile(50))
        .num("itl_p99_s", m.itl_wall.percentile(99))
        .num("ttft_p50_s", m.ttft_wall.percentile(50))
        .num("ttft_p99_s", m.ttft_wall.percentile(99))
        .num("e2e_p50_s", m.e2e_wall.percentile(50))
        .num("e2e_p99_s", m.e2e_wall.percentile(99))
        .num("itl_p50_steps", m.itl_steps.percentile(50))
        .num("itl_p99_steps", m.itl_steps.percentile(99))
        .num("itl_max_steps", m.itl_steps.percentile(100))
        .num("ttft_p99_steps", m.ttft_steps.percentile(99))
        .num("e2e_p50_steps", m.e2e_steps.percentile(50))
        .num("e2e_p99_steps", m.e2e_steps.percentile(99));
    return j;
}

}  // namespace study

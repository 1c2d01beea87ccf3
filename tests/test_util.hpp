// tests/test_util.hpp -- helpers that more than one test file needs.
//
// Only what is really the same everywhere lives here: the random numbers the
// tests are built from, bit-exact float comparison, the small odd-shaped model
// and the scattered block tables that the model and kernel tests both feed
// through a ForwardBatch, and the files and processes the end-to-end tests
// look for. Helpers that belong to one file's story (the contiguous run.c
// oracle, the scheduler's simulate_step, the kernel tests' attention problems)
// stay in that file, next to the tests that explain them.
//
// Every test file is also compiled by nvcc (`make cuda`), so this header is
// plain C++20 host code.
#pragma once

#include <doctest/doctest.h>

#include <sys/wait.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <limits>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "core/block_pool.hpp"
#include "core/block_pool_check.hpp"
#include "paged_kv.cuh"
#include "examples/devices.hpp"
#include "examples/workload.hpp"
#include "lab/policies.hpp"
#include "tiny_model/forward_cpu.hpp"
#include "tiny_model/model.hpp"
#include "tiny_model/runner.hpp"

namespace pkv_test {

// Runs `c` with the scheduling policy `p` (lab/policies.hpp, through
// scheduler.hpp's seam), e.g. use_policy(cfg, {.victim = pkv::Victim::kOldest}).
inline void use_policy(pkv::SchedulerConfig& c, const pkv::PolicyConfig& p) { c.policy = pkv::make_policy(p); }
// Host swap slots held right now (0 under a policy that never swaps).
inline int swap_slots_in_use(const pkv::Scheduler& s) {
    const pkv::LabPolicy* lab = pkv::lab_policy(s);
    return lab ? lab->swap_space().in_use() : 0;
}

// An engine of `ec` on `runner` with the lab policy `p` (lab/policies.hpp),
// a swapping one wired to its copier as the programs wire it
// (examples/workload.hpp's make_engine).
inline std::unique_ptr<pkv::Engine> engine_with(const pkv::EngineConfig& ec, const pkv::PolicyConfig& p,
                                                std::unique_ptr<pkv::ModelRunner> runner, pkv::Clock* clock = nullptr) {
    return workload::make_engine(ec, p, std::move(runner), clock);
}
// The swap counters of an engine's lab policy; zeros under any other.
inline pkv::SwapStats swap_stats(const pkv::Engine& eng) {
    const pkv::LabPolicy* lab = pkv::lab_policy(eng.scheduler());
    return lab ? lab->stats() : pkv::SwapStats{};
}

// A model runner for `m` on `device` (the CPU forward by default), with the
// reference's arithmetic unless `math` asks for lab's (examples/devices.hpp):
// what an Engine is built on.
inline std::unique_ptr<pkv::ModelRunner> runner(const pkv::Model& m, pkv::Device device = pkv::Device::kCpu,
                                                pkv::MathPath math = pkv::MathPath::kReference) {
    return pkv::make_model_runner(device, m, math);
}
// The same, with its KV cache allocated for `geo`, for tests that drive a
// runner directly.
inline std::unique_ptr<pkv::ModelRunner> runner(const pkv::Model& m, pkv::Device device, const pkv::KVGeometry& geo,
                                                pkv::MathPath math = pkv::MathPath::kReference) {
    auto r = pkv::make_model_runner(device, m, math);
    r->init_kv_cache(geo);
    return r;
}

// The kernel path's arithmetic, every way a program can run it: the
// reference (gemm_simple and the one-pass kernel) and lab's FastGpuMath with
// each attention kernel. Tests of the kernel runner loop over all three.
struct KernelMath {
    const char* name;
    std::function<std::unique_ptr<pkv::GpuMath>()> make;
};
inline const std::vector<KernelMath>& kernel_maths() {
    static const std::vector<KernelMath> all = {
        {"reference", [] { return std::make_unique<pkv::GpuMath>(); }},
        {"fast, partitioned attention", [] { return std::make_unique<pkv::FastGpuMath>(pkv::AttentionKernel::kPartitioned); }},
        {"fast, baseline attention", [] { return std::make_unique<pkv::FastGpuMath>(pkv::AttentionKernel::kBaseline); }},
    };
    return all;
}
// A kernel runner (this build's kernel device) with `math`, its cache allocated.
inline std::unique_ptr<pkv::ModelRunner> kernel_runner(const pkv::Model& m, const pkv::KVGeometry& geo, const KernelMath& math) {
    auto r = std::make_unique<pkv::GpuRunner>(m, math.make());
    r->init_kv_cache(geo);
    return r;
}

// A small random model: fast enough for many engine runs, big enough to be a
// real transformer (2 layers, GQA 2:1, head_dim 8, vocabulary 64), one per
// seed, built once. The swap and kv_dtype suites run on it.
inline const pkv::Model& small_engine_model(uint64_t seed) {
    static std::map<uint64_t, pkv::Model> models;  // never erased: references stay valid
    auto it = models.find(seed);
    if (it == models.end()) {
        pkv::Config c;
        c.dim = 32; c.hidden_dim = 64; c.n_layers = 2; c.n_heads = 4; c.n_kv_heads = 2;
        c.vocab_size = 64; c.seq_len = 512; c.shared_classifier = false;
        it = models.emplace(seed, pkv::make_random_model(c, seed)).first;
    }
    return it->second;
}

// The sanitizer build (`make sanitize`, -O0 with ASan and UBSan): a few tests
// run smaller workloads there; everything else is the same.
#ifdef __has_feature  // clang (and newer GCC); GCC 12 says it with __SANITIZE_*__
#define PKV_TEST_HAS_FEATURE(x) __has_feature(x)
#else
#define PKV_TEST_HAS_FEATURE(x) 0
#endif
#if defined(__SANITIZE_ADDRESS__) || PKV_TEST_HAS_FEATURE(address_sanitizer)
constexpr bool kSanitized = true;
#else
constexpr bool kSanitized = false;
#endif
// The ThreadSanitizer build (`make tsan`, the kernel suites at -O1): there
// what matters is that every kernel runs under it, not how many tokens do.
#if defined(__SANITIZE_THREAD__) || PKV_TEST_HAS_FEATURE(thread_sanitizer)
constexpr bool kThreadSanitized = true;
#else
constexpr bool kThreadSanitized = false;
#endif

// ---------------------------------------------------------------------------
// Random test inputs
// ---------------------------------------------------------------------------

// splitmix64 (the model's own generator): the same numbers on every compiler
// and standard library, which std:: distributions do not promise. As in
// <random>, integers are drawn from a closed range and floats from a half-open
// one.
struct Rng {
    uint64_t state;
    explicit Rng(uint64_t seed) : state(seed) {}
    uint64_t next() { return pkv::splitmix64(state); }
    int below(int n) { return (int)(next() % (uint64_t)n); }       // [0, n)
    int uniform(int lo, int hi) { return lo + below(hi - lo + 1); }  // [lo, hi]
    float uniform(float lo, float hi) { return lo + (hi - lo) * pkv::uniform01(state); }  // [lo, hi)
    bool chance(double p) { return (double)(next() >> 11) * (1.0 / 9007199254740992.0) < p; }
    template <class T>
    const T& pick(const std::vector<T>& v) { return v[(size_t)below((int)v.size())]; }
};

// Fisher-Yates, back to front.
template <class T>
void shuffle(std::vector<T>& v, Rng& rng) {
    for (size_t i = v.size(); i > 1; --i) std::swap(v[i - 1], v[(size_t)rng.below((int)i)]);
}

// n token ids in [first, vocab).
inline std::vector<int32_t> random_tokens(Rng& rng, int n, int vocab, int first = 0) {
    std::vector<int32_t> t((size_t)n);
    for (int32_t& x : t) x = first + rng.below(vocab - first);
    return t;
}
inline std::vector<int32_t> random_tokens(int n, int vocab, uint64_t seed) {
    Rng rng(seed);
    return random_tokens(rng, n, vocab);
}

// ---------------------------------------------------------------------------
// Floats
// ---------------------------------------------------------------------------

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

// Index of the first element whose bits differ, or -1 when a and b are
// identical (0 when their sizes differ). Bits, not ==: NaN == NaN is false and
// -0 == +0 is true, and "bit for bit" is a promise about neither.
template <class T>
long first_bit_diff(const std::vector<T>& a, const std::vector<T>& b) {
    if (a.size() != b.size()) return 0;
    for (size_t i = 0; i < a.size(); ++i)
        if (std::memcmp(&a[i], &b[i], sizeof(T)) != 0) return (long)i;
    return -1;
}

inline bool all_finite(const std::vector<float>& v) {
    return std::all_of(v.begin(), v.end(), [](float x) { return std::isfinite(x); });
}

// ---------------------------------------------------------------------------
// Models and forward batches
// ---------------------------------------------------------------------------

// A Config from the seven numbers of a llama2.c header, in the header's order,
// plus whether the classifier is the embedding table.
inline pkv::Config config_of(int dim, int hidden_dim, int n_layers, int n_heads, int n_kv_heads, int vocab_size,
                             int seq_len, bool shared_classifier) {
    pkv::Config c;
    c.dim = dim;
    c.hidden_dim = hidden_dim;
    c.n_layers = n_layers;
    c.n_heads = n_heads;
    c.n_kv_heads = n_kv_heads;
    c.vocab_size = vocab_size;
    c.seq_len = seq_len;
    c.shared_classifier = shared_classifier;
    return c;
}

// The small model whose shape is chosen to be awkward: head_dim 8, GQA 3:1
// (6 heads over 2 kv heads), and dim 48 / hidden 100 / vocab 300, which are not
// multiples of 32 or 128 and so leave tails in every dot product and GEMM tile.
inline pkv::Config small_config(bool shared_classifier) {
    return config_of(48, 100, 2, 6, 2, 300, 128, shared_classifier);
}

// A pool whose free list is a random permutation of its blocks, so tables
// allocated from it are scattered over the cache. The blocks come out in
// shuffle(ids, rng)'s order.
inline pkv::BlockPool shuffled_pool(int num_blocks, int block_size, Rng& rng) {
    pkv::BlockPool pool(num_blocks, block_size, /*enable_prefix_caching=*/false);
    std::vector<int32_t> all;
    REQUIRE(pool.allocate(num_blocks, all));
    shuffle(all, rng);
    pool.release(all);
    return pool;
}
inline pkv::BlockPool shuffled_pool(int num_blocks, int block_size, uint64_t seed) {
    Rng rng(seed);
    return shuffled_pool(num_blocks, block_size, rng);
}

// One sequence being fed through the forward pass, chunk by chunk.
struct Seq {
    std::vector<int32_t> tokens;
    pkv::BlockTable table;
    int done = 0;  // tokens already placed in some batch (their K/V are, or will be, cached)
};

// Adds the next n tokens of s to batch b, growing its table from pool first.
// all_logits: a logits row for every one of them, else for the last only.
// Returns the index of the first logits row it added.
inline int add_chunk(pkv::ForwardBatch& b, pkv::BlockPool& pool, Seq& s, int n, bool all_logits = false) {
    REQUIRE(s.done + n <= (int)s.tokens.size());
    REQUIRE(pkv::allocate_slots(pool, s.table, {}, s.done + n));
    const int first_row = (int)b.logits_indices.size();
    b.add_sequence(s.table.blocks, pool.block_size(), s.tokens.data() + s.done, s.done, n, !all_logits);
    if (all_logits)
        for (int i = 0; i < n; ++i) b.logits_indices.push_back(b.num_tokens() - n + i);
    s.done += n;
    return first_row;
}

// ---------------------------------------------------------------------------
// Files and processes
// ---------------------------------------------------------------------------

// Where stories260K.bin and tok512.bin are looked for: ../shared/models, or
// $PAGEDKV_MODELS. Tests that need them skip when absent (need_model_files).
inline std::string models_dir() {
    const char* env = std::getenv("PAGEDKV_MODELS");
    return env && *env ? std::string(env) : std::string("../shared/models");
}

inline bool file_exists(const std::string& p) {
    std::error_code ec;
    return std::filesystem::is_regular_file(p, ec);
}

// ---- skips that say so ---------------------------------------------------------
//
// A test that cannot run here (no model files, no GPU, a program not built)
// calls skip(): a MESSAGE now, and a line in the summary tests/main.cpp
// prints after doctest's own, so a skipped test never reads as a pass. Where
// a skip would hide a real failure, an environment variable turns it into
// one: PAGEDKV_REQUIRE_MODELS=1 (CI, which has ../shared/models),
// PAGEDKV_REQUIRE_GPU=1 (tests/gpu_check.sh on a GPU machine) and
// PAGEDKV_REQUIRE_BROWSER=1 (CI, which installs chromium: tests/get_chromium.sh).
enum class SkipKind { kModels, kGpu, kProgram, kBrowser };
struct SkipRecord {
    SkipKind kind;
    std::string test, why;
};
inline std::vector<SkipRecord>& skips() {
    static std::vector<SkipRecord> v;  // one list for every test file (an inline function's static)
    return v;
}
// The running test case's name, kept by a doctest listener in tests/main.cpp.
inline std::string& current_test() {
    static std::string name;
    return name;
}
inline void skip(SkipKind kind, const std::string& why) {
    skips().push_back({kind, current_test(), why});
    MESSAGE("SKIPPED: " << why);
}

// True when every one of `names` is in models_dir(); otherwise records a
// skip naming what is missing and returns false.
inline bool need_model_files(std::initializer_list<const char*> names) {
    std::string missing;
    for (const char* n : names)
        if (!file_exists(models_dir() + "/" + n)) missing += (missing.empty() ? "" : ", ") + std::string(n);
    if (missing.empty()) return true;
    skip(SkipKind::kModels, missing + " not found in " + models_dir() + " (set PAGEDKV_MODELS to the folder holding them)");
    return false;
}

// The folder of the running test binary (build/, build/asan/, build/cuda/):
// the programs of the same build sit beside it.
inline std::string program_dir() {
    std::error_code ec;
    const std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", ec);
    return ec ? std::string("build") : self.parent_path().string();
}
// A program of this build, or "" after recording a skip when it is not built.
inline std::string need_program(const std::string& name) {
    const std::string p = program_dir() + "/" + name;
    if (file_exists(p)) return p;
    skip(SkipKind::kProgram, p + " is not built (`make all`, `make sanitize` or `make cuda` builds it)");
    return "";
}

inline std::string shell_quote(const std::string& s) {
    std::string q = "'";
    for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
    return q + "'";
}

// Runs a shell command; returns its stdout and exit status (-1 if it died).
inline std::pair<std::string, int> run_command(const std::string& cmd) {
    std::string out;
    FILE* p = ::popen(cmd.c_str(), "r");
    REQUIRE(p != nullptr);
    char buf[4096];
    size_t n;
    while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
    const int status = ::pclose(p);
    return {out, WIFEXITED(status) ? WEXITSTATUS(status) : -1};
}

}  // namespace pkv_test

// lab/bench_cpu.cpp -- lab/LAB.md chapter L1: how fast is the CPU forward
// pass, and how far is it from what this machine can do right now?
//
// A stories15M-shaped model (dim 288, 6 layers, 6 heads, vocab 32000, ctx 256)
// with random weights made in-process, so no file is needed. It prints:
//   0. the roofline, measured here and now, because a shared machine's roof
//      moves: how fast one thread and all threads can read the weights, how
//      fast the matmul microkernel multiplies when its data is in cache (one
//      thread, all threads), and the plain dot() one output at a time;
//   1. single-sequence decode tok/s (one token per forward, context growing),
//      and the weight bytes it streams per second as a % of the read roof;
//   2. batched decode throughput at batch 1/4/16/64: every sequence holds a
//      64-token prompt, then each step decodes one token for each of them;
//      the matmul multiply-adds per second as a % of the microkernel's roof;
//   3. the engine's own overhead: a real Engine running batch 1 and batch 64,
//      and the share of each step spent outside the model's forward pass
//      (scheduling, building the batch, the argmax, streaming).
// Batched decode reads each weight row once per step for the whole batch, so
// tokens/s grows with batch size until arithmetic, not memory, limits it.
//
//   build/bench_cpu [--steps N] [--threads T]
//   build/bench_cpu --save-checkpoint FILE
// The second form only writes the benchmark's model as a llama2.c checkpoint
// and exits: the stories15M-shaped file that tools/vs_runc.sh times our
// `generate` and llama2.c's run.c on.
// PKV_SIMD=baseline (or avx2) in the environment runs the matmuls on a lower
// instruction set than the CPU has, to compare.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "core/block_pool.hpp"
#include "engine.hpp"
#include "examples/cli.hpp"
#include "paged_kv.cuh"
#include "lab/fast_cpu.hpp"
#include "tiny_model/forward_cpu.hpp"
#include "tiny_model/runner.hpp"
#include "tiny_model/sampler.hpp"

namespace {

double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

pkv::Config stories15m_shape() {
    pkv::Config c;
    c.dim = 288; c.hidden_dim = 768; c.n_layers = 6; c.n_heads = 6; c.n_kv_heads = 6;
    c.vocab_size = 32000; c.seq_len = 256; c.shared_classifier = true;
    return c;
}

// The benchmark's model: that shape, random weights from a fixed seed.
pkv::Model bench_model() { return pkv::make_random_model(stories15m_shape(), 15, {}); }

int max_threads() {
#ifdef _OPENMP
    return omp_get_max_threads();
#else
    return 1;
#endif
}

// Runs body(thread) on `threads` threads at once (OpenMP), or once on this one.
template <class Body>
void on_threads(int threads, const Body& body) {
#ifdef _OPENMP
#pragma omp parallel num_threads(threads)
    body(omp_get_thread_num());
#else
    (void)threads;
    body(0);
#endif
}

// ---- 0. The roofline -----------------------------------------------------------
//
// Each figure is the best of several tries: on a shared machine a slow try
// measures the neighbours, not the hardware.

// Bytes per second at which `threads` threads read the arrays, each thread a
// contiguous share of each. The read XORs 64-bit words into four independent
// chains: a loop that retires more bytes per cycle than memory delivers, so
// it times the memory and not itself. memcpy is the legal way to view a
// float's bits as an integer.
double read_bytes_per_s(const std::vector<std::pair<const float*, size_t>>& arrays, int threads) {
    size_t bytes = 0;
    for (const auto& a : arrays) bytes += a.second * sizeof(float);
    std::vector<uint64_t> sink((size_t)threads * 8);  // one cache line per thread
    double best = 1e30;
    for (int rep = 0; rep < 5; ++rep) {
        const double t0 = now_s();
        on_threads(threads, [&](int th) {
            uint64_t x[4] = {0, 0, 0, 0};
            for (const auto& [data, count] : arrays) {
                const size_t words = count * sizeof(float) / 8;
                const size_t b = words * th / threads / 4 * 4, e = th + 1 == threads ? words : words * (th + 1) / threads / 4 * 4;
                const char* p = reinterpret_cast<const char*>(data);
                for (size_t i = b; i + 4 <= e; i += 4)
                    for (int k = 0; k < 4; ++k) {
                        uint64_t w;
                        std::memcpy(&w, p + (i + k) * 8, 8);
                        x[k] ^= w;
                    }
            }
            sink[(size_t)th * 8] = x[0] ^ x[1] ^ x[2] ^ x[3];
        });
        best = std::min(best, now_s() - t0);
    }
    volatile uint64_t keep = 0;  // the XORs must not be optimised away
    for (uint64_t s : sink) keep = keep ^ s;
    return bytes / best;
}

// Multiply-adds per second of `threads` threads each running a T=64 matmul
// over a 64-row, 288-wide slice of W again and again: the slice and the
// inputs stay in cache, so this is the arithmetic roof. microkernel = matmul's
// own kernel on this CPU's instruction set; otherwise one dot() per output.
double macs_per_s(const float* W, int threads, bool microkernel) {
    const int T = 64, n = 288, d = 64;
    std::vector<float> x((size_t)T * n);
    for (size_t i = 0; i < x.size(); ++i) x[i] = W[(i * 7919) % ((size_t)d * n)];  // values of a realistic size
    std::vector<std::vector<float>> out((size_t)threads, std::vector<float>((size_t)T * d));
    const int reps = 60;
    double best = 1e30;
    for (int rep = 0; rep < 5; ++rep) {
        const double t0 = now_s();
        on_threads(threads, [&](int th) {
            float* o = out[(size_t)th].data();
            for (int r = 0; r < reps; ++r) {
                if (microkernel) pkv::matmul_rows_simd(o, x.data(), W, T, n, d, 0, d);
                else
                    for (int i = 0; i < d; ++i)
                        for (int t = 0; t < T; ++t) o[(size_t)t * d + i] = pkv::dot(W + (size_t)i * n, x.data() + (size_t)t * n, n);
            }
        });
        best = std::min(best, now_s() - t0);
    }
    return (double)threads * reps * T * n * d / best;
}

// ---- 3. The engine's overhead ------------------------------------------------------

// The CPU runner, timing its forward passes. The engine's greedy path calls
// forward_argmax: the forward pass, then an argmax per logits row (what the
// base class does; we do the same, timing each part). The argmax is the
// engine's sampling, outside the forward pass.
class TimedCpuRunner : public pkv::ModelRunner {
public:
    explicit TimedCpuRunner(const pkv::Model& m) : inner_(m, std::make_unique<pkv::FastCpuMath>()) {}
    const pkv::Config& model_config() const override { return inner_.model_config(); }
    std::string device_name() const override { return inner_.device_name(); }
    void init_kv_cache(const pkv::KVGeometry& geo) override { inner_.init_kv_cache(geo); }
    pkv::KVView kv_view(int layer, int kv) override { return inner_.kv_view(layer, kv); }
    void forward(const pkv::ForwardBatch& b, std::vector<float>& logits) override {
        const double t0 = now_s();
        inner_.forward(b, logits);
        forward_s += now_s() - t0;
    }
    void forward_argmax(const pkv::ForwardBatch& b, std::vector<int32_t>& tokens) override {
        forward(b, logits_);
        const double t0 = now_s();
        const int V = model_config().vocab_size;
        tokens.resize(b.logits_indices.size());
        for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = pkv::argmax(logits_.data() + i * V, V);
        argmax_s += now_s() - t0;
    }
    double forward_s = 0, argmax_s = 0;  // seconds inside forward() and in the argmax, summed

private:
    pkv::CpuRunner inner_;
    std::vector<float> logits_;
};

struct EngineTimes {
    double step_s, forward_s, argmax_s;
};

// `B` greedy requests with `prompt_len`-token prompts; after every prefill is
// done, `steps` decode steps timed: seconds of step(), of the forward passes
// and of the argmax.
EngineTimes engine_decode_time(const pkv::Model& model, int B, int prompt_len, int steps) {
    const int block_size = 16;
    pkv::EngineConfig ec;
    ec.block_size = block_size;
    ec.num_blocks = B * (int)pkv::blocks_for_tokens(prompt_len + steps + 2, block_size);
    ec.sched.max_num_seqs = B;
    ec.sched.max_num_batched_tokens = B * prompt_len;
    auto owned = std::make_unique<TimedCpuRunner>(model);
    TimedCpuRunner* runner = owned.get();
    pkv::Engine eng(std::move(owned), ec);
    int first_tokens = 0;
    eng.on_event = [&](const pkv::StreamEvent& e) { first_tokens += e.type == pkv::EventType::kToken && e.output_index == 0; };
    pkv::SamplingParams sp;
    sp.max_tokens = steps + 2;
    sp.ignore_eos = true;
    for (int s = 0; s < B; ++s) {
        std::vector<int32_t> prompt((size_t)prompt_len);
        for (int i = 0; i < prompt_len; ++i) prompt[(size_t)i] = (s * 7919 + i * 104729 + 13) % model.cfg.vocab_size;
        eng.add_request(prompt, sp);
    }
    while (first_tokens < B) eng.step();  // the prefills, not timed
    runner->forward_s = runner->argmax_s = 0;
    const double t0 = now_s();
    for (int i = 0; i < steps; ++i) eng.step();
    return {now_s() - t0, runner->forward_s, runner->argmax_s};
}

}  // namespace

int run(int argc, char** argv) {
    int steps = 64, threads_flag = 0;
    std::string save_path;
    cli::Parser p("bench_cpu", "[options]", "Decode benchmark of a stories15M-shaped random model on the CPU, against this machine's roofline.");
    p.integer("--steps", &steps, 1, 190, "decode steps per measurement");
    p.integer("--threads", &threads_flag, 0, 1024, "OpenMP threads; 0 = OMP_NUM_THREADS or all cores");
    p.text("--save-checkpoint", &save_path, "FILE",
           "only write the benchmark's model to FILE as a llama2.c checkpoint (for tools/vs_runc.sh), then exit");
    p.parse(argc, argv);
    if (!save_path.empty()) {
        pkv::save_checkpoint(save_path, bench_model());
        std::printf("bench_cpu: wrote the stories15M-shaped benchmark model to %s\n", save_path.c_str());
        return 0;
    }
#ifdef _OPENMP
    if (threads_flag > 0) omp_set_num_threads(threads_flag);
#endif
    const int threads = max_threads();
    const pkv::Config cfg = stories15m_shape();
    pkv::Model model = bench_model();
    size_t params = 0;
    for (const auto& t : pkv::checkpoint_tensors(cfg, model.w)) params += t.data ? t.count : 0;
    const double weight_bytes = params * 4.0;
    std::printf("bench_cpu: stories15M shape (dim %d, %d layers, %d heads, vocab %d), %.1fM params, %d thread(s)\n", cfg.dim,
                cfg.n_layers, cfg.n_heads, cfg.vocab_size, params / 1e6, threads);

    // 0. The roofline. What a decode step reads: the layer matrices and the
    // classifier (the embedding table, shared). Per token, every one of their
    // weights is one multiply-add (attention's are not counted: they are few).
    const pkv::Weights& w = model.w;
    const std::vector<std::pair<const float*, size_t>> arrays = {
        {w.wq.data(), w.wq.size()}, {w.wk.data(), w.wk.size()}, {w.wv.data(), w.wv.size()}, {w.wo.data(), w.wo.size()},
        {w.w1.data(), w.w1.size()}, {w.w2.data(), w.w2.size()}, {w.w3.data(), w.w3.size()},
        {model.classifier(), (size_t)cfg.vocab_size * cfg.dim}};
    double linear_macs = 0;  // per token
    for (const auto& a : arrays) linear_macs += (double)a.second;
    const double read1 = read_bytes_per_s(arrays, 1), read_all = threads > 1 ? read_bytes_per_s(arrays, threads) : read1;
    const double mk1 = macs_per_s(w.wq.data(), 1, true), mk_all = threads > 1 ? macs_per_s(w.wq.data(), threads, true) : mk1;
    const double dot1 = macs_per_s(w.wq.data(), 1, false);
    // The roofs: the better of one thread and all of them (on a busy machine
    // all threads can be the slower, and the ThreadPolicy then runs on one).
    const double read_roof = std::max(read1, read_all), mk_roof = std::max(mk1, mk_all);
    std::printf("\nroofline, measured now (best of 5 tries each):\n");
    std::printf("  matmul instruction set: %s (the best this CPU has, unless PKV_SIMD lowers it)\n", pkv::to_string(pkv::cpu_simd()));
    char label[64];
    std::snprintf(label, sizeof label, "read the weights (%.1f MB), 1 thread:", linear_macs * 4 / 1e6);
    std::printf("  %-42s %7.2f GB/s   -> at most %6.1f tok/s single-sequence\n", label, read1 / 1e9, read1 / (linear_macs * 4));
    if (threads > 1) {
        std::snprintf(label, sizeof label, "read the weights, %d threads:", threads);
        std::printf("  %-42s %7.2f GB/s   -> at most %6.1f tok/s single-sequence\n", label, read_all / 1e9, read_all / (linear_macs * 4));
    }
    std::printf("  %-42s %7.2f GMAC/s -> at most %6.1f tok/s batched\n", "matmul microkernel in cache, 1 thread:", mk1 / 1e9, mk1 / linear_macs);
    if (threads > 1) {
        std::snprintf(label, sizeof label, "matmul microkernel in cache, %d threads:", threads);
        std::printf("  %-42s %7.2f GMAC/s -> at most %6.1f tok/s batched\n", label, mk_all / 1e9, mk_all / linear_macs);
    }
    std::printf("  %-42s %7.2f GMAC/s (%.0f%% of the microkernel)\n", "plain dot() per output, 1 thread:", dot1 / 1e9, 100 * dot1 / mk1);

    const int block_size = 16, prompt_len = 64;
    std::vector<float> logits;

    // 1. Single sequence, token-by-token decode from position 0.
    {
        pkv::KVGeometry geo{cfg.n_layers, (int)pkv::blocks_for_tokens(cfg.seq_len, block_size), block_size, cfg.n_kv_heads, cfg.head_dim()};
        pkv::KVCache cache(geo);
        pkv::BlockPool pool(geo.num_blocks, block_size, false);
        pkv::BlockTable table;
        pkv::FastCpuMath fast;
        pkv::CpuForward fwd(model, cache, fast);
        int token = 1;  // BOS
        const int n = 4 * steps > cfg.seq_len ? cfg.seq_len : 4 * steps;
        double t0 = now_s();
        for (int pos = 0; pos < n; ++pos) {
            pkv::allocate_slots(pool, table, {}, pos + 1);
            pkv::ForwardBatch b;
            b.add_sequence(table.blocks, block_size, &token, pos, 1, true);
            fwd.forward(b, logits);
            token = pkv::argmax(logits.data(), cfg.vocab_size);
        }
        double dt = now_s() - t0;
        const pkv::FastCpuMath::Profile& pr = fast.profile;
        const double gbps = n * weight_bytes / dt;
        std::printf("\nsingle-sequence decode: %d tokens in %.3f s = %.1f tok/s\n", n, dt, n / dt);
        std::printf("  weights streamed: %.2f GB/s = %.0f%% of the read roof; time in matmul %.0f%%, in attention %.0f%%;\n"
                    "  %ld of %ld passes on %d threads\n",
                    gbps / 1e9, 100 * gbps / read_roof, 100 * pr.matmul_s / dt, 100 * pr.attention_s / dt, pr.parallel_passes, pr.passes, threads);
    }

    // 2. Batched decode.
    std::printf("\nbatched decode (%d-token prompts, then %d decode steps per sequence):\n", prompt_len, steps);
    std::printf("  %6s  %8s  %11s  %10s  %7s  %9s  %7s  %9s  %7s\n", "batch", "tok/s", "ms per step", "vs batch 1", "GMAC/s", "% of roof",
                "matmul", "attention", "argmax");
    double base = 0;
    for (int B : {1, 4, 16, 64}) {
        const int per_seq = (int)pkv::blocks_for_tokens(prompt_len + steps, block_size);
        pkv::KVGeometry geo{cfg.n_layers, B * per_seq, block_size, cfg.n_kv_heads, cfg.head_dim()};
        pkv::KVCache cache(geo);
        pkv::BlockPool pool(geo.num_blocks, block_size, false);
        std::vector<pkv::BlockTable> tables(B);
        std::vector<int32_t> last(B);
        pkv::FastCpuMath fast;
        pkv::CpuForward fwd(model, cache, fast);
        // Prefill every sequence (not timed): prompt tokens differ per sequence.
        for (int s = 0; s < B; ++s) {
            std::vector<int32_t> prompt(prompt_len);
            for (int i = 0; i < prompt_len; ++i) prompt[i] = (s * 7919 + i * 104729) % cfg.vocab_size;
            pkv::allocate_slots(pool, tables[s], {}, prompt_len);
            pkv::ForwardBatch b;
            b.add_sequence(tables[s].blocks, block_size, prompt.data(), 0, prompt_len, true);
            fwd.forward(b, logits);
            last[s] = pkv::argmax(logits.data(), cfg.vocab_size);
        }
        fast.profile = {};
        double argmax_s = 0;
        double t0 = now_s();
        for (int step = 0; step < steps; ++step) {
            pkv::ForwardBatch b;
            for (int s = 0; s < B; ++s) {
                pkv::allocate_slots(pool, tables[s], {}, prompt_len + step + 1);
                b.add_sequence(tables[s].blocks, block_size, &last[s], prompt_len + step, 1, true);
            }
            fwd.forward(b, logits);
            const double a0 = now_s();
            for (int s = 0; s < B; ++s) last[s] = pkv::argmax(logits.data() + (size_t)s * cfg.vocab_size, cfg.vocab_size);
            argmax_s += now_s() - a0;
        }
        double dt = now_s() - t0;
        const double mm = fast.profile.matmul_s, at = fast.profile.attention_s;
        double tps = (double)B * steps / dt;
        if (B == 1) base = tps;
        const double macs = tps * linear_macs;
        std::printf("  %6d  %8.1f  %11.2f  %9.2fx  %7.2f  %8.0f%%  %6.0f%%  %8.0f%%  %6.0f%%\n", B, tps, dt / steps * 1e3, tps / base,
                    macs / 1e9, 100 * macs / mk_roof, 100 * mm / dt, 100 * at / dt, 100 * argmax_s / dt);
    }
    std::printf("  (GMAC/s: the matmuls' multiply-adds; roof: the faster microkernel figure above. matmul,\n"
                "   attention, argmax: shares of the step time; the rest is norms, RoPE, SwiGLU, the cache writes)\n");

    // 3. The engine's overhead.
    std::printf("\nengine overhead (a real Engine, greedy, %d decode steps after the prefills): shares of step()\n", steps);
    std::printf("  %6s  %12s  %8s  %8s  %8s\n", "batch", "ms per step", "forward", "argmax", "engine");
    for (int B : {1, 64}) {
        const EngineTimes e = engine_decode_time(model, B, prompt_len, steps);
        std::printf("  %6d  %12.3f  %7.1f%%  %7.2f%%  %7.2f%%\n", B, e.step_s / steps * 1e3, 100 * e.forward_s / e.step_s,
                    100 * e.argmax_s / e.step_s, 100 * (e.step_s - e.forward_s - e.argmax_s) / e.step_s);
    }
    std::printf("  (forward: the model's forward pass; argmax: picking each sequence's token from its logits;\n"
                "   engine: everything else -- scheduling, building the batch, streaming the tokens)\n");
    return 0;
}

int main(int argc, char** argv) { return cli::guarded_main("bench_cpu", [&] { return run(argc, argv); }); }

// examples/bench_cpu.cpp -- how fast is the CPU forward pass?
//
// A stories15M-shaped model (dim 288, 6 layers, 6 heads, vocab 32000, ctx 256)
// with random weights made in-process, so no file is needed. It prints:
//   1. single-sequence decode tok/s (one token per forward, context growing);
//   2. batched decode throughput at batch 1/4/16/64: every sequence holds a
//      64-token prompt, then each step decodes one token for each of them.
// Batched decode reads each weight row once per step for the whole batch, so
// tokens/s should grow with batch size until arithmetic, not memory, limits.
//
//   build/bench_cpu [--steps N] [--threads T]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "block_pool.hpp"
#include "examples/cli.hpp"
#include "paged_kv.cuh"
#include "tiny_model/forward_cpu.hpp"
#include "tiny_model/sampler.hpp"

namespace {

double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

pkv::Config stories15m_shape() {
    pkv::Config c;
    c.dim = 288; c.hidden_dim = 768; c.n_layers = 6; c.n_heads = 6; c.n_kv_heads = 6;
    c.vocab_size = 32000; c.seq_len = 256; c.shared_classifier = true;
    return c;
}

}  // namespace

int run(int argc, char** argv) {
    int steps = 64, threads_flag = 0;
    cli::Parser p("bench_cpu", "[options]", "Decode benchmark of a stories15M-shaped random model on the CPU.");
    p.integer("--steps", &steps, 1, 190, "decode steps per measurement");
    p.integer("--threads", &threads_flag, 0, 1024, "OpenMP threads; 0 = OMP_NUM_THREADS or all cores");
    p.parse(argc, argv);
#ifdef _OPENMP
    if (threads_flag > 0) omp_set_num_threads(threads_flag);
#endif
    int threads = 1;
#ifdef _OPENMP
    threads = omp_get_max_threads();
#endif
    const pkv::Config cfg = stories15m_shape();
    pkv::Model model = pkv::make_random_model(cfg, 15, {});
    size_t params = 0;
    for (const auto& t : pkv::checkpoint_tensors(cfg, model.w)) params += t.data ? t.count : 0;
    const double weight_bytes = params * 4.0;
    std::printf("bench_cpu: stories15M shape (dim %d, %d layers, %d heads, vocab %d), %.1fM params, %d thread(s)\n",
                cfg.dim, cfg.n_layers, cfg.n_heads, cfg.vocab_size, params / 1e6, threads);

    const int block_size = 16, prompt_len = 64;
    std::vector<float> logits;

    // 1. Single sequence, token-by-token decode from position 0.
    {
        pkv::KVGeometry geo{cfg.n_layers, (int)pkv::blocks_for_tokens(cfg.seq_len, block_size), block_size, cfg.n_kv_heads, cfg.head_dim()};
        pkv::KVCache cache(geo);
        pkv::BlockPool pool(geo.num_blocks, block_size, false);
        pkv::BlockTable table;
        pkv::CpuForward fwd(model, cache);
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
        std::printf("\nsingle-sequence decode: %d tokens in %.3f s = %.1f tok/s  (weights streamed: %.2f GB/s)\n", n, dt, n / dt,
                    n * weight_bytes / dt / 1e9);
    }

    // 2. Batched decode.
    std::printf("\nbatched decode (%d-token prompts, then %d decode steps per sequence):\n", prompt_len, steps);
    std::printf("  %6s  %12s  %14s  %10s\n", "batch", "tok/s", "ms per step", "vs batch 1");
    double base = 0;
    for (int B : {1, 4, 16, 64}) {
        const int per_seq = (int)pkv::blocks_for_tokens(prompt_len + steps, block_size);
        pkv::KVGeometry geo{cfg.n_layers, B * per_seq, block_size, cfg.n_kv_heads, cfg.head_dim()};
        pkv::KVCache cache(geo);
        pkv::BlockPool pool(geo.num_blocks, block_size, false);
        std::vector<pkv::BlockTable> tables(B);
        std::vector<int32_t> last(B);
        pkv::CpuForward fwd(model, cache);
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
        double t0 = now_s();
        for (int step = 0; step < steps; ++step) {
            pkv::ForwardBatch b;
            for (int s = 0; s < B; ++s) {
                pkv::allocate_slots(pool, tables[s], {}, prompt_len + step + 1);
                b.add_sequence(tables[s].blocks, block_size, &last[s], prompt_len + step, 1, true);
            }
            fwd.forward(b, logits);
            for (int s = 0; s < B; ++s) last[s] = pkv::argmax(logits.data() + (size_t)s * cfg.vocab_size, cfg.vocab_size);
        }
        double dt = now_s() - t0;
        double tps = (double)B * steps / dt;
        if (B == 1) base = tps;
        std::printf("  %6d  %12.1f  %14.2f  %9.2fx\n", B, tps, dt / steps * 1e3, tps / base);
    }
    return 0;
}

int main(int argc, char** argv) { return cli::guarded_main("bench_cpu", [&] { return run(argc, argv); }); }

// examples/generate.cpp -- a llama2.c-compatible command line on the paged engine.
//
//   build/generate [checkpoint.bin] [-t temp] [-p top_p] [-s seed] [-n steps]
//                  [-i prompt] [-z tokenizer.bin] [--num-blocks N] [--block-size B]
//
// For the same checkpoint, tokenizer, prompt and -t 0 its stdout is byte for
// byte run.c's. The difference is underneath: the prompt is prefilled in one
// batch, and the KV cache is a pool of blocks that this one sequence grows into
// block by block, exactly as a sequence inside the engine does.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <memory>
#include <string>

#include "examples/cli.hpp"
#include "core/block_pool.hpp"
#include "paged_kv.cuh"
#include "examples/devices.hpp"
#include "tiny_model/sampler.hpp"
#include "tiny_model/builtin.hpp"
#include "tiny_model/tokenizer.hpp"

namespace {

struct Options {
    std::string checkpoint, tokenizer_path, prompt;
    double temperature = 1.0, top_p = 0.9;
    uint64_t seed = 0;  // 0 = time(NULL), as run.c
    long steps = 256;
    int num_blocks = 0, block_size = 16;
    pkv::Device device = pkv::Device::kCpu;
    pkv::MathPath math = pkv::MathPath::kReference;
};

Options parse(int argc, char** argv) {
    Options o;
    cli::Parser p("generate", "[checkpoint.bin] [options]",
                  "llama2.c's run.c command line on the paged engine. With no checkpoint, runs the built-in model\n"
                  "(random weights, seed 42).");
    p.positional(&o.checkpoint, "checkpoint");
    p.real("-t", &o.temperature, 0, 100, "temperature, 0 = greedy");
    p.real("-p", &o.top_p, 0, 1, "top-p (nucleus); 0 or 1 = off");
    p.integer("-s", &o.seed, 0, std::numeric_limits<int64_t>::max(), "random seed; 0 = time(NULL)");
    p.integer("-n", &o.steps, 0, 1 << 24, "positions incl. BOS and prompt; 0 or more than the model's context = its context");
    p.text("-i", &o.prompt, "TEXT", "prompt", /*nonempty=*/false);
    p.text("-z", &o.tokenizer_path, "FILE", "tokenizer file, default tokenizer.bin (checkpoints only)");
    p.integer("--num-blocks", &o.num_blocks, 0, 1 << 22, "KV cache blocks; 0 = enough for -n positions");
    p.integer("--block-size", &o.block_size, 1, pkv::kMaxBlockSize, "positions per block");
    p.choice("--device", &o.device, {{"cpu", pkv::Device::kCpu}, {"emulated", pkv::Device::kEmulated}, {"cuda", pkv::Device::kCuda}},
             "cpu, emulated (the CUDA kernels on the CPU; CPU build only) or cuda (a GPU; `make cuda` build only)");
    pkv::add_math_flag(p, &o.math);
    p.epilog("Where run.c clamps a bad -t or -p to a default, we refuse it; -n is clamped to the model's context as in run.c.");
    p.parse(argc, argv);
    if (!o.tokenizer_path.empty() && o.checkpoint.empty()) cli::bad_usage("-z needs a checkpoint: the built-in model has its own vocabulary");
    return o;
}

int run(int argc, char** argv) {
    const Options o = parse(argc, argv);
    const float temperature = (float)o.temperature, top_p = (float)o.top_p;
    const int block_size = o.block_size;
    uint64_t seed = o.seed;
    if (seed == 0) seed = (unsigned int)std::time(nullptr);

    const pkv::ModelAndTokenizer mt = pkv::load_model_and_tokenizer(o.checkpoint, o.tokenizer_path);
    const pkv::Config& cfg = mt.model.cfg;
    const int steps = (o.steps <= 0 || o.steps > cfg.seq_len) ? cfg.seq_len : (int)o.steps;

    // The paged KV cache: a pool of blocks, and this sequence's block table.
    const int needed_blocks = (int)pkv::blocks_for_tokens(steps, block_size);
    const int num_blocks = o.num_blocks == 0 ? needed_blocks : o.num_blocks;
    if (num_blocks < needed_blocks)
        cli::bad_usage("--num-blocks " + std::to_string(num_blocks) + " holds " + std::to_string((long)num_blocks * block_size) +
                       " positions, but -n " + std::to_string(steps) + " needs " + std::to_string(needed_blocks) + " blocks of " +
                       std::to_string(block_size));
    const pkv::KVGeometry geo{cfg.n_layers, num_blocks, block_size, cfg.n_kv_heads, cfg.head_dim()};
    const uint64_t need = pkv::mul_sat((uint64_t)num_blocks, geo.bytes_per_block());
    if (need > pkv::host_memory_bytes())
        throw std::runtime_error("a KV cache of " + std::to_string(num_blocks) + " blocks needs " + pkv::format_bytes(need) +
                                 ", more than this machine's " + pkv::format_bytes(pkv::host_memory_bytes()) + ": lower --num-blocks or --block-size");
    std::unique_ptr<pkv::ModelRunner> runner = pkv::make_model_runner(o.device, mt.model, o.math);
    runner->init_kv_cache(geo);
    pkv::BlockPool pool(num_blocks, block_size, /*enable_prefix_caching=*/false);
    pkv::BlockTable table;
    std::vector<float> logits;
    std::vector<int32_t> greedy;  // -t 0: the argmax, computed where the logits are
    auto forward = [&](const pkv::ForwardBatch& b) {
        if (temperature == 0.0f) runner->forward_argmax(b, greedy);
        else runner->forward(b, logits);
    };
    std::vector<std::pair<float, int>> scratch;
    uint64_t rng = seed;

    std::vector<int> prompt_tokens = mt.tok.encode(o.prompt, /*bos=*/true);
    const int num_prompt = (int)prompt_tokens.size();

    // Prefill: the first P prompt positions in one batch, logits for the last.
    const int P = std::min<int>(num_prompt, steps);
    pkv::allocate_slots(pool, table, {}, P);
    {
        pkv::ForwardBatch b;
        b.add_sequence(table.blocks, (int)block_size, prompt_tokens.data(), 0, P, true);
        forward(b);
    }
    for (int i = 1; i < P; ++i) std::fputs(mt.tok.render(prompt_tokens[i - 1], prompt_tokens[i]).c_str(), stdout);
    std::fflush(stdout);

    // Decode: one position at a time, each forward writes one slot.
    auto start = std::chrono::steady_clock::now();
    int token = prompt_tokens[P - 1];
    int pos = P - 1;  // the position whose logits we hold
    while (pos < steps) {
        int next;
        if (pos < num_prompt - 1) next = prompt_tokens[pos + 1];  // a prompt cut short by -n
        else {
            if (temperature == 0.0f) next = greedy[0];
            else next = pkv::sample_token(logits.data(), cfg.vocab_size, temperature, top_p, pkv::runc_random_f32(rng), scratch);
        }
        ++pos;
        if (next == pkv::kBosId) break;  // run.c stops when the model says BOS
        std::fputs(mt.tok.render(token, next).c_str(), stdout);
        std::fflush(stdout);
        token = next;
        if (pos >= steps) break;
        pkv::allocate_slots(pool, table, {}, pos + 1);  // a new block every block_size positions
        pkv::ForwardBatch b;
        b.add_sequence(table.blocks, (int)block_size, &token, pos, 1, true);
        forward(b);
    }
    std::printf("\n");
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (pos > P && secs > 0) std::fprintf(stderr, "achieved tok/s: %f\n", (pos - P) / secs);
    return 0;
}

}  // namespace

int main(int argc, char** argv) { return cli::guarded_main("generate", [&] { return run(argc, argv); }); }

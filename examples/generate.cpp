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
#include "block_pool.hpp"
#include "paged_kv.cuh"
#include "tiny_model/devices.hpp"
#include "tiny_model/sampler.hpp"
#include "tiny_model/tokenizer.hpp"

namespace {

void usage(FILE* out) {
    std::fprintf(out,
                 "Usage: generate [checkpoint.bin] [options]\n"
                 "  With no checkpoint, runs the built-in model (random weights, seed 42).\n"
                 "Options (llama2.c run.c's):\n"
                 "  -t <float>  temperature in [0,inf), default 1.0 (0 = greedy)\n"
                 "  -p <float>  top-p in [0,1], default 0.9 (0 or 1 = off)\n"
                 "  -s <int>    random seed, default time(NULL)\n"
                 "  -n <int>    number of positions incl. BOS and prompt, default 256 (0 = model context)\n"
                 "  -i <string> prompt\n"
                 "  -z <string> tokenizer file, default tokenizer.bin (checkpoints only)\n"
                 "pagedkv options:\n"
                 "  --num-blocks <int>  KV cache blocks, default: enough for -n positions\n"
                 "  --block-size <int>  positions per block, default 16\n"
                 "  --device <name>     cpu (default), emulated (the CUDA kernels run on the CPU;\n"
                 "                      CPU build only) or cuda (a GPU; `make cuda` build only)\n"
                 "  --help              this text\n");
}

}  // namespace

int main(int argc, char** argv) {
    cli::program = "generate";
    cli::print_usage = usage;
    std::string checkpoint, tokenizer_path, prompt;
    float temperature = 1.0f, top_p = 0.9f;
    unsigned long long seed = 0;
    long steps = 256;
    long num_blocks = 0, block_size = 16;
    std::string device_name = "cpu";

    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        if (a == "--help" || a == "-h") { usage(stdout); return 0; }
        if (a[0] != '-') {
            if (!checkpoint.empty()) cli::bad_usage("more than one checkpoint given ('" + checkpoint + "' and '" + a + "')");
            checkpoint = a;
            continue;
        }
        static const char* const kFlags[] = {"-t", "-p", "-s", "-n", "-i", "-z", "--num-blocks", "--block-size", "--device"};
        if (std::find(std::begin(kFlags), std::end(kFlags), a) == std::end(kFlags)) cli::bad_usage("unknown option " + a);
        if (i + 1 >= argc) cli::bad_usage("option " + a + " needs a value");
        const char* val = argv[++i];
        if (a == "-t") temperature = (float)cli::parse_float("-t", val);
        else if (a == "-p") top_p = (float)cli::parse_float("-p", val);
        else if (a == "-s") seed = (unsigned long long)cli::parse_int("-s", val);
        else if (a == "-n") steps = cli::parse_int("-n", val);
        else if (a == "-i") prompt = val;
        else if (a == "-z") tokenizer_path = val;
        else if (a == "--num-blocks") num_blocks = cli::parse_int("--num-blocks", val);
        else if (a == "--block-size") block_size = cli::parse_int("--block-size", val);
        else if (a == "--device") device_name = val;
    }
    // run.c's parameter clean-up.
    if (seed == 0) seed = (unsigned int)std::time(nullptr);
    if (temperature < 0.0f) temperature = 0.0f;
    if (top_p < 0.0f || 1.0f < top_p) top_p = 0.9f;
    if (block_size <= 0 || block_size > 4096) cli::bad_usage("--block-size must be in 1..4096");

    pkv::ModelAndTokenizer mt;
    try {
        mt = pkv::load_model_and_tokenizer(checkpoint, tokenizer_path);
    } catch (const pkv::FileError& e) {
        std::fprintf(stderr, "generate: %s\n", e.what());
        return 1;
    }
    const pkv::Config& cfg = mt.model.cfg;
    if (steps <= 0 || steps > cfg.seq_len) steps = cfg.seq_len;

    // The paged KV cache: a pool of blocks, and this sequence's block table.
    const int needed_blocks = (int)pkv::blocks_for_tokens(steps, block_size);
    if (num_blocks == 0) num_blocks = needed_blocks;
    if (num_blocks < needed_blocks) {
        std::fprintf(stderr, "generate: --num-blocks %ld holds %ld positions, but -n %ld needs %d blocks of %ld\n", num_blocks,
                     num_blocks * block_size, steps, needed_blocks, block_size);
        return 1;
    }
    pkv::KVGeometry geo{cfg.n_layers, (int)num_blocks, (int)block_size, cfg.n_kv_heads, cfg.head_dim()};
    std::unique_ptr<pkv::ModelRunner> runner;
    try {
        runner = pkv::make_model_runner(pkv::parse_device(device_name), mt.model);
        runner->init_kv_cache(geo, 0);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "generate: %s\n", e.what());
        return 1;
    }
    pkv::BlockPool pool((int)num_blocks, (int)block_size, /*enable_prefix_caching=*/false);
    pkv::BlockTable table;
    std::vector<float> logits;
    std::vector<int32_t> greedy;  // -t 0: the argmax, computed where the logits are
    auto forward = [&](const pkv::ForwardBatch& b) {
        if (temperature == 0.0f) runner->forward_argmax(b, greedy);
        else runner->forward(b, logits);
    };
    std::vector<std::pair<float, int>> scratch;
    uint64_t rng = seed;

    std::vector<int> prompt_tokens = mt.tok.encode(prompt, /*bos=*/true);
    const int num_prompt = (int)prompt_tokens.size();

    // Prefill: the first P prompt positions in one batch, logits for the last.
    const int P = std::min<int>(num_prompt, (int)steps);
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

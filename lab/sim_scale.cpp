// lab/sim_scale.cpp -- lab/LAB.md chapter L6: production scale on the
// simulated GPU: Llama-3-8B
// on an H200 (a KV pool of tens of thousands of blocks), ten thousand
// chat-like requests arriving as a Poisson process, and how fast this
// machine simulates it.
//
// Everything but the forward pass is the real engine: the scheduler, the
// block pool (and its prefix cache), the metrics. The forward pass is
// SimRunner (sim_runner.hpp), which charges each step the duration the cost
// model (cost_model.hpp) gives it on the chosen GPU, to a virtual clock; so
// every latency printed is in simulated seconds, and the wall seconds are
// only what the bookkeeping costs on this CPU. The point of the program is
// that second number: the engine's own work per step must stay proportional
// to the work of the step (requests running, tokens scheduled), whatever the
// size of the pool and however many requests came before. A cost that grows
// with the length of the run shows up here as a falling "steps per wall
// second" as --requests grows: try 2500, 5000, 10000, 20000.
//
//   build/sim_scale                          the default: 10,000 requests, h200, llama-3-8b
//   build/sim_scale --requests 20000 --json  one JSON object instead of the table
//   build/sim_scale --gpu a100-80g --rate 20 the same traffic on a smaller GPU
//
// The default rate (52 requests/s) is a little above what the H200 sustains
// on this traffic at max_num_seqs 256: the engine runs full and a queue
// builds slowly, so time to first token grows over the run while the
// inter-token latency stays that of a full batch.
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "engine.hpp"
#include "examples/cli.hpp"
#include "lab/traffic.hpp"
#include "examples/workload.hpp"
#include "lab/sim_engine.hpp"
#include "lab/sim_runner.hpp"

namespace {

struct Options {
    std::string gpu = "h200", model = "llama-3-8b";
    int requests = 10000;
    double rate = 52.0;  // requests per simulated second
    int max_num_seqs = 256, max_num_batched_tokens = 8192;
    double gpu_memory_utilization = 0.9;
    bool prefix_caching = true;  // vLLM V1's default
    uint64_t seed = 1;
    bool json = false;
};

template <class T>
std::vector<std::pair<std::string, std::string>> preset_names(const std::vector<T>& presets) {
    std::vector<std::pair<std::string, std::string>> v;
    for (const T& p : presets) v.push_back({p.name, p.name});
    return v;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

int run(int argc, char** argv) {
    Options o;
    cli::Parser p("sim_scale", "[options]",
                  "Chat-like Poisson traffic on a simulated GPU at production scale; prints how fast it simulates.");
    p.choice("--gpu", &o.gpu, preset_names(pkv::gpu_presets()), "GPU preset (cost_model.hpp section 1)");
    p.choice("--model", &o.model, preset_names(pkv::model_presets()), "model preset (cost_model.hpp section 1)");
    p.integer("--requests", &o.requests, 1, 1000000, "requests to serve");
    p.real("--rate", &o.rate, 0.001, 1e6, "mean arrival rate, requests per simulated second (Poisson)");
    p.integer("--max-num-seqs", &o.max_num_seqs, 1, 65536, "most requests running at once");
    p.integer("--max-num-batched-tokens", &o.max_num_batched_tokens, 1, 1 << 20, "token budget of one step");
    p.real("--gpu-memory-utilization", &o.gpu_memory_utilization, 0.05, 1.0, "vLLM's fraction of GPU memory for weights, activations and KV cache");
    p.on_off("--prefix-caching", &o.prefix_caching, "reuse cached prompt blocks");
    p.integer("--seed", &o.seed, 0, (1LL << 62), "traffic seed (lengths, tokens, arrival times)");
    p.flag("--json", &o.json, "print one JSON object instead of the table");
    p.epilog("Lengths are chat_like (traffic.hpp: lognormal, ShareGPT means of 161 prompt and 338 output tokens),\n"
             "capped so that prompt + output fits the model's context. Latencies are simulated seconds.");
    p.parse(argc, argv);

    // The simulated engine, built as vLLM sizes it (lab/sim_engine.hpp).
    pkv::SimConfig sc = pkv::sim_config(o.gpu, o.model);
    sc.memory_utilization = o.gpu_memory_utilization;
    workload::EngineKnobs knobs;
    knobs.num_blocks = 0;  // vLLM's rule: what the GPU holds
    knobs.max_num_seqs = o.max_num_seqs;
    knobs.max_num_batched_tokens = o.max_num_batched_tokens;
    knobs.prefix_caching = o.prefix_caching;
    pkv::VirtualClock clock;
    const std::unique_ptr<pkv::Engine> engine = study::make_sim_engine(sc, knobs, &clock);
    pkv::Engine& eng = *engine;

    // The traffic: prompt + output never longer than max_model_len, so every
    // request ends by max_tokens.
    const int ctx = eng.config().sched.max_model_len;
    const int max_prompt = ctx / 2, max_output = ctx - max_prompt;
    study::Traffic t = study::chat_like(o.requests, max_prompt, max_output);
    t.arrivals.kind = study::Arrivals::Kind::kPoisson;
    t.arrivals.rate = o.rate;
    t.seed = o.seed;
    const auto t_plan = std::chrono::steady_clock::now();
    const std::vector<study::PlannedRequest> plan = study::plan_traffic(t, eng.model().vocab_size);
    const double plan_wall = seconds_since(t_plan);

    // The loop: requests join when the virtual clock reaches their arrival
    // (between steps); an idle engine jumps to the next arrival.
    const auto t0 = std::chrono::steady_clock::now();
    size_t next = 0;
    long steps = 0;
    while (next < plan.size() || eng.has_unfinished()) {
        while (next < plan.size() && clock.t >= plan[next].arrival_s) {
            eng.add_request(plan[next].prompt, plan[next].params);
            ++next;
        }
        if (!eng.has_unfinished()) {
            clock.t = plan[next].arrival_s;
            continue;
        }
        eng.step();
        ++steps;
    }
    const double wall = seconds_since(t0);
    const double sim = clock.t;

    const pkv::Metrics& m = eng.metrics();
    const double ttft50 = m.time_to_first_token.percentile(50) * 1e3, ttft99 = m.time_to_first_token.percentile(99) * 1e3;
    const double itl50 = m.inter_token_latency.percentile(50) * 1e3, itl99 = m.inter_token_latency.percentile(99) * 1e3;
    if (o.json) {
        std::printf("%s\n", workload::Json()
                                .str("gpu", o.gpu)
                                .str("model", o.model)
                                .integer("requests", o.requests)
                                .num("rate", o.rate)
                                .integer("max_num_seqs", o.max_num_seqs)
                                .integer("max_num_batched_tokens", o.max_num_batched_tokens)
                                .boolean("prefix_caching", o.prefix_caching)
                                .integer("seed", (long)o.seed)
                                .integer("num_blocks", eng.config().num_blocks)
                                .integer("max_model_len", ctx)
                                .num("sim_seconds", sim)
                                .num("wall_seconds", wall)
                                .num("plan_wall_seconds", plan_wall)
                                .num("sim_seconds_per_wall_second", sim / wall)
                                .integer("steps", steps)
                                .num("steps_per_wall_second", steps / wall)
                                .integer("requests_finished", m.num_requests_finished)
                                .integer("requests_rejected", m.num_requests_rejected)
                                .integer("useful_tokens", m.generation_tokens_total)
                                .integer("prompt_tokens", m.prompt_tokens_total)
                                .num("output_tokens_per_sim_second", m.generation_tokens_total / sim)
                                .integer("preemptions", m.num_preemptions_total)
                                .num("ttft_p50_ms", ttft50)
                                .num("ttft_p99_ms", ttft99)
                                .num("itl_p50_ms", itl50)
                                .num("itl_p99_ms", itl99)
                                .num("peak_kv_usage", m.max_kv_cache_usage_perc)
                                .dump()
                                .c_str());
    } else {
        std::printf("sim_scale: %s on %s, %d chat-like requests, Poisson %.3g req/s, max_num_seqs %d, "
                    "max_num_batched_tokens %d, prefix caching %s, seed %llu\n",
                    o.model.c_str(), o.gpu.c_str(), o.requests, o.rate, o.max_num_seqs, o.max_num_batched_tokens,
                    o.prefix_caching ? "on" : "off", (unsigned long long)o.seed);
        std::printf("  KV pool                   %d blocks of %d tokens (%ld token slots), max_model_len %d\n",
                    eng.config().num_blocks, eng.config().block_size, (long)eng.config().num_blocks * eng.config().block_size, ctx);
        std::printf("  simulated                 %.2f s\n", sim);
        std::printf("  wall                      %.3f s (+ %.3f s planning the traffic)\n", wall, plan_wall);
        std::printf("  simulated s per wall s    %.1f\n", sim / wall);
        std::printf("  steps                     %ld (%.0f per wall second)\n", steps, steps / wall);
        std::printf("  requests finished         %ld of %d (%ld rejected)\n", m.num_requests_finished, o.requests,
                    m.num_requests_rejected);
        std::printf("  useful tokens             %ld output (%.0f per simulated second), %ld prompt\n",
                    m.generation_tokens_total, m.generation_tokens_total / sim, m.prompt_tokens_total);
        std::printf("  preemptions               %ld\n", m.num_preemptions_total);
        std::printf("  TTFT p50 / p99            %.1f / %.1f ms (simulated)\n", ttft50, ttft99);
        std::printf("  ITL  p50 / p99            %.2f / %.2f ms (simulated)\n", itl50, itl99);
        std::printf("  peak KV cache usage       %.1f%%\n", 100.0 * m.max_kv_cache_usage_perc);
    }
    return m.num_requests_finished + m.num_requests_rejected == o.requests ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
    return cli::guarded_main("sim_scale", [&] { return run(argc, argv); });
}

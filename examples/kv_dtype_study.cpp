// examples/kv_dtype_study.cpp -- what does a smaller KV cache dtype cost, and
// what does it buy?
//
// Cost: we run each prompt greedily with an f32 cache, then feed the very same
// tokens through an f16 and an int8 cache (teacher forcing), and compare the
// logits at every position: the largest |logit - f32 logit|, and how often the
// greedy (argmax) token is still the same. We also let each dtype generate
// freely and count how many generated tokens match f32 before the first
// difference.
// Gain: the same byte budget holds more blocks of a smaller dtype; on the
// overload workload that means fewer preemptions.
//
//   build/kv_dtype_study [--tokens N] [--json]
// stories260K is included when ../shared/models/ (or $PAGEDKV_MODELS) has it.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "engine.hpp"
#include "examples/cli.hpp"
#include "tiny_model/tokenizer.hpp"

namespace {

const char* const kPrompts[] = {"Once upon a time", "The little dog ran to the park", "One day, a girl named Lily",
                                "the sun was warm and the sky was blue", "Tom and his friend found a big box",
                                "She wanted to play with the ball", "a bird sat in the tree and sang", "Mom said"};

struct Row {
    std::string model, dtype;
    double max_logit_diff = 0;       // over all prompts and positions
    long agree = 0, positions = 0;   // teacher-forced argmax agreement
    long free_match = 0, free_total = 0;  // free-running tokens equal to f32's before the first difference
};

// Greedy-decodes `n` tokens after `prompt` with a cache of `dtype`; if `forced`
// is non-empty those tokens are fed instead of the argmax (teacher forcing).
// Returns the logits at every generated position and the tokens.
void decode(const pkv::Model& m, pkv::KVDtype dtype, const std::vector<int>& prompt, int n, const std::vector<int>& forced,
            std::vector<std::vector<float>>& logits, std::vector<int>& tokens) {
    const int bs = 16, total = (int)prompt.size() + n;
    pkv::KVCache cache(pkv::KVGeometry{m.cfg.n_layers, (int)pkv::blocks_for_tokens(total, bs), bs, m.cfg.n_kv_heads, m.cfg.head_dim(), dtype});
    pkv::CpuForward fwd(m, cache);
    pkv::BlockPool pool(cache.geo.num_blocks, bs, false);
    pkv::BlockTable table;
    std::vector<int32_t> seq(prompt.begin(), prompt.end());
    logits.clear();
    tokens.clear();
    std::vector<float> out;
    int pos = 0;
    while ((int)tokens.size() < n) {
        pkv::allocate_slots(pool, table, {}, (int)seq.size());
        pkv::ForwardBatch b;
        b.add_sequence(table.blocks, bs, seq.data() + pos, pos, (int)seq.size() - pos, true);
        fwd.forward(b, out);
        pos = (int)seq.size();
        logits.push_back(out);
        const int next = forced.empty() ? pkv::argmax(out.data(), m.cfg.vocab_size) : forced[tokens.size()];
        tokens.push_back(next);
        seq.push_back(next);
    }
}

void study_model(const std::string& name, const pkv::Model& m, const pkv::Tokenizer& tok, int n, std::vector<Row>& rows) {
    const pkv::KVDtype dtypes[] = {pkv::KVDtype::kF16, pkv::KVDtype::kInt8};
    Row r[2];
    for (int k = 0; k < 2; ++k) r[k] = Row{name, pkv::to_string(dtypes[k])};
    for (const char* p : kPrompts) {
        const std::vector<int> prompt = tok.encode(p, true);
        if ((int)prompt.size() + n > m.cfg.seq_len) continue;
        std::vector<std::vector<float>> ref_logits, logits;
        std::vector<int> ref_tokens, tokens;
        decode(m, pkv::KVDtype::kF32, prompt, n, {}, ref_logits, ref_tokens);
        for (int k = 0; k < 2; ++k) {
            decode(m, dtypes[k], prompt, n, ref_tokens, logits, tokens);
            for (int i = 0; i < n; ++i) {
                for (int v = 0; v < m.cfg.vocab_size; ++v)
                    r[k].max_logit_diff = std::max(r[k].max_logit_diff, (double)std::fabs(logits[i][v] - ref_logits[i][v]));
                r[k].agree += pkv::argmax(logits[i].data(), m.cfg.vocab_size) == ref_tokens[i];
                r[k].positions++;
            }
            decode(m, dtypes[k], prompt, n, {}, logits, tokens);
            int same = 0;
            while (same < n && tokens[same] == ref_tokens[same]) ++same;
            r[k].free_match += same;
            r[k].free_total += n;
        }
    }
    rows.push_back(r[0]);
    rows.push_back(r[1]);
}

struct Budget {
    std::string dtype;
    int num_blocks;
    long preemptions, recomputed;
};

// The overload workload (24 requests x (32 + 96) tokens) at the byte budget of
// 40 f32 blocks: how many blocks each dtype gets, and what that does.
Budget run_budget(const pkv::Model& m, pkv::KVDtype dtype) {
    pkv::EngineConfig ec;
    ec.block_size = 16;
    ec.kv_dtype = dtype;
    ec.kv_cache_bytes = 40 * pkv::KVGeometry{m.cfg.n_layers, 1, 16, m.cfg.n_kv_heads, m.cfg.head_dim(), pkv::KVDtype::kF32}.bytes_per_block();
    ec.sched.max_num_seqs = 16;
    ec.log_interval_s = 0;
    pkv::StepClock clock;
    pkv::Engine eng(std::make_unique<pkv::CpuRunner>(m), ec, &clock);
    pkv::SamplingParams sp;
    sp.max_tokens = 96;
    sp.ignore_eos = true;
    for (int i = 0; i < 24; ++i) {
        std::vector<int32_t> prompt(32);
        for (int j = 0; j < 32; ++j) prompt[j] = j == 0 ? 1 : 3 + (i * 31 + j * 17) % (m.cfg.vocab_size - 3);
        eng.add_request(prompt, sp);
    }
    eng.run_until_done();
    return {pkv::to_string(dtype), eng.config().num_blocks, eng.metrics().num_preemptions_total, eng.metrics().recomputed_tokens_total};
}

}  // namespace

int run(int argc, char** argv) {
    int n = 48;
    bool json = false;
    cli::Parser p("kv_dtype_study", "[options]",
                  "Cost of f16 and int8 KV caches against f32 (max logit difference, greedy agreement)\n"
                  "on the built-in model and stories260K (when ../shared/models or $PAGEDKV_MODELS has it),\n"
                  "and what each buys at the same byte budget on the overload workload.");
    p.integer("--tokens", &n, 1, 400, "generated tokens per prompt");
    p.flag("--json", &json, "one JSON object on stdout instead of the table");
    p.parse(argc, argv);

    std::vector<Row> rows;
    pkv::ModelAndTokenizer builtin = pkv::load_model_and_tokenizer("", "");
    study_model("built-in", builtin.model, builtin.tok, n, rows);
    const char* env = std::getenv("PAGEDKV_MODELS");
    const std::string dir = env ? env : "../shared/models";
    std::string skipped;
    try {
        pkv::ModelAndTokenizer s = pkv::load_model_and_tokenizer(dir + "/stories260K.bin", dir + "/tok512.bin");
        study_model("stories260K", s.model, s.tok, n, rows);
    } catch (const pkv::FileError& e) {
        skipped = e.what();
    }
    std::vector<Budget> budgets;
    for (pkv::KVDtype dt : {pkv::KVDtype::kF32, pkv::KVDtype::kF16, pkv::KVDtype::kInt8}) budgets.push_back(run_budget(builtin.model, dt));

    if (json) {
        std::printf("{\"tokens_per_prompt\":%d,\"prompts\":%zu,\"cost\":[", n, sizeof(kPrompts) / sizeof(kPrompts[0]));
        for (size_t i = 0; i < rows.size(); ++i)
            std::printf("%s{\"model\":\"%s\",\"dtype\":\"%s\",\"max_logit_diff\":%.6g,\"greedy_agreement\":%.6f,\"free_running_match\":%.6f}",
                        i ? "," : "", rows[i].model.c_str(), rows[i].dtype.c_str(), rows[i].max_logit_diff,
                        (double)rows[i].agree / rows[i].positions, (double)rows[i].free_match / rows[i].free_total);
        std::printf("],\"budget\":[");
        for (size_t i = 0; i < budgets.size(); ++i)
            std::printf("%s{\"dtype\":\"%s\",\"num_blocks\":%d,\"preemptions\":%ld,\"recomputed_tokens\":%ld}", i ? "," : "",
                        budgets[i].dtype.c_str(), budgets[i].num_blocks, budgets[i].preemptions, budgets[i].recomputed);
        std::printf("]}\n");
        return 0;
    }
    std::printf("What a smaller KV cache dtype costs (vs f32; %zu prompts x %d greedy tokens, teacher-forced on f32's tokens)\n\n",
                sizeof(kPrompts) / sizeof(kPrompts[0]), n);
    std::printf("  %-12s %-5s  %16s  %18s  %22s\n", "model", "dtype", "max |dlogit|", "greedy agreement", "free-running match");
    for (const Row& r : rows)
        std::printf("  %-12s %-5s  %16.3g  %17.2f%%  %21.2f%%\n", r.model.c_str(), r.dtype.c_str(), r.max_logit_diff,
                    100.0 * r.agree / r.positions, 100.0 * r.free_match / r.free_total);
    if (!skipped.empty()) std::printf("  (stories260K skipped: %s)\n", skipped.c_str());
    std::printf("\nWhat it buys: the overload workload (24 x (32 + 96) tokens, built-in model) at the byte budget of 40 f32 blocks\n\n");
    std::printf("  %-5s  %10s  %12s  %18s\n", "dtype", "blocks", "preemptions", "recomputed tokens");
    for (const Budget& b : budgets) std::printf("  %-5s  %10d  %12ld  %18ld\n", b.dtype.c_str(), b.num_blocks, b.preemptions, b.recomputed);
    return 0;
}

int main(int argc, char** argv) { return cli::guarded_main("kv_dtype_study", [&] { return run(argc, argv); }); }

// tests/test_model.cpp -- the model, the tokenizer, the sampler and the files
// they are loaded from.
//
//   - the paged forward against a plain llama2.c run.c-style forward written
//     here, with a contiguous [layer][pos][kv_dim] cache (bit for bit);
//   - batch invariance: a token's logits do not depend on what else is in the
//     batch, how the prompt is chunked, or where its blocks are (bit for bit);
//   - checkpoint save/load round trips, and every corrupt-file case;
//   - tokenizer round trips (built-in vocabulary, and tok512.bin when present);
//   - stories260K through build/generate against llama2.c's recorded output;
//   - sampler edge cases.
//
// Real model files are read from ../shared/models (override with
// PAGEDKV_MODELS=dir); the tests that need them skip with a MESSAGE otherwise.
#include <doctest/doctest.h>

#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "paged_kv.cuh"
#include "tiny_model/forward_cpu.hpp"
#include "tiny_model/model.hpp"
#include "tiny_model/sampler.hpp"
#include "tiny_model/builtin.hpp"
#include "tiny_model/tokenizer.hpp"

#include "tests/test_util.hpp"

namespace {

using namespace pkv_test;

namespace fs = std::filesystem;

// ---------------------------------------------------------------------------
// Files
// ---------------------------------------------------------------------------

// A unique path under the system temp directory, removed when it goes out of scope.
struct TempFile {
    fs::path path;
    explicit TempFile(const std::string& tag) {
        static std::atomic<int> counter{0};
        path = fs::temp_directory_path() /
               ("pagedkv_test_model_" + std::to_string((long)::getpid()) + "_" + std::to_string(counter++) + "_" + tag);
        std::error_code ec;
        fs::remove(path, ec);
    }
    ~TempFile() {
        std::error_code ec;
        fs::remove(path, ec);
    }
    TempFile(const TempFile&) = delete;
    TempFile& operator=(const TempFile&) = delete;
    std::string str() const { return path.string(); }
};

void write_bytes(const std::string& path, const std::string& bytes) {
    std::ofstream f(path, std::ios::binary | std::ios::trunc);
    REQUIRE(f.good());
    f.write(bytes.data(), (std::streamsize)bytes.size());
    REQUIRE(f.good());
}

std::string read_bytes(const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    REQUIRE(f.good());
    return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

// A tensor's floats as a vector, for first_bit_diff.
std::vector<float> to_vector(const pkv::Tensor& t) { return std::vector<float>(t.begin(), t.end()); }

template <class T>
void append_pod(std::string& s, T v) {
    char buf[sizeof(T)];
    std::memcpy(buf, &v, sizeof(T));
    s.append(buf, sizeof(T));
}

// Calls f and checks that it throws pkv::FileError whose message names `path`
// and contains `problem`.
void check_file_error(const std::function<void()>& f, const std::string& path, const std::string& problem) {
    INFO("expecting FileError for " << path << " containing '" << problem << "'");
    bool threw = false;
    try {
        f();
    } catch (const pkv::FileError& e) {
        threw = true;
        const std::string what = e.what();
        CHECK_MESSAGE(what.find(path) != std::string::npos, "message does not name the file: " << what);
        CHECK_MESSAGE(what.find(problem) != std::string::npos, "message does not say the problem: " << what);
    } catch (const std::exception& e) {
        threw = true;
        FAIL_CHECK("threw something other than FileError: " << e.what());
    }
    CHECK_MESSAGE(threw, "nothing was thrown");
}

// ---------------------------------------------------------------------------
// The oracle: llama2.c run.c's forward(), written out plainly
// ---------------------------------------------------------------------------
//
// One token at a time, one sequence, K/V in contiguous arrays
// key_cache[layer][pos][kv_dim]. Every operation is done in the same order as
// the paged forward (matmul rows through pkv::dot, RoPE through pkv::rope, the
// attention dot sequential over head_dim, two-pass softmax, values accumulated
// in position order), so the two agree to the bit. The cache starts as NaN: a
// read of any position that was not written shows up in the logits.
struct ContiguousRef {
    const pkv::Model& m;
    int D, KV, H, hd, kv_mul, S;
    std::vector<float> key_cache, value_cache;  // [n_layers, seq_len, kv_dim]
    std::vector<float> x, xb, xb2, q, hb, hb2, att, logits;

    explicit ContiguousRef(const pkv::Model& model) : m(model) {
        const pkv::Config& c = m.cfg;
        D = c.dim;
        KV = c.kv_dim();
        H = c.hidden_dim;
        hd = c.head_dim();
        kv_mul = c.n_heads / c.n_kv_heads;
        S = c.seq_len;
        key_cache.assign((size_t)c.n_layers * S * KV, NAN);
        value_cache.assign(key_cache.size(), NAN);
        x.resize(D);
        xb.resize(D);
        xb2.resize(D);
        q.resize(D);
        hb.resize(H);
        hb2.resize(H);
        att.resize((size_t)c.n_heads * S);
        logits.resize(c.vocab_size);
    }

    // rmsnorm and softmax are transcribed from run.c again here, on purpose,
    // not called from forward_cpu.hpp and sampler.hpp: an oracle that shares
    // the code it checks would agree with any bug in it. (matmul calls dot():
    // run.c sums in index order, and dot()'s order is the one we promise.)
    static void rmsnorm(float* o, const float* x, const float* weight, int n) {
        float ss = 0.0f;
        for (int j = 0; j < n; ++j) ss += x[j] * x[j];
        ss /= n;
        ss += 1e-5f;
        ss = 1.0f / std::sqrt(ss);
        for (int j = 0; j < n; ++j) o[j] = weight[j] * (ss * x[j]);
    }
    // W [d][n] times x [n] -> out [d]
    static void matmul(float* out, const float* x, const float* W, int n, int d) {
        for (int i = 0; i < d; ++i) out[i] = pkv::dot(W + (size_t)i * n, x, n);
    }
    static void softmax(float* x, int n) {
        float max_val = x[0];
        for (int i = 1; i < n; ++i)
            if (x[i] > max_val) max_val = x[i];
        float sum = 0.0f;
        for (int i = 0; i < n; ++i) {
            x[i] = std::exp(x[i] - max_val);
            sum += x[i];
        }
        for (int i = 0; i < n; ++i) x[i] /= sum;
    }

    const std::vector<float>& forward(int token, int pos) {
        const pkv::Config& c = m.cfg;
        const pkv::Weights& w = m.w;
        std::copy_n(w.token_embedding.data() + (size_t)token * D, D, x.data());
        for (int l = 0; l < c.n_layers; ++l) {
            rmsnorm(xb.data(), x.data(), &w.rms_att[(size_t)l * D], D);
            const size_t loff = (size_t)l * S * KV;
            float* k = &key_cache[loff + (size_t)pos * KV];
            float* v = &value_cache[loff + (size_t)pos * KV];
            matmul(q.data(), xb.data(), &w.wq[(size_t)l * D * D], D, D);
            matmul(k, xb.data(), &w.wk[(size_t)l * KV * D], D, KV);
            matmul(v, xb.data(), &w.wv[(size_t)l * KV * D], D, KV);
            pkv::rope(q.data(), D, hd, pos);
            pkv::rope(k, KV, hd, pos);
            for (int h = 0; h < c.n_heads; ++h) {
                const float* qh = &q[(size_t)h * hd];
                float* a = &att[(size_t)h * S];
                for (int t = 0; t <= pos; ++t) {
                    const float* kt = &key_cache[loff + (size_t)t * KV + (size_t)(h / kv_mul) * hd];
                    float score = 0.0f;
                    for (int i = 0; i < hd; ++i) score += qh[i] * kt[i];
                    a[t] = score / std::sqrt((float)hd);
                }
                softmax(a, pos + 1);
                float* xbh = &xb[(size_t)h * hd];
                std::fill_n(xbh, hd, 0.0f);
                for (int t = 0; t <= pos; ++t) {
                    const float* vt = &value_cache[loff + (size_t)t * KV + (size_t)(h / kv_mul) * hd];
                    for (int i = 0; i < hd; ++i) xbh[i] += a[t] * vt[i];
                }
            }
            matmul(xb2.data(), xb.data(), &w.wo[(size_t)l * D * D], D, D);
            for (int i = 0; i < D; ++i) x[i] += xb2[i];
            rmsnorm(xb.data(), x.data(), &w.rms_ffn[(size_t)l * D], D);
            matmul(hb.data(), xb.data(), &w.w1[(size_t)l * H * D], D, H);
            matmul(hb2.data(), xb.data(), &w.w3[(size_t)l * H * D], D, H);
            for (int i = 0; i < H; ++i) {
                float val = hb[i];
                val *= (1.0f / (1.0f + std::exp(-val)));
                hb[i] = val * hb2[i];
            }
            matmul(xb.data(), hb.data(), &w.w2[(size_t)l * D * H], H, D);
            for (int i = 0; i < D; ++i) x[i] += xb[i];
        }
        rmsnorm(x.data(), x.data(), w.rms_final.data(), D);
        matmul(logits.data(), x.data(), m.classifier(), D, c.vocab_size);
        return logits;
    }
};

// ---------------------------------------------------------------------------
// Paged helpers
// ---------------------------------------------------------------------------

pkv::KVCache nan_cache(const pkv::Config& c, int num_blocks, int block_size) {
    pkv::KVCache cache(pkv::KVGeometry{c.n_layers, num_blocks, block_size, c.n_kv_heads, c.head_dim()});
    // Every f32 element NaN: a read of a slot nobody wrote poisons the result.
    const float nan = NAN;
    for (size_t i = 0; i + sizeof(float) <= cache.k.size(); i += sizeof(float)) {
        std::memcpy(cache.k.data() + i, &nan, sizeof(float));
        std::memcpy(cache.v.data() + i, &nan, sizeof(float));
    }
    return cache;
}

// Logits at every position of `tokens` through the paged forward: a prefill of
// the first `prefill` tokens (all their logits), then one decode per token.
// Blocks come from a shuffled pool; the table is checked to be scattered.
std::vector<float> paged_logits(const pkv::Model& m, const std::vector<int32_t>& tokens, int block_size, int prefill,
                                uint64_t shuffle_seed) {
    const int n = (int)tokens.size(), V = m.cfg.vocab_size;
    const int num_blocks = 2 * pkv::blocks_for_tokens(n, block_size) + 3;
    pkv::BlockPool pool = shuffled_pool(num_blocks, block_size, shuffle_seed);
    pkv::KVCache cache = nan_cache(m.cfg, num_blocks, block_size);
    pkv::CpuForward fwd(m, cache);
    Seq s{tokens, {}, 0};
    std::vector<float> all((size_t)n * V), logits;
    {
        pkv::ForwardBatch b;
        add_chunk(b, pool, s, prefill, true);
        fwd.forward(b, logits);
        REQUIRE(logits.size() == (size_t)prefill * V);
        std::copy(logits.begin(), logits.end(), all.begin());
    }
    for (int p = prefill; p < n; ++p) {
        pkv::ForwardBatch b;
        add_chunk(b, pool, s, 1, false);
        fwd.forward(b, logits);
        REQUIRE(logits.size() == (size_t)V);
        std::copy(logits.begin(), logits.end(), all.begin() + (size_t)p * V);
    }
    CHECK(check_invariants(pool, {&s.table.blocks}) == "");
    if (s.table.blocks.size() > 2) CHECK_FALSE(std::is_sorted(s.table.blocks.begin(), s.table.blocks.end()));
    return all;
}

std::vector<float> reference_logits(const pkv::Model& m, const std::vector<int32_t>& tokens) {
    ContiguousRef ref(m);
    const int V = m.cfg.vocab_size;
    std::vector<float> all(tokens.size() * (size_t)V);
    for (size_t p = 0; p < tokens.size(); ++p) {
        const auto& l = ref.forward(tokens[p], (int)p);
        std::copy(l.begin(), l.end(), all.begin() + p * V);
    }
    return all;
}

// Greedy continuation of `prompt` through the paged forward: the prompt is
// prefilled in one batch, then one decode per new token. Returns up to
// `num_new` generated token ids, stopping early (like run.c) if the model says
// BOS. The last token is sampled but never fed back.
std::vector<int> greedy_paged(const pkv::Model& m, const std::vector<int>& prompt, int num_new, int block_size) {
    const int num_blocks = pkv::blocks_for_tokens((int)prompt.size() + num_new, block_size);
    pkv::BlockPool pool(num_blocks, block_size, false);
    pkv::KVCache cache = nan_cache(m.cfg, num_blocks, block_size);
    pkv::CpuForward fwd(m, cache);
    Seq s{std::vector<int32_t>(prompt.begin(), prompt.end()), {}, 0};
    std::vector<float> logits;
    pkv::ForwardBatch b0;
    add_chunk(b0, pool, s, (int)prompt.size(), false);
    fwd.forward(b0, logits);
    std::vector<int> out;
    while ((int)out.size() < num_new) {
        const int next = pkv::argmax(logits.data(), m.cfg.vocab_size);
        if (next == pkv::kBosId) break;
        out.push_back(next);
        s.tokens.push_back(next);
        if ((int)out.size() == num_new) break;
        pkv::ForwardBatch b;
        add_chunk(b, pool, s, 1, false);
        fwd.forward(b, logits);
    }
    CHECK(check_invariants(pool, {&s.table.blocks}) == "");
    return out;
}

// What decode(encode(s)) must give, derived from run.c's rules independently of
// the BPE merges: each UTF-8 code point that is a multi-byte vocabulary piece
// prints whole; anything else prints byte by byte, where safe_printf drops a
// lone byte that is neither printable nor whitespace in the C locale (every
// byte >= 0x80 among them). Merged pieces print verbatim, and the dummy-prefix
// space that encode adds is exactly the one render() strips after BOS.
std::string expected_roundtrip(const pkv::Tokenizer& tok, const std::string& text) {
    std::string out;
    for (size_t i = 0; i < text.size();) {
        size_t len = 1;
        while (i + len < text.size() && len < 4 && ((unsigned char)text[i + len] & 0xC0) == 0x80) ++len;
        const std::string cp = text.substr(i, len);
        if (cp.size() > 1 && tok.lookup(cp) >= 0) out += cp;
        else
            for (unsigned char b : cp)
                if (std::isprint(b) || std::isspace(b)) out += (char)b;
        i += len;
    }
    return out;
}

// decode(encode(s)) == expected_roundtrip(s) for 300 random strings of 1..24
// bytes, a quarter of them arbitrary (0..255) and the rest printable ASCII.
void check_random_roundtrips(const pkv::Tokenizer& tok, uint64_t seed) {
    Rng r(seed);
    for (int i = 0; i < 300; ++i) {
        std::string s;
        const int len = 1 + r.below(24);
        for (int j = 0; j < len; ++j) s += (char)(r.below(4) == 0 ? r.below(256) : 32 + r.below(95));
        INFO("random text #" << i);
        CHECK(tok.decode(tok.encode(s)) == expected_roundtrip(tok, s));
    }
}

}  // namespace

TEST_SUITE("model") {

// ===========================================================================
// 1. Paged forward == contiguous run.c-style forward
// ===========================================================================

// Proves the paged forward (scattered block tables, prefill + decode) computes bit-identical logits to a plain contiguous-cache run.c forward, on the built-in model.
TEST_CASE("paged forward matches a contiguous run.c forward on the built-in model") {
    const pkv::ModelAndTokenizer mt = pkv::load_model_and_tokenizer("", "");
    const pkv::Model& m = mt.model;
    REQUIRE(m.cfg.problem() == "");
    CHECK_FALSE(m.cfg.shared_classifier);
    CHECK(m.cfg.n_kv_heads < m.cfg.n_heads);  // GQA path exercised

    // A realistic sequence: a prompt and the reference's own greedy continuation.
    std::vector<int> prompt = mt.tok.encode("once upon a time there was a little dog");
    std::vector<int32_t> tokens(prompt.begin(), prompt.end());
    {
        ContiguousRef ref(m);
        for (int p = 0; p < 60; ++p) {
            const auto& l = ref.forward(tokens[(size_t)p], p);
            if (p + 1 >= (int)tokens.size()) tokens.push_back(pkv::argmax(l.data(), m.cfg.vocab_size));
        }
    }
    REQUIRE(tokens.size() == 61);
    tokens.pop_back();

    const std::vector<float> want = reference_logits(m, tokens);
    REQUIRE(all_finite(want));
    for (int block_size : {1, 3, 16}) {
        INFO("block_size " << block_size);
        const std::vector<float> got = paged_logits(m, tokens, block_size, (int)prompt.size(), 1000 + block_size);
        CHECK(first_bit_diff(want, got) == -1);
    }
}

// Proves paged == contiguous bit for bit on a different shape (dim 48, 6 heads, 2 kv heads, hidden 100: dot tails, GQA 3:1) with shared and separate classifiers, up to the last position seq_len-1, with block tables allocated from a shuffled pool and with a hand-made random permutation.
TEST_CASE("paged forward matches a contiguous run.c forward on small random models") {
    for (bool shared : {true, false}) {
        INFO("shared_classifier " << shared);
        const pkv::Config c = small_config(shared);
        REQUIRE(c.problem() == "");
        const pkv::Model m = pkv::make_random_model(c, shared ? 7 : 8);
        CHECK(m.w.wcls.empty() == shared);
        const std::vector<int32_t> tokens = random_tokens(c.seq_len, c.vocab_size, 99);
        const std::vector<float> want = reference_logits(m, tokens);
        REQUIRE(all_finite(want));

        // Tables from a shuffled pool: prefill 50, decode the rest.
        for (int block_size : {4, 5}) {
            INFO("block_size " << block_size);
            CHECK(first_bit_diff(want, paged_logits(m, tokens, block_size, 50, 77)) == -1);
        }

        // A hand-made table: a random subset of a larger cache, in random order,
        // whole sequence in one prefill.
        const int bs = 6, need = pkv::blocks_for_tokens(c.seq_len, bs), num_blocks = 3 * need;
        std::vector<int32_t> perm((size_t)num_blocks);
        for (int i = 0; i < num_blocks; ++i) perm[(size_t)i] = i;
        Rng r(5);
        shuffle(perm, r);
        perm.resize((size_t)need);
        pkv::KVCache cache = nan_cache(c, num_blocks, bs);
        pkv::CpuForward fwd(m, cache);
        pkv::ForwardBatch b;
        b.add_sequence(perm, bs, tokens.data(), 0, c.seq_len, false);
        for (int i = 0; i < c.seq_len; ++i) b.logits_indices.push_back(i);
        std::vector<float> got;
        fwd.forward(b, got);
        CHECK(first_bit_diff(want, got) == -1);
    }
}

// ===========================================================================
// 2. Batch invariance
// ===========================================================================

// Proves a token's logits are bit-identical whether computed by one-at-a-time decodes, inside one 100-token prefill, or in chunks inside mixed batches beside other sequences' prefills and decodes in various orders and block sizes.
TEST_CASE("logits are batch invariant, bit for bit") {
    const pkv::ModelAndTokenizer mt = pkv::load_model_and_tokenizer("", "");
    const pkv::Model& m = mt.model;
    const int V = m.cfg.vocab_size, N = 100;
    const std::vector<int32_t> seq_a = random_tokens(N, V, 1);

    // (a) alone, decode steps one at a time.
    const std::vector<float> alone = paged_logits(m, seq_a, 16, 1, 11);
    REQUIRE(alone.size() == (size_t)N * V);
    REQUIRE(all_finite(alone));

    // (b) one 100-token prefill, logits for every position.
    CHECK(first_bit_diff(alone, paged_logits(m, seq_a, 7, N, 12)) == -1);
#ifdef _OPENMP
    // (b') the same prefill with a different number of OpenMP threads.
    {
        struct RestoreThreads {
            int n = omp_get_max_threads();
            ~RestoreThreads() { omp_set_num_threads(n); }
        } restore;
        omp_set_num_threads(restore.n > 1 ? 1 : 2);
        CHECK(first_bit_diff(alone, paged_logits(m, seq_a, 7, N, 13)) == -1);
    }
#endif

    // (c) mixed batches. A plan is a list of steps; a step is a list of
    // (sequence, number of tokens) in batch order. Sequence 0 is A; 1..3 are
    // other sequences whose prefill chunks and decodes share A's batches.
    using Step = std::vector<std::pair<int, int>>;
    struct Plan {
        const char* name;
        int block_size;
        std::vector<Step> steps;
    };
    const std::vector<Plan> plans = {
        {"B prefill beside A; decodes around A's chunks", 16,
         {{{1, 30}, {0, 37}}, {{2, 7}, {0, 1}, {1, 1}}, {{1, 1}, {2, 1}, {0, 25}}, {{0, 37}, {2, 1}, {1, 1}}}},
        {"same chunks, every batch in reverse order", 16,
         {{{0, 37}, {1, 30}}, {{1, 1}, {0, 1}, {2, 7}}, {{0, 25}, {2, 1}, {1, 1}}, {{1, 1}, {2, 1}, {0, 37}}}},
        {"other chunking, block size 5, four sequences", 5,
         {{{0, 10}}, {{3, 3}, {1, 20}, {0, 40}, {2, 1}}, {{2, 1}, {0, 49}, {3, 1}, {1, 1}}, {{1, 1}, {3, 1}, {0, 1}, {2, 1}}}},
    };
    for (const Plan& plan : plans) {
        INFO("plan: " << plan.name);
        const int num_blocks = 4 * pkv::blocks_for_tokens(N, plan.block_size) + 8;
        pkv::BlockPool pool = shuffled_pool(num_blocks, plan.block_size, 21);
        pkv::KVCache cache = nan_cache(m.cfg, num_blocks, plan.block_size);
        pkv::CpuForward fwd(m, cache);
        std::vector<Seq> seqs(4);
        seqs[0].tokens = seq_a;
        for (int i = 1; i < 4; ++i) seqs[(size_t)i].tokens = random_tokens(64, V, 100 + i);
        std::vector<float> mixed((size_t)N * V), logits;
        int batches_with_others = 0;
        for (const Step& step : plan.steps) {
            pkv::ForwardBatch b;
            int a_row = -1, a_first = 0, a_n = 0;
            for (auto [seq, n] : step) {
                if (seq == 0) {
                    a_first = seqs[0].done;
                    a_n = n;
                    a_row = add_chunk(b, pool, seqs[0], n, true);
                } else {
                    add_chunk(b, pool, seqs[(size_t)seq], n, false);
                }
            }
            if (a_row >= 0 && step.size() > 1) ++batches_with_others;
            fwd.forward(b, logits);
            REQUIRE(logits.size() == b.logits_indices.size() * (size_t)V);
            if (a_row >= 0)
                std::copy_n(logits.begin() + (size_t)a_row * V, (size_t)a_n * V, mixed.begin() + (size_t)a_first * V);
            std::vector<const std::vector<int32_t>*> tables;
            for (const Seq& s : seqs) tables.push_back(&s.table.blocks);
            CHECK(check_invariants(pool, tables) == "");
        }
        REQUIRE(seqs[0].done == N);
        CHECK(batches_with_others >= 3);
        CHECK(first_bit_diff(alone, mixed) == -1);
    }
}

// ===========================================================================
// 3. Checkpoint round trip
// ===========================================================================

// Proves save_checkpoint + load_checkpoint reproduce the config and every weight bit for bit (shared and separate classifier), write llama2.c's header sign convention and RoPE tables, and give identical logits.
TEST_CASE("checkpoint save/load round trip") {
    for (bool shared : {true, false}) {
        INFO("shared_classifier " << shared);
        const pkv::Config c = small_config(shared);
        const pkv::Model m = pkv::make_random_model(c, 31);
        TempFile file(shared ? "shared.bin" : "separate.bin");
        pkv::save_checkpoint(file.str(), m);

        // The file: header with vocab_size negative for a separate classifier,
        // exactly the expected size, RoPE tables after rms_final.
        const std::string bytes = read_bytes(file.str());
        const size_t L = c.n_layers, D = c.dim, H = c.hidden_dim, KV = c.kv_dim(), V = c.vocab_size;
        const size_t half = c.head_dim() / 2, rope = (size_t)c.seq_len * half;
        const size_t before_rope = V * D + L * D + L * D * D + 2 * L * KV * D + L * D * D + L * D + 3 * L * H * D + D;
        const size_t floats = before_rope + 2 * rope + (shared ? 0 : V * D);
        REQUIRE(bytes.size() == 28 + 4 * floats);
        int32_t hdr[7];
        std::memcpy(hdr, bytes.data(), sizeof hdr);
        CHECK(hdr[0] == c.dim);
        CHECK(hdr[1] == c.hidden_dim);
        CHECK(hdr[2] == c.n_layers);
        CHECK(hdr[3] == c.n_heads);
        CHECK(hdr[4] == c.n_kv_heads);
        CHECK(hdr[5] == (shared ? c.vocab_size : -c.vocab_size));
        CHECK(hdr[6] == c.seq_len);
        float cos_p1_i0, sin_p1_i0;  // position 1, pair 0: angle 1 radian
        std::memcpy(&cos_p1_i0, bytes.data() + 28 + 4 * (before_rope + half), 4);
        std::memcpy(&sin_p1_i0, bytes.data() + 28 + 4 * (before_rope + rope + half), 4);
        CHECK(cos_p1_i0 == doctest::Approx(std::cos(1.0)).epsilon(1e-6));
        CHECK(sin_p1_i0 == doctest::Approx(std::sin(1.0)).epsilon(1e-6));

        const pkv::Model back = pkv::load_checkpoint(file.str());
        CHECK(back.cfg.dim == c.dim);
        CHECK(back.cfg.hidden_dim == c.hidden_dim);
        CHECK(back.cfg.n_layers == c.n_layers);
        CHECK(back.cfg.n_heads == c.n_heads);
        CHECK(back.cfg.n_kv_heads == c.n_kv_heads);
        CHECK(back.cfg.vocab_size == c.vocab_size);
        CHECK(back.cfg.seq_len == c.seq_len);
        CHECK(back.cfg.shared_classifier == shared);
        const std::pair<const char*, pkv::Tensor pkv::Weights::*> fields[] = {
            {"token_embedding", &pkv::Weights::token_embedding}, {"rms_att", &pkv::Weights::rms_att},
            {"wq", &pkv::Weights::wq}, {"wk", &pkv::Weights::wk}, {"wv", &pkv::Weights::wv}, {"wo", &pkv::Weights::wo},
            {"rms_ffn", &pkv::Weights::rms_ffn}, {"w1", &pkv::Weights::w1}, {"w2", &pkv::Weights::w2},
            {"w3", &pkv::Weights::w3}, {"rms_final", &pkv::Weights::rms_final}, {"wcls", &pkv::Weights::wcls},
        };
        for (const auto& f : fields) {
            INFO("tensor " << f.first);
            CHECK(first_bit_diff(to_vector(m.w.*f.second), to_vector(back.w.*f.second)) == -1);
            // Loaded tensors are windows into the mapped file; the random model's are its own.
            CHECK((back.w.*f.second).mapped() == !(back.w.*f.second).empty());
            CHECK(!(m.w.*f.second).mapped());
        }
        CHECK(back.w.wcls.empty() == shared);

        const std::vector<int32_t> tokens = random_tokens(20, c.vocab_size, 3);
        const std::vector<float> a = paged_logits(m, tokens, 4, 8, 1), b = paged_logits(back, tokens, 4, 8, 1);
        REQUIRE(all_finite(a));
        CHECK(first_bit_diff(a, b) == -1);

        // Saving the loaded model writes the very same bytes.
        TempFile again("again.bin");
        pkv::save_checkpoint(again.str(), back);
        CHECK((read_bytes(again.str()) == bytes));

        // Even over the very file it is mapped from: save_checkpoint writes a
        // new file and renames it over the old, so `back` keeps reading the
        // old one's bytes (writing into the mapped file would cut its pages
        // from under us: a SIGBUS, not an error message).
        pkv::save_checkpoint(file.str(), back);
        CHECK((read_bytes(file.str()) == bytes));
        CHECK(first_bit_diff(paged_logits(back, tokens, 4, 8, 1), a) == -1);
        CHECK(!fs::exists(file.str() + ".tmp"));

        // A copy of a loaded model outlives the file and the model it was copied from.
        std::unique_ptr<pkv::Model> loaded = std::make_unique<pkv::Model>(pkv::load_checkpoint(again.str()));
        const pkv::Model copy = *loaded;
        loaded.reset();
        fs::remove(again.str());
        CHECK(first_bit_diff(paged_logits(copy, tokens, 4, 8, 1), a) == -1);

        // Editing a loaded model copies the tensor first (vec()) and leaves the file alone.
        pkv::Model edited = back;
        edited.w.rms_final.vec()[0] += 1.0f;
        CHECK(!edited.w.rms_final.mapped());
        CHECK(back.w.rms_final.mapped());
        CHECK(back.w.rms_final[0] == m.w.rms_final[0]);
        CHECK((read_bytes(file.str()) == bytes));
    }
}

// Proves save_checkpoint refuses a model whose config is unusable or whose tensors do not fit the config, naming the file.
TEST_CASE("save_checkpoint refuses inconsistent models") {
    TempFile file("refused.bin");
    pkv::Model m = pkv::make_random_model(small_config(true), 1);
    pkv::Model bad_cfg = m;
    bad_cfg.cfg.n_kv_heads = 4;
    check_file_error([&] { pkv::save_checkpoint(file.str(), bad_cfg); }, file.str(), "not divisible by n_kv_heads");
    pkv::Model bad_tensor = m;
    bad_tensor.w.wq.vec().pop_back();
    check_file_error([&] { pkv::save_checkpoint(file.str(), bad_tensor); }, file.str(), "wrong size");
}

// ===========================================================================
// 4. Corrupt files
// ===========================================================================

// Proves every malformed checkpoint (missing, empty, truncated header or data, trailing bytes, bad or absurd header sizes) throws FileError naming the file and the problem, without allocating for absurd headers.
TEST_CASE("corrupt checkpoints throw FileError naming the file and the problem") {
    const pkv::Config c = config_of(8, 12, 1, 2, 1, 5, 4, false);  // its header is `ok` below
    TempFile good("good.bin");
    pkv::save_checkpoint(good.str(), pkv::make_random_model(c, 2));
    const std::string valid = read_bytes(good.str());
    CHECK(pkv::load_checkpoint(good.str()).cfg.vocab_size == 5);

    TempFile f("corrupt.bin");
    const std::string p = f.str();
    auto load = [&] { (void)pkv::load_checkpoint(p); };
    auto with = [&](const std::string& bytes, const std::string& problem) {
        write_bytes(p, bytes);
        check_file_error(load, p, problem);
    };

    check_file_error(load, p, "no such checkpoint file");  // does not exist yet
    with("", "truncated checkpoint (0 bytes");
    with(valid.substr(0, 27), "truncated checkpoint (27 bytes");
    with(valid.substr(0, 28), "does not match its header");
    with(valid.substr(0, valid.size() - 4), "does not match its header");
    with(valid.substr(0, valid.size() - 1), "does not match its header");
    with(valid + std::string(1, '\0'), "does not match its header");
    with(valid + std::string(400, 'x'), "does not match its header");

    const std::array<int32_t, 7> ok = {8, 12, 1, 2, 1, -5, 4};
    auto header = [](const std::array<int32_t, 7>& h) {
        std::string s;
        for (int32_t v : h) append_pod(s, v);
        return s;
    };
    REQUIRE(header(ok) == valid.substr(0, 28));
    const std::string body = valid.substr(28);
    for (int field = 0; field < 7; ++field) {
        for (int32_t bad : {0, -1, INT32_MIN}) {
            if (field == 5 && bad == -1) continue;  // a negative vocab_size means a separate classifier
            INFO("header field " << field << " = " << bad);
            std::array<int32_t, 7> h = ok;
            h[(size_t)field] = bad;
            with(header(h) + body, "zero or negative");
        }
    }
    with(header({10, 12, 1, 4, 1, 5, 4}) + body, "dim 10 is not divisible by n_heads 4");
    with(header({8, 12, 1, 4, 3, 5, 4}) + body, "n_heads 4 is not divisible by n_kv_heads 3");
    with(header({6, 12, 1, 2, 1, 5, 4}) + body, "head_dim 3 is odd");

    // Absurd sizes: over the plausibility limits, and (within them) a header
    // that claims ~1e18 bytes. Both must fail on the header alone, at once.
    const auto t0 = std::chrono::steady_clock::now();
    with(header({1 << 30, 12, 1, 2, 1, 5, 4}) + body, "implausibly large");
    with(header({INT32_MAX - 1, INT32_MAX, INT32_MAX, 1, 1, INT32_MAX, INT32_MAX}) + body, "implausibly large");
    with(header({8, 12, 1, 2, 1, 1 << 30, 4}) + body, "implausibly large");
    with(header({1 << 16, 1 << 18, 4096, 8, 8, -(1 << 22), 1 << 22}) + body, "does not match its header");
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    CHECK_MESSAGE(secs < 1.0, "absurd headers took " << secs << " s: did the loader allocate?");

    // A directory is not a checkpoint either.
    const std::string dir = fs::temp_directory_path().string();
    CHECK_THROWS_AS((void)pkv::load_checkpoint(dir), pkv::FileError);
}

// Proves every malformed tokenizer.bin (missing, truncated, negative or oversize token length, wrong token count) throws FileError naming the file and the problem, and a well-formed one loads exactly.
TEST_CASE("corrupt tokenizers throw FileError naming the file and the problem") {
    // A well-formed 4-token file.
    auto token = [](float score, const std::string& piece) {
        std::string s;
        append_pod(s, score);
        append_pod(s, (int32_t)piece.size());
        return s + piece;
    };
    std::string hdr;
    append_pod(hdr, (uint32_t)5);
    const std::string t0 = token(0.0f, "<unk>"), t1 = token(-1.0f, "ab"), t2 = token(2.5f, ""), t3 = token(3.0f, " x");
    const std::string valid = hdr + t0 + t1 + t2 + t3;

    TempFile f("tok.bin");
    const std::string p = f.str();
    // It loads exactly once padded to the 259 pieces that llama2.c's layout
    // needs (<unk>, <s>, </s> and the 256 byte pieces); alone it is refused.
    std::string padding;
    for (int i = 4; i < pkv::kMinVocabSize; ++i) padding += token(0.0f, "<" + std::to_string(i) + ">");
    write_bytes(p, valid + padding);
    const pkv::Tokenizer tok = pkv::Tokenizer::load(p, pkv::kMinVocabSize);
    CHECK(std::vector<std::string>(tok.vocab.begin(), tok.vocab.begin() + 4) ==
          std::vector<std::string>{"<unk>", "ab", "", " x"});
    CHECK(std::vector<float>(tok.scores.begin(), tok.scores.begin() + 4) == std::vector<float>{0.0f, -1.0f, 2.5f, 3.0f});
    CHECK(tok.lookup(" x") == 3);

    auto load4 = [&] { (void)pkv::Tokenizer::load(p, 4); };
    auto with = [&](const std::string& bytes, const std::string& problem) {
        write_bytes(p, bytes);
        check_file_error(load4, p, problem);
    };
    with(valid, "tokenizer has 4 tokens, but llama2.c's layout needs at least 259");
    with("", "truncated tokenizer (no header)");
    with(hdr.substr(0, 3), "truncated tokenizer (no header)");
    with(hdr + t0 + t1 + t2.substr(0, 4), "truncated tokenizer inside token 2");     // score, no length
    with(hdr + t0 + t1 + t2 + t3.substr(0, 6), "truncated tokenizer inside token 3");  // half a length
    with(hdr + t0.substr(0, 10), "truncated tokenizer inside token 0");                // piece cut short
    with(valid.substr(0, valid.size() - 1), "truncated tokenizer inside token 3");
    {
        std::string minus_one;  // score 1.0, length -1
        append_pod(minus_one, 1.0f);
        append_pod(minus_one, (int32_t)-1);
        with(hdr + t0 + t1 + minus_one + t3, "token 2 has length -1");
    }
    {
        std::string neg;
        append_pod(neg, 1.0f);
        append_pod(neg, INT32_MIN);
        with(hdr + neg, "token 0 has length " + std::to_string(INT32_MIN));
    }
    with(hdr + t0 + token(1.0f, "toolong"), "token 1 has length 7 (max_token_length is 5)");
    with(hdr + t0 + t1 + t2, "tokenizer has 3 tokens but the model's vocab_size is 4");
    with(valid + t3, "tokenizer has 5 tokens but the model's vocab_size is 4");
    with(hdr, "tokenizer has 0 tokens but the model's vocab_size is 4");

    TempFile missing("missing_tok.bin");
    check_file_error([&] { (void)pkv::Tokenizer::load(missing.str(), 4); }, missing.str(), "no such tokenizer file");
    // A directory opens as a stream on Linux and reports a nonsense size: it
    // must be named for what it is, for the tokenizer and the checkpoint.
    const std::string dir = std::filesystem::temp_directory_path().string();
    check_file_error([&] { (void)pkv::Tokenizer::load(dir, 4); }, dir, "is a directory, not a tokenizer file");
    check_file_error([&] { (void)pkv::load_checkpoint(dir); }, dir, "is a directory, not a checkpoint file");
}

// Proves load_model_and_tokenizer reports file problems as FileError: -z with the built-in model, and a checkpoint whose tokenizer is missing or has the wrong vocab size.
TEST_CASE("load_model_and_tokenizer rejects bad combinations") {
    check_file_error([] { (void)pkv::load_model_and_tokenizer("", "x"); }, "x", "-z needs a checkpoint");

    pkv::Config c = small_config(true);
    TempFile ckpt("lmt.bin"), tok("lmt_tok.bin"), missing("lmt_missing.bin");
    pkv::save_checkpoint(ckpt.str(), pkv::make_random_model(c, 4));
    check_file_error([&] { (void)pkv::load_model_and_tokenizer(ckpt.str(), missing.str()); }, missing.str(),
                     "no such tokenizer file");
    check_file_error([&] { (void)pkv::load_model_and_tokenizer(missing.str(), tok.str()); }, missing.str(),
                     "no such checkpoint file");

    // A tokenizer with 3 tokens for a 300-token model.
    std::string bytes;
    append_pod(bytes, (uint32_t)1);
    for (const char* piece : {"a", "b", "c"}) {
        append_pod(bytes, 0.0f);
        append_pod(bytes, (int32_t)1);
        bytes += piece;
    }
    write_bytes(tok.str(), bytes);
    check_file_error([&] { (void)pkv::load_model_and_tokenizer(ckpt.str(), tok.str()); }, tok.str(),
                     "tokenizer has 3 tokens but the model's vocab_size is 300");
}

// ===========================================================================
// 5. Tokenizer
// ===========================================================================

// Proves the built-in vocabulary's encode puts BOS and the dummy-prefix space first, makes common words single tokens, and that decode(encode(s)) == s for printable ASCII (non-ASCII bytes are dropped, as run.c's safe_printf does).
TEST_CASE("built-in tokenizer encodes words whole and round trips") {
    const pkv::BuiltinVocab bv = pkv::builtin_vocab();
    const pkv::Tokenizer& tok = bv.tok;
    REQUIRE(tok.size() == (int)bv.row_scale.size());
    CHECK(tok.vocab[0] == "<unk>");
    CHECK(tok.vocab[pkv::kBosId] == "\n<s>\n");
    CHECK(tok.vocab[pkv::kEosId] == "\n</s>\n");
    CHECK(tok.vocab[3] == "<0x00>");
    CHECK(tok.vocab[3 + 0xFF] == "<0xFF>");
    const int space = tok.lookup(" ");
    REQUIRE(space >= 0);

    // Structure of encode.
    CHECK(tok.encode("") == std::vector<int>{pkv::kBosId});
    CHECK(tok.encode("", false).empty());
    CHECK(tok.encode("the") == std::vector<int>{pkv::kBosId, tok.lookup(" the")});
    CHECK(tok.encode("the", false) == std::vector<int>{tok.lookup(" the")});
    CHECK(tok.encode("the", true, true) == std::vector<int>{pkv::kBosId, tok.lookup(" the"), pkv::kEosId});
    // The dummy prefix stays a token of its own when nothing can merge with it.
    CHECK(tok.encode("\xc3\xa9") == std::vector<int>{pkv::kBosId, space, 0xC3 + 3, 0xA9 + 3});
    CHECK(tok.encode("!") == std::vector<int>{pkv::kBosId, space, tok.lookup("!")});
    // Common words are single tokens.
    for (const char* w : {"the", "once", "upon", "time", "little", "together", "surprised"}) {
        INFO("word " << w);
        const int id = tok.lookup(std::string(" ") + w);
        REQUIRE(id >= 0);
        CHECK(bv.row_scale[(size_t)id] == 1.0f);
        CHECK(tok.encode(std::string("x ") + w).back() == id);
    }
    const std::vector<int> story = tok.encode("once upon a time");
    CHECK(story == std::vector<int>{pkv::kBosId, tok.lookup(" once"), tok.lookup(" upon"), tok.lookup(" a"),
                                    tok.lookup(" time")});
    // A word outside the vocabulary is spelled with shorter pieces.
    const std::vector<int> odd = tok.encode("xylophone");
    CHECK(odd.size() > 2);

    // decode skips BOS and strips the dummy prefix after it; without BOS the
    // dummy-prefix space is printed.
    const std::vector<std::string> texts = {
        "once upon a time",
        "Hello, World! How are you?",
        "the quick brown fox jumps over the lazy dog.",
        "xylophone zebra qwertyuiop",
        "  leading and trailing spaces  ",
        "punctuation: ;:'\"()[]{}<>/\\|`~@#$%^&*-_=+?!.,",
        "tabs\tand\nnewlines\r\n",
        "numbers 0123456789 and <0x41> literally",
        "\n<s>\n and \n</s>\n as text",
        "a",
        " ",
    };
    for (const std::string& s : texts) {
        INFO("text '" << s << "'");
        const std::vector<int> t = tok.encode(s);
        CHECK(t.front() == pkv::kBosId);
        CHECK(std::count(t.begin(), t.end(), pkv::kBosId) == 1);
        CHECK(tok.decode(t) == s);
        CHECK(tok.decode(tok.encode(s, false)) == " " + s);
        // decode == concatenated render, starting after BOS.
        std::string r;
        for (size_t i = 1; i < t.size(); ++i) r += tok.render(t[i - 1], t[i]);
        CHECK(r == s);
    }
    CHECK(tok.decode(tok.encode("the end", true, true)) == "the end\n</s>\n");

    // Non-ASCII UTF-8 has no pieces here: it is encoded as bytes and every
    // byte >= 0x80 prints as nothing (run.c's safe_printf, C locale).
    const std::string utf8 = "caf\xc3\xa9 \xe2\x80\x93 \xe6\x97\xa5\xe6\x9c\xac";  // "café – 日本"
    CHECK(tok.decode(tok.encode(utf8)) == "caf  ");
    CHECK(tok.decode(tok.encode("\x01x\x7fy")) == "xy");  // control bytes print nothing

    check_random_roundtrips(tok, 17);
    CHECK(expected_roundtrip(tok, utf8) == "caf  ");
}

// Proves llama2.c's tok512.bin loads and round trips (multi-byte pieces like "é" and "–" survive, other non-ASCII is dropped), skipping when the file is absent.
TEST_CASE("tok512.bin round trips") {
    if (!need_model_files({"tok512.bin"})) return;
    const std::string path = models_dir() + "/tok512.bin";
    const pkv::Tokenizer tok = pkv::Tokenizer::load(path, 512);
    CHECK(tok.size() == 512);
    check_file_error([&] { (void)pkv::Tokenizer::load(path, 511); }, path, "tokenizer has 512 tokens");
    CHECK(tok.vocab[pkv::kBosId] == "\n<s>\n");
    const std::vector<int> once = tok.encode("Once upon a time");
    REQUIRE(once.size() >= 2);
    CHECK(once[0] == pkv::kBosId);
    CHECK(once[1] == tok.lookup(" Once"));
    CHECK(tok.encode("the", false).front() == tok.lookup(" the"));
    for (const std::string s : {"Once upon a time", "Lily's mom said, \"Lily, let's go to the park.\"",
                                "zyzzyva QWERTY 12345 !?", "  two spaces", "tab\there\nnewline"}) {
        INFO("text '" << s << "'");
        CHECK(tok.decode(tok.encode(s)) == s);
        CHECK(tok.decode(tok.encode(s, false)) == " " + s);
    }
    const std::string utf8 = "caf\xc3\xa9 \xe2\x80\x93 \xe6\x97\xa5\xe6\x9c\xac";  // "café – 日本"
    CHECK(tok.lookup("\xc3\xa9") >= 0);
    CHECK(tok.decode(tok.encode(utf8)) == "caf\xc3\xa9 \xe2\x80\x93 ");
    check_random_roundtrips(tok, 23);
}

// ===========================================================================
// 6. stories260K: llama2.c's recorded output
// ===========================================================================

// Proves build/generate prints llama2.c run.c's greedy stories260K story byte for byte, and that block sizes 1 and 7 do not change it; skips when the model files or build/generate are absent.
TEST_CASE("stories260K through build/generate matches llama2.c") {
    const std::string dir = models_dir();
    const std::string ckpt = dir + "/stories260K.bin", tok = dir + "/tok512.bin",
                      expected_path = dir + "/stories260K.once_upon_a_time.n100.txt";
    if (!need_model_files({"stories260K.bin", "tok512.bin", "stories260K.once_upon_a_time.n100.txt"})) return;
    const std::string exe = need_program("generate");
    if (exe.empty()) return;
    const std::string expected = read_bytes(expected_path);
    REQUIRE(expected.size() > 100);
    for (const char* extra : {"", " --block-size 1", " --block-size 7", " --block-size 7 --num-blocks 40"}) {
        INFO("options:" << extra);
        const std::string cmd = shell_quote(exe) + " " + shell_quote(ckpt) + " -z " + shell_quote(tok) +
                                " -t 0 -n 100 -i \"Once upon a time\"" + extra + " 2>/dev/null";
        const auto [out, status] = run_command(cmd);
        CHECK(status == 0);
        CHECK(out == expected);
    }
}

// Proves the in-process paged forward and the contiguous reference both reproduce llama2.c's stories260K greedy text (so the oracle itself is faithful to run.c), and a stories260K checkpoint round trips; skips when the files are absent.
TEST_CASE("stories260K in process matches llama2.c") {
    const std::string dir = models_dir();
    const std::string ckpt = dir + "/stories260K.bin", tok_path = dir + "/tok512.bin",
                      expected_path = dir + "/stories260K.once_upon_a_time.n100.txt";
    if (!need_model_files({"stories260K.bin", "tok512.bin", "stories260K.once_upon_a_time.n100.txt"})) return;
    const pkv::ModelAndTokenizer mt = pkv::load_model_and_tokenizer(ckpt, tok_path);
    const pkv::Config& c = mt.model.cfg;
    CHECK(c.dim == 64);
    CHECK(c.hidden_dim == 172);
    CHECK(c.n_layers == 5);
    CHECK(c.n_heads == 8);
    CHECK(c.n_kv_heads == 4);
    CHECK(c.vocab_size == 512);
    CHECK(c.seq_len == 512);
    CHECK(c.shared_classifier);
    const std::string expected = read_bytes(expected_path);
    const std::vector<int> prompt = mt.tok.encode("Once upon a time");
    // run.c's -n 100: positions 0..99 are forwarded, each yielding the next
    // token, so the tokens after the prompt number 100 - (prompt size - 1).
    const int steps = 100, num_new = steps - (int)prompt.size() + 1;

    // Text as generate prints it: the prompt after BOS, the continuation, "\n".
    auto text_of = [&](const std::vector<int>& gen) {
        std::vector<int> all = prompt;
        all.insert(all.end(), gen.begin(), gen.end());
        std::string s;
        for (size_t i = 1; i < all.size(); ++i) s += mt.tok.render(all[i - 1], all[i]);
        return s + "\n";
    };
    for (int bs : {16, 3}) {
        INFO("block_size " << bs);
        CHECK(text_of(greedy_paged(mt.model, prompt, num_new, bs)) == expected);
    }
    {
        ContiguousRef ref(mt.model);
        std::vector<int> gen;
        std::vector<int> seq = prompt;
        for (int pos = 0; pos < steps; ++pos) {
            const auto& l = ref.forward(seq[(size_t)pos], pos);
            if (pos + 1 < (int)seq.size()) continue;
            const int next = pkv::argmax(l.data(), c.vocab_size);
            if (next == pkv::kBosId) break;
            seq.push_back(next);
            gen.push_back(next);
        }
        CHECK(text_of(gen) == expected);
    }

    // A real checkpoint survives load -> save -> load.
    TempFile again("stories_again.bin");
    pkv::save_checkpoint(again.str(), mt.model);
    const pkv::Model back = pkv::load_checkpoint(again.str());
    CHECK(first_bit_diff(to_vector(back.w.token_embedding), to_vector(mt.model.w.token_embedding)) == -1);
    CHECK(first_bit_diff(to_vector(back.w.w2), to_vector(mt.model.w.w2)) == -1);
    CHECK(first_bit_diff(to_vector(back.w.rms_final), to_vector(mt.model.w.rms_final)) == -1);
    CHECK(read_bytes(again.str()).size() == fs::file_size(ckpt));
}

// ===========================================================================
// 7. The built-in model says varied things
// ===========================================================================

// Proves the built-in model's 200-token greedy continuation is varied (many distinct tokens, no long runs of one token), i.e. the demo does not say "time time time".
TEST_CASE("built-in model greedy output is varied") {
    const pkv::ModelAndTokenizer mt = pkv::load_model_and_tokenizer("", "");
    const std::vector<int> prompt = mt.tok.encode("once upon a time");
    const std::vector<int> gen = greedy_paged(mt.model, prompt, 200, 16);
    REQUIRE(gen.size() == 200);  // the built-in model never says BOS here
    const std::set<int> distinct(gen.begin(), gen.end());
    int longest_run = 1, run = 1;
    for (size_t i = 1; i < gen.size(); ++i) {
        run = gen[i] == gen[i - 1] ? run + 1 : 1;
        longest_run = std::max(longest_run, run);
    }
    // Mostly whole words: tokens whose classifier row was not scaled down.
    int words = 0;
    for (int t : gen) {
        const std::string& piece = mt.tok.vocab[(size_t)t];
        words += piece.size() > 1 && piece[0] == ' ';
    }
    MESSAGE("built-in greedy: " << distinct.size() << " distinct of 200, longest run " << longest_run << ", " << words
                                << " word tokens: " << mt.tok.decode(gen, prompt.back()).substr(0, 80) << "...");
    CHECK(distinct.size() >= 50);
    CHECK(longest_run <= 2);
    CHECK(words >= 150);
}

// ===========================================================================
// 8. Sampler
// ===========================================================================

// Proves argmax returns the lowest index on ties and handles negative and single-element inputs.
TEST_CASE("sampler: argmax ties go to the lowest index") {
    const float a[] = {1.0f, 3.0f, 3.0f, 2.0f};
    CHECK(pkv::argmax(a, 4) == 1);
    const float same[] = {0.5f, 0.5f, 0.5f};
    CHECK(pkv::argmax(same, 3) == 0);
    const float neg[] = {-5.0f, -1.0f, -3.0f, -1.0f};
    CHECK(pkv::argmax(neg, 4) == 1);
    const float one[] = {-INFINITY};
    CHECK(pkv::argmax(one, 1) == 0);
    const float last[] = {0.0f, 0.0f, 1e-30f};
    CHECK(pkv::argmax(last, 3) == 2);
}

// Proves sample_token at temperature 0 is argmax whatever the coin and top_p, and leaves the logits untouched.
TEST_CASE("sampler: temperature 0 is greedy") {
    std::vector<std::pair<float, int>> scratch;
    for (float coin : {0.0f, 0.5f, 0.99999994f})
        for (float top_p : {0.0f, 0.1f, 0.9f, 1.0f}) {
            std::vector<float> logits = {0.1f, 2.0f, -1.0f, 2.0f, 1.9f};
            const std::vector<float> before = logits;
            CHECK(pkv::sample_token(logits.data(), 5, 0.0f, top_p, coin, scratch) == 1);
            CHECK(logits == before);
        }
}

// Proves coin_for is a pure function of (seed, index), always in [0,1), and spreads over the interval.
TEST_CASE("sampler: coin_for is deterministic and in [0,1)") {
    std::set<float> seen;
    double sum = 0;
    const uint64_t seeds[] = {0, 1, 42, 0x9e3779b97f4a7c15ull, ~0ull};
    int n = 0, out_of_range = 0, unstable = 0;
    for (uint64_t seed : seeds)
        for (int i = -3; i < 2000; ++i) {
            const float c = pkv::coin_for(seed, i);
            out_of_range += !(c >= 0.0f && c < 1.0f);
            unstable += c != pkv::coin_for(seed, i);
            seen.insert(c);
            sum += c;
            ++n;
        }
    CHECK(out_of_range == 0);
    CHECK(unstable == 0);
    CHECK(pkv::coin_for(7, INT32_MAX) < 1.0f);
    CHECK(seen.size() > (size_t)n * 99 / 100);  // 24-bit values: almost no repeats
    CHECK(sum / n == doctest::Approx(0.5).epsilon(0.03));
    CHECK(pkv::coin_for(1, 0) != pkv::coin_for(2, 0));
    CHECK(pkv::coin_for(1, 0) != pkv::coin_for(1, 1));

    // run.c's xorshift stream (generate's coins): same seed, same stream, in [0,1).
    uint64_t s1 = 123, s2 = 123;
    int runc_bad = 0;
    std::set<float> runc_seen;
    for (int i = 0; i < 1000; ++i) {
        const float a = pkv::runc_random_f32(s1);
        runc_bad += a != pkv::runc_random_f32(s2) || !(a >= 0.0f && a < 1.0f);
        runc_seen.insert(a);
    }
    CHECK(runc_bad == 0);
    CHECK(runc_seen.size() > 990);
}

// Proves top-p sampling keeps only the nucleus: a tiny top_p always picks the most likely token (lowest index among equals), and coins map onto the renormalised nucleus.
TEST_CASE("sampler: top-p") {
    std::vector<std::pair<float, int>> scratch;
    const float peaked[] = {0.05f, 0.1f, 0.7f, 0.1f, 0.05f};
    for (float coin : {0.0f, 0.3f, 0.5f, 0.99999994f}) {
        CHECK(pkv::sample_top_p(peaked, 5, 0.01f, coin, scratch) == 2);
        CHECK(pkv::sample_top_p(peaked, 5, 0.5f, coin, scratch) == 2);
    }
    const float tied[] = {0.1f, 0.4f, 0.4f, 0.1f};
    for (float coin : {0.0f, 0.5f, 0.99999994f}) CHECK(pkv::sample_top_p(tied, 4, 0.3f, coin, scratch) == 1);
    // top_p 0.5 over {0.5, 0.3, 0.2}: the nucleus is the first two (mass 0.8).
    const float three[] = {0.5f, 0.3f, 0.2f};
    CHECK(pkv::sample_top_p(three, 3, 0.5f, 0.0f, scratch) == 0);
    CHECK(pkv::sample_top_p(three, 3, 0.5f, 0.6f, scratch) == 0);   // 0.48 < 0.5
    CHECK(pkv::sample_top_p(three, 3, 0.5f, 0.65f, scratch) == 1);  // 0.52
    CHECK(pkv::sample_top_p(three, 3, 0.5f, 0.99999994f, scratch) == 1);
    // Through sample_token: a dominant logit wins with a small top_p.
    std::vector<float> logits = {0.0f, 1.0f, 5.0f, 1.0f};
    CHECK(pkv::sample_token(logits.data(), 4, 1.0f, 0.05f, 0.99f, scratch) == 2);
}

// Proves sample_multinomial walks the CDF: zero-probability buckets are never hit by an in-range coin, bucket edges go right, and a coin past the total mass falls back to the last token.
TEST_CASE("sampler: multinomial edge cases") {
    const float p[] = {0.0f, 0.5f, 0.0f, 0.5f};
    CHECK(pkv::sample_multinomial(p, 4, 0.0f) == 1);
    CHECK(pkv::sample_multinomial(p, 4, 0.49f) == 1);
    CHECK(pkv::sample_multinomial(p, 4, 0.5f) == 3);
    CHECK(pkv::sample_multinomial(p, 4, 0.99999994f) == 3);
    const float tail_zero[] = {0.25f, 0.25f, 0.5f, 0.0f};
    CHECK(pkv::sample_multinomial(tail_zero, 4, 0.99999994f) == 2);
    const float one[] = {1.0f};
    CHECK(pkv::sample_multinomial(one, 1, 0.0f) == 0);
    CHECK(pkv::sample_multinomial(one, 1, 0.99999994f) == 0);
    const float short_mass[] = {0.25f, 0.25f, 0.25f};  // sums to 0.75
    CHECK(pkv::sample_multinomial(short_mass, 3, 0.9f) == 2);
    // Through sample_token with top_p off: temperature flattens or sharpens.
    std::vector<std::pair<float, int>> scratch;
    for (auto [coin, want] : {std::pair{0.1f, 0}, {0.3f, 1}, {0.6f, 2}, {0.9f, 3}}) {
        std::vector<float> flat = {1.0f, 2.0f, 3.0f, 4.0f};
        CHECK(pkv::sample_token(flat.data(), 4, 1e6f, 1.0f, coin, scratch) == want);
        std::vector<float> sharp = {1.0f, 2.0f, 3.0f, 4.0f};
        CHECK(pkv::sample_token(sharp.data(), 4, 0.01f, 0.0f, coin, scratch) == 3);
    }
}

}  // TEST_SUITE("model")

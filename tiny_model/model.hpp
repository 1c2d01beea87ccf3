// tiny_model/model.hpp -- chapter 7: the model's shape and weights: a built-in random model,
// and llama2.c legacy checkpoints (load and save).
//
// The architecture is Llama as llama2.c's run.c computes it; the forward pass is
// in tiny_model/forward_cpu.hpp. This file is only about numbers on disk and in
// memory.
//
// Everything is float32, as in run.c (llama2.c's int8 variant, runq.c, and its
// version 2 export are out of scope). Like run.c, we memory-map the checkpoint
// read-only and point each tensor into the mapping: no copy, and no memory
// zero-filled only to be overwritten (section 4 says why that matters at
// start-up). Unlike run.c, we first check that the file size matches the
// header to the byte, so a truncated file is an error message, not a crash.
// A Tensor (section 2) is either such a window into a mapped file or floats of
// its own (the built-in random model, a model built or edited in memory), so
// a Model stays a value you can copy, move, build in memory or save.
//
// Sections: 1. Config  2. Weights and the checkpoint tensor list  3. the
// built-in random model  4. loading and saving llama2.c legacy checkpoints.
#pragma once

#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <fcntl.h>     // open
#include <sys/mman.h>  // mmap, the checkpoint's bytes
#include <sys/stat.h>  // fstat
#include <unistd.h>    // close

namespace pkv {

// Every model or tokenizer file problem is reported as one of these, with the
// file name and what is wrong, so programs print it and exit instead of crashing.
// The examples catch it around load_model_and_tokenizer() and exit with 1.
struct FileError : std::runtime_error {
    using std::runtime_error::runtime_error;
};

// Throws FileError unless `path` names a regular file. A directory opens fine
// as an ifstream on Linux and then reports a nonsense size, so we ask the file
// system what `path` is first.
inline void check_regular_file(const std::string& path, const char* what) {
    std::error_code ec;
    const auto st = std::filesystem::status(path, ec);
    if (ec || !std::filesystem::exists(st)) throw FileError(path + ": no such " + what + " file");
    if (std::filesystem::is_directory(st)) throw FileError(path + ": is a directory, not a " + what + " file");
    if (!std::filesystem::is_regular_file(st)) throw FileError(path + ": not a regular file (a " + what + " must be one)");
}

// Opens `path` for binary reading and returns its size, or throws FileError
// saying why not.
inline uint64_t open_regular_file(std::ifstream& f, const std::string& path, const char* what) {
    check_regular_file(path, what);
    std::error_code ec;
    f.open(path, std::ios::binary);
    if (!f) throw FileError(path + ": cannot open " + what + " (permissions?)");
    const uint64_t size = std::filesystem::file_size(path, ec);
    if (ec) throw FileError(path + ": cannot read the size of the " + what);
    return size;
}

// ============================================================================
// 1. Config: the seven numbers of a llama2.c header
// ============================================================================

// What the KV cache cares about is n_layers, n_kv_heads and head_dim: one
// token slot holds K and V for every layer, n_layers * 2 * kv_dim floats. For
// the built-in model in `make run`'s demo that is 2 KiB per token, 1.25 MiB
// for its 640 token slots.
// Grouped-query attention (n_kv_heads < n_heads) shrinks exactly this by
// n_heads / n_kv_heads, which is why it matters so much to serving.
struct Config {
    int dim = 0;         // residual stream width
    int hidden_dim = 0;  // SwiGLU inner width
    int n_layers = 0;
    int n_heads = 0;     // query heads
    int n_kv_heads = 0;  // key/value heads (GQA when fewer than n_heads)
    int vocab_size = 0;
    int seq_len = 0;     // the model's context length
    bool shared_classifier = true;  // logits use the embedding table (llama2.c: vocab_size > 0 in the header)

    int head_dim() const { return dim / n_heads; }
    // Width of one token's K (or V) across all kv heads: a token slot's size
    // per layer, per K or V, in floats.
    int kv_dim() const { return n_kv_heads * head_dim(); }

    // "" when the shape is usable, else what is wrong with it.
    std::string problem() const {
        if (dim <= 0 || hidden_dim <= 0 || n_layers <= 0 || n_heads <= 0 || n_kv_heads <= 0 || vocab_size <= 0 || seq_len <= 0)
            return "a zero or negative size (dim " + std::to_string(dim) + ", hidden_dim " + std::to_string(hidden_dim) +
                   ", n_layers " + std::to_string(n_layers) + ", n_heads " + std::to_string(n_heads) + ", n_kv_heads " +
                   std::to_string(n_kv_heads) + ", vocab_size " + std::to_string(vocab_size) + ", seq_len " + std::to_string(seq_len) + ")";
        if (dim % n_heads != 0) return "dim " + std::to_string(dim) + " is not divisible by n_heads " + std::to_string(n_heads);
        if (n_heads % n_kv_heads != 0) return "n_heads " + std::to_string(n_heads) + " is not divisible by n_kv_heads " + std::to_string(n_kv_heads);
        if (head_dim() % 2 != 0) return "head_dim " + std::to_string(head_dim()) + " is odd (RoPE rotates pairs)";
        // Sizes this large are corrupt headers, not models we could hold anyway.
        // The caps also keep every product in checkpoint_tensors() far below
        // 2^64, so the file-size check cannot be fooled by an overflow.
        if (dim > (1 << 16) || hidden_dim > (1 << 18) || n_layers > 4096 || vocab_size > (1 << 22) || seq_len > (1 << 22))
            return "sizes that are implausibly large (corrupt file?)";
        return "";
    }
};

// ============================================================================
// 2. Weights, in llama2.c's order and layout (matrices are [out][in])
// ============================================================================
//
// A matrix W with shape [out][in] is applied as y[o] = sum_i W[o][i] * x[i]:
// each output is a dot product with one contiguous row, the loop the CPU
// forward is built around.
//
// Every tensor holds all layers back to back ([n_layers, ...]), as the file
// stores them, so layer l's wq starts at l * dim * dim. The feed-forward is
// Llama's SwiGLU: out = w2 (silu(w1 x) * (w3 x)). Note that wq and wo are
// dim x dim because n_heads * head_dim == dim; wk and wv are kv_dim x dim,
// smaller under GQA, and that is where K and V for the cache come from.

// One tensor's floats, read-only to the forward pass: data(), size() and
// operator[] as on a std::vector<float>. Where the floats live is the
// Tensor's business, one of two places:
//   - a window into a checkpoint file mapped read-only (load_checkpoint). The
//     Tensor shares ownership of the mapping, so the file stays mapped as long
//     as any Tensor, or any copy of a Model, points into it. Copying such a
//     Tensor copies a pointer, not the floats: nobody can write to them;
//   - a std::vector<float> of its own (the built-in random model, a model
//     built or edited in memory). Copying copies the floats, as a vector does.
// vec() is the one way to write: it gives the owned vector, first copying a
// mapped tensor's floats into it (copy on write), so editing a loaded model
// never touches its file.
class Tensor {
public:
    Tensor() = default;
    explicit Tensor(std::vector<float> v) : own_(std::move(v)) {}
    Tensor(std::shared_ptr<const void> file, const float* p, size_t n) : file_(std::move(file)), view_(p), n_(n) {}

    const float* data() const { return file_ ? view_ : own_.data(); }
    size_t size() const { return file_ ? n_ : own_.size(); }
    bool empty() const { return size() == 0; }
    const float& operator[](size_t i) const { return data()[i]; }
    const float* begin() const { return data(); }
    const float* end() const { return data() + size(); }
    bool mapped() const { return file_ != nullptr; }  // a window into a file?

    std::vector<float>& vec() {
        if (file_) {
            own_.assign(view_, view_ + n_);
            file_.reset();
            view_ = nullptr;
            n_ = 0;
        }
        return own_;
    }

private:
    std::vector<float> own_;             // [size()] when owned
    std::shared_ptr<const void> file_;   // the mapping, when a window into one
    const float* view_ = nullptr;        // [n_] inside it
    size_t n_ = 0;
};

struct Weights {
    Tensor token_embedding;  // [vocab_size, dim]
    Tensor rms_att;          // [n_layers, dim]
    Tensor wq;               // [n_layers, n_heads * head_dim, dim]
    Tensor wk;               // [n_layers, kv_dim, dim]
    Tensor wv;               // [n_layers, kv_dim, dim]
    Tensor wo;               // [n_layers, dim, n_heads * head_dim]
    Tensor rms_ffn;          // [n_layers, dim]
    Tensor w1;               // [n_layers, hidden_dim, dim]  gate
    Tensor w2;               // [n_layers, dim, hidden_dim]  down
    Tensor w3;               // [n_layers, hidden_dim, dim]  up
    Tensor rms_final;        // [dim]
    Tensor wcls;             // [vocab_size, dim], empty when the classifier is shared
};

// A model is its shape plus its numbers; it holds no state between calls.
// Everything that changes while generating lives in the KV cache, owned by
// the engine, which is what lets one Model serve many sequences at once.
struct Model {
    Config cfg;
    Weights w;
    // [vocab_size, dim] the rows that turn the final hidden state into logits.
    const float* classifier() const { return cfg.shared_classifier ? w.token_embedding.data() : w.wcls.data(); }
};

// The tensors of a checkpoint in file order, each with its element count. One
// list used by load, save and the size check, so they cannot disagree.
struct TensorRef {
    Tensor* data;  // nullptr: the legacy RoPE tables, skipped on load
    size_t count;
};
inline std::vector<TensorRef> checkpoint_tensors(const Config& c, Weights& w) {
    const size_t L = c.n_layers, D = c.dim, H = c.hidden_dim, KV = c.kv_dim(), V = c.vocab_size;
    // Each legacy RoPE table is [seq_len, head_dim / 2]: one angle per pair.
    const size_t rope = (size_t)c.seq_len * c.head_dim() / 2;
    std::vector<TensorRef> t = {
        {&w.token_embedding, V * D}, {&w.rms_att, L * D}, {&w.wq, L * D * D}, {&w.wk, L * KV * D},
        {&w.wv, L * KV * D},         {&w.wo, L * D * D},  {&w.rms_ffn, L * D}, {&w.w1, L * H * D},
        {&w.w2, L * D * H},          {&w.w3, L * H * D},  {&w.rms_final, D},   {nullptr, rope},  // freq_cis_real
        {nullptr, rope},  // freq_cis_imag
    };
    // Last, and only in files whose header vocab_size is negative.
    if (!c.shared_classifier) t.push_back({&w.wcls, V * D});
    return t;
}

// ============================================================================
// 3. The built-in model: random weights from a seed, no file needed
// ============================================================================
//
// A random transformer still computes a real, deterministic function of its
// context: good enough to exercise every code path and to watch an engine
// schedule it. Three choices make its greedy output read like varied words rather
// than one token repeated:
//   - weights are N(0, gain / sqrt(fan_in)) with a gain a little above 1, so the
//     residual stream and attention actually move with the context;
//   - the classifier is separate from the embedding. With a shared one, the
//     logit of the current token is |e|^2 -- by far the largest -- and a random
//     model says "time time time ..." forever (we tried);
//   - the classifier rows of byte and sub-word tokens are scaled down (by the
//     `row_scale` the tokenizer supplies), so a whole-word token wins the argmax
//     far more often and the stream reads as words.

// splitmix64: a tiny, well-mixed 64-bit generator. Also used for sampling.
// Its whole state is one integer, and we use no standard-library
// distribution (their algorithms differ between implementations); what is
// left to the platform is only the last-bit rounding of std::log and std::cos.
inline uint64_t splitmix64(uint64_t& state) {
    uint64_t z = (state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
// Uniform in [0, 1) with 24 random bits (exactly representable in float).
// coin_for in sampler.hpp turns its hash into a float the same way.
inline float uniform01(uint64_t& state) { return (float)(splitmix64(state) >> 40) * (1.0f / 16777216.0f); }

// The built-in shape: small enough that `make run` (350 engine steps) takes
// about a second on a laptop, and chosen to exercise the interesting paths:
//   - 8 query heads over 4 kv heads: GQA, query head h reads kv head h / 2;
//   - head_dim 16 (128 / 8), even, as RoPE needs;
//   - hidden_dim 384 = 3 x dim, close to Llama's 8/3 ratio;
//   - seq_len 1024, longer than `make run`'s 640-slot pool, so max_model_len is
//     capped to the pool (the "max_model_len 640" in its startup line);
//   - a separate classifier (see above).
inline Config builtin_config(int vocab_size) {
    Config c;
    c.dim = 128;
    c.hidden_dim = 384;
    c.n_layers = 4;
    c.n_heads = 8;
    c.n_kv_heads = 4;
    c.vocab_size = vocab_size;
    c.seq_len = 1024;
    c.shared_classifier = false;
    return c;
}

// `row_scale[v]` multiplies classifier row v (empty: all 1).
inline Model make_random_model(const Config& c, uint64_t seed, const std::vector<float>& row_scale = {}) {
    Model m;
    m.cfg = c;
    uint64_t rng = seed;
    // Box-Muller from two uniforms; deterministic for a given seed on any machine.
    // u1 is nudged away from 0 because log(0) is -infinity.
    auto gauss = [&]() {
        float u1 = uniform01(rng) + 1e-7f, u2 = uniform01(rng);
        return std::sqrt(-2.0f * std::log(u1)) * std::cos(6.2831853f * u2);
    };
    // N(0, gain^2 / fan_in): a dot product of fan_in such weights with inputs
    // of unit variance has variance gain^2, so activations keep their scale
    // from layer to layer instead of exploding or dying out.
    auto fill = [&](Tensor& t, size_t n, int fan_in, float gain) {
        std::vector<float> v(n);
        const float sd = gain / std::sqrt((float)fan_in);
        for (float& x : v) x = gauss() * sd;
        t = Tensor(std::move(v));
    };
    // RMSNorm gains start at 1, as in a freshly initialized Llama.
    auto ones = [&](Tensor& t, size_t n) { t = Tensor(std::vector<float>(n, 1.0f)); };
    Weights& w = m.w;
    const size_t L = c.n_layers, D = c.dim, H = c.hidden_dim, KV = c.kv_dim(), V = c.vocab_size;
    // The call order is the draw order: reordering these lines changes every
    // weight, and with it every output printed in TUTORIAL.md.
    // Embeddings are N(0, 1) (fan_in 1), PyTorch's default for nn.Embedding.
    fill(w.token_embedding, V * D, 1, 1.0f);
    ones(w.rms_att, L * D);
    // q and k get the larger gain: their product sets the attention scores,
    // and scores near zero would make every softmax nearly uniform.
    fill(w.wq, L * D * D, c.dim, 1.5f);
    fill(w.wk, L * KV * D, c.dim, 1.5f);
    fill(w.wv, L * KV * D, c.dim, 1.0f);
    fill(w.wo, L * D * D, c.dim, 1.0f);
    ones(w.rms_ffn, L * D);
    fill(w.w1, L * H * D, c.dim, 1.0f);
    fill(w.w2, L * D * H, c.hidden_dim, 1.0f);
    fill(w.w3, L * H * D, c.dim, 1.0f);
    ones(w.rms_final, D);
    if (!c.shared_classifier) fill(w.wcls, V * D, c.dim, 1.0f);
    // Scale whole classifier rows: a smaller row means a smaller logit for that
    // token at every position, so it wins the argmax less often.
    std::vector<float>& cls = (c.shared_classifier ? w.token_embedding : w.wcls).vec();
    for (size_t v = 0; v < row_scale.size() && v < V; ++v)
        for (size_t d = 0; d < D; ++d) cls[v * D + d] *= row_scale[v];
    return m;
}

// ============================================================================
// 4. llama2.c legacy checkpoints (version 0 / "legacy_export")
// ============================================================================
//
// File layout:
//   int32 dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size, seq_len
//   float32 tensors, each stored whole for all layers, in checkpoint_tensors()
//   order: embedding, rms_att, wq, wk, wv, wo, rms_ffn, w1, w2, w3, rms_final,
//   two legacy RoPE tables [seq_len, head_dim/2] (cos, sin; we recompute RoPE and
//   skip them), then wcls only when vocab_size < 0 (negative = separate classifier).
// We require the file size to match the header exactly: a truncated download or
// a header from another format is caught here, not as garbage logits later.

// Why we map the file instead of reading it. Reading a tensor into memory of
// our own first needs that memory, and fresh memory is given to a process
// page by page on first touch, each page zero-filled by the kernel, only to be
// overwritten by the copy from the file: for a 61 MB checkpoint ~15,000 page
// faults of 4 KiB, and in a virtual machine each one is slow (on this
// project's VM they were most of `generate`'s start-up; 2 MiB huge pages cut
// their number but not the copy). mmap() instead makes the file's pages in
// the kernel's page cache -- where the last run, or the read of the header,
// left them -- part of our address space: no zero fill, no copy, and a fault
// on first touch maps a whole neighbourhood of already-cached pages at once.
// llama2.c's run.c does the same.
//
// The price of a mapping, and why it is safe here: the floats are the file's,
// so the file must not shrink while we run (a process that truncates it under
// us would make the next read of a lost page a SIGBUS; run.c has the same
// exposure). save_checkpoint() therefore never writes into an existing file:
// it writes a new one and renames it over the old, which leaves a mapping of
// the old one intact. And the size check below happens before the first
// float is read, so a file that is short from the start is an error message.

// The checkpoint's bytes, mapped read-only; the mapping ends when the last
// shared_ptr copy (the Model's Tensors) lets go. Throws FileError.
inline std::shared_ptr<const void> map_file(const std::string& path, uint64_t& size, const char* what) {
    check_regular_file(path, what);
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) throw FileError(path + ": cannot open " + what + " (" + std::strerror(errno) + ")");
    struct stat st;
    if (fstat(fd, &st) != 0) {
        const int e = errno;
        ::close(fd);
        throw FileError(path + ": cannot read the size of the " + what + " (" + std::strerror(e) + ")");
    }
    size = (uint64_t)st.st_size;
    if (size == 0) {  // mmap refuses zero bytes; the caller reports the truncation
        ::close(fd);
        return nullptr;
    }
    void* p = mmap(nullptr, (size_t)size, PROT_READ, MAP_PRIVATE, fd, 0);
    const int e = errno;
    ::close(fd);  // the mapping keeps the file open by itself
    if (p == MAP_FAILED) throw FileError(path + ": cannot map the " + what + " into memory (" + std::strerror(e) + ")");
    const size_t bytes = (size_t)size;
    return std::shared_ptr<const void>(p, [bytes](const void* q) { munmap(const_cast<void*>(q), bytes); });
}

inline Model load_checkpoint(const std::string& path) {
    uint64_t file_size = 0;
    const std::shared_ptr<const void> file = map_file(path, file_size, "checkpoint");
    const unsigned char* bytes = static_cast<const unsigned char*>(file.get());
    // The seven int32 of the header, in Config's field order.
    int32_t hdr[7];
    if (file_size < sizeof(hdr))
        throw FileError(path + ": truncated checkpoint (" + std::to_string(file_size) + " bytes, the header alone is 28)");
    std::memcpy(hdr, bytes, sizeof(hdr));
    Model m;
    Config& c = m.cfg;
    c.dim = hdr[0]; c.hidden_dim = hdr[1]; c.n_layers = hdr[2]; c.n_heads = hdr[3];
    c.n_kv_heads = hdr[4]; c.seq_len = hdr[6];
    c.shared_classifier = hdr[5] > 0;
    // abs(INT32_MIN) does not fit in an int32; map it to 0 so problem()
    // rejects the header instead of the program computing with garbage.
    c.vocab_size = hdr[5] == INT32_MIN ? 0 : std::abs(hdr[5]);
    if (std::string p = c.problem(); !p.empty()) throw FileError(path + ": not a llama2.c checkpoint (bad header: " + p + ")");
    auto tensors = checkpoint_tensors(c, m.w);
    uint64_t expect = sizeof(hdr);
    for (const auto& t : tensors) expect += t.count * sizeof(float);
    if (expect != file_size)
        throw FileError(path + ": file size " + std::to_string(file_size) + " bytes does not match its header, which needs " +
                        std::to_string(expect) + " bytes (truncated, or not a llama2.c legacy checkpoint)");
    // Every tensor is a window into the mapping, at its offset in the file
    // (a multiple of 4 bytes after the 28-byte header: floats are aligned as
    // floats, not as vectors, so the CPU forward's loads are unaligned ones).
    // The two RoPE tables are stepped over.
    uint64_t offset = sizeof(hdr);
    for (const auto& t : tensors) {
        if (t.data) *t.data = Tensor(file, reinterpret_cast<const float*>(bytes + offset), t.count);
        offset += t.count * sizeof(float);
    }
    return m;
}

// The inverse of load_checkpoint, used by the tests for round trips: save,
// load, and compare every weight bit and the logits. The output is a
// llama2.c legacy checkpoint, header sign convention included.
//
// It writes `path`.tmp and renames that over `path`, never into an existing
// file: a model loaded from `path` is a mapping of the old file, which must
// keep its bytes (load_checkpoint says why), even when that very model is
// what we save.
inline void save_checkpoint(const std::string& path, const Model& m) {
    const Config& c = m.cfg;
    if (std::string p = c.problem(); !p.empty()) throw FileError(path + ": refusing to save: " + p);
    // Every tensor must fit the config before anything is written.
    for (const auto& t : checkpoint_tensors(c, const_cast<Weights&>(m.w)))  // only read through here
        if (t.data && t.data->size() != t.count) throw FileError(path + ": refusing to save: a tensor has the wrong size for the config");
    const std::string tmp = path + ".tmp";
    std::ofstream f(tmp, std::ios::binary);
    if (!f) throw FileError(path + ": cannot create checkpoint");
    int32_t hdr[7] = {c.dim, c.hidden_dim, c.n_layers, c.n_heads, c.n_kv_heads,
                      c.shared_classifier ? c.vocab_size : -c.vocab_size, c.seq_len};
    f.write(reinterpret_cast<const char*>(hdr), sizeof(hdr));
    // The legacy RoPE tables, written as llama2.c's export does, for readers
    // that still use them: cos and sin of pos * theta^(-2i/head_dim).
    const int half = c.head_dim() / 2;
    std::vector<float> rope_cos((size_t)c.seq_len * half), rope_sin(rope_cos.size());
    for (int p = 0; p < c.seq_len; ++p)
        for (int i = 0; i < half; ++i) {
            double freq = 1.0 / std::pow(10000.0, (2.0 * i) / c.head_dim());
            rope_cos[(size_t)p * half + i] = (float)std::cos(p * freq);
            rope_sin[(size_t)p * half + i] = (float)std::sin(p * freq);
        }
    Weights& w = const_cast<Weights&>(m.w);  // checkpoint_tensors only reads through it here
    int rope_index = 0;
    for (const auto& t : checkpoint_tensors(c, w)) {
        const float* src = t.data ? t.data->data() : (rope_index++ == 0 ? rope_cos : rope_sin).data();
        f.write(reinterpret_cast<const char*>(src), (std::streamsize)(t.count * sizeof(float)));
    }
    f.close();
    std::error_code ec;
    if (!f) {
        std::filesystem::remove(tmp, ec);
        throw FileError(path + ": write failed");
    }
    std::filesystem::rename(tmp, path, ec);
    if (ec) {
        std::filesystem::remove(tmp, ec);
        throw FileError(path + ": cannot replace the checkpoint (" + ec.message() + ")");
    }
}

}  // namespace pkv

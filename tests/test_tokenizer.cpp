// tests/test_tokenizer.cpp -- the tokenizer's fast BPE merge against run.c's
// loop, the word-by-word identities encode_raw() promises, and the size checks
// that keep a small vocabulary from being read out of bounds.
//
// The comparisons run encode() (priority queue) and encode_reference() (run.c's
// O(n^2) loop) on the same texts and demand identical ids, on three
// vocabularies: the built-in one, a small hand-built one full of traps (score
// ties, NaN, scores at or below run.c's -1e10 floor, duplicate pieces, pieces
// with an embedded NUL), and llama2.c's tok512.bin when it is present.
#include <doctest/doctest.h>

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "examples/workload.hpp"
#include "tests/test_util.hpp"
#include "tiny_model/builtin.hpp"
#include "tiny_model/tokenizer.hpp"

namespace {

using Ids = std::vector<int>;

// The one place a test gives up for a missing file: returns true (after saying
// so) when `name` is not in the models folder ($PAGEDKV_MODELS, else
// ../shared/models from the repository root, where the tests run).
bool skip_without_model_file(const std::string& name, std::string& path) {
    path = pkv_test::models_dir() + "/" + name;
    return !pkv_test::need_model_files({name.c_str()});
}

Ids concat(Ids a, const Ids& b) {
    a.insert(a.end(), b.begin(), b.end());
    return a;
}

// encode_raw(s) computed word by word: s cut before every space.
Ids encode_by_words(const pkv::Tokenizer& tok, const std::string& s) {
    Ids ids;
    for (size_t b = 0, e; b < s.size(); b = e) {
        e = std::min(s.find(' ', b + 1), s.size());
        ids = concat(std::move(ids), tok.encode_raw(s.substr(b, e - b)));
    }
    return ids;
}

// Random texts. std::mt19937 is the same sequence everywhere; we take it
// modulo n ourselves because the standard distributions are not.
struct Texts {
    std::mt19937 r;
    explicit Texts(uint32_t seed) : r(seed) {}
    int below(int n) { return (int)(r() % (uint32_t)n); }

    // Words of the built-in vocabulary, sometimes capitalized, with
    // punctuation and runs of one or two spaces.
    std::string words(int n) {
        const int nw = (int)(sizeof pkv::kBuiltinWords / sizeof pkv::kBuiltinWords[0]);
        std::string s;
        for (int i = 0; i < n; ++i) {
            std::string w = pkv::kBuiltinWords[below(nw)];
            if (below(8) == 0) w[0] = (char)std::toupper((unsigned char)w[0]);
            s += w;
            if (below(5) == 0) s += ".,!?;\"'"[below(7)];
            s += below(6) == 0 ? "  " : " ";
        }
        return s;
    }
    // Printable ASCII plus tab and newline, spaces more often than the rest.
    std::string ascii(int n) {
        std::string s;
        for (int i = 0; i < n; ++i) s += below(5) == 0 ? ' ' : below(20) == 0 ? '\n' : (char)(32 + below(95));
        return s;
    }
    // UTF-8 with 2-, 3- and 4-byte characters, and arbitrary bytes (invalid
    // sequences, stray continuation bytes, NUL) mixed in.
    std::string utf8(int n) {
        static const char* const chars[] = {"a", " ", "e", "\xc3\xa9", "\xe2\x80\x93", "\xe6\x97\xa5", "\xf0\x9f\x98\x80"};
        std::string s;
        for (int i = 0; i < n; ++i) s += below(4) == 0 ? std::string(1, (char)below(256)) : chars[below(7)];
        return s;
    }
    std::string any(int n) {
        switch (below(3)) {
        case 0: return words(1 + n / 5);
        case 1: return ascii(n);
        default: return utf8(n);
        }
    }
};

// encode() == encode_reference() for `text`, with every BOS/EOS combination.
void check_same(const pkv::Tokenizer& tok, const std::string& text) {
    for (int flags = 0; flags < 4; ++flags) {
        const bool bos = flags & 1, eos = flags & 2;
        const Ids fast = tok.encode(text, bos, eos), ref = tok.encode_reference(text, bos, eos);
        if (fast != ref) {  // one readable failure instead of thousands of lines
            std::string shown;  // the text with unprintable bytes as \xNN, cut at 80 bytes
            for (unsigned char c : text.substr(0, 80)) {
                char hex[8];
                std::snprintf(hex, sizeof hex, "\\x%02X", c);
                shown += std::isprint(c) ? std::string(1, (char)c) : std::string(hex);
            }
            FAIL_CHECK("encode != encode_reference (bos " << bos << ", eos " << eos << ", " << fast.size() << " vs "
                                                          << ref.size() << " tokens) for \"" << shown << "\"");
            return;
        }
    }
}

void check_same_on_random_texts(const pkv::Tokenizer& tok, uint32_t seed, int count) {
    check_same(tok, "");
    for (int c = 0; c < 256; ++c) check_same(tok, std::string(1, (char)c));
    Texts t(seed);
    for (int i = 0; i < count; ++i) check_same(tok, t.any(1 + t.below(60)));
}

// The two identities of encode_raw() (see tokenizer.hpp): the dummy prefix,
// and a text cut at every space encoding word by word.
void check_raw_identities(const pkv::Tokenizer& tok, uint32_t seed) {
    REQUIRE(tok.merges_stay_within_words());
    Texts t(seed);
    for (int i = 0; i < 300; ++i) {
        std::string text = t.any(1 + t.below(60));
        if (((unsigned char)text[0] & 0xC0) == 0x80) text[0] = 'x';  // the documented exception
        CHECK(tok.encode(text, true, false) == concat({pkv::kBosId}, tok.encode_raw(" " + text)));
        CHECK(tok.encode_raw(" " + text) == encode_by_words(tok, " " + text));
    }
    // The exceptions, as documented: the dummy prefix needs a non-empty text,
    // and a leading continuation byte joins the space's code point in " " + t.
    CHECK(tok.encode("") == Ids{pkv::kBosId});
    CHECK(tok.encode_raw(" ") == Ids{tok.lookup(" ")});
    CHECK(tok.encode("\x80x") != concat({pkv::kBosId}, tok.encode_raw(" \x80x")));
}

// llama2.c's layout: <unk>, <s>, </s>, then <0x00>..<0xFF>.
std::vector<std::string> llama_layout() {
    std::vector<std::string> v = {"<unk>", "\n<s>\n", "\n</s>\n"};
    for (int b = 0; b < 256; ++b) {
        char name[8];
        std::snprintf(name, sizeof name, "<0x%02X>", b);
        v.push_back(name);
    }
    return v;
}

// A vocabulary built to trip a merge loop over its edge cases.
pkv::Tokenizer trap_vocabulary() {
    const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
    pkv::Tokenizer t;
    t.vocab = llama_layout();
    t.scores.assign(t.vocab.size(), 0.0f);
    // 'z' falls back to a byte piece that reads "b" as a C string, 'y' to one
    // that reads "": run.c sees only what precedes the NUL.
    t.vocab[pkv::kFirstByteId + 'z'] = std::string("b\0q", 3);
    t.vocab[pkv::kFirstByteId + 'y'] = std::string("\0b", 2);
    const std::vector<std::pair<std::string, float>> pieces = {
        {"a", 0}, {"b", 0}, {"c", 0}, {"d", 0}, {" ", 0}, {std::string("\0", 1), 0},  // text NUL has a piece
        {"ab", 1}, {"ba", 1}, {"bc", 1}, {"aa", 1},   // ties: leftmost first
        {"abab", 2}, {"aab", 1.5f}, {"bcd", 2},       // merges of merges
        {"cd", nan}, {"dc", -1e10f}, {"dd", -2e10f}, {"ca", -inf},  // never merge
        {"db", -9.9e9f}, {"dab", inf},                 // just above the floor; +inf
        {"ab", 9}, {"ba", -5},                         // duplicates: the first id wins
        {"a b", 3}, {" b", 2}, {" a", 0.5f}, {"d ", 4},  // merges across spaces
    };
    for (const auto& [piece, score] : pieces) {
        t.vocab.push_back(piece);
        t.scores.push_back(score);
    }
    t.index();
    return t;
}

// A tokenizer.bin holding `pieces`, each with score 0.
void write_tokenizer(const std::string& path, const std::vector<std::string>& pieces) {
    std::ofstream f(path, std::ios::binary);
    const uint32_t max_len = 16;
    f.write(reinterpret_cast<const char*>(&max_len), 4);
    for (const std::string& p : pieces) {
        const float score = 0;
        const int32_t len = (int32_t)p.size();
        f.write(reinterpret_cast<const char*>(&score), 4);
        f.write(reinterpret_cast<const char*>(&len), 4);
        f.write(p.data(), len);
    }
}

}  // namespace

TEST_SUITE("tokenizer") {

// Proves the priority-queue merge gives run.c's ids on the built-in vocabulary.
TEST_CASE("encode equals run.c's merge loop on the built-in vocabulary") {
    const pkv::Tokenizer tok = pkv::builtin_vocab().tok;
    check_same_on_random_texts(tok, 1, 1500);
    // And a fixed point, so that the two cannot agree on something wrong.
    CHECK(tok.encode("once upon a time") == Ids{pkv::kBosId, tok.lookup(" once"), tok.lookup(" upon"),
                                               tok.lookup(" a"), tok.lookup(" time")});
}

// Proves it on ties, NaN, scores at or below -1e10, +-inf, duplicate pieces
// and NUL-truncated pieces, where a careless heap order would differ.
TEST_CASE("encode equals run.c's merge loop on a vocabulary full of traps") {
    const pkv::Tokenizer tok = trap_vocabulary();
    Texts t(2);
    const char alphabet[] = {'a', 'b', 'c', 'd', ' ', 'y', 'z', '\0', 'e'};
    for (int i = 0; i < 4000; ++i) {
        std::string s;
        for (int n = t.below(40); n > 0; --n) s += alphabet[t.below(9)];
        check_same(tok, s);
    }
    // Hand-checked: "ab" and "ba" tie at 1, so the leftmost pair goes first;
    // "z" falls back to a piece that merges as "b" into "ab" (id of the first "ab").
    const int ab = tok.lookup("ab"), a = tok.lookup("a"), c = tok.lookup("c"), d = tok.lookup("d");
    CHECK(tok.scores[ab] == 1.0f);  // the first of the two "ab"
    CHECK(tok.encode_raw("aba") == Ids{ab, a});
    CHECK(tok.encode_raw("az") == Ids{ab});
    CHECK(tok.encode_raw("cd") == Ids{c, d});  // NaN score
    CHECK(tok.encode_raw("dc") == Ids{d, c});  // exactly -1e10
    CHECK(tok.encode_raw("db") == Ids{tok.lookup("db")});    // just above -1e10
    CHECK(tok.encode_raw("dab") == Ids{tok.lookup("dab")});  // +inf beats "ab"
    check_same_on_random_texts(tok, 3, 500);
}

// Proves it on llama2.c's real 512-token tokenizer, when present.
TEST_CASE("encode equals run.c's merge loop on tok512.bin") {
    std::string path;
    if (skip_without_model_file("tok512.bin", path)) return;
    const pkv::Tokenizer tok = pkv::Tokenizer::load(path, 512);
    check_same_on_random_texts(tok, 4, 1500);
    check_same(tok, "Once upon a time, there was a little girl named Lily. She loved to play outside.");
}

// Proves the merge is no longer quadratic: 100 KB in well under a second (the
// bound is coarse on purpose), with the result checked word by word, and a
// 3 KB text still matching the reference exactly.
TEST_CASE("a 100 KB prompt encodes fast and correctly") {
    const pkv::Tokenizer tok = pkv::builtin_vocab().tok;
    Texts t(5);
    std::string big;
    while (big.size() < 100000) big += t.words(50);
    const auto t0 = std::chrono::steady_clock::now();
    const Ids ids = tok.encode(big);
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    CHECK_MESSAGE(secs < 2.0, "encoding 100 KB took " << secs << " s");
    CHECK(ids.size() > big.size() / 10);
    CHECK(ids == concat({pkv::kBosId}, encode_by_words(tok, " " + big)));
    const std::string small = big.substr(0, 3000);  // the reference is quadratic: one flag combination
    CHECK(tok.encode(small) == tok.encode_reference(small));
}

// Proves encode(t) == BOS + encode_raw(" " + t) and the word-by-word identity
// on the built-in vocabulary and tok512.bin, and that the property behind
// them is reported false when a piece spans a space.
TEST_CASE("encode_raw and merges_stay_within_words") {
    check_raw_identities(pkv::builtin_vocab().tok, 6);
    std::string path;
    if (!skip_without_model_file("tok512.bin", path)) check_raw_identities(pkv::Tokenizer::load(path, 512), 7);

    CHECK_FALSE(pkv::Tokenizer().merges_stay_within_words());  // never indexed
    const pkv::Tokenizer trap = trap_vocabulary();
    CHECK_FALSE(trap.merges_stay_within_words());
    // Why it matters: with "a b" a piece, " a b" is not " a" then " b".
    CHECK(trap.encode_raw(" a b") == Ids{trap.lookup(" "), trap.lookup("a b")});
    CHECK(concat(trap.encode_raw(" a"), trap.encode_raw(" b")) == Ids{trap.lookup(" a"), trap.lookup(" b")});
    pkv::Tokenizer t = pkv::builtin_vocab().tok;  // one piece with a space inside is enough
    t.vocab.push_back("a b");
    t.scores.push_back(1.0f);
    t.index();
    CHECK_FALSE(t.merges_stay_within_words());
}

// Proves load() demands the 259 pieces of llama2.c's layout (258 is refused
// with the count in the message, 259 loads), and that a hand-shrunk
// Tokenizer throws from encode, render and decode instead of reading past its
// vocabulary.
TEST_CASE("small vocabularies are refused, not read out of bounds") {
    const std::string path = (std::filesystem::temp_directory_path() /
                              ("pagedkv_test_tokenizer_" + std::to_string(::getpid()) + ".bin")).string();
    std::vector<std::string> pieces = llama_layout();
    REQUIRE(pieces.size() == 259);
    write_tokenizer(path, pieces);
    CHECK(pkv::Tokenizer::load(path, 259).encode("\xff", false) == Ids{3 + 0xFF});
    pieces.pop_back();
    write_tokenizer(path, pieces);
    try {
        (void)pkv::Tokenizer::load(path, 258);
        FAIL_CHECK("a 258-token tokenizer loaded");
    } catch (const pkv::FileError& e) {
        const std::string msg = e.what();
        CHECK(msg.find(path) != std::string::npos);
        CHECK(msg.find("has 258 tokens") != std::string::npos);
        CHECK(msg.find("at least 259") != std::string::npos);
    }
    std::filesystem::remove(path);

    pkv::Tokenizer tok = pkv::builtin_vocab().tok;
    tok.vocab.resize(100);
    tok.scores.resize(100);
    CHECK_THROWS_AS((void)tok.encode("the"), std::invalid_argument);  // stale index: " " is id 259+
    tok.index();
    CHECK(tok.encode("\x01", true, true) == Ids{pkv::kBosId, 3 + 0x01, pkv::kEosId});  // ids that exist work
    CHECK_THROWS_WITH_AS((void)tok.encode("t"), doctest::Contains("byte 0x74 needs id 119"), std::invalid_argument);
    CHECK_THROWS_AS((void)tok.encode_reference("t"), std::invalid_argument);
    CHECK_THROWS_AS((void)tok.encode_raw("\xff"), std::invalid_argument);
    CHECK(tok.render(-1, 99) == "`");  // <0x60>, the last id left
    CHECK_THROWS_AS((void)tok.render(-1, 100), std::out_of_range);
    CHECK_THROWS_AS((void)tok.render(pkv::kBosId, -1), std::out_of_range);
    CHECK_THROWS_AS((void)tok.decode({pkv::kBosId, 5, 1000}), std::out_of_range);
    tok.scores.resize(50);
    CHECK_THROWS_AS((void)tok.encode("\x01"), std::invalid_argument);  // fewer scores than pieces
    tok.vocab.resize(2);
    tok.scores.resize(2);
    tok.index();
    CHECK(tok.encode("", true, false) == Ids{pkv::kBosId});
    CHECK_THROWS_WITH_AS((void)tok.encode("", true, true), doctest::Contains("EOS"), std::invalid_argument);
    tok.vocab.resize(1);
    tok.scores.resize(1);
    tok.index();
    CHECK_THROWS_WITH_AS((void)tok.encode(""), doctest::Contains("BOS"), std::invalid_argument);
}

// The prompt builder the studies and overload use, as it was before it became
// linear: encode the whole text again after every word until it has `len`
// tokens (cubic in len). The fast one must give the very same tokens, or every
// count printed in the TUTORIAL would change.
std::vector<int32_t> make_prompt_by_reencoding(const pkv::Tokenizer& tok, int len, uint64_t seed) {
    uint64_t rng = seed;
    std::string text;
    std::vector<int> ids = tok.encode(text, true);
    const int num_words = (int)(sizeof(pkv::kBuiltinWords) / sizeof(pkv::kBuiltinWords[0]));
    while ((int)ids.size() < len) {
        text += (text.empty() ? "" : " ") + std::string(pkv::kBuiltinWords[pkv::splitmix64(rng) % num_words]);
        ids = tok.encode(text, true);
    }
    ids.resize((size_t)len);
    return std::vector<int32_t>(ids.begin(), ids.end());
}

// Proves workload::make_prompt (linear) returns exactly the tokens of re-encoding the growing text, for the built-in vocabulary and tok512.bin, at many lengths and seeds, and that a 5000-token prompt takes well under a second.
TEST_CASE("make_prompt is the re-encoding builder, in linear time") {
    std::vector<std::pair<std::string, pkv::Tokenizer>> toks;
    toks.emplace_back("built-in", pkv::builtin_vocab().tok);
    if (pkv_test::need_model_files({"tok512.bin"})) toks.emplace_back("tok512", pkv::Tokenizer::load(pkv_test::models_dir() + "/tok512.bin", 512));
    for (const auto& entry : toks) {
        // Not a structured binding: CAPTURE captures by lambda, and clang++ 14
        // cannot capture a structured binding.
        const std::string& name = entry.first;
        const pkv::Tokenizer& tok = entry.second;
        CAPTURE(name);
        REQUIRE(tok.merges_stay_within_words());
        for (int len : {1, 2, 3, 7, 32, 33, 100, 257})
            for (uint64_t seed : {1ull, 2ull, 1000003ull + 5, 99ull}) {
                CAPTURE(len);
                CAPTURE(seed);
                CHECK(workload::make_prompt(tok, len, seed) == make_prompt_by_reencoding(tok, len, seed));
            }
        const auto t0 = std::chrono::steady_clock::now();
        const std::vector<int32_t> big = workload::make_prompt(tok, 5000, 7);
        CHECK(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() < 0.5);
        CHECK(big.size() == 5000u);
        CHECK(big[0] == pkv::kBosId);
    }
}

}  // TEST_SUITE("tokenizer")

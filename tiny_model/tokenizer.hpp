// tiny_model/tokenizer.hpp -- llama2.c's BPE tokenizer (tokenizer.bin) and a
// built-in word-level vocabulary for the built-in model.
//
// Encoding and decoding follow llama2.c's run.c step for step, because
// examples/generate promises byte-identical output to run.c.
#pragma once

#include <cctype>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <unordered_map>
#include <vector>

#include "tiny_model/model.hpp"

namespace pkv {

constexpr int kBosId = 1;  // "<s>": starts every sequence; the model emitting it ends generate
constexpr int kEosId = 2;  // "</s>"

struct Tokenizer {
    std::vector<std::string> vocab;  // [vocab_size] piece bytes
    std::vector<float> scores;       // [vocab_size] merge priority: higher merges first
    std::unordered_map<std::string, int> ids;  // piece -> id

    int size() const { return (int)vocab.size(); }

    void index() {
        ids.clear();
        for (int i = 0; i < size(); ++i) ids.emplace(vocab[i], i);  // first id wins on duplicates
    }
    int lookup(const std::string& piece) const {
        auto it = ids.find(piece);
        return it == ids.end() ? -1 : it->second;
    }

    // ---- tokenizer.bin ------------------------------------------------------
    // uint32 max_token_length, then per token: float32 score, int32 len, len bytes.
    // The file must hold exactly the model's vocab_size tokens.
    static Tokenizer load(const std::string& path, int vocab_size) {
        std::ifstream f(path, std::ios::binary | std::ios::ate);
        if (!f) throw FileError(path + ": cannot open tokenizer");
        const int64_t file_size = (int64_t)f.tellg();
        f.seekg(0);
        Tokenizer t;
        uint32_t max_len = 0;
        if (!f.read(reinterpret_cast<char*>(&max_len), 4)) throw FileError(path + ": truncated tokenizer (no header)");
        for (;;) {
            float score;
            int32_t len;
            f.read(reinterpret_cast<char*>(&score), 4);
            if (f.gcount() == 0) break;  // clean end of file, between two tokens
            if (f.gcount() != 4 || !f.read(reinterpret_cast<char*>(&len), 4))
                throw FileError(path + ": truncated tokenizer inside token " + std::to_string(t.size()));
            if (len < 0 || (uint32_t)len > max_len)
                throw FileError(path + ": token " + std::to_string(t.size()) + " has length " + std::to_string(len) +
                                " (max_token_length is " + std::to_string(max_len) + "): corrupt tokenizer");
            // Check before allocating: a corrupt length must not cost gigabytes.
            if (len > file_size - (int64_t)f.tellg())
                throw FileError(path + ": truncated tokenizer inside token " + std::to_string(t.size()));
            std::string piece((size_t)len, '\0');
            if (len > 0 && !f.read(piece.data(), len))
                throw FileError(path + ": truncated tokenizer inside token " + std::to_string(t.size()));
            t.vocab.push_back(std::move(piece));
            t.scores.push_back(score);
        }
        if (t.size() != vocab_size)
            throw FileError(path + ": tokenizer has " + std::to_string(t.size()) + " tokens but the model's vocab_size is " +
                            std::to_string(vocab_size) + " (wrong tokenizer for this checkpoint?)");
        t.index();
        return t;
    }

    // ---- encoding (run.c's encode) -------------------------------------------
    // 1. BOS; 2. if the text is non-empty, the piece " " (SentencePiece's dummy
    // prefix); 3. each UTF-8 code point that is a piece becomes that token, else
    // each of its bytes becomes <0xXX> = byte + 3; 4. repeatedly merge the
    // adjacent pair whose concatenation is a piece with the highest score
    // (strictly greater wins, so the leftmost pair wins a tie).
    std::vector<int> encode(const std::string& text, bool bos = true, bool eos = false) const {
        std::vector<int> tok;
        if (bos) tok.push_back(kBosId);
        if (!text.empty()) {
            int sp = lookup(" ");
            if (sp >= 0) tok.push_back(sp);
        }
        for (size_t i = 0; i < text.size();) {
            size_t len = 1;  // a code point: a lead byte plus up to 3 continuation bytes
            while (i + len < text.size() && len < 4 && ((unsigned char)text[i + len] & 0xC0) == 0x80) ++len;
            std::string cp = text.substr(i, len);
            int id = lookup(cp);
            if (id >= 0) tok.push_back(id);
            else for (unsigned char b : cp) tok.push_back(b + 3);
            i += len;
        }
        for (;;) {
            float best_score = -1e10f;
            int best_id = -1, best_idx = -1;
            for (size_t i = 0; i + 1 < tok.size(); ++i) {
                int id = lookup(c_str(tok[i]) + c_str(tok[i + 1]));
                if (id >= 0 && scores[id] > best_score) {
                    best_score = scores[id];
                    best_id = id;
                    best_idx = (int)i;
                }
            }
            if (best_idx < 0) break;
            tok[best_idx] = best_id;
            tok.erase(tok.begin() + best_idx + 1);
        }
        if (eos) tok.push_back(kEosId);
        return tok;
    }

    // ---- decoding (run.c's decode + safe_printf) ------------------------------
    // The bytes printed for `token` following `prev`: a piece right after BOS
    // loses its leading space; "<0xXX>" is that raw byte; a single-byte piece that
    // is neither printable nor whitespace in the C locale prints nothing.
    std::string render(int prev, int token) const {
        std::string piece = c_str(token);
        if (prev == kBosId && !piece.empty() && piece[0] == ' ') piece.erase(0, 1);
        unsigned int byte;
        if (piece.size() >= 4 && piece.compare(0, 3, "<0x") == 0 && std::isxdigit((unsigned char)piece[3]) &&
            std::sscanf(piece.c_str(), "<0x%02X>", &byte) == 1)
            piece = std::string(1, (char)(unsigned char)byte);
        if (piece.size() == 1) {
            unsigned char b = (unsigned char)piece[0];
            if (!(std::isprint(b) || std::isspace(b))) return "";
        }
        if (!piece.empty() && piece[0] == '\0') return "";  // a NUL byte prints nothing from %s
        return piece;
    }

    // Concatenated render of a token sequence (the first token is treated as
    // following BOS when it is BOS itself). Used by tests and the engine's streams.
    std::string decode(const std::vector<int>& tokens, int prev = -1) const {
        std::string s;
        for (int t : tokens) {
            if (t != kBosId) s += render(prev, t);
            prev = t;
        }
        return s;
    }

private:
    // run.c treats pieces as C strings: anything after an embedded NUL is invisible.
    std::string c_str(int id) const { return std::string(vocab[id].c_str()); }
};

// ============================================================================
// The built-in vocabulary
// ============================================================================
//
// Layout, like llama2.c's: 0 <unk>, 1 <s>, 2 </s>, 3..258 the bytes <0x00>..<0xFF>,
// then every printable ASCII character, then for each word below its merge
// chain: " w", " wo", " wor", " word". With scores that rank longer pieces
// higher, the BPE encoder above turns " word" into one token. Any string can be
// encoded thanks to the byte fallback, and printable ASCII decodes back exactly;
// bytes >= 0x80 that are not whole pieces print nothing, as in run.c.
//
// `row_scale` (per token) tells make_random_model to shrink the embedding rows
// of everything that is not a whole word, so the random model mostly says words.

inline const char* const kBuiltinWords[] = {
    "the", "a", "and", "to", "was", "he", "she", "it", "of", "in", "they", "his", "her", "that", "with", "on",
    "for", "but", "is", "you", "said", "had", "there", "one", "day", "so", "very", "big", "little", "time", "upon",
    "once", "were", "at", "not", "all", "be", "we", "are", "them", "then", "saw", "played", "friend", "friends",
    "happy", "sad", "girl", "boy", "dog", "cat", "bird", "tree", "park", "house", "mom", "dad", "sun", "ball", "toy",
    "car", "fish", "red", "blue", "green", "small", "old", "new", "good", "bad", "fast", "slow", "up", "down",
    "out", "into", "over", "under", "when", "what", "who", "why", "how", "where", "this", "these", "those", "some",
    "every", "many", "more", "could", "would", "should", "can", "will", "did", "do", "go", "went", "come", "came",
    "see", "look", "looked", "find", "found", "make", "made", "take", "took", "give", "gave", "run", "ran", "jump",
    "jumped", "walk", "walked", "play", "help", "helped", "want", "wanted", "like", "liked", "love", "loved", "know",
    "knew", "think", "thought", "say", "tell", "told", "ask", "asked", "smile", "smiled", "laugh", "cry", "eat",
    "ate", "sleep", "night", "morning", "home", "school", "garden", "flower", "flowers", "water", "sky", "rain",
    "snow", "box", "book", "cake", "apple", "hat", "boat", "ship", "sea", "river", "hill", "rock", "door", "window",
    "room", "bed", "table", "chair", "name", "named", "lily", "tom", "ben", "sue", "max", "amy", "sam", "king",
    "queen", "bear", "bunny", "duck", "frog", "mouse", "lion", "star", "moon", "light", "dark", "warm", "cold",
    "soft", "loud", "quiet", "kind", "brave", "funny", "together", "again", "away", "back", "now", "too", "also",
    "because", "after", "before", "from", "about", "just", "only", "never", "always", "yes", "no", "thank",
    "sorry", "please", "hello", "learned", "lesson", "story", "end", "first", "last", "best", "long", "short",
    "hard", "easy", "open", "close", "new", "fun", "game", "song", "sing", "dance", "wind", "leaf", "grass", "shiny",
    "pretty", "scared", "excited", "surprised", "careful", "special", "nice", "great", "each", "other", "their",
    "him", "me", "my", "your", "our", "us", "i", "an", "as", "by", "if", "or", "here", "have", "has", "get", "got",
};

struct BuiltinVocab {
    Tokenizer tok;
    std::vector<float> row_scale;  // [vocab_size] embedding row scale for make_random_model
};

inline BuiltinVocab builtin_vocab() {
    BuiltinVocab bv;
    Tokenizer& t = bv.tok;
    auto add = [&](const std::string& piece, float score, float scale) {
        if (t.lookup(piece) >= 0) return;
        t.vocab.push_back(piece);
        t.scores.push_back(score);
        t.ids.emplace(piece, t.size() - 1);
        bv.row_scale.push_back(scale);
    };
    const float kNonWordScale = 0.3f;
    add("<unk>", 0.0f, kNonWordScale);
    add("\n<s>\n", 0.0f, kNonWordScale);
    add("\n</s>\n", 0.0f, kNonWordScale);
    for (int b = 0; b < 256; ++b) {
        char buf[8];
        std::snprintf(buf, sizeof buf, "<0x%02X>", b);
        add(buf, 0.0f, kNonWordScale);
    }
    for (int c = 32; c < 127; ++c) add(std::string(1, (char)c), 0.0f, c == '.' || c == ',' ? 1.0f : kNonWordScale);
    // Merge chains: the score is the piece length, so longer pieces merge first.
    for (const char* w : kBuiltinWords) {
        const std::string word = std::string(" ") + w;
        for (size_t n = 2; n < word.size(); ++n) add(word.substr(0, n), (float)n, kNonWordScale);
    }
    for (const char* w : kBuiltinWords) {
        const std::string word = std::string(" ") + w;
        int id = t.lookup(word);
        if (id >= 0) bv.row_scale[id] = 1.0f;  // a prefix of a longer word may itself be a word
        else add(word, (float)word.size(), 1.0f);
    }
    return bv;
}

}  // namespace pkv

namespace pkv {

// ============================================================================
// What the examples load: a checkpoint + tokenizer, or the built-in pair
// ============================================================================

// The seed of the built-in model's weights. Every run of every example uses the
// same built-in model, so outputs in the docs can be reproduced exactly.
constexpr uint64_t kBuiltinModelSeed = 42;

struct ModelAndTokenizer {
    Model model;
    Tokenizer tok;
    std::string name;  // "built-in" or the checkpoint path
};

// checkpoint "" = the built-in model (tokenizer_path must then be "" too).
inline ModelAndTokenizer load_model_and_tokenizer(const std::string& checkpoint, const std::string& tokenizer_path) {
    ModelAndTokenizer mt;
    if (checkpoint.empty()) {
        if (!tokenizer_path.empty())
            throw FileError(tokenizer_path + ": the built-in model has its own vocabulary; -z needs a checkpoint");
        BuiltinVocab bv = builtin_vocab();
        mt.model = make_random_model(builtin_config(bv.tok.size()), kBuiltinModelSeed, bv.row_scale);
        mt.tok = std::move(bv.tok);
        mt.name = "built-in";
        return mt;
    }
    mt.model = load_checkpoint(checkpoint);
    mt.tok = Tokenizer::load(tokenizer_path.empty() ? "tokenizer.bin" : tokenizer_path, mt.model.cfg.vocab_size);
    mt.name = checkpoint;
    return mt;
}

}  // namespace pkv

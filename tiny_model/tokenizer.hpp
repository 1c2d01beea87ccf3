// tiny_model/tokenizer.hpp -- llama2.c's BPE tokenizer (tokenizer.bin) and a
// built-in word-level vocabulary for the built-in model.
//
// Encoding and decoding follow llama2.c's run.c step for step, because
// examples/generate promises byte-identical output to run.c.
//
// The engine never sees text: requests arrive as token ids and leave as token
// ids. The tokenizer lives at the edges (the examples and the tests), which is
// also where vLLM keeps it, in its front-end process.
//
// What tokenizer.bin is: llama2.c's tokenizer.py exports a SentencePiece BPE
// model as a flat list of (score, piece) pairs. SentencePiece's word marker
// (U+2581, a lower one-eighth block) becomes a plain space, BOS and EOS become "\n<s>\n" and
// "\n</s>\n", and the 256 byte-fallback pieces keep their textual names
// "<0x00>".."<0xFF>" at ids 3..258. The score is the merge priority: of all
// adjacent pairs, the one whose merged piece scores highest is merged first.
//
// Sections: the Tokenizer (load, encode, decode), the built-in vocabulary,
// and load_model_and_tokenizer(), which the examples call.
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

// Llama 2's SentencePiece ids, and the built-in vocabulary copies them:
// 0 is <unk>, 1 BOS, 2 EOS.
constexpr int kBosId = 1;  // "<s>": starts every sequence; the model emitting it ends generate
constexpr int kEosId = 2;  // "</s>"

struct Tokenizer {
    std::vector<std::string> vocab;  // [vocab_size] piece bytes
    std::vector<float> scores;       // [vocab_size] merge priority: higher merges first
    // run.c sorts a copy of the vocabulary once and bsearch()es it for every
    // lookup. A hash map gives the same answers for a vocabulary without
    // duplicate pieces, in O(1) per lookup, and needs no comparator.
    std::unordered_map<std::string, int> ids;  // piece -> id

    int size() const { return (int)vocab.size(); }

    // Rebuild `ids` from `vocab`: after load(), or after editing vocab by hand.
    void index() {
        ids.clear();
        for (int i = 0; i < size(); ++i) ids.emplace(vocab[i], i);  // first id wins on duplicates
    }
    // The id of `piece`, or -1 when it is not in the vocabulary.
    int lookup(const std::string& piece) const {
        auto it = ids.find(piece);
        return it == ids.end() ? -1 : it->second;
    }

    // ---- tokenizer.bin ------------------------------------------------------
    // uint32 max_token_length, then per token: float32 score, int32 len, len bytes.
    // The file must hold exactly the model's vocab_size tokens.
    //
    // run.c uses max_token_length to size its merge buffer and reads exactly
    // vocab_size tokens, ignoring anything after them; a tokenizer with more
    // pieces than the model's vocabulary loads without complaint. We use
    // std::string (no buffer to size), treat max_token_length only as a
    // sanity bound on each piece, and demand that the token count match.
    // Every failure names the file (and the token, where one is at fault).
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
    //
    // With the built-in vocabulary, "the cat" becomes BOS " the" " cat": the
    // dummy prefix gives the first word the leading space every word piece
    // has. "Once" stays five tokens (" ", "O", "n", "c", "e"): the vocabulary
    // only has lowercase words, and BPE can only merge into pieces that exist.
    // "cafe" with an accented e becomes " ca" "f" <0xC3> <0xA9>: the two
    // UTF-8 bytes of the e are not a piece, so they fall back to bytes.
    //
    // Cost: every merge rescans all pairs and builds a string per pair, so a
    // text of n characters costs O(n^2) lookups. That is run.c's algorithm,
    // kept for exactness; prompts here are short. A production BPE keeps the
    // candidate pairs in a priority queue instead.
    //
    // EOS is off by default: a prompt is a prefix for the model to continue,
    // not a finished text. run.c's generate encodes with BOS on, EOS off too.
    std::vector<int> encode(const std::string& text, bool bos = true, bool eos = false) const {
        std::vector<int> tok;
        if (bos) tok.push_back(kBosId);
        if (!text.empty()) {
            int sp = lookup(" ");
            if (sp >= 0) tok.push_back(sp);
        }
        // Split into code points, not bytes: a multi-byte character that is a
        // piece of its own must be looked up whole.
        for (size_t i = 0; i < text.size();) {
            size_t len = 1;  // a code point: a lead byte plus up to 3 continuation bytes
            while (i + len < text.size() && len < 4 && ((unsigned char)text[i + len] & 0xC0) == 0x80) ++len;
            std::string cp = text.substr(i, len);
            int id = lookup(cp);
            if (id >= 0) tok.push_back(id);
            // Byte fallback: byte b is piece <0xXX> at id b + 3. Like run.c we
            // assume the Llama layout here rather than looking the piece up.
            else for (unsigned char b : cp) tok.push_back(b + 3);
            i += len;
        }
        // The merge loop: one merge per pass until no adjacent pair forms a
        // piece. Each merge shortens the sequence by one token.
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
    //
    // The leading space is the dummy prefix that encode() added: dropping it
    // after BOS makes decode(encode(text)) start where the text started.
    // Printing nothing for a lone control byte or high byte is run.c's
    // safe_printf, which guards the terminal; the price is that a character
    // that fell back to bytes (the accented e above) does not come back.
    std::string render(int prev, int token) const {
        std::string piece = c_str(token);
        if (prev == kBosId && !piece.empty() && piece[0] == ' ') piece.erase(0, 1);
        // The isxdigit test rejects a piece such as "<0x-1>", which %X alone
        // reads as a signed number (run.c's "<0x%02hhX>" accepts it).
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
    // Decoding one token at a time, as a stream does, gives the same bytes as
    // decoding the whole sequence, as long as each call passes the previous
    // token as `prev`: rendering depends on nothing else.
    std::string decode(const std::vector<int>& tokens, int prev = -1) const {
        std::string s;
        for (int t : tokens) {
            // BOS prints nothing itself; it only strips the space of the token
            // after it (render's first rule).
            if (t != kBosId) s += render(prev, t);
            prev = t;
        }
        return s;
    }

private:
    // run.c treats pieces as C strings: anything after an embedded NUL is invisible.
    // We store pieces as std::string (a NUL is legal inside one) but merge and
    // print them through this, so that a piece with an embedded NUL (only an
    // unusual or corrupt file has one) behaves exactly as in run.c.
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
// `row_scale` (per token) tells make_random_model to shrink the classifier rows
// of everything that is not a whole word, so the random model mostly says words.
//
// Why copy llama2.c's layout instead of a plain word list? Then the built-in
// model and a real checkpoint go through the very same encode and render,
// and the byte fallback guarantees any string can be encoded. Why the merge
// chains? BPE only ever merges two adjacent tokens into an existing piece,
// so to get from " ", "w", "o", "r", "d" to " word" some pair must form a
// piece at every step; " w", " wo", " wor" are that path, left to right.
//
// The words are the kind that fill TinyStories, the children's stories the
// llama2.c stories models were trained on, so the built-in model's output
// looks at home next to a real stories checkpoint. The whole vocabulary comes
// to 994 pieces (the "vocab 994" in the demos' first line).

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

// The tokenizer plus one number per token for the model builder: the model
// is made to fit the vocabulary, never the other way round.
struct BuiltinVocab {
    Tokenizer tok;
    std::vector<float> row_scale;  // [vocab_size] embedding row scale for make_random_model
};

inline BuiltinVocab builtin_vocab() {
    BuiltinVocab bv;
    Tokenizer& t = bv.tok;
    // Append a piece unless it exists (the word list has duplicates, and a
    // chain prefix may repeat another chain's). Ids are assigned in call
    // order, so the order of the calls below *is* the layout.
    auto add = [&](const std::string& piece, float score, float scale) {
        if (t.lookup(piece) >= 0) return;
        t.vocab.push_back(piece);
        t.scores.push_back(score);
        t.ids.emplace(piece, t.size() - 1);
        bv.row_scale.push_back(scale);
    };
    // Rows of non-word pieces are scaled by this. '.' and ',' keep full scale
    // so that the random model's stream has some punctuation in it.
    const float kNonWordScale = 0.3f;
    add("<unk>", 0.0f, kNonWordScale);
    add("\n<s>\n", 0.0f, kNonWordScale);
    add("\n</s>\n", 0.0f, kNonWordScale);
    // Ids 3..258: the byte fallback, byte b at id b + 3, as in Llama 2.
    for (int b = 0; b < 256; ++b) {
        char buf[8];
        std::snprintf(buf, sizeof buf, "<0x%02X>", b);
        add(buf, 0.0f, kNonWordScale);
    }
    // Single printable characters. Their score of 0 is never read: scores
    // rank merge *results*, and a merge always yields at least two bytes.
    for (int c = 32; c < 127; ++c) add(std::string(1, (char)c), 0.0f, c == '.' || c == ',' ? 1.0f : kNonWordScale);
    // Merge chains: the score is the piece length, so longer pieces merge first.
    for (const char* w : kBuiltinWords) {
        const std::string word = std::string(" ") + w;
        for (size_t n = 2; n < word.size(); ++n) add(word.substr(0, n), (float)n, kNonWordScale);
    }
    // Then the whole words, each with score = its length, so that it is the
    // last merge of its chain.
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
// With a checkpoint and no -z, we look for "tokenizer.bin" in the current
// directory, run.c's default. The tokenizer is checked against the model's
// vocab_size, so a mismatched pair fails here, naming the tokenizer file,
// instead of producing out-of-range token ids later.
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

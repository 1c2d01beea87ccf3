// tiny_model/tokenizer.hpp -- chapter 7: llama2.c's BPE tokenizer
// (tokenizer.bin). The built-in model's vocabulary is tiny_model/builtin.hpp's.
//
// Encoding and decoding follow llama2.c's run.c step for step, because
// examples/generate promises byte-identical output to run.c. Where run.c's way
// is slow (the merge loop) we compute the same answer a faster way, and keep
// run.c's way next to it as the specification the tests compare against.
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
// One section: the Tokenizer (load, encode, decode). The built-in vocabulary
// and load_model_and_tokenizer(), which the examples call, are builtin.hpp's.
#pragma once

#include <cctype>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <queue>
#include <stdexcept>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "tiny_model/model.hpp"

namespace pkv {

// Llama 2's SentencePiece ids, and the built-in vocabulary copies them:
// 0 is <unk>, 1 BOS, 2 EOS.
constexpr int kBosId = 1;  // "<s>": starts every sequence; the model emitting it ends generate
constexpr int kEosId = 2;  // "</s>"
// Byte fallback: byte b is the piece "<0xXX>" at id kFirstByteId + b. run.c
// does not look these pieces up, it computes the id, so every vocabulary it
// meets must have all 256 of them, at ids 3..258: 259 pieces at the least.
constexpr int kFirstByteId = 3;
constexpr int kMinVocabSize = kFirstByteId + 256;

struct Tokenizer {
    std::vector<std::string> vocab;  // [vocab_size] piece bytes
    std::vector<float> scores;       // [vocab_size] merge priority: higher merges first
    // run.c sorts a copy of the vocabulary once and bsearch()es it for every
    // lookup. A hash map gives the same answers for a vocabulary without
    // duplicate pieces, in O(1) per lookup, and needs no comparator.
    std::unordered_map<std::string, int> ids;  // piece -> id

    int size() const { return (int)vocab.size(); }

    // Rebuild `ids` from `vocab`, and the cached merges_stay_within_words():
    // after load(), or after editing vocab by hand.
    void index() {
        ids.clear();
        for (int i = 0; i < size(); ++i) ids.emplace(vocab[i], i);  // first id wins on duplicates
        within_words_ = compute_merges_stay_within_words();
    }
    // The id of `piece`, or -1 when it is not in the vocabulary. An index that
    // names an id past the end of vocab (vocab shrunk without index()) throws
    // rather than letting encode read past the vocabulary.
    int lookup(const std::string& piece) const {
        auto it = ids.find(piece);
        if (it == ids.end()) return -1;
        if (it->second < 0 || it->second >= size())
            throw std::invalid_argument("Tokenizer: the index maps a piece to id " + std::to_string(it->second) +
                                        " but the vocabulary has " + std::to_string(size()) +
                                        " pieces; call index() after editing vocab");
        return it->second;
    }

    // ---- tokenizer.bin ------------------------------------------------------
    // uint32 max_token_length, then per token: float32 score, int32 len, len bytes.
    // The file must hold exactly the model's vocab_size tokens, and at least
    // kMinVocabSize of them.
    //
    // run.c uses max_token_length to size its merge buffer and reads exactly
    // vocab_size tokens, ignoring anything after them; a tokenizer with more
    // pieces than the model's vocabulary loads without complaint. We use
    // std::string (no buffer to size), treat max_token_length only as a
    // sanity bound on each piece, and demand that the token count match.
    // run.c also never checks that the byte pieces exist: with fewer than 259
    // tokens its byte fallback indexes past the vocabulary. We refuse such a
    // file here, where the message can name it.
    // Every failure names the file (and the token, where one is at fault).
    static Tokenizer load(const std::string& path, int vocab_size) {
        std::ifstream f;
        const int64_t file_size = (int64_t)open_regular_file(f, path, "tokenizer");
        Tokenizer t;
        uint32_t max_len = 0;
        if (!f.read(reinterpret_cast<char*>(&max_len), 4)) throw FileError(path + ": truncated tokenizer (no header)");
        // Where we are in the file, counted here: asking the stream (tellg)
        // is a system call per token, 32,000 of them for a llama2 vocabulary.
        int64_t pos = 4;
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
            pos += 8;
            if (len > file_size - pos)
                throw FileError(path + ": truncated tokenizer inside token " + std::to_string(t.size()));
            std::string piece((size_t)len, '\0');
            if (len > 0 && !f.read(piece.data(), len))
                throw FileError(path + ": truncated tokenizer inside token " + std::to_string(t.size()));
            pos += len;
            t.vocab.push_back(std::move(piece));
            t.scores.push_back(score);
        }
        // The count mismatch first: for a file paired with the wrong model it
        // is the more useful of the two messages.
        if (t.size() != vocab_size)
            throw FileError(path + ": tokenizer has " + std::to_string(t.size()) + " tokens but the model's vocab_size is " +
                            std::to_string(vocab_size) + " (wrong tokenizer for this checkpoint?)");
        if (t.size() < kMinVocabSize)
            throw FileError(path + ": tokenizer has " + std::to_string(t.size()) + " tokens, but llama2.c's layout needs at least " +
                            std::to_string(kMinVocabSize) +
                            ": <unk>, <s>, </s> at ids 0..2 and the byte pieces <0x00>..<0xFF> at ids 3..258, which the "
                            "byte fallback of encode uses (export a SentencePiece model trained with byte_fallback, as "
                            "llama2.c's tokenizer.py does)");
        t.index();
        return t;
    }

    // ---- encoding (run.c's encode) -------------------------------------------
    // 1. BOS; 2. if the text is non-empty, the piece " " (SentencePiece's dummy
    // prefix; skipped when " " is not a piece, where run.c would push id -1); 3. each UTF-8 code point that is a piece becomes that token, else
    // each of its bytes becomes <0xXX> = byte + 3; 4. repeatedly merge the
    // adjacent pair whose concatenation is a piece with the highest score
    // (strictly greater wins, so the leftmost pair wins a tie). BOS takes part
    // in step 4 like any token, as in run.c. It could only merge into a piece
    // that starts with BOS's text "\n<s>\n"; tok512.bin and the built-in
    // vocabulary have none (and when the dummy prefix follows BOS,
    // merges_stay_within_words() below rules such a merge out).
    //
    // With the built-in vocabulary, "the cat" becomes BOS " the" " cat": the
    // dummy prefix gives the first word the leading space every word piece
    // has. "Once" stays five tokens (" ", "O", "n", "c", "e"): the vocabulary
    // only has lowercase words, and BPE can only merge into pieces that exist.
    // "cafe" with an accented e becomes " ca" "f" <0xC3> <0xA9>: the two
    // UTF-8 bytes of the e are not a piece, so they fall back to bytes.
    //
    // Cost: O(n log n) for a text of n characters. run.c rescans every pair
    // after every merge, O(n^2): billions of pair lookups for a 100 KB prompt.
    // merge() below keeps the candidate pairs in a priority queue instead and
    // gets the very same tokens (encode_reference() is run.c's loop, kept as
    // the specification the tests compare it with).
    //
    // EOS is off by default: a prompt is a prefix for the model to continue,
    // not a finished text. run.c's generate encodes with BOS on, EOS off too.
    //
    // A hand-edited Tokenizer too small for what the text needs (a byte
    // fallback id, BOS or EOS at or past size()) gets std::invalid_argument,
    // never a read past the vocabulary.
    std::vector<int> encode(const std::string& text, bool bos = true, bool eos = false) const {
        std::vector<int> tok = initial_tokens(text, bos, eos, /*dummy_prefix=*/true);
        merge(tok);
        if (eos) tok.push_back(kEosId);
        return tok;
    }

    // The text alone: no BOS, no dummy prefix, no EOS; steps 3 and 4 above.
    // For every non-empty text t that does not start with a UTF-8 continuation
    // byte (0x80..0xBF), in a vocabulary that has the piece " " and where BOS
    // never merges (merges_stay_within_words() guarantees that),
    //     encode(t, true, false) == {BOS} + encode_raw(" " + t).
    // Both sides then start from the same tokens: the dummy prefix is the
    // token of " ", and so is the code point " " that starts " " + t. The two
    // exceptions come from run.c pushing the dummy prefix apart from the text:
    // encode("") is {BOS} alone, and a leading continuation byte makes its own
    // code point in t but joins the space's code point in " " + t.
    std::vector<int> encode_raw(const std::string& text) const {
        std::vector<int> tok = initial_tokens(text, false, false, /*dummy_prefix=*/false);
        merge(tok);
        return tok;
    }

    // run.c's encode, merge loop and all: the specification that encode()
    // must match token for token. O(n^2); for tests and for reading.
    std::vector<int> encode_reference(const std::string& text, bool bos = true, bool eos = false) const {
        std::vector<int> tok = initial_tokens(text, bos, eos, /*dummy_prefix=*/true);
        merge_reference(tok);
        if (eos) tok.push_back(kEosId);
        return tok;
    }

    // ---- merges never cross a space ----------------------------------------
    // True when no merge can ever join a token that starts at a space to the
    // token before it. Then, for words w1..wk without spaces (any of them may
    // be empty),
    //     encode_raw(" w1 w2 ... wk") == encode_raw(" w1") + ... + encode_raw(" wk"),
    // so a long prompt can be encoded word by word (or from a cache of words)
    // in linear time. It holds for llama2.c's tokenizers and the built-in
    // vocabulary. Computed by index(), so it describes vocab as of the last
    // index() (a Tokenizer that never had one says false).
    //
    // The condition, on the pieces as C strings (as merges see them):
    //  a. no piece has a space at a position > 0;
    //  b. no piece has the text of the space's byte piece vocab[35] (35 is
    //     3 + 0x20; "<0x20>" in llama2.c's layout) at a position > 0;
    //  c. no piece is empty.
    // Why that is enough. Code points never straddle a space (a space is not a
    // continuation byte), so the tokens of the whole text before any merge are
    // the words' tokens side by side. The token at the start of each word is
    // the piece of a code point that starts with " ", or, when that code
    // point is not a piece (a space followed by continuation bytes), the
    // space's byte piece. So each word's first token starts with " " or with
    // vocab[35]'s text, and merging it with the tokens after it keeps that
    // start. A merge across the word boundary would join a non-empty left
    // token (c) to such a right token, giving a piece with " " (a) or
    // vocab[35]'s text (b) at a position > 0: no such piece exists. So every
    // merge stays inside one word. And the order is each word's own: the
    // merge chosen globally (highest score, then leftmost) is, if it falls in
    // word w, also the highest-scoring leftmost candidate among w's pairs, and
    // w's pairs change only when w itself merges; so w goes through exactly
    // the merges it would go through alone, and it is finished exactly when
    // it would be alone (the whole text stops when no word has a candidate).
    // The same argument keeps BOS, in encode(), away from the " " after it.
    bool merges_stay_within_words() const { return within_words_; }

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
    //
    // A token outside [0, size()) throws std::out_of_range (run.c would read
    // past its vocabulary). `prev` is only compared with BOS, so any value is fine.
    std::string render(int prev, int token) const {
        if (token < 0 || token >= size())
            throw std::out_of_range("Tokenizer: token id " + std::to_string(token) + " is outside the vocabulary [0, " +
                                    std::to_string(size()) + ")");
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
    // token as `prev`: rendering depends on nothing else. An id outside the
    // vocabulary throws, as in render() (BOS is never looked up, so never).
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
    bool within_words_ = false;  // merges_stay_within_words(), as of the last index()

    // A merge is allowed only if its piece scores above this. It is run.c's
    // starting "best score": a piece scoring -1e10 or less, or NaN (which
    // compares false with everything), never merges.
    static constexpr float kNoMerge = -1e10f;

    // run.c treats pieces as C strings: anything after an embedded NUL is invisible.
    // We store pieces as std::string (a NUL is legal inside one) but merge and
    // print them through this, so that a piece with an embedded NUL (only an
    // unusual or corrupt file has one) behaves exactly as in run.c.
    std::string c_str(int id) const { return std::string(vocab[id].c_str()); }

    // `id` itself when it is a valid id, else std::invalid_argument naming
    // `what` needed it. Only a hand-edited Tokenizer can fail this: load()
    // and builtin_vocab() guarantee kMinVocabSize pieces.
    int checked_id(int id, const std::string& what) const {
        if (id >= size())
            throw std::invalid_argument("Tokenizer: " + what + " needs id " + std::to_string(id) +
                                        ", but the vocabulary has only " + std::to_string(size()) +
                                        " pieces (llama2.c's layout needs " + std::to_string(kMinVocabSize) + ")");
        return id;
    }

    // The byte-fallback id of byte b, checked like checked_id().
    int byte_id(unsigned char b) const {
        if (kFirstByteId + b < size()) return kFirstByteId + b;
        char what[16];
        std::snprintf(what, sizeof what, "byte 0x%02X", b);
        return checked_id(kFirstByteId + b, what);
    }

    // Steps 1-3 of encode: BOS, the dummy prefix, code points, byte fallback.
    // EOS is only checked here (it is appended after the merges).
    std::vector<int> initial_tokens(const std::string& text, bool bos, bool eos, bool dummy_prefix) const {
        if (scores.size() < vocab.size())
            throw std::invalid_argument("Tokenizer: " + std::to_string(scores.size()) + " scores for " +
                                        std::to_string(vocab.size()) + " pieces");
        if (eos) checked_id(kEosId, "EOS");
        std::vector<int> tok;
        tok.reserve(text.size() + 2);
        if (bos) tok.push_back(checked_id(kBosId, "BOS"));
        if (dummy_prefix && !text.empty()) {
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
            else
                for (unsigned char b : cp) tok.push_back(byte_id(b));
            i += len;
        }
        return tok;
    }

    // run.c's merge loop: one merge per pass until no adjacent pair forms a
    // piece. Each merge shortens the sequence by one token, and each pass
    // rescans every pair and builds a string per pair: O(n^2) for n tokens.
    void merge_reference(std::vector<int>& tok) const {
        for (;;) {
            float best_score = kNoMerge;
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
    }

    // The same merges in O(n log n). Tokens live in a doubly linked list over
    // their starting positions (a merged token keeps the position of its left
    // half), so a merge is O(1) and only the two pairs next to it change.
    // Candidate pairs wait in a max-heap ordered by (score descending, start
    // position of the left token ascending).
    //
    // Why that order is run.c's. A pass of run.c takes, among all adjacent
    // pairs whose piece scores above kNoMerge, the highest score, and among
    // equal scores the first one it met, i.e. the leftmost: "strictly
    // greater" never replaces an earlier pair by a later one of the same
    // score. The list keeps tokens in text order, so the left token's start
    // position orders pairs exactly as their index in run.c's array does.
    // If the heap holds an entry for every current pair (plus outdated
    // entries we skip), its best current entry is the pair run.c picks, and
    // by induction both make the same merge at every step and stop together,
    // when no current pair forms a piece.
    //
    // Outdated entries: a merge changes the pairs on either side of it. We
    // push the two new pairs and leave the old entries in the heap; when one
    // reaches the top we compare it with the list as it is now (left token
    // alive, same right neighbour, both ids unchanged) and drop it if it
    // differs. An entry that still matches is exactly the entry we would push
    // for the current pair, since its piece and score follow from the two ids.
    // Each merge pushes at most two entries, so the heap never holds more than
    // about 3n of them.
    void merge(std::vector<int>& tok) const {
        const int n = (int)tok.size();
        if (n < 2) return;
        std::vector<int> prev(n), next(n);  // list links; -1 / n at the ends
        for (int i = 0; i < n; ++i) {
            prev[i] = i - 1;
            next[i] = i + 1;
        }
        struct Candidate {
            float score;            // scores[merged]: > kNoMerge, so never NaN
            int left, right;        // positions of the two tokens
            int left_id, right_id;  // their ids when pushed, to recognize outdated entries
            int merged;             // the id of the piece they make
        };
        // priority_queue puts the "largest" on top; "a below b" means b first.
        auto below = [](const Candidate& a, const Candidate& b) {
            if (a.score != b.score) return a.score < b.score;
            return a.left > b.left;
        };
        std::priority_queue<Candidate, std::vector<Candidate>, decltype(below)> heap(below);
        std::string key;  // reused: the concatenation of two pieces as C strings
        auto consider = [&](int l, int r) {
            key.assign(vocab[tok[l]].c_str());
            key.append(vocab[tok[r]].c_str());
            int id = lookup(key);
            if (id >= 0 && scores[id] > kNoMerge) heap.push({scores[id], l, r, tok[l], tok[r], id});
        };
        for (int i = 0; i + 1 < n; ++i) consider(i, i + 1);
        while (!heap.empty()) {
            const Candidate c = heap.top();
            heap.pop();
            // A merged-away token has id -1, which no entry's left_id equals.
            if (tok[c.left] != c.left_id || next[c.left] != c.right || tok[c.right] != c.right_id) continue;
            tok[c.left] = c.merged;
            tok[c.right] = -1;
            next[c.left] = next[c.right];
            if (next[c.left] < n) prev[next[c.left]] = c.left;
            if (prev[c.left] >= 0) consider(prev[c.left], c.left);
            if (next[c.left] < n) consider(c.left, next[c.left]);
        }
        // Read the list back into tok. Position 0 is never merged away (only
        // right halves are), so the list starts there.
        int out = 0;
        for (int i = 0; i < n; i = next[i]) tok[out++] = tok[i];
        tok.resize(out);
    }

    // merges_stay_within_words(), conditions a-c (see there), on C strings.
    bool compute_merges_stay_within_words() const {
        const int space_byte = kFirstByteId + ' ';
        const std::string_view space_piece = space_byte < size() ? vocab[space_byte].c_str() : "";
        for (const std::string& p : vocab) {
            const std::string_view s = p.c_str();
            if (s.empty()) return false;                                                  // c
            if (s.find(' ', 1) != s.npos) return false;                                   // a
            if (!space_piece.empty() && s.find(space_piece, 1) != s.npos) return false;  // b
        }
        return true;
    }
};

}  // namespace pkv

// tiny_model/builtin.hpp -- the built-in model's vocabulary, and what the
// examples load: a llama2.c checkpoint + tokenizer, or the built-in pair
// (chapter 7).
//
// Everything runs without a file: a model with random weights from a fixed
// seed (model.hpp's make_random_model) over a vocabulary of words laid out as
// llama2.c lays out its tokenizers, so both go through the very same encode
// and render (tokenizer.hpp).
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "tiny_model/model.hpp"
#include "tiny_model/tokenizer.hpp"

namespace pkv {

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
    // Ids 3..258: the byte fallback, byte b at id b + 3, as in Llama 2. The
    // three pieces above and these 256 are all distinct, so add() skips none
    // of them: the layout that encode's byte fallback and load()'s size check
    // assume holds here by construction.
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
    t.index();  // the same ids add() built, plus the cached merges_stay_within_words()
    return bv;
}


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

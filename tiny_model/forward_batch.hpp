// tiny_model/forward_batch.hpp -- the flat batch: what the engine hands a
// model runner each step (chapter 7).
//
// The batch is vLLM V1's shape: no [batch, seq] padding, just a list of tokens.
// Each token carries its id, its position in its own sequence, the slot its K/V
// go to, and which sequence (row of block_tables) it belongs to. A prefill of
// 100 tokens, 30 decodes and a recompute chunk all travel in one list, through
// the same code.
//
// It is the one type the engine, every runner and the forward passes share,
// so it has a header of its own: whoever needs the batch does not have to
// include a forward pass to get it. vLLM's model runner prepares the same
// inputs (input ids, positions, slot_mapping, block tables) but finds a
// sequence's queries by where they start in the flat list (query_start_loc);
// we give every token its row (token_seq) instead, which keeps attention's
// indexing one lookup deep.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/block_pool.hpp"
#include "paged_kv.cuh"

namespace pkv {


// The step's input, built on the host. slot_mapping is computed here, once
// per token, so that the model's one write to the cache is a plain scatter.
// Rows of block_tables are padded with -1 to a common width so a kernel can
// index them as a matrix; the padding is never read, because a token's
// context ends inside its own blocks.
struct ForwardBatch {
    std::vector<int32_t> token_ids;     // [num_tokens]
    std::vector<int32_t> positions;     // [num_tokens] position within its sequence
    std::vector<int64_t> slot_mapping;  // [num_tokens] where its K/V are written
    std::vector<int32_t> token_seq;     // [num_tokens] its row in block_tables
    std::vector<int32_t> block_tables;  // [num_seqs, max_blocks_per_seq], rows padded with -1
    int max_blocks_per_seq = 0;
    std::vector<int32_t> logits_indices;  // [num_logits] tokens whose logits are wanted

    int num_tokens() const { return (int)token_ids.size(); }
    int num_seqs() const { return num_seqs_; }

    // Optional, before the first add_sequence: the batch will hold `seqs`
    // sequences whose tables are at most `width` blocks long. Rows then never
    // need widening (repad), which matters for batches of hundreds.
    void reserve(int seqs, int width) {
        if (num_seqs_ > 0) return;
        max_blocks_per_seq = std::max(max_blocks_per_seq, width);
        block_tables.reserve((size_t)seqs * max_blocks_per_seq);
    }

    // Append `n` tokens of one sequence that start at position `first_pos`.
    // `table` must already cover positions up to first_pos + n - 1. With
    // want_logits, the last of these tokens gets a row of logits. Only a token
    // whose next token will be sampled needs one: a 100-token prefill costs
    // one classifier row, not 100.
    void add_sequence(const std::vector<int32_t>& table, int block_size, const int32_t* tokens, int first_pos, int n,
                      bool want_logits) {
        if (blocks_for_tokens((int64_t)first_pos + n, block_size) > (int64_t)table.size())
            throw std::logic_error("add_sequence: block table too short for its tokens");
        const int seq = num_seqs_++;
        if ((int)table.size() > max_blocks_per_seq) repad((int)table.size());
        // The row: the table, then -1 up to the common width. -1 is every bit
        // set, so memset writes the padding at memory speed (a batch of
        // hundreds of long rows is mostly padding).
        const size_t at = block_tables.size();
        block_tables.resize(at + (size_t)max_blocks_per_seq);
        int32_t* row = block_tables.data() + at;
        std::copy(table.begin(), table.end(), row);
        if (const size_t pad = (size_t)max_blocks_per_seq - table.size()) std::memset(row + table.size(), 0xff, pad * sizeof(int32_t));
        for (int i = 0; i < n; ++i) {
            token_ids.push_back(tokens[i]);
            positions.push_back(first_pos + i);
            slot_mapping.push_back(slot_of(table.data(), first_pos + i, block_size));
            token_seq.push_back(seq);
        }
        if (want_logits) logits_indices.push_back(num_tokens() - 1);
    }

    // Sequence `s` alone, as a batch of its own: its tokens, slots, table
    // row and logits row, copied. The runner's failure isolation
    // (forward_isolating, runner.hpp) runs each sequence this way.
    ForwardBatch sequence(int s) const {
        if (s < 0 || s >= num_seqs_) throw std::out_of_range("ForwardBatch::sequence: no sequence " + std::to_string(s));
        ForwardBatch one;
        one.num_seqs_ = 1;
        one.max_blocks_per_seq = max_blocks_per_seq;
        one.block_tables.assign(block_tables.begin() + (ptrdiff_t)s * max_blocks_per_seq,
                                block_tables.begin() + (ptrdiff_t)(s + 1) * max_blocks_per_seq);
        for (int t = 0; t < num_tokens(); ++t) {
            if (token_seq[t] != s) continue;
            one.token_ids.push_back(token_ids[t]);
            one.positions.push_back(positions[t]);
            one.slot_mapping.push_back(slot_mapping[t]);
            one.token_seq.push_back(0);
        }
        for (int32_t l : logits_indices)
            if (token_seq[l] == s) one.logits_indices.push_back(one.num_tokens() - 1);  // a sequence's logits row is its last token's
        return one;
    }

private:
    // Widen every row to `width` columns (a longer table arrived). vLLM
    // avoids the copy with a table as wide as max_model_len can ever need.
    void repad(int width) {
        const int rows = num_seqs_ - 1;  // the rows stored so far (the new one is counted already)
        std::vector<int32_t> wide((size_t)rows * width, -1);
        for (int r = 0; r < rows; ++r)
            std::copy_n(block_tables.begin() + (size_t)r * max_blocks_per_seq, max_blocks_per_seq, wide.begin() + (size_t)r * width);
        block_tables.swap(wide);
        max_blocks_per_seq = width;
    }
    int num_seqs_ = 0;
};

}  // namespace pkv

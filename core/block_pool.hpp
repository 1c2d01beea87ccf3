// core/block_pool.hpp -- chapter 1: who owns which block of the KV cache.
//
// The KV cache is cut into fixed-size *blocks* of `block_size` token positions
// (paged_kv.cuh says what a block holds). This header is the bookkeeping on
// top: plain C++, no keys or values, no CUDA. Sections: 1. the block pool: a
// free list that is also an LRU queue, and reference counts; 2. block tables:
// growing a request's table, freeing it tail first. The pool owns the free
// list's queue (core/free_block_queue.hpp) and prefix caching's index
// (core/prefix_index.hpp); core/prefix_cache.hpp names full blocks and finds
// a new request's cached prefix.
//
// A sequence never owns contiguous memory; it owns a list of block ids, its
// *block table*. Position p lives in logical block p / block_size, which the
// table maps to some physical block anywhere in the pool:
//
//   sequence positions   0 1 2 3 | 4 5 6 7 | 8 9            (block_size = 4)
//   logical block        ---0--- | ---1--- | -2-
//   block_table[]        [  7   ,     2   ,   5  ]
//
// The scheduler grows tables with allocate_slots() and frees them with
// free_blocks(); no model runner calls either. vLLM splits the same work
// between block_pool.py (the free queue and the hash map) and
// kv_cache_manager.py with the managers under it (tables, prefix lookup).
#pragma once

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/free_block_queue.hpp"
#include "core/prefix_index.hpp"

namespace pkv {

// The largest block we accept: past any use (vLLM's default is 16; its v0.11
// config took 1 to 256), and the bound keeps size arithmetic small.
constexpr int kMaxBlockSize = 4096;

// ceil(num_tokens / block_size), in 64 bits: callers add lengths from the
// command line, and 2^31 - 1 tokens plus a block size must not wrap.
inline int64_t blocks_for_tokens(int64_t num_tokens, int64_t block_size) {
    if (block_size <= 0) throw std::invalid_argument("blocks_for_tokens: block_size must be >= 1");
    return num_tokens <= 0 ? 0 : (num_tokens + block_size - 1) / block_size;
}

// ============================================================================
// 1. The block pool: free list = LRU queue, reference counts
// ============================================================================
//
// Every physical block is either referenced (ref_cnt > 0: held by that many
// block tables, more than one only when prefix caching shares a prefix) or
// free (ref_cnt == 0, in the free list). A free block may still hold cached
// tokens; a request that hits it pulls it out of the *middle* of the list.
//
// The list is also the eviction order: allocation pops from the head; a freed
// block the prefix cache can find (PrefixIndex::cached) goes to the *tail*, to
// be evicted last (LRU among cached blocks); one without (a partial block, or
// every block when prefix caching is off) goes to the *head*: handing it out
// first keeps cached ones alive. A request's blocks are freed last logical
// block first (section 2), so a prompt's shared head is evicted last. vLLM's
// BlockPool.free_blocks does the same since its pull request #42656 (2026);
// before that, every freed block went to the tail.

// What the pool keeps per block: how many tables hold it. (vLLM's
// KVCacheBlock also carries the free-list links and the hash.)
struct KVBlock {
    int32_t ref_cnt = 0;
};

class BlockPool {
public:
    BlockPool() = default;
    BlockPool(int num_blocks, int block_size, bool enable_prefix_caching)
        : block_size_(block_size), prefix_caching_(enable_prefix_caching), free_(num_blocks), index_(std::max(num_blocks, 0), block_size) {
        if (num_blocks < 1) throw std::invalid_argument("BlockPool: num_blocks must be >= 1");
        if (block_size < 1 || block_size > kMaxBlockSize)
            throw std::invalid_argument("BlockPool: block_size must be in 1.." + std::to_string(kMaxBlockSize));
        blocks_.resize((size_t)num_blocks);
        for (int32_t b = 0; b < num_blocks; ++b) free_.push_back(b);
    }

    int num_blocks() const { return (int)blocks_.size(); }
    int block_size() const { return block_size_; }
    int num_free_blocks() const { return free_.size(); }
    bool prefix_caching() const { return prefix_caching_; }
    const KVBlock& block(int32_t id) const { return blocks_.at((size_t)id); }
    const FreeBlockQueue& free_list() const { return free_; }
    // What prefix caching can find in the pool's blocks (core/prefix_index.hpp).
    PrefixIndex& prefix_index() { return index_; }
    const PrefixIndex& prefix_index() const { return index_; }

    // vLLM's gauge: the fraction of blocks held by some request (cached free
    // blocks count as free).
    double kv_cache_usage_perc() const {
        return blocks_.empty() ? 0.0 : 1.0 - (double)free_.size() / (double)blocks_.size();
    }

    // Take `n` blocks from the head of the free list, O(1) each. All or
    // nothing: false, and nothing changed, when fewer than n are free.
    bool allocate(int n, std::vector<int32_t>& out) {
        if (n < 0) throw std::invalid_argument("BlockPool::allocate: negative count");
        // ---- exercise 2 begin: the LRU free list ----
        // All or nothing: refuse (return false) before touching anything. Then
        // n times: take the block at the front off the list (free_.remove),
        // drop the name it may still carry in the prefix index (index_.evict: a
        // cached block is evicted only now, when it is reused), give it one
        // reference, append its id to `out`.
        if (n > free_.size()) return false;
        for (int i = 0; i < n; ++i) {
            const int32_t b = free_.front();
            free_.remove(b);
            index_.evict(b);  // lazy eviction happens here, at reuse time
            blocks_[b].ref_cnt = 1;
            out.push_back(b);
        }
        return true;
        // ---- exercise 2 end ----
    }

    // Take one more reference on blocks found in the prefix cache; a hit on a
    // free block pulls it out of the free list.
    void touch(const std::vector<int32_t>& ids) {
        // ---- exercise 2 begin: the LRU free list ----
        // A block nobody holds sits in the free list: take it out before you
        // count the new reference. checked(b, "touch") validates the id.
        for (int32_t b : ids) {
            KVBlock& blk = checked(b, "touch");
            if (blk.ref_cnt == 0) free_.remove(b);
            blk.ref_cnt++;
        }
        // ---- exercise 2 end ----
    }

    // Drop one reference on each block. A block reaching zero joins the free
    // list by the rule above, its prefix-index name kept; each end receives its
    // blocks in the order given (a table in reverse: section 2). A block
    // released more often than held (a table freed twice) is refused here.
    void release(const std::vector<int32_t>& ids_in_free_order) {
        // ---- exercise 2 begin: the LRU free list ----
        // First refuse a double free: no id may appear more often than its
        // ref_cnt (throw std::logic_error, and change nothing). Then drop one
        // reference per id; a block reaching zero goes to the tail
        // (free_.push_back) if it is cached (index_.cached), else to the head
        // (free_.push_front), both groups keeping the order given.
        std::vector<int32_t> sorted(ids_in_free_order);  // to count repeats of one id
        std::sort(sorted.begin(), sorted.end());
        for (size_t i = 0, n = 1; i < sorted.size(); ++i, ++n) {
            if (i > 0 && sorted[i] != sorted[i - 1]) n = 1;
            if (checked(sorted[i], "release").ref_cnt < (int)n)
                throw std::logic_error("BlockPool::release: block " + std::to_string(sorted[i]) +
                                       " released more often than it is held (double free)");
        }
        std::vector<int32_t> to_head;  // [uncached blocks freed] in the order given
        for (int32_t b : ids_in_free_order) {
            if (--blocks_[b].ref_cnt > 0) continue;
            if (index_.cached(b)) free_.push_back(b);
            else to_head.push_back(b);
        }
        // Pushing onto the head reverses order, so push the last one first.
        for (auto it = to_head.rbegin(); it != to_head.rend(); ++it) free_.push_front(*it);
        // ---- exercise 2 end ----
    }

private:
    KVBlock& checked(int32_t b, const char* what) {
        if (b < 0 || b >= num_blocks())
            throw std::out_of_range(std::string("BlockPool::") + what + ": block id " + std::to_string(b) + " is not in 0.." +
                                    std::to_string(num_blocks() - 1));
        return blocks_[b];
    }
    int block_size_ = 0;
    bool prefix_caching_ = false;
    FreeBlockQueue free_;          // the free blocks: front = next handed out
    PrefixIndex index_;            // which blocks prefix caching can find, and by what name
    std::vector<KVBlock> blocks_;  // [num_blocks]
};

// ============================================================================
// 2. Block tables: growth and tail-first free
// ============================================================================
//
// A block table belongs to one request: the blocks that hold its positions,
// in logical order (which of them are named is core/prefix_index.hpp's business).

struct BlockTable {
    std::vector<int32_t> blocks;  // [num logical blocks] physical block ids
};

// How many of `hits` sit in the free list: such a hit leaves the list when
// touched, so "does this fit?" must count it like a new block.
inline int num_free_hits(const BlockPool& pool, const std::vector<int32_t>& hits) {
    int n = 0;
    for (int32_t b : hits) n += pool.block(b).ref_cnt == 0;
    return n;
}

// Grow `table` to hold `num_tokens` positions; `hits` are prefix-cache hits
// for a table still empty ({} otherwise). All or nothing: false, nothing changed.
inline bool allocate_slots(BlockPool& pool, BlockTable& table, const std::vector<int32_t>& hits, int64_t num_tokens) {
    if (!hits.empty() && !table.blocks.empty()) throw std::logic_error("allocate_slots: prefix hits for a table that is not empty");
    for (size_t i = 0; i < hits.size(); ++i)  // a table holds a block once (find_cached_prefix's hits always do)
        if (std::find(hits.begin(), hits.begin() + (ptrdiff_t)i, hits[i]) != hits.begin() + (ptrdiff_t)i)
            throw std::invalid_argument("allocate_slots: the hit list names block " + std::to_string(hits[i]) + " twice");
    // ---- exercise 3 begin: block table growth ----
    // Count what is missing: blocks_for_tokens(num_tokens) minus what the
    // table and the hits already give. Refuse (false, nothing changed) if the
    // free list cannot supply the missing blocks plus the hits that sit in it
    // (num_free_hits). Otherwise touch the hits, append them, then allocate.
    const int64_t have = (int64_t)table.blocks.size() + (int64_t)hits.size();
    const int64_t need_new = std::max<int64_t>(0, blocks_for_tokens(num_tokens, pool.block_size()) - have);
    if (need_new + num_free_hits(pool, hits) > pool.num_free_blocks()) return false;
    pool.touch(hits);
    table.blocks.insert(table.blocks.end(), hits.begin(), hits.end());
    pool.allocate((int)need_new, table.blocks);
    return true;
    // ---- exercise 3 end ----
}

// Give every block of `table` back, last logical block first (so tails are
// evicted before the shared heads), and leave the table empty.
inline void free_blocks(BlockPool& pool, BlockTable& table) {
    // ---- exercise 3 begin: block table growth ----
    // Release in reverse logical order, then leave the table empty.
    std::vector<int32_t> reversed(table.blocks.rbegin(), table.blocks.rend());
    pool.release(reversed);
    table = BlockTable{};
    // ---- exercise 3 end ----
}

}  // namespace pkv

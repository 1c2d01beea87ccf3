// core/prefix_index.hpp -- chapter 1: the prefix cache's index, which full
// block holds which tokens.
//
// When prefix caching is on, a full block whose K/V are computed gets a name:
// a chained hash of its tokens (core/prefix_cache.hpp says how it is made).
// This header is the map from that name to the block, and what each named
// block remembers of its contents. The block pool (core/block_pool.hpp) owns
// one index. It tells the index one thing: a block left the free list to be
// reused (evict: its old contents are about to be overwritten); and asks it
// one: does this block hold something findable (cached: then the freed block
// goes to the tail of the free list, to be evicted last).
//
// A name survives its block going back to the free list ("lazy eviction"):
// a freed block keeps its K/V until someone overwrites it, so a later request
// with the same prefix may still find it there. It is dropped only when the
// pool hands the block out again. vLLM V1 keeps the same map inside its
// BlockPool (cached_block_hash_to_block) and the hash in each KVCacheBlock;
// we keep them apart so that chapter 1's pool reads as a free list alone.
#pragma once

#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <vector>

namespace pkv {

// What the index remembers of one block. Set once the block is full and
// hashed; cleared when the pool hands it out again.
struct PrefixEntry {
    bool has_hash = false;
    uint64_t block_hash = 0;
    uint64_t parent_hash = 0;     // hash of the previous block of the same chain
    std::vector<int32_t> tokens;  // [block_size] token ids, for the collision guard
};

// Two views of one relation, kept in step: the map answers lookup's question
// ("which block holds this name?"), the entries answer eviction's ("what
// name does this block hold?"). A block is cached exactly when the map
// points back at it: core/block_pool_check.hpp checks that after every step
// in the tests.
class PrefixIndex {
public:
    PrefixIndex() = default;
    PrefixIndex(int num_blocks, int block_size) : block_size_(block_size), entries_((size_t)num_blocks) {}

    // Tests shrink this (e.g. to 0x3) to force hash collisions and exercise the
    // token-equality guard. 64 bits in normal use.
    uint64_t hash_mask = ~0ull;

    const PrefixEntry& entry(int32_t id) const { return entries_.at((size_t)id); }
    bool cached(int32_t id) const { return entry(id).has_hash; }
    size_t num_cached_blocks() const { return map_.size(); }
    // chained hash -> block id; core/block_pool_check.hpp checks it against the entries.
    const std::unordered_map<uint64_t, int32_t>& cached_blocks() const { return map_; }

    // Look up a full block with this chained hash whose parent hash and tokens
    // are exactly these. Returns the block id or -1.
    int32_t lookup(uint64_t hash, uint64_t parent_hash, const int32_t* tokens) const {
        auto it = map_.find(hash);
        if (it == map_.end()) return -1;
        const PrefixEntry& e = entries_[(size_t)it->second];
        // The collision guard: equal hashes are not proof of equal contents.
        if (e.parent_hash != parent_hash) return -1;
        if (std::memcmp(e.tokens.data(), tokens, sizeof(int32_t) * (size_t)block_size_) != 0) return -1;
        return it->second;
    }

    // Record that block `id` is full and holds `tokens`, with this chained hash.
    // If another block already holds this hash we keep the older entry (the new
    // block simply stays uncached): one hash, one block.
    void cache_block(int32_t id, uint64_t hash, uint64_t parent_hash, const int32_t* tokens) {
        if (id < 0 || (size_t)id >= entries_.size())
            throw std::out_of_range("PrefixIndex::cache_block: block id " + std::to_string(id) + " is not in 0.." +
                                    std::to_string((long)entries_.size() - 1));
        PrefixEntry& e = entries_[(size_t)id];
        if (e.has_hash || map_.count(hash)) return;
        e.has_hash = true;
        e.block_hash = hash;
        e.parent_hash = parent_hash;
        e.tokens.assign(tokens, tokens + block_size_);
        map_[hash] = id;
    }

    // The pool hands block `id` out again: its contents are about to be
    // overwritten, so its name goes. (Only the pool calls this.) A block that
    // stayed uncached (an older block holds its hash) has nothing to drop.
    void evict(int32_t id) {
        PrefixEntry& e = entries_[(size_t)id];
        if (!e.has_hash) return;
        auto it = map_.find(e.block_hash);
        if (it != map_.end() && it->second == id) map_.erase(it);
        e.has_hash = false;
        e.tokens.clear();  // keeps its capacity: the next hash of this block reuses it
    }

private:
    int block_size_ = 0;
    std::vector<PrefixEntry> entries_;             // [num_blocks]
    std::unordered_map<uint64_t, int32_t> map_;    // chained hash -> block id
};

}  // namespace pkv

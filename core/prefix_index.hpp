// core/prefix_index.hpp -- chapter 4: the prefix cache's index, which full
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

// The parent hash of a sequence's first block.
constexpr uint64_t kRootHash = 0x9e3779b97f4a7c15ull;

// What the index remembers of one block, once the block is full and its
// K/V are computed; all of it is cleared when the pool hands the block out
// again. A block's `state` says what registering it found:
//   kNone    not registered: not full yet, not computed yet, or reused since
//   kNamed   it holds the name: lookup finds it (cached() is true)
//   kTwin    an identical block (same parent hash, same tokens) already holds
//            the name: one name, one block, so this one stays unfindable, but
//            the chain goes on through it (two requests computed one prefix)
//   kBroken  another block with *other* contents holds the hash (a
//            collision): nothing after it in its sequence can be named,
//            because a chained hash would vouch for a prefix it does not have
// Blocks are registered in logical order, so in a block table the
// registered blocks (state != kNone) always come first: that is all the
// state prefix caching needs per request (core/prefix_cache.hpp,
// cache_full_blocks). vLLM V1 keeps it per request instead (its block_hashes).
enum class PrefixState { kNone, kNamed, kTwin, kBroken };

struct PrefixEntry {
    PrefixState state = PrefixState::kNone;
    uint64_t block_hash = 0;      // kNamed, kTwin: the chained hash of this block
    uint64_t parent_hash = 0;     // kNamed: hash of the previous block of the same chain
    std::vector<int32_t> tokens;  // kNamed: [block_size] token ids, for the collision guard
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
    bool cached(int32_t id) const { return entry(id).state == PrefixState::kNamed; }
    bool registered(int32_t id) const { return entry(id).state != PrefixState::kNone; }
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

    // Register block `id`: it is full and holds `tokens`, with this chained
    // hash. It takes the name unless another block holds it already (one
    // hash, one block): a twin if that block has the same parent and tokens,
    // a broken chain if it has other contents. Returns the state recorded.
    PrefixState cache_block(int32_t id, uint64_t hash, uint64_t parent_hash, const int32_t* tokens) {
        if (id < 0 || (size_t)id >= entries_.size())
            throw std::out_of_range("PrefixIndex::cache_block: block id " + std::to_string(id) + " is not in 0.." +
                                    std::to_string((long)entries_.size() - 1));
        PrefixEntry& e = entries_[(size_t)id];
        if (e.state != PrefixState::kNone) return e.state;  // registered already
        e.block_hash = hash;
        if (map_.count(hash)) {
            e.state = lookup(hash, parent_hash, tokens) >= 0 ? PrefixState::kTwin : PrefixState::kBroken;
            return e.state;
        }
        e.state = PrefixState::kNamed;
        e.parent_hash = parent_hash;
        e.tokens.assign(tokens, tokens + block_size_);
        map_[hash] = id;
        return e.state;
    }

    // The pool hands block `id` out again: its contents are about to be
    // overwritten, so its name goes, and whatever else registering it
    // recorded. (Only the pool calls this.)
    void evict(int32_t id) {
        PrefixEntry& e = entries_[(size_t)id];
        if (e.state == PrefixState::kNone) return;
        if (e.state == PrefixState::kNamed) map_.erase(e.block_hash);
        e.state = PrefixState::kNone;
        e.tokens.clear();  // keeps its capacity: the next hash of this block reuses it
    }

private:
    int block_size_ = 0;
    std::vector<PrefixEntry> entries_;             // [num_blocks]
    std::unordered_map<uint64_t, int32_t> map_;    // chained hash -> block id
};

}  // namespace pkv

// core/prefix_cache.hpp -- chapter 4: what a new or a resumed
// request can skip computing, because its prefix's K/V are still in the cache.
//
// A freed block keeps its K/V until someone overwrites it. If we remember
// which tokens a full block holds, a later request starting with the same
// tokens -- a shared system prompt, or a preempted request coming back -- can
// take that block instead of computing it again. core/prefix_index.hpp keeps
// the hash -> block map, and the pool evicts lazily (a freed cached block
// stays findable until it is handed out again, least recently freed first);
// this header names blocks by hash and walks a sequence's blocks. Sections:
// 1. chained hashes; 2. the lookup at admission; 3. registration after compute.
//
// For the key question you may read find_cached_prefix's contract and skip
// the rest: a request is admitted with its longest cached prefix already
// computed (scheduler.hpp, try_admit), and its blocks enter the cache once
// their K/V are written (Scheduler::on_computed). vLLM finds the prefix in
// kv_cache_manager.py (get_computed_blocks) and names blocks in block_pool.py
// (cache_full_blocks), as soon as allocate_slots hands them out.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/block_pool.hpp"

namespace pkv {

// ============================================================================
// 1. Chained hashes of full blocks
// ============================================================================
//
// A full block is identified by hash(parent block's hash, its block_size tokens).
// Chaining makes the hash name the whole prefix, not just this block: two
// requests that share tokens 32..47 but not 0..31 must not share block 2.
// Only full blocks are hashed -- a partial tail block is still being written.
//
// The hash is FNV-1a-style mixing over 64 bits; vLLM uses SHA-256 by default
// (prefix_caching_hash_algo: sha256, sha256_cbor, xxhash or xxhash_cbor).
// Whatever the function, collisions are possible, which is why
// PrefixIndex::lookup also compares parent hash and tokens.

inline uint64_t hash_block_tokens(uint64_t parent_hash, const int32_t* tokens, int block_size, uint64_t mask) {
    uint64_t h = 1469598103934665603ull ^ parent_hash;
    for (int i = 0; i < block_size; ++i) {
        h ^= (uint32_t)tokens[i];
        h *= 1099511628211ull;
        h ^= h >> 29;
    }
    return h & mask;
}

// ============================================================================
// 2. The lookup at admission
// ============================================================================

// The longest run of cached full blocks matching the start of `tokens`.
// The hit is capped at num_tokens - 1 tokens: the last token is always computed,
// because its forward pass is what produces the logits we sample from. (With
// num_tokens = 32 and block_size 16 that means one hit block, not two.)
// Returns the hit block ids (not yet touched) in logical order.
inline std::vector<int32_t> find_cached_prefix(const BlockPool& pool, const int32_t* tokens, int num_tokens) {
    // ---- exercise 7 begin: chained hashes and the prefix lookup ----
    // Walk the full blocks of `tokens` from the first: hash each with its
    // parent's hash (kRootHash for block 0), look it up in the pool's index
    // (pool.prefix_index(): lookup, hash_mask), stop at the first miss. Never
    // hit the block holding the last token: at most (num_tokens - 1) /
    // block_size blocks. Nothing without prefix caching.
    std::vector<int32_t> hits;
    if (!pool.prefix_caching() || num_tokens <= 0) return hits;
    const PrefixIndex& index = pool.prefix_index();
    const int bs = pool.block_size();
    const int max_blocks = (num_tokens - 1) / bs;
    uint64_t parent = kRootHash;
    for (int i = 0; i < max_blocks; ++i) {
        const int32_t* blk_tokens = tokens + (size_t)i * bs;
        uint64_t h = hash_block_tokens(parent, blk_tokens, bs, index.hash_mask);
        int32_t id = index.lookup(h, parent, blk_tokens);
        if (id < 0) break;
        hits.push_back(id);
        parent = h;
    }
    return hits;
    // ---- exercise 7 end ----
}

// ============================================================================
// 3. Registration, once a block's K/V are computed
// ============================================================================

// Register every block of `table` that is full of computed tokens. `tokens` are
// the sequence's tokens (prompt then outputs); `num_computed` how many of them
// have K/V written. Called after each forward step when prefix caching is on.
// Blocks are registered in logical order, so the registered ones lead the
// table (its prefix hits among them); the work each call is the full blocks
// after them, usually none or one. A table can be registered again after a
// preemption: its new blocks start unregistered, its hits do not.
inline void cache_full_blocks(BlockPool& pool, const BlockTable& table, const int32_t* tokens, int num_computed) {
    // ---- exercise 7 begin: chained hashes and the prefix lookup ----
    // Find the first full block not registered yet (index.registered), going
    // back from the last full one. Its parent hash is the block_hash of the
    // block before it (kRootHash for block 0); stop at once if that block is
    // kBroken. Then register each full block from there in order
    // (index.cache_block), each hashed with its parent's hash; stop for good
    // at a block that comes back kBroken (a collision).
    if (!pool.prefix_caching()) return;
    PrefixIndex& index = pool.prefix_index();
    const int bs = pool.block_size();
    const int num_full = num_computed / bs;
    if (num_computed < 0 || (size_t)num_full > table.blocks.size())
        throw std::invalid_argument("cache_full_blocks: " + std::to_string(num_computed) + " computed tokens, but the table holds " +
                                    std::to_string(table.blocks.size()) + " blocks of " + std::to_string(bs));
    int i = num_full;
    while (i > 0 && !index.registered(table.blocks[(size_t)i - 1])) --i;
    uint64_t parent = kRootHash;
    if (i > 0) {
        const PrefixEntry& before = index.entry(table.blocks[(size_t)i - 1]);
        if (before.state == PrefixState::kBroken) return;
        parent = before.block_hash;
    }
    for (; i < num_full; ++i) {
        const int32_t* blk_tokens = tokens + (size_t)i * bs;
        const uint64_t h = hash_block_tokens(parent, blk_tokens, bs, index.hash_mask);
        if (index.cache_block(table.blocks[(size_t)i], h, parent, blk_tokens) == PrefixState::kBroken) return;
        parent = h;
    }
    // ---- exercise 7 end ----
}

}  // namespace pkv

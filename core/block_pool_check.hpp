// core/block_pool_check.hpp -- chapter 1: what must always hold between the
// block pool and the block tables that use it, checked.
//
// The tests (and the course kit's checks) call check_invariants after every
// engine step of thousands of randomized workloads: a bookkeeping bug
// anywhere above the pool -- a table freed twice, a block handed to two
// tables, a free list that lost a link -- shows up at the step that caused
// it, not hundreds of steps later as a wrong token. It reads the pool only
// through its public views, so it cannot change what it checks.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/block_pool.hpp"

namespace pkv {

// Check `pool` against the block tables that are supposed to be its only
// users. Returns "" when consistent, else a description of the first
// violation:
//   - every block is free xor referenced (in the free list <=> ref_cnt == 0);
//   - each ref_cnt equals the number of block tables holding the block;
//   - the free list is a well-formed chain of num_free_blocks() distinct blocks;
//   - no table holds a block twice; every hash map entry points at a block
//     that carries that hash.
inline std::string check_invariants(const BlockPool& pool, const std::vector<const std::vector<int32_t>*>& tables) {
    const int n = pool.num_blocks();
    std::vector<int> holders(n, 0);
    std::vector<int> last_table(n, -1);  // [block] the last table seen holding it: O(blocks + table entries) in all
    for (size_t t = 0; t < tables.size(); ++t) {
        for (int32_t b : *tables[t]) {
            if (b < 0 || b >= n) return "table " + std::to_string(t) + " holds invalid block " + std::to_string(b);
            if (last_table[b] == (int)t) return "table " + std::to_string(t) + " holds block " + std::to_string(b) + " twice";
            last_table[b] = (int)t;
            holders[b]++;
        }
    }
    for (int b = 0; b < n; ++b) {
        const KVBlock& blk = pool.block(b);
        if (blk.ref_cnt != holders[b])
            return "block " + std::to_string(b) + " ref_cnt " + std::to_string(blk.ref_cnt) + " but held by " +
                   std::to_string(holders[b]) + " tables";
        if (pool.free_list().contains(b) != (blk.ref_cnt == 0))
            return "block " + std::to_string(b) + " free-list membership disagrees with ref_cnt";
    }
    std::vector<char> seen(n, 0);
    int count = 0;
    int32_t prev = -1;
    for (int32_t b = pool.free_list().front(); b != -1; b = pool.free_list().next(b)) {
        if (b < 0 || b >= n || seen[b]) return "free list is corrupt (cycle or bad id) at block " + std::to_string(b);
        if (pool.free_list().prev(b) != prev) return "free list back link broken at block " + std::to_string(b);
        if (!pool.free_list().contains(b)) return "block " + std::to_string(b) + " linked but not marked free";
        seen[b] = 1;
        prev = b;
        ++count;
    }
    if (prev != pool.free_list().back()) return "free list tail pointer is wrong";
    if (count != pool.num_free_blocks())
        return "free list has " + std::to_string(count) + " blocks, counter says " + std::to_string(pool.num_free_blocks());
    // Every hash map entry must point at a block that carries its hash.
    // Walking the map itself chases a pointer per entry through memory (slow
    // once tens of thousands of blocks are cached); instead each block looks
    // up its own hash, which can account for at most one entry, so the count
    // of blocks that find themselves equals the map's size exactly when every
    // entry is right.
    const PrefixIndex& index = pool.prefix_index();
    const auto& cached = index.cached_blocks();
    size_t mapped = 0;
    for (int b = 0; b < n; ++b) {
        if (!index.cached(b)) continue;
        const auto it = cached.find(index.entry(b).block_hash);
        mapped += it != cached.end() && it->second == b;
    }
    if (mapped != cached.size())
        for (const auto& [h, b] : cached)  // rare: name the culprit
            if (!index.cached(b) || index.entry(b).block_hash != h)
                return "hash map entry points at block " + std::to_string(b) + " without that hash";
    return "";
}

}  // namespace pkv

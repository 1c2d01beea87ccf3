// examples/kv_tour.cpp -- the block pool, narrated. TUTORIAL.md chapter 1 walks
// through its output: block tables, slots, the free list as an LRU queue,
// tail-first freeing, and a prefix-cache hit on a freed block.
//
//   build/kv_tour
#include <cstdio>
#include <string>
#include <vector>

#include "core/block_pool.hpp"
#include "core/block_pool_check.hpp"
#include "core/prefix_cache.hpp"
#include "examples/cli.hpp"
#include "paged_kv.cuh"

namespace {

std::string list(const std::vector<int32_t>& v) {
    std::string s = "[";
    for (size_t i = 0; i < v.size(); ++i) s += (i ? " " : "") + std::to_string(v[i]);
    return s + "]";
}

// The free list from head (next to be handed out) to tail.
std::string free_list(const pkv::BlockPool& pool) {
    std::vector<int32_t> ids;
    for (int32_t b = pool.free_list().front(); b != -1; b = pool.free_list().next(b)) ids.push_back(b);
    return list(ids);
}

void show(const char* what, const pkv::BlockPool& pool) {
    std::printf("%-44s free list %s  usage %.0f%%\n", what, free_list(pool).c_str(), 100 * pool.kv_cache_usage_perc());
}

}  // namespace

int run(int argc, char** argv) {
    cli::Parser p("kv_tour", "", "Narrates block allocation, slots, the free list's order and a prefix-cache hit.");
    p.parse(argc, argv);
    const int block_size = 4;
    pkv::BlockPool pool(8, block_size, /*enable_prefix_caching=*/true);
    std::printf("A pool of 8 blocks x %d slots, prefix caching on.\n", block_size);
    show("start:", pool);
    {
        pkv::BlockTable tx;
        pkv::allocate_slots(pool, tx, {}, 10);
        show("X takes 3 blocks for 10 tokens:", pool);
        pkv::free_blocks(pool, tx);
        show("X finishes; its blocks go back tail first:", pool);
    }

    // Two sequences with the same 8-token prompt, then one more token each.
    std::vector<int32_t> a = {1, 10, 11, 12, 13, 14, 15, 16, 17};
    pkv::BlockTable ta, tb;
    pkv::allocate_slots(pool, ta, {}, (int)a.size());
    show("A allocates 3 blocks for 9 tokens:", pool);
    std::printf("  A.block_table = %s\n", list(ta.blocks).c_str());
    for (int p : {0, 3, 4, 8})
        std::printf("  position %d -> logical block %d -> physical block %d -> slot %lld\n", p, p / block_size,
                    ta.blocks[p / block_size], (long long)pkv::slot_of(ta.blocks.data(), p, block_size));
    pkv::cache_full_blocks(pool, ta, a.data(), (int)a.size());
    std::printf("  A's 2 full blocks are hashed into the prefix cache (%zu cached)\n", pool.prefix_index().num_cached_blocks());

    std::vector<int32_t> b = a;
    b.back() = 99;  // same prompt, different last token
    std::vector<int32_t> hits = pkv::find_cached_prefix(pool, b.data(), (int)b.size());
    pkv::allocate_slots(pool, tb, hits, (int)b.size());
    std::printf("B shares A's first 8 tokens: %zu hit blocks, B.block_table = %s\n", hits.size(), list(tb.blocks).c_str());
    std::printf("  ref_cnt of block %d is now %d (held by A and B)\n", ta.blocks[0], pool.block(ta.blocks[0]).ref_cnt);
    show("after B:", pool);

    pkv::free_blocks(pool, tb);
    show("B finishes; only its own tail block frees:", pool);
    pkv::free_blocks(pool, ta);
    show("A finishes; freed tail first:", pool);
    std::printf("  A's two full blocks keep their hashes in the free list: lazy eviction\n");

    std::vector<int32_t> c = a;
    hits = pkv::find_cached_prefix(pool, c.data(), (int)c.size());
    std::printf("C arrives with A's tokens: %zu hit blocks %s, found in the free list\n", hits.size(), list(hits).c_str());
    pkv::BlockTable tc;
    pkv::allocate_slots(pool, tc, hits, (int)c.size());
    show("C touches its hits (unlinked, O(1)):", pool);
    std::printf("  C.block_table = %s; invariants: %s\n", list(tc.blocks).c_str(),
                check_invariants(pool, {&tc.blocks}).empty() ? "ok" : "BROKEN");
    return 0;
}

int main(int argc, char** argv) { return cli::guarded_main("kv_tour", [&] { return run(argc, argv); }); }

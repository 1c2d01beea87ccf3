// lab/attention_partitioned.cuh -- lab/LAB.md chapter L2: paged attention,
// partitioned ("split-KV"): vLLM's paged_attention v2, built to reach a GPU's
// memory roof.
//
// paged_kv.cuh's paged_attention_kernel is the one to read: one thread block
// per (token, kv head), tiles through shared memory, barriers between steps.
// This file is the faster pair the programs run by default (examples/devices.hpp
// chooses it, lab/fast_gpu.cuh wraps it), and a reader may skip it. It takes
// the same AttentionArgs, accepts the same shapes (check_attention_shape), and
// agrees with paged_attention_ref within the tests' tolerance; the model's
// greedy tokens are unchanged (tests/test_kernels.cpp).
//
// Sections: 1. the design and the partition kernel  2. the merge kernel
// 3. the host side: PartitionedAttention, which owns its workspace.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "core/emu/cuda_shim.hpp"
#include "paged_kv.cuh"

namespace pkv {

// ============================================================================
// 1. The partition kernel
// ============================================================================
//
// The baseline kernel gives one thread block the whole context of one (token,
// kv head). A decode batch of a few sequences is then a few dozen blocks on a
// GPU with 132 multiprocessors, each block walking thousands of keys one tile
// after another: most of the GPU idles while a handful of blocks are busy for
// a long time. vLLM's paged_attention v2 answers with two kernels, and so do
// we:
//
//   paged_attention_partition_kernel, grid (num_tokens, n_kv_heads,
//     max_partitions), block (128 threads = 4 warps): block (t, kvh, p) reads
//     only keys p * P .. p * P + P - 1 of token t's context (P =
//     kPartitionKeys = 512) and computes, for each query head of the GQA group,
//     the partition's softmax *state*: its running max m, its sum
//     l = sum_j exp(s_j - m), and its unnormalised output
//     acc[d] = sum_j exp(s_j - m) v_j[d]. A context of 2000 keys keeps 4 blocks
//     busy instead of 1.
//   paged_attention_merge_kernel, grid (num_tokens, n_heads): combines a
//     token's partitions, in the fixed order 0, 1, 2, ..., into
//     out = sum_p exp(m_p - M) acc_p / sum_p exp(m_p - M) l_p, M = max_p m_p.
//
// Why a *fixed* partition size. The split could adapt to the batch (fewer,
// longer partitions when many tokens already fill the GPU, as some kernels do),
// but then a token's sums would be grouped differently depending on which other
// tokens share the launch, and its output would change in the last bits with
// the batch. Our engine promises batch invariance (a recomputed request
// reproduces its tokens), so a token's partitions depend only on its own
// context length: P is a compile-time constant. The same holds for everything
// inside a partition: which thread reads which key is a function of the key's
// index in the partition, never of the launch's shape. (The table width
// max_blocks_per_seq does set how many partition blocks are *launched*; the
// ones past a token's context return at once, so it changes nothing either.)
// 512 keys is vLLM v2's choice; it keeps every block busy for a while (the
// fixed cost of a block -- q into registers, the slot table, the final merge
// -- is shared by 512 keys), and costs one workspace row per 512 keys.
//
// Why the merge order is fixed. Floating-point sums depend on their order. The
// merge kernel adds the partitions in index order, always, and inside a
// partition block the four warps' states are merged in warp order by the same
// threads every time. Nothing is combined with atomics, whose order would be
// whatever the hardware's timing was.
//
// A token whose context fits in one partition (ctx <= 512, every token of a
// short sequence) needs no merge: its single partition block divides acc / l
// and writes the output itself, and the merge kernel skips the token. That
// rule depends only on the token's own context, so it is deterministic; and
// it gives the bits a merge of one partition would (exp(0) = 1 exactly). When
// no token of the launch can have a second partition (max_blocks_per_seq *
// block_size <= 512) the merge kernel is not launched at all.
//
// Inside a partition block: a *key group* of KG lanes shares each key, KG =
// min(32, head_dim / 4) rounded down to a power of two, so each lane owns
// head_dim / KG elements of the head vectors, in float4 chunks: chunk c
// (elements 4c .. 4c+3) belongs to lane c % KG of the group.
//   - q in registers: each lane loads its chunks of the group's query heads
//     once; no shared-memory round trip, no barrier before the first key.
//   - K and V with one vector load per chunk (kv_load4_at: 16 bytes of f32,
//     8 of f16, 4 of int8, with the hardware's exact conversions). A group's
//     lanes read consecutive 16-byte chunks of one key's vector, so for
//     head_dim 128 a warp reads one whole 512-byte K row per instruction.
//   - the dot product: each lane sums its own products, then the group adds its
//     lanes' partial sums with butterfly shuffles (shfl_xor with lane masks
//     1, 2, .. KG/2): log2(KG) register-to-register steps instead of a trip
//     through shared memory and a block-wide barrier. After a butterfly every
//     lane holds the same sum, bit for bit (a + b == b + a in IEEE).
//   - the online softmax per lane, per head, key after key, with one exp per
//     (key, head): a key above the running max rescales the state by
//     exp(m - s) and enters with weight exp(0) = 1; any other key enters with
//     exp(s - m). No thread ever folds a whole tile alone (the baseline's
//     serial step 3), and there is no barrier inside the key loop at all.
//   - at the end of the partition the groups' states merge: inside a warp by
//     shuffles (lane masks KG .. 16, each step combining two states with the
//     usual rescaling), then the four warps' states through shared memory, in
//     warp order, by one thread per (head, element).
//   - slot addresses: the partition's slots are computed once, through slot_of
//     and kv_offset (the only place a position becomes an address), one per
//     key, into a shared table of 512 offsets. The per-element index math of
//     the baseline (divisions by head_dim, per element, per tile) is gone: the
//     kernel is a template on head_dim (8, 16, 32, 64, 128, and 0 = any other
//     multiple of 4 up to 256, a generic instantiation with run-time bounds),
//     so chunk loops unroll and their bounds are constants.
//   - at most PartLayout::kHeadsPerPass = 4 query heads are held in registers
//     at once: a larger GQA group is done in several passes over the
//     partition's keys, which re-reads K and V (from L1/L2, mostly) but keeps
//     q and acc in registers, never spilled to local memory.
//   - each group takes kKeysPerRound keys (4; 2 above head_dim 128) per round:
//     their K and V loads are in flight together, and the group's butterfly
//     sums all (head, key) dot products of the round in the same steps.
//
// What each buys, as estimates rather than measurements (this repository
// reports no GPU timings in comments; lab/bench_attention.cpp measures):
// the split raises the number of busy blocks for a long decode by ctx / 512;
// shuffles remove the baseline's 4 block barriers per tile and its serial
// softmax step; register-resident q and acc remove the shared-memory reads of
// q and of the V tile, so a decode's time should approach what its K/V bytes
// cost at memory bandwidth. The price: a workspace and a second, small launch
// for contexts above 512 keys, and a different rounding order than both the
// reference and the baseline (within the tests' tolerance; the model's greedy
// tokens are unchanged).
//
// Accuracy. Scores are q.k summed in another order than the reference (per
// lane, then a tree across the group), then divided by sqrtf(head_dim) as the
// reference does. The baseline sums in the reference's order, so its scores are
// bit-identical; ours may differ in the last bit, and exp(s - m) passes that
// on as a relative error of about 2^-24 * |s| to each weight: with scores of
// size 10, ~1e-6. The softmax then rescales as often as the running max rises.
// Emulated, the tests see outputs within ~1e-5 of the reference (the
// baseline: ~2e-6) against a tolerance of 1e-5 + 1e-4 |out|; through a model
// that stays far inside kLogitTol (test_kernels.cpp).

constexpr int kPartitionKeys = 512;  // keys per partition: fixed, see above
constexpr int kPartThreads = 128;    // 4 warps per partition block
constexpr int kMergeThreads = 128;   // threads of a merge block: one per output element (strided)

// The compile-time layout of a partition block for head_dim HD (0: generic).
// HD == 0 sizes its arrays for the largest head_dim, 256, and keeps run-time
// bounds; the specialised ones are exact.
template <int HD>
struct PartLayout {
    static constexpr int kChunks = (HD ? HD : 256) / 4;  // float4 chunks per head vector
    // Lanes per key: the largest power of two <= min(32, chunks).
    static constexpr int kLanes = kChunks >= 32 ? 32 : kChunks >= 16 ? 16 : kChunks >= 8 ? 8 : kChunks >= 4 ? 4 : kChunks >= 2 ? 2 : 1;
    // Chunks per lane (at most 2 for any head_dim <= 256).
    static constexpr int kChunksPerLane = HD ? (kChunks + kLanes - 1) / kLanes : 2;
    // Query heads per pass: their q and acc take 2 * 4 * kChunksPerLane floats
    // each. 4 covers Llama-3-8B's group (32 / 8) in one pass. Registers decide
    // it: with 4 heads and 4 keys per round, CUDA 13's ptxas (sm_90) gives the
    // kernel about 120 registers, so 4 blocks (16 warps) fit on a
    // multiprocessor; with 8 heads about 240 -- no spills, but half the warps.
    static constexpr int kHeadsPerPass = 4;
    // Keys a group takes per round: their K and V take 2 * 4 * kChunksPerLane
    // floats each (32 in all), and their loads are in flight together.
    static constexpr int kKeysPerRound = kChunksPerLane == 1 ? 4 : 2;
    // Floats of one head's softmax state in a lane: m, l, acc chunks.
    static constexpr int kStateFloats = 2 + 4 * kChunksPerLane;
};

// Lanes per key for a run-time head_dim (the generic instantiation), the same
// rule as PartLayout::kLanes.
PKV_HD inline int part_lanes_for(int head_dim) {
    const int chunks = head_dim / 4;
    int lanes = 1;
    while (lanes * 2 <= chunks && lanes < 32) lanes *= 2;
    return lanes;
}

// Shared memory of a partition block, in bytes (all fit in 48 KiB: at most
// 8 KiB of offsets + 4 warps x 4 heads x (256 + 2) floats).
PKV_HD inline size_t partition_smem_bytes(int heads_per_pass, int head_dim) {
    return 2 * kPartitionKeys * sizeof(int64_t)                                 // offsets, head indices  [2, P]
           + (size_t)(kPartThreads / 32) * heads_per_pass * (head_dim + 2) * sizeof(float);  // warp states [4, GH, 2 + hd]
}

// Combine softmax state (m2, l2, a2) into (m, l, a): the larger max wins and
// each side is rescaled to it. An empty state has m = -inf, l = 0, a = 0 and
// weight 0 (not exp(-inf - -inf) = NaN). Symmetric: combining x into y gives
// the same bits as y into x, which is what lets both lanes of a shuffle agree.
PKV_HD inline float softmax_weight(float m, float m_max) { return m == -INFINITY ? 0.0f : expf(m - m_max); }

template <int HD>
PKV_KERNEL void paged_attention_partition_kernel(AttentionArgs args,  // out, q, caches, tables (paged_kv.cuh)
                                                 float* ws_ml,        // [num_tokens, n_heads, max_parts, 2] (m, l)
                                                 float* ws_acc,       // [num_tokens, n_heads, max_parts, head_dim]
                                                 int max_parts) {
    const AttentionShape& s = args.s;
    using L = PartLayout<HD>;
    constexpr int NC = L::kChunksPerLane, GH = L::kHeadsPerPass, U = L::kKeysPerRound, S = L::kStateFloats;
    const int hd = HD ? HD : s.head_dim;
    const int chunks = hd / 4;
    const int KG = HD ? L::kLanes : part_lanes_for(hd);  // lanes per key
    const int t = blockIdx.x, kvh = blockIdx.y, part = blockIdx.z;
    const int tid = threadIdx.x, nthr = blockDim.x, nwarps = nthr / 32;
    const int ctx = args.positions[t] + 1;
    const int start = part * kPartitionKeys;
    if (start >= ctx) return;  // past this token's context: the whole block leaves
    const int n = ctx - start < kPartitionKeys ? ctx - start : kPartitionKeys;  // keys here
    int nparts = (ctx + kPartitionKeys - 1) / kPartitionKeys;
    if (nparts > max_parts) nparts = max_parts;  // a context longer than its table row: stay inside the workspace
    const int G = s.n_heads / s.n_kv_heads;
    const int grp = tid / KG, gl = tid % KG, ngroups = nthr / KG;  // key group, lane in it, groups
    const int warp = tid / 32, lane = tid % 32;
    const int32_t* table = args.block_tables + (size_t)args.token_seq[t] * s.max_blocks_per_seq;
    const float scale_div = sqrtf((float)hd);

    int64_t* s_off = shared_memory<int64_t>();    // [P] element offset of key j's head vector
    int64_t* s_head = s_off + kPartitionKeys;     // [P] its head index (slot * n_kv_heads + kvh): int8 scales
    float* s_ws = reinterpret_cast<float*>(s_head + kPartitionKeys);  // [nwarps, GH, 2 + hd]: m, l, acc

    // The partition's addresses, once per key.
    for (int j = tid; j < n; j += nthr) {
        const int64_t slot = slot_of(table, start + j, s.block_size);
        s_off[j] = kv_offset(slot, kvh, s.n_kv_heads, hd);
        s_head[j] = slot * s.n_kv_heads + kvh;
    }
    syncthreads();

    for (int h0 = 0; h0 < G; h0 += GH) {  // passes over the group's heads (one when G <= GH)
        // q of heads h0 .. h0 + GH - 1 of the group, this lane's chunks.
        float qr[GH][NC][4];                  // [GH, NC, 4] q chunks c = gl + r * KG of each head
        float m[GH], l[GH], acc[GH][NC][4];   // [GH] max, [GH] sum, [GH, NC, 4] unnormalised output
        for (int hh = 0; hh < GH; ++hh) {
            const float* qh = args.q + ((size_t)t * s.n_heads + (size_t)kvh * G + h0 + hh) * hd;
            m[hh] = -INFINITY;
            l[hh] = 0.0f;
            for (int r = 0; r < NC; ++r) {
                const int c = gl + r * KG;
                for (int e = 0; e < 4; ++e) { qr[hh][r][e] = 0.0f; acc[hh][r][e] = 0.0f; }
                if (h0 + hh < G && c < chunks) load4(qh + 4 * c, qr[hh][r][0], qr[hh][r][1], qr[hh][r][2], qr[hh][r][3]);
            }
        }
        // Rounds of U keys per group: group grp takes keys base + u * ngroups
        // + grp. Every lane runs the same rounds (the shuffles need the whole
        // warp); a group past the end computes zeros and drops them.
        const int heads = G - h0 < GH ? G - h0 : GH;  // heads of this pass
        for (int base = 0; base < n; base += ngroups * U) {
            float kf[U][NC][4], vf[U][NC][4];  // [U, NC, 4] this lane's chunks of the round's keys and values
            bool valid[U];                     // [U] key inside the partition
            for (int u = 0; u < U; ++u) {
                const int j = base + u * ngroups + grp;
                valid[u] = j < n;
                for (int r = 0; r < NC; ++r) {
                    const int c = gl + r * KG;
                    for (int e = 0; e < 4; ++e) { kf[u][r][e] = 0.0f; vf[u][r][e] = 0.0f; }
                    if (valid[u] && c < chunks) {
                        kv_load4_at(args.k_cache, s_off[j] + 4 * c, s_head[j], kf[u][r][0], kf[u][r][1], kf[u][r][2], kf[u][r][3]);
                        kv_load4_at(args.v_cache, s_off[j] + 4 * c, s_head[j], vf[u][r][0], vf[u][r][1], vf[u][r][2], vf[u][r][3]);
                    }
                }
            }
            // This lane's share of every (head, key) dot product, then the
            // group's sum: a butterfly over its KG lanes, all products at once.
            float dot[GH * U], other[GH * U];  // [GH, U] per (head, key)
            for (int hh = 0; hh < GH; ++hh)
                for (int u = 0; u < U; ++u) {
                    float acc_dot = 0.0f;
                    for (int r = 0; r < NC; ++r)
                        for (int e = 0; e < 4; ++e) acc_dot += qr[hh][r][e] * kf[u][r][e];
                    dot[hh * U + u] = acc_dot;
                }
            for (int mask = 1; mask < KG; mask <<= 1) {
                shfl_xor_n(dot, other, heads * U, mask);
                for (int i = 0; i < GH * U; ++i) dot[i] += other[i];
            }
            // The online softmax, key by key in order, one exp per (key, head).
            for (int u = 0; u < U; ++u) {
                if (!valid[u]) continue;
                for (int hh = 0; hh < GH; ++hh) {
                    if (hh >= heads) break;
                    const float sc = dot[hh * U + u] / scale_div;
                    if (sc > m[hh]) {  // a new max: rescale what we have, this key weighs exp(0) = 1
                        const float alpha = expf(m[hh] - sc);  // exp(-inf) = 0 for the first key
                        m[hh] = sc;
                        l[hh] = l[hh] * alpha + 1.0f;
                        for (int r = 0; r < NC; ++r)
                            for (int e = 0; e < 4; ++e) acc[hh][r][e] = acc[hh][r][e] * alpha + vf[u][r][e];
                    } else {
                        const float p = expf(sc - m[hh]);
                        l[hh] += p;
                        for (int r = 0; r < NC; ++r)
                            for (int e = 0; e < 4; ++e) acc[hh][r][e] += p * vf[u][r][e];
                    }
                }
            }
        }
        // Merge the warp's key groups: lanes with the same gl, lane masks KG ..
        // 16, every head's state in one exchange.
        for (int mask = KG; mask < 32; mask <<= 1) {
            float mine[GH * S], theirs[GH * S];  // [GH, S]: per head m, l, acc chunks
            for (int hh = 0; hh < GH; ++hh) {
                mine[hh * S] = m[hh];
                mine[hh * S + 1] = l[hh];
                for (int r = 0; r < NC; ++r)
                    for (int e = 0; e < 4; ++e) mine[hh * S + 2 + 4 * r + e] = acc[hh][r][e];
            }
            shfl_xor_n(mine, theirs, heads * S, mask);
            for (int hh = 0; hh < GH; ++hh) {
                if (hh >= heads) break;
                const float m2 = theirs[hh * S], mm = fmaxf(m[hh], m2);
                const float w1 = softmax_weight(m[hh], mm), w2 = softmax_weight(m2, mm);
                l[hh] = l[hh] * w1 + theirs[hh * S + 1] * w2;
                for (int r = 0; r < NC; ++r)
                    for (int e = 0; e < 4; ++e) acc[hh][r][e] = acc[hh][r][e] * w1 + theirs[hh * S + 2 + 4 * r + e] * w2;
                m[hh] = mm;
            }
        }
        // Lanes 0 .. KG-1 of each warp now hold the warp's state: to shared memory.
        for (int hh = 0; hh < GH; ++hh) {
            if (hh >= heads) break;
            float* ws = s_ws + ((size_t)warp * GH + hh) * (2 + hd);
            if (lane == 0) { ws[0] = m[hh]; ws[1] = l[hh]; }
            if (lane < KG)
                for (int r = 0; r < NC; ++r) {
                    const int c = gl + r * KG;
                    if (c < chunks)
                        for (int e = 0; e < 4; ++e) ws[2 + 4 * c + e] = acc[hh][r][e];
                }
        }
        syncthreads();
        // The warps' states, merged in warp order: one thread per (head, element).
        for (int i = tid; i < heads * hd; i += nthr) {
            const int hh = i / hd, d = i % hd;  // hd is a constant in the specialised kernels
            float mm = -INFINITY;
            for (int w = 0; w < nwarps; ++w) mm = fmaxf(mm, s_ws[((size_t)w * GH + hh) * (2 + hd)]);
            float lsum = 0.0f, a = 0.0f;
            for (int w = 0; w < nwarps; ++w) {
                const float* ws = s_ws + ((size_t)w * GH + hh) * (2 + hd);
                const float wt = softmax_weight(ws[0], mm);
                lsum += ws[1] * wt;
                a += ws[2 + d] * wt;
            }
            const size_t head = (size_t)t * s.n_heads + (size_t)kvh * G + h0 + hh;  // global query head row
            if (nparts == 1) {
                args.out[head * hd + d] = a / lsum;  // the whole context was here: no merge
            } else {
                ws_acc[(head * max_parts + part) * hd + d] = a;
                if (d == 0) {
                    ws_ml[(head * max_parts + part) * 2] = mm;
                    ws_ml[(head * max_parts + part) * 2 + 1] = lsum;
                }
            }
        }
        syncthreads();  // the next pass rewrites s_ws
    }
}

// ============================================================================
// 2. The merge kernel
// ============================================================================

// grid (num_tokens, n_heads), block (kMergeThreads): token t, query head h.
// A token with one partition was finished by its partition block. Every
// thread recomputes M and the weights itself (a few exps per partition): no
// shared memory, no barrier, and the same order for every element.
template <class = void>
PKV_KERNEL void paged_attention_merge_kernel(float* out,              // [num_tokens, n_heads, head_dim]
                                             const float* ws_ml,      // [num_tokens, n_heads, max_parts, 2] (m, l)
                                             const float* ws_acc,     // [num_tokens, n_heads, max_parts, head_dim]
                                             const int32_t* positions,  // [num_tokens]
                                             int n_heads, int head_dim, int max_parts) {
    const int t = blockIdx.x, h = blockIdx.y;
    const int ctx = positions[t] + 1;
    int nparts = (ctx + kPartitionKeys - 1) / kPartitionKeys;
    if (nparts > max_parts) nparts = max_parts;  // a context longer than its table: never read past the workspace
    if (nparts <= 1) return;
    const size_t head = (size_t)t * n_heads + h;
    const float* ml = ws_ml + head * max_parts * 2;              // [max_parts, 2]
    const float* acc = ws_acc + head * max_parts * head_dim;     // [max_parts, head_dim]
    float mm = -INFINITY;
    for (int p = 0; p < nparts; ++p) mm = fmaxf(mm, ml[2 * p]);
    float lsum = 0.0f;
    for (int p = 0; p < nparts; ++p) lsum += ml[2 * p + 1] * softmax_weight(ml[2 * p], mm);
    for (int d = threadIdx.x; d < head_dim; d += blockDim.x) {
        float a = 0.0f;
        for (int p = 0; p < nparts; ++p) a += acc[(size_t)p * head_dim + d] * softmax_weight(ml[2 * p], mm);
        out[head * head_dim + d] = a / lsum;
    }
}

// ============================================================================
// 3. The host side
// ============================================================================
//
// The partition kernels need a workspace: m and l [num_tokens, n_heads,
// max_parts, 2], then acc [num_tokens, n_heads, max_parts, head_dim] (floats).
// Whoever launches them owns it -- a GpuRunner, through FastGpuMath, or a bench
// -- never the program: two runners on two host threads each launch into their
// own (tests/test_kernels.cpp runs two at once). It grows to the largest
// launch so far and is kept, because device memory is allocated rarely (see
// core/emu/cuda_shim.hpp's device_malloc).
class PartitionedAttention {
public:
    // Check the shape (before anything is launched), size the workspace,
    // launch the partition kernel for this head_dim, then the merge.
    void operator()(const AttentionArgs& a) {
        const AttentionShape& s = a.s;
        const std::string who = "paged_attention (partitioned): ";
        check_attention_shape(s, who);
        // The host cannot see the contexts (positions is device memory), but a
        // context never exceeds its block-table row: max_blocks_per_seq *
        // block_size keys bounds every token's partitions.
        const long long max_ctx = (long long)s.max_blocks_per_seq * s.block_size;
        const long long max_parts_ll = max_ctx <= 0 ? 1 : (max_ctx + kPartitionKeys - 1) / kPartitionKeys;
        if (max_parts_ll > (long long)kMaxGridYZ)
            throw std::invalid_argument(who + "max_blocks_per_seq * block_size = " + std::to_string(max_ctx) +
                                        " keys would need more than 65535 partitions of 512 (the grid's z limit)");
        const int max_parts = (int)max_parts_ll;
        if (a.num_tokens <= 0) return;
        float* ws_ml = nullptr;
        float* ws_acc = nullptr;
        if (max_parts > 1) {
            const size_t rows = (size_t)a.num_tokens * s.n_heads * max_parts;  // [num_tokens, n_heads, max_parts]
            workspace_.reserve(rows * (2 + (size_t)s.head_dim));
            ws_ml = workspace_.data();
            ws_acc = workspace_.data() + rows * 2;
        }
        const dim3 grid(a.num_tokens, s.n_kv_heads, max_parts), block(kPartThreads);
        const int hd = s.head_dim;
        auto go = [&](auto kern, int heads_per_pass) {
            launch(kern, grid, block, partition_smem_bytes(heads_per_pass, hd), a, ws_ml, ws_acc, max_parts);
        };
        switch (hd) {  // the head dims of our models and tests get their own kernel; any other, the generic one
            case 8: go(paged_attention_partition_kernel<8>, PartLayout<8>::kHeadsPerPass); break;
            case 16: go(paged_attention_partition_kernel<16>, PartLayout<16>::kHeadsPerPass); break;
            case 32: go(paged_attention_partition_kernel<32>, PartLayout<32>::kHeadsPerPass); break;
            case 64: go(paged_attention_partition_kernel<64>, PartLayout<64>::kHeadsPerPass); break;
            case 128: go(paged_attention_partition_kernel<128>, PartLayout<128>::kHeadsPerPass); break;
            default: go(paged_attention_partition_kernel<0>, PartLayout<0>::kHeadsPerPass); break;
        }
        if (max_parts > 1)
            launch(paged_attention_merge_kernel<>, dim3(a.num_tokens, s.n_heads), dim3(kMergeThreads), 0, a.out, (const float*)ws_ml,
                   (const float*)ws_acc, a.positions, s.n_heads, hd, max_parts);
    }

private:
    DeviceBuffer<float> workspace_;  // [rows * (2 + head_dim)] floats: m and l, then acc (above)
};

}  // namespace pkv

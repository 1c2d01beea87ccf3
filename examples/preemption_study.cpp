// examples/preemption_study.cpp -- what a preemption costs: recompute, prefix
// caching, or swap, on one overloaded workload.
//
// When the KV cache runs dry the scheduler preempts a victim, and its K/V must
// go somewhere. Recompute (vLLM V1) drops them and runs prompt + outputs
// through the model again on resume: it pays in compute. Prefix caching makes
// that cheaper when a victim's own blocks are still in the free list on
// resume. Swap (vLLM V0) copies the victim's blocks to a host swap space and
// back: it pays in bytes copied and host memory, and recomputes nothing --
// unless the swap space is full, when the victim falls back to recompute.
//
// Four rows on the same workload (the studies' overloaded one):
//   recompute | recompute + prefix caching | swap, ample space | swap, small space
// with preemptions, victims swapped and fallen back, recomputed tokens, bytes
// copied (out + in), useful and processed tok/s and inter-token latency p99
// (wall clock). Then the same four modes at several output lengths (32, 96
// and 160 by default), the pool scaled with the length so the pressure stays
// the same, to see how recomputed tokens and bytes moved grow.
//
// On this CPU engine the KV cache already lives in host memory, so a swap is
// a memcpy and a recompute is a forward pass on the same cores: this run
// measures that side of the trade. On a GPU the copy crosses PCIe and the
// recompute runs on the GPU; neither is measured here, and the conclusions
// say only what the measured numbers support.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "examples/cli.hpp"
#include "examples/svg.hpp"
#include "examples/legacy_study.hpp"

namespace {

// ---- the four ways to preempt ------------------------------------------------

enum class SwapSpace { kNone, kAmple, kSmall };

struct Mode {
    const char* key;   // --json
    const char* name;  // tables and the chart legend
    bool prefix_caching;
    pkv::Preemption preemption;
    SwapSpace swap;
};

const Mode kModes[] = {
    {"recompute", "recompute", false, pkv::Preemption::kRecompute, SwapSpace::kNone},
    {"recompute_prefix_caching", "recompute + prefix caching", true, pkv::Preemption::kRecompute, SwapSpace::kNone},
    {"swap_ample", "swap, ample space", false, pkv::Preemption::kSwap, SwapSpace::kAmple},
    {"swap_small", "swap, small space", false, pkv::Preemption::kSwap, SwapSpace::kSmall},
};
constexpr int kNumModes = (int)(sizeof kModes / sizeof kModes[0]);

struct Options {
    study::Setup setup = study::study_setup();
    // Output lengths of the second table. 160 is the main workload's, so its
    // rows are reused; 32..160 keeps the whole study near 15 s on 2 cores
    // (--lengths 64,160,256 reaches further and takes about twice as long).
    std::vector<int> lengths = {32, 96, 160};
    int small_swap_pct = 25;                    // small swap space, % of the KV cache's blocks
    int repeat = 1;                             // runs per point, fastest kept
    std::string svg_path = "build/preemption_study.svg";
    bool json = false;
};

Options parse(int argc, char** argv) {
    Options o;
    cli::Parser p("preemption_study", "[options]",
                  "One overloaded workload (built-in model, all requests at once), preempted four ways:\n"
                  "recompute, recompute + prefix caching, swap with ample swap space, swap with a small\n"
                  "one (victims that do not fit fall back to recompute). Then the same four at several\n"
                  "output lengths, with the KV cache scaled to keep the pressure the same.");
    p.int_list("--lengths", &o.lengths, 1, (int)study::kMaxLen, 16, "output lengths of the second table");
    p.integer("--small-swap-pct", &o.small_swap_pct, 1, 1000,
              "small swap space, % of the KV cache's blocks (the ample one holds every request at its longest)");
    p.integer("--max-num-seqs", &o.setup.max_num_seqs, 1, 1 << 16, "running requests at most");
    p.integer("--repeat", &o.repeat, 1, 100, "run each point N times, keep the fastest");
    study::add_workload_flags(p, o.setup);
    p.text("--svg", &o.svg_path, "PATH", "chart to write");
    p.flag("--json", &o.json, "one JSON object on stdout instead of the table");
    p.parse(argc, argv);
    study::check_workload(o.setup);
    std::sort(o.lengths.begin(), o.lengths.end());
    o.lengths.erase(std::unique(o.lengths.begin(), o.lengths.end()), o.lengths.end());
    return o;
}

// ---- sizing ------------------------------------------------------------------------

// Blocks one request holds at its longest.
int blocks_per_request(const study::Setup& s) { return (int)pkv::blocks_for_tokens((int64_t)s.prompt_len + s.max_tokens, s.block_size); }

// The workload at output length `len`, the KV cache scaled so that it holds
// as many requests at their longest as the main workload's does (48 blocks /
// 12 per request = 4 by default): the same pressure, longer sequences.
study::Setup at_length(const study::Setup& base, int len) {
    study::Setup s = base;
    s.max_tokens = len;
    const double fit = (double)base.num_blocks / blocks_per_request(base);
    // In double, then clamped: the engine's own check says what a too-large
    // pool would need, rather than an int wrapping around to a small one.
    s.num_blocks = (int)std::clamp(std::round(fit * blocks_per_request(s)), 1.0, (double)INT32_MAX);
    return s;
}

// Ample: every request parked at its longest at once, so it can never fill.
// Small: a fraction of the KV cache, so a victim that has grown large finds
// too few free slots and falls back to recompute.
int swap_blocks(const study::Setup& s, SwapSpace k, int small_pct) {
    int64_t n = 0;  // 64 bits: requests x blocks may pass 2^31
    if (k == SwapSpace::kAmple) n = (int64_t)s.requests * blocks_per_request(s);
    if (k == SwapSpace::kSmall) n = std::max<int64_t>(1, (int64_t)s.num_blocks * small_pct / 100);
    return (int)std::min<int64_t>(n, INT32_MAX);
}

study::Setup with_mode(study::Setup s, const Mode& m, int small_pct) {
    s.prefix_caching = m.prefix_caching;
    s.preemption = m.preemption;
    s.swap_space_blocks = swap_blocks(s, m.swap, small_pct);
    return s;
}

// ---- what one swap costs on this machine ------------------------------------------
//
// The engine's CPU runner swaps a block as 2 * n_layers memcpy calls (K and V
// of each layer), block_size * kv_dim floats each. We time the same pattern
// over the same number of bytes the ample swap run moved, best of a few
// passes, and get this machine's copy rate for swap-sized pieces.
struct CopyRate {
    double gb_per_s = 0;     // 1e9 bytes per second
    size_t piece_bytes = 0;  // one memcpy
};

CopyRate measure_copy_rate(const pkv::Config& c, int block_size, long bytes) {
    CopyRate r;
    r.piece_bytes = (size_t)block_size * c.kv_dim() * sizeof(float);
    const size_t pieces_per_block = 2 * (size_t)c.n_layers;
    const size_t block_bytes = r.piece_bytes * pieces_per_block;
    const size_t blocks = (size_t)std::max<long>(1, bytes / (long)block_bytes);
    const size_t span = std::min<size_t>(blocks, 512);  // 512 blocks on each side, reused round robin
    std::vector<unsigned char> cache(span * block_bytes, 1), host(span * block_bytes, 0);
    double best = 1e30;
    unsigned sink = 0;
    for (int pass = 0; pass < 5; ++pass) {
        const auto t0 = std::chrono::steady_clock::now();
        for (size_t b = 0; b < blocks; ++b) {
            // Out and in alternate like swap-outs and swap-ins: half the copies each way.
            unsigned char* dev = cache.data() + ((b * 7) % span) * block_bytes;
            unsigned char* hst = host.data() + (b % span) * block_bytes;
            for (size_t p = 0; p < pieces_per_block; ++p) {
                if (b % 2 == 0) std::memcpy(hst + p * r.piece_bytes, dev + p * r.piece_bytes, r.piece_bytes);
                else std::memcpy(dev + p * r.piece_bytes, hst + p * r.piece_bytes, r.piece_bytes);
            }
        }
        best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
        sink += host[(size_t)pass % host.size()] + cache[(size_t)pass % cache.size()];
    }
    if (sink == 0xdeadbeef) std::fprintf(stderr, " ");  // keeps the copies observable
    r.gb_per_s = (double)(blocks * block_bytes) / std::max(1e-9, best) / 1e9;
    return r;
}

// ---- the runs ---------------------------------------------------------------------

struct Row {
    int mode;           // index into kModes
    study::Setup setup; // as run (mode applied)
    study::Measurement m;
    double wall_spread = 0;  // --repeat > 1: slowest / fastest - 1 over the repeats

    long bytes_moved() const { return m.swap_out_bytes + m.swap_in_bytes; }
    double mb_moved() const { return bytes_moved() / 1e6; }
    bool all_done() const { return m.finished == m.requests; }
};

// Four rows, one per mode, for one workload. Scheduling is deterministic, so
// repeats differ only in timing: the fastest is the least disturbed.
bool run_modes(const pkv::ModelAndTokenizer& mt, const study::Setup& s, const Options& o, std::vector<Row>& rows) {
    for (int k = 0; k < kNumModes; ++k) {
        Row r{k, with_mode(s, kModes[k], o.small_swap_pct), {}, 0.0};
        double slowest = 0;
        for (int rep = 0; rep < o.repeat; ++rep) {
            study::Measurement m;
            try {
                m = study::run(mt, r.setup);
            } catch (const std::exception& e) {
                std::fprintf(stderr, "preemption_study: %s (%s, max_tokens %d, %d blocks)\n", e.what(), kModes[k].name,
                             s.max_tokens, s.num_blocks);
                return false;
            }
            slowest = std::max(slowest, m.wall_s);
            if (rep == 0 || m.wall_s < r.m.wall_s) r.m = std::move(m);
        }
        r.wall_spread = slowest / std::max(1e-9, r.m.wall_s) - 1.0;
        rows.push_back(std::move(r));
    }
    return true;
}

struct Results {
    std::vector<Row> main;                // kNumModes rows
    std::vector<std::vector<Row>> sweep;  // [length] kNumModes rows each
    CopyRate copy;
    long kv_bytes_per_token = 0;          // K and V of one token, all layers
};

// ---- conclusions, from the numbers alone ---------------------------------------------

// Below this a wall-clock difference between two single runs is within what
// repeated runs of the same point vary by on a small, quiet 2-core machine.
// With --repeat > 1 the spread actually seen between repeats, if larger,
// takes its place.
constexpr double kNoisePct = 10.0;

double noise_pct(const Results& R) {
    double n = kNoisePct;
    for (const Row& r : R.main) n = std::max(n, 100.0 * r.wall_spread);
    return n;
}

std::string pct_change(double from, double to, double noise) {
    char b[80];
    double d = 100.0 * (to - from) / std::max(1e-9, from);
    if (std::fabs(d) < 0.5) d = 0.0;  // never "-0%"
    if (std::fabs(d) < noise) std::snprintf(b, sizeof b, "%+.0f%%, within the ~%.0f%% wall-clock noise", d, noise);
    else std::snprintf(b, sizeof b, "%+.0f%%", d);
    return b;
}

std::vector<std::string> conclude(const Options& o, const Results& R) {
    std::vector<std::string> out;
    char b[1000];
    const Row& rec = R.main[0];
    const Row& pc = R.main[1];
    const Row& amp = R.main[2];
    const Row& sml = R.main[3];
    const double noise = noise_pct(R);

    bool all = true;
    for (const Row& r : R.main) all = all && r.all_done();
    for (const auto& rows : R.sweep)
        for (const Row& r : rows) all = all && r.all_done();
    out.push_back(all ? "every run completed every request: the modes differ in what preemption cost, not in what was delivered"
                      : "NOT every run completed every request: see the 'all done' columns");

    if (rec.m.preemptions == 0) {
        out.push_back("the recompute run never preempted: this workload does not overload the pool, so there is nothing to compare "
                      "(lower --num-blocks or raise --requests)");
        return out;
    }
    std::snprintf(b, sizeof b,
                  "recompute: %ld preemptions recomputed %ld tokens, %.0f%% of the %ld tokens through the model; "
                  "useful %.0f tok/s of %.0f processed",
                  rec.m.preemptions, rec.m.recomputed_tokens, 100.0 * rec.m.recomputed_tokens / std::max(1L, rec.m.computed_tokens),
                  rec.m.computed_tokens, rec.m.useful_tok_per_s(), rec.m.processed_tok_per_s());
    out.push_back(b);

    char pre[64];
    if (pc.m.preemptions == rec.m.preemptions) std::snprintf(pre, sizeof pre, "the same %ld preemptions", pc.m.preemptions);
    else std::snprintf(pre, sizeof pre, "%ld preemptions instead of %ld", pc.m.preemptions, rec.m.preemptions);
    if (pc.m.recomputed_tokens < rec.m.recomputed_tokens)
        std::snprintf(b, sizeof b,
                      "prefix caching: resumed victims found %ld tokens of their own blocks still cached, so recompute fell from %ld "
                      "to %ld tokens (%.0f%% less) with %s; useful tok/s %s",
                      pc.m.prefix_cache_hits, rec.m.recomputed_tokens, pc.m.recomputed_tokens,
                      100.0 * (1.0 - (double)pc.m.recomputed_tokens / std::max(1L, rec.m.recomputed_tokens)), pre,
                      pct_change(rec.m.useful_tok_per_s(), pc.m.useful_tok_per_s(), noise).c_str());
    else
        std::snprintf(b, sizeof b,
                      "prefix caching: resumed victims found %ld tokens of their own blocks still cached, and recompute did not "
                      "fall (%ld tokens against %ld, with %s)%s",
                      pc.m.prefix_cache_hits, pc.m.recomputed_tokens, rec.m.recomputed_tokens, pre,
                      pc.m.prefix_cache_hits == 0 ? ": every victim's blocks had been reused by others before it came back" : "");
    out.push_back(b);

    std::snprintf(b, sizeof b,
                  "swap, ample space (%d blocks, at most %.0f%% used): all %ld victims swapped, %ld tokens recomputed, %.1f MB "
                  "copied instead; %.0f%% fewer tokens through the model than recompute, wall time %s, useful tok/s %s, "
                  "ITL p99 %.1f ms against %.1f ms",
                  amp.setup.swap_space_blocks, 100.0 * amp.m.peak_swap, amp.m.swap_outs, amp.m.recomputed_tokens, amp.mb_moved(),
                  100.0 * (1.0 - (double)amp.m.computed_tokens / std::max(1L, rec.m.computed_tokens)),
                  pct_change(rec.m.wall_s, amp.m.wall_s, noise).c_str(),
                  pct_change(rec.m.useful_tok_per_s(), amp.m.useful_tok_per_s(), noise).c_str(),
                  1e3 * amp.m.itl_wall.percentile(99), 1e3 * rec.m.itl_wall.percentile(99));
    out.push_back(b);

    if (sml.m.swap_fallbacks == 0)
        std::snprintf(b, sizeof b, "swap, small space (%d blocks): no victim fell back (%ld swapped out); the space was never short",
                      sml.setup.swap_space_blocks, sml.m.swap_outs);
    else
        std::snprintf(b, sizeof b,
                      "swap, small space (%d blocks, %d%% of the KV cache): %ld of %ld victims were swapped and %ld fell back to "
                      "recompute (too many blocks for the free slots), recomputing %ld tokens (%.0f%% of recompute-only's %ld) and "
                      "copying %.1f MB",
                      sml.setup.swap_space_blocks, o.small_swap_pct, sml.m.swap_outs, sml.m.preemptions, sml.m.swap_fallbacks,
                      sml.m.recomputed_tokens, 100.0 * sml.m.recomputed_tokens / std::max(1L, rec.m.recomputed_tokens),
                      rec.m.recomputed_tokens, sml.mb_moved());
    out.push_back(b);

    // Counted in steps (deterministic), the modes barely differ: a resumed
    // victim's recompute rides in a step next to the decodes.
    long smin = rec.m.engine_steps, smax = rec.m.engine_steps;
    for (const Row& r : R.main) {
        smin = std::min(smin, r.m.engine_steps);
        smax = std::max(smax, r.m.engine_steps);
    }
    const double spread = 100.0 * (smax - smin) / std::max(1L, smin);
    std::snprintf(b, sizeof b,
                  "counted in engine steps the four runs take %ld, %ld, %ld and %ld steps (%.1f%% apart, ITL p99 %.0f, %.0f, %.0f "
                  "and %.0f steps): %s",
                  rec.m.engine_steps, pc.m.engine_steps, amp.m.engine_steps, sml.m.engine_steps, spread, rec.m.itl_steps.percentile(99),
                  pc.m.itl_steps.percentile(99), amp.m.itl_steps.percentile(99), sml.m.itl_steps.percentile(99),
                  spread < 5.0 ? "a resumed victim's recompute fits in one step's token budget next to the decodes, so "
                                 "recompute makes steps heavier, not more numerous; what a heavier step costs is the hardware's "
                                 "answer (the wall-clock columns: this machine's)"
                               : "the schedules differ: a swapped victim must get all its blocks back at once, and blocks new "
                                 "admissions until it does, while a recomputed one re-enters the waiting queue");
    out.push_back(b);

    // How the two prices grow with the sequence length, per useful token.
    if (R.sweep.size() >= 2) {
        const std::vector<Row>& lo = R.sweep.front();
        const std::vector<Row>& hi = R.sweep.back();
        auto per = [](double x, const Row& r) { return x / std::max(1L, r.m.useful_tokens); };
        std::snprintf(b, sizeof b,
                      "with the output length (max_tokens %d -> %d, pool %d -> %d blocks, the same pressure): per useful output "
                      "token, recompute recomputed %.2f -> %.2f tokens (%ld -> %ld in all), with prefix caching %.2f -> %.2f; ample "
                      "swap copied %.1f -> %.1f KB (%.1f -> %.1f MB in all); small swap fell back %ld -> %ld times. Both prices "
                      "grow with what the victims hold; recompute also pays attention over ever longer prefixes for each "
                      "recomputed token, a copy costs the same per token at any length",
                      lo[0].setup.max_tokens, hi[0].setup.max_tokens, lo[0].setup.num_blocks, hi[0].setup.num_blocks,
                      per((double)lo[0].m.recomputed_tokens, lo[0]), per((double)hi[0].m.recomputed_tokens, hi[0]),
                      lo[0].m.recomputed_tokens, hi[0].m.recomputed_tokens, per((double)lo[1].m.recomputed_tokens, lo[1]),
                      per((double)hi[1].m.recomputed_tokens, hi[1]), per(lo[2].bytes_moved() / 1e3, lo[2]),
                      per(hi[2].bytes_moved() / 1e3, hi[2]), lo[2].mb_moved(), hi[2].mb_moved(), lo[3].m.swap_fallbacks,
                      hi[3].m.swap_fallbacks);
        out.push_back(b);
    }

    // The trade-off, as far as this machine can show it.
    const bool on_cpu = o.setup.device == pkv::Device::kCpu;
    if (!on_cpu) {
        std::snprintf(b, sizeof b,
                      "this run used --device %s: every swap went through that device's runner (one copy per block, layer and "
                      "K/V, all finished before the step's forward pass), so the rows' wall times include the copies; the %.1f GB/s printed above is host memcpy only, "
                      "not that path, and the built-in model is far too small for its times to stand for a large one",
                      pkv::to_string(o.setup.device), R.copy.gb_per_s);
        out.push_back(b);
    } else if (amp.bytes_moved() > 0 && rec.m.recomputed_tokens > 0) {
        const double copy_s = amp.bytes_moved() / (R.copy.gb_per_s * 1e9);
        const double recompute_s = rec.m.recomputed_tokens / std::max(1e-9, rec.m.processed_tok_per_s());
        std::snprintf(b, sizeof b,
                      "what this CPU run shows: a swap here is a memcpy, and the ample swap run's %.1f MB take about %.1f ms at the "
                      "%.1f GB/s measured for swap-sized copies, while recompute's %ld tokens take about %.2f s at that run's "
                      "average %.0f processed tok/s: copying is ~%.0fx cheaper than recomputing on this machine",
                      amp.mb_moved(), 1e3 * copy_s, R.copy.gb_per_s, rec.m.recomputed_tokens, recompute_s, rec.m.processed_tok_per_s(),
                      recompute_s / std::max(1e-12, copy_s));
        out.push_back(b);
    }
    const double tokens_per_gb = 1e9 / (2.0 * (double)R.kv_bytes_per_token);
    std::snprintf(b, sizeof b,
                  "%s (no overlap of copies with compute), swapping a token moves its K/V out and back, "
                  "2 x %ld bytes for this model, so each GB/s of link carries ~%.0f tokens/s: swap is cheaper while the GPU "
                  "recomputes this model slower than (link GB/s) x %.0f tokens/s, recompute above that. A model with more KV "
                  "bytes per token lowers that line (favours recompute); one with more compute per token favours swap",
                  on_cpu ? "what it cannot show: on a GPU the copy crosses PCIe and the recompute runs on the GPU, and this run "
                           "measures neither. On cost alone"
                         : "the general rule, on cost alone",
                  R.kv_bytes_per_token, tokens_per_gb, tokens_per_gb);
    out.push_back(b);
    return out;
}

// ---- the chart -------------------------------------------------------------------

bool write_svg(const Options& o, const Results& R) {
    svg::Figure fig;
    const study::Setup& w = o.setup;
    std::vector<std::string> cats;
    for (const Mode& m : kModes) {
        std::string n = m.name;
        const size_t cut = n.find(", ") != std::string::npos ? n.find(", ") : n.find(" + ");
        if (cut != std::string::npos) n = n.substr(0, cut) + "\n" + n.substr(cut + (n[cut] == ',' ? 2 : 1));
        cats.push_back(n);
    }
    // 1. The main workload: what each mode paid.
    svg::Chart a;
    a.kind = svg::Chart::Kind::kBar;
    a.title = "What preemption cost (" + std::to_string(w.requests) + " requests x (" + std::to_string(w.prompt_len) + "+" +
              std::to_string(w.max_tokens) + " tokens), " + std::to_string(w.num_blocks) + " blocks of " +
              std::to_string(w.block_size) + ")";
    a.y_label = "tokens / MB";
    a.categories = cats;
    svg::Series rt{"recomputed tokens / 100", {}, {}}, mb{"MB copied (out + in)", {}, {}}, fb{"swap fallbacks", {}, {}};
    for (const Row& r : R.main) {
        rt.y.push_back(r.m.recomputed_tokens / 100.0);
        mb.y.push_back(r.mb_moved());
        fb.y.push_back((double)r.m.swap_fallbacks);
    }
    a.series = {rt, mb, fb};
    fig.add(a);
    svg::Chart t = a;
    t.title = "Throughput (wall clock, " + std::to_string(study::cpu_threads()) + " CPU thread(s))";
    t.y_label = "tokens per second";
    svg::Series useful{"useful tok/s", {}, {}}, proc{"processed tok/s", {}, {}}, p99{"ITL p99", {}, {}};
    for (const Row& r : R.main) {
        useful.y.push_back(r.m.useful_tok_per_s());
        proc.y.push_back(r.m.processed_tok_per_s());
        p99.y.push_back(1e3 * r.m.itl_wall.percentile(99));
    }
    t.series = {useful, proc};
    fig.add(t);
    svg::Chart l = t;
    l.title = "Pauses: inter-token latency p99 (wall clock)";
    l.y_label = "milliseconds";
    l.series = {p99};
    l.height = 260;
    fig.add(l);

    // 2. With the output length: recomputed tokens and MB copied, per mode.
    if (!R.sweep.empty()) {
        svg::Chart c;
        c.title = "Recomputed tokens vs output length (pool scaled with the length)";
        c.x_label = "max_tokens (output length)";
        c.y_label = "recomputed tokens";
        c.height = 300;
        for (const std::vector<Row>& rows : R.sweep) c.x_ticks.push_back(rows[0].setup.max_tokens);
        svg::Chart d = c;
        d.title = "Bytes copied by swap vs output length";
        d.y_label = "MB (out + in)";
        for (int k = 0; k < kNumModes; ++k) {
            svg::Series s1{kModes[k].name, {}, {}}, s2{kModes[k].name, {}, {}};
            s1.dashed = s2.dashed = k % 2 == 1;
            for (const std::vector<Row>& rows : R.sweep) {
                s1.x.push_back(rows[k].setup.max_tokens);
                s1.y.push_back((double)rows[k].m.recomputed_tokens);
                s2.x.push_back(rows[k].setup.max_tokens);
                s2.y.push_back(rows[k].mb_moved());
            }
            c.series.push_back(s1);
            d.series.push_back(s2);
        }
        fig.add(c);
        fig.add(d);
    }
    std::string err;
    if (fig.write(o.svg_path, &err)) return true;
    std::fprintf(stderr, "preemption_study: %s\n", err.c_str());
    return false;
}

// ---- output ----------------------------------------------------------------------

std::string row_json(const Row& r) {
    return study::measurement_json(r.m)
        .str("mode", kModes[r.mode].key)
        .integer("max_tokens", r.setup.max_tokens)
        .integer("num_blocks", r.setup.num_blocks)
        .boolean("prefix_caching", r.setup.prefix_caching)
        .str("preemption", r.setup.preemption == pkv::Preemption::kSwap ? "swap" : "recompute")
        .integer("swap_space_blocks", r.setup.swap_space_blocks)
        .integer("num_swap_outs", r.m.swap_outs)
        .integer("num_swap_ins", r.m.swap_ins)
        .integer("num_swap_fallbacks", r.m.swap_fallbacks)
        .integer("swap_out_bytes", r.m.swap_out_bytes)
        .integer("swap_in_bytes", r.m.swap_in_bytes)
        .num("peak_swap_space_usage_perc", r.m.peak_swap)
        .integer("prefix_cache_hits", r.m.prefix_cache_hits)
        .boolean("all_completed", r.all_done())
        .num("wall_spread_over_repeats", r.wall_spread)
        .dump();
}

void print_main(const std::vector<Row>& rows) {
    std::printf("%-27s %7s %7s %9s %10s %7s %9s %8s %9s %8s %6s %6s %8s\n", "mode", "preempt", "swapped", "fallbacks",
                "recomputed", "prefix", "MB copied", "useful", "processed", "ITL p99", "steps", "wall", "all");
    std::printf("%-27s %7s %7s %9s %10s %7s %9s %8s %9s %8s %6s %6s %8s\n", "", "", "out", "", "tokens", "hits", "(out+in)",
                "tok/s", "tok/s", "ms", "", "s", "done");
    for (const Row& r : rows) {
        const study::Measurement& m = r.m;
        char done[32];
        std::snprintf(done, sizeof done, "%s %d/%d", r.all_done() ? "yes" : "NO", m.finished, m.requests);
        std::printf("%-27s %7ld %7ld %9ld %10ld %7ld %9.2f %8.0f %9.0f %8.1f %6ld %6.2f %8s\n", kModes[r.mode].name,
                    m.preemptions, m.swap_outs, m.swap_fallbacks, m.recomputed_tokens, m.prefix_cache_hits, r.mb_moved(),
                    m.useful_tok_per_s(), m.processed_tok_per_s(), 1e3 * m.itl_wall.percentile(99), m.engine_steps, m.wall_s, done);
    }
}

}  // namespace

int run(int argc, char** argv) {
    const Options o = parse(argc, argv);
    const pkv::ModelAndTokenizer mt = pkv::load_model_and_tokenizer("", "");
    // Checks that need the model: every sequence fits its context, and the
    // pool holds at least one request at its longest (else nothing preempts:
    // requests are cut short or rejected, and there is no study).
    for (int len : o.lengths)
        if (o.setup.prompt_len + len > mt.model.cfg.seq_len)
            cli::bad_usage("--lengths " + std::to_string(len) + ": prompt + output = " + std::to_string(o.setup.prompt_len + len) +
                           " tokens is longer than the model's context (" + std::to_string(mt.model.cfg.seq_len) + ")");
    if (o.setup.prompt_len + o.setup.max_tokens > mt.model.cfg.seq_len)
        cli::bad_usage("--prompt-len + --max-tokens = " + std::to_string(o.setup.prompt_len + o.setup.max_tokens) +
                       " tokens is longer than the model's context (" + std::to_string(mt.model.cfg.seq_len) + ")");
    if (o.setup.num_blocks < blocks_per_request(o.setup))
        cli::bad_usage("--num-blocks " + std::to_string(o.setup.num_blocks) + " cannot hold even one request at its longest (" +
                       std::to_string(blocks_per_request(o.setup)) + " blocks of " + std::to_string(o.setup.block_size) +
                       "): raise --num-blocks or lower --max-tokens");

    study::check_writable(o.svg_path);  // fail now, not after the runs
    Results R;
    const double load = study::load_average();  // before the runs; load_end after them
    R.kv_bytes_per_token = 2L * mt.model.cfg.n_layers * mt.model.cfg.kv_dim() * (long)sizeof(float);
    if (!run_modes(mt, o.setup, o, R.main)) return 1;
    for (int len : o.lengths) {
        const study::Setup s = at_length(o.setup, len);
        // The main workload is one of the lengths (160 by default): reuse its rows.
        if (s.max_tokens == o.setup.max_tokens && s.num_blocks == o.setup.num_blocks) {
            R.sweep.push_back(R.main);
            continue;
        }
        std::vector<Row> rows;
        if (!run_modes(mt, s, o, rows)) return 1;
        R.sweep.push_back(std::move(rows));
    }
    R.copy = measure_copy_rate(mt.model.cfg, o.setup.block_size, std::max(1L, R.main[2].bytes_moved()));
    const double load_end = study::load_average();
    const std::string warning = study::busy_warning(load, load_end);
    const std::vector<std::string> conclusion = conclude(o, R);
    const bool svg_ok = write_svg(o, R);

    const study::Setup& w = o.setup;
    if (o.json) {
        std::vector<std::string> jm, js, jc;
        for (const Row& r : R.main) jm.push_back(row_json(r));
        for (const auto& rows : R.sweep)
            for (const Row& r : rows) js.push_back(row_json(r));
        for (const std::string& c : conclusion) jc.push_back(study::Json::quote(c));
        std::printf("%s\n", study::Json()
                                .str("study", "preemption_study")
                                .raw("workload", study::workload_json(w, mt.name))
                                .integer("max_num_seqs", w.max_num_seqs)
                                .integer("small_swap_pct", o.small_swap_pct)
                                .integer("repeat", o.repeat)
                                .num("load_average_start", load)
                                .num("load_average_end", load_end)
                                .str("warning", warning)
                                .num("wall_noise_pct", noise_pct(R))
                                .integer("kv_bytes_per_token", R.kv_bytes_per_token)
                                .num("memcpy_gb_per_s", R.copy.gb_per_s)
                                .integer("memcpy_piece_bytes", (long)R.copy.piece_bytes)
                                .raw("rows", study::Json::array(jm))
                                .raw("length_rows", study::Json::array(js))
                                .raw("conclusion", study::Json::array(jc))
                                .str("svg", o.svg_path)
                                .dump()
                                .c_str());
        return svg_ok ? 0 : 1;
    }

    const double block_mib = (double)R.kv_bytes_per_token * w.block_size / 1048576.0;
    std::printf("preemption study: %d requests x (%d prompt + %d output tokens), all at once; KV cache %d blocks of %d "
                "(%d tokens, %.2f MiB); max_num_seqs %d, admission bet, victim newest; %s, %d CPU thread(s), load average %.1f at "
                "start, %.1f at end%s\n",
                w.requests, w.prompt_len, w.max_tokens, w.num_blocks, w.block_size, w.num_blocks * w.block_size,
                w.num_blocks * block_mib, w.max_num_seqs, pkv::to_string(w.device), study::cpu_threads(), load, load_end,
                o.repeat > 1 ? (", fastest of " + std::to_string(o.repeat) + " runs per point").c_str() : "");
    std::printf("swap space: ample = %d blocks (%.1f MiB: every request at its longest), small = %d blocks (%d%% of the KV "
                "cache); one block = %.0f KiB\n\n",
                R.main[2].setup.swap_space_blocks, R.main[2].setup.swap_space_blocks * block_mib, R.main[3].setup.swap_space_blocks,
                o.small_swap_pct, block_mib * 1024);
    if (!warning.empty()) std::printf("%s\n\n", warning.c_str());
    print_main(R.main);

    if (!R.sweep.empty()) {
        std::printf("\nhow the answer changes with the output length (KV cache scaled to hold %.1f requests at their longest):\n",
                    (double)w.num_blocks / blocks_per_request(w));
        std::printf("%10s %6s  %-27s %7s %9s %10s %9s %8s %6s %5s\n", "max_tokens", "blocks", "mode", "preempt", "fallbacks",
                    "recomputed", "MB copied", "useful", "wall", "all");
        std::printf("%10s %6s  %-27s %7s %9s %10s %9s %8s %6s %5s\n", "", "", "", "", "", "tokens", "(out+in)", "tok/s", "s", "done");
        for (const std::vector<Row>& rows : R.sweep)
            for (const Row& r : rows)
                std::printf("%10d %6d  %-27s %7ld %9ld %10ld %9.2f %8.0f %6.2f %5s\n", r.setup.max_tokens, r.setup.num_blocks,
                            kModes[r.mode].name, r.m.preemptions, r.m.swap_fallbacks, r.m.recomputed_tokens, r.mb_moved(),
                            r.m.useful_tok_per_s(), r.m.wall_s, r.all_done() ? "yes" : "NO");
    }
    std::printf("\ncopy rate on this machine: %.1f GB/s (memcpy of %zu KiB pieces, the CPU runner's swap pattern)\n\n",
                R.copy.gb_per_s, R.copy.piece_bytes / 1024);
    for (const std::string& c : conclusion) std::printf("conclusion: %s\n", c.c_str());
    if (svg_ok) std::printf("\nchart: %s\n", o.svg_path.c_str());
    return svg_ok ? 0 : 1;
}

int main(int argc, char** argv) { return cli::guarded_main("preemption_study", [&] { return run(argc, argv); }); }

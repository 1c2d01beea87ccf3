// lab/study_kit.hpp -- lab/LAB.md chapter L5: what every study shares: a
// device to run on (this
// CPU, or a simulated GPU), a scenario (engine knobs + traffic, on one engine
// or several behind a router), one measured run of it, and the claims and
// verdicts a study reports. lab/studies.hpp holds the studies,
// lab/study.cpp the driver (`build/study NAME`).
//
// Time. Every engine gets its own DeviceClock. On the CPU it is the CPU time
// the engine's thread spends in steps (one thread: the driver sets OpenMP to
// one): it runs while a step runs and stands still between steps, so an idle
// gap before the next arrival is skipped, not waited for, and another
// program competing for the machine does not count -- on a shared 2-core
// machine wall time mostly measures the neighbours, and conclusions built on
// it flip from run to run. On the simulated GPU it moves only by the
// modelled duration of each step (Clock::advance). Arrival times, latencies
// and throughputs are all in these device seconds, so the same study reads
// the same on both devices.
//
// Latencies are measured here, from the event stream, against each
// request's true arrival time: an engine only looks at new requests between
// steps, so a request that arrives while a step runs waits for its end, and
// that wait belongs in its time to first token.
//
// Sections: 1. the device  2. scenarios  3. one measured run (several replicas
// and a router included)  4. claims and verdicts  5. output: tables and JSON.
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <ctime>
#include <cstdio>
#include <functional>
#include <future>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include "engine.hpp"
#include "lab/traffic.hpp"
#include "examples/workload.hpp"
#include "lab/sim_engine.hpp"
#include "lab/sim_runner.hpp"
#include "examples/devices.hpp"
#include "tiny_model/builtin.hpp"
#include "tiny_model/tokenizer.hpp"

namespace study {

// The knobs, workloads and helpers every program shares (examples/workload.hpp).
using namespace workload;

// ============================================================================
// 1. The device
// ============================================================================

struct MeasureMemo;

// Where a study runs: this CPU with the built-in model (measured), or a
// simulated GPU running a model preset (modelled: cost_model.hpp).
struct Env {
    pkv::Device device = pkv::Device::kCpu;
    std::string gpu = "h200", model = "llama-3-8b", pcie;  // the sim's presets ("" pcie = the GPU's own)
    pkv::CostParams cost;                                  // the sim's cost parameters
    pkv::HostProfile host = pkv::study_host_profile();     // the sim's engine host work (cost_model.hpp section 4c)
    double pcie_bw_override = 0;                           // > 0: replaces the link's bandwidth (bytes/s)
    double pcie_background = 0;                            // the share of the link other traffic takes, [0, 0.99]
    // The workload's own inputs (every study reads them; a map varies them):
    uint64_t seed = 1;    // the traffic's seed (lengths, arrivals, tokens)
    double scale = 1.0;   // every prompt and output length x scale
    double load = 0;      // arrival rate as a multiple of the measured capacity; 0 = the study's own default
    // Where requests come from: "synthetic" (Poisson arrivals, lognormal
    // lengths: studies.hpp's base) or a replay of an Azure trace, "conv" or
    // "code" (traffic.hpp section 2), time-scaled to the same offered load.
    std::string traffic = "synthetic";
    // How long the arrivals last, in drain times (studies.hpp's base: the
    // time the device takes to work through one pool's worth of tokens at
    // its measured capacity). A map cell (study_map.hpp) is lighter than a
    // single run: it holds its load for fewer drain times, and a study may
    // skip variants its verdicts do not read (each study says which).
    double drains = 8;
    bool map_cell = false;
    // A map's cells share the runs that do not depend on what sets them
    // apart (measure_shared); null for a single run.
    std::shared_ptr<MeasureMemo> memo;
    const pkv::ModelAndTokenizer* cpu_model = nullptr;     // the CPU's model (the built-in one)
    // The `cpu` preset (sim_runner.hpp section 2), measured on this machine
    // for the built-in model: set when the sim should model this CPU.
    const pkv::SimConfig* measured = nullptr;

    bool sim() const { return device == pkv::Device::kSim; }
    std::string describe() const {
        if (!sim()) return "cpu (this machine, built-in model, one thread, measured CPU time)";
        if (measured) return "sim (the `cpu` preset: this machine's rates, measured for the built-in model; modelled time)";
        const pkv::SimConfig s = sim_config_for(pcie);
        char b[240];
        std::snprintf(b, sizeof b, "sim (%s + %s, %s PCIe at %.0f GB/s%s, modelled time)", gpu.c_str(), model.c_str(),
                      (pcie.empty() ? pkv::find_preset(pkv::gpu_presets(), gpu, "GPU preset").pcie : pcie).c_str(), s.hw.pcie_bw / 1e9,
                      pcie_background > 0 ? (", " + std::to_string((int)std::lround(100 * pcie_background)) + "% of it taken by other traffic").c_str()
                                          : "");
        return b;
    }
    const pkv::Config& shape() const {
        if (measured) return measured->model.shape;
        return sim() ? pkv::find_preset(pkv::model_presets(), model, "model preset").shape : cpu_model->model.cfg;
    }
    // Everything about this env that a run's result depends on, but its
    // link (a run that never crosses it can be shared across links).
    std::string identity_but_link() const {
        char b[640];
        std::snprintf(b, sizeof b, "%d|%s|%s|%p|%.17g|%.17g|%.17g|%.17g|%.17g|%.17g|%d|%.17g|%.17g|%d|%d|%.17g|%llu|%.17g|%s|%.17g|%d",
                      (int)device, gpu.c_str(), model.c_str(), (const void*)measured, cost.bw_efficiency, cost.flops_efficiency,
                      cost.attn_flops_efficiency, cost.step_overhead_s, cost.per_token_s, cost.per_logit_s, (int)cost.swap_stalls,
                      host.per_step_s, host.per_seq_s, 2 * (int)host.step_overlaps + (int)host.seq_overlaps, host.steps_per_schedule, scale, (unsigned long long)seed,
                      load, traffic.c_str(), drains, (int)map_cell);
        return b;
    }
    // The sim's configuration with the PCIe link `link` ("" = the env's).
    pkv::SimConfig sim_config_for(const std::string& link) const {
        if (measured) return *measured;  // this machine: its "link" is a memcpy, measured too
        pkv::SimConfig s = pkv::sim_config(gpu, model, link.empty() ? pcie : link);
        s.cost = cost;
        s.host = host;
        if (pcie_bw_override > 0) s.hw.pcie_bw = pcie_bw_override;
        s.hw.pcie_background = pcie_background;
        return s;
    }
};

// ============================================================================
// 2. Scenarios
// ============================================================================

enum class Router { kRoundRobin, kLeastKv };
inline const char* to_string(Router r) { return r == Router::kRoundRobin ? "round-robin" : "least-KV-usage"; }

// One configuration a study runs: engine knobs (per replica) and traffic.
// The engine knobs are workload::EngineKnobs (examples/workload.hpp), with one
// difference: num_blocks 0 = the device's whole pool (the sim: vLLM's rule);
// the CPU needs a number. kv_dtype is the CPU's cache type; the sim uses its
// model's, unless kv_bytes_override.
struct Scenario : EngineKnobs {
    Scenario() { num_blocks = 0; }
    std::string name;
    int kv_bytes_override = 0;                   // the sim: serve the KV cache with this many bytes per element (1 = FP8)
    double memory_utilization = 0;               // the sim: vLLM's gpu_memory_utilization (0 = the default, 0.9)
    std::string pcie;                            // the sim: this link instead of the env's ("" = the env's)
    int replicas = 1;
    Router router = Router::kRoundRobin;
    Traffic traffic;
    // Requests built by hand instead of drawn from `traffic` (a scenario that
    // needs two particular requests, say); traffic.requests must match.
    std::shared_ptr<const std::vector<PlannedRequest>> planned;
};

// ============================================================================
// 3. One measured run
// ============================================================================

// An engine's time: this thread's CPU time in steps on the CPU, modelled time
// on the sim.
struct DeviceClock : pkv::VirtualClock {
    // t (VirtualClock's): device seconds when the current step began (or now, between steps)
    bool real = true;    // CPU: add the CPU time a step takes (the sim's clock only advances)
    bool in_step = false;
    double wall0 = 0;
    static double wall() {
        timespec ts{};
        clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
        return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
    }
    double now() override { return real && in_step ? t + (wall() - wall0) : t; }
    void begin_step() {
        in_step = true;
        if (real) wall0 = wall();
    }
    void end_step() {
        if (real) t += wall() - wall0;
        in_step = false;
    }
};

struct Measurement {
    int requests = 0, finished = 0, rejected = 0, failed = 0;
    long preemptions = 0, useful_tokens = 0, prompt_tokens = 0, recomputed_tokens = 0, computed_tokens = 0, engine_steps = 0;
    int preempted_requests = 0, max_preemptions = 0;
    double makespan_s = 0;  // device seconds until the last request ended
    double busy_s = 0;      // device seconds spent in steps (all replicas)
    double peak_kv = 0, mean_kv = 0;          // KV usage 0..1: peak, and averaged over steps
    double full_fraction = 0;                 // fraction of steps that ended with the pool at >= 99%
    double mean_running = 0;
    int peak_running = 0, peak_waiting = 0;
    long swap_outs = 0, swap_ins = 0, swap_fallbacks = 0, swap_out_bytes = 0, swap_in_bytes = 0;
    long prefix_cache_hits = 0;
    pkv::LatencySamples itl, ttft, e2e, reject_latency;  // device seconds
    std::vector<double> done_s;                           // completion times, sorted
    // A time series, one point per step (of any replica): for "over time" views.
    struct Point {
        double t;
        long useful, computed, preemptions;
        double kv;
    };
    std::vector<Point> series;
    // Preemption bookkeeping for the mechanism checks: tokens a victim had
    // computed when it was preempted (what a recompute must redo).
    long victim_tokens = 0;
    // Per request, in the traffic's order: when it ended (device seconds
    // after its arrival; -1 if rejected or failed) and how many output tokens
    // it got.
    std::vector<double> e2e_by_request;
    std::vector<int> tokens_by_request;
    // Every inter-token gap, by its cause (see measure()), the first that
    // applies:
    //   preempted  the request itself was preempted between the two tokens:
    //              it waited to be readmitted, then recomputed or swapped in;
    //   recompute  a step in between also recomputed another request's
    //              tokens after its preemption, so this token waited
    //              behind preemption's work;
    //   swap       a step in between copied a victim's blocks out or in;
    //   prefill    a step in between computed an admission's prompt chunk:
    //              chunked prefill, with or without any pressure;
    //   decode     none of these: plain decode steps.
    // The first three are preemption's: what it costs the streams, its own
    // victims' and everyone else's.
    pkv::LatencySamples itl_preempted, itl_recompute, itl_swap, itl_prefill, itl_decode;
    long gaps_from_preemption() const { return (long)(itl_preempted.count() + itl_recompute.count() + itl_swap.count()); }
    // Per request, in the traffic's order: its longest gap between two
    // tokens (the pause its client saw; 0 with fewer than two tokens) and
    // how many times it was preempted.
    std::vector<double> longest_gap_by_request;
    std::vector<int> preemptions_by_request;
    // The share of the gaps at or above `threshold` seconds that are
    // preemption's (preempted, recompute or swap); 0 if there are none.
    double preemption_share_at_or_above(double threshold) const {
        auto n = [&](const pkv::LatencySamples& x) { return (double)std::count_if(x.v.begin(), x.v.end(), [&](double g) { return g >= threshold; }); };
        const double pre = n(itl_preempted) + n(itl_recompute) + n(itl_swap), all = pre + n(itl_prefill) + n(itl_decode);
        return all > 0 ? pre / all : 0.0;
    }

    double useful_tok_per_s() const { return makespan_s > 0 ? useful_tokens / makespan_s : 0; }
    double processed_tok_per_s() const { return makespan_s > 0 ? computed_tokens / makespan_s : 0; }
    double busy_fraction() const { return makespan_s > 0 ? busy_s / makespan_s : 0; }
    int completed_by(double t) const { return (int)(std::upper_bound(done_s.begin(), done_s.end(), t) - done_s.begin()); }
};

// Optional hook: every event of every replica, with the replica's index.
using EventHook = std::function<void(int replica, const pkv::StreamEvent&, pkv::Engine&)>;

struct Replica {
    std::unique_ptr<DeviceClock> clock;
    std::unique_ptr<pkv::Engine> engine;
    std::vector<int> global_id;  // [engine request id] -> request index in the traffic
};

// One replica: an engine on the env's device, with its own clock.
inline Replica make_replica(const Env& env, const Scenario& sc) {
    Replica r;
    r.clock = std::make_unique<DeviceClock>();
    pkv::EngineConfig ec = engine_config(sc);
    ec.log_interval_s = 0;
    std::unique_ptr<pkv::ModelRunner> runner;
    if (env.sim()) {
        pkv::SimConfig s = env.sim_config_for(sc.pcie);
        if (sc.kv_bytes_override > 0) s.model.kv_bytes = sc.kv_bytes_override;
        else if (sc.kv_dtype != pkv::KVDtype::kF32) s.model.kv_bytes = pkv::kv_dtype_bytes(sc.kv_dtype);
        if (sc.memory_utilization > 0) s.memory_utilization = sc.memory_utilization;
        s.max_num_batched_tokens = sc.max_num_batched_tokens;
        s.max_num_seqs = sc.max_num_seqs;
        auto sr = std::make_unique<pkv::SimRunner>(s);
        sr->set_clock(r.clock.get());
        ec = sim_engine_config(sc, *sr);  // lab/sim_engine.hpp: vLLM's pool when num_blocks is 0
        runner = std::move(sr);
        r.clock->real = false;
    } else {
        if (sc.num_blocks == 0) throw std::invalid_argument("a CPU scenario needs num_blocks");
        if (!sc.pcie.empty() || sc.kv_bytes_override || sc.memory_utilization > 0)
            throw std::invalid_argument("PCIe, KV byte and memory-utilization overrides are for the sim");
        // Timed: lab's fast CPU path (the same tokens as the reference's).
        runner = pkv::make_model_runner(pkv::Device::kCpu, env.cpu_model->model, pkv::MathPath::kFast);
    }
    r.engine = make_engine(ec, policy_of(sc), std::move(runner), r.clock.get());
    return r;
}

// Victims swapped out and back in so far, by a lab policy that swaps
// (lab/swap.hpp's counters); 0 under any other.
inline long swaps_of(const pkv::Engine& eng) {
    const pkv::LabPolicy* lab = pkv::lab_policy(eng.scheduler());
    return lab ? lab->stats().num_swap_outs + lab->stats().num_swap_ins : 0;
}

// Runs `sc` to the end on `env` and measures it. With several replicas a
// router sends each arriving request to one of them, looking at the
// replicas' state at the arrival time; the replicas run side by side in
// device time (the one furthest behind steps next).
//
// Every inter-token gap is put down to a cause (Measurement's itl_*): the
// request's own preemption between the two tokens, else a step in between
// that recomputed a victim's tokens, else one that copied swap blocks, else
// one that computed an admission's prompt chunk, else plain decode. What a
// step carried is read off the engine's counters across it (recomputed,
// prompt tokens, swaps), so the gaps of a step are classified once the step
// is over.
inline Measurement measure(const Env& env, const Scenario& sc, const EventHook& hook = {}) {
    const pkv::Config& shape = env.shape();
    const std::vector<PlannedRequest> plan = sc.planned ? *sc.planned : plan_traffic(sc.traffic, shape.vocab_size);
    const int R = (int)plan.size();
    Measurement out;
    out.requests = R;
    out.e2e_by_request.assign((size_t)R, -1.0);
    out.tokens_by_request.assign((size_t)R, 0);
    out.longest_gap_by_request.assign((size_t)R, 0.0);
    out.preemptions_by_request.assign((size_t)R, 0);
    std::vector<Replica> reps;
    for (int k = 0; k < std::max(1, sc.replicas); ++k) reps.push_back(make_replica(env, sc));
    std::vector<double> last_token(R, -1.0);
    std::vector<char> ended(R, 0), preempted_since(R, 0);
    // Per replica: how many steps so far carried each kind of stall
    // (recompute, swap, prefill); per request: those counts on its replica
    // when it emitted its last token. A gap crossed a stall of a kind when
    // the count moved since.
    struct StallCounts {
        long recompute = 0, swap = 0, prefill = 0;
    };
    std::vector<StallCounts> stalls_at((size_t)R), stalls((size_t)std::max(1, sc.replicas));
    struct Gap {
        int g;
        double dt;
    };
    std::vector<Gap> step_gaps;
    std::vector<int> step_token_reqs;  // requests that emitted a token this step
    for (int k = 0; k < (int)reps.size(); ++k) {
        Replica& rep = reps[(size_t)k];
        rep.engine->on_event = [&, k](const pkv::StreamEvent& e) {
            const int g = reps[(size_t)k].global_id.at((size_t)e.request_id);
            const double a = plan[(size_t)g].arrival_s;
            switch (e.type) {
                case pkv::EventType::kToken:
                    step_token_reqs.push_back(g);
                    out.tokens_by_request[(size_t)g]++;
                    if (last_token[(size_t)g] < 0) out.ttft.add(e.time - a);
                    else {
                        const double dt = e.time - last_token[(size_t)g];
                        out.itl.add(dt);
                        out.longest_gap_by_request[(size_t)g] = std::max(out.longest_gap_by_request[(size_t)g], dt);
                        if (preempted_since[(size_t)g]) out.itl_preempted.add(dt);
                        else step_gaps.push_back({g, dt});  // another cause: known after the step
                    }
                    preempted_since[(size_t)g] = 0;
                    last_token[(size_t)g] = e.time;
                    break;
                case pkv::EventType::kFinished:
                    ended[(size_t)g] = 1;
                    if (e.reason == pkv::FinishReason::kError) out.failed++;
                    else if (e.reason != pkv::FinishReason::kAborted) {
                        out.e2e.add(e.time - a);
                        out.e2e_by_request[(size_t)g] = e.time - a;
                        out.done_s.push_back(e.time);
                    }
                    break;
                case pkv::EventType::kRejected:
                    ended[(size_t)g] = 1;
                    out.reject_latency.add(std::max(0.0, e.time - a));
                    break;
                case pkv::EventType::kPreempted:
                    preempted_since[(size_t)g] = 1;
                    out.preemptions_by_request[(size_t)g]++;
                    out.victim_tokens += reps[(size_t)k].engine->request(e.request_id)->num_computed_high_water;
                    break;
                case pkv::EventType::kResumed: break;
            }
            if (hook) hook(k, e, *reps[(size_t)k].engine);
        };
    }
    int rr = 0;  // the round-robin cursor
    auto route = [&]() -> int {
        if (reps.size() == 1) return 0;
        if (sc.router == Router::kRoundRobin) return rr++ % (int)reps.size();
        int best = 0;  // least KV usage; ties: fewer waiting, then the lower index
        for (int k = 1; k < (int)reps.size(); ++k) {
            const pkv::Metrics& a = reps[(size_t)k].engine->metrics();
            const pkv::Metrics& b = reps[(size_t)best].engine->metrics();
            const double ua = reps[(size_t)k].engine->pool().kv_cache_usage_perc(), ub = reps[(size_t)best].engine->pool().kv_cache_usage_perc();
            if (ua < ub || (ua == ub && a.num_requests_waiting < b.num_requests_waiting)) best = k;
        }
        return best;
    };
    long steps = 0;
    double kv_sum = 0, running_sum = 0, full_steps = 0;
    int next = 0;
    const long max_steps = 50000000;
    while (true) {
        // The busy replica furthest behind in device time steps next, unless
        // a request arrives before it.
        int k_min = -1;
        for (int k = 0; k < (int)reps.size(); ++k)
            if (reps[(size_t)k].engine->has_unfinished() && (k_min < 0 || reps[(size_t)k].clock->t < reps[(size_t)k_min].clock->t)) k_min = k;
        if (next < R && (k_min < 0 || plan[(size_t)next].arrival_s <= reps[(size_t)k_min].clock->t)) {
            const int k = route();
            Replica& rep = reps[(size_t)k];
            // An idle replica waits for the arrival; a busy one sees it at
            // its next step boundary (its clock may be past the arrival).
            if (!rep.engine->has_unfinished()) rep.clock->t = std::max(rep.clock->t, plan[(size_t)next].arrival_s);
            rep.global_id.push_back(next);
            rep.engine->add_request(plan[(size_t)next].prompt, plan[(size_t)next].params);
            ++next;
            continue;
        }
        if (k_min < 0) break;  // nothing left anywhere
        Replica& rep = reps[(size_t)k_min];
        const double t0 = rep.clock->t;
        // (The counters alone: a Metrics also holds every latency sample.)
        const pkv::Metrics& m0 = rep.engine->metrics();
        const long recomputed0 = m0.recomputed_tokens_total, swaps0 = swaps_of(*rep.engine), prompt0 = m0.prompt_tokens_total;
        step_gaps.clear();
        step_token_reqs.clear();
        rep.clock->begin_step();
        rep.engine->step();
        rep.clock->end_step();
        out.busy_s += rep.clock->t - t0;
        // What this step carried, from the counters across it.
        const pkv::Metrics& after = rep.engine->metrics();
        StallCounts& st = stalls[(size_t)k_min];
        st.recompute += after.recomputed_tokens_total > recomputed0;
        st.swap += swaps_of(*rep.engine) > swaps0;
        st.prefill += after.prompt_tokens_total > prompt0;
        // Each gap ended in this step: the first kind of stall that ran
        // since the request's previous token, up to and including this step.
        for (const Gap& gp : step_gaps) {
            const StallCounts& at = stalls_at[(size_t)gp.g];
            (st.recompute > at.recompute ? out.itl_recompute
             : st.swap > at.swap         ? out.itl_swap
             : st.prefill > at.prefill   ? out.itl_prefill
                                         : out.itl_decode)
                .add(gp.dt);
        }
        for (int g : step_token_reqs) stalls_at[(size_t)g] = st;
        if (++steps > max_steps) throw std::runtime_error("measure: too many steps (a scheduler that makes no progress?)");
        // The whole fleet's view after this step.
        double kv = 0;
        int running = 0, waiting = 0;
        long useful = 0, computed = 0, pre = 0;
        for (const Replica& r : reps) {
            const pkv::Metrics& m = r.engine->metrics();
            kv += r.engine->pool().kv_cache_usage_perc();
            running += m.num_requests_running;
            waiting += m.num_requests_waiting;
            useful += m.generation_tokens_total;
            computed += m.computed_tokens_total;
            pre += m.num_preemptions_total;
        }
        kv /= (double)reps.size();
        kv_sum += kv;
        running_sum += running;
        full_steps += kv >= 0.99;
        out.peak_kv = std::max(out.peak_kv, kv);
        out.peak_running = std::max(out.peak_running, running);
        out.peak_waiting = std::max(out.peak_waiting, waiting);
        out.series.push_back({rep.clock->t, useful, computed, pre, kv});
    }
    out.engine_steps = steps;
    if (steps > 0) {
        out.mean_kv = kv_sum / steps;
        out.mean_running = running_sum / steps;
        out.full_fraction = full_steps / steps;
    }
    std::sort(out.done_s.begin(), out.done_s.end());
    std::sort(out.series.begin(), out.series.end(), [](const Measurement::Point& a, const Measurement::Point& b) { return a.t < b.t; });
    for (const Replica& r : reps) {
        const pkv::Metrics& m = r.engine->metrics();
        out.finished += (int)m.num_requests_finished;
        out.rejected += (int)m.num_requests_rejected;
        out.preemptions += m.num_preemptions_total;
        out.useful_tokens += m.generation_tokens_total;
        out.prompt_tokens += m.prompt_tokens_total;
        out.recomputed_tokens += m.recomputed_tokens_total;
        out.computed_tokens += m.computed_tokens_total;
        const pkv::LabPolicy* lab = pkv::lab_policy(r.engine->scheduler());
        const pkv::SwapStats sw = lab ? lab->stats() : pkv::SwapStats{};  // lab/swap.hpp
        out.swap_outs += sw.num_swap_outs;
        out.swap_ins += sw.num_swap_ins;
        out.swap_fallbacks += sw.num_swap_fallbacks;
        out.swap_out_bytes += sw.bytes_out;
        out.swap_in_bytes += sw.bytes_in;
        out.prefix_cache_hits += m.prefix_cache_hits;
        out.makespan_s = std::max(out.makespan_s, r.clock->t);
        for (int id = 0; id < r.engine->scheduler().num_requests(); ++id) {
            const int p = r.engine->request(id)->num_preemptions;
            out.preempted_requests += p > 0;
            out.max_preemptions = std::max(out.max_preemptions, p);
        }
    }
    for (int g = 0; g < R; ++g)
        if (!ended[(size_t)g]) throw std::logic_error("measure: request " + std::to_string(g) + " never ended");
    return out;
}

// Runs a map's cells share: one measurement per key, computed once (by
// whichever cell asks first; the others wait for it).
struct MeasureMemo {
    std::mutex mu;
    std::map<std::string, std::shared_future<Measurement>> runs;
};
// measure(env, sc), shared through env.memo under `key` when there is one.
// The key must name everything about `sc` the run depends on; the env's
// part (but its link) is added here. Only for runs that never cross the
// link and have no event hook.
inline Measurement measure_shared(const Env& env, const Scenario& sc, const std::string& key) {
    if (!env.memo || key.empty()) return measure(env, sc);
    const std::string k = env.identity_but_link() + "|" + key;
    std::promise<Measurement> mine;
    std::shared_future<Measurement> f;
    bool compute = false;
    {
        std::lock_guard<std::mutex> lock(env.memo->mu);
        auto it = env.memo->runs.find(k);
        if (it == env.memo->runs.end()) {
            f = mine.get_future().share();
            env.memo->runs.emplace(k, f);
            compute = true;
        } else {
            f = it->second;
        }
    }
    if (compute) {
        try {
            mine.set_value(measure(env, sc));
        } catch (...) {
            mine.set_exception(std::current_exception());
        }
    }
    return f.get();
}

// ============================================================================
// 4. Claims and verdicts
// ============================================================================

// The thirteen claims the tutorial makes about a KV cache that runs out of
// blocks (the "At scale" issue lists them). A study names the ones it tests.
inline const std::vector<std::pair<std::string, std::string>>& claims() {
    static const std::vector<std::pair<std::string, std::string>> v = {
        {"C1", "admitting on blocks needed now beats reserving for the whole sequence"},
        {"C2", "an allocation failure is a designed-for event, not a crash"},
        {"C3", "preempting the newest first completes more work than slowing everyone uniformly"},
        {"C4", "the victim goes to the front of the queue and resumes when blocks free"},
        {"C5", "recompute costs one prefill of the current length, and prefix caching serves part of it"},
        {"C6a", "swap pays PCIe both ways and its host buffer fills; it loses where PCIe is scarcer"},
        {"C6b", "swap wins only for very long sequences (beyond a crossover length L*)"},
        {"C7", "the client sees a pause, a p99 inter-token-latency cliff"},
        {"C8", "recompute does more total work per completed request"},
        {"C9", "shedding at the edge gives fast, retryable failures instead of unbounded stalls"},
        {"C10", "the signals: a nonzero preemption counter, cache usage pinned at the ceiling, ITL p99 far above the median"},
        {"C11", "sustained preemption is thrash: the device stays busy while useful throughput drops"},
        {"C12", "the fixes in order of bluntness: cap concurrency, cap generation length, free or quantize cache memory, add replicas"},
        {"C13", "raising concurrency while preemptions climb makes throughput worse"},
    };
    return v;
}
inline const std::string& claim_text(const std::string& id) {
    for (const auto& c : claims())
        if (c.first == id) return c.second;
    throw std::invalid_argument("no claim " + id);
}

enum class Verdict { kSupported, kContradicted, kMixed, kNotShown };
inline const char* to_string(Verdict v) {
    switch (v) {
        case Verdict::kSupported: return "supported";
        case Verdict::kContradicted: return "contradicted";
        case Verdict::kMixed: return "mixed";
        case Verdict::kNotShown: return "not shown";
    }
    return "?";
}

// One claim's verdict and the numbers behind it: in words (`because`), as
// the decider's inputs by name, and the numbers that say whether the claim's
// premise occurred at all (preemptions, a queue at the door, runaway
// requests): a map's cells carry both (study_map.hpp).
using Numbers = std::vector<std::pair<std::string, double>>;
struct ClaimVerdict {
    std::string claim;
    Verdict verdict;
    std::string because;
    Numbers numbers = {};
    Numbers premise = {};
};
// The overall verdict of several: all agree -> that; otherwise mixed (not
// shown only when nothing was shown).
inline Verdict combine(const std::vector<ClaimVerdict>& v) {
    bool all_sup = true, all_con = true, any_shown = false;
    for (const ClaimVerdict& c : v) {
        if (c.verdict == Verdict::kNotShown) continue;
        any_shown = true;
        all_sup = all_sup && c.verdict == Verdict::kSupported;
        all_con = all_con && c.verdict == Verdict::kContradicted;
    }
    if (!any_shown) return Verdict::kNotShown;
    return all_sup ? Verdict::kSupported : all_con ? Verdict::kContradicted : Verdict::kMixed;
}
// A verdict from a test that holds (supported), fails the other way
// (contradicted), or neither (mixed), with its reason.
inline ClaimVerdict verdict(const std::string& claim, bool holds, bool opposite, const std::string& because, Numbers numbers = {}) {
    return {claim, holds ? Verdict::kSupported : opposite ? Verdict::kContradicted : Verdict::kMixed, because, std::move(numbers)};
}
// The same, for a claim about something that must first happen (a
// preemption, a queue at the door, a runaway request): where it did not,
// the run cannot speak to the claim, and the verdict is "not shown" -- never
// "contradicted" because nothing happened. `premise` holds the numbers that
// decided it either way.
inline ClaimVerdict verdict_if(bool premise_occurred, const std::string& why_not, Numbers premise, ClaimVerdict v) {
    if (!premise_occurred) {
        v.verdict = Verdict::kNotShown;
        v.because = why_not + " -- " + v.because;
    }
    v.premise = std::move(premise);
    return v;
}

// ============================================================================
// 5. Output: a table, and JSON
// ============================================================================

struct Table {
    std::vector<std::string> headers;
    std::vector<std::vector<std::string>> rows;
    void print(FILE* out) const {
        std::vector<size_t> w(headers.size());
        for (size_t c = 0; c < headers.size(); ++c) w[c] = headers[c].size();
        for (const auto& r : rows)
            for (size_t c = 0; c < r.size() && c < w.size(); ++c) w[c] = std::max(w[c], r[c].size());
        auto line = [&](const std::vector<std::string>& cells) {
            std::string s = " ";
            for (size_t c = 0; c < headers.size(); ++c) {
                const std::string cell = c < cells.size() ? cells[c] : "";
                s += " " + (c == 0 ? cell + std::string(w[c] - cell.size(), ' ') : std::string(w[c] - cell.size(), ' ') + cell);
            }
            std::fprintf(out, "%s\n", s.c_str());
        };
        line(headers);
        for (const auto& r : rows) line(r);
    }
    std::string json() const {
        std::vector<std::string> rs;
        for (const auto& r : rows) {
            Json j;
            for (size_t c = 0; c < headers.size() && c < r.size(); ++c) j.str(headers[c], r[c]);
            rs.push_back(j.dump());
        }
        return Json::array(rs);
    }
};

// printf into a std::string (table cells).
template <class... A>
std::string fmt(const char* f, A... a) {
    const int n = std::snprintf(nullptr, 0, f, a...);
    std::string s((size_t)std::max(0, n), '\0');
    std::snprintf(s.data(), s.size() + 1, f, a...);
    return s;
}

}  // namespace study

// examples/trace.hpp -- a recorded run (examples/recorder.hpp) as a trace in
// Chrome's Trace Event Format: the JSON that Perfetto (ui.perfetto.dev, "Open
// trace file") and chrome://tracing open. build/overload --trace FILE.json
// writes it; vLLM's users read engine timelines the same way.
#pragma once

#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "examples/recorder.hpp"

namespace viewer {

// ============================================================================
// The trace: Chrome's Trace Event Format, which Perfetto opens
// ============================================================================
//
// ui.perfetto.dev (Open trace file) or chrome://tracing reads it. Tracks:
//   "engine", "steps"     a span per engine step, and two counters: KV cache
//                         usage and the queue lengths (running, waiting)
//   "requests", one track per request: its phases, one after the other:
//                         waiting (arrival to first scheduled), prefill,
//                         decode, preempted (out of the running set) and
//                         recompute; "paused" encloses a preemption's whole
//                         pause as the client feels it, from the preemption
//                         to the first token after it; an instant
//                         "preempted" marks each preemption, with its reason.
// Spans are begin/end pairs (ph B and E), in time order on every track. A
// phase that computes (prefill, decode, recompute) covers its steps, from the
// first one's start to the last one's end; waiting and preempted last until
// the step that schedules the request again.
// Builds the trace from the records, in their order.
class TraceWriter {
public:
    TraceWriter() {
        meta(kEngine, 0, "process_name", "engine");
        meta(kEngine, 0, "thread_name", "steps");
        meta(kRequests, 0, "process_name", "requests");
    }

    void step(const StepRecord& s) {
        for (const RequestInfo& q : s.introduced) {
            meta(kRequests, tid(q.id), "thread_name", "request " + std::to_string(q.id));
            const bool rejected = std::any_of(s.events.begin(), s.events.end(), [&](const Event& e) { return e.r == q.id && e.kind == "rejected"; });
            if (!rejected) open_phase(q.id, "waiting", q.arrival, false);
        }
        for (const Event& e : s.events) {  // between the steps: a rejection, an abort
            if (e.t >= s.t0) continue;
            if (e.kind == "rejected") add("i", kRequests, tid(e.r), "rejected", e.t, "{\"why\":" + quote(e.why) + "}");
            if (e.kind == "aborted") end_life(e.r, e.t);
        }
        const std::string step_args = "{\"step\":" + std::to_string(s.step) + "}";
        add("B", kEngine, 0, "step " + std::to_string(s.step), s.t0, step_args);
        for (const Event& e : s.events)
            if (e.kind == "preempted") preempted(e, s);
        for (const Chunk& c : s.chunks) {
            if (tracks_[c.r].phase != c.phase) open_phase(c.r, c.phase, s.t0, true, step_args);
            tracks_[c.r].run_end = s.t1;
        }
        // The first token after a pause ends it (its phase first: spans nest).
        for (const Token& t : s.tokens) {
            Track& k = tracks_[t.r];
            if (!k.paused) continue;
            close_phase(t.r, s.t1);
            add("E", kRequests, tid(t.r), "", s.t1);
            k.paused = false;
        }
        for (const Event& e : s.events)
            if (e.t >= s.t0 && (e.kind == "finished" || e.kind == "aborted")) end_life(e.r, s.t1);
        add("E", kEngine, 0, "", s.t1);
        add("C", kEngine, 0, "KV cache usage", s.t1, "{\"percent\":" + num(100 * s.kv) + "}");
        add("C", kEngine, 0, "queues", s.t1,
            "{\"running\":" + std::to_string(s.running.size()) + ",\"waiting\":" + std::to_string(s.waiting.size()) + "}");
        last_t_ = s.t1;
    }

    // The trace, every span still open (a recording that ended mid-run)
    // closed at its end.
    std::string finish(const RunInfo& info) {
        std::vector<int> left;
        for (const auto& [r, k] : tracks_) left.push_back(r);
        for (int r : left) end_life(r, last_t_);
        std::string out = "{\"displayTimeUnit\":\"ms\",\"otherData\":{\"source\":\"pagedkv\",\"model\":" + quote(info.model) +
                          ",\"workload\":" + quote(info.workload) + "},\"traceEvents\":[";
        for (size_t i = 0; i < ev_.size(); ++i) out += (i ? ",\n" : "\n") + ev_[i];
        return out + "]}\n";
    }

private:
    static constexpr int kEngine = 1, kRequests = 2;  // the two processes (groups of tracks)
    // Per request: the phase span open now, and the paused span around it.
    struct Track {
        std::string phase;   // "" when none is open
        bool computes = false;
        double run_end = 0;  // a computing phase: the end of its latest step
        bool paused = false;
    };
    static int tid(int r) { return r + 1; }

    // One trace event; t in seconds, written in microseconds.
    void add(const std::string& ph, int pid, int tid, const std::string& name, double t, const std::string& args = "") {
        ev_.push_back("{\"ph\":\"" + ph + "\",\"pid\":" + std::to_string(pid) + ",\"tid\":" + std::to_string(tid) + ",\"ts\":" + num(t * 1e6) +
                      (name.empty() ? "" : ",\"name\":" + quote(name)) + (ph == "i" ? ",\"s\":\"t\"" : "") +
                      (args.empty() ? "" : ",\"args\":" + args) + "}");
    }
    void meta(int pid, int tid, const char* what, const std::string& name) {
        ev_.push_back("{\"ph\":\"M\",\"pid\":" + std::to_string(pid) + ",\"tid\":" + std::to_string(tid) + ",\"name\":\"" + what +
                      "\",\"args\":{\"name\":" + quote(name) + "}}");
    }
    // Close r's open phase: a computing one at the end of its latest step,
    // a waiting one at `t`.
    void close_phase(int r, double t) {
        Track& k = tracks_[r];
        if (k.phase.empty()) return;
        add("E", kRequests, tid(r), "", k.computes ? k.run_end : t);
        k.phase.clear();
    }
    void open_phase(int r, const std::string& p, double t, bool computes, const std::string& args = "") {
        close_phase(r, t);
        Track& k = tracks_[r];
        add("B", kRequests, tid(r), p, t, args);
        k.phase = p;
        k.computes = computes;
    }
    void end_life(int r, double t) {
        close_phase(r, t);
        if (tracks_[r].paused) add("E", kRequests, tid(r), "", t);
        tracks_.erase(r);
    }
    // A preemption: the phase ends, a pause begins (unless one is on: a
    // request preempted again before its first token back), an instant with
    // the reason, and the preempted phase.
    void preempted(const Event& e, const StepRecord& s) {
        close_phase(e.r, s.t0);
        Track& k = tracks_[e.r];
        if (!k.paused) add("B", kRequests, tid(e.r), "paused", s.t0);
        k.paused = true;
        add("i", kRequests, tid(e.r), "preempted", s.t0, "{\"step\":" + std::to_string(s.step) + ",\"why\":" + quote(e.why) + "}");
        open_phase(e.r, "preempted", s.t0, false);
    }

    std::vector<std::string> ev_;  // the trace events, in time order per track
    std::map<int, Track> tracks_;  // requests with a span open
    double last_t_ = 0;
};

// The trace of everything `rec` kept (keep mode).
inline std::string trace(const Recorder& rec) {
    TraceWriter w;
    for (const StepRecord& s : rec.records()) w.step(s);
    return w.finish(rec.info());
}

}  // namespace viewer

// examples/recorder.hpp -- a real run, recorded step by step: what the viewer
// (examples/viewer/) draws, and the same run as a trace Perfetto opens.
//
//   viewer::Recorder rec(tok, info, /*keep=*/true);
//   rec.attach(eng);                      // before add_request: rejections are recorded too
//   ... add requests ...
//   while (eng.has_unfinished()) { eng.step(); rec.end_step(); }
//   viewer::page(viewer::embedded_page(), rec.page_data())   one HTML file (build/overload --view;
//                                                            examples/viewer_page.hpp)
//   viewer::trace(rec)                                       Chrome's Trace Event Format (--trace;
//                                                            examples/trace.hpp)
//
// build/serve keeps nothing (keep = false): each end_step() returns the
// step's record, which goes to /view/events as it happens.
//
// The recorder lives beside the engine, not in it. It only observes, through
// what the engine already offers: Engine::on_schedule (each step's decision,
// before the forward pass), Engine::on_event (tokens, finishes, rejections,
// aborts: chained, so the program's own callback still gets every event, in
// the same order) and reading the engine's state after each step (block
// tables, the free list, the prefix index, the metrics). With no recorder
// attached the engine pays nothing: on_schedule stays empty and on_event is
// the program's own.
//
// What a step's record holds (its JSON is the schema the page reads; the
// page's header comment lists every field):
//   the decision   which requests ran with how many tokens and why
//                  (prefill, decode, recompute), who was admitted, preempted
//                  (with the reason and the blocks it gave back), resumed, and
//                  why the waiting queue's head still waits;
//   the client     every token's text and its gap since the request's
//                  previous token (a pause is one long gap);
//   the cache      every running request's block table, the free list in
//                  its order (head first), the blocks the prefix cache can
//                  find, the usage;
//   the counters   the engine's own running totals (Metrics), so that a
//                  viewer that missed records still shows true totals.
// Every event names the code that made it: the code map below, one table.
//
// Sections: 1. the code map  2. JSON helpers  3. the recorder. The trace is
// examples/trace.hpp, the page examples/viewer_page.hpp.
#pragma once

#include <algorithm>
#include <cstdio>
#include <map>
#include <set>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "engine.hpp"
#include "examples/workload.hpp"
#include "tiny_model/tokenizer.hpp"

namespace viewer {

// ============================================================================
// 1. The code map: which function, file and TUTORIAL chapter made an event
// ============================================================================
//
// The page shows these beside every event, so that it is a map back into the
// code. Renumbering the TUTORIAL means editing these two tables only.

struct Chapter {
    int number;
    const char* title;
};
inline constexpr Chapter kChapters[] = {
    {1, "paged memory"},       {2, "admission is a bet"}, {3, "preemption"}, {4, "recompute and prefix caching"},
    {5, "the client's view"},  {6, "the signals"},        {7, "the model"},  {8, "the kernel"},
    {9, "the tests"},          {10, "over HTTP"},
};

struct CodeSite {
    const char* key;       // what an event's "code" list names
    const char* function;  // where to look
    const char* file;
    int chapter;           // kChapters
};
inline constexpr CodeSite kCodeMap[] = {
    {"allocate", "allocate_slots, BlockPool::allocate", "core/block_pool.hpp", 1},
    {"free", "free_blocks, BlockPool::release", "core/block_pool.hpp", 1},
    {"free_list", "FreeBlockQueue", "core/free_block_queue.hpp", 1},
    {"schedule", "Scheduler::schedule", "scheduler.hpp", 2},
    {"admit", "Scheduler::try_admit", "scheduler.hpp", 2},
    {"reject", "Scheduler::add_request", "scheduler.hpp", 2},
    {"preempt", "Scheduler::preempt", "scheduler.hpp", 3},
    {"victim", "SchedulerPolicy::pick_victim", "scheduler.hpp", 3},
    {"resume", "Scheduler::start_running", "scheduler.hpp", 4},
    {"recompute", "Scheduler::on_computed", "scheduler.hpp", 4},
    {"prefix_hit", "find_cached_prefix", "core/prefix_cache.hpp", 4},
    {"cache", "cache_full_blocks", "core/prefix_cache.hpp", 4},
    {"step", "Engine::step", "engine.hpp", 5},
    {"token", "Engine::sample_and_stream", "engine.hpp", 5},
    {"finish", "Engine::sample_and_stream, Scheduler::finish", "engine.hpp", 5},
    {"abort", "Engine::abort", "engine.hpp", 5},
    {"metrics", "Metrics::on_step_end", "core/metrics.hpp", 6},
    {"serve", "EngineLoop (examples/serve.cpp)", "examples/serve.cpp", 10},
};

// ============================================================================
// 2. JSON, written by hand (the records are small and flat)
// ============================================================================

// `s` with every byte sequence that is not UTF-8 (RFC 3629: no overlong
// forms, no surrogates) replaced by U+FFFD. A token's text is a piece of the
// vocabulary, and a character split over two tokens is not UTF-8 alone; a
// JSON parser may refuse such bytes, a browser shows them as U+FFFD anyway.
inline std::string valid_utf8(std::string_view s) {
    std::string o;
    o.reserve(s.size());
    for (size_t i = 0; i < s.size();) {
        const unsigned char c = (unsigned char)s[i];
        // The byte count the lead byte announces, and the range its second byte must be in.
        int len = 0;
        unsigned char lo = 0x80, hi = 0xBF;
        if (c < 0x80) len = 1;
        else if (c >= 0xC2 && c <= 0xDF) len = 2;
        else if (c >= 0xE0 && c <= 0xEF) { len = 3; if (c == 0xE0) lo = 0xA0; if (c == 0xED) hi = 0x9F; }
        else if (c >= 0xF0 && c <= 0xF4) { len = 4; if (c == 0xF0) lo = 0x90; if (c == 0xF4) hi = 0x8F; }
        bool ok = len > 0 && i + (size_t)len <= s.size();
        for (int k = 1; ok && k < len; ++k) {
            const unsigned char b = (unsigned char)s[i + (size_t)k];
            ok = k == 1 ? (b >= lo && b <= hi) : (b >= 0x80 && b <= 0xBF);
        }
        if (ok) o.append(s.substr(i, (size_t)len));
        else o += "\xEF\xBF\xBD";  // U+FFFD, for one byte; the next byte starts afresh
        i += ok ? (size_t)len : 1;
    }
    return o;
}

// A JSON string (workload::Json::quote escapes it), of valid UTF-8.
inline std::string quote(std::string_view raw) { return workload::Json::quote(valid_utf8(raw)); }

// A number: JSON has no NaN or infinity; seconds keep microseconds.
inline std::string num(double v) {
    if (!(v == v) || v > 1e300 || v < -1e300) return "null";
    char b[40];
    std::snprintf(b, sizeof b, "%.9g", v);
    return b;
}
template <class T>
std::string ints(const std::vector<T>& v) {
    std::string s = "[";
    for (size_t i = 0; i < v.size(); ++i) s += (i ? "," : "") + std::to_string(v[i]);
    return s + "]";
}
// [a,b,c] from strings that are JSON already.
inline std::string list(const std::vector<std::string>& v) {
    std::string s = "[";
    for (size_t i = 0; i < v.size(); ++i) s += (i ? "," : "") + v[i];
    return s + "]";
}

// ============================================================================
// 3. The recorder
// ============================================================================

// What the engine cannot tell the recorder itself: the run's description and
// the choices of the scheduling policy (lab/policies.hpp), for the page's
// header and the reasons it prints.
struct RunInfo {
    std::string mode = "recorded";  // or "live" (build/serve)
    std::string model, workload, device = "cpu";
    std::string victim = "newest", preemption = "recompute", admission = "bet";
    std::string events_url;         // live: where the page subscribes
};

// One event of a step, as the page lists it.
struct Event {
    std::string kind;               // admitted resumed preempted finished aborted rejected waits
    int r = -1;                     // the request
    std::vector<std::string> code;  // keys of kCodeMap
    std::vector<int32_t> blocks;    // preempted/finished/aborted: the blocks it gave back
    long tokens = -1;               // admitted/resumed: tokens this step; preempted: computed tokens lost
    std::string reason, why;        // finished: the finish reason; every kind: one sentence
    double t = 0;                   // engine clock, relative to the recording's origin
};

// One scheduled chunk: request r computes n tokens this step.
struct Chunk {
    int r, n;
    const char* phase;  // "prefill", "decode" or "recompute" (the chunk starts below the high-water mark)
    int recompute;      // of the n, tokens computed before a preemption threw their K/V away
    int cached;         // admitted this step: prompt tokens served by the prefix cache
};

struct Token {
    int r, index;      // request, output index
    std::string text;  // rendered after the request's previous token
    double gap;        // seconds since the request's previous token; < 0: its first token
};

// A request, the first time a record mentions it.
struct RequestInfo {
    int id, prompt_len, max_tokens;
    std::string prompt;  // its text (at most kPromptChars bytes shown)
    double arrival;      // relative to the origin
};

struct Totals {
    long steps = 0, preemptions = 0, recomputed = 0, finished = 0, generated = 0, rejected = 0, aborted = 0;
};

struct StepRecord {
    long step = 0;                 // the engine's step count after this step
    bool state = false;            // a record of the state between steps (a viewer joining a live run), not of a step
    double t0 = 0, t1 = 0;         // its schedule() and its end, relative to the origin
    std::vector<Chunk> chunks;     // in the batch's order
    std::vector<Event> events;     // since the previous record (between steps too: aborts, rejections)
    std::vector<Token> tokens;
    std::vector<int> running, waiting;                         // ids; waiting: front first
    std::vector<std::pair<int, std::vector<int32_t>>> tables;  // running requests' block tables
    std::vector<int32_t> free_list;                            // head first
    std::vector<int32_t> cached;                               // blocks the prefix cache can find
    double kv = 0;                                             // kv_cache_usage_perc
    Totals totals;
    std::vector<RequestInfo> introduced;
};

// The run's description: everything a page needs before the first record
// (the configuration, and the code map and chapters above).
inline std::string header_json(const RunInfo& info, const pkv::EngineConfig& c) {
    std::string chapters, code;
    for (const Chapter& ch : kChapters)
        chapters += std::string(chapters.empty() ? "" : ",") + "{\"number\":" + std::to_string(ch.number) + ",\"title\":" + quote(ch.title) + "}";
    for (const CodeSite& cs : kCodeMap)
        code += std::string(code.empty() ? "" : ",") + quote(cs.key) + ":{\"function\":" + quote(cs.function) + ",\"file\":" +
                quote(cs.file) + ",\"chapter\":" + std::to_string(cs.chapter) + "}";
    return "{\"format\":\"pagedkv-view/1\",\"mode\":" + quote(info.mode) + ",\"events_url\":" + quote(info.events_url) +
           ",\"model\":" + quote(info.model) + ",\"workload\":" + quote(info.workload) + ",\"device\":" + quote(info.device) +
           ",\"config\":{\"num_blocks\":" + std::to_string(c.num_blocks) + ",\"block_size\":" + std::to_string(c.block_size) +
           ",\"max_num_seqs\":" + std::to_string(c.sched.max_num_seqs) + ",\"max_num_batched_tokens\":" +
           std::to_string(c.sched.max_num_batched_tokens) + ",\"max_model_len\":" + std::to_string(c.sched.max_model_len) +
           ",\"prefix_caching\":" + (c.enable_prefix_caching ? "true" : "false") + ",\"victim\":" + quote(info.victim) +
           ",\"preemption\":" + quote(info.preemption) + ",\"admission\":" + quote(info.admission) + "},\"chapters\":[" + chapters +
           "],\"code\":{" + code + "}}";
}

// One server-sent event: "event: KIND", the data (one line of JSON), a blank line.
inline std::string sse_event(const std::string& kind, const std::string& json) { return "event: " + kind + "\ndata: " + json + "\n\n"; }

// ---- one step, as the recorder sees it ---------------------------------------
//
//   end of step k-1  end_step(): the state after it -- block tables, the free
//                    list, the queues -- is the record's, and is kept as the
//                    "before" of step k (before_)
//   between steps    on_event: an abort frees blocks, a request is rejected;
//                    both go into step k's record, marked as before it
//   schedule()       on_schedule: who runs with how many tokens, who was
//                    admitted, resumed or preempted; each is explained by
//                    comparing with "before": a victim gave back the table it
//                    held then, and the running requests needed the blocks
//                    their tables grew by
//   forward, sample  on_event: every token and its gap; the finishes
//   end of step k    end_step(): the state after, and the record
//
// Why compare with a snapshot instead of asking the scheduler why? The
// recorder must not change what it records: it sees only what the engine
// already shows at these moments, so every reason on the page is one a reader
// of scheduler.hpp could check at the same point of the step.
class Recorder {
public:
    static constexpr size_t kPromptChars = 240;

    // keep: every record is kept (page_data, trace); otherwise each lives
    // only as end_step()'s return value (build/serve).
    Recorder(const pkv::Tokenizer& tok, RunInfo info, bool keep) : tok_(tok), info_(std::move(info)), keep_(keep) {}
    Recorder(const Recorder&) = delete;
    Recorder& operator=(const Recorder&) = delete;
    ~Recorder() { detach(); }

    // Hooks on. The program's own on_event keeps every event, after us; an
    // on_schedule already set is called after us too.
    void attach(pkv::Engine& eng) {
        if (eng_) throw std::logic_error("Recorder::attach: already attached");
        eng_ = &eng;
        origin_ = eng.now();
        saved_event_ = eng.on_event;
        saved_schedule_ = eng.on_schedule;
        eng.on_event = [this](const pkv::StreamEvent& e) {
            on_event(e);
            if (saved_event_) saved_event_(e);
        };
        eng.on_schedule = [this](const pkv::SchedulerOutput& so) {
            on_schedule(so);
            if (saved_schedule_) saved_schedule_(so);
        };
        before_ = snapshot();
    }
    // Hooks off: the engine's callbacks are what they were before attach().
    void detach() {
        if (!eng_) return;
        eng_->on_event = saved_event_;
        eng_->on_schedule = saved_schedule_;
        eng_ = nullptr;
        cur_ = StepRecord{};
        known_.clear();
        last_token_.clear();
    }
    bool attached() const { return eng_ != nullptr; }
    long num_records() const { return (long)steps_.size(); }

    // After each Engine::step(): the step's record, as one JSON object.
    std::string end_step() {
        StepRecord& s = cur_;
        s.step = eng_->metrics().num_steps;
        s.t1 = eng_->now() - origin_;
        fill_state(s);
        std::string json = to_json(s);
        if (keep_) steps_.push_back(std::move(s));
        cur_ = StepRecord{};
        return json;
    }
    // Between steps: the state as of now (and the events since the last
    // record), every live request introduced afresh: what a viewer joining a
    // live run starts from. Its step number is the last step's.
    std::string state_record() {
        known_.clear();
        StepRecord s = std::move(cur_);
        cur_ = StepRecord{};
        s.state = true;
        s.step = eng_->metrics().num_steps;
        s.t0 = s.t1 = eng_->now() - origin_;
        fill_state(s);
        return to_json(s);
    }

    // The header with "steps": every record kept (keep mode; attached).
    std::string page_data() const {
        std::string s = header_json(info_, eng_->config());
        s.pop_back();
        s += ",\"steps\":[";
        for (size_t i = 0; i < steps_.size(); ++i) s += (i ? ",\n" : "\n") + to_json(steps_[i]);
        return s + "]}";
    }
    // What was kept (keep mode): examples/trace.hpp writes the trace from it.
    const std::vector<StepRecord>& records() const { return steps_; }
    const RunInfo& info() const { return info_; }

private:
    // What the recorder keeps of the engine between two records: each
    // running request's blocks and computed tokens, and the free count.
    struct Held {
        std::vector<int32_t> blocks;
        int computed = 0;
    };
    struct Snapshot {
        std::map<int, Held> running;
        int free = 0;
    };
    Snapshot snapshot() const {
        Snapshot s;
        for (const pkv::Request* r : eng_->scheduler().running()) s.running[r->id] = {r->block_table.blocks, r->num_computed_tokens};
        s.free = eng_->pool().num_free_blocks();
        return s;
    }

    double now() const { return eng_->now() - origin_; }
    static std::vector<std::string> codes(std::initializer_list<const char*> keys) { return std::vector<std::string>(keys.begin(), keys.end()); }

    // ---- the step's decision (Engine::on_schedule) ----------------------------

    void on_schedule(const pkv::SchedulerOutput& so) {
        StepRecord& s = cur_;
        s.t0 = now();
        const int bs = eng_->config().block_size;
        // The chunks, and the block tables as schedule() left them (a request
        // that finishes in this step frees what it holds at its end). A
        // chunk's phase is what Engine::account_and_commit will count it as:
        // positions below the request's high-water mark were computed before
        // a preemption threw them away (recompute), positions in the prompt
        // are prefill, the rest decode. num_computed_tokens has not moved
        // yet (Scheduler::on_computed runs after the forward pass), so for an
        // admitted request it still says how much the prefix cache served.
        std::vector<std::string> grew;  // "r3 +1": running requests whose tables had to grow
        int needed = 0;
        for (const pkv::ScheduledRequest& sr : so.scheduled) {
            const pkv::Request& r = *sr.req;
            const int c = r.num_computed_tokens, hw = r.num_computed_high_water;
            const int recompute = std::max(0, std::min(c + sr.num_new_tokens, hw) - c);
            const char* phase = c < hw ? "recompute" : c < r.num_prompt_tokens ? "prefill" : "decode";
            const auto was = before_.running.find(r.id);
            const bool new_here = was == before_.running.end();
            s.chunks.push_back({r.id, sr.num_new_tokens, phase, recompute, new_here ? c : 0});
            mid_[r.id] = r.block_table.blocks;
            // A running request needs a block when its chunk crosses a block
            // boundary: the blocks for num_computed + n tokens, less those its
            // table held when the step began.
            if (!new_here) {
                const long need = pkv::blocks_for_tokens((int64_t)c + sr.num_new_tokens, bs) - (long)was->second.blocks.size();
                if (need > 0) { grew.push_back("r" + std::to_string(r.id) + " +" + std::to_string(need)); needed += (int)need; }
                continue;
            }
            const bool resumed = std::find(so.resumed.begin(), so.resumed.end(), sr.req) != so.resumed.end();
            Event e{resumed ? "resumed" : "admitted", r.id, {}, {}, sr.num_new_tokens, "", "", s.t0};
            if (resumed) {
                e.code = codes({"resume", "admit", "recompute"});
                e.why = "back from the front of the waiting queue: recomputes its prompt and the " + std::to_string(r.num_output_tokens()) +
                        " tokens it already streamed (" + std::to_string(sr.num_new_tokens) + " of " + std::to_string(r.num_tokens() - c) +
                        " this step)";
            } else {
                e.code = codes({"admit", "allocate"});
                e.why = "admitted from the head of the waiting queue: " + std::to_string(sr.num_new_tokens) + " of its " +
                        std::to_string(r.num_tokens()) + " tokens this step";
            }
            if (c > 0) {
                e.code.push_back("prefix_hit");
                e.why += "; " + std::to_string(c) + " found in the prefix cache";
            }
            s.events.push_back(std::move(e));
        }
        for (const pkv::Request* v : so.preempted) s.events.push_back(preempted(*v, grew, needed));
        waits(so);
    }

    // Why `v` was preempted, from what the recorder saw: the free list when
    // the step began, the growth the running requests needed, the victim rule.
    Event preempted(const pkv::Request& v, const std::vector<std::string>& grew, int needed) {
        const auto was = before_.running.find(v.id);
        Event e{"preempted", v.id, codes({"preempt", "victim", "free"}), {}, -1, "", "", cur_.t0};
        if (was != before_.running.end()) {
            e.blocks = was->second.blocks;
            e.tokens = was->second.computed;
        }
        std::string list;
        for (size_t i = 0; i < grew.size() && i < 6; ++i) list += (i ? ", " : "") + grew[i];
        if (grew.size() > 6) list += ", ...";
        e.why = "the free list held " + std::to_string(before_.free) + " of " + std::to_string(eng_->pool().num_blocks()) +
                " blocks when the step began and the running requests needed " + std::to_string(needed) + " more" +
                (list.empty() ? "" : " (" + list + ")") + ": allocate_slots failed, and pick_victim chose r" + std::to_string(v.id) +
                " (victim rule: " + info_.victim + (info_.victim == "newest" ? ", vLLM V1's running.pop()" : "") + "). Its " +
                std::to_string(e.blocks.size()) + " blocks go back to the free list; " +
                (info_.preemption == "swap" ? "their contents go to host swap space (recomputed only if that is full)"
                                            : "its " + std::to_string(std::max(0L, e.tokens)) + " computed tokens will be recomputed");
        return e;
    }

    // Why the head of the waiting queue still waits, in the order schedule()
    // asks: a preempting step admits nobody, then max_num_seqs, the token
    // budget, and the blocks its whole sequence needs.
    void waits(const pkv::SchedulerOutput& so) {
        const auto& waiting = eng_->scheduler().waiting();
        if (waiting.empty()) return;
        const pkv::Request& h = *waiting.front();
        const pkv::EngineConfig& c = eng_->config();
        std::string why;
        if (!so.preempted.empty()) why = "this step preempted, and a preempting step admits nobody: the blocks just freed are for the running requests";
        else if ((int)eng_->scheduler().running().size() >= c.sched.max_num_seqs)
            why = std::to_string(c.sched.max_num_seqs) + " requests run already (max_num_seqs)";
        else if (so.total_num_scheduled_tokens >= c.sched.max_num_batched_tokens)
            why = "the step's token budget (max_num_batched_tokens " + std::to_string(c.sched.max_num_batched_tokens) + ") is spent";
        else if (info_.admission == "bet")
            why = "its " + std::to_string(h.num_tokens()) + " tokens need " + std::to_string(pkv::blocks_for_tokens(h.num_tokens(), c.block_size)) +
                  " blocks" + (c.enable_prefix_caching ? " (fewer if the prefix cache holds part)" : "") + " and " +
                  std::to_string(eng_->pool().num_free_blocks()) + " are free; first come, first served: nobody overtakes it";
        else why = "the admission policy (" + info_.admission + ") does not let it in yet";
        cur_.events.push_back({"waits", h.id, codes({"schedule", "admit"}), {}, -1, "", why, cur_.t0});
    }

    // ---- what the client sees (Engine::on_event) ------------------------------

    void on_event(const pkv::StreamEvent& e) {
        const double t = e.time - origin_;
        pkv::Request* r = eng_->request(e.request_id);
        switch (e.type) {
            case pkv::EventType::kToken: {
                const int prev = r && r->num_tokens() >= 2 ? r->tokens[(size_t)r->num_tokens() - 2] : -1;
                const auto last = last_token_.find(e.request_id);
                const double gap = last == last_token_.end() ? -1 : e.time - last->second;
                last_token_[e.request_id] = e.time;
                cur_.tokens.push_back({e.request_id, e.output_index, tok_.render(prev, e.token), gap});
                break;
            }
            case pkv::EventType::kFinished: {
                const bool aborted = e.reason == pkv::FinishReason::kAborted;
                Event ev{aborted ? "aborted" : "finished", e.request_id, aborted ? codes({"abort", "free"}) : codes({"finish", "free"}), {}, -1,
                         pkv::to_string(e.reason), "", t};
                // The blocks it held: as schedule() left them if it ran in this
                // step, else as the last record saw them.
                const auto mid = mid_.find(e.request_id);
                const auto was = before_.running.find(e.request_id);
                if (mid != mid_.end()) ev.blocks = mid->second;
                else if (was != before_.running.end()) ev.blocks = was->second.blocks;
                ev.why = aborted ? "its client hung up: the request ends and its " + std::to_string(ev.blocks.size()) + " blocks are freed"
                                 : std::string("finished (") + pkv::to_string(e.reason) + "): its " + std::to_string(ev.blocks.size()) +
                                       " blocks go back to the free list, last block first";
                cur_.events.push_back(std::move(ev));
                forget(e.request_id);
                break;
            }
            case pkv::EventType::kRejected: {
                introduce(e.request_id, cur_.introduced);
                cur_.events.push_back({"rejected", e.request_id, codes({"reject"}), {}, -1, "rejected", r ? r->reject_reason : "", t});
                forget(e.request_id);
                break;
            }
            case pkv::EventType::kPreempted:
            case pkv::EventType::kResumed: break;  // schedule()'s own lists say it (on_schedule), with the reason
        }
    }
    // A finished request is forgotten, so that a server's recorder does not
    // grow with the requests it has served. (A record that introduced it
    // keeps its description.)
    void forget(int id) {
        last_token_.erase(id);
        if (!keep_) known_.erase(id);
    }

    // ---- the state after a step -------------------------------------------------

    void introduce(int id, std::vector<RequestInfo>& out) {
        if (!known_.insert(id).second) return;
        const pkv::Request* r = eng_->request(id);
        if (!r) return;
        std::vector<int> prompt(r->tokens.begin(), r->tokens.begin() + r->num_prompt_tokens);
        std::string text = tok_.decode(prompt);
        if (text.size() > kPromptChars) text = text.substr(0, kPromptChars) + "...";
        out.push_back({id, r->num_prompt_tokens, r->params.max_tokens, text, r->arrival_time - origin_});
    }

    // The state after a step (or now, between steps): every running
    // request's table, the queues, the free list walked from its head (the
    // next block handed out) to its tail (the last), the blocks the prefix
    // cache can still find (only with prefix caching: a free one keeps its
    // contents until it is handed out again), and the engine's counters.
    // Only running requests hold blocks; a waiting one, new or preempted,
    // holds none.
    void fill_state(StepRecord& s) {
        const pkv::Scheduler& sch = eng_->scheduler();
        const pkv::BlockPool& pool = eng_->pool();
        for (const pkv::Request* r : sch.running()) {
            s.running.push_back(r->id);
            s.tables.push_back({r->id, r->block_table.blocks});
        }
        for (const pkv::Request* r : sch.waiting()) s.waiting.push_back(r->id);
        for (int id : s.running) introduce(id, s.introduced);
        for (int id : s.waiting) introduce(id, s.introduced);
        for (int32_t b = pool.free_list().front(); b != -1; b = pool.free_list().next(b)) s.free_list.push_back(b);
        if (pool.prefix_caching())
            for (int32_t b = 0; b < pool.num_blocks(); ++b)
                if (pool.prefix_index().cached(b)) s.cached.push_back(b);
        s.kv = pool.kv_cache_usage_perc();
        const pkv::Metrics& m = eng_->metrics();
        s.totals = {m.num_steps, m.num_preemptions_total, m.recomputed_tokens_total, m.num_requests_finished,
                    m.generation_tokens_total, m.num_requests_rejected, m.num_requests_aborted};
        before_ = snapshot();
        mid_.clear();
    }

    // One record as one line of JSON (a server-sent event must not hold a
    // bare newline; quote() escapes those in text). Tokens are arrays, not
    // objects: a record holds up to max_num_seqs of them, and a page
    // thousands of records.
    static std::string to_json(const StepRecord& s) {
        std::vector<std::string> chunks, events, tokens, tables, intro;
        for (const Chunk& c : s.chunks)
            chunks.push_back("{\"r\":" + std::to_string(c.r) + ",\"n\":" + std::to_string(c.n) + ",\"phase\":\"" + c.phase +
                             "\",\"recompute\":" + std::to_string(c.recompute) + ",\"cached\":" + std::to_string(c.cached) + "}");
        for (const Event& e : s.events) {
            std::vector<std::string> code;
            for (const std::string& k : e.code) code.push_back(quote(k));
            events.push_back("{\"kind\":" + quote(e.kind) + ",\"r\":" + std::to_string(e.r) + ",\"code\":" + list(code) + ",\"blocks\":" +
                             ints(e.blocks) + ",\"tokens\":" + std::to_string(e.tokens) + ",\"reason\":" + quote(e.reason) +
                             ",\"why\":" + quote(e.why) + ",\"t\":" + num(e.t) + "}");
        }
        for (const Token& t : s.tokens)
            tokens.push_back("[" + std::to_string(t.r) + "," + std::to_string(t.index) + "," + quote(t.text) + "," + (t.gap < 0 ? "null" : num(t.gap)) + "]");
        for (const auto& [id, blocks] : s.tables) tables.push_back("[" + std::to_string(id) + "," + ints(blocks) + "]");
        for (const RequestInfo& q : s.introduced)
            intro.push_back("{\"id\":" + std::to_string(q.id) + ",\"prompt_len\":" + std::to_string(q.prompt_len) + ",\"max_tokens\":" +
                            std::to_string(q.max_tokens) + ",\"prompt\":" + quote(q.prompt) + ",\"arrival\":" + num(q.arrival) + "}");
        const Totals& t = s.totals;
        return "{\"step\":" + std::to_string(s.step) + ",\"state\":" + (s.state ? "true" : "false") + ",\"t0\":" + num(s.t0) + ",\"t1\":" + num(s.t1) + ",\"chunks\":" + list(chunks) +
               ",\"events\":" + list(events) + ",\"tokens\":" + list(tokens) + ",\"running\":" + ints(s.running) + ",\"waiting\":" +
               ints(s.waiting) + ",\"tables\":" + list(tables) + ",\"free\":" + ints(s.free_list) + ",\"cached\":" + ints(s.cached) +
               ",\"kv\":" + num(s.kv) + ",\"totals\":{\"steps\":" + std::to_string(t.steps) + ",\"preemptions\":" +
               std::to_string(t.preemptions) + ",\"recomputed\":" + std::to_string(t.recomputed) + ",\"finished\":" +
               std::to_string(t.finished) + ",\"generated\":" + std::to_string(t.generated) + ",\"rejected\":" +
               std::to_string(t.rejected) + ",\"aborted\":" + std::to_string(t.aborted) + "},\"requests\":" + list(intro) + "}";
    }

    const pkv::Tokenizer& tok_;
    const RunInfo info_;
    const bool keep_;
    pkv::Engine* eng_ = nullptr;
    pkv::Engine::StreamCallback saved_event_;
    std::function<void(const pkv::SchedulerOutput&)> saved_schedule_;
    double origin_ = 0;                       // engine clock at attach(): time zero of every record
    Snapshot before_;                         // the state the last record saw: the next step starts from it
    std::map<int, std::vector<int32_t>> mid_; // this step: scheduled requests' tables as schedule() left them
    StepRecord cur_;                          // the record being filled
    std::set<int> known_;                     // requests some record introduced (live: still running or waiting)
    std::map<int, double> last_token_;        // request -> engine time of its latest token
    std::vector<StepRecord> steps_;           // keep mode: every record
};

}  // namespace viewer

// examples/serve.cpp -- the engine behind an OpenAI-compatible HTTP server, the
// way vLLM, SGLang and llama.cpp's server are run: a client streams tokens over
// server-sent events, an operator scrapes /metrics.
//
//   build/serve [checkpoint.bin -z tokenizer.bin] [--port 8000] [options]
//   curl -N http://127.0.0.1:8000/v1/completions -H 'Content-Type: application/json'
//        -d '{"prompt": "Once upon a time", "max_tokens": 32, "temperature": 0, "stream": true}'
//   (one command line)
//
// Endpoints: POST /v1/completions, POST /v1/chat/completions (what a request
// may say: examples/openai_api.hpp), GET /v1/models, GET /health, GET /metrics,
// and the viewer: GET /view (the page of examples/viewer/, live) and GET
// /view/events (its event stream: one record per engine step, section 7).
//
// ---- the threads ---------------------------------------------------------------
//
//   I/O        main's thread, running Boost.Asio's event loop: it accepts
//              connections, reads requests, checks them, hands them to the
//              engine and writes every answer -- for a stream, chunk by chunk
//              as tokens arrive. Nothing on it ever waits: every read, write
//              and timer is asynchronous, so one thread carries any number of
//              connections, streaming, idle or slow, and /health is answered
//              at once whatever the others do.
//   engine     the only thread that ever touches the Engine. It loops: take
//              what the I/O thread handed over, run one step, hand the step's
//              events back; it sleeps when there is nothing to do.
//
// Why not a thread per connection (what cpp-httplib, the library llama.cpp's
// server is built on, does)? Then every connection holds a thread for as long as it
// lasts, so the thread count caps the connections: a few hundred idle
// sockets, or a few dozen clients sending their headers one byte a second,
// hold every thread, and a new client, /health included, gets no answer at
// all. With one event loop an idle connection costs a socket and a timer.
// Boost.Beast (Boost's HTTP library, on Boost.Asio) parses the requests,
// bounding the size of their headers and bodies, and frames the answers.
//
// ---- the hand-over -------------------------------------------------------------
//
// pkv::Engine is single-threaded by design (engine.hpp): its step() mutates
// the scheduler, the block pool and every request. So the I/O thread never
// calls it. It puts an Item (a new request, an abort, a metrics scrape) into
// the EngineLoop's inbox -- a deque under a mutex, with a condition variable
// that wakes the engine thread. Between two steps the engine thread drains
// the inbox, so an abort takes effect before the next step schedules anyone,
// as in vLLM, and the blocks it frees are free for that step. What the
// engine says back (a request's admission, its tokens, its end) is collected
// during the step and posted to the I/O thread in one batch after it: one
// wake-up per step, however many streams there are.
//
// ---- what a pause looks like to the client ----------------------------------------
//
// When the cache runs out of blocks, the scheduler preempts the newest running
// request: its blocks are freed, and it waits until it can be scheduled again
// and recompute its prompt and every token it already sent. Nothing fails.
// The connection stays open, no token is sent twice or lost, the stream just
// goes quiet: one inter-token gap is as long as the whole pause. The client's
// p99 inter-token latency shows it as a cliff (build/loadgen measures it).
// SSE lets us make it visible without disturbing any client: a line starting
// with ':' is a comment that every SSE parser skips, so (unless
// --sse-comments off) we send ": pagedkv preempted" and ": pagedkv resumed"
// where the pause begins and ends; `curl -N` shows them.
//
// ---- an edge that outlasts its clients -------------------------------------------
//
// Whatever a client does, the others are served:
//   - A request must arrive whole (headers and body) within --request-timeout
//     of its connection's accept, and never fall silent for longer than
//     --read-timeout: a slow or silent client is answered 408 and closed (a
//     connection that never sent a byte is just closed).
//   - Headers are bounded in size (--max-header-kib: 431), bodies too
//     (--max-body-kib: 413), so a client cannot make us hold more memory than that.
//   - --max-connections caps the completions answered at once; one more gets a
//     fast 429 with Retry-After. /health, /metrics and /v1/models are never
//     counted: a liveness probe and a scrape are answered at full load.
//   - --max-open-connections caps the sockets; at the cap a new connection
//     closes the oldest one still sending its request, so idle connections
//     can never lock a client out.
//   - A client that leaves is noticed at once, streamed or not: a pending read
//     sees its end, and its request is aborted (its blocks freed) between two
//     steps. A client that only shut its sending side (`nc -N` does) still
//     gets its answer: the first bytes we send it tell the two apart (a client
//     that closed its socket answers them with a reset).
//   - A write that a client does not take within --write-timeout ends its
//     answer, and the request is aborted.
// With --max-waiting N, a request that finds N requests already waiting (new
// or preempted, plus those handed over and not yet taken) is answered 429
// with Retry-After at once, without waiting for a step: a fast "try again"
// a client or router can act on, instead of a stream that stalls behind a
// queue the engine cannot drain. The scheduler applies the same limit at its
// door (SchedulerConfig::max_waiting) and says "retryable" if a request
// slipped past our count during a step; that is a 429 too, after at most one
// step. Bad input gets a 4xx with an OpenAI-style error body and never reaches
// the engine: malformed JSON, wrong types, unknown fields, ids out of range,
// max_tokens past the context (400), a model we do not serve (404).
//
// ---- the viewer ------------------------------------------------------------------
//
// GET /view is the page of examples/viewer/ in live mode: it subscribes to
// GET /view/events, where a recorder on the engine thread
// (examples/recorder.hpp) sends one record per step -- who ran, who was
// preempted and why, every block table, the free list, the tokens -- so a
// student runs build/loadgen and watches the cache run out as it happens. The
// engine records only while a page is subscribed (--max-viewers caps how
// many; 0 turns /view off); with none it runs as if there were no viewer. A
// step's record travels to the I/O thread in the same batch as the step's
// tokens, and from there to each page. Bounded: each page's connection queues
// at most kViewQueueBytes; a record that does not fit is dropped, and the page
// told how many (every record is a whole snapshot, so the next one stands on
// its own); a page that takes nothing for --write-timeout is closed, like any
// client. The engine thread never waits for a page, nor one page for another.
//
// ---- shutting down ---------------------------------------------------------------
//
// The first SIGTERM or Ctrl-C stops accepting connections and closes those
// still sending a request; answers in progress go on for up to
// --shutdown-timeout. Then each stream still open ends with an error event
// and "data: [DONE]" (a client raises the error: it cannot take the cut for a
// whole answer), each body not yet sent is answered 503, and the server
// exits (status 0). A second signal exits at once.
//
// ---- memory ------------------------------------------------------------------------
//
// Flat under a long run: the engine keeps latency histograms in fixed buckets,
// not every sample (EngineConfig::keep_latency_samples), a finished request
// is released from the scheduler's table (Engine::release) once the step
// that finished it is over, and a connection's state goes with its socket. What
// stays is per connection (bounded by the caps above) and per running request.
// Known limits (a teaching server): one model; no TLS, no auth; one request
// per connection (no keep-alive: every answer says Connection: close).

// Under ThreadSanitizer (make tsan-serve): TSan does not model
// std::atomic_thread_fence (g++ refuses it with -fsanitize=thread), which
// Asio's "fenced blocks" use around a handler's call. They add nothing here:
// one thread runs the event loop, and every hand-over from the engine thread
// goes through the event loop's queue, under its mutex, which TSan does model.
#if defined(__SANITIZE_THREAD__)
#define BOOST_ASIO_DISABLE_FENCED_BLOCK
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define BOOST_ASIO_DISABLE_FENCED_BLOCK
#endif
#endif
#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <nlohmann/json.hpp>

#include <signal.h>
#include <sys/resource.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <deque>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "engine.hpp"
#include "examples/cli.hpp"
#include "examples/devices.hpp"
#include "examples/openai_api.hpp"
#include "examples/recorder.hpp"
#include "examples/viewer_page.hpp"
#include "examples/workload.hpp"
#include "tiny_model/tokenizer.hpp"

namespace {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = net::ip::tcp;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

std::chrono::nanoseconds seconds(double s) { return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::duration<double>(s)); }

// ============================================================================
// 1. Options
// ============================================================================

// The engine's knobs are workload::Setup's (examples/workload.hpp), with `make
// run`'s defaults: 40 blocks of 16 tokens, max_num_seqs 16, so that
// build/loadgen's default workload (make run's, over HTTP) preempts here as
// it does there. The rest is the HTTP edge.
//
// Two defaults are deliberate. The server listens on 127.0.0.1 only: it
// has no authentication, and a teaching server should not be reachable from
// the network by accident (--host 0.0.0.0 says so explicitly). And
// --step-delay-ms is 0: the built-in model steps in about a millisecond, so a
// preemption pause is over before a human watching curl could see it; a
// delay of 50-100 ms per step slows everything down evenly, and the pause
// becomes something you watch happen.
struct Options : workload::Setup {
    std::string checkpoint, tokenizer, model_name;
    std::string host = "127.0.0.1";
    int port = 8000;
    int max_connections = 32;          // completions answered at once
    int max_open_connections = 0;      // sockets open at once; 0 = 1024, or what the open-file limit allows
    int max_body_kib = 256;            // request body cap
    int max_header_kib = 16;           // request line + headers cap
    double request_timeout = 30.0;     // seconds for a whole request to arrive, from its accept
    double read_timeout = 5.0;         // seconds a request may fall silent while it arrives
    double write_timeout = 5.0;        // seconds a write may wait for a client that does not read
    double shutdown_timeout = 5.0;     // seconds answers may go on after the first SIGTERM
    bool sse_comments = true;          // ": pagedkv preempted" / ": pagedkv resumed" in streams
    int step_delay_ms = 0;             // demo knob: sleep after every step
    int max_viewers = 4;               // /view/events streams at once; 0 = the viewer is off
    bool log_requests = false;
};

// Every socket is an open file: the process's limit (ulimit -n) is raised to
// fit --max-open-connections, or, when the hard limit cannot fit what the
// flag asked for, that is an error. 0 (the default) takes 1024, or what the
// limit allows; the startup line prints the number.
void fit_file_limit(Options& o) {
    const rlim_t spare = 64;  // the engine's, the model's and the process's own files
    rlimit r{};
    if (::getrlimit(RLIMIT_NOFILE, &r) != 0) return;
    if (o.max_open_connections == 0) {
        const rlim_t room = r.rlim_max > spare ? r.rlim_max - spare : 0;
        o.max_open_connections = (int)std::min<rlim_t>(1024, room);
        if (o.max_open_connections < 8)
            throw std::runtime_error("this process may open only " + std::to_string(r.rlim_max) + " files (ulimit -n): too few for a server");
    }
    const rlim_t need = (rlim_t)o.max_open_connections + spare;
    if (r.rlim_cur >= need) return;
    if (r.rlim_max < need)
        throw std::runtime_error("--max-open-connections " + std::to_string(o.max_open_connections) + " needs " + std::to_string(need) +
                                 " open files, but this process may have only " + std::to_string(r.rlim_max) +
                                 " (ulimit -n); lower --max-open-connections");
    r.rlim_cur = need;
    ::setrlimit(RLIMIT_NOFILE, &r);
}

Options parse(int argc, char** argv) {
    Options o;
    cli::Parser p("serve", "[checkpoint.bin -z tokenizer.bin] [options]",
                  "An OpenAI-compatible HTTP server (completions, chat, SSE streaming, /metrics) in front of the engine.\n"
                  "Built-in model by default. Listens on 127.0.0.1 only, unless --host says otherwise.");
    p.positional(&o.checkpoint, "checkpoint");
    p.text("-z", &o.tokenizer, "FILE", "tokenizer for a checkpoint");
    p.text("--host", &o.host, "ADDR", "address to listen on; anything but 127.0.0.1 exposes the server to the network");
    p.integer("--port", &o.port, 0, 65535, "TCP port; 0 = any free port (printed at startup)");
    p.text("--model-name", &o.model_name, "NAME", "the model id clients name (default: 'built-in', or the checkpoint's file name without .bin)");
    p.integer("--num-blocks", &o.num_blocks, 1, workload::kMaxBlocks, "KV cache blocks");
    p.integer("--block-size", &o.block_size, 1, pkv::kMaxBlockSize, "tokens per block");
    p.integer("--max-num-batched-tokens", &o.max_num_batched_tokens, 1, workload::kMaxLen, "token budget per step");
    workload::add_engine_flags(p, o);
    p.choice("--device", &o.device, {{"cpu", pkv::Device::kCpu}, {"emulated", pkv::Device::kEmulated}, {"cuda", pkv::Device::kCuda}},
             "where the model runs (emulated: the CUDA kernels on the CPU, slow; cuda: a `make cuda` build on a GPU)");
    pkv::add_math_flag(p, &o.math);
    p.real("--log-interval", &o.log_interval, 0, 3600, "seconds between vLLM-style INFO lines on stderr; 0 = off");
    p.integer("--max-connections", &o.max_connections, 1, 65536,
              "completions answered at once (streams and bodies); one more gets a fast 429. /health, /metrics and /v1/models never count");
    p.integer("--max-open-connections", &o.max_open_connections, 0, 65536,
              "sockets open at once; at the cap a new connection closes the oldest one still sending its request. "
              "0 = 1024, or fewer if the open-file limit (ulimit -n) allows fewer");
    p.integer("--max-body-kib", &o.max_body_kib, 1, 65536, "largest request body, KiB; larger gets 413");
    p.integer("--max-header-kib", &o.max_header_kib, 1, 1024, "largest request line and headers together, KiB; larger gets 431");
    p.real("--request-timeout", &o.request_timeout, 0.05, 3600, "seconds a whole request (headers and body) may take to arrive; slower gets 408");
    p.real("--read-timeout", &o.read_timeout, 0.05, 3600, "seconds a request may fall silent while it arrives; then 408");
    p.real("--write-timeout", &o.write_timeout, 0.05, 3600, "seconds a write may block on a client that does not read; then the request is aborted");
    p.real("--shutdown-timeout", &o.shutdown_timeout, 0, 3600,
           "seconds answers in progress may go on after SIGTERM or Ctrl-C; then streams end with an error event (a second signal: exit at once)");
    p.on_off("--sse-comments", &o.sse_comments, "mark preemption pauses in streams with SSE comment lines (every client ignores them)");
    p.integer("--step-delay-ms", &o.step_delay_ms, 0, 10000, "sleep this long after every engine step (a demo knob: makes a pause long enough to watch)");
    p.integer("--max-viewers", &o.max_viewers, 0, 64,
              "pages watching the engine at /view at once (each gets every step's record; one more gets a 429); 0 = /view is off");
    p.flag("--log-requests", &o.log_requests, "one line per finished request on stderr");
    p.epilog("Try: curl -N http://127.0.0.1:8000/v1/completions -H 'Content-Type: application/json' \\\n"
             "       -d '{\"prompt\": \"Once upon a time\", \"max_tokens\": 32, \"temperature\": 0, \"stream\": true}'");
    p.parse(argc, argv);
    if (!o.tokenizer.empty() && o.checkpoint.empty()) cli::bad_usage("-z needs a checkpoint: the built-in model has its own vocabulary");
    if (o.model_name.empty())
        o.model_name = o.checkpoint.empty() ? "built-in" : std::filesystem::path(o.checkpoint).stem().string();
    return o;
}

// What the viewer's page says about this server's run (the engine's own
// configuration comes from the engine).
viewer::RunInfo live_run_info(const Options& o) {
    viewer::RunInfo info;
    info.mode = "live";
    info.events_url = "/view/events";
    info.model = o.model_name;
    info.device = pkv::to_string(o.device);
    info.workload = "requests from HTTP clients, as they come";
    info.victim = pkv::to_string(o.policy.victim);
    info.preemption = pkv::to_string(o.policy.preemption);
    info.admission = pkv::to_string(o.policy.admission);
    return info;
}

// ============================================================================
// 2. The hand-over: the inbox, the notes, the engine thread
// ============================================================================
//
//   I/O thread --Item--> [ inbox: one deque, one mutex ] --> engine thread
//   engine thread --Notes, one batch per step--> net::post --> each request's Listener
//
// Why not let the I/O thread lock the engine and call it itself? A step
// takes milliseconds (seconds on a slow device), and the I/O thread would
// wait on that lock, with every connection behind it -- a /health probe
// included. With the inbox the I/O thread holds a lock only for a push_back;
// the engine thread takes everything in one swap between steps, so a burst
// of a hundred requests costs it one lock, not a hundred.

// What the engine thread tells a request's client. kDoor: the engine's
// verdict on add_request (the I/O thread waits for it before it sends a
// status line: once "200 OK" is on the wire, a refusal could only be told
// inside the stream). kEvent: a token or a state change. kGone: the engine
// stopped (it failed): no more notes will come.
struct Note {
    enum Kind { kDoor, kEvent, kGone } kind = kEvent;
    pkv::StreamEvent event{};  // kEvent
    int id = -1;               // kDoor: the engine's request id
    bool accepted = false;     // kDoor
    bool retryable = false;    // kDoor, rejected: a full queue (429), not a bad request (400)
    std::string reason;        // kDoor rejected, kGone: why

    static Note door(int id, bool accepted, bool retryable, std::string reason) {
        Note n;
        n.kind = kDoor;
        n.id = id;
        n.accepted = accepted;
        n.retryable = retryable;
        n.reason = std::move(reason);
        return n;
    }
    static Note of(const pkv::StreamEvent& e) {
        Note n;
        n.event = e;
        return n;
    }
    static Note gone(std::string why) {
        Note n;
        n.kind = kGone;
        n.reason = std::move(why);
        return n;
    }
};

// Whoever waits for a request's notes (a connection, section 3). on_note
// runs on the I/O thread only: the engine thread posts it there.
struct Listener {
    virtual ~Listener() = default;
    virtual void on_note(const Note& n) = 0;
};

// Runs a function on the I/O thread (net::post onto its event loop).
using PostFn = std::function<void(std::function<void()>)>;
// The viewer's records, as server-sent events, for the pages (I/O thread).
struct ViewRecord {
    bool state;       // a "state" record (a page starts from one), not a "step"
    std::string sse;  // the event's bytes
};
using ViewSink = std::function<void(const std::vector<ViewRecord>&)>;

// The engine thread. The I/O thread calls submit(), abort() and scrape();
// the engine thread runs loop(), and is the only thread that touches `eng_`
// once start() has been called (before that, main sets it up).
class EngineLoop {
public:
    enum class Admit { kQueued, kShed, kDown };

    EngineLoop(pkv::Engine& eng, const Options& o, const pkv::Tokenizer& tok, PostFn post, ViewSink view)
        : eng_(eng), labels_("model_name=\"" + pkv::prometheus_escape(o.model_name) + "\""), max_waiting_(o.policy.max_waiting),
          step_delay_ms_(o.step_delay_ms), post_(std::move(post)), view_(std::move(view)), rec_(tok, live_run_info(o), /*keep=*/false),
          prompt_tokens_(one_two_five(eng.config().sched.max_model_len)), generation_tokens_(one_two_five(eng.config().sched.max_model_len)) {
        // Runs on the engine thread, inside add_request / step / abort.
        eng_.on_event = [this](const pkv::StreamEvent& e) { route(e); };
    }
    EngineLoop(const EngineLoop&) = delete;
    EngineLoop& operator=(const EngineLoop&) = delete;
    ~EngineLoop() { stop(); }

    void start() { thread_ = std::thread([this] { run(); }); }
    // Waits for the engine thread to finish its step and leave. Requests
    // still in the engine are dropped with it (the server is exiting).
    void stop() {
        {
            std::lock_guard<std::mutex> lk(m_);
            stopping_ = true;
        }
        cv_.notify_all();
        if (thread_.joinable()) thread_.join();
    }
    const std::string& labels() const { return labels_; }

    // ---- called by the I/O thread ---------------------------------------------

    // Hands a request over, or sheds it at once when the waiting queue is at
    // --max-waiting. The count is the engine's waiting queue as of its last
    // publish (after its last step), plus the requests handed over since and
    // not yet taken: we decide without waiting for a step. It can be one
    // step stale, in both directions; the scheduler's own max_waiting check
    // at add_request is exact, and what slips past us meets it there.
    Admit submit(std::vector<int32_t> prompt, const pkv::SamplingParams& params, std::shared_ptr<Listener> to) {
        {
            std::lock_guard<std::mutex> lk(m_);
            if (stopping_ || !failed_.empty()) return Admit::kDown;
            if (max_waiting_ > 0 && waiting_ + handed_over_ >= max_waiting_) return Admit::kShed;
            inbox_.push_back(Item{Item::kSubmit, std::move(prompt), params, std::move(to), -1, nullptr});
            ++handed_over_;
        }
        cv_.notify_one();
        return Admit::kQueued;
    }
    // The client left: abort request `id` (a no-op if it already finished).
    void abort(int id) {
        {
            std::lock_guard<std::mutex> lk(m_);
            if (stopping_ || !failed_.empty()) return;
            inbox_.push_back(Item{Item::kAbort, {}, {}, nullptr, id, nullptr});
        }
        cv_.notify_one();
    }
    // The metrics page's engine part, rendered on the engine thread between
    // two steps; `done` gets it on the I/O thread ("" if the engine is down).
    void scrape(std::function<void(std::string)> done) {
        {
            std::lock_guard<std::mutex> lk(m_);
            if (!(stopping_ || !failed_.empty())) {
                inbox_.push_back(Item{Item::kScrape, {}, {}, nullptr, -1, std::move(done)});
                done = nullptr;
            }
        }
        if (done) return post_([done] { done(""); });
        cv_.notify_one();
    }
    // How many pages watch /view/events now. The engine thread records only
    // while there is one, and sends a state record whenever the count changes
    // (a page that joined starts from it).
    void set_viewers(int n) {
        {
            std::lock_guard<std::mutex> lk(m_);
            viewers_ = n;
            viewers_changed_ = true;
        }
        cv_.notify_one();
    }
    // "" while the engine thread runs; else why it stopped.
    std::string failure() {
        std::lock_guard<std::mutex> lk(m_);
        return failed_;
    }

private:
    // What the I/O thread hands over. One struct for all three kinds keeps
    // the inbox a plain deque; the fields a kind does not use stay empty.
    struct Item {
        enum Kind { kSubmit, kAbort, kScrape } kind;
        std::vector<int32_t> prompt;                 // kSubmit: [prompt tokens]
        pkv::SamplingParams params;                  // kSubmit
        std::shared_ptr<Listener> to;                // kSubmit
        int id;                                      // kAbort
        std::function<void(std::string)> scraped;    // kScrape
    };
    // A request in the engine, as the engine thread follows it: where its
    // notes go, and when its phases began (vLLM's queue/prefill/decode times).
    // vLLM's request histograms (those the engine's Metrics do not keep) are
    // counted here, when a request finishes: they need a request's whole life.
    struct Live {
        std::shared_ptr<Listener> to;
        double scheduled = -1, first_token = -1;  // engine clock; -1 = not yet
    };

    // ---- the engine thread ----------------------------------------------------------

    void run() {
        try {
            loop();
        } catch (const std::exception& e) {
            // A step that throws is a bug (or memory ran out): every stream
            // ends with an error event, /health answers 503, new requests too.
            std::fprintf(stderr, "serve: the engine stopped: %s\n", e.what());
            std::lock_guard<std::mutex> lk(m_);
            failed_ = e.what();
        }
        // Nobody will answer these any more: requests in the engine, items
        // taken but not applied (when an item threw), items never taken.
        const std::string why = failure().empty() ? "the server is stopping" : "the engine stopped: " + failure();
        for (auto& [id, l] : live_) tell(l.to, Note::gone(why));
        live_.clear();
        std::deque<Item> left;
        {
            std::lock_guard<std::mutex> lk(m_);
            left.swap(inbox_);
        }
        for (std::deque<Item>* q : {&taken_, &left})
            for (Item& it : *q) {
                if (it.to) tell(it.to, Note::gone(why));
                if (it.scraped) post_([f = std::move(it.scraped)] { f(""); });
            }
        flush();
    }

    // The engine thread's whole life: take what was handed over, apply it,
    // run one step, publish the queue length the I/O thread sheds on; sleep
    // only when the engine has nothing to do. Aborts are applied here,
    // between two steps, never inside one (the step's batch holds the blocks).
    void loop() {
        int viewers = 0;
        bool changed = false;
        for (;;) {
            {
                std::unique_lock<std::mutex> lk(m_);
                cv_.wait(lk, [&] { return stopping_ || !inbox_.empty() || eng_.has_unfinished() || viewers_changed_; });
                if (stopping_) return;
                taken_.swap(inbox_);  // inbox_ is now empty: the I/O thread goes on filling it
                viewers = viewers_;
                changed = viewers_changed_;
                viewers_changed_ = false;
            }
            int submitted = 0;
            while (!taken_.empty()) {
                submitted += apply(taken_.front());
                taken_.pop_front();
            }
            follow_viewers(viewers, changed);
            publish(submitted);
            release_finished();
            flush();
            if (!eng_.has_unfinished()) continue;
            step_start_ = eng_.now();
            eng_.step();
            if (rec_.attached()) view_out_.push_back({false, viewer::sse_event("step", rec_.end_step())});
            note_scheduled();
            publish(0);
            release_finished();
            flush();
            // The demo knob: a slower step makes a pause long enough to watch.
            // (A wait, not a sleep: stop() cuts it short.)
            if (step_delay_ms_ > 0) {
                std::unique_lock<std::mutex> lk(m_);
                cv_.wait_for(lk, milliseconds(step_delay_ms_), [&] { return stopping_; });
            }
        }
    }

    // One handed-over item. Returns 1 for a submission (it leaves the
    // handed-over count once the engine has it in its own queue).
    int apply(Item& it) {
        switch (it.kind) {
            case Item::kSubmit: {
                // add_request hands out the next id; routing must know it before
                // add_request emits anything (a rejection is emitted inside it).
                const int id = eng_.scheduler().num_requests();
                live_[id] = Live{it.to};
                eng_.add_request(std::move(it.prompt), it.params);
                const pkv::Request* r = eng_.request(id);
                const bool rejected = r->finish_reason == pkv::FinishReason::kRejected;
                tell(it.to, Note::door(id, !rejected, r->retryable, r->reject_reason));
                if (rejected) {
                    live_.erase(id);
                    done_.push_back(id);
                }
                return 1;
            }
            case Item::kAbort:
                // Between steps: the blocks are free when abort() returns, and
                // its kFinished(aborted) event ends the route. An abort for a
                // request that finished meanwhile finds no route: nothing to do.
                if (live_.count(it.id)) eng_.abort(it.id);
                return 0;
            case Item::kScrape: {
                std::string page = eng_.prometheus(labels_) + phases_text();
                // Swap's own families, when a lab policy swaps (lab/swap.hpp).
                const pkv::LabPolicy* lab = pkv::lab_policy(eng_.scheduler());
                if (lab && lab->config().preemption == pkv::Preemption::kSwap) page += pkv::prometheus_swap_text(lab->stats(), labels_);
                std::ostringstream o;
                // Read now, unlike a step's snapshot: a freed block shows at once.
                pkv::prometheus_family(o, "gauge", "kv_cache_free_blocks", "Free KV cache blocks, at scrape time.");
                pkv::prometheus_sample(o, "kv_cache_free_blocks", labels_, (long)eng_.pool().num_free_blocks());
                pkv::prometheus_family(o, "gauge", "kv_cache_blocks", "KV cache blocks in the pool.");
                pkv::prometheus_sample(o, "kv_cache_blocks", labels_, (long)eng_.pool().num_blocks());
                post_([f = std::move(it.scraped), p = page + o.str()] { f(p); });
                return 0;
            }
        }
        return 0;
    }

    // Engine::on_event: every token and state change goes to its request's
    // listener, in the order the engine emits them (engine.hpp section 1),
    // collected in the outbox until the step ends. A finished request's
    // route is dropped: nothing follows kFinished.
    void route(const pkv::StreamEvent& e) {
        auto it = live_.find(e.request_id);
        if (it == live_.end() || e.type == pkv::EventType::kRejected) return;  // (a rejection: the door's note says it)
        Live& l = it->second;
        if (e.type == pkv::EventType::kToken) {
            if (l.scheduled < 0) l.scheduled = step_start_;
            if (l.first_token < 0) l.first_token = e.time;
        }
        tell(l.to, Note::of(e));
        if (e.type != pkv::EventType::kFinished) return;
        if (e.reason != pkv::FinishReason::kAborted && e.reason != pkv::FinishReason::kError) {
            // vLLM's phases of a finished request (vllm/v1/metrics/stats.py):
            // waiting, prefill (first scheduled -> first token), decode (first
            // token -> last), inference (prefill + decode).
            const pkv::Request* r = eng_.request(e.request_id);
            const double arrival = r->arrival_time;
            queue_.add(l.scheduled - arrival);
            prefill_.add(l.first_token - l.scheduled);
            decode_.add(e.time - l.first_token);
            inference_.add(e.time - l.scheduled);
            prompt_tokens_.add(r->num_prompt_tokens);
            generation_tokens_.add(r->num_output_tokens());
        }
        live_.erase(it);
        done_.push_back(e.request_id);  // released after the step: its batch still refers to it
    }

    // A request is scheduled in the step where it first computes something:
    // the first chunk of a long prompt comes steps before its first token.
    void note_scheduled() {
        for (auto& [id, l] : live_)
            if (l.scheduled < 0 && eng_.request(id)->num_computed_tokens > 0) l.scheduled = step_start_;
    }

    void release_finished() {
        for (int id : done_) eng_.release(id);
        done_.clear();
    }

    // The viewer's recorder: attached while a page watches, detached when the
    // last one leaves; a state record (the whole state now) whenever the
    // count of pages changed, for one that joined.
    void follow_viewers(int viewers, bool changed) {
        if (viewers == 0) return rec_.detach();
        if (!rec_.attached()) rec_.attach(eng_);
        if (changed) view_out_.push_back({true, viewer::sse_event("state", rec_.state_record())});
    }

    void tell(const std::shared_ptr<Listener>& to, Note n) { outbox_.emplace_back(to, std::move(n)); }
    // The notes of one step (or one inbox drain), and its viewer records, to
    // the I/O thread in one post.
    void flush() {
        if (outbox_.empty() && view_out_.empty()) return;
        post_([batch = std::move(outbox_), view = std::move(view_out_), sink = &view_] {
            for (const auto& [to, n] : batch) to->on_note(n);
            if (!view.empty()) (*sink)(view);
        });
        outbox_.clear();
        view_out_.clear();
    }

    std::string phases_text() const {
        std::ostringstream o;
        pkv::prometheus_histogram(o, "request_queue_time_seconds", "Arrival to first scheduled (the WAITING phase).", queue_, labels_);
        pkv::prometheus_histogram(o, "request_prefill_time_seconds", "First scheduled to first token (the PREFILL phase).", prefill_, labels_);
        pkv::prometheus_histogram(o, "request_decode_time_seconds", "First token to last (the DECODE phase).", decode_, labels_);
        pkv::prometheus_histogram(o, "request_inference_time_seconds", "First scheduled to last token (PREFILL + DECODE).", inference_, labels_);
        pkv::prometheus_histogram(o, "request_prompt_tokens", "Prompt tokens of a finished request.", prompt_tokens_, labels_);
        pkv::prometheus_histogram(o, "request_generation_tokens", "Output tokens of a finished request.", generation_tokens_, labels_);
        return o.str();
    }
    // vLLM's ladder for token counts: 1, 2, 5, 10, 20, 50, ... up to `max`.
    static std::vector<double> one_two_five(int max) {
        std::vector<double> b;
        for (double d = 1; d <= max; d *= 10)
            for (double m : {1, 2, 5})
                if (m * d <= max) b.push_back(m * d);
        return b;
    }

    // The count the I/O thread sheds on: the requests waiting for the engine
    // (new and preempted, and swapped out), as of now. A preemption puts its
    // victim back into the waiting queue, so under thrash this count grows
    // with no new arrival at all: the edge then sheds the newcomers.
    void publish(int submitted) {
        const int waiting = (int)(eng_.scheduler().waiting().size() + eng_.scheduler().policy().num_held());
        std::lock_guard<std::mutex> lk(m_);
        waiting_ = waiting;
        handed_over_ -= submitted;
    }

    pkv::Engine& eng_;  // touched by the engine thread only (after start())
    const std::string labels_;
    const int max_waiting_, step_delay_ms_;
    const PostFn post_;
    const ViewSink view_;  // (called on the I/O thread: it never changes)
    // Engine thread only: the viewer's recorder and this step's records;
    // request id -> its route, for requests that can
    // still emit; the items taken from the inbox, being applied; the notes
    // of this step; finished ids to release; the phase histograms (vLLM's
    // request ladder; the samples themselves are not kept).
    std::unordered_map<int, Live> live_;
    std::deque<Item> taken_;
    std::vector<std::pair<std::shared_ptr<Listener>, Note>> outbox_;
    viewer::Recorder rec_;
    std::vector<ViewRecord> view_out_;
    std::vector<int> done_;
    double step_start_ = 0;  // engine clock, when the current step began
    pkv::Histogram queue_{pkv::request_latency_buckets()}, prefill_{pkv::request_latency_buckets()},
        decode_{pkv::request_latency_buckets()}, inference_{pkv::request_latency_buckets()};
    pkv::Histogram prompt_tokens_, generation_tokens_;

    std::mutex m_;  // guards everything below
    std::condition_variable cv_;
    std::deque<Item> inbox_;
    int waiting_ = 0;      // the engine's waiting + swapped queues, as of its last publish
    int handed_over_ = 0;  // submissions in the inbox or being applied
    int viewers_ = 0;      // pages watching /view/events
    bool viewers_changed_ = false;
    bool stopping_ = false;
    std::string failed_;   // why the engine thread stopped ("" while it runs)
    std::thread thread_;
};

// ============================================================================
// 3. A connection: one request, one answer
// ============================================================================
//
// Every connection is a Connection object, alive while any of its pending
// operations (a read, a write, a timer) or the engine thread holds it. Its
// life, all on the I/O thread:
//
//   reading    the request arrives, parsed by Beast as it comes, under two
//              clocks (the whole request by --request-timeout, each silence
//              by --read-timeout) and two size caps (headers, body). Its head
//              alone decides what needs no body: a wrong path or method, a
//              body over the cap, a completion over --max-connections.
//   answering  a GET is answered at once (a scrape after one trip through
//              the engine thread); a completion waits for the engine's
//              verdict, then streams its tokens, or sends one body at the end.
//              Meanwhile a read stays pending on the socket: it sees the
//              client leave.
//   closing    after the answer we shut our sending side and read until the
//              client closes too (at most 2 s): closing a socket with unread
//              bytes in it resets the connection, and the client could lose
//              the end of our answer.
//
// One request per connection: every answer says Connection: close.

class Server;

class Connection : public Listener, public std::enable_shared_from_this<Connection> {
public:
    Connection(Server& srv, tcp::socket sock, uint64_t serial);
    void start();
    // Listener: a note from the engine thread (posted to the I/O thread).
    void on_note(const Note& n) override;

    enum class Phase { kReading, kAnswering, kClosing, kClosed };
    Phase phase() const { return phase_; }
    uint64_t serial() const { return serial_; }
    bool answering_completion() const { return counted_; }
    // The server closes it: evicted at the cap, or shutting down.
    void close() { close_now(); }
    // Shutdown's deadline: end the answer now, as an error the client sees.
    void cut(const std::string& why);
    // A page watching /view/events: the engine's records for it.
    void view_send(const std::vector<ViewRecord>& records);

private:
    // ---- reading the request ---------------------------------------------------
    void read_more();
    void on_read(beast::error_code ec, size_t n);
    bool on_head();  // false: answered already
    void dispatch();

    // ---- answers -----------------------------------------------------------------
    void answer(int status, const std::string& content_type, std::string body, const std::string& allow = "", bool retry = false);
    void error(int status, const std::string& msg, const std::string& type, const std::string& code, const std::string& param = "",
               bool retry = false);
    void wrong_method(const std::string& allow);
    void metrics();
    void completion(bool chat);
    void send_head(const std::string& content_type);
    void on_events(const std::vector<pkv::StreamEvent>& evs);
    void view_events();
    void finish(const std::string& reason, std::string& out);
    void fail_stream(const std::string& why);
    void end_answer();

    // ---- the socket ---------------------------------------------------------------
    void write(std::string bytes, bool last = false);
    void write_body(const std::string& bytes);
    void flush();
    void watch();
    void on_watch(beast::error_code ec, size_t n);
    void on_client_eof();
    void gone(const char* how);
    void close_gracefully();
    void close_now();
    void arm(std::chrono::nanoseconds d, void (Connection::*on_expiry)());
    void disarm();
    void read_timed_out();
    void write_timed_out();
    void log_request();

    Server& srv_;
    tcp::socket sock_;
    net::steady_timer timer_;
    uint64_t timer_gen_ = 0;  // which arm() the pending wait belongs to
    const uint64_t serial_;
    Phase phase_ = Phase::kReading;
    const Clock::time_point accepted_ = Clock::now();

    // The request.
    beast::flat_buffer in_;
    std::optional<http::request_parser<http::string_body>> parser_;
    size_t bytes_in_ = 0;        // of the request, so far
    bool head_seen_ = false;     // on_head ran
    bool read_timeout_ = false;  // the read clock, not the whole-request one, ran out
    bool http10_ = false;        // an HTTP/1.0 client: no chunked encoding
    bool head_method_ = false;   // HEAD: the head of a GET's answer, no body
    std::string path_;

    // The answer. out_: bytes waiting to be written, one write at a time.
    std::deque<std::string> out_;
    bool writing_ = false, close_after_write_ = false;
    bool reading_ = false;       // a read is pending (the request's, or the watch's)
    bool head_sent_ = false, chunked_ = false;
    bool counted_ = false;       // a completion counted against --max-connections
    bool eof_seen_ = false;      // the client shut its sending side (or closed)
    bool client_gone_ = false;   // ... and it is gone (a reset, a failed write)

    // A completion, from the engine's verdict to its last byte.
    std::optional<openai::Request> req_;
    openai::AnswerId id_;
    std::optional<openai::TextStream> text_;
    bool chat_ = false;
    int engine_id_ = -1;         // from the engine's verdict (Note::kDoor)
    bool door_open_ = false;     // accepted
    bool done_ = false;          // the answer ended (finished, failed or cut)
    std::vector<int32_t> tokens_;  // [output tokens] so far
    std::string body_text_;        // not streamed: the text so far
    std::string finish_;           // "stop" / "length" once known
    int preemptions_ = 0;
    // A page watching /view/events: its stream started with a state record
    // (until then step records are not sent: they would stand on nothing);
    // records dropped since the last "dropped" event told it.
    bool viewer_ = false, view_ready_ = false;
    long view_dropped_ = 0;
    std::array<char, 512> sink_{};  // the watch's reads land here, unused
    size_t discarded_ = 0;
};

// ============================================================================
// 4. The server: accepting, capping, shutting down, /metrics
// ============================================================================

// The edge's own counters. All on the I/O thread: no atomics needed.
struct EdgeStats {
    long shed_queue_full = 0, shed_connections = 0, bad_requests = 0, disconnects = 0, timeouts = 0, evicted = 0;
};

class Server {
public:
    Server(const Options& o, pkv::Engine& eng, const pkv::Tokenizer& tok, net::io_context& io)
        : o_(o), tok_(tok), io_(io), acceptor_(io), signals_(io, SIGINT, SIGTERM), drain_timer_(io),
          loop_(eng, o, tok, [this](std::function<void()> f) { net::post(io_, std::move(f)); },
                [this](const std::vector<ViewRecord>& r) { publish_view(r); }) {
        lim_.model_id = o.model_name;
        if (o.max_viewers > 0) {  // the page and its stream's first event, made once (the engine's configuration is fixed)
            const std::string header = viewer::header_json(live_run_info(o), eng.config());
            view_page_ = viewer::page(viewer::embedded_page(), header);
            view_hello_ = viewer::sse_event("hello", header);
        }
        lim_.vocab_size = eng.model().vocab_size;
        lim_.max_model_len = eng.config().sched.max_model_len;
        seed_state_ = std::random_device{}();
        seed_state_ = (seed_state_ << 32) ^ std::random_device{}();
    }

    // Binds, or throws saying why not. Returns the port (for --port 0).
    int bind() {
        beast::error_code ec;
        tcp::resolver resolver(io_);
        const auto found = resolver.resolve(o_.host, std::to_string(o_.port), ec);
        if (ec || found.empty()) throw std::runtime_error("cannot listen on " + o_.host + ": not an address of this machine (" + ec.message() + ")");
        const tcp::endpoint at = found.begin()->endpoint();
        acceptor_.open(at.protocol(), ec);
        if (!ec) acceptor_.set_option(net::socket_base::reuse_address(true), ec);
        if (!ec) acceptor_.bind(at, ec);
        // The kernel's backlog of connections not yet accepted: twenty clients
        // connecting at once on a busy machine must not overflow it.
        if (!ec) acceptor_.listen(net::socket_base::max_listen_connections, ec);
        if (ec)
            throw std::runtime_error("cannot listen on " + o_.host + ":" + std::to_string(o_.port) + " (" + ec.message() + ")" +
                                     (o_.port != 0 ? "; --port 0 picks a free port" : ""));
        return acceptor_.local_endpoint().port();
    }

    // Runs the I/O thread's event loop until the server has shut down.
    void serve() {
        loop_.start();
        accept();
        wait_for_signal();
        io_.run();
        loop_.stop();
    }

    // What connections ask of the server.
    const Options& options() const { return o_; }
    const pkv::Tokenizer& tok() const { return tok_; }
    const openai::Limits& limits() const { return lim_; }
    EngineLoop& loop() { return loop_; }
    EdgeStats& stats() { return stats_; }
    bool draining() const { return draining_; }
    net::io_context& io() { return io_; }
    // A completion may start unless --max-connections are being answered.
    bool take_answer_slot() {
        if (answers_ >= o_.max_connections) return false;
        ++answers_;
        return true;
    }
    void release_answer_slot() {
        --answers_;
        if (draining_ && answers_ == 0) finish_shutdown();
    }
    void closed(const Connection& c) { open_.erase(c.serial()); }
    std::string next_answer_id(bool chat) { return (chat ? "chatcmpl-" : "cmpl-") + std::to_string(next_id_++); }
    // A request without a seed gets one no other request shares.
    uint64_t next_seed() { return pkv::splitmix64(seed_state_); }
    std::time_t start_time() const { return start_time_; }

    // ---- the viewer's pages ---------------------------------------------------------
    const std::string& view_page() const { return view_page_; }
    const std::string& view_hello() const { return view_hello_; }
    // A page subscribes, unless --max-viewers are subscribed already.
    bool add_viewer(const std::shared_ptr<Connection>& c);
    void remove_viewer(const Connection& c) {
        if (viewers_.erase(c.serial())) loop_.set_viewers((int)viewers_.size());
    }
    // A batch of records from the engine thread, to every page.
    void publish_view(const std::vector<ViewRecord>& records) {
        std::vector<std::shared_ptr<Connection>> pages;
        for (auto& [serial, weak] : viewers_)
            if (auto c = weak.lock()) pages.push_back(c);
        for (auto& c : pages) c->view_send(records);
    }

    // The edge's families, after the engine's (I/O thread, at scrape time).
    std::string edge_metrics() const {
        std::ostringstream o;
        const std::string& l = loop_.labels();
        pkv::prometheus_family(o, "counter", "http_shed_total", "Requests answered 429 at the edge, by reason.");
        pkv::prometheus_sample(o, "http_shed_total", pkv::label_join(l, "reason=\"queue_full\""), stats_.shed_queue_full);
        pkv::prometheus_sample(o, "http_shed_total", pkv::label_join(l, "reason=\"too_many_connections\""), stats_.shed_connections);
        pkv::prometheus_family(o, "counter", "http_bad_requests_total", "Requests refused with a 4xx for their content (not 429).");
        pkv::prometheus_sample(o, "http_bad_requests_total", l, stats_.bad_requests);
        pkv::prometheus_family(o, "counter", "http_request_timeouts_total", "Requests that did not arrive in time (408).");
        pkv::prometheus_sample(o, "http_request_timeouts_total", l, stats_.timeouts);
        pkv::prometheus_family(o, "counter", "http_client_disconnects_total", "Answers whose client left before the end (the request was aborted).");
        pkv::prometheus_sample(o, "http_client_disconnects_total", l, stats_.disconnects);
        pkv::prometheus_family(o, "counter", "http_evicted_connections_total", "Connections closed at --max-open-connections, still sending their request.");
        pkv::prometheus_sample(o, "http_evicted_connections_total", l, stats_.evicted);
        pkv::prometheus_family(o, "gauge", "http_open_answers", "Completions (streams or bodies) being answered now.");
        pkv::prometheus_sample(o, "http_open_answers", l, (long)answers_);
        pkv::prometheus_family(o, "gauge", "http_open_connections", "Sockets open now.");
        pkv::prometheus_sample(o, "http_open_connections", l, (long)open_.size());
        return o.str();
    }

private:
    // ---- accepting ----------------------------------------------------------------

    // The accept loop only ever accepts: a connection is served by its own
    // handlers, never by this one.
    void accept() {
        acceptor_.async_accept([this](beast::error_code ec, tcp::socket sock) {
            if (!acceptor_.is_open()) return;  // shutting down
            if (ec) {
                // Out of file descriptors (or memory): wait a little instead of
                // spinning, and let timeouts free some.
                std::fprintf(stderr, "serve: accept failed: %s\n", ec.message().c_str());
                auto t = std::make_shared<net::steady_timer>(io_, milliseconds(100));
                return t->async_wait([this, t](beast::error_code) { accept(); });
            }
            if ((int)open_.size() >= o_.max_open_connections) make_room();
            const uint64_t serial = next_serial_++;
            auto c = std::make_shared<Connection>(*this, std::move(sock), serial);
            open_[serial] = c;
            c->start();
            accept();
        });
    }
    // At --max-open-connections: close the oldest connection still sending
    // its request (it was promised nothing). If every one is being answered,
    // the newcomer is let in over the cap: it is one of few, as every answer
    // counts against --max-connections, which is lower.
    void make_room() {
        for (auto& [serial, weak] : open_) {
            const std::shared_ptr<Connection> c = weak.lock();
            if (c && c->phase() == Connection::Phase::kReading) {
                stats_.evicted++;
                c->close();  // (erases itself from open_: we stop iterating)
                return;
            }
        }
    }

    // ---- shutting down ---------------------------------------------------------------

    // Signals arrive on the I/O thread, through the event loop (Asio's
    // signal_set): a handler may then do anything, not only what a plain
    // signal handler may (async-signal-safe calls).
    void wait_for_signal() {
        signals_.async_wait([this](beast::error_code ec, int sig) {
            if (ec) return;
            if (!draining_) {
                begin_shutdown(sig);
                return wait_for_signal();
            }
            std::fprintf(stderr, "serve: %s again: exiting now\n", sig == SIGINT ? "SIGINT" : "SIGTERM");
            std::fflush(stderr);
            std::_Exit(128 + sig);
        });
    }
    void begin_shutdown(int sig) {
        draining_ = true;
        beast::error_code ignored;
        acceptor_.close(ignored);
        // Connections still sending a request were promised nothing.
        std::vector<std::shared_ptr<Connection>> readers;
        for (auto& [serial, weak] : open_)
            if (auto c = weak.lock(); c && c->phase() == Connection::Phase::kReading) readers.push_back(c);
        for (auto& c : readers) c->close();
        if (answers_ == 0) return finish_shutdown();
        std::printf("%s: %d answer%s in progress; waiting up to %s s for them\n", sig == SIGINT ? "SIGINT" : "SIGTERM", answers_,
                    answers_ == 1 ? "" : "s", cli::number_text(o_.shutdown_timeout).c_str());
        std::fflush(stdout);
        drain_timer_.expires_after(seconds(o_.shutdown_timeout));
        drain_timer_.async_wait([this](beast::error_code ec) {
            if (ec || finished_) return;
            // The deadline: every answer still open ends now, as an error.
            std::vector<std::shared_ptr<Connection>> cut;
            for (auto& [serial, weak] : open_)
                if (auto c = weak.lock()) cut.push_back(c);
            for (auto& c : cut) c->cut("the server is shutting down");
            // Their last bytes get one more second (a client that does not
            // read them is not waited for).
            drain_timer_.expires_after(std::chrono::seconds(1));
            drain_timer_.async_wait([this](beast::error_code e) {
                if (!e) finish_shutdown();
            });
        });
    }
    void finish_shutdown() {
        if (finished_) return;
        finished_ = true;
        drain_timer_.cancel();
        signals_.cancel();
        std::vector<std::shared_ptr<Connection>> all;
        for (auto& [serial, weak] : open_)
            if (auto c = weak.lock()) all.push_back(c);
        for (auto& c : all) c->close();
        io_.stop();  // serve() returns, and stops the engine thread
    }

    const Options& o_;
    const pkv::Tokenizer& tok_;
    net::io_context& io_;
    tcp::acceptor acceptor_;
    net::signal_set signals_;
    net::steady_timer drain_timer_;
    openai::Limits lim_;
    EngineLoop loop_;
    EdgeStats stats_;
    // Every open connection, oldest first (make_room evicts from the front).
    std::map<uint64_t, std::weak_ptr<Connection>> open_;
    std::map<uint64_t, std::weak_ptr<Connection>> viewers_;  // pages on /view/events
    std::string view_page_, view_hello_;
    uint64_t next_serial_ = 0;
    int answers_ = 0;  // completions being answered (--max-connections)
    bool draining_ = false, finished_ = false;
    long next_id_ = 0;
    uint64_t seed_state_ = 0;
    const std::time_t start_time_ = std::time(nullptr);
};

// ============================================================================
// 5. The connection's code
// ============================================================================

bool Server::add_viewer(const std::shared_ptr<Connection>& c) {
    if ((int)viewers_.size() >= o_.max_viewers) return false;
    viewers_[c->serial()] = c;
    loop_.set_viewers((int)viewers_.size());
    return true;
}

Connection::Connection(Server& srv, tcp::socket sock, uint64_t serial)
    : srv_(srv), sock_(std::move(sock)), timer_(srv.io()), serial_(serial) {}

void Connection::start() {
    // Small writes go out at once: a token is a few dozen bytes.
    beast::error_code ignored;
    sock_.set_option(tcp::no_delay(true), ignored);
    parser_.emplace();
    parser_->header_limit((uint32_t)srv_.options().max_header_kib * 1024);
    parser_->body_limit((uint64_t)srv_.options().max_body_kib * 1024);
    read_more();
}

// ---- reading the request ------------------------------------------------------

// One more read of the request, under whichever clock runs out first: the
// whole request's (from the accept) or the silence's (from now).
void Connection::read_more() {
    const auto whole = accepted_ + seconds(srv_.options().request_timeout);
    const auto quiet = Clock::now() + seconds(srv_.options().read_timeout);
    read_timeout_ = quiet < whole;
    arm(std::min(whole, quiet) - Clock::now(), &Connection::read_timed_out);
    reading_ = true;
    http::async_read_some(sock_, in_, *parser_, [self = shared_from_this()](beast::error_code ec, size_t n) {
        self->reading_ = false;
        self->on_read(ec, n);
    });
}

void Connection::on_read(beast::error_code ec, size_t n) {
    if (phase_ != Phase::kReading) {  // answered meanwhile (a timeout), or closed (eviction, shutdown)
        if (phase_ == Phase::kClosing) watch();  // the answer is out: drain
        return;
    }
    disarm();
    bytes_in_ += n;
    if (ec == http::error::end_of_stream || ec == http::error::partial_message || ec == net::error::eof) {
        // The client shut its side before the request was whole (or sent nothing).
        if (bytes_in_ == 0 && in_.size() == 0) return close_now();
        srv_.stats().bad_requests++;
        return error(400, "the request was cut short: the client closed its side before the request was complete", "invalid_request_error",
                     "bad_request");
    }
    if (ec == http::error::header_limit) {
        srv_.stats().bad_requests++;
        return error(431, "the request line and headers are larger than this server's limit of " + std::to_string(srv_.options().max_header_kib) +
                              " KiB (--max-header-kib)", "invalid_request_error", "request_header_fields_too_large");
    }
    if (ec == http::error::body_limit) {
        srv_.stats().bad_requests++;
        return error(413, "the request body is larger than this server's limit of " + std::to_string(srv_.options().max_body_kib) +
                              " KiB (--max-body-kib)", "invalid_request_error", "request_too_large");
    }
    if (ec && ec.category() == http::make_error_code(http::error::bad_target).category()) {
        // Beast's parser refused it: not HTTP, two different Content-Lengths,
        // a bad chunk size, ...
        srv_.stats().bad_requests++;
        return error(400, "the HTTP request could not be read: " + ec.message(), "invalid_request_error", "bad_request");
    }
    if (ec) return close_now();  // a reset, or the socket closed under us
    if (parser_->is_header_done() && !head_seen_) {
        head_seen_ = true;
        if (!on_head()) return;
    }
    if (parser_->is_done()) return dispatch();
    if (writing_) return;  // a "100 Continue" is on its way; its completion reads on
    read_more();
}

// The routes: a path and the methods it takes (HEAD with every GET).
struct Route {
    const char* path;
    const char* allow;
};
constexpr Route kRoutes[] = {{"/v1/completions", "POST"}, {"/v1/chat/completions", "POST"}, {"/v1/models", "GET, HEAD"},
                             {"/health", "GET, HEAD"},     {"/metrics", "GET, HEAD"},           {"/view", "GET, HEAD"},
                             {"/view/events", "GET, HEAD"}};

// The request's head is in: what can be decided without its body is decided
// here, before the body is read.
bool Connection::on_head() {
    const auto& req = parser_->get();
    http10_ = req.version() < 11;
    head_method_ = req.method() == http::verb::head;
    // The path: an absolute-form target (http://host/path) names it too;
    // a query string is not part of it.
    std::string target(req.target());
    if (target.rfind("http://", 0) == 0 || target.rfind("https://", 0) == 0) {
        const size_t slash = target.find('/', target.find("//") + 2);
        target = slash == std::string::npos ? "/" : target.substr(slash);
    }
    path_ = target.substr(0, target.find('?'));
    const Route* route = nullptr;
    for (const Route& r : kRoutes)
        if (path_ == r.path) route = &r;
    const std::string method(req.method_string());
    if (!route) {
        srv_.stats().bad_requests++;
        error(404, "no route for " + method + " " + path_ +
                       " (this server has POST /v1/completions, POST /v1/chat/completions, GET /v1/models, GET /health, GET /metrics, "
                       "GET /view, GET /view/events)",
              "invalid_request_error", "not_found");
        return false;
    }
    const bool is_post = std::string(route->allow) == "POST";
    const bool allowed = is_post ? req.method() == http::verb::post : (req.method() == http::verb::get || head_method_);
    if (!allowed) {
        wrong_method(route->allow);
        return false;
    }
    if (!is_post) return true;
    // A body we cannot decode is refused, not read as plain text.
    const auto enc = req.find(http::field::content_encoding);
    if (enc != req.end() && !beast::iequals(enc->value(), "identity")) {
        srv_.stats().bad_requests++;
        error(415, "the body's Content-Encoding is " + std::string(enc->value()) + ", which this server does not decode: send it uncompressed",
              "invalid_request_error", "unsupported_media_type");
        return false;
    }
    if (srv_.draining()) {
        error(503, "the server is shutting down", "server_error", "server_shutdown", "", true);
        return false;
    }
    // The cap on completions, before their body is read.
    if (!srv_.take_answer_slot()) {
        srv_.stats().shed_connections++;
        error(429, "too many connections: this server answers " + std::to_string(srv_.options().max_connections) +
                       " completions at once (--max-connections); retry after a moment",
              "rate_limit_error", "too_many_connections", "", true);
        return false;
    }
    counted_ = true;
    // A client that asks first (Expect: 100-continue, as curl does for large
    // bodies) is told to go on; otherwise it waits a second before sending.
    if (beast::iequals(req[http::field::expect], "100-continue") && !http10_) write("HTTP/1.1 100 Continue\r\n\r\n");
    return true;
}

void Connection::dispatch() {
    phase_ = Phase::kAnswering;
    const std::string& p = path_;
    if (p == "/health") {
        const std::string f = srv_.loop().failure();
        if (!f.empty()) return error(503, "the engine stopped: " + f, "server_error", "engine_failed", "", true);
        return answer(200, "application/json", "{\"status\":\"ok\"}");
    }
    if (p == "/v1/models") {
        const openai::Limits& lim = srv_.limits();
        const openai::ojson m = {{"id", lim.model_id}, {"object", "model"}, {"created", (long)srv_.start_time()},
                                 {"owned_by", "pagedkv"}, {"max_model_len", lim.max_model_len}};
        return answer(200, "application/json", openai::dump({{"object", "list"}, {"data", openai::ojson::array({m})}}));
    }
    if (p == "/metrics") return metrics();
    if (p == "/view" || p == "/view/events") {
        if (srv_.options().max_viewers == 0)
            return error(404, "the viewer is off on this server (--max-viewers 0)", "invalid_request_error", "not_found");
        if (p == "/view") return answer(200, "text/html; charset=utf-8", srv_.view_page());
        return view_events();
    }
    completion(p == "/v1/chat/completions");
}

// ---- answers --------------------------------------------------------------------

// A whole answer at once, then the connection closes. A 429 or 503 says when
// to retry: one second, a fixed guess. A busier server could compute it from
// the queue's drain rate; a client that retries sooner is shed again,
// cheaply, so a guess is safe.
void Connection::answer(int status, const std::string& content_type, std::string body, const std::string& allow, bool retry) {
    if (phase_ == Phase::kClosing || phase_ == Phase::kClosed || head_sent_) return;
    phase_ = Phase::kAnswering;
    http::response<http::string_body> res{(http::status)status, 11};
    res.set(http::field::server, "pagedkv");
    res.set(http::field::content_type, content_type);
    if (!allow.empty()) res.set(http::field::allow, allow);
    if (retry || status == 429 || status == 503) res.set(http::field::retry_after, "1");
    res.keep_alive(false);
    res.body() = std::move(body);
    res.prepare_payload();
    std::ostringstream o;
    if (head_method_) o << res.base();  // HEAD: the head alone, Content-Length included
    else o << res;
    head_sent_ = true;
    write(o.str(), /*last=*/true);
}

// An OpenAI-style error (openai_api.hpp section 1).
void Connection::error(int status, const std::string& msg, const std::string& type, const std::string& code, const std::string& param,
                       bool retry) {
    answer(status, "application/json", openai::error_body(msg, type, code, param), "", retry);
}

void Connection::wrong_method(const std::string& allow) {
    srv_.stats().bad_requests++;
    const std::string method(parser_->get().method_string());
    answer(405, "application/json",
           openai::error_body(method + " is not allowed on " + path_ + "; use " + allow, "invalid_request_error", "method_not_allowed"), allow);
}

// The engine's part comes from the engine thread (its Metrics are written
// there), between two steps: a scrape during a long step waits for its end.
// The edge's part is read here. The names carry vLLM's colon style
// ("pagedkv:"): promtool's linter remarks on the colon, and says nothing
// else (tests/test_serve.cpp).
void Connection::metrics() {
    arm(std::chrono::seconds(10), &Connection::write_timed_out);  // an engine stuck in a step: 503 below
    srv_.loop().scrape([self = shared_from_this()](std::string page) {
        if (self->phase_ != Phase::kAnswering || self->head_sent_) return;
        self->disarm();
        if (page.empty()) return self->error(503, "the engine did not answer the scrape (stopped?)", "server_error", "engine_unavailable");
        self->answer(200, "text/plain; version=0.0.4", page + self->srv_.edge_metrics());
    });
}

void Connection::completion(bool chat) {
    chat_ = chat;
    // What it asks for, checked field by field (openai_api.hpp).
    try {
        req_.emplace(openai::parse_request(parser_->get().body(), chat, srv_.limits(), srv_.tok(), srv_.next_seed()));
    } catch (const openai::ApiError& e) {
        srv_.stats().bad_requests++;
        return error(e.status, e.what(), e.type, e.code, e.param);
    }
    parser_.reset();  // the body is parsed: its memory goes
    // Admission at the edge: shed now, or hand it over.
    switch (srv_.loop().submit(req_->prompt, req_->params, shared_from_this())) {
        case EngineLoop::Admit::kShed:
            srv_.stats().shed_queue_full++;
            return error(429, "the server is overloaded: " + std::to_string(srv_.options().policy.max_waiting) +
                                  " requests are already waiting (--max-waiting); retry after a moment",
                         "rate_limit_error", "queue_full", "", true);
        case EngineLoop::Admit::kDown:
            return error(503, "the engine is not running: " + srv_.loop().failure(), "server_error", "engine_unavailable");
        case EngineLoop::Admit::kQueued: break;
    }
    id_.chat = chat;
    id_.id = srv_.next_answer_id(chat);
    id_.model = req_->model;
    id_.created = (long)std::time(nullptr);
    text_.emplace(srv_.tok(), req_->prompt.back(), req_->stop);
    // The engine's verdict comes as a note (at most one step away); meanwhile
    // we watch for the client leaving.
    watch();
}

void Connection::on_note(const Note& n) {
    if (n.kind == Note::kDoor) engine_id_ = n.id;
    if (done_ || client_gone_ || phase_ == Phase::kClosed) {
        // The answer ended already (its client left, or shutdown cut it
        // while it waited for this verdict): nobody waits for the request.
        if (n.kind == Note::kDoor && n.accepted) srv_.loop().abort(n.id);
        return;
    }
    switch (n.kind) {
        case Note::kDoor:
            if (!n.accepted) {
                if (n.retryable) {
                    srv_.stats().shed_queue_full++;
                    return error(429, "the server is overloaded: " + n.reason, "rate_limit_error", "queue_full", "", true);
                }
                srv_.stats().bad_requests++;
                return error(400, "the engine refused the request: " + n.reason, "invalid_request_error", "invalid_value");
            }
            door_open_ = true;
            // A stream's head goes now; a body's at the end, unless the client
            // shut its side: then the head is our probe (see on_client_eof).
            if (req_->stream) send_head("text/event-stream");
            else if (eof_seen_) send_head("application/json");
            return;
        case Note::kEvent:
            return on_events({n.event});
        case Note::kGone:
            return fail_stream(n.reason.empty() ? "the engine stopped before this request finished" : n.reason);
    }
}

// The 200 head of a completion. Chunked for an HTTP/1.1 client; for an
// HTTP/1.0 client (which knows no chunks) the body simply ends with the
// connection.
void Connection::send_head(const std::string& content_type) {
    if (head_sent_) return;
    http::response<http::empty_body> res{http::status::ok, 11};
    res.set(http::field::server, "pagedkv");
    res.set(http::field::content_type, content_type);
    if (content_type == "text/event-stream") res.set(http::field::cache_control, "no-cache");
    res.keep_alive(false);
    chunked_ = !http10_;
    if (chunked_) res.chunked(true);
    std::ostringstream o;
    o << res.base();
    head_sent_ = true;
    write(o.str());
}

// Each token is its own SSE event, sent as soon as the step that made it is
// over: what a client times between two events is the engine's inter-token
// latency plus a few microseconds of loopback. During a preemption pause
// there are no events, and we write nothing: the stream goes quiet, which is
// what the client sees.
void Connection::on_events(const std::vector<pkv::StreamEvent>& evs) {
    std::string out;  // this batch's SSE bytes: one write
    for (const pkv::StreamEvent& e : evs) {
        if (done_) break;
        switch (e.type) {
            case pkv::EventType::kToken: {
                tokens_.push_back(e.token);
                const std::string piece = text_->add(e.token);
                if (req_->stream) {
                    const std::vector<int32_t> one = {e.token};
                    out += "data: " + openai::chunk(id_, piece, "", req_->return_token_ids ? &one : nullptr, tokens_.size() == 1) + "\n\n";
                } else {
                    body_text_ += piece;
                }
                // A stop string ends the answer here; the engine would go on,
                // so we abort the request (its blocks are freed).
                if (text_->stopped()) {
                    srv_.loop().abort(engine_id_);
                    finish("stop", out);
                }
                break;
            }
            case pkv::EventType::kPreempted:
                preemptions_++;
                if (req_->stream && srv_.options().sse_comments) out += ": pagedkv preempted\n\n";
                break;
            case pkv::EventType::kResumed:
                if (req_->stream && srv_.options().sse_comments) out += ": pagedkv resumed\n\n";
                break;
            case pkv::EventType::kFinished:
                if (e.reason == pkv::FinishReason::kError || e.reason == pkv::FinishReason::kAborted) {
                    if (!out.empty()) write_body(out);
                    return fail_stream(std::string("the request ended early: ") +
                                       (e.reason == pkv::FinishReason::kError ? "its forward pass failed" : "it was aborted"));
                }
                finish(openai::finish_reason_text(e.reason), out);
                break;
            case pkv::EventType::kRejected: break;  // answered at the door
        }
    }
    if (!out.empty()) write_body(out);
    if (done_) {
        if (head_sent_ && chunked_) write(beast::buffers_to_string(http::make_chunk_last()), true);
        else close_after_write_ = true;
        if (!writing_ && out_.empty()) close_gracefully();
    }
}

// GET /view/events: a page subscribes to the engine's records. The head and
// a "hello" (the run's header) go now; the records follow from the engine
// thread (view_send), starting with a state record. Like a completion's
// stream it ends when the page leaves or the server stops.
void Connection::view_events() {
    if (head_method_) return answer(200, "text/event-stream", "");
    if (!srv_.add_viewer(shared_from_this()))
        return error(429, "too many viewers: this server streams to " + std::to_string(srv_.options().max_viewers) +
                              " pages at once (--max-viewers); retry after a moment", "rate_limit_error", "too_many_viewers", "", true);
    viewer_ = true;
    // The kernel's share of the bound: a fixed send buffer (Linux grows an
    // unset one up to megabytes), so a page that reads nothing holds at most
    // this much in the kernel besides kViewQueueBytes here.
    beast::error_code ignored;
    sock_.set_option(net::socket_base::send_buffer_size(64 * 1024), ignored);
    send_head("text/event-stream");
    write_body(srv_.view_hello());
    watch();  // the page leaving is seen at once
}

// Records for this page. Nothing waits here: the bytes are queued for the
// socket, at most kViewQueueBytes of them; a step record that does not fit
// is dropped and counted, and the page is told how many ("dropped") with the
// next record that fits. A state record is never dropped: the page needs one
// to start from, and there is one per page that joins.
constexpr size_t kViewQueueBytes = 256 * 1024;
void Connection::view_send(const std::vector<ViewRecord>& records) {
    if (phase_ != Phase::kAnswering || client_gone_) return;
    size_t queued = 0;
    for (const std::string& b : out_) queued += b.size();
    for (const ViewRecord& r : records) {
        if (!r.state && !view_ready_) continue;
        if (!r.state && queued + r.sse.size() > kViewQueueBytes) {
            view_dropped_++;
            continue;
        }
        std::string bytes = view_dropped_ > 0 ? viewer::sse_event("dropped", "{\"records\":" + std::to_string(view_dropped_) + "}") : "";
        bytes += r.sse;
        view_dropped_ = 0;
        view_ready_ = true;
        queued += bytes.size();
        write_body(bytes);
    }
}

// The end of a good answer: the last chunk (or the whole body), usage, [DONE].
void Connection::finish(const std::string& reason, std::string& out) {
    finish_ = reason;
    done_ = true;
    const std::string rest = text_->flush();
    const long P = (long)req_->prompt.size(), C = (long)tokens_.size();
    if (req_->stream) {
        const std::vector<int32_t> none;
        out += "data: " + openai::chunk(id_, rest, reason, req_->return_token_ids ? &none : nullptr, tokens_.empty()) + "\n\n";
        if (req_->include_usage) out += "data: " + openai::usage_chunk(id_, P, C) + "\n\n";
        out += "data: [DONE]\n\n";
    } else {
        body_text_ += rest;
        const std::string body = openai::body(id_, body_text_, reason, req_->return_token_ids ? &tokens_ : nullptr, P, C);
        if (head_sent_) out += body;  // after an early head (a probe): the body as its chunks
        else answer(200, "application/json", body);  // the usual case: one whole answer, with its length
    }
    log_request();
}

// An answer that cannot finish (the engine stopped or failed it, or the
// server is shutting down). A stream that has begun can only say so in an
// event, then [DONE]: a client raises the error, and never takes the cut for
// a whole answer. A body not yet begun gets a 503; one begun (after a probe)
// gets the error object as its body.
void Connection::fail_stream(const std::string& why) {
    if (done_) return;
    done_ = true;
    log_request();
    const std::string code = srv_.draining() ? "server_shutdown" : "request_failed";
    if (!head_sent_) return error(503, why, "server_error", code, "", true);
    write_body(req_->stream ? "data: " + openai::error_body(why, "server_error", code) + "\n\ndata: [DONE]\n\n"
                            : openai::error_body(why, "server_error", code));
    if (chunked_) write(beast::buffers_to_string(http::make_chunk_last()), true);
    else close_after_write_ = true;
    if (!writing_ && out_.empty()) close_gracefully();
}

// Shutdown's deadline, for whatever this connection is doing.
void Connection::cut(const std::string& why) {
    if (phase_ == Phase::kReading) return close_now();
    if (phase_ != Phase::kAnswering) return;
    if (req_ && !done_) {
        if (door_open_ && engine_id_ >= 0) srv_.loop().abort(engine_id_);
        return fail_stream(why);
    }
    if (!head_sent_) error(503, why, "server_error", "server_shutdown", "", true);  // a scrape still waiting
}

// The answer's slot (--max-connections) is free once its last bytes are
// written (or the connection is closed): a client that reads slowly holds it.
void Connection::end_answer() {
    if (!counted_) return;
    counted_ = false;
    srv_.release_answer_slot();
}

// ---- the socket ------------------------------------------------------------------

// Queues bytes; one write at a time, in order. `last`: the connection closes
// (gracefully) once they are written.
void Connection::write(std::string bytes, bool last) {
    if (phase_ == Phase::kClosed || client_gone_) return;
    out_.push_back(std::move(bytes));
    if (last) close_after_write_ = true;
    flush();
}
// Body bytes of a completion: one chunk each for a chunked answer.
void Connection::write_body(const std::string& bytes) {
    if (bytes.empty()) return;  // (an empty chunk would end a chunked body)
    write(chunked_ ? beast::buffers_to_string(http::make_chunk(net::buffer(bytes))) : bytes);
}

void Connection::flush() {
    if (writing_ || out_.empty() || phase_ == Phase::kClosed) return;
    writing_ = true;
    arm(seconds(srv_.options().write_timeout), &Connection::write_timed_out);
    net::async_write(sock_, net::buffer(out_.front()), [self = shared_from_this()](beast::error_code ec, size_t) {
        self->writing_ = false;
        if (self->phase_ == Phase::kClosed) return;
        self->disarm();
        if (ec) return self->gone("a write failed");
        self->out_.pop_front();
        if (!self->out_.empty()) return self->flush();
        if (self->close_after_write_) self->close_gracefully();
        else if (self->phase_ == Phase::kReading) self->read_more();  // a "100 Continue" is out: the body comes
    });
}

// The one read that may be pending on the socket once the request is in
// (Asio allows one read at a time on a socket; on_read, reading the request,
// is the other). While a completion is answered it watches: the client sends
// nothing more, so whatever the read returns is news. An end of stream: the
// client shut its sending side -- or closed its socket. Either way a FIN
// came; only our next bytes tell the two apart (on_client_eof). A reset: the
// client is gone. While closing, it drains what the client still sends
// until the client closes too.
void Connection::watch() {
    if (reading_ || phase_ == Phase::kClosed) return;
    reading_ = true;
    sock_.async_read_some(net::buffer(sink_), [self = shared_from_this()](beast::error_code ec, size_t n) {
        self->reading_ = false;
        self->on_watch(ec, n);
    });
}
void Connection::on_watch(beast::error_code ec, size_t n) {
    // Bytes after the request (a pipelined one we will not serve) are
    // dropped; a client that sends megabytes is cut off.
    discarded_ += n;
    const bool too_much = discarded_ > (1u << 20);
    if (phase_ == Phase::kClosing) return ec || too_much ? close_now() : watch();
    if (phase_ != Phase::kAnswering) return;
    if (!ec) return too_much ? gone("it kept sending after its request") : watch();
    if (ec == net::error::eof) return on_client_eof();
    gone("its connection was reset");
}

// A FIN from the client. One that closed its socket answers any byte we send
// with a reset; one that only shut its sending side (`nc -N`, some HTTP/1.0
// clients) reads on. So we make sure bytes go out now -- a stream's head is
// out already, and a comment line (which every SSE client skips) follows;
// a body's head goes early -- and wait for a reset (async_wait on the
// socket's error state): if one comes, the client is gone and its request is
// aborted; if not, it gets its answer.
void Connection::on_client_eof() {
    eof_seen_ = true;
    sock_.async_wait(tcp::socket::wait_error, [self = shared_from_this()](beast::error_code ec) {
        if (!ec && self->phase_ == Phase::kAnswering) self->gone("it closed its connection");
    });
    if (!door_open_ || done_) return;  // the verdict sends the head (on_note); a finished answer is being written
    if (req_->stream) write_body(":\n\n");
    else send_head("application/json");
}

// The client left before the end of its answer: abort its request, so its
// blocks are free for the next step; nothing more is written.
void Connection::gone(const char* how) {
    if (client_gone_ || phase_ == Phase::kClosed) return;
    client_gone_ = true;
    if (req_ && !done_) {
        srv_.stats().disconnects++;
        if (door_open_) {
            done_ = true;
            srv_.loop().abort(engine_id_);
        }
        // (still at the door: on_note aborts it when the verdict comes)
        if (srv_.options().log_requests)
            std::fprintf(stderr, "serve: %s: the client left (%s) after %zu tokens\n", id_.id.c_str(), how, tokens_.size());
    }
    end_answer();
    close_now();
}

// Our answer is out: shut our side, and wait (at most 2 s) for the client to
// close its own before closing the socket (see section 3).
void Connection::close_gracefully() {
    if (phase_ == Phase::kClosing || phase_ == Phase::kClosed) return;
    phase_ = Phase::kClosing;
    end_answer();
    beast::error_code ignored;
    sock_.shutdown(tcp::socket::shutdown_send, ignored);
    if (eof_seen_) return close_now();
    arm(std::chrono::seconds(2), &Connection::close_now);
    watch();  // (or the read pending now: it sees kClosing and drains)
}

void Connection::close_now() {
    if (phase_ == Phase::kClosed) return;
    phase_ = Phase::kClosed;
    if (req_ && !done_ && door_open_) {  // closed by the server (evicted, shut down) mid-answer
        done_ = true;
        srv_.loop().abort(engine_id_);
    }
    end_answer();
    disarm();
    beast::error_code ignored;
    sock_.close(ignored);  // pending operations end with operation_aborted
    if (viewer_) srv_.remove_viewer(*this);
    srv_.closed(*this);
}

// One timer per connection, re-armed for each wait; a stale expiry (from an
// earlier arm) is recognised by its generation and ignored.
void Connection::arm(std::chrono::nanoseconds d, void (Connection::*on_expiry)()) {
    const uint64_t gen = ++timer_gen_;
    timer_.expires_after(d);
    timer_.async_wait([self = shared_from_this(), gen, on_expiry](beast::error_code ec) {
        if (ec || gen != self->timer_gen_ || self->phase_ == Phase::kClosed) return;
        ((*self).*on_expiry)();
    });
}
void Connection::disarm() {
    ++timer_gen_;
    timer_.cancel();
}

// The request did not arrive in time. A connection that never sent a byte
// is just closed (there is nothing to answer); otherwise 408.
void Connection::read_timed_out() {
    if (phase_ != Phase::kReading) return;
    if (bytes_in_ == 0 && in_.size() == 0) return close_now();
    srv_.stats().timeouts++;
    const Options& o = srv_.options();
    const std::string why = read_timeout_ ? "it fell silent for longer than the read timeout (" + cli::number_text(o.read_timeout) + " s), --read-timeout"
                                          : "it took longer than the request timeout (" + cli::number_text(o.request_timeout) + " s), --request-timeout";
    beast::error_code ignored;
    sock_.cancel(ignored);  // the pending read ends (its handler sees we moved on)
    phase_ = Phase::kAnswering;
    error(408, "the request did not arrive in time: " + why, "invalid_request_error", "request_timeout");
}

void Connection::write_timed_out() {
    if (phase_ == Phase::kClosing) return close_now();
    if (writing_) return gone("it did not read what we sent within the write timeout");
    // A scrape the engine did not answer in time.
    if (!head_sent_ && phase_ == Phase::kAnswering && path_ == "/metrics")
        error(503, "the engine did not answer the scrape within 10 s (a long step?)", "server_error", "engine_unavailable");
}

void Connection::log_request() {
    if (!srv_.options().log_requests || !req_) return;
    const double s = std::chrono::duration<double>(Clock::now() - accepted_).count();
    std::fprintf(stderr, "serve: %s %s %s: %zu prompt + %zu output tokens, %d preemption%s, finish %s, %.3f s\n", id_.id.c_str(), path_.c_str(),
                 req_->stream ? "stream" : "body", req_->prompt.size(), tokens_.size(), preemptions_, preemptions_ == 1 ? "" : "s",
                 finish_.empty() ? "none (cut short)" : finish_.c_str(), s);
}

// ============================================================================
// 6. main
// ============================================================================

// Start-up order: parse, load, build the engine, bind the port (an error
// there is one line and exit status 1, before any thread exists), print
// "listening on ..." (true from this moment: a client that connects now
// waits in the kernel's backlog), then start the engine thread and the
// event loop. Shutdown runs it backwards.
int run(int argc, char** argv) {
    Options opts = parse(argc, argv);
    fit_file_limit(opts);
    const Options& o = opts;
    // A client that hangs up must not kill us: a write to its socket fails
    // with EPIPE instead of raising SIGPIPE.
    ::signal(SIGPIPE, SIG_IGN);

    const pkv::ModelAndTokenizer mt = pkv::load_model_and_tokenizer(o.checkpoint, o.tokenizer);
    opts.keep_latency_samples = false;  // histograms only: flat memory however long we run
    const std::unique_ptr<pkv::Engine> engine = workload::make_engine(o, pkv::make_model_runner(o.device, mt.model, o.math));
    pkv::Engine& eng = *engine;
    if (o.log_interval > 0) eng.on_log = [](const std::string& line) { std::fprintf(stderr, "INFO %s\n", line.c_str()); };
    net::io_context io(1);  // one thread runs it: the handlers need no locks among themselves
    Server server(o, eng, mt.tok, io);
    const int port = server.bind();

    std::printf("model: %s (id \"%s\": dim %d, %d layers, vocab %d)\n", mt.name.c_str(), o.model_name.c_str(), mt.model.cfg.dim,
                mt.model.cfg.n_layers, mt.model.cfg.vocab_size);
    std::printf("%s\n", workload::startup_summary(eng).c_str());
    std::printf("edge: %d completions at once, up to %d connections open, requests within %s s (silent at most %s s), headers up to %d KiB, "
                "bodies up to %d KiB, %s\n",
                o.max_connections, o.max_open_connections, cli::number_text(o.request_timeout).c_str(), cli::number_text(o.read_timeout).c_str(),
                o.max_header_kib, o.max_body_kib,
                o.policy.max_waiting > 0 ? ("429 when " + std::to_string(o.policy.max_waiting) + " requests wait").c_str()
                                         : "no queue limit (--max-waiting 0)");
    std::printf("listening on http://%s:%d\n", o.host.c_str(), port);
    std::fflush(stdout);

    server.serve();  // returns once the server has shut down (the first signal, then its deadline)
    std::printf("stopped\n");
    return 0;
}

}  // namespace

int main(int argc, char** argv) { return cli::guarded_main("serve", [&] { return run(argc, argv); }); }

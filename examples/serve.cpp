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
// may say: examples/openai_api.hpp), GET /v1/models, GET /health, GET /metrics.
//
// ---- the threads ---------------------------------------------------------------
//
//   listener       cpp-httplib's accept loop (main's thread): each connection
//                  it accepts goes to the ConnectionQueue.
//   workers        --max-connections threads, one per connection being served:
//                  read the request, check it, hand it to the engine, and write
//                  the answer -- for a stream, chunk by chunk as tokens arrive.
//                  One request per connection (no keep-alive), so an idle
//                  client never holds a worker for long.
//   rejecters      two threads that answer the connections beyond that cap
//                  with a fast 429, so a flood cannot queue up behind streams.
//   engine         the only thread that ever touches the Engine. It loops:
//                  take what the workers handed over, run one step, repeat;
//                  it sleeps when there is nothing to do.
//   signals        waits for Ctrl-C or SIGTERM, then stops the listener.
//
// ---- the hand-over ---------------------------------------------------------------
//
// pkv::Engine is single-threaded by design (engine.hpp): its step() mutates
// the scheduler, the block pool and every request. So a worker never calls
// it. It puts an Item (a new request, an abort, a metrics scrape) into the
// EngineLoop's inbox -- a deque under a mutex, with a condition variable that
// wakes the engine thread -- and waits on its own Channel: a small mailbox
// (mutex, condition variable, deque of StreamEvents) that the engine thread
// fills from Engine::on_event. Between two steps the engine thread drains the
// inbox, so an abort takes effect before the next step schedules anyone, as
// in vLLM, and the blocks it frees are free for that step.
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
// ---- shedding at the edge, and bad input ---------------------------------------------
//
// With --max-waiting N, a request that finds N requests already waiting
// (new or preempted, plus those handed over and not yet taken) is answered
// 429 with Retry-After at once, by the worker, without waiting for a step: a
// fast "try again" a client or router can act on, instead of a stream that
// stalls behind a queue the engine cannot drain. The scheduler applies the
// same limit at its door (SchedulerConfig::max_waiting) and says "retryable"
// if a request slipped past our count during a step; that is a 429 too,
// after at most one step. Bad input gets a 4xx with an OpenAI-style error
// body and never reaches the engine: a body over --max-body-kib (413), a
// request that arrives too slowly (--read-timeout: 400), malformed JSON,
// wrong types, unknown fields, ids out of range, max_tokens past the context
// (400), a model we do not serve (404), too many connections (429).
//
// Known limits (a teaching server): requests stay in the scheduler's table
// and latency samples in Metrics for the server's whole life (memory grows
// with the number of requests served); one model; no TLS, no auth. The
// per-read timeout bounds a silent client, not one that trickles a byte just
// under every timeout: the connection cap bounds how many of those there can be.
#include <httplib.h>
#include <nlohmann/json.hpp>

#include <pthread.h>
#include <signal.h>
#include <sys/socket.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <ctime>
#include <deque>
#include <filesystem>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <type_traits>
#include <unordered_map>
#include <vector>

#include "engine.hpp"
#include "examples/cli.hpp"
#include "examples/openai_api.hpp"
#include "examples/workload.hpp"
#include "examples/devices.hpp"
#include "tiny_model/tokenizer.hpp"

namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// ============================================================================
// 1. Options
// ============================================================================

// The engine's knobs are study::Setup's (examples/workload.hpp), with `make
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
struct Options : study::Setup {
    std::string checkpoint, tokenizer, model_name;
    std::string host = "127.0.0.1";
    int port = 8000;
    int max_connections = 32;   // workers: connections served at once
    int max_body_kib = 256;     // request body cap
    double read_timeout = 5.0;  // seconds a read may wait (and a new connection, for its request)
    double write_timeout = 5.0; // seconds a write may wait for a client that does not read
    bool sse_comments = true;   // ": pagedkv preempted" / ": pagedkv resumed" in streams
    int step_delay_ms = 0;      // demo knob: sleep after every step
    bool log_requests = false;
};

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
    p.integer("--num-blocks", &o.num_blocks, 1, study::kMaxBlocks, "KV cache blocks");
    p.integer("--block-size", &o.block_size, 1, pkv::kMaxBlockSize, "tokens per block");
    p.integer("--max-num-batched-tokens", &o.max_num_batched_tokens, 1, study::kMaxLen, "token budget per step");
    study::add_engine_flags(p, o);
    p.choice("--device", &o.device, {{"cpu", pkv::Device::kCpu}, {"emulated", pkv::Device::kEmulated}, {"cuda", pkv::Device::kCuda}},
             "where the model runs (emulated: the CUDA kernels on the CPU, slow; cuda: a `make cuda` build on a GPU)");
    p.real("--log-interval", &o.log_interval, 0, 3600, "seconds between vLLM-style INFO lines on stderr; 0 = off");
    p.integer("--max-connections", &o.max_connections, 1, 4096, "connections served at once; more get a fast 429");
    p.integer("--max-body-kib", &o.max_body_kib, 1, 65536, "largest request body, KiB; larger gets 413");
    p.real("--read-timeout", &o.read_timeout, 0.05, 3600, "seconds a request may take to arrive between two reads; slower gets 400");
    p.real("--write-timeout", &o.write_timeout, 0.05, 3600, "seconds a write may block on a client that does not read; then the request is aborted");
    p.on_off("--sse-comments", &o.sse_comments, "mark preemption pauses in streams with SSE comment lines (every client ignores them)");
    p.integer("--step-delay-ms", &o.step_delay_ms, 0, 10000, "sleep this long after every engine step (a demo knob: makes a pause long enough to watch)");
    p.flag("--log-requests", &o.log_requests, "one line per finished request on stderr");
    p.epilog("Try: curl -N http://127.0.0.1:8000/v1/completions -H 'Content-Type: application/json' \\\n"
             "       -d '{\"prompt\": \"Once upon a time\", \"max_tokens\": 32, \"temperature\": 0, \"stream\": true}'");
    p.parse(argc, argv);
    if (!o.tokenizer.empty() && o.checkpoint.empty()) cli::bad_usage("-z needs a checkpoint: the built-in model has its own vocabulary");
    if (o.model_name.empty())
        o.model_name = o.checkpoint.empty() ? "built-in" : std::filesystem::path(o.checkpoint).stem().string();
    return o;
}

// ============================================================================
// 2. The hand-over: inbox, channels and the engine thread
// ============================================================================
//
// Two directions, two kinds of queue:
//
//   workers --Item--> [ inbox: one deque, one mutex ] --> engine thread
//   engine thread --StreamEvent--> [ Channel: one per request ] --> its worker
//
// Why not let the workers lock the engine and call it themselves? A step
// takes milliseconds (seconds on a slow device), and every worker would
// queue on that lock -- including the ones that only want to shed a request
// or scrape /metrics. With the inbox, a worker holds a lock only for a
// push_back; the engine thread takes everything in one swap between steps,
// so a burst of a hundred requests costs it one lock, not a hundred.
//
// Why one channel per request instead of one queue for all events? Each
// worker waits for its own request's events only, and the engine thread,
// routing an event, touches only that request's lock: a slow client never
// delays the delivery of anyone else's tokens.

// A request's mailbox: the engine thread writes, one worker reads.
struct Channel {
    std::mutex m;
    std::condition_variable cv;
    // The door: the engine's verdict on add_request. The worker waits for
    // it before it sends a status line: once "200 OK" is on the wire, a
    // refusal could only be told inside the stream.
    enum class Door { kPending, kAccepted, kRejected } door = Door::kPending;
    std::string reject_reason;         // why, when rejected
    bool retryable = false;            // a full queue (429), not a bad request (400)
    std::deque<pkv::StreamEvent> events;  // [undelivered] tokens and state changes, in engine order
    bool broken = false;               // the engine stopped or failed: no more events will come
    int id = -1;                       // the engine's request id (set by the engine thread)

    // Moves every pending event into `out`, waiting up to `timeout` for the
    // first. Returns false when the channel is broken and empty. Taking all
    // at once matters: after a stall (a slow client) the worker catches up in
    // one write instead of one wake-up per token.
    bool take(std::vector<pkv::StreamEvent>& out, milliseconds timeout) {
        std::unique_lock<std::mutex> lk(m);
        cv.wait_for(lk, timeout, [&] { return !events.empty() || broken; });
        out.assign(events.begin(), events.end());
        events.clear();
        return !(broken && out.empty());
    }
    void push(const pkv::StreamEvent& e) {
        {
            std::lock_guard<std::mutex> lk(m);
            events.push_back(e);
        }
        cv.notify_one();  // outside the lock: the woken worker need not wait for it
    }
    // No more events will come (the engine stopped): wake the worker.
    void close() {
        {
            std::lock_guard<std::mutex> lk(m);
            broken = true;
        }
        cv.notify_all();
    }
};

// A metrics scrape, answered by the engine thread between two steps: the
// Metrics object is the engine's, so it is read where it is written.
struct Scrape {
    std::string engine_text;  // Engine::prometheus()
    int free_blocks = 0, num_blocks = 0;
};

// Owns the engine thread. Workers call submit(), abort() and scrape(); the
// engine thread runs loop(), and is the only thread that touches `eng_`
// once start() has been called (before that, main sets it up).
class EngineLoop {
public:
    enum class Admit { kQueued, kShed, kDown };

    EngineLoop(pkv::Engine& eng, int max_waiting, int step_delay_ms)
        : eng_(eng), max_waiting_(max_waiting), step_delay_ms_(step_delay_ms) {
        // Runs on the engine thread, inside add_request / step / abort.
        eng_.on_event = [this](const pkv::StreamEvent& e) { route(e); };
    }
    EngineLoop(const EngineLoop&) = delete;
    EngineLoop& operator=(const EngineLoop&) = delete;
    ~EngineLoop() { stop(); }

    void start() { thread_ = std::thread([this] { run(); }); }
    // Waits for the engine thread to finish its step and leave.
    void stop() {
        {
            std::lock_guard<std::mutex> lk(m_);
            stopping_ = true;
        }
        cv_.notify_all();
        if (thread_.joinable()) thread_.join();
    }

    // ---- called by workers ------------------------------------------------------

    // Hands a request over, or sheds it at once when the waiting queue is at
    // --max-waiting. The count is the engine's waiting queue as of its last
    // publish (after its last step), plus the requests handed over since and
    // not yet taken: a worker decides without waiting for a step. It can be
    // one step stale, in both directions; the scheduler's own max_waiting
    // check at add_request is exact, and what slips past us meets it there.
    Admit submit(std::vector<int32_t> prompt, const pkv::SamplingParams& params, std::shared_ptr<Channel> ch) {
        {
            std::lock_guard<std::mutex> lk(m_);
            if (stopping_ || !failed_.empty()) return Admit::kDown;
            if (max_waiting_ > 0 && waiting_ + handed_over_ >= max_waiting_) return Admit::kShed;
            inbox_.push_back(Item{Item::kSubmit, std::move(prompt), params, std::move(ch), nullptr});
            ++handed_over_;
        }
        cv_.notify_one();
        return Admit::kQueued;
    }
    // The client left: abort its request (a no-op if it already finished).
    void abort(std::shared_ptr<Channel> ch) {
        {
            std::lock_guard<std::mutex> lk(m_);
            if (stopping_ || !failed_.empty()) return;
            inbox_.push_back(Item{Item::kAbort, {}, {}, std::move(ch), nullptr});
        }
        cv_.notify_one();
    }
    // The engine's metrics, read on the engine thread; false if the engine
    // does not answer within `timeout` (it is stopped or failed).
    bool scrape(Scrape& out, milliseconds timeout) {
        auto promise = std::make_shared<std::promise<Scrape>>();
        std::future<Scrape> f = promise->get_future();
        {
            std::lock_guard<std::mutex> lk(m_);
            if (stopping_ || !failed_.empty()) return false;
            inbox_.push_back(Item{Item::kScrape, {}, {}, nullptr, promise});
        }
        cv_.notify_one();
        if (f.wait_for(timeout) != std::future_status::ready) return false;
        out = f.get();
        return true;
    }
    // "" while the engine thread runs; else why it stopped.
    std::string failure() {
        std::lock_guard<std::mutex> lk(m_);
        return failed_;
    }

private:
    // What a worker hands over. One struct for all three kinds keeps the
    // inbox a plain deque; the fields a kind does not use stay empty.
    struct Item {
        enum Kind { kSubmit, kAbort, kScrape } kind;
        std::vector<int32_t> prompt;              // kSubmit: [prompt tokens]
        pkv::SamplingParams params;               // kSubmit
        std::shared_ptr<Channel> ch;              // kSubmit, kAbort
        std::shared_ptr<std::promise<Scrape>> scrape;  // kScrape
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
        for (auto& [id, ch] : live_) ch->close();
        live_.clear();
        for (Item& it : taken_)
            if (it.ch) it.ch->close();
        std::lock_guard<std::mutex> lk(m_);
        for (Item& it : inbox_)
            if (it.ch) it.ch->close();
        inbox_.clear();
    }

    // The engine thread's whole life: take what was handed over, apply it,
    // run one step, publish the queue length the workers shed on; sleep only
    // when the engine has nothing to do. Aborts are applied here, between
    // two steps, never inside one (the step's batch holds the blocks).
    void loop() {
        for (;;) {
            {
                std::unique_lock<std::mutex> lk(m_);
                cv_.wait(lk, [&] { return stopping_ || !inbox_.empty() || eng_.has_unfinished(); });
                if (stopping_) return;
                taken_.swap(inbox_);  // inbox_ is now empty: workers go on filling it
            }
            int submitted = 0;
            while (!taken_.empty()) {
                submitted += apply(taken_.front());
                taken_.pop_front();
            }
            publish(submitted);
            if (!eng_.has_unfinished()) continue;
            eng_.step();
            publish(0);
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
                live_[id] = it.ch;
                {
                    std::lock_guard<std::mutex> lk(it.ch->m);
                    it.ch->id = id;
                }
                eng_.add_request(std::move(it.prompt), it.params);
                const pkv::Request* r = eng_.request(id);
                const bool rejected = r->finish_reason == pkv::FinishReason::kRejected;
                {
                    std::lock_guard<std::mutex> lk(it.ch->m);
                    it.ch->door = rejected ? Channel::Door::kRejected : Channel::Door::kAccepted;
                    it.ch->reject_reason = r->reject_reason;
                    it.ch->retryable = r->retryable;
                }
                it.ch->cv.notify_all();
                if (rejected) live_.erase(id);
                return 1;
            }
            case Item::kAbort: {
                // Between steps: the blocks are free when abort() returns, and
                // its kFinished(aborted) event closes the route. An abort for a
                // request that finished meanwhile finds no route: nothing to do.
                const int id = it.ch->id;  // written by this thread
                if (live_.count(id)) eng_.abort(id);
                return 0;
            }
            case Item::kScrape: {
                Scrape s;
                s.engine_text = eng_.prometheus();
                s.free_blocks = eng_.pool().num_free_blocks();
                s.num_blocks = eng_.pool().num_blocks();
                it.scrape->set_value(std::move(s));
                return 0;
            }
        }
        return 0;
    }

    // Engine::on_event: every token and state change goes to its request's
    // channel, in the order the engine emits them (engine.hpp section 2). A
    // finished request's route is dropped: nothing follows kFinished.
    void route(const pkv::StreamEvent& e) {
        auto it = live_.find(e.request_id);
        if (it == live_.end()) return;
        it->second->push(e);
        if (e.type == pkv::EventType::kFinished) live_.erase(it);
    }

    // The count workers shed on: the requests waiting for the engine (new
    // and preempted, and swapped out), as of now. A preemption puts its
    // victim back into the waiting queue, so under thrash this count grows
    // with no new arrival at all: the edge then sheds the newcomers.
    void publish(int submitted) {
        const int waiting = (int)(eng_.scheduler().waiting().size() + eng_.scheduler().policy().num_held());
        std::lock_guard<std::mutex> lk(m_);
        waiting_ = waiting;
        handed_over_ -= submitted;
    }

    pkv::Engine& eng_;  // touched by the engine thread only (after start())
    const int max_waiting_, step_delay_ms_;
    // Engine thread only: request id -> its channel, for requests that can
    // still emit; and the items taken from the inbox, being applied.
    std::unordered_map<int, std::shared_ptr<Channel>> live_;
    std::deque<Item> taken_;

    std::mutex m_;  // guards everything below
    std::condition_variable cv_;
    std::deque<Item> inbox_;
    int waiting_ = 0;      // the engine's waiting + swapped queues, as of its last publish
    int handed_over_ = 0;  // submissions in the inbox or being applied
    bool stopping_ = false;
    std::string failed_;   // why the engine thread stopped ("" while it runs)
    std::thread thread_;
};

// ============================================================================
// 3. Connections: a capped pool of workers
// ============================================================================
//
// cpp-httplib does blocking I/O, one thread per connection: its accept loop
// hands every accepted connection to a TaskQueue as a closure that reads the
// request, runs our handler, writes the answer and closes the socket. A
// stream therefore holds its thread for as long as it streams, pauses
// included, so the number of workers is also the number of streams the
// server can carry at once.
//
// The default TaskQueue (httplib::ThreadPool) queues without limit: under a
// flood, a new connection would wait, unanswered, behind streams that may
// last minutes -- the opposite of a fast failure. Ours runs at most `workers`
// connections at once. Beyond that a connection goes to a rejecter thread,
// which serves it with t_overflow set, and the pre-routing handler answers
// it 429 before its body is read. When even the rejecters' queue is full,
// the accept loop serves the connection itself, which slows accepting down:
// the flood then waits in the kernel's listen backlog, not in our memory.
//
// The closure is all we are given (not the socket), so "reject this one"
// cannot be said to cpp-httplib directly; a thread-local flag, read by the
// pre-routing handler on the same thread, says it.

thread_local bool t_overflow = false;  // this thread is answering a connection over the cap

class ConnectionQueue : public httplib::TaskQueue {
public:
    // cpp-httplib 0.15 made enqueue() report success (bool); Debian 12's 0.11
    // returns void. We override whichever this header declares.
    using Ret = decltype(std::declval<httplib::TaskQueue&>().enqueue(std::function<void()>()));

    explicit ConnectionQueue(int workers) : workers_(workers) {
        for (int i = 0; i < workers; ++i) threads_.emplace_back([this] { work(jobs_, false); });
        for (int i = 0; i < kRejecters; ++i) threads_.emplace_back([this] { work(overflow_, true); });
    }
    // Called by the accept loop, once per accepted connection.
    Ret enqueue(std::function<void()> fn) override {
        std::unique_lock<std::mutex> lk(m_);
        if (busy_ + (int)jobs_.size() < workers_) {
            jobs_.push_back(std::move(fn));
        } else if ((int)overflow_.size() < kMaxOverflow) {
            overflow_.push_back(std::move(fn));
        } else {
            lk.unlock();
            serve_over_cap(fn);
            return accepted<Ret>();
        }
        lk.unlock();
        cv_.notify_all();
        return accepted<Ret>();
    }
    // Called by the accept loop when the server stops: every thread finishes
    // the connection it serves (a stream sees the shutdown within 50 ms) and
    // the queued ones, then leaves.
    void shutdown() override {
        {
            std::lock_guard<std::mutex> lk(m_);
            shutdown_ = true;
        }
        cv_.notify_all();
        for (std::thread& t : threads_) t.join();
    }

private:
    // Two rejecters: one connection that sends its request slowly holds one
    // (up to the read timeout), and the other goes on answering 429s.
    static constexpr int kRejecters = 2, kMaxOverflow = 64;
    template <class R>
    static R accepted() {
        if constexpr (std::is_same_v<R, bool>) return true;
    }
    static void serve_over_cap(std::function<void()>& fn) {
        t_overflow = true;
        fn();
        t_overflow = false;
    }
    // A worker (over_cap false) or a rejecter (true): take a connection, serve it.
    void work(std::deque<std::function<void()>>& q, bool over_cap) {
        for (;;) {
            std::function<void()> fn;
            {
                std::unique_lock<std::mutex> lk(m_);
                cv_.wait(lk, [&] { return !q.empty() || shutdown_; });
                if (q.empty()) return;  // shutting down, nothing left
                fn = std::move(q.front());
                q.pop_front();
                if (!over_cap) ++busy_;
            }
            if (over_cap) serve_over_cap(fn);
            else fn();
            if (!over_cap) {
                std::lock_guard<std::mutex> lk(m_);
                --busy_;
            }
        }
    }
    const int workers_;
    std::mutex m_;
    std::condition_variable cv_;
    std::deque<std::function<void()>> jobs_, overflow_;  // connections waiting for a worker / a rejecter
    int busy_ = 0;                                       // workers serving a connection
    bool shutdown_ = false;
    std::vector<std::thread> threads_;
};

// cpp-httplib listens with a backlog of 5 connections (CPPHTTPLIB_LISTEN_BACKLOG,
// compiled into Debian's library). Twenty clients connecting at once, on a
// busy machine, overflow that: the kernel drops their handshakes and they
// retry a second later, or fail. Calling listen() again on the bound socket
// raises the backlog; only a subclass can reach the socket.
class HttpServer : public httplib::Server {
public:
    bool raise_backlog(int n) { return ::listen(svr_sock_, n) == 0; }
};

// ============================================================================
// 4. The server: handlers
// ============================================================================

// The edge's own counters (the engine's are in its Metrics).
struct EdgeStats {
    std::atomic<long> shed_queue_full{0}, shed_connections{0}, bad_requests{0}, disconnects{0}, open_answers{0};
};

// The HTTP side. Every handler runs on a worker thread and follows one
// path: read and check the request (openai_api.hpp), shed or hand it over
// (EngineLoop), wait for the engine's verdict, then write the answer from
// the request's channel. The handlers share only what is read-only after
// construction (options, tokenizer, limits) and what is atomic (EdgeStats,
// the answer counter); the engine is reached through loop_ alone.
class Server {
public:
    Server(const Options& o, pkv::Engine& eng, const pkv::Tokenizer& tok)
        : o_(o), tok_(tok), loop_(eng, o.policy.max_waiting, o.step_delay_ms) {
        lim_.model_id = o.model_name;
        lim_.vocab_size = eng.model().vocab_size;
        lim_.max_model_len = eng.config().sched.max_model_len;
        seed_state_ = std::random_device{}();
        seed_state_ = (seed_state_ << 32) ^ std::random_device{}();
        configure();
    }

    // Binds, or throws saying why not. Returns the port (for --port 0).
    int bind() {
        int port = o_.port;
        if (port == 0) port = http_.bind_to_any_port(o_.host);
        else if (!http_.bind_to_port(o_.host, port)) port = -1;
        if (port < 0)
            throw std::runtime_error("cannot listen on " + o_.host + ":" + std::to_string(o_.port) +
                                     " (in use, or not an address of this machine?); --port 0 picks a free port");
        if (!http_.raise_backlog(SOMAXCONN)) throw std::runtime_error("cannot raise the listen backlog of port " + std::to_string(port));
        return port;
    }
    // Serves until stop(); then stops the engine thread.
    void serve() {
        loop_.start();
        http_.listen_after_bind();
        served_ = true;
        loop_.stop();
    }
    // From another thread. cpp-httplib's stop() does nothing before the
    // accept loop has started, so we repeat it until serve() has returned.
    void stop() {
        while (!served_) {
            http_.stop();
            std::this_thread::sleep_for(milliseconds(10));
        }
    }

private:
    // ---- routes and limits -----------------------------------------------------

    void configure() {
        // One request per connection: no worker waits on an idle keep-alive
        // connection. A new connection gets read_timeout (at least a whole
        // second: cpp-httplib counts that wait in seconds) to send its request.
        // The price is one TCP handshake per request, nothing on loopback;
        // clients reconnect on their own (curl, the openai package).
        //
        // The two timeouts are what makes a slow client cheap. The read
        // timeout bounds each wait for request bytes: a client that stops
        // sending mid-request is answered 400 and its worker is free again.
        // The write timeout bounds each wait for a client to take our bytes:
        // a client that stops reading (its socket buffers full) makes a
        // write fail, the answer ends, and its request is aborted, so it
        // cannot hold KV blocks either.
        http_.set_keep_alive_max_count(1);
        http_.set_keep_alive_timeout(std::max<time_t>(1, (time_t)std::ceil(o_.read_timeout)));
        const auto usec = [](double s) { return (time_t)((s - std::floor(s)) * 1e6); };
        http_.set_read_timeout((time_t)std::floor(o_.read_timeout), usec(o_.read_timeout));
        http_.set_write_timeout((time_t)std::floor(o_.write_timeout), usec(o_.write_timeout));
        // A body larger than this is refused (413) before it is read into
        // memory; completion() applies the same cap to bodies without a
        // Content-Length (chunked, or compressed).
        http_.set_payload_max_length((size_t)o_.max_body_kib * 1024);
        // cpp-httplib calls this once, when the accept loop starts (section 3).
        http_.new_task_queue = [this] { return new ConnectionQueue(o_.max_connections); };

        // Before any body is read: connections over the cap, and methods no
        // route takes (a PUT would otherwise have its body read first).
        http_.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
            if (t_overflow) {
                stats_.shed_connections++;
                send_error(res, 429, "too many connections: this server serves " + std::to_string(o_.max_connections) +
                                         " at once; retry after a moment", "rate_limit_error", "too_many_connections", "", true);
                return httplib::Server::HandlerResponse::Handled;
            }
            if (req.method != "GET" && req.method != "POST" && req.method != "HEAD") {
                wrong_method(req, res, "GET, POST");
                return httplib::Server::HandlerResponse::Handled;
            }
            return httplib::Server::HandlerResponse::Unhandled;
        });
        // Errors cpp-httplib itself decides (a request it could not read, a
        // body over the cap, no such route) get the same JSON body as ours.
        http_.set_error_handler(httplib::Server::HandlerWithResponse([this](const httplib::Request& req, httplib::Response& res) {
            if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;  // one of ours
            stats_.bad_requests++;
            std::string msg, code;
            switch (res.status) {
                case 400: msg = "the HTTP request could not be read: malformed, or it stopped arriving for longer than the read timeout (" +
                                cli::number_text(o_.read_timeout) + " s)"; code = "bad_request"; break;
                case 404: msg = "no route for " + req.method + " " + req.path +
                                " (this server has POST /v1/completions, POST /v1/chat/completions, GET /v1/models, GET /health, GET /metrics)";
                          code = "not_found"; break;
                case 413: msg = too_large(); code = "request_too_large"; break;
                case 414: msg = "the request line is too long"; code = "uri_too_long"; break;
                case 415: msg = "the body's Content-Encoding is not one this server can decode"; code = "unsupported_media_type"; break;
                default: msg = "HTTP error " + std::to_string(res.status); code = "http_error";
            }
            res.set_content(openai::error_body(msg, "invalid_request_error", code), "application/json");
            return httplib::Server::HandlerResponse::Handled;
        }));
        http_.set_exception_handler([this](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
            std::string what = "unknown";
            try {
                std::rethrow_exception(ep);
            } catch (const std::exception& e) {
                what = e.what();
            } catch (...) {
            }
            send_error(res, 500, "internal error: " + what, "server_error", "internal_error");
        });

        // The routes. The two POSTs take a ContentReader: the body is read
        // by completion(), under our cap, not by cpp-httplib beforehand.
        http_.Post("/v1/completions", [this](const httplib::Request& req, httplib::Response& res, const httplib::ContentReader& rd) {
            completion(req, res, rd, /*chat=*/false);
        });
        http_.Post("/v1/chat/completions", [this](const httplib::Request& req, httplib::Response& res, const httplib::ContentReader& rd) {
            completion(req, res, rd, /*chat=*/true);
        });
        http_.Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
            const openai::ojson m = {{"id", lim_.model_id}, {"object", "model"}, {"created", (long)start_time_},
                                     {"owned_by", "pagedkv"}, {"max_model_len", lim_.max_model_len}};
            res.set_content(openai::dump({{"object", "list"}, {"data", openai::ojson::array({m})}}), "application/json");
        });
        // 200 while the engine thread runs; 503 once it has failed.
        http_.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
            const std::string f = loop_.failure();
            if (f.empty()) return res.set_content("{\"status\":\"ok\"}", "application/json");
            send_error(res, 503, "the engine stopped: " + f, "server_error", "engine_failed");
        });
        http_.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) { metrics(res); });
        // The right path with the wrong method: 405, not 404.
        for (const char* p : {"/v1/completions", "/v1/chat/completions"})
            http_.Get(p, [this](const httplib::Request& req, httplib::Response& res) { wrong_method(req, res, "POST"); });
        for (const char* p : {"/v1/models", "/health", "/metrics"})
            http_.Post(p, [this](const httplib::Request& req, httplib::Response& res, const httplib::ContentReader&) {
                wrong_method(req, res, "GET");
            });
    }

    std::string too_large() const {
        return "the request body is larger than this server's limit of " + std::to_string(o_.max_body_kib) + " KiB (--max-body-kib)";
    }

    // An OpenAI-style error (openai_api.hpp section 1). A 429 or 503 says
    // when to retry: one second, a fixed guess. A busier server could compute
    // it from the queue's drain rate; a client that retries sooner is shed
    // again, cheaply, so a guess is safe.
    void send_error(httplib::Response& res, int status, const std::string& msg, const std::string& type, const std::string& code,
                    const std::string& param = "", bool retry = false) {
        res.status = status;
        if (retry || status == 429 || status == 503) res.set_header("Retry-After", "1");
        res.set_content(openai::error_body(msg, type, code, param), "application/json");
    }
    void send_error(httplib::Response& res, const openai::ApiError& e) {
        stats_.bad_requests++;
        send_error(res, e.status, e.what(), e.type, e.code, e.param);
    }
    void wrong_method(const httplib::Request& req, httplib::Response& res, const char* allowed) {
        stats_.bad_requests++;
        res.set_header("Allow", allowed);
        send_error(res, 405, req.method + " is not allowed on " + req.path + "; use " + allowed, "invalid_request_error",
                   "method_not_allowed");
    }

    // ---- /metrics ----------------------------------------------------------------
    //
    // The engine's own Prometheus text (metrics.hpp), then the edge's
    // families. The engine's part is produced on the engine thread (through
    // the inbox, between two steps), because Metrics is written there: a
    // scrape during a long step waits for its end, as a vLLM scrape shows the
    // state as of its last step. The edge's counters are atomics, read here.
    // The names carry vLLM's colon style ("pagedkv:"): promtool's linter
    // remarks on the colon, and says nothing else (tests/test_serve.cpp).

    void metrics(httplib::Response& res) {
        Scrape s;
        if (!loop_.scrape(s, milliseconds(10000))) {
            send_error(res, 503, "the engine did not answer the scrape (stopped?)", "server_error", "engine_unavailable");
            return;
        }
        std::string t = s.engine_text;
        auto family = [&](const char* type, const char* name, const char* help) {
            t += std::string("# HELP pagedkv:") + name + " " + help + "\n# TYPE pagedkv:" + name + " " + type + "\n";
        };
        auto sample = [&](const char* name, const std::string& labels, long v) {
            t += std::string("pagedkv:") + name + labels + " " + std::to_string(v) + "\n";
        };
        // Read at scrape time, unlike the engine's gauges (as of its last
        // step): a disconnect's freed blocks show here at once.
        family("gauge", "kv_cache_free_blocks", "Free KV cache blocks, at scrape time.");
        sample("kv_cache_free_blocks", "", s.free_blocks);
        family("gauge", "kv_cache_blocks", "KV cache blocks in the pool.");
        sample("kv_cache_blocks", "", s.num_blocks);
        family("counter", "http_shed_total", "Requests answered 429 at the edge, by reason.");
        sample("http_shed_total", "{reason=\"queue_full\"}", stats_.shed_queue_full.load());
        sample("http_shed_total", "{reason=\"too_many_connections\"}", stats_.shed_connections.load());
        family("counter", "http_bad_requests_total", "Requests refused with a 4xx for their content (not 429).");
        sample("http_bad_requests_total", "", stats_.bad_requests.load());
        family("counter", "http_client_disconnects_total", "Answers whose client left before the end (the request was aborted).");
        sample("http_client_disconnects_total", "", stats_.disconnects.load());
        family("gauge", "http_open_answers", "Answers (streams or bodies) being written now.");
        sample("http_open_answers", "", stats_.open_answers.load());
        res.set_content(t, "text/plain; version=0.0.4");
    }

    // ---- completions -------------------------------------------------------------

    // One answer in progress: what the content provider needs between calls.
    // cpp-httplib calls the provider again and again on the worker's thread
    // until it says the answer is done (or fails); the releaser runs when
    // the response is destroyed, whatever happened. Provider and releaser
    // run on the same worker thread, one after the other: an Answer needs no
    // lock of its own. A non-streamed answer goes through a provider too
    // (its one body written at the end, chunked): that is how it, too,
    // notices a client that hangs up while it waits.
    struct Answer {
        openai::Request req;
        openai::AnswerId id;
        std::shared_ptr<Channel> ch;
        openai::TextStream text;
        std::vector<int32_t> out;   // [output tokens] so far
        std::string body_text;      // non-streamed: the text so far
        int preemptions = 0;
        bool first = true;          // no chunk sent yet
        bool done = false;          // the last byte was written (or the answer ended with an error)
        std::string finish;         // "stop" / "length" once known
        Clock::time_point t0 = Clock::now();
        Answer(openai::Request r, const pkv::Tokenizer& tok, std::shared_ptr<Channel> c)
            : req(std::move(r)), ch(std::move(c)), text(tok, req.prompt.back(), req.stop) {}
    };

    void completion(const httplib::Request& http_req, httplib::Response& res, const httplib::ContentReader& reader, bool chat) {
        // 1. The body, read by us so the cap holds for every framing: a
        // Content-Length over it is refused by cpp-httplib (413) before it
        // is read, and a chunked or compressed body stops at the cap here.
        std::string body;
        bool too_big = false;
        const size_t cap = (size_t)o_.max_body_kib * 1024;
        const bool read_ok = reader([&](const char* d, size_t n) {
            if (body.size() + n > cap) {
                too_big = true;
                return false;
            }
            body.append(d, n);
            return true;
        });
        if (!read_ok) {
            stats_.bad_requests++;
            if (too_big || res.status == 413) send_error(res, 413, too_large(), "invalid_request_error", "request_too_large");
            else if (res.status == 415) send_error(res, 415, "the body's Content-Encoding is not one this server can decode",
                                                   "invalid_request_error", "unsupported_media_type");
            else send_error(res, 400, "the request body could not be read: cut short, or it stopped arriving for longer than the read timeout (" +
                                          cli::number_text(o_.read_timeout) + " s)", "invalid_request_error", "bad_request");
            return;
        }

        // 2. What it asks for, checked field by field (openai_api.hpp).
        openai::Request r;
        try {
            r = openai::parse_request(body, chat, lim_, tok_, next_seed());
        } catch (const openai::ApiError& e) {
            send_error(res, e);
            return;
        }

        // 3. Admission at the edge: shed now, or hand it over.
        auto ch = std::make_shared<Channel>();
        switch (loop_.submit(r.prompt, r.params, ch)) {
            case EngineLoop::Admit::kShed:
                stats_.shed_queue_full++;
                send_error(res, 429, "the server is overloaded: " + std::to_string(o_.policy.max_waiting) +
                                         " requests are already waiting (--max-waiting); retry after a moment",
                           "rate_limit_error", "queue_full", "", true);
                return;
            case EngineLoop::Admit::kDown:
                send_error(res, 503, "the engine is not running: " + loop_.failure(), "server_error", "engine_unavailable");
                return;
            case EngineLoop::Admit::kQueued: break;
        }

        // 4. The engine's verdict, due when the engine thread next drains its
        // inbox (at most one step away). Only then do we know the status.
        {
            std::unique_lock<std::mutex> lk(ch->m);
            while (ch->door == Channel::Door::kPending && !ch->broken) ch->cv.wait_for(lk, milliseconds(100));
            if (ch->broken && ch->door == Channel::Door::kPending) {
                lk.unlock();
                send_error(res, 503, "the server is shutting down", "server_error", "engine_unavailable");
                return;
            }
            if (ch->door == Channel::Door::kRejected) {
                const std::string why = ch->reject_reason;
                const bool retry = ch->retryable;
                lk.unlock();
                if (retry) {
                    stats_.shed_queue_full++;
                    send_error(res, 429, "the server is overloaded: " + why, "rate_limit_error", "queue_full", "", true);
                } else {
                    stats_.bad_requests++;
                    send_error(res, 400, "the engine refused the request: " + why, "invalid_request_error", "invalid_value");
                }
                return;
            }
        }

        // 5. The answer, written by a content provider: chunk by chunk for a
        // stream, one body at the end otherwise. Both watch for a client that
        // has gone, and the releaser aborts a request that did not finish.
        auto a = std::make_shared<Answer>(std::move(r), tok_, ch);
        a->id.chat = chat;
        a->id.id = (chat ? "chatcmpl-" : "cmpl-") + std::to_string(next_id_++);
        a->id.model = a->req.model;
        a->id.created = (long)std::time(nullptr);
        stats_.open_answers++;
        const std::string path = http_req.path;
        auto provider = [this, a](size_t, httplib::DataSink& sink) { return write_some(*a, sink); };
        auto releaser = [this, a, path](bool) {
            stats_.open_answers--;
            if (!a->done) {
                // The client left (or the server is stopping): free its blocks.
                stats_.disconnects++;
                loop_.abort(a->ch);
            }
            if (o_.log_requests) log_request(*a, path);
        };
        res.set_chunked_content_provider(a->req.stream ? "text/event-stream" : "application/json", provider, releaser);
    }

    // One call of the content provider: wait briefly for events, write what
    // they make. Returns false to end the answer with an error (the client
    // is gone); true otherwise, and cpp-httplib calls again until sink.done().
    //
    // Each token is its own SSE event, sent as soon as the engine thread has
    // routed it: what a client times between two events is the engine's
    // inter-token latency plus a few microseconds of loopback. During a
    // preemption pause there are no events: we write nothing (the stream goes
    // quiet, which is what the client sees), and every 50 ms we only ask the
    // socket whether the client is still there. A client that left during a
    // pause is noticed then; one that leaves while tokens flow is noticed at
    // the next write, which fails.
    bool write_some(Answer& a, httplib::DataSink& sink) {
        std::vector<pkv::StreamEvent> events;
        if (!a.ch->take(events, milliseconds(50))) return fail(a, sink, "the engine stopped before this request finished");
        if (events.empty()) return sink.is_writable();  // nothing new; is the client still there?
        std::string out;  // the SSE bytes of this call: written at once, one syscall
        for (const pkv::StreamEvent& e : events) {
            if (a.done) break;
            switch (e.type) {
                case pkv::EventType::kToken: {
                    a.out.push_back(e.token);
                    const std::string piece = a.text.add(e.token);
                    if (a.req.stream) {
                        const std::vector<int32_t> one = {e.token};
                        out += sse(openai::chunk(a.id, piece, "", a.req.return_token_ids ? &one : nullptr, a.first));
                        a.first = false;
                    } else {
                        a.body_text += piece;
                    }
                    // A stop string ends the answer here; the engine would go on,
                    // so we abort the request (its blocks are freed).
                    if (a.text.stopped()) {
                        loop_.abort(a.ch);
                        finish(a, "stop", out);
                    }
                    break;
                }
                case pkv::EventType::kPreempted:
                    a.preemptions++;
                    if (a.req.stream && o_.sse_comments) out += ": pagedkv preempted\n\n";
                    break;
                case pkv::EventType::kResumed:
                    if (a.req.stream && o_.sse_comments) out += ": pagedkv resumed\n\n";
                    break;
                case pkv::EventType::kFinished:
                    if (e.reason == pkv::FinishReason::kError || e.reason == pkv::FinishReason::kAborted) {
                        // (Never write 0 bytes: cpp-httplib takes that as "no more data".)
                        if (!out.empty() && !sink.write(out.data(), out.size())) return false;
                        return fail(a, sink, std::string("the request ended early: ") +
                                                 (e.reason == pkv::FinishReason::kError ? "its forward pass failed" : "it was aborted"));
                    }
                    finish(a, openai::finish_reason_text(e.reason), out);
                    break;
                case pkv::EventType::kRejected: break;  // answered at the door
            }
        }
        if (!out.empty() && !sink.write(out.data(), out.size())) return false;
        if (a.done) sink.done();
        return true;
    }

    static std::string sse(const std::string& json) { return "data: " + json + "\n\n"; }

    // The end of a good answer: the last chunk (or the whole body), usage, [DONE].
    void finish(Answer& a, const std::string& reason, std::string& out) {
        a.finish = reason;
        const std::string rest = a.text.flush();
        const long P = (long)a.req.prompt.size(), C = (long)a.out.size();
        if (a.req.stream) {
            const std::vector<int32_t> none;
            out += sse(openai::chunk(a.id, rest, reason, a.req.return_token_ids ? &none : nullptr, a.first));
            if (a.req.include_usage) out += sse(openai::usage_chunk(a.id, P, C));
            out += "data: [DONE]\n\n";
        } else {
            a.body_text += rest;
            out += openai::body(a.id, a.body_text, reason, a.req.return_token_ids ? &a.out : nullptr, P, C);
        }
        a.done = true;
    }

    // An answer that cannot finish. A stream that has begun can only say so
    // in an event (its status line is long gone); a body can only be cut off.
    bool fail(Answer& a, httplib::DataSink& sink, const std::string& why) {
        a.done = true;  // nothing to abort: the engine already ended it
        if (!a.req.stream) return false;
        const std::string e = sse(openai::error_body(why, "server_error", "request_failed")) + "data: [DONE]\n\n";
        if (!sink.write(e.data(), e.size())) return false;
        sink.done();
        return true;
    }

    void log_request(const Answer& a, const std::string& path) {
        const double s = std::chrono::duration<double>(Clock::now() - a.t0).count();
        std::fprintf(stderr, "serve: %s %s %s: %zu prompt + %zu output tokens, %d preemption%s, finish %s, %.3f s\n", a.id.id.c_str(),
                     path.c_str(), a.req.stream ? "stream" : "body", a.req.prompt.size(), a.out.size(), a.preemptions,
                     a.preemptions == 1 ? "" : "s", a.finish.empty() ? "none (client left)" : a.finish.c_str(), s);
    }

    // A request without a seed gets one no other request shares.
    uint64_t next_seed() {
        std::lock_guard<std::mutex> lk(seed_m_);
        return pkv::splitmix64(seed_state_);
    }

    const Options& o_;
    const pkv::Tokenizer& tok_;
    openai::Limits lim_;
    EngineLoop loop_;
    EdgeStats stats_;
    HttpServer http_;
    std::atomic<long> next_id_{0};
    std::atomic<bool> served_{false};  // serve() has returned
    std::mutex seed_m_;
    uint64_t seed_state_ = 0;
    const std::time_t start_time_ = std::time(nullptr);
};

// ============================================================================
// 5. main
// ============================================================================

// Start-up order: parse, load, build the engine, bind the port (an error
// there is one line and exit status 1, before any thread exists), print
// "listening on ..." (true from this moment: a client that connects now
// waits in the kernel's backlog), then start the engine thread and the
// accept loop. Shutdown runs it backwards.
int run(int argc, char** argv) {
    const Options o = parse(argc, argv);
    // A client that hangs up must not kill us: writes to its socket fail with
    // EPIPE instead of raising SIGPIPE (cpp-httplib's sends do not ask for that).
    ::signal(SIGPIPE, SIG_IGN);
    // Ctrl-C and SIGTERM are taken by one thread with sigwait(); every thread
    // started from here on inherits the blocked mask. Not a signal handler:
    // a handler may only call async-signal-safe functions, and stopping the
    // server takes locks and joins threads.
    sigset_t stop_signals;
    sigemptyset(&stop_signals);
    sigaddset(&stop_signals, SIGINT);
    sigaddset(&stop_signals, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

    const pkv::ModelAndTokenizer mt = pkv::load_model_and_tokenizer(o.checkpoint, o.tokenizer);
    pkv::Engine eng(pkv::make_model_runner(o.device, mt.model), study::engine_config(o));
    if (o.log_interval > 0) eng.on_log = [](const std::string& line) { std::fprintf(stderr, "INFO %s\n", line.c_str()); };
    Server server(o, eng, mt.tok);
    const int port = server.bind();

    std::printf("model: %s (id \"%s\": dim %d, %d layers, vocab %d)\n", mt.name.c_str(), o.model_name.c_str(), mt.model.cfg.dim,
                mt.model.cfg.n_layers, mt.model.cfg.vocab_size);
    std::printf("%s\n", study::startup_summary(eng).c_str());
    std::printf("edge: %d connections at once, bodies up to %d KiB, read timeout %s s, %s\n", o.max_connections, o.max_body_kib,
                cli::number_text(o.read_timeout).c_str(),
                o.policy.max_waiting > 0 ? ("429 when " + std::to_string(o.policy.max_waiting) + " requests wait").c_str() : "no queue limit (--max-waiting 0)");
    std::printf("listening on http://%s:%d\n", o.host.c_str(), port);
    std::fflush(stdout);

    std::thread signals([&] {
        int sig = 0;
        sigwait(&stop_signals, &sig);
        server.stop();
    });
    server.serve();  // returns once the listener has stopped and every worker is done
    // If the listener stopped by itself, the signal thread still waits: wake it.
    pthread_kill(signals.native_handle(), SIGTERM);
    signals.join();
    std::printf("stopped\n");
    return 0;
}

}  // namespace

int main(int argc, char** argv) { return cli::guarded_main("serve", [&] { return run(argc, argv); }); }

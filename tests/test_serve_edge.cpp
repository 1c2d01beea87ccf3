// tests/test_serve_edge.cpp -- build/serve and build/loadgen against clients
// and servers that misbehave (the "serve_edge" suite): what happens around the
// requests. Real sockets on 127.0.0.1; every test starts its own server, and
// every count and every wait is bounded.
//
//   - the gauges are true at every scrape, even after an abort on an idle engine;
//   - idle and trickling connections starve no one: /health, a completion and
//     /metrics answer at once beside hundreds of them; a request trickled a
//     byte at a time meets the whole-request deadline; at the socket cap the
//     oldest connection still sending its request makes room;
//   - at the connection cap /health, /metrics and /v1/models still answer;
//   - SIGTERM: open streams end with an error event and [DONE] within the
//     deadline (never a silent truncation), then the server exits; a trickling
//     client does not hold it; a second signal exits at once;
//   - a non-streamed request is aborted when its client leaves;
//   - request headers are bounded in size (memory stays flat);
//   - a half-closed client (request sent, then its write side shut) gets its answer;
//   - HTTP conformance: HTTP/1.0, two Content-Lengths, absolute-form targets,
//     Content-Encoding, Allow;
//   - build/loadgen against a fake server: wrongly typed chunks, a stream that
//     never ends, a stream without [DONE]: one line with a reason each, no crash;
//   - in-process: a released request is gone and latencies are buckets only.
// And the "soak" suite (make soak; also in make test): 2,000 mixed requests
// with aborts, slow readers and a slowloris neighbour, /health polled
// throughout; afterwards every block free, every gauge 0, memory flat.
#include "tests/serve_util.hpp"

#include <sys/resource.h>

#include <atomic>
#include <mutex>

using namespace serve_test;

namespace {

const std::string kCompletions = "/v1/completions";

// A completion body: `max_tokens` output tokens (ignore_eos), greedy.
std::string completion_body(int max_tokens, bool stream) {
    return json({{"prompt", "once upon a time"}, {"max_tokens", max_tokens}, {"temperature", 0}, {"ignore_eos", true}, {"stream", stream}}).dump();
}

// connect() without REQUIRE: -1 when nothing listens (a server that stopped accepting).
int try_connect(int port) {
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return -1;
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons((uint16_t)port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::connect(fd, (sockaddr*)&a, sizeof a) != 0) {
        ::close(fd);
        return -1;
    }
    return fd;
}

// Reads from `fd` into `got` until `needle` is in it, the server closes, or
// `timeout_s` passes. True when the needle came.
bool read_until(int fd, std::string& got, const std::string& needle, double timeout_s) {
    const auto t0 = sse::Clock::now();
    while (got.find(needle) == std::string::npos) {
        const double left = timeout_s - seconds_since(t0);
        pollfd p{fd, POLLIN, 0};
        if (left <= 0 || ::poll(&p, 1, (int)(left * 1000) + 1) <= 0) return false;
        char buf[4096];
        const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
        if (n <= 0) return got.find(needle) != std::string::npos;
        got.append(buf, (size_t)n);
    }
    return true;
}

// Room for hundreds of sockets in this process (the soft limit may be 1024).
void raise_fd_limit() {
    rlimit r{};
    if (::getrlimit(RLIMIT_NOFILE, &r) == 0 && r.rlim_cur < r.rlim_max) {
        r.rlim_cur = r.rlim_max;
        ::setrlimit(RLIMIT_NOFILE, &r);
    }
}

// Waits (bounded) until a metric reaches `want`; returns the last value read.
double wait_metric(const ServeProcess& srv, const std::string& name, double want, double timeout_s) {
    const auto t0 = sse::Clock::now();
    double v = -1;
    while (seconds_since(t0) < timeout_s) {
        v = metric(srv, name);
        if (v == want) break;
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return v;
}

bool exited_zero(int status) { return status != -1 && WIFEXITED(status) && WEXITSTATUS(status) == 0; }

// Connections that send a request one byte at a time, forever (until stop()):
// the classic slowloris. Each sends the start of a POST, then one header byte
// every `every_s`; a connection the server closes is opened again.
class Tricklers {
public:
    Tricklers(int port, int n, double every_s) {
        for (int i = 0; i < n; ++i) fds_.push_back(start(port));
        thread_ = std::thread([this, port, every_s] {
            while (!stop_) {
                for (int& fd : fds_) {
                    if (fd >= 0 && ::send(fd, "X", 1, MSG_NOSIGNAL) == 1) continue;
                    if (fd >= 0) ::close(fd);
                    fd = start(port);  // closed by the server: come back
                    ++reopened_;
                }
                for (int k = 0; k < 10 && !stop_; ++k) std::this_thread::sleep_for(std::chrono::duration<double>(every_s / 10));
            }
        });
    }
    ~Tricklers() { stop(); }
    void stop() {
        stop_ = true;
        if (thread_.joinable()) thread_.join();
        for (int fd : fds_)
            if (fd >= 0) ::close(fd);
        fds_.clear();
    }
    int reopened() const { return reopened_; }

private:
    static int start(int port) {
        const int fd = try_connect(port);
        if (fd >= 0) send_all(fd, "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ");
        return fd;
    }
    std::vector<int> fds_;
    std::atomic<bool> stop_{false};
    std::atomic<int> reopened_{0};
    std::thread thread_;
};

// ---------------------------------------------------------------------------
// A fake OpenAI server for build/loadgen: it answers /v1/models, has no
// /metrics, and answers every POST with the bytes `stream` writes.
// ---------------------------------------------------------------------------

class FakeServer {
public:
    // Writes the answer to a POST on fd; returns when done (or the client left).
    using Answer = std::function<void(int fd, const std::atomic<bool>& stop)>;
    explicit FakeServer(Answer answer) : answer_(std::move(answer)) {
        lfd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        REQUIRE(lfd_ >= 0);
        sockaddr_in a{};
        a.sin_family = AF_INET;
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        REQUIRE(::bind(lfd_, (sockaddr*)&a, sizeof a) == 0);
        REQUIRE(::listen(lfd_, 64) == 0);
        socklen_t len = sizeof a;
        REQUIRE(::getsockname(lfd_, (sockaddr*)&a, &len) == 0);
        port_ = ntohs(a.sin_port);
        accept_ = std::thread([this] {
            while (!stop_) {
                pollfd p{lfd_, POLLIN, 0};
                if (::poll(&p, 1, 50) <= 0) continue;
                const int fd = ::accept4(lfd_, nullptr, nullptr, SOCK_CLOEXEC);
                if (fd < 0) continue;
                std::lock_guard<std::mutex> lk(m_);
                conns_.emplace_back([this, fd] { serve(fd); });
            }
        });
    }
    ~FakeServer() {
        stop_ = true;
        accept_.join();
        std::lock_guard<std::mutex> lk(m_);
        for (std::thread& t : conns_) t.join();
        ::close(lfd_);
    }
    int port() const { return port_; }

    // The head of a chunked event stream, and one SSE event as one chunk.
    static std::string stream_head() {
        return "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n";
    }
    static std::string chunk(const std::string& payload) {
        char n[32];
        std::snprintf(n, sizeof n, "%zx\r\n", payload.size());
        return n + payload + "\r\n";
    }
    static std::string event(const std::string& json_text) { return chunk("data: " + json_text + "\n\n"); }
    // An answer that sends `event` every `ms` milliseconds, `n` times (until
    // the client leaves or the server stops).
    static Answer endless(std::string event, int n, int ms) {
        return [event, n, ms](int fd, const std::atomic<bool>& stop) {
            send_all(fd, stream_head());
            for (int i = 0; i < n && !stop; ++i) {
                if (::send(fd, event.data(), event.size(), MSG_NOSIGNAL) <= 0) return;
                std::this_thread::sleep_for(std::chrono::milliseconds(ms));
            }
        };
    }
    static std::string token_event(const std::string& token_ids_json) {
        return event(R"({"id":"cmpl-x","object":"text_completion","created":1,"model":"fake","choices":[{"index":0,"text":" a","token_ids":)" +
                     token_ids_json + R"(,"logprobs":null,"finish_reason":null}]})");
    }

private:
    void serve(int fd) {
        SigpipeGuard guard;
        std::string got;
        read_until(fd, got, "\r\n\r\n", 5);
        if (got.compare(0, 15, "GET /v1/models ") == 0) {
            send_all(fd, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 15\r\nConnection: close\r\n\r\n{\"data\": [   ]}");
        } else if (got.compare(0, 5, "POST ") == 0) {
            answer_(fd, stop_);
        } else {
            send_all(fd, "HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
        }
        ::close(fd);
    }
    Answer answer_;
    int lfd_ = -1, port_ = 0;
    std::atomic<bool> stop_{false};
    std::thread accept_;
    std::mutex m_;
    std::vector<std::thread> conns_;
};

// build/loadgen against `fake`, one request; (output, exit status).
std::pair<std::string, int> loadgen_against(const FakeServer& fake, const std::string& flags) {
    const std::string exe = pkv_test::need_program("loadgen");
    if (exe.empty()) return {"", -1};
    return pkv_test::run_command("timeout 20 " + exe + " --port " + std::to_string(fake.port()) + " --requests 1 " + flags + " 2>&1");
}

}  // namespace

TEST_SUITE("serve_edge") {

// ---------------------------------------------------------------------------
// The signals stay true
// ---------------------------------------------------------------------------

TEST_CASE("/metrics tells the truth after clients hang up on an idle engine") {
    SigpipeGuard guard;
    ServeProcess srv({"--step-delay-ms", "20"});
    if (!srv.running()) return;
    // Two streams of 200 tokens, each abandoned after 3 tokens: once each
    // abort is applied the engine has nothing to do, and takes no step.
    for (int k = 1; k <= 2; ++k) {
        const sse::Stream s = sse::post_stream(target(srv), kCompletions, completion_body(200, true), /*stop_after_tokens=*/3);
        REQUIRE(s.status == 200);
        CHECK(wait_metric(srv, "pagedkv:request_aborted_total", k, 5) == k);
    }
    const std::vector<sse::Sample> m = metrics(srv);
    CHECK(sse::value(m, "pagedkv:num_requests_running") == 0);
    CHECK(sse::value(m, "pagedkv:num_requests_waiting") == 0);
    CHECK(sse::value(m, "pagedkv:kv_cache_usage_perc") == 0);
    CHECK(sse::value(m, "pagedkv:kv_cache_free_blocks") == sse::value(m, "pagedkv:kv_cache_blocks"));
    srv.stop();
}

// ---------------------------------------------------------------------------
// Slow, idle and vanishing clients
// ---------------------------------------------------------------------------

TEST_CASE("idle and trickling connections starve no one: /health, a completion and /metrics answer at once") {
    SigpipeGuard guard;
    raise_fd_limit();
    ServeProcess srv({"--max-connections", "4"});
    if (!srv.running()) return;
    const int port = srv.port();
    // 300 connections opened and never used, and 34 that send their request
    // one byte every half second.
    std::vector<int> idle;
    for (int i = 0; i < 300; ++i) {
        const int fd = try_connect(port);
        if (fd >= 0) idle.push_back(fd);
    }
    CHECK(idle.size() == 300);
    Tricklers slow(port, 34, 0.5);
    std::this_thread::sleep_for(std::chrono::milliseconds(300));

    const Reply health = raw(port, "GET /health HTTP/1.1\r\nHost: x\r\n\r\n", 3);
    CHECK(health.status == 200);
    CHECK(health.seconds < 1.0);
    const Reply done = raw(port, post(kCompletions, completion_body(4, true)), 5);
    CHECK(done.status == 200);
    CHECK(done.body.find("data: [DONE]") != std::string::npos);
    CHECK(done.seconds < 2.0);
    const Reply scrape = raw(port, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n", 3);
    CHECK(scrape.status == 200);
    CHECK(scrape.seconds < 1.0);
    slow.stop();
    for (int fd : idle) ::close(fd);
    srv.stop();
}

TEST_CASE("a request trickled a byte at a time gets 408 at the whole-request deadline; at the socket cap the oldest such goes first") {
    SigpipeGuard guard;
    raise_fd_limit();
    {
        // One byte every 0.1 s never trips the 5 s read timeout: only the
        // whole-request deadline (1 s here) ends it.
        ServeProcess srv({"--request-timeout", "1"});
        if (!srv.running()) return;
        const auto t0 = sse::Clock::now();
        const int fd = connect_to(srv.port());
        const std::string req = "GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: " + std::string(100, 'a') + "\r\n\r\n";
        std::string got;
        for (size_t i = 0; i < req.size() && got.empty(); ++i) {
            if (::send(fd, req.data() + i, 1, MSG_NOSIGNAL) != 1) break;
            pollfd p{fd, POLLIN, 0};
            if (::poll(&p, 1, 100) > 0) got = read_all(fd, 1);
        }
        got += read_all(fd, 2);
        ::close(fd);
        const Reply r = parse_reply(got);
        CHECK(r.status == 408);
        CHECK(r.body.find("request timeout (1 s)") != std::string::npos);
        CHECK(seconds_since(t0) < 2.5);
        CHECK(metric(srv, "pagedkv:http_request_timeouts_total") == 1);
        srv.stop();
    }
    {
        // 40 idle connections against a cap of 16 sockets: each newcomer
        // closes the oldest one still sending its request, so /health and a
        // completion are answered.
        ServeProcess srv({"--max-open-connections", "16"});
        if (!srv.running()) return;
        std::vector<int> idle;
        for (int i = 0; i < 40; ++i)
            if (const int fd = try_connect(srv.port()); fd >= 0) idle.push_back(fd);
        std::this_thread::sleep_for(std::chrono::milliseconds(200));
        const Reply health = raw(srv.port(), "GET /health HTTP/1.1\r\nHost: x\r\n\r\n", 3);
        CHECK(health.status == 200);
        CHECK(health.seconds < 1.0);
        const Reply done = raw(srv.port(), post(kCompletions, completion_body(4, true)), 5);
        CHECK(done.status == 200);
        CHECK(done.body.find("data: [DONE]") != std::string::npos);
        CHECK(metric(srv, "pagedkv:http_evicted_connections_total") >= 24);
        CHECK(metric(srv, "pagedkv:http_open_connections") <= 16);
        for (int fd : idle) ::close(fd);
        srv.stop();
    }
}

TEST_CASE("at the connection cap, /health, /metrics and /v1/models still answer; one more completion gets 429") {
    SigpipeGuard guard;
    ServeProcess srv({"--max-connections", "2", "--step-delay-ms", "20"});
    if (!srv.running()) return;
    const int port = srv.port();
    // Two long streams hold the two answers the server serves at once.
    int streams[2];
    for (int& fd : streams) {
        fd = connect_to(port);
        send_all(fd, post(kCompletions, completion_body(300, true)));
        std::string got;
        CHECK(read_until(fd, got, "data: {", 5));
    }
    for (const char* path : {"/health", "/metrics", "/v1/models"}) {
        CAPTURE(path);
        const Reply r = raw(port, std::string("GET ") + path + " HTTP/1.1\r\nHost: x\r\n\r\n", 3);
        CHECK(r.status == 200);
        CHECK(r.seconds < 1.0);
    }
    const Reply over = raw(port, post(kCompletions, completion_body(4, true)), 3);
    CHECK(over.status == 429);
    CHECK(over.header("Retry-After") == "1");
    CHECK(error_shape_problem(over.body) == "");
    CHECK(over.body.find("too_many_connections") != std::string::npos);
    for (int fd : streams) ::close(fd);
    srv.stop();
}

TEST_CASE("a non-streamed request is aborted when its client leaves, while its tokens flow") {
    SigpipeGuard guard;
    // 10 ms a step: 400 tokens would take 4 s.
    ServeProcess srv({"--step-delay-ms", "10"});
    if (!srv.running()) return;
    const int fd = connect_to(srv.port());
    send_all(fd, post(kCompletions, completion_body(400, false)));
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    ::close(fd);
    const auto t0 = sse::Clock::now();
    CHECK(wait_metric(srv, "pagedkv:request_aborted_total", 1, 3) == 1);
    CHECK(seconds_since(t0) < 1.0);
    const std::vector<sse::Sample> m = metrics(srv);
    CHECK(sse::value(m, "pagedkv:kv_cache_free_blocks") == sse::value(m, "pagedkv:kv_cache_blocks"));
    CHECK(sse::value(m, "pagedkv:generation_tokens_total") < 300);
    srv.stop();
}

TEST_CASE("request headers are bounded: endless header lines get 431 and the server's memory stays flat") {
    SigpipeGuard guard;
    ServeProcess srv({});
    if (!srv.running()) return;
    const long rss0 = srv.rss_kib();
    const int fd = connect_to(srv.port());
    send_all(fd, "GET /health HTTP/1.1\r\nHost: x\r\n");
    // Up to 32 MB of 8 KB header lines; a bounded server answers and closes
    // long before (our sends then fail).
    const std::string line = "X-Pad: " + std::string(8000, 'a') + "\r\n";
    size_t sent = 0;
    for (int i = 0; i < 4096; ++i) {
        pollfd p{fd, POLLOUT, 0};
        if (::poll(&p, 1, 2000) <= 0 || (p.revents & (POLLERR | POLLHUP))) break;
        const ssize_t n = ::send(fd, line.data(), line.size(), MSG_NOSIGNAL);
        if (n <= 0) break;
        sent += (size_t)n;
    }
    const long rss1 = srv.rss_kib();
    const Reply r = parse_reply(read_all(fd, 3));
    ::close(fd);
    INFO("sent " << sent / 1024 << " KiB of headers; server RSS " << rss0 << " -> " << rss1 << " KiB");
    CHECK(r.status == 431);
    CHECK(error_shape_problem(r.body) == "");
    CHECK(sent < 16u * 1024 * 1024);
    CHECK(rss1 - rss0 < 5 * 1024);
    srv.stop();
}

TEST_CASE("a half-closed client (request sent, then its write side shut) gets its answer") {
    SigpipeGuard guard;
    ServeProcess srv({});
    if (!srv.running()) return;
    auto half_closed = [&](const std::string& request) {
        const auto t0 = sse::Clock::now();
        const int fd = connect_to(srv.port());
        send_all(fd, request);
        ::shutdown(fd, SHUT_WR);  // as `nc -N` does
        const std::string got = read_all(fd, 10);
        ::close(fd);
        Reply r = parse_reply(got);
        r.seconds = seconds_since(t0);
        return r;
    };
    const Reply health = half_closed("GET /health HTTP/1.1\r\nHost: x\r\n\r\n");
    CHECK(health.status == 200);
    CHECK(health.body == "{\"status\":\"ok\"}");
    const Reply body = half_closed(post(kCompletions, completion_body(8, false)));
    CHECK(body.status == 200);
    REQUIRE(body.body.find('{') != std::string::npos);
    CHECK(json::parse(body.body.substr(body.body.find('{')))["usage"]["completion_tokens"] == 8);
    const Reply stream = half_closed(post(kCompletions, completion_body(8, true)));
    CHECK(stream.status == 200);
    CHECK(stream.body.find("data: [DONE]") != std::string::npos);
    CHECK(metric(srv, "pagedkv:request_aborted_total") == 0);
    srv.stop();
}

// ---------------------------------------------------------------------------
// HTTP conformance
// ---------------------------------------------------------------------------

TEST_CASE("HTTP conformance: HTTP/1.0, two Content-Lengths, absolute-form targets, Content-Encoding, Allow, 100-continue") {
    SigpipeGuard guard;
    ServeProcess srv({});
    if (!srv.running()) return;
    const int port = srv.port();
    auto raw_text = [&](const std::string& request) {
        const int fd = connect_to(port);
        send_all(fd, request);
        const std::string got = read_all(fd, 5);
        ::close(fd);
        return got;
    };
    auto lower = [](std::string s) {
        std::transform(s.begin(), s.end(), s.begin(), ::tolower);
        return s;
    };
    // An HTTP/1.0 client knows no chunked encoding: the answer is delimited
    // by the connection's end.
    const std::string body10 = completion_body(4, true);
    const std::string s10 = raw_text("POST /v1/completions HTTP/1.0\r\nContent-Type: application/json\r\nContent-Length: " +
                                     std::to_string(body10.size()) + "\r\n\r\n" + body10);
    CHECK(s10.compare(0, 13, "HTTP/1.1 200 ") * s10.compare(0, 13, "HTTP/1.0 200 ") == 0);
    CHECK(lower(s10.substr(0, s10.find("\r\n\r\n"))).find("transfer-encoding") == std::string::npos);
    CHECK(s10.find("\r\n\r\ndata: {") != std::string::npos);  // SSE bytes right after the head, no chunk sizes
    CHECK(s10.find("data: [DONE]\n\n") != std::string::npos);
    const std::string h10 = raw_text("GET /health HTTP/1.0\r\n\r\n");
    CHECK(lower(h10).find("transfer-encoding") == std::string::npos);
    CHECK(h10.find("{\"status\":\"ok\"}") != std::string::npos);

    // Two different Content-Lengths: which is the body? Refused.
    const Reply two = raw(port, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 15\r\n"
                                "Content-Length: 16\r\n\r\n{\"prompt\": \"a\"}", 5);
    CHECK(two.status == 400);
    CHECK(error_shape_problem(two.body) == "");
    // The absolute form of a request target (RFC 9112 3.2.2) names the same resource.
    const Reply absolute = raw(port, "GET http://127.0.0.1:" + std::to_string(port) + "/health HTTP/1.1\r\nHost: x\r\n\r\n", 5);
    CHECK(absolute.status == 200);
    // A body in an encoding we do not decode is refused, not read as plain text.
    const Reply zstd = raw(port, post(kCompletions, "{\"prompt\": \"a\"}", "Content-Encoding: zstd\r\n"), 5);
    CHECK(zstd.status == 415);
    CHECK(error_shape_problem(zstd.body) == "");
    // 405's Allow lists what the path takes, never a method that is 405 there too.
    const Reply put_c = raw(port, "PUT /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n", 5);
    CHECK(put_c.status == 405);
    CHECK(put_c.header("Allow") == "POST");
    const Reply put_h = raw(port, "PUT /health HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n", 5);
    CHECK(put_h.status == 405);
    CHECK(put_h.header("Allow").find("GET") == 0);
    CHECK(put_h.header("Allow").find("POST") == std::string::npos);
    const Reply post_h = raw(port, post("/health", "{}"), 5);
    CHECK(post_h.status == 405);
    CHECK(post_h.header("Allow").find("POST") == std::string::npos);
    // Expect: 100-continue (curl sends it before a large body): told to go on, then answered.
    {
        const std::string body = completion_body(2, false);
        const int fd = connect_to(port);
        send_all(fd, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nExpect: 100-continue\r\n"
                     "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n");
        std::string got;
        CHECK(read_until(fd, got, "\r\n\r\n", 3));
        CHECK(got.compare(0, 25, "HTTP/1.1 100 Continue\r\n\r\n") == 0);
        send_all(fd, body);
        got += read_all(fd, 5);
        ::close(fd);
        const Reply r = parse_reply(got.substr(got.find("\r\n\r\n") + 4));
        CHECK(r.status == 200);
        CHECK(r.body.find("\"completion_tokens\":2") != std::string::npos);
    }
    srv.stop();
}

// ---------------------------------------------------------------------------
// Shutdown
// ---------------------------------------------------------------------------

TEST_CASE("SIGTERM: open streams end with an error event and [DONE] within the deadline, then the server exits") {
    SigpipeGuard guard;
    ServeProcess srv({"--step-delay-ms", "20", "--shutdown-timeout", "1"});
    if (!srv.running()) return;
    const int port = srv.port();
    // Three streams of 400 tokens (8 s at 20 ms a step), one of 10 (done
    // within the deadline) and a body of 400.
    std::vector<int> longs;
    for (int i = 0; i < 3; ++i) {
        longs.push_back(connect_to(port));
        send_all(longs.back(), post(kCompletions, completion_body(400, true)));
    }
    const int short_fd = connect_to(port), body_fd = connect_to(port);
    send_all(body_fd, post(kCompletions, completion_body(400, false)));
    std::vector<std::string> got(longs.size());
    for (size_t i = 0; i < longs.size(); ++i) CHECK(read_until(longs[i], got[i], "data: {", 5));
    send_all(short_fd, post(kCompletions, completion_body(10, true)));
    std::string short_got;
    CHECK(read_until(short_fd, short_got, "data: {", 5));

    const auto t_sig = sse::Clock::now();
    srv.signal(SIGTERM);
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    // No new connection is taken once the signal is in.
    const int late = try_connect(port);
    if (late >= 0) {
        send_all(late, "GET /health HTTP/1.1\r\nHost: x\r\n\r\n");
        const Reply r = parse_reply(read_all(late, 3));
        CHECK(r.status != 200);
        ::close(late);
    }
    for (size_t i = 0; i < longs.size(); ++i) {
        CAPTURE(i);
        read_until(longs[i], got[i], "\r\n0\r\n\r\n", 5);
        const Reply r = parse_reply(got[i]);
        CHECK(r.status == 200);
        // The last events: an error (a client cannot take it for an answer), then
        // [DONE], then the chunked terminator.
        const size_t err = r.body.rfind("data: {\"error\":");
        CHECK(err != std::string::npos);
        CHECK(r.body.size() >= 14);
        CHECK(r.body.compare(r.body.size() - 14, 14, "data: [DONE]\n\n") == 0);
        CHECK(got[i].size() >= 7);
        CHECK(got[i].compare(got[i].size() - 7, 7, "\r\n0\r\n\r\n") == 0);
        CHECK(r.body.find("\"finish_reason\":\"length\"") == std::string::npos);
        ::close(longs[i]);
    }
    read_until(short_fd, short_got, "\r\n0\r\n\r\n", 5);
    const Reply sr = parse_reply(short_got);
    CHECK(sr.body.find("\"finish_reason\":\"length\"") != std::string::npos);
    CHECK(sr.body.find("data: [DONE]") != std::string::npos);
    CHECK(sr.body.find("\"error\"") == std::string::npos);
    ::close(short_fd);
    const Reply br = parse_reply(read_all(body_fd, 5));
    ::close(body_fd);
    CHECK(br.status == 503);
    CHECK(error_shape_problem(br.body) == "");

    const int status = srv.wait_exit(5);
    const double took = seconds_since(t_sig);
    INFO("exit status " << status << " after " << took << " s; stderr:\n" << srv.err());
    CHECK(exited_zero(status));
    CHECK(took >= 0.9);  // the streams had their deadline ...
    CHECK(took < 2.5);   // ... and no more
    CHECK(srv.err().find("Sanitizer") == std::string::npos);
}

TEST_CASE("SIGTERM: a trickling client does not hold the shutdown, and a second signal exits at once") {
    SigpipeGuard guard;
    {
        ServeProcess srv({"--shutdown-timeout", "1"});
        if (!srv.running()) return;
        Tricklers slow(srv.port(), 2, 0.1);
        std::this_thread::sleep_for(std::chrono::milliseconds(300));
        const auto t0 = sse::Clock::now();
        srv.signal(SIGTERM);
        const int status = srv.wait_exit(6);
        INFO("exit status " << status << " after " << seconds_since(t0) << " s");
        CHECK(exited_zero(status));
        CHECK(seconds_since(t0) < 2.5);
    }
    {
        ServeProcess srv({"--shutdown-timeout", "30", "--step-delay-ms", "20"});
        if (!srv.running()) return;
        Tricklers slow(srv.port(), 2, 0.1);
        const int fd = connect_to(srv.port());
        send_all(fd, post(kCompletions, completion_body(400, true)));
        std::string got;
        CHECK(read_until(fd, got, "data: {", 5));
        srv.signal(SIGTERM);
        CHECK(srv.wait_exit(0.5) == -1);  // draining: the stream has 30 s
        const auto t0 = sse::Clock::now();
        srv.signal(SIGTERM);
        const int status = srv.wait_exit(3);
        INFO("exit status " << status << " after " << seconds_since(t0) << " s");
        CHECK(status != -1);
        CHECK(seconds_since(t0) < 1.0);
        ::close(fd);
    }
}

TEST_CASE("SIGTERM with the official openai npm client: each stream raises or finishes, never a silent truncation") {
    const std::string dir = "build/deps/node";
    if (!need_openai_npm(dir)) return;
    SigpipeGuard guard;
    ServeProcess srv({"--step-delay-ms", "20", "--shutdown-timeout", "1"});
    if (!srv.running()) return;
    // The script starts two long streams (a completion and a chat), sends
    // SIGTERM to the server once both have a chunk, and reads them to the end.
    // We reap the server meanwhile and time its exit from the script's signal.
    std::pair<std::string, int> res;
    std::thread node([&] {
        res = pkv_test::run_command("timeout 60 node tests/openai_shutdown.mjs " + std::to_string(srv.port()) + " " + dir + " " +
                                    std::to_string(srv.pid()) + " 2>&1");
    });
    const int status = srv.wait_exit(60);
    const double exit_ms = (double)std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch()).count();
    node.join();
    INFO("node said: " << res.first << "\nserver exit status " << status);
    REQUIRE(res.second == 0);
    REQUIRE(res.first.find('{') != std::string::npos);
    const json j = json::parse(res.first.substr(res.first.find('{')));
    for (const char* k : {"completion", "chat"}) {
        CAPTURE(k);
        const json& s = j[k];
        CHECK(s["chunks"].get<int>() >= 1);
        // Either the client raised (the error event), or the answer finished.
        CHECK((!s["error"].is_null() || !s["finish_reason"].is_null()));
        if (!s["error"].is_null()) CHECK(s["error"]["message"].get<std::string>().find("shutting down") != std::string::npos);
    }
    CHECK(exited_zero(status));
    const double exit_s = (exit_ms - j["signal_at_ms"].get<double>()) / 1e3;
    INFO("exit " << exit_s << " s after the signal");
    CHECK(exit_s < 2.5);
}

// ---------------------------------------------------------------------------
// build/loadgen against a server that misbehaves
// ---------------------------------------------------------------------------

TEST_CASE("loadgen: wrongly typed chunks, a stream that never ends, a stream without [DONE]: a reason each, no crash") {
    SigpipeGuard guard;
    if (pkv_test::need_program("loadgen").empty()) return;
    auto failed_line = [](const std::string& out) {
        const size_t at = out.find("request 0 failed: ");
        return at == std::string::npos ? std::string() : out.substr(at, out.find('\n', at) - at);
    };
    // Chunks whose fields have the wrong type: loadgen says which, exit 1.
    for (const std::string& bad : {FakeServer::token_event(R"(["x"])"),
                                   FakeServer::event(R"({"id":"x","choices":[],"usage":{"prompt_tokens":"many","completion_tokens":1}})"),
                                   FakeServer::event(R"({"id":"x","choices":[{"index":0,"text":5,"finish_reason":null}]})"),
                                   FakeServer::event(R"({"id":"x","choices":[{"index":0,"text":"a","finish_reason":7}]})")}) {
        CAPTURE(bad);
        FakeServer fake([&](int fd, const std::atomic<bool>&) {
            send_all(fd, FakeServer::stream_head() + FakeServer::token_event("[5]") + bad + FakeServer::event("[DONE]") + "0\r\n\r\n");
        });
        const std::pair<std::string, int> r = loadgen_against(fake, "--max-tokens 8");
        INFO(r.first);
        CHECK(r.second == 1);
        CHECK(failed_line(r.first).find("status 200: a chunk") != std::string::npos);
    }
    // A stream past max_tokens, forever: cut at the cap.
    {
        FakeServer fake(FakeServer::endless(FakeServer::token_event("[5]"), 20000, 2));
        const auto t0 = sse::Clock::now();
        const std::pair<std::string, int> r = loadgen_against(fake, "--max-tokens 8");
        INFO(r.first);
        CHECK(r.second == 1);
        CHECK(failed_line(r.first).find("more than max_tokens") != std::string::npos);
        CHECK(seconds_since(t0) < 10);
    }
    // A stream that only ever sends comments: cut at the overall deadline.
    {
        FakeServer fake(FakeServer::endless(FakeServer::chunk(": still here\n\n"), 400, 50));
        const auto t0 = sse::Clock::now();
        const std::pair<std::string, int> r = loadgen_against(fake, "--max-tokens 8 --deadline 2");
        INFO(r.first);
        CHECK(r.second == 1);
        CHECK(failed_line(r.first).find("deadline") != std::string::npos);
        CHECK(seconds_since(t0) < 6);
    }
    // A stream that ends, properly framed, without [DONE].
    {
        FakeServer fake([](int fd, const std::atomic<bool>&) {
            send_all(fd, FakeServer::stream_head() + FakeServer::token_event("[5]") + FakeServer::token_event("[6]") + "0\r\n\r\n");
        });
        const std::pair<std::string, int> r = loadgen_against(fake, "--max-tokens 8");
        INFO(r.first);
        CHECK(r.second == 1);
        CHECK(failed_line(r.first).find("without data: [DONE]") != std::string::npos);
    }
}

// ---------------------------------------------------------------------------
// Memory: what a server keeps of the requests it served
// ---------------------------------------------------------------------------

TEST_CASE("retained state is bounded: a released request is gone, and latencies are buckets, not samples") {
    // The engine as build/serve configures it: histograms only.
    pkv::EngineConfig ec = workload::engine_config(workload::Setup{});
    ec.keep_latency_samples = false;
    pkv::Engine eng(pkv::make_model_runner(pkv::Device::kCpu, builtin().model), ec);
    pkv::SamplingParams sp;
    sp.max_tokens = 20;
    sp.ignore_eos = true;
    pkv_test::Rng rng(4);
    long tokens = 0;
    for (int round = 0; round < 5; ++round) {
        std::vector<int> ids;
        for (int i = 0; i < 8; ++i) ids.push_back(eng.add_request(random_prompt(rng, 12), sp));
        eng.run_until_done();
        for (int id : ids) {
            CHECK(eng.request(id)->finished());
            CHECK(eng.release(id));
            CHECK(eng.request(id) == nullptr);
            CHECK(!eng.release(id));  // once
        }
        tokens += 8 * 20;
    }
    // An unfinished request cannot be released.
    const int live = eng.add_request(random_prompt(rng, 12), sp);
    CHECK(!eng.release(live));
    CHECK(eng.request(live) != nullptr);
    eng.run_until_done();
    CHECK(eng.release(live));
    CHECK(eng.scheduler().num_requests() == 41);  // ids go on; none is reused
    // Every observation counted, none kept.
    const pkv::Metrics& m = eng.metrics();
    CHECK(m.inter_token_latency.v.empty());
    CHECK(m.time_to_first_token.v.empty());
    CHECK(m.e2e_request_latency.v.empty());
    CHECK(m.inter_token_latency.count() == (size_t)(tokens + 20 - 41));
    CHECK(m.e2e_request_latency.count() == 41);
    CHECK(m.inter_token_latency.hist.n.size() == pkv::itl_buckets().size() + 1);
    CHECK_THROWS_AS(m.inter_token_latency.percentile(50), std::logic_error);
    // The page is the same size after 41 requests as it would be after a billion.
    const std::string page = eng.prometheus("model_name=\"m\"");
    CHECK(page.find("pagedkv:e2e_request_latency_seconds_count{model_name=\"m\"} 41\n") != std::string::npos);
    CHECK(page.find("pagedkv:request_success_total{model_name=\"m\",finished_reason=\"length\"} 41\n") != std::string::npos);
}

}  // TEST_SUITE("serve_edge")

// ---------------------------------------------------------------------------
// The soak: a long mixed run against one server
// ---------------------------------------------------------------------------

TEST_SUITE("soak") {

TEST_CASE("soak: 2,000 requests with aborts, slow readers and a slowloris neighbour; /health stays fast, nothing leaks") {
    SigpipeGuard guard;
    raise_fd_limit();
    ServeProcess srv({"--read-timeout", "2", "--request-timeout", "4", "--write-timeout", "2"});
    if (!srv.running()) return;
    const int port = srv.port();
    const long rss_start = srv.rss_kib();
    std::atomic<bool> stop{false};

    // /health, every 100 ms, throughout.
    std::vector<double> health_s;
    int health_bad = 0;
    std::thread health([&] {
        while (!stop) {
            const Reply r = raw(port, "GET /health HTTP/1.1\r\nHost: x\r\n\r\n", 5);
            health_s.push_back(r.seconds);
            health_bad += r.status != 200;
            std::this_thread::sleep_for(std::chrono::milliseconds(100));
        }
    });
    // The neighbour: 16 connections sending their headers a byte every 0.5 s,
    // coming back each time the server cuts them off.
    Tricklers slowloris(port, 16, 0.5);

    // One request of kind i % 10: 0-5 a stream read to its end, 6 a body,
    // 7 a stream abandoned after a few tokens, 8 a stream read slowly,
    // 9 a body abandoned while it is computed. Returns "" or what went wrong.
    auto one = [&](int i, pkv_test::Rng& rng) -> std::string {
        const int kind = i % 10;
        const int n = rng.uniform(8, 64);
        if (kind <= 5 || kind == 7) {
            const sse::Stream st = sse::post_stream(target(srv), kCompletions, completion_body(kind == 7 ? 200 : n, true),
                                                    kind == 7 ? rng.uniform(1, 5) : -1);
            if (st.status != 200) return "stream: status " + std::to_string(st.status) + " " + st.error;
            if (kind == 7) return st.hung_up ? "" : "abandoned stream: did not hang up: " + st.error;
            if (!st.done || (int)st.token_times.size() != n) return "stream: " + std::to_string(st.token_times.size()) + " tokens, " + st.error;
            return "";
        }
        const int fd = connect_to(port);
        if (kind == 8) {  // a slow reader: 512 bytes at a time, 2 ms apart
            send_all(fd, post(kCompletions, completion_body(n, true)));
            std::string got;
            for (int k = 0; k < 5000 && got.find("data: [DONE]") == std::string::npos; ++k) {
                pollfd p{fd, POLLIN, 0};
                if (::poll(&p, 1, 5000) <= 0) break;
                char buf[512];
                const ssize_t r = ::recv(fd, buf, sizeof buf, 0);
                if (r <= 0) break;
                got.append(buf, (size_t)r);
                std::this_thread::sleep_for(std::chrono::milliseconds(2));
            }
            ::close(fd);
            return got.find("data: [DONE]") != std::string::npos ? "" : "slow reader: no [DONE]";
        }
        send_all(fd, post(kCompletions, completion_body(kind == 9 ? 200 : n, false)));
        if (kind == 9) {
            std::this_thread::sleep_for(std::chrono::milliseconds(rng.uniform(1, 20)));
            ::close(fd);
            return "";
        }
        const Reply r = parse_reply(read_all(fd, 30));
        ::close(fd);
        return r.status == 200 && r.body.find("\"completion_tokens\":" + std::to_string(n)) != std::string::npos ? "" : "body: status " +
                                                                                                                  std::to_string(r.status);
    };
    auto run = [&](int first, int count, int clients, std::vector<std::string>& problems) {
        std::atomic<int> next{first};
        std::mutex m;
        std::vector<std::thread> th;
        for (int c = 0; c < clients; ++c)
            th.emplace_back([&, c] {
                pkv_test::Rng rng(1000 + (uint64_t)c);
                for (int i; (i = next++) < first + count;) {
                    const std::string p = one(i, rng);
                    if (p.empty()) continue;
                    std::lock_guard<std::mutex> lk(m);
                    problems.push_back("request " + std::to_string(i) + ": " + p);
                }
            });
        for (std::thread& t : th) t.join();
    };
    const auto t0 = sse::Clock::now();
    std::vector<std::string> problems;
    run(0, 200, 16, problems);  // warm-up: the allocator and the buffers reach their working size
    const long rss0 = srv.rss_kib();
    run(200, 2000, 16, problems);
    const double took = seconds_since(t0);
    stop = true;
    health.join();
    slowloris.stop();

    // Every abort applied, every block free, every gauge 0 (the engine idle).
    const auto t1 = sse::Clock::now();
    std::vector<sse::Sample> m;
    while (seconds_since(t1) < 10) {
        m = metrics(srv);
        if (sse::value(m, "pagedkv:num_requests_running") == 0 && sse::value(m, "pagedkv:http_open_answers") == 0) break;
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    const long rss1 = srv.rss_kib();
    const double worst = health_s.empty() ? 0 : *std::max_element(health_s.begin(), health_s.end());
    MESSAGE("soak: 2200 requests in " << took << " s; /health " << health_s.size() << " probes, slowest " << worst * 1e3 << " ms; RSS "
                                      << rss_start << " KiB at the start, " << rss0 << " -> " << rss1 << " KiB after the warm-up; slowloris reconnected " << slowloris.reopened()
                                      << " times; " << sse::value(m, "pagedkv:request_success_total", "finished_reason=\"abort\"") << " aborted");
    for (size_t k = 0; k < std::min<size_t>(problems.size(), 10); ++k) INFO(problems[k]);
    CHECK(problems.empty());
    CHECK(health_bad == 0);
    CHECK(worst < 1.0);
    CHECK(sse::value(m, "pagedkv:kv_cache_free_blocks") == sse::value(m, "pagedkv:kv_cache_blocks"));
    CHECK(sse::value(m, "pagedkv:num_requests_running") == 0);
    CHECK(sse::value(m, "pagedkv:num_requests_waiting") == 0);
    CHECK(sse::value(m, "pagedkv:kv_cache_usage_perc") == 0);
    CHECK(sse::value(m, "pagedkv:http_open_answers") == 0);
    CHECK(sse::value(m, "pagedkv:request_success_total") >= 2200 - 10);  // (a body abandoned before it reached the engine is not counted)
    CHECK(sse::value(m, "pagedkv:request_success_total", "finished_reason=\"abort\"") >= 300);
    CHECK(rss1 - rss0 < 5 * 1024);
    srv.stop();
}

}  // TEST_SUITE("soak")

// tests/serve_util.hpp -- what the serve test suites share (tests/test_serve.cpp,
// tests/test_serve_edge.cpp): build/serve as a child process on a free port,
// the built-in model and an in-process reference engine, and raw HTTP on a
// socket of our own, so a test sends exactly the bytes it chooses. Every wait
// here is bounded.
#pragma once

#include <doctest/doctest.h>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "engine.hpp"
#include "examples/openai_api.hpp"
#include "examples/sse_client.hpp"
#include "examples/workload.hpp"
#include "tests/test_util.hpp"

namespace serve_test {

namespace fs = std::filesystem;
using json = nlohmann::json;
using pkv_test::shell_quote;

inline double seconds_since(sse::Clock::time_point t0) { return std::chrono::duration<double>(sse::Clock::now() - t0).count(); }

// ---------------------------------------------------------------------------
// The model and the in-process reference
// ---------------------------------------------------------------------------

// The built-in model, as build/serve loads it by default.
inline const pkv::ModelAndTokenizer& builtin() {
    static const pkv::ModelAndTokenizer mt = pkv::load_model_and_tokenizer("", "");
    return mt;
}

struct Req {
    std::vector<int32_t> prompt;
    pkv::SamplingParams params;
};

// The output tokens of each request, run in-process on an engine configured
// like the server (workload::engine_config of the same Setup).
inline std::vector<std::vector<int32_t>> reference(const workload::Setup& s, const std::vector<Req>& reqs) {
    pkv::Engine eng(pkv::make_model_runner(pkv::Device::kCpu, builtin().model), workload::engine_config(s));
    for (const Req& r : reqs) eng.add_request(r.prompt, r.params);
    eng.run_until_done();
    std::vector<std::vector<int32_t>> out;
    for (int i = 0; i < (int)reqs.size(); ++i) {
        const pkv::Request* r = eng.request(i);
        REQUIRE(r->finish_reason != pkv::FinishReason::kRejected);
        out.emplace_back(r->tokens.begin() + r->num_prompt_tokens, r->tokens.end());
    }
    return out;
}

// The text a client should see for `out` after `prompt`: each token rendered
// after the one before it, BOS and EOS as nothing (openai::TextStream).
inline std::string expected_text(const std::vector<int32_t>& prompt, const std::vector<int32_t>& out) {
    openai::TextStream ts(builtin().tok, prompt.back(), {});
    std::string s;
    for (int32_t t : out) s += ts.add(t);
    return s + ts.flush();
}

// A request body: prompt as token ids, stream or not, with return_token_ids.
inline std::string body_for(const Req& r, bool stream, bool chat_text = false, const std::string& text = "") {
    json j;
    if (chat_text) j["messages"] = json::array({{{"role", "user"}, {"content", text}}});
    else if (!text.empty()) j["prompt"] = text;
    else j["prompt"] = r.prompt;
    j["max_tokens"] = r.params.max_tokens;
    j["temperature"] = r.params.temperature;
    if (r.params.top_p != 1.0f) j["top_p"] = r.params.top_p;
    j["seed"] = (int64_t)r.params.seed;
    if (r.params.ignore_eos) j["ignore_eos"] = true;
    j["stream"] = stream;
    j["return_token_ids"] = true;
    return j.dump();
}

// ---------------------------------------------------------------------------
// A server process
// ---------------------------------------------------------------------------

// SIGPIPE, blocked in this thread while a test talks to servers: a write to
// a socket the server closed then fails with EPIPE instead of killing the
// test binary. The mask is restored (and a pending SIGPIPE consumed) at the
// end, so the programs other tests start do not inherit it.
struct SigpipeGuard {
    sigset_t old{};
    SigpipeGuard() {
        sigset_t s;
        sigemptyset(&s);
        sigaddset(&s, SIGPIPE);
        pthread_sigmask(SIG_BLOCK, &s, &old);
    }
    ~SigpipeGuard() {
        sigset_t s;
        sigemptyset(&s);
        sigaddset(&s, SIGPIPE);
        const timespec zero{0, 0};
        while (sigtimedwait(&s, nullptr, &zero) > 0) {
        }
        pthread_sigmask(SIG_SETMASK, &old, nullptr);
    }
};

// build/serve (of this build: build/, build/asan/) on 127.0.0.1 and a free
// port. The constructor returns once it listens; the destructor stops it.
class ServeProcess {
public:
    explicit ServeProcess(const std::vector<std::string>& args) {
        exe_ = pkv_test::need_program("serve");
        if (exe_.empty()) return;
        err_path_ = (fs::temp_directory_path() / ("pagedkv_serve_" + std::to_string(::getpid()) + "_" + std::to_string(counter()++) + ".err")).string();
        std::vector<std::string> argv_s = {exe_, "--port", "0"};
        argv_s.insert(argv_s.end(), args.begin(), args.end());
        std::vector<char*> argv;
        for (std::string& a : argv_s) argv.push_back(a.data());
        argv.push_back(nullptr);
        int out[2];
        REQUIRE(::pipe2(out, O_CLOEXEC) == 0);
        const int err_fd = ::open(err_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        REQUIRE(err_fd >= 0);
        pid_ = ::fork();
        REQUIRE(pid_ >= 0);
        if (pid_ == 0) {
            // The child: only async-signal-safe calls until exec. It dies
            // with us if the test binary dies.
            ::prctl(PR_SET_PDEATHSIG, SIGKILL);
            sigset_t none;
            sigemptyset(&none);
            ::sigprocmask(SIG_SETMASK, &none, nullptr);
            ::dup2(out[1], 1);
            ::dup2(err_fd, 2);
            ::execv(argv[0], argv.data());
            ::_exit(127);
        }
        ::close(out[1]);
        ::close(err_fd);
        out_fd_ = out[0];
        // The line "listening on http://127.0.0.1:PORT"; 60 s for a
        // sanitizer build on a busy machine.
        std::string got;
        const auto t0 = sse::Clock::now();
        while (port_ == 0 && seconds_since(t0) < 60) {
            pollfd p{out_fd_, POLLIN, 0};
            if (::poll(&p, 1, 100) <= 0) continue;
            char buf[512];
            const ssize_t n = ::read(out_fd_, buf, sizeof buf);
            if (n <= 0) break;
            got.append(buf, (size_t)n);
            const std::string said = "listening on http://127.0.0.1:";
            const size_t at = got.find(said), nl = at == std::string::npos ? at : got.find('\n', at);
            if (nl == std::string::npos) continue;
            long long port = 0;  // the whole rest of the line, a port number or nothing
            if (cli::to_integer(got.substr(at + said.size(), nl - at - said.size()).c_str(), 1, 65535, port)) port_ = (int)port;
            break;
        }
        stdout_ = got;
        if (port_ == 0) {  // no destructor runs after a failed constructor: stop it here
            ::kill(pid_, SIGKILL);
            ::waitpid(pid_, nullptr, 0);
            pid_ = -1;
            ::close(out_fd_);
        }
        REQUIRE_MESSAGE(port_ > 0, "build/serve did not start listening; stdout:\n" << got << "\nstderr:\n" << err());
    }
    ServeProcess(const ServeProcess&) = delete;
    ServeProcess& operator=(const ServeProcess&) = delete;
    ~ServeProcess() {
        if (pid_ > 0) stop();
        if (!err_path_.empty()) {
            std::error_code ec;
            fs::remove(err_path_, ec);
        }
    }

    bool running() const { return pid_ > 0 && port_ > 0; }
    int port() const { return port_; }
    pid_t pid() const { return pid_; }
    // Sends `sig` (a test of shutdown); then wait_exit().
    void signal(int sig) const {
        if (pid_ > 0) ::kill(pid_, sig);
    }
    // Waits up to `timeout_s` for the process to exit; its wait status, or -1
    // if it still runs (then the destructor stops it). After an exit, stop()
    // checks nothing more than stderr.
    int wait_exit(double timeout_s) {
        if (pid_ <= 0) return exit_status_;
        const auto t0 = sse::Clock::now();
        int status = 0;
        for (;;) {
            const pid_t r = ::waitpid(pid_, &status, WNOHANG);
            if (r == pid_) break;
            if (seconds_since(t0) >= timeout_s) return -1;
            std::this_thread::sleep_for(std::chrono::milliseconds(5));
        }
        pid_ = -1;
        ::close(out_fd_);
        exit_status_ = status;
        return status;
    }
    // The server's resident memory (VmRSS, KiB), or -1 when it is not running.
    long rss_kib() const {
        std::ifstream f("/proc/" + std::to_string(pid_) + "/status");
        std::string line;
        while (pid_ > 0 && std::getline(f, line))
            if (line.compare(0, 6, "VmRSS:") == 0) return std::strtol(line.c_str() + 6, nullptr, 10);
        return -1;
    }
    std::string err() const {
        std::ifstream f(err_path_);
        return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
    }

    // SIGTERM, and the checks every test makes: it stops within 20 s,
    // exits 0, and no sanitizer reported anything.
    void stop() {
        if (pid_ <= 0) return;
        ::kill(pid_, SIGTERM);
        int status = 0;
        const auto t0 = sse::Clock::now();
        pid_t r = 0;
        while ((r = ::waitpid(pid_, &status, WNOHANG)) == 0 && seconds_since(t0) < 20)
            std::this_thread::sleep_for(std::chrono::milliseconds(10));
        const bool hung = r == 0;
        if (hung) {
            ::kill(pid_, SIGKILL);
            ::waitpid(pid_, &status, 0);
        }
        pid_ = -1;
        ::close(out_fd_);
        const std::string e = err();
        CHECK_MESSAGE(!hung, "build/serve did not stop within 20 s of SIGTERM");
        CHECK_MESSAGE((WIFEXITED(status) && WEXITSTATUS(status) == 0), "build/serve exited with status " << status << "; stderr:\n" << e);
        CHECK_MESSAGE(e.find("Sanitizer") == std::string::npos, "sanitizer report:\n" << e);
        CHECK_MESSAGE(e.find("runtime error:") == std::string::npos, "sanitizer report:\n" << e);
    }

private:
    static int& counter() {
        static int n = 0;
        return n;
    }
    std::string exe_, err_path_, stdout_;
    pid_t pid_ = -1;
    int exit_status_ = -1;
    int out_fd_ = -1, port_ = 0;
};

inline sse::Target target(const ServeProcess& s) { return sse::Target{"127.0.0.1", s.port(), 60}; }

// GET path; the body ("" on failure, with the status 0).
inline std::pair<int, std::string> get(const ServeProcess& s, const std::string& path) {
    httplib::Client cli("127.0.0.1", s.port());
    cli.set_connection_timeout(5, 0);
    cli.set_read_timeout(30, 0);
    const httplib::Result r = cli.Get(path);
    if (!r) return {0, ""};
    return {r->status, r->body};
}
inline std::vector<sse::Sample> metrics(const ServeProcess& s) {
    const std::pair<int, std::string> page = get(s, "/metrics");
    REQUIRE(page.first == 200);
    return sse::samples(page.second);
}
inline double metric(const ServeProcess& s, const std::string& name, const std::string& labels = "") {
    return sse::value(metrics(s), name, labels);
}

// ---------------------------------------------------------------------------
// Raw HTTP: exactly the bytes we choose, on a socket of our own
// ---------------------------------------------------------------------------

inline int connect_to(int port) {
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    REQUIRE(fd >= 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons((uint16_t)port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(::connect(fd, (sockaddr*)&a, sizeof a) == 0);
    return fd;
}
inline void send_all(int fd, const std::string& bytes) {
    size_t off = 0;
    while (off < bytes.size()) {
        const ssize_t n = ::send(fd, bytes.data() + off, bytes.size() - off, MSG_NOSIGNAL);
        if (n <= 0) return;  // the server may close early (413): what it answered is read below
        off += (size_t)n;
    }
}
// Everything the server sends until it closes, or until `timeout_s`.
inline std::string read_all(int fd, double timeout_s) {
    std::string got;
    const auto t0 = sse::Clock::now();
    for (;;) {
        const double left = timeout_s - seconds_since(t0);
        if (left <= 0) break;
        pollfd p{fd, POLLIN, 0};
        if (::poll(&p, 1, (int)(left * 1000) + 1) <= 0) break;
        char buf[4096];
        const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
        if (n <= 0) break;
        got.append(buf, (size_t)n);
    }
    return got;
}

struct Reply {
    int status = 0;
    std::string head, body;  // head: status line + headers
    double seconds = 0;
    bool closed = false;     // the server closed the connection (not our timeout)
    std::string header(const std::string& name) const {
        std::string h = head;
        std::transform(h.begin(), h.end(), h.begin(), ::tolower);
        std::string n = name;
        std::transform(n.begin(), n.end(), n.begin(), ::tolower);
        const size_t at = h.find("\r\n" + n + ":");
        if (at == std::string::npos) return "";
        size_t v = at + 3 + n.size();
        while (v < head.size() && head[v] == ' ') ++v;
        return head.substr(v, head.find("\r\n", v) - v);
    }
};

inline Reply parse_reply(const std::string& got) {
    Reply r;
    const size_t end = got.find("\r\n\r\n");
    if (got.compare(0, 9, "HTTP/1.1 ") != 0 || end == std::string::npos) return r;
    long long status = 0;  // "HTTP/1.1 200 OK": three digits, then a space
    if (!cli::to_integer(got.substr(9, 3).c_str(), 100, 599, status) || got.compare(12, 1, " ") != 0) return r;
    r.status = (int)status;
    r.head = got.substr(0, end);
    r.body = got.substr(end + 4);
    if (r.header("Transfer-Encoding") == "chunked") {  // de-chunk
        std::string b;
        size_t p = 0;
        while (p < r.body.size()) {
            const size_t nl = r.body.find("\r\n", p);
            if (nl == std::string::npos) break;
            const size_t n = std::strtoul(r.body.c_str() + p, nullptr, 16);
            if (n == 0) break;
            b += r.body.substr(nl + 2, n);
            p = nl + 2 + n + 2;
        }
        r.body = b;
    }
    return r;
}

// Sends `bytes`, then (unless keep_sending) reads the reply until the server
// closes. pause_after: send that prefix, then nothing more (a client that
// stalls); the reply must then come from the server's timeout.
inline Reply raw(int port, const std::string& bytes, double timeout_s = 10) {
    const auto t0 = sse::Clock::now();
    const int fd = connect_to(port);
    send_all(fd, bytes);
    const std::string got = read_all(fd, timeout_s);
    ::close(fd);
    Reply r = parse_reply(got);
    r.seconds = seconds_since(t0);
    r.closed = r.seconds < timeout_s;
    return r;
}

// Sends `bytes` and reads only the status line and headers, and the body when
// it has a Content-Length (an error); then hangs up. A stream's body is not
// waited for.
inline Reply raw_head(int port, const std::string& bytes, double timeout_s) {
    const auto t0 = sse::Clock::now();
    const int fd = connect_to(port);
    send_all(fd, bytes);
    std::string got;
    for (;;) {
        const double left = timeout_s - seconds_since(t0);
        const size_t end = got.find("\r\n\r\n");
        if (end != std::string::npos) {
            const Reply head = parse_reply(got);
            const std::string len = head.header("Content-Length");
            if (len.empty() || got.size() >= end + 4 + std::strtoul(len.c_str(), nullptr, 10)) break;
        }
        pollfd p{fd, POLLIN, 0};
        if (left <= 0 || ::poll(&p, 1, (int)(left * 1000) + 1) <= 0) break;
        char buf[4096];
        const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
        if (n <= 0) break;
        got.append(buf, (size_t)n);
    }
    ::close(fd);
    Reply r = parse_reply(got);
    r.seconds = seconds_since(t0);
    return r;
}

inline std::string post(const std::string& path, const std::string& body, const std::string& extra_headers = "") {
    return "POST " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n" + extra_headers +
           "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
}

// The OpenAI error shape: {"error": {"message": str, "type": str, "param": str|null, "code": str|null}}.
// Returns "" when `body` has it, else what is wrong.
inline std::string error_shape_problem(const std::string& body) {
    json j;
    try {
        j = json::parse(body);
    } catch (const json::exception& e) {
        return std::string("not JSON: ") + e.what();
    }
    if (!j.is_object() || !j.contains("error") || !j["error"].is_object()) return "no \"error\" object";
    const json& e = j["error"];
    if (!e.contains("message") || !e["message"].is_string() || e["message"].get<std::string>().empty()) return "no message";
    if (!e.contains("type") || !e["type"].is_string()) return "no type";
    if (!e.contains("param") || !(e["param"].is_string() || e["param"].is_null())) return "no param (string or null)";
    if (!e.contains("code") || !(e["code"].is_string() || e["code"].is_null())) return "no code (string or null)";
    return "";
}

// Token ids of `n` random tokens after BOS (ids 3.. are ordinary pieces).
inline std::vector<int32_t> random_prompt(pkv_test::Rng& rng, int n) {
    std::vector<int32_t> p = {pkv::kBosId};
    for (int i = 1; i < n; ++i) p.push_back(3 + rng.below(builtin().model.cfg.vocab_size - 3));
    return p;
}

inline bool have_command(const std::string& name) { return pkv_test::run_command("command -v " + name + " >/dev/null 2>&1").second == 0; }

// Node.js and the official `openai` npm package in DIR/node_modules:
// npm-installed there once; false (with a skip saying why) without Node.js
// or npm, or when the registry is out of reach.
inline bool need_openai_npm(const std::string& dir) {
    if (!have_command("node") || !have_command("npm")) {
        pkv_test::skip(pkv_test::SkipKind::kProgram, "Node.js or npm not found: the openai npm client test needs both");
        return false;
    }
    const std::string pkg = "openai@6.49.0";
    if (pkv_test::file_exists(dir + "/node_modules/openai/package.json")) return true;
    const std::pair<std::string, int> inst = pkv_test::run_command("mkdir -p " + dir + " && timeout 120 npm install --prefix " + dir +
                                                                   " --no-audit --no-fund --no-save --fetch-retries=1 " + pkg + " 2>&1");
    if (inst.second == 0 && pkv_test::file_exists(dir + "/node_modules/openai/package.json")) return true;
    pkv_test::skip(pkv_test::SkipKind::kProgram, "npm install " + pkg + " failed (no registry?): " + inst.first.substr(0, 300));
    return false;
}


}  // namespace serve_test

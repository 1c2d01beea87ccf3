// examples/sse_client.hpp -- the client's side of a streamed completion: one
// POST, its server-sent events split into data and comments, and the moment
// each token arrived, as a client measures it. Plus a reader for the numbers
// in a Prometheus /metrics page. build/loadgen and tests/test_serve.cpp use it.
//
//   sse::Target t{"127.0.0.1", 8000};
//   sse::Stream s = sse::post_stream(t, "/v1/completions",
//                                    R"({"prompt": "Once", "max_tokens": 8, "stream": true})");
//   s.status, s.token_times, s.text, s.finish_reason, s.comments ...
//
// The wire format (the WHATWG HTML standard, "server-sent events"): lines;
// "data: x" appends x to the event's data; a blank line ends the event; a
// line starting with ':' is a comment that a client skips (serve marks
// preemption pauses with them). OpenAI streams one JSON object per event and
// ends with "data: [DONE]".
#pragma once

#include <httplib.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

namespace sse {

using Clock = std::chrono::steady_clock;

// Seconds on the steady clock: every time below is one of these.
inline double now() { return std::chrono::duration<double>(Clock::now().time_since_epoch()).count(); }

// ============================================================================
// 1. Bytes -> events
// ============================================================================

// Feeds arrive as the socket delivers them, cut anywhere (inside a line, a
// JSON object, a "\r\n"); the parser keeps the unfinished line between feeds.
class Parser {
public:
    // on_data(payload) for every event with data, on_comment(text) for
    // every comment line (without the ':').
    template <class OnData, class OnComment>
    void feed(std::string_view bytes, OnData&& on_data, OnComment&& on_comment) {
        for (char c : bytes) {
            if (skip_lf_ && c == '\n') {  // the '\n' of a "\r\n" already ended its line
                skip_lf_ = false;
                continue;
            }
            skip_lf_ = c == '\r';
            if (c != '\n' && c != '\r') {
                line_ += c;
                continue;
            }
            if (line_.empty()) {  // a blank line: the event is complete
                if (have_data_) on_data(data_);
                data_.clear();
                have_data_ = false;
            } else if (line_[0] == ':') {
                on_comment(line_.substr(line_[1] == ' ' ? 2 : 1));
            } else if (line_.compare(0, 5, "data:") == 0) {
                const size_t v = line_.size() > 5 && line_[5] == ' ' ? 6 : 5;
                if (have_data_) data_ += '\n';
                data_ += line_.substr(v);
                have_data_ = true;
            }  // other fields (event:, id:, retry:) are not used by OpenAI streams
            line_.clear();
        }
    }

private:
    std::string line_, data_;  // the line being read; the event's data so far
    bool have_data_ = false, skip_lf_ = false;
};

// ============================================================================
// 2. One streamed completion, as the client saw it
// ============================================================================

struct Target {
    std::string host = "127.0.0.1";
    int port = 8000;
    double read_timeout_s = 600;  // how long a silent stream is waited for (a pause can be long)
    double deadline_s = 0;        // how long the whole request may take; 0 = no limit
    int max_tokens = 0;           // more tokens than this in one stream is an error; 0 = no limit
};

struct Stream {
    int status = 0;                    // HTTP status; 0 = no response at all (error says why)
    std::string error;                 // why it failed: a transport error, the body of a non-200 answer, an error
                                       // event, a chunk we cannot read, too many tokens, a missing [DONE]
    std::string retry_after;           // the Retry-After header of a 429 / 503
    double sent = 0;                   // when the request was sent (now())
    std::vector<double> token_times;   // [tokens] when each token's chunk arrived
    std::vector<int32_t> token_ids;    // [tokens] when the server sends them (return_token_ids)
    std::vector<double> comment_times; // [comments] when each SSE comment arrived
    std::vector<std::string> comments; // [comments] their text ("pagedkv preempted", ...)
    std::string text;                  // the concatenated text (or chat content)
    std::string finish_reason;         // of the last chunk
    long prompt_tokens = -1, completion_tokens = -1;  // from a usage chunk, if one came
    bool done = false;                 // "data: [DONE]" arrived
    bool hung_up = false;              // we stopped reading early (stop_after_tokens)
    size_t chunks = 0;                 // data events received
};

// Reads one data payload of an OpenAI stream into `s`. A chunk that carries
// token_ids adds that many tokens; one without adds one token unless it is
// the final chunk (finish_reason set) with no text. Nothing a server sends
// is trusted: a field of the wrong type is an error that names it, never an
// exception. `max_tokens` > 0: a stream with more tokens is an error too.
inline void take_chunk(Stream& s, const std::string& payload, double t, int max_tokens = 0) {
    s.chunks++;
    if (payload == "[DONE]") {
        s.done = true;
        return;
    }
    if (!s.error.empty()) return;  // the first problem is the one reported
    using json = nlohmann::json;
    const std::string shown = payload.substr(0, 200);
    json j;
    try {
        j = json::parse(payload);
    } catch (const json::exception& e) {
        s.error = std::string("a chunk that is not JSON (") + e.what() + "): " + shown;
        return;
    }
    auto bad = [&](const std::string& what) { s.error = "a chunk with " + what + ": " + shown; };
    auto present = [](const json& o, const char* k) { return o.contains(k) && !o[k].is_null(); };
    if (!j.is_object()) return bad("no JSON object");
    if (j.contains("error")) {
        s.error = payload;
        return;
    }
    if (present(j, "usage")) {
        const json& u = j["usage"];
        if (!u.is_object()) return bad("a usage that is not an object");
        for (const char* k : {"prompt_tokens", "completion_tokens"})
            if (present(u, k) && !u[k].is_number_integer()) return bad(std::string("usage.") + k + " that is not an integer");
        if (present(u, "prompt_tokens")) s.prompt_tokens = u["prompt_tokens"].get<long>();
        if (present(u, "completion_tokens")) s.completion_tokens = u["completion_tokens"].get<long>();
    }
    if (!present(j, "choices")) return;
    if (!j["choices"].is_array()) return bad("choices that is not an array");
    if (j["choices"].empty()) return;
    const json& c = j["choices"][0];
    if (!c.is_object()) return bad("choices[0] that is not an object");
    std::string piece;
    if (present(c, "text")) {
        if (!c["text"].is_string()) return bad("a text that is not a string");
        piece = c["text"].get<std::string>();
    }
    if (present(c, "delta")) {
        if (!c["delta"].is_object()) return bad("a delta that is not an object");
        if (present(c["delta"], "content")) {
            if (!c["delta"]["content"].is_string()) return bad("a delta.content that is not a string");
            piece = c["delta"]["content"].get<std::string>();
        }
    }
    if (present(c, "finish_reason") && !c["finish_reason"].is_string()) return bad("a finish_reason that is not a string");
    if (present(c, "token_ids")) {
        if (!c["token_ids"].is_array()) return bad("token_ids that is not an array");
        for (const json& id : c["token_ids"])
            if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() > INT32_MAX)
                return bad("a token id that is not an integer in 0..2^31-1");
    }
    s.text += piece;
    const bool last = present(c, "finish_reason");
    if (last) s.finish_reason = c["finish_reason"].get<std::string>();
    if (present(c, "token_ids")) {
        for (const json& id : c["token_ids"]) {
            s.token_ids.push_back(id.get<int32_t>());
            s.token_times.push_back(t);
        }
    } else if (!last || !piece.empty()) {
        s.token_times.push_back(t);
    }
    if (max_tokens > 0 && (int)s.token_times.size() > max_tokens)
        s.error = "the server sent more than max_tokens (" + std::to_string(max_tokens) + ") tokens";
}

// POSTs `body` (JSON, with "stream": true) to `path` and reads the stream to
// its end, or until t.deadline_s, or until a chunk we cannot take (a wrong
// type, more than t.max_tokens tokens): then we hang up. stop_after_tokens
// >= 0: hang up after that many tokens, as a client that loses interest
// does. Never throws for what the server or the network does: every failure
// is a status and a reason in `error`.
inline Stream post_stream(const Target& t, const std::string& path, const std::string& body, int stop_after_tokens = -1) {
    Stream s;
    httplib::Client cli(t.host, t.port);
    cli.set_connection_timeout(10, 0);
    cli.set_read_timeout((time_t)t.read_timeout_s, (time_t)((t.read_timeout_s - (double)(time_t)t.read_timeout_s) * 1e6));
    cli.set_write_timeout(10, 0);
    httplib::Request req;
    req.method = "POST";
    req.path = path;
    req.body = body;
    req.set_header("Content-Type", "application/json");
    req.set_header("Accept", "text/event-stream");
    Parser parser;
    bool gave_up = false;  // we stopped reading: a chunk we could not take
    req.response_handler = [&](const httplib::Response& r) {
        s.status = r.status;
        s.retry_after = r.get_header_value("Retry-After");
        return true;
    };
    req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
        if (s.status != 200) {  // an error answer: keep (the start of) its body
            s.error.append(data, std::min(n, (size_t)65536 - std::min(s.error.size(), (size_t)65536)));
            return true;
        }
        const double at = now();
        parser.feed(std::string_view(data, n), [&](const std::string& payload) { take_chunk(s, payload, at, t.max_tokens); },
                    [&](const std::string& comment) {
                        s.comments.push_back(comment);
                        s.comment_times.push_back(at);
                    });
        if (!s.error.empty()) {
            gave_up = true;
            return false;  // cpp-httplib closes the connection
        }
        if (stop_after_tokens >= 0 && (int)s.token_times.size() >= stop_after_tokens) {
            s.hung_up = true;
            return false;
        }
        return true;
    };
    // The whole request's deadline: a watchdog stops the client from its own
    // thread (cpp-httplib's stop() shuts the socket down), however the server
    // trickles its bytes (the read timeout bounds only a silence).
    std::mutex m;
    std::condition_variable cv;
    bool finished = false, expired = false;
    std::thread watchdog;
    if (t.deadline_s > 0)
        watchdog = std::thread([&] {
            std::unique_lock<std::mutex> lk(m);
            if (cv.wait_for(lk, std::chrono::duration<double>(t.deadline_s), [&] { return finished; })) return;
            expired = true;
            lk.unlock();
            cli.stop();
        });
    s.sent = now();
    const httplib::Result res = cli.send(req);
    {
        std::lock_guard<std::mutex> lk(m);
        finished = true;
    }
    cv.notify_all();
    if (watchdog.joinable()) watchdog.join();
    const std::string got = " after " + std::to_string(s.token_times.size()) + " tokens";
    if (expired && !s.done)
        s.error = "the request's deadline passed (" + std::to_string((long)std::ceil(t.deadline_s)) + " s, --deadline)" + got;
    else if (gave_up || s.hung_up || !s.error.empty()) {
    } else if (!res && s.status == 0)
        s.error = "no answer: " + httplib::to_string(res.error());
    else if (!res && !s.done)
        s.error = "the stream broke off: " + httplib::to_string(res.error()) + got;
    else if (s.status == 200 && !s.done)
        s.error = "the stream ended without data: [DONE]" + got;
    return s;
}

// ============================================================================
// 3. Reading /metrics
// ============================================================================
//
// Just enough of the Prometheus text format for our own pages: a sample line
// is `name{labels} value`. value() finds a sample by its name and label text
// ("" = no labels); buckets() reads a histogram's cumulative buckets.

struct Sample {
    std::string name, labels;  // labels as written, with braces ("" if none)
    double value = 0;
};

inline std::vector<Sample> samples(const std::string& text) {
    std::vector<Sample> out;
    size_t pos = 0;
    while (pos < text.size()) {
        size_t end = text.find('\n', pos);
        if (end == std::string::npos) end = text.size();
        const std::string line = text.substr(pos, end - pos);
        pos = end + 1;
        if (line.empty() || line[0] == '#') continue;
        const size_t sp = line.rfind(' ');
        if (sp == std::string::npos) continue;
        Sample s;
        const std::string key = line.substr(0, sp);
        const size_t brace = key.find('{');
        s.name = key.substr(0, brace);
        s.labels = brace == std::string::npos ? "" : key.substr(brace);
        char* e = nullptr;
        s.value = std::strtod(line.c_str() + sp + 1, &e);
        out.push_back(s);
    }
    return out;
}

// A label text, {a="x",b="y"} or a="x",b="y", as its pairs: a="x" and b="y".
inline std::vector<std::string> label_pairs(const std::string& labels) {
    std::vector<std::string> out;
    std::string cur;
    bool quoted = false;
    for (size_t i = 0; i < labels.size(); ++i) {
        const char c = labels[i];
        if (c == '"' && (i == 0 || labels[i - 1] != '\\')) quoted = !quoted;
        if (!quoted && (c == '{' || c == '}')) continue;
        if (!quoted && c == ',') {
            if (!cur.empty()) out.push_back(cur);
            cur.clear();
            continue;
        }
        cur += c;
    }
    if (!cur.empty()) out.push_back(cur);
    return out;
}

// The value of `name` over the samples whose labels include every pair of
// `labels` ("" = any), summed: metric("pagedkv:request_success_total",
// "finished_reason=\"stop\"") whatever other labels (model_name) a server
// adds. `missing` when the page has none.
inline double value(const std::vector<Sample>& page, const std::string& name, const std::string& labels = "", double missing = -1) {
    const std::vector<std::string> want = label_pairs(labels);
    double sum = 0;
    bool found = false;
    for (const Sample& s : page) {
        if (s.name != name) continue;
        const std::vector<std::string> have = label_pairs(s.labels);
        bool all = true;
        for (const std::string& w : want) all = all && std::find(have.begin(), have.end(), w) != have.end();
        if (!all) continue;
        sum += s.value;
        found = true;
    }
    return found ? sum : missing;
}

// A histogram's buckets as (upper bound, cumulative count), +Inf last.
inline std::vector<std::pair<double, double>> buckets(const std::vector<Sample>& page, const std::string& name) {
    std::vector<std::pair<double, double>> out;
    for (const Sample& s : page) {
        if (s.name != name + "_bucket") continue;
        const size_t q = s.labels.find("le=\"");
        if (q == std::string::npos) continue;
        const std::string le = s.labels.substr(q + 4, s.labels.find('"', q + 4) - q - 4);
        out.push_back({le == "+Inf" ? HUGE_VAL : std::strtod(le.c_str(), nullptr), s.value});
    }
    return out;
}

}  // namespace sse

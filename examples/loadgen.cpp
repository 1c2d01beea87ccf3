// examples/loadgen.cpp -- overload a server from the outside and measure what
// its clients feel, like vLLM's benchmark_serving: N streaming requests, all at
// once or arriving as a Poisson process, each on its own connection, timed by
// the client:
//
//   TTFT           time to first token: request sent -> first token's chunk
//   ITL            inter-token latency: the gap between two chunks of a stream
//   longest pause  the largest gap of each stream: one preemption's whole pause
//   429s, retries  requests the server shed at the edge, and how often we retried
//
// and then the same run from the server's side: two scrapes of /metrics (before
// and after) give the preemptions, the recomputed tokens and the server's own
// inter-token latency histogram for exactly this run.
//
//   build/serve --port 8000 &
//   build/loadgen --port 8000                     (make run's workload: 24 x (32 + 96) tokens)
//   build/loadgen --port 8000 --rate 20 --requests 100 --json
//   build/loadgen --port 8000 --svg build/itl.svg   (the chart: a cliff at each pause)
//
// Works against any OpenAI-compatible server; the comments ": pagedkv
// preempted" and the /metrics section are pagedkv's. A server that misbehaves
// (a chunk of the wrong shape, a stream that never ends or ends without
// [DONE]) fails its request, with the reason printed, never loadgen itself.
#include <httplib.h>
#include <nlohmann/json.hpp>

#include <signal.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "examples/cli.hpp"
#include "examples/sse_client.hpp"
#include "examples/svg.hpp"
#include "tiny_model/builtin.hpp"

namespace {

struct Options {
    std::string host = "127.0.0.1", svg_path, model;
    int port = 8000;
    bool chat = false;
    int requests = 24, prompt_words = 31, max_tokens = 96, retries = 0;
    double rate = 0;  // requests per second; 0 = all at once
    double temperature = 0, timeout = 600, deadline = 600;
    uint64_t seed = 1;
    bool ignore_eos = true, token_ids = true, json = false;
};

Options parse(int argc, char** argv) {
    Options o;
    cli::Parser p("loadgen", "[options]",
                  "Streaming requests against an OpenAI-compatible server (build/serve), timed from the client's side.");
    p.text("--host", &o.host, "ADDR", "server address");
    p.integer("--port", &o.port, 1, 65535, "server port");
    p.choice("--endpoint", &o.chat, {{"completions", false}, {"chat", true}}, "/v1/completions or /v1/chat/completions");
    p.text("--model", &o.model, "NAME", "the model field to send (default: none, the server's only model)");
    p.integer("--requests", &o.requests, 1, 4096, "requests, each on its own connection and thread");
    p.real("--rate", &o.rate, 0, 1e6, "arrivals per second, a Poisson process; 0 = all at once");
    p.integer("--prompt-words", &o.prompt_words, 1, 100000, "prompt words per request (the built-in model: one token each, after BOS)");
    p.integer("--max-tokens", &o.max_tokens, 1, 1 << 20, "output tokens per request");
    p.on_off("--ignore-eos", &o.ignore_eos, "generate exactly --max-tokens (vLLM's ignore_eos; turn off for a server without it)");
    p.on_off("--token-ids", &o.token_ids, "ask for token ids in each chunk (return_token_ids) to count tokens exactly");
    p.real("--temperature", &o.temperature, 0, 2, "0 = greedy; request i is seeded with --seed * 7919 + i");
    p.integer("--seed", &o.seed, 0, std::numeric_limits<int64_t>::max(), "prompts, arrivals and sampling seeds");
    p.integer("--retries", &o.retries, 0, 100, "retries of a request answered 429 (after its Retry-After)");
    p.real("--timeout", &o.timeout, 1, 86400, "seconds a stream may stay silent before we give up on it");
    p.real("--deadline", &o.deadline, 0.1, 86400, "seconds a whole request may take, however its bytes come; then we give up on it");
    p.flag("--json", &o.json, "one JSON object on stdout (summary + every request), nothing else");
    p.text("--svg", &o.svg_path, "FILE", "write the chart: inter-token gaps over time, and a few streams' progress");
    p.parse(argc, argv);
    return o;
}

// Request i's prompt: words of the built-in vocabulary, drawn with the seed.
// Any tokenizer can encode them (a checkpoint's BPE splits them further).
std::string prompt_text(const Options& o, int i) {
    const int n = (int)(sizeof(pkv::kBuiltinWords) / sizeof(pkv::kBuiltinWords[0]));
    uint64_t rng = o.seed * 1000003 + (uint64_t)i;
    std::string s;
    for (int w = 0; w < o.prompt_words; ++w) s += (w ? " " : "") + std::string(pkv::kBuiltinWords[pkv::splitmix64(rng) % n]);
    return s;
}

std::string request_body(const Options& o, int i) {
    nlohmann::ordered_json j;
    if (!o.model.empty()) j["model"] = o.model;
    if (o.chat) j["messages"] = nlohmann::ordered_json::array({{{"role", "user"}, {"content", prompt_text(o, i)}}});
    else j["prompt"] = prompt_text(o, i);
    j["max_tokens"] = o.max_tokens;
    j["temperature"] = o.temperature;
    j["seed"] = (int64_t)((o.seed * 7919 + (uint64_t)i) & (uint64_t)INT64_MAX);
    j["stream"] = true;
    if (o.ignore_eos) j["ignore_eos"] = true;
    if (o.token_ids) j["return_token_ids"] = true;
    return j.dump();
}

// One request from the client's side, retries included.
struct Result {
    sse::Stream last;      // the last attempt
    double first_sent = 0; // the first attempt's send time
    int shed = 0;          // attempts answered 429
    int retries = 0;
    bool ok() const { return last.status == 200 && last.done && last.error.empty(); }
};

Result run_one(const Options& o, const sse::Target& t, int i) {
    Result r;
    const std::string path = o.chat ? "/v1/chat/completions" : "/v1/completions";
    const std::string body = request_body(o, i);
    for (int attempt = 0;; ++attempt) {
        r.last = sse::post_stream(t, path, body);
        if (attempt == 0) r.first_sent = r.last.sent;
        if (r.last.status != 429) break;
        r.shed++;
        if (attempt >= o.retries) break;
        r.retries++;
        // Wait as the server asks, at most 10 s. Retry-After may also be an
        // HTTP date, or garbage: anything but a number of seconds waits 1 s.
        double wait = 1.0;  // to_real leaves it alone unless it reads a number in range
        cli::to_real(r.last.retry_after.c_str(), 0.0, 1e9, wait);
        wait = std::min(10.0, wait);
        std::this_thread::sleep_for(std::chrono::duration<double>(wait));
    }
    return r;
}

// Nearest-rank percentile, as metrics.hpp computes them (0 when empty).
double pct(std::vector<double> v, double p) {
    if (v.empty()) return 0;
    std::sort(v.begin(), v.end());
    const size_t rank = (size_t)std::ceil(p / 100.0 * (double)v.size());
    return v[std::min(v.size(), std::max<size_t>(rank, 1)) - 1];
}

// The upper bound of the histogram bucket holding the p-th percentile of the
// samples added between two scrapes: a server-side ITL p99 "<= x s".
double bucket_percentile(const std::vector<std::pair<double, double>>& before, const std::vector<std::pair<double, double>>& after,
                         double p) {
    if (after.empty()) return -1;
    const double total = after.back().second - (before.empty() ? 0 : before.back().second);
    if (total <= 0) return -1;
    for (size_t k = 0; k < after.size(); ++k) {
        const double c = after[k].second - (k < before.size() ? before[k].second : 0);
        if (c >= p / 100.0 * total) return after[k].first;
    }
    return after.back().first;
}

std::vector<sse::Sample> scrape(const sse::Target& t) {
    httplib::Client cli(t.host, t.port);
    cli.set_connection_timeout(5, 0);
    cli.set_read_timeout(30, 0);
    const httplib::Result r = cli.Get("/metrics");
    if (!r || r->status != 200) return {};
    return sse::samples(r->body);
}

std::string ms(double s) {
    char b[32];
    std::snprintf(b, sizeof b, "%.1f ms", 1e3 * s);
    return b;
}

void write_chart(const Options& o, const std::vector<Result>& rs, double t0, double t1) {
    // Chart 1: every inter-token gap, binned by when it ended: the largest
    // and the median gap of each bin. A pause stands up as a cliff.
    const int bins = 80;
    const double w = std::max(1e-3, (t1 - t0) / bins);
    std::vector<std::vector<double>> gaps(bins);
    for (const Result& r : rs)
        for (size_t k = 1; k < r.last.token_times.size(); ++k) {
            const double end = r.last.token_times[k] - t0;
            const double g = r.last.token_times[k] - r.last.token_times[k - 1];
            if (g <= 0) continue;  // tokens of one chunk
            gaps[(size_t)std::min(bins - 1, std::max(0, (int)(end / w)))].push_back(1e3 * g);
        }
    svg::Chart c1;
    c1.title = "inter-token gaps as the clients saw them (" + std::to_string(rs.size()) + " streams)";
    c1.x_label = "seconds since the first request";
    c1.y_label = "gap (ms)";
    svg::Series mx{"largest gap in the bin", {}, {}}, med{"median gap in the bin", {}, {}};
    med.markers = false;  // the largest gaps keep their dots: a pause is one bin
    for (int b = 0; b < bins; ++b) {
        if (gaps[b].empty()) continue;
        mx.x.push_back((b + 0.5) * w);
        mx.y.push_back(*std::max_element(gaps[b].begin(), gaps[b].end()));
        med.x.push_back((b + 0.5) * w);
        med.y.push_back(pct(gaps[b], 50));
    }
    c1.series = {mx, med};
    // Chart 2: tokens received over time by a few streams; a pause is a flat step.
    svg::Chart c2;
    c2.title = "tokens received over time: the streams with the longest pauses";
    c2.x_label = "seconds since the first request";
    c2.y_label = "tokens received";
    std::vector<std::pair<double, size_t>> by_pause;
    for (size_t i = 0; i < rs.size(); ++i) {
        double g = 0;
        const auto& tt = rs[i].last.token_times;
        for (size_t k = 1; k < tt.size(); ++k) g = std::max(g, tt[k] - tt[k - 1]);
        by_pause.push_back({g, i});
    }
    std::sort(by_pause.rbegin(), by_pause.rend());
    for (size_t k = 0; k < std::min<size_t>(4, by_pause.size()); ++k) {
        const size_t i = by_pause[k].second;
        svg::Series s{"request " + std::to_string(i), {}, {}};
        s.steps = true;
        s.markers = false;
        for (size_t n = 0; n < rs[i].last.token_times.size(); ++n) {
            s.x.push_back(rs[i].last.token_times[n] - t0);
            s.y.push_back((double)(n + 1));
        }
        c2.series.push_back(s);
    }
    svg::Figure fig;
    fig.add(c1);
    fig.add(c2);
    std::string err;
    if (!fig.write(o.svg_path, &err)) throw std::runtime_error(err);
}

int run(int argc, char** argv) {
    const Options o = parse(argc, argv);
    ::signal(SIGPIPE, SIG_IGN);  // a server that hangs up must not kill us
    // Each stream is bounded three ways: a silence (--timeout), its whole
    // time (--deadline) and its tokens (more than --max-tokens is an error:
    // a server that streams past max_tokens never ends otherwise).
    sse::Target t{o.host, o.port, o.timeout, o.deadline, o.max_tokens};

    // Arrival times: all at once, or exponential gaps of mean 1/rate.
    std::vector<double> arrival(o.requests, 0.0);
    uint64_t rng = o.seed ^ 0x9e3779b97f4a7c15ull;
    for (int i = 1; i < o.requests && o.rate > 0; ++i) arrival[i] = arrival[i - 1] - std::log(1.0 - pkv::uniform01(rng)) / o.rate;

    {
        // A server that is not there is one clear line, not a table of failures.
        httplib::Client cli(t.host, t.port);
        cli.set_connection_timeout(5, 0);
        cli.set_read_timeout(30, 0);
        if (!cli.Get("/v1/models"))
            throw std::runtime_error("no server answers at http://" + o.host + ":" + std::to_string(o.port) +
                                     " (start one: build/serve --port " + std::to_string(o.port) + ")");
    }
    const std::vector<sse::Sample> before = scrape(t);
    std::vector<Result> rs(o.requests);
    std::vector<std::thread> threads;
    const double t0 = sse::now();
    for (int i = 0; i < o.requests; ++i) {
        const double wait = t0 + arrival[i] - sse::now();
        if (wait > 0) std::this_thread::sleep_for(std::chrono::duration<double>(wait));
        threads.emplace_back([&, i] {
            // Nothing a request meets may end the whole run (an exception
            // escaping a thread would abort it): it fails that request alone.
            try {
                rs[i] = run_one(o, t, i);
            } catch (const std::exception& e) {
                rs[i].last.error = std::string("loadgen could not run it: ") + e.what();
            }
        });
    }
    for (std::thread& th : threads) th.join();
    const double t1 = sse::now();
    const std::vector<sse::Sample> after = scrape(t);

    // ---- the client's numbers ----
    std::vector<double> ttft, itl, longest, e2e;
    long tokens = 0, shed = 0, retries = 0, preempt_comments = 0;
    int ok = 0, failed = 0, paused_streams = 0;
    for (const Result& r : rs) {
        shed += r.shed;
        retries += r.retries;
        if (!r.ok()) {
            ++failed;
            continue;
        }
        ++ok;
        const auto& tt = r.last.token_times;
        tokens += (long)tt.size();
        if (!tt.empty()) ttft.push_back(tt.front() - r.last.sent);
        double g_max = 0;
        for (size_t k = 1; k < tt.size(); ++k) {
            itl.push_back(tt[k] - tt[k - 1]);
            g_max = std::max(g_max, tt[k] - tt[k - 1]);
        }
        longest.push_back(g_max);
        if (!tt.empty()) e2e.push_back(tt.back() - r.first_sent);
        long p = 0;
        for (const std::string& c : r.last.comments) p += c == "pagedkv preempted";
        preempt_comments += p;
        paused_streams += p > 0;
    }
    const double wall = t1 - t0;

    // ---- the server's numbers for this run (two scrapes) ----
    const bool have_metrics = !before.empty() && !after.empty();
    auto delta = [&](const char* name) { return sse::value(after, name) - sse::value(before, name); };
    const char* itl_name = "pagedkv:inter_token_latency_seconds";
    const double srv_p50 = have_metrics ? bucket_percentile(sse::buckets(before, itl_name), sse::buckets(after, itl_name), 50) : -1;
    const double srv_p99 = have_metrics ? bucket_percentile(sse::buckets(before, itl_name), sse::buckets(after, itl_name), 99) : -1;

    if (o.json) {
        nlohmann::ordered_json j;
        j["config"] = {{"host", o.host}, {"port", o.port}, {"endpoint", o.chat ? "chat" : "completions"}, {"requests", o.requests},
                       {"rate", o.rate}, {"prompt_words", o.prompt_words}, {"max_tokens", o.max_tokens}, {"ignore_eos", o.ignore_eos},
                       {"temperature", o.temperature}, {"seed", o.seed}, {"retries", o.retries}};
        j["summary"] = {{"ok", ok}, {"failed", failed}, {"shed_429", shed}, {"retries", retries}, {"tokens", tokens},
                        {"wall_s", wall}, {"ttft_p50_s", pct(ttft, 50)}, {"ttft_p90_s", pct(ttft, 90)}, {"ttft_p99_s", pct(ttft, 99)},
                        {"ttft_max_s", pct(ttft, 100)}, {"itl_p50_s", pct(itl, 50)}, {"itl_p90_s", pct(itl, 90)},
                        {"itl_p99_s", pct(itl, 99)}, {"itl_max_s", pct(itl, 100)}, {"longest_pause_p50_s", pct(longest, 50)},
                        {"longest_pause_max_s", pct(longest, 100)}, {"e2e_p50_s", pct(e2e, 50)}, {"e2e_p99_s", pct(e2e, 99)},
                        {"preempted_comments", preempt_comments}, {"paused_streams", paused_streams}};
        if (have_metrics)
            j["server"] = {{"num_preemptions", delta("pagedkv:num_preemptions_total")},
                           {"recomputed_tokens", delta("pagedkv:recomputed_tokens_total")},
                           {"generation_tokens", delta("pagedkv:generation_tokens_total")},
                           {"itl_p50_bucket_s", srv_p50}, {"itl_p99_bucket_s", srv_p99}};
        nlohmann::ordered_json reqs = nlohmann::ordered_json::array();
        for (size_t i = 0; i < rs.size(); ++i) {
            const Result& r = rs[i];
            const auto& tt = r.last.token_times;
            double g_max = 0;
            for (size_t k = 1; k < tt.size(); ++k) g_max = std::max(g_max, tt[k] - tt[k - 1]);
            long p = 0;
            for (const std::string& c : r.last.comments) p += c == "pagedkv preempted";
            reqs.push_back({{"id", i}, {"status", r.last.status}, {"ok", r.ok()}, {"shed_429", r.shed}, {"tokens", tt.size()},
                            {"ttft_s", tt.empty() ? -1.0 : tt.front() - r.last.sent}, {"longest_pause_s", g_max},
                            {"preempted", p}, {"finish_reason", r.last.finish_reason}, {"error", r.last.error}});
        }
        j["requests"] = reqs;
        // (replace: a server's bytes in an error may be invalid UTF-8)
        std::printf("%s\n", j.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace).c_str());
    } else {
        std::printf("loadgen: %d streaming requests to http://%s:%d%s, %s; %d-word prompts, %d output tokens each%s\n", o.requests,
                    o.host.c_str(), o.port, o.chat ? "/v1/chat/completions" : "/v1/completions",
                    o.rate > 0 ? ("Poisson arrivals at " + cli::number_text(o.rate) + "/s").c_str() : "all at once", o.prompt_words,
                    o.max_tokens, o.ignore_eos ? " (ignore_eos)" : "");
        std::printf("  requests        %d completed, %d not (%ld answers were 429, %ld retried)\n", ok, failed, shed, retries);
        std::printf("  tokens          %ld received in %.2f s (%.0f tokens/s)\n", tokens, wall, tokens / std::max(wall, 1e-9));
        std::printf("  TTFT            p50 %s  p90 %s  p99 %s  max %s\n", ms(pct(ttft, 50)).c_str(), ms(pct(ttft, 90)).c_str(),
                    ms(pct(ttft, 99)).c_str(), ms(pct(ttft, 100)).c_str());
        std::printf("  ITL             p50 %s  p90 %s  p99 %s  max %s  (p99 = %.1fx p50)\n", ms(pct(itl, 50)).c_str(),
                    ms(pct(itl, 90)).c_str(), ms(pct(itl, 99)).c_str(), ms(pct(itl, 100)).c_str(),
                    pct(itl, 50) > 0 ? pct(itl, 99) / pct(itl, 50) : 0.0);
        std::printf("  longest pause   per stream: p50 %s  max %s\n", ms(pct(longest, 50)).c_str(), ms(pct(longest, 100)).c_str());
        std::printf("  preempted       %d streams paused (%ld \": pagedkv preempted\" comments)\n", paused_streams, preempt_comments);
        if (have_metrics) {
            std::printf("the server's /metrics for this run (after - before):\n");
            std::printf("  num_preemptions_total     +%.0f\n", delta("pagedkv:num_preemptions_total"));
            std::printf("  recomputed_tokens_total   +%.0f\n", delta("pagedkv:recomputed_tokens_total"));
            std::printf("  generation_tokens_total   +%.0f\n", delta("pagedkv:generation_tokens_total"));
            std::printf("  inter_token_latency       p50 <= %s, p99 <= %s (histogram buckets)\n", ms(srv_p50).c_str(), ms(srv_p99).c_str());
        } else {
            std::printf("(no pagedkv metrics at /metrics)\n");
        }
        for (size_t i = 0, shown = 0; i < rs.size() && shown < 3; ++i)
            if (!rs[i].ok() && rs[i].last.status != 429) {
                std::printf("  request %zu failed: status %d: %s\n", i, rs[i].last.status, rs[i].last.error.substr(0, 200).c_str());
                ++shown;
            }
    }
    if (!o.svg_path.empty()) write_chart(o, rs, t0, t1);
    // A 429 is an answer (the server shed the request, as it may); a stream
    // that broke or never came is a failure.
    int broken = 0;
    for (const Result& r : rs) broken += !r.ok() && r.last.status != 429;
    return broken == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) { return cli::guarded_main("loadgen", [&] { return run(argc, argv); }); }

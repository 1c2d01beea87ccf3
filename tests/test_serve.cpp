// tests/test_serve.cpp -- build/serve seen from its clients, over real HTTP on
// 127.0.0.1 (the "serve" suite). Each test starts its own server on a free
// port (--port 0), talks to it, and stops it with SIGTERM, checking a clean
// exit and no sanitizer report. Every wait is bounded.
//
//   - streamed tokens equal the in-process engine's for the same requests,
//     greedy and seeded sampling, streamed and not, text and token-id prompts;
//   - a run that preempts: every stream pauses (the client sees the gap and
//     the server's ": pagedkv preempted" comment) and loses nothing;
//   - a client that hangs up aborts its request and its blocks are freed;
//   - shedding: 429 + Retry-After while the engine is busy with a step;
//   - a table of bad HTTP input, each a 4xx with an OpenAI-style error body,
//     while another client's stream runs on, unaffected;
//   - /metrics passes `promtool check metrics` (when promtool is here);
//   - clients no one here wrote: curl -N, and the official `openai` npm
//     package (skipped, saying why, without Node/npm or the registry);
//   - openai_api.hpp on its own: defaults, the chat template, stop strings.
#include "tests/serve_util.hpp"

using namespace serve_test;

TEST_SUITE("serve") {

// ---------------------------------------------------------------------------
// openai_api.hpp without a server
// ---------------------------------------------------------------------------

TEST_CASE("openai_api: defaults, the chat template, the context check, stop strings held back") {
    const pkv::Tokenizer& tok = builtin().tok;
    openai::Limits lim;
    lim.model_id = "built-in";
    lim.vocab_size = tok.size();
    lim.max_model_len = 64;
    // OpenAI's defaults: temperature 1, top_p 1, max_tokens 16 (completions),
    // the rest of the context (chat); the seed comes from the caller.
    const openai::Request c = openai::parse_request(R"({"prompt": "the cat"})", false, lim, tok, 77);
    CHECK(c.params.temperature == 1.0f);
    CHECK(c.params.top_p == 1.0f);
    CHECK(c.params.max_tokens == 16);
    CHECK(c.params.seed == 77);
    const std::vector<int> the_cat = tok.encode("the cat", true);
    CHECK(c.prompt == std::vector<int32_t>(the_cat.begin(), the_cat.end()));
    // The chat template: contents joined with "\n", encoded with BOS.
    const openai::Request ch = openai::parse_request(
        R"({"messages": [{"role": "system", "content": "the cat"}, {"role": "user", "content": "sat"}]})", true, lim, tok, 1);
    const std::vector<int> want = tok.encode("the cat\nsat", true);
    CHECK(ch.prompt == std::vector<int32_t>(want.begin(), want.end()));
    CHECK(ch.params.max_tokens == 64 - (int)want.size());
    // A negative seed is its 64-bit pattern; token ids are used as given.
    const openai::Request ids = openai::parse_request(R"({"prompt": [1, 5, 7], "seed": -1, "max_tokens": 61})", false, lim, tok, 0);
    CHECK(ids.prompt == std::vector<int32_t>{1, 5, 7});
    CHECK(ids.params.seed == ~0ull);
    // 3 + 61 = 64 fits; 3 + 62 does not, and the message says what would.
    try {
        openai::parse_request(R"({"prompt": [1, 5, 7], "max_tokens": 62})", false, lim, tok, 0);
        FAIL("max_tokens past the context was accepted");
    } catch (const openai::ApiError& e) {
        CHECK(e.status == 400);
        CHECK(e.code == "context_length_exceeded");
        CHECK(e.param == "max_tokens");
        CHECK(std::string(e.what()).find("ask for at most 61") != std::string::npos);
    }

    // Stop strings: the text before the stop string is returned, the stop
    // string is not, and a tail that might become one is held back until
    // the next token decides. These pieces of the built-in vocabulary are
    // words with a leading space.
    const int the = tok.lookup(" the"), cat = tok.lookup(" cat"), garden = tok.lookup(" garden");
    REQUIRE((the >= 0 && cat >= 0 && garden >= 0));
    openai::TextStream ts(tok, 5, {" cat garden", "xyz"});
    CHECK(ts.add(the) == " the");
    CHECK(ts.add(cat) == "");  // " cat" may be the start of " cat garden": held back
    CHECK(ts.add(the) == " cat the");  // it was not
    CHECK(ts.add(cat) == "");
    CHECK(ts.add(garden) == "");  // " cat garden": stop; nothing of it is returned
    CHECK(ts.stopped());
    CHECK(ts.text() == " the cat the");
    CHECK(ts.add(the) == "");  // nothing after a stop
    // Without stop strings nothing is ever held back; EOS renders as nothing.
    openai::TextStream plain(tok, 5, {});
    CHECK(plain.add(cat) == " cat");
    CHECK(plain.add(pkv::kEosId) == "");
}

// ---------------------------------------------------------------------------
// What the engine computes is what the client receives
// ---------------------------------------------------------------------------

TEST_CASE("streamed tokens equal the in-process engine's: greedy and seeded sampling, streamed or not") {
    SigpipeGuard guard;
    ServeProcess srv({});
    if (!srv.running()) return;
    pkv_test::Rng rng(19);
    std::vector<Req> reqs;
    for (int i = 0; i < 6; ++i) {
        Req r;
        r.prompt = random_prompt(rng, 8 + 5 * i);
        r.params.max_tokens = 24 + 4 * i;
        r.params.temperature = i < 3 ? 0.0f : 0.8f;  // three greedy, three sampled
        r.params.top_p = i == 5 ? 0.9f : 1.0f;
        r.params.seed = 1000 + (uint64_t)i;
        r.params.ignore_eos = i != 2;  // one may stop on EOS
        reqs.push_back(r);
    }
    // A text prompt too: the server's tokenizer is the reference's.
    Req text;
    const std::string words = "once upon a time the little cat";
    const std::vector<int> enc = builtin().tok.encode(words, true);
    text.prompt.assign(enc.begin(), enc.end());
    text.params.max_tokens = 20;
    text.params.temperature = 0.5f;
    text.params.seed = 42;
    reqs.push_back(text);
    const workload::Setup setup;  // the server's defaults: make run's engine
    const std::vector<std::vector<int32_t>> want = reference(setup, reqs);

    // All at once, each on its own connection: they share batches on the
    // server, which must not change a single token.
    std::vector<sse::Stream> got(reqs.size());
    std::vector<std::thread> th;
    for (size_t i = 0; i < reqs.size(); ++i)
        th.emplace_back([&, i] {
            const bool is_text = i + 1 == reqs.size();
            got[i] = sse::post_stream(target(srv), "/v1/completions", body_for(reqs[i], true, false, is_text ? words : ""));
        });
    for (std::thread& t : th) t.join();
    for (size_t i = 0; i < reqs.size(); ++i) {
        CAPTURE(i);
        CHECK(got[i].status == 200);
        CHECK(got[i].error == "");
        CHECK(got[i].done);
        CHECK(got[i].token_ids == want[i]);
        CHECK(got[i].text == expected_text(reqs[i].prompt, want[i]));
        CHECK(got[i].finish_reason == ((int)want[i].size() < reqs[i].params.max_tokens ? "stop" : "length"));
    }
    // Not streamed: one body with the same tokens, text and usage counts.
    httplib::Client cli("127.0.0.1", srv.port());
    cli.set_read_timeout(60, 0);
    const httplib::Result r = cli.Post("/v1/completions", body_for(reqs[3], false), "application/json");
    REQUIRE(r);
    CHECK(r->status == 200);
    const json j = json::parse(r->body);
    CHECK(j["object"] == "text_completion");
    CHECK(j["choices"][0]["token_ids"].get<std::vector<int32_t>>() == want[3]);
    CHECK(j["choices"][0]["text"] == expected_text(reqs[3].prompt, want[3]));
    CHECK(j["usage"]["prompt_tokens"] == reqs[3].prompt.size());
    CHECK(j["usage"]["completion_tokens"] == want[3].size());
    CHECK(j["usage"]["total_tokens"] == reqs[3].prompt.size() + want[3].size());
    // Chat, streamed: the template's prompt, chunks in chat's shape.
    Req chat = text;
    const sse::Stream cs = sse::post_stream(target(srv), "/v1/chat/completions", body_for(chat, true, true, words));
    CHECK(cs.status == 200);
    CHECK(cs.token_ids == want.back());
    CHECK(cs.text == expected_text(chat.prompt, want.back()));
    // stream_options.include_usage: one more chunk before [DONE], with the counts.
    json uj = json::parse(body_for(reqs[4], true));
    uj["stream_options"] = {{"include_usage", true}};
    const sse::Stream us = sse::post_stream(target(srv), "/v1/completions", uj.dump());
    CHECK(us.token_ids == want[4]);
    CHECK(us.prompt_tokens == (long)reqs[4].prompt.size());
    CHECK(us.completion_tokens == (long)want[4].size());
    // A stop string: the text ends before it, and the request is aborted
    // (the engine would have gone on to max_tokens).
    const std::string full = expected_text(reqs[0].prompt, want[0]);
    const size_t cut = full.find(' ', full.size() / 2);
    REQUIRE(cut != std::string::npos);
    const std::string stop = full.substr(cut, 4);
    json sj = json::parse(body_for(reqs[0], true));
    sj["stop"] = stop;
    const sse::Stream ss = sse::post_stream(target(srv), "/v1/completions", sj.dump());
    CHECK(ss.status == 200);
    CHECK(ss.finish_reason == "stop");
    CHECK(ss.text == full.substr(0, full.find(stop)));
    srv.stop();
}

TEST_CASE("a run that preempts: the client's streams pause and lose nothing") {
    SigpipeGuard guard;
    // 12 blocks of 8 tokens for 8 requests growing to 56 tokens each: the
    // scheduler must preempt. A short delay per step makes one step's gap
    // a measurable unit on any machine.
    workload::Setup setup;
    setup.num_blocks = 12;
    setup.block_size = 8;
    setup.max_num_seqs = 8;
    ServeProcess srv({"--num-blocks", "12", "--block-size", "8", "--max-num-seqs", "8", "--step-delay-ms", "3"});
    if (!srv.running()) return;
    pkv_test::Rng rng(7);
    std::vector<Req> reqs;
    for (int i = 0; i < 8; ++i) {
        Req r;
        r.prompt = random_prompt(rng, 16);
        r.params.max_tokens = 40;
        r.params.temperature = i % 2 ? 0.7f : 0.0f;
        r.params.seed = 50 + (uint64_t)i;
        r.params.ignore_eos = true;
        reqs.push_back(r);
    }
    const std::vector<std::vector<int32_t>> want = reference(setup, reqs);
    const double preempted_before = metric(srv, "pagedkv:num_preemptions_total");
    std::vector<sse::Stream> got(reqs.size());
    std::vector<std::thread> th;
    for (size_t i = 0; i < reqs.size(); ++i)
        th.emplace_back([&, i] { got[i] = sse::post_stream(target(srv), "/v1/completions", body_for(reqs[i], true)); });
    for (std::thread& t : th) t.join();

    const double preemptions = metric(srv, "pagedkv:num_preemptions_total") - preempted_before;
    CHECK(preemptions > 0);
    long announced = 0;
    std::vector<double> gaps, pause_gaps;
    for (size_t i = 0; i < reqs.size(); ++i) {
        CAPTURE(i);
        const sse::Stream& s = got[i];
        // Nothing lost, nothing repeated: exactly the tokens of a run alone.
        CHECK(s.status == 200);
        CHECK(s.done);
        CHECK(s.token_ids == want[i]);
        CHECK(s.finish_reason == "length");
        for (size_t k = 1; k < s.token_times.size(); ++k) gaps.push_back(s.token_times[k] - s.token_times[k - 1]);
        // Each pause the server announced: the gap the client saw across it,
        // from the last token before ": pagedkv preempted" to the first one
        // after ": pagedkv resumed".
        for (size_t c = 0; c < s.comments.size(); ++c) {
            if (s.comments[c] != "pagedkv preempted") continue;
            ++announced;
            const double t_pre = s.comment_times[c];
            double before = s.sent, after = -1;
            for (double t : s.token_times) {
                if (t <= t_pre) before = t;
                else if (after < 0) after = t;
            }
            if (after > 0) pause_gaps.push_back(after - before);
        }
    }
    // Every preemption reached its client as a comment ...
    CHECK(announced == (long)preemptions);
    // ... and as a gap: the longest pause is several times a usual gap (one
    // step), because a preempted request waits for blocks, then recomputes.
    REQUIRE(!pause_gaps.empty());
    std::sort(gaps.begin(), gaps.end());
    const double median = gaps[gaps.size() / 2];
    const double longest = *std::max_element(pause_gaps.begin(), pause_gaps.end());
    INFO("median gap " << median * 1e3 << " ms, longest pause " << longest * 1e3 << " ms, " << preemptions << " preemptions");
    CHECK(longest >= 3 * median);
    srv.stop();
}

TEST_CASE("a client that hangs up mid-stream: its request is aborted and its blocks are freed") {
    SigpipeGuard guard;
    // 10 ms per step: the request would take seconds to finish on its own.
    ServeProcess srv({"--step-delay-ms", "10"});
    if (!srv.running()) return;
    Req r;
    pkv_test::Rng rng(3);
    r.prompt = random_prompt(rng, 40);
    r.params.max_tokens = 400;
    r.params.ignore_eos = true;
    const sse::Stream s = sse::post_stream(target(srv), "/v1/completions", body_for(r, true), /*stop_after_tokens=*/5);
    CHECK(s.status == 200);
    CHECK(s.hung_up);
    CHECK(s.token_ids.size() >= 5);
    // The server notices at its next write (or within 50 ms of silence), and
    // the engine thread applies the abort between two steps.
    const auto t0 = sse::Clock::now();
    std::vector<sse::Sample> m;
    while (seconds_since(t0) < 10) {
        m = metrics(srv);
        if (sse::value(m, "pagedkv:request_aborted_total") == 1) break;
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    CHECK(sse::value(m, "pagedkv:request_aborted_total") == 1);
    CHECK(sse::value(m, "pagedkv:http_client_disconnects_total") == 1);
    CHECK(sse::value(m, "pagedkv:kv_cache_free_blocks") == sse::value(m, "pagedkv:kv_cache_blocks"));
    CHECK(sse::value(m, "pagedkv:generation_tokens_total") < 400);
    CHECK(sse::value(m, "pagedkv:request_success_total", "finished_reason=\"abort\"") == 1);
    CHECK(sse::value(m, "pagedkv:request_success_total", "finished_reason=\"stop\"") == 0);
    CHECK(sse::value(m, "pagedkv:request_success_total", "finished_reason=\"length\"") == 0);
    srv.stop();
}

TEST_CASE("shedding at the edge: 429 with Retry-After while the engine is inside a step") {
    SigpipeGuard guard;
    // One request runs at a time, one may wait; every step is followed by a
    // 1 s pause, during which the engine thread takes nothing from its inbox.
    ServeProcess srv({"--max-num-seqs", "1", "--max-waiting", "1", "--step-delay-ms", "1000"});
    if (!srv.running()) return;
    Req r;
    pkv_test::Rng rng(5);
    r.prompt = random_prompt(rng, 8);
    r.params.max_tokens = 50;
    r.params.ignore_eos = true;
    // A's first token means its first step is over and the engine has begun
    // its pause (A's client then hangs up; that abort waits for the pause too).
    const sse::Stream a = sse::post_stream(target(srv), "/v1/completions", body_for(r, true), 1);
    REQUIRE(a.status == 200);
    REQUIRE(!a.token_times.empty());
    // Now B and C, at once. The waiting queue has room for one: whichever
    // of the two workers counts second must be shed, at once, while the
    // other is handed over and answered when the engine wakes.
    Reply bc[2];
    double done_at[2] = {0, 0};
    std::thread th[2];
    for (int i = 0; i < 2; ++i)
        th[i] = std::thread([&, i] {
            bc[i] = raw_head(srv.port(), post("/v1/completions", body_for(r, true)), 10);
            done_at[i] = sse::now();
        });
    for (std::thread& t : th) t.join();
    const int shed = bc[0].status == 429 ? 0 : 1, in = 1 - shed;
    CHECK(bc[shed].status == 429);
    CHECK(bc[in].status == 200);
    const Reply& c = bc[shed];
    CHECK(c.header("Retry-After") == "1");
    CHECK(error_shape_problem(c.body) == "");
    CHECK(c.body.find("\"code\":\"queue_full\"") != std::string::npos);
    // Fast: answered before the engine's pause was over (1 s after A's first
    // token), so no step and no drain of the inbox was waited for; the
    // request that got in was answered only after it.
    INFO("429 after " << (done_at[shed] - a.token_times.front()) << " s of the pause, the admitted one after "
                      << (done_at[in] - a.token_times.front()) << " s");
    CHECK(done_at[shed] - a.token_times.front() < 1.0);
    CHECK(done_at[shed] < done_at[in]);
    CHECK(metric(srv, "pagedkv:http_shed_total", "{reason=\"queue_full\"}") == 1);
    srv.stop();
}

TEST_CASE("bad HTTP input: a clear 4xx with an OpenAI-style error each, and another client's stream runs on") {
    SigpipeGuard guard;
    ServeProcess srv({"--max-connections", "4", "--read-timeout", "1", "--max-body-kib", "16", "--step-delay-ms", "20"});
    if (!srv.running()) return;
    const int port = srv.port();

    // The other client: a stream of 100 tokens, 20 ms per step, running
    // while the bad input below arrives.
    Req good;
    pkv_test::Rng rng(11);
    good.prompt = random_prompt(rng, 12);
    good.params.max_tokens = 100;
    good.params.temperature = 0.6f;
    good.params.seed = 99;
    good.params.ignore_eos = true;
    const std::vector<int32_t> want = reference(workload::Setup{}, {good})[0];
    sse::Stream other;
    std::thread other_t([&] { other = sse::post_stream(target(srv), "/v1/completions", body_for(good, true)); });
    std::this_thread::sleep_for(std::chrono::milliseconds(100));

    struct Row {
        std::string what;
        std::string request;   // raw bytes
        int status;
        std::string code;      // error.code
        std::string param;     // error.param ("" = null or not checked)
        std::string message;   // part of error.message
    };
    const std::string C = "/v1/completions", CH = "/v1/chat/completions";
    std::string deep = "{\"prompt\": ";
    for (int i = 0; i < 100; ++i) deep += "[";
    for (int i = 0; i < 100; ++i) deep += "]";
    deep += "}";
    std::string long_prompt = "[1";
    for (int i = 0; i < 700; ++i) long_prompt += ",5";
    long_prompt += "]";
    const std::string big(17 * 1024, 'x');
    std::string chunked_big = "POST " + C + " HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n";
    for (int i = 0; i < 20; ++i) chunked_big += "400\r\n" + std::string(1024, ' ') + "\r\n";
    chunked_big += "0\r\n\r\n";
    const std::vector<Row> rows = {
        {"malformed JSON", post(C, R"({"prompt": "a",)"), 400, "invalid_json", "", "not valid JSON"},
        {"body is an array", post(C, "[1, 2]"), 400, "invalid_json", "", "must be a JSON object"},
        {"empty body", post(C, ""), 400, "invalid_json", "", "body is empty"},
        {"prompt is a number", post(C, R"({"prompt": 5})"), 400, "invalid_type", "prompt", "prompt must be a string or an array of token ids"},
        {"max_tokens is a string", post(C, R"({"prompt": "a", "max_tokens": "10"})"), 400, "invalid_type", "max_tokens", "must be an integer, got a string"},
        {"max_tokens has a fraction", post(C, R"({"prompt": "a", "max_tokens": 1.5})"), 400, "invalid_type", "max_tokens", "must be an integer"},
        {"max_tokens 0", post(C, R"({"prompt": "a", "max_tokens": 0})"), 400, "invalid_value", "max_tokens", "got 0"},
        {"huge max_tokens", post(C, R"({"prompt": [1, 5], "max_tokens": 1000000000})"), 400, "context_length_exceeded", "max_tokens", "ask for at most 638"},
        {"max_tokens 1e999 (no double holds it)", post(C, R"({"prompt": "a", "max_tokens": 1e999})"), 400, "invalid_json", "", "number overflow"},
        {"temperature \"NaN\" (JSON has no NaN)", post(C, R"({"prompt": "a", "temperature": "NaN"})"), 400, "invalid_type", "temperature", "must be a number, got a string"},
        {"temperature 1e999 (infinity)", post(C, R"({"prompt": "a", "temperature": 1e999})"), 400, "invalid_json", "", "number overflow"},
        {"temperature -0.5", post(C, R"({"prompt": "a", "temperature": -0.5})"), 400, "invalid_value", "temperature", "0..2"},
        {"top_p 0", post(C, R"({"prompt": "a", "top_p": 0})"), 400, "invalid_value", "top_p", "(0, 1]"},
        {"unknown field (a typo)", post(C, R"({"prompt": "a", "max_token": 5})"), 400, "unknown_parameter", "max_token", "unknown field \"max_token\""},
        {"unsupported field", post(C, R"({"prompt": "a", "logprobs": 5})"), 400, "unsupported_parameter", "logprobs", "not supported"},
        {"n = 2", post(C, R"({"prompt": "a", "n": 2})"), 400, "unsupported_parameter", "n", "set it to 1"},
        {"stream is a string", post(C, R"({"prompt": "a", "stream": "yes"})"), 400, "invalid_type", "stream", "true or false"},
        {"token id out of range", post(C, R"({"prompt": [1, 99999]})"), 400, "invalid_value", "prompt", "prompt[1] is 99999, not a token id of this model (0..993)"},
        {"negative token id", post(C, R"({"prompt": [1, -1]})"), 400, "invalid_value", "prompt", "prompt[1] is -1"},
        {"empty prompt array", post(C, R"({"prompt": []})"), 400, "invalid_value", "prompt", "empty array"},
        {"a batch of prompts", post(C, R"({"prompt": ["a", "b"]})"), 400, "unsupported_value", "prompt", "one prompt per request"},
        {"prompt longer than the context", post(C, "{\"prompt\": " + long_prompt + "}"), 400, "context_length_exceeded", "prompt", "more than max_model_len 640"},
        {"five stop strings", post(C, R"({"prompt": "a", "stop": ["a", "b", "c", "d", "e"]})"), 400, "invalid_value", "stop", "at most 4"},
        {"stream_options without stream", post(C, R"({"prompt": "a", "stream_options": {"include_usage": true}})"), 400, "invalid_value", "stream_options", "only allowed"},
        {"a model not served", post(C, R"({"model": "gpt-4", "prompt": "a"})"), 404, "model_not_found", "model", "does not exist"},
        {"chat with a completion's prompt", post(CH, R"({"prompt": "a"})"), 400, "unknown_parameter", "prompt", "unknown field"},
        {"chat without messages", post(CH, "{}"), 400, "invalid_value", "messages", "messages is missing"},
        {"chat: a role no one has", post(CH, R"({"messages": [{"role": "wizard", "content": "a"}]})"), 400, "invalid_value", "messages[0].role", "must be system"},
        {"chat: content parts", post(CH, R"({"messages": [{"role": "user", "content": [{"type": "text", "text": "a"}]}]})"), 400, "invalid_type", "messages[0].content", "content parts are not supported"},
        {"invalid UTF-8 in a string", post(C, "{\"prompt\": \"\xff\xfe\"}"), 400, "invalid_json", "", "UTF-8"},
        {"JSON nested 100 deep", post(C, deep), 400, "invalid_json", "", "nests deeper than 16"},
        {"body over the cap (Content-Length)", post(C, big), 413, "request_too_large", "", "16 KiB"},
        {"body over the cap (chunked)", chunked_big, 413, "request_too_large", "", "16 KiB"},
        {"GET on a POST route", "GET " + C + " HTTP/1.1\r\nHost: x\r\n\r\n", 405, "method_not_allowed", "", "use POST"},
        {"DELETE", "DELETE /v1/models HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n", 405, "method_not_allowed", "", "DELETE is not allowed"},
        {"no such route", "GET /v1/engines HTTP/1.1\r\nHost: x\r\n\r\n", 404, "not_found", "", "no route for GET /v1/engines"},
        {"not HTTP at all", "HELLO THERE\r\n\r\n", 400, "bad_request", "", "could not be read"},
        {"headers over the cap (16 KiB)", "GET /health HTTP/1.1\r\nX-Big: " + std::string(17000, 'a') + "\r\n\r\n", 431,
         "request_header_fields_too_large", "", "limit of 16 KiB"},
    };
    // Rows that wait on the server's read timeout (1 s): run side by side.
    // 408 Request Timeout, with the clock that ran out.
    const std::vector<Row> slow = {
        {"half-open: the body stops arriving", "POST " + C + " HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"prompt\":", 408,
         "request_timeout", "", "read timeout (1 s)"},
        {"slow: the headers never end", "POST " + C + " HTTP/1.1\r\nHost: x\r\nContent-Type: appl", 408, "request_timeout", "", "did not arrive in time"},
    };

    auto check_row = [&](const Row& row, const Reply& r, double limit_s) {
        CAPTURE(row.what);
        CHECK(r.status == row.status);
        CHECK(r.header("Content-Type").find("application/json") == 0);
        const std::string problem = error_shape_problem(r.body);
        CHECK_MESSAGE(problem == "", problem << "; body: " << r.body);
        if (!problem.empty()) return;
        const json e = json::parse(r.body)["error"];
        CHECK(e["code"] == row.code);
        if (!row.param.empty()) CHECK(e["param"] == row.param);
        CHECK_MESSAGE(e["message"].get<std::string>().find(row.message) != std::string::npos, "message: " << e["message"]);
        CHECK(r.seconds < limit_s);
    };
    int checked = 0;
    for (const Row& row : rows) {
        check_row(row, raw(port, row.request), 2.0);
        ++checked;
    }
    {
        // Side by side with them: a connection that never says anything. It
        // gets no answer (there is no request to answer) and is closed after
        // the timeout.
        std::vector<Reply> replies(slow.size());
        std::vector<std::thread> th;
        for (size_t i = 0; i < slow.size(); ++i) th.emplace_back([&, i] { replies[i] = raw(port, slow[i].request, 10); });
        const auto t0 = sse::Clock::now();
        const int fd = connect_to(port);
        const std::string silent = read_all(fd, 10);
        const double silent_s = seconds_since(t0);
        ::close(fd);
        for (std::thread& t : th) t.join();
        for (size_t i = 0; i < slow.size(); ++i) {
            check_row(slow[i], replies[i], 4.0);
            CHECK(replies[i].seconds >= 0.9);  // it was the timeout that answered
            ++checked;
        }
        CHECK(silent.empty());
        CHECK(silent_s < 4.0);
    }
    // Too many completions: with the other client's stream, three more hold
    // the 4 answers served at once (--max-connections 4); the next is
    // answered 429 at once.
    {
        std::vector<int> held;
        for (int i = 0; i < 3; ++i) {
            held.push_back(connect_to(port));
            send_all(held.back(), post(C, body_for(good, true)));
            std::string got;
            for (int k = 0; k < 500 && got.find("data: {") == std::string::npos; ++k) got += read_all(held.back(), 0.01);
        }
        const Row row{"too many connections", post(C, R"({"prompt": "a"})"), 429, "too_many_connections", "", "answers 4 completions at once"};
        const Reply r = raw(port, row.request, 10);
        check_row(row, r, 2.0);
        CHECK(r.header("Retry-After") == "1");
        ++checked;
        for (int fd : held) ::close(fd);
    }
    CHECK(checked >= 20);

    // The other client did not notice: every token, in order, no error, and
    // no gap as long as a timeout (the engine never waited on a bad client).
    other_t.join();
    CHECK(other.status == 200);
    CHECK(other.error == "");
    CHECK(other.done);
    CHECK(other.token_ids == want);
    double longest = 0;
    for (size_t k = 1; k < other.token_times.size(); ++k) longest = std::max(longest, other.token_times[k] - other.token_times[k - 1]);
    CHECK(longest < 0.9);
    // And the server still serves.
    Req next = good;
    next.params.max_tokens = 5;
    const sse::Stream after = sse::post_stream(target(srv), "/v1/completions", body_for(next, true));
    CHECK(after.token_ids == std::vector<int32_t>(want.begin(), want.begin() + 5));
    CHECK(metric(srv, "pagedkv:http_bad_requests_total") >= (double)rows.size());
    srv.stop();
}

// ---------------------------------------------------------------------------
// Clients and tools no one here wrote
// ---------------------------------------------------------------------------

TEST_CASE("/metrics passes promtool check metrics") {
    std::string promtool;
    if (have_command("promtool")) promtool = "promtool";
    else if (pkv_test::file_exists("build/deps/bin/promtool")) promtool = "build/deps/bin/promtool";
    if (promtool.empty()) {
        pkv_test::skip(pkv_test::SkipKind::kProgram,
                       "promtool not found (Debian's prometheus package; `tests/get_deps.sh build/deps --promtool` unpacks it)");
        return;
    }
    SigpipeGuard guard;
    // A model name the label must escape: a quote, a backslash.
    ServeProcess srv({"--num-blocks", "8", "--block-size", "8", "--model-name", "tiny \"story\" model\\1"});
    if (!srv.running()) return;
    // Some traffic first, so every histogram has samples.
    Req r;
    pkv_test::Rng rng(1);
    r.prompt = random_prompt(rng, 10);
    r.params.max_tokens = 40;
    r.params.ignore_eos = true;
    std::vector<std::thread> th;
    for (int i = 0; i < 3; ++i) th.emplace_back([&] { sse::post_stream(target(srv), "/v1/completions", body_for(r, true)); });
    for (std::thread& t : th) t.join();
    const std::pair<int, std::string> scraped = get(srv, "/metrics");
    REQUIRE(scraped.first == 200);
    const std::string page = scraped.second;
    srv.stop();
    CHECK(page.find("pagedkv:num_requests_running{model_name=\"tiny \\\"story\\\" model\\\\1\"} 0\n") != std::string::npos);
    // vLLM's request histograms count the three finished requests: their
    // phases, and 40 output tokens each.
    const std::vector<sse::Sample> m = sse::samples(page);
    for (const char* h : {"queue_time_seconds", "prefill_time_seconds", "decode_time_seconds", "inference_time_seconds", "prompt_tokens",
                          "generation_tokens"})
        CHECK_MESSAGE(sse::value(m, std::string("pagedkv:request_") + h + "_count") == 3, h);
    CHECK(sse::value(m, "pagedkv:request_generation_tokens_sum") == 120);
    CHECK(sse::value(m, "pagedkv:request_success_total", "finished_reason=\"length\"") == 3);
    const std::string path = (fs::temp_directory_path() / ("pagedkv_metrics_" + std::to_string(::getpid()))).string();
    auto check = [&](const std::string& text) {
        std::ofstream(path) << text;
        return pkv_test::run_command(promtool + " check metrics < " + shell_quote(path) + " 2>&1");
    };
    // promtool parses the page (exit 1 on a format error) and lints it (exit
    // 3 on style problems). Its one complaint is the colon in our names,
    // which mirror vLLM's "vllm:" (metrics.hpp says why); no other lint, no
    // parse error.
    const std::pair<std::string, int> res = check(page);
    const std::string out = res.first;
    INFO("promtool said:\n" << out);
    CHECK((res.second == 0 || res.second == 3));
    size_t lines = 0, colon = 0;
    for (size_t p = 0; p < out.size();) {
        const size_t nl = out.find('\n', p);
        const std::string line = out.substr(p, nl == std::string::npos ? std::string::npos : nl - p);
        p = nl == std::string::npos ? out.size() : nl + 1;
        if (line.empty()) continue;
        ++lines;
        colon += line.find("metric names should not contain ':'") != std::string::npos;
    }
    CHECK(lines == colon);
    // And the check can fail: a page with a broken sample line is refused.
    CHECK(check(page + "pagedkv:broken{le=1} x\n").second == 1);
    std::error_code ec;
    fs::remove(path, ec);
}

TEST_CASE("curl -N drives a stream, and a chat answer") {
    if (!have_command("curl")) {
        pkv_test::skip(pkv_test::SkipKind::kProgram, "curl not found");
        return;
    }
    SigpipeGuard guard;
    ServeProcess srv({});
    if (!srv.running()) return;
    Req r;
    const std::vector<int> enc = builtin().tok.encode("Once upon a time", true);
    r.prompt.assign(enc.begin(), enc.end());
    r.params.max_tokens = 16;
    const std::vector<int32_t> want = reference(workload::Setup{}, {r})[0];
    const std::string url = "http://127.0.0.1:" + std::to_string(srv.port());
    const std::string req = R"({"prompt": "Once upon a time", "max_tokens": 16, "temperature": 0, "stream": true, "return_token_ids": true})";
    const std::pair<std::string, int> res = pkv_test::run_command("curl -sN --max-time 30 " + url +
                                                                  "/v1/completions -H 'Content-Type: application/json' -d " + shell_quote(req));
    const std::string out = res.first;
    CHECK(res.second == 0);
    sse::Stream s;
    s.status = 200;
    sse::Parser p;
    p.feed(out, [&](const std::string& d) { sse::take_chunk(s, d, 0); }, [](const std::string&) {});
    CHECK(s.done);
    CHECK(s.token_ids == want);
    CHECK(s.text == expected_text(r.prompt, want));
    // Chat, not streamed, with curl's default Content-Type (a form):
    // the body is JSON all the same.
    const std::pair<std::string, int> chat = pkv_test::run_command(
        "curl -s --max-time 30 " + url + "/v1/chat/completions -d " +
        shell_quote(R"({"messages": [{"role": "user", "content": "Once upon a time"}], "max_tokens": 16, "temperature": 0})"));
    CHECK(chat.second == 0);
    const json j = json::parse(chat.first);
    CHECK(j["object"] == "chat.completion");
    CHECK(j["choices"][0]["message"]["content"] == expected_text(r.prompt, want));
    CHECK(j["usage"]["completion_tokens"] == 16);
    srv.stop();
}

TEST_CASE("the official openai npm package: a completion, a chat stream, an error") {
    // npm install into build/deps/node, once (its registry may be out of reach: then skip).
    const std::string dir = "build/deps/node";
    if (!need_openai_npm(dir)) return;
    SigpipeGuard guard;
    ServeProcess srv({});
    if (!srv.running()) return;
    Req r;
    const std::vector<int> enc = builtin().tok.encode("Once upon a time", true);
    r.prompt.assign(enc.begin(), enc.end());
    r.params.max_tokens = 12;
    const std::vector<int32_t> want = reference(workload::Setup{}, {r})[0];
    const std::pair<std::string, int> res = pkv_test::run_command("timeout 60 node tests/openai_client.mjs " + std::to_string(srv.port()) + " " +
                                                                  dir + " 2>&1");
    const std::string out = res.first;
    INFO("node said: " << out);
    REQUIRE(res.second == 0);
    REQUIRE(out.find('{') != std::string::npos);
    const json j = json::parse(out.substr(out.find('{')));
    const std::string text = expected_text(r.prompt, want);
    CHECK(j["completion"]["text"] == text);
    CHECK(j["completion"]["finish_reason"] == "length");
    CHECK(j["completion"]["usage"]["completion_tokens"] == 12);
    CHECK(j["completion_stream"]["text"] == text);
    CHECK(j["completion_stream"]["chunks"].get<int>() >= 12);
    CHECK(j["chat_stream"]["text"] == text);
    CHECK(j["chat_stream"]["finish_reason"] == "length");
    CHECK(j["error"]["status"] == 400);
    CHECK(j["error"]["code"] == "invalid_value");
    CHECK(j["error"]["param"] == "max_tokens");
    srv.stop();
}

TEST_CASE("build/serve and build/loadgen: --help, bad flags, no server") {
    const std::string serve = pkv_test::need_program("serve"), loadgen = pkv_test::need_program("loadgen");
    if (serve.empty() || loadgen.empty()) return;
    auto run = [](const std::string& cmd) { return pkv_test::run_command("timeout 20 " + cmd + " 2>&1"); };
    const std::pair<std::string, int> help = run(serve + " --help");
    CHECK(help.second == 0);
    CHECK(help.first.find("--max-waiting") != std::string::npos);
    const std::pair<std::string, int> bad = run(serve + " --port 70000");
    CHECK(bad.second == 2);
    CHECK(bad.first.find("serve: --port expects an integer in 0..65535, got '70000'") == 0);
    const std::pair<std::string, int> rt = run(serve + " --read-timeout nan");
    CHECK(rt.second == 2);
    CHECK(rt.first.find("--read-timeout expects a finite number") != std::string::npos);
    const std::pair<std::string, int> lh = run(loadgen + " --help");
    CHECK(lh.second == 0);
    CHECK(lh.first.find("--rate") != std::string::npos);
    const std::pair<std::string, int> lb = run(loadgen + " --rate -1");
    CHECK(lb.second == 2);
    CHECK(lb.first.find("loadgen: --rate expects a finite number in 0..1000000, got '-1'") == 0);
    // A port where nothing listens (a server we start and stop): one line, status 1.
    int port = 0;
    {
        SigpipeGuard guard;
        ServeProcess srv({});
        if (!srv.running()) return;
        port = srv.port();
    }
    const std::pair<std::string, int> none = run(loadgen + " --port " + std::to_string(port));
    CHECK(none.second == 1);
    CHECK(none.first.find("loadgen: no server answers at http://127.0.0.1:" + std::to_string(port)) == 0);
    CHECK(std::count(none.first.begin(), none.first.end(), '\n') == 1);
}

}  // TEST_SUITE("serve")

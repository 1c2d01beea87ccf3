// examples/openai_api.hpp -- the OpenAI completions API as examples/serve speaks
// it: what a request may say, what the answer looks like, and the error for
// everything else. No sockets and no threads here: the server (serve.cpp)
// calls these, and so do the tests, without a server.
//
//   parse_request()   untrusted JSON text -> a Request the engine can run,
//                     or an ApiError naming the field, what was wrong and
//                     what would work (status 400, 404)
//   error_body()      {"error": {"message", "type", "param", "code"}}
//   TextStream        token ids -> the text a client sees, with stop strings
//                     (held back while they might still be forming)
//   *_chunk(), *_body()  the JSON of a streamed chunk and of a whole answer
//
// The rules, in one place (the TUTORIAL chapter "the client's view, over HTTP"
// states them for users):
//   - Every field of the body must be one we know. A field we do not
//     implement is refused (400, code "unsupported_parameter") unless its
//     value asks for what we do anyway (n: 1, echo: false, logprobs: null,
//     presence_penalty: 0, ...); a field no OpenAI endpoint has is refused
//     with code "unknown_parameter". OpenAI's own API refuses unknown fields
//     too; vLLM ignores them with a warning. A typo ("max_token") is then an
//     error the client sees, not a default it never notices.
//   - Types are checked, never converted: "10" is not a number, 1.5 is not
//     an integer, and a number JSON cannot carry (1e999) fails in the parser.
//   - Defaults are OpenAI's: temperature 1, top_p 1, max_tokens 16 for
//     /v1/completions and "the rest of the context" for chat; a request
//     without a seed gets a random one.
//   - prompt + max_tokens longer than max_model_len is refused (400, code
//     "context_length_exceeded", saying the largest max_tokens that fits),
//     as OpenAI does: never silently capped.
//   - The chat template of the tiny models: the messages' contents, in
//     order, joined with "\n", encoded like a completion prompt (BOS first).
//     Roles are checked, not rendered: a story model knows no roles.
// Two fields come from vLLM, not OpenAI: ignore_eos (generate exactly
// max_tokens, what a benchmark wants) and return_token_ids (each choice also
// carries the token ids it adds, which the tests compare with the engine's).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "scheduler.hpp"
#include "tiny_model/tokenizer.hpp"

namespace openai {

using json = nlohmann::json;          // what we parse: a request
using ojson = nlohmann::ordered_json; // what we send: keys in OpenAI's order (id, object, created, ...)

// ============================================================================
// 1. Errors
// ============================================================================
//
// OpenAI's error body is {"error": {"message", "type", "param", "code"}}:
// `param` names the offending field (null when none does), `code` is a short
// machine-readable reason. Clients show `message`, so it says what was wrong
// and what would work.

struct ApiError : std::runtime_error {
    int status;              // HTTP status
    std::string type, code;  // e.g. "invalid_request_error", "invalid_type"
    std::string param;       // the field at fault; "" = null
    ApiError(int status_, std::string message, std::string type_, std::string code_, std::string param_ = "")
        : std::runtime_error(std::move(message)), status(status_), type(std::move(type_)), code(std::move(code_)),
          param(std::move(param_)) {}
};

// A 400 about one field of the request.
inline ApiError invalid(const std::string& param, const std::string& message, const std::string& code = "invalid_value") {
    return ApiError(400, message, "invalid_request_error", code, param);
}

// Every JSON text we send goes through this: invalid UTF-8 (which no path
// here should produce) becomes U+FFFD instead of an exception mid-stream.
inline std::string dump(const ojson& j) { return j.dump(-1, ' ', false, ojson::error_handler_t::replace); }

inline std::string error_body(const std::string& message, const std::string& type, const std::string& code,
                              const std::string& param = "") {
    ojson e = {{"message", message}, {"type", type}, {"param", nullptr}, {"code", nullptr}};
    if (!param.empty()) e["param"] = param;
    if (!code.empty()) e["code"] = code;
    return dump(ojson{{"error", e}});
}
inline std::string error_body(const ApiError& e) { return error_body(e.what(), e.type, e.code, e.param); }

// ============================================================================
// 2. The request
// ============================================================================

// What the server knows that a request is checked against.
struct Limits {
    std::string model_id;     // the one model served; "model" must name it
    int vocab_size = 0;       // token ids are 0..vocab_size-1
    int max_model_len = 0;    // prompt + output, the engine's limit
    int max_stop = 4;         // stop strings per request (OpenAI's limit)
    int max_stop_bytes = 256; // per stop string: what a stream may hold back
    int max_depth = 16;       // JSON nesting; a request needs 3
};

// A request as the engine will run it: the prompt already tokenized, every
// sampling parameter checked and defaulted, and what only the edge handles
// (stop strings, streaming options) kept beside it.
struct Request {
    bool chat = false;
    std::string model;               // as the client named it (the served id if it did not)
    std::vector<int32_t> prompt;     // token ids, BOS first when the prompt was text
    pkv::SamplingParams params;      // max_tokens, temperature, top_p, seed, ignore_eos
    std::vector<std::string> stop;   // stop strings (not part of the returned text)
    bool stream = false;
    bool include_usage = false;      // stream_options.include_usage: a last chunk with usage
    bool return_token_ids = false;   // vLLM's extension: token ids beside the text
};

namespace detail {

// How a JSON value is named in a message: "max_tokens must be an integer,
// got a string" tells a client exactly what to change.
inline std::string type_name(const json& v) {
    if (v.is_number_integer()) return "an integer";
    if (v.is_number_float()) return "a number with a fraction or exponent";
    if (v.is_string()) return "a string";
    if (v.is_boolean()) return "a boolean";
    if (v.is_null()) return "null";
    if (v.is_array()) return "an array";
    return "an object";
}
inline ApiError wrong_type(const std::string& param, const std::string& want, const json& v) {
    return invalid(param, param + " must be " + want + ", got " + type_name(v), "invalid_type");
}

// An integer field in [lo, hi], or an error naming the range. Both signed and
// unsigned JSON integers are read without wrapping.
inline int64_t integer(const json& v, const std::string& param, int64_t lo, int64_t hi) {
    if (!v.is_number_integer()) throw wrong_type(param, "an integer", v);
    if (v.is_number_unsigned() && v.get<uint64_t>() > (uint64_t)INT64_MAX)
        throw invalid(param, param + " must be an integer in " + std::to_string(lo) + ".." + std::to_string(hi) + ", got " + v.dump());
    const int64_t x = v.get<int64_t>();
    if (x < lo || x > hi)
        throw invalid(param, param + " must be an integer in " + std::to_string(lo) + ".." + std::to_string(hi) + ", got " + v.dump());
    return x;
}
// A number (integer or not) in [lo, hi]. JSON has no NaN or infinity, and
// the parser refuses a literal too large for a double, so every number that
// reaches here is finite; the range check is written so that NaN would fail it.
inline double number(const json& v, const std::string& param, double lo, double hi, const char* range_text) {
    if (!v.is_number()) throw wrong_type(param, "a number", v);
    const double x = v.get<double>();
    if (!(x >= lo && x <= hi)) throw invalid(param, param + " must be a number in " + range_text + ", got " + v.dump());
    return x;
}
inline bool boolean(const json& v, const std::string& param) {
    if (!v.is_boolean()) throw wrong_type(param, "true or false", v);
    return v.get<bool>();
}

// The OpenAI fields we do not implement, accepted only with the value that
// means "what we do anyway" (anything else: unsupported). Client libraries
// and frameworks send some of these with their default values on every
// request; refusing n: 1 or presence_penalty: 0 would refuse those clients
// for nothing, and accepting n: 2 would silently return one answer instead
// of two.
inline bool no_op_value(const std::string& k, const json& v) {
    if (k == "n" || k == "best_of") return v.is_number_integer() && v.get<int64_t>() == 1;
    if (k == "echo") return v.is_boolean() && !v.get<bool>();
    if (k == "logprobs") return v.is_null() || (v.is_boolean() && !v.get<bool>());
    if (k == "top_logprobs" || k == "suffix" || k == "response_format" || k == "tools" || k == "tool_choice" ||
        k == "functions" || k == "function_call")
        return v.is_null();
    if (k == "presence_penalty" || k == "frequency_penalty") return v.is_number() && v.get<double>() == 0.0;
    if (k == "logit_bias") return v.is_null() || (v.is_object() && v.empty());
    return false;
}
inline bool known_unsupported(const std::string& k) {
    static const char* const names[] = {"n", "best_of", "echo", "logprobs", "top_logprobs", "suffix", "presence_penalty",
                                        "frequency_penalty", "logit_bias", "response_format", "tools", "tool_choice",
                                        "functions", "function_call", "parallel_tool_calls", "service_tier", "store",
                                        "metadata", "modalities", "audio", "prediction", "reasoning_effort"};
    return std::find_if(std::begin(names), std::end(names), [&](const char* n) { return k == n; }) != std::end(names);
}

// The body as a JSON object, or a 400 saying why not. Nesting deeper than
// max_depth is refused while parsing (a request nests three levels: the
// body, messages, a message), before any deep structure is built.
inline json parse_object(const std::string& body, int max_depth) {
    if (body.empty()) throw invalid("", "the request body is empty: send a JSON object, e.g. {\"prompt\": \"Once upon a time\"}", "invalid_json");
    json j;
    try {
        j = json::parse(body, [max_depth](int depth, json::parse_event_t, json&) {
            if (depth > max_depth)
                throw invalid("", "the JSON body nests deeper than " + std::to_string(max_depth) + " levels", "invalid_json");
            return true;
        });
    } catch (const json::exception& e) {
        // e.what() names the position and the problem (parse_error.101 ...,
        // out_of_range.406 "number overflow" for 1e999).
        throw invalid("", std::string("the body is not valid JSON: ") + e.what(), "invalid_json");
    }
    if (!j.is_object()) throw invalid("", "the request body must be a JSON object, got " + type_name(j), "invalid_json");
    return j;
}

// prompt: a string (encoded with BOS, like llama2.c's run.c), or an array of
// token ids (used as they are: no BOS added). Every id is checked here,
// with its index, so the message names the offending one; the engine would
// refuse it too (Engine::add_request), but only as "rejected".
// A batch (an array of strings or of arrays) is OpenAI's way to ask for
// several completions in one request; we answer one prompt per request.
inline std::vector<int32_t> prompt_tokens(const json& v, const Limits& lim, const pkv::Tokenizer& tok) {
    if (v.is_string()) {
        const std::vector<int> ids = tok.encode(v.get<std::string>(), /*bos=*/true);
        return std::vector<int32_t>(ids.begin(), ids.end());
    }
    if (!v.is_array()) throw wrong_type("prompt", "a string or an array of token ids", v);
    if (v.empty()) throw invalid("prompt", "prompt is an empty array: give at least one token id (1 is BOS)");
    if (v[0].is_string() || v[0].is_array())
        throw invalid("prompt", "prompt is a batch (an array of " + std::string(v[0].is_string() ? "strings" : "arrays") +
                                    "); this server takes one prompt per request: send one request each",
                      "unsupported_value");
    if ((int64_t)v.size() > lim.max_model_len)
        throw invalid("prompt", "prompt has " + std::to_string(v.size()) + " tokens, more than max_model_len " +
                                    std::to_string(lim.max_model_len), "context_length_exceeded");
    std::vector<int32_t> out;
    out.reserve(v.size());
    for (size_t i = 0; i < v.size(); ++i) {
        const json& t = v[i];
        const std::string name = "prompt[" + std::to_string(i) + "]";
        if (!t.is_number_integer()) throw wrong_type(name, "a token id (an integer)", t);
        const bool in_range = t.is_number_unsigned() ? t.get<uint64_t>() < (uint64_t)lim.vocab_size
                                                     : (t.get<int64_t>() >= 0 && t.get<int64_t>() < lim.vocab_size);
        if (!in_range)
            throw invalid("prompt", name + " is " + t.dump() + ", not a token id of this model (0.." + std::to_string(lim.vocab_size - 1) + ")");
        out.push_back((int32_t)t.get<int64_t>());
    }
    return out;
}

// The chat template (see the top of this file): contents joined by "\n".
inline std::vector<int32_t> chat_tokens(const json& v, const pkv::Tokenizer& tok) {
    if (!v.is_array()) throw wrong_type("messages", "an array of {\"role\", \"content\"} objects", v);
    if (v.empty()) throw invalid("messages", "messages is empty: give at least one {\"role\": \"user\", \"content\": \"...\"}");
    std::string text;
    for (size_t i = 0; i < v.size(); ++i) {
        const json& m = v[i];
        const std::string name = "messages[" + std::to_string(i) + "]";
        if (!m.is_object()) throw wrong_type(name, "an object with role and content", m);
        for (const auto& [k, val] : m.items()) {
            if (k == "role") {
                if (!val.is_string()) throw wrong_type(name + ".role", "a string", val);
                const std::string r = val.get<std::string>();
                if (r != "system" && r != "user" && r != "assistant" && r != "developer")
                    throw invalid(name + ".role", name + ".role must be system, developer, user or assistant, got \"" + r + "\"");
            } else if (k == "content") {
                if (!val.is_string())
                    throw wrong_type(name + ".content", "a string (content parts are not supported)", val);
            } else if (k == "name") {
                if (!val.is_string()) throw wrong_type(name + ".name", "a string", val);
            } else {
                throw invalid(name + "." + k, name + " has an unknown field \"" + k + "\" (a message has role, content and name)",
                              "unknown_parameter");
            }
        }
        if (!m.contains("role")) throw invalid(name + ".role", name + " has no role");
        if (!m.contains("content")) throw invalid(name + ".content", name + " has no content");
        text += (i ? "\n" : "") + m["content"].get<std::string>();
    }
    const std::vector<int> ids = tok.encode(text, /*bos=*/true);
    return std::vector<int32_t>(ids.begin(), ids.end());
}

inline std::vector<std::string> stop_strings(const json& v, const Limits& lim) {
    std::vector<std::string> out;
    if (v.is_null()) return out;
    if (v.is_string()) out.push_back(v.get<std::string>());
    else if (v.is_array()) {
        if ((int)v.size() > lim.max_stop)
            throw invalid("stop", "stop has " + std::to_string(v.size()) + " strings; at most " + std::to_string(lim.max_stop));
        for (size_t i = 0; i < v.size(); ++i) {
            if (!v[i].is_string()) throw wrong_type("stop[" + std::to_string(i) + "]", "a string", v[i]);
            out.push_back(v[i].get<std::string>());
        }
    } else {
        throw wrong_type("stop", "a string or an array of strings", v);
    }
    for (const std::string& s : out) {
        if (s.empty()) throw invalid("stop", "a stop string is empty (it would match before the first token)");
        if ((int)s.size() > lim.max_stop_bytes)
            throw invalid("stop", "a stop string is " + std::to_string(s.size()) + " bytes; at most " + std::to_string(lim.max_stop_bytes));
    }
    return out;
}

}  // namespace detail

// The whole check, field by field. `random_seed` is used when the request
// names no seed. Throws ApiError; returns a request the engine will accept
// (the engine checks again at its door, so this is not the only guard).
inline Request parse_request(const std::string& body, bool chat, const Limits& lim, const pkv::Tokenizer& tok, uint64_t random_seed) {
    using namespace detail;
    const json j = parse_object(body, lim.max_depth);
    Request r;
    r.chat = chat;
    r.model = lim.model_id;
    r.params.temperature = 1.0f;  // OpenAI's default
    r.params.top_p = 1.0f;
    r.params.seed = random_seed;
    bool have_prompt = false;
    int64_t max_tokens = -1;  // -1 = not given
    const json* stream_options = nullptr;

    // One pass over the fields: a field is either one we know, or an error.
    // A null value means "the default" for every optional field, as in
    // OpenAI's API (clients send "stop": null and the like).
    for (const auto& [k, v] : j.items()) {
        if (k == "model") {
            if (!v.is_string()) throw wrong_type("model", "a string", v);
            r.model = v.get<std::string>();
            if (r.model != lim.model_id)
                throw ApiError(404, "the model \"" + r.model + "\" does not exist here; this server serves \"" + lim.model_id +
                                        "\" (GET /v1/models)", "invalid_request_error", "model_not_found", "model");
        } else if (!chat && k == "prompt") {
            r.prompt = prompt_tokens(v, lim, tok);
            have_prompt = true;
        } else if (chat && k == "messages") {
            r.prompt = chat_tokens(v, tok);
            have_prompt = true;
        } else if (k == "max_tokens" || (chat && k == "max_completion_tokens")) {
            if (v.is_null()) continue;
            const int64_t m = integer(v, k, 1, INT64_MAX);
            if (max_tokens >= 0 && m != max_tokens)
                throw invalid(k, "max_tokens and max_completion_tokens differ (" + std::to_string(max_tokens) + " vs " +
                                     std::to_string(m) + "): give one of them");
            max_tokens = m;
        } else if (k == "temperature") {
            // OpenAI's range. The engine would take any finite t >= 0; above
            // 2 the distribution is so flat that the text is noise.
            if (!v.is_null()) r.params.temperature = (float)number(v, k, 0.0, 2.0, "0..2 (0 = greedy)");
        } else if (k == "top_p") {
            // The sampler treats top_p outside (0, 1) as "off"; a client
            // sending 0 means the opposite (keep almost nothing), so 0 is refused.
            if (v.is_null()) continue;
            const double p = number(v, k, 0.0, 1.0, "(0, 1]");
            if (p == 0.0) throw invalid(k, "top_p must be a number in (0, 1], got 0 (use temperature 0 for greedy decoding)");
            r.params.top_p = (float)p;
        } else if (k == "seed") {
            if (v.is_null()) continue;
            // OpenAI's seed is a signed 64-bit integer; the engine's is its bit pattern.
            r.params.seed = (uint64_t)integer(v, k, INT64_MIN, INT64_MAX);
        } else if (k == "stop") {
            r.stop = stop_strings(v, lim);
        } else if (k == "stream") {
            if (!v.is_null()) r.stream = boolean(v, k);
        } else if (k == "stream_options") {
            if (v.is_null()) continue;
            if (!v.is_object()) throw wrong_type(k, "an object like {\"include_usage\": true}", v);
            stream_options = &v;
        } else if (k == "user") {
            // An end-user id for abuse monitoring at OpenAI; nothing to do here.
            if (!v.is_string()) throw wrong_type(k, "a string", v);
        } else if (k == "ignore_eos") {
            r.params.ignore_eos = boolean(v, k);
        } else if (k == "return_token_ids") {
            r.return_token_ids = boolean(v, k);
        } else if (known_unsupported(k)) {
            if (!no_op_value(k, v))
                throw invalid(k, k + " is not supported by this server (remove it" +
                                     std::string(k == "n" || k == "best_of" ? ", or set it to 1" : "") + ")", "unsupported_parameter");
        } else {
            throw invalid(k, "unknown field \"" + k + "\" (this endpoint takes " +
                                 (chat ? "model, messages, max_tokens, max_completion_tokens"
                                       : "model, prompt, max_tokens") +
                                 ", temperature, top_p, seed, stop, stream, stream_options, user, ignore_eos, return_token_ids)",
                          "unknown_parameter");
        }
    }
    if (!have_prompt) throw invalid(chat ? "messages" : "prompt", chat ? "messages is missing" : "prompt is missing");
    if (stream_options) {
        if (!r.stream) throw invalid("stream_options", "stream_options is only allowed with \"stream\": true");
        for (const auto& [k, v] : stream_options->items()) {
            if (k != "include_usage")
                throw invalid("stream_options." + k, "unknown field \"" + k + "\" in stream_options (it takes include_usage)",
                              "unknown_parameter");
            r.include_usage = boolean(v, "stream_options.include_usage");
        }
    }

    // The context: prompt + max_tokens must fit max_model_len. The prompt
    // needs room for at least one new token.
    const int64_t P = (int64_t)r.prompt.size(), L = lim.max_model_len;
    if (P >= L)
        throw invalid(chat ? "messages" : "prompt",
                      "this model's maximum context length is " + std::to_string(L) + " tokens, and the prompt alone has " +
                          std::to_string(P) + ": shorten it to at most " + std::to_string(L - 1) + " tokens",
                      "context_length_exceeded");
    if (max_tokens < 0) max_tokens = chat ? L - P : 16;  // OpenAI's defaults (chat: the rest of the context)
    if (max_tokens > L - P)  // (not P + max_tokens: that may overflow)
        throw invalid(chat && j.contains("max_completion_tokens") ? "max_completion_tokens" : "max_tokens",
                      "this model's maximum context length is " + std::to_string(L) + " tokens, but you asked for " +
                          std::to_string(P) + " in the prompt + " + std::to_string(max_tokens) +
                          " to generate: ask for at most " + std::to_string(L - P),
                      "context_length_exceeded");
    r.params.max_tokens = (int)max_tokens;
    return r;
}

// ============================================================================
// 3. Token ids -> the text a client sees
// ============================================================================
//
// The engine streams token ids; a client wants text. Each token renders as
// its piece (Tokenizer::render, run.c's rules), except the special tokens
// BOS and EOS, which render as nothing (vLLM's skip_special_tokens).
//
// Stop strings make it subtle: a stop string may span several tokens, and
// the text up to it is returned but the stop string itself is not. So we
// hold back any tail of the text that could still grow into a stop string,
// and release it only when the next token shows that it does not. With no
// stop strings nothing is ever held back.
class TextStream {
public:
    TextStream(const pkv::Tokenizer& tok, int prev_token, std::vector<std::string> stop)
        : tok_(tok), prev_(prev_token), stop_(std::move(stop)) {}

    // Adds one token; returns the text that may be sent now. After a stop
    // string matched (stopped() is true), the text up to it has been
    // returned, and nothing more ever will be.
    std::string add(int token) {
        if (stopped_) return "";
        if (token != pkv::kBosId && token != pkv::kEosId) text_ += tok_.render(prev_, token);
        prev_ = token;
        // A match can only start in the unsent part: the sent part never ends
        // in a prefix of a stop string (that is what we hold back).
        size_t at = std::string::npos;
        for (const std::string& s : stop_) at = std::min(at, text_.find(s, sent_));
        if (at != std::string::npos) {
            stopped_ = true;
            text_.resize(at);
            return release(at);
        }
        return release(text_.size() - held_back());
    }
    // The end of the stream (EOS or a length limit): whatever was held back.
    std::string flush() { return release(text_.size()); }
    bool stopped() const { return stopped_; }
    const std::string& text() const { return text_; }

private:
    // The longest tail of the unsent text that is a proper prefix of a stop string.
    size_t held_back() const {
        size_t best = 0;
        for (const std::string& s : stop_)
            for (size_t k = std::min(s.size() - 1, text_.size() - sent_); k > best; --k)
                if (text_.compare(text_.size() - k, k, s, 0, k) == 0) {
                    best = k;
                    break;
                }
        return best;
    }
    std::string release(size_t upto) {
        std::string out = text_.substr(sent_, upto - sent_);
        sent_ = upto;
        return out;
    }
    const pkv::Tokenizer& tok_;
    int prev_;
    std::vector<std::string> stop_;
    std::string text_;   // everything rendered so far (cut at a stop string)
    size_t sent_ = 0;    // how much of text_ was returned
    bool stopped_ = false;
};

// ============================================================================
// 4. Answers
// ============================================================================
//
// Shapes as OpenAI sends them. A completion (one JSON body):
//   {"id": "cmpl-7", "object": "text_completion", "created": 1700000000, "model": "built-in",
//    "choices": [{"index": 0, "text": "...", "logprobs": null, "finish_reason": "length"}],
//    "usage": {"prompt_tokens": 32, "completion_tokens": 16, "total_tokens": 48}}
// A stream: one such object per token with the new text in choices[0].text
// and "finish_reason": null, the last one with its finish_reason, then
// "data: [DONE]". Chat says "chat.completion" / "chat.completion.chunk", and
// carries the text in choices[0].message.content / choices[0].delta.content.

// "stop" for a stop token or stop string, "length" for either length limit.
inline const char* finish_reason_text(pkv::FinishReason r) {
    return r == pkv::FinishReason::kStop ? "stop" : "length";
}

inline ojson usage_json(long prompt_tokens, long completion_tokens) {
    return {{"prompt_tokens", prompt_tokens}, {"completion_tokens", completion_tokens}, {"total_tokens", prompt_tokens + completion_tokens}};
}

// Identity of one answer: the same in every chunk of a stream.
struct AnswerId {
    std::string id, model;
    long created = 0;  // Unix seconds
    bool chat = false;
};

inline ojson answer_head(const AnswerId& a, bool chunk) {
    const char* object = a.chat ? (chunk ? "chat.completion.chunk" : "chat.completion") : "text_completion";
    return {{"id", a.id}, {"object", object}, {"created", a.created}, {"model", a.model}};
}

// One streamed chunk. finish: "" while the stream goes on. token_ids: added
// when the request asked for them. first: chat's first chunk also carries
// the role, as OpenAI's does.
inline std::string chunk(const AnswerId& a, const std::string& text, const std::string& finish,
                         const std::vector<int32_t>* token_ids, bool first = false) {
    ojson c = {{"index", 0}};
    if (a.chat) {
        ojson delta = ojson::object();
        if (first) delta["role"] = "assistant";
        if (!text.empty() || (first && finish.empty())) delta["content"] = text;
        c["delta"] = delta;
    } else {
        c["text"] = text;
    }
    c["logprobs"] = nullptr;
    c["finish_reason"] = finish.empty() ? ojson(nullptr) : ojson(finish);
    if (token_ids) c["token_ids"] = *token_ids;
    ojson j = answer_head(a, true);
    j["choices"] = ojson::array({c});
    return dump(j);
}

// stream_options.include_usage: the last chunk before [DONE], with no choices.
inline std::string usage_chunk(const AnswerId& a, long prompt_tokens, long completion_tokens) {
    ojson j = answer_head(a, true);
    j["choices"] = ojson::array();
    j["usage"] = usage_json(prompt_tokens, completion_tokens);
    return dump(j);
}

// The whole answer, when the request did not stream.
inline std::string body(const AnswerId& a, const std::string& text, const std::string& finish,
                        const std::vector<int32_t>* token_ids, long prompt_tokens, long completion_tokens) {
    ojson c = {{"index", 0}};
    if (a.chat) c["message"] = {{"role", "assistant"}, {"content", text}};
    else c["text"] = text;
    c["logprobs"] = nullptr;
    c["finish_reason"] = finish;
    if (token_ids) c["token_ids"] = *token_ids;
    ojson j = answer_head(a, false);
    j["choices"] = ojson::array({c});
    j["usage"] = usage_json(prompt_tokens, completion_tokens);
    return dump(j);
}

}  // namespace openai

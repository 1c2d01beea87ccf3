// tests/test_viewer.cpp -- the recorded run and its viewer (the "viewer"
// suite): examples/recorder.hpp, examples/viewer/, build/overload --view and
// --trace, build/serve's /view. Every wait is bounded.
//
//   - the recorder changes nothing the engine does: the same tokens and
//     counts, and the program's own callback gets every event in the same
//     order; detached, the engine's callbacks are what they were;
//   - its records agree with the engine: as many as steps, every preemption
//     with the victim's blocks, every recomputed token, every finish; each
//     record's block tables and free list account for every block once;
//   - the page: its data cannot end its <script> early, and the three marks
//     are filled once each; bytes that are not UTF-8 are replaced;
//   - build/overload --view and --trace on make run's workload: --json
//     unchanged by them, the page's data totals equal --json's, the page
//     names no URL outside itself; the trace's spans are all closed, in time
//     order per track, one preemption instant per preemption; a path that
//     cannot be written or a pool too large to draw is refused at the door;
//   - a real headless browser (Debian's chromium) over that page: the
//     totals it shows equal --json's, "p" steps to the first preemption of
//     the lane chart, where each victim holds no block, its blocks are given
//     back (free, or taken by a request that grew) and its stream is
//     paused; three screenshots (build/viewer-*.png);
//   - build/serve: /view's event stream, while build/loadgen runs, reports
//     the preemptions /metrics counts; a page that reads nothing holds up
//     neither the engine nor the other pages (its records are dropped, and
//     it is told how many); --max-viewers caps the pages.
#include "tests/serve_util.hpp"

#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <atomic>
#include <map>
#include <mutex>
#include <regex>
#include <set>

#include "examples/recorder.hpp"
#include "examples/viewer_page.hpp"

namespace {

using namespace serve_test;

// ---------------------------------------------------------------------------
// In-process runs
// ---------------------------------------------------------------------------

// A workload that preempts, small enough for a test build: 8 requests of
// 24 + 40 tokens on 12 blocks of 16 (each needs 4 blocks at the end).
workload::Setup small_setup() {
    workload::Setup s;
    s.requests = 8;
    s.prompt_len = 24;
    s.max_tokens = 40;
    s.num_blocks = 12;
    s.block_size = 16;
    s.max_num_seqs = 8;
    return s;
}

struct Seen {
    int type, r, token, index;
    bool operator==(const Seen&) const = default;
};

// Runs the workload; returns the events the program's own callback saw.
std::vector<Seen> run_engine(pkv::Engine& eng, const workload::Setup& s, viewer::Recorder* rec) {
    std::vector<Seen> seen;
    eng.on_event = [&](const pkv::StreamEvent& e) { seen.push_back({(int)e.type, e.request_id, e.token, e.output_index}); };
    if (rec) rec->attach(eng);
    workload::add_workload(eng, builtin().tok, s);
    while (eng.has_unfinished()) {
        eng.step();
        if (rec) rec->end_step();
    }
    return seen;
}

std::map<int, std::vector<int>> tables_of(const json& rec) {
    std::map<int, std::vector<int>> t;
    for (const json& row : rec["tables"]) t[row[0].get<int>()] = row[1].get<std::vector<int>>();
    return t;
}

// ---------------------------------------------------------------------------
// Programs, pages, traces
// ---------------------------------------------------------------------------

std::string slurp(const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

// build/overload with `args`; its stdout (stderr goes to err_path when given).
std::string overload(const std::string& args, const std::string& err_path = "/dev/null") {
    const std::string exe = pkv_test::need_program("overload");
    if (exe.empty()) return "";
    // (no structured bindings: clang 14 cannot capture them in doctest's lambdas)
    const std::pair<std::string, int> r = pkv_test::run_command("timeout 120 " + exe + " " + args + " 2>" + err_path);
    REQUIRE_MESSAGE(r.second == 0, "build/overload " << args << " failed:\n" << slurp(err_path));
    return r.first;
}

// The run's data, as the page holds it: the JSON between <script
// id="run-data" ...> and </script>.
json page_data(const std::string& page) {
    const std::string open = "<script id=\"run-data\" type=\"application/json\">";
    const size_t a = page.find(open);
    REQUIRE(a != std::string::npos);
    const size_t b = page.find("</script>", a);
    REQUIRE(b != std::string::npos);
    return json::parse(page.substr(a + open.size(), b - a - open.size()));
}

// The first row of make run's lane chart with an X: its step, and the
// requests preempted in it (columns of X). The lanes start after the step,
// kv%, run and wait columns: "%5ld %3.0f%% %4d %4d  ".
std::pair<long, std::vector<int>> first_preemption_in_lanes(const std::string& out) {
    std::istringstream in(out);
    for (std::string line; std::getline(in, line);) {
        if (line.size() <= 22 || line.find('%') != 9) continue;
        const std::string lanes = line.substr(22);
        if (lanes.find('X') == std::string::npos) continue;
        std::vector<int> victims;
        for (size_t i = 0; i < lanes.size(); ++i)
            if (lanes[i] == 'X') victims.push_back((int)i);
        return {std::stol(line.substr(0, 5)), victims};
    }
    return {-1, {}};
}

// ---------------------------------------------------------------------------
// The browser
// ---------------------------------------------------------------------------

// Debian's chromium, or "" after recording a skip. CI installs it
// (tests/get_chromium.sh) and sets PAGEDKV_REQUIRE_BROWSER=1.
std::string need_chromium() {
    const std::pair<std::string, int> r = pkv_test::run_command("command -v chromium 2>/dev/null");
    if (r.second == 0 && !r.first.empty()) return r.first.substr(0, r.first.find('\n'));
    pkv_test::skip(pkv_test::SkipKind::kBrowser, "chromium not found: tests/get_chromium.sh installs it (Debian's chromium)");
    return "";
}

// chromium headless on `url`, with a fresh profile, no network of its own
// (the flags that keep it from calling home), bounded at 60 s. `what`:
// "--dump-dom" (the DOM after the page's script ran, on stdout) or
// "--screenshot=FILE". The page's console goes to stderr
// (--enable-logging): an uncaught JavaScript error fails the test.
std::string chromium(const std::string& exe, const std::string& what, const std::string& url) {
    char tmpl[] = "/tmp/pagedkv_chromium_XXXXXX";
    REQUIRE(::mkdtemp(tmpl) != nullptr);
    const std::string profile = tmpl;
    const std::string cmd = "timeout 60 " + exe +
                            " --headless --no-sandbox --disable-gpu --no-first-run --disable-background-networking"
                            " --disable-component-update --disable-sync --disable-dev-shm-usage --enable-logging=stderr --v=0"
                            " --user-data-dir=" + profile +
                            " --window-size=1400,1250 " + what + " " + shell_quote(url) + " 2>" + profile + ".err";
    const std::pair<std::string, int> r = pkv_test::run_command(cmd);
    const std::string err = slurp(profile + ".err");
    pkv_test::run_command("rm -rf " + shell_quote(profile) + " " + shell_quote(profile + ".err"));
    REQUIRE_MESSAGE(r.second == 0, "chromium failed (" << r.second << "): " << err.substr(0, 2000));
    const size_t uncaught = err.find("Uncaught");
    CHECK_MESSAGE(uncaught == std::string::npos, "a JavaScript error on " << url << ": " << err.substr(uncaught == std::string::npos ? 0 : uncaught, 300));
    return r.first;
}

// The attributes of every start tag in `html` with attribute `has`.
std::vector<std::map<std::string, std::string>> tags_with(const std::string& html, const std::string& has) {
    std::vector<std::map<std::string, std::string>> found;
    static const std::regex attr(R"re(([a-zA-Z_:][-a-zA-Z0-9_:.]*)="([^"]*)")re");
    for (size_t at = html.find('<'); at != std::string::npos; at = html.find('<', at + 1)) {
        const size_t end = html.find('>', at);
        if (end == std::string::npos) break;
        const std::string tag = html.substr(at, end - at);
        if (tag.find(" " + has + "=\"") == std::string::npos) continue;
        std::map<std::string, std::string> a;
        for (std::sregex_iterator it(tag.begin(), tag.end(), attr), e; it != e; ++it) a[(*it)[1]] = (*it)[2];
        a["<tag>"] = tag.substr(1, tag.find(' ') - 1);
        found.push_back(a);
    }
    return found;
}
// The text directly inside the element with this id (up to its first child tag).
std::string text_of(const std::string& html, const std::string& id) {
    const size_t at = html.find(" id=\"" + id + "\"");
    REQUIRE(at != std::string::npos);
    const size_t open_end = html.find('>', at);
    return html.substr(open_end + 1, html.find('<', open_end) - open_end - 1);
}
std::map<std::string, std::string> tag_with_id(const std::string& html, const std::string& id) {
    for (auto& t : tags_with(html, "id"))
        if (t["id"] == id) return t;
    FAIL("no element with id " << id);
    return {};
}

// A PNG's width and height, from its IHDR chunk ({0, 0} if it is not a PNG).
std::pair<int, int> png_size(const std::string& path) {
    const std::string b = slurp(path);
    if (b.size() < 24 || b.compare(0, 8, "\x89PNG\r\n\x1a\n") != 0 || b.compare(12, 4, "IHDR") != 0) return {0, 0};
    auto be = [&](size_t o) { return (int)((unsigned char)b[o] << 24 | (unsigned char)b[o + 1] << 16 | (unsigned char)b[o + 2] << 8 | (unsigned char)b[o + 3]); };
    return {be(16), be(20)};
}

// ---------------------------------------------------------------------------
// /view/events, read as a page would
// ---------------------------------------------------------------------------

// A subscriber to /view/events on its own socket and thread. `rcvbuf` > 0
// shrinks its receive buffer, and `reading` false makes it read nothing
// until told: a page too slow for the engine.
class ViewStream {
public:
    ViewStream(int port, int rcvbuf = 0, bool reading = true) : reading_(reading) {
        fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        REQUIRE(fd_ >= 0);
        if (rcvbuf > 0) ::setsockopt(fd_, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof rcvbuf);
        sockaddr_in a{};
        a.sin_family = AF_INET;
        a.sin_port = htons((uint16_t)port);
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        REQUIRE(::connect(fd_, (sockaddr*)&a, sizeof a) == 0);
        // HTTP/1.0: the answer is not chunked, the events come as they are.
        send_all(fd_, "GET /view/events HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n");
        thread_ = std::thread([this] { loop(); });
    }
    ~ViewStream() {
        stop_ = true;
        thread_.join();
        ::close(fd_);
    }
    void start_reading() { reading_ = true; }
    // Waits (at most `timeout_s`) until `pred(records)` holds.
    template <class Pred>
    bool wait_for(Pred pred, double timeout_s) {
        const auto t0 = sse::Clock::now();
        while (seconds_since(t0) < timeout_s) {
            {
                std::lock_guard<std::mutex> lk(m_);
                if (pred(records_)) return true;
            }
            std::this_thread::sleep_for(std::chrono::milliseconds(20));
        }
        return false;
    }
    std::vector<json> records() {
        std::lock_guard<std::mutex> lk(m_);
        return records_;
    }
    long dropped() {
        std::lock_guard<std::mutex> lk(m_);
        return dropped_;
    }
    bool hello() {
        std::lock_guard<std::mutex> lk(m_);
        return hello_;
    }
    std::string head() {
        std::lock_guard<std::mutex> lk(m_);
        return head_;
    }
    bool closed() const { return closed_; }

private:
    void loop() {
        std::string pending;
        bool in_body = false;
        while (!stop_) {
            if (!reading_) {
                std::this_thread::sleep_for(std::chrono::milliseconds(10));
                continue;
            }
            pollfd p{fd_, POLLIN, 0};
            if (::poll(&p, 1, 50) <= 0) continue;
            char buf[16384];
            const ssize_t n = ::recv(fd_, buf, sizeof buf, 0);
            if (n <= 0) {
                closed_ = true;
                return;
            }
            std::string bytes(buf, (size_t)n);
            if (!in_body) {
                pending += bytes;
                const size_t end = pending.find("\r\n\r\n");
                if (end == std::string::npos) continue;
                {
                    std::lock_guard<std::mutex> lk(m_);
                    head_ = pending.substr(0, end);
                }
                bytes = pending.substr(end + 4);
                in_body = true;
            }
            parser_.feed(bytes, [&](const std::string& data) { take(data); }, [](const std::string&) {});
        }
    }
    // The events differ by their JSON: hello (the header: "format"), a
    // record ("step"), dropped ("records").
    void take(const std::string& data) {
        const json j = json::parse(data);
        std::lock_guard<std::mutex> lk(m_);
        if (j.contains("format")) hello_ = true;
        else if (j.contains("step")) records_.push_back(j);
        else if (j.contains("records")) dropped_ += j["records"].get<long>();
    }

    int fd_ = -1;
    std::atomic<bool> stop_{false}, reading_{true}, closed_{false};
    std::thread thread_;
    sse::Parser parser_;
    std::mutex m_;
    std::vector<json> records_;
    long dropped_ = 0;
    bool hello_ = false;
    std::string head_;
};

long preempted_events(const std::vector<json>& records) {
    long n = 0;
    for (const json& r : records)
        for (const json& e : r["events"]) n += e["kind"] == "preempted";
    return n;
}

// build/loadgen against `port`; its --json summary.
json loadgen(int port, const std::string& args = "") {
    const std::string exe = pkv_test::need_program("loadgen");
    REQUIRE(!exe.empty());
    const std::pair<std::string, int> r =
        pkv_test::run_command("timeout 120 " + exe + " --port " + std::to_string(port) + " --json " + args + " 2>/dev/null");
    REQUIRE_MESSAGE(r.second == 0, "build/loadgen failed:\n" << r.first.substr(0, 2000));
    return json::parse(r.first);
}

}  // namespace

TEST_SUITE("viewer") {

// ---------------------------------------------------------------------------
// The recorder, in-process
// ---------------------------------------------------------------------------

TEST_CASE("the recorder changes nothing the engine does, and chains the program's callback") {
    const workload::Setup s = small_setup();
    pkv::Engine plain(pkv::make_model_runner(pkv::Device::kCpu, builtin().model), workload::engine_config(s));
    pkv::Engine watched(pkv::make_model_runner(pkv::Device::kCpu, builtin().model), workload::engine_config(s));
    viewer::Recorder rec(builtin().tok, {}, /*keep=*/true);
    const std::vector<Seen> a = run_engine(plain, s, nullptr);
    const std::vector<Seen> b = run_engine(watched, s, &rec);
    REQUIRE(plain.metrics().num_preemptions_total > 0);  // the workload preempts: there is something to record
    CHECK(a == b);                                        // every event, in the same order, to the program's own callback
    for (int i = 0; i < s.requests; ++i) CHECK(plain.request(i)->tokens == watched.request(i)->tokens);
    CHECK(plain.metrics().num_steps == watched.metrics().num_steps);
    CHECK(plain.metrics().num_preemptions_total == watched.metrics().num_preemptions_total);
    CHECK(plain.metrics().recomputed_tokens_total == watched.metrics().recomputed_tokens_total);
    // Detached: on_schedule is empty again, on_event the program's.
    rec.detach();
    CHECK(!watched.on_schedule);
    const size_t before = b.size();
    std::vector<Seen> after;
    watched.on_event = [&](const pkv::StreamEvent& e) { after.push_back({(int)e.type, e.request_id, e.token, e.output_index}); };
    watched.add_request({1, 5, 7}, pkv::SamplingParams{});
    watched.run_until_done();
    CHECK(!after.empty());
    CHECK(before == b.size());
}

TEST_CASE("the records agree with the engine: steps, preemptions with their blocks, recomputes, finishes, every block once") {
    const workload::Setup s = small_setup();
    pkv::Engine eng(pkv::make_model_runner(pkv::Device::kCpu, builtin().model), workload::engine_config(s));
    viewer::RunInfo info;
    info.model = "built-in";
    viewer::Recorder rec(builtin().tok, info, /*keep=*/true);
    run_engine(eng, s, &rec);
    const json data = json::parse(rec.page_data());
    const json& steps = data["steps"];
    const pkv::Metrics& m = eng.metrics();
    CHECK(data["format"] == "pagedkv-view/1");
    CHECK(data["config"]["num_blocks"] == s.num_blocks);
    CHECK((long)steps.size() == m.num_steps);
    long preempted = 0, recomputed = 0, finished = 0, tokens = 0;
    std::set<int> introduced;
    for (size_t i = 0; i < steps.size(); ++i) {
        CAPTURE(i);
        const json& st = steps[i];
        CHECK(st["step"] == (long)i + 1);
        CHECK(st["t0"].get<double>() <= st["t1"].get<double>());
        for (const json& q : st["requests"]) introduced.insert(q["id"].get<int>());
        for (const json& c : st["chunks"]) recomputed += c["recompute"].get<long>();
        tokens += (long)st["tokens"].size();
        // Every block is in exactly one place: one running request's table,
        // or the free list (no prefix caching: no block is shared).
        std::vector<int> where(s.num_blocks, 0);
        const auto tables = tables_of(st);
        for (const auto& [r, blocks] : tables)
            for (int b : blocks) where[(size_t)b]++;
        for (const json& b : st["free"]) where[b.get<size_t>()]++;
        for (int b = 0; b < s.num_blocks; ++b) CHECK_MESSAGE(where[(size_t)b] == 1, "block " << b);
        CHECK(st["kv"].get<double>() == doctest::Approx(1.0 - (double)st["free"].size() / s.num_blocks));
        CHECK(st["running"].size() == tables.size());
        const auto before = i ? tables_of(steps[i - 1]) : std::map<int, std::vector<int>>{};
        std::set<int> grew;  // requests whose table gained blocks in this step
        for (const auto& [r, blocks] : tables)
            if (!before.count(r) || before.at(r).size() < blocks.size()) grew.insert(r);
        for (const json& e : st["events"]) {
            if (e["kind"] == "finished" && e["reason"] == "max_tokens") finished++;
            if (e["kind"] != "preempted") continue;
            preempted++;
            const int v = e["r"];
            // The blocks it gave back are the table it held when the step
            // began; it holds none now; each is free or went to a request
            // that grew in this step.
            REQUIRE(before.count(v));
            CHECK(e["blocks"].get<std::vector<int>>() == before.at(v));
            CHECK(!tables.count(v));
            for (int b : before.at(v)) {
                bool free = false;
                for (const json& f : st["free"]) free = free || f == b;
                int holder = -1;
                for (const auto& [r, blocks] : tables)
                    if (std::find(blocks.begin(), blocks.end(), b) != blocks.end()) holder = r;
                CHECK_MESSAGE((free || grew.count(holder)), "block " << b << " of victim " << v);
            }
            CHECK(e["why"].get<std::string>().find("pick_victim chose r" + std::to_string(v)) != std::string::npos);
            CHECK(std::find(st["waiting"].begin(), st["waiting"].end(), v) != st["waiting"].end());
        }
        // The engine's own counters ride along in every record.
        CHECK(st["totals"]["preemptions"] == preempted);
        CHECK(st["totals"]["recomputed"] == recomputed);
    }
    CHECK(preempted == m.num_preemptions_total);
    CHECK(recomputed == m.recomputed_tokens_total);
    CHECK(finished == m.num_requests_finished);
    CHECK(tokens == m.generation_tokens_total);
    CHECK((int)introduced.size() == s.requests);
}

TEST_CASE("the page: the data cannot end its script, each mark is filled once, bytes that are not UTF-8 are replaced") {
    const std::string html = "<style>/*@STYLE@*/</style><script id=\"run-data\" type=\"application/json\">/*@DATA@*/</script><script>/*@SCRIPT@*/</script>";
    // A token's text may hold anything, the marks' own spelling included.
    const std::string text = "</script><script>alert(1)</script><!-- & /*@SCRIPT@*/ \xff\xfe ok \xc3\xa9";
    const std::string data = "{\"t\":" + viewer::quote(text) + "}";
    const std::string out = viewer::page({html, "body{}", "let x = 1;"}, data);
    // One </script> per script element: the data's are escaped.
    size_t n = 0;
    for (size_t at = out.find("</script"); at != std::string::npos; at = out.find("</script", at + 1)) ++n;
    CHECK(n == 2);
    CHECK(out.find("<!--") == std::string::npos);
    CHECK(out.find("let x = 1;") != std::string::npos);
    CHECK(out.find("body{}") != std::string::npos);
    // JSON.parse reads the escapes back: the text, with U+FFFD for the bad bytes.
    const json j = page_data(out);
    CHECK(j["t"] == "</script><script>alert(1)</script><!-- & /*@SCRIPT@*/ \xef\xbf\xbd\xef\xbf\xbd ok \xc3\xa9");
    CHECK(viewer::valid_utf8("\xe0\x80\x80") == "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd");  // an overlong form
    CHECK(viewer::valid_utf8("\xed\xa0\x80") == "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd");  // a surrogate
    CHECK(viewer::valid_utf8("\xf0\x9f\x98\x80") == "\xf0\x9f\x98\x80");                 // a valid 4-byte character
    // A template without a mark, or with one twice, and assets that would
    // end their element, are refused.
    CHECK_THROWS_AS(viewer::page({"<style>/*@STYLE@*/</style>", "", ""}, "{}"), std::logic_error);
    CHECK_THROWS_AS(viewer::page({html + "/*@DATA@*/", "", ""}, "{}"), std::logic_error);
    CHECK_THROWS_AS(viewer::page({html, "", "x = '</script>';"}, "{}"), std::logic_error);
    CHECK_THROWS_AS(viewer::page({html, "</style>", ""}, "{}"), std::logic_error);
}

// ---------------------------------------------------------------------------
// build/overload --view and --trace
// ---------------------------------------------------------------------------

TEST_CASE("overload --view and --trace: --json unchanged, the page's data equals --json's, no URL outside the page") {
    const std::string dir = pkv_test::program_dir();
    const std::string view = dir + "/viewer-test.html", trace = dir + "/viewer-test-trace.json";
    const std::string plain_out = overload("--json");
    if (plain_out.empty()) return;
    const std::string rec_out = overload("--json --view " + shell_quote(view) + " --trace " + shell_quote(trace));
    json plain = json::parse(plain_out), recorded = json::parse(rec_out);
    // Recording changes no token and no count (the times are the machine's).
    CHECK(plain["requests"] == recorded["requests"]);
    for (const char* k : {"num_steps", "num_preemptions_total", "recomputed_tokens_total", "num_requests_finished", "generation_tokens_total",
                          "computed_tokens_total"})
        CHECK_MESSAGE(plain["metrics"][k] == recorded["metrics"][k], k);
    const json& m = recorded["metrics"];
    REQUIRE(m["num_preemptions_total"].get<long>() > 0);

    const std::string page = slurp(view);
    const json data = page_data(page);
    CHECK(data["mode"] == "recorded");
    CHECK((long)data["steps"].size() == m["num_steps"].get<long>());
    long preempted = 0, recomputed = 0, finished = 0;
    for (const json& st : data["steps"]) {
        for (const json& c : st["chunks"]) recomputed += c["recompute"].get<long>();
        for (const json& e : st["events"]) {
            preempted += e["kind"] == "preempted";
            finished += e["kind"] == "finished" && e["reason"] != "error";
        }
    }
    CHECK(preempted == m["num_preemptions_total"].get<long>());
    CHECK(recomputed == m["recomputed_tokens_total"].get<long>());
    CHECK(finished == m["num_requests_finished"].get<long>());
    // Nothing outside the file: no address, no element that loads one, no
    // style that imports one. (The page's script builds SVG elements without
    // naming SVG's namespace URL; see examples/viewer/viewer.js.)
    for (const char* bad : {"://", "src=", "href=", "url(", "@import", "<link", "<iframe", "<img", "<object", "<embed", "fetch(",
                            "XMLHttpRequest", "import(", "srcset", "<base"})
        CHECK_MESSAGE(page.find(bad) == std::string::npos, "the page holds " << bad);
    CHECK(data["events_url"] == "");  // (a recorded page subscribes to nothing)
}

TEST_CASE("overload --view and --trace refuse, before the run, what they cannot write") {
    const std::string exe = pkv_test::need_program("overload");
    if (exe.empty()) return;
    const std::string file = pkv_test::program_dir() + "/viewer-test-a-file";
    pkv_test::run_command("touch " + shell_quote(file));
    struct Row {
        std::string args;
        int status;
        const char* says;
    };
    const std::vector<Row> rows = {
        {"--view " + shell_quote(file + "/v.html"), 1, "cannot create the folder of"},
        {"--trace " + shell_quote(file + "/t.json"), 1, "cannot create the folder of"},
        {"--view /tmp/v.html --num-blocks 5000", 2, "--view draws every block of the pool: at most 4096"},
        {"--view", 2, "--view needs a value"},
    };
    for (const Row& r : rows) {
        CAPTURE(r.args);
        const auto t0 = sse::Clock::now();
        const std::pair<std::string, int> out = pkv_test::run_command("timeout 60 " + exe + " " + r.args + " 2>&1 >/dev/null");
        CHECK(out.second == r.status);
        CHECK(out.first.find(r.says) != std::string::npos);
        CHECK(seconds_since(t0) < 5);  // refused at the door, not after a run
    }
}

TEST_CASE("overload --trace: every span closed, in time order per track, one instant per preemption") {
    const std::string dir = pkv_test::program_dir();
    const std::string trace = dir + "/viewer-test-trace2.json";
    const std::string out = overload("--json --trace " + shell_quote(trace));
    if (out.empty()) return;
    const json m = json::parse(out)["metrics"];
    const json t = json::parse(slurp(trace));
    REQUIRE(t.contains("traceEvents"));
    std::map<std::pair<int, int>, std::vector<std::string>> open;  // track -> spans open, innermost last
    std::map<std::pair<int, int>, double> last;                    // track -> its latest timestamp
    std::map<std::string, long> begun;
    long instants = 0, counters = 0, unmatched = 0, backwards = 0;
    const std::set<std::string> phases = {"waiting", "prefill", "decode", "recompute", "preempted", "paused"};
    for (const json& e : t["traceEvents"]) {
        const std::string ph = e["ph"];
        if (ph == "M") continue;
        const std::pair<int, int> track{e["pid"], e["tid"]};
        const double ts = e["ts"];
        if (last.count(track) && ts < last[track]) backwards++;
        last[track] = ts;
        if (ph == "B") {
            open[track].push_back(e["name"]);
            begun[e["name"]]++;
            if (track.first == 2) CHECK_MESSAGE(phases.count(e["name"]), e["name"]);
        } else if (ph == "E") {
            if (open[track].empty()) unmatched++;
            else open[track].pop_back();
        } else if (ph == "i") {
            instants += e["name"] == "preempted";
        } else if (ph == "C") {
            counters++;
        }
    }
    long still_open = 0;
    for (const auto& [track, spans] : open) still_open += (long)spans.size();
    CHECK(unmatched == 0);
    CHECK(still_open == 0);
    CHECK(backwards == 0);
    CHECK(instants == m["num_preemptions_total"].get<long>());
    CHECK(begun["preempted"] == m["num_preemptions_total"].get<long>());
    CHECK(begun["waiting"] == m["num_requests_finished"].get<long>());  // every request waited first (none rejected)
    CHECK(counters == 2 * m["num_steps"].get<long>());                  // KV usage and the queues, each step
    CHECK(begun["paused"] > 0);
}

// ---------------------------------------------------------------------------
// A real browser over make view's page
// ---------------------------------------------------------------------------

TEST_CASE("a headless browser over make view's page: the totals, the first preemption, three screenshots") {
    const std::string exe = need_chromium();
    if (exe.empty()) return;
    const std::string dir = std::filesystem::absolute(pkv_test::program_dir()).string();
    const std::string view = dir + "/view-browser-test.html";
    // make run's workload, its lanes (for the first preemption) and --json
    // (for the totals); the same workload is deterministic in its steps.
    const std::string lanes = overload("--view " + shell_quote(view));
    if (lanes.empty()) return;
    const json m = json::parse(overload("--json"))["metrics"];
    const std::pair<long, std::vector<int>> first = first_preemption_in_lanes(lanes);
    const long first_step = first.first;
    const std::vector<int>& victims = first.second;
    REQUIRE(first_step > 0);
    REQUIRE(!victims.empty());
    const std::string url = "file://" + view;

    // "p", as a reader presses it on the page just opened: the first
    // preemption. The totals the page shows (its own count of the records'
    // events) are the run's, whatever the step.
    const std::string pre = chromium(exe, "--dump-dom", url + "#keys=p");
    const std::string& dom = pre;
    CHECK(tag_with_id(dom, "total-steps")["data-value"] == std::to_string(m["num_steps"].get<long>()));
    CHECK(tag_with_id(dom, "total-preemptions")["data-value"] == std::to_string(m["num_preemptions_total"].get<long>()));
    CHECK(tag_with_id(dom, "total-recomputed")["data-value"] == std::to_string(m["recomputed_tokens_total"].get<long>()));
    CHECK(tag_with_id(dom, "total-finished")["data-value"] == std::to_string(m["num_requests_finished"].get<long>()));
    CHECK(text_of(dom, "status") == "");  // the page's own cross-check with the engine's counters found nothing amiss

    CHECK(tags_with(pre, "data-step").at(0)["data-step"] == std::to_string(first_step));
    const auto blocks = tags_with(pre, "data-block");
    const auto streams = tags_with(pre, "data-state");
    for (int v : victims) {
        CAPTURE(v);
        const std::string vs = std::to_string(v);
        long given_back = 0;
        for (auto b : blocks) {
            if (b["<tag>"] != "div") continue;
            std::istringstream owners(b["data-owner"]);
            for (std::string o; owners >> o;) CHECK_MESSAGE(o != vs, "victim " << v << " still holds block " << b["data-block"]);
            if (b["data-freed-by"] != vs) continue;
            ++given_back;
            CHECK(b["data-freed-kind"] == "preempted");
            // Free now, or taken at once by a request that needed a block in this step.
            const bool free = !b["data-free"].empty();
            CHECK_MESSAGE((free || b["class"].find(" new") != std::string::npos), "block " << b["data-block"]);
        }
        CHECK(given_back > 0);
        bool paused = false, event = false;
        for (auto s : streams) paused = paused || (s["data-req"] == vs && s["data-state"] == "paused" && s["<tag>"] == "div");
        for (auto e : tags_with(pre, "data-kind")) event = event || (e["data-kind"] == "preempted" && e["data-req"] == vs);
        CHECK(paused);
        CHECK(event);
    }
    // At least one of the blocks given back is still free at the step's end
    // (the others went, in the same step, to the requests that needed them).
    long free_from_victims = 0;
    for (auto b : blocks)
        if (b["<tag>"] == "div" && !b["data-freed-by"].empty() && !b["data-free"].empty()) ++free_from_victims;
    CHECK(free_from_victims > 0);

    // The other keys: four steps forward, one back, then shift+right (10 on).
    const std::string keys = chromium(exe, "--dump-dom", url + "#keys=ArrowRight,ArrowRight,ArrowRight,ArrowRight,ArrowLeft,shift+ArrowRight");
    CHECK(tags_with(keys, "data-step").at(0)["data-step"] == "14");

    // Three moments as pictures: the first step, the first preemption, the
    // last preemption (End, then shift+p).
    const std::vector<std::pair<std::string, std::string>> shots = {
        {"viewer-1-first-step.png", "#step=1"}, {"viewer-2-first-preemption.png", "#keys=p"}, {"viewer-3-last-preemption.png", "#keys=End,P"}};
    for (const auto& [name, frag] : shots) {
        const std::string png = dir + "/" + name;
        std::filesystem::remove(png);
        chromium(exe, "--screenshot=" + png, url + frag);
        CHECK_MESSAGE(png_size(png) == std::make_pair(1400, 1250), png);
    }
}

// ---------------------------------------------------------------------------
// build/serve: /view, live
// ---------------------------------------------------------------------------

TEST_CASE("serve: /view's event stream reports the preemptions /metrics counts, while loadgen runs") {
    SigpipeGuard guard;
    ServeProcess srv({});  // make run's cache: loadgen's default workload preempts
    if (!srv.running()) return;
    const std::pair<int, std::string> page = get(srv, "/view");
    CHECK(page.first == 200);
    CHECK(page.second.find("\"mode\":\"live\"") != std::string::npos);
    CHECK(page.second.find("/*@DATA@*/") == std::string::npos);
    // The live page starts in a real browser without a script error (its
    // records, which come later, are this test's to check, below).
    const std::string exe = need_chromium();
    if (!exe.empty()) CHECK(chromium(exe, "--dump-dom", "http://127.0.0.1:" + std::to_string(srv.port()) + "/view").find("live: connecting") != std::string::npos);
    ViewStream view(srv.port());
    // The page starts from a state record (the engine is idle: no step yet).
    REQUIRE(view.wait_for([](const std::vector<json>& r) { return !r.empty(); }, 20));
    CHECK(view.hello());
    CHECK(view.head().find("text/event-stream") != std::string::npos);
    const json lg = loadgen(srv.port());
    CHECK(lg["summary"]["ok"] == 24);
    const double preemptions = metric(srv, "pagedkv:num_preemptions_total");
    REQUIRE(preemptions > 0);
    // The last step's record reaches the page after the stream's last token;
    // wait for it (the engine is idle then: nothing running or waiting).
    const bool settled = view.wait_for([&](const std::vector<json>& r) {
        const json& l = r.back();
        return l["totals"]["preemptions"].get<double>() == preemptions && l["running"].empty() && l["waiting"].empty();
    }, 20);
    CHECK(settled);
    const std::vector<json> records = view.records();
    CHECK(records.front()["state"] == true);
    CHECK(preempted_events(records) == (long)preemptions);  // each preemption, as an event the page saw
    CHECK(view.dropped() == 0);
    long gaps = 0;  // steps the page did not get (a state record repeats the last step's number)
    for (size_t i = 1; i < records.size(); ++i)
        gaps += !records[i]["state"].get<bool>() && records[i]["step"].get<long>() != records[i - 1]["step"].get<long>() + 1;
    CHECK(gaps == 0);
    CHECK(records.back()["totals"]["steps"].get<long>() == records.back()["step"].get<long>());
    srv.stop();
}

TEST_CASE("serve: a page that reads nothing holds up neither the engine nor another page; its records are dropped and it is told") {
    SigpipeGuard guard;
    // A long write timeout: here the bound is the queue's, not the clock's.
    ServeProcess srv({"--write-timeout", "60"});
    if (!srv.running()) return;
    // One page, then the other: each join sends every page a state record.
    ViewStream fast(srv.port());
    REQUIRE(fast.wait_for([](const std::vector<json>& r) { return r.size() >= 1; }, 20));
    ViewStream slow(srv.port(), /*rcvbuf=*/4096, /*reading=*/false);
    REQUIRE(fast.wait_for([](const std::vector<json>& r) { return r.size() >= 2; }, 20));
    // 32 requests (--max-connections' default) of 128 tokens on make run's
    // cache: about 700 steps, over twice the records that a page's queue and
    // the kernel's buffers hold (about 270 here).
    const auto t0 = sse::Clock::now();
    std::atomic<bool> done{false};
    double worst_health = 0;
    std::thread probe([&] {
        while (!done) {
            const auto h0 = sse::Clock::now();
            CHECK(get(srv, "/health").first == 200);
            worst_health = std::max(worst_health, seconds_since(h0));
            std::this_thread::sleep_for(std::chrono::milliseconds(100));
        }
    });
    const json lg = loadgen(srv.port(), "--requests 32 --max-tokens 128");
    done = true;
    probe.join();
    INFO("loadgen took " << seconds_since(t0) << " s; the slowest /health " << worst_health << " s");
    CHECK(lg["summary"]["ok"] == 32);
    CHECK(worst_health < 2.0);
    const double preemptions = metric(srv, "pagedkv:num_preemptions_total");
    CHECK(fast.wait_for([&](const std::vector<json>& r) { return r.back()["totals"]["preemptions"].get<double>() == preemptions; }, 20));
    CHECK(preempted_events(fast.records()) == (long)preemptions);
    CHECK(fast.dropped() == 0);
    // The slow page now reads what it was sent; one more request makes
    // steps, whose records tell it how many it missed.
    slow.start_reading();
    const json more = loadgen(srv.port(), "--requests 1 --max-tokens 4");
    CHECK(more["summary"]["ok"] == 1);
    CHECK(slow.wait_for([&](const std::vector<json>& r) { return !r.empty() && r.back()["running"].empty() && r.back()["waiting"].empty(); }, 20));
    const std::vector<json> seen = slow.records();
    long missing = 0;  // steps between consecutive records it got (a state record repeats the last step's number)
    for (size_t i = 1; i < seen.size(); ++i)
        if (!seen[i]["state"].get<bool>()) missing += seen[i]["step"].get<long>() - seen[i - 1]["step"].get<long>() - 1;
    INFO("the slow page got " << seen.size() << " records, " << missing << " steps missing, told of " << slow.dropped());
    CHECK(missing > 0);
    CHECK(slow.dropped() == missing);
    CHECK(!slow.closed());
    srv.stop();
}

TEST_CASE("serve: --max-viewers caps the pages (429), 0 turns /view off (404); SIGTERM ends a page's stream") {
    SigpipeGuard guard;
    {
        ServeProcess srv({"--max-viewers", "1"});
        if (!srv.running()) return;
        ViewStream one(srv.port());
        REQUIRE(one.wait_for([](const std::vector<json>& r) { return !r.empty(); }, 20));
        const Reply second = raw(srv.port(), "GET /view/events HTTP/1.1\r\nHost: x\r\n\r\n", 10);
        CHECK(second.status == 429);
        CHECK(second.header("Retry-After") == "1");
        CHECK(second.body.find("--max-viewers") != std::string::npos);
        const auto t0 = sse::Clock::now();
        srv.stop();  // (checks a clean exit)
        CHECK(seconds_since(t0) < 5);
        CHECK(one.wait_for([&](const std::vector<json>&) { return one.closed(); }, 10));
    }
    ServeProcess off({"--max-viewers", "0"});
    if (!off.running()) return;
    CHECK(get(off, "/view").first == 404);
    CHECK(raw(off.port(), "GET /view/events HTTP/1.1\r\nHost: x\r\n\r\n", 10).status == 404);
    CHECK(get(off, "/health").first == 200);
    off.stop();
}

}  // TEST_SUITE("viewer")

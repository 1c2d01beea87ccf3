#!/usr/bin/env bash
# The server's hand-over under ThreadSanitizer (`make tsan-serve`, part of
# `make tsan`). DIR/serve and DIR/loadgen are built with -fsanitize=thread;
# for a few seconds we give the server everything that crosses threads:
#   - concurrent streams on `make run`'s cache, so the scheduler preempts
#     (events flow engine thread -> channels -> workers);
#   - a --max-waiting that sheds some of them with 429 (the edge's count,
#     shared by workers and the engine thread);
#   - clients that hang up mid-stream (aborts, worker -> engine thread);
#   - /metrics scrapes (rendered on the engine thread, posted back);
#   - a page watching /view/events (the recorder on the engine thread, its
#     records posted to the I/O thread with the step's tokens);
#   - a client trickling its request line (answered by the read timeout);
#   - SIGTERM with streams in flight: they are cut at --shutdown-timeout with
#     an error event (the I/O thread aborts, then stops the engine thread).
# Any ThreadSanitizer report, a broken stream or an unclean exit fails it.
# Usage: tests/tsan_serve.sh DIR   (from the repository root)
set -u
dir=${1:-build/tsan}
tmp=$(mktemp -d)
trap 'kill $pid 2>/dev/null; [ -n "${KEEP_TMP:-}" ] || rm -rf "$tmp"' EXIT
export TSAN_OPTIONS="halt_on_error=0 exitcode=66 suppressions=$(pwd)/tests/tsan_serve.supp ${TSAN_OPTIONS:-}"
fail() { echo "tsan_serve: FAILED: $*"; for f in "$tmp"/*.err; do [ -s "$f" ] && { echo "--- $f"; head -60 "$f"; }; done; exit 1; }

"$dir/serve" --port 0 --max-waiting 6 --max-connections 24 --shutdown-timeout 1 > "$tmp/serve.out" 2> "$tmp/serve.err" &
pid=$!
port=
for _ in $(seq 1 600); do
    port=$(sed -n 's/^listening on http:\/\/127\.0\.0\.1:\([0-9]*\)$/\1/p' "$tmp/serve.out")
    [ -n "$port" ] && break
    kill -0 $pid 2>/dev/null || fail "the server exited before listening"
    sleep 0.1
done
[ -n "$port" ] || fail "the server did not start listening within 60 s"

url=http://127.0.0.1:$port
long='{"prompt": "once upon a time", "max_tokens": 400, "ignore_eos": true, "temperature": 0, "stream": true}'
# A page watching the engine, for the whole run (stopped by its pid below).
curl -sN --max-time 120 "$url/view/events" > "$tmp/view.out" 2>/dev/null &
viewer=$!
# Streams with preemptions, some shed and retried (loadgen), ...
"$dir/loadgen" --port "$port" --requests 16 --max-tokens 48 --retries 3 --json > "$tmp/loadgen.out" 2> "$tmp/loadgen.err" &
lg=$!
# ... clients that hang up mid-stream, and scrapes, all at the same time.
for i in 1 2 3 4; do
    curl -sN --max-time 0.$((2 + i)) "$url/v1/completions" -H 'Content-Type: application/json' -d "$long" > /dev/null 2>&1 &
done
for i in 1 2 3 4 5; do curl -s --max-time 20 "$url/metrics" > "$tmp/metrics.$i" 2>/dev/null & sleep 0.1; done
# A client that trickles its request line, a byte every 0.3 s (bash's /dev/tcp).
( exec 3<>"/dev/tcp/127.0.0.1/$port"; for c in G E T ' ' /; do printf %s "$c" >&3; sleep 0.3; done; exec 3>&- ) 2>/dev/null &
wait $lg
lg_rc=$?
kill $viewer 2>/dev/null; wait $viewer 2>/dev/null
grep -q '^event: step' "$tmp/view.out" || fail "the page on /view/events got no step record"
wait_curls() { for j in $(jobs -p); do [ "$j" = "$pid" ] || wait "$j"; done; }
wait_curls
curl -s --max-time 20 "$url/metrics" > "$tmp/metrics.end"

# Two long streams, then SIGTERM: each must end with an error event and [DONE].
for i in 1 2; do curl -sN --max-time 20 "$url/v1/completions" -H 'Content-Type: application/json' -d "$long" > "$tmp/cut.$i" 2>/dev/null & done
for _ in $(seq 1 100); do [ -s "$tmp/cut.1" ] && [ -s "$tmp/cut.2" ] && break; sleep 0.1; done
kill -TERM $pid
for _ in $(seq 1 300); do kill -0 $pid 2>/dev/null || break; sleep 0.1; done
kill -0 $pid 2>/dev/null && fail "the server did not stop within 30 s of SIGTERM"
wait $pid
rc=$?
pid=

grep -q "ThreadSanitizer" "$tmp/serve.err" && fail "ThreadSanitizer reports in the server"
grep -q "ThreadSanitizer" "$tmp/loadgen.err" && fail "ThreadSanitizer reports in loadgen"
[ $rc -eq 0 ] || fail "the server exited with status $rc"
[ $lg_rc -eq 0 ] || fail "loadgen exited with status $lg_rc (a broken stream?)"
wait_curls
for i in 1 2; do
    grep -q '"code":"server_shutdown"' "$tmp/cut.$i" && tail -c 15 "$tmp/cut.$i" | grep -q 'data: \[DONE\]' ||
        fail "stream $i was not ended with an error event and [DONE] at shutdown: $(tail -c 300 "$tmp/cut.$i")"
done
# (every sample has a model_name label; request_success_total is by finished_reason)
get() { sed -n "s/^pagedkv:$1{[^}]*} \([0-9.e+]*\)$/\1/p" "$tmp/metrics.end" | awk '{ s += $1 } END { print s }'; }
shed=$(sed -n 's/^pagedkv:http_shed_total{.*reason="queue_full"} \([0-9]*\)$/\1/p' "$tmp/metrics.end")
echo "tsan_serve: $(sed -n 's/^pagedkv:request_success_total{.*finished_reason="\(stop\|length\)"} \([0-9]*\)$/\2/p' "$tmp/metrics.end" | awk '{ s += $1 } END { print s }') requests finished, $(get num_preemptions_total) preemptions," \
     "$(get request_aborted_total) aborted by clients that hung up, ${shed:-?} shed with 429;" \
     "no ThreadSanitizer report, clean exit"

#!/usr/bin/env bash
# tests/run_suite.sh BIN [DOCTEST ARGS...] -- how `make test` runs the doctest
# binary (BIN, build/tests): on two cores, as two processes side by side.
#
# The suite is one binary, and doctest runs its test cases one after another,
# so on its own it keeps one core busy. Alone, the suites named in HEAVY below
# (the simulator's, the soak, the bad-input table and fuzz, the server's) take
# about as long as all the others together (the viewer's browser test and the
# studies' among them): the first process runs HEAVY, the second every other
# suite (doctest's -ts and -tse, on the same list), so no test is left out or
# run twice, and one added later runs in the second. Each process's report is
# printed whole, the first's then the second's, and a last line adds them up;
# the exit status is 0 only if both passed.
#
# One process, as before, when this machine has one core or when arguments are
# given (a filter such as -ts=kernels picks its own tests: run it as asked).
set -u
bin=${1:?usage: tests/run_suite.sh BIN [DOCTEST ARGS...]}
shift
HEAVY="sim,soak,bad_input,serve"
if [ "$#" -gt 0 ] || [ "$(nproc 2>/dev/null || echo 1)" -lt 2 ]; then exec "$bin" "$@"; fi

tmp=$(mktemp -d "${TMPDIR:-/tmp}/run_suite.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
"$bin" -ts="$HEAVY" > "$tmp/1.log" 2>&1 & first=$!
"$bin" -tse="$HEAVY" > "$tmp/2.log" 2>&1 & second=$!
rc1=0; wait "$first" || rc1=$?
rc2=0; wait "$second" || rc2=$?
echo "== build/tests -ts=$HEAVY (exit status $rc1)"
cat "$tmp/1.log"
echo "== build/tests -tse=$HEAVY (exit status $rc2)"
cat "$tmp/2.log"
# doctest's own count line: "[doctest] test cases: 190 | 190 passed | 0 failed | 0 skipped"
# (0 when a process ended without one: its exit status says why.)
count() { awk -v f="$2" '/^\[doctest\] test cases:/ { gsub(/[|]/, " "); n = $(f) } END { print n + 0 }' "$1"; }
total=$(( $(count "$tmp/1.log" 4) + $(count "$tmp/2.log" 4) ))
passed=$(( $(count "$tmp/1.log" 5) + $(count "$tmp/2.log" 5) ))
failed=$(( $(count "$tmp/1.log" 7) + $(count "$tmp/2.log" 7) ))
if [ "$rc1" -eq 0 ] && [ "$rc2" -eq 0 ]; then
    echo "tests: $total test cases in two processes: $passed passed, $failed failed: SUCCESS"
    exit 0
fi
echo "tests: $total test cases in two processes: $passed passed, $failed failed: FAILURE (exit statuses $rc1 and $rc2; the reports above say which)"
exit 1

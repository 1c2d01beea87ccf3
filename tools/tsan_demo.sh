#!/usr/bin/env bash
# tools/tsan_demo.sh -- deletes one barrier from the paged-attention kernel, in a
# copy of the sources, and shows ThreadSanitizer finding the data race that
# follows. TUTORIAL.md chapter 8 ("A missing syncthreads()") runs it.
#
#   tools/tsan_demo.sh          (from anywhere; about a minute the first time)
#
# Why a script. The tutorial's claim is "ThreadSanitizer knows what a barrier
# orders in the emulated kernels (cuda_emulation.hpp declares it), so a missing
# barrier is a data race that TSan reports". A claim like
# that should be re-provable by anyone, unattended, on every change: so the
# edit is made by a program, found by a marker in the source (the comment
# "// 3. Online softmax", with the statement `syncthreads();` right above it)
# and never by a line number, and the result is checked, not eyeballed.
#
# What it does:
#   1. copies the repository (without build/ and .git/) to a temporary folder;
#      the working tree is never touched, and the copy is removed at the end;
#   2. deletes, in the copy's paged_kv.cuh, the `syncthreads();` line right
#      above "// 3. Online softmax" and shows that change; if the marker or the
#      statement is not there, it stops and says so (the demo then needs the
#      same update as the kernel);
#   3. builds the kernel tests in the copy as `make tsan` builds them
#      (tests/main.cpp + tests/test_kernels.cpp, -O1 -g1 -fsanitize=thread); the
#      binary is kept in build/tsan_demo/HASH/, HASH naming the copied sources
#      and the compiler, so a second run with the same sources skips the build;
#   4. runs the paged-attention test with TSAN_OPTIONS=halt_on_error=1, so
#      ThreadSanitizer stops at its first report, and prints that report
#      trimmed to its accesses (the full one names every frame with its
#      template arguments);
#   5. reads the source line of each access in the edited copy and says which
#      step of the kernel it belongs to.
# Exit status 0 when TSan reported a race between step 2 (a score written to
# shared memory) and step 3 (the online softmax reading or overwriting it),
# which is what a missing barrier there must cause; 1 when it did not; 2 when
# the demo itself cannot run (marker gone, build failed).
#
# Which of step 3's statements TSan catches first (the read that finds the
# tile's max, or the write of an exponential) depends on the order in which the
# emulation runs the threads (the same every run with fibers, but another with
# another design), and so does which access it calls "previous": the tutorial's
# listing elides those lines. Addresses, thread numbers, pids and line numbers
# change from run to run or with every edit of the file, and are marked there.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
CXX=${CXX:-g++}
say() { echo "tsan_demo: $*"; }
die() { echo "tsan_demo: $*" >&2; exit 2; }

work=$(mktemp -d "${TMPDIR:-/tmp}/tsan_demo.XXXXXX")
trap 'rm -rf "$work"' EXIT

# 1. The copy.
tar -C "$root" --exclude=./build --exclude=./.git -cf - . | tar -C "$work" -xf -

# 2. The one-line change, by marker. awk holds each line back by one, so it can
# drop a `syncthreads();` line when the line after it is the step-3 comment.
marker='// 3. Online softmax'
awk -v marker="$marker" '
    held_ok && index($0, marker) > 0 && held ~ /^[ \t]*syncthreads\(\);[ \t]*$/ { removed++; at = NR - 1; held_ok = 0 }
    held_ok { print held }
    { held = $0; held_ok = 1 }
    END { if (held_ok) print held; print (removed == 1 ? at : 0) > "/dev/stderr" }
' "$root/paged_kv.cuh" > "$work/paged_kv.cuh" 2> "$work/removed_at"
at=$(cat "$work/removed_at")
[ "$at" -gt 0 ] || die "found no 'syncthreads();' line right above '$marker' in paged_kv.cuh: the kernel changed, and this demo must follow it"
say "in a copy of the sources, delete the barrier between step 2 and step 3 of paged_attention_kernel:"
sed -n "$((at - 2)),$((at + 2))p" "$root/paged_kv.cuh" | awk -v mid=3 '{ printf "%s %s\n", (NR == mid ? "-" : " "), $0 }'

# 3. The build, reused when the same sources were built before. The hash
# covers every file the kernel tests can include, and the compiler.
flags=(-O1 -g1 -fsanitize=thread -std=c++20 -Wall -Wextra -Werror -ffp-contract=off -Wno-unknown-pragmas -I.
       ${DOCTEST_INC:+-I"$DOCTEST_INC"} -isystem "$root/build/deps/include")
key=$( (cd "$work" && cat ./*.hpp ./*.cuh core/* tiny_model/* lab/*.hpp lab/*.cuh tests/*.hpp tests/main.cpp tests/test_kernels.cpp examples/*.hpp 2>/dev/null; "$CXX" --version; echo "${flags[*]}") | sha256sum | cut -c1-16)
cache="$root/build/tsan_demo"
bin="$cache/$key/kernel_tests"
say "build the kernel tests in the copy with -fsanitize=thread, run the paged_attention test"
if [ ! -x "$bin" ]; then
    rm -rf "$cache"  # an older build, of older sources
    mkdir -p "$cache/$key"
    # Built inside the copy with relative paths, so reports name paged_kv.cuh.
    (cd "$work" && "$CXX" "${flags[@]}" tests/main.cpp tests/test_kernels.cpp -o kernel_tests) > "$work/build.log" 2>&1 ||
        { cat "$work/build.log" >&2; die "the build failed"; }
    cp "$work/kernel_tests" "$bin.tmp" && mv "$bin.tmp" "$bin"
fi

# 4. The run: ThreadSanitizer stops at its first report (exit status 66).
set +e
(cd "$work" && TSAN_OPTIONS="halt_on_error=1 exitcode=66 ${TSAN_OPTIONS:-}" \
    "$bin" -ts=kernels -tc='paged_attention kernel matches paged_attention_ref' > "$work/run.log" 2>&1)
rc=$?
set -e
if ! grep -q '^WARNING: ThreadSanitizer: data race' "$work/run.log"; then
    tail -n 20 "$work/run.log"
    say "no data race reported (exit status $rc): ThreadSanitizer did not see the missing barrier"
    exit 1
fi
say "ThreadSanitizer's first report, trimmed to its two accesses:"
# The report runs from the WARNING line to the closing "=====" line; keep the
# access lines, each one's innermost frame (#0), and the SUMMARY.
awk '
    /^WARNING: ThreadSanitizer: data race/ { on = 1; print "=================="; print; next }
    !on { next }
    /^==================/ { print; exit }
    /^  [A-Za-z ]*([Rr]ead|[Ww]rite) of size [0-9]+ at / { print; want = 1; next }
    want && /^ +#0 / { print; want = 0; next }
    /^SUMMARY: / { print }
' "$work/run.log"

# 5. Which statements raced: the report's "#0" frames point at lines of the
# edited copy; the step is the last "// N." comment of the kernel above a line.
mapfile -t at_lines < <(awk '
    /^WARNING: ThreadSanitizer/ { on = 1 }
    on && /^ +#0 .*paged_attention_kernel.*paged_kv\.cuh:[0-9]+/ { match($0, /paged_kv\.cuh:[0-9]+/); print substr($0, RSTART + 13, RLENGTH - 13) }
    on && /^==================/ { exit }
' "$work/run.log")
if [ "${#at_lines[@]}" -ne 2 ]; then
    say "ThreadSanitizer reported a race, but not two accesses in paged_attention_kernel (see above)"
    exit 1
fi
found=()
for line in "${at_lines[@]}"; do
    code=$(sed -n "${line}p" "$work/paged_kv.cuh" | sed 's/^[ \t]*//')
    step=$(head -n "$line" "$work/paged_kv.cuh" | grep -o '^[ \t]*// [1-4]\. ' | tail -n 1 | tr -dc '0-9')
    found+=("$step|$line|$code")
done
say "the two accesses, by the statement at their line in the edited copy (step 2 first):"
steps=""
while IFS='|' read -r step line code; do
    printf '  step %s, paged_kv.cuh:%s:  %s\n' "$step" "$line" "$code"
    steps="$steps$step"
done < <(printf '%s\n' "${found[@]}" | sort -t'|' -k1,1n)
if [ "$steps" = "23" ]; then
    say "a data race where the barrier was: step 2 writes the tile's scores while step 3 reads or overwrites them"
    exit 0
fi
say "the race is not between step 2 and step 3 (steps $steps): not what a missing barrier there causes"
exit 1

#!/usr/bin/env bash
# tools/vs_runc.sh -- our `generate` against llama2.c's run.c, whole runs side by side.
#
#   tools/vs_runc.sh [RUNS]          (from anywhere; RUNS per program, default 7)
#   make vs-runc                     (the same, RUNS=7)
#
# What it measures: the wall-clock time of one whole run of each program --
# start-up (loading the checkpoint and the tokenizer) plus 256 positions of
# greedy generation -- on one thread, on a stories15M-shaped checkpoint with
# random weights (dim 288, 6 layers, 6 heads, vocab 32000, context 256; the
# speed does not depend on the weights). That is the figure a user of either
# program feels, and the one the TUTORIAL's table in chapter 8 reports.
#
# How:
#   1. run.c is not ours and is never committed: the script expects llama2.c's
#      repository (run.c and its tokenizer.bin) in build/llama2.c, or wherever
#      LLAMA2C points, and says how to get it when it is not there;
#   2. it builds run.c as llama2.c's README says for one thread
#      (gcc -Ofast -o run run.c -lm), into build/llama2.c/run, and our
#      build/generate and build/bench_cpu with make;
#   3. build/bench_cpu --save-checkpoint writes the checkpoint (its own
#      benchmark model) to build/llama2.c/stories15M_random.bin, once;
#   4. one untimed run of each warms the page cache; then RUNS rounds, each
#      running both programs in turn, alternating which goes first (so a
#      change in the machine's load hits both alike), with
#        run.c:    build/llama2.c/run CKPT -z tokenizer.bin -t 0 -n 256 -i "Once upon a time"
#        ours:     build/generate     CKPT -z tokenizer.bin -t 0 -n 256 -i "Once upon a time"
#      and OMP_NUM_THREADS=1 for both (our thread knob: the CPU forward uses at
#      most omp_get_max_threads() threads);
#   5. it prints each program's median wall time and CPU time (user + system,
#      which other work on a shared machine disturbs less), the ratios run.c /
#      ours (above 1: we are faster), the load average before and after, and
#      whether the two printed the same text (greedy decoding of the same weights; run.c's
#      -Ofast may reorder sums, so a difference is possible, and said).
# GENERATE=path times that binary instead of build/generate (to compare an
# older build on the same footing).
# Exit status 0 when it measured, 2 when it could not (run.c missing, a build
# or a run failed).
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
runs=${1:-7}
[[ "$runs" =~ ^[1-9][0-9]*$ ]] || { echo "vs_runc: RUNS must be a positive integer, got '$runs'" >&2; exit 2; }
llama=${LLAMA2C:-$root/build/llama2.c}
gen=${GENERATE:-build/generate}  # another build of generate to time instead (an older one, say)
say() { echo "vs_runc: $*"; }
die() { echo "vs_runc: $*" >&2; exit 2; }

if [ ! -f "$llama/run.c" ] || [ ! -f "$llama/tokenizer.bin" ]; then
    die "no llama2.c in $llama (run.c and tokenizer.bin): git clone https://github.com/karpathy/llama2.c $root/build/llama2.c, or set LLAMA2C"
fi
cd "$root"
say "building run.c (gcc -Ofast) and our generate, bench_cpu"
gcc -Ofast -o "$llama/run" "$llama/run.c" -lm || die "run.c did not build"
make -s build/generate build/bench_cpu || die "make failed"
ckpt=$llama/stories15M_random.bin
if [ ! -f "$ckpt" ]; then
    build/bench_cpu --save-checkpoint "$ckpt" > /dev/null || die "bench_cpu --save-checkpoint failed"
fi
tok=$llama/tokenizer.bin
args=("$ckpt" -z "$tok" -t 0 -n 256 -i "Once upon a time")
export OMP_NUM_THREADS=1

work=$(mktemp -d "${TMPDIR:-/tmp}/vs_runc.XXXXXX")
trap 'rm -rf "$work"' EXIT
# One timed run: "wall cpu" seconds on stdout (cpu = user + system, which
# another process on the machine disturbs far less than wall time); the
# program's text in $work/$1.txt.
timed() {
    local name=$1 t
    shift
    t=$( { TIMEFORMAT='%R %U %S'; time "$@" > "$work/$name.txt" 2> "$work/$name.err"; } 2>&1 ) ||
        { cat "$work/$name.err" >&2; die "$name failed"; }
    awk '{ printf "%.3f %.3f\n", $1, $2 + $3 }' <<< "$t"
}
# The median of column $1 of stdin.
median() { awk -v c="$1" '{ print $c }' | sort -g | awk '{ v[NR] = $1 } END { if (NR % 2) print v[(NR + 1) / 2]; else print (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

say "load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
timed runc "$llama/run" "${args[@]}" > /dev/null  # warm the page cache
timed ours "$gen" "${args[@]}" > /dev/null
: > "$work/runc.times"
: > "$work/ours.times"
for ((i = 1; i <= runs; i++)); do
    if ((i % 2)); then
        timed runc "$llama/run" "${args[@]}" >> "$work/runc.times"
        timed ours "$gen" "${args[@]}" >> "$work/ours.times"
    else
        timed ours "$gen" "${args[@]}" >> "$work/ours.times"
        timed runc "$llama/run" "${args[@]}" >> "$work/runc.times"
    fi
done
say "load average after:  $(cut -d' ' -f1-3 /proc/loadavg)"
rw=$(median 1 < "$work/runc.times"); rc=$(median 2 < "$work/runc.times")
ow=$(median 1 < "$work/ours.times"); oc=$(median 2 < "$work/ours.times")
printf 'vs_runc: median of %d runs, 1 thread, whole run (load + 256 positions):\n' "$runs"
printf 'vs_runc:   run.c -Ofast       wall %.3f s  cpu %.3f s  (wall: %s)\n' "$rw" "$rc" "$(awk '{ print $1 }' "$work/runc.times" | sort -g | xargs)"
printf 'vs_runc:   pagedkv generate   wall %.3f s  cpu %.3f s  (wall: %s)\n' "$ow" "$oc" "$(awk '{ print $1 }' "$work/ours.times" | sort -g | xargs)"
printf 'vs_runc: ratio run.c / generate: wall %.2fx, cpu %.2fx (above 1: generate is faster)\n' \
    "$(awk -v a="$rw" -v b="$ow" 'BEGIN { print a / b }')" "$(awk -v a="$rc" -v b="$oc" 'BEGIN { print a / b }')"
if cmp -s "$work/runc.txt" "$work/ours.txt"; then say "both printed the same text"; else say "the two printed different text (see above why that can happen)"; fi

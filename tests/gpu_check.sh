#!/usr/bin/env bash
# tests/gpu_check.sh -- everything that needs a real GPU, in one run of at most
# 600 s, written so that the one run we get on a rented GPU is never wasted.
#
#   bash tests/gpu_check.sh                 # on a machine with nvcc and an NVIDIA GPU
#   DEADLINE_S=300 bash tests/gpu_check.sh  # a shorter global deadline (default 540 s)
#
# Through a remote runner (it copies the working tree plus the ignored folders
# it is told to carry, runs one command under a time cap, and returns what the
# command wrote under $OUT; there is no network on the GPU machine):
#   1. here, first, put what cannot be downloaded there into ignored folders:
#        mkdir -p build/deps/include && cp -r /usr/include/doctest build/deps/include/   # the test framework
#        mkdir -p .gpu_models && cp ../shared/models/stories260K.bin ../shared/models/tok512.bin .gpu_models/
#   2. run   command "bash tests/gpu_check.sh"   carry ["build/deps", ".gpu_models"]   timeout_s 600
#      (keep DEADLINE_S at least 60 s under timeout_s: the summary and the copy back need time);
#   3. read $OUT/gpu_report.txt (the summary) and $OUT/<step>.log (each step's whole output).
#
# The steps, each with its own log, streamed as it runs (so a step killed by
# the deadline still leaves its output behind):
#   probe            nvcc present, nvidia-smi answers, a device query finds a GPU;
#                    without them everything else is SKIP and the run FAILs within seconds
#   build            nvcc: every example and the test binary (`make -k cuda`; without
#                    doctest, only the programs run below, and the test steps are INCOMPLETE)
#   tests            the whole doctest suite on the GPU, PAGEDKV_REQUIRE_GPU=1 (a test that
#                    skips for want of a GPU fails), PAGEDKV_REQUIRE_MODELS=1 when models are here
#   bench_attention  every kernel x shape x KV dtype: GB/s, % of peak and of a D2D copy, PASS/FAIL
#   generate-*       generate --device cuda vs --device cpu, greedy: the built-in model, and
#                    stories260K when $PAGEDKV_MODELS, .gpu_models/ or ../shared/models has it
#   overload-*       overload --device cuda and --device cpu, useful tok/s side by side
#   memcheck, racecheck, synccheck
#                    compute-sanitizer over the kernel, KV-dtype and swap suites
#                    (UNAVAILABLE, which is not a pass, when compute-sanitizer is missing)
# Each step ends PASS, FAIL, SKIP (could not run: no GPU, no input), UNAVAILABLE
# (a tool is missing) or INCOMPLETE (killed by its limit or the deadline, or not
# reached). The run PASSes only if every required step PASSed; only the
# stories260K comparison may be skipped (when no models travelled). The summary
# is written whatever happens (trap on EXIT, INT, TERM). Exit status 0 = PASS.
set -u
cd "$(dirname "$0")/.." || exit 2

# nvcc, compute-sanitizer and the device query live in /usr/local/cuda/bin,
# which a fresh machine often leaves off PATH. First, so that a distribution's
# older nvcc in /usr/bin does not win.
export PATH="/usr/local/cuda/bin:$PATH"
# Everything this run writes goes under $OUT: the runner returns only that.
# Absolute, because the steps run from the repository root.
OUT=${OUT:-./gpu_check_out}
mkdir -p "$OUT" || exit 2
OUT=$(cd "$OUT" && pwd)
REPORT="$OUT/gpu_report.txt"
DEADLINE_S=${DEADLINE_S:-540}
case $DEADLINE_S in
    '' | *[!0-9]*) echo "gpu_check: DEADLINE_S must be a whole number of seconds, got '$DEADLINE_S'" >&2; exit 2 ;;
esac
# One deadline for the whole run, not a budget per step: a step's limit is its
# own cap or the time left, whichever is less, so a slow build shortens what
# follows instead of pushing the run past the runner's 600 s, where it would
# be killed without a summary.
START=$(date +%s)
DEADLINE_AT=$((START + DEADLINE_S))
RESERVE_S=10      # kept back at the end for the summary
CUDA_BUILD=${CUDA_BUILD:-build/cuda}  # where `make cuda` puts its programs (the Makefile's CUDA_BUILD)
JOBS=$(nproc 2>/dev/null || echo 4)

# ---- the table of steps ------------------------------------------------------
# Every step is listed up front as "not reached", so a run cut short still
# shows what it never got to.
STEPS=(probe build tests bench_attention generate-builtin generate-stories260K overload-cuda overload-cpu memcheck racecheck synccheck)
OPTIONAL=" generate-stories260K "
declare -A STATUS NOTE SECS
for s in "${STEPS[@]}"; do STATUS[$s]=INCOMPLETE; NOTE[$s]="not reached"; SECS[$s]=-; done
HEADER=()   # lines for the top of the summary
EXTRA=()    # lines for the bottom (RESULT lines, throughput)

say() { echo "gpu_check: $*"; }
set_status() { STATUS[$1]=$2; NOTE[$1]=${3:-}; say "$1: $2${3:+ ($3)}"; }
left() { echo $((DEADLINE_AT - $(date +%s) - RESERVE_S)); }

summary() {
    {
        echo "pagedkv GPU check, $(date -u -d "@$START" +%Y-%m-%dT%H:%M:%SZ), $(($(date +%s) - START)) s of a ${DEADLINE_S} s deadline"
        printf '%s\n' "${HEADER[@]}"
        echo
        printf '%-22s %-12s %6s  %s\n' step status time note
        local fails=""
        for s in "${STEPS[@]}"; do
            printf '%-22s %-12s %6s  %s\n' "$s" "${STATUS[$s]}" "${SECS[$s]}" "${NOTE[$s]}"
            if [ "${STATUS[$s]}" != PASS ] && ! { [[ $OPTIONAL == *" $s "* ]] && [ "${STATUS[$s]}" = SKIP ]; }; then
                fails+=" $s"
            fi
        done
        if [ ${#EXTRA[@]} -gt 0 ]; then echo; printf '%s\n' "${EXTRA[@]}"; fi
        echo
        if [ -z "$fails" ]; then echo "overall: PASS"; else echo "overall: FAIL (not PASS:$fails)"; fi
        echo "logs: $OUT/<step>.log"
    } > "$REPORT"
    echo "==================== summary ($REPORT)"
    cat "$REPORT"
    grep -q '^overall: PASS' "$REPORT"
}

CHILD=""
on_exit() {
    local rc
    summary
    rc=$?
    trap - EXIT
    exit $rc
}
on_signal() {
    [ -n "$CHILD" ] && kill -TERM -- "-$CHILD" "$CHILD" 2>/dev/null
    for s in "${STEPS[@]}"; do
        [ "${NOTE[$s]}" = running ] && { STATUS[$s]=INCOMPLETE; NOTE[$s]="interrupted by a signal"; }
    done
    exit 1  # runs on_exit
}
trap on_exit EXIT
trap on_signal INT TERM

# run_step NAME CAP CMD...: runs CMD with its output (stdout and stderr) going
# straight to $OUT/NAME.log, for at most CAP seconds and never past the global
# deadline. Sets the step's status from the exit status; returns it.
run_step() {
    local name=$1 cap=$2
    shift 2
    local log="$OUT/$name.log" limit t0 rc
    limit=$(left)
    if [ "$limit" -lt 5 ]; then
        set_status "$name" INCOMPLETE "not started: the ${DEADLINE_S} s deadline was reached"
        return 124
    fi
    local cut=""
    if [ "$cap" -lt "$limit" ]; then limit=$cap; else cut=" (cut short by the global deadline)"; fi
    echo "\$ $* (limit ${limit} s)" > "$log"
    NOTE[$name]=running
    say "$name: running (limit ${limit} s, log $log)"
    t0=$(date +%s)
    # In the background, so that a TERM sent to this script is handled at once
    # (bash runs a trap only after a foreground child returns). timeout puts
    # itself and CMD in a process group of their own, whose id is its pid:
    # on_signal kills that group as a whole.
    timeout -k 5 "$limit" "$@" >> "$log" 2>&1 < /dev/null &
    CHILD=$!
    wait "$CHILD"
    rc=$?
    CHILD=""
    SECS[$name]="$(($(date +%s) - t0)) s"
    case $rc in
        0) set_status "$name" PASS ;;
        124 | 137) set_status "$name" INCOMPLETE "killed after ${limit} s$cut" ;;
        *) set_status "$name" FAIL "exit status $rc, see $name.log" ;;
    esac
    return $rc
}
# skip_rest STATUS NOTE: every step not yet run gets STATUS.
# extra LOG PATTERN HEAD: for the summary's bottom, HEAD and the lines of LOG
# that match PATTERN (an extended regex), if the step ran at all.
extra() {
    [ -f "$1" ] || return 0
    EXTRA+=("$3")
    while IFS= read -r line; do EXTRA+=("   $line"); done < <(grep -E -- "$2" "$1" | head -n 40)
}
skip_rest() {
    for s in "${STEPS[@]}"; do
        [ "${NOTE[$s]}" = "not reached" ] && { STATUS[$s]=$1; NOTE[$s]=$2; }
    done
}

# ---- what is here ------------------------------------------------------------
if COMMIT=$(git rev-parse --short HEAD 2>/dev/null); then
    git diff --quiet HEAD 2>/dev/null || COMMIT+=" + uncommitted changes"
else
    COMMIT="? (no git repository here)"
fi
HEADER+=("tree: commit $COMMIT")
# doctest: the system package, or a copy carried in build/deps/include or .doctest/.
DOCTEST_INC=""
for d in /usr/include "$PWD/build/deps/include" "$PWD/.doctest"; do
    if [ -f "$d/doctest/doctest.h" ]; then DOCTEST_INC=$d; break; fi
done
HEADER+=("doctest: ${DOCTEST_INC:-not found (looked in /usr/include, build/deps/include, .doctest): test steps INCOMPLETE}")
# Models: $PAGEDKV_MODELS, else the carried .gpu_models/, else ../shared/models.
MODELS=${PAGEDKV_MODELS:-}
if [ -z "$MODELS" ]; then
    for d in "$PWD/.gpu_models" ../shared/models; do
        if [ -f "$d/stories260K.bin" ]; then MODELS=$(cd "$d" && pwd); break; fi
    done
fi
if [ -n "$MODELS" ] && [ -f "$MODELS/stories260K.bin" ] && [ -f "$MODELS/tok512.bin" ]; then
    export PAGEDKV_MODELS=$MODELS PAGEDKV_REQUIRE_MODELS=1
    HEADER+=("models: $MODELS (model tests required to run)")
else
    MODELS=""
    HEADER+=("models: none (set PAGEDKV_MODELS or carry .gpu_models/ with stories260K.bin and tok512.bin)")
fi
SANITIZER=$(command -v compute-sanitizer || true)
[ -z "$SANITIZER" ] && [ -x /usr/local/cuda/compute-sanitizer/compute-sanitizer ] && SANITIZER=/usr/local/cuda/compute-sanitizer/compute-sanitizer
HEADER+=("compute-sanitizer: ${SANITIZER:-not found (PATH, /usr/local/cuda/bin)}")

# ---- probe: fail fast without nvcc or a GPU ----------------------------------
probe() {
    local t0 log="$OUT/probe.log" why=""
    t0=$(date +%s)
    NOTE[probe]=running
    {
        if ! command -v nvcc > /dev/null; then
            why="no nvcc (looked in PATH and /usr/local/cuda/bin)"
        else
            nvcc --version
        fi
        if [ -z "$why" ]; then
            if ! command -v nvidia-smi > /dev/null; then
                why="no usable GPU: nvidia-smi not found (no NVIDIA driver)"
            elif ! timeout 30 nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; then
                why="no usable GPU: nvidia-smi failed"
            fi
        fi
        # The device query nvcc itself uses for -arch=native: it creates a CUDA
        # context, so it fails where the driver sees a GPU the runtime cannot use.
        if [ -z "$why" ] && command -v __nvcc_device_query > /dev/null; then
            local cc
            if ! cc=$(timeout 30 __nvcc_device_query) || [ -z "$cc" ]; then
                why="no usable GPU: the CUDA device query failed"
            else
                echo "device query: compute capability $cc"
            fi
        fi
        echo "${why:-ok}"
    } > "$log" 2>&1
    why=$(tail -n 1 "$log")
    SECS[probe]="$(($(date +%s) - t0)) s"
    if [ "$why" != ok ]; then
        echo "gpu_check: $why" >&2
        set_status probe FAIL "$why"
        return 1
    fi
    set_status probe PASS
}
if command -v nvcc > /dev/null; then HEADER+=("nvcc: $(nvcc --version | grep -m 1 release)"); else HEADER+=("nvcc: not found"); fi
if ! probe; then
    skip_rest SKIP "no usable GPU or nvcc (see probe.log)"
    exit 1
fi
HEADER+=("GPU: $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | head -n 1)")

# ---- build -------------------------------------------------------------------
# Only what is run: with doctest, every example (the test suite runs them all:
# the bad-input table) and the test binary; without it, the three programs the
# later steps run. No -Werror: a new warning from this machine's host compiler
# must not cost the run. -k: one failed file does not stop the others.
PROGRAMS=(generate bench_attention overload)
if [ -n "$DOCTEST_INC" ]; then
    # DOCTEST_INC names the folder for make, so that it never runs
    # tests/get_doctest.sh (which would try the network); /usr/include is on
    # the compilers' own path already.
    inc=()
    [ "$DOCTEST_INC" != /usr/include ] && inc=(DOCTEST_INC="$DOCTEST_INC")
    run_step build 330 make -k -j"$JOBS" NVCC_WERROR= CUDA_BUILD="$CUDA_BUILD" "${inc[@]}" cuda
else
    run_step build 330 make -k -j"$JOBS" NVCC_WERROR= CUDA_BUILD="$CUDA_BUILD" "${PROGRAMS[@]/#/$CUDA_BUILD/}"
fi
# need STEP FILE: true if FILE was built, else the step FAILs (or is
# INCOMPLETE when the build itself was cut short).
need() {
    [ -x "$2" ] && return 0
    if [ "${STATUS[build]}" = INCOMPLETE ]; then set_status "$1" INCOMPLETE "$2 not built: the build was cut short"
    else set_status "$1" FAIL "$2 not built (see build.log)"; fi
    return 1
}

# ---- the test suite on the GPU ----------------------------------------------
SUITES=kernels,kv_dtype,swap   # the suites that launch kernels (test_kernels, test_kv_dtype, test_swap)
if [ -z "$DOCTEST_INC" ]; then
    for s in tests memcheck racecheck synccheck; do STATUS[$s]=INCOMPLETE; NOTE[$s]="doctest not found: the test binary was not built"; done
elif need tests "$CUDA_BUILD/tests"; then
    run_step tests 180 env PAGEDKV_REQUIRE_GPU=1 "$CUDA_BUILD/tests"
    extra "$OUT/tests.log" '^\[(doctest\] test cases|pagedkv\])' "-- tests (doctest's count, then the skips it counts as passed)"
fi

# ---- bench_attention ---------------------------------------------------------
if need bench_attention "$CUDA_BUILD/bench_attention"; then
    run_step bench_attention 150 "$CUDA_BUILD/bench_attention" --shapes all --dtype all
    extra "$OUT/bench_attention.log" '^(device|peak bandwidth|copy bandwidth|cost model|RESULT) ' \
        "-- bench_attention (RESULT <shape> <dtype> <kernel> <GB/s> <%peak> <%copy> PASS|FAIL)"
fi

# ---- generate: the GPU and the CPU must print the same greedy text ------------
# Run as `bash -c gen_compare` under run_step's timeout; the programs' stderr
# (tok/s, any error) stays in the step's log, their stdout goes to files.
gen_compare() {  # gen_compare OUT_PREFIX ARGS...
    local pre=$1 d
    shift
    for d in cuda cpu; do
        echo "== generate $* --device $d"
        "$CUDA_BUILD/generate" "$@" --device "$d" > "$pre.$d.txt" || { echo "generate --device $d: exit status $?"; return 1; }
    done
    if [ ! -s "$pre.cuda.txt" ]; then echo "generate printed nothing"; return 1; fi
    if cmp -s "$pre.cuda.txt" "$pre.cpu.txt"; then
        echo "== cuda == cpu:"; head -c 400 "$pre.cuda.txt"; echo
    else
        echo "== cuda != cpu:"; diff "$pre.cuda.txt" "$pre.cpu.txt" | head -n 20; return 1
    fi
}
export -f gen_compare
export CUDA_BUILD
if need generate-builtin "$CUDA_BUILD/generate"; then
    run_step generate-builtin 90 bash -c 'gen_compare "$@"' _ "$OUT/generate-builtin" -t 0 -n 200 -i "once upon a time"
fi
if [ -z "$MODELS" ]; then
    set_status generate-stories260K SKIP "no models (PAGEDKV_MODELS, .gpu_models/, ../shared/models)"
elif need generate-stories260K "$CUDA_BUILD/generate"; then
    run_step generate-stories260K 90 bash -c 'gen_compare "$@"' _ "$OUT/generate-stories260K" \
        "$MODELS/stories260K.bin" -z "$MODELS/tok512.bin" -t 0 -n 256 -i "Once upon a time"
fi

# ---- overload on the GPU and on the CPU ---------------------------------------
for d in cuda cpu; do
    if need "overload-$d" "$CUDA_BUILD/overload"; then
        run_step "overload-$d" 90 "$CUDA_BUILD/overload" --device "$d" --no-lanes --log-interval 0
        extra "$OUT/overload-$d.log" '^ *throughput' "-- overload --device $d"
    fi
done

# ---- compute-sanitizer ----------------------------------------------------------
# Last, because they are the slowest; each is capped so that one cannot starve
# the others. --error-exitcode: a reported hazard fails the step.
if [ -n "$DOCTEST_INC" ] && [ -x "$CUDA_BUILD/tests" ]; then
    for tool in memcheck racecheck synccheck; do
        if [ -z "$SANITIZER" ]; then
            set_status "$tool" UNAVAILABLE "compute-sanitizer not found (PATH, /usr/local/cuda/bin)"
        else
            run_step "$tool" 120 env PAGEDKV_REQUIRE_GPU=1 "$SANITIZER" --tool "$tool" --error-exitcode 1 \
                "$CUDA_BUILD/tests" -ts="$SUITES"
        fi
    done
elif [ -n "$DOCTEST_INC" ]; then
    for tool in memcheck racecheck synccheck; do need "$tool" "$CUDA_BUILD/tests"; done
fi

# The summary, and the exit status, come from on_exit.

#!/usr/bin/env bash
# tests/gpu_check.sh -- everything that needs a real GPU, in one run (< 5 minutes).
#
#   bash tests/gpu_check.sh            # on a machine with nvcc and an NVIDIA GPU
#
# 1. builds every example and the test binary with nvcc (`make cuda`);
# 2. runs the whole doctest suite on the GPU;
# 3. compute-sanitizer memcheck and racecheck on the kernel tests;
# 4. generate --device cuda vs --device cpu, greedy: the built-in model, and
#    stories260K when ../shared/models/ (or $PAGEDKV_MODELS) has it;
# 5. examples/bench_attention (time, GB/s, % of the H200's 4.8 TB/s);
# 6. overload --device cuda vs --device cpu, useful tok/s side by side.
# A short report goes to $REPORT (default: $OUT/gpu_report.txt if $OUT is set,
# else gpu_report.txt). The script keeps going after a failed step and exits
# non-zero if any step failed.
set -u
cd "$(dirname "$0")/.."
REPORT=${REPORT:-${OUT:-.}/gpu_report.txt}
MODELS=${PAGEDKV_MODELS:-../shared/models}
# doctest: the system package, or a copy carried to .doctest/doctest/doctest.h.
if [ ! -f /usr/include/doctest/doctest.h ] && [ -f .doctest/doctest/doctest.h ]; then
    export DOCTEST_INC=$PWD/.doctest
fi
fail=0
: > "$REPORT"
say() { echo "$*" | tee -a "$REPORT"; }
step() {  # step NAME TIMEOUT CMD...: run, keep the last lines, record pass/fail
    local name=$1 limit=$2; shift 2
    local t0=$(date +%s)
    local out; out=$(timeout "$limit" "$@" 2>&1); local rc=$?
    say "== $name: $([ $rc -eq 0 ] && echo ok || echo "FAILED (rc $rc)") in $(( $(date +%s) - t0 )) s"
    echo "$out" | tail -n 12 | sed 's/^/   /' | tee -a "$REPORT"
    [ $rc -eq 0 ] || fail=1
}

say "pagedkv GPU check, $(date -u +%Y-%m-%dT%H:%MZ), commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
say "$(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null || echo 'nvidia-smi: not available')"
say "$(nvcc --version | tail -n 1)"

step "make cuda" 240 make -j"$(nproc)" cuda
step "test suite on the GPU" 120 ./build/cuda/tests
if command -v compute-sanitizer >/dev/null; then
    step "compute-sanitizer memcheck (kernel tests)" 120 compute-sanitizer --tool memcheck --error-exitcode 1 ./build/cuda/tests -ts=kernels
    step "compute-sanitizer racecheck (kernel tests)" 180 compute-sanitizer --tool racecheck --error-exitcode 1 ./build/cuda/tests -ts=kernels
else
    say "== compute-sanitizer: not found, skipped"
fi
cmp_gen() {  # cmp_gen NAME ARGS...: generate on the GPU and on the CPU must print the same
    local name=$1; shift
    local gpu cpu
    gpu=$(./build/cuda/generate "$@" --device cuda 2>/dev/null); cpu=$(./build/cuda/generate "$@" --device cpu 2>/dev/null)
    if [ -n "$gpu" ] && [ "$gpu" == "$cpu" ]; then say "== generate $name: cuda == cpu ok"; say "   ${gpu:0:160}"
    else say "== generate $name: cuda != cpu FAILED"; say "   cuda: ${gpu:0:160}"; say "   cpu:  ${cpu:0:160}"; fail=1; fi
}
cmp_gen "built-in" -t 0 -n 200 -i "once upon a time"
if [ -f "$MODELS/stories260K.bin" ] && [ -f "$MODELS/tok512.bin" ]; then
    cmp_gen "stories260K" "$MODELS/stories260K.bin" -z "$MODELS/tok512.bin" -t 0 -n 256 -i "Once upon a time"
else
    say "== generate stories260K: skipped ($MODELS/stories260K.bin not found)"
fi
step "bench_attention" 120 ./build/cuda/bench_attention
step "overload --device cuda" 60 ./build/cuda/overload --device cuda --no-lanes --log-interval 0
step "overload --device cpu" 60 ./build/cuda/overload --device cpu --no-lanes --log-interval 0
say "== overall: $([ $fail -eq 0 ] && echo PASS || echo FAIL)"
exit $fail

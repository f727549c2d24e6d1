#!/usr/bin/env bash
# A short GPU check of the device stage (issue 23): is the device= stall down to the loop's own copies?
#
#   PYTHONPATH=src:. OUT=/some/dir bash benchmarks/device_check.sh                   # on the GPU machine
#   PYTHONPATH=src:. OUT=/tmp/x SMALL=1 DEVICE=cpu bash benchmarks/device_check.sh   # a test run
#
# Run from the repository root; at most about 200 s on an H200 with 16 CPUs, data included.
# Writes 5 small text files to $OUT: steps.log, cuda_tests.out, bench_gpu.out,
# bench_gpu.md, bench_gpu.json (the generated data stays in DATA_DIR, outside $OUT).
#   1. the CUDA tests of the device stage (tests/runtime/test_device.py; 40 s at most);
#   2. bench_gpu.py on 8M rows, 4 epochs per loop (3 steady), in this order: the memory-fed
#      reference; device= with the group copies queued by the loop's thread (the default
#      now) at 4 and 8 workers, shuffle on and off, with the step; the loop's own copies
#      (4 workers, shuffled); the same device= rows with the copies queued by the receiving
#      thread (the first design, as measured in the first device run); the no-step rows at
#      8 workers (GB/s into the device). Each copy's host memory is checked for page-locking
#      (column "unpinned copies"). Loops that would start after 120 s are skipped.
set -u
OUT=${OUT:?set OUT to the output directory}
DEVICE=${DEVICE:-cuda}
SMALL=${SMALL:-0}
DEADLINE_S=${DEADLINE_S:-195}
PY=${PYTHON:-$(command -v python || command -v python3)}
DATA=${DATA_DIR:-/tmp/tdu-device-data}
mkdir -p "$OUT" "$DATA"
START=$(date +%s)
LOG="$OUT/steps.log"
: > "$LOG"

if [ "$SMALL" = "1" ]; then
  ROWS=200000; HIDDEN=16; EPOCHS=2; BUDGET=400; T_BENCH=500; T_TESTS=240; DEADLINE_S=${DEADLINE_S_SMALL:-800}
else
  ROWS=8000000; HIDDEN=2048; EPOCHS=4; BUDGET=120; T_BENCH=150; T_TESTS=40
fi

step() {  # step NAME TIMEOUT_S COMMAND...: run it if the deadline allows, log wall time and code
  local name=$1 limit=$2; shift 2
  local now; now=$(date +%s)
  local left=$((DEADLINE_S - (now - START)))
  if [ "$left" -lt "$limit" ]; then
    echo "$name: skipped ($left s left, needs $limit s)" | tee -a "$LOG"
    return
  fi
  local t0; t0=$(date +%s%N)
  timeout --kill-after=5 "$limit" "$@" > "$OUT/$name.out" 2>&1
  local code=$?
  local ms=$(( ($(date +%s%N) - t0) / 1000000 ))
  printf '%s: exit %s, %d.%03d s (limit %s s) at %s\n' "$name" "$code" $((ms / 1000)) $((ms % 1000)) \
    "$limit" "$(date +%H:%M:%S)" | tee -a "$LOG"
}

{ nproc; cat /proc/loadavg; git log --oneline -1 2>/dev/null; } >> "$LOG" 2>&1
# --noconftest: the suite's fixture plugins need packages the GPU machine lacks.
step cuda_tests "$T_TESTS" $PY -m pytest -q -p no:cacheprovider --noconftest -rs tests/runtime/test_device.py
step bench_gpu "$T_BENCH" $PY benchmarks/bench_gpu.py --out "$OUT" --device "$DEVICE" --rows "$ROWS" \
  --hidden "$HIDDEN" --workers 4 8 --epochs "$EPOCHS" --budget-s "$BUDGET" --skip-pyarrow \
  --copy-in loop receiver --no-step-workers 8 --count-unpinned --data-dir "$DATA"
echo "total: $(( $(date +%s) - START )) s" | tee -a "$LOG"

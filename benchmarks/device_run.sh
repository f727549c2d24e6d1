#!/usr/bin/env bash
# The GPU machine's one prepared run (issue 23): everything it writes goes under $OUT.
#
#   PYTHONPATH=src:. OUT=/some/dir bash benchmarks/device_run.sh          # the real run
#   PYTHONPATH=src:. OUT=/tmp/x SMALL=1 DEVICE=cpu bash benchmarks/device_run.sh   # a test run
#
# Run from the repository root. Steps, each under its own `timeout`, each logged with its
# wall time and exit code in $OUT/steps.log (a step that fails or times out does not stop
# the others). A step starts only if the script's deadline (DEADLINE_S, 400 s) leaves it
# its whole timeout, so the run ends within about DEADLINE_S seconds.
#   1. machine facts (nvidia-smi, CPUs, versions);
#   2. the CUDA tests of the device stage and the page-locked segments (skipped without CUDA);
#   3. bench_gpu.py: every loop of the GPU scenario;
#   4. CPU scaling on this machine's cores: bench_shuffle.py --split-rows 0 at num_workers=0
#      and 4, bench_receive.py (main-process CPU per GB) at 2 and 8 workers,
#      bench_parquet.py (numeric, batch 8192, persistent) at 2/4/8/16 workers,
#      bench_ragged.py at 2/4 workers.
# SMALL=1 shrinks every dataset so the whole script runs in a few minutes on 2 cores.
set -u
OUT=${OUT:?set OUT to the output directory}
DEVICE=${DEVICE:-cuda}
SMALL=${SMALL:-0}
DEADLINE_S=${DEADLINE_S:-400}
PY=${PYTHON:-$(command -v python || command -v python3)}
mkdir -p "$OUT"
# Generated data (about 1.5 GB for the real run) stays out of $OUT, so a run cut off
# before its end does not send it back with the results.
DATA=${DATA_DIR:-/tmp/tdu-device-data}
mkdir -p "$DATA"
START=$(date +%s)
LOG="$OUT/steps.log"
: > "$LOG"

if [ "$SMALL" = "1" ]; then
  GPU_ROWS=200000; GPU_HIDDEN=16; GPU_WORKERS="2"; GPU_EPOCHS=2; GPU_BUDGET=100
  SHUFFLE_ROWS=200000; RECEIVE_MB=16; PARQUET_ROWS=200000; PARQUET_WORKERS="2"; RAGGED="--quick"
  REPEATS=1; T_GPU=240; T_SHUFFLE=120; T_RECEIVE=120; T_PARQUET=150; T_RAGGED=120; T_TESTS=240
else
  GPU_ROWS=8000000; GPU_HIDDEN=2048; GPU_WORKERS="2 4 8"; GPU_EPOCHS=3; GPU_BUDGET=170
  SHUFFLE_ROWS=2000000; RECEIVE_MB=256; PARQUET_ROWS=4000000; PARQUET_WORKERS="2 4 8 16"; RAGGED=""
  REPEATS=5; T_GPU=200; T_SHUFFLE=45; T_RECEIVE=40; T_PARQUET=75; T_RAGGED=40; T_TESTS=60
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

facts() {
  nvidia-smi || true
  nproc
  cat /proc/loadavg
  free -g || true
  df -h /dev/shm || true
  ulimit -l
  $PY -c "import sys, torch, pyarrow, numpy; print(sys.version); print('torch', torch.__version__, torch.version.cuda, torch.cuda.is_available()); print('pyarrow', pyarrow.__version__, 'numpy', numpy.__version__)"
  $PY -c "import pytest; print('pytest', pytest.__version__)" || echo "no pytest: cuda_tests cannot run"
  git log --oneline -1 2>/dev/null || true
}

export -f facts
export PY
step facts 30 bash -c facts
# --noconftest: the suite's fixture plugins need packages this machine lacks (pyiceberg,
# s3fs); these two files need none of them.
step cuda_tests "$T_TESTS" $PY -m pytest -q -p no:cacheprovider --noconftest -rs \
  tests/runtime/test_device.py tests/runtime/test_transfer_blocks.py
step bench_gpu "$T_GPU" $PY benchmarks/bench_gpu.py --out "$OUT" --device "$DEVICE" --rows "$GPU_ROWS" \
  --hidden "$GPU_HIDDEN" --workers $GPU_WORKERS --epochs "$GPU_EPOCHS" --budget-s "$GPU_BUDGET" \
  --data-dir "$DATA"
step shuffle_nw0 "$T_SHUFFLE" $PY benchmarks/bench_shuffle.py --split-rows 0 --rows "$SHUFFLE_ROWS" \
  --repeats "$REPEATS" --workers 0
step shuffle_nw4 "$T_SHUFFLE" $PY benchmarks/bench_shuffle.py --split-rows 0 --rows "$SHUFFLE_ROWS" \
  --repeats "$REPEATS" --workers 4
step receive_nw2 "$T_RECEIVE" $PY benchmarks/bench_receive.py --mb "$RECEIVE_MB" --workers 2 --repeats 3 \
  --data-dir "$DATA" --out "$OUT/receive_nw2"
step receive_nw8 "$T_RECEIVE" $PY benchmarks/bench_receive.py --mb "$RECEIVE_MB" --workers 8 --repeats 3 \
  --data-dir "$DATA" --out "$OUT/receive_nw8" --skip-floor
step parquet "$T_PARQUET" $PY benchmarks/bench_parquet.py --rows "$PARQUET_ROWS" --column-sets numeric \
  --batch-sizes 8192 --workers 0 $PARQUET_WORKERS --persistent --repeats 3 --data-dir "$DATA" \
  --out-dir "$OUT/parquet"
step ragged "$T_RAGGED" $PY benchmarks/bench_ragged.py $RAGGED --workers 2 4 --repeats 3 \
  --data-dir "$DATA" --out-dir "$OUT/ragged"
echo "total: $(( $(date +%s) - START )) s" | tee -a "$LOG"
rm -rf "$DATA"

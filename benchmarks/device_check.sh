#!/usr/bin/env bash
# One visit to a GPU machine: every question about the CuPy/CUDA backend, in about 8 minutes.
#
#   OUT=/some/folder bash benchmarks/device_check.sh        # from the repository root
#
# Needs: python3 with numpy, cupy, numba (torch optional); no network, nothing installed.
# Every section is independent and time-bounded (timeout); a failing section is recorded and
# the next one runs. Results: $OUT/device_check.json (everything), $OUT/device_check.log (the
# full output), $OUT/conformance.txt (the conformance table); a short table is printed last.
# Budget: DEVICE_CHECK_BUDGET_S seconds in all (default 450); each section gets at most its
# own limit and never more than what is left of the budget.
set -u
cd "$(dirname "$0")/.."
export PYTHONPATH=".${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
OUT="${OUT:-$(mktemp -d /tmp/device-check-out.XXXXXX)}"
mkdir -p "$OUT"
WORK="$(mktemp -d /tmp/device-check.XXXXXX)"
LOG="$OUT/device_check.log"
BUDGET="${DEVICE_CHECK_BUDGET_S:-450}"
START=$(date +%s)
: > "$WORK/status.tsv"

echo "== device_check: $(date -u +%Y-%m-%dT%H:%M:%SZ), out $OUT, work $WORK, budget ${BUDGET}s" | tee -a "$LOG"
{ nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv 2>&1 | head -3
  python3 -c 'import sys; print("python", sys.version.split()[0], sys.executable)'
  python3 -c 'import cupy, cupy.cuda.runtime as r; print("cupy", cupy.__version__, "runtime", r.runtimeGetVersion(), "driver", r.driverGetVersion())' 2>&1 | tail -1
  python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)' 2>&1 | tail -1
  python3 -c 'import numpy, numba; print("numpy", numpy.__version__, "numba", numba.__version__)' 2>&1 | tail -1
  git rev-parse --short HEAD 2>/dev/null | sed 's/^/commit /'
} 2>&1 | tee -a "$LOG"

left() { echo $(( BUDGET - ($(date +%s) - START) )); }

# section NAME LIMIT_S: run `device_check.py NAME` under timeout, record rc and seconds, go on.
section() {
  local name=$1 limit=$2 remaining t0 rc
  remaining=$(( $(left) - 15 ))  # keep 15 s for the summary
  if [ "$remaining" -lt 10 ]; then
    echo "== $name: skipped (budget spent)" | tee -a "$LOG"
    printf '%s\t%s\t%s\n' "$name" 125 0 >> "$WORK/status.tsv"
    return
  fi
  [ "$limit" -gt "$remaining" ] && limit=$remaining
  echo "== $name (limit ${limit}s, $(left)s of budget left)" | tee -a "$LOG"
  t0=$(date +%s)
  timeout -k 5 "$limit" python3 benchmarks/device_check.py "$name" --work "$WORK" 2>&1 | tee -a "$LOG"
  rc=${PIPESTATUS[0]}
  printf '%s\t%s\t%s\n' "$name" "$rc" "$(( $(date +%s) - t0 ))" >> "$WORK/status.tsv"
  echo "== $name: rc=$rc in $(( $(date +%s) - t0 ))s" | tee -a "$LOG"
}

# The reference runs (and the run the audit replay checks), trained on the CPU with numba while
# the GPU sections run: a second reference for the state roots, computed on this machine.
( timeout -k 5 300 python3 benchmarks/device_check.py numba-reference --work "$WORK" > "$WORK/numba_train.log" 2>&1
  echo "numba-reference: rc=$?" >> "$WORK/numba_train.log" ) &
NUMBA_PID=$!

# The questions, in this order: cuda conformance; tiny and small state roots against the
# references; one audit replay; the step-time breakdown (kernels, update, hashing, bytes moved)
# measured against benchmarks/perf_model.py's prediction; MFU and the tax against PyTorch bf16
# (torch, then throughput; the summary prints the tax); one Open-1B micro-batch (with recomputation and
# the LM head in row chunks: its time and device memory). Then, with what is left of the budget, the
# diagnostics (flush probe, int8 and float GEMMs).
section versions 30
section conformance 120
section roots 90
section replay 45
section breakdown 75
section torch 45
section throughput 60
section open1b 60
section probe 30
section gemm_int8 30
section gemm_float 30

kill "$NUMBA_PID" 2>/dev/null
echo "== numba-reference (background):" | tee -a "$LOG"; tail -4 "$WORK/numba_train.log" 2>/dev/null | tee -a "$LOG"
cp "$WORK/conformance.txt" "$OUT/" 2>/dev/null
timeout -k 2 20 python3 benchmarks/device_check.py summary --work "$WORK" --out "$OUT" 2>&1 | tee -a "$LOG"
echo "== device_check done in $(( $(date +%s) - START ))s; results in $OUT" | tee -a "$LOG"

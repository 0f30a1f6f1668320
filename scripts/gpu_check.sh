#!/usr/bin/env bash
# The GPU checks, in one go, for a machine lent for a few minutes: the CUDA tests, a short bf16 +
# torch.compile training run, DDP over every visible GPU, and the speed race against diffusers.
# Writes gpu_check/results.md (and every log beside it); aims at under 8 minutes on one GPU.
#
#     bash scripts/gpu_check.sh            # from the repository root, with the package installed
set -uo pipefail
OUT=${OUT:-gpu_check}
mkdir -p "$OUT"
export TINYDIT_OFFLINE=1 PYTHONUNBUFFERED=1
# `python`, where it names an interpreter (a venv, conda), else python3 (images that ship python3 alone)
PY=$(command -v python || command -v python3) || { echo "gpu_check.sh: no python or python3 on PATH" >&2; exit 1; }
row() { printf '| %s | %s | %s |\n' "$1" "$2" "$3" >> "$OUT/results.md"; }
step() {  # step NAME TIMEOUT_S CMD...: run, log, and add a row with its status and wall time
  local name=$1 limit=$2; shift 2
  local t0=$SECONDS
  timeout "$limit" "$@" > "$OUT/$name.log" 2>&1
  local rc=$?
  row "$name" "$([ $rc = 0 ] && echo ok || echo "FAILED (exit $rc)")" "$((SECONDS - t0)) s"
  return $rc
}
{
  echo "# GPU check, $(date -u +%Y-%m-%d)"
  echo
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null | sed 's/^/GPU: /'
  "$PY" -c "import torch; print(f'torch {torch.__version__}, CUDA {torch.version.cuda}, {torch.cuda.device_count()} GPU(s)')"
  echo
  echo "| check | result | wall |"
  echo "|---|---|---|"
} > "$OUT/results.md"

step cuda-tests 240 "$PY" -m pytest -q -p no:cacheprovider -m cuda tests/test_cuda.py
step train-bf16-compile 120 "$PY" -m tinydit train --data shapes --preset dit-1.9m --steps 300 --precision bf16 \
  --compile on --device cuda --no-progress --no-report --overwrite --out "$OUT/run-bf16-compile"
NGPU=$("$PY" -c "import torch; print(torch.cuda.device_count())")
step "ddp-nccl-x$NGPU" 120 "$PY" -m torch.distributed.run --standalone --nproc_per_node="$NGPU" -m tinydit -- train \
  --data shapes --preset dit-1.9m --steps 200 --precision bf16 --device cuda --no-progress --no-report \
  --overwrite --out "$OUT/run-ddp"
step bench-dit-1.9m 100 "$PY" benchmarks/bench_train.py --preset dit-1.9m --device cuda --precision bf16 \
  --compare diffusers
# the CIFAR-10 recipe's preset (docs/distributed.md): its cost per step at the recipe's batch of 128
step bench-dit-32m 120 "$PY" benchmarks/bench_train.py --preset dit-32m --device cuda --precision bf16 \
  --compare diffusers

# The numbers the checks produced: the last training windows' rates and the benchmark's table.
{
  echo
  for run in run-bf16-compile run-ddp; do
    [ -f "$OUT/$run/metrics.jsonl" ] && "$PY" - "$OUT/$run" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(f"{sys.argv[1]}/metrics.jsonl")]
rates = [r["img_per_s"] for r in rows if "img_per_s" in r][1:]
loss = [r["loss"] for r in rows if "loss" in r]
if rates:
    print(f"* {sys.argv[1].split('/')[-1]}: {sorted(rates)[len(rates) // 2]:.0f} img/s (median window), "
          f"loss {loss[0]:.3f} -> {loss[-1]:.3f}")
PY
  done
  echo
  for b in bench-dit-1.9m bench-dit-32m; do
    echo "$b (benchmarks/bench_train.py --compare diffusers, last lines):"
    echo '```'
    tail -n 12 "$OUT/$b.log"
    echo '```'
  done
} >> "$OUT/results.md"
cat "$OUT/results.md"

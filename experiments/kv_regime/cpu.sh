#!/bin/bash
# The kv regime's runs on this machine's CPU, one at a time (no device lent; see README.md here):
# each resumes from its checkpoint under WORK, trains until DEADLINE (SIGTERM: a checkpoint, exit 0),
# and a run that reached its last step is kept at once into KEPT (sweep keep: what git must hold,
# since a new machine brings only the checkout). A run kept already is skipped.
#   bash experiments/kv_regime/cpu.sh DEADLINE GRID RUN [RUN ...]
# DEADLINE: Unix time (e.g. $(( $(date +%s) + 9000 ))); WORK (default runs/kv_regime, ignored by
# git) holds the shards, checkpoints and exports; KEPT defaults to experiments/kv_regime/models/vary.
set -e
DEADLINE=${1:?DEADLINE: Unix time to stop training by}
GRID=${2:?GRID: a grid of grids.py}
shift 2
[ $# -gt 0 ] || { echo "error: name the runs to train (e.g. rope-s1 rope-s2)" >&2; exit 2; }
cd "$(dirname "$0")/../.."
PY=${PY:-.venv/bin/python}
WORK=${WORK:-runs/kv_regime}
KEPT=${KEPT:-experiments/kv_regime/models/vary}
CORES=$(nproc)
export OMP_NUM_THREADS=$CORES PYTHONUNBUFFERED=1
for run in "$@"; do
  if [ -d "$KEPT/$run" ]; then echo "[cpu.sh] $run: kept already ($KEPT/$run)"; continue; fi
  # no new run in the last 5 minutes: its start-up would be all it did
  [ "$(date +%s)" -lt $(( DEADLINE - 300 )) ] || { echo "[cpu.sh] deadline: $run not started"; break; }
  "$PY" -m experiments.kv_regime.sweep train --grid "$GRID" --only "$run" --backend gloo \
    --threads "$CORES" --workers "$CORES" --seconds 1e9 --until "$DEADLINE" \
    --shards "$WORK/shards" --work "$WORK/work" --out "$WORK/out"
  if ! "$PY" -m experiments.kv_regime.sweep keep --grid "$GRID" --models "$WORK/work/hf" \
      --logs "$WORK/work/runs" --summary "$WORK/work/summary.json" --only "$run" --into "$KEPT"; then
    echo "[cpu.sh] $run not kept (see the line above; its checkpoint: $(cat "$WORK/work/runs/$run/checkpoints/latest" 2>/dev/null)); rerun to resume"
    break
  fi
  echo "[cpu.sh] kept $run: commit $KEPT/$run"
done

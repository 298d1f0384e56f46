#!/bin/bash
# The kv regime's runs on a lent GPU node (see README.md here): install the wheelhouse beside the
# node's torch, then train the grid until SECONDS have passed; a second call on the still-warm
# machine resumes where the first stopped. What comes back lands in $OUT.
#   bash experiments/kv_regime/gpu.sh [SECONDS] [GRID]     # carry: wheelhouse/py3.12, data/kv
set -e
export PYTHONUNBUFFERED=1
[ -d /tmp/site/deepspeed ] || python3 -m pip install -q --disable-pip-version-check --no-index --no-deps \
  --no-compile --upgrade --find-links wheelhouse/py3.12 --target /tmp/site -r wheelhouse/py3.12/requirements.txt
export PYTHONPATH=$PWD:/tmp/site  # this checkout before the wheel of lenext_dist in /tmp/site
python3 -m experiments.kv_regime.sweep train --shards /tmp/kvr/shards --work /tmp/kvr/work --out "$OUT" \
  --seconds "${1:-420}" --grid "${2:-distract}"
for f in /tmp/kvr/work/*[0-9].log; do echo "== $f"; grep -a "^step" "$f" | tail -n 1 || true; done

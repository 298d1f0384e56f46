#!/bin/bash
# The kv regime's runs on a lent GPU node (see README.md here): install the wheelhouse beside the
# node's torch, then train the grid; what comes back lands in $OUT. A second call on the
# still-warm machine resumes where the first stopped (a cold machine starts over: make the second
# call at once, within the device's idle_release_s).
#   bash experiments/kv_regime/gpu.sh CALL_SECONDS [GRID [RUNS]]     # carry: wheelhouse/py3.12, data/kv
# RUNS: the grid's runs to train, comma-separated (sweep train --only; e.g. nope-s0,nope-s1,nope-s2).
# CALL_SECONDS: the call's limit_s (its timeout_s, at most budget_left_s - 70: the device's own
# start and transfers). Training stops RESERVE seconds before it, for the exports and packs
# (~25 s for 8 runs, 27 Nov), so the call returns its models before the limit.
set -e
export PYTHONUNBUFFERED=1
END=$(( $(date +%s) + ${1:?CALL_SECONDS: the call timeout_s} - ${RESERVE:-60} ))
[ -d /tmp/site/deepspeed ] || python3 -m pip install -q --disable-pip-version-check --no-index --no-deps \
  --no-compile --upgrade --find-links wheelhouse/py3.12 --target /tmp/site -r wheelhouse/py3.12/requirements.txt
export PYTHONPATH=$PWD:/tmp/site  # this checkout before the wheel of lenext_dist in /tmp/site
python3 -m experiments.kv_regime.sweep train --shards /tmp/kvr/shards --work /tmp/kvr/work --out "$OUT" \
  --seconds 100000 --until "$END" --grid "${2:-distract}" --only "${3:-}"
for f in /tmp/kvr/work/*[0-9].log; do echo "== $f"; grep -a "^step" "$f" | tail -n 1 || true; done

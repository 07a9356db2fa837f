#!/usr/bin/env bash
# What the earlier GPU leases left open (docs/BENCHMARKS.md "GPU", "What is left"), in one call
# on a lent GPU machine, one stage after another so that no timing shares the CPU with another
# stage's work; each stage stops at its deadline and its results are packed into
# $OUT/followups.tgz at once (one file: a call brings back only a few), so a call cut off still
# brings back every stage that finished:
#
#   scripts/gpu_followups.sh SECONDS
#
#   e2e     `rlflow optimize MODEL --method greedy --cost e2e` from onnxruntime's CUDA graph
#           (E2E_MODELS, default resnet-18; E2E_BUDGET expansions, default to greedy's local
#           minimum): a search ranked by end-to-end GPU timings, which per-op and table costs
#           cannot stand in for with FusedConv on CUDA (its per-op price and its in-graph cost
#           disagree in sign)
#   tests   the gpu-marked tests (tests/cost/test_cuda.py)
#   online  the records in REPLAYS/MODEL/*.json (ONLINE_MODELS) replayed and timed with
#           onnxruntime's optimiser over them at load (`--deploys online`)
#
# Installs onnxruntime-gpu first (its parts copied to /tmp/gpu-parts by the calls before, as
# scripts/gpu_lease.sh does) and waits for a zoo export started by `scripts/gpu_prebuild.sh
# start`. STAGES (e2e tests online) picks and orders them.
set -uo pipefail
deadline=$(($(date +%s) + ${1:?usage: scripts/gpu_followups.sh SECONDS}))
out=${OUT:-/tmp/gpu-out}
runs=${RUNS:-/tmp/gpu-runs}
mkdir -p "$out" "$runs"
left() { echo $((deadline - $(date +%s))); }
say() { echo "[gpu_followups $(date +%H:%M:%S) $(left)s left] $*" | tee -a "$out/followups.log" >&2; }
keep() {
    (cd "$runs" && find . -type f ! -name '*.onnx' ! -path './cache/*' -size -8M \
        | tar -czf "$out/partial.tgz" -T -) && mv "$out/partial.tgz" "$out/followups.tgz"
}
until_share() { timeout -k 5 $(($(left) * $1 / 100)) "${@:2}"; }

say "install"
bash .gpu/unpack.sh > "$out/unpack.txt" 2>&1 || { cat "$out/unpack.txt"; exit 1; }
export PYTHONPATH=/tmp/site
python3 -m pip install -q --no-deps --no-index --no-build-isolation -e . > "$out/install.txt" 2>&1 \
    || { cat "$out/install.txt"; exit 1; }
export PYTHONUNBUFFERED=1 RLFLOW_TIMING_LOCK=$runs/timing.lock RLFLOW_CACHE_DIR=$runs/cache
nvidia-smi > "$out/nvidia-smi.txt" 2>&1
cat "$out/unpack.txt"
RUNS=$runs scripts/gpu_prebuild.sh wait
say "zoo exported"

e2e() {
    for model in ${E2E_MODELS:-resnet-18}; do
        say "e2e-ranked greedy on $model"
        until_share "${E2E_SHARE:-60}" python3 -m rlflow.cli optimize "$model" --size full \
            --provider cuda --method greedy --cost e2e --start ort:all --no-peer --min-time 0.3 \
            --top-k 8 ${E2E_BUDGET:+--budget "$E2E_BUDGET"} -o "$runs/e2e-$model.onnx" --json > "$runs/e2e-$model.json" 2> "$runs/e2e-$model.log"
        say "$model: $(python3 -c 'import json, sys; d = json.load(open(sys.argv[1]))
print("%.3fx, confirmed %s, %s" % (d["speedup"], d["confirmed"], d["rules_applied"]))' \
            "$runs/e2e-$model.json" 2>&1 | tail -1)"
    done
}
tests() {
    say "gpu-marked tests"
    until_share "${TESTS_SHARE:-60}" python3 -m pytest -m gpu -q -p no:cacheprovider \
        tests/cost/test_cuda.py > "$runs/pytest-gpu.txt" 2>&1
    say "tests: $(tail -1 "$runs/pytest-gpu.txt")"
}
online() {
    for model in ${ONLINE_MODELS:-vit-base transformer-transducer}; do
        say "online replays of $model"
        records=()
        for record in "${REPLAYS:?REPLAYS=DIR holding MODEL/*.json}/$model"/*.json; do
            records+=("replay:$record")
        done
        until_share 90 python3 -m rlflow.cli bench --models "$model" --size full \
            --provider cuda --methods "${records[@]}" --deploys online --cost analytic \
            --start original --no-peer --min-time 0.3 --out "$runs/bench-online-$model" \
            > "$runs/bench-online-$model.log" 2>&1
        keep
    done
}
for stage in ${STAGES:-e2e tests online}; do
    [ "$(left)" -gt 20 ] || break
    "$stage"
    keep
done
say "done (or out of time)"
keep

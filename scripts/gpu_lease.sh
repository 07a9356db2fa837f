#!/usr/bin/env bash
# Everything docs/BENCHMARKS.md "GPU" needs, in one call on a lent GPU machine whose time is
# short (minutes): install onnxruntime-gpu (its wheel's parts copied to /tmp/gpu-parts by the
# calls before, with .gpu/unpack.sh to join them, where the machine reaches no package index) and
# rlflow, then the stages of scripts/bench_gpu.sh under one deadline, the later ones side by side
# (their GPU timings still one at a time, under the timing lock).
# Results (not the .onnx models the bench writes: a file coming back is limited to 16 MiB) are
# packed into $OUT/gpu.tgz every 20 s and at the end, so a call cut off at its limit still
# brings back every stage that finished.
#
#   scripts/gpu_lease.sh SECONDS        # stop everything SECONDS after the start
#
# PROVIDER (cuda; cpu tries the stages out here, without installing), NOISE=0 (no noise floor),
# MODELS, SIZE (full), STEPS (table rollout steps, 10), JOBS (table workers, one per model),
# MIN_TIME (timed seconds per graph in the bench, 0.3) and COST (what ranks the bench's searches,
# default the table) and METHODS (greedy taso; `agent:RUN_DIR` for a carried run) as in
# scripts/bench_gpu.sh; TABLE_SHARE (35) is the percentage of the time left that the table may
# take (NO_TABLE=1: no table collected; the table error stage runs on TABLE_FROM if given),
# BENCH_MODELS (MODELS) the models the bench runs (REPLAYS=DIR: with the results recorded
# elsewhere in DIR/MODEL/*.json, replayed and timed here, scripts/bench_gpu.sh, under DEPLOYS;
# that bench needs no table and starts at once), PROBE=1 adds scripts/probe_fusedconv.py before
# the bench (PROBE_MODELS: and its --model probe of each). AT_REST=1 runs every stage alone,
# one after another, so that no timing shares the CPU with another stage's work (a GPU graph of
# many small kernels runs slower while the CPU that launches them is loaded). The gpu-marked
# tests run beside the table (every GPU timing of either holds the timing lock). The table is
# written as $RUNS/<gpu>.json; TABLE_FROM names one brought back by an earlier lease (carried)
# for `costs collect` to resume. The zoo's export can start in the first of the calls that copy
# the wheel's parts (scripts/gpu_prebuild.sh start); this waits for it. rlflow's caches live in
# $RUNS/cache and come back too: every operator timed, finished model or not
# (cache/perop.sqlite; its keys name the GPU); CACHE_FROM names such a file to start from.
set -uo pipefail
deadline=$(($(date +%s) + ${1:?usage: scripts/gpu_lease.sh SECONDS}))
out=${OUT:-/tmp/gpu-out}
runs=${RUNS:-/tmp/gpu-runs}
mkdir -p "$out" "$runs"
left() { echo $((deadline - $(date +%s))); }
say() { echo "[gpu_lease $(date +%H:%M:%S) $(left)s left] $*" | tee -a "$runs/lease.log" >&2; }
pack() {
    (cd "$runs" && find . -type f ! -name '*.onnx' -size -8M | tar -czf "$out/partial.tgz" -T -) \
        && mv "$out/partial.tgz" "$out/gpu.tgz"
}
(while sleep 20; do pack; done) &
packer=$!

provider=${PROVIDER:-cuda}
if [ "$provider" = cuda ]; then
    say "install"
    bash .gpu/unpack.sh > "$runs/unpack.txt" 2>&1 || { cat "$runs/unpack.txt"; pack; exit 1; }
    export PYTHONPATH=/tmp/site
    python3 -m pip install -q --no-deps --no-index --no-build-isolation -e . \
        > "$runs/install.txt" 2>&1 || { cat "$runs/install.txt"; pack; exit 1; }
    cat "$runs/unpack.txt"
fi
export PYTHONUNBUFFERED=1 RLFLOW_TIMING_LOCK=$runs/timing.lock RLFLOW_CACHE_DIR=$runs/cache
RUNS=$runs scripts/gpu_prebuild.sh wait  # the zoo's export, if an earlier call started one
mkdir -p "$RLFLOW_CACHE_DIR"
[ -z "${CACHE_FROM:-}" ] || cp "$CACHE_FROM" "$RLFLOW_CACHE_DIR/perop.sqlite"
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2> /dev/null | head -1)
name=$(echo "$gpu" | grep -oiE '\b[ahl][0-9]+' | head -1 | tr 'A-Z' 'a-z')
table=$runs/${name:-$provider}.json
[ -z "${TABLE_FROM:-}" ] || cp "$TABLE_FROM" "$table"
say "gpu: $gpu; table: $table"

zoo="bert resnet-50 vit-base inception-v3 squeezenet-1.1 resnet-18 transformer-transducer"
export SIZE=${SIZE:-full} MODELS=${MODELS:-$zoo resnext-50 mini-dalle}
read -r -a models <<< "$MODELS"
# Each stage stops at its share of the time left, so the ones after it still run.
stage() { local share=$1; shift; timeout -k 5 $(($(left) * share / 100)) "$@"; }

say "rules verified on $provider (once, before the processes that read the verdicts)"
stage 30 python3 - > "$runs/rules.txt" 2> "$runs/rules.log" <<'PY'
from rlflow.rewrite.verify import verify_rules
results = verify_rules()
failed = [r for r in results if not r.passed]
print(f"{len(results) - len(failed)} of {len(results)} rules pass")
for r in failed:
    print(f"{r.rule}: {r.reason}")
PY
head -1 "$runs/rules.txt"

export MIN_TIME=${MIN_TIME:-0.3} BENCH_GROUPS=5 PROVIDER=$provider
# Run a later stage alone (AT_REST=1) or beside the ones after it.
later() { if [ "${AT_REST:-0}" = 1 ]; then "$@"; else "$@" & fi; }
replay_bench() {  # replay_bench SHARE
    MODELS=${BENCH_MODELS:-$MODELS} TABLE=$table stage "$1" scripts/bench_gpu.sh "$runs" bench
}
if [ -n "${REPLAYS:-}" ] && [ "${AT_REST:-0}" != 1 ]; then
    say "bench of the replays (${BENCH_MODELS:-$MODELS}), beside everything after it"
    replay_bench 95 &
fi

say "check: versions; gpu-marked tests beside the table"
nvidia-smi > "$runs/nvidia-smi.txt" 2>&1
python3 -c 'import onnxruntime as o, torch
print(o.__version__, o.get_available_providers(), torch.__version__, torch.version.cuda)' \
    > "$runs/versions.txt" 2>&1
stage 15 python3 -m pytest -m gpu -q -p no:cacheprovider tests/cost/test_cuda.py \
    > "$runs/pytest-gpu.txt" 2>&1 &
tests=$!

if [ "${NO_TABLE:-0}" != 1 ]; then
    say "table: ${models[*]}"
    stage "${TABLE_SHARE:-35}" python3 -m rlflow.cli costs collect --provider "$provider" \
        --models "${models[@]}" --size "$SIZE" --steps "${STEPS:-10}" \
        --jobs "${JOBS:-${#models[@]}}" --out "$table" --json > "$runs/table-summary.json" \
        2> "$runs/table.log"
    say "table done: $(tail -c 400 "$runs/table-summary.json")"
fi
wait "$tests"
say "gpu-marked tests: $(tail -1 "$runs/pytest-gpu.txt")"

if [ "${PROBE:-0}" = 1 ]; then
    say "FusedConv against Conv+Relu, alone and in chains"
    stage 10 python3 scripts/probe_fusedconv.py --provider "$provider" --out "$runs/fusedconv.json" \
        > "$runs/fusedconv.txt" 2>&1
    for model in ${PROBE_MODELS:-}; do
        say "FusedConv in $model"
        stage 15 python3 scripts/probe_fusedconv.py --provider "$provider" --model "$model" \
            --model-size "$SIZE" --out "$runs/fusedconv-$model.json" >> "$runs/fusedconv.txt" 2>&1
    done
    cat "$runs/fusedconv.txt"
fi

noise_floor() {
    for model in "${models[@]}"; do
        python3 -m rlflow.cli measure "$model" --size "$SIZE" --vs "$model" --provider "$provider" \
            --json > "$runs/self-$model.json" 2>> "$runs/self.log"
    done
}
if [ "${AT_REST:-0}" = 1 ]; then
    say "one at a time: bench, table vs end to end, noise floor"
else
    say "side by side: noise floor, table vs end to end, bench (5 groups)"
fi
[ -z "${REPLAYS:-}" ] || [ "${AT_REST:-0}" != 1 ] || replay_bench 50
[ -n "${REPLAYS:-}" ] || MODELS=${BENCH_MODELS:-$MODELS} TABLE=$table \
    later stage 90 scripts/bench_gpu.sh "$runs" bench
[ ! -f "$table" ] || TABLE=$table later stage 90 scripts/bench_gpu.sh "$runs" error
[ "${NOISE:-1}" = 0 ] || later noise_floor
while [ "$(left)" -gt 15 ] && [ -n "$(jobs -rp | grep -vx "$packer")" ]; do sleep 5; done
say "done (or out of time)"
kill $(jobs -rp) 2> /dev/null
pkill -f rlflow.cli 2> /dev/null
pack

#!/usr/bin/env bash
# The GPU benchmark of docs/BENCHMARKS.md "GPU", stage by stage, on a machine whose onnxruntime
# lists CUDAExecutionProvider (onnxruntime-gpu). Each stage writes under RUNS_DIR and can run
# in its own session (a stage's results survive the next one failing):
#
#   scripts/bench_gpu.sh RUNS_DIR check table error bench
#
#   check  nvidia-smi; the gpu-marked tests; every full zoo model timed against itself at
#          onnxruntime's defaults (the noise floor, and the model's CUDA latency)
#   table  `rlflow costs collect` on CUDA over the full zoo (TABLE, default RUNS_DIR/h100.json;
#          JOBS worker processes rewrite in parallel and time one at a time)
#   error  the table's sum against end-to-end latency in offline mode, per zoo model
#          (scripts/bench_perop_offline.py --table)
#   bench  `rlflow bench`: greedy and taso (or METHODS, e.g. `greedy agent:RUN_DIR`; empty
#          with REPLAYS: the replays alone) offline ranked by the table (or COST, e.g. perop: each
#          operator timed on the GPU as the search meets it, sharing rlflow's per-op cache with
#          the table's collection), taso online (ONLINE=0: not); the models in BENCH_GROUPS (3)
#          processes at once, timing one at a time under one lock. REPLAYS=DIR adds, for each
#          model, the results recorded elsewhere in DIR/MODEL/*.json (`rlflow optimize --json`
#          records, e.g. of a search ranked by this GPU's table on a CPU machine, or of an agent
#          trained there) as `replay:` methods: their models are too large to carry, their
#          episodes are not. A model then gets its own report, bench-DEPLOYS-MODEL (DEPLOYS:
#          offline, or e.g. offline,online to time each result under onnxruntime's optimiser
#          too).
#
# RLFLOW (default: `python3 -m rlflow.cli`) runs rlflow; MODELS, SIZE (full), STEPS (20),
# JOBS (6), MIN_TIME (timed seconds per graph in `error` and `bench`; default adaptive), START
# (the bench's start state; default: the fastest measured) and
# PROVIDER (cuda; cpu to try the stages out here) change what is run. On the CPU
# provider the lock keeps timings apart but not the other processes' CPU work beside them
# (rlflow/cost/timing_lock.py): there, numbers worth keeping need JOBS=1 BENCH_GROUPS=1.
set -uo pipefail
runs=${1:?usage: scripts/bench_gpu.sh RUNS_DIR STAGE...}
shift
mkdir -p "$runs"
read -r -a rlflow_cmd <<< "${RLFLOW:-python3 -m rlflow.cli}"
rlflow() { "${rlflow_cmd[@]}" "$@"; }
size=${SIZE:-full}
provider=${PROVIDER:-cuda}
read -r -a models <<< "${MODELS:-bert vit-base mini-dalle transformer-transducer inception-v3 resnext-50 squeezenet-1.1 resnet-18 resnet-50}"
table=${TABLE:-$runs/h100.json}
cost=${COST:-table:$table}
read -r -a methods <<< "${METHODS-greedy taso}"
export RLFLOW_TIMING_LOCK=${RLFLOW_TIMING_LOCK:-$runs/timing.lock}
say() { echo "[bench_gpu $(date +%H:%M:%S)] $*" >&2; }
min_time=()
[ -z "${MIN_TIME:-}" ] || min_time=(--min-time "$MIN_TIME")

check() {
    nvidia-smi > "$runs/nvidia-smi.txt" 2>&1
    python3 -c 'import onnxruntime as o; print(o.__version__, o.get_available_providers())' \
        > "$runs/versions.txt"
    python3 -m pip list 2>/dev/null | grep -iE '^(torch|torch.geometric|onnx|onnxscript|numpy) ' \
        >> "$runs/versions.txt"
    say "gpu-marked tests"
    python3 -m pytest -m gpu -q -p no:cacheprovider tests/cost/test_cuda.py 2>&1 | tee "$runs/pytest-gpu.txt"
    for model in "${models[@]}"; do
        say "$model against itself"
        rlflow measure "$model" --size "$size" --vs "$model" --provider "$provider" --json \
            > "$runs/self-$model.json" || say "$model: measure failed"
    done
}

collect_table() {
    say "cost table -> $table"
    rlflow costs collect --provider "$provider" --models "${models[@]}" --size "$size" \
        --steps "${STEPS:-20}" --jobs "${JOBS:-6}" --out "$table" --json > "$runs/table-summary.json"
}

table_error() {
    say "table vs end to end"
    python3 scripts/bench_perop_offline.py --size "$size" --models "${models[@]}" \
        --provider "$provider" --table "$table" "${min_time[@]}" --out "$runs/table-vs-e2e"
}

bench_methods() {  # bench_methods NAME MODEL...: METHODS (and replays) on the models, DEPLOYS
    local name=$1 replays=() deploys=${DEPLOYS:-offline}
    shift
    if [ -n "${REPLAYS:-}" ]; then
        for record in "$REPLAYS/$1"/*.json; do [ -f "$record" ] && replays+=("replay:$record"); done
    fi
    [ $((${#methods[@]} + ${#replays[@]})) -gt 0 ] || return 0
    rlflow bench --models "$@" --size "$size" --provider "$provider" \
        --methods "${methods[@]}" "${replays[@]}" --deploys "$deploys" --cost "$cost" \
        ${START:+--start "$START"} "${min_time[@]}" --out "$runs/bench-${deploys//,/-}-$name" \
        > "$runs/bench-${deploys//,/-}-$name.log" 2>&1
}

bench() {
    # BENCH_GROUPS processes at once, model i in group i mod BENCH_GROUPS; each writes its own report.
    local count=${BENCH_GROUPS:-3} index
    for ((index = 0; index < count; index++)); do
        local members=()
        for ((i = index; i < ${#models[@]}; i += count)); do members+=("${models[i]}"); done
        [ ${#members[@]} -gt 0 ] || continue
        (
            if [ -n "${REPLAYS:-}" ]; then  # each model its own methods
                for model in "${members[@]}"; do bench_methods "$model" "$model"; done
            else
                bench_methods "$index" "${members[@]}"
            fi
            [ "${ONLINE:-1}" = 0 ] || rlflow bench --models "${members[@]}" --size "$size" \
                --provider "$provider" --methods taso --deploys online --no-peer "${min_time[@]}" \
                --out "$runs/bench-online-$index" > "$runs/bench-online-$index.log" 2>&1
        ) &
    done
    wait
}

for stage in "$@"; do
    case $stage in
        check) check ;;
        table) collect_table ;;
        error) table_error ;;
        bench) bench ;;
        *) echo "unknown stage $stage (check, table, error, bench)" >&2; exit 2 ;;
    esac
done

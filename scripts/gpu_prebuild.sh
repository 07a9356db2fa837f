#!/usr/bin/env bash
# Export the full zoo into rlflow's cache on a lent GPU machine while the calls that copy
# onnxruntime-gpu's parts run, so that the call that measures does not spend its minutes in
# torch's exporter (the machine keeps /tmp between calls while it stays warm).
#
#   scripts/gpu_prebuild.sh start     # in the first call: returns at once, the export runs on
#   scripts/gpu_prebuild.sh wait      # gpu_lease.sh does this before it starts timing
#
# RUNS (/tmp/gpu-runs) as in scripts/gpu_lease.sh: the cache is RUNS/cache, the log
# RUNS/prebuild.txt. It waits on the export's process id, kept in RUNS/prebuild.pid, rather
# than on a `pgrep -f` of its name, which also matches the shell running the command that names
# it and so never returns.
set -uo pipefail
runs=${RUNS:-/tmp/gpu-runs}
pid_file=$runs/prebuild.pid
models=${MODELS:-resnet-18 bert vit-base transformer-transducer squeezenet-1.1 resnet-50 inception-v3 resnext-50 mini-dalle}
case ${1:?usage: scripts/gpu_prebuild.sh start|wait} in
    start)
        mkdir -p "$runs/cache"
        RLFLOW_CACHE_DIR=$runs/cache PYTHONPATH=$PWD setsid nohup python3 -c '
import sys
from rlflow import zoo
for name in sys.argv[1:]:
    print(name, zoo.cached_path(name, "full"), flush=True)
' $models > "$runs/prebuild.txt" 2>&1 < /dev/null &
        echo $! > "$pid_file"
        ;;
    wait)
        [ -f "$pid_file" ] || exit 0
        while kill -0 "$(cat "$pid_file")" 2> /dev/null; do sleep 1; done
        rm -f "$pid_file"
        cat "$runs/prebuild.txt"
        ;;
    *) echo "unknown action $1 (start, wait)" >&2; exit 2 ;;
esac

#!/usr/bin/env bash
# The README's main-job command: set up .venv if needed, then run rlflow's headline pipeline
# (RLFlow: a world model learnt from real rollouts, a controller trained in its dream) end to
# end on a small built-in model, and print a before/after table against TASO's search.
#
#   collect -> train-wm -> train-controller -> optimize --agent   (and optimize --method taso)
#
# Every optimised model is written only after it is checked equivalent to the original.
# Default: BERT at the zoo's medium size (4 layers, ~3 ms a run), where onnxruntime's own
# SkipLayerNormalization fusion is slower than what it replaces on a CPU thread, so what rlflow
# hands back (run as written, that fusion undone) beats onnxruntime's defaults; the zoo's
# "small" sizes run in ~0.1 ms, below what rewrites can measurably change, and on the CNNs
# onnxruntime's own graph is already the best we know. Override with e.g.
# `MODEL=squeezenet-1.1 SIZE=full EPISODES=64 ./scripts/demo.sh`. Runs again reuse finished
# data and runs.
# Epochs and generations are cut below configs/worldmodel.yaml's so that the whole demo fits
# in about ten minutes on two cores.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$ROOT/scripts/setup_venv.sh"
RLFLOW="$ROOT/.venv/bin/rlflow"
PY="$ROOT/.venv/bin/python"
MODEL="${MODEL:-bert}"
SIZE="${SIZE:-medium}"
EPISODES="${EPISODES:-48}"
BUDGET="${BUDGET:-100}"
OUT="${OUT:-$ROOT/out/demo}"
mkdir -p "$OUT"
started=$(date +%s)

echo "== $MODEL ($SIZE) in the graph IR"
"$RLFLOW" inspect "$MODEL" --size "$SIZE"
echo
echo "== 1/4 collect $EPISODES random rollouts in the real environment"
"$RLFLOW" collect --model "$MODEL" --size "$SIZE" --episodes "$EPISODES" --out "$OUT/data"
echo
echo "== 2/4 train the world model (VAE, then MDN-RNN)"
"$RLFLOW" train-wm --data "$OUT/data" --out "$OUT/wm" --vae-epochs 15 --rnn-epochs 20
echo
echo "== 3/4 train the controller in the world model's dream (no real environment steps)"
"$RLFLOW" train-controller --wm "$OUT/wm" --out "$OUT/controller" --temperatures 1 --generations 25
for deploy in offline online; do
    echo
    echo "== 4/4 optimize $MODEL, deploy $deploy: the controller, then taso (budget $BUDGET)"
    "$RLFLOW" optimize "$MODEL" --size "$SIZE" --agent "$OUT/controller" --deploy "$deploy" \
        -o "$OUT/$MODEL-controller-$deploy.onnx" --json | tail -n 1 \
        > "$OUT/controller-$deploy.json"
    "$RLFLOW" optimize "$MODEL" --size "$SIZE" --method taso --budget "$BUDGET" \
        --deploy "$deploy" -o "$OUT/$MODEL-taso-$deploy.onnx" --json | tail -n 1 \
        > "$OUT/taso-$deploy.json"
done

"$PY" - "$OUT" "$MODEL" "$SIZE" "$(( $(date +%s) - started ))" <<'PYEOF'
import json, sys
from pathlib import Path

out, model, size, wall = Path(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
print()
print(f"== result: {model} ({size}), 1 thread; speedup = the original under onnxruntime's "
      "defaults / the result as it deploys, timed interleaved in one run; peer = onnxruntime's "
      "best knob on the original")
header = (f"{'method':<11} {'deploy':<8} {'original ms':>11} {'optimized ms':>12} "
          f"{'speedup':>8} {'peer':>8} {'steps':>5} {'max abs err':>11} {'wall s':>7}  "
          "start state; rules applied")
print(header)
print("-" * len(header))
for method in ("controller", "taso"):
    for deploy in ("offline", "online"):
        r = json.loads((out / f"{method}-{deploy}.json").read_text())
        rules = ", ".join(f"{name} x{n}" for name, n in r["rules_applied"].items()) or "none"
        print(f"{method:<11} {deploy:<8} {r['original_ms']:>11.3f} {r['optimized_ms']:>12.3f} "
              f"{r['speedup']:>7.3f}x {r['peer_speedup']:>7.3f}x {r['steps']:>5} "
              f"{r['max_abs_err']:>11.1e} {r['wall_s']:>7.1f}  {r['start_state']}; {rules}")
print(f"(optimised models and runs in {out}; demo wall time {wall} s after set-up; "
      f"watch training with: tensorboard --logdir {out})")
PYEOF

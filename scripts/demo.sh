#!/usr/bin/env bash
# The README's main-job command: set up .venv if needed, then run rlflow end to end on a
# small built-in model and print a short result table.
# Until the learners land it runs what exists (grows with each issue): load the model, list its
# candidate rewrites, run TASO's backtracking search with ORT's optimiser off and on, and
# write each optimised model only after it is checked equivalent to the original.
# Default: SqueezeNet 1.1 at its real size (1.2M parameters, ~10 ms): the zoo's "small" sizes
# run in ~0.1 ms, below what rewrites can measurably change. E.g. `MODEL=bert SIZE=small ...`.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$ROOT/scripts/setup_venv.sh"
RLFLOW="$ROOT/.venv/bin/rlflow"
PY="$ROOT/.venv/bin/python"
MODEL="${MODEL:-squeezenet-1.1}"
BUDGET="${BUDGET:-200}"
SIZE="${SIZE:-full}"
OUT="${OUT:-$ROOT/out/demo}"
mkdir -p "$OUT"

echo "== the zoo"
"$RLFLOW" zoo list
echo
echo "== load $MODEL ($SIZE) into the graph IR"
"$RLFLOW" inspect "$MODEL" --size "$SIZE"
"$RLFLOW" inspect "$MODEL" --size "$SIZE" --json | tail -n 1 > "$OUT/inspect.json"
echo
echo
echo "== candidate rewrites of $MODEL (verified rules)"
"$RLFLOW" rules candidates "$MODEL" --size "$SIZE"
for level in disable all; do
    echo
    echo "== taso search on $MODEL, ort-level $level (1 thread; budget $BUDGET expansions)"
    "$RLFLOW" search "$MODEL" --size "$SIZE" --method taso --budget "$BUDGET" \
        --ort-level "$level" -o "$OUT/$MODEL-$level.onnx" --json | tail -n 1 \
        > "$OUT/search-$level.json"
done

"$PY" - "$OUT" <<'PYEOF'
import json, sys
from pathlib import Path

out = Path(sys.argv[1])
inspect = json.loads((out / "inspect.json").read_text())
print()
print(f"== result: {inspect['model']}, {inspect['nodes']} nodes, loaded in {inspect['load_s']} s")
header = (f"{'ort-level':<10} {'original ms':>11} {'optimized ms':>12} {'speedup':>8} "
          f"{'steps':>5} {'max abs err':>11} {'wall s':>7}  rules applied")
print(header)
print("-" * len(header))
for level in ("disable", "all"):
    r = json.loads((out / f"search-{level}.json").read_text())
    rules = ", ".join(f"{name} x{n}" for name, n in r["rules_applied"].items()) or "none"
    print(f"{level:<10} {r['original_ms']:>11.3f} {r['optimized_ms']:>12.3f} "
          f"{r['speedup']:>7.3f}x {r['steps']:>5} {r['max_abs_err']:>11.1e} "
          f"{r['wall_s']:>7.1f}  {rules}")
print(f"(threads {r['threads']}; speedup = original / optimized, measured interleaved in one "
      f"run; optimised models in {out})")
PYEOF

#!/usr/bin/env bash
# The README's main-job command: set up .venv if needed, then run rlflow end to end on a
# small built-in model and print a short result table.
# Until the learners land it runs what exists: export, load, measure (grows with each issue).
# MODEL=resnet-18 SIZE=small by default; e.g. `MODEL=bert SIZE=full ./scripts/demo.sh`.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$ROOT/scripts/setup_venv.sh"
RLFLOW="$ROOT/.venv/bin/rlflow"
PY="$ROOT/.venv/bin/python"
MODEL="${MODEL:-resnet-18}"
SIZE="${SIZE:-small}"
OUT="${OUT:-$ROOT/out/demo}"
mkdir -p "$OUT"

echo "== the zoo"
"$RLFLOW" zoo list
echo
echo "== load $MODEL ($SIZE) into the graph IR"
"$RLFLOW" inspect "$MODEL" --size "$SIZE"
"$RLFLOW" inspect "$MODEL" --size "$SIZE" --json | tail -n 1 > "$OUT/inspect.json"
echo
for level in disable all; do
    echo "== measure $MODEL with ort-level $level (1 thread, interleaved)"
    "$RLFLOW" measure "$MODEL" --size "$SIZE" --ort-level "$level" --json | tail -n 1 \
        > "$OUT/measure-$level.json"
done

"$PY" - "$OUT" <<'PYEOF'
import json, sys
from pathlib import Path

out = Path(sys.argv[1])
inspect = json.loads((out / "inspect.json").read_text())
print()
print(f"model {inspect['model']}: {inspect['nodes']} nodes, load {inspect['load_s']} s, "
      f"hash {inspect['hash'][:12]}")
print(f"{'ort-level':<10} {'min ms':>9} {'median ms':>10} {'runs':>6}  threads  provider")
for level in ("disable", "all"):
    m = json.loads((out / f"measure-{level}.json").read_text())
    print(f"{level:<10} {m['min_ms']:>9.3f} {m['median_ms']:>10.3f} {m['runs']:>6}  "
          f"{m['threads']:>7}  {m['provider']}")
PYEOF

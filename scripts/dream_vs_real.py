"""Dream return against real return of world-model controllers, one point per controller and
temperature, per group of controller runs: how optimistic each dream is.

    python scripts/dream_vs_real.py --group "label=RUN_DIR RUN_DIR ..." [--group ...] --png OUT.png

Each RUN_DIR is a `train-controller` run (or a loop's iter-K/controller) whose eval.json holds
the controllers' real episodes (`--eval-real`, or any `train-wm-loop`). Prints per group the
mean dream and real return and the mean gap (dream - real); draws them against y = x, groups
2k and 2k+1 in one hue (crosses, then dots: give them as before/after pairs).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def read_group(spec: str) -> tuple[str, list[dict]]:
    label, _, dirs = spec.partition("=")
    rows = []
    for run in dirs.split():
        path = Path(run) / "eval.json"
        if not path.is_file():
            sys.exit(f"error: {path} is missing (run train-controller --eval-real)")
        for row in json.loads(path.read_text())["per_model"]:
            rows.append({"run": run, **row})
    return label, rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--group", action="append", required=True, help='"label=RUN_DIR ..."')
    parser.add_argument("--png", help="write the scatter here")
    args = parser.parse_args()
    groups = [read_group(spec) for spec in args.group]
    print(f"{'group':40s} {'n':>3} {'dream':>7} {'real':>7} {'gap':>7}")
    for label, rows in groups:
        dream = [row["dream_return"] for row in rows]
        real = [row["real_return"] for row in rows]
        gap = sum(d - r for d, r in zip(dream, real)) / len(rows)
        print(
            f"{label:40s} {len(rows):>3} {sum(dream) / len(rows):>7.2f} "
            f"{sum(real) / len(rows):>7.2f} {gap:>7.2f}"
        )
    if args.png:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        figure, axis = plt.subplots(figsize=(6, 5))
        low, high = 0.0, 0.0
        palette = plt.get_cmap("tab20")  # groups 2k and 2k+1 share a hue: before and after
        for index, (label, rows) in enumerate(groups):
            dream = [row["dream_return"] for row in rows]
            real = [row["real_return"] for row in rows]
            marker = "o" if index % 2 else "x"
            axis.scatter(real, dream, label=label, color=palette(index), marker=marker)
            low, high = min(low, *dream, *real), max(high, *dream, *real)
        axis.plot([low, high], [low, high], color="grey", linewidth=1, label="dream = real")
        axis.set_xlabel("real return (percent of the per-op cost saved)")
        axis.set_ylabel("dream return")
        axis.set_title("World-model controllers: dream against real return")
        axis.legend(fontsize=8)
        figure.tight_layout()
        figure.savefig(args.png, dpi=120)
        print(f"wrote {args.png}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

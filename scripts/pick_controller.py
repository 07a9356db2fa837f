#!/usr/bin/env python
"""Pick one controller among several runs by their real episodes: the most real env steps a
world model's budget can still buy, spent on choosing.

Every temperature of every listed `rlflow train-controller --eval-real` run (or loop round's
controller directory) is a candidate, scored by its real return (the env's per-op reward) or by
the measured end-to-end speedup of the cheapest graph its episode passed (`--select speedup`
runs, timed once each).
The winning run is copied to OUT with its temperature chosen; `picked.json` there lists every
candidate and what choosing cost: the real env steps and measurements of all the listed runs'
real episodes, which `scripts/learners_table.py` counts with the controller's training.

    python scripts/pick_controller.py --by speedup --out runs/pick/seed-0 RUN_A RUN_B
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

import yaml

from rlflow.worldmodel.controller import SCORE_KEYS as SCORES


def candidates(runs: list[Path], by: str) -> tuple[list[dict], int, int]:
    """(every run's temperatures with their scores, eval-real env steps, measurements)."""
    rows, steps, measurements = [], 0, 0
    for run in runs:
        if not (run / "config.yaml").is_file():
            raise SystemExit(f"pick_controller: {run} has no config.yaml: not a controller run")
        path = run / "eval.json"
        try:
            report = json.loads(path.read_text())
        except (OSError, ValueError) as error:
            message = f"pick_controller: {path} unreadable ({error}): run --eval-real first"
            raise SystemExit(message) from None
        steps += int(report["real_env_steps"])
        measurements += int(report["real_measurements"])
        for tau, row in report["temperatures"].items():
            if row.get(SCORES[by]) is None:
                raise SystemExit(f"pick_controller: {run} tau {tau} has no {by}: not measured")
            rows.append(
                {"run": str(run), "temperature": float(tau), "score": float(row[SCORES[by]])}
                | {"real_return": row["real_return"], "speedup": row.get("speedup")}
            )
    return rows, steps, measurements


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path, help="controller run directories")
    parser.add_argument("--by", choices=sorted(SCORES), default="speedup")
    parser.add_argument("--out", type=Path, required=True, help="where the winner is copied")
    args = parser.parse_args()
    if args.out.exists():
        raise SystemExit(f"pick_controller: {args.out} exists")
    rows, steps, measurements = candidates(args.runs, args.by)
    best = max(rows, key=lambda row: row["score"])  # ties: the first listed
    # Assembled beside OUT and renamed into place: a killed pick leaves no OUT whose eval.json
    # still names the copied run's own tau (and which a rerun would refuse as existing).
    args.out.parent.mkdir(parents=True, exist_ok=True)
    draft = Path(tempfile.mkdtemp(prefix=f".{args.out.name}-", dir=args.out.parent)) / "run"
    shutil.copytree(best["run"], draft)
    report = json.loads((draft / "eval.json").read_text())
    report["selected_temperature"] = best["temperature"]
    (draft / "eval.json").write_text(json.dumps(report, indent=1))
    config = yaml.safe_load((draft / "config.yaml").read_text())
    config["select"] = args.by  # the copy's policy is the chosen tau (`run_temperature`)
    (draft / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    picked = {"by": args.by, "candidates": rows, "picked": best}
    picked |= {"real_env_steps": steps, "real_measurements": measurements}
    (draft / "picked.json").write_text(json.dumps(picked, indent=1))
    draft.rename(args.out)
    draft.parent.rmdir()
    for row in rows:
        mark = "*" if row is best else " "
        print(
            f"{mark} {row['run']} tau {row['temperature']:g}: real return "
            f"{row['real_return']:.3f}, speedup {row['speedup'] or float('nan'):.3f}"
        )
    print(
        f"picked by {args.by} among {len(rows)}: {args.out}; choosing cost {steps} real env "
        f"steps and {measurements} measurements",
        file=sys.stderr,
    )


if __name__ == "__main__":
    main()

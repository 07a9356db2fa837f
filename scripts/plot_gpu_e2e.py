#!/usr/bin/env python
"""Table and plot of a lease's end-to-end-ranked searches (scripts/gpu_followups.sh `e2e`).

Reads, from one results directory, the `rlflow optimize --json` records in `e2e/*.json` and the
`rlflow measure --vs` records in `remeasure/NAME-N.json` (the model search NAME wrote, timed
again against the original, each in a fresh process). Prints per search its confirmed speedup,
the best of its selection run, the rules it applied and the re-timings; `--png` draws each
search's finalists, its returned result and the re-timings of what it wrote, so that a search's
own timing is seen beside later ones.

    python scripts/plot_gpu_e2e.py docs/results/gpu-h200-2026-11-27 \
        --png docs/img/gpu_h200_e2e_search.png
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def read(results: Path) -> tuple[dict[str, dict], dict[str, list[float]]]:
    """(search name -> optimize record, re-timed group -> speedups over the original)."""
    searches = {
        path.stem: json.loads(path.read_text()) for path in sorted(results.glob("e2e/*.json"))
    }
    retimed: dict[str, list[float]] = defaultdict(list)
    for path in sorted(results.glob("remeasure/*.json")):
        group = path.stem.rsplit("-", 1)[0]  # resnet-18-run2-3 -> resnet-18-run2
        retimed[group].append(json.loads(path.read_text())["ratio"])
    return searches, dict(retimed)


def table(searches: dict[str, dict], retimed: dict[str, list[float]]) -> str:
    lines = [
        "| search | graphs timed | selection run, best | returned | confirmed | rules applied "
        "| re-timed |",
        "|---|---:|---:|---:|---|---|---|",
    ]
    for name, record in searches.items():
        best = max(finalist["speedup"] for finalist in record["finalists"])
        again = retimed.get(name, [])
        lines.append(
            f"| {name} | {record['evaluated']} | {best:.3f}x | {record['speedup']:.3f}x | "
            f"{record['confirmed']} | {dict(record['rules_applied']) or '-'} | "
            f"{', '.join(f'{value:.3f}x' for value in again) or '-'} |"
        )
    for group in sorted(set(retimed) - set(searches)):
        values = ", ".join(f"{value:.3f}x" for value in retimed[group])
        lines.append(f"| {group} (as written) | - | - | - | - | - | {values} |")
    return "\n".join(lines)


def plot(searches: dict[str, dict], retimed: dict[str, list[float]], png: Path) -> None:
    names = [*searches, *sorted(set(retimed) - set(searches))]
    fig, ax = plt.subplots(figsize=(8, 0.6 * len(names) + 1.5))
    for row, name in enumerate(names):
        record = searches.get(name)
        if record:
            finalists = [finalist["speedup"] for finalist in record["finalists"]]
            ax.scatter(
                finalists,
                [row] * len(finalists),
                marker="|",
                s=200,
                color="0.6",
                label="selection run (finalists)" if row == 0 else None,
            )
            ax.scatter(
                [record["speedup"]],
                [row],
                marker="o",
                s=70,
                color="C0",
                label="returned (confirmation run)" if row == 0 else None,
            )
        again = retimed.get(name, [])
        ax.scatter(
            again,
            [row - 0.18] * len(again),
            marker="x",
            color="C3",
            label="written model re-timed, fresh process" if row == 0 else None,
        )
    ax.axvline(1.0, color="black", linewidth=0.8)
    labels = [name if name in searches else f"{name} (as written)" for name in names]
    ax.set_yticks(range(len(names)), labels)
    ax.invert_yaxis()
    ax.set_xlabel("speedup over the original under onnxruntime's CUDA defaults")
    ax.set_title("greedy ranked by end-to-end GPU timings (H200, full size)")
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(png, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", type=Path)
    parser.add_argument("--png", type=Path)
    args = parser.parse_args()
    searches, retimed = read(args.results)
    print(table(searches, retimed))
    if args.png:
        plot(searches, retimed, args.png)


if __name__ == "__main__":
    main()

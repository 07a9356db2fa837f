#!/usr/bin/env python
"""The GPU section's table and plot from what `scripts/gpu_lease.sh` brought back.

Reads one or more lease directories (each the unpacked `gpu.tgz`: `bench-offline-*/` and
`bench-online-*/` report directories, `self-MODEL.json` from `rlflow measure --vs`,
`table-vs-e2e.json` from `scripts/bench_perop_offline.py --table`) and prints, per model, the
original's CUDA latency and its noise floor (the model timed against itself), onnxruntime's
levels against its default, each method's deployable speedup offline and online with the
tuning peer beside them, the worst equivalence error, and the table's sum against end-to-end
latency. Where two leases measured the same thing, the later directory given wins. A result
whose bench was cut off before its final interleaved timing is marked * (provisional: its own
measurement against its start, times the start against onnxruntime's default).

    python scripts/gpu_table.py docs/results/gpu-h200-2026-11-26 --png docs/img/gpu_h200_full.png
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def read_leases(dirs: list[Path]) -> dict[str, dict]:
    """model -> what was measured of it (keys: self, levels, methods, peer, table)."""
    models: dict[str, dict] = {}
    for lease in dirs:
        for path in sorted(lease.glob("self-*.json")):
            if path.stat().st_size:
                data = json.loads(path.read_text())
                models.setdefault(data["model"], {})["self"] = data
        for path in sorted(lease.glob("bench-*/results.json")):
            read_bench(json.loads(path.read_text()), models)
        errors = lease / "table-vs-e2e.json"
        if errors.exists():
            for row in json.loads(errors.read_text())["rows"]:
                entry = models.setdefault(f"{row['model']}:full", {}).setdefault("table", {})
                entry[row["state"]] = row
    return models


def read_bench(results: dict, models: dict[str, dict]) -> None:
    for key, comparison in results["comparisons"].items():
        model, deploy = key.split("|")
        entry = models.setdefault(model, {})
        for method, graph in comparison["members"].items():
            cell = results["cells"][f"{model}|{method}|{deploy}"]
            entry.setdefault("methods", {})[f"{method} {deploy}"] = {
                "speedup": comparison["speedup"][graph],
                "err": cell.get("max_abs_err"),
                "rules": sum(cell.get("rules_applied", {}).values()),
            }
        entry.setdefault("original_ms", {})[deploy] = comparison["ms"]["original"]
    compared = {
        f"{key.split('|')[0]}|{method}|{key.split('|')[1]}"
        for key, comparison in results["comparisons"].items()
        for method in comparison["members"]
    }
    for key, cell in results["cells"].items():
        model, method, deploy = key.split("|")
        start = results["starts"].get(f"{model}|{deploy}", {}).get(cell.get("start_state"))
        if key in compared or start is None or cell.get("method_speedup") is None:
            continue
        # The bench stopped before timing its results together: the method's own final
        # measurement against its start, times the start against onnxruntime's default (two
        # interleaved runs, minutes apart), marked provisional.
        entry = models.setdefault(model, {}).setdefault("methods", {})
        if not entry.get(f"{method} {deploy}", {}).get("provisional", True):
            continue  # a final timing of it, from an earlier lease, stands
        entry[f"{method} {deploy}"] = {
            "speedup": start * cell["method_speedup"],
            "err": cell.get("max_abs_err"),
            "rules": sum(cell.get("rules_applied", {}).values()),
            "provisional": True,
        }
    for model, peer in results["peers"].items():
        models.setdefault(model, {})["peer"] = peer
    for key, starts in results["starts"].items():
        models.setdefault(key.split("|")[0], {})["levels"] = starts


def fmt(value: float | None, pattern: str = "{:.3f}x") -> str:
    return "—" if value is None else pattern.format(value)


def table(models: dict[str, dict], methods: list[str]) -> str:
    head = ["model", "CUDA ms", "itself", "ORT `disable`", *methods, "tuning peer", "max abs err"]
    lines = ["| " + " | ".join(head) + " |", "|---" + "|---:" * (len(head) - 1) + "|"]
    for model, entry in sorted(models.items()):
        done = entry.get("methods", {})
        cells = [
            fmt(done[m]["speedup"]) + ("*" if done[m].get("provisional") else "")
            if m in done
            else "—"
            for m in methods
        ]
        errors = [done[m]["err"] for m in methods if m in done and done[m]["err"] is not None]
        itself = entry.get("self", {})
        peer = entry.get("peer")
        lines.append(
            "| "
            + " | ".join(
                [
                    model,
                    fmt(itself.get("median_ms"), "{:.3f}"),
                    fmt(itself.get("ratio"), "{:.3f}"),
                    fmt(entry.get("levels", {}).get("original")),
                    *cells,
                    f"{peer['speedup']:.3f}x ({peer['knob']})" if peer else "—",
                    fmt(max(errors) if errors else None, "{:.1e}"),
                ]
            )
            + " |"
        )
    return "\n".join(lines)


def table_error(models: dict[str, dict]) -> str:
    lines = [
        "| model | graph | end to end ms | table sum ms | error | operators not in the table |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for model, entry in sorted(models.items()):
        for state, row in sorted(entry.get("table", {}).items()):
            error = row["perop_ms"] / row["e2e_ms"] - 1
            lines.append(
                f"| {model} | {state} | {row['e2e_ms']:.3f} | {row['perop_ms']:.3f} | "
                f"{error:+.0%} | {row['perop_fallbacks']} of {row['nodes']} |"
            )
    return "\n".join(lines)


def plot(models: dict[str, dict], methods: list[str], path: Path, title: str) -> None:
    names = [m for m in sorted(models) if models[m].get("methods")]
    series = [*methods, "tuning peer"]
    width = 0.8 / len(series)
    fig, ax = plt.subplots(figsize=(max(6, 1.4 * len(names)) + 2, 4))
    for index, method in enumerate(series):
        values, hatches = [], []
        for name in names:
            entry = models[name]
            if method == "tuning peer":
                values.append(entry["peer"]["speedup"] if "peer" in entry else 0)
                hatches.append("")
            else:
                done = entry["methods"].get(method, {})
                values.append(done.get("speedup", 0))
                hatches.append("//" if done.get("provisional") else "")
        xs = [i + (index - (len(series) - 1) / 2) * width for i in range(len(names))]
        bars = ax.bar(xs, values, width, label=method)
        for bar, hatch in zip(bars, hatches):
            bar.set_hatch(hatch)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks(range(len(names)), [n.replace(":full", "") for n in names], rotation=20)
    ax.set_ylabel("speedup over the original at ORT's defaults")
    low = min((v["speedup"] for n in names for v in models[n]["methods"].values()), default=1)
    ax.set_ylim(min(0.95, low - 0.02), None)
    ax.set_title(title)
    if any(m.get("provisional") for n in names for m in models[n]["methods"].values()):
        ax.text(
            0.99,
            0.97,
            "hatched: provisional (*)",
            transform=ax.transAxes,
            ha="right",
            va="top",
            fontsize=8,
        )
    # beside the axes: with many methods a legend inside covers the bars
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("leases", nargs="+", type=Path, help="unpacked lease directories")
    parser.add_argument("--png", type=Path, help="write the speedup plot here")
    parser.add_argument("--title", default="rlflow on the GPU (full size, CUDA provider)")
    args = parser.parse_args()
    missing = [str(d) for d in args.leases if not d.is_dir()]
    if missing:
        parser.error(f"not a directory: {', '.join(missing)}")
    models = read_leases(args.leases)
    methods = sorted({m for e in models.values() for m in e.get("methods", {})}, reverse=True)
    print(table(models, methods))
    print()
    print(table_error(models))
    if args.png:
        plot(models, methods, args.png, args.title)


if __name__ == "__main__":
    main()

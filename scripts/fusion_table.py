#!/usr/bin/env python
"""Which of onnxruntime's fusions each bench result kept, dropped or added, and at which sites.

`rlflow bench` records, per result, onnxruntime's own operators (contrib `ms:` and blocked
layout `nchwc:`) in ORT's `all` graph of the model and in the result, each site named by the
tensor the fused operator produces (`rlflow.cost.ort_optimizer.fusion_table`). This turns a
bench's results.json into one markdown table: per model and operator, ORT's count, the
result's count, and the sites dropped and added. Rewrites that rename a tensor without removing
the operator (an activation moved across a blocked Conv, say) show as a site dropped and one
added with the count unchanged; those are reported as "named differently", not as fusions
undone. Starting from the original graph, "same sites" means the search made them itself.

    python scripts/fusion_table.py runs/offline-medium/results.json > fusions.md
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

SHOWN_SITES = 4
"""Site names listed per cell before "+N more" (full lists stay in results.json)."""


def sites_text(sites: list[str]) -> str:
    """`a`, `b`, +3 more."""
    shown = ", ".join(f"`{site}`" for site in sites[:SHOWN_SITES])
    extra = len(sites) - SHOWN_SITES
    return f"{shown}, +{extra} more" if extra > 0 else shown


def change_text(entry: dict) -> str:
    """What the result did to one operator's sites: kept all, dropped some, added some."""
    ort, ours = entry["ort"], entry["rlflow"]
    dropped, added = entry["dropped"], entry["added"]
    if ours == ort:
        if not dropped:
            return "same sites as ORT"
        return f"same count; {len(dropped)} named differently (moved or renamed by rewrites)"
    parts = []
    if ours < ort:
        parts.append(f"dropped {ort - ours}: {sites_text(dropped)}")
    else:
        parts.append(f"added {ours - ort}: {sites_text(added)}")
    return "; ".join(parts)


def table(results: dict) -> str:
    """The markdown table of every cell of a bench's results.json."""
    lines = [
        "| model | method | start state | operator | ORT all | result | what the result did |",
        "|---|---|---|---|---:|---:|---|",
    ]
    for key in sorted(results["cells"]):
        cell = results["cells"][key]
        fusions = cell.get("fusions") or {}
        for op, entry in sorted(fusions.items()):
            lines.append(
                f"| {cell['model']} | {cell['method']} | {cell.get('start_state', '')} | {op} "
                f"| {entry['ort']} | {entry['rlflow']} | {change_text(entry)} |"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", type=Path, help="a bench's results.json")
    args = parser.parse_args(argv)
    try:
        results = json.loads(args.results.read_text())
        print(table(results))
    except (OSError, ValueError, KeyError) as error:
        print(f"fusion_table: cannot read {args.results}: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""The markdown of a benchmark report: per deploy mode, tables over models (rows) and methods
(columns) of speedup (beside the tuning peer), optimisation wall time, steps, equivalence error,
rules applied and onnxruntime's fusions kept or dropped."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from rlflow.cost.runner import geometric_mean

Row = Mapping[str, Any]

ROW_FIELDS: tuple[str, ...] = (
    "model",  # label of the model (zoo name:size or path)
    "method",  # method label (greedy, taso, random, agent:RUN_NAME)
    "deploy",  # offline (runs as written) or online (onnxruntime optimises it at load)
    "start_state",  # where the method began (offline: original, ort:all, ...)
    "threads",  # intra-op threads of the measurements
    "equivalent",  # the result passed the equivalence check (else no speedup is reported)
    "speedup",  # over the original under ORT's defaults, in the model's interleaved comparison
    "earlier_speedups",  # the same graph's speedups in that comparison's earlier runs (--retime)
    "peer_speedup",  # the best of onnxruntime's own knobs on the original (the tuning peer)
    "peer_knob",  # which knob that was (level, or level-PASS with that pass off)
    "original_ms",  # the original's median run in that comparison
    "optimized_ms",  # original_ms / speedup (Comparison.scaled_ms)
    "wall_s",  # the method's optimisation wall time (search or rollouts + its measurement)
    "steps",  # rewrites applied on the path to the result
    "expansions",  # search expansions, or the agent's rollout steps
    "env_steps",  # real env steps the agent trained with (None for searches)
    "max_abs_err",  # equivalence check: largest absolute error over outputs and seeds
    "rules_applied",  # rule name -> times applied
    "fusions",  # onnxruntime's fusions in its all graph against the result's, per operator
)
"""What each result row holds (a dict); `render_report` reads these keys."""


def _ordered(rows: Sequence[Row], key: str) -> list[str]:
    seen: dict[str, None] = {}
    for row in rows:
        seen.setdefault(str(row[key]), None)
    return list(seen)


def _table(
    rows: Sequence[Row],
    models: list[str],
    methods: list[str],
    cell: Callable[[Row], str],
    first: tuple[str, Callable[[str], str]] | None = None,
) -> list[str]:
    """A markdown table: a row per model, a column per method (plus an optional first one)."""
    by_key = {(row["model"], row["method"]): row for row in rows}
    head = ["model", *([first[0]] if first else []), *methods]
    lines = ["| " + " | ".join(head) + " |", "|---" + "|---:" * (len(head) - 1) + "|"]
    for model in models:
        cells = [model]
        if first:
            cells.append(first[1](model))
        for method in methods:
            row = by_key.get((model, method))
            cells.append("—" if row is None else cell(row))
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def _speedup(row: Row) -> str:
    if not row.get("equivalent", True):
        return "not equivalent"
    if row.get("speedup") is None:
        return "—"
    earlier = row.get("earlier_speedups") or []
    before = f" (earlier {', '.join(f'{s:.3f}x' for s in earlier)})" if earlier else ""
    return f"{row['speedup']:.3f}x{before}"


def _steps(row: Row) -> str:
    env_steps = row.get("env_steps")
    trained = "—" if env_steps is None else f"{env_steps:,}"
    return f"{row.get('steps', 0)} / {row.get('expansions', 0)} / {trained}"


def _error(row: Row) -> str:
    value = row.get("max_abs_err")
    if not row.get("equivalent", True):
        return f"fails ({value:.1e})" if isinstance(value, float) else "fails"
    return "—" if value is None else f"{value:.1e}"


def _geomeans(rows: Sequence[Row], methods: list[str]) -> str:
    """One line: each method's geometric mean speedup over the models, and the peer's."""
    parts = []
    for method in methods:
        mean = geometric_mean(row.get("speedup") for row in rows if row["method"] == method)
        parts.append(f"{method} {mean:.3f}x")
    peers = {row["model"]: row.get("peer_speedup") for row in rows}
    if any(value is not None for value in peers.values()):
        parts.append(f"tuning peer {geometric_mean(peers.values()):.3f}x")
    return "Geometric mean over the models: " + ", ".join(parts) + "."


def _fusions(row: Row) -> str:
    changed = [
        f"{op} {entry['ort']}->{entry['rlflow']}"
        for op, entry in (row.get("fusions") or {}).items()
        if entry["dropped"] or entry["added"]
    ]
    return ", ".join(changed) if changed else "as onnxruntime"


def format_rules(rules: dict[str, int] | None) -> str:
    """The three most used rules with their counts (rules come most used first), then how
    many more: enough to tell two results apart in a table cell."""
    if not rules:
        return "none"
    shown = [f"{name} x{count}" for name, count in list(rules.items())[:3]]
    more = len(rules) - len(shown)
    return ", ".join(shown) + (f", +{more} more" if more > 0 else "")


def render_report(
    rows: Sequence[Row],
    *,
    title: str = "rlflow bench",
    preamble: Sequence[str] = (),
    plots: Sequence[tuple[str, str]] = (),
) -> str:
    """The report as markdown: `preamble` lines, then per deploy mode the tables, then
    `plots` as (caption, relative PNG path) images."""
    lines = [f"# {title}", "", *preamble, ""]
    models, methods = _ordered(rows, "model"), _ordered(rows, "method")
    for mode in _ordered(rows, "deploy"):
        at_level = [row for row in rows if row["deploy"] == mode]
        threads = sorted({row.get("threads") for row in at_level if row.get("threads")})
        original_ms: dict[str, str] = {}
        peers: dict[str, str] = {}
        starts = {row["model"]: str(row.get("start_state", "—")) for row in at_level}
        for row in at_level:
            if row.get("original_ms") is not None:
                original_ms[row["model"]] = f"{row['original_ms']:.3f}"
            if row.get("peer_speedup") is not None:
                peers[row["model"]] = f"{row['peer_speedup']:.3f}x ({row['peer_knob']})"
        how = {
            "offline": "runs as written (onnxruntime's optimiser off, declared in its "
            "ort_config), starting from the fastest of onnxruntime's graphs",
            "online": "is optimised again by onnxruntime when it loads",
        }.get(mode, "")
        lines += [
            f"## Deploy `{mode}`" + (f", {threads[0]} thread(s)" if len(threads) == 1 else ""),
            "",
            f"Each result {how}. Speedup over the original under onnxruntime's defaults "
            "(level all; the median of per-pair ratios), all results of a model timed "
            "interleaved in one run; original ms is the original's median run in that run. "
            "Tuning peer: the best of onnxruntime's own knobs on the original (its levels, "
            "and all with each pass that changed the model off), timed in its own run.",
            "",
            *_table(
                at_level,
                models,
                methods,
                _speedup,
                ("original ms", lambda model, ms=original_ms: ms.get(model, "—")),
            ),
            "",
            _geomeans(at_level, methods),
            "",
            "Tuning peer and start state per model.",
            "",
            "| model | tuning peer | start state |",
            "|---|---:|---|",
            *(
                f"| {model} | {peers.get(model, '—')} | {starts.get(model, '—')} |"
                for model in models
            ),
            "",
            "Optimisation wall time (s): search or rollouts, plus the method's own final "
            "measurement of its best graphs.",
            "",
            *_table(at_level, models, methods, lambda row: f"{row['wall_s']:.1f}"),
            "",
            "Steps: rewrites applied / search expansions or agent rollout steps / real env "
            "steps the agent trained with.",
            "",
            *_table(at_level, models, methods, _steps),
            "",
            "Equivalence check of each result against the original: max abs error.",
            "",
            *_table(at_level, models, methods, _error),
            "",
            "Rules applied (most used first).",
            "",
            *_table(at_level, models, methods, lambda row: format_rules(row.get("rules_applied"))),
            "",
            "onnxruntime's fusions (its `all` graph -> the result), where they differ.",
            "",
            *_table(at_level, models, methods, _fusions),
            "",
        ]
    if plots:
        lines += ["## Plots", ""]
        for caption, path in plots:
            lines += [f"![{caption}]({path})", "", caption, ""]
    return "\n".join(lines).rstrip() + "\n"

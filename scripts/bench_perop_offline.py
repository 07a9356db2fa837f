#!/usr/bin/env python
"""Per-op cost against end-to-end latency in offline mode, for every zoo model at one size.

Offline, a model runs as written (optimiser off), so each operator runs as timed alone and the
per-op sum should track the whole graph. This measures how well it does: for every zoo model,
the original and onnxruntime's `all` graph of it (the two start states every offline search
has), both declared to run as written, are

- timed end to end by the Runner (its adaptive protocol; a graph alone is summarised by its
  3rd-smallest run, `Measurement.low_ms`);
- costed by the per-op model (each distinct operator timed alone at the graph's level, the
  per-run overhead counted once; fallbacks to the analytic model counted);
- costed by the analytic roofline (a floor: its error is expected to be negative).

Relative error = (estimate - end to end) / end to end. The table goes to stdout and OUT.md, the
rows with the date and load average of each to OUT.json, a bar chart of the errors per model to
OUT.png; progress to stderr. Resumable: rows already in OUT.json for the same size, threads,
provider and onnxruntime are kept, and operator times are cached in OUT.sqlite, this table's
own, so that they were taken in the same session as the end-to-end times beside them
(--fresh starts both over; --perop-cache uses another cache, e.g. the shared one).

With `--graphs FILE ...` the rows are those ONNX files instead (or as well, with --models),
e.g. a bench's result models (`OUT/models/*.onnx`): a search ranks graphs that are neither
start state, and the error that misleads it is the one on those. Each runs at the level it
declares; its row is named by its file as a bench names it
(`squeezenet-1.1_medium.taso.offline.onnx`: model `squeezenet-1.1_medium`, state
`taso.offline`; another name is the model, its state `file`).

With `--table PATH` the estimate is a cost table's sum instead (`rlflow costs collect`, e.g. one
collected on a GPU, checked here against that GPU's end-to-end latency): no operator is timed,
and operators the table lacks are priced by its fitted roofline (counted as fallbacks).

    python scripts/bench_perop_offline.py --size small --out runs/perop-offline-small
    python scripts/bench_perop_offline.py --graphs runs/bench/models/*.onnx --out runs/perop-results
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import SimpleNamespace

import onnxruntime as ort

from rlflow.cost import (
    AnalyticCostModel,
    Deployment,
    MachinePeaks,
    OrtSettings,
    PerOpCostModel,
    Runner,
    machine_peaks,
)
from rlflow.cost.cache import read_json
from rlflow.cost.ort_optimizer import start_state
from rlflow.cost.table import TableCostModel
from rlflow.fileio import write_json_atomic, write_text_atomic
from rlflow.graph import Graph, load_model
from rlflow.zoo import MODEL_NAMES, cached_path

BENCH_RESULT_NAME = re.compile(r"^(.+?_(?:small|medium|full))\.(.+)\.onnx$")
"""How `rlflow bench` names a result model: the zoo model and size, then method and deploy."""
STATES = ("original", "ort:all")
"""The start states compared: the model as written and onnxruntime's `all` graph of it."""


@dataclass
class Row:
    """One graph: its end-to-end latency (`e2e_ms`, the 3rd-smallest run) and the two estimates
    of it; `ort_level` is the level the per-op model timed its operators at (the graph's
    declared one), `load` the 1-minute load average when it was measured, `notes` the per-op
    model's fallbacks and the operators the analytic model has no formula for, if any."""

    model: str
    state: str
    nodes: int
    e2e_ms: float
    e2e_median_ms: float
    perop_ms: float
    perop_fallbacks: int
    analytic_ms: float
    ort_level: str
    load: float
    date: str
    notes: list[str] = field(default_factory=list)

    @property
    def key(self) -> str:
        return f"{self.model}|{self.state}"

    @property
    def perop_error(self) -> float:
        return relative_error(self.perop_ms, self.e2e_ms)

    @property
    def analytic_error(self) -> float:
        return relative_error(self.analytic_ms, self.e2e_ms)


class TableEstimate:
    """A cost table in the per-op model's place: `report` answers with the fields `measure`
    reads (nothing is timed; operators the table lacks are the fallbacks)."""

    def __init__(self, spec: str) -> None:
        self.model = TableCostModel(spec)

    def report(self, graph: Graph) -> SimpleNamespace:
        report = self.model.report(graph)
        return SimpleNamespace(
            total_ms=report.total_ms,
            measured_now=0,
            fallback_nodes=report.misses,
            fallback_reasons={op: "not in the table (roofline)" for op in report.missed_ops},
            ort_level=self.model.level_for(graph),
        )

    def close(self) -> None:
        pass


def relative_error(estimate: float, measured: float) -> float:
    """(estimate - measured) / measured: positive when the estimate is too high."""
    return (estimate - measured) / measured


def progress(message: str) -> None:
    stamp = time.strftime("%H:%M:%S")
    print(f"[bench_perop_offline {stamp}] {message}", file=sys.stderr, flush=True)


def start_graphs(name: str, size: str, settings: OrtSettings) -> dict[str, Graph]:
    """The zoo model's start states in `STATES`, by name, each declared to run as written."""
    original = load_model(cached_path(name, size))
    return {state: start_state(original, state, settings).graph for state in STATES}


def file_graph(path: Path, settings: OrtSettings) -> tuple[str, str, Graph]:
    """(model, state, graph) of an ONNX file, named as `rlflow bench` names its results
    (MODEL_SIZE.METHOD.DEPLOY.onnx). A file that declares no settings of its own runs at the
    offline ones."""
    named = BENCH_RESULT_NAME.match(path.name)
    model, state = named.groups() if named else (path.stem, "file")
    graph = load_model(path)
    if "ort_config" not in graph.metadata:
        graph = start_state(graph, "original", settings).graph
    return model, state, graph


def measure(
    name: str,
    state: str,
    graph: Graph,
    runner: Runner,
    perop: PerOpCostModel | TableEstimate,
    analytic: AnalyticCostModel,
) -> Row:
    """Time `graph` end to end and cost it both ways."""
    started = time.perf_counter()
    per_op = perop.report(graph)
    progress(
        f"{name} {state}: estimate {per_op.total_ms:.3f} ms ({per_op.measured_now} operators "
        f"timed in {time.perf_counter() - started:.1f} s, {per_op.fallback_nodes} fallbacks)"
    )
    e2e = runner.measure(graph, use_cache=False)
    floor = analytic.report(graph)
    row = Row(
        model=name,
        state=state,
        nodes=len(graph.nodes),
        e2e_ms=e2e.low_ms or e2e.min_ms,
        e2e_median_ms=e2e.median_ms,
        perop_ms=per_op.total_ms,
        perop_fallbacks=per_op.fallback_nodes,
        analytic_ms=floor.floor_ms,
        ort_level=per_op.ort_level,
        load=os.getloadavg()[0],
        date=time.strftime("%Y-%m-%d %H:%M:%S"),
    )
    if per_op.fallback_reasons:
        row.notes.append(f"estimate's fallbacks: {per_op.fallback_reasons}")
    if floor.unmodelled:
        row.notes.append(f"no analytic formula for {floor.unmodelled}")
    progress(
        f"{name} {state}: e2e {row.e2e_ms:.3f} ms ({e2e.runs} runs), estimate's error "
        f"{100 * row.perop_error:+.1f}%, analytic {100 * row.analytic_error:+.1f}%, "
        f"load {row.load:.2f}"
    )
    return row


def run_meta(
    size: str, settings: OrtSettings, cold: bool = True, table: str | None = None
) -> dict[str, object]:
    """What rows must share to sit in one table (`table`: the cost table estimating, if any)."""
    return {
        "size": size,
        **({"estimate": f"table:{table}"} if table else {}),
        "perop_caches": "flushed before every run" if cold else "warm",
        "threads": settings.threads,
        "provider": settings.resolved().provider,
        "onnxruntime": ort.__version__,
    }


def kept_rows(path: Path, meta: dict[str, object]) -> dict[str, Row]:
    """The rows of an earlier run at `path` measured under the same `meta` (else none)."""
    data = read_json(path)
    if data.get("meta") != meta:
        return {}
    rows = [Row(**entry) for entry in data.get("rows", [])]
    return {row.key: row for row in rows}


def markdown(rows: list[Row], meta: dict[str, object], peaks: MachinePeaks, command: str) -> str:
    """The table, with how it was measured and a summary line per estimate."""
    dates = sorted(row.date for row in rows)
    loads = [row.load for row in rows]
    label = estimate_label(meta)
    how = (
        f"its operators are costed by the cost table {str(meta['estimate'])[6:]}"
        if "estimate" in meta
        else "its operators are timed alone at the same level, caches "
        f"{meta.get('perop_caches', 'warm')}"
    )
    lines = [
        f"# {label} cost vs end-to-end latency, offline (zoo size {meta['size']})",
        "",
        f"`{command}`",
        "",
        f"onnxruntime {meta['onnxruntime']}, provider {meta['provider']}, {meta['threads']} "
        f"thread(s); every graph runs as written (optimiser off) and {how}; "
        f"measured {dates[0]} to {dates[-1]}, 1-minute load average "
        f"{min(loads):.2f}-{max(loads):.2f}; analytic peaks {peaks.gflops:.1f} GFLOP/s, "
        f"{peaks.gbps:.1f} GB/s DRAM, {peaks.cache_gbps or peaks.gbps:.1f} GB/s in cache. "
        "Error = (estimate - e2e) / e2e, e2e the 3rd-smallest run.",
        "",
        f"| model | start state | nodes | e2e ms | e2e median ms | {label} ms | {label} err % "
        f"| {label} fallbacks | analytic ms | analytic err % | load | date |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for row in rows:
        lines.append(
            f"| {row.model} | {row.state} | {row.nodes} | {row.e2e_ms:.3f} "
            f"| {row.e2e_median_ms:.3f} | {row.perop_ms:.3f} | {100 * row.perop_error:+.1f} "
            f"| {row.perop_fallbacks} | {row.analytic_ms:.3f} | {100 * row.analytic_error:+.1f} "
            f"| {row.load:.2f} | {row.date} |"
        )
    lines.append("")
    for name, errors in [
        (label, [row.perop_error for row in rows]),
        ("analytic", [row.analytic_error for row in rows]),
    ]:
        magnitudes = [abs(error) for error in errors]
        lines.append(
            f"- {name}: median |error| {100 * statistics.median(magnitudes):.1f}%, "
            f"max {100 * max(magnitudes):.1f}%, mean signed {100 * statistics.mean(errors):+.1f}%"
        )
    lines += [f"- {row.model} {row.state}: {note}" for row in rows for note in row.notes]
    return "\n".join(lines) + "\n"


def estimate_label(meta: dict[str, object]) -> str:
    """What the estimate is called in the table and the plot: per-op, or table."""
    return "table" if "estimate" in meta else "per-op"


def plot(rows: list[Row], meta: dict[str, object], path: Path) -> None:
    """Bars of the relative error per model, one per start state: per-op above, analytic below
    (the analytic floor's errors are far larger, and would flatten the per-op bars)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = list(dict.fromkeys(row.model for row in rows))
    states = list(dict.fromkeys(row.state for row in rows))
    by_key = {row.key: row for row in rows}
    fig, axes = plt.subplots(2, 1, figsize=(max(6.0, 1.1 * len(models)), 7.0), sharex=True)
    width = 0.8 / len(states)
    for ax, label, error in [
        (axes[0], f"{estimate_label(meta)} sum", lambda row: row.perop_error),
        (axes[1], "analytic floor", lambda row: row.analytic_error),
    ]:
        for index, state in enumerate(states):
            rows_of = [by_key.get(f"{model}|{state}") for model in models]
            ax.bar(
                [i + (index - (len(states) - 1) / 2) * width for i in range(len(models))],
                [100 * error(row) if row else float("nan") for row in rows_of],
                width,
                label=state,
            )
        ax.axhline(0.0, color="black", linewidth=0.5)
        ax.set_ylabel(f"{label}: error vs e2e (%)")
        ax.legend(fontsize=8)
    axes[1].set_xticks(range(len(models)), models, rotation=30, ha="right")
    dates = sorted(row.date for row in rows)
    loads = [row.load for row in rows]
    fig.suptitle(
        f"offline (run as written), zoo {meta['size']}, {meta['provider']}, "
        f"{meta['threads']} thread(s), onnxruntime {meta['onnxruntime']}\n"
        f"{dates[0]} to {dates[-1]}, load {min(loads):.2f}-{max(loads):.2f}",
        fontsize=10,
    )
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", default="small", help="zoo size: small, medium or full")
    parser.add_argument(
        "--models", nargs="+", help="zoo models (default: all of them, none with --graphs)"
    )
    parser.add_argument(
        "--graphs", nargs="+", type=Path, default=[], metavar="FILE", help="ONNX files to add"
    )
    parser.add_argument("--threads", type=int, default=1, help="intra-op threads")
    parser.add_argument(
        "--out", help="output path without suffix (default runs/perop-offline-SIZE)"
    )
    parser.add_argument("--runs", type=int, default=30, help="least timed end-to-end runs")
    adaptive = "default: the Runner's adaptive stop"
    parser.add_argument("--min-time", type=float, help=f"least timed s per graph ({adaptive})")
    parser.add_argument("--perop-runs", type=int, default=10, help="timed runs per operator")
    parser.add_argument("--perop-cache", metavar="FILE", help="per-op cache (default OUT.sqlite)")
    parser.add_argument("--fresh", action="store_true", help="forget kept rows and OUT.sqlite")
    parser.add_argument(
        "--warm", action="store_true", help="time operators warm (the per-op model's old way)"
    )
    parser.add_argument(
        "--table", metavar="PATH", help="estimate by this cost table's sum, not per-op timings"
    )
    parser.add_argument(
        "--provider", choices=("cpu", "cuda"), help="default: cuda where onnxruntime has it"
    )
    args = parser.parse_args(argv)
    models = args.models if args.models is not None else [] if args.graphs else list(MODEL_NAMES)
    missing = [str(path) for path in args.graphs if not path.is_file()]
    if missing:
        parser.error(f"no such ONNX file: {missing[0]}")

    provider = args.provider or "auto"
    base = OrtSettings(threads=args.threads, provider=provider)
    settings = Deployment("offline").settings(base).resolved()
    out = args.out or f"runs/perop-offline-{args.size}"
    paths = {suffix: Path(f"{out}.{suffix}") for suffix in ("json", "md", "png", "sqlite")}
    meta = run_meta(args.size, settings, cold=not args.warm, table=args.table)
    kept = {} if args.fresh else kept_rows(paths["json"], meta)
    perop_cache = Path(args.perop_cache or paths["sqlite"])
    if args.fresh and not args.perop_cache:
        perop_cache.unlink(missing_ok=True)
    peaks = machine_peaks(settings)
    runner = Runner(settings, runs=args.runs, min_time_s=args.min_time)
    perop: PerOpCostModel | TableEstimate = (
        TableEstimate(args.table)
        if args.table
        else PerOpCostModel(
            settings, runs=args.perop_runs, cache_path=perop_cache, cold=not args.warm
        )
    )
    analytic = AnalyticCostModel(peaks)
    command = shlex.join(["python", *sys.argv])
    rows: list[Row] = []
    jobs = [
        (name, state, graph)
        for name in models
        for state, graph in start_graphs(name, args.size, settings).items()
    ]
    jobs += [file_graph(path, settings) for path in args.graphs]
    try:
        for name, state, graph in jobs:
            row = kept.get(f"{name}|{state}")
            if row is None:
                row = measure(name, state, graph, runner, perop, analytic)
            else:
                progress(f"{name} {state}: kept from {row.date}")
            rows.append(row)
            # Written after every row, so that a killed run resumes where it stopped.
            entries = {done.key: asdict(done) for done in [*kept.values(), *rows]}
            write_json_atomic(
                paths["json"],
                {"meta": meta, "command": command, "rows": list(entries.values())},
            )
    finally:
        perop.close()
    table = markdown(rows, meta, peaks, command)
    write_text_atomic(paths["md"], table)
    plot(rows, meta, paths["png"])
    print(table)
    progress(f"wrote {out}.md, .json and .png")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Per-operator cost tables: operators timed once on one device, shipped, and summed anywhere.

A table holds, for every distinct operator instance some rollouts reached (the per-op model's
signature: operator, attributes, shapes, dtypes, the values of small constants, and the level
it runs at), its time alone on the device it was collected on, net of onnxruntime's per-run
overhead, which is recorded once (`rlflow costs collect`, `rlflow.search.table_collect`). So
a learner or a search on a CPU machine ranks graphs by GPU timings: `TableCostModel` costs a
graph as the overhead plus the sum of its nodes' entries, as `PerOpCostModel` does with
timings it takes itself.

An operator the table lacks (a miss) gets a roofline estimate, launch + max(flops / peak,
bytes / bandwidth), with the three parameters fitted by least squares to the table's own
entries (`fit_roofline`): the machine that reads the table is not the one it describes, so
its own peaks would say nothing. The share of the cost that came from misses is kept
(`TableReport.miss_share`, `TableCostModel.usage`), so a result says how much of it is
extrapolated.

Tables are JSON (`CostTable.to_json`): `meta` (device, driver, CUDA and onnxruntime versions,
provider and its options, level, the command that made it), `overhead_ms`, and `ops`, one row
per signature digest. Tables shipped with rlflow live in `rlflow/cost/tables/NAME.json` and are
named `table:NAME`; any other is `table:PATH`.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from onnx import helper

from rlflow.cost.analytic import node_signature, op_cost
from rlflow.cost.cache import read_json
from rlflow.cost.deploy import declared_level
from rlflow.cost.perop import node_key, runs_in_place
from rlflow.cost.source import ModelLike
from rlflow.errors import RlflowError
from rlflow.fileio import write_text_atomic
from rlflow.graph import Graph, Node, load_model

TABLE_FORMAT = "rlflow-cost-table"
TABLE_VERSION = 1
TABLES_DIR = Path(__file__).with_name("tables")
"""Tables shipped with rlflow (package data), named by their file's stem."""
COLUMNS = ("op", "ms", "flops", "bytes", "signature")
"""The fields of a row of `ops`, in order (rows are lists, to keep tables compact)."""
BALANCES = np.logspace(-2, 4, 241)
"""Balance points (FLOPs per byte at which a kernel turns compute-bound) the fit tries."""


@dataclass(frozen=True)
class TableEntry:
    """One operator instance's time alone on the table's device."""

    op: str
    ms: float
    """Net of onnxruntime's per-run overhead (the table's `overhead_ms`)."""
    flops: float
    bytes: float
    """The analytic model's count for this instance: what the roofline fit is fitted on."""
    signature: str
    """A readable description (op, input and output shapes and dtypes), for people."""


@dataclass
class CostTable:
    """Measured per-operator times on one device (see the module docstring)."""

    meta: dict[str, Any]
    overhead_ms: float
    entries: dict[str, TableEntry] = field(default_factory=dict)
    failed: dict[str, dict[str, str]] = field(default_factory=dict)
    """Signatures that could not run alone, with the operator and the reason."""
    name: str = ""
    """How it was named (`NAME` or `PATH` of table:...)."""

    @property
    def provider(self) -> str:
        """The execution provider its operators were timed on (cpu | cuda)."""
        return str(self.meta.get("provider", "cpu"))

    @property
    def rules(self) -> list[str] | None:
        """The rules its rollouts rewrote with: those that passed verification on its provider
        (None: not recorded)."""
        rules = self.meta.get("rules")
        return None if rules is None else [str(name) for name in rules]

    def made_elsewhere(self, provider: str) -> bool:
        """Whether graphs ranked by this table are for another provider than `provider`, the one
        measuring here (a GPU's table on a CPU machine). They are then made for the table's
        provider: from the original (onnxruntime's optimised graphs of a model are its
        provider's own, made where it runs; `check_start`), with the rules it verified and
        none of the CPU's own layouts, and chosen by the table rather than by timings here."""
        return self.provider != provider

    def check_start(self, start: str, provider: str) -> None:
        """RlflowError if a search or an env ranked by this table may not begin at `start`
        (`original`, `ort:all`, ...) on a machine measuring on `provider`."""
        if self.made_elsewhere(provider) and start not in ("original", "best"):
            raise RlflowError(
                f"start {start!r}: onnxruntime's graphs for {self.provider} (the cost table "
                f"{self.name or 'given'}) cannot be made on this {provider} machine; ranked by "
                "that table, graphs start from the original"
            )

    @property
    def ort_level(self) -> str:
        """The level operators were timed at unless their graph declared its own."""
        return str(self.meta.get("ort_level", "disable"))

    def key(self, graph: Graph, node: Node, level: str) -> str:
        """The row key of `node` of `graph` run at `level`."""
        return node_key(graph, node, f"level={level}")

    def add(self, key: str, graph: Graph, node: Node, ms: float) -> None:
        """Record `node`'s measured time (ms, net of the overhead) under `key`."""
        cost = op_cost(*node_signature(graph, node))
        # Rounded as written, so that a table read back costs graphs exactly as it did here.
        self.entries[key] = TableEntry(
            node.op_type, _short(ms), _short(cost.flops), _short(cost.bytes), describe(graph, node)
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "format": TABLE_FORMAT,
            "version": TABLE_VERSION,
            "meta": self.meta,
            "overhead_ms": self.overhead_ms,
            "columns": list(COLUMNS),
            "ops": {
                key: [e.op, e.ms, e.flops, e.bytes, e.signature]
                for key, e in sorted(self.entries.items())
            },
            "failed": dict(sorted(self.failed.items())),
        }

    @classmethod
    def from_json(cls, data: Any, name: str = "") -> CostTable:
        """A table from its JSON; RlflowError when `data` is not one this version reads."""
        where = f"cost table {name}" if name else "cost table"
        if not isinstance(data, dict) or data.get("format") != TABLE_FORMAT:
            raise RlflowError(f"{where} is not an rlflow cost table (rlflow costs collect)")
        if data.get("version") != TABLE_VERSION:
            raise RlflowError(
                f"{where} is of version {data.get('version')!r}; this rlflow reads version "
                f"{TABLE_VERSION}: collect it again"
            )
        try:
            columns = data.get("columns", list(COLUMNS))
            entries = {
                key: TableEntry(**dict(zip(columns, row, strict=True)))
                for key, row in data["ops"].items()
            }
            return cls(
                meta=dict(data["meta"]),
                overhead_ms=float(data["overhead_ms"]),
                entries=entries,
                failed=dict(data.get("failed", {})),
                name=name,
            )
        except (KeyError, TypeError, ValueError) as error:
            raise RlflowError(f"{where} is damaged: {error}") from None

    def dumps(self) -> str:
        """The table as JSON text, one operator per line (compact, and diffs stay readable)."""
        data = self.to_json()
        ops = data.pop("ops")
        head = json.dumps(data, indent=1, sort_keys=True)
        rows = ",\n".join(
            f"  {json.dumps(key)}: {json.dumps([op, *map(_short, numbers), text])}"
            for key, (op, *numbers, text) in ops.items()
        )
        return f'{head[:-2]},\n "ops": {{\n{rows}\n }}\n}}\n'

    def save(self, path: str | Path) -> Path:
        """Write the table to `path` atomically (a killed run leaves the previous file)."""
        return write_text_atomic(path, self.dumps())


def _short(number: float) -> float | int:
    """A count as an int, a time to 6 significant digits: enough, and a third of the text."""
    if float(number).is_integer() and abs(number) < 2**53:
        return int(number)
    return float(f"{number:.6g}")


def describe(graph: Graph, node: Node) -> str:
    """`Conv float32[1,3,32,32],float32[16,3,3,3] -> float32[1,16,16,16]`: shapes for people."""

    def tensor(name: str) -> str:
        value = graph.values.get(name) if name else None
        if value is None:
            return "-"
        dtype = helper.tensor_dtype_to_np_dtype(value.dtype).name if value.dtype else "?"
        return f"{dtype}[{','.join(str(d) for d in value.shape or ())}]"

    inputs = ",".join(tensor(name) for name in node.inputs)
    outputs = ",".join(tensor(name) for name in node.outputs)
    domain = f"{node.domain}." if node.domain else ""
    return f"{domain}{node.op_type} {inputs} -> {outputs}"


# ---- finding tables -------------------------------------------------------------------------


def table_names() -> list[str]:
    """The tables shipped with rlflow, by name."""
    return sorted(path.stem for path in TABLES_DIR.glob("*.json"))


def table_path(spec: str) -> Path:
    """The file `spec` names: a path when it has a folder part or ends in .json, else a table
    shipped with rlflow; RlflowError when there is none."""
    if "/" in spec or "\\" in spec or spec.endswith(".json"):
        path = Path(spec)
        if not path.is_file():
            raise RlflowError(f"no cost table at {spec}: not a file")
        return path
    path = TABLES_DIR / f"{spec}.json"
    if not path.is_file():
        shipped = ", ".join(table_names()) or "none"
        raise RlflowError(
            f"no cost table named {spec!r}: rlflow ships {shipped}; a table you collected is "
            "table:PATH (a path with a folder part or ending in .json)"
        )
    return path


_loaded: dict[tuple[str, float], CostTable] = {}


def load_table(spec: str) -> CostTable:
    """The table `spec` names (see `table_path`), read once per file version."""
    path = table_path(spec)
    stamp = (str(path.resolve()), path.stat().st_mtime)
    if stamp not in _loaded:
        _loaded[stamp] = CostTable.from_json(read_json(path), spec)
    return _loaded[stamp]


# ---- the roofline for misses ----------------------------------------------------------------


@dataclass(frozen=True)
class Roofline:
    """time = launch_ms + ms_per_flop * max(flops, balance * bytes), fitted to a table."""

    launch_ms: float
    ms_per_flop: float
    balance: float
    """FLOPs per byte at which an operator turns from memory-bound to compute-bound."""
    fitted_on: int
    rms_ms: float
    """Root mean square error of the fit over the entries it was fitted on."""

    def time_ms(self, flops: float, moved: float) -> float:
        return self.launch_ms + self.ms_per_flop * max(flops, self.balance * moved)

    @property
    def gflops(self) -> float | None:
        """The fitted peak arithmetic rate (None: no entry was compute-bound enough to say)."""
        return 1e-6 / self.ms_per_flop if self.ms_per_flop > 0 else None

    @property
    def gbps(self) -> float | None:
        """The fitted peak bandwidth."""
        per_byte = self.ms_per_flop * self.balance
        return 1e-6 / per_byte if per_byte > 0 else None

    def to_json(self) -> dict[str, Any]:
        return {
            "launch_ms": self.launch_ms,
            "gflops": self.gflops,
            "gbps": self.gbps,
            "fitted_on": self.fitted_on,
            "rms_ms": self.rms_ms,
        }


def fit_roofline(points: Iterable[tuple[float, float, float]]) -> Roofline:
    """The roofline (launch, peak, bandwidth) closest in least squares to (flops, bytes, ms)
    points. For a fixed balance b the model ms = launch + s * max(flops, b * bytes) is linear
    in (launch, s), both held non-negative; b is chosen on a log grid (`BALANCES`). Absolute,
    not relative, errors are minimised: what adds up in a graph's cost is milliseconds."""
    data = np.array([point for point in points if math.isfinite(point[2])], dtype=np.float64)
    if len(data) == 0:
        return Roofline(0.0, 0.0, 1.0, 0, 0.0)
    flops, moved, ms = data[:, 0], data[:, 1], data[:, 2]
    best: tuple[float, float, float, float] | None = None  # (sse, launch, slope, balance)
    for balance in BALANCES:
        work = np.maximum(flops, balance * moved)
        launch, slope = _nonnegative_line(work, ms)
        sse = float(np.sum((launch + slope * work - ms) ** 2))
        if best is None or sse < best[0]:
            best = (sse, launch, slope, float(balance))
    sse, launch, slope, balance = best  # type: ignore[misc]
    return Roofline(launch, slope, balance, len(data), math.sqrt(sse / len(data)))


def _nonnegative_line(x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """(a, b) >= 0 minimising sum (a + b x - y)^2 (the three cases of the constrained fit)."""
    spread = float(np.sum((x - x.mean()) ** 2))
    slope = float(np.sum((x - x.mean()) * (y - y.mean())) / spread) if spread > 0 else 0.0
    if slope <= 0:
        return max(float(y.mean()), 0.0), 0.0
    launch = float(y.mean() - slope * x.mean())
    if launch >= 0:
        return launch, slope
    squares = float(np.sum(x * x))
    return 0.0, max(float(np.sum(x * y)) / squares, 0.0) if squares > 0 else 0.0


# ---- costing graphs -------------------------------------------------------------------------


@dataclass(frozen=True)
class TableReport:
    """One graph's cost from a table, and how much of it the table did not cover."""

    total_ms: float
    """The overhead once, plus every node's entry or roofline estimate."""
    miss_ms: float
    """The part of `total_ms` estimated by the fitted roofline."""
    hits: int
    misses: int
    in_place: int
    """Nodes that relabel a buffer (Reshape, ...): priced 0, as by the per-op model."""
    missed_ops: dict[str, int] = field(default_factory=dict)
    """Missed nodes per operator type."""

    @property
    def miss_share(self) -> float:
        return self.miss_ms / self.total_ms if self.total_ms > 0 else 0.0


class TableCostModel:
    """Costs graphs from a `CostTable`; misses by the roofline fitted to it.

    It also keeps the totals over every graph it costed (`usage`): a search memoises costs by
    graph, so that is each distinct graph once.
    """

    def __init__(self, table: CostTable | str) -> None:
        self.table = load_table(table) if isinstance(table, str) else table
        self.roofline = fit_roofline(
            (entry.flops, entry.bytes, entry.ms) for entry in self.table.entries.values()
        )
        self.graphs = 0
        self.total_ms = 0.0
        self.miss_ms = 0.0
        self.missed_ops: Counter[str] = Counter()

    @property
    def name(self) -> str:
        return f"table:{self.table.name}"

    def level_for(self, graph: Graph) -> str:
        """The level a graph's operators are looked up at: its declared one, else the table's
        (as the per-op model times them)."""
        return declared_level(graph.metadata) or self.table.ort_level

    def report(self, model: ModelLike) -> TableReport:
        graph = model if isinstance(model, Graph) else load_model(model)
        level = self.level_for(graph)
        total, missed = self.table.overhead_ms, 0.0
        hits = misses = in_place = 0
        missed_ops: Counter[str] = Counter()
        for node in graph.nodes:
            if runs_in_place(node):
                in_place += 1
                continue
            entry = self.table.entries.get(self.table.key(graph, node, level))
            if entry is not None:
                hits += 1
                total += entry.ms
                continue
            cost = op_cost(*node_signature(graph, node))
            estimate = self.roofline.time_ms(cost.flops, cost.bytes)
            misses += 1
            missed_ops[node.op_type] += 1
            total += estimate
            missed += estimate
        return TableReport(total, missed, hits, misses, in_place, dict(missed_ops))

    def cost_ms(self, model: ModelLike) -> float:
        """The graph's cost in ms; counted in `usage`."""
        report = self.report(model)
        self.graphs += 1
        self.total_ms += report.total_ms
        self.miss_ms += report.miss_ms
        self.missed_ops.update(report.missed_ops)
        return report.total_ms

    def usage(self) -> dict[str, Any]:
        """What results report about the table: where it was measured, and the share of the
        cost of every graph costed so far that came from misses."""
        meta = self.table.meta
        return {
            "table": self.table.name,
            "device": meta.get("device"),
            "provider": meta.get("provider"),
            "entries": len(self.table.entries),
            "graphs_costed": self.graphs,
            "miss_share": self.miss_ms / self.total_ms if self.total_ms > 0 else 0.0,
            "missed_ops": dict(self.missed_ops.most_common()),
            "roofline": self.roofline.to_json(),
        }


__all__ = [
    "CostTable",
    "Roofline",
    "TableCostModel",
    "TableEntry",
    "TableReport",
    "fit_roofline",
    "load_table",
    "table_names",
    "table_path",
]

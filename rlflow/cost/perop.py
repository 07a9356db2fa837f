"""Per-operator measured cost (TASO's cost model): time each distinct operator alone, sum.

Each distinct node signature -- operator, domain and opset, attributes, input and output
shapes and dtypes, which inputs are constants -- is run once as a one-node model in
onnxruntime and its time cached on disk (sqlite: one transaction per entry, so a killed run
or a concurrent process never leaves a torn cache). A graph's cost is the sum over its nodes.

Inputs whose *values* decide what the operator does (a Reshape's shape, Slice starts, Gather
indices, Pad pads, TopK's k, ...) are copied from the real graph: every integer or bool
constant, and every float constant of at most SMALL_CONSTANT elements (Resize scales, Clip
bounds), and their digest is part of the signature. Other constants (weights) get random
data of the right shape. Non-constant inputs get random data, except indices (drawn within
the indexed axis) and shape inputs derivable from the node's static output shape.

Each timing includes onnxruntime's fixed per-run cost, which a whole graph pays once; so that
cost is measured on a trivial model and taken off every operator, and added once per graph.
An operator that cannot be run alone is priced by the analytic model and counted as a
fallback, never an error.
"""

from __future__ import annotations

import os
import sqlite3
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper

from rlflow.cost.analytic import AnalyticCostModel
from rlflow.cost.cache import cache_dir
from rlflow.cost.inputs import int_range, random_tensor
from rlflow.cost.session import OrtSettings, make_session, timed_run
from rlflow.cost.source import ModelLike, TensorSpec, max_ort_ir_version
from rlflow.errors import first_line
from rlflow.graph import Graph, Node, load_model
from rlflow.graph.domains import opset_for
from rlflow.graph.hashing import digest

# Float constants up to this size are copied (Resize scales, Clip bounds, a Pad value);
# larger ones are weights, whose values do not change the running time.
SMALL_CONSTANT = 8
# fmt: off
_INDEX_INPUTS = {  # op type -> input slot holding indices into input 0 along attribute "axis"
    "Gather": 1, "GatherElements": 1, "ScatterElements": 1, "GatherND": 1, "ScatterND": 1,
}
# fmt: on


_SHAPE_INPUTS = {("Reshape", 1), ("Expand", 1), ("ConstantOfShape", 0)}
# Operators whose integer inputs past the first steer the computation (starts, axes, k,
# pads, sizes): random values there would time some other computation, or fail.
# fmt: off
_CONTROL_OPS = frozenset({
    "Slice", "Pad", "Split", "TopK", "Squeeze", "Unsqueeze", "Resize", "Upsample", "Range",
    "OneHot", "CumSum", "ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd",
    "ReduceL1", "ReduceL2", "ReduceSumSquare", "ReduceLogSum", "ReduceLogSumExp", "Tile",
    "Reshape", "Expand", "ConstantOfShape", "NonMaxSuppression", "Trilu", "DFT", "STFT",
})
# fmt: on
_SHAPE_DTYPES = frozenset({onnx.TensorProto.INT64, onnx.TensorProto.INT32})


class _Unmeasurable(Exception):
    """This node cannot be built as a one-node model (e.g. a shape input we cannot know)."""


@dataclass(frozen=True)
class PerOpReport:
    """A graph's per-op cost and how it was obtained."""

    total_ms: float
    """Sum over nodes (each net of the per-run overhead) plus the overhead once."""
    overhead_ms: float
    """onnxruntime's fixed cost of one run, taken off each operator and added once."""
    measured_now: int
    """Distinct signatures measured during this call (0 when everything was cached)."""
    fallback_nodes: int
    """Nodes priced by the analytic model because they could not be run alone."""
    ms_by_op: dict[str, float] = field(default_factory=dict)
    fallback_reasons: dict[str, str] = field(default_factory=dict)
    """One reason per operator type that fell back."""


class PerOpCostModel:
    """Measured per-operator costs, cached on disk by node signature and settings.

    Args:
        settings: onnxruntime settings every operator is timed under (part of the cache key).
        cache_path: the sqlite file; default `perop.sqlite` in the cache directory.
        runs: timed runs per operator (the minimum is kept), after `warmup` untimed ones.
        analytic: the fallback for operators that cannot run alone (made on first need).
    """

    def __init__(
        self,
        settings: OrtSettings | None = None,
        *,
        cache_path: str | os.PathLike | None = None,
        runs: int = 10,
        warmup: int = 2,
        analytic: AnalyticCostModel | None = None,
    ) -> None:
        self.settings = (settings or OrtSettings()).resolved()
        self.runs, self.warmup = runs, warmup
        self.cache_path = Path(cache_path) if cache_path else cache_dir() / "perop.sqlite"
        self._analytic = analytic
        self._db = _open_db(self.cache_path)
        self._memory: dict[str, tuple[float | None, str]] = {}
        self._settings_key = f"{self.settings.key()},runs={runs},warmup={warmup}"
        self._overhead_ms: float | None = None
        self.measured_ops = 0
        """One-node measurements made by this object (a fully cached pass adds none)."""
        self.fallback_nodes = 0
        """Nodes priced by the analytic fallback so far."""

    # ---- public -----------------------------------------------------------------------------

    def cost_ms(self, model: ModelLike) -> float:
        """The graph's per-op cost in ms."""
        return self.report(model).total_ms

    def report(self, model: ModelLike) -> PerOpReport:
        """The graph's per-op cost with its breakdown by operator type and its fallbacks."""
        graph = model if isinstance(model, Graph) else load_model(model)
        measured_before = self.measured_ops
        overhead = self.overhead_ms()
        total = overhead
        by_op: Counter[str] = Counter()
        reasons: dict[str, str] = {}
        fallbacks = 0
        for node in graph.nodes:
            raw_ms, error = self._raw_ms(graph, node)
            if raw_ms is None:
                fallbacks += 1
                reasons.setdefault(node.op_type, error)
                node_ms = self._fallback().node_time_ms(graph, node)
            else:
                node_ms = max(raw_ms - overhead, 0.0)
            total += node_ms
            by_op[node.op_type] += node_ms
        self.fallback_nodes += fallbacks
        return PerOpReport(
            total_ms=total,
            overhead_ms=overhead,
            measured_now=self.measured_ops - measured_before,
            fallback_nodes=fallbacks,
            ms_by_op=dict(by_op),
            fallback_reasons=reasons,
        )

    def node_cost_ms(self, graph: Graph, node: Node) -> float:
        """One node's cost, net of the per-run overhead (analytic if it cannot run alone)."""
        raw_ms, _ = self._raw_ms(graph, node)
        if raw_ms is None:
            self.fallback_nodes += 1
            return self._fallback().node_time_ms(graph, node)
        return max(raw_ms - self.overhead_ms(), 0.0)

    def overhead_ms(self) -> float:
        """onnxruntime's time for one run of a trivial model (cached like an operator)."""
        if self._overhead_ms is None:
            key = digest("overhead", self._settings_key).hex()
            cached = self._lookup(key)
            if cached is None:
                model, feeds = _trivial_model()
                # More runs than an operator gets: this number is subtracted from every one.
                ms = self._time(model, feeds, runs=max(50, 5 * self.runs))
                self._save(key, "(overhead)", ms, "")
                cached = (ms, "")
            self._overhead_ms = cached[0] or 0.0
        return self._overhead_ms

    def close(self) -> None:
        self._db.close()

    # ---- measuring --------------------------------------------------------------------------

    def _raw_ms(self, graph: Graph, node: Node) -> tuple[float | None, str]:
        """(time of the one-node model in ms or None, why not) for the node's signature."""
        key = node_key(graph, node, self._settings_key)
        cached = self._lookup(key)
        if cached is not None:
            return cached
        self.measured_ops += 1
        try:
            model, feeds = one_node_model(graph, node)
            ms: float | None = self._time(model, feeds, runs=self.runs)
            error = ""
        except Exception as failure:  # any failure to build or run means "cannot run alone"
            ms, error = None, first_line(failure)
        self._save(key, node.op_type, ms, error)
        return ms, error

    def _time(self, model: onnx.ModelProto, feeds: dict[str, np.ndarray], runs: int) -> float:
        run = timed_run(make_session(model.SerializeToString(), self.settings), feeds)
        for _ in range(self.warmup):
            run()
        return min(run() for _ in range(runs))

    def _fallback(self) -> AnalyticCostModel:
        if self._analytic is None:
            self._analytic = AnalyticCostModel(settings=self.settings)
        return self._analytic

    # ---- cache ------------------------------------------------------------------------------

    def _lookup(self, key: str) -> tuple[float | None, str] | None:
        if key in self._memory:
            return self._memory[key]
        row = self._db.execute("SELECT ms, error FROM op_times WHERE key = ?", (key,)).fetchone()
        if row is not None:
            self._memory[key] = (row[0], row[1] or "")
        return self._memory.get(key)

    def _save(self, key: str, op_type: str, ms: float | None, error: str) -> None:
        self._memory[key] = (ms, error)
        with self._db:  # one transaction: the entry is written whole or not at all
            self._db.execute(
                "INSERT OR REPLACE INTO op_times (key, op_type, settings, ms, error, created) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                (key, op_type, self._settings_key, ms, error, time.time()),
            )


def node_key(graph: Graph, node: Node, settings_key: str = "") -> str:
    """A digest of everything the node's running time depends on (not weight values)."""
    parts: list[bytes | str] = [
        settings_key,
        node.domain,
        node.op_type,
        str(graph.opset.get(node.domain, 0)),
    ]
    for name in sorted(node.attrs):
        parts.append(node.attrs[name].SerializeToString(deterministic=True))
    parts.append("|inputs")
    for name in node.inputs:
        if not name:
            parts.append("absent")
            continue
        value = graph.value(name)
        constant = graph.is_constant(name)
        parts.append(f"{value.dtype}:{value.shape}:{'const' if constant else 'var'}")
        if constant and _values_matter(graph.initializers[name]):
            parts.append(graph.const_digest(name))
    parts.append("|outputs")
    for name in node.outputs:
        known = name and name in graph.values
        parts.append(f"{graph.values[name].dtype}:{graph.values[name].shape}" if known else "-")
    return digest(*parts).hex()


def _values_matter(array: np.ndarray) -> bool:
    """Whether a constant's values (not just its shape) may change what the operator does."""
    return array.dtype.kind in "biu" or array.size <= SMALL_CONSTANT


def one_node_model(graph: Graph, node: Node) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """The node alone as a model, with its constants as initializers, and feeds for the rest."""
    rng = np.random.default_rng(0)
    initializers: list[onnx.TensorProto] = []
    inputs: list[onnx.ValueInfoProto] = []
    feeds: dict[str, np.ndarray] = {}
    for slot, name in enumerate(node.inputs):
        if not name or name in feeds or any(t.name == name for t in initializers):
            continue
        value = graph.value(name)
        spec = TensorSpec(name, value.dtype, value.shape)
        if graph.is_constant(name):
            array = graph.initializers[name]
            if not _values_matter(array):
                array = random_tensor(spec, rng)
            initializers.append(numpy_helper.from_array(array, name))
        else:
            feeds[name] = _feed(graph, node, slot, spec, rng)
            inputs.append(helper.make_tensor_value_info(name, value.dtype, value.shape))
    outputs = [
        helper.make_tensor_value_info(name, graph.values[name].dtype, graph.values[name].shape)
        for name in node.outputs
        if name and name in graph.values
    ]
    proto = onnx.NodeProto(
        op_type=node.op_type, domain=node.domain, input=node.inputs, output=node.outputs
    )
    proto.attribute.extend(node.attrs.values())
    opset = opset_for(graph.opset, ("", node.domain))
    model = helper.make_model(
        helper.make_graph([proto], f"one_{node.op_type}", inputs, outputs, initializers),
        opset_imports=[helper.make_opsetid(domain, version) for domain, version in opset.items()],
    )
    model.ir_version = min(model.ir_version, max_ort_ir_version())
    model.functions.extend(graph.functions)  # a node may call a model-local function
    return model, feeds


def _feed(
    graph: Graph, node: Node, slot: int, spec: TensorSpec, rng: np.random.Generator
) -> np.ndarray:
    """Random data for a non-constant input, valid where its values matter."""
    op_type = node.op_type
    output = graph.values.get(node.outputs[0]) if node.outputs and node.outputs[0] else None
    # Shape inputs computed at run time: their values follow from the static output shape.
    if output is not None and (op_type, slot) in _SHAPE_INPUTS:
        return np.array(output.shape, dtype=np.int64)
    if output is not None and (op_type, slot) == ("Tile", 1):
        in_shape = graph.value(node.inputs[0]).shape
        repeats = [o // max(i, 1) for o, i in zip(output.shape, in_shape, strict=True)]
        return np.array(repeats, dtype=np.int64)
    if _INDEX_INPUTS.get(op_type) == slot:
        data_shape = graph.value(node.inputs[0]).shape
        if op_type in ("GatherND", "ScatterND"):
            extent = min(data_shape) if data_shape else 1
        else:
            extent = data_shape[node.attr("axis", 0)] if data_shape else 1
        return random_tensor(spec, rng, (0, max(extent, 1)))
    if slot > 0 and op_type in _CONTROL_OPS and spec.dtype in _SHAPE_DTYPES:
        raise _Unmeasurable(f"{op_type} input {slot} holds run-time values we cannot know")
    return random_tensor(spec, rng, int_range(graph.metadata, spec.name))


def _trivial_model() -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])],
        "overhead",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = min(model.ir_version, max_ort_ir_version())
    return model, {"x": np.ones(1, dtype=np.float32)}


def _open_db(path: Path) -> sqlite3.Connection:
    path.parent.mkdir(parents=True, exist_ok=True)
    db = sqlite3.connect(path, timeout=60)  # other processes may be writing their entries
    with db:
        db.execute(
            "CREATE TABLE IF NOT EXISTS op_times (key TEXT PRIMARY KEY, op_type TEXT, "
            "settings TEXT, ms REAL, error TEXT, created REAL)"
        )
    return db

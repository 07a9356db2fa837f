"""Per-operator measured cost (TASO's cost model): time each distinct operator alone, sum.

Each distinct node signature -- operator, domain and opset, attributes, input and output
shapes and dtypes, which inputs are constants -- is run as a one-node model in onnxruntime
and its time cached on disk (sqlite: one transaction per entry, so a killed run or a
concurrent process never leaves a torn cache). A graph's cost is the sum over its nodes.

An entry is the fastest of OCCASIONS timings at least OCCASION_SPACING_S apart: an entry used
again after that long with fewer occasions is timed again and keeps the minimum
(`$RLFLOW_TIMING_OCCASIONS` sets how many: 1 on a quiet machine times each operator once, and
makes a cache's prices final, e.g. for two runs that must read the same ones). On a shared
machine one slow moment inflates every operator timed in it alike, and the operators of one
graph are timed together: ResNeXt-50 medium's start state, timed in one slow second inside a
learner, priced 28% over its end-to-end time, so every rewrite away from it looked like a
gain (16-26% per-op along paths that gained 0.5-2.4% end to end; docs/BENCHMARKS.md,
"Per-op cost against end-to-end latency"). Timed again minutes later, such a moment is gone.

Inputs whose *values* decide what the operator does (a Reshape's shape, Slice starts, Gather
indices, Pad pads, TopK's k, ...) are copied from the real graph: every integer or bool
constant, and every float constant of at most SMALL_CONSTANT elements (Resize scales, Clip
bounds), and their digest is part of the signature. Other constants (weights) get random
data of the right shape. Non-constant inputs get random data, except indices (drawn within
the indexed axis) and shape inputs derivable from the node's static output shape.

On CPU an operator that holds weights (a constant input of COLD_WEIGHT_BYTES or more) is
timed with the caches flushed before every run (`CacheFlusher`: a buffer twice the last-level
cache written outside the clock), and the per-run overhead taken off it is the one measured
the same way. Timed again and again alone, such an operator finds its weights in cache from
the run before, which inside a graph it does not: the other operators' weights have evicted
them. Operators without weights read activations the operator before them has just written,
still in cache, and are timed warm. Warm timings underestimated every offline zoo graph here
(median 16%, and 50% on a model whose 39 MB of weights exceed the 32 MB L3; docs/BENCHMARKS.md,
"Per-op cost against end-to-end latency"). `cold=False` times every operator warm.

Each timing includes onnxruntime's fixed per-run cost, which a whole graph pays once; so that
cost is measured on a trivial model and taken off every operator, and added once per graph.
Operators that only relabel a buffer (Reshape, Flatten, Squeeze, ...) are not timed: inside a
graph onnxruntime runs them in place (30 Reshapes of 4 MB between two Relus added 9 us to the
graph here, where each alone copies its 4 MB), so they cost nothing beyond the overhead.
An operator that cannot be run alone is priced by the analytic model and counted as a
fallback, never an error.

Operators are timed at the level their graph runs at: the one it declares (`ort_config`; an
offline model, e.g. one of onnxruntime's optimised start states, the optimiser off), else the
model's settings, as the Runner does. At level `all` onnxruntime would optimise a one-node
model again (a lone Conv becomes ReorderInput, nchwc Conv, ReorderOutput) and time something
the offline graph never runs. onnxruntime's own operators (com.microsoft, and the blocked
com.microsoft.nchwc ones) get their real attributes and the shapes the graph records, which
for blocked tensors are the blocked ones (channels padded to the block) that onnxruntime
itself reported; a one-node model whose outputs come out in other shapes than the graph's is
not timed (it would run another computation) but counted as a fallback, with the reason.
"""

from __future__ import annotations

import os
import sqlite3
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import helper, numpy_helper

from rlflow.cost.analytic import ALIASES, AnalyticCostModel
from rlflow.cost.cache import cache_dir
from rlflow.cost.deploy import declared_settings
from rlflow.cost.inputs import int_range, random_tensor
from rlflow.cost.session import OrtSettings, make_session, timed_run
from rlflow.cost.source import ModelLike, TensorSpec
from rlflow.cost.timing_lock import exclusive_timing
from rlflow.errors import RlflowError, first_line
from rlflow.graph import Graph, Node, load_model
from rlflow.graph.domains import is_standard, opset_for
from rlflow.graph.hashing import digest
from rlflow.graph.shapes import max_ort_ir_version

COLD_WEIGHT_BYTES = 64 * 2**10
"""A constant input this large makes an operator's timing cold (see the module docstring)."""
OCCASIONS = 3
"""An entry is the fastest of this many separate timings (see the module docstring), unless
`$RLFLOW_TIMING_OCCASIONS` says otherwise."""
OCCASIONS_ENV_VAR = "RLFLOW_TIMING_OCCASIONS"
OCCASION_SPACING_S = 60.0
"""Seconds between two timings of one entry, so that a slow moment does not span both."""
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


def occasions_wanted() -> int:
    """How many separate timings make an entry: `$RLFLOW_TIMING_OCCASIONS`, else OCCASIONS
    (read at each lookup, so worker processes and a changed environment agree)."""
    value = os.environ.get(OCCASIONS_ENV_VAR, "").strip()
    if not value:
        return OCCASIONS
    if not value.isdigit() or int(value) < 1:
        raise RlflowError(
            f"{OCCASIONS_ENV_VAR} must be a whole number of at least 1, not {value!r}"
        )
    return int(value)


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
    in_place_nodes: int
    """Nodes that only relabel a buffer (Reshape, ...): run in place in a graph, priced 0."""
    ort_level: str
    """The level the operators were timed at (the graph's declared one, else the model's)."""
    ms_by_op: dict[str, float] = field(default_factory=dict)
    fallback_reasons: dict[str, str] = field(default_factory=dict)
    """One reason per operator type that fell back."""


class PerOpCostModel:
    """Measured per-operator costs, cached on disk by node signature and settings.

    Args:
        settings: onnxruntime settings operators are timed under (part of the cache key),
            unless their graph declares its own level (see the module docstring).
        cache_path: the sqlite file; default `perop.sqlite` in the cache directory.
        runs: timed runs per operator (the minimum is kept), after `warmup` untimed ones.
        analytic: the fallback for operators that cannot run alone (made on first need).
        cold: flush the CPU caches before every timed run (see the module docstring; part of
            the cache key; no effect on CUDA, whose operators stream from device memory).
    """

    def __init__(
        self,
        settings: OrtSettings | None = None,
        *,
        cache_path: str | os.PathLike | None = None,
        runs: int = 10,
        warmup: int = 2,
        analytic: AnalyticCostModel | None = None,
        cold: bool = True,
    ) -> None:
        self.settings = (settings or OrtSettings()).resolved()
        self.runs, self.warmup = runs, warmup
        self.cold = cold
        self._flusher: CacheFlusher | None = None
        self.cache_path = Path(cache_path) if cache_path else cache_dir() / "perop.sqlite"
        self._analytic = analytic
        self._db = _open_db(self.cache_path)
        self._memory: dict[str, tuple[float | None, str]] = {}
        self._settings_keys: dict[OrtSettings, str] = {}
        self._overheads: dict[tuple[OrtSettings, bool], float] = {}
        self.measured_ops = 0
        """One-node measurements made by this object (a fully cached pass adds none)."""
        self.fallback_nodes = 0
        """Nodes priced by the analytic fallback so far."""

    # ---- public -----------------------------------------------------------------------------

    def cost_ms(self, model: ModelLike) -> float:
        """The graph's per-op cost in ms."""
        return self.report(model).total_ms

    def settings_for(self, graph: Graph) -> OrtSettings:
        """The settings `graph`'s operators are timed under: those it declares, else ours."""
        return declared_settings(graph.metadata, self.settings).resolved()

    def report(self, model: ModelLike) -> PerOpReport:
        """The graph's per-op cost with its breakdown by operator type and its fallbacks."""
        graph = model if isinstance(model, Graph) else load_model(model)
        settings = self.settings_for(graph)
        measured_before = self.measured_ops
        overhead = self.overhead_ms(settings)
        total = overhead
        by_op: Counter[str] = Counter()
        reasons: dict[str, str] = {}
        fallbacks = in_place = 0
        for node in graph.nodes:
            node_ms, error = self._node_ms(graph, node, settings)
            if error is not None:
                fallbacks += 1
                reasons.setdefault(node.op_type, error)
            in_place += runs_in_place(node)
            total += node_ms
            by_op[node.op_type] += node_ms
        return PerOpReport(
            total_ms=total,
            overhead_ms=overhead,
            measured_now=self.measured_ops - measured_before,
            fallback_nodes=fallbacks,
            in_place_nodes=in_place,
            ort_level=settings.ort_level,
            ms_by_op=dict(by_op),
            fallback_reasons=reasons,
        )

    def node_cost_ms(self, graph: Graph, node: Node) -> float:
        """One node's cost, net of the per-run overhead (analytic if it cannot run alone)."""
        return self._node_ms(graph, node, self.settings_for(graph))[0]

    def measured_ms(self, graph: Graph, node: Node) -> tuple[float | None, str]:
        """(the node's time alone net of the per-run overhead, "") as measured (or cached), or
        (None, why it cannot run alone); no analytic fallback. What a cost table records;
        a node run in place is (0, "") untimed."""
        if runs_in_place(node):
            return 0.0, ""
        settings = self.settings_for(graph)
        raw_ms, error = self._raw_ms(graph, node, settings)
        if raw_ms is None:
            return None, error
        return max(raw_ms - self.overhead_ms(settings, holds_weights(graph, node)), 0.0), ""

    def overhead_ms(self, settings: OrtSettings | None = None, cold: bool = False) -> float:
        """onnxruntime's time for one run of a trivial model under `settings` (default ours),
        from flushed caches if `cold`, cached like an operator."""
        settings = settings or self.settings
        cold = cold and self._flushes(settings)
        if (settings, cold) not in self._overheads:
            label = "overhead-cold" if cold else "overhead"
            key = digest(label, self._settings_key(settings)).hex()

            def measure() -> tuple[float | None, str]:
                model, feeds = _trivial_model()
                # More runs than an operator gets: this number is subtracted from every one.
                runs = max(50, 5 * self.runs)
                return self._time(model, feeds, settings, runs=runs, cold=cold), ""

            ms, _ = self._cached(key, f"({label})", settings, measure)
            self._overheads[settings, cold] = ms or 0.0
        return self._overheads[settings, cold]

    def close(self) -> None:
        self._db.close()

    # ---- measuring --------------------------------------------------------------------------

    def _node_ms(self, graph: Graph, node: Node, settings: OrtSettings) -> tuple[float, str | None]:
        """(ms, None) for a node timed alone (net of the overhead) or run in place (0); for a
        fallback, (its analytic time, why it could not run alone)."""
        if runs_in_place(node):
            return 0.0, None
        raw_ms, error = self._raw_ms(graph, node, settings)
        if raw_ms is None:
            self.fallback_nodes += 1
            return self._fallback().node_time_ms(graph, node), error
        return max(raw_ms - self.overhead_ms(settings, holds_weights(graph, node)), 0.0), None

    def _settings_key(self, settings: OrtSettings) -> str:
        if settings not in self._settings_keys:
            key = f"{settings.key()},runs={self.runs},warmup={self.warmup}"
            if self._flushes(settings):
                key += ",cold"
            self._settings_keys[settings] = key
        return self._settings_keys[settings]

    def _raw_ms(self, graph: Graph, node: Node, settings: OrtSettings) -> tuple[float | None, str]:
        """(time of the one-node model in ms or None, why not) for the node's signature."""
        key = node_key(graph, node, self._settings_key(settings))

        def measure() -> tuple[float | None, str]:
            self.measured_ops += 1
            try:
                model, feeds = one_node_model(graph, node)
                shapes = {out.name: graph.values[out.name].shape for out in model.graph.output}
                cold = holds_weights(graph, node)
                return self._time(model, feeds, settings, self.runs, shapes, cold), ""
            except Exception as failure:  # any failure to build or run: "cannot run alone"
                return None, first_line(failure)

        return self._cached(key, node.op_type, settings, measure)

    def _time(
        self,
        model: onnx.ModelProto,
        feeds: dict[str, np.ndarray],
        settings: OrtSettings,
        runs: int,
        shapes: dict[str, tuple[int, ...]] | None = None,
        cold: bool = False,
    ) -> float:
        """The fastest of `runs` timed runs, after checking the outputs' `shapes` if given;
        each from flushed caches if `cold` (and this model flushes under `settings`); built and
        run holding the machine's timing lock, if one is set (`rlflow.cost.timing_lock`)."""
        with exclusive_timing():
            return self._time_session(model, feeds, settings, runs, shapes, cold)

    def _time_session(
        self,
        model: onnx.ModelProto,
        feeds: dict[str, np.ndarray],
        settings: OrtSettings,
        runs: int,
        shapes: dict[str, tuple[int, ...]] | None,
        cold: bool,
    ) -> float:
        session = make_session(model.SerializeToString(), settings)
        if shapes:
            _check_shapes(session, feeds, shapes)
        run = timed_run(session, feeds)
        for _ in range(self.warmup):
            run()
        if not (cold and self._flushes(settings)):
            return min(run() for _ in range(runs))
        if self._flusher is None:
            self._flusher = CacheFlusher()
        times = []
        for _ in range(runs):
            self._flusher.flush()
            times.append(run())
        return min(times)

    def _flushes(self, settings: OrtSettings) -> bool:
        """Whether timings under `settings` start from flushed caches (cold, on CPU)."""
        return self.cold and settings.resolved().provider == "cpu"

    def _fallback(self) -> AnalyticCostModel:
        if self._analytic is None:
            self._analytic = AnalyticCostModel(settings=self.settings)
        return self._analytic

    # ---- cache ------------------------------------------------------------------------------

    def _cached(
        self,
        key: str,
        op_type: str,
        settings: OrtSettings,
        measure: Callable[[], tuple[float | None, str]],
    ) -> tuple[float | None, str]:
        """The entry's (ms, error), measured first if there is none, and timed again (keeping
        the minimum) if it has fewer than `occasions_wanted()`, the last OCCASION_SPACING_S or
        more ago. An operator that could not run alone is not tried again."""
        entry = self._lookup(key)
        if entry is not None:
            ms, error, occasions, timed = entry
            fresh = time.time() - timed < OCCASION_SPACING_S
            if ms is None or occasions >= occasions_wanted() or fresh:
                return ms, error
        ms, error = measure()
        now = time.time()
        with self._db:  # one transaction: the entry is written whole or not at all
            if entry is None:
                self._db.execute(
                    "INSERT OR REPLACE INTO op_times "
                    "(key, op_type, settings, ms, error, created, occasions, timed) "
                    "VALUES (?, ?, ?, ?, ?, ?, 1, ?)",
                    (key, op_type, self._settings_key(settings), ms, error, now, now),
                )
            elif ms is None:  # ran before, not now (rare): keep what it measured
                self._db.execute("UPDATE op_times SET timed = ? WHERE key = ?", (now, key))
            else:  # another process may have timed it meanwhile: the minimum of all
                self._db.execute(
                    "UPDATE op_times SET ms = MIN(COALESCE(ms, ?), ?), "
                    "occasions = occasions + 1, timed = ? WHERE key = ?",
                    (ms, ms, now, key),
                )
        self._memory.pop(key, None)
        found = self._lookup(key)
        assert found is not None
        return found[0], found[1]

    def _lookup(self, key: str) -> tuple[float | None, str, int, float] | None:
        """(ms, error, occasions, when last timed) of a cached entry, or None."""
        if key in self._memory:
            return self._memory[key]
        row = self._db.execute(
            "SELECT ms, error, occasions, COALESCE(timed, created, 0) FROM op_times WHERE key = ?",
            (key,),
        ).fetchone()
        if row is not None:
            self._memory[key] = (row[0], row[1] or "", row[2], row[3])
        return self._memory.get(key)


class CacheFlusher:
    """Evicts the CPU caches by writing a buffer twice the size of the last-level cache (~2 ms
    for 64 MB here), so that the next timed run reads its weights and inputs from memory."""

    FALLBACK_LLC_BYTES = 32 * 2**20
    """Used where the cache size cannot be read (not Linux, or no sysfs)."""

    def __init__(self, llc_bytes: int | None = None) -> None:
        size = 2 * (llc_bytes or last_level_cache_bytes() or self.FALLBACK_LLC_BYTES)
        self._buffer = np.zeros(size // 8, dtype=np.float64)

    def flush(self) -> None:
        np.add(self._buffer, 1.0, out=self._buffer)


def holds_weights(graph: Graph, node: Node) -> bool:
    """Whether `node` reads a constant of COLD_WEIGHT_BYTES or more (a weight matrix, a filter):
    such operators are timed cold."""
    for name in node.inputs:
        array = graph.constant(name) if name else None
        if array is not None and array.nbytes >= COLD_WEIGHT_BYTES:
            return True
    return False


def last_level_cache_bytes() -> int | None:
    """The largest CPU cache of cpu0 in bytes, from Linux's sysfs (None if unreadable)."""
    sizes = []
    for entry in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*/size"):
        try:
            text = entry.read_text().strip().upper()
        except OSError:
            continue
        units = {"K": 2**10, "M": 2**20, "G": 2**30}
        if text and text[-1] in units and text[:-1].isdigit():
            sizes.append(int(text[:-1]) * units[text[-1]])
        elif text.isdigit():
            sizes.append(int(text))
    return max(sizes, default=None)


def runs_in_place(node: Node) -> bool:
    """Whether onnxruntime runs `node` in place inside a graph (a Reshape, Squeeze, ... relabels
    its input's buffer): alone, its output would be a fresh buffer, a copy the graph never
    makes, so such a node is priced 0 like the analytic model's aliases, not timed."""
    return is_standard(node.domain) and node.op_type in ALIASES


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


def _check_shapes(
    session: ort.InferenceSession, feeds: dict[str, np.ndarray], shapes: dict[str, tuple]
) -> None:
    """Raise _Unmeasurable unless one run gives every output the shape the graph records."""
    names = list(shapes)
    for name, result in zip(names, session.run(names, feeds), strict=True):
        if tuple(np.shape(result)) != tuple(shapes[name]):
            raise _Unmeasurable(
                f"alone it gives {name} the shape {tuple(np.shape(result))} where the graph "
                f"records {tuple(shapes[name])}: not the computation the graph runs"
            )


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
            "settings TEXT, ms REAL, error TEXT, created REAL, "
            "occasions INTEGER NOT NULL DEFAULT 1, timed REAL)"
        )
        columns = {row[1] for row in db.execute("PRAGMA table_info(op_times)")}
        # A cache from before OCCASIONS: each entry one timing, taken when it was created.
        for column, kind in (("occasions", "INTEGER NOT NULL DEFAULT 1"), ("timed", "REAL")):
            if column not in columns:
                try:
                    db.execute(f"ALTER TABLE op_times ADD COLUMN {column} {kind}")
                except sqlite3.OperationalError as error:  # another process added it first
                    if "duplicate column" not in str(error):
                        raise
        if "timed" not in columns:
            db.execute("UPDATE op_times SET timed = created WHERE timed IS NULL")
    return db

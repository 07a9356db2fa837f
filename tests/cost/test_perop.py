"""The per-op cost model measures each distinct operator, caches it (the fastest of a few timings
separated in time), and never crashes."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

from rlflow.cost import Deployment, OrtSettings, PerOpCostModel, nchwc_block_size
from rlflow.cost.perop import CacheFlusher, last_level_cache_bytes, node_key
from rlflow.graph import NCHWC_DOMAIN, Graph, Node, Value, load_model


def _block_model(build, weight_seed: int = 0, shape=(4, 64)):
    """Gather of token ids, MatMul, Add, Relu twice, Reshape and Slice: values that matter."""
    rng = np.random.default_rng(weight_seed)
    nodes = [
        helper.make_node("Gather", ["emb", "ids"], ["e"]),
        helper.make_node("MatMul", ["e", "w"], ["m"]),
        helper.make_node("Add", ["m", "b"], ["a"]),
        helper.make_node("Relu", ["a"], ["r1"]),
        helper.make_node("Relu", ["r1"], ["r2"]),  # same signature as the first Relu
        helper.make_node("Reshape", ["r2", "shape"], ["rs"]),
        helper.make_node("Slice", ["rs", "starts", "ends", "axes"], ["y"]),
        helper.make_node("Gather", ["r2", "picks"], ["p"], axis=2),
    ]
    consts = {
        "emb": rng.standard_normal((50, 32)).astype(np.float32),
        "w": rng.standard_normal((32, 32)).astype(np.float32),
        "b": rng.standard_normal(32).astype(np.float32),
        "shape": np.array(shape, np.int64),
        "starts": np.array([1], np.int64),
        "ends": np.array([3], np.int64),
        "axes": np.array([0], np.int64),
        "picks": np.array([30, 31], np.int64),  # random indices would overrun the axis of 32
    }
    return build(
        nodes,
        [("ids", TensorProto.INT64, [1, 8])],
        [("y", TensorProto.FLOAT, None), ("p", TensorProto.FLOAT, None)],
        consts,
        {"rlflow.int_range.ids": "0,50"},
    )


def test_second_pass_measures_nothing(build, tmp_path):
    graph = load_model(_block_model(build))
    cache_path = tmp_path / "perop.sqlite"
    first = PerOpCostModel(cache_path=cache_path, runs=3)
    report = first.report(graph)
    assert report.fallback_nodes == 0, report.fallback_reasons
    # The two Relus share a signature; the Reshape runs in place in a graph: priced 0, untimed.
    assert report.measured_now == first.measured_ops == len(graph.nodes) - 2
    assert report.in_place_nodes == 1 and report.ms_by_op["Reshape"] == 0
    assert report.total_ms > 0
    assert first.report(graph).measured_now == 0  # memory

    second = PerOpCostModel(cache_path=cache_path, runs=3)  # a new process: from disk
    again = second.report(graph)
    assert second.measured_ops == 0 and again.measured_now == 0
    assert again.total_ms == report.total_ms
    assert set(again.ms_by_op) == {node.op_type for node in graph.nodes}


def test_signature_ignores_weight_values_but_not_shape_values(build):
    a = load_model(_block_model(build, weight_seed=0))
    b = load_model(_block_model(build, weight_seed=1))
    c = load_model(_block_model(build, shape=(8, 32)))
    keys = {name: [node_key(g, n) for n in g.nodes] for name, g in [("a", a), ("b", b), ("c", c)]}
    assert keys["a"] == keys["b"]
    reshape = [i for i, node in enumerate(a.nodes) if node.op_type == "Reshape"][0]
    assert keys["a"][reshape] != keys["c"][reshape]


def test_unmeasurable_op_falls_back_to_analytic(tmp_path):
    """An operator onnxruntime does not know is priced analytically and counted, not raised."""
    values = {name: Value(name, TensorProto.FLOAT, (16, 16)) for name in ("x", "h", "y")}
    nodes = [
        Node("Frobnicate", ["x"], ["h"], domain="example.custom"),
        Node("Relu", ["h"], ["y"]),
    ]
    graph = Graph(nodes, [values["x"]], [values["y"]], {}, values, {"": 17, "example.custom": 1})
    model = PerOpCostModel(cache_path=tmp_path / "perop.sqlite", runs=2)
    report = model.report(graph)
    assert report.fallback_nodes == 1 and model.fallback_nodes == 1
    assert "Frobnicate" in report.fallback_reasons
    assert report.ms_by_op["Frobnicate"] > 0
    again = PerOpCostModel(cache_path=tmp_path / "perop.sqlite", runs=2)
    assert again.report(graph).fallback_nodes == 1
    assert again.measured_ops == 0  # the failure is cached too: nobody retries it


@pytest.mark.parametrize("ort_level", ["all", "disable"])
def test_settings_are_part_of_the_key(build, tmp_path, ort_level):
    graph = load_model(_block_model(build))
    cache_path = tmp_path / "perop.sqlite"
    PerOpCostModel(OrtSettings(ort_level="basic"), cache_path=cache_path, runs=2).report(graph)
    other = PerOpCostModel(OrtSettings(ort_level=ort_level), cache_path=cache_path, runs=2)
    assert other.report(graph).measured_now > 0


def test_cold_and_warm_timings_are_cached_apart(build, tmp_path):
    # Cold (caches flushed before each run, the default) and warm timings are different
    # measurements of the same operator: neither may be served from the other's entries.
    graph = load_model(_block_model(build))
    cache_path = tmp_path / "perop.sqlite"
    cold = PerOpCostModel(cache_path=cache_path, runs=2)
    assert cold.cold and cold.report(graph).measured_now > 0
    warm = PerOpCostModel(cache_path=cache_path, runs=2, cold=False)
    assert warm.report(graph).measured_now == cold.measured_ops
    again = PerOpCostModel(cache_path=cache_path, runs=2)
    assert again.report(graph).measured_now == 0


def test_the_cache_flusher_covers_the_last_level_cache():
    llc = last_level_cache_bytes()
    assert llc is None or llc >= 2**16  # read from sysfs where there is one
    flusher = CacheFlusher(llc_bytes=2**20)
    assert flusher._buffer.nbytes == 2 * 2**20  # twice the cache: every line evicted
    flusher.flush()
    flusher.flush()
    assert np.all(flusher._buffer == 2.0)  # every byte was written, not just allocated


def test_operators_are_timed_at_the_level_their_graph_declares(build, tmp_path):
    """A graph declared offline runs as written, so its operators are timed with the optimiser
    off whatever the model's settings; at `all` onnxruntime would rewrite a lone operator."""
    graph = load_model(_block_model(build))
    offline = graph.with_metadata(Deployment("offline").metadata("cpu", {""}))
    model = PerOpCostModel(OrtSettings(ort_level="all"), cache_path=tmp_path / "p.sqlite", runs=2)
    assert model.report(graph).ort_level == "all"
    declared = model.report(offline)
    assert declared.ort_level == "disable" and declared.measured_now > 0  # timed anew
    assert declared.overhead_ms == model.overhead_ms(OrtSettings(ort_level="disable").resolved())


def _nchwc_graph(node: Node, shapes: dict[str, tuple[int, ...]], weights=None) -> Graph:
    values = {name: Value(name, TensorProto.FLOAT, shape) for name, shape in shapes.items()}
    initializers = {name: np.ones(shapes[name], np.float32) for name in weights or ()}
    inputs = [values[name] for name in node.inputs if name not in initializers]
    outputs = [values[name] for name in node.outputs]
    return Graph([node], inputs, outputs, initializers, values, {"": 17, NCHWC_DOMAIN: 1})


def test_an_nchwc_op_given_logical_shapes_is_a_counted_fallback(tmp_path):
    """Blocked tensors must carry their blocked shapes (channels padded to the block): given the
    logical ones, a one-node model would time another computation, or fail. Either way the
    node is not timed but priced analytically, counted, with the reason."""
    block = nchwc_block_size()
    if block is None:
        pytest.skip("onnxruntime here makes no NCHWc graphs")
    half = block // 2
    conv = Node.make(
        "Conv", ["x", "w", "b"], ["y"], domain=NCHWC_DOMAIN, kernel_shape=[3, 3], pads=[1] * 4
    )
    # The filter and bias are padded to a block; the graph records y's logical channels.
    wrong_output = _nchwc_graph(
        conv,
        {"x": (1, half, 8, 8), "w": (block, half, 3, 3), "b": (block,), "y": (1, half, 8, 8)},
        weights=("w", "b"),
    )
    reorder = Node.make("ReorderOutput", ["x"], ["y"], domain=NCHWC_DOMAIN, channels=half)
    wrong_input = _nchwc_graph(reorder, {"x": (1, half, 4, 4), "y": (1, half, 4, 4)})
    model = PerOpCostModel(OrtSettings(ort_level="disable"), cache_path=tmp_path / "p.sqlite")
    for graph, reason in [(wrong_output, "records"), (wrong_input, "")]:
        report = model.report(graph)
        assert report.fallback_nodes == 1, report
        assert reason in report.fallback_reasons[graph.nodes[0].op_type]
    right = _nchwc_graph(reorder, {"x": (1, block, 4, 4), "y": (1, half, 4, 4)})
    assert model.report(right).fallback_nodes == 0


def test_an_entry_is_the_fastest_of_separate_timings(build, tmp_path, monkeypatch):
    """An entry timed in a slow moment is timed again once OCCASION_SPACING_S has passed,
    keeps the minimum, and stops being timed after OCCASIONS timings."""
    import sqlite3

    from rlflow.cost import perop

    graph = load_model(_block_model(build))
    cache_path = tmp_path / "perop.sqlite"
    model = PerOpCostModel(cache_path=cache_path, runs=3)
    first = model.report(graph)
    distinct = first.measured_now
    assert model.report(graph).measured_now == 0  # timed a moment ago: not again
    # A slow moment: every operator's entry 1000x its time, timed an hour ago.
    with sqlite3.connect(cache_path) as db:
        db.execute(
            "UPDATE op_times SET ms = ms * 1000, timed = timed - 3600 WHERE op_type NOT LIKE '(%'"
        )
    model = PerOpCostModel(cache_path=cache_path, runs=3)
    second = model.report(graph)
    assert second.measured_now == distinct  # each operator timed again
    assert second.total_ms < 100 * first.total_ms  # the minimum kept, not the slow value
    assert model.report(graph).measured_now == 0  # timed a moment ago again
    monkeypatch.setattr(perop, "OCCASION_SPACING_S", 0.0)
    model = PerOpCostModel(cache_path=cache_path, runs=3)
    assert model.report(graph).measured_now == distinct  # the third occasion
    assert model.report(graph).measured_now == 0  # OCCASIONS reached
    with sqlite3.connect(cache_path) as db:
        rows = db.execute("SELECT occasions FROM op_times WHERE op_type NOT LIKE '(%'")
        occasions = {row[0] for row in rows}
    assert occasions == {perop.OCCASIONS}


def test_one_occasion_makes_the_first_timing_final(build, tmp_path, monkeypatch):
    """With `RLFLOW_TIMING_OCCASIONS=1` an entry timed an hour ago is read, not timed again;
    a value that is not a count is refused."""
    import sqlite3

    from rlflow.errors import RlflowError

    graph = load_model(_block_model(build))
    cache_path = tmp_path / "perop.sqlite"
    first = PerOpCostModel(cache_path=cache_path, runs=3).report(graph)
    with sqlite3.connect(cache_path) as db:
        db.execute("UPDATE op_times SET timed = timed - 3600")
    monkeypatch.setenv("RLFLOW_TIMING_OCCASIONS", "1")
    again = PerOpCostModel(cache_path=cache_path, runs=3).report(graph)
    assert first.measured_now > 0 and again.measured_now == 0
    assert again.total_ms == first.total_ms
    monkeypatch.setenv("RLFLOW_TIMING_OCCASIONS", "0")
    with pytest.raises(RlflowError, match="RLFLOW_TIMING_OCCASIONS must be"):
        PerOpCostModel(cache_path=cache_path, runs=3).report(graph)


def test_a_cache_from_before_occasions_opens_with_one_timing_each(build, tmp_path):
    import sqlite3

    cache_path = tmp_path / "perop.sqlite"
    with sqlite3.connect(cache_path) as db:
        db.execute(
            "CREATE TABLE op_times (key TEXT PRIMARY KEY, op_type TEXT, settings TEXT, "
            "ms REAL, error TEXT, created REAL)"
        )
        db.execute("INSERT INTO op_times VALUES ('k', 'Relu', 's', 0.5, '', 123.0)")
    model = PerOpCostModel(cache_path=cache_path, runs=3)
    assert model._lookup("k") == (0.5, "", 1, 123.0)
    PerOpCostModel(cache_path=cache_path, runs=3)  # opening it again changes nothing
    assert model.report(load_model(_block_model(build))).total_ms > 0

"""The graph IR: loading, static shapes, topological order, folding, export."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from rlflow.errors import RlflowError
from rlflow.graph import Graph, GraphError, Node, Value, load_model, topological_order
from tests.conftest import make_model, random_feeds, run_onnx


def test_load_gives_static_shapes_for_every_value(mlp_model):
    graph = load_model(mlp_model)
    assert [n.op_type for n in graph.nodes] == ["MatMul", "Add", "Relu", "MatMul"]
    assert graph.value("h0").shape == (2, 16)
    assert graph.value("y") == Value("y", TensorProto.FLOAT, (2, 4))
    assert graph.is_constant("w1") and not graph.is_constant("x")
    assert graph.producer("h1").op_type == "Add"
    assert [n.op_type for n in graph.consumers("h2")] == ["MatMul"]


def test_export_passes_full_check_and_computes_the_same(mlp_model):
    exported = load_model(mlp_model).to_onnx()
    onnx.checker.check_model(exported, full_check=True)
    feeds = random_feeds(mlp_model)
    np.testing.assert_allclose(run_onnx(exported, feeds)[0], run_onnx(mlp_model, feeds)[0])


def test_nodes_out_of_order_are_sorted():
    nodes = [
        helper.make_node("Relu", ["a"], ["y"]),
        helper.make_node("Neg", ["x"], ["a"]),
    ]
    model = make_model(nodes, [("x", [3])], ["y"])
    graph = load_model(model)
    assert [n.op_type for n in graph.nodes] == ["Neg", "Relu"]


def test_cycle_is_rejected():
    nodes = [Node.make("Relu", ["b"], ["a"]), Node.make("Relu", ["a"], ["b"])]
    with pytest.raises(GraphError, match="cycle"):
        topological_order(nodes, {"x"})


def test_shape_subgraph_is_folded_into_a_constant():
    """Shape -> Gather -> Unsqueeze -> Concat -> Reshape becomes a Reshape by a constant."""
    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Gather", ["s", "zero"], ["d0"], axis=0),
        helper.make_node("Unsqueeze", ["d0", "axes"], ["d0u"]),
        helper.make_node("Concat", ["d0u", "minus_one"], ["shape"], axis=0),
        helper.make_node("Reshape", ["x", "shape"], ["y"]),
    ]
    inits = [
        ("zero", np.array(0, dtype=np.int64)),
        ("axes", np.array([0], dtype=np.int64)),
        ("minus_one", np.array([-1], dtype=np.int64)),
    ]
    model = make_model(nodes, [("x", [2, 3, 4])], ["y"], inits)
    graph = load_model(model)
    assert [n.op_type for n in graph.nodes] == ["Reshape"]
    np.testing.assert_array_equal(graph.constant(graph.nodes[0].inputs[1]), [2, -1])
    assert graph.value("y").shape == (2, 12)


def test_constant_nodes_become_initializers():
    nodes = [
        helper.make_node("Constant", [], ["c"], value_floats=[1.0, 2.0, 3.0]),
        helper.make_node("Add", ["x", "c"], ["y"]),
    ]
    graph = load_model(make_model(nodes, [("x", [3])], ["y"]))
    assert [n.op_type for n in graph.nodes] == ["Add"]
    np.testing.assert_array_equal(graph.constant("c"), [1.0, 2.0, 3.0])


def test_unknown_operator_is_kept_opaque():
    """An operator ONNX cannot type (a contrib op) is kept; its shape comes from one ORT run."""
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["h"]),
        helper.make_node("FastGelu", ["h"], ["y"], domain="com.microsoft"),
    ]
    w = np.random.default_rng(0).standard_normal((4, 6)).astype(np.float32)
    model = make_model(nodes, [("x", [2, 4])], ["y"], [("w", w)])
    model.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    graph = load_model(model)
    assert [n.op_type for n in graph.nodes] == ["MatMul", "FastGelu"]
    assert graph.value("y").shape == (2, 6)
    feeds = random_feeds(model)
    np.testing.assert_allclose(run_onnx(graph.to_onnx(), feeds)[0], run_onnx(model, feeds)[0])


def test_shape_probe_reads_a_model_newer_than_onnxruntime():
    """A model written by a newer onnx than onnxruntime reads (as the GPU machine's onnx and
    onnxruntime-gpu were) still has its contrib op's shape read off a run: the probe lowers
    the IR version, which onnxruntime would otherwise refuse before running anything."""
    import onnx

    from rlflow.graph.shapes import max_ort_ir_version

    w = np.random.default_rng(0).standard_normal((4, 6)).astype(np.float32)
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["h"]),
        helper.make_node("FastGelu", ["h"], ["y"], domain="com.microsoft"),
    ]
    model = make_model(nodes, [("x", [2, 4])], ["y"], [("w", w)])
    model.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    model.ir_version = max(onnx.IR_VERSION, max_ort_ir_version()) + 1
    assert load_model(model).value("y").shape == (2, 6)


def test_dynamic_input_needs_a_shape():
    model = make_model([helper.make_node("Relu", ["x"], ["y"])], [("x", ["batch", 4])], ["y"])
    with pytest.raises(RlflowError, match=r"dynamic dims: x\['batch', 4\].*--input-shape"):
        load_model(model)
    graph = load_model(model, {"x": (3, 4)})
    assert graph.value("y").shape == (3, 4)


def test_replaced_shares_untouched_parts_and_prunes_dead_nodes(mlp_model):
    graph = load_model(mlp_model)
    add = graph.producer("h1")
    relu = graph.producer("h2")
    fused = Node.make("Relu", ["h0"], ["h2"])
    derived = graph.replaced(removed=[add, relu], added=[fused])
    assert [n.op_type for n in derived.nodes] == ["MatMul", "Relu", "MatMul"]
    assert "b1" not in derived.initializers  # its only reader is gone
    assert derived.initializers["w1"] is graph.initializers["w1"]
    assert derived.nodes[0] is graph.nodes[0]
    assert isinstance(derived, Graph) and derived.canonical_hash() != graph.canonical_hash()


def test_replaced_renames_readers_and_keeps_output_names(mlp_model):
    graph = load_model(mlp_model)
    last = graph.producer("y")
    replacement = Node.make("MatMul", ["h2", "w2"], ["y_new"])
    derived = graph.replaced(
        removed=[last],
        added=[replacement],
        renames={"y": "y_new"},
        values=[Value("y_new", TensorProto.FLOAT, (2, 4))],
    )
    assert [v.name for v in derived.outputs] == ["y"]
    assert derived.producer("y").op_type == "MatMul"
    assert derived.canonical_hash() == graph.canonical_hash()

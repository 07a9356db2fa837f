"""Loading keeps what a caller of the model sees: `--input-shape` must fit the model, weights
listed among the inputs stay inputs, and `Interface.restore` puts the original's inputs, outputs
and symbolic dims back on a model written from the Graph."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from rlflow.errors import RlflowError
from rlflow.graph import load_model, load_with_interface
from rlflow.rewrite import default_ruleset
from tests.fuzz.cases import build, conv_bn, mlp


def dims(info: onnx.ValueInfoProto) -> list:
    return [
        d.dim_value if d.HasField("dim_value") else (d.dim_param or None)
        for d in info.type.tensor_type.shape.dim
    ]


# ---- item 1: a given shape must fit the model ---------------------------------------------------


def test_a_shape_that_contradicts_a_fixed_dim_is_an_error():
    """The issue's case: x fixed at 2x8, given 5x8, was written as a model onnx rejects."""
    with pytest.raises(RlflowError, match="x=5x8 contradicts the model: x is 2x8, its dim 0 fixed"):
        load_model(mlp(), {"x": (5, 8)})
    assert [v.shape for v in load_model(mlp(), {"x": (2, 8)}).inputs] == [(2, 8)]


@pytest.mark.parametrize(
    ("model", "shapes", "message"),
    [
        (mlp(["N", 8], ["N", 4]), {"x": (0, 8)}, "x=0x8: every dim must be at least 1"),
        (mlp(["N", 8], ["N", 4]), {"x": (3, 9)}, "x is Nx8, its dim 1 fixed at 8"),
        (mlp(["N", 8], ["N", 4]), {"x": (3,)}, "has 1 dims; x has 2"),
        (mlp(), {"z": (2, 8)}, "z is not an input of model; inputs: x"),
        (mlp(), {"w": (8, 4)}, "w is a weight (a constant) of model"),
        (mlp(listed=("w",)), {"w": (4, 8)}, "w is a weight listed among the inputs, of shape 8x4"),
    ],
)
def test_shapes_that_do_not_fit_the_model_are_errors(model, shapes, message):
    with pytest.raises(RlflowError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load_model(model, shapes)


def test_one_symbol_given_two_sizes_is_an_error():
    nodes = [helper.make_node("Add", ["a", "b"], ["y"])]
    io = [("a", TensorProto.FLOAT, ["N", 4]), ("b", TensorProto.FLOAT, ["N", 4])]
    model = build(nodes, io, [("y", TensorProto.FLOAT, ["N", 4])])
    with pytest.raises(RlflowError, match="dim N two sizes: 2 in a, 3 in b"):
        load_model(model, {"a": (2, 4), "b": (3, 4)})


# ---- item 2: weights listed among the inputs --------------------------------------------------


def test_weights_listed_as_inputs_stay_inputs_and_are_never_folded():
    graph = load_model(conv_bn(listed=("w", "scale", "bias", "mean", "var")))
    assert [v.name for v in graph.inputs] == ["x", "w", "scale", "bias", "mean", "var"]
    assert not graph.initializers
    rules = {c.rule.name for c in default_ruleset().candidates(graph)}
    assert "conv-batchnorm-fold" not in rules
    folded = load_model(conv_bn(listed=("w", "var")), fold_initializer_inputs=True)
    assert [v.name for v in folded.inputs] == ["x"]
    assert "conv-batchnorm-fold" in {c.rule.name for c in default_ruleset().candidates(folded)}


def test_ir3_model_keeps_its_weights_as_inputs_with_defaults():
    """IR 3 lists every weight among the inputs; the written model must too (else onnx's
    checker rejects it), with the original values as defaults."""
    original = mlp(listed=("w", "b"), ir_version=3, opset=9)
    graph, interface = load_with_interface(original)
    written = interface.restore(graph.to_onnx(), ())
    onnx.checker.check_model(written, full_check=True)
    assert [i.name for i in written.graph.input] == ["x", "w", "b"]
    defaults = {t.name: onnx.numpy_helper.to_array(t) for t in written.graph.initializer}
    assert np.array_equal(defaults["w"], onnx.numpy_helper.to_array(original.graph.initializer[0]))


def test_large_weight_inputs_load():
    """A weight too large to hand shape inference as data is typed once, not twice."""
    nodes = [helper.make_node("MatMul", ["x", "w"], ["y"])]
    weights = {"w": np.ones((128, 64), np.float32)}
    model = build(nodes, [("x", TensorProto.FLOAT, [2, 128])], [("y", TensorProto.FLOAT, [2, 64])],
                  weights, listed=("w",))  # fmt: skip
    graph = load_model(model)
    assert [v.shape for v in graph.inputs] == [(2, 128), (128, 64)]


def test_a_graph_with_constants_from_an_ir3_source_is_written_as_ir4():
    """A Graph's constants are never inputs, which IR 3 forbids."""
    graph = load_model(mlp(listed=("w", "b"), ir_version=3, opset=9), fold_initializer_inputs=True)
    model = graph.to_onnx()
    assert model.ir_version == 4
    onnx.checker.check_model(model, full_check=True)


# ---- item 3: restoring symbolic dims ------------------------------------------------------------


def test_restore_gives_back_symbolic_dims_and_drops_static_inner_shapes():
    graph, interface = load_with_interface(mlp(["N", 8], ["N", 4]), {"x": (3, 8)})
    assert interface.symbols == {"N": 3}
    general = interface.restore(graph.to_onnx(), {"N"})
    assert dims(general.graph.input[0]) == ["N", 8] and dims(general.graph.output[0]) == ["N", 4]
    assert not general.graph.value_info  # inner shapes would say 3 where a caller feeds 5
    onnx.checker.check_model(general, full_check=True)
    session = ort.InferenceSession(general.SerializeToString(), providers=["CPUExecutionProvider"])
    assert session.run(None, {"x": np.ones((5, 8), np.float32)})[0].shape == (5, 4)
    specialised = interface.restore(graph.to_onnx(), ())
    assert dims(specialised.graph.input[0]) == [3, 8]
    assert dims(specialised.graph.output[0]) == [3, 4]


def test_unnamed_dynamic_dims_are_named_by_their_place():
    graph, interface = load_with_interface(mlp([None, 8], [None, 4]), {"x": (2, 8)})
    assert interface.symbols == {"x[0]": 2}
    assert interface.input_shapes({"x[0]": 7}) == {"x": (7, 8)}
    written = interface.restore(graph.to_onnx(), {"x[0]"})
    assert dims(written.graph.input[0]) == [None, 8] and dims(written.graph.output[0]) == [None, 4]


def test_node_names_stay_unique_when_a_kept_name_looks_generated():
    """A node named like a generated name (`Relu_1`) must not collide with one (onnxruntime
    refuses a model with two nodes of one name)."""
    nodes = [
        helper.make_node("Relu", ["x"], ["a"], name="Relu_1"),
        helper.make_node("Relu", ["a"], ["y"]),
    ]
    model = build(nodes, [("x", TensorProto.FLOAT, [2])], [("y", TensorProto.FLOAT, [2])])
    written = load_model(model).to_onnx()
    names = [node.name for node in written.graph.node]
    assert len(set(names)) == 2 and "Relu_1" in names
    ort.InferenceSession(written.SerializeToString(), providers=["CPUExecutionProvider"])

"""The model handed back keeps the original's interface, is checked against the original file,
and keeps a dynamic dim symbolic only where it matches the original at other sizes."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from rlflow.cost.handback import hand_back, other_sizes
from rlflow.errors import RlflowError
from rlflow.graph import load_with_interface
from tests.fuzz.cases import build, flatten_by_shape, mlp


def dims(info: onnx.ValueInfoProto) -> list:
    return [d.dim_value or d.dim_param for d in info.type.tensor_type.shape.dim]


def test_a_dim_that_stays_general_keeps_its_symbol():
    graph, interface = load_with_interface(mlp(["N", 8], ["N", 4]), {"x": (3, 8)})
    handed = hand_back(graph, graph, interface)
    check = handed.sizes["N"]
    assert check.general and check.checked == (6, 4) and not handed.specialised
    assert dims(handed.model.graph.input[0]) == ["N", 8]
    assert handed.report.equivalent and "6 input sets" in handed.report.reason


def test_a_dim_the_result_was_specialised_to_is_fixed_and_said_so():
    """Loading folds Reshape(x, [Shape(x)[0], -1]) into Reshape(x, [3, 8]): correct at N=3 only."""
    graph, interface = load_with_interface(flatten_by_shape(), {"x": (3, 2, 4)})
    handed = hand_back(graph, graph, interface)
    assert handed.specialised == {"N": 3}
    assert "at N=6 the result differs from the original" in handed.sizes["N"].reason
    assert dims(handed.model.graph.input[0]) == [3, 2, 4]
    assert dims(handed.model.graph.output[0]) == [3, 4]
    assert handed.to_json()["specialised"] == {"N": 3}


def test_a_dim_the_original_accepts_at_one_size_only_is_not_called_general():
    """x[N, 8] + c[2, 8] runs at N = 1 or 2 only: one other size is not evidence enough."""
    nodes = [helper.make_node("Add", ["x", "c"], ["y"])]
    io = [("x", TensorProto.FLOAT, ["N", 8])], [("y", TensorProto.FLOAT, [2, 8])]
    model = build(nodes, *io, {"c": np.ones((2, 8), np.float32)})
    graph, interface = load_with_interface(model, {"x": (2, 8)})
    check = hand_back(graph, graph, interface).sizes["N"]
    assert not check.general and check.checked == (1,)
    assert check.reason == "the original does not run at N=4, 3, 6"


def test_weights_listed_as_inputs_are_handed_back_as_inputs():
    graph, interface = load_with_interface(mlp(listed=("w", "b")))
    handed = hand_back(graph, graph, interface)
    assert [info.name for info in handed.model.graph.input] == ["x", "w", "b"]
    assert handed.to_json()["initializer_inputs"] == ["b", "w"]
    assert list(handed.report.inputs) == ["x"]  # the file runs with its defaults


def test_a_result_that_is_not_equivalent_is_refused():
    original, interface = load_with_interface(mlp())
    wrong, _ = load_with_interface(mlp(listed=()), fold_initializer_inputs=True)
    wrong.initializers["b"] = wrong.initializers["b"] + 1
    with pytest.raises(RlflowError, match="not equivalent to the original.*nothing written"):
        hand_back(original, wrong, interface)


def test_other_sizes_twice_first_then_one_more():
    assert other_sizes(3) == [6, 4, 1, 9, 2]
    assert other_sizes(1) == [2, 3]

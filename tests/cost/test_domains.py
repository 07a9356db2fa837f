"""Integer inputs are drawn from the range the graph shows valid (a Gather's table, a shape a
Reshape reads) or the documented default, the report says which, and scalar inputs work."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

from rlflow.cost import check_equivalence, random_inputs
from rlflow.cost.domains import DEFAULT_INT_RANGE, InputDomain
from rlflow.cost.source import ModelSource
from rlflow.graph import load_model
from tests.fuzz.cases import build, embedding, scalars

F, I64 = TensorProto.FLOAT, TensorProto.INT64


def domains(model) -> dict[str, InputDomain | None]:
    return {spec.name: spec.domain for spec in ModelSource(model).inputs}


def test_token_ids_span_the_embedding_table():
    """The issue's case: ids drawn from {0, 1} exercised two rows of the table."""
    for model in (embedding(rows=1000), load_model(embedding(rows=1000))):
        domain = domains(model)["ids"]
        assert (domain.low, domain.high) == (0, 1000)
        assert domain.origin == "rows of Gather table 'emb'"
    feeds = random_inputs(ModelSource(embedding(rows=1000)).inputs, {}, seed=0)
    assert feeds["ids"].max() < 1000 and len(np.unique(feeds["ids"])) > 5


def test_ids_are_followed_through_value_passing_ops_and_the_smallest_table_wins():
    nodes = [
        helper.make_node("Cast", ["ids"], ["ids64"], to=I64),
        helper.make_node("Reshape", ["ids64", "flat"], ["flat_ids"]),
        helper.make_node("Gather", ["big", "flat_ids"], ["a"]),
        helper.make_node("Gather", ["small", "ids64"], ["b"]),
        helper.make_node("GatherElements", ["wide", "ids64"], ["c"], axis=1),
    ]
    weights = {
        "flat": np.array([-1], np.int64),
        "big": np.zeros((500, 2), np.float32),
        "small": np.zeros((40, 2), np.float32),
        "wide": np.zeros((2, 25), np.float32),
    }
    outputs = [("a", F, [6, 2]), ("b", F, [2, 3, 2]), ("c", F, [2, 3])]
    model = build(nodes, [("ids", TensorProto.INT32, [2, 3])], outputs, weights)
    domain = domains(model)["ids"]
    assert (domain.low, domain.high) == (0, 25)
    assert domain.origin == "rows of GatherElements table 'wide'"


def test_metadata_range_wins_and_an_unexplained_int_takes_the_default():
    nodes = [
        helper.make_node("Cast", ["mask"], ["m"], to=F),
        helper.make_node("Gather", ["emb", "ids"], ["e"]),
    ]
    io = [("mask", I64, [4]), ("ids", I64, [4])]
    weights = {"emb": np.zeros((100, 2), np.float32)}
    model = build(nodes, io, [("m", F, [4]), ("e", F, [4, 2])], weights)
    model.metadata_props.add(key="rlflow.int_range.ids", value="10,20")
    found = domains(model)
    assert (found["ids"].low, found["ids"].high) == (10, 20)
    assert found["ids"].origin == "metadata rlflow.int_range.ids"
    assert (found["mask"].low, found["mask"].high, found["mask"].origin) == (
        *DEFAULT_INT_RANGE,
        "default",
    )


def test_a_shape_input_is_fed_the_value_the_static_shapes_fix():
    """A Reshape's target listed among the inputs (an older export) stays an input of the
    Graph; randomised, it would make the model fail, or compute something else."""
    nodes = [
        helper.make_node("Reshape", ["x", "target"], ["r"], name="r"),
        helper.make_node("Relu", ["r"], ["y"]),
    ]
    io = [("x", F, [2, 8])], [("y", F, [4, 4])]
    model = build(nodes, *io, {"target": np.array([4, -1], np.int64)}, listed=("target",))
    graph = load_model(model)
    domain = domains(graph)["target"]
    assert domain.fixed == (4, 4) and domain.origin == "the shape Reshape 'r' reads"
    report = check_equivalence(graph, graph)
    assert report.equivalent, report.reason
    assert report.inputs["target"] == {
        "dtype": "int64",
        "value": [4, 4],
        "from": "the shape Reshape 'r' reads",
    }
    assert "target" not in domains(model)  # the file runs with its default, not fed


def test_scalar_int_and_bool_inputs_work():
    feeds = random_inputs(ModelSource(scalars()).inputs, {}, seed=0)
    assert feeds["k"].shape == () and feeds["flag"].shape == () and feeds["x"].shape == (2, 3)
    assert all(isinstance(array, np.ndarray) for array in feeds.values())
    report = check_equivalence(scalars(), load_model(scalars()))
    assert report.equivalent, report.reason
    assert report.inputs == {
        "x": {"dtype": "float", "normal_scales": [1.0]},
        "k": {"dtype": "int64", "low": 0, "high": 2, "from": "default"},
        "flag": {"dtype": "bool", "values": "coin flips"},
    }


@pytest.mark.parametrize("text", ["10", "a,b", "5,5"])
def test_malformed_metadata_range_is_a_user_error(text):
    from rlflow.errors import RlflowError

    model = embedding()
    model.metadata_props.add(key="rlflow.int_range.ids", value=text)
    with pytest.raises(RlflowError, match="rlflow.int_range.ids"):
        ModelSource(model)

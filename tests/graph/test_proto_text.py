"""A byte flipped inside a text field of a saved model (a node's name, a doc string, a value
name) is reported at load as one line naming the field, not as a UnicodeDecodeError from onnx's
checker or a failure in onnxruntime or the writer later on."""

from __future__ import annotations

import onnx
import pytest
from onnx import helper

from rlflow.graph import load_model
from rlflow.graph.proto_text import invalid_text_field
from tests.cli.test_errors import assert_one_line_error, rlflow
from tests.conftest import make_model

MARKS = {
    "name": "model.graph.node[1].name",
    "doc_string": "model.graph.node[1].doc_string",
    "input": "model.graph.node[2].input[0]",
}
"""Where each damaged copy has its bad byte: the field path the error must name."""


@pytest.fixture
def damaged(tmp_path, mlp_model):
    """Copies of the MLP, each with one byte of one text field replaced by 0xff."""
    for dim in (2, 4):  # a declared output shape: onnx's checker then goes on to the nodes
        mlp_model.graph.output[0].type.tensor_type.shape.dim.add().dim_value = dim
    mlp_model.graph.node[1].name = "NAMEMARK"
    mlp_model.graph.node[1].doc_string = "DOCMARK"
    mlp_model.graph.node[1].output[0] = "VALUEMARK"
    mlp_model.graph.node[2].input[0] = "VALUEMARK"
    good = mlp_model.SerializeToString()
    paths = {}
    for field, needle in (("name", b"NAMEMARK"), ("doc_string", b"DOCMARK")):
        at = good.index(needle) + 1
        paths[field] = tmp_path / f"{field}.onnx"
        paths[field].write_bytes(good[:at] + b"\xff" + good[at + 1 :])
    # The second VALUEMARK is node 2's input: the graph then also reads an undefined value,
    # which is what made onnx's checker quote the bad bytes and fail to decode its message.
    at = good.index(b"VALUEMARK", good.index(b"VALUEMARK") + 1) + 1
    paths["input"] = tmp_path / "input.onnx"
    paths["input"].write_bytes(good[:at] + b"\xff" + good[at + 1 :])
    return paths


def test_invalid_text_field_names_the_field(damaged, mlp_model):
    assert invalid_text_field(mlp_model) is None
    for field, path in damaged.items():
        assert invalid_text_field(onnx.load(path)) == MARKS[field]


def test_subgraph_fields_are_read_too():
    body = helper.make_graph(
        [helper.make_node("Neg", ["x"], ["n"], name="neg")],
        "then",
        [],
        [helper.make_tensor_value_info("n", onnx.TensorProto.FLOAT, [2])],
    )
    node = helper.make_node("If", ["c"], ["y"], then_branch=body, else_branch=body)
    model = make_model([node], [("x", [2])], ["y"])
    model.graph.node[0].attribute[0].g.node[0].name = "NEGMARK"
    raw = model.SerializeToString()
    at = raw.index(b"NEGMARK")
    found = invalid_text_field(onnx.load_from_string(raw[:at] + b"\xfe" + raw[at + 1 :]))
    assert found == "model.graph.node[0].attribute[0].g.node[0].name"


def test_load_model_says_which_field(damaged):
    for field, path in damaged.items():
        with pytest.raises(Exception) as error:
            load_model(path)
        assert f"{MARKS[field]} is not UTF-8 text" in str(error.value)


@pytest.mark.parametrize("field", sorted(MARKS))
def test_every_command_that_loads_a_model_says_one_line(tmp_path, damaged, field):
    path = str(damaged[field])
    needle = f"{path} is not a valid ONNX model ({MARKS[field]} is not UTF-8 text)"
    assert_one_line_error(rlflow("inspect", path), needle)
    assert_one_line_error(rlflow("measure", path, "--runs", "5"), needle)
    out = tmp_path / "out.onnx"
    result = rlflow("optimize", path, "-o", str(out), "--min-time", "0.05", "--no-peer")
    assert_one_line_error(result, needle)
    assert not out.exists()

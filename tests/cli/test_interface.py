"""`rlflow optimize` hands back a model with the original's interface, and says how it checked
it: one test per item of the interface issue (shapes that contradict the model, weights listed as
inputs, dynamic dims, integer input ranges, input magnitudes)."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest

from rlflow.cli import main
from tests.fuzz.cases import embedding, flatten_by_shape, mlp, scalars

QUICK = ("--budget", "4", "--min-time", "0.05", "--no-peer")


@pytest.fixture(autouse=True)
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("RLFLOW_CACHE_DIR", str(tmp_path / "cache"))


def optimize(tmp_path, capsys, model: onnx.ModelProto, *args: str) -> tuple[int, str, str]:
    """Run `rlflow optimize` on `model` in process: (exit code, stdout, stderr)."""
    source = tmp_path / "model.onnx"
    onnx.save(model, source)
    code = main(["optimize", str(source), "-o", str(tmp_path / "out.onnx"), *QUICK, *args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def summary_of(out: str) -> dict:
    return json.loads(out.strip().splitlines()[-1])


def dims(info: onnx.ValueInfoProto) -> list:
    return [d.dim_value or d.dim_param for d in info.type.tensor_type.shape.dim]


@pytest.mark.parametrize(
    ("model", "flag", "needle"),
    [
        (mlp(), "x=5x8", "--input-shape x=5x8 contradicts the model: x is 2x8"),
        (mlp(["N", 8], ["N", 4]), "x=0x8", "every dim must be at least 1"),
        (mlp(), "y=2x4", "--input-shape y: y is not an input"),
        (mlp(), "b=4", "--input-shape b: b is a weight"),
    ],
)
def test_input_shapes_that_do_not_fit_are_one_line_errors(tmp_path, capsys, model, flag, needle):
    """Item 1: x fixed at 2x8 and given 5x8 was written declaring x 5x8 and y 2x8."""
    code, _, err = optimize(tmp_path, capsys, model, "--input-shape", flag)
    assert code == 2 and not (tmp_path / "out.onnx").exists()
    lines = err.strip().splitlines()
    assert lines[-1].startswith("rlflow: error:") and needle in lines[-1], err
    assert "Traceback" not in err


def test_one_input_given_two_shapes_is_a_one_line_error(tmp_path, capsys):
    flags = ("--input-shape", "x=3x8", "--input-shape", "x=4x8")
    code, _, err = optimize(tmp_path, capsys, mlp(["N", 8], ["N", 4]), *flags)
    assert (
        code == 2 and err.strip().splitlines()[-1] == "rlflow: error: --input-shape gives x twice"
    )


def test_weights_listed_as_inputs_stay_inputs_unless_folded_on_request(tmp_path, capsys):
    """Item 2: an IR 3 export lists its weights among its inputs; the output dropped them."""
    model = mlp(listed=("w", "b"), ir_version=3, opset=9)
    code, out, err = optimize(tmp_path, capsys, model, "--json")
    assert code == 0, err
    written = onnx.load(tmp_path / "out.onnx")
    onnx.checker.check_model(written, full_check=True)
    assert [i.name for i in written.graph.input] == ["x", "w", "b"]
    assert {"w", "b"} <= {t.name for t in written.graph.initializer}
    assert summary_of(out)["interface"]["initializer_inputs"] == ["b", "w"]
    code, out, err = optimize(tmp_path, capsys, model, "--fold-initializer-inputs")
    assert code == 0, err
    assert [i.name for i in onnx.load(tmp_path / "out.onnx").graph.input] == ["x"]
    assert "weights listed as inputs folded into constants: w, b" in out


def test_dynamic_dims_come_back_or_the_specialisation_is_said(tmp_path, capsys):
    """Item 3: x[N,8] came back as x[3,8] without a word."""
    code, out, err = optimize(
        tmp_path, capsys, mlp(["N", 8], ["N", 4]), "--input-shape", "x=3x8", "--json"
    )
    assert code == 0, err
    written = onnx.load(tmp_path / "out.onnx")
    assert dims(written.graph.input[0]) == ["N", 8] and dims(written.graph.output[0]) == ["N", 4]
    dim = summary_of(out)["interface"]["dynamic_dims"]["N"]
    assert dim == {"given": 3, "checked": [6, 4], "general": True, "reason": ""}

    code, out, err = optimize(tmp_path, capsys, flatten_by_shape(), "--input-shape", "x=3x2x4")
    assert code == 0, err
    written_to = tmp_path / "out.onnx"
    assert f"SPECIALISED: {written_to} fixes dim N at 3, the size it was given: at N=6" in out
    assert dims(onnx.load(tmp_path / "out.onnx").graph.input[0]) == [3, 2, 4]
    code, out, _ = optimize(
        tmp_path, capsys, flatten_by_shape(), "--input-shape", "x=3x2x4", "--json"
    )
    assert summary_of(out)["interface"]["specialised"] == {"N": 3}


def test_integer_inputs_are_drawn_from_the_table_they_index_and_the_ranges_are_reported(
    tmp_path, capsys
):
    """Item 4: token ids were drawn from {0, 1}; scalar int and bool inputs must work."""
    code, out, err = optimize(tmp_path, capsys, embedding(rows=1000))
    assert code == 0, err
    assert "ids int64 in [0, 1000) (rows of Gather table 'emb')" in out
    code, out, err = optimize(tmp_path, capsys, scalars(), "--json")
    assert code == 0, err
    drawn = summary_of(out)["inputs_drawn"]
    assert drawn["k"] == {"dtype": "int64", "low": 0, "high": 2, "from": "default"}
    assert drawn["flag"] == {"dtype": "bool", "values": "coin flips"}


def test_the_check_covers_large_and_small_magnitudes_under_the_declared_settings(tmp_path, capsys):
    """Item 5: the written model runs as it declares (ort_config) on six input sets, floats at
    scales 1, 1e3 and 1e-3."""
    code, out, err = optimize(tmp_path, capsys, mlp(), "--json")
    assert code == 0, err
    summary = summary_of(out)
    assert summary["ort_config"] == {"session_options": {"graph_optimization_level": 0}}
    assert summary["check"].endswith(
        "on 6 input sets (seeds [0, 1] at float scales 1, 1000, 0.001)"
    )
    assert summary["inputs_drawn"]["x"]["normal_scales"] == [1.0, 1000.0, 0.001]
    assert np.isfinite(summary["max_abs_err"]) and summary["equivalent"] is True

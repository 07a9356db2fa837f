"""Bad input ends in one line on stderr, no traceback and exit code 2."""

from __future__ import annotations

import subprocess
import sys

import pytest
from onnx import helper

from tests.conftest import make_model


def rlflow(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "rlflow.cli", *args], capture_output=True, text=True, timeout=300
    )


def assert_one_line_error(result: subprocess.CompletedProcess, *needles: str) -> None:
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("rlflow: error:")
    assert "Traceback" not in result.stderr
    for needle in needles:
        assert needle in lines[0]


@pytest.fixture
def bad_files(tmp_path, mlp_model):
    text = tmp_path / "notes.onnx"
    text.write_text("this is not a model\n")
    good = tmp_path / "good.onnx"
    good.write_bytes(mlp_model.SerializeToString())
    truncated = tmp_path / "truncated.onnx"
    truncated.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    dynamic = tmp_path / "dynamic.onnx"
    model = make_model([helper.make_node("Relu", ["x"], ["y"])], [("x", ["batch", 4])], ["y"])
    dynamic.write_bytes(model.SerializeToString())
    return {"text": text, "truncated": truncated, "dynamic": dynamic, "good": good}


def test_missing_path(tmp_path):
    assert_one_line_error(rlflow("inspect", str(tmp_path / "missing.onnx")), "no such file")


def test_non_onnx_file(bad_files):
    assert_one_line_error(rlflow("inspect", str(bad_files["text"])), "not a valid ONNX model")


def test_truncated_onnx_file(bad_files):
    assert_one_line_error(rlflow("inspect", str(bad_files["truncated"])), "not a valid ONNX")


def test_unknown_zoo_name():
    assert_one_line_error(rlflow("inspect", "resnet-1000"), "unknown model", "bert")


def test_dynamic_dims_without_input_shape(bad_files):
    assert_one_line_error(rlflow("inspect", str(bad_files["dynamic"])), "dynamic dims", "x[")
    ok = rlflow("inspect", str(bad_files["dynamic"]), "--input-shape", "x=3x4", "--json")
    assert ok.returncode == 0, ok.stderr
    assert '"y": "float32[3x4]"' in ok.stdout


def test_bad_input_shape_syntax(bad_files):
    result = rlflow("inspect", str(bad_files["dynamic"]), "--input-shape", "x=3by4")
    assert_one_line_error(result, "--input-shape")


@pytest.mark.parametrize("kind", ["missing", "text", "truncated"])
def test_measure_rejects_bad_files(tmp_path, bad_files, kind):
    path = tmp_path / "missing.onnx" if kind == "missing" else bad_files[kind]
    assert_one_line_error(rlflow("measure", str(path)))


def test_measure_vs_itself_is_equivalent(bad_files):
    good = str(bad_files["good"])
    result = rlflow("measure", good, "--vs", good, "--runs", "5", "--json")
    assert result.returncode == 0, result.stderr
    import json

    payload = json.loads(result.stdout.strip().splitlines()[-1])
    assert payload["equivalent"] is True and payload["max_abs_err"] == 0.0
    assert payload["ort_level"] == "all" and payload["threads"] == 1
    assert payload["ratio"] > 0

"""How MODEL is read (`rlflow.zoo.MODEL_RULE`): a path ending in .onnx or with a directory part
is a file; a zoo name is the zoo model even beside a file or directory of that name (which used to
shadow it with "resnet-18 is not a file"); any other name must be an existing file."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from rlflow import zoo
from tests.cli.test_errors import assert_one_line_error


def rlflow_in(folder: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "rlflow.cli", *args],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=folder,
    )


def test_zoo_name_reads_no_disk(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "resnet-18").mkdir()
    assert zoo.zoo_name("resnet-18") == "resnet-18"
    for spec in ("./resnet-18", "resnet-18.onnx", "models/resnet-18", "resnet-1000"):
        assert zoo.zoo_name(spec) is None, spec


def test_a_directory_named_like_a_zoo_model_does_not_shadow_it(tmp_path):
    (tmp_path / "squeezenet-1.1").mkdir()  # e.g. a run directory named after the model
    result = rlflow_in(tmp_path, "inspect", "squeezenet-1.1", "--json")
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    assert Path(summary["path"]) == zoo.cached_path("squeezenet-1.1", "small")
    assert result.stderr == ""


def test_a_file_named_like_a_zoo_model_is_reached_with_a_path(tmp_path):
    (tmp_path / "resnet-18").write_text("my notes\n")
    result = rlflow_in(tmp_path, "inspect", "resnet-18", "--json")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["nodes"] > 0
    assert result.stderr.strip() == (
        "rlflow: MODEL resnet-18 is the zoo model; write ./resnet-18 for the local file"
    )
    assert_one_line_error(rlflow_in(tmp_path, "inspect", "./resnet-18"), "not a valid ONNX")


def test_other_names(tmp_path, mlp_model):
    (tmp_path / "runs").mkdir()
    (tmp_path / "mlp").write_bytes(mlp_model.SerializeToString())  # a model without .onnx
    assert rlflow_in(tmp_path, "inspect", "mlp").returncode == 0
    assert_one_line_error(rlflow_in(tmp_path, "inspect", "runs"), "runs is a directory")
    assert_one_line_error(rlflow_in(tmp_path, "inspect", "gone.onnx"), "no such file: gone.onnx")
    unknown = rlflow_in(tmp_path, "inspect", "resnet-1000")
    assert_one_line_error(unknown, "unknown model 'resnet-1000'", "resnet-18")


@pytest.mark.parametrize("command", ["inspect", "measure", "optimize", "search", "rules"])
def test_help_states_the_rule(command):
    argv = [command, "candidates", "--help"] if command == "rules" else [command, "--help"]
    text = " ".join(rlflow_in(Path.cwd(), *argv).stdout.split())
    assert "./NAME" in text and "zoo name" in text

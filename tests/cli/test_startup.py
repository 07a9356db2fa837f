"""The CLI imports only the command asked for, and torch, torch_geometric and onnxruntime only
once the arguments have been checked: `rlflow zoo list` and the quick errors must not wait
seconds for them. Checked by the modules loaded, not by time (the machine is shared)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

HEAVY = ("torch", "torch_geometric", "onnxruntime", "onnx")

PROBE = f"""
import json, sys
from rlflow.cli import main
code = main(sys.argv[1:])
print(json.dumps({{"code": code, "loaded": [m for m in {HEAVY!r} if m in sys.modules]}}))
"""


def loaded_by(*argv: str) -> tuple[int, set[str]]:
    """Exit code of `rlflow ARGV` in a fresh interpreter, and the heavy modules it loaded."""
    result = subprocess.run(
        [sys.executable, "-c", PROBE, *argv], capture_output=True, text=True, timeout=300
    )
    report = json.loads(result.stdout.strip().splitlines()[-1])
    return report["code"], set(report["loaded"])


def test_zoo_list_loads_nothing_heavy():
    assert loaded_by("zoo", "list", "--json") == (0, set())


@pytest.mark.parametrize(
    "argv",
    [
        ["train-wm", "--data", "{tmp}/missing", "--out", "{tmp}/wm"],
        ["train-controller", "--wm", "{tmp}/missing", "--out", "{tmp}/file"],
        ["train-ppo", "--model", "resnet-18", "--out", "{tmp}/file"],
        ["train-advantage", "--data", "{tmp}/missing", "--out", "{tmp}/adv"],
        ["collect", "--model", "resnet-18", "--out", "{tmp}/file"],
        ["zoo", "export", "resnet-18", "-o", "{tmp}"],
        ["inspect", "{tmp}/missing.onnx"],
    ],
    ids=lambda argv: argv[0] + (f" {argv[1]}" if argv[0] == "zoo" else ""),
)
def test_quick_errors_come_before_torch_and_onnxruntime(tmp_path, argv):
    (tmp_path / "file").write_text("")
    code, loaded = loaded_by(*(word.format(tmp=tmp_path) for word in argv))
    assert code == 2
    assert not loaded & {"torch", "torch_geometric", "onnxruntime"}, loaded


@pytest.mark.parametrize("command", ["optimize", "bench"])
def test_output_errors_of_the_searching_commands_come_before_torch(tmp_path, command):
    target = ["-o", str(tmp_path)] if command == "optimize" else ["--out", str(tmp_path / "f")]
    (tmp_path / "f").write_text("")
    argv = ["resnet-18", *target] if command == "optimize" else ["--models", "resnet-18", *target]
    code, loaded = loaded_by(command, *argv)
    assert code == 2
    assert not loaded & {"torch", "torch_geometric"}, loaded

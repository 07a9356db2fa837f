"""`rlflow search` end to end: the JSON contract, the written model, one-line errors."""

from __future__ import annotations

import json
import subprocess
import sys

from rlflow.cost import check_equivalence
from rlflow.graph import load_model
from rlflow.zoo import cached_path

CONTRACT = (
    "original_ms",
    "optimized_ms",
    "speedup",
    "ort_level",
    "threads",
    "steps",
    "wall_s",
    "max_abs_err",
    "rules_applied",
    "method",
    "expansions",
    "cost_model",
    "model",
    "output",
)


def rlflow(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "rlflow.cli", *args], capture_output=True, text=True, timeout=600
    )


def test_search_json_contract_and_output(tmp_path):
    out = tmp_path / "opt" / "resnet18.onnx"
    result = rlflow(
        "search", "resnet-18", "--method", "taso", "--budget", "10", "--deploy", "online",
        "-o", str(out), "--json",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    missing = [key for key in CONTRACT if key not in summary]
    assert not missing, missing
    assert summary["method"] == "taso" and summary["cost_model"] == "analytic"
    assert summary["model"] == "resnet-18:small" and summary["output"] == str(out)
    assert summary["ort_level"] == "all" and summary["threads"] == 1
    assert summary["expansions"] == 10
    assert summary["steps"] == sum(summary["rules_applied"].values())
    assert summary["speedup"] > 0 and summary["optimized_ms"] > 0
    assert summary["max_abs_err"] >= 0 and summary["equivalent"] is True
    assert "exp" in result.stderr  # the progress bar, on stderr

    written = load_model(out)
    assert written.canonical_hash() == summary["episode"]["final_hash"]
    original = load_model(cached_path("resnet-18", "small"))
    report = check_equivalence(original, written)
    assert report.equivalent, report.reason
    assert [p.name for p in out.parent.iterdir()] == [out.name]  # no temporary left behind


def test_search_human_output(tmp_path):
    out = tmp_path / "sq.onnx"
    result = rlflow(
        "search", "squeezenet-1.1", "--method", "random", "--budget", "5", "--seed", "1",
        "--ort-level", "disable", "-o", str(out),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "speedup" in result.stdout and "ort-level disable" in result.stdout
    assert out.is_file()


def test_bad_model_path_is_one_line_and_exit_2(tmp_path):
    out = tmp_path / "out.onnx"
    result = rlflow("search", str(tmp_path / "missing.onnx"), "--method", "greedy", "-o", str(out))
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("rlflow: error:"), result.stderr
    assert "no such file" in lines[0]
    assert not out.exists()

"""scripts/bench_rule_everywhere.py on a small model: the rule applied at every site (or rules
in turn, from a saved graph), its row printed with the site count; the timings are short and
never asserted on."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import onnx

from rlflow.cost import OrtSettings
from rlflow.cost.ort_optimizer import start_state
from rlflow.graph import load_model
from rlflow.rewrite.rules.nchwc_projection import ProjectionToNchwc
from rlflow.zoo import cached_path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "bench_rule_everywhere.py"


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=600
    )


def test_attention_fused_at_every_layer_of_small_bert():
    result = run("bert", "--size", "small", "--start", "ort:all", "--rule", "attention-fusion")
    assert result.returncode == 0, result.stderr[-2000:]
    lines = result.stdout.splitlines()
    assert lines[0].startswith("`python scripts/bench_rule_everywhere.py bert")
    (row,) = [line for line in lines if line.startswith("| bert:small")]
    cells = [cell.strip() for cell in row.strip("|").split("|")]
    assert cells[1] == "ort:all" and cells[2] == "2"  # two layers, two sites
    assert all(cells[i].endswith("x") for i in (5, 6))


def test_max_sites_stops_a_rule_whose_results_have_sites_again():
    result = run(
        "vit-base",
        "--size",
        "small",
        "--start",
        "ort:all",
        "--rule",
        "slice-hoist",
        "--max-sites",
        "1",
    )
    assert result.returncode == 0, result.stderr[-2000:]
    (row,) = [line for line in result.stdout.splitlines() if line.startswith("| vit-base:small")]
    assert row.split("|")[3].strip() == "1"


def test_a_saved_graph_rewritten_by_two_rules_in_turn(tmp_path):
    """A search's result as the start (a `.onnx` file): the transducer's projections blocked,
    then the ops between them joined; the sites column counts each rule's."""
    original = load_model(cached_path("transformer-transducer", "small"))
    blocked, sites = ProjectionToNchwc().apply_everywhere(
        start_state(original, "ort:all", OrtSettings()).graph
    )
    assert sites
    path = tmp_path / "blocked.onnx"
    onnx.save(blocked.to_onnx(), str(path))
    result = run(
        str(path), "--rule", "nchwc-projection-join", "--rule", "nchwc-conv-activation-fusion"
    )
    assert result.returncode == 0, result.stderr[-2000:]
    (row,) = [line for line in result.stdout.splitlines() if line.startswith("| blocked.onnx")]
    cells = [cell.strip() for cell in row.strip("|").split("|")]
    joins, fusions = (int(count) for count in cells[2].split(" + "))
    assert cells[1] == "the file" and joins > 0 and fusions == joins  # each Relu into its Conv


def test_a_missing_model_file_is_one_line():
    result = run("no/such/model.onnx", "--rule", "nchwc-projection-join")
    assert result.returncode == 1
    assert result.stderr.strip() == "no such model file: no/such/model.onnx"


def test_an_unknown_rule_is_one_line():
    result = run("bert", "--rule", "no-such-rule")
    assert result.returncode == 1 and result.stderr.strip() == "unknown rule 'no-such-rule'"

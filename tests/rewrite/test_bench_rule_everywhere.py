"""scripts/bench_rule_everywhere.py on a small model: the rule applied at every site, its row
printed with the site count; the timings are short and never asserted on."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

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


def test_an_unknown_rule_is_one_line():
    result = run("bert", "--rule", "no-such-rule")
    assert result.returncode == 1 and result.stderr.strip() == "unknown rule 'no-such-rule'"

"""scripts/first_step_values.py on a small model: every offered slot counted under one rule,
gains and losses within the slots, the random step the mean of the rules' means weighted by
their slots; bad input a one-line error."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "first_step_values.py"


def test_every_offered_slot_counted_once_under_its_rule():
    command = [sys.executable, str(SCRIPT), "resnet-18", "--size", "small", "--start", "ort:all"]
    result = subprocess.run(command + ["--json"], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    report = json.loads(result.stdout)
    rules = report["rules"]
    assert report["offered"] > 1 and len(rules) > 1
    assert sum(row["slots"] for row in rules) == report["offered"]
    assert sum(row["gains"] for row in rules) == report["gains"]
    assert sum(row["losses"] for row in rules) == report["losses"]
    assert report["gains"] + report["losses"] <= report["offered"]
    weighted = sum(row["mean_pct"] * row["slots"] for row in rules) / report["offered"]
    assert math.isclose(weighted, report["random_step_pct"], rel_tol=1e-9, abs_tol=1e-9)
    for row in rules:
        assert row["worst_pct"] <= row["mean_pct"] <= row["best_pct"]
    assert [row["slots"] for row in rules] == sorted((row["slots"] for row in rules), reverse=True)


def test_unknown_model_and_bad_options_are_one_line_errors():
    unknown = subprocess.run(
        [sys.executable, str(SCRIPT), "no-such-model"], capture_output=True, text=True
    )
    assert unknown.returncode == 2 and "Traceback" not in unknown.stderr
    assert unknown.stderr.startswith("first_step_values: ")
    assert len(unknown.stderr.strip().splitlines()) == 1
    slots = subprocess.run(
        [sys.executable, str(SCRIPT), "resnet-18", "--max-candidates", "0"],
        capture_output=True,
        text=True,
    )
    assert slots.returncode == 2 and "Traceback" not in slots.stderr
    assert slots.stderr.strip().splitlines()[-1].endswith("--max-candidates must be at least 1")

"""scripts/bench_start_states.py on a small model: every start state timed against the original
under the defaults in each run; the timings are short and never asserted on."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "bench_start_states.py"


def test_every_start_state_is_timed_in_every_run(tmp_path):
    out = tmp_path / "starts.json"
    command = [sys.executable, str(SCRIPT), "squeezenet-1.1", "--size", "small"]
    result = subprocess.run(
        [*command, "--repeats", "2", "--out", str(out)], capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, result.stderr[-2000:]
    lines = result.stdout.splitlines()
    assert [line.split(" (")[0] for line in lines] == ["run 1", "run 2"]
    runs = json.loads(out.read_text())["runs"]
    assert len(runs) == 2
    for run, line in zip(runs, lines, strict=True):
        assert {"original", "ort:all"} <= set(run["speedups"])
        assert all(f"{name} " in line for name in run["speedups"])
        assert all(speedup > 0 for speedup in run["speedups"].values())

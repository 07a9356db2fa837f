"""scripts/plot_gpu_e2e.py on the fifth GPU lease's records (docs/results/gpu-h200-2026-11-27):
one row per search with what it returned and what it wrote timed again, and a PNG."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LEASE = ROOT / "docs" / "results" / "gpu-h200-2026-11-27"


def test_a_row_per_search_and_the_retimings_beside_it(tmp_path):
    png = tmp_path / "e2e.png"
    command = [sys.executable, str(ROOT / "scripts" / "plot_gpu_e2e.py"), str(LEASE)]
    result = subprocess.run([*command, "--png", str(png)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-2000:]
    rows = {line.split(" | ")[0].lstrip("| "): line for line in result.stdout.splitlines()[2:]}
    assert set(rows) == {
        "resnet-18-run1",
        "resnet-18-run2",
        "resnet-18-run3",
        "resnet-50",
        "resnet-18-start (as written)",
    }
    # A search whose confirmation run disagreed returns its start (1.0 against the start).
    assert "| False | - |" in rows["resnet-18-run1"]
    assert rows["resnet-18-run2"].count("x,") == 4  # five re-timings
    assert png.stat().st_size > 10_000

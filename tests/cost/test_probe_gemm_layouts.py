"""scripts/probe_gemm_layouts.py on small shapes: the layouts of a projection compute the
same output and are timed in one comparison against the exported one; the speedups are
printed, never asserted on."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnxruntime as ort

from rlflow.cost import nchwc_block_size

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"


def test_every_layout_timed_against_matmul_add(tmp_path):
    command = [sys.executable, str(SCRIPTS / "probe_gemm_layouts.py")]
    command += ["--shapes", "8x16x32", "3x5x7", "--json"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    report = json.loads(result.stdout)
    assert report["reference"] == "matmul+add"
    assert [row["shape"] for row in report["rows"]] == ["8x16x32", "3x5x7"]
    plain = {"matmul+add", "gemm", "transposed"}
    blocked = {"nchwc-w", "nchwc-h"} if nchwc_block_size() else set()
    # 16 inputs can be blocked where onnxruntime does NCHWc; 5 are not in ReorderInput's fours
    assert set(report["rows"][0]["speedups"]) == plain | blocked
    assert set(report["rows"][1]["speedups"]) == plain
    for row in report["rows"]:
        assert row["speedups"]["matmul+add"] == 1.0
        assert all(value > 0 for value in row["gflops"].values())


def test_the_layouts_compute_the_same_projection():
    sys.path.insert(0, str(SCRIPTS))
    try:
        from probe_gemm_layouts import projection, variants
    finally:
        sys.path.remove(str(SCRIPTS))
    x = np.random.default_rng(2).standard_normal((1, 6, 12), dtype=np.float32)
    outputs = []
    for variant in variants(12):  # 12 inputs: padded to a block in the blocked layouts
        model = projection(variant, 6, 12, 10, np.random.default_rng(0))
        session = ort.InferenceSession(model.SerializeToString())
        outputs.append(session.run(None, {"x": x})[0])
    assert outputs[0].shape == (1, 6, 10)
    for output in outputs[1:]:
        np.testing.assert_allclose(output, outputs[0], rtol=1e-5, atol=1e-5)


def test_a_bad_shape_is_one_line_and_exit_2():
    command = [sys.executable, str(SCRIPTS / "probe_gemm_layouts.py"), "--shapes", "64x1024"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    assert "expected MxKxN" in result.stderr

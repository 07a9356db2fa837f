"""scripts/bench_headroom.py on a small model: each operator type's kernels inside the graph beside
its FLOPs and roofline floor, measured peaks beside the graph; the shares are printed, never
asserted on (they are timings)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import onnx

from rlflow.cost import AnalyticCostModel, MachinePeaks, OrtSettings
from rlflow.cost.inputs import random_inputs
from rlflow.cost.ort_optimizer import start_state
from rlflow.cost.session import kernel_times_ms
from rlflow.cost.source import ModelSource
from rlflow.graph import load_model
from rlflow.zoo import cached_path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "bench_headroom.py"


def test_every_kernel_of_the_graph_is_profiled_by_node_name():
    model = onnx.load(cached_path("squeezenet-1.1", "small"))
    source = ModelSource(model)
    settings = OrtSettings(threads=1, ort_level="disable")
    feeds = random_inputs(source.inputs, source.metadata, 0)
    times = kernel_times_ms(source.model_bytes(), settings, feeds, runs=3, warmup=1)
    convs = {node.name for node in model.graph.node if node.op_type == "Conv"}
    assert convs and convs <= set(times)
    assert set(times) <= {node.name for node in model.graph.node}
    assert all(value > 0 for value in times.values())


def test_a_table_row_per_graph_with_its_operators_flops(tmp_path):
    out = tmp_path / "headroom"
    command = [sys.executable, str(SCRIPT), "--size", "small", "--runs", "3"]
    command += ["--graphs", "squeezenet-1.1:ort:all", "--out", str(out)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    (row,) = json.loads(out.with_suffix(".json").read_text())
    assert row["label"] == "squeezenet-1.1:small ort:all"
    assert row["e2e_ms"] > 0 and row["kernels_ms"] > 0 and row["floor_ms"] > 0
    assert row["peak_gflops"] > 0 and row["peak_gbps"] > 0
    by_type = {op["op_type"]: op for op in row["op_types"]}
    # The FLOPs are the analytic model's, whatever the timings.
    graph = start_state(
        load_model(cached_path("squeezenet-1.1", "small")), "ort:all", OrtSettings()
    ).graph
    report = AnalyticCostModel(peaks=MachinePeaks(gflops=1.0, gbps=1.0)).report(graph)
    assert sum(op["gflop"] for op in row["op_types"]) * 1e9 <= report.flops * (1 + 1e-9)
    assert by_type["Conv"]["gflop"] > 0
    assert out.with_suffix(".png").stat().st_size > 0
    assert "squeezenet-1.1:small ort:all" in out.with_suffix(".md").read_text()


def test_a_bad_graph_name_is_one_line_and_exit_2(tmp_path):
    command = [sys.executable, str(SCRIPT), "--graphs", "resnet-18", "--out", str(tmp_path / "x")]
    result = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0 and "MODEL:STATE" in result.stderr

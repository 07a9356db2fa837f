"""onnxruntime's CUDA execution provider through rlflow's measuring code: equivalence on the
device, the Runner's synchronised timing (a model against itself is level), and a cost table
collected on the GPU and read back. Marked gpu: deselected by default (`-m gpu` runs them) and
skipped where onnxruntime has no CUDAExecutionProvider."""

from __future__ import annotations

import json

import numpy as np
import onnxruntime as ort
import pytest

import rlflow.runtime
from rlflow.cli import main
from rlflow.cost import (
    Deployment,
    OrtSettings,
    PerOpCostModel,
    Runner,
    check_equivalence,
    make_session,
)
from rlflow.cost.session import timed_run
from rlflow.cost.table import TableCostModel, load_table
from rlflow.graph import load_model
from rlflow.search.table_collect import collect_table
from rlflow.zoo import cached_path

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        "CUDAExecutionProvider" not in ort.get_available_providers(),
        reason="onnxruntime here has no CUDAExecutionProvider",
    ),
]
CUDA = OrtSettings(provider="cuda")


def test_sessions_run_on_the_gpu_with_tf32_off(mlp_model):
    session = make_session(mlp_model.SerializeToString(), CUDA)
    assert session.get_providers()[0] == "CUDAExecutionProvider"
    assert session.get_provider_options()["CUDAExecutionProvider"]["use_tf32"] == "0"
    run = timed_run(session, {"x": np.ones((2, 8), dtype=np.float32)})
    assert all(run() > 0 for _ in range(3))


def test_equivalence_on_cuda(linear_models):
    reference = linear_models["matmul_add"]
    report = check_equivalence(reference, linear_models["gemm"], provider="cuda")
    assert report.equivalent, report.reason
    assert not check_equivalence(reference, linear_models["no_bias"], provider="cuda").equivalent


def test_cuda_agrees_with_the_cpu(mlp_model):
    feeds = {"x": np.random.default_rng(0).standard_normal((2, 8)).astype(np.float32)}
    on_cpu = make_session(mlp_model.SerializeToString(), OrtSettings(provider="cpu"))
    on_gpu = make_session(mlp_model.SerializeToString(), CUDA)
    np.testing.assert_allclose(
        on_gpu.run(None, feeds)[0], on_cpu.run(None, feeds)[0], rtol=1e-4, atol=1e-4
    )


def test_runner_self_comparison_is_level(build):
    """Without the wait for the device, a run's time would be its launch time, and the pairs of
    a model against itself would straggle; synchronised, they are level."""
    from onnx import TensorProto, helper

    size = 1024
    node = helper.make_node("MatMul", ["x", "w"], ["y"])
    weights = {"w": np.random.default_rng(0).standard_normal((size, size)).astype(np.float32)}
    model = build(
        [node],
        [("x", TensorProto.FLOAT, [size, size])],
        [("y", TensorProto.FLOAT, [size, size])],
        weights,
    )
    runner = Runner(CUDA)
    comparison = runner.compare([model, model], use_cache=False)
    assert comparison.measurements[0].provider == "cuda"
    assert comparison.ratios[1] == pytest.approx(1.0, abs=0.05)


def test_a_table_collected_on_cuda_round_trips(mlp_model, tmp_path):
    graph = load_model(mlp_model)
    out = tmp_path / "cuda.json"
    table = collect_table(
        [("mlp", graph)], out, settings=CUDA, deploy=Deployment("offline"), steps=1
    )
    loaded = load_table(str(out))
    assert loaded.entries == table.entries and loaded.entries
    assert loaded.meta["provider"] == "cuda" and loaded.meta["device"]
    assert loaded.meta["provider_options"]["use_tf32"] == "0"
    assert TableCostModel(loaded).report(graph).misses == 0
    perop = PerOpCostModel(Deployment("offline").settings(CUDA))
    assert TableCostModel(loaded).cost_ms(graph) == pytest.approx(perop.cost_ms(graph), rel=1e-4)


def test_optimize_on_cuda_hands_back_a_model_that_runs_as_written_there(tmp_path, capsys):
    """Offline on the GPU: ORT's CUDA graphs as start states, the result declares the optimiser
    off and a cuda target, is equivalent on the device, and runs there through rlflow.runtime."""
    out = tmp_path / "r18.onnx"
    argv = ["optimize", "resnet-18", "--provider", "cuda", "--budget", "4", "-o", str(out)]
    code = main([*argv, "--min-time", "0.05", "--json"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    summary = json.loads(captured.out.strip().splitlines()[-1])
    assert summary["target"]["provider"] == "cuda" and summary["equivalent"]
    assert summary["ort_config"] == {"session_options": {"graph_optimization_level": 0}}
    session = rlflow.runtime.InferenceSession(out)
    assert session.get_providers()[0] == "CUDAExecutionProvider"
    feeds = {"image": np.random.default_rng(0).standard_normal((1, 3, 32, 32), "float32")}
    reference = ort.InferenceSession(
        str(cached_path("resnet-18", "small")), providers=["CPUExecutionProvider"]
    )
    np.testing.assert_allclose(
        session.run(None, feeds)[0], reference.run(None, feeds)[0], rtol=1e-3, atol=1e-4
    )


def test_graphs_with_cuda_only_operators_load():
    """onnxruntime's CUDA graphs of the attention models hold BiasSoftmax, which its CPU does
    not implement: the shapes ONNX cannot infer are read off a run on the GPU instead."""
    from onnx import TensorProto, helper

    softmax = helper.make_node(
        "BiasSoftmax", ["x", "b"], ["s"], domain="com.microsoft", axis=-1, is_inner_broadcast=0
    )
    graph = helper.make_graph(
        [softmax, helper.make_node("Relu", ["s"], ["y"])],
        "bias_softmax",
        [helper.make_tensor_value_info(name, TensorProto.FLOAT, [2, 8]) for name in "xb"],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 8])],
    )
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    loaded = load_model(helper.make_model(graph, opset_imports=opsets))
    assert [node.op_type for node in loaded.nodes] == ["BiasSoftmax", "Relu"]


def test_cuda_cache_keys_name_the_gpu():
    """A per-op cache carried from one GPU to another must not hand over its timings."""
    from rlflow.cost.device import gpu_facts

    assert f"gpu={gpu_facts()['device']}" in CUDA.key()


def test_the_rules_on_a_gpu_leave_the_cpus_layouts_out():
    """NCHWc rewrites would send their operators to the CPU, between copies: not offered."""
    from rlflow.rewrite import default_ruleset

    rules = default_ruleset()
    assert len(rules) > 0 and not any(rule.cpu_only for rule in rules)

"""The deployment contract: what an offline model declares, and everything honouring it (the
Runner, the equivalence check, rlflow.runtime, onnxruntime itself); onnxruntime's own graphs as
start states and its knobs as the tuning peer."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import onnx
import onnxruntime as ort
import pytest

import rlflow.runtime
from rlflow.cost import (
    ORT_CONFIG_KEY,
    TARGET_KEY,
    Deployment,
    OrtSettings,
    Runner,
    Target,
    check_equivalence,
    check_target,
    declared_level,
    nchwc_block_size,
)
from rlflow.cost.ort_optimizer import changed_passes, optimized_graph, start_states, tuning_peer
from rlflow.errors import RlflowError
from rlflow.graph import NCHWC_DOMAIN, load_model
from rlflow.zoo import cached_path
from tests.conftest import assert_peer_confirmed

QUICK = {"runs": 5, "min_time_s": 0}


@pytest.fixture(scope="module")
def resnet():
    return load_model(cached_path("resnet-18", "small"))


def declared(graph, block=None, provider="cpu"):
    """`graph` declared offline, tuned for `block` (default: this machine's when it has nchwc)."""
    metadata = Deployment("offline").metadata(provider, {node.domain for node in graph.nodes})
    if block is not None:
        metadata[TARGET_KEY] = Target(provider, block).to_json()
    return graph.with_metadata(metadata)


def test_offline_declares_the_optimiser_off_and_online_declares_nothing(resnet):
    metadata = Deployment("offline").metadata("cpu", {""})
    assert json.loads(metadata[ORT_CONFIG_KEY]) == {
        "session_options": {"graph_optimization_level": 0}
    }
    assert declared_level(metadata) == "disable"
    target = Target.from_json(metadata[TARGET_KEY])
    assert target.provider == "cpu" and target.nchwc_block is None  # no nchwc op inside
    assert Deployment("online").metadata("cpu", {""}) == {}
    assert Deployment("offline").ort_level == "disable" and Deployment("online").ort_level == "all"
    with pytest.raises(RlflowError, match="deploy mode"):
        Deployment("sometimes")
    with pytest.raises(RlflowError, match="unreadable ort_config"):
        declared_level({ORT_CONFIG_KEY: "{not json"})


def test_runner_times_each_graph_under_the_level_it_declares(resnet):
    runner = Runner(OrtSettings(), **QUICK)
    comparison = runner.compare([resnet, declared(resnet)])
    assert [m.ort_level for m in comparison.measurements] == ["all", "disable"]
    assert runner.measure(declared(resnet)).ort_level == "disable"
    knobs = [OrtSettings(), OrtSettings(ort_level="basic"), OrtSettings(disabled=("X",))]
    measured = runner.compare([resnet] * 3, settings=knobs).measurements
    assert [(m.ort_level, m.disabled) for m in measured] == [
        ("all", ()),
        ("basic", ()),
        ("all", ("X",)),
    ]


def test_a_model_tuned_for_another_block_size_is_refused_not_run(resnet, tmp_path):
    here = nchwc_block_size()
    if here is None:
        pytest.skip("onnxruntime here makes no NCHWc graphs")
    state = next(s for s in start_states(resnet, OrtSettings()) if s.name == "ort:all")
    assert any(node.domain == NCHWC_DOMAIN for node in state.graph.nodes)
    assert Target.from_json(state.graph.metadata[TARGET_KEY]).nchwc_block == here
    other = declared(state.graph, block=8 if here == 16 else 16)
    with pytest.raises(RlflowError, match="tuned for NCHWc block"):
        Runner(OrtSettings(), **QUICK).measure(other)
    path = tmp_path / "other.onnx"
    onnx.save(other.to_onnx(), path)
    with pytest.raises(RlflowError, match="this CPU has block"):
        rlflow.runtime.InferenceSession(path)
    assert not check_equivalence(resnet, other).equivalent
    with pytest.raises(RlflowError, match="cannot run on the cuda provider"):
        check_target(state.graph.metadata, "cuda")


def test_runtime_and_onnxruntime_itself_honour_ort_config(resnet, tmp_path):
    path = tmp_path / "declared.onnx"
    onnx.save(declared(resnet).to_onnx(), path)
    session = rlflow.runtime.InferenceSession(path)
    assert session.get_session_options().graph_optimization_level == (
        ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    )
    assert rlflow.runtime.declared(str(path)).ort_level == "disable"
    probe = (
        "import onnxruntime as ort, sys\n"
        "s = ort.InferenceSession(sys.argv[1], providers=['CPUExecutionProvider'])\n"
        "print(int(s.get_session_options().graph_optimization_level))\n"
    )
    env = {**os.environ, "ORT_LOAD_CONFIG_FROM_MODEL": "1"}
    out = subprocess.run(
        [sys.executable, "-c", probe, str(path)], env=env, capture_output=True, text=True
    )
    assert out.stdout.strip() == "0", out.stderr
    with pytest.raises(RlflowError, match="no such file"):
        rlflow.runtime.InferenceSession(tmp_path / "missing.onnx")


def test_onnxruntime_graphs_load_round_trip_and_run_as_written(resnet):
    states = start_states(resnet, OrtSettings())
    names = [state.name for state in states]
    assert names[:2] == ["original", "ort:all"] and len(set(names)) == len(names)
    hashes = {state.graph.canonical_hash() for state in states}
    assert len(hashes) == len(states)  # one state per distinct graph
    for state in states:
        graph = state.graph
        assert declared_level(graph.metadata) == "disable"
        assert all(name in graph.values for node in graph.nodes for name in node.outputs if name)
        again = load_model(graph.to_onnx())
        assert again.canonical_hash() == graph.canonical_hash()
        report = check_equivalence(resnet, graph)
        assert report.equivalent, (state.name, report.reason)


def test_changed_passes_are_read_from_onnxruntime_and_switch_off_by_name(resnet):
    passes = changed_passes(resnet, OrtSettings())
    assert "Level1_RuleBasedTransformer" in passes  # conv + batch-norm folding
    if nchwc_block_size() is not None:
        assert "NchwcTransformer" in passes
        plain = optimized_graph(resnet, OrtSettings(disabled=("NchwcTransformer",)))
        assert not any(node.domain == NCHWC_DOMAIN for node in plain.nodes)


def test_the_tuning_peer_times_every_knob_against_the_default(resnet):
    peer = tuning_peer(resnet, Runner(OrtSettings(), **QUICK))
    assert peer.speedups["all"] == 1.0
    assert {"disable", "basic", "extended"} <= set(peer.speedups)
    assert any(label.startswith("all-") for label in peer.speedups)
    assert_peer_confirmed(peer.knob, peer.speedup, peer.speedups, peer.selected)

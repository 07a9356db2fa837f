"""onnxruntime's optimised graphs as offline mode runs them (the start states of searches): every
operator is timed alone with the optimiser off, fed the blocked shapes it reads, with no
fallback, and every one has a formula in the analytic model."""

from __future__ import annotations

import pytest

from rlflow.cost import OrtSettings, PerOpCostModel, nchwc_block_size
from rlflow.cost.analytic import has_formula
from rlflow.cost.ort_optimizer import StartState, start_states
from rlflow.cost.perop import one_node_model
from rlflow.graph import NCHWC_DOMAIN, load_model
from rlflow.zoo import MODEL_NAMES, cached_path

_STATES: dict[str, list[StartState]] = {}


def _states(name: str) -> list[StartState]:
    """The small zoo model's start states (the original and onnxruntime's graphs), made once."""
    if name not in _STATES:
        _STATES[name] = start_states(load_model(cached_path(name, "small")), OrtSettings())
    return _STATES[name]


@pytest.mark.parametrize("name", ["resnet-18", "bert"])
def test_start_states_are_timed_alone_without_a_fallback(name, tmp_path):
    model = PerOpCostModel(cache_path=tmp_path / "perop.sqlite", runs=2, warmup=1)
    for state in _states(name):
        report = model.report(state.graph)
        assert report.ort_level == "disable"  # declared offline, whatever the model's level
        assert report.fallback_nodes == 0, (state.name, report.fallback_reasons)


def test_nchwc_ops_are_fed_the_blocked_shapes_they_read():
    block = nchwc_block_size()
    if block is None:
        pytest.skip("onnxruntime here makes no NCHWc graphs")
    graph = next(state.graph for state in _states("resnet-18") if state.name == "ort:all")
    seen = set()
    for node in graph.nodes:
        if node.domain != NCHWC_DOMAIN:
            continue
        _, feeds = one_node_model(graph, node)
        output = graph.values[node.outputs[0]].shape
        if node.op_type == "ReorderOutput":
            channels = feeds[node.inputs[0]].shape[1]
            assert channels % block == 0 and 0 <= channels - node.attr("channels") < block
            seen.add("ReorderOutput")
        elif node.op_type == "Conv" and len(node.inputs) > 3:
            assert feeds[node.inputs[3]].shape == output and output[1] % block == 0
            seen.add("Conv with Sum")
        elif node.op_type == "GlobalAveragePool":
            assert feeds[node.inputs[0]].shape[1] % block == 0
            seen.add("GlobalAveragePool")
    assert seen == {"ReorderOutput", "Conv with Sum", "GlobalAveragePool"}


def test_every_operator_of_the_start_states_has_a_formula():
    """No operator of the nine small models or of onnxruntime's graphs of them falls into the
    analytic model's generic fallback (data movement has its own entry)."""
    unmodelled = {
        f"{name} {state.name}: {node.domain}:{node.op_type}"
        for name in MODEL_NAMES
        for state in _states(name)
        for node in state.graph.nodes
        if not has_formula(node.op_type)
    }
    assert not unmodelled

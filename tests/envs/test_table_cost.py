"""The env's `table:PATH` cost: rewards from a cost table's sums (as a learner on a CPU machine
trains on a GPU table), the table's use counted, a bad name refused in one line."""

from __future__ import annotations

import numpy as np
import pytest

from rlflow.cost import OrtSettings, PerOpCostModel
from rlflow.cost.table import CostTable, TableCostModel
from rlflow.envs.graph_rewrite import GraphRewriteEnv
from rlflow.errors import RlflowError
from rlflow.graph import load_model
from rlflow.search.table_collect import TableRecorder


@pytest.fixture
def mlp_table(mlp_model, tmp_path, monkeypatch):
    """(graph, path of a table holding the graph's operators, timed offline on CPU)."""
    monkeypatch.setenv("RLFLOW_CACHE_DIR", str(tmp_path / "cache"))
    settings = OrtSettings(ort_level="disable", provider="cpu")
    perop = PerOpCostModel(settings)
    table = CostTable(
        meta={"provider": "cpu", "device": "test", "ort_level": "disable"},
        overhead_ms=perop.overhead_ms(settings),
    )
    graph = load_model(mlp_model)
    TableRecorder(table, perop).record(graph)
    return graph, table.save(tmp_path / "mlp.json")


def test_rewards_come_from_the_table(mlp_table):
    graph, path = mlp_table
    env = GraphRewriteEnv([graph], cost=f"table:{path}", deploy="offline", max_candidates=16)
    observation, _ = env.reset(seed=0)
    costs = TableCostModel(str(path))
    assert env._cost0 == pytest.approx(costs.cost_ms(graph))
    slot = int(np.flatnonzero(observation["action_mask"][:-1])[0])
    after = env.offered_candidates()[slot].graph
    _, reward, _, _, info = env.step(slot)
    c0, c1 = costs.cost_ms(graph), costs.cost_ms(after)
    assert reward == pytest.approx(100.0 * (c0 - c1) / c0)
    assert info["cost"] == pytest.approx(c1)
    usage = env.table_model.usage()
    assert usage["graphs_costed"] == 2 and usage["table"] == str(path)


def test_a_missing_table_is_one_line(mlp_model):
    with pytest.raises(RlflowError, match="no cost table named 'nonesuch'"):
        GraphRewriteEnv([load_model(mlp_model)], cost="table:nonesuch")
    with pytest.raises(RlflowError, match="table:NAME"):
        GraphRewriteEnv([load_model(mlp_model)], cost="tables")


def test_a_gpu_table_makes_episodes_for_the_gpu(mlp_model):
    """The shipped H200 table on this CPU machine: episodes start from the original, with the
    rules verified on CUDA and none of the CPU's NCHWc layouts."""
    graph = load_model(mlp_model)
    env = GraphRewriteEnv([graph], cost="table:h200", deploy="offline", provider="cpu")
    table = env.table_model.table
    assert table.made_elsewhere("cpu") and not table.made_elsewhere("cuda")
    assert set(env.rule_names) <= set(table.rules)
    assert not any(rule.cpu_only for rule in env.ruleset)
    with pytest.raises(RlflowError, match="onnxruntime's graphs for cuda .* cannot be made"):
        GraphRewriteEnv([graph], cost="table:h200", deploy="offline", start="ort:all")
    with pytest.raises(RlflowError, match="onnxruntime's graphs for cuda .* cannot be made"):
        GraphRewriteEnv(  # rules of the caller's own choosing: the start is checked all the same
            [graph], cost="table:h200", deploy="offline", start="ort:all", ruleset=env.ruleset
        )

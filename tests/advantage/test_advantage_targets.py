"""The advantage model's targets: `collect --candidate-samples` records each sampled candidate's
relative change in the env's cost, which agrees with the env's own rewards and with the
analytic cost recomputed here; the examples are the candidates' k-hop neighbourhoods."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

import rlflow.envs
from rlflow.advantage.model import khop_nodes
from rlflow.advantage.train import AdvantageSettings, examples
from rlflow.cost import AnalyticCostModel
from rlflow.errors import RlflowError
from rlflow.nn.features import GLOBAL_FEATURES
from rlflow.worldmodel.collect import CollectSettings, candidate_targets, prepare
from rlflow.worldmodel.data import RolloutData
from tests.advantage.conftest import MODEL, SAMPLES, tiny_settings


def test_targets_match_the_env_cost_changes_of_the_actions_taken(advantage_data):
    """Where the action taken was one of the sampled candidates, its target must be the change
    the env's reward reports: r_t = 100 (C_{t-1} - C_t) / C_0 with C_{t-1} / C_0 the
    observation's cost_ratio, so (C_t - C_{t-1}) / C_{t-1} = -r_t / (100 cost_ratio)."""
    data = RolloutData.load(advantage_data)
    arrays = data.arrays
    ratio = GLOBAL_FEATURES.index("cost_ratio")
    matched = 0
    for episode in range(data.num_episodes):
        for t in range(int(arrays["episode_steps"][episode])):
            step, obs = data.step_start[episode] + t, data.obs_start[episode] + t
            slots = list(arrays["advantage_slots"][obs])
            if arrays["action"][step] not in slots:
                continue
            target = arrays["advantage_targets"][obs][slots.index(arrays["action"][step])]
            expected = -arrays["reward"][step] / 100.0 / arrays["global_features"][obs][ratio]
            assert target == pytest.approx(expected, rel=1e-4, abs=1e-7)
            matched += 1
    assert matched >= 3, "the seeded tiny data has several such steps"


def test_sampled_changes_are_the_analytic_costs_of_the_rewritten_graphs():
    env = gym.make(rlflow.envs.GRAPH_REWRITE_ID, models=[MODEL], cost="analytic")
    unwrapped = env.unwrapped
    analytic = AnalyticCostModel()
    rng = np.random.default_rng(0)
    observation, _ = env.reset(seed=0)
    checked = 0
    for _ in range(3):  # a few states along an episode
        found = candidate_targets(unwrapped, observation, 5, rng)
        slots, targets = found["advantage_slots"], found["advantage_targets"]
        offered = unwrapped.offered_candidates()
        assert len(set(slots[slots >= 0])) == min(5, len(offered))
        now = analytic.cost_ms(unwrapped.current_graph())
        for slot, target in zip(slots, targets):
            if slot < 0:
                assert np.isnan(target)
                continue
            after = analytic.cost_ms(offered[slot].graph)
            assert target == pytest.approx((after - now) / now, rel=1e-5, abs=1e-7)
            checked += 1
        observation, _, terminated, _, _ = env.step(int(slots[0]))
        if terminated:
            break
    env.close()
    assert checked >= 5


def test_examples_are_the_candidates_neighbourhoods(advantage_data):
    data = RolloutData.load(advantage_data)
    arrays = data.arrays
    found = examples(data, AdvantageSettings(hops=1))
    slots = arrays["advantage_slots"]
    assert len(found.items) == int((slots >= 0).sum()) > 0
    stored = arrays["advantage_targets"][slots >= 0]
    np.testing.assert_allclose(found.targets, np.clip(100 * stored, -100, 100), rtol=1e-6)

    obs = int(np.flatnonzero((slots >= 0).any(axis=1))[0])
    slot = int(slots[obs][0])
    graph = data.graph(obs)
    site = arrays["candidate_sites"][obs, slot]
    site = site[site >= 0]
    item = found.items[0]
    local = item.site[0][item.site[0] >= 0].numpy()
    np.testing.assert_array_equal(item.x[local].numpy(), graph["node_features"][site])
    assert int(item.rule) == int(arrays["candidate_rules"][obs, slot])
    nodes = khop_nodes(len(graph["node_features"]), graph["edge_index"], site, 1)
    assert item.num_nodes == len(nodes) < len(graph["node_features"])


def test_khop_nodes_follow_edges_both_ways():
    chain = np.array([[0, 1, 2, 3, 5], [1, 2, 3, 4, 6]])  # 0->1->2->3->4, 5->6 apart
    assert khop_nodes(7, chain, [2], 0).tolist() == [2]
    assert khop_nodes(7, chain, [2], 1).tolist() == [1, 2, 3]
    assert khop_nodes(7, chain, [2], 2).tolist() == [0, 1, 2, 3, 4]
    assert khop_nodes(7, chain, [2, 6], 1).tolist() == [1, 2, 3, 5, 6]
    assert khop_nodes(7, chain, [2], 9).tolist() == [0, 1, 2, 3, 4]


def test_directories_collected_before_candidate_samples_still_match():
    assert "candidate_samples" not in CollectSettings(models=[MODEL]).identity()
    assert tiny_settings().identity()["candidate_samples"] == SAMPLES


def test_candidate_samples_need_a_cost_model(tmp_path):
    with pytest.raises(RlflowError, match="--cost analytic or perop"):
        prepare(tiny_settings(cost="e2e"), tmp_path / "data")
    with pytest.raises(RlflowError, match="at least 0"):
        prepare(tiny_settings(candidate_samples=-1), tmp_path / "data")
    assert not (tmp_path / "data").exists()

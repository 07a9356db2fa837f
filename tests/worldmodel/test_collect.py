"""Collect: shards round-trip the env's observations, a rerun resumes without rewriting a
finished shard, workers give the same shards, and settings are pinned per directory."""

from __future__ import annotations

import hashlib
import json
from dataclasses import replace

import gymnasium as gym
import numpy as np
import pytest

import rlflow.envs
from rlflow.errors import RlflowError
from rlflow.worldmodel.collect import CollectSettings, RandomPolicy, collect, load_policy
from rlflow.worldmodel.data import (
    EpisodeRecord,
    RolloutData,
    observation_record,
    read_shard,
    step_record,
    write_shard,
)

MODEL = "resnet-18"


def shard_state(data_dir):
    return {
        path.name: (path.stat().st_mtime_ns, path.stat().st_ino, _digest(path))
        for path in sorted(data_dir.glob("shard-*.npz"))
    }


def _digest(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_shards_round_trip_the_padded_observations(tmp_path):
    env = gym.make(rlflow.envs.GRAPH_REWRITE_ID, models=[MODEL], max_nodes=64, max_edges=128)
    num_rules = len(env.unwrapped.rule_names)
    rng = np.random.default_rng(0)
    policy = RandomPolicy(0.0)
    observation, _ = env.reset(seed=0)
    seen = [observation]
    record = EpisodeRecord(model=0, observations=[observation_record(observation, num_rules, 0)])
    for _ in range(3):
        action = policy.act(observation, rng=rng)
        following, reward, terminated, truncated, _ = env.step(action)
        nxt = observation_record(following, num_rules, 0)
        record.steps.append(
            step_record(observation, action, reward, terminated, truncated, nxt, num_rules)
        )
        record.observations.append(nxt)
        seen.append(following)
        observation = following
        if terminated or truncated:
            break
    env.close()
    path = tmp_path / "shard-00000.npz"
    write_shard(path, [record], {"index": 0})
    arrays, meta = read_shard(path)
    assert meta == {"index": 0}
    manifest = {
        "kind": "rollouts",
        "rule_names": list(env.unwrapped.rule_names),
        "env": {"max_nodes": 64, "max_edges": 128},
        "shards": {path.name: {"episodes": 1}},
    }
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    data = RolloutData.load(tmp_path)
    assert data.num_observations == len(seen) and data.num_steps == len(seen) - 1
    for index, expected in enumerate(seen):
        restored = data.observation(index)
        assert restored.keys() == expected.keys()
        for key in expected:
            np.testing.assert_array_equal(restored[key], expected[key], err_msg=key)
    step = data.arrays
    np.testing.assert_array_equal(step["next_action_mask"], step["action_mask"][1:].astype(bool))
    rules = step["action_rule"]
    assert all(rules[t] == seen[t]["candidate_rules"][step["action"][t]] for t in range(len(rules)))


def test_rerun_resumes_and_never_rewrites_a_finished_shard(tmp_path):
    out = tmp_path / "data"
    settings = CollectSettings(models=[MODEL], episodes=4, episodes_per_shard=2)
    first = collect(settings, out, progress=False)
    before = shard_state(out)
    assert list(before) == ["shard-00000.npz", "shard-00001.npz"]
    again = collect(settings, out, progress=False)
    assert shard_state(out) == before
    assert again["totals"] == first["totals"]
    # asking for more adds shards after the finished ones, which stay as they were
    more = collect(
        CollectSettings(models=[MODEL], episodes=7, episodes_per_shard=2), out, progress=False
    )
    after = shard_state(out)
    assert {name: after[name] for name in before} == before
    assert sorted(after) == [f"shard-{i:05d}.npz" for i in range(4)]
    assert more["totals"]["episodes"] == 7
    assert RolloutData.load(out).num_episodes == 7


def test_a_shard_written_before_a_kill_is_adopted_not_redone(tmp_path):
    out = tmp_path / "data"
    settings = CollectSettings(models=[MODEL], episodes=2, episodes_per_shard=1)
    collect(settings, out, progress=False)
    manifest = json.loads((out / "manifest.json").read_text())
    del manifest["shards"]["shard-00001.npz"]  # as if killed between shard and manifest
    (out / "manifest.json").write_text(json.dumps(manifest))
    before = shard_state(out)
    adopted = collect(settings, out, progress=False)
    assert shard_state(out) == before
    assert adopted["totals"]["episodes"] == 2


@pytest.mark.slow  # two spawned processes each import torch: tens of seconds on a busy CPU
def test_workers_give_the_same_shards_as_one_process(tmp_path):
    settings = CollectSettings(models=[MODEL], episodes=2, episodes_per_shard=1, seed=5)
    collect(settings, tmp_path / "one", progress=False)
    collect(settings, tmp_path / "two", workers=2, progress=False)
    for name in ("shard-00000.npz", "shard-00001.npz"):
        one, _ = read_shard(tmp_path / "one" / name)
        two, _ = read_shard(tmp_path / "two" / name)
        for key in one:
            np.testing.assert_array_equal(one[key], two[key], err_msg=key)


def test_other_settings_refuse_the_directory(tmp_path):
    out = tmp_path / "data"
    collect(CollectSettings(models=[MODEL], episodes=1), out, progress=False)
    with pytest.raises(RlflowError, match="other settings.*seed"):
        collect(CollectSettings(models=[MODEL], episodes=1, seed=1), out, progress=False)
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / "notes.txt").write_text("x")
    with pytest.raises(RlflowError, match="non-empty directory"):
        collect(CollectSettings(models=[MODEL], episodes=1), tmp_path / "junk", progress=False)


def test_random_policy_is_rlflows_random_agent():
    mask = np.array([1, 0, 1, 0, 1], dtype=np.int8)  # slots 0 and 2 offered, 4 is stop
    rng = np.random.default_rng(0)
    draws = [RandomPolicy(0.2).act({"action_mask": mask}, rng=rng) for _ in range(2000)]
    counts = np.bincount(draws, minlength=5)
    assert counts[1] == counts[3] == 0
    assert 0.15 < counts[4] / 2000 < 0.25
    assert abs(counts[0] - counts[2]) < 150
    assert RandomPolicy(0.0).act({"action_mask": np.array([0, 0, 1])}, rng=rng) == 2


def test_rule_balanced_random_policy_draws_rules_evenly():
    # rule 7 has one candidate, rule 3 has four: uniform over rules, each half the draws
    mask = np.array([1, 1, 1, 1, 1, 0, 1], dtype=np.int8)
    rules = np.array([3, 3, 7, 3, 3, -1])
    observation = {"action_mask": mask, "candidate_rules": rules}
    rng = np.random.default_rng(0)
    policy = load_policy("random-rule", 0.0)
    draws = np.bincount([policy.act(observation, rng=rng) for _ in range(4000)], minlength=7)
    assert draws[5] == draws[6] == 0  # not offered; never stops with stop probability 0
    assert 1800 < draws[2] < 2200  # the one-site rule: half, not a fifth
    assert max(draws[[0, 1, 3, 4]]) - min(draws[[0, 1, 3, 4]]) < 200


def test_rule_repeat_draws_runs_of_one_rule_and_starts_afresh_each_episode():
    """--rule-repeat P: the last rule again with chance P while it is offered (runs of
    1/(1-P) on average), a new draw when it is not, and none carried into a new episode."""
    mask = np.array([1, 1, 1, 1, 0, 1], dtype=np.int8)
    rules = np.array([0, 1, 2, 3, -1])
    observation = {"action_mask": mask, "candidate_rules": rules}
    rng = np.random.default_rng(0)

    def mean_run(policy):
        draws = [int(policy.act(observation, rng=rng)) for _ in range(4000)]
        changes = sum(a != b for a, b in zip(draws, draws[1:], strict=False))
        return len(draws) / (changes + 1)

    # uniform over 4 rules: a run ends with chance 3/4 (mean 4/3); with repeats 0.8 the chance
    # is 0.2 * 3/4 (mean 6.7)
    assert 1.2 < mean_run(load_policy("random-rule", 0.0)) < 1.5
    assert 5.5 < mean_run(load_policy("random-rule", 0.0, rule_repeat=0.8)) < 8.0
    policy = load_policy("random-rule", 0.0, rule_repeat=0.99)
    first = policy.act(observation, rng=rng)
    gone = {**observation, "action_mask": np.where(np.arange(6) == first, 0, mask)}
    assert policy.act(gone, rng=rng) != first  # no longer offered: drawn afresh
    policy.reset()
    assert policy.last_rule is None


@pytest.mark.parametrize(
    ("spec", "repeat"), [("random", 0.5), ("agent:runs/x", 0.5), ("random-rule", 1.0)]
)
def test_rule_repeat_is_refused_where_it_means_nothing(spec, repeat):
    with pytest.raises(RlflowError, match="rule-repeat"):
        load_policy(spec, 0.2, rule_repeat=repeat)


def test_collect_with_rule_repeat_records_runs_of_one_rule(tmp_path):
    """A real collect: the data's episodes apply one rule several times in a row, and the
    setting is part of the directory's identity (a rerun without it is refused)."""
    settings = CollectSettings(
        models=[MODEL],
        episodes=2,
        policy="random-rule",
        stop_probability=0.0,
        rule_repeat=0.9,
        max_episode_steps=12,
        episodes_per_shard=2,
        seed=3,
    )
    manifest = collect(settings, tmp_path / "data", progress=False)
    assert manifest["settings"]["rule_repeat"] == 0.9
    arrays, _ = read_shard(tmp_path / "data" / sorted(manifest["shards"])[0])
    taken = arrays["action_rule"]
    assert np.mean(taken[1:] == taken[:-1]) > 0.5  # uniform over its rules: far fewer repeats
    with pytest.raises(RlflowError, match="rule_repeat"):
        collect(replace(settings, rule_repeat=0.0), tmp_path / "data", progress=False)


def test_cheapest_site_policy_takes_the_sites_a_controller_would():
    """random-rule-cheapest: a rule drawn uniformly, then its site with the lowest cost by the
    env's own estimate (here, an analytic env, the analytic cost), the controller's own choice,
    so the data prices a rule where controllers apply it."""
    from rlflow.cost import AnalyticCostModel

    env = gym.make(rlflow.envs.GRAPH_REWRITE_ID, models=[MODEL], cost="analytic", max_candidates=64)
    observation, _ = env.reset(seed=0)
    base = env.unwrapped
    offered = base.offered_candidates()
    rules = np.asarray(observation["candidate_rules"])[: len(offered)]
    analytic = AnalyticCostModel()
    cheapest = {}
    for slot, candidate in enumerate(offered):
        cost = analytic.cost_ms(candidate.graph)
        if rules[slot] not in cheapest or cost < cheapest[rules[slot]][1]:
            cheapest[rules[slot]] = (slot, cost)
    policy = load_policy("random-rule-cheapest", 0.0)
    rng = np.random.default_rng(0)
    taken = {policy.act(observation, rng=rng, env=base) for _ in range(200)}
    assert taken == {slot for slot, _ in cheapest.values()}  # every rule, at its cheapest site
    assert sum(np.bincount(rules) > 1) > 0  # some rule had several sites to choose from
    env.close()


def test_cheapest_site_is_the_envs_per_op_cheapest_offline():
    """Offline the env prices graphs per op, and the site choice follows that cost, not the
    analytic one (which on ResNet-50 took an unblocking that loses where another gains)."""
    env = gym.make(
        rlflow.envs.GRAPH_REWRITE_ID, models=[MODEL], deploy="offline", max_candidates=64
    )
    observation, _ = env.reset(seed=0)
    base = env.unwrapped
    assert base.cost == "perop"
    offered = base.offered_candidates()
    rules = np.asarray(observation["candidate_rules"])[: len(offered)]
    cheapest = {}
    for slot, candidate in enumerate(offered):
        cost = base.perop_model.cost_ms(candidate.graph)
        assert base.estimated_cost(candidate.graph) == cost
        if rules[slot] not in cheapest or cost < cheapest[rules[slot]][1]:
            cheapest[rules[slot]] = (slot, cost)
    policy = load_policy("random-rule-cheapest", 0.0)
    rng = np.random.default_rng(0)
    taken = {policy.act(observation, rng=rng, env=env) for _ in range(200)}  # wrapped env too
    assert taken == {slot for slot, _ in cheapest.values()}
    env.close()


def test_collect_takes_the_envs_candidate_slots(tmp_path):
    """`--max-candidates`: the env's slots, in the data's env settings (the world model's
    controller acts in an env made from them) and in the width of the recorded arrays."""
    from rlflow.cli import main

    out = tmp_path / "data"
    flags = ["--model", MODEL, "--episodes", "2", "--episodes-per-shard", "2"]
    assert main(["collect", *flags, "--max-candidates", "8", "--out", str(out), "--quiet"]) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["env"]["max_candidates"] == 8
    shard = np.load(out / sorted(manifest["shards"])[0])
    assert shard["candidate_rules"].shape[1] == 8 and shard["action_mask"].shape[1] == 9


@pytest.mark.parametrize("spec", ["greedy", "ppo", "ppo:", "random:x"])
def test_bad_policy_specs(spec):
    with pytest.raises(RlflowError, match="bad --policy"):
        load_policy(spec)


def test_missing_policy_run_dir(tmp_path):
    with pytest.raises(RlflowError, match="no such agent run directory"):
        load_policy(f"ppo:{tmp_path / 'missing'}")


def test_a_deleted_shard_is_collected_again(tmp_path):
    out = tmp_path / "data"
    settings = CollectSettings(models=[MODEL], episodes=3, episodes_per_shard=1)
    collect(settings, out, progress=False)
    (out / "shard-00001.npz").unlink()
    kept = shard_state(out)
    with pytest.raises(RlflowError, match="shard-00001.npz is missing"):
        RolloutData.load(out)
    manifest = collect(settings, out, progress=False)
    assert manifest["totals"]["episodes"] == 3
    after = shard_state(out)
    assert {name: after[name] for name in kept} == kept
    assert sorted(after) == ["shard-00000.npz", "shard-00002.npz", "shard-00003.npz"]
    assert RolloutData.load(out).num_episodes == 3


def test_collect_runs_offline_from_the_start_state_it_is_given(tmp_path):
    """As train-ppo: graphs run as written (offline) by default, episodes begin at `start`
    (onnxruntime's graph here), and both pin the directory."""
    settings = CollectSettings(
        models=[MODEL], episodes=1, cost="analytic", start="ort:all", max_episode_steps=2
    )
    manifest = collect(settings, tmp_path / "ort", progress=False)
    assert manifest["settings"]["deploy"] == "offline"
    assert manifest["settings"]["start"] == "ort:all"
    env = gym.make(
        rlflow.envs.GRAPH_REWRITE_ID,
        models=[MODEL],
        cost="analytic",
        deploy="offline",
        start="ort:all",
    )
    observation, _ = env.reset(seed=0)
    env.close()
    arrays, _ = read_shard(tmp_path / "ort" / "shard-00000.npz")
    first = int(arrays["num_nodes"][0])
    assert first == int(observation["node_mask"].sum())
    original = CollectSettings(models=[MODEL], episodes=1, cost="analytic", max_episode_steps=2)
    collect(original, tmp_path / "original", progress=False)
    arrays, _ = read_shard(tmp_path / "original" / "shard-00000.npz")
    assert int(arrays["num_nodes"][0]) > first  # onnxruntime's graph fused operators away
    with pytest.raises(RlflowError, match="other settings.*deploy"):
        collect(replace(original, deploy="online"), tmp_path / "original", progress=False)
    with pytest.raises(RlflowError, match="unknown deploy mode"):
        collect(replace(original, deploy="sideways"), tmp_path / "bad", progress=False)
    with pytest.raises(RlflowError, match="unknown start state"):
        collect(replace(original, start="ort:bogus"), tmp_path / "bad", progress=False)
    assert not (tmp_path / "bad").exists()  # refused before anything was written

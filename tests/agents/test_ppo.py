"""PPO on GraphRewrite-v0: it learns, it resumes, it logs what STYLE.md names."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import yaml
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from rlflow.agents.evaluate import policy_rollouts
from rlflow.agents.policy import Policy, PPOPolicy, load_ppo_policy
from rlflow.agents.ppo import CHECKPOINT, PPOConfig, load_checkpoint, make_scorer, train
from rlflow.config import CONFIGS, read_yaml
from rlflow.cost import AnalyticCostModel
from rlflow.envs.graph_rewrite import _default_rules
from rlflow.errors import RlflowError
from rlflow.rewrite.session import RewriteSession

TAGS = (
    "charts/episodic_return",
    "charts/speedup",
    "charts/SPS",
    "losses/value_loss",
    "losses/policy_loss",
    "losses/entropy",
    "losses/approx_kl",
    "losses/clipfrac",
)


def tiny_config(**overrides) -> PPOConfig:
    """Short episodes on resnet-18 (small): a handful of candidates, a small network; the
    analytic ablation online (no measurement: fast, and the same in CI as here)."""
    values = dict(
        models=["resnet-18"],
        cost="analytic",
        deploy="online",
        total_steps=20,
        max_candidates=4,
        horizon=5,
        episodes_per_update=2,
        hidden=16,
        layers=1,
        heads=2,
    )
    values.update(overrides)
    return PPOConfig(**values)


def analytic_return(session) -> float:
    """The episode's return in the env's analytic terms: % of the original cost saved."""
    model = AnalyticCostModel()
    original = model.cost_ms(session.original)
    return 100.0 * (original - model.cost_ms(session.graph)) / original


def scalars(run_dir) -> dict[str, list[int]]:
    accumulator = EventAccumulator(str(run_dir), size_guidance={"scalars": 0})
    accumulator.Reload()
    tags = accumulator.Tags()["scalars"]
    return {tag: [event.step for event in accumulator.Scalars(tag)] for tag in tags}


def test_training_raises_the_return_above_the_untrained_policy(tmp_path) -> None:
    # The portable rules: an action space a 400-step budget can learn (the NCHWc layout rules
    # pay only in chains of several steps, which real budgets learn: docs/BENCHMARKS.md). At
    # 200 steps, since the env spreads a rule's slots over its sites (8 slots now offer other
    # batch-norm folds than the first ones), the greedy episode of every seed tried stops.
    config = PPOConfig(
        models=["resnet-18"],
        total_steps=400,
        max_candidates=8,
        horizon=8,
        episodes_per_update=4,
        hidden=32,
        layers=2,
        seed=0,
        portable=True,
        cost="analytic",
        deploy="online",
    )
    torch.manual_seed(config.seed)
    rule_names = _default_rules(config.portable).names
    untrained = PPOPolicy(make_scorer(config, len(rule_names)), config.env_kwargs(), rule_names)
    train(config, tmp_path, progress=False)
    trained = load_ppo_policy(tmp_path)

    before = [analytic_return(s) for s in policy_rollouts(untrained, "resnet-18", episodes=10)]
    after = [analytic_return(s) for s in policy_rollouts(trained, "resnet-18", episodes=10)]
    # Seeded: untrained about -17 % of the cost saved on average (it makes the graph slower),
    # trained about +2 % (seeds 0 and 1: +2.2 and +2.3 %, the greedy episode +2.9 and +3.6 %);
    # its sampled episodes still stray, so the mean is compared,
    # and the greedy episode (rollout 0, the one an agent hands back) must make the graph faster.
    assert np.mean(after) > np.mean(before) + 3.0, (before, after)
    assert after[0] > 0.0, after


def test_run_dir_contents_and_tensorboard_tags(tmp_path) -> None:
    summary = train(tiny_config(), tmp_path, progress=False)
    assert summary["global_step"] == 20 and not summary["resumed"]
    config = yaml.safe_load((tmp_path / "config.yaml").read_text())
    assert config["kind"] == "ppo"
    for key in ("models", "size", "cost", "max_nodes", "max_edges", "max_candidates"):
        assert key in config
    assert config["max_site_nodes"] == 4 and config["portable"] is False
    assert config["scorer"] == "local" and config["models"] == ["resnet-18"]
    assert load_checkpoint(tmp_path)["global_step"] == 20

    found = scalars(tmp_path)
    missing = [tag for tag in TAGS if tag not in found]
    assert not missing, missing
    assert found["charts/SPS"][-1] == 20

    accumulator = EventAccumulator(str(tmp_path), size_guidance={"tensors": 0})
    accumulator.Reload()
    assert any("hyperparameters" in tag for tag in accumulator.Tags()["tensors"])

    progress = json.loads((tmp_path / "progress.json").read_text())
    assert progress["global_step"] == 20 and progress["real_measurements"] == 0
    steps = [episode["global_step"] for episode in progress["episodes"]]
    assert steps == sorted(steps) and steps[-1] <= 20
    assert {"return", "speedup", "real_measurements", "model", "revisits"} <= set(
        progress["episodes"][0]
    )


def test_rerun_resumes_and_continues_the_step_count(tmp_path) -> None:
    train(tiny_config(total_steps=20), tmp_path, progress=False)
    first = json.loads((tmp_path / "progress.json").read_text())
    # A killed run may have written progress past its last checkpoint: the rerun trims it.
    ahead = {**first, "episodes": [*first["episodes"], {"global_step": 999, "return": 1.0}]}
    (tmp_path / "progress.json").write_text(json.dumps(ahead))

    summary = train(tiny_config(total_steps=40), tmp_path, progress=False)
    assert summary["resumed"] and summary["global_step"] == 40
    assert load_checkpoint(tmp_path)["global_step"] == 40
    progress = json.loads((tmp_path / "progress.json").read_text())
    assert progress["episodes"][: len(first["episodes"])] == first["episodes"]
    steps = [episode["global_step"] for episode in progress["episodes"]]
    assert steps == sorted(steps) and 999 not in steps and steps[-1] > 20
    assert [update["global_step"] for update in progress["updates"]][-1] == 40
    # TensorBoard: one curve continuing past step 20, no second start from 0
    value_steps = scalars(tmp_path)["losses/value_loss"]
    assert value_steps == sorted(set(value_steps)) and value_steps[-1] == 40
    assert 20 in value_steps and min(value_steps) < 20

    finished = train(tiny_config(total_steps=40), tmp_path, progress=False)
    assert finished["global_step"] == 40  # nothing left to do

    with pytest.raises(RlflowError, match=r"other settings \(hidden 16 -> 32\)"):
        train(tiny_config(total_steps=60, hidden=32), tmp_path, progress=False)


def test_full_scorer_trains_and_rolls_out(tmp_path) -> None:
    train(tiny_config(scorer="full", total_steps=10), tmp_path, progress=False)
    policy = load_ppo_policy(tmp_path)
    assert isinstance(policy, Policy) and policy.scorer.mode == "full"
    sessions = policy_rollouts(policy, "resnet-18", episodes=2, seed=3)
    assert len(sessions) == 2 and all(len(s.actions) <= 5 for s in sessions)


def test_policy_rollouts_greedy_first_then_sampled(tmp_path) -> None:
    train(tiny_config(total_steps=10), tmp_path, progress=False)
    policy = load_ppo_policy(tmp_path)
    assert policy.env_config["max_candidates"] == 4 and "models" not in policy.env_config
    first = policy_rollouts(policy, "resnet-18", episodes=3, seed=0)
    second = policy_rollouts(policy, "resnet-18", episodes=3, seed=0)
    assert [s.state().to_json() for s in first] == [s.state().to_json() for s in second]
    # a zero-shot model, with another candidate count: the policy does not depend on it
    other = policy_rollouts(
        policy, "squeezenet-1.1", episodes=1, env_overrides={"max_candidates": 8}
    )
    assert other[0].model == "squeezenet-1.1"
    with pytest.raises(RlflowError, match="episodes"):
        policy_rollouts(policy, "resnet-18", episodes=0)


def test_load_ppo_policy_errors(tmp_path) -> None:
    with pytest.raises(RlflowError, match="no PPO checkpoint"):
        load_ppo_policy(tmp_path)
    path = tmp_path / CHECKPOINT
    path.parent.mkdir(parents=True)
    path.write_bytes(b"not a checkpoint")
    with pytest.raises(RlflowError, match="cannot read checkpoint"):
        load_ppo_policy(tmp_path)
    torch.save({"kind": "something else"}, path)
    with pytest.raises(RlflowError, match="not an rlflow PPO checkpoint"):
        load_ppo_policy(tmp_path)


def test_configs_ppo_yaml_mirrors_the_config_defaults() -> None:
    assert read_yaml(CONFIGS / "ppo.yaml") == PPOConfig().to_dict()


def test_agent_rollouts_keep_the_cheapest_graph_passed(tmp_path) -> None:
    """An episode that passes a cheaper graph than the one it ends on hands that graph back
    too (by the env's cost): each graph of the path is priced again here to check which."""
    from rlflow.agents.evaluate import agent_rollouts
    from rlflow.cost import AnalyticCostModel
    from rlflow.worldmodel.collect import RandomPolicy

    policy = RandomPolicy(stop_probability=0.0)
    policy.env_config = {"cost": "analytic", "horizon": 8}
    rollouts = agent_rollouts(policy, "resnet-18", episodes=6, seed=1)
    analytic = AnalyticCostModel()
    kept = 0
    for rollout in rollouts:
        final = rollout.final
        path: list[float] = []  # the cost after each step
        RewriteSession.replay(
            final.original,
            final.state(),
            final.ruleset,
            on_step=lambda session, path=path: path.append(analytic.cost_ms(session.graph)),
        )
        passed = path[:-1]
        if passed and min(passed) < path[-1]:
            kept += 1
            assert rollout.best is not None
            assert len(rollout.best.actions) == int(np.argmin(passed)) + 1
            assert rollout.best.actions == final.actions[: len(rollout.best.actions)]
            assert rollout.sessions == [final, rollout.best]
        else:
            assert rollout.best is None and rollout.sessions == [final]
    assert kept  # the random walk overshot at least once


def test_agent_rollouts_run_to_the_policys_own_episode_limit() -> None:
    """A controller whose data was collected with a longer episode limit than the env's default
    (50 steps) acts under that limit in `rlflow optimize` and `bench` too, not under 50."""
    from rlflow.agents.evaluate import agent_rollouts
    from rlflow.worldmodel.collect import RandomPolicy

    policy = RandomPolicy(stop_probability=0.0)
    policy.env_config = {"cost": "analytic"}
    policy.max_episode_steps = 60
    lengths = [len(r.final.actions) for r in agent_rollouts(policy, "resnet-18", episodes=2)]
    assert max(lengths) > 50 and max(lengths) <= 60, lengths

"""Behaviour cloning from recorded episodes: a PPO run that starts on a search's path."""

from __future__ import annotations

import json

import gymnasium as gym
import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

import rlflow.envs  # noqa: F401  (registers rlflow/GraphRewrite-v0)
from rlflow.agents.demos import clone, fit, read_demos, walk_demos
from rlflow.agents.evaluate import agent_rollouts
from rlflow.agents.policy import PPOPolicy
from rlflow.agents.ppo import PPOConfig, load_checkpoint, make_env, make_scorer, train
from rlflow.envs import GRAPH_REWRITE_ID
from rlflow.errors import RlflowError
from tests.agents.test_ppo import scalars, tiny_config


def record_walk(path, steps: int, seed: int = 3) -> list[tuple[str, tuple]]:
    """A random walk of `steps` rewrites on resnet-18 (small) in `tiny_config`'s env, written as
    `rlflow optimize --json` records its episode; returns its (rule, site) steps."""
    options = dict(cost="analytic", deploy="online", max_candidates=4, horizon=5)
    env = gym.make(GRAPH_REWRITE_ID, models=["resnet-18"], disable_env_checker=True, **options)
    env.reset(seed=seed)
    generator = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        offered = len(env.unwrapped.offered_candidates())
        env.step(int(torch.randint(offered, (1,), generator=generator)))
    state = env.unwrapped.episode_state()
    env.close()
    path.write_text(json.dumps({"episode": state.to_json(), "start_state": "original"}))
    return [(action.rule, tuple(action.site)) for action in state.actions]


def test_cloned_policy_walks_the_demonstrated_path_and_stops(tmp_path) -> None:
    demo = tmp_path / "walk.json"
    walked = record_walk(demo, steps=3)
    config = tiny_config(demos=[str(demo)], seed=1)
    env = make_env(config)
    rule_names = list(env.unwrapped.rule_names)
    scorer = make_scorer(config, len(rule_names))
    demos = walk_demos(env, read_demos(config.demos), scorer, gamma=config.gamma)
    env.close()
    # three rewrites, then the stop the walk ended with
    assert (demos.recorded_steps, demos.kept_steps, len(demos)) == (3, 3, 4)
    assert demos.actions[-1] == config.max_candidates
    before, _ = fit(scorer, demos)
    stats = clone(
        scorer, demos, epochs=100, learning_rate=0.01, minibatch_size=16, vf_coef=0.5, seed=0
    )
    assert stats["accuracy"] == 1.0 and before < 1.0, (before, stats)
    policy = PPOPolicy(scorer, config.env_kwargs(), rule_names)
    greedy = agent_rollouts(policy, "resnet-18", episodes=1)[0].final
    assert [(action.rule, tuple(action.site)) for action in greedy.actions] == walked


def test_fresh_run_imitates_its_demos_and_says_how_well(tmp_path) -> None:
    demo = tmp_path / "walk.json"
    record_walk(demo, steps=3)
    config = tiny_config(demos=[str(demo)], learning_rate=0.01, seed=1)
    train(config, tmp_path / "run", progress=False)
    progress = json.loads((tmp_path / "run" / "progress.json").read_text())
    assert progress["demos"]["files"] == [str(demo)]
    assert progress["demos"]["states"] == 4 and progress["demos"]["accuracy"] == 1.0
    assert "demos/accuracy" in scalars(tmp_path / "run")
    # a rerun continues the run; it does not imitate again
    config.total_steps = 40
    train(config, tmp_path / "run", progress=False)
    resumed = json.loads((tmp_path / "run" / "progress.json").read_text())
    assert resumed["global_step"] == 40 and resumed["demos"] == progress["demos"]


def test_demo_coef_keeps_imitating_with_a_fading_weight(tmp_path) -> None:
    """With demo_coef the cloning loss runs after every PPO update at demo_coef times the share
    of the run left; the policy ends closer to the demonstrations than the same run without it
    (over three seeds: one tiny run's ending is a draw), and a rerun walks the demos again to
    go on imitating them."""
    demo = tmp_path / "walk.json"
    record_walk(demo, steps=3)
    configs = {}
    for seed in (0, 1, 2):
        configs["run", seed] = tiny_config(
            demos=[str(demo)], demo_coef=2.0, learning_rate=0.01, seed=seed
        )
        # the same run without the term
        configs["plain", seed] = tiny_config(demos=[str(demo)], learning_rate=0.01, seed=seed)
    for (kind, seed), config in configs.items():
        train(config, tmp_path / f"{kind}-{seed}", progress=False)
    config = configs["run", 0]
    updates = json.loads((tmp_path / "run-0" / "progress.json").read_text())["updates"]
    assert updates and all(update["demo_loss"] >= 0 for update in updates)
    curves = scalars(tmp_path / "run-0")
    assert curves["losses/demo"] == [update["global_step"] for update in updates]
    weights = EventAccumulator(str(tmp_path / "run-0"))
    weights.Reload()
    weight = [event.value for event in weights.Scalars("charts/demo_weight")]
    assert weight[0] == pytest.approx(2.0) and weight == sorted(weight, reverse=True)
    assert weight[-1] < 2.0
    env = make_env(config)
    scorer = make_scorer(config, len(env.unwrapped.rule_names))
    demos = walk_demos(env, read_demos(config.demos), scorer, gamma=config.gamma)
    env.close()
    logprob = dict.fromkeys(("run", "plain"), 0.0)
    for kind, seed in configs:
        scorer.load_state_dict(load_checkpoint(tmp_path / f"{kind}-{seed}")["model"])
        logprob[kind] += fit(scorer, demos)[1]
    assert logprob["run"] > logprob["plain"], logprob
    config.total_steps = 40
    train(config, tmp_path / "run-0", progress=False)
    resumed = json.loads((tmp_path / "run-0" / "progress.json").read_text())["updates"]
    assert len(resumed) > len(updates) and "demo_loss" in resumed[-1]


def test_demo_errors_are_one_line(tmp_path) -> None:
    empty = tmp_path / "empty.json"
    empty.write_text("{}")
    with pytest.raises(RlflowError, match="demo .*holds no episode"):
        read_demos([str(empty)])
    demo = tmp_path / "walk.json"
    record_walk(demo, steps=2)
    # another model than the run trains on
    config = tiny_config(models=["squeezenet-1.1"], demos=[str(demo)])
    with pytest.raises(RlflowError, match="recorded on resnet-18, which this run does not"):
        train(config, tmp_path / "other", progress=False)
    # the same model from another start state
    config = tiny_config(demos=[str(demo)], start="ort:all")
    with pytest.raises(RlflowError, match="starts from another graph"):
        train(config, tmp_path / "start", progress=False)
    with pytest.raises(RlflowError, match="demo_epochs must be at least 0"):
        PPOConfig(demo_epochs=-1).validate()
    with pytest.raises(RlflowError, match="demo_coef keeps imitating demos: give them"):
        PPOConfig(demo_coef=0.1).validate()
    with pytest.raises(RlflowError, match="demo_coef must be at least 0"):
        PPOConfig(demos=[str(demo)], demo_coef=-1).validate()

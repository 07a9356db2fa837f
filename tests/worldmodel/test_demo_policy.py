"""`demo:RESULT.json`: world-model data that walks a search's recorded path, then explores from
it; in `rlflow collect` and as the loop's `--demo`."""

from __future__ import annotations

import json

import numpy as np
import pytest

from rlflow.cli import main
from rlflow.errors import RlflowError
from rlflow.worldmodel.collect import CollectSettings, collect, make_env
from rlflow.worldmodel.data import read_manifest
from rlflow.worldmodel.demo_policy import DemoPolicy
from rlflow.worldmodel.loop import LoopSettings
from tests.worldmodel.test_loop import tiny_loop

MODEL = "resnet-18"


def record_walk(path, settings: CollectSettings, steps: int, seed: int = 3) -> list[str]:
    """A random walk of `steps` rewrites in `settings`' env, written as `rlflow optimize --json`
    records its episode; the rules it applied."""
    env = make_env(settings)
    env.reset(seed=seed)
    rng = np.random.default_rng(seed)
    for _ in range(steps):
        env.step(int(rng.integers(len(env.unwrapped.offered_candidates()))))
    state = env.unwrapped.episode_state()
    env.close()
    path.write_text(json.dumps({"episode": state.to_json(), "start_state": "original"}))
    return [action.rule for action in state.actions]


def run_episode(env, policy, rng) -> list[str]:
    """One episode of `policy` in `env`; the rules it applied."""
    observation, _ = env.reset()
    policy.reset()
    while True:
        action = policy.act(observation, rng=rng, env=env.unwrapped)
        observation, _, terminated, truncated, _ = env.step(action)
        if terminated or truncated:
            return [step.rule for step in env.unwrapped.episode_state().actions]


def test_walks_the_whole_path_first_then_prefixes_and_explores(tmp_path) -> None:
    base = CollectSettings(models=[MODEL], max_episode_steps=6, stop_probability=0.0)
    demo = tmp_path / "walk.json"
    walked = record_walk(demo, base, steps=3)
    settings = CollectSettings(**{**base.__dict__, "policy": f"demo:{demo}"})
    policy = settings.make_policy()
    assert isinstance(policy, DemoPolicy)
    env, rng = make_env(settings), np.random.default_rng(0)
    first = run_episode(env, policy, rng)
    # the whole recorded path, then the random agent on to the episode's 6 steps
    assert first[:3] == walked and len(first) == 6 and policy.walked == 3
    prefixes = []
    for _ in range(6):
        before = policy.walked
        rules = run_episode(env, policy, rng)
        prefix = policy.walked - before
        assert rules[:prefix] == walked[:prefix] and len(rules) == 6
        prefixes.append(prefix)
    env.close()
    assert len(set(prefixes)) > 1 and max(prefixes) <= 3  # branches off at drawn depths


def test_collect_with_a_demo_and_its_errors(tmp_path) -> None:
    base = CollectSettings(models=[MODEL], max_episode_steps=5, episodes=2)
    demo = tmp_path / "walk.json"
    walked = record_walk(demo, base, steps=2)
    settings = CollectSettings(**{**base.__dict__, "policy": f"demo:{demo}"})
    manifest = collect(settings, tmp_path / "data", progress=False)
    assert manifest["settings"]["policy"] == f"demo:{demo}"
    assert manifest["totals"]["episodes"] == 2 and manifest["totals"]["real_env_steps"] >= 2
    assert len(walked) == 2

    elsewhere = CollectSettings(**{**settings.__dict__, "models": ["squeezenet-1.1"]})
    with pytest.raises(RlflowError, match="starts from another graph"):
        collect(elsewhere, tmp_path / "other", progress=False)
    for spec, message in [
        ("demo:", "expected demo:RESULT.json"),
        (f"demo:{tmp_path / 'missing.json'}", "demo cannot read"),
    ]:
        with pytest.raises(RlflowError, match=message):
            CollectSettings(models=[MODEL], policy=spec).make_policy()
    with pytest.raises(RlflowError, match="--demo-episodes must be at least 1"):
        LoopSettings(demo=str(demo), demo_episodes=0).validate()


def test_the_loop_adds_the_demo_episodes_to_every_rounds_data(tmp_path, capsys) -> None:
    argv, out = tiny_loop(tmp_path, "--iterations", "2", "--episodes", "4")
    demo = tmp_path / "walk.json"
    record_walk(demo, CollectSettings(models=[MODEL], max_episode_steps=6), steps=2)
    flags = ["--demo", str(demo), "--demo-episodes", "2", "--controller-episodes", "1"]
    assert main([*argv, *flags, "--eval-real", "last", "--json"]) == 0
    first, second = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["iterations"]
    walked = read_manifest(out / "iter-0" / "data-demo")
    assert walked["settings"]["policy"] == f"demo:{demo}" and walked["totals"]["episodes"] == 2
    # 4 random episodes and 2 on the path, then 1 with the controller
    assert (first["data_episodes"], second["data_episodes"]) == (6, 7)
    random_steps = read_manifest(out / "iter-0" / "data")["totals"]["real_env_steps"]
    assert first["collected"]["real_env_steps"] == random_steps + walked["totals"]["real_env_steps"]
    merged = read_manifest(out / "iter-1" / "data-all")
    assert merged["sources"][1] == str(out / "iter-0" / "data-demo")
    # the loop's data walked that path: a rerun without it is refused
    assert main([*argv, "--controller-episodes", "1", "--eval-real", "last"]) == 2
    assert "made with other settings" in capsys.readouterr().err

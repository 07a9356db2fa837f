"""The controller: trained in the dream with zero real-env calls, and how it acts for real."""

from __future__ import annotations

import numpy as np
import pytest

from rlflow.cli import main
from rlflow.cost import Runner
from rlflow.envs.graph_rewrite import GraphRewriteEnv
from rlflow.errors import RlflowError
from rlflow.worldmodel.collect import RandomPolicy
from rlflow.worldmodel.controller import (
    ControllerSettings,
    LinearController,
    batched_logits,
    dream_returns,
    selected_temperature,
)
from rlflow.worldmodel.dream import DreamEnv
from rlflow.worldmodel.evaluate import real_env, run_episode
from rlflow.worldmodel.model import WorldModel
from rlflow.worldmodel.policy import load_controller_policy


class Counter:
    """Wraps methods of real classes so every call is counted, then runs the real method."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls: dict[str, int] = {}
        self.monkeypatch = monkeypatch

    def wrap(self, cls: type, name: str) -> None:
        original = getattr(cls, name)
        key = f"{cls.__name__}.{name}"
        self.calls[key] = 0

        def counted(*args, **kwargs):
            self.calls[key] += 1
            return original(*args, **kwargs)

        self.monkeypatch.setattr(cls, name, counted)


def test_train_controller_never_calls_the_real_env(pipeline, tmp_path, monkeypatch):
    counter = Counter(monkeypatch)
    for name in ("__init__", "reset", "step"):
        counter.wrap(GraphRewriteEnv, name)
    for name in ("measure", "compare"):
        counter.wrap(Runner, name)
    out = tmp_path / "controller"
    code = main(
        [
            "train-controller",
            "--wm",
            str(pipeline.wm),
            "--out",
            str(out),
            "--config",
            str(pipeline.config),
            "--generations",
            "3",
            "--temperatures",
            "1",
            "--quiet",
        ]
    )
    assert code == 0
    assert (out / "tau-1" / "controller.pt").is_file()  # it did train
    assert counter.calls == {
        "GraphRewriteEnv.__init__": 0,
        "GraphRewriteEnv.reset": 0,
        "GraphRewriteEnv.step": 0,
        "Runner.measure": 0,
        "Runner.compare": 0,
    }
    # the counters do see real calls: one real reset and step through the same patches
    env = real_env(WorldModel.load(pipeline.wm), "resnet-18")
    env.reset(seed=0)
    env.step(env.action_space.n - 1)
    assert counter.calls["GraphRewriteEnv.reset"] == 1
    assert counter.calls["GraphRewriteEnv.step"] == 1


def test_controller_beats_random_agent_in_real_env_seeded(pipeline):
    policy = load_controller_policy(pipeline.controller)
    env = real_env(policy.world, "resnet-18")
    try:
        controller = [
            run_episode(env, policy, seed=seed, deterministic=True)["return"] for seed in range(2)
        ]
        random = [
            run_episode(env, RandomPolicy(0.2), seed=seed, deterministic=False)["return"]
            for seed in range(8)
        ]
    finally:
        env.close()
    assert controller[0] == controller[1]  # deterministic: seeds only pick the model
    assert controller[0] > np.mean(random)
    report = pipeline.train_controller["eval"]
    chosen = report["temperatures"][f"{report['selected_temperature']:g}"]
    assert policy.temperature == report["selected_temperature"]
    assert controller[0] == chosen["real_return"]
    assert chosen["real_return"] == max(
        row["real_return"] for row in report["temperatures"].values()
    )


def test_real_episode_keeps_its_cheapest_graph_and_ends_after_patience(pipeline):
    """The graph --eval-real times is the cheapest the episode passed (the one `optimize
    --agent` hands back), and with patience the episode stops spending steps past it."""
    world = WorldModel.load(pipeline.wm)
    env = real_env(world, "resnet-18")
    walker = RandomPolicy(0.0)  # never stops by itself: only the horizon or patience end it
    try:
        full = run_episode(env, walker, seed=3, deterministic=False)
        short = run_episode(env, walker, seed=3, deterministic=False, patience=2)
    finally:
        env.close()
    assert 0 < full["best_step"] <= full["steps"]
    assert full["best_env_speedup"] >= max(1.0, full["env_speedup"])
    assert full["best_graph"].canonical_hash() != full["original"].canonical_hash()
    # the same seeded walk (analytic cost: no timing noise), cut two steps past its cheapest
    assert short["rules"] == full["rules"][: len(short["rules"])]
    assert short["steps"] < full["steps"]
    assert short["steps"] - short["best_step"] == 2
    assert short["best_env_speedup"] <= full["best_env_speedup"]
    for entry in pipeline.train_controller["eval"]["per_model"]:
        assert 0 <= entry["best_step"] <= entry["steps"]
        assert entry["best_env_speedup"] >= max(1.0, entry["env_speedup"])


def test_dream_horizon_is_the_datas_longest_episode(pipeline):
    """M has seen no step past the data's longest episode: dreams (and the controller's real
    episodes) stop there unless max_steps is shorter, or dream_horizon says max-steps."""
    from rlflow.worldmodel.data import RolloutData

    world = WorldModel.load(pipeline.wm)
    data = RolloutData.load(pipeline.data)
    lengths = np.diff(np.append(data.step_start, data.num_steps))
    assert world.longest_episode == lengths.max() < 50
    assert DreamEnv(world).max_steps == lengths.max()  # the gym dream's default too
    assert ControllerSettings().dream_steps(world) == lengths.max()
    assert ControllerSettings(max_steps=2).dream_steps(world) == 2
    assert ControllerSettings(dream_horizon="max-steps").dream_steps(world) == 50
    policy = load_controller_policy(pipeline.controller)
    assert policy.horizon == lengths.max()  # what the controller trained for, kept with it


def test_policy_stops_after_its_horizon(pipeline):
    policy = load_controller_policy(pipeline.controller)
    policy.controller = LinearController(  # one that never stops on its own
        policy.world.num_actions,
        policy.controller.input_dim,
        np.concatenate(
            [np.zeros(policy.world.num_actions * policy.controller.input_dim),
             np.append(np.zeros(policy.world.num_actions - 1), -100.0)]
        ),
    )  # fmt: skip
    policy.horizon = 2
    env = real_env(policy.world, "resnet-18")
    try:
        result = run_episode(env, policy, seed=0, deterministic=True)
    finally:
        env.close()
    assert len(result["rules"]) == 2 and result["steps"] == 3  # two rewrites, then stop


def test_selected_temperature_is_the_best_real_return():
    returns = {0.5: 3.0, 1.0: 2.0, 1.5: 3.0}
    assert selected_temperature(1.0, "real-return", returns) == 0.5  # a tie: the lower tau
    assert selected_temperature(1.5, "real-return", returns) == 1.5  # a tie with the main one
    assert selected_temperature(1.0, "temperature", returns) == 1.0
    assert selected_temperature(1.0, "real-return", None) == 1.0  # nothing measured yet
    speedups = {0.5: 1.01, 1.0: 0.99, 1.5: 1.03}  # what `select: speedup` is handed
    assert selected_temperature(1.0, "speedup", speedups) == 1.5


def test_run_policy_follows_its_select_setting(pipeline, tmp_path):
    """A controller run's policy is the tau with the best real return in its eval.json; with
    `select: temperature`, or with no eval.json yet, its main temperature."""
    import shutil

    import yaml

    report = pipeline.train_controller["eval"]
    run = tmp_path / "controller"
    shutil.copytree(pipeline.controller, run)
    assert load_controller_policy(run).temperature == report["selected_temperature"]
    config = yaml.safe_load((run / "config.yaml").read_text())
    (run / "config.yaml").write_text(yaml.safe_dump({**config, "select": "temperature"}))
    assert load_controller_policy(run).temperature == config["temperature"]
    (run / "config.yaml").write_text(yaml.safe_dump(config))
    (run / "eval.json").unlink()
    assert load_controller_policy(run).temperature == config["temperature"]
    (run / "eval.json").write_text("{")
    with pytest.raises(RlflowError, match="eval.json is unreadable"):
        load_controller_policy(run)


def test_real_env_runs_as_the_data_was_collected(pipeline):
    """The controller's real check starts where its data started (onnxruntime's graph, say)
    and deploys as it did, not at the env's defaults."""
    world = WorldModel.load(pipeline.wm)
    meta_env = {**world.meta["env"], "start": "ort:all", "deploy": "offline", "cost": "analytic"}
    world.meta = {**world.meta, "env": meta_env}
    env = real_env(world, "resnet-18")
    try:
        _, info = env.reset(seed=0)
        unwrapped = env.unwrapped
        assert unwrapped.start == "ort:all" and unwrapped.deployment.mode == "offline"
        assert info["model"] == "resnet-18"
        assert env.spec.max_episode_steps == meta_env["max_episode_steps"]
    finally:
        env.close()


def test_policy_applies_the_chosen_rules_cheapest_candidate(pipeline):
    policy = load_controller_policy(pipeline.controller)
    world = policy.world
    env = real_env(world, "resnet-18")
    cost = env.unwrapped.estimated_cost  # the env's own cost of a graph (analytic here)
    visited = set()
    try:
        observation, _ = env.reset(seed=0)
        for _ in range(6):
            visited.add(env.unwrapped.current_graph().canonical_hash())
            slot = policy.act(observation, deterministic=True, rng=None, env=env.unwrapped)
            mask = observation["action_mask"]
            if slot == len(mask) - 1:
                break
            assert mask[slot] == 1
            rule = observation["candidate_rules"][slot]
            assert rule in world.active_rules
            offered = env.unwrapped.offered_candidates()
            same_rule = [  # the rule's candidates that do not go back to a graph of the episode
                cost(offered[i].graph)
                for i in np.flatnonzero(observation["candidate_rules"] == rule)
                if offered[i].graph_hash not in visited
            ]
            assert cost(offered[slot].graph) == min(same_rule)
            observation, _, terminated, truncated, _ = env.step(slot)
            if terminated or truncated:
                break
    finally:
        env.close()


def test_policy_never_returns_to_a_graph_nor_takes_a_rule_pair_both_ways(pipeline):
    # A controller that wants a rule and, even more, its reverse: the cycle a dream can sell
    policy = load_controller_policy(pipeline.controller)
    world = policy.world
    names = [world.rule_names[rule] for rule in world.active_rules]
    forward = next(name for name in names if f"{name}-reverse" in names)
    bias = np.zeros(world.num_actions)
    bias[names.index(forward)], bias[names.index(f"{forward}-reverse")] = 10.0, 20.0
    bias[-1] = -100.0  # never stop
    inputs = world.latent + world.hidden
    weights = np.zeros(world.num_actions * inputs)
    policy.controller = LinearController(world.num_actions, inputs, np.concatenate([weights, bias]))
    env = real_env(world, "resnet-18")
    visited, applied = [], []
    try:
        observation, _ = env.reset(seed=0)
        for _ in range(8):
            visited.append(env.unwrapped.current_graph().canonical_hash())
            slot = policy.act(observation, deterministic=True, rng=None, env=env.unwrapped)
            if slot == len(observation["action_mask"]) - 1:
                break
            applied.append(env.unwrapped.rule_names[observation["candidate_rules"][slot]])
            observation, _, terminated, truncated, _ = env.step(slot)
            if terminated or truncated:
                break
    finally:
        env.close()
    assert applied[0] in (forward, f"{forward}-reverse")  # what the controller wants most
    assert len(visited) == len(set(visited)), applied
    assert not {forward, f"{forward}-reverse"} <= set(applied), applied  # one way per episode


def test_policy_without_env_takes_the_rules_first_slot(pipeline):
    policy = load_controller_policy(pipeline.controller)
    env = real_env(policy.world, "resnet-18")
    try:
        observation, _ = env.reset(seed=0)
        slot = policy.act(observation, deterministic=True, rng=None, env=None)
    finally:
        env.close()
    if slot != len(observation["action_mask"]) - 1:
        rule = observation["candidate_rules"][slot]
        assert slot == np.flatnonzero(observation["candidate_rules"] == rule)[0]


def test_batched_logits_match_one_controller_at_a_time():
    rng = np.random.default_rng(0)
    params = rng.standard_normal((3, LinearController.num_params(4, 5)))
    x = rng.standard_normal((3, 2, 5))
    batched = batched_logits(params, x, 4)
    for p in range(3):
        controller = LinearController(4, 5, params[p])
        np.testing.assert_allclose(batched[p], controller.logits(x[p]))


def test_identical_controllers_get_identical_dream_returns(pipeline):
    """Common random numbers: every controller of a population sees the same dream draws."""
    world = WorldModel.load(pipeline.wm)
    size = LinearController.num_params(world.num_actions, world.latent + world.hidden)
    one = np.random.default_rng(1).standard_normal(size) * 0.1
    returns = dream_returns(
        world,
        np.stack([one, one, np.zeros(size)]),
        episodes=4,
        temperature=1.0,
        max_steps=20,
        rng=np.random.default_rng(0),
    )
    assert returns[0] == returns[1]


@pytest.mark.parametrize(
    "change, message",
    [
        ({"method": "sgd"}, "unknown method"),
        ({"temperature": 2.0}, "not among temperatures"),
        ({"population": 1}, "population"),
        ({"select": "dream"}, "unknown select"),
        ({"dream_horizon": "forever"}, "unknown dream_horizon"),
        ({"eval_patience": -1}, "eval_patience"),
    ],
)
def test_controller_settings_are_checked(change, message):
    settings = ControllerSettings(**change)
    with pytest.raises(RlflowError, match=message):
        settings.validate()


def test_load_controller_policy_refuses_other_run_dirs(pipeline, tmp_path):
    with pytest.raises(RlflowError, match="no such controller run directory"):
        load_controller_policy(tmp_path / "missing")
    with pytest.raises(RlflowError, match="not a controller run config"):
        load_controller_policy(pipeline.wm)


def test_interrupted_cmaes_resumes_to_the_same_controller(pipeline, tmp_path, capsys):
    def train(out, generations):
        argv = ["train-controller", "--wm", str(pipeline.wm), "--out", str(out)]
        argv += ["--config", str(pipeline.config), "--temperatures", "1", "--quiet"]
        assert main([*argv, "--generations", str(generations)]) == 0

    train(tmp_path / "straight", 4)
    train(tmp_path / "resumed", 2)  # as if stopped after two generations
    train(tmp_path / "resumed", 4)
    capsys.readouterr()
    one = load_controller_policy(tmp_path / "straight").controller.params
    two = load_controller_policy(tmp_path / "resumed").controller.params
    np.testing.assert_array_equal(one, two)

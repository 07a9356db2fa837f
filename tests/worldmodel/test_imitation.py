"""Controllers from a search's path (`--imitation`): the path in the controller's own inputs, the
clone CMA-ES starts from, the fading term that keeps it near, in the loop and train-controller."""

from __future__ import annotations

import json

import numpy as np
import pytest

from rlflow.cli import main
from rlflow.config import read_yaml
from rlflow.errors import RlflowError
from rlflow.worldmodel.collect import CollectSettings
from rlflow.worldmodel.controller import ControllerSettings, LinearController
from rlflow.worldmodel.evaluate import real_env, run_episode
from rlflow.worldmodel.imitation import (
    _minority_directions,
    agreement,
    cloned_params,
    log_likelihoods,
    path_examples,
)
from rlflow.worldmodel.model import WorldModel, load_checkpoint
from rlflow.worldmodel.policy import ControllerPolicy
from tests.worldmodel.test_demo_policy import MODEL, record_walk
from tests.worldmodel.test_loop import tiny_loop


def test_the_loop_starts_its_controllers_from_the_path_clone(tmp_path, capsys) -> None:
    argv, out = tiny_loop(tmp_path, "--iterations", "1", "--episodes", "4")
    demo = tmp_path / "walk.json"
    walked = record_walk(demo, CollectSettings(models=[MODEL], max_episode_steps=6), steps=3)
    flags = ["--demo", str(demo), "--demo-episodes", "2", "--imitation", "2"]
    assert main([*argv, *flags, "--eval-real", "last"]) == 0
    controller, demo_data = out / "iter-0" / "controller", out / "iter-0" / "data-demo"
    config = read_yaml(controller / "config.yaml")
    assert config["imitation"] == 2.0 and config["imitate"] == str(demo_data.resolve())
    for tau in ("0.5", "1"):  # each controller reports how much of the path it still walks
        trained = load_checkpoint(controller / f"tau-{tau}" / "controller.pt")
        assert 0.0 <= trained["path_agreement"] <= 1.0

    world = WorldModel.from_bundle(controller / "world_model.pt")
    path = path_examples(world, demo_data)
    assert path.recorded_steps == path.walked_steps == 3
    stop = world.num_actions - 1
    assert 2 <= len(path) <= 4 and path.actions[-1] == stop and stop not in path.actions[:-1]
    assert path.valid[np.arange(len(path)), path.actions].all()
    names = world.rule_names
    taken = [names[world.active_rules[action]] for action in path.actions[:-1]]
    assert all(rule in walked for rule in taken)

    clone = cloned_params(path, world.num_actions)
    assert agreement(clone, path, world.num_actions) == 1.0
    zero = np.zeros_like(clone)  # uniform over the actions the controller could choose
    uniform = -np.log(path.valid.sum(axis=1)).sum()
    likelihood = log_likelihoods(np.stack([clone, zero]), path, world.num_actions)
    assert likelihood[1] == pytest.approx(uniform) and likelihood[0] > likelihood[1]
    assert likelihood[0] < 0

    # in the real env the clone takes the path's first step: its observation is the data's
    inputs = world.latent + world.hidden
    policy = ControllerPolicy(world, LinearController(world.num_actions, inputs, clone), 1.0)
    env = real_env(world, MODEL)
    episode = run_episode(env, policy, seed=0, deterministic=True)
    env.close()
    assert episode["rules"][:1] == walked[:1] == taken[:1]

    # train-controller on the loop's world model, from the same walk
    capsys.readouterr()
    argv = ["train-controller", "--wm", str(out / "iter-0" / "wm"), "--out", str(tmp_path / "c")]
    argv += ["--config", str(tmp_path / "loop.yaml"), "--quiet", "--json"]
    assert main([*argv, "--imitation", "1", "--imitate", str(demo_data)]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert all(0.0 <= row["path_agreement"] <= 1.0 for row in summary["controllers"].values())


def test_imitation_settings_and_inputs_are_refused_in_one_line(pipeline, tmp_path, capsys):
    for values, message in [
        ({"imitation": 1.0}, "imitation needs both"),
        ({"imitate": "data"}, "imitation needs both"),
        ({"imitation": -1.0, "imitate": "data"}, "imitation must be a number >= 0"),
        ({"imitation": 1.0, "imitate": "data", "method": "ppo"}, "is for the cmaes method"),
    ]:
        with pytest.raises(RlflowError, match=message):
            ControllerSettings(**values).validate()
    # off, the settings are recorded as before the option: older runs still resume
    assert "imitate" not in ControllerSettings().identity()

    out = tmp_path / "controller"
    argv = ["train-controller", "--wm", str(pipeline.wm), "--out", str(out), "--quiet"]
    assert main([*argv, "--imitation", "1", "--imitate", str(pipeline.data)]) == 2
    assert "not collected with a demo" in capsys.readouterr().err
    assert main([*argv, "--imitation", "1"]) == 2
    assert "--imitate DATA_DIR" in capsys.readouterr().err

    loop, _ = tiny_loop(tmp_path, "--iterations", "1", "--episodes", "2")
    assert main([*loop, "--imitation", "1"]) == 2
    assert "--imitation needs --demo" in capsys.readouterr().err


def test_a_rule_pair_taken_both_ways_is_cloned_the_way_the_path_takes_more_often() -> None:
    # actions 0/1 and 3/4 are reverse pairs, 2 has none; a controller goes one way per pair and
    # episode, so the clone drops the direction the path takes less often (on a tie, the later)
    reverse = np.array([1, 0, -1, 4, 3, -1])
    assert _minority_directions([1, 0, 0, 2, 0, 1], reverse) == {1}
    assert _minority_directions([3, 4, 2], reverse) == {4}
    assert _minority_directions([2, 0, 0, -1], reverse) == set()

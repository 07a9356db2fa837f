"""PPO at a real budget's shape: several envs per update (CleanRL's num_envs x num_steps), the
offline per-op reward with end-to-end checks, runs saved before these settings, and one run
per seed with the learning curves drawn."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import yaml
from PIL import Image

from rlflow.agents.ppo import CHECKPOINT, PRE_VECTOR_DEFAULTS, PPOConfig, load_checkpoint, train
from rlflow.agents.rollout import EnvRollout
from rlflow.agents.vector import make_vector_env, unbatch
from rlflow.nn.features import GLOBAL_FEATURES
from rlflow.report.seeds import episode_curves, smooth, spread
from tests.agents.test_ppo import scalars, tiny_config
from tests.agents.test_train_ppo_cli import TINY, rlflow


def test_vector_env_resets_in_the_step_that_ends_an_episode() -> None:
    config = tiny_config(horizon=2)
    envs = make_vector_env(config.models, config.horizon, config.env_kwargs(), num_envs=2)
    try:
        batched, _ = envs.reset(seed=0)
        first = unbatch(batched, 2)
        assert first[0]["action_mask"].shape == (config.max_candidates + 1,)
        stop = np.full(2, config.max_candidates)
        batched, rewards, terminated, truncated, infos = envs.step(stop)
        assert terminated.all() and not truncated.any()
        assert infos["_final_info"].all() and len(infos["final_obs"]) == 2
        assert list(infos["final_info"]["step"]) == [1, 1]
        # the returned observation is the next episode's first one, already reset
        step_fraction = GLOBAL_FEATURES.index("step_fraction")
        assert all(obs["global_features"][step_fraction] == 0 for obs in unbatch(batched, 2))
    finally:
        envs.close()


def test_gae_of_one_env_cuts_at_episode_ends_and_bootstraps_a_cut_rollout() -> None:
    rollout = EnvRollout()
    state = None
    for reward, value, ended, next_value in [
        (1.0, 0.5, False, None),
        (2.0, 0.25, True, 0.0),  # terminated
        (0.0, 1.0, False, None),  # the rollout stops here mid-episode
    ]:
        rollout.add(state, [], 0, 0.0, reward, value, ended=ended, next_value=next_value)
    assert rollout.open
    rollout.close(next_value=2.0)
    advantages, values = rollout.advantages(gamma=0.5, gae_lambda=1.0)
    # step 2: 0 + 0.5 * 2 - 1 = 0; step 1: 2 - 0.25 = 1.75; step 0: 1 + 0.5*0.25 - 0.5 + 0.5*1.75
    expected = torch.tensor([1.0 + 0.125 - 0.5 + 0.875, 1.75, 0.0])
    torch.testing.assert_close(advantages, expected)
    torch.testing.assert_close(values, torch.tensor([0.5, 0.25, 1.0]))


def test_num_envs_by_num_steps_rollouts(tmp_path) -> None:
    config = tiny_config(num_envs=2, num_steps=3, total_steps=12)
    summary = train(config, tmp_path, progress=False)
    assert summary["global_step"] == 12 and summary["updates"] == 2  # 2 x (2 envs x 3 steps)
    progress = json.loads((tmp_path / "progress.json").read_text())
    assert [update["global_step"] for update in progress["updates"]] == [6, 12]
    assert progress["episodes"], "horizon 5 within 6 steps per env: episodes end"
    assert {"return", "speedup", "model", "length"} <= set(progress["episodes"][0])
    assert all(1 <= episode["length"] <= 5 for episode in progress["episodes"])
    saved = yaml.safe_load((tmp_path / "config.yaml").read_text())
    assert saved["num_envs"] == 2 and saved["num_steps"] == 3
    assert scalars(tmp_path)["losses/value_loss"] == [6, 12]

    resumed = train(tiny_config(num_envs=2, num_steps=3, total_steps=18), tmp_path, progress=False)
    assert resumed["resumed"] and resumed["global_step"] == 18 and resumed["updates"] == 3


def test_default_reward_is_the_offline_per_op_cost_with_end_to_end_checks(tmp_path) -> None:
    config = PPOConfig(
        models=["resnet-18"], total_steps=4, horizon=3, measure_every=2, episodes_per_update=1,
        max_candidates=4, hidden=16, layers=1, heads=2,
    )  # fmt: skip
    assert config.cost == "perop-e2e" and config.deploy == "offline"
    summary = train(config, tmp_path, progress=False)
    assert summary["global_step"] == 4
    # C_0 and the checks are end-to-end measurements (the original's, then the graphs')
    assert summary["real_measurements"] >= 1
    assert load_checkpoint(tmp_path)["config"]["cost"] == "perop-e2e"


def test_a_run_saved_before_vector_settings_resumes_as_it_ran(tmp_path, capsys) -> None:
    out = tmp_path / "run"
    flags = ("--total-steps", "5")
    code, _, err = rlflow(capsys, "train-ppo", *TINY, "--out", str(out), *flags)
    assert code == 0, err
    # As an older rlflow wrote it: none of the new keys, in config.yaml and the checkpoint.
    saved = yaml.safe_load((out / "config.yaml").read_text())
    for key in PRE_VECTOR_DEFAULTS:
        del saved[key]
    (out / "config.yaml").write_text(yaml.safe_dump(saved))
    state = torch.load(out / CHECKPOINT, weights_only=False)
    for key in PRE_VECTOR_DEFAULTS:
        del state["config"][key]
    torch.save(state, out / CHECKPOINT)

    code, stdout, err = rlflow(capsys, "train-ppo", "--out", str(out), "--total-steps", "8")
    assert code == 0, err
    assert f"resuming {out} at step 5" in err and "trained 8 steps" in stdout
    assert yaml.safe_load((out / "config.yaml").read_text())["deploy"] == "online"


def test_seeds_train_one_run_each_and_draw_the_spread(tmp_path, capsys) -> None:
    out = tmp_path / "set"
    flags = ("--seeds", "0,1", "--total-steps", "8", "--json")
    code, stdout, err = rlflow(capsys, "train-ppo", *TINY, "--out", str(out), *flags)
    assert code == 0, err
    summary = json.loads(stdout)
    assert set(summary["runs"]) == {"seed 0", "seed 1"}
    for seed in (0, 1):
        run = out / f"seed-{seed}"
        assert load_checkpoint(run)["config"]["seed"] == seed
        assert summary["runs"][f"seed {seed}"]["global_step"] == 8
    png = out / "learning_curve.png"
    assert summary["learning_curve"] == str(png)
    with Image.open(png) as image:
        assert image.size[0] > 400
    rows = (out / "learning_curve.csv").read_text().splitlines()
    assert rows[0] == "tag,run,step,value,smoothed"
    assert {row.split(",")[1] for row in rows[1:]} == {"seed 0", "seed 1"}

    with pytest.raises(SystemExit) as exit_info:  # argparse's own error: usage, then one line
        rlflow(capsys, "train-ppo", *TINY, "--out", str(out), "--seeds", "0,0")
    assert exit_info.value.code == 2 and "distinct seeds" in capsys.readouterr().err


def test_curves_keep_every_episode_of_envs_that_end_together(tmp_path) -> None:
    episodes = [
        {"global_step": 4, "return": 1.0, "speedup": 1.01},
        {"global_step": 4, "return": -2.0, "speedup": 0.98},  # the other env, same step
        {"global_step": 8, "return": 3.0, "speedup": 1.03},
    ]
    (tmp_path / "progress.json").write_text(json.dumps({"episodes": episodes}))
    curves = episode_curves(tmp_path, ("charts/episodic_return", "charts/speedup"))
    assert curves["charts/episodic_return"] == [(4, 1.0), (4, -2.0), (8, 3.0)]
    assert [value for _, value in curves["charts/speedup"]] == [1.01, 0.98, 1.03]


def test_curve_smoothing_and_spread() -> None:
    assert smooth([(1, 1.0), (2, 3.0), (3, 5.0)], window=2) == [(1, 1.0), (2, 2.0), (3, 4.0)]
    grid, mean, low, high = spread({"a": [(0, 0.0), (10, 10.0)], "b": [(0, 2.0), (20, 2.0)]}, 3)
    np.testing.assert_allclose(grid, [0, 5, 10])  # the steps both runs reached
    np.testing.assert_allclose(mean, [1.0, 3.5, 6.0])
    np.testing.assert_allclose(low, [0.0, 2.0, 2.0])
    np.testing.assert_allclose(high, [2.0, 5.0, 10.0])

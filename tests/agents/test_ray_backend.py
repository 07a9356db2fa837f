"""`--backend ray` on a real local Ray (2 CPUs, one `rlflow_timer`): a tiny collect writes the
shards an in-process collect writes, per-op measurements go through the timer actor, and PPO's
envs as Ray actors train exactly as in-process ones under the same seeds."""

from __future__ import annotations

import json

import numpy as np
import pytest
import ray
import torch

from rlflow.agents.ppo import load_checkpoint, train
from rlflow.agents.ray_workers import TIMER_NAME, TIMER_RESOURCE
from rlflow.cli import main
from rlflow.errors import RlflowError
from rlflow.worldmodel.collect import CollectSettings, collect
from rlflow.worldmodel.data import read_shard
from tests.agents.test_ppo import tiny_config

EPISODE_KEYS = ("global_step", "model", "return", "speedup", "length")


@pytest.fixture(scope="module")
def local_ray():
    ray.init(
        address="local",  # ours, even while another test's cluster is still shutting down
        num_cpus=2,
        resources={TIMER_RESOURCE: 1},
        include_dashboard=False,
        log_to_driver=False,
    )
    yield ray
    ray.shutdown()


def shards_of(data_dir) -> dict[str, dict[str, np.ndarray]]:
    return {path.name: read_shard(path)[0] for path in sorted(data_dir.glob("shard-*.npz"))}


def assert_same_shards(expected_dir, actual_dir) -> None:
    expected, actual = shards_of(expected_dir), shards_of(actual_dir)
    assert list(actual) == list(expected) and expected
    for name, arrays in expected.items():
        assert actual[name].keys() == arrays.keys()
        for key, value in arrays.items():
            np.testing.assert_array_equal(actual[name][key], value, err_msg=f"{name} {key}")


def test_collect_on_ray_writes_the_in_process_shards(tmp_path, local_ray, capsys) -> None:
    flags = ["--model", "resnet-18", "--episodes", "4", "--episodes-per-shard", "2", "--quiet"]
    assert main(["collect", *flags, "--out", str(tmp_path / "here")]) == 0
    capsys.readouterr()
    code = main(["collect", *flags, "--out", str(tmp_path / "ray"), "--backend", "ray", "--json"])
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert code == 0 and summary["backend"] == "ray"
    assert summary["episodes"] == 4 and summary["shards"] == 2
    assert_same_shards(tmp_path / "here", tmp_path / "ray")
    manifest = json.loads((tmp_path / "ray" / "manifest.json").read_text())
    here = json.loads((tmp_path / "here" / "manifest.json").read_text())
    assert manifest["settings"] == here["settings"]
    assert manifest["totals"]["steps"] == here["totals"]["steps"]


def test_per_op_costs_are_measured_by_the_timer_actor(tmp_path, local_ray) -> None:
    settings = CollectSettings(
        models=["resnet-18"], episodes=2, episodes_per_shard=1, cost="perop", max_episode_steps=4
    )
    # In process first: every operator signature the episodes meet is then in the per-op
    # cache, which the timer reads too, so the rewards agree to the bit.
    collect(settings, tmp_path / "here", progress=False)
    collect(settings, tmp_path / "ray", progress=False, backend="ray")
    assert_same_shards(tmp_path / "here", tmp_path / "ray")
    # the envs' per-op costs (one per step and reset) were asked of the machine's timer actor
    timer = ray.get_actor(TIMER_NAME.format(index=0))
    steps = int(shards_of(tmp_path / "ray")["shard-00000.npz"]["episode_steps"].sum())
    assert ray.get(timer.served.remote()) >= steps
    rewards = shards_of(tmp_path / "ray")["shard-00000.npz"]["reward"]
    assert np.isfinite(rewards).all()


def test_ppo_envs_on_ray_train_as_in_process(tmp_path, local_ray) -> None:
    config = tiny_config(num_envs=2, num_steps=3, total_steps=12)
    here = train(config, tmp_path / "here", progress=False)
    there = train(config, tmp_path / "ray", progress=False, backend="ray")
    assert here["global_step"] == there["global_step"] == 12
    logs = [json.loads((tmp_path / run / "progress.json").read_text()) for run in ("here", "ray")]
    episodes = [[{k: e[k] for k in EPISODE_KEYS} for e in log["episodes"]] for log in logs]
    assert episodes[0] == episodes[1] and episodes[0]
    weights = [load_checkpoint(tmp_path / run)["model"] for run in ("here", "ray")]
    for name, value in weights[0].items():
        torch.testing.assert_close(weights[1][name], value, msg=name)


def test_an_error_in_a_ray_worker_is_its_one_line(tmp_path, local_ray) -> None:
    with pytest.raises(RlflowError, match=r"^model resnet-18 has \d+ operators, more than"):
        train(tiny_config(num_envs=2, max_nodes=4), tmp_path, progress=False, backend="ray")


def test_an_unreachable_cluster_is_one_line_and_nothing_written(tmp_path, capsys) -> None:
    # No Ray is started: the address is checked before Ray's own minutes of retries.
    address = ("--backend", "ray", "--ray-address", "127.0.0.1:1")
    for argv in (
        ["collect", "--model", "resnet-18", "--episodes", "2", "--out", str(tmp_path / "d")],
        ["train-ppo", "--model", "resnet-18", "--out", str(tmp_path / "r")],
    ):
        assert main([*argv, *address]) == 2
        lines = capsys.readouterr().err.strip().splitlines()
        assert len(lines) == 1 and "cannot reach Ray at 127.0.0.1:1" in lines[0], lines
    assert not any(tmp_path.iterdir())
    assert main(["collect", "--model", "resnet-18", "--out", str(tmp_path / "d"),
                 "--ray-address", "auto"]) == 2  # fmt: skip
    assert "--ray-address needs --backend ray" in capsys.readouterr().err

"""`rlflow train-wm` rerun on a data directory that `rlflow collect` has grown since: one line,
exit 2 and the run left as it was (it used to resume and die with an IndexError); and the
world-model trainers print only their JSON on stdout under --json."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from rlflow.cli import main

TINY = {
    "collect": {"episodes_per_shard": 2, "max_episode_steps": 6},
    "train_wm": {
        "latent": 4,
        "encoder_hidden": 8,
        "encoder_layers": 1,
        "encoder_heads": 1,
        "decoder_hidden": 8,
        "vae_epochs": 1,
        "rnn_hidden": 8,
        "mixtures": 2,
        "action_embedding": 4,
        "rnn_epochs": 1,
    },
    "train_controller": {
        "temperatures": [1.0],
        "max_steps": 4,
        "generations": 1,
        "population": 2,
        "rollouts": 1,
        "eval_dream_episodes": 1,
    },
}


def run(capfd, *argv: str) -> tuple[int, str, str]:
    """Exit code, stdout and stderr of `rlflow ARGV` in this process (file descriptors
    captured, so that nothing written below Python escapes the check)."""
    capfd.readouterr()
    code = main(list(argv))
    captured = capfd.readouterr()
    return code, captured.out, captured.err


def only_json(result: tuple[int, str, str]) -> dict:
    code, out, err = result
    assert code == 0, err
    assert len(out.strip().splitlines()) == 1, out
    return json.loads(out)


@pytest.fixture
def tiny(tmp_path) -> dict[str, Path]:
    config = tmp_path / "tiny.yaml"
    config.write_text(yaml.safe_dump(TINY))
    return {"config": config, "data": tmp_path / "data", "wm": tmp_path / "wm"}


def collect(capfd, tiny, episodes: int) -> dict:
    argv = ["collect", "--model", "squeezenet-1.1", "--episodes", str(episodes)]
    argv += ["--out", str(tiny["data"]), "--config", str(tiny["config"]), "--quiet", "--json"]
    return only_json(run(capfd, *argv))


def train_wm(capfd, tiny) -> tuple[int, str, str]:
    argv = ["train-wm", "--data", str(tiny["data"]), "--out", str(tiny["wm"])]
    return run(capfd, *argv, "--config", str(tiny["config"]), "--quiet", "--json")


def test_rerun_on_grown_data_says_so_and_leaves_the_run_alone(capfd, tiny):
    assert collect(capfd, tiny, 2)["episodes"] == 2
    first = only_json(train_wm(capfd, tiny))
    assert first["episodes"] == 2
    again = only_json(train_wm(capfd, tiny))  # the same data: resumes (nothing left to train)
    assert again["episodes"] == 2

    assert collect(capfd, tiny, 4)["episodes"] == 4
    before = {path: path.read_bytes() for path in tiny["wm"].iterdir() if path.is_file()}
    code, out, err = train_wm(capfd, tiny)
    assert code == 2 and out == "", err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("rlflow: error: --data"), err
    assert "has changed since" in lines[0] and "4 episodes" in lines[0]
    assert {path: path.read_bytes() for path in tiny["wm"].iterdir() if path.is_file()} == before


def test_trainers_print_only_json_on_stdout(capfd, tiny, tmp_path):
    collect(capfd, tiny, 2)
    code, out, err = train_wm(capfd, tiny)
    assert only_json((code, out, err))["episodes"] == 2
    assert f"tensorboard --logdir {tiny['wm']}" in err

    controller = tmp_path / "controller"
    argv = ["train-controller", "--wm", str(tiny["wm"]), "--out", str(controller)]
    result = run(capfd, *argv, "--config", str(tiny["config"]), "--quiet", "--json")
    assert only_json(result)["out"] == str(controller)
    assert f"tensorboard --logdir {controller}" in result[2]

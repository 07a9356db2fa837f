"""The tiny world-model pipeline, run once per session through the real CLI (collect, train-wm,
train-controller --eval-real) on a small zoo model; the other world-model tests read its
outputs."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

MODEL = "resnet-18"  # small: 41 operators, 7 rules with candidates along random episodes
EPISODES = 40

TINY = {
    "train_wm": {
        "latent": 8,
        "encoder_hidden": 32,
        "encoder_layers": 2,
        "encoder_heads": 2,
        "decoder_hidden": 64,
        "vae_epochs": 30,
        "rnn_hidden": 64,
        "mixtures": 4,
        "action_embedding": 8,
        "rnn_epochs": 100,
        "rnn_batch": 8,
        "rnn_lr": 0.003,
        "holdout": 0.2,
        "ensemble": 1,  # one M: tests/worldmodel/test_ensemble.py grows it to two
    },
    "train_controller": {
        "temperatures": [0.5, 1.0, 1.5],
        "generations": 10,
        "population": 10,
        "rollouts": 6,
        "eval_dream_episodes": 16,
    },
}
"""Small nets and budgets: the pipeline's point here is that every stage works and learns."""


def rlflow(*args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "rlflow.cli", *args], capture_output=True, text=True, timeout=timeout
    )


def last_json(result: subprocess.CompletedProcess) -> dict:
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


@dataclass
class Pipeline:
    root: Path
    config: Path
    data: Path
    wm: Path
    controller: Path
    collect: dict
    train_wm: dict
    train_controller: dict
    seconds: dict[str, float]


@pytest.fixture(scope="session")
def tiny_config(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("wm-config") / "tiny.yaml"
    path.write_text(yaml.safe_dump(TINY))
    return path


@pytest.fixture(scope="session")
def pipeline(tmp_path_factory, tiny_config) -> Pipeline:
    root = tmp_path_factory.mktemp("wm-pipeline")
    data, wm, controller = root / "data", root / "wm", root / "controller"
    seconds = {}
    started = time.perf_counter()
    collect = last_json(
        rlflow(
            "collect",
            "--model",
            MODEL,
            "--episodes",
            str(EPISODES),
            "--episodes-per-shard",
            "10",
            "--cost",
            "analytic",  # the pipeline checks that each stage learns: no timing noise in its data
            "--out",
            str(data),
            "--json",
        )
    )
    seconds["collect"] = time.perf_counter() - started
    started = time.perf_counter()
    train_wm = last_json(
        rlflow(
            "train-wm",
            "--data",
            str(data),
            "--out",
            str(wm),
            "--config",
            str(tiny_config),
            "--json",
        )
    )
    seconds["train_wm"] = time.perf_counter() - started
    started = time.perf_counter()
    result = rlflow(
        "train-controller",
        "--wm",
        str(wm),
        "--out",
        str(controller),
        "--config",
        str(tiny_config),
        "--eval-real",
        "--json",
    )
    train_controller = last_json(result)
    seconds["train_controller"] = time.perf_counter() - started
    seconds["total"] = sum(seconds.values())
    print(f"\ntiny world-model pipeline seconds: {json.dumps(seconds)}")
    return Pipeline(
        root, tiny_config, data, wm, controller, collect, train_wm, train_controller, seconds
    )

"""A tiny collected dataset with per-candidate cost changes and a tiny advantage run trained on
it through the real CLI, made once per session in this process; the advantage tests read them."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import pytest

from rlflow.cli import main
from rlflow.worldmodel.collect import CollectSettings, collect

MODEL = "resnet-18"  # small: 41 operators, a handful of rules with candidates
SAMPLES = 8
TINY_NET = ("--hidden", "16", "--layers", "1", "--heads", "2", "--batch", "16")


def tiny_settings(**changes) -> CollectSettings:
    values = {
        "models": [MODEL],
        "episodes": 4,
        "episodes_per_shard": 2,
        "max_episode_steps": 8,
        "stop_probability": 0.1,
        "candidate_samples": SAMPLES,
        "cost": "analytic",  # deterministic targets (the default offline is the measured per-op)
        **changes,
    }
    return CollectSettings(**values)


@pytest.fixture(scope="session")
def advantage_data(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("advantage") / "data"
    collect(tiny_settings(), out, progress=False)
    return out


def train_args(data: Path, out: Path, *extra: str) -> list[str]:
    """`rlflow train-advantage` on the tiny data with a tiny network (3 epochs unless given)."""
    epochs = () if "--epochs" in extra else ("--epochs", "3")
    return [
        "train-advantage", "--data", str(data), "--out", str(out), *TINY_NET,
        "--holdout", "0.25", "--quiet", *epochs, *extra,
    ]  # fmt: skip


def run_cli(argv: list[str]) -> tuple[int, str, str]:
    """`rlflow ARGV` in this process (torch is loaded once for all the tests): exit code,
    stdout, stderr."""
    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        code = main(argv)
    return code, stdout.getvalue(), stderr.getvalue()


@pytest.fixture(scope="session")
def advantage_run(advantage_data, tmp_path_factory) -> tuple[Path, dict]:
    """(RUN_DIR, the --json summary) of `rlflow train-advantage` on the tiny data."""
    out = tmp_path_factory.mktemp("advantage-run") / "run"
    code, stdout, stderr = run_cli(train_args(advantage_data, out, "--json"))
    assert code == 0, stderr[-3000:]
    return out, json.loads(stdout.strip().splitlines()[-1])

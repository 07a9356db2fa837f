"""A real path priced by the dream (rlflow.worldmodel.path_price) and scripts/dream_path.py,
which sets it beside the path's real rewards: the tiny pipeline's world model, a path of real
rewrites of its model."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from rlflow.commands.common import resolve_model
from rlflow.cost import OrtSettings
from rlflow.cost.deploy import Deployment
from rlflow.cost.ort_optimizer import start_state
from rlflow.errors import RlflowError
from rlflow.rewrite.session import RewriteSession
from rlflow.worldmodel.model import WorldModel
from rlflow.worldmodel.path_price import price_path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "dream_path.py"


@pytest.fixture(scope="module")
def world(pipeline) -> WorldModel:
    return WorldModel.load(pipeline.wm)


def known_rules(world: WorldModel) -> list[str]:
    return [world.rule_names[rule] for rule in world.active_rules]


def test_a_path_is_priced_step_by_step_and_its_rewards_telescope(world):
    rules = [known_rules(world)[step % len(known_rules(world))] for step in range(7)]
    price = price_path(world, rules, episodes=8, seed=3)
    for per_step in (price.reward, price.charge, price.masked, price.ended):
        assert per_step.shape == (7,)
    # r_t = 100 (c_{t-1} - c_t) on every dream, so their mean telescopes too
    assert price.reward.sum() == pytest.approx(100.0 * (price.cost[0] - price.cost[-1]))
    assert np.all(price.charge == 0.0)  # one M: no disagreement to charge
    assert price.dream_return == pytest.approx(price.reward.sum())
    assert np.all((price.masked >= 0) & (price.masked <= 1))
    assert np.all(np.diff(price.ended) >= 0)  # a dream that ended stays ended
    table = price.by_rule()
    assert list(table) == list(dict.fromkeys(rules))  # in order of first use
    assert sum(row["steps"] for row in table.values()) == 7
    assert sum(row["reward"] for row in table.values()) == pytest.approx(price.reward.sum())
    again = price_path(world, rules, episodes=8, seed=3)
    assert np.array_equal(again.reward, price.reward)


def test_a_rule_the_data_never_applied_is_refused(world):
    with pytest.raises(RlflowError, match="never applied no-such-rule"):
        price_path(world, [known_rules(world)[0], "no-such-rule"])


def bench_results(directory: Path, world: WorldModel, steps: int) -> Path:
    """A bench's results.json with one result: a path of `steps` real rewrites of the
    pipeline's model, each the first candidate of a rule its world model knows."""
    settings = Deployment("offline").settings(OrtSettings(threads=1))
    session = RewriteSession(
        start_state(resolve_model("resnet-18", "small"), "original", settings).graph,
        model="resnet-18",
    )
    known = set(known_rules(world))
    for _ in range(steps):
        session.apply_candidate(next(c for c in session.candidates() if c.rule.name in known))
    cell = {
        "model": "resnet-18:small",
        "method": "agent:wm-run/seed-0",
        "deploy": "offline",
        "start_state": "original",
        "episode": session.state().to_json(),
    }
    path = directory / "results.json"
    path.write_text(json.dumps({"settings": {"size": "small", "threads": 1}, "cells": {"a": cell}}))
    return path


def dream_path(*argv) -> subprocess.CompletedProcess:
    command = [sys.executable, str(SCRIPT), *map(str, argv)]
    return subprocess.run(command, capture_output=True, text=True, timeout=300)


def test_the_script_sets_the_dream_beside_the_real_rewards(pipeline, world, tmp_path):
    results = bench_results(tmp_path, world, steps=4)
    png = tmp_path / "path.png"
    args = ["--model", "resnet-18:small", "--wm", pipeline.wm, "--cost", "analytic"]
    done = dream_path(results, *args, "--method", "wm-run", "--png", png, "--json")
    assert done.returncode == 0, done.stderr[-2000:]
    summary = json.loads(done.stdout)
    assert summary["steps"] == 4
    rows = summary["per_rule"].values()
    assert sum(row["steps"] for row in rows) == 4
    assert summary["real_return"] == pytest.approx(sum(row["real"] for row in rows))
    rules = [a["rule"] for a in json.loads(results.read_text())["cells"]["a"]["episode"]["actions"]]
    direct = price_path(world, rules)  # the script's defaults: 64 dreams, tau 1, charge 1, seed 0
    assert summary["dream"][str(pipeline.wm)]["return"] == pytest.approx(direct.dream_return)
    assert png.stat().st_size > 0
    table = dream_path(results, *args, "--method", "wm-run")
    assert table.returncode == 0 and "total (4 steps)" in table.stdout
    missing = dream_path(results, *args, "--method", "ppo")
    assert missing.returncode == 2
    assert missing.stderr.strip().splitlines() == [
        "error: --method 'ppo' matches 0 offline results of resnet-18:small with a path; "
        "give a part of one method's name"
    ]
    unreadable = dream_path(tmp_path / "none.json", *args, "--method", "wm-run")
    assert unreadable.returncode == 2 and len(unreadable.stderr.strip().splitlines()) == 1

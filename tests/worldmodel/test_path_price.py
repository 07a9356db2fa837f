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
from rlflow.nn.features import GLOBAL_FEATURES
from rlflow.rewrite.session import EpisodeState, RewriteSession
from rlflow.search.cost import make_cost
from rlflow.worldmodel.data import RolloutData
from rlflow.worldmodel.evaluate import real_env
from rlflow.worldmodel.model import WorldModel
from rlflow.worldmodel.path_price import price_path, price_path_forced, real_path_observations
from rlflow.worldmodel.train import encode_all, episode_sequences, rnn_predictions

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


def test_fed_a_data_episode_m_prices_it_as_it_was_trained(pipeline, world):
    """Fed the real path, M's predictions are its training's teacher-forced ones: on an episode
    of its own data, the forced price is what `rnn_predictions` (the training loss's inputs)
    gives, step for step."""
    data = RolloutData.load(pipeline.data)

    def applied(episode: int) -> np.ndarray:
        """The rule ids of the episode's steps up to its first stop or no-op."""
        first = data.step_start[episode]
        ids = data.arrays["action_rule"][first : first + data.arrays["episode_steps"][episode]]
        ends = np.flatnonzero((ids < 0) | (ids >= data.num_rules))
        return ids[: ends[0]] if len(ends) else ids

    episode = next(e for e in range(data.num_episodes) if len(applied(e)) >= 3)
    steps = len(applied(episode))
    observations = [data.observation(data.obs_start[episode] + t) for t in range(steps + 1)]
    rules = [data.rule_names[rule] for rule in applied(episode)]
    price = price_path_forced(world, observations, rules)
    mu, _ = encode_all(world.vae, data)
    output, targets = rnn_predictions(world.rnn, data, episode_sequences(data, [episode]), mu)
    ratios = targets["next_cost"][0, :steps].numpy()
    trained = 100.0 * (
        np.append(price.cost[0], ratios[:-1]) - output.cost[0, :steps].detach().numpy()
    )
    np.testing.assert_allclose(price.reward, trained, atol=1e-3)
    np.testing.assert_allclose(price.cost[1:], ratios, rtol=1e-6)
    assert np.all(price.charge == 0.0)  # one M: no disagreement
    assert price.masked[0] == 0.0 and np.all(np.isin(price.masked, [0.0, 1.0]))
    assert np.all(np.diff(price.ended) >= 0) and np.all(price.ended <= 1.0)
    with pytest.raises(RlflowError, match="3 rules need 4 observations"):
        price_path_forced(world, observations[:3], rules[:1] * 3)


def bench_path(world: WorldModel, steps: int) -> RewriteSession:
    """A path of `steps` real rewrites of the pipeline's model, each the first candidate of a
    rule its world model knows."""
    settings = Deployment("offline").settings(OrtSettings(threads=1))
    session = RewriteSession(
        start_state(resolve_model("resnet-18", "small"), "original", settings).graph,
        model="resnet-18",
    )
    known = set(known_rules(world))
    for _ in range(steps):
        session.apply_candidate(next(c for c in session.candidates() if c.rule.name in known))
    return session


def test_a_recorded_path_replays_in_the_world_models_env(world):
    session = bench_path(world, steps=4)
    env = real_env(world, "resnet-18")
    observations = real_path_observations(env, session.state())
    assert len(observations) == 5
    # the env's cost ratios along the path are its graphs' costs (the data's: analytic)
    analytic = make_cost("analytic", Deployment("offline").settings(OrtSettings(threads=1)))
    graphs = [session.original]
    RewriteSession.replay(
        session.original, session.state(), on_step=lambda s: graphs.append(s.graph)
    )
    column = GLOBAL_FEATURES.index("cost_ratio")
    ratios = [obs["global_features"][column] for obs in observations]
    np.testing.assert_allclose(
        ratios, [analytic(g) / analytic(graphs[0]) for g in graphs], rtol=1e-5
    )
    assert env.unwrapped.current_graph().canonical_hash() == session.state().final_hash
    wrong = session.state().to_json()
    wrong["actions"][2]["graph_hash"] = "0" * 16  # a step no candidate makes
    with pytest.raises(RlflowError, match="step 2 of the path .* is not among the env's"):
        real_path_observations(env, EpisodeState.from_json(wrong))
    env.close()


def bench_results(directory: Path, world: WorldModel, steps: int) -> Path:
    """A bench's results.json with one result: `bench_path`."""
    session = bench_path(world, steps)
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
    fed = dream_path(results, *args, "--method", "wm-run", "--feed", "real", "--json")
    assert fed.returncode == 0, fed.stderr[-2000:]
    forced = json.loads(fed.stdout)
    assert forced["real_return"] == pytest.approx(summary["real_return"])
    world_env = real_env(world, "resnet-18")
    observations = real_path_observations(world_env, EpisodeState.from_json(
        json.loads(results.read_text())["cells"]["a"]["episode"]))  # fmt: skip
    world_env.close()
    direct = price_path_forced(world, observations, rules)
    assert forced["dream"][str(pipeline.wm)]["return"] == pytest.approx(direct.dream_return)
    # the data's cost is the script's --cost here: fed the real path, M's cost starts right
    assert direct.cost[-1] == pytest.approx(1.0 - summary["real_return"] / 100.0, rel=1e-5)

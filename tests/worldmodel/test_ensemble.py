"""An ensemble of Ms (`train-wm --ensemble K`), the dream's charge for their disagreement
(`train-controller --uncertainty`) and its cap on a rule's applications (the data's most
sites), on the tiny pipeline's data."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import torch

from rlflow.errors import RlflowError
from rlflow.worldmodel.dream import DreamBatch, DreamEnv
from rlflow.worldmodel.model import MDNRNN_CHECKPOINT, WorldModel, load_checkpoint
from tests.worldmodel.conftest import last_json, rlflow


@pytest.fixture(scope="module")
def grown(pipeline, tmp_path_factory):
    """The pipeline's world model grown to two members by a rerun with --ensemble 2: V, the
    latents and member 0 are kept, member 1 is trained."""
    out = tmp_path_factory.mktemp("wm-ensemble") / "wm"
    shutil.copytree(pipeline.wm, out)
    args = ["--data", str(pipeline.data), "--out", str(out), "--config", str(pipeline.config)]
    summary = last_json(rlflow("train-wm", *args, "--ensemble", "2", "--json"))
    return out, summary


@pytest.fixture(scope="module")
def pair(grown) -> WorldModel:
    return WorldModel.load(grown[0])


def test_a_rerun_with_ensemble_adds_members_and_keeps_m(pipeline, grown, pair):
    out, summary = grown
    assert (out / "mdnrnn-1.pt").is_file() and not (out / "mdnrnn-2.pt").exists()
    assert len(pair.members) == 2 and pair.meta["ensemble"] == 2
    kept = load_checkpoint(pipeline.wm / MDNRNN_CHECKPOINT)["model"]
    for key, value in pair.rnn.state_dict().items():  # member 0 is M, untouched
        torch.testing.assert_close(value, kept[key])
    other = pair.members[1].state_dict()
    assert any(not torch.equal(value, other[key]) for key, value in kept.items())
    # member 0 reads as before: held-out numbers unchanged
    assert summary["mdnrnn_val"] == pytest.approx(pipeline.train_wm["mdnrnn_val"])
    assert len(WorldModel.load(pipeline.wm).members) == 1


def test_heldout_report_gives_the_members_disagreement(pipeline, pair):
    from rlflow.worldmodel.data import RolloutData
    from rlflow.worldmodel.heldout import heldout_report

    data = RolloutData.load(pipeline.data)
    report = heldout_report(pair, data, [0, 1, 2])
    assert report["cost_disagreement"] > 0
    assert heldout_report(WorldModel.load(pipeline.wm), data, [0])["cost_disagreement"] is None


def _run(world: WorldModel, penalty: float, steps: int = 5):
    """A dream's rewards, costs and disagreements, always applying the first offered rule."""
    batch = DreamBatch(
        world, episodes=8, max_steps=steps, rng=np.random.default_rng(3), penalty=penalty
    )
    _, mask = batch.reset()
    previous = batch.cost.copy()
    rewards, changes, spread = [], [], []
    for _ in range(steps):
        actions = np.array([int(np.flatnonzero(row)[0]) for row in mask])
        _, reward, _, _, mask = batch.step(actions)
        rewards.append(reward)
        changes.append(100.0 * (previous - batch.cost))
        spread.append(batch.disagreement.copy())
        previous = batch.cost.copy()
    return np.array(rewards), np.array(changes), np.array(spread)


def test_dream_charges_the_disagreement_and_averages_the_cost(pair):
    free, free_changes, spread = _run(pair, 0.0)
    np.testing.assert_allclose(free, free_changes)  # no charge: the mean cost's change
    assert (spread >= 0).all() and spread.max() > 0
    charged, changes, same_spread = _run(pair, 2.0)
    np.testing.assert_allclose(changes, free_changes)  # same draws, same dream
    np.testing.assert_allclose(same_spread, spread)
    np.testing.assert_allclose(charged, free - 2.0 * spread)
    # negative, the disagreement is a bonus (an exploring controller's dream), on the same draws
    explored, explored_changes, _ = _run(pair, -1.0)
    np.testing.assert_allclose(explored_changes, free_changes)
    np.testing.assert_allclose(explored, free + spread)


def test_an_ensemble_of_identical_members_dreams_as_one(pipeline):
    """The mean of equal predictions is the prediction, their spread 0: a one-member world and
    the same M twice give the same dream, reward for reward."""
    single = WorldModel.load(pipeline.wm)
    twice = WorldModel(single.vae, single.rnn, single.meta, single.start, [single.rnn])
    one, _, zero = _run(single, 1.0)
    two, _, also_zero = _run(twice, 1.0)
    np.testing.assert_allclose(two, one, atol=1e-9)
    assert not zero.any() and not also_zero.any()


def test_dream_env_takes_the_penalty_and_reports_the_disagreement(pair):
    from gymnasium.utils.env_checker import check_env

    env = DreamEnv(pair, penalty=1.0)
    check_env(env, skip_render_check=True)
    observation, _ = env.reset(seed=0)
    action = int(np.flatnonzero(observation["action_mask"])[0])
    _, _, _, _, info = env.step(action)
    assert info["disagreement"] >= 0
    with pytest.raises(RlflowError, match="a finite number"):
        DreamEnv(pair, penalty=float("nan"))


def test_a_controller_trains_with_the_uncertainty_charge_and_keeps_its_members(
    pipeline, grown, tmp_path
):
    out = tmp_path / "controller"
    args = ["--wm", str(grown[0]), "--out", str(out), "--config", str(pipeline.config)]
    result = last_json(
        rlflow("train-controller", *args, "--uncertainty", "1", "--generations", "2", "--json")
    )
    assert len(result["controllers"]) == 3
    assert all(np.isfinite(row["dream_return"]) for row in result["controllers"].values())
    bundle = WorldModel.from_bundle(out / "world_model.pt")
    assert len(bundle.members) == 2


def test_uncertainty_without_an_ensemble_is_a_one_line_error(pipeline, tmp_path):
    out = tmp_path / "controller"
    result = rlflow(
        "train-controller", "--wm", str(pipeline.wm), "--out", str(out), "--uncertainty", "1"
    )
    assert result.returncode != 0
    assert "--ensemble" in result.stderr and "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert not out.exists()


def test_most_sites_counts_each_rules_offered_candidates(pipeline, pair):
    from rlflow.worldmodel.data import RolloutData

    data = RolloutData.load(pipeline.data)
    expected = np.zeros(data.num_rules, dtype=np.int64)
    for index in range(data.num_observations):
        observation = data.observation(index)
        offered = observation["action_mask"][:-1].astype(bool)
        counts = np.bincount(observation["candidate_rules"][offered], minlength=data.num_rules)
        expected = np.maximum(expected, counts)
    np.testing.assert_array_equal(data.most_sites(), expected)
    assert pair.meta["most_sites"] == expected.tolist()
    assert pair.most_sites[-1] > 10**9  # stop is never capped


def test_a_dream_applies_a_rule_at_most_as_often_as_it_had_sites(pair):
    """M does not count sites: the dream stops offering a rule once it has been applied as
    many times as its most sites in the data, whatever M's mask says."""
    sites = pair.most_sites
    offered = pair.start["applicable"][:, pair.active_rules].any(axis=0)
    action = int(np.flatnonzero(offered & (sites[:-1] <= 3))[0])
    batch = DreamBatch(pair, episodes=16, max_steps=20, rng=np.random.default_rng(1))
    _, mask = batch.reset()
    counts = np.zeros(16, dtype=np.int64)
    for _ in range(20):
        taken = mask[:, action].copy()
        counts += taken
        _, _, _, _, mask = batch.step(np.where(taken, action, pair.num_actions - 1))
        assert not mask[counts >= sites[action], action].any()
    assert counts.max() <= sites[action]
    np.testing.assert_array_equal(batch.applied[:, action], counts)

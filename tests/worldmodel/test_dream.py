"""The dream env: gymnasium's checker, seeded determinism, masks and episode ends from M."""

from __future__ import annotations

import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

from rlflow.errors import RlflowError
from rlflow.worldmodel.dream import DreamBatch, DreamEnv
from rlflow.worldmodel.model import WorldModel


@pytest.fixture(scope="module")
def world(pipeline) -> WorldModel:
    return WorldModel.load(pipeline.wm)


def test_check_env_passes(world):
    check_env(DreamEnv(world, render_mode="ansi"), skip_render_check=False)


def rollout(env: DreamEnv, seed: int) -> list:
    observation, info = env.reset(seed=seed)
    trace = [observation["latent"].copy()]
    rng = np.random.default_rng(seed)
    for _ in range(env.max_steps):
        valid = np.flatnonzero(observation["action_mask"][:-1])
        action = int(rng.choice(valid)) if len(valid) else env.action_space.n - 1
        observation, reward, terminated, truncated, info = env.step(action)
        trace.append((observation["latent"].copy(), reward, terminated, truncated))
        assert observation["action_mask"][-1] == 1  # stop is always possible
        assert np.array_equal(observation["action_mask"], info["action_mask"])
        if terminated or truncated:
            break
    return trace


def test_seeded_dreams_repeat_and_temperatures_differ(world):
    first = rollout(DreamEnv(world, temperature=1.0), seed=3)
    again = rollout(DreamEnv(world, temperature=1.0), seed=3)
    assert len(first) == len(again)
    for a, b in zip(first[1:], again[1:]):
        np.testing.assert_array_equal(a[0], b[0])
        assert a[1:] == b[1:]
    hot = rollout(DreamEnv(world, temperature=1.5), seed=3)
    np.testing.assert_array_equal(first[0], hot[0])  # same start draw
    assert not np.array_equal(first[1][0], hot[1][0])  # tau changes the next latent


def test_stop_terminates_and_masked_action_is_a_noop_step(world):
    env = DreamEnv(world)
    env.reset(seed=0)
    _, _, terminated, truncated, info = env.step(env.action_space.n - 1)
    assert terminated and not truncated and info["rule"] is None
    observation, _ = env.reset(seed=0)
    masked = np.flatnonzero(observation["action_mask"] == 0)
    if len(masked):
        _, _, _, _, info = env.step(int(masked[0]))
        assert info["invalid_action"]


def test_truncation_after_max_steps(world):
    batch = DreamBatch(world, episodes=4, max_steps=2, rng=np.random.default_rng(0))
    batch.reset()
    apply_first = np.zeros(4, dtype=np.int64)
    _, _, terminated, truncated, _ = batch.step(apply_first)
    assert not truncated.any()
    _, _, terminated, truncated, _ = batch.step(apply_first)
    assert (terminated | truncated).all()


def test_dream_env_refuses_bad_use(world):
    with pytest.raises(RlflowError, match="temperature"):
        DreamEnv(world, temperature=0.0)
    env = DreamEnv(world)
    with pytest.raises(RlflowError, match="reset"):
        env.step(0)
    env.reset(seed=0)
    with pytest.raises(RlflowError, match="outside"):
        env.step(env.action_space.n)


def test_dream_return_telescopes_to_the_predicted_cost(world):
    """r_t = 100 (c_{t-1} - c_t) on M's predicted cost ratios: a dream return is
    100 (c_0 - c_T), whatever the path (so a rule and its reverse cannot both earn a gain)."""
    env = DreamEnv(world)
    for seed in range(4):
        observation, _ = env.reset(seed=seed)
        rng = np.random.default_rng(seed)
        total, cost = 0.0, 1.0
        for _ in range(env.max_steps):
            valid = np.flatnonzero(observation["action_mask"][:-1])
            action = int(rng.choice(valid)) if len(valid) else env.action_space.n - 1
            observation, reward, terminated, truncated, info = env.step(action)
            assert reward == pytest.approx(100.0 * (cost - info["cost_ratio"]))
            assert info["cost_ratio"] >= 0.0
            total, cost = total + reward, info["cost_ratio"]
            if terminated or truncated:
                break
        assert total == pytest.approx(100.0 * (1.0 - cost))


def test_a_rule_pair_goes_one_way_per_dream_episode(world):
    """Once a rule is applied, its reverse is masked for the rest of the episode (as the real
    policy acts); everything else in the mask is M's, as without the pair."""
    from rlflow.worldmodel.model import WorldModel

    offered = world.start["applicable"][:, world.active_rules].any(axis=0)
    first = int(np.flatnonzero(offered)[0])
    other = next(a for a in range(world.num_actions - 1) if a != first)
    plain = [f"rule-{index}" for index in range(len(world.rule_names))]  # no pair at all
    names = list(plain)
    names[world.active_rules[first]] = "some-rule"
    names[world.active_rules[other]] = "some-rule-reverse"
    paired = WorldModel(world.vae, world.rnn, {**world.meta, "rule_names": names}, world.start)
    assert paired.reverse_actions[first] == other and paired.reverse_actions[other] == first
    assert paired.reverse_actions[-1] == -1  # stop has none
    assert set(world.reverse_actions[world.reverse_actions >= 0]) <= set(range(world.num_actions))

    def two_steps(model: WorldModel) -> tuple[np.ndarray, list[np.ndarray]]:
        """Apply `first` (where offered), then stop-free steps of `first` again."""
        batch = DreamBatch(model, episodes=16, max_steps=5, rng=np.random.default_rng(0))
        _, start_mask = batch.reset()
        masks = [batch.step(np.full(16, first))[-1] for _ in range(2)]
        return start_mask[:, first], masks

    applied, masks = two_steps(paired)
    assert applied.any()
    for mask in masks:  # still masked a step later, whatever M predicts
        assert not mask[applied, other].any()
    unpaired_world = WorldModel(
        world.vae, world.rnn, {**world.meta, "rule_names": plain}, world.start
    )
    assert (unpaired_world.reverse_actions == -1).all()
    _, unpaired = two_steps(unpaired_world)
    expected = unpaired[0].copy()
    expected[applied, other] = False
    np.testing.assert_array_equal(masks[0], expected)


def test_dream_starts_at_the_recorded_cost(world):
    np.testing.assert_allclose(world.start["cost"], 1.0)  # C_0 / C_0 of every start graph


def test_world_model_of_the_reward_predicting_kind_is_refused(pipeline, world):
    from rlflow.worldmodel.model import MDNRNN_CHECKPOINT, VAE_CHECKPOINT, load_checkpoint

    vae = load_checkpoint(pipeline.wm / VAE_CHECKPOINT)
    rnn = load_checkpoint(pipeline.wm / MDNRNN_CHECKPOINT)
    old_meta = {key: value for key, value in world.meta.items() if key != "dynamics"}
    with pytest.raises(RlflowError, match="older rlflow"):
        WorldModel._build(vae, rnn, old_meta, world.start)


@pytest.mark.parametrize("head", ["step", "level"])
def test_dream_of_either_cost_head_telescopes_over_the_dream_cost(pipeline, head):
    """A step-head M adds its predicted change to the dream's current cost: the dream must
    hand that cost in (else every cost is NaN); with either head the return telescopes."""
    world = WorldModel.load(pipeline.wm)
    world.rnn.cost_head = head  # the same weights, read as changes or as levels
    batch = DreamBatch(world, episodes=3, max_steps=6, rng=np.random.default_rng(0))
    _, mask = batch.reset()
    total, previous = np.zeros(3), batch.cost.copy()
    for _ in range(6):
        actions = np.array([int(np.flatnonzero(row)[0]) for row in mask])
        _, reward, _, _, mask = batch.step(actions)
        assert np.isfinite(batch.cost).all()
        np.testing.assert_allclose(reward, 100.0 * (previous - batch.cost))
        total, previous = total + reward, batch.cost.copy()
    np.testing.assert_allclose(total, 100.0 * (1.0 - batch.cost))

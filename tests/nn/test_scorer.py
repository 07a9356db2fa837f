"""CandidateScorer: masked logits over candidates + stop and a value, in both modes."""

from __future__ import annotations

import gymnasium as gym
import pytest
import torch

import rlflow.envs  # noqa: F401  (registers rlflow/GraphRewrite-v0)
from rlflow.errors import RlflowError
from rlflow.nn import (
    MASKED_LOGIT,
    CandidateScorer,
    candidate_batch,
    candidate_data,
    collate,
)

SLOTS = 6


@pytest.fixture(scope="module")
def states():
    """States of two models, with the graphs of their offered candidates."""
    found = []
    for model in ("resnet-18", "squeezenet-1.1"):
        env = gym.make("rlflow/GraphRewrite-v0", models=[model], max_candidates=SLOTS)
        observation, _ = env.reset(seed=0)
        found.append((observation, candidate_data(env.unwrapped.candidate_observations())))
    return found


@pytest.fixture(scope="module")
def num_rules():
    """The env's rule vocabulary, as PPO sizes its scorer by it (it grows with every rule)."""
    return len(gym.make("rlflow/GraphRewrite-v0", models=["resnet-18"]).unwrapped.rule_names)


@pytest.mark.parametrize("mode", ["local", "full"])
def test_logits_are_masked_and_shaped(states, num_rules, mode) -> None:
    torch.manual_seed(0)
    observations = [observation for observation, _ in states]
    # hide the last slot of the first state: its logit must be masked too
    observations[0] = {**observations[0], "action_mask": observations[0]["action_mask"].copy()}
    observations[0]["action_mask"][SLOTS - 1] = 0
    scorer = CandidateScorer(num_rules, mode=mode, hidden=32, layers=1, heads=2).eval()
    batch = collate(observations)
    graphs = candidate_batch([graphs for _, graphs in states], SLOTS)
    logits, values = scorer(batch, graphs if scorer.needs_candidate_graphs else None)
    assert logits.shape == (2, SLOTS + 1) and values.shape == (2,)
    mask = batch.action_mask
    assert torch.all(logits[~mask] == MASKED_LOGIT)
    assert torch.all(logits[mask] > MASKED_LOGIT / 2) and mask[:, -1].all()
    assert not torch.equal(logits[0, mask[0]], logits[1, mask[1]])  # states differ
    torch.testing.assert_close(scorer.value(batch), values)
    again, _ = scorer(batch, graphs if scorer.needs_candidate_graphs else None)
    assert torch.equal(logits, again)


def test_full_scores_follow_the_candidate_graphs(states, num_rules) -> None:
    """Swapping two candidates' graphs swaps their scores (the score is the graph's)."""
    torch.manual_seed(0)
    scorer = CandidateScorer(num_rules, mode="full", hidden=32, layers=1, heads=2).eval()
    observation, graphs = states[0]
    batch = collate([observation])
    logits, _ = scorer(batch, candidate_batch([graphs], SLOTS))
    swapped = [graphs[1], graphs[0], *graphs[2:]]
    swapped_logits, _ = scorer(batch, candidate_batch([swapped], SLOTS))
    torch.testing.assert_close(swapped_logits[0, :2], logits[0, :2].flip(0))
    with pytest.raises(RlflowError, match="rewritten graphs"):
        scorer(batch, None)


def test_candidate_batch_slots(states) -> None:
    graphs = [states[0][1], states[1][1][:2]]
    batch = candidate_batch(graphs, SLOTS)
    assert batch.num_graphs == len(graphs[0]) + 2
    assert batch.slot.tolist() == [*range(len(graphs[0])), SLOTS, SLOTS + 1]
    assert candidate_batch([[], []], SLOTS) is None
    with pytest.raises(RlflowError, match="action slots"):
        candidate_batch([graphs[0]], 2)


def test_unknown_mode_and_repr() -> None:
    with pytest.raises(RlflowError, match="unknown scorer"):
        CandidateScorer(10, mode="global")
    assert repr(CandidateScorer(10, hidden=16, layers=1, heads=2)).startswith(
        "CandidateScorer(num_rules=10, mode='local', encoder=GraphEncoder("
    )

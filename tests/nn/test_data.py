"""Observations of GraphRewrite-v0 to torch_geometric data and batches."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch

import rlflow.envs  # noqa: F401  (registers rlflow/GraphRewrite-v0)
from rlflow.errors import RlflowError
from rlflow.nn import collate, observation_to_data
from rlflow.nn.features import EDGE_FEATURES, GLOBAL_FEATURES, NODE_FEATURES


@pytest.fixture(scope="module")
def observations() -> list[dict[str, np.ndarray]]:
    """A resnet-18 and a squeezenet observation (different sizes), 8 candidates, 4 site nodes."""
    found = []
    for model in ("resnet-18", "squeezenet-1.1"):
        env = gym.make("rlflow/GraphRewrite-v0", models=[model], max_candidates=8)
        observation, _ = env.reset(seed=0)
        found.append(observation)
    return found


def test_observation_to_data_unpads(observations) -> None:
    observation = observations[0]
    data = observation_to_data(observation)
    n, m = int(observation["node_mask"].sum()), int(observation["edge_mask"].sum())
    assert data.num_nodes == n
    assert data.x.shape == (n, len(NODE_FEATURES))
    assert data.edge_index.shape == (2, m) and data.edge_index.dtype == torch.long
    assert data.edge_attr.shape == (m, len(EDGE_FEATURES))
    assert data.u.shape == (1, len(GLOBAL_FEATURES))
    assert data.candidate_rules.shape == (8,)
    assert data.candidate_sites.shape == (8, 4)
    assert data.action_mask.dtype == torch.bool and data.action_mask.shape == (9,)
    assert int(data.edge_index.max()) < n
    np.testing.assert_array_equal(data.x.numpy(), observation["node_features"][:n])


def test_collate_offsets_sites_into_the_batch(observations) -> None:
    batch = collate(observations)
    assert batch.num_graphs == 2
    assert batch.u.shape == (2, len(GLOBAL_FEATURES))
    assert batch.candidate_rules.shape == (2, 8)
    assert batch.candidate_sites.shape == (2, 8, 4)
    assert batch.action_mask.shape == (2, 9)
    first_nodes = int(observations[0]["node_mask"].sum())
    assert int(batch.ptr[1]) == first_nodes
    for index, observation in enumerate(observations):
        local = torch.as_tensor(observation["candidate_sites"])
        batched = batch.candidate_sites[index]
        assert torch.equal(batched < 0, local < 0)  # padding stays -1
        real = local >= 0
        assert torch.equal(batched[real], local[real] + int(batch.ptr[index]))
        # the offset sites point at the same feature rows as in the observation
        np.testing.assert_array_equal(
            batch.x[batched[real]].numpy(), observation["node_features"][local[real].numpy()]
        )


def test_collate_rejects_mixed_candidate_shapes(observations) -> None:
    env = gym.make("rlflow/GraphRewrite-v0", models=["resnet-18"], max_candidates=4)
    other, _ = env.reset(seed=0)
    with pytest.raises(RlflowError, match="max_candidates"):
        collate([observations[0], other])
    with pytest.raises(RlflowError, match="candidate_rules"):
        observation_to_data({k: v for k, v in other.items() if k != "candidate_rules"})

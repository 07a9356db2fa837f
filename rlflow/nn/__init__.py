"""Graph featurisation and the shared GNN: observations -> torch_geometric batches -> embeddings.

PPO, the world model's encoder and the guided search all go through `collate` and
`GraphEncoder`, so one graph means the same thing to every learner.
"""

from __future__ import annotations

from rlflow.nn.encoder import GraphEncoder
from rlflow.nn.features import (
    RewriteData,
    collate,
    collate_graphs,
    graph_to_data,
    observation_to_data,
)
from rlflow.nn.scorer import (
    MASKED_LOGIT,
    SCORER_MODES,
    CandidateScorer,
    candidate_batch,
    candidate_data,
)

__all__ = [
    "MASKED_LOGIT",
    "SCORER_MODES",
    "CandidateScorer",
    "GraphEncoder",
    "RewriteData",
    "candidate_batch",
    "candidate_data",
    "collate",
    "collate_graphs",
    "graph_to_data",
    "observation_to_data",
]

"""Graph featurisation and the shared GNN: Graph -> observation arrays -> torch_geometric
batches -> embeddings.

`rlflow.nn.features` (numpy only) turns an IR graph into the env's observation arrays;
`rlflow.nn.data` turns observations into torch_geometric batches; `GraphEncoder` embeds them.
PPO, the world model's encoder and the guided search all go through `collate` and
`GraphEncoder`, so one graph means the same thing to every learner.

The torch parts load on first use, so that the env (which needs only `features`) does not
import torch.
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY = {
    "GraphEncoder": "rlflow.nn.encoder",
    "RewriteData": "rlflow.nn.data",
    "collate": "rlflow.nn.data",
    "collate_graphs": "rlflow.nn.data",
    "graph_to_data": "rlflow.nn.data",
    "observation_to_data": "rlflow.nn.data",
    "MASKED_LOGIT": "rlflow.nn.scorer",
    "SCORER_MODES": "rlflow.nn.scorer",
    "CandidateScorer": "rlflow.nn.scorer",
    "candidate_batch": "rlflow.nn.scorer",
    "candidate_data": "rlflow.nn.scorer",
}


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'rlflow.nn' has no attribute {name!r}")
    value = getattr(importlib.import_module(_LAZY[name]), name)
    globals()[name] = value
    return value


__all__ = sorted(_LAZY)

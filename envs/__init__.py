"""Gymnasium environments of rlflow, registered on import: `rlflow/GraphRewrite-v0`.

Use: `import rlflow.envs` then `gymnasium.make("rlflow/GraphRewrite-v0", models=["resnet-18"])`.
"""

from __future__ import annotations

from gymnasium.envs.registration import register, registry

GRAPH_REWRITE_ID = "rlflow/GraphRewrite-v0"
MAX_EPISODE_STEPS = 50
"""Truncation of GraphRewrite-v0 episodes (X-RLflow's episodes are a few dozen rewrites)."""

# A re-import (e.g. under importlib.reload) must not register twice: gymnasium would warn.
if GRAPH_REWRITE_ID not in registry:
    register(
        id=GRAPH_REWRITE_ID,
        entry_point="rlflow.envs.graph_rewrite:GraphRewriteEnv",
        max_episode_steps=MAX_EPISODE_STEPS,
    )

__all__ = ["GRAPH_REWRITE_ID", "MAX_EPISODE_STEPS"]

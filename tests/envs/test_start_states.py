"""GraphRewrite-v0 in offline mode and from onnxruntime's own graphs: episodes can begin where
onnxruntime ends, and everything measured runs as written."""

from __future__ import annotations

import gymnasium as gym
import pytest
from gymnasium.utils.env_checker import check_env

import rlflow.envs  # noqa: F401  (registers rlflow/GraphRewrite-v0)
from rlflow.cost import ORT_CONFIG_KEY, declared_level, nchwc_block_size
from rlflow.envs.graph_rewrite import GraphRewriteEnv
from rlflow.errors import RlflowError
from rlflow.graph import NCHWC_DOMAIN

MODEL = "resnet-18"


def test_offline_env_from_onnxruntimes_graph_passes_the_checker():
    env = GraphRewriteEnv([MODEL], deploy="offline", start="ort:all")
    check_env(env, skip_render_check=True)
    env.reset(seed=0)
    start = env.session.original
    assert declared_level(start.metadata) == "disable"
    assert env.settings.ort_level == "disable"
    if nchwc_block_size() is not None:
        assert any(node.domain == NCHWC_DOMAIN for node in start.nodes)
    env.close()


def test_online_env_from_an_ort_graph_declares_nothing_and_measures_at_its_level():
    env = gym.make(
        rlflow.envs.GRAPH_REWRITE_ID, models=[MODEL], start="ort:extended", disable_env_checker=True
    )
    env.reset(seed=0)
    unwrapped = env.unwrapped
    assert ORT_CONFIG_KEY not in unwrapped.session.original.metadata
    assert unwrapped.settings.ort_level == "all"
    _, reward, terminated, _, _ = env.step(env.action_space.n - 1)  # stop at once
    assert terminated and reward == 0.0
    env.close()


def test_an_unknown_start_state_is_a_one_line_error():
    env = GraphRewriteEnv([MODEL], start="ort:fastest")
    with pytest.raises(RlflowError, match="unknown start state 'ort:fastest'"):
        env.reset(seed=0)

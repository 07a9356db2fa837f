"""Fixtures shared by the CLI tests."""

from __future__ import annotations

import pytest

from rlflow.agents import ppo


@pytest.fixture(scope="session")
def tiny_ppo_run(tmp_path_factory):
    """A real PPO run directory, trained once for a handful of steps on squeezenet (small)."""
    run_dir = tmp_path_factory.mktemp("ppo-run")
    config = ppo.PPOConfig(
        models=["squeezenet-1.1"], total_steps=8, horizon=4, episodes_per_update=2,
        minibatch_size=4, update_epochs=1, hidden=16, layers=1, heads=1, max_candidates=32,
        cost="analytic", deploy="online",  # the ablation: no measurement, no offline start
    )  # fmt: skip
    ppo.train(config, run_dir, progress=False)
    return run_dir

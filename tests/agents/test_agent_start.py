"""An agent trained from onnxruntime's graph (`--start ort:all`) rolls out, in optimize and
bench, from the start state it is given: its env does not apply its training start again."""

from __future__ import annotations

from rlflow.agents import ppo
from rlflow.commands.common import resolve_model
from rlflow.cost import OrtSettings
from rlflow.cost.ort_optimizer import start_state
from rlflow.optimize import Method, SearchOptions, optimize


def test_an_agent_trained_from_ort_all_begins_at_the_start_state_it_is_given(tmp_path):
    config = ppo.PPOConfig(
        models=["squeezenet-1.1"], total_steps=8, horizon=4, episodes_per_update=2,
        minibatch_size=4, update_epochs=1, hidden=16, layers=1, heads=1, max_candidates=32,
        cost="analytic", deploy="offline", start="ort:all",
    )  # fmt: skip
    ppo.train(config, tmp_path / "run", progress=False)
    original = resolve_model("squeezenet-1.1", "small")
    given = start_state(original, "ort:all", OrtSettings(threads=1))
    twice = start_state(given.graph, "ort:all", OrtSettings(threads=1))
    done = optimize(
        original,
        Method.parse(f"agent:{tmp_path / 'run'}"),
        options=SearchOptions(episodes=1, top_k=1),
        settings=OrtSettings(threads=1),
        start="ort:all",
        peer=False,
    )
    assert done.start.name == "ort:all"
    assert done.result.state.original_hash == given.graph.canonical_hash()
    if twice.graph.canonical_hash() != given.graph.canonical_hash():  # ORT's graph of ORT's graph
        assert done.result.state.original_hash != twice.graph.canonical_hash()

"""Fixtures for the search tests: the rules, the small zoo graphs, and a deterministic stand-in
for the end-to-end Runner (timing is noise on this machine; the real Runner is exercised by the
CLI test)."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from rlflow.cost import AnalyticCostModel, Comparison, Measurement
from rlflow.graph import Graph, load_model
from rlflow.rewrite import RuleSet, default_ruleset
from rlflow.zoo import cached_path


class CostRunner:
    """Answers `compare` with analytic costs as if they were measured times, so that which
    finalist wins is a function of the graphs alone. `penalties[k]` (ms) is added to every
    graph but the first in the k-th comparison (to make the original win it)."""

    def __init__(self, penalties: Sequence[float] = ()) -> None:
        self.model = AnalyticCostModel()
        self.penalties = list(penalties)
        self.compared: list[list[str]] = []

    def compare(self, models: Sequence[Graph], *, use_cache: bool = True) -> Comparison:
        penalty = (
            self.penalties[len(self.compared)] if len(self.compared) < len(self.penalties) else 0.0
        )
        self.compared.append([graph.canonical_hash() for graph in models])
        times = [
            self.model.cost_ms(graph) + (penalty if index else 0.0)
            for index, graph in enumerate(models)
        ]
        measurements = tuple(
            Measurement(graph.canonical_hash(), ms, ms, 1, 1, "all", "cpu")
            for graph, ms in zip(models, times)
        )
        ratios = tuple(ms / times[0] for ms in times)
        return Comparison(measurements, ratios, ratios)


@pytest.fixture(scope="session")
def ruleset() -> RuleSet:
    return default_ruleset()


_GRAPHS: dict[str, Graph] = {}


@pytest.fixture(scope="session")
def small_graph():
    """name -> the small zoo graph, loaded once per test run."""

    def load(name: str) -> Graph:
        if name not in _GRAPHS:
            _GRAPHS[name] = load_model(cached_path(name, "small"))
        return _GRAPHS[name]

    return load


@pytest.fixture
def cost_runner() -> CostRunner:
    return CostRunner()

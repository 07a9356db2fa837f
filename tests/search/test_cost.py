"""The search cost models: memoised by graph hash; perop and e2e drive a search too."""

from __future__ import annotations

from rlflow.cost import OrtSettings, PerOpCostModel, Runner
from rlflow.rewrite.session import RewriteSession
from rlflow.search import SearchCost, make_cost, search
from tests.search.conftest import CostRunner


def test_costs_are_computed_once_per_graph_hash(small_graph):
    graph = small_graph("resnet-18")
    calls = []
    cost = SearchCost("counting", lambda g: calls.append(g) or float(len(g)), OrtSettings())
    assert cost(graph) == cost(graph) == float(len(graph))
    assert len(calls) == 1 and cost.calls == 2 and cost.evaluations == 1
    cost.reset_count()
    assert cost.evaluations == 0
    cost(graph)
    assert len(calls) == 1 and cost.evaluations == 1


def test_perop_cost_drives_a_search(small_graph, ruleset, tmp_path):
    settings = OrtSettings().resolved()
    perop = PerOpCostModel(settings, cache_path=tmp_path / "perop.sqlite", runs=2, warmup=1)
    cost = SearchCost("perop", perop.cost_ms, settings)
    original = small_graph("squeezenet-1.1")
    result = search(
        "greedy", RewriteSession(original, ruleset), cost, runner=CostRunner(), budget=2
    )
    assert result.cost_model == "perop" and result.expansions <= 2
    assert result.cost <= result.original_cost


def test_e2e_cost_and_the_real_runner(small_graph, ruleset):
    """The only test timing real graphs in the search: results are checked for shape, never
    for speed."""
    cost = make_cost("e2e")
    original = small_graph("resnet-18")
    runner = Runner(cost.settings, runs=3, warmup=1, min_time_s=0.0)
    result = search("taso", RewriteSession(original, ruleset), cost, runner=runner, budget=1)
    assert result.cost_model == "e2e" and result.expansions == 1
    assert result.original_ms > 0 and result.optimized_ms > 0 and result.speedup > 0
    assert result.finalists[0].graph_hash == original.canonical_hash()
    assert result.threads == 1 and result.ort_level == "all"


def test_a_cost_for_another_device_chooses_the_result_not_the_timings_here(small_graph, ruleset):
    """A GPU's cost table on a CPU machine (`SearchCost.target`): the cheapest graph by the
    table is the result, even where this machine times it slower than the start graph."""
    from rlflow.cost import AnalyticCostModel

    analytic = AnalyticCostModel()
    original = small_graph("squeezenet-1.1")
    for target, penalty in ((None, 100.0), ("cuda", 100.0)):
        cost = SearchCost("stand-in table", analytic.cost_ms, OrtSettings(), target=target)
        runner = CostRunner(penalties=[penalty])  # every rewritten graph times 100 ms slower
        result = search("greedy", RewriteSession(original, ruleset), cost, runner=runner)
        if target is None:
            assert result.graph is original and result.cost == result.original_cost
        else:
            assert result.cost < result.original_cost and result.actions
            assert len(runner.compared) == 1  # timed once for the report, never confirmed

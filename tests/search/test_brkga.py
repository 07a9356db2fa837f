"""BRKGA (rlflow.search.brkga): the decoder applies the rewrites its keys choose, sites keep their
genes across rewrites, a seeded run is reproducible, biases steer it, the budget is counted in
chromosome evaluations."""

from __future__ import annotations

import numpy as np
import pytest

from rlflow.cost import check_equivalence
from rlflow.errors import RlflowError
from rlflow.rewrite.session import RewriteSession
from rlflow.search import make_cost, search
from rlflow.search.base import Board
from rlflow.search.brkga import BrkgaConfig, Decoder, GeneBiases, evolve, node_name, start_layout
from tests.search.conftest import CostRunner

SMALL = BrkgaConfig(population=6, max_steps=6)


@pytest.fixture(scope="module")
def analytic():
    return make_cost("analytic")


@pytest.fixture
def session(small_graph, ruleset):
    return RewriteSession(small_graph("squeezenet-1.1"), ruleset, model="squeezenet-1.1")


def test_keys_at_one_apply_valid_rewrites_and_the_result_is_equivalent(session):
    layout = start_layout(session)
    assert layout.sites and layout.size == len(layout.sites) + len(session.graph)
    decoded = Decoder(session, layout, SMALL).decode(np.ones(layout.size))

    assert len(decoded.actions) == SMALL.max_steps  # every site on: it stops at the limit
    assert session.actions == [] and session.graph is decoded.original  # decoded on a fork
    replayed = RewriteSession.replay(session.graph, decoded.state(), session.ruleset)
    assert replayed.graph.canonical_hash() == decoded.graph.canonical_hash()
    assert len({action.graph_hash for action in decoded.actions}) == len(decoded.actions)
    report = check_equivalence(session.graph, decoded.graph)
    assert report.equivalent, report.reason


def test_keys_below_the_threshold_apply_nothing(session):
    layout = start_layout(session)
    decoded = Decoder(session, layout, SMALL).decode(np.full(layout.size, 0.49))
    assert decoded.actions == [] and decoded.graph is session.graph


def test_a_site_keeps_its_gene_after_another_site_is_rewritten(session):
    layout = start_layout(session)
    decoder = Decoder(session, layout, SMALL)
    keys = np.zeros(layout.size)
    keys[0] = 1.0
    first = decoder.decode(keys)
    assert len(first.actions) == 1
    rule, site = layout.sites[0]
    assert (first.actions[0].rule, first.actions[0].site) == (rule, site)

    # A start-graph site still offered after the first rewrite, found by its nodes' names.
    graph = first.graph
    ids = [layout.node_ids.get(node_name(node), -1) for node in graph.nodes]
    later = {
        (candidate.rule.name, tuple(ids[i] for i in candidate.site)): candidate
        for candidate in first.candidates()
    }
    gene = next(g for g, key in enumerate(layout.sites) if g > 0 and key in later)
    keys[gene] = 0.9
    second = decoder.decode(keys)
    assert second.actions[0] == first.actions[0]
    expected = later[layout.sites[gene]]
    assert (second.actions[1].rule, second.actions[1].graph_hash) == (
        expected.rule.name,
        expected.graph_hash,
    )


def decoded_graphs(session, analytic, seed: int) -> tuple[list[float], list[str]]:
    """The curve and the graphs decoded by a run on a fresh session (an empty cache)."""
    fresh = RewriteSession(session.original, session.ruleset, model=session.model)
    board = Board(1000)
    run = evolve(fresh, analytic, budget=14, config=SMALL, seed=seed, board=board)
    return run.curve, sorted(s.graph.canonical_hash() for _, s in board.best())


def test_a_seeded_run_is_reproducible(session, analytic):
    first, again, other = (decoded_graphs(session, analytic, seed) for seed in (7, 7, 8))
    assert first == again
    assert first[1] != other[1]  # 14 random chromosomes of another seed decode otherwise


def test_the_curve_counts_every_evaluation_and_never_rises(session, analytic):
    run = evolve(session, analytic, budget=14, config=SMALL, seed=1)
    assert run.evaluations == len(run.curve) == 14
    assert run.generations >= 2  # 6 first, then 5 new per generation (one elite kept)
    assert all(later <= earlier for earlier, later in zip(run.curve, run.curve[1:]))
    assert run.best_cost == run.curve[-1] <= run.start_cost


def test_biases_steer_the_keys(session, analytic):
    size = start_layout(session).size
    off = GeneBiases(np.full(size, 0.01), np.full(size, 0.7), concentration=200.0)
    run = evolve(session, analytic, budget=8, config=SMALL, biases=off, seed=0)
    assert run.best_cost == run.start_cost  # every key is below the threshold: no rewrite
    with pytest.raises(RlflowError, match="gene biases"):
        evolve(session, analytic, budget=2, biases=GeneBiases(np.ones(2), np.ones(2)))


def test_search_accounts_its_budget_and_is_reproducible(session, analytic):
    def run(seed: int):
        fresh = RewriteSession(session.original, session.ruleset, model=session.model)
        return search(
            "brkga", fresh, analytic, runner=CostRunner(), budget=10, seed=seed, config=SMALL
        )

    first, again = run(3), run(3)
    assert first.method == "brkga" and first.expansions == 10
    assert first.actions == again.actions
    assert [f.graph_hash for f in first.finalists] == [f.graph_hash for f in again.finalists]
    assert first.cost <= first.original_cost


@pytest.mark.parametrize(
    ("config", "message"),
    [
        (BrkgaConfig(population=1), "population"),
        (BrkgaConfig(elite_fraction=0.0), "elite fraction"),
        (BrkgaConfig(elite_fraction=0.6, mutant_fraction=0.5), "room for children"),
        (BrkgaConfig(max_steps=0), "max steps"),
    ],
)
def test_bad_parameters_are_clear_errors(session, analytic, config, message):
    with pytest.raises(RlflowError, match=message):
        evolve(session, analytic, budget=2, config=config)
    with pytest.raises(RlflowError, match="budget"):
        evolve(session, analytic, budget=0)

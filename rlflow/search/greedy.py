"""Greedy search: apply the lowest-cost candidate until no candidate lowers the cost.

The simplest baseline, and the one TASO's backtracking is measured against: it never
accepts a step that makes the graph costlier, so it stops in the first local minimum.
"""

from __future__ import annotations

import time

from rlflow.cost import Runner
from rlflow.graph import Graph
from rlflow.rewrite.session import RewriteSession
from rlflow.search.base import DEFAULT_TOP_K, NO_PROGRESS, Board, Progress, SearchResult, finish
from rlflow.search.cost import SearchCost


def search(
    session: RewriteSession,
    cost: SearchCost,
    *,
    budget: int | None = None,
    top_k: int = DEFAULT_TOP_K,
    runner: Runner | None = None,
    progress: Progress = NO_PROGRESS,
    reference: Graph | None = None,
) -> SearchResult:
    """Greedy descent from the session's current graph.

    Args:
        session: where to start (it is not modified: the search works on a fork).
        cost: what to minimise.
        budget: at most this many steps (expansions); None runs to the local minimum.
        top_k: how many of the best graphs seen are measured end to end at the end.
        runner: times the finalists (default: `default_runner` under the cost's settings).
        progress: told of every expansion.
        reference: what the speedups are measured against (default: the start graph).
    """
    started = time.perf_counter()
    cost.reset_count()
    current = session.fork()
    current_cost = cost(current.graph)
    board = Board(top_k)
    board.offer(current_cost, current.fork())
    expansions = 0
    while budget is None or expansions < budget:
        candidates = current.candidates()
        # Each graph is expanded once on a greedy path: its candidates need not stay cached.
        current.cache.pop(current.graph.canonical_hash(), None)
        expansions += 1
        progress.update(1)
        best_index, best_cost = -1, current_cost
        for index, candidate in enumerate(candidates):
            candidate_cost = cost(candidate.graph)
            if board.would_keep(candidate_cost):
                forked = current.fork()
                forked.apply_candidate(candidate)
                board.offer(candidate_cost, forked)
            if candidate_cost < best_cost:  # strict: ties keep the earlier candidate
                best_index, best_cost = index, candidate_cost
        if best_index < 0:
            break
        current.apply_candidate(candidates[best_index])
        current_cost = best_cost
        progress.set_postfix_str(f"cost {current_cost:.4g}", refresh=False)
    return finish(
        "greedy",
        session,
        board,
        cost,
        expansions=expansions,
        started=started,
        runner=runner,
        progress=progress,
        reference=reference,
    )

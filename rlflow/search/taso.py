"""TASO's cost-based backtracking search (Jia et al., SOSP 2019, Algorithm 2).

A priority queue of graphs ordered by cost: pop the cheapest, enumerate its candidates, keep
every unseen one whose cost is under alpha x the best cost so far. alpha > 1 lets the search
pass through slightly costlier graphs to reach better ones beyond; graphs are deduplicated by
canonical hash; the search stops after `budget` expansions (pops) or when the queue empties.

Memory: a candidate graph carries its new weights, megabytes on a full-size model, so the
queue is trimmed to the entries that can still be popped within the remaining budget (exact:
a trimmed entry has at least that many cheaper ones ahead of it), and a graph's candidate
list leaves the session cache once it has been expanded (TASO never expands a graph twice).
"""

from __future__ import annotations

import heapq
import time

from rlflow.cost import Runner
from rlflow.errors import RlflowError
from rlflow.graph import Graph
from rlflow.rewrite.session import RewriteSession
from rlflow.search.base import (
    DEFAULT_TOP_K,
    NO_PROGRESS,
    Board,
    Progress,
    SearchResult,
    finish,
    trim_queue,
)
from rlflow.search.cost import SearchCost

DEFAULT_ALPHA = 1.05
DEFAULT_BUDGET = 1000


def search(
    session: RewriteSession,
    cost: SearchCost,
    *,
    alpha: float = DEFAULT_ALPHA,
    budget: int = DEFAULT_BUDGET,
    top_k: int = DEFAULT_TOP_K,
    runner: Runner | None = None,
    progress: Progress = NO_PROGRESS,
    reference: Graph | None = None,
) -> SearchResult:
    """Backtracking search from the session's current graph.

    Args:
        session: where to start (it is not modified: the search works on forks).
        cost: what to minimise.
        alpha: keep a candidate if its cost is below alpha x the best cost seen (TASO: 1.05).
        budget: at most this many expansions (graphs popped and their candidates costed).
        top_k: how many of the best graphs seen are measured end to end at the end.
        runner: times the finalists (default: `default_runner` under the cost's settings).
        progress: told of every expansion.
        reference: what the speedups are measured against (default: the start graph).
    """
    if alpha < 1.0:
        raise RlflowError(f"alpha must be at least 1.0, got {alpha}")
    if budget < 1:
        raise RlflowError(f"budget must be at least 1, got {budget}")
    started = time.perf_counter()
    cost.reset_count()
    start = session.fork()
    start_cost = cost(start.graph)
    best_cost = start_cost
    board = Board(top_k)
    board.offer(start_cost, start.fork())
    seen = {start.graph.canonical_hash()}
    # Entries are (cost, insertion order, session): ties pop in insertion order, which makes
    # the search deterministic for a deterministic cost.
    queue: list[tuple[float, int, RewriteSession]] = [(start_cost, 0, start)]
    pushed = 1
    expansions = 0
    while queue and expansions < budget:
        _, _, current = heapq.heappop(queue)
        candidates = current.candidates()
        current.cache.pop(current.graph.canonical_hash(), None)
        expansions += 1
        progress.update(1)
        for candidate in candidates:
            digest = candidate.graph_hash  # known without building the graph
            if digest in seen:
                continue
            seen.add(digest)
            candidate_cost = cost(candidate.graph)
            if candidate_cost >= alpha * best_cost:
                continue
            forked = current.fork()
            forked.apply_candidate(candidate)
            board.offer(candidate_cost, forked)
            best_cost = min(best_cost, candidate_cost)
            heapq.heappush(queue, (candidate_cost, pushed, forked))
            pushed += 1
        queue = trim_queue(queue, budget - expansions)
        progress.set_postfix_str(f"best {best_cost:.4g} queue {len(queue)}", refresh=False)
    return finish(
        "taso",
        session,
        board,
        cost,
        expansions=expansions,
        started=started,
        runner=runner,
        progress=progress,
        reference=reference,
    )

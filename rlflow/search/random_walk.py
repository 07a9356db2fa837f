"""Random search: random walks of uniformly drawn candidates, keeping the cheapest graphs seen.

The floor every other method must beat. Walks restart from the start graph after
`walk_length` steps or where no candidate remains; all randomness comes from one numpy
Generator seeded by `seed`, so a run is reproducible.
"""

from __future__ import annotations

import time

import numpy as np

from rlflow.cost import Runner
from rlflow.errors import RlflowError
from rlflow.graph import Graph
from rlflow.rewrite.session import RewriteSession
from rlflow.search.base import DEFAULT_TOP_K, NO_PROGRESS, Board, Progress, SearchResult, finish
from rlflow.search.cost import SearchCost

DEFAULT_BUDGET = 300
DEFAULT_WALK_LENGTH = 20


def search(
    session: RewriteSession,
    cost: SearchCost,
    *,
    budget: int = DEFAULT_BUDGET,
    walk_length: int = DEFAULT_WALK_LENGTH,
    seed: int = 0,
    top_k: int = DEFAULT_TOP_K,
    runner: Runner | None = None,
    progress: Progress = NO_PROGRESS,
    reference: Graph | None = None,
) -> SearchResult:
    """Random walks from the session's current graph.

    Args:
        session: where every walk starts (it is not modified: walks run on forks).
        cost: what the kept graphs are ranked by.
        budget: total steps over all walks (each step is one expansion).
        walk_length: steps per walk before restarting.
        seed: seeds the search's own numpy Generator (its only source of randomness).
        top_k: how many of the best graphs seen are measured end to end at the end.
        runner: times the finalists (default: `default_runner` under the cost's settings).
        progress: told of every step.
        reference: what the speedups are measured against (default: the start graph).
    """
    if budget < 1 or walk_length < 1:
        raise RlflowError(f"budget and walk length must be at least 1, got {budget}, {walk_length}")
    started = time.perf_counter()
    cost.reset_count()
    rng = np.random.default_rng(seed)
    start_hash = session.graph.canonical_hash()
    board = Board(top_k)
    board.offer(cost(session.graph), session.fork())
    best_cost = cost(session.graph)
    expansions = 0
    while expansions < budget:
        walker = session.fork()
        for _ in range(walk_length):
            if expansions >= budget:
                break
            candidates = walker.candidates()
            digest = walker.graph.canonical_hash()
            # Walks restart at the start graph, whose candidates are worth keeping; deeper
            # graphs are rarely revisited and their candidates carry megabytes of weights.
            if digest != start_hash:
                walker.cache.pop(digest, None)
            expansions += 1
            progress.update(1)
            if not candidates:
                break
            walker.apply_candidate(candidates[int(rng.integers(len(candidates)))])
            walker_cost = cost(walker.graph)
            if board.would_keep(walker_cost):
                board.offer(walker_cost, walker.fork())
            best_cost = min(best_cost, walker_cost)
            progress.set_postfix_str(f"best {best_cost:.4g}", refresh=False)
    return finish(
        "random",
        session,
        board,
        cost,
        expansions=expansions,
        started=started,
        runner=runner,
        progress=progress,
        reference=reference,
    )

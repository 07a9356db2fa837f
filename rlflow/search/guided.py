"""Search guided by a learned local advantage (Wu et al., "Learning Local Advantage Functions
for Generalizable Graph Optimizations"): cost only the candidates a model predicts to help.

TASO costs every candidate of every graph it pops; here a model predicts each candidate's
relative cost change from its site's neighbourhood (`rlflow.advantage`), and the search keeps
a frontier of (graph, candidate) pairs ordered by the cost predicted for the result: parent
cost x (1 + predicted change). Each expansion pops the most promising pair (or, with
probability `exploration`, one drawn uniformly from the frontier), applies it, costs the one
graph it gives, and, if that graph is under alpha x the best cost so far (TASO's rule), lists
its candidates, predicts their changes and adds them to the frontier. The budget counts
expansions, as taso's and random's do; each expansion costs one graph, so `evaluated` is the
budget plus the start graph (TASO's is its budget times the candidates per graph).

The search knows the model only as `Advantage`, a function of a graph and its candidates, so
this package stays below the learners. Memory: as in taso, the frontier is trimmed to the
entries that could still be popped greedily within the remaining budget, and a graph's
candidate list leaves the session cache once its candidates are on the frontier.
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Sequence
from typing import Protocol

import numpy as np

from rlflow.cost import Runner
from rlflow.errors import RlflowError
from rlflow.graph import Graph
from rlflow.rewrite import Candidate
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

DEFAULT_BUDGET = 300
DEFAULT_EXPLORATION = 0.1
DEFAULT_ALPHA = 1.05


class Advantage(Protocol):
    """What guides the search: each candidate's predicted relative cost change,
    (C(after) - C(now)) / C(now), negative for a candidate that makes the graph faster."""

    def __call__(self, graph: Graph, candidates: Sequence[Candidate]) -> np.ndarray: ...


def search(
    session: RewriteSession,
    cost: SearchCost,
    *,
    advantage: Advantage,
    budget: int = DEFAULT_BUDGET,
    exploration: float = DEFAULT_EXPLORATION,
    alpha: float = DEFAULT_ALPHA,
    seed: int = 0,
    top_k: int = DEFAULT_TOP_K,
    runner: Runner | None = None,
    progress: Progress = NO_PROGRESS,
    reference: Graph | None = None,
) -> SearchResult:
    """Best-first search over candidates ranked by predicted advantage.

    Args:
        session: where to start (it is not modified: the search works on forks).
        cost: what the graphs reached are costed and ranked by.
        advantage: predicts each candidate's relative cost change (`Advantage`).
        budget: at most this many expansions (candidates applied and their graphs costed).
        exploration: the chance that an expansion pops a frontier entry drawn uniformly
            instead of the most promising one.
        alpha: a graph's candidates join the frontier only if its cost is below alpha x the
            best cost seen (TASO: 1.05).
        seed: seeds the search's own numpy Generator (its only source of randomness).
        top_k: how many of the best graphs seen are measured end to end at the end.
        runner: times the finalists (default: `default_runner` under the cost's settings).
        progress: told of every expansion.
        reference: what the speedups are measured against (default: the start graph).
    """
    if budget < 1:
        raise RlflowError(f"budget must be at least 1, got {budget}")
    if not 0.0 <= exploration <= 1.0:
        raise RlflowError(f"exploration must be in [0, 1], got {exploration}")
    if alpha < 1.0:
        raise RlflowError(f"alpha must be at least 1.0, got {alpha}")
    started = time.perf_counter()
    cost.reset_count()
    rng = np.random.default_rng(seed)
    start = session.fork()
    start_cost = cost(start.graph)
    best_cost = start_cost
    board = Board(top_k)
    board.offer(start_cost, start.fork())
    seen = {start.graph.canonical_hash()}
    # Entries are (predicted cost, insertion order, parent session, candidate): ties pop in
    # insertion order, so a run is a function of the graphs, the model and the seed.
    frontier: list[tuple[float, int, RewriteSession, Candidate]] = []
    pushed = 0

    def extend(parent: RewriteSession, parent_cost: float) -> None:
        nonlocal pushed
        candidates = parent.candidates()  # may move `parent` to the cached version's graph
        parent.cache.pop(parent.graph.canonical_hash(), None)
        fresh = [candidate for candidate in candidates if candidate.graph_hash not in seen]
        if not fresh:
            return
        changes = np.asarray(advantage(parent.graph, fresh), dtype=np.float64)
        if changes.shape != (len(fresh),):
            raise RlflowError(
                f"the advantage model gave {changes.shape} predictions for {len(fresh)} candidates"
            )
        for candidate, change in zip(fresh, changes):
            seen.add(candidate.graph_hash)
            predicted = parent_cost * (1.0 + float(change))
            heapq.heappush(frontier, (predicted, pushed, parent, candidate))
            pushed += 1

    extend(start, start_cost)
    expansions = 0
    while frontier and expansions < budget:
        if exploration > 0.0 and len(frontier) > 1 and rng.random() < exploration:
            index = int(rng.integers(len(frontier)))
            frontier[index], frontier[-1] = frontier[-1], frontier[index]
            _, _, parent, candidate = frontier.pop()
            heapq.heapify(frontier)
        else:
            _, _, parent, candidate = heapq.heappop(frontier)
        child = parent.fork()
        child.apply_candidate(candidate)
        child_cost = cost(child.graph)
        expansions += 1
        progress.update(1)
        if board.would_keep(child_cost):
            board.offer(child_cost, child.fork())
        promising = child_cost < alpha * best_cost
        best_cost = min(best_cost, child_cost)
        if promising:
            extend(child, child_cost)
        frontier = trim_queue(frontier, budget - expansions)
        progress.set_postfix_str(f"best {best_cost:.4g} frontier {len(frontier)}", refresh=False)
    return finish(
        "guided",
        session,
        board,
        cost,
        expansions=expansions,
        started=started,
        runner=runner,
        progress=progress,
        reference=reference,
    )

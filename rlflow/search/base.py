"""What every search method shares: the result record, the board of best graphs found, and
the final end-to-end measurement that decides which graph (possibly the original) is returned.

A cost model only ranks graphs; what a search returns is decided by timing its best few
distinct graphs and the original in one interleaved onnxruntime run (the selection run). The
fastest is then timed again against the original alone (the confirmation run): the largest
of several noisy speedups overstates its graph's, so the speedup reported is the
confirmation's, and the graph is kept only if it is faster there too. Otherwise the result is
the original with speedup 1.0: a search never reports a gain it did not measure.

Every graph timed there is first rid of its twins (`merge_twins`: a node computing what
another computes). A graph with twins and the graph without hash alike (the hash is of what the
outputs compute), so no search step can tell them apart, yet the twins run twice: per-site
rewrites leave them where one tensor has several readers, and onnxruntime's own pass that
merges them never runs over a model that runs as written.
"""

from __future__ import annotations

import heapq
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Protocol

from rlflow.cost import OrtSettings, Runner
from rlflow.graph import Graph
from rlflow.rewrite.rules.simplify import merge_twins
from rlflow.rewrite.session import Action, EpisodeState, RewriteSession
from rlflow.search.cost import SearchCost

DEFAULT_TOP_K = 3
"""How many of the best distinct graphs (by cost) are measured end to end with the original."""


def default_runner(settings: OrtSettings, min_time_s: float | None = None) -> Runner:
    """The Runner of the final measurements: adaptive (until every ratio to the original is
    known within 2%, 1-30 s of timed runs per graph; see `rlflow.cost.runner.AdaptiveStop`)
    unless `min_time_s` fixes the timed time per graph. Search, optimize and bench all time
    their results so."""
    return Runner(settings, runs=30, min_time_s=min_time_s)


class Progress(Protocol):
    """What a search reports progress to (a tqdm bar fits)."""

    def update(self, n: int = 1) -> object: ...

    def set_postfix_str(self, s: str = "", refresh: bool = True) -> object: ...


class _NoProgress:
    def update(self, n: int = 1) -> None:
        pass

    def set_postfix_str(self, s: str = "", refresh: bool = True) -> None:
        pass


NO_PROGRESS: Progress = _NoProgress()


@dataclass(frozen=True)
class Finalist:
    """A graph measured end to end at the end of a search (the original included)."""

    graph_hash: str
    cost: float
    ms: float
    """Its latency on the original's footing (`Comparison.scaled_ms`): original_ms / speedup."""
    speedup: float
    steps: int


@dataclass
class SearchResult:
    """The outcome of one search: the graph returned, how it was reached, what it costs.

    `graph` is the fastest measured of the finalists, if a confirmation run found it faster
    than the original too (else the original); `state` replays it from the original
    (`RewriteSession.replay`). Costs are in the search's cost model; `speedup` (the median
    of per-pair ratios), `original_ms` (the original's median run) and `optimized_ms`
    (original_ms / speedup, `Comparison.scaled_ms`) come from one interleaved end-to-end run:
    the confirmation run when there was one, else the selection run. `finalists` are the
    selection run's.
    """

    method: str
    model: str
    graph: Graph
    state: EpisodeState
    cost: float
    original_cost: float
    cost_model: str
    expansions: int
    evaluated: int
    """Distinct graphs costed by the cost model (the candidates evaluated)."""
    original_ms: float
    optimized_ms: float
    speedup: float
    search_s: float
    measure_s: float
    threads: int
    ort_level: str
    provider: str
    finalists: list[Finalist] = field(default_factory=list)
    confirmed: bool | None = None
    """None: the original won the selection run; else whether the confirmation run agreed."""
    cost_details: dict[str, Any] | None = None
    """What the cost model reports beyond its name (a cost table: its device and the share of
    the cost its fitted roofline estimated); None for the plain models."""

    @property
    def actions(self) -> list[Action]:
        return self.state.actions

    @property
    def wall_s(self) -> float:
        """Search plus final measurement, in seconds."""
        return self.search_s + self.measure_s

    @property
    def rules_applied(self) -> dict[str, int]:
        """Rule name -> times applied on the path to `graph`, most used first."""
        return dict(Counter(action.rule for action in self.actions).most_common())


class Board:
    """The `size` lowest-cost distinct graphs seen, each with the session that reached it.

    Ties keep the graph seen first, so a deterministic search gives a deterministic board.
    """

    def __init__(self, size: int = DEFAULT_TOP_K) -> None:
        self.size = size
        self._heap: list[tuple[float, int, str, RewriteSession]] = []  # max-heap by -cost
        self._hashes: set[str] = set()
        self._counter = 0

    def offer(self, cost: float, session: RewriteSession) -> None:
        digest = session.graph.canonical_hash()
        if digest in self._hashes:
            return
        self._counter += 1
        entry = (-cost, -self._counter, digest, session)
        if len(self._heap) < self.size:
            heapq.heappush(self._heap, entry)
            self._hashes.add(digest)
        elif entry > self._heap[0]:
            _, _, dropped, _ = heapq.heapreplace(self._heap, entry)
            self._hashes.discard(dropped)
            self._hashes.add(digest)

    def would_keep(self, cost: float) -> bool:
        """Whether a graph of this cost would enter the board (to skip forking sessions)."""
        return len(self._heap) < self.size or cost < -self._heap[0][0]

    def best(self) -> list[tuple[float, RewriteSession]]:
        """Lowest cost first (ties: seen first)."""
        return [
            (-neg_cost, session) for neg_cost, _, _, session in sorted(self._heap, reverse=True)
        ]


def finish(
    method: str,
    session: RewriteSession,
    board: Board,
    cost: SearchCost,
    *,
    expansions: int,
    started: float,
    runner: Runner | None = None,
    progress: Progress = NO_PROGRESS,
    reference: Graph | None = None,
    capped_by_cost: bool = True,
) -> SearchResult:
    """Measure the search's start graph and the board's graphs that cost no more than it,
    interleaved in one run, and return the fastest (the start graph if nothing beats it); for
    a cost that stands for another device (`SearchCost.target`), the cheapest by that cost,
    with the timings here reported beside it. `capped_by_cost=False` times every graph of the
    board whatever `cost` says of it: a replay's graph was chosen by another cost (the per-op
    cost where it was made, say), which the cheap one here must not overrule.

    Speedups are against `reference` when given (in offline mode: the user's original under
    onnxruntime's defaults, while the search began from a start state run as written), timed
    in the same runs; else against the start graph itself.
    """
    search_s = time.perf_counter() - started
    measure_started = time.perf_counter()
    start = session.original
    start_cost = cost(start)
    start_hash = start.canonical_hash()
    contenders = [
        (graph_cost, candidate)
        for graph_cost, candidate in board.best()
        if (graph_cost <= start_cost or not capped_by_cost)
        and candidate.graph.canonical_hash() != start_hash
    ]
    runner = runner or default_runner(cost.settings)
    unchanged = session.fork()
    unchanged.graph, unchanged.actions = start, []
    sessions = [unchanged, *(candidate for _, candidate in contenders)]
    costs = [start_cost, *(graph_cost for graph_cost, _ in contenders)]
    for index, member in enumerate(sessions):
        merged, twins = merge_twins(member.graph)
        if twins:  # the same hash, so the episode still ends where it says
            member.graph, costs[index] = merged, cost(merged)
    lead = [] if reference is None else [reference]  # timed first: ratios are against it
    progress.set_postfix_str(f"timing {len(sessions) + len(lead)} graphs end to end", refresh=True)
    selection = runner.compare([*lead, *(member.graph for member in sessions)])
    offset = len(lead)
    finalists = [
        Finalist(
            graph_hash=measurement.graph_hash,
            cost=graph_cost,
            ms=ms,
            speedup=speedup,
            steps=len(finalist.actions),
        )
        for measurement, ms, speedup, graph_cost, finalist in zip(
            selection.measurements[offset:],
            selection.scaled_ms[offset:],
            selection.speedups[offset:],
            costs,
            sessions,
        )
    ]
    winner = min(range(len(sessions)), key=lambda index: selection.ratios[offset + index])
    if cost.target is not None:  # timings here rank graphs for the wrong device
        winner = min(range(len(sessions)), key=lambda index: costs[index])
    final, confirmed = selection, None
    if winner != 0 and cost.target is None:
        progress.set_postfix_str("confirming the fastest against the start", refresh=True)
        final = runner.compare([*lead, start, sessions[winner].graph], use_cache=False)
        confirmed = final.ratios[offset + 1] < final.ratios[offset]
        sessions, costs = [sessions[0], sessions[winner]], [costs[0], costs[winner]]
        winner = 1 if confirmed else 0
    chosen, chosen_cost = sessions[winner], costs[winner]
    reward = 100.0 * (start_cost - chosen_cost) / start_cost if start_cost else 0.0
    measurement = final.measurements[offset + winner]
    speedup = final.speedups[offset + winner] if reference is not None or winner else 1.0
    return SearchResult(
        method=method,
        model=session.model,
        graph=chosen.graph,
        state=chosen.state(reward=reward),
        cost=chosen_cost,
        original_cost=start_cost,
        cost_model=cost.name,
        expansions=expansions,
        evaluated=cost.evaluations,
        original_ms=final.scaled_ms[0],
        optimized_ms=final.scaled_ms[offset + winner],
        speedup=speedup,
        search_s=search_s,
        measure_s=time.perf_counter() - measure_started,
        threads=measurement.threads,
        ort_level=measurement.ort_level,
        provider=measurement.provider,
        finalists=finalists,
        confirmed=confirmed,
        cost_details=cost.details(),
    )


def trim_queue(queue: list, remaining: int) -> list:
    """A best-first queue (a heap) cut to its `remaining` best entries once it holds more than
    twice that: entries past what the budget can still expand are never popped."""
    if len(queue) > 2 * remaining:
        queue = heapq.nsmallest(remaining, queue)
        heapq.heapify(queue)
    return queue

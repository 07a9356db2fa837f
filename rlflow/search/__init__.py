"""Search baselines over rewrite sessions: greedy, TASO's backtracking, random walks, and a
search guided by a learned local advantage (given as a function: `rlflow.search.guided`).

Each method drives a `RewriteSession` with the same rules the learners use, ranks graphs with
a `SearchCost` (analytic, per-op measured or end-to-end measured), and ends by timing its
best few graphs against the original in one run, then the fastest again in a confirmation
run (see `base.finish`): `search(METHOD, session, cost, ...)`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rlflow.errors import RlflowError
from rlflow.rewrite.session import RewriteSession
from rlflow.search import brkga, greedy, guided, random_walk, taso
from rlflow.search.base import (
    DEFAULT_TOP_K,
    Board,
    Finalist,
    Progress,
    SearchResult,
    default_runner,
    finish,
)
from rlflow.search.cost import COST_MODELS, SearchCost, make_cost

METHODS: dict[str, Callable[..., SearchResult]] = {
    "greedy": greedy.search,
    "taso": taso.search,
    "random": random_walk.search,
    "guided": guided.search,
    "brkga": brkga.search,
}


def search(method: str, session: RewriteSession, cost: SearchCost, **options: Any) -> SearchResult:
    """Run the named method; `options` are its keyword arguments (budget, alpha, seed, ...)."""
    try:
        run = METHODS[method]
    except KeyError:
        raise RlflowError(
            f"unknown search method {method!r}; choose one of {', '.join(METHODS)}"
        ) from None
    return run(session, cost, **options)


__all__ = [
    "COST_MODELS",
    "DEFAULT_TOP_K",
    "METHODS",
    "Board",
    "Finalist",
    "Progress",
    "SearchCost",
    "SearchResult",
    "default_runner",
    "finish",
    "make_cost",
    "search",
]

"""The cost a search minimises: analytic, per-op measured, end-to-end measured or a cost table's,
by graph hash.

A search asks for the cost of the same graph many times (TASO re-derives a graph by several
paths; random walks revisit), so every cost is computed once per canonical hash. The three
models trade fidelity for speed: `analytic` is a roofline sum (microseconds per graph),
`perop` times each distinct operator once in onnxruntime (cached on disk), `e2e` times every
graph end to end (seconds per graph: only for small budgets). `table:NAME` or `table:PATH`
sums per-op times measured once on another device (`rlflow.cost.table`: a GPU's, on any
machine), and reports how much of the cost its fitted roofline had to estimate; a table of
another provider than the one here makes graphs for that provider (`SearchCost.target`).

In offline mode (`settings.ort_level` "disable", what `rlflow.optimize` passes) graphs run as
written, so each operator runs as it is timed alone and the per-op sum tracks latency; `perop`
and `e2e` also time a graph that declares its level (`ort_config`, e.g. a start state from
onnxruntime's optimiser) at that level, whatever `settings` say.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rlflow.cost import AnalyticCostModel, OrtSettings, PerOpCostModel, Runner
from rlflow.cost.table import CostTable, TableCostModel, load_table
from rlflow.errors import RlflowError
from rlflow.graph import Graph

COST_MODELS: tuple[str, ...] = ("analytic", "perop", "e2e")
TABLE_PREFIX = "table:"
"""`table:NAME` (shipped with rlflow) or `table:PATH`: a cost table's cost (see above)."""


class SearchCost:
    """A cost function of graphs, memoised by canonical hash.

    Args:
        name: the cost model's name, reported with every result.
        cost_ms: the underlying function (graph -> estimated or measured ms).
        settings: the onnxruntime settings the cost stands for; the final end-to-end
            measurement of a search uses the same ones.
        details: what results report about the cost model beyond its name (a table's
            device and miss share); None: nothing.
        target: the provider the graphs are for when it is not the one measuring here (a
            GPU's cost table on a CPU machine, `CostTable.made_elsewhere`): a search then
            chooses its result by this cost, since timings here would rank them for the
            wrong device; None: this machine's provider.
    """

    def __init__(
        self,
        name: str,
        cost_ms: Callable[[Graph], float],
        settings: OrtSettings,
        details: Callable[[], dict[str, Any]] | None = None,
        target: str | None = None,
    ):
        self.name = name
        self.settings = settings
        self.target = target
        self._cost_ms = cost_ms
        self._details = details
        self._by_hash: dict[str, float] = {}
        self._asked: set[str] = set()
        self.calls = 0
        """How many times a cost was asked for (cache hits included)."""

    @property
    def evaluations(self) -> int:
        """How many distinct graphs were costed since `reset_count` (cache hits included)."""
        return len(self._asked)

    def reset_count(self) -> None:
        """Start counting distinct graphs afresh (a search calls it as it starts), keeping the
        memoised costs."""
        self._asked = set()

    def __call__(self, graph: Graph) -> float:
        self.calls += 1
        digest = graph.canonical_hash()
        self._asked.add(digest)
        cost = self._by_hash.get(digest)
        if cost is None:
            cost = float(self._cost_ms(graph))
            self._by_hash[digest] = cost
        return cost

    def details(self) -> dict[str, Any] | None:
        """What results report about the cost model now (None for the plain models)."""
        return self._details() if self._details is not None else None

    def __repr__(self) -> str:
        return f"SearchCost({self.name!r}, {self.evaluations} graphs costed)"


def table_elsewhere(name: str | None, settings: OrtSettings) -> CostTable | None:
    """The cost table the cost `name` names, when it was measured on another provider than
    `settings`' (`CostTable.made_elsewhere`); None for any other cost."""
    if not name or not name.startswith(TABLE_PREFIX):
        return None
    table = load_table(name[len(TABLE_PREFIX) :])
    return table if table.made_elsewhere(settings.resolved().provider) else None


def make_cost(name: str = "analytic", settings: OrtSettings | None = None) -> SearchCost:
    """The named cost model under `settings` (default: 1 thread, ORT level all; "disable" for
    offline mode); `table:NAME|PATH` ignores them: its times were taken where it was made."""
    settings = (settings or OrtSettings()).resolved()
    if name.startswith(TABLE_PREFIX):
        table = TableCostModel(name[len(TABLE_PREFIX) :])
        target = table.table.provider if table.table.made_elsewhere(settings.provider) else None
        return SearchCost(name, table.cost_ms, settings, details=table.usage, target=target)
    if name == "analytic":
        model = AnalyticCostModel(settings=settings)
        return SearchCost(name, model.cost_ms, settings)
    if name == "perop":
        perop = PerOpCostModel(settings)
        return SearchCost(name, perop.cost_ms, settings)
    if name == "e2e":
        # Short timings: a search measures many graphs, and only ranks them; the final
        # comparison of the best few is the careful, interleaved one.
        runner = Runner(settings, runs=10, min_time_s=0.05, max_runs=200)
        warmed = False

        def e2e_ms(graph: Graph) -> float:
            nonlocal warmed
            if not warmed:
                # The first graph a process times reads slow (seen: 0.083 vs 0.053 ms); that
                # first graph is the original, which would then look easy to beat.
                runner.measure(graph, use_cache=False)
                warmed = True
            return runner.measure(graph, use_cache=False).low_ms

        return SearchCost(name, e2e_ms, settings)
    raise RlflowError(
        f"unknown cost model {name!r}; choose one of {', '.join(COST_MODELS)}, table:NAME or "
        "table:PATH"
    )

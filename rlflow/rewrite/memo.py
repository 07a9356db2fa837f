"""Reusing sites and rewrites from one candidate enumeration to the next.

After one rewrite, most of a graph is the graph before, on the same Node objects: the sites
found at most anchors are found again, and most rewrites come out the same, yet finding and
rewriting them again (matching, new weights, shape inference, hashing the new weights) is most
of what an enumeration costs once results are derived cheaply (rlflow.graph.derive). Matching
at an anchor and rewriting a match are functions of the match and of what they ask the graph (a
value's type, a constant, a node's readers...), so both run against a `LoggedGraph` that writes
down every answer, and a result is reused on a later graph only if that graph gives every one
of those answers again. Code asking anything else is never reused.
"""

from __future__ import annotations

from typing import Any

from rlflow.graph import Graph, GraphError, Node
from rlflow.graph.derive import Derivation
from rlflow.rewrite.replacement import Match, RewriteRejected, prepare_replacement
from rlflow.rewrite.rule import Rule


class LoggedGraph:
    """The part of a Graph that matching, checks and rewrites read, answered and logged.

    `complete` turns False when anything else is read (passed through): such a rewrite
    depends on more than the log says, and is not reused.
    """

    def __init__(self, graph: Graph) -> None:
        self._graph = graph
        self.log: list[tuple[str, str, Any]] = []
        self.complete = True
        self.opset = graph.opset  # the same along a derivation; compared whole on reuse
        self.values = _LoggedMapping(self, "has_value", "value", graph.values)
        self.initializers = _LoggedMapping(self, "is_constant", "constant", graph.initializers)

    def _ask(self, question: str, name: str) -> Any:
        answer = _QUESTIONS[question](self._graph, name)
        self.log.append((question, name, answer))
        return answer

    def value(self, name: str):
        answer = self._ask("value", name)
        if answer is None:
            return self._graph.value(name)  # raises GraphError naming it
        return answer

    def constant(self, name: str):
        return self._ask("constant", name)

    def is_constant(self, name: str) -> bool:
        return self._ask("is_constant", name)

    def is_output(self, name: str) -> bool:
        return self._ask("is_output", name)

    def producer(self, name: str):
        return self._ask("producer", name)

    def consumers(self, name: str):
        return self._ask("consumers", name)

    def __getattr__(self, attribute: str) -> Any:
        self.complete = False
        return getattr(self._graph, attribute)

    def __len__(self) -> int:
        self.complete = False
        return len(self._graph)


class _LoggedMapping:
    """`graph.values` or `graph.initializers` for membership and lookup, logged."""

    def __init__(self, logged: LoggedGraph, has: str, get: str, mapping: dict) -> None:
        self._logged, self._has, self._get, self._mapping = logged, has, get, mapping

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and self._logged._ask(self._has, name)

    def get(self, name: str, default: Any = None) -> Any:
        answer = self._logged._ask(self._get, name)
        return default if answer is None else answer

    def __getitem__(self, name: str) -> Any:
        answer = self._logged._ask(self._get, name)
        if answer is None:
            raise KeyError(name)
        return answer

    def __getattr__(self, attribute: str) -> Any:
        self._logged.complete = False
        return getattr(self._mapping, attribute)

    def __iter__(self):
        self._logged.complete = False
        return iter(self._mapping)

    def __len__(self) -> int:
        self._logged.complete = False
        return len(self._mapping)


_QUESTIONS = {
    "value": lambda graph, name: graph.values.get(name),
    "constant": lambda graph, name: graph.initializers.get(name),
    "is_constant": lambda graph, name: name in graph.initializers,
    "has_value": lambda graph, name: name in graph.values,
    "is_output": lambda graph, name: graph.is_output(name),
    "producer": lambda graph, name: graph.producer(name),
    "consumers": lambda graph, name: graph.consumers(name),
}
# Nodes, arrays and lists of nodes must be the very same objects; the rest equal.
_BY_IDENTITY = {"constant", "producer"}


def _same(question: str, before: Any, now: Any) -> bool:
    if question in _BY_IDENTITY:
        return before is now
    if question == "consumers":
        return len(before) == len(now) and all(a is b for a, b in zip(before, now, strict=True))
    return before == now


class _Entry:
    """One memoised answer: the objects it was computed for, what it read, and the result."""

    def __init__(self, refs: tuple, logged: LoggedGraph, result: Any) -> None:
        self.refs = refs  # holds the nodes the key names by id, so their ids stay theirs
        self.log = logged.log
        self.opset = dict(logged.opset)
        self.result = result

    def holds_on(self, graph: Graph, refs: tuple) -> bool:
        return (
            all(a is b for a, b in zip(self.refs, refs, strict=True))
            and graph.opset == self.opset
            and all(
                _same(question, answer, _QUESTIONS[question](graph, name))
                for question, name, answer in self.log
            )
        )


class RewriteMemo:
    """The sites found at each anchor and the rewrites of each match, in the last enumeration
    and in the current one, reused where the graph answers alike.

    `start()` begins an enumeration: what the one before used is kept for it, older entries
    are dropped (entries hold new weights), so a memo serves one line of graphs at a time.
    """

    def __init__(self) -> None:
        self._last: dict[tuple, _Entry] = {}
        self._now: dict[tuple, _Entry] = {}
        self.reused = 0
        self.computed = 0

    def start(self) -> None:
        self._last, self._now = self._now, {}

    def sites(self, rule: Rule, graph: Graph, anchor: Node) -> list[Match]:
        """`rule.anchor_sites(graph, anchor)`."""
        refs = (anchor,)
        entry = self._find(("sites", rule, id(anchor)), graph, refs)
        if entry is None:
            logged = LoggedGraph(graph)
            found = rule.anchor_sites(logged, anchor)  # type: ignore[arg-type]
            entry = self._keep(("sites", rule, id(anchor)), refs, logged, found)
        return entry.result

    def derive(self, rule: Rule, graph: Graph, match: Match) -> Derivation:
        """`rule.derive(graph, match)`."""
        refs = (*match.nodes, *match.keep)
        key = (
            "rewrite",
            rule,
            match.pattern_index,
            tuple(map(id, refs)),
            len(match.nodes),
            tuple(sorted(match.bindings.items())),
            match.outputs,
        )
        entry = self._find(key, graph, refs)
        if entry is None:
            logged = LoggedGraph(graph)
            try:
                replacement = rule.rewrite(logged, match)  # type: ignore[arg-type]
                nodes, values, renames = prepare_replacement(logged, match, replacement)  # type: ignore[arg-type]
                result: Any = (nodes, list(values.values()), renames, replacement.initializers)
            except RewriteRejected as error:
                result = error
            entry = self._keep(key, refs, logged, result)
        if isinstance(entry.result, RewriteRejected):
            raise RewriteRejected(str(entry.result))
        nodes, values, renames, initializers = entry.result
        try:
            return Derivation(graph, match.nodes, nodes, initializers, values, renames)
        except GraphError as error:
            raise RewriteRejected(str(error)) from None

    def _find(self, key: tuple, graph: Graph, refs: tuple) -> _Entry | None:
        entry = self._now.get(key) or self._last.get(key)
        if entry is None or not entry.holds_on(graph, refs):
            return None
        self.reused += 1
        self._now[key] = entry
        return entry

    def _keep(self, key: tuple, refs: tuple, logged: LoggedGraph, result: Any) -> _Entry:
        self.computed += 1
        entry = _Entry(refs, logged, result)
        if logged.complete:  # otherwise it read more than its log says: not reusable
            self._now[key] = entry
        return entry

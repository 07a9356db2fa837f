"""A RuleSet enumerates the candidate rewrites of a graph: every site of every rule, applied.

Candidates are the actions of the learners and searches, so the list is deterministic (rules
in order, anchors in graph order) and deduplicated by the canonical hash of the result. A
result with a cycle, or with more operators than the cap (TASO's: twice the original graph's
count), is not a candidate.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from rlflow.graph import Graph
from rlflow.graph.derive import Derivation
from rlflow.rewrite.replacement import Match, RewriteRejected
from rlflow.rewrite.rule import GraphIndex, Rule

if TYPE_CHECKING:
    from rlflow.rewrite.memo import RewriteMemo


@dataclass(frozen=True, eq=False)
class Candidate:
    """One applicable rewrite: the rule, its site (indices into the source graph's nodes,
    anchor first) and the rewritten graph.

    The graph is built on first use of `graph`: an enumeration offers many candidates and an
    agent takes one, while `graph_hash`, `num_nodes` and `num_inputs` come without building it.
    """

    rule: Rule
    site: tuple[int, ...]
    result: Derivation

    @property
    def action(self) -> str:
        return self.rule.name

    @property
    def graph(self) -> Graph:
        return self.result.graph()

    @property
    def graph_hash(self) -> str:
        """`graph.canonical_hash()`."""
        return self.result.hash

    @property
    def num_nodes(self) -> int:
        """`len(graph)`."""
        return self.result.num_nodes

    @property
    def num_inputs(self) -> int:
        """The total length of the graph's node input lists (a bound on its edges)."""
        return self.result.num_inputs


class RuleSet:
    """An ordered collection of rules with unique names."""

    def __init__(self, rules: Iterable[Rule]) -> None:
        self.rules = list(rules)
        self._by_name = {rule.name: rule for rule in self.rules}
        if len(self._by_name) != len(self.rules):
            seen: set[str] = set()
            twice = sorted({r.name for r in self.rules if r.name in seen or seen.add(r.name)})
            raise ValueError(f"rule names must be unique; repeated: {twice}")

    def __iter__(self) -> Iterator[Rule]:
        return iter(self.rules)

    def __len__(self) -> int:
        return len(self.rules)

    def __getitem__(self, name: str) -> Rule:
        return self._by_name[name]

    def __contains__(self, name: object) -> bool:
        return name in self._by_name

    @property
    def names(self) -> list[str]:
        return [rule.name for rule in self.rules]

    def select(
        self,
        portable: bool = False,
        names: Iterable[str] | None = None,
        provider: str | None = None,
    ) -> RuleSet:
        """The rules emitting only standard ONNX ops (if `portable`), restricted to `names`,
        and, for a `provider` other than the CPU, without the CPU-only ones (`Rule.cpu_only`)."""
        wanted = None if names is None else set(names)
        off_cpu = provider is not None and provider != "cpu"
        return RuleSet(
            rule
            for rule in self.rules
            if (not portable or rule.portable)
            and (wanted is None or rule.name in wanted)
            and not (off_cpu and rule.cpu_only)
        )

    def sites(self, graph: Graph, memo: RewriteMemo | None = None) -> list[tuple[Rule, Match]]:
        """Every (rule, match) that passes its check, without applying any."""
        index = GraphIndex(graph)
        return [(rule, match) for rule in self.rules for match in rule.sites(graph, index, memo)]

    def candidates(
        self, graph: Graph, max_ops: int | None = None, memo: RewriteMemo | None = None
    ) -> list[Candidate]:
        """Every distinct rewritten graph, one per result hash.

        Args:
            graph: the current graph.
            max_ops: reject results with more operators than this; default twice the
                current graph's count (a session passes twice its original graph's).
            memo: reuses the sites and rewrites of the previous call where the graph answers
                alike (the same candidates, found with less matching and fewer new weights).
        """
        limit = 2 * len(graph) if max_ops is None else max_ops
        position = node_positions(graph)
        seen = {graph.canonical_hash()}
        candidates = []
        if memo is not None:
            memo.start()
        for rule, match in self.sites(graph, memo):
            result = derive_within(rule, graph, match, limit, memo)
            if result is None or result.hash in seen:
                continue
            seen.add(result.hash)
            candidates.append(Candidate(rule, site_of(match, position), result))
        return candidates


def node_positions(graph: Graph) -> dict[int, int]:
    """id(node) -> its index in `graph.nodes`: what `site_of` turns a match's nodes into."""
    return {id(node): index for index, node in enumerate(graph.nodes)}


def site_of(match: Match, position: dict[int, int]) -> tuple[int, ...]:
    """A match's site: the indices of its nodes, anchor first, then the ones it keeps."""
    return tuple(position[id(node)] for node in (*match.nodes, *match.keep))


def derive_within(
    rule: Rule, graph: Graph, match: Match, max_ops: int, memo: RewriteMemo | None = None
) -> Derivation | None:
    """The rule's result at `match`, or None when the rule rejects it or it has more than
    `max_ops` operators (not a candidate): the test every enumeration of candidates applies."""
    try:
        result = rule.derive(graph, match) if memo is None else memo.derive(rule, graph, match)
    except RewriteRejected:
        return None
    return None if result.num_nodes > max_ops else result


def default_ruleset(portable: bool = False, refresh: bool = False) -> RuleSet:
    """Every rule that passed verification (built-in and generated); contrib-free if `portable`.

    Verdicts come from the cache (see rlflow.rewrite.verify); rules not verified yet are
    verified now, once. Rules that fail are left out (list them with `verify_rules()`), and so
    are the CPU-only ones (`Rule.cpu_only`) where the models will run on a GPU
    (`default_provider`): onnxruntime would run their operators on the CPU, between copies.
    """
    from rlflow.cost.session import default_provider
    from rlflow.rewrite.rules import all_rules
    from rlflow.rewrite.verify import verify_rules

    rules = all_rules()
    passed = {result.rule for result in verify_rules(rules, refresh=refresh) if result.passed}
    verified = RuleSet(rule for rule in rules if rule.name in passed)
    return verified.select(portable=portable, provider=default_provider())

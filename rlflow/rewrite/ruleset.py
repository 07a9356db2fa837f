"""A RuleSet enumerates the candidate rewrites of a graph: every site of every rule, applied.

Candidates are the actions of the learners and searches, so the list is deterministic (rules
in order, anchors in graph order) and deduplicated by the canonical hash of the result. A
result with a cycle, or with more operators than the cap (TASO's: twice the original graph's
count), is not a candidate.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from rlflow.graph import Graph
from rlflow.rewrite.rule import GraphIndex, Match, RewriteRejected, Rule


@dataclass(frozen=True, eq=False)
class Candidate:
    """One applicable rewrite: the rule, its site (indices into the source graph's nodes,
    anchor first) and the rewritten graph."""

    rule: Rule
    site: tuple[int, ...]
    graph: Graph

    @property
    def action(self) -> str:
        return self.rule.name


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

    def select(self, portable: bool = False, names: Iterable[str] | None = None) -> RuleSet:
        """The rules emitting only standard ONNX ops (if `portable`), restricted to `names`."""
        wanted = None if names is None else set(names)
        return RuleSet(
            rule
            for rule in self.rules
            if (not portable or rule.portable) and (wanted is None or rule.name in wanted)
        )

    def sites(self, graph: Graph) -> list[tuple[Rule, Match]]:
        """Every (rule, match) that passes its check, without applying any."""
        index = GraphIndex(graph)
        return [(rule, match) for rule in self.rules for match in rule.sites(graph, index)]

    def candidates(self, graph: Graph, max_ops: int | None = None) -> list[Candidate]:
        """Every distinct rewritten graph, one per result hash.

        Args:
            graph: the current graph.
            max_ops: reject results with more operators than this; default twice the
                current graph's count (a session passes twice its original graph's).
        """
        limit = 2 * len(graph) if max_ops is None else max_ops
        position = {id(node): index for index, node in enumerate(graph.nodes)}
        seen = {graph.canonical_hash()}
        candidates = []
        for rule, match in self.sites(graph):
            try:
                result = rule.apply(graph, match)
            except RewriteRejected:
                continue
            if len(result) > limit:
                continue
            digest = result.canonical_hash()
            if digest in seen:
                continue
            seen.add(digest)
            site = tuple(position[id(node)] for node in (*match.nodes, *match.keep))
            candidates.append(Candidate(rule, site, result))
        return candidates


def default_ruleset(portable: bool = False, refresh: bool = False) -> RuleSet:
    """Every rule that passed verification (built-in and generated); contrib-free if `portable`.

    Verdicts come from the cache (see rlflow.rewrite.verify); rules not verified yet are
    verified now, once. Rules that fail are left out (list them with `verify_rules()`).
    """
    from rlflow.rewrite.rules import all_rules
    from rlflow.rewrite.verify import verify_rules

    rules = all_rules()
    passed = {result.rule for result in verify_rules(rules, refresh=refresh) if result.passed}
    return RuleSet(rule for rule in rules if rule.name in passed).select(portable=portable)

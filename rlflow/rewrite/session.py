"""A gym-free rewrite session: the current graph, its candidates, apply, fork, replay, validate.

The env, the search baselines and the dream all drive this one object (CompilerGym's pure
`CompilationSession` under a thin gym wrapper), so every result is an action list that
`RewriteSession.replay` re-applies and re-checks hash by hash.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from rlflow.cost import EquivalenceReport, check_equivalence
from rlflow.errors import RlflowError
from rlflow.graph import Graph
from rlflow.rewrite.memo import RewriteMemo
from rlflow.rewrite.ruleset import Candidate, RuleSet, default_ruleset


@dataclass(frozen=True)
class Action:
    """One applied rewrite: the rule's name, its site in the graph it was applied to, and the
    canonical hash of the graph it produced (what replay checks)."""

    rule: str
    site: tuple[int, ...]
    graph_hash: str

    def to_json(self) -> dict[str, Any]:
        return {"rule": self.rule, "site": list(self.site), "graph_hash": self.graph_hash}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Action:
        return cls(str(data["rule"]), tuple(int(i) for i in data["site"]), str(data["graph_hash"]))


@dataclass
class EpisodeState:
    """Everything needed to reproduce an episode: the model, the hash it started from, the
    actions in order, the hash it ended on, and the reward it earned."""

    model: str
    original_hash: str
    actions: list[Action] = field(default_factory=list)
    final_hash: str = ""
    reward: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "original_hash": self.original_hash,
            "actions": [action.to_json() for action in self.actions],
            "final_hash": self.final_hash,
            "reward": float(self.reward),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> EpisodeState:
        try:
            return cls(
                model=str(data.get("model", "")),
                original_hash=str(data["original_hash"]),
                actions=[Action.from_json(item) for item in data.get("actions", [])],
                final_hash=str(data["final_hash"]),
                reward=float(data.get("reward", 0.0)),
            )
        except (KeyError, TypeError, ValueError) as error:
            raise RlflowError(f"malformed episode state: {type(error).__name__}: {error}") from None


# By canonical hash: the graph version the candidates were computed on (their sites index its
# nodes) and the candidates. Shared by a session and its forks.
CandidateCache = dict[str, tuple[Graph, list[Candidate]]]


def recorded_candidate(candidates: Sequence[Candidate], action: Action) -> Candidate | None:
    """The candidate that a recorded step applied: found by its rule and site, or, where the
    step was recorded with its site in another node order, by its rule and the hash it
    produced; None when no candidate produces the recorded hash."""
    of_rule = [c for c in candidates if c.rule.name == action.rule]
    at_site = next((c for c in of_rule if c.site == action.site), None)
    if at_site is not None and at_site.graph_hash == action.graph_hash:
        return at_site
    return next((c for c in of_rule if c.graph_hash == action.graph_hash), None)


class RewriteSession:
    """The state of one rewriting episode on one model.

    Args:
        graph: the original graph (the episode starts here).
        ruleset: the rules; default `default_ruleset()`.
        model: a label for the model (zoo name or path), recorded in the episode state.
        max_ops: no candidate may have more operators than this; default twice the original
            graph's count (TASO's cap), fixed for the whole episode so that a rewrite's
            candidates do not depend on the path that reached it.
    """

    def __init__(
        self,
        graph: Graph,
        ruleset: RuleSet | None = None,
        *,
        model: str = "",
        max_ops: int | None = None,
        _cache: CandidateCache | None = None,
        _memo: RewriteMemo | None = None,
    ) -> None:
        self.original = graph
        self.graph = graph
        self.ruleset = default_ruleset() if ruleset is None else ruleset
        self.model = model
        self.max_ops = 2 * len(graph) if max_ops is None else max_ops
        self.actions: list[Action] = []
        self._cache: CandidateCache = {} if _cache is None else _cache
        # The rewrites of the last enumeration, reused by the next (shared with forks too).
        self._memo = RewriteMemo() if _memo is None else _memo

    def __repr__(self) -> str:
        return (
            f"RewriteSession({self.model or self.original.name!r}, {len(self.actions)} actions, "
            f"{len(self.original)} -> {len(self.graph)} nodes)"
        )

    @property
    def cache(self) -> CandidateCache:
        """The candidate cache (graph hash -> (graph, candidates)), shared with forks; a user
        may delete entries to bound memory (candidates hold their new weights, and their
        rewritten graphs once built)."""
        return self._cache

    @property
    def memo(self) -> RewriteMemo:
        """The sites and rewrites of the last enumeration, reused by the next (shared with
        forks); `memo.reused` and `memo.computed` count its hits and misses."""
        return self._memo

    def candidates(self, graph: Graph | None = None) -> list[Candidate]:
        """The candidate rewrites of the current graph (or of `graph`), in the ruleset's
        deterministic order; computed once per graph hash, for this session and its forks.

        Two paths can reach one hash with the nodes in different orders, and sites are node
        indices: when the cached candidates were computed on another version of the current
        graph, the session moves to that version (same hash), so that sites index its nodes.
        """
        current = graph is None or graph is self.graph
        graph = self.graph if graph is None else graph
        digest = graph.canonical_hash()
        cached = self._cache.get(digest)
        if cached is None:
            candidates = self.ruleset.candidates(graph, max_ops=self.max_ops, memo=self._memo)
            cached = (graph, candidates)
            self._cache[digest] = cached
        elif current and cached[0] is not self.graph:
            self.graph = cached[0]
        return cached[1]

    def apply(self, index: int) -> Graph:
        """Apply `candidates()[index]`, record it, and return the new current graph."""
        candidates = self.candidates()
        if not 0 <= index < len(candidates):
            raise IndexError(f"candidate {index} out of range: {len(candidates)} candidates")
        return self.apply_candidate(candidates[index])

    def apply_candidate(self, candidate: Candidate) -> Graph:
        """Apply a candidate of the current graph (as returned by `candidates()`)."""
        self.actions.append(Action(candidate.rule.name, candidate.site, candidate.graph_hash))
        self.graph = candidate.graph
        return self.graph

    def fork(self) -> RewriteSession:
        """An independent copy at the same point: its own action list, the same cache."""
        other = RewriteSession(
            self.original,
            self.ruleset,
            model=self.model,
            max_ops=self.max_ops,
            _cache=self._cache,
            _memo=self._memo,
        )
        other.graph = self.graph
        other.actions = list(self.actions)
        return other

    def state(self, reward: float = 0.0) -> EpisodeState:
        """The episode so far, as a replayable record."""
        return EpisodeState(
            model=self.model,
            original_hash=self.original.canonical_hash(),
            actions=list(self.actions),
            final_hash=self.graph.canonical_hash(),
            reward=reward,
        )

    @classmethod
    def replay(
        cls,
        graph: Graph,
        state: EpisodeState,
        ruleset: RuleSet | None = None,
        *,
        max_ops: int | None = None,
        on_step: Callable[[RewriteSession], object] | None = None,
    ) -> RewriteSession:
        """Re-apply an episode's actions to `graph`, checking every hash on the way;
        `on_step(session)` after each one (a trajectory's cost curve, say).

        A step is found by its rule and site; should the site index another node order (the
        same graph reached by another path), by its rule and the hash it produced. Raises
        RlflowError naming the first step that neither finds, or whose result has another
        hash than the one recorded.
        """
        session = cls(graph, ruleset, model=state.model, max_ops=max_ops)
        start = graph.canonical_hash()
        if start != state.original_hash:
            raise RlflowError(
                f"replay: the graph's hash {start[:12]} is not the episode's original "
                f"{state.original_hash[:12]} (another model or version?)"
            )
        for step, action in enumerate(state.actions, start=1):
            candidates = session.candidates()
            found = recorded_candidate(candidates, action)
            if found is not None:
                session.apply_candidate(found)
                if on_step is not None:
                    on_step(session)
                continue
            where = f"step {step} ({action.rule} at site {list(action.site)})"
            at_site = next(
                (c for c in candidates if c.rule.name == action.rule and c.site == action.site),
                None,
            )
            if at_site is None:
                raise RlflowError(f"replay: {where} is not a candidate of the graph at that point")
            raise RlflowError(
                f"replay: {where} gave hash {at_site.graph_hash[:12]}, "
                f"the episode recorded {action.graph_hash[:12]}"
            )
        final = session.graph.canonical_hash()
        if state.final_hash and final != state.final_hash:
            raise RlflowError(
                f"replay: final hash {final[:12]} is not the episode's {state.final_hash[:12]}"
            )
        return session

    def validate(self) -> EquivalenceReport:
        """Run the current graph against the original on random inputs."""
        return check_equivalence(self.original, self.graph)

"""BRKGA: a biased random-key genetic algorithm over rewrite sequences (Gonçalves & Resende,
J. Heuristics 2011), the search that REGAL (Paliwal et al., ICLR 2020) biases with a GNN.

**Chromosome.** For one start graph, a vector of keys in [0, 1] (`Layout`): one gene per
candidate site the start graph offers (a rule and the nodes it matches), then one gene per
node of the start graph. A node is known across rewrites by the name of the tensor it
computes, which every rewrite leaves on the nodes it does not touch.

**Decoder.** Repeatedly apply, among the candidates of the current graph, the one with the
highest key, while that key is at least `threshold` (0.5: a uniform key switches a site on
with even odds) and for at most `max_steps` rewrites; a candidate that would return to a
graph of this decoding is skipped, so a rewrite and its reverse cannot alternate. Sites are
ranked by key before any is rewritten, and only the best few are: a decoding costs site
matching, not a full candidate enumeration per step (6.7x faster on a medium Inception-v3). A
candidate's key is its site's gene when the start graph offered that (rule, site); otherwise
(a site that earlier rewrites made: a new node, or a rule that newly matches) it is the node
gene of its anchor, or, for a node a rewrite made, of the nearest start-graph node upstream
(else downstream) of it. Ties go to the candidate with the smaller result hash, so a decoding
does not depend on the node order of the version of a graph that the session holds.

**Evolution.** A population of `population` chromosomes, each scored by the search cost of
its decoded graph (one cost-model call: the budget counts these evaluations). Every
generation keeps the elite fraction unchanged, adds fresh random mutants, and fills the rest
with children of one elite and one non-elite parent, each gene taken from the elite parent
with probability `inheritance` (0.7). Keys are drawn uniformly unless `GeneBiases` give each
gene a mean (keys then follow Beta(c m, c (1 - m)), uniform at m = 0.5 and c = 2) and its own
inheritance probability: what a REGAL policy supplies. All randomness comes from one numpy
Generator seeded by `seed`, so a run is reproducible.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from rlflow.cost import Runner
from rlflow.errors import RlflowError
from rlflow.graph import Graph, Node
from rlflow.rewrite.replacement import Match
from rlflow.rewrite.rule import Rule
from rlflow.rewrite.ruleset import Candidate, derive_within, node_positions, site_of
from rlflow.rewrite.session import RewriteSession
from rlflow.search.base import DEFAULT_TOP_K, NO_PROGRESS, Board, Progress, SearchResult, finish
from rlflow.search.cost import SearchCost

DEFAULT_BUDGET = 300
"""Chromosome evaluations (decoded graphs costed) of a run."""


@dataclass(frozen=True)
class BrkgaConfig:
    """BRKGA's parameters (defaults in the ranges Gonçalves & Resende recommend)."""

    population: int = 24
    """Chromosomes per generation."""
    elite_fraction: float = 0.2
    """Share of each generation copied unchanged into the next (the best)."""
    mutant_fraction: float = 0.15
    """Share of each generation drawn afresh."""
    inheritance: float = 0.7
    """Probability that a child's gene comes from its elite parent."""
    threshold: float = 0.5
    """Keys below this switch their site off."""
    max_steps: int = 16
    """Rewrites a decoding applies at most."""

    def validate(self) -> None:
        if self.population < 2:
            raise RlflowError(f"BRKGA population must be at least 2, got {self.population}")
        if not 0.0 < self.elite_fraction < 1.0:
            raise RlflowError(f"elite fraction must be in (0, 1), got {self.elite_fraction}")
        if not 0.0 <= self.mutant_fraction < 1.0:
            raise RlflowError(f"mutant fraction must be in [0, 1), got {self.mutant_fraction}")
        if self.elite_fraction + self.mutant_fraction >= 1.0:
            raise RlflowError("elite and mutant fractions must leave room for children")
        if not 0.0 <= self.inheritance <= 1.0:
            raise RlflowError(f"inheritance must be in [0, 1], got {self.inheritance}")
        if not 0.0 <= self.threshold <= 1.0:
            raise RlflowError(f"threshold must be in [0, 1], got {self.threshold}")
        if self.max_steps < 1:
            raise RlflowError(f"max steps must be at least 1, got {self.max_steps}")

    @property
    def elites(self) -> int:
        return max(1, int(self.population * self.elite_fraction))

    @property
    def mutants(self) -> int:
        return min(int(self.population * self.mutant_fraction), self.population - self.elites)


def node_name(node: Node) -> str:
    """What a node is known by across rewrites: the first tensor it computes."""
    return next((name for name in node.outputs if name), "")


@dataclass(frozen=True)
class Layout:
    """The genes of a chromosome for one start graph: `sites` (rule name, the start graph's
    node indices it matches) first, then one gene per node of the start graph."""

    sites: tuple[tuple[str, tuple[int, ...]], ...]
    num_nodes: int
    node_ids: dict[str, int] = field(repr=False)
    """A start-graph node's `node_name` -> its index."""
    site_genes: dict[tuple[str, tuple[int, ...]], int] = field(repr=False)

    @classmethod
    def of(cls, graph: Graph, candidates: list[Candidate]) -> Layout:
        """The layout of `graph` with its candidates (in their order, each (rule, site) once)."""
        site_genes: dict[tuple[str, tuple[int, ...]], int] = {}
        for candidate in candidates:
            site_genes.setdefault((candidate.rule.name, tuple(candidate.site)), len(site_genes))
        node_ids = {node_name(node): index for index, node in enumerate(graph.nodes)}
        return cls(tuple(site_genes), len(graph.nodes), node_ids, site_genes)

    @property
    def size(self) -> int:
        return len(self.sites) + self.num_nodes

    def node_gene(self, index: int) -> int:
        return len(self.sites) + index


@dataclass(frozen=True)
class GeneBiases:
    """Per-gene parameters of the chromosome distribution (what a REGAL policy outputs).

    `means` (in (0, 1)) are the means of each gene's key distribution, Beta(c m, c (1 - m))
    with c = `concentration`; `inheritance` is each gene's probability of coming from the
    elite parent in a crossover.
    """

    means: np.ndarray
    inheritance: np.ndarray
    concentration: float = 2.0

    def check(self, size: int) -> None:
        if self.means.shape != (size,) or self.inheritance.shape != (size,):
            raise RlflowError(
                f"gene biases of shapes {self.means.shape}, {self.inheritance.shape} for a "
                f"chromosome of {size} genes"
            )


BiasSource = Callable[[Graph, Layout], GeneBiases]
"""Gives the biases of a start graph's chromosome (e.g. a trained REGAL policy)."""


class Decoder:
    """Turns a chromosome into a rewritten session (see the module docstring)."""

    def __init__(self, session: RewriteSession, layout: Layout, config: BrkgaConfig) -> None:
        self.session, self.layout, self.config = session, layout, config
        self.start_hash = session.graph.canonical_hash()

    def decode(self, keys: np.ndarray) -> RewriteSession:
        """The session after applying the chromosome's rewrites to a fork of the start."""
        walker = self.session.fork()
        visited = {self.start_hash}
        for _ in range(self.config.max_steps):
            chosen = self.choose(walker, keys, visited)
            if chosen is None:
                break
            walker.apply_candidate(chosen)
            visited.add(chosen.graph_hash)
        return walker

    def choose(
        self, walker: RewriteSession, keys: np.ndarray, visited: set[str]
    ) -> Candidate | None:
        """The candidate of the walker's graph with the highest key at or above the threshold.

        Only the sites are enumerated; rewrites are derived in order of falling key until one
        gives a valid graph not visited yet (all of a group of equal keys, for the tie-break by
        result hash). A full enumeration derives and hashes every candidate, ten times the work
        of a decoding step on a medium-size graph."""
        graph = walker.graph
        position = node_positions(graph)
        lineage: dict[int, int] = {}
        walker.memo.start()
        ranked: list[tuple[float, int, Rule, Match, tuple[int, ...]]] = []
        for order, (rule, match) in enumerate(walker.ruleset.sites(graph, walker.memo)):
            site = site_of(match, position)
            key = float(keys[self.gene(graph, rule.name, site, lineage, position)])
            if key >= self.config.threshold:
                ranked.append((-key, order, rule, match, site))
        ranked.sort(key=lambda entry: entry[:2])
        start = 0
        while start < len(ranked):
            end = start
            while end < len(ranked) and ranked[end][0] == ranked[start][0]:
                end += 1
            best: Candidate | None = None
            for _, _, rule, match, site in ranked[start:end]:
                result = derive_within(rule, graph, match, walker.max_ops, walker.memo)
                if result is None or result.hash in visited:
                    continue
                if best is None or result.hash < best.graph_hash:
                    best = Candidate(rule, site, result)
            if best is not None:
                return best
            start = end
        return None

    def gene(
        self,
        graph: Graph,
        rule: str,
        site: tuple[int, ...],
        lineage: dict[int, int],
        position: dict[int, int],
    ) -> int:
        """The gene that is the key of `rule` at `site` (node indices of `graph`)."""
        node_ids = self.layout.node_ids
        stable = tuple(node_ids.get(node_name(graph.nodes[index]), -1) for index in site)
        if -1 not in stable:
            site_gene = self.layout.site_genes.get((rule, stable))
            if site_gene is not None:
                return site_gene
        anchor = site[0]
        if anchor not in lineage:
            lineage[anchor] = self.origin(graph, anchor, position)
        return self.layout.node_gene(lineage[anchor])

    def origin(self, graph: Graph, index: int, position: dict[int, int]) -> int:
        """The start-graph node that node `index` of `graph` is, or the nearest one upstream
        of it (breadth first over its inputs), else downstream; node 0 if none is."""
        node_ids = self.layout.node_ids
        for neighbours in (_producers, _consumers):
            queue, seen = deque([index]), {index}
            while queue:
                at = queue.popleft()
                known = node_ids.get(node_name(graph.nodes[at]))
                if known is not None:
                    return known
                for neighbour in neighbours(graph, graph.nodes[at]):
                    step = position[id(neighbour)]
                    if step not in seen:
                        seen.add(step)
                        queue.append(step)
        return 0


def _producers(graph: Graph, node: Node) -> list[Node]:
    return [p for name in node.present_inputs if (p := graph.producer(name)) is not None]


def _consumers(graph: Graph, node: Node) -> list[Node]:
    return [c for name in node.outputs if name for c in graph.consumers(name)]


@dataclass
class Evolution:
    """What one BRKGA run found, before the final measurement."""

    best_cost: float
    start_cost: float
    evaluations: int
    generations: int
    curve: list[float]
    """The best cost after each evaluation (the curve over evaluations)."""
    layout: Layout


def start_layout(session: RewriteSession) -> Layout:
    """The chromosome layout of the session's current graph."""
    candidates = session.candidates()  # first: it may move the session to the cached version
    return Layout.of(session.graph, candidates)


def evolve(
    session: RewriteSession,
    cost: SearchCost,
    *,
    budget: int = DEFAULT_BUDGET,
    config: BrkgaConfig | None = None,
    biases: GeneBiases | BiasSource | None = None,
    seed: int = 0,
    board: Board | None = None,
    progress: Progress = NO_PROGRESS,
) -> Evolution:
    """Run BRKGA from the session's current graph for `budget` chromosome evaluations,
    offering every decoded graph to `board`; the session itself is not modified."""
    config = config or BrkgaConfig()
    config.validate()
    if budget < 1:
        raise RlflowError(f"budget must be at least 1, got {budget}")
    rng = np.random.default_rng(seed)
    start = session.fork()
    layout = start_layout(start)
    if biases is not None and not isinstance(biases, GeneBiases):
        biases = biases(start.graph, layout)
    if biases is not None:
        biases.check(layout.size)
    decoder = Decoder(start, layout, config)
    start_cost = cost(start.graph)
    best_cost = start_cost
    curve: list[float] = []

    def sample(count: int) -> np.ndarray:
        if biases is None:
            return rng.random((count, layout.size))
        alpha = np.clip(biases.concentration * biases.means, 1e-3, None)
        beta = np.clip(biases.concentration * (1.0 - biases.means), 1e-3, None)
        return rng.beta(alpha, beta, size=(count, layout.size))

    def evaluate(population: np.ndarray) -> np.ndarray:
        nonlocal best_cost
        fitness = np.empty(len(population))
        for row, keys in enumerate(population):
            decoded = decoder.decode(keys)
            fitness[row] = value = cost(decoded.graph)
            if board is not None and board.would_keep(value):
                board.offer(value, decoded)
            best_cost = min(best_cost, value)
            curve.append(best_cost)
            progress.update(1)
        return fitness

    population = sample(min(config.population, budget))
    fitness = evaluate(population)
    generations = 1
    inheritance = np.full(layout.size, config.inheritance) if biases is None else biases.inheritance
    while len(curve) < budget:
        order = np.argsort(fitness, kind="stable")
        elites = population[order[: config.elites]]
        others = population[order[config.elites :]]
        if not len(others):
            others = population
        fresh = min(config.population - len(elites), budget - len(curve))
        mutants = sample(min(config.mutants, fresh))
        children = np.empty((fresh - len(mutants), layout.size))
        for row in range(len(children)):
            elite = elites[rng.integers(len(elites))]
            other = others[rng.integers(len(others))]
            children[row] = np.where(rng.random(layout.size) < inheritance, elite, other)
        offspring = np.concatenate([mutants, children])
        population = np.concatenate([elites, offspring])
        fitness = np.concatenate([fitness[order[: config.elites]], evaluate(offspring)])
        generations += 1
        progress.set_postfix_str(f"best {best_cost:.4g} gen {generations}", refresh=False)
    return Evolution(best_cost, start_cost, len(curve), generations, curve, layout)


def search(
    session: RewriteSession,
    cost: SearchCost,
    *,
    budget: int = DEFAULT_BUDGET,
    seed: int = 0,
    config: BrkgaConfig | None = None,
    biases: GeneBiases | BiasSource | None = None,
    label: str = "brkga",
    top_k: int = DEFAULT_TOP_K,
    runner: Runner | None = None,
    progress: Progress = NO_PROGRESS,
    reference: Graph | None = None,
) -> SearchResult:
    """BRKGA from the session's current graph, then the shared final measurement.

    Args:
        session: where every decoding starts (it is not modified: decodings run on forks).
        cost: what the decoded graphs are ranked by.
        budget: chromosome evaluations (each decodes one chromosome and costs its graph).
        seed: seeds the search's own numpy Generator (its only source of randomness).
        config: population, elite and mutant fractions, inheritance, decoder limits.
        biases: per-gene key means and inheritance (REGAL), or what gives them for the start
            graph; None: plain BRKGA.
        label: the method's name in the result (`regal` when biased by a policy).
        top_k: how many of the best graphs seen are measured end to end at the end.
        runner: times the finalists (default: `default_runner` under the cost's settings).
        progress: told of every evaluation.
        reference: what the speedups are measured against (default: the start graph).
    """
    if budget < 1:
        raise RlflowError(f"budget must be at least 1, got {budget}")
    started = time.perf_counter()
    cost.reset_count()
    board = Board(top_k)
    board.offer(cost(session.graph), session.fork())
    evolution = evolve(
        session,
        cost,
        budget=budget,
        config=config,
        biases=biases,
        seed=seed,
        board=board,
        progress=progress,
    )
    return finish(
        label,
        session,
        board,
        cost,
        expansions=evolution.evaluations,
        started=started,
        runner=runner,
        progress=progress,
        reference=reference,
    )

"""Candidates without building every result graph: `Derivation` (hash, size and validity of
`Graph.replaced` from the change alone) and `RewriteMemo` (sites and rewrites reused from the
graph before). Both must give exactly what building and hashing every result gave."""

from __future__ import annotations

import numpy as np
import pytest

from rlflow.graph import Graph, GraphError, Node, load_model
from rlflow.graph.derive import Derivation
from rlflow.rewrite import Replacement, RewriteRejected, RuleSet, default_ruleset
from rlflow.rewrite.build import ModelBuilder
from rlflow.rewrite.memo import RewriteMemo
from rlflow.rewrite.rule import PatternRule
from rlflow.rewrite.session import RewriteSession
from rlflow.zoo import cached_path


def fresh_hash(graph: Graph) -> str:
    """The canonical hash computed from scratch (no parent hashes to reuse)."""
    return Graph(
        graph.nodes,
        graph.inputs,
        graph.outputs,
        graph.initializers,
        dict(graph.values),
        graph.opset,
    ).canonical_hash()


def reference_candidates(ruleset: RuleSet, graph: Graph, max_ops: int) -> list[tuple]:
    """Candidate enumeration done the plain way: build every result, hash it from scratch."""
    position = {id(node): index for index, node in enumerate(graph.nodes)}
    seen = {fresh_hash(graph)}
    found = []
    for rule, match in ruleset.sites(graph):
        try:
            result = rule.apply(graph, match)
        except RewriteRejected:
            continue
        digest = fresh_hash(result)
        if len(result) > max_ops or digest in seen:
            continue
        seen.add(digest)
        site = tuple(position[id(node)] for node in (*match.nodes, *match.keep))
        inputs = sum(len(node.inputs) for node in result.nodes)
        found.append((rule.name, site, digest, len(result), inputs, _structure(result)))
    return found


def _structure(graph: Graph) -> list[tuple]:
    return [(node.op_type, len(node.inputs), len(node.outputs)) for node in graph.nodes]


@pytest.mark.parametrize("name", ["resnet-18", "bert", "mini-dalle", "inception-v3"])
def test_a_random_walk_offers_the_candidates_a_plain_enumeration_finds(name):
    """Same candidates, order, sites, hashes and sizes, step after step (the session reuses
    sites and rewrites from one step to the next); the graph taken is the one `Rule.apply`
    builds."""
    graph = load_model(cached_path(name, "small"))
    session = RewriteSession(graph, default_ruleset())
    rng = np.random.default_rng(0)
    for _ in range(4):
        want = reference_candidates(session.ruleset, session.graph, session.max_ops)
        got = session.candidates()
        assert [(c.rule.name, c.site, c.graph_hash, c.num_nodes, c.num_inputs) for c in got] == [
            entry[:5] for entry in want
        ]
        if not got:
            break
        index = int(rng.integers(len(got)))
        session.apply(index)
        assert session.graph.canonical_hash() == fresh_hash(session.graph) == want[index][2]
        assert _structure(session.graph) == want[index][5]
    assert session.memo.reused > session.memo.computed


def chain() -> Graph:
    """in -> Neg -> a -> Relu -> b -> Exp -> c;  in -> Sigmoid -> s;  y = Add(c, s)."""
    b = ModelBuilder()
    x = b.input((2, 3))
    c = b.op("Exp", [b.op("Relu", [b.op("Neg", [x])])])
    return load_model(b.model(b.op("Add", [c, b.op("Sigmoid", [x])])))


def node(graph: Graph, op_type: str) -> Node:
    return next(n for n in graph.nodes if n.op_type == op_type)


def changes(graph: Graph) -> dict[str, dict]:
    """Changes of `chain()` covering each path of a derivation."""
    neg, relu, exp, sigmoid, add = (
        node(graph, op) for op in ("Neg", "Relu", "Exp", "Sigmoid", "Add")
    )
    x, a, b = neg.inputs[0], neg.outputs[0], relu.outputs[0]
    c, s, y = exp.outputs[0], sigmoid.outputs[0], add.outputs[0]
    twice = [Node.make("Abs", [a], [b]), Node.make("Neg", [a], [s])]
    return {
        "takeover": dict(removed=[relu], added=[Node.make("Abs", [a], [b])]),
        "rename": dict(removed=[relu], renames={b: a}),
        "prune": dict(removed=[add], added=[Node.make("Identity", [c], [y])]),
        "reorder": dict(removed=[neg], added=[Node.make("Mul", [x, s], [a])]),
        "cycle": dict(removed=[neg], added=[Node.make("Mul", [x, c], [a])]),
        "undefined": dict(removed=[relu], added=[Node.make("Abs", ["nowhere"], [b])]),
        "twice": dict(removed=[relu], added=twice),
        "new-constant": dict(
            removed=[add],
            added=[Node.make("Add", [c, "k"], [y])],
            initializers={"k": np.ones(3, np.float32)},
        ),
    }


@pytest.mark.parametrize("case", list(changes(chain())))
def test_a_derivation_knows_what_graph_replaced_would_build(case):
    graph = chain()
    graph.canonical_hash()
    change = changes(graph)[case]
    try:
        built = graph.replaced(**change)
    except GraphError as error:
        with pytest.raises(GraphError, match=str(error).split("'")[0]):
            Derivation(graph, **change)
        return
    derived = Derivation(graph, **change)
    assert derived.built_eagerly == (case == "reorder")  # only a re-sort needs the graph
    assert derived.hash == fresh_hash(built)
    assert derived.num_nodes == len(built)
    assert derived.num_inputs == sum(len(n.inputs) for n in built.nodes)
    assert _structure(derived.graph()) == _structure(built)
    assert derived.graph().canonical_hash() == derived.hash


def test_the_derivation_cases_reach_each_outcome():
    """The cases above are not vacuous: each error occurs, and pruning drops a node."""
    graph = chain()
    outcomes = {}
    for case, change in changes(graph).items():
        try:
            outcomes[case] = len(graph.replaced(**change))
        except GraphError as error:
            outcomes[case] = str(error)
    assert "cycle" in outcomes["cycle"] and "nothing produces" in outcomes["undefined"]
    assert "more than once" in outcomes["twice"]
    assert outcomes["prune"] == len(graph) - 1 and outcomes["reorder"] == len(graph)


class _ByReaders(PatternRule):
    """Relu(x) -> Abs(x) while x has one reader, else -> Neg(Neg(x)): a rewrite that asks the
    graph something beyond the match."""

    name = "by-readers"
    pattern = "Relu(x)"

    def rewrite(self, graph, match):
        x = match["x"]
        if len(graph.consumers(x)) == 1:
            return Replacement([Node.make("Abs", [x], ["abs_out"])], ["abs_out"])
        inner = Node.make("Neg", [x], ["neg_in"])
        return Replacement([inner, Node.make("Neg", ["neg_in"], ["neg_out"])], ["neg_out"])


class _ReadsNodes(_ByReaders):
    name = "reads-nodes"

    def rewrite(self, graph, match):
        assert graph.nodes  # not a question the memo logs
        return super().rewrite(graph, match)


def test_a_memo_recomputes_a_rewrite_when_the_graph_answers_differently():
    graph = chain()
    rules = RuleSet([_ByReaders()])
    memo = RewriteMemo()
    (first,) = rules.candidates(graph, memo=memo)
    assert rules.candidates(graph, memo=memo)[0].graph_hash == first.graph_hash
    assert memo.reused == 2 and memo.computed == 2  # the site and the rewrite, reused
    # Sigmoid now reads Neg's output too: the same Relu node, but x has two readers.
    sigmoid, neg = node(graph, "Sigmoid"), node(graph, "Neg")
    changed = graph.replaced(
        removed=[sigmoid], added=[Node.make("Sigmoid", [neg.outputs[0]], sigmoid.outputs)]
    )
    (candidate,) = rules.candidates(changed, memo=memo)
    assert candidate.graph_hash == rules.candidates(changed)[0].graph_hash != first.graph_hash
    assert "Neg" in [n.op_type for n in candidate.graph.nodes if n is not neg]


def test_a_memo_never_reuses_a_rewrite_that_read_more_than_its_log():
    graph = chain()
    rules = RuleSet([_ReadsNodes()])
    memo = RewriteMemo()
    first = rules.candidates(graph, memo=memo)
    again = rules.candidates(graph, memo=memo)
    assert [c.graph_hash for c in again] == [c.graph_hash for c in first]
    assert memo.computed == 3 and memo.reused == 1  # the site reused, the rewrite not

"""The matcher and the candidate engine: patterns, sites, deduplication, cycles, the op cap."""

from __future__ import annotations

import pytest

from rlflow.graph import Node, load_model
from rlflow.rewrite import Candidate, Replacement, RewriteRejected, RuleSet
from rlflow.rewrite.build import ModelBuilder
from rlflow.rewrite.pattern import Pattern
from rlflow.rewrite.rule import Match, PatternRule
from rlflow.rewrite.rules import builtin_rules
from rlflow.rewrite.rules.simplify import IdentityElim

RULES = RuleSet(builtin_rules())


def test_pattern_parser_names_shared_values_and_optional_inputs():
    pattern = Pattern.parse("Div(d=Sub(x, ReduceMean(x, axes?)), Sqrt(Pow(d, two)))")
    assert [node.op for node in pattern.nodes] == ["ReduceMean", "Sub", "Pow", "Sqrt", "Div"]
    assert set(pattern.variables) == {"x", "axes", "two"}
    assert pattern.variables["axes"].optional and not pattern.variables["x"].optional
    assert pattern.anchor_op == ("", "Div")
    with pytest.raises(ValueError):
        Pattern.parse("Relu(Conv(x, w)")


def test_pattern_binds_a_repeated_variable_to_one_value():
    pattern = Pattern.parse("Mul(x, Relu(x))")
    b = ModelBuilder()
    x, y = b.input((2, 3)), b.input((2, 3))
    graph = load_model(
        b.model(b.op("Mul", [x, b.op("Relu", [x])]), b.op("Mul", [y, b.op("Relu", [x])]))
    )
    found = [pattern.match(graph, node) for node in graph.nodes if node.op_type == "Mul"]
    assert [len(list(matches)) for matches in found] == [1, 0]


def test_internal_value_read_outside_the_match_is_not_a_site():
    b = ModelBuilder()
    product = b.op("MatMul", [b.input((2, 3)), b.const((3, 4))])
    graph = load_model(b.model(b.op("Add", [product, b.const((4,))]), b.op("Relu", [product])))
    assert RuleSet([RULES["matmul-add-to-gemm"]]).candidates(graph) == []


def test_candidates_are_deduplicated_by_result_hash():
    """Removing either of two chained Identities gives the same graph: one candidate."""
    b = ModelBuilder()
    chain = b.op("Identity", [b.op("Identity", [b.op("Neg", [b.input((2, 3))])])])
    graph = load_model(b.model(b.op("Relu", [chain])))
    rules = RuleSet([IdentityElim()])
    assert len(rules.sites(graph)) == 2
    (candidate,) = rules.candidates(graph)
    assert [node.op_type for node in candidate.graph.nodes] == ["Neg", "Identity", "Relu"]


def test_candidates_are_deterministic_and_sites_index_the_source_graph(mlp_model):
    graph = load_model(mlp_model)
    first = RULES.candidates(graph)
    again = RULES.candidates(graph)
    assert [(c.rule.name, c.site) for c in first] == [(c.rule.name, c.site) for c in again]
    # Where onnxruntime does NCHWc, each MatMul is also a site of `nchwc-projection`.
    names = [c.rule.name for c in first]
    assert names.count("matmul-add-to-gemm") == 1
    assert set(names) <= {"matmul-add-to-gemm", "nchwc-projection"}
    (candidate,) = [c for c in first if c.rule.name == "matmul-add-to-gemm"]
    assert isinstance(candidate, Candidate) and candidate.action == "matmul-add-to-gemm"
    assert [graph.nodes[i].op_type for i in candidate.site] == ["Add", "MatMul"]
    assert [node.op_type for node in candidate.graph.nodes] == ["Gemm", "Relu", "MatMul"]
    assert candidate.graph.nodes[-1] is graph.nodes[-1]  # untouched nodes are shared


class _LoopBack(PatternRule):
    """A wrong rule: makes the Relu read its own consumer's output."""

    name = "loop-back"
    pattern = "Relu(x)"

    def rewrite(self, graph, match):
        reader = graph.consumers(match.outputs[0])[0]
        return Replacement([Node.make("Relu", [reader.outputs[0]], ["looped"])], ["looped"])


def test_a_rewrite_that_makes_a_cycle_is_rejected():
    b = ModelBuilder()
    graph = load_model(b.model(b.op("Neg", [b.op("Relu", [b.input((2, 3))])])))
    rule = _LoopBack()
    match = next(iter(rule.sites(graph)))
    with pytest.raises(RewriteRejected, match="cycle"):
        rule.apply(graph, match)
    assert RuleSet([rule]).candidates(graph) == []


class _WrongShape(PatternRule):
    """A wrong rule: replaces Relu(x) by x transposed, which has another shape."""

    name = "wrong-shape"
    pattern = "Relu(x)"

    def rewrite(self, graph, match):
        return Replacement([Node.make("Transpose", [match["x"]], ["t"], perm=[1, 0])], ["t"])


def test_a_rewrite_that_changes_a_shape_is_rejected_by_the_applier():
    b = ModelBuilder()
    graph = load_model(b.model(b.op("Neg", [b.op("Relu", [b.input((2, 3))])])))
    with pytest.raises(RewriteRejected, match="would change from float"):
        _WrongShape().apply(graph, next(iter(_WrongShape().sites(graph))))


def test_results_above_the_op_cap_are_not_candidates():
    split = RULES["matmul-siblings-merge-reverse"]
    graph = load_model(split.example(0))  # Neg, MatMul, Add, Split -> Neg + 2 x (MatMul, Add)
    rules = RuleSet([split])
    assert len(graph) == 4
    assert rules.candidates(graph, max_ops=4) == []
    (candidate,) = rules.candidates(graph, max_ops=5)
    assert len(candidate.graph) == 5
    assert len(rules.candidates(graph)) == 1  # default cap: twice the graph's own count


def test_a_rewrite_giving_back_the_same_graph_is_not_a_candidate():
    """x -> Transpose -> Transpose (identity) -> Transpose: folding either pair gives one graph,
    and no candidate may equal the input graph."""
    b = ModelBuilder()
    x = b.op("Neg", [b.input((2, 3))])
    three = b.op("Transpose", [b.op("Transpose", [b.op("Transpose", [x])])])
    graph = load_model(b.model(b.op("Relu", [three])))
    candidates = RuleSet([RULES["transpose-transpose-fold"]]).candidates(graph)
    assert len(candidates) == 1
    assert candidates[0].graph.canonical_hash() != graph.canonical_hash()


def test_every_value_of_a_candidate_has_a_static_shape(mlp_model):
    rule = RULES["conv-siblings-merge"]
    for source in (load_model(rule.example(1)), load_model(mlp_model)):
        for candidate in RULES.candidates(source):
            graph = candidate.graph
            for node in graph.nodes:
                for name in filter(None, node.outputs):
                    assert all(isinstance(d, int) for d in graph.value(name).shape)


def test_portable_selection_drops_contrib_rules():
    portable = RULES.select(portable=True)
    assert "conv-relu-to-fusedconv" not in portable and "matmul-add-to-gemm" in portable
    assert all(rule.portable for rule in portable)
    assert RULES.select(names=["identity-elim"]).names == ["identity-elim"]


def test_a_gpu_target_drops_the_cpus_own_layout_rules():
    """NCHWc ops run on onnxruntime's CPU only: graphs for a GPU are made without them."""
    for_gpu = RULES.select(provider="cuda")
    assert not any(rule.cpu_only for rule in for_gpu)
    assert "matmul-add-to-gemm" in for_gpu and "conv-relu-to-fusedconv" in for_gpu
    if "nchwc-conv" in RULES:  # offered where onnxruntime does NCHWc
        assert RULES["nchwc-conv"].cpu_only and "nchwc-conv" not in for_gpu
    assert RULES.select(provider="cpu").names == RULES.names


def test_bidirectional_rules_are_declared_once_and_named_with_reverse():
    names = RULES.names
    for base in ("matmul-add-to-gemm", "conv-siblings-merge", "matmul-siblings-merge"):
        assert f"{base}-reverse" in names
        forward, backward = RULES[base], RULES[f"{base}-reverse"]
        assert type(forward) is type(backward)
        assert dict(forward.source_ops) == dict(backward.target_ops)


def test_match_node_finds_the_producer_of_a_variable():
    b = ModelBuilder()
    graph = load_model(b.model(b.op("Relu", [b.op("Neg", [b.input((2,))])])))
    pattern = Pattern.parse("Relu(n=Neg(x))")
    binding = next(pattern.match(graph, graph.nodes[1]))
    assert [node.op_type for node in binding.nodes] == ["Relu", "Neg"]  # anchor first
    match = Match(binding.nodes, binding.values, (graph.nodes[1].outputs[0],))
    assert match.node("n").op_type == "Neg" and match["x"] == graph.inputs[0].name

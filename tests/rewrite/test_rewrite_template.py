"""Generated rules: loading the JSON templates, matching their lhs, instantiating their rhs."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np
import onnx
import pytest

from rlflow.errors import RlflowError
from rlflow.graph import load_model
from rlflow.rewrite import RuleSet, TemplateRule, load_templates, verify_rule
from rlflow.rewrite.build import ModelBuilder
from tests.conftest import random_feeds, run_onnx

DATA = Path(__file__).parent / "data" / "templates.json"
SPECS = {spec["name"]: spec for spec in json.loads(DATA.read_text())["rules"]}


@pytest.fixture(scope="module")
def rules() -> dict[str, TemplateRule]:
    return {rule.name: rule for rule in load_templates(DATA)}


def test_loader_gives_both_directions_of_bidirectional_rules(rules):
    assert list(rules) == [
        "matmul-matmul-reassociate",
        "matmul-matmul-reassociate-reverse",
        "relu-relu-collapse",
        "matmul-transpose-distribute",
        "matmul-transpose-distribute-reverse",
        "add-mul-distribute",
        "add-mul-distribute-reverse",
        "conv-relu-split-commute",
        "conv-relu-split-commute-reverse",
    ]
    rule = rules["matmul-transpose-distribute"]
    assert rule.origin == "generated" and rule.portable
    assert rule.source_ops == {"MatMul": 1, "Transpose": 1}
    assert rule.target_ops == {"Transpose": 2, "MatMul": 1}
    assert rules["matmul-transpose-distribute-reverse"].source_ops == rule.target_ops


def _apply_everywhere_and_compare(rule: TemplateRule, model: onnx.ModelProto) -> list[str]:
    graph = load_model(model)
    (candidate,) = RuleSet([rule]).candidates(graph)
    exported = candidate.graph.to_onnx()
    onnx.checker.check_model(exported, full_check=True)
    feeds = random_feeds(model, seed=3)
    for want, got in zip(run_onnx(model, feeds), run_onnx(exported, feeds), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    return [node.op_type for node in candidate.graph.nodes]


def test_reassociation_instantiates_the_rhs_with_inferred_shapes(rules):
    b = ModelBuilder()
    ab = b.op("MatMul", [b.input((2, 8)), b.input((8, 3))])
    model = b.model(b.op("Relu", [b.op("MatMul", [ab, b.input((3, 5))])]))
    assert _apply_everywhere_and_compare(rules["matmul-matmul-reassociate"], model) == [
        "MatMul",
        "MatMul",
        "Relu",
    ]


def test_attributes_must_match_with_defaults_filled_in(rules):
    rule = rules["matmul-transpose-distribute"]
    b = ModelBuilder()
    product = b.op("MatMul", [b.input((2, 3)), b.input((3, 4))])
    model = b.model(b.op("Transpose", [product]))  # no perm: reversed axes, the same as [1, 0]
    assert _apply_everywhere_and_compare(rule, model) == ["Transpose", "Transpose", "MatMul"]
    b = ModelBuilder()
    product = b.op("MatMul", [b.input((2, 3, 4)), b.input((2, 4, 5))])
    graph = load_model(b.model(b.op("Transpose", [product], perm=[0, 2, 1])))
    assert list(rule.sites(graph)) == []  # other perm, and rank 3 where the rule says 2


def test_commutative_operators_match_in_either_order(rules):
    b = ModelBuilder()
    x0, x1, x2 = (b.input((2, 3)) for _ in range(3))
    model = b.model(b.op("Add", [b.op("Mul", [x2, x0]), b.op("Mul", [x1, x2])]))
    assert _apply_everywhere_and_compare(rules["add-mul-distribute"], model) == ["Add", "Mul"]


def test_multi_output_template_with_constant_variable(rules):
    rule = rules["conv-relu-split-commute"]
    b = ModelBuilder(opset=18)
    conv = b.op("Conv", [b.input((1, 3, 5, 5)), b.const((4, 3, 3, 3))], pads=[1, 1, 1, 1])
    halves = b.op("Split", [conv], outputs=2, axis=1, num_outputs=2)
    model = b.model(*[b.op("Relu", [half]) for half in halves])
    assert _apply_everywhere_and_compare(rule, model) == ["Conv", "Relu", "Split"]
    # The weight must be a constant ("const": true): a weight fed at run time does not match.
    b = ModelBuilder(opset=18)
    conv = b.op("Conv", [b.input((1, 3, 5, 5)), b.input((4, 3, 3, 3))], pads=[1, 1, 1, 1])
    halves = b.op("Split", [conv], outputs=2, axis=1, num_outputs=2)
    graph = load_model(b.model(*[b.op("Relu", [half]) for half in halves]))
    assert list(rule.sites(graph)) == []


def test_a_site_where_the_rhs_does_not_type_is_rejected_with_the_reason():
    spec = {
        "name": "add-to-matmul-wrong",
        "inputs": {"x0": {"rank": 2}, "x1": {"rank": 2}},
        "lhs": {"nodes": [["Add", ["x0", "x1"], ["y0"], {}]], "outputs": ["y0"]},
        "rhs": {"nodes": [["MatMul", ["x0", "x1"], ["y0"], {}]], "outputs": ["y0"]},
    }
    rule = TemplateRule(spec)
    b = ModelBuilder()
    graph = load_model(b.model(b.op("Add", [b.input((2, 3)), b.input((2, 3))])))
    assert list(rule.sites(graph)) == []
    match = next(rule.matches(graph, graph.nodes[0]))
    assert "MatMul is invalid here" in rule.reason(graph, match)


def test_a_wrong_template_fails_verification():
    spec = copy.deepcopy(SPECS["matmul-matmul-reassociate"])
    spec["name"] = "matmul-commute-wrong"
    spec["lhs"] = {"nodes": [["MatMul", ["x0", "x1"], ["y0"], {}]], "outputs": ["y0"]}
    spec["rhs"] = {"nodes": [["MatMul", ["x1", "x0"], ["y0"], {}]], "outputs": ["y0"]}
    spec["inputs"] = {"x0": {"rank": 2}, "x1": {"rank": 2}}
    spec["verified_shapes"] = [[[3, 3], [3, 3]]] * 3
    result = verify_rule(TemplateRule(spec))
    assert not result.passed and "differs" in result.reason


def test_every_hand_made_template_verifies(rules):
    for rule in rules.values():
        result = verify_rule(rule)
        assert result.passed, (rule.name, result.reason)


def test_shapes_are_searched_for_when_the_file_lists_none(rules):
    settings = rules["add-mul-distribute"].shape_settings()
    assert len(settings) == 3 and all(len(s["x0"]) == 2 for s in settings)


def test_malformed_files_raise_a_clear_error(tmp_path):
    bad = tmp_path / "rules.json"
    bad.write_text('{"version": 2, "rules": []}')
    with pytest.raises(RlflowError, match="not a valid rules file"):
        load_templates(bad)
    with pytest.raises(RlflowError, match="no such rules file"):
        load_templates(tmp_path / "missing.json")


def test_a_rule_that_cannot_be_reversed_is_skipped_with_a_warning(tmp_path):
    spec = {
        "name": "relu-neg-neg",
        "inputs": {"x0": {"rank": 2}},
        "lhs": {
            "nodes": [["Neg", ["x0"], ["t0"], {}], ["Neg", ["t0"], ["y0"], {}]],
            "outputs": ["y0"],
        },
        "rhs": {"nodes": [], "outputs": ["x0"]},
        "bidirectional": True,
    }
    path = tmp_path / "rules.json"
    path.write_text(json.dumps({"version": 1, "rules": [spec]}))
    with pytest.warns(UserWarning, match="relu-neg-neg-reverse skipped"):
        (rule,) = load_templates(path)
    b = ModelBuilder()
    x = b.op("Relu", [b.input((2, 3))])
    model = b.model(b.op("Relu", [b.op("Neg", [b.op("Neg", [x])])]))
    assert _apply_everywhere_and_compare(rule, model) == ["Relu", "Relu"]


def test_elementwise_templates_apply_at_any_rank_but_keep_shapes():
    spec = {
        "name": "sub-of-add-is-identity",
        "inputs": {"x0": {"rank": 2}, "x1": {"rank": 2}},
        "lhs": {
            "nodes": [["Add", ["x0", "x1"], ["t0"], {}], ["Sub", ["t0", "x0"], ["y0"], {}]],
            "outputs": ["y0"],
        },
        "rhs": {"nodes": [["Identity", ["x1"], ["y0"], {}]], "outputs": ["y0"]},
    }
    rule = TemplateRule(spec)
    b = ModelBuilder()
    x0, x1 = b.input((2, 3, 4)), b.op("Neg", [b.input((2, 3, 4))])
    model = b.model(b.op("Sub", [b.op("Add", [x0, x1]), x0]))
    assert _apply_everywhere_and_compare(rule, model) == ["Neg", "Identity"]
    # x1 broadcast up by the Add: Identity(x1) would have another shape, so no site.
    b = ModelBuilder()
    x0, x1 = b.input((2, 3, 4)), b.op("Neg", [b.input((4,))])
    graph = load_model(b.model(b.op("Sub", [b.op("Add", [x0, x1]), x0])))
    assert list(rule.sites(graph)) == []
    match = next(rule.matches(graph, graph.nodes[-1]))
    assert "would change from float[2, 3, 4] to float[4]" in rule.reason(graph, match)


def test_rules_turning_one_operator_into_several_are_left_out_unless_asked_for(tmp_path):
    spec = {
        "name": "relu-of-relu-to-relu",
        "inputs": {"x0": {"rank": 2}},
        "lhs": {
            "nodes": [["Relu", ["x0"], ["t0"], {}], ["Relu", ["t0"], ["y0"], {}]],
            "outputs": ["y0"],
        },
        "rhs": {"nodes": [["Relu", ["x0"], ["y0"], {}]], "outputs": ["y0"]},
        "bidirectional": True,
    }
    path = tmp_path / "rules.json"
    path.write_text(json.dumps({"version": 1, "rules": [spec]}))
    assert [r.name for r in load_templates(path)] == ["relu-of-relu-to-relu"]
    assert [r.name for r in load_templates(path, growing=True)] == [
        "relu-of-relu-to-relu",
        "relu-of-relu-to-relu-reverse",
    ]


def test_the_generated_rule_file_loads_and_a_sample_verifies():
    from rlflow.rewrite.template import GENERATED_PATH

    if not GENERATED_PATH.exists():
        pytest.skip("rules/generated.json has not been generated yet")
    rules = load_templates()
    names = [rule.name for rule in rules]
    assert len(names) == len(set(names)) and len(rules) >= 100
    assert all(name == name.lower() and " " not in name for name in names)
    for rule in rules[:: max(1, len(rules) // 12)]:
        result = verify_rule(rule)
        assert result.passed, (rule.name, result.reason)

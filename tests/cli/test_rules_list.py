"""`rlflow rules list`: each rule as `name: source => target`, in the table and in --json."""

from __future__ import annotations

import json

import pytest

import rlflow.rewrite.rules as rule_library
import rlflow.rewrite.verify as verify
from rlflow.cli import main
from rlflow.rewrite import TemplateRule
from rlflow.rewrite.rules import all_rules, builtin_rules

SPLIT_MATMUL = {
    "name": "matmuls-to-split-of-matmul",
    "origin": "generated",
    "inputs": {"x0": {"rank": 2}, "x1": {"rank": 2}, "x2": {"rank": 2}},
    "lhs": {
        "nodes": [["MatMul", ["x0", "x1"], ["y0"], {}], ["MatMul", ["x0", "x2"], ["y1"], {}]],
        "outputs": ["y0", "y1"],
    },
    "rhs": {
        "nodes": [
            ["Concat", ["x1", "x2"], ["t0"], {"axis": 1}],
            ["MatMul", ["x0", "t0"], ["t1"], {}],
            ["Split", ["t1"], ["y0", "y1"], {"axis": 1, "num_outputs": 2}],
        ],
        "outputs": ["y0", "y1"],
    },
    "bidirectional": True,
}
SPLIT_MATMUL_EQUATION = (
    "(MatMul(x0, x1), MatMul(x0, x2)) => "
    "(Split(MatMul(x0, Concat(x1, x2, axis=1)), axis=1, num_outputs=2)[0], "
    "Split(MatMul(x0, Concat(x1, x2, axis=1)), axis=1, num_outputs=2)[1])"
)


def by_name(rules):
    return {rule.name: rule for rule in rules}


def test_a_pattern_rule_shows_its_pattern_and_its_described_target():
    rules = by_name(builtin_rules())
    assert rules["conv-relu-to-fusedconv"].equation == (
        "Relu(Conv(x, w, b?)) => FusedConv(x, w, b, activation=Relu)"
    )
    assert rules["matmul-add-to-gemm-reverse"].equation == "Gemm(a, b, c?) => Add(MatMul(a, b), c)"


def test_a_rule_written_in_code_shows_its_description():
    assert by_name(builtin_rules())["split-concat-elim"].equation == "Concat(Split(x)) => x"


def test_a_generated_rule_shows_both_sides_as_expressions():
    forward, reverse = TemplateRule(SPLIT_MATMUL), TemplateRule(SPLIT_MATMUL, reverse=True)
    assert forward.equation == SPLIT_MATMUL_EQUATION
    lhs, rhs = SPLIT_MATMUL_EQUATION.split(" => ")
    assert reverse.equation == f"{rhs} => {lhs}"


def test_every_rule_has_an_equation():
    for rule in all_rules():
        source, arrow, target = rule.equation.partition(" => ")
        assert arrow and source and target, rule.name


@pytest.fixture
def listed(tmp_path, monkeypatch):
    """The rules list of one built-in and one generated rule, never verified."""
    monkeypatch.setattr(verify, "cache_path", lambda: tmp_path / "verification.json")
    rules = [by_name(builtin_rules())["conv-relu-to-fusedconv"], TemplateRule(SPLIT_MATMUL)]
    monkeypatch.setattr(rule_library, "all_rules", lambda: rules)


def test_rules_list_prints_name_and_equation(listed, capsys):
    assert main(["rules", "list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["origin", "portable", "verified", "rule:", "source", "=>", "target"]
    assert lines[1].split()[:3] == ["built-in", "no", "not"]
    assert lines[1].endswith(
        "conv-relu-to-fusedconv: Relu(Conv(x, w, b?)) => FusedConv(x, w, b, activation=Relu)"
    )
    assert lines[2].endswith(f"matmuls-to-split-of-matmul: {SPLIT_MATMUL_EQUATION}")
    assert lines[3] == "2 rules, 0 verified (run `rlflow rules verify`)"


def test_rules_list_json_carries_the_equation(listed, capsys):
    assert main(["rules", "list", "--portable", "--json"]) == 0
    payload = json.loads(capsys.readouterr().out)
    assert payload["count"] == 1
    (record,) = payload["rules"]
    assert record["name"] == "matmuls-to-split-of-matmul"
    assert record["equation"] == SPLIT_MATMUL_EQUATION
    assert record["source_ops"] == {"MatMul": 2} and record["verified"] is None

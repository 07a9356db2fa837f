"""Verification: every rule on random inputs at three shape settings, verdicts cached, failing
rules left out of the default RuleSet and listed with their reason."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

import rlflow.rewrite.rules as rule_library
import rlflow.rewrite.verify as verify
from rlflow.rewrite import TemplateRule, default_ruleset, list_rules, verify_rules
from rlflow.rewrite.rules import builtin_rules

DATA = Path(__file__).parent / "data" / "templates.json"


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    path = tmp_path / "verification.json"
    monkeypatch.setattr(verify, "cache_path", lambda: path)
    return path


@pytest.fixture
def wrong_rule() -> TemplateRule:
    """MatMul is not commutative: verification must catch it."""
    spec = copy.deepcopy(json.loads(DATA.read_text())["rules"][0])
    spec.update(
        name="matmul-commute-wrong",
        inputs={"x0": {"rank": 2}, "x1": {"rank": 2}},
        lhs={"nodes": [["MatMul", ["x0", "x1"], ["y0"], {}]], "outputs": ["y0"]},
        rhs={"nodes": [["MatMul", ["x1", "x0"], ["y0"], {}]], "outputs": ["y0"]},
        verified_shapes=[[[3, 3], [3, 3]], [[4, 4], [4, 4]], [[2, 2], [2, 2]]],
        bidirectional=False,
    )
    return TemplateRule(spec)


def test_every_builtin_rule_passes_verification_at_three_settings(cache):
    results = verify_rules(builtin_rules())
    failed = {r.rule: r.reason for r in results if not r.passed}
    assert failed == {}
    assert all(r.settings >= 3 for r in results)
    assert set(json.loads(cache.read_text())) == {r.rule for r in results}


def test_verdicts_are_cached_and_reused(cache, monkeypatch):
    rules = builtin_rules()[:3]
    first = verify_rules(rules)
    monkeypatch.setattr(verify, "verify_rule", lambda rule: pytest.fail("verified again"))
    assert verify_rules(rules) == first


def test_a_failing_rule_is_reported_and_left_out_of_the_default_ruleset(
    cache, monkeypatch, wrong_rule
):
    monkeypatch.setattr(rule_library, "all_rules", lambda: [*builtin_rules(), wrong_rule])
    results = {r.rule: r for r in verify_rules()}
    assert not results["matmul-commute-wrong"].passed
    assert "differs" in results["matmul-commute-wrong"].reason
    rules = default_ruleset()
    assert "matmul-commute-wrong" not in rules and "matmul-add-to-gemm" in rules
    portable = default_ruleset(portable=True)
    assert "conv-relu-to-fusedconv" in rules and "conv-relu-to-fusedconv" not in portable
    assert all(rule.portable for rule in portable)


def test_list_rules_gives_one_record_per_rule(cache, monkeypatch, wrong_rule):
    monkeypatch.setattr(rule_library, "all_rules", lambda: [*builtin_rules()[:2], wrong_rule])
    before = list_rules()
    assert [r["verified"] for r in before] == [None, None, None]
    records = {r["name"]: r for r in list_rules(verify=True)}
    gemm = {r["name"]: r for r in list_rules(builtin_rules())}["matmul-add-to-gemm"]
    assert gemm["source_ops"] == {"Add": 1, "MatMul": 1} and gemm["target_ops"] == {"Gemm": 1}
    assert gemm["origin"] == "built-in" and gemm["portable"] is True
    assert records["matmul-commute-wrong"]["verified"] is False
    assert records["matmul-commute-wrong"]["origin"] == "generated"
    assert records["identity-elim"]["verified"] is True
    assert set(records["identity-elim"]) == {
        "name",
        "origin",
        "portable",
        "source_ops",
        "target_ops",
        "description",
        "verified",
        "reason",
    }
    json.dumps(list(records.values()))  # what `rlflow rules list --json` prints


def test_a_changed_rule_is_verified_again(cache, wrong_rule):
    (first,) = verify_rules([wrong_rule])
    changed = TemplateRule({**wrong_rule.spec, "rhs": wrong_rule.spec["lhs"]})
    (second,) = verify_rules([changed])
    assert first.fingerprint != second.fingerprint
    assert not first.passed and second.passed


def test_a_rule_that_does_not_run_on_the_provider_is_left_out(cache, monkeypatch):
    """On CUDA, FusedConv takes Relu only: a rule whose source pattern onnxruntime cannot load
    there makes check_equivalence raise for the reference; verification reports the rule as
    not running here, and the other rules are still verified (it never raises)."""
    from rlflow.errors import RlflowError

    rules = builtin_rules()[:2]
    same_function = verify.same_function
    calls = []

    def reference_fails_for_the_first(reference, candidate):
        calls.append(reference)
        if len(calls) == 1:  # the first rule's first setting (rules are verified in order)
            raise RlflowError("the reference model fails in onnxruntime: unsupported activation")
        return same_function(reference, candidate)

    monkeypatch.setattr(verify, "same_function", reference_fails_for_the_first)
    results = verify_rules(rules, refresh=True)
    assert not results[0].passed
    assert "does not run on cpu: the reference model fails" in results[0].reason
    assert results[1].passed

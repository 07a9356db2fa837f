"""Verify every rule before it enters a RuleSet, and cache the verdicts.

A rule is verified at each of its shape settings (three or more): its example model (the
source pattern with random constants) is loaded, the rule is applied at the first site of each
of its alternative patterns there, and each result must pass
`onnx.checker.check_model(full_check=True)` and compute the same outputs as the example in
onnxruntime on random inputs (`same_function`), on the execution provider that will run the
rewritten models (`rlflow.cost.session.default_provider`: CUDA where onnxruntime
lists it). A rule failing any setting is left out of every default RuleSet and listed by name
with its reason; so is a rule whose example or result does not run on that provider (CUDA's
FusedConv, for one, takes Relu as its only activation, and a session holding any other fails to
load). The rule generator checks its candidate rules with `same_function` too, so "verified"
means one thing for every rule.

Verdicts are cached in `$RLFLOW_CACHE_DIR/rewrite/verification.json` (default
`~/.cache/rlflow/rewrite/`), keyed by rule name and a fingerprint of the rule's source, the
engine's source, the onnx / onnxruntime versions and the provider, so `default_ruleset()` is
fast after the first call and a changed rule is verified again.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import onnx

from rlflow.cost.cache import cache_dir, read_json, update_json_atomic
from rlflow.cost.session import default_provider
from rlflow.errors import RlflowError, first_line
from rlflow.rewrite.replacement import Match, RewriteRejected
from rlflow.rewrite.rule import Rule

if TYPE_CHECKING:
    from rlflow.cost.equivalence import EquivalenceReport
    from rlflow.cost.source import ModelLike
    from rlflow.graph import Graph

_ENGINE_MODULES = (
    "rule.py",
    "replacement.py",
    "pattern.py",
    "build.py",
    "template.py",
    "rules/common.py",
    "verify.py",
)

RULE_SEEDS = (0, 1)
"""The random input sets on which a rule's two sides are compared, at each shape setting."""


def same_function(reference: ModelLike, candidate: ModelLike) -> EquivalenceReport:
    """Whether `candidate` computes what `reference` does: the test every rule must pass at each
    of its shape settings, at `rlflow.cost.equivalence`'s tolerances on RULE_SEEDS (the
    onnxruntime optimiser off, so the rule is judged and not ORT's fusions)."""
    from rlflow.cost.equivalence import check_equivalence

    return check_equivalence(reference, candidate, seeds=RULE_SEEDS)


@dataclass(frozen=True)
class VerificationResult:
    """The verdict on one rule: passed at every one of `settings` shape settings, or why not."""

    rule: str
    passed: bool
    settings: int
    max_abs_err: float
    reason: str
    fingerprint: str = ""


def verify_rule(rule: Rule) -> VerificationResult:
    """Apply `rule` to its example at every shape setting and check the result (never raises)."""
    fingerprint = rule_fingerprint(rule)
    worst = 0.0

    def failed(setting: int, reason: str) -> VerificationResult:
        return VerificationResult(
            rule.name, False, rule.settings, worst, f"setting {setting}: {reason}", fingerprint
        )

    for setting in range(rule.settings):
        try:
            graph = rule.example_graph(setting)
        except Exception as error:  # a rule without a usable example cannot be trusted
            return failed(setting, f"no example model ({first_line(error)})")
        try:
            sites = _one_site_per_pattern(rule, graph)
        except Exception as error:  # a rule bug
            return failed(setting, f"invalid match: {first_line(error)}")
        if not sites:
            return failed(setting, "the rule finds no site in its example")
        for match in sites:
            reason, error = _check_site(rule, graph, match)
            worst = max(worst, error)
            if reason:
                return failed(setting, reason)
    return VerificationResult(rule.name, True, rule.settings, worst, "equivalent", fingerprint)


def _one_site_per_pattern(rule: Rule, graph: Graph) -> list[Match]:
    """The first site of each of the rule's alternative patterns that its example holds: an
    example can hold a site of several (a Conv alone, and the Conv with its activation), and
    each alternative rewrites differently."""
    sites: dict[int, Match] = {}
    for match in rule.sites(graph):
        sites.setdefault(match.pattern_index, match)
    return list(sites.values())


def _check_site(rule: Rule, graph: Graph, match: Match) -> tuple[str, float]:
    """Why the rewrite of `graph` at `match` is not valid or not equivalent ('' when it is), and
    its largest absolute error."""
    try:
        result = rule.apply(graph, match)
        onnx.checker.check_model(result.to_onnx(), full_check=True)
    except RewriteRejected as error:
        return f"rewrite rejected: {error}", 0.0
    except Exception as error:  # checker errors come in several types; a rule bug too
        return f"invalid result: {first_line(error)}", 0.0
    try:
        report = same_function(graph, result)
    except RlflowError as error:  # a side onnxruntime cannot load or run on this provider
        return f"does not run on {default_provider()}: {first_line(error)}", 0.0
    return ("" if report.equivalent else report.reason), report.max_abs_err


def verify_rules(
    rules: Sequence[Rule] | None = None, *, refresh: bool = False
) -> list[VerificationResult]:
    """Verdicts for `rules` (default: every rule), from the cache where still valid.

    Args:
        rules: the rules to verify; default `all_rules()`.
        refresh: verify every rule again, ignoring cached verdicts.
    """
    from rlflow.rewrite.rules import all_rules

    rules = all_rules() if rules is None else list(rules)
    cache = {} if refresh else _read_cache()
    results = []
    fresh = {}
    for rule in rules:
        fingerprint = rule_fingerprint(rule)
        entry = cache.get(rule.name)
        if entry is not None and entry.get("fingerprint") == fingerprint:
            results.append(VerificationResult(**entry))
            continue
        result = verify_rule(rule)
        fresh[rule.name] = asdict(result)
        results.append(result)
    if fresh:
        _write_cache(fresh)
    return results


def cached_results(rules: Iterable[Rule]) -> dict[str, VerificationResult | None]:
    """The cached verdict of each rule (None: never verified, or changed since)."""
    cache = _read_cache()
    verdicts: dict[str, VerificationResult | None] = {}
    for rule in rules:
        entry = cache.get(rule.name)
        valid = entry is not None and entry.get("fingerprint") == rule_fingerprint(rule)
        verdicts[rule.name] = VerificationResult(**entry) if valid else None
    return verdicts


def list_rules(rules: Sequence[Rule] | None = None, verify: bool = False) -> list[dict[str, Any]]:
    """One record per rule for `rlflow rules list [--json]`.

    Keys: name, origin, portable, source_ops, target_ops, description, verified (True, False,
    or None when not verified yet; `verify=True` verifies those first) and reason. The command
    adds each rule's `equation` (Rule.equation) beside them.
    """
    from rlflow.rewrite.rules import all_rules

    rules = all_rules() if rules is None else list(rules)
    if verify:
        verdicts = {r.rule: r for r in verify_rules(rules)}
    else:
        verdicts = cached_results(rules)
    records = []
    for rule in rules:
        verdict = verdicts.get(rule.name)
        records.append(
            {
                "name": rule.name,
                "origin": rule.origin,
                "portable": rule.portable,
                "source_ops": dict(rule.source_ops),
                "target_ops": dict(rule.target_ops),
                "description": rule.description,
                "verified": None if verdict is None else verdict.passed,
                "reason": "" if verdict is None else verdict.reason,
            }
        )
    return records


# ---- fingerprints and the cache ----------------------------------------------------------------


def rule_fingerprint(rule: Rule) -> str:
    """Changes when the rule, the engine, onnx, onnxruntime or its provider may behave
    differently."""
    import onnxruntime

    return hashlib.sha256(
        "\0".join(
            [
                rule.name,
                rule.fingerprint(),
                _engine_digest(),
                onnx.__version__,
                onnxruntime.__version__,
                default_provider(),
            ]
        ).encode()
    ).hexdigest()[:24]


@functools.cache
def _engine_digest() -> str:
    package = Path(__file__).parent
    digest = hashlib.sha256()
    for relative in _ENGINE_MODULES:
        digest.update((package / relative).read_bytes())
    return digest.hexdigest()


def cache_path() -> Path:
    return cache_dir() / "rewrite" / "verification.json"


def _read_cache() -> dict[str, dict]:
    return read_json(cache_path())


def _write_cache(fresh: dict[str, dict]) -> None:
    """Merge new verdicts into the cache file (written to a temporary name and renamed)."""
    try:
        update_json_atomic(cache_path(), fresh)
    except OSError:
        pass  # a read-only cache only costs re-verification

"""Graph rewriting: rules (pattern, check, rewrite), rule sets and their candidates, verification.

`default_ruleset()` gives the verified rules (`portable=True`: plain ONNX only), and
`ruleset.candidates(graph)` every distinct rewrite of a graph as a Candidate (rule, site, and
the rewritten graph, built when first asked for).
"""

from rlflow.rewrite.replacement import Match, Replacement, RewriteRejected
from rlflow.rewrite.rule import Emitter, Rule
from rlflow.rewrite.ruleset import Candidate, RuleSet, default_ruleset
from rlflow.rewrite.template import TemplateRule, load_templates
from rlflow.rewrite.verify import VerificationResult, list_rules, verify_rule, verify_rules

__all__ = [
    "Candidate",
    "Emitter",
    "Match",
    "Replacement",
    "RewriteRejected",
    "Rule",
    "RuleSet",
    "TemplateRule",
    "VerificationResult",
    "default_ruleset",
    "list_rules",
    "load_templates",
    "verify_rule",
    "verify_rules",
]

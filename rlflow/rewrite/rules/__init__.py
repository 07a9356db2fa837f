"""The rule library, one module per family; `builtin_rules()` lists them in a fixed order.

Generated rules (from `rlflow.rewrite.generator`) live in `generated.json` beside this file
and are loaded by `rlflow.rewrite.template`.
"""

from __future__ import annotations

from rlflow.rewrite.rule import Rule


def builtin_rules() -> list[Rule]:
    """Every hand-written rule, portable and not, verified or not."""
    from rlflow.rewrite.rules import (
        attention,
        conv,
        fusion,
        matmul,
        nchwc,
        nchwc_join,
        nchwc_projection,
        nchwc_projection_join,
        reshape,
        simplify,
        slicing,
        transformer,
        winograd,
    )

    return [
        *simplify.RULES,
        *matmul.RULES,
        *conv.RULES,
        *fusion.RULES,
        *transformer.RULES,
        *reshape.RULES,
        *nchwc.RULES,
        *nchwc_join.RULES,
        *nchwc_projection.RULES,
        *nchwc_projection_join.RULES,
        *attention.RULES,
        *winograd.RULES,
        *slicing.RULES,
    ]


def all_rules() -> list[Rule]:
    """Built-in rules, then the generated ones whose names do not clash with a built-in."""
    import warnings

    from rlflow.rewrite.template import load_templates

    rules = builtin_rules()
    names = {rule.name for rule in rules}
    for rule in load_templates():
        if rule.name in names:
            warnings.warn(f"generated rule {rule.name} skipped: the name is taken", stacklevel=2)
            continue
        names.add(rule.name)
        rules.append(rule)
    return rules

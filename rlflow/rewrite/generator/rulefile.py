"""The rule file: verified pairs as the entries `rlflow.rewrite.template` loads, and the
document that holds them (format described there).

The document is written one rule a line, so that a regenerated file diffs rule by rule.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from rlflow.rewrite.generator.dag import to_nodes
from rlflow.rewrite.generator.menu import SPECS
from rlflow.rewrite.generator.pairs import Pair, joint_shapes
from rlflow.rewrite.generator.symbolic import WEIGHT, resolve
from rlflow.rewrite.template import TEMPLATE_OPSET


def _rule_inputs(pair: Pair) -> dict[str, dict[str, Any]]:
    """Each input's rank, and `const` for conv weights that another op than Conv reads:
    such a rule only pays when the weight is a constant that folds."""
    joint = joint_shapes(pair)
    assert joint is not None
    subst, shapes, _ = joint
    inputs = {}
    for i in pair.used_inputs():
        entry: dict[str, Any] = {"rank": pair.lhs.rank}
        if resolve(shapes[i][0], subst) == WEIGHT:
            readers = {SPECS[k].op_type for g in (pair.lhs, pair.rhs) for k, a in g.ops if i in a}
            if readers - {"Conv"}:
                entry["const"] = True
        inputs[f"x{i}"] = entry
    return inputs


def to_rule(pair: Pair, points: Sequence[dict[int, tuple[int, ...]]], name: str) -> dict[str, Any]:
    """The rule-file entry of a verified pair."""
    sides = {}
    for side, graph in (("lhs", pair.lhs), ("rhs", pair.rhs)):
        nodes, outputs = to_nodes(graph)
        sides[side] = {"nodes": nodes, "outputs": outputs}
    identity = all(SPECS[k].op_type == "Identity" for k, _ in pair.rhs.ops)
    return {
        "name": name,
        "origin": "generated",
        "inputs": _rule_inputs(pair),
        **sides,
        # Reading Identity(x) -> graph would match every tensor: keep only the simplification.
        "bidirectional": not identity,
        "verified_shapes": [{f"x{i}": list(s) for i, s in point.items()} for point in points],
    }


def settings_summary(
    max_ops: int, ops: Sequence[str], num_inputs: int, ranks: Sequence[int]
) -> str:
    """The generator settings, as the document's header records them."""
    return (
        f"max_ops={max_ops} inputs={num_inputs} ranks={','.join(map(str, ranks))} "
        f"ops={','.join(ops)}"
    )


def document_text(rules: Sequence[dict[str, Any]], settings: str) -> str:
    """The rule file's text: a header line, then one rule a line."""
    header = {
        "version": 1,
        "generator": f"rlflow.rewrite.generator {settings}",
        "opset": TEMPLATE_OPSET,
    }
    return (
        "{"
        + ", ".join(f"{json.dumps(k)}: {json.dumps(v)}" for k, v in header.items())
        + ', "rules": [\n'
        + ",\n".join(json.dumps(rule) for rule in rules)
        + "\n]}\n"
    )

"""Property: any sequence of rewrites keeps a model computing the same function.

For hand-built models and a few small zoo models, 50 rewrites picked at random (fixed seed)
among all sites of all built-in and generated rules (and hand-made templates) are applied in
sequence;
the result must still pass the full checker, give every value a static shape, and match the
original in onnxruntime.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest

from rlflow.cost.equivalence import check_equivalence
from rlflow.graph import Graph, load_model
from rlflow.rewrite import RewriteRejected, RuleSet, load_templates
from rlflow.rewrite.build import ModelBuilder
from rlflow.rewrite.rules import builtin_rules

STEPS = 50
# Built-in rules, the generated ones (rules/generated.json, if generated) and the hand-made
# templates of tests/rewrite/data that the generated file does not already name.
_GENERATED = load_templates()
RULES = RuleSet(
    [
        *builtin_rules(),
        *_GENERATED,
        *(
            rule
            for rule in load_templates(Path(__file__).parent / "data" / "templates.json")
            if rule.name not in {generated.name for generated in _GENERATED}
        ),
    ]
)


def _conv_block() -> onnx.ModelProto:
    """An Inception-like block: branches of 1x1 and 3x3 convs with BN and Relu, concatenated."""
    b = ModelBuilder(opset=18, seed=4)
    x = b.input((1, 4, 8, 8))

    def conv_bn_relu(source: str, out: int, k: int) -> str:
        conv = b.op("Conv", [source, b.const((out, 4, k, k)), b.const((out,))], pads=[k // 2] * 4)
        var = b.const(np.abs(b.rng.standard_normal(out)) + 0.5)
        bn = b.op(
            "BatchNormalization", [conv, b.const((out,)), b.const((out,)), b.const((out,)), var]
        )
        return b.op("Relu", [bn])

    branches = [conv_bn_relu(x, 3, 1), conv_bn_relu(x, 5, 3), conv_bn_relu(x, 2, 1)]
    return b.model(b.op("Concat", branches, axis=1))


def _attention() -> onnx.ModelProto:
    """One post-LN transformer layer: fused QKV candidates, the softmax scale, Gelu, LN."""
    b = ModelBuilder(opset=18, seed=5)
    seq, width = 4, 6
    x = b.input((1, seq, width))

    def project(source: str, out: int) -> str:
        return b.op("Add", [b.const((out,)), b.op("MatMul", [source, b.const((width, out))])])

    q, k, v = project(x, width), project(x, width), project(x, width)
    k_t = b.op("Transpose", [k], perm=[0, 2, 1])
    scores = b.op("Mul", [b.op("MatMul", [q, k_t]), b.const(width**-0.5)])
    attended = b.op("MatMul", [b.op("Softmax", [scores], axis=-1), v])
    total = b.op("Add", [x, project(attended, width)])
    normed = b.op("LayerNormalization", [total, b.const((width,)), b.const((width,))])
    hidden = project(normed, 8)
    erf = b.op("Erf", [b.op("Div", [hidden, b.const(2**0.5)])])
    gelu = b.op("Mul", [b.op("Mul", [hidden, b.op("Add", [erf, b.const(1.0)])]), b.const(0.5)])
    return b.model(b.op("Add", [normed, b.op("MatMul", [gelu, b.const((8, width))])]))


def _zoo(name: str):
    def build() -> onnx.ModelProto:
        zoo = pytest.importorskip("rlflow.zoo")
        return onnx.load(str(zoo.cached_path(name)))

    return build


def _zoo_names() -> tuple[str, ...]:
    from rlflow.zoo import MODEL_NAMES

    return MODEL_NAMES


MODELS = {
    "conv-block": _conv_block,
    "attention": _attention,
    **{f"zoo-{name}": _zoo(name) for name in _zoo_names()},
}


def _random_walk(graph: Graph, rules: RuleSet, steps: int, seed: int) -> tuple[Graph, list[str]]:
    """Apply `steps` rewrites, each from a rule drawn uniformly among those with a site (so a
    rule with many sites does not crowd out the others), at a random site of it."""
    rng = np.random.default_rng(seed)
    cap = 2 * len(graph)
    applied: list[str] = []
    for _ in range(steps):
        by_rule: dict[str, list] = {}
        for rule, match in rules.sites(graph):
            by_rule.setdefault(rule.name, []).append((rule, match))
        choices = [
            (rule, match)
            for name in sorted(by_rule)
            for rule, match in [by_rule[name][int(rng.integers(len(by_rule[name])))]]
        ]
        rng.shuffle(choices)
        for rule, match in choices:
            try:
                result = rule.apply(graph, match)
            except RewriteRejected:
                continue
            if len(result) <= cap:
                graph = result
                applied.append(rule.name)
                break
        else:
            break
    return graph, applied


@pytest.mark.parametrize("portable", [False, True], ids=["all", "portable"])
@pytest.mark.parametrize("name", sorted(MODELS))
def test_random_rewrites_keep_the_model_equivalent(name, portable):
    original = load_model(MODELS[name]())
    rules = RULES.select(portable=portable)
    rewritten, applied = _random_walk(original, rules, STEPS, seed=0)
    # A walk ends early only at a graph no rule can rewrite any further.
    assert len(applied) == STEPS or not rules.candidates(rewritten, max_ops=2 * len(original)), (
        f"only {len(applied)} rewrites applied: {applied}"
    )
    if name.startswith("zoo-"):
        assert len(applied) == STEPS
    exported = rewritten.to_onnx()
    onnx.checker.check_model(exported, full_check=True)
    for node in rewritten.nodes:
        for output in filter(None, node.outputs):
            assert all(isinstance(d, int) and d >= 0 for d in rewritten.value(output).shape)
    report = check_equivalence(original, rewritten, seeds=(0, 1))
    assert report.equivalent, (report.reason, applied)

"""Attention into onnxruntime's fused `Attention` and back, on the zoo's transformers: one site per
attention layer, found in the graph as exported and in onnxruntime's own optimised graph (its
Gemm and FusedMatMul forms), and every graph on the way computing what the original does."""

from __future__ import annotations

import pytest

from rlflow.cost import OrtSettings, check_equivalence
from rlflow.cost.analytic import op_cost
from rlflow.cost.ort_optimizer import start_state
from rlflow.graph import Graph, load_model
from rlflow.graph.domains import MS_DOMAIN
from rlflow.rewrite.rules.attention import AttentionFusion, AttentionFusionReverse
from rlflow.rewrite.verify import verify_rule
from rlflow.zoo import cached_path

FUSE, UNFUSE = AttentionFusion(), AttentionFusionReverse()
# Attention layers of each small zoo transformer (the transducer: 2 audio + 1 label layers).
LAYERS = {"bert": 2, "vit-base": 2, "mini-dalle": 2, "transformer-transducer": 3}


def attention_nodes(graph: Graph) -> list:
    return [n for n in graph.nodes if n.op_type == "Attention" and n.domain == MS_DOMAIN]


@pytest.mark.parametrize("rule", [FUSE, UNFUSE], ids=lambda rule: rule.name)
def test_attention_rules_pass_verification(rule):
    result = verify_rule(rule)
    assert result.passed, result.reason


@pytest.mark.parametrize("start", ["original", "ort:all"])
@pytest.mark.parametrize("name", sorted(LAYERS))
def test_every_attention_layer_fuses_and_unfuses(name, start):
    original = load_model(cached_path(name, "small"))
    graph = start_state(original, start, OrtSettings()).graph
    fused, count = FUSE.apply_everywhere(graph)
    assert count == LAYERS[name] == len(attention_nodes(fused))
    causal = [n.attr("unidirectional", 0) for n in attention_nodes(fused)]
    masked = {"bert": 0, "vit-base": 0, "mini-dalle": 2, "transformer-transducer": 1}[name]
    assert sum(causal) == masked  # the causal decoder layers, and only they
    report = check_equivalence(original, fused)
    assert report.equivalent, report.reason

    unfused, count = UNFUSE.apply_everywhere(fused)
    assert count == LAYERS[name] and not attention_nodes(unfused)
    report = check_equivalence(original, unfused)
    assert report.equivalent, report.reason
    refused, _ = FUSE.apply_everywhere(unfused)
    assert refused.canonical_hash() == fused.canonical_hash()


def test_attention_costs_its_projection_products_and_softmax():
    """The analytic FLOPs of the fused operator are those of the operators it replaces."""
    f = 1  # TensorProto.FLOAT
    batch, seq, embed, heads, size = 1, 16, 64, 4, 16
    hidden = heads * size

    def t(*shape):
        return (shape, f)

    fused = op_cost(
        "Attention",
        (t(batch, seq, embed), t(embed, 3 * hidden), t(3 * hidden)),
        (t(batch, seq, hidden),),
        (("num_heads", heads),),
    )
    projection = op_cost(
        "MatMul", (t(batch, seq, embed), t(embed, hidden)), (t(batch, seq, hidden),)
    )
    bias = op_cost("Add", (t(batch, seq, hidden), t(hidden)), (t(batch, seq, hidden),))
    scores = op_cost(
        "MatMul",
        (t(batch, heads, seq, size), t(batch, heads, size, seq)),
        (t(batch, heads, seq, seq),),
    )
    context = op_cost(
        "MatMul",
        (t(batch, heads, seq, seq), t(batch, heads, seq, size)),
        (t(batch, heads, seq, size),),
    )
    softmax = op_cost("Softmax", (t(batch, heads, seq, seq),), (t(batch, heads, seq, seq),))
    parts = 3 * (projection.flops + bias.flops) + scores.flops + context.flops + softmax.flops
    assert fused.flops == pytest.approx(parts)

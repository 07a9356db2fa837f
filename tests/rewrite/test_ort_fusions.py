"""The rules redo onnxruntime's CPU fusions one site at a time, and undo them.

On every small zoo model: the forward rules, applied greedily in the order ORT runs its passes,
take the original to the op counts of ORT's `extended` graph; the reverse rules take ORT's
`extended` and `all` graphs back to plain ONNX (NCHWc ops aside, another family's); every graph
on the way computes what the original does.

Two differences from ORT are by design, and the comparison states them exactly:

- ORT's SkipLayerNormFusion leaves a residual Add whose sum is read again (the pre-LN residual
  stream of ViT, mini-DALL-E and the transducer); skip-layernorm-fusion fuses it too and hands
  the sum on as the fused op's fourth output. Each such site is one SkipLayerNormalization
  where ORT keeps an Add and a LayerNormalization.
- ORT's ReshapeFusion runs at level 1 only, and MatMulAddFusion leaves inputs of an attention
  block to level 2 (BERT's projections), so ORT keeps some Reshape pairs the reshape folds
  merge. The same folds are applied to ORT's graph before comparing.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from rlflow.cost.equivalence import check_equivalence
from rlflow.cost.session import ORT_LEVELS
from rlflow.graph import Graph, load_model
from rlflow.graph.domains import MS_DOMAIN
from rlflow.rewrite.build import ModelBuilder
from rlflow.rewrite.rules import builtin_rules
from rlflow.zoo import MODEL_NAMES, cached_path

RULES = {rule.name: rule for rule in builtin_rules()}

# ORT's passes that change a zoo graph at `extended`, in the order ORT runs them, as our rules.
FORWARD = [
    "conv-batchnorm-fold",  # Level1_RuleBasedTransformer: ConvBNFusion, ConvMulFusion, ConvAdd...
    "conv-mul-fold",
    "conv-add-bias-fold",
    "matmul-add-to-gemm",  # MatMulAddFusion
    "matmul-add-to-reshaped-gemm",
    "reshape-reshape-fold",  # ReshapeFusion
    "reshape-unsqueeze-fold",
    "reshape-squeeze-fold",
    "gelu-fusion",  # GeluFusionL2
    "bias-gelu-fusion",
    "fastgelu-fusion",
    "layernorm-fusion",
    "skip-layernorm-fusion",  # SkipLayerNormFusion
    "skip-layernorm-bias-fusion",
    "matmul-scale-to-fusedmatmul",  # MatMulScaleFusion
    "matmul-input-scale-to-fusedmatmul",
    "conv-relu-to-fusedconv",  # ConvActivationFusion
    "conv-activation-to-fusedconv",
]
REVERSE = [
    "fusedconv-to-conv",
    "fusedmatmul-to-matmul",
    "gelu-fusion-reverse",
    "bias-gelu-fusion-reverse",
    "fastgelu-fusion-reverse",
    "skip-layernorm-fusion-reverse",
    "matmul-add-to-reshaped-gemm-reverse",
]
RESHAPE_FOLDS = ["reshape-reshape-fold", "reshape-unsqueeze-fold", "reshape-squeeze-fold"]
# Unsqueezes that ORT's ReshapeFusion folds into a Gemm's output Reshape: undone, it stays one.
FOLDED_UNSQUEEZES = {"transformer-transducer": 1}
# The contrib attributes that must be ORT's to the bit (alpha in float32, epsilon, activation),
# with the defaults ORT writes out and we leave implicit.
KEY_ATTRS = {"alpha": 1.0, "transA": 0, "transB": 0, "epsilon": None, "activation": None}


def rewrite_to_fixpoint(graph: Graph, names: list[str]) -> Graph:
    """The first of `names` that has a site, applied at its first site, until none has one: the
    order of `names` is the priority (for FORWARD, the order ORT runs its passes in)."""
    for _ in range(1000):
        for name in names:
            site = next(iter(RULES[name].sites(graph)), None)
            if site is not None:
                graph = RULES[name].apply(graph, site)
                break
        else:
            return graph
    raise AssertionError("no fixpoint after 1000 rewrites")


def ort_graph(model: Path, level: str, folder: Path) -> Graph:
    """onnxruntime's optimised graph of `model` at `level`, as it saves it offline."""
    options = ort.SessionOptions()
    options.graph_optimization_level = ORT_LEVELS[level]
    options.intra_op_num_threads = 1
    options.optimized_model_filepath = str(folder / f"{level}.onnx")
    ort.InferenceSession(str(model), options, providers=["CPUExecutionProvider"])
    return load_model(folder / f"{level}.onnx")


def op_counts(graph: Graph) -> Counter:
    return Counter((node.domain, node.op_type) for node in graph.nodes)


def contrib_forms(graph: Graph) -> set:
    return {
        (node.op_type, *((k, node.attr(k)) for k, v in KEY_ATTRS.items() if node.attr(k, v) != v))
        for node in graph.nodes
        if node.domain == MS_DOMAIN
    }


def assert_equivalent(reference: Graph, candidate: Graph) -> None:
    report = check_equivalence(reference, candidate, seeds=(0,))
    assert report.equivalent, report.reason


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_forward_rules_reach_ort_extended_graph(name, tmp_path):
    path = cached_path(name, "small")
    original = load_model(path)
    ours = rewrite_to_fixpoint(original, FORWARD)
    theirs = rewrite_to_fixpoint(ort_graph(path, "extended", tmp_path), RESHAPE_FOLDS)
    expected = op_counts(theirs)
    shared = sum(
        1
        for node in ours.nodes
        if node.op_type == "SkipLayerNormalization" and len(node.outputs) > 3 and node.outputs[3]
    )
    expected.subtract({("", "Add"): shared, ("", "LayerNormalization"): shared})
    expected[(MS_DOMAIN, "SkipLayerNormalization")] += shared
    assert +op_counts(ours) == +expected
    assert contrib_forms(ours) == contrib_forms(theirs)
    assert_equivalent(original, ours)


@pytest.mark.parametrize("level", ["extended", "all"])
@pytest.mark.parametrize("name", MODEL_NAMES)
def test_reverse_rules_undo_ort_graph(name, level, tmp_path):
    path = cached_path(name, "small")
    original = load_model(path)
    undone = rewrite_to_fixpoint(ort_graph(path, level, tmp_path), REVERSE)
    assert not [node for node in undone.nodes if node.domain == MS_DOMAIN]
    assert_equivalent(original, undone)
    if level == "extended":  # back to the original's ops, but for the folds ORT made
        expected = op_counts(original)
        del expected[("", "BatchNormalization")]
        folded = FOLDED_UNSQUEEZES.get(name, 0)
        expected.subtract({("", "Unsqueeze"): folded})
        expected[("", "Reshape")] += folded
        assert +op_counts(undone) == +expected


@pytest.mark.parametrize(
    "act, inputs, attrs",
    [
        ("Relu", [], {}),
        ("Sigmoid", [], {}),
        ("Tanh", [], {}),
        ("LeakyRelu", [], {"alpha": 0.2}),
        ("Clip", [-1.0, 1.0], {}),
        ("HardSigmoid", [], {"alpha": 0.25, "beta": 0.4}),
    ],
)
def test_conv_activation_fuses_and_comes_back(act, inputs, attrs):
    b = ModelBuilder()
    conv = b.op("Conv", [b.input((1, 3, 6, 6)), b.const((4, 3, 3, 3)), b.const((4,))])
    bounds = [b.const(value) for value in inputs]
    graph = load_model(b.model(b.op(act, [conv, *bounds], **attrs)))
    fuse = RULES["conv-relu-to-fusedconv" if act == "Relu" else "conv-activation-to-fusedconv"]
    fused = rewrite_to_fixpoint(graph, [fuse.name])
    (node,) = fused.nodes
    assert node.attr("activation") == act
    assert np.allclose(node.attr("activation_params", []), inputs + list(attrs.values()))
    restored = rewrite_to_fixpoint(fused, ["fusedconv-to-conv"])
    assert [node.op_type for node in restored.nodes] == ["Conv", act]
    assert_equivalent(graph, fused)
    assert_equivalent(graph, restored)


def test_input_and_output_scales_join_one_fusedmatmul_with_ort_alpha():
    b = ModelBuilder()
    query = b.op("Div", [b.input((2, 4, 3)), b.const(3.0)])
    product = b.op("MatMul", [query, b.op("Mul", [b.input((2, 3, 5)), b.const(0.7)])])
    graph = load_model(b.model(b.op("Mul", [product, b.const(1.3)])))
    fused = rewrite_to_fixpoint(
        graph, ["matmul-scale-to-fusedmatmul", "matmul-input-scale-to-fusedmatmul"]
    )
    (node,) = fused.nodes
    alpha = np.float32(1.3) * (np.float32(1) / np.float32(3.0)) * np.float32(0.7)
    assert node.op_type == "FusedMatMul" and node.attr("alpha") == pytest.approx(alpha, rel=1e-7)
    assert_equivalent(graph, fused)
    restored = rewrite_to_fixpoint(fused, ["fusedmatmul-to-matmul"])
    assert [node.op_type for node in restored.nodes] == ["MatMul", "Mul"]
    assert_equivalent(graph, restored)


def test_skip_layernorm_with_bias_and_read_sum_comes_back():
    b = ModelBuilder(opset=18)
    dims = (1, 4, 8)
    biased = b.op("Add", [b.op("Relu", [b.input(dims)]), b.const((8,))])
    total = b.op("Add", [b.input(dims), biased])
    normed = b.op("LayerNormalization", [total, b.const((8,)), b.const((8,))], epsilon=1e-6)
    graph = load_model(b.model(b.op("Add", [normed, total])))
    fused = rewrite_to_fixpoint(graph, ["skip-layernorm-fusion", "skip-layernorm-bias-fusion"])
    assert [node.op_type for node in fused.nodes] == ["Relu", "SkipLayerNormalization", "Add"]
    (sln,) = [node for node in fused.nodes if node.domain == MS_DOMAIN]
    assert len(sln.present_inputs) == 5 and sln.outputs[3]
    assert sln.attr("epsilon") == pytest.approx(1e-6)
    restored = rewrite_to_fixpoint(fused, ["skip-layernorm-fusion-reverse"])
    assert Counter(n.op_type for n in restored.nodes) == Counter(n.op_type for n in graph.nodes)
    assert_equivalent(graph, fused)
    assert_equivalent(graph, restored)


def test_a_rule_applied_everywhere_fuses_every_residual_block(tmp_path):
    """`Rule.apply_everywhere` on ResNet-18's BatchNorm-folded graph: Relu(Add(Conv, z)) at every
    residual block, then Relu(Conv) at every other Conv, and `max_sites` stops it early."""
    graph = ort_graph(cached_path("resnet-18", "small"), "basic", tmp_path)
    residual, plain = RULES["conv-add-relu-to-fusedconv"], RULES["conv-relu-to-fusedconv"]
    adds = op_counts(graph)[("", "Add")]
    fused, sites = residual.apply_everywhere(graph)
    assert sites == adds > 0 and op_counts(fused)[("", "Add")] == 0
    both, more = plain.apply_everywhere(fused)
    assert more == op_counts(graph)[("", "Relu")] - adds > 0
    assert op_counts(both)[(MS_DOMAIN, "FusedConv")] == sites + more
    assert not list(residual.sites(both)) and not list(plain.sites(both))
    assert_equivalent(graph, both)
    once, one = residual.apply_everywhere(graph, max_sites=1)
    assert one == 1 and op_counts(once)[("", "Add")] == adds - 1

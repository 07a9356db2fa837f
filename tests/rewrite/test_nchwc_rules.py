"""NCHWc layout rules against onnxruntime's own NCHWc transformer: each rule verified, the filter
reorders equal to the ones onnxruntime writes, the original CNNs rewritten to the structure of
onnxruntime's `all` graphs, and those graphs rewritten back out of the layout."""

from __future__ import annotations

from collections import Counter

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import numpy_helper

from rlflow.cost import check_equivalence, nchwc_block_size
from rlflow.graph import MS_DOMAIN, NCHWC_DOMAIN, Graph, load_model
from rlflow.rewrite.build import ModelBuilder
from rlflow.rewrite.rules import conv, nchwc, nchwc_join, nchwc_layout
from rlflow.rewrite.rules.common import merge_groups
from rlflow.rewrite.rules.nchwc_format import (
    conv_layout,
    padded,
    reorder_filter,
    restore_filter,
)
from rlflow.rewrite.verify import verify_rule
from rlflow.zoo import cached_path

BLOCK = nchwc_block_size()
pytestmark = pytest.mark.skipif(BLOCK is None, reason="onnxruntime does no NCHWc here")

RULES = {rule.name: rule for rule in [*conv.RULES, *nchwc.RULES, *nchwc_join.RULES]}

# onnxruntime's levels 1-2 before its NCHWc pass: BatchNormalization folded, Conv+Relu fused.
BEFORE_LAYOUT = ["conv-batchnorm-fold", "conv-relu-to-fusedconv"]
# Into the layout: convert ops, join regions, move and fuse the rest in.
FORWARD = [
    "nchwc-conv",
    "nchwc-conv-join",
    "nchwc-pool",
    "nchwc-pool-join",
    "nchwc-reorder-cancel",
    "nchwc-reorder-roundtrip",
    "nchwc-reorder-share",
    "nchwc-activation-move",
    "nchwc-binary-move",
    "nchwc-concat-move",
    "nchwc-global-pool",
    "nchwc-batchnorm",
    "nchwc-conv-sum-fusion",
    "nchwc-conv-activation-fusion",
]
# Out of it: un-fuse, convert back, move ops out, and split regions where nothing else applies.
REVERSE = [
    "nchwc-conv-activation-fusion-reverse",
    "nchwc-conv-sum-fusion-reverse",
    "nchwc-conv-reverse",
    "nchwc-pool-reverse",
    "nchwc-activation-move-reverse",
    "nchwc-binary-move-reverse",
    "nchwc-concat-move-reverse",
    "nchwc-global-pool-reverse",
    "nchwc-reorder-roundtrip",
    "nchwc-reorder-share",
    "nchwc-reorder-cancel-reverse",
]


def to_fixpoint(graph: Graph, names: list[str]) -> Graph:
    """Apply the first rule (in `names` order) that has a site, until none has."""
    rules = [RULES[name] for name in names]
    while True:
        for rule in rules:
            match = next(iter(rule.sites(graph)), None)
            if match is not None:
                graph = rule.apply(graph, match)
                break
        else:
            return graph


def ort_all(source: onnx.ModelProto | str, folder) -> onnx.ModelProto:
    """onnxruntime's own optimised graph (level all, CPU) of a model."""
    options = ort.SessionOptions()
    options.log_severity_level = 3
    options.optimized_model_filepath = str(folder / "all.onnx")
    model = source.SerializeToString() if isinstance(source, onnx.ModelProto) else str(source)
    ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])
    return onnx.load(str(folder / "all.onnx"))


def op_counts(graph: Graph) -> Counter:
    return Counter((node.domain, node.op_type) for node in graph.nodes)


def nchwc_values(graph: Graph) -> list:
    """The type and shape of every nchwc op's output, by op type."""
    values = [graph.value(node.outputs[0]) for node in graph.nodes if node.domain == NCHWC_DOMAIN]
    ops = [node.op_type for node in graph.nodes if node.domain == NCHWC_DOMAIN]
    return sorted((op, value.dtype, value.shape) for op, value in zip(ops, values, strict=True))


@pytest.mark.parametrize("name", [rule.name for rule in nchwc.RULES])
def test_every_nchwc_rule_passes_verification(name):
    result = verify_rule(RULES[name])
    assert result.passed, result.reason


def test_no_site_where_onnxruntime_does_no_nchwc(monkeypatch):
    rule = RULES["nchwc-conv"]
    graph = rule.example_graph(0)
    match = next(iter(rule.matches(graph, graph.nodes[0])))
    assert rule.check(graph, match) is None
    monkeypatch.setattr(nchwc_layout, "nchwc_block_size", lambda: None)
    assert rule.check(graph, match) == "onnxruntime does no NCHWc on this machine"


_B = BLOCK or 8  # parameters are built even where the tests are skipped
# input channels, output channels, group: each filter format and onnxruntime's padding cases
FILTER_CASES = [
    (3, _B // 2, 1),  # NCHW input read directly: OIHWBo
    (_B, _B, 1),  # OIHWBiBo
    (_B + 8, 3 * _B // 2, 1),  # OIHWBiBo, input channels padded
    (_B + 4, _B + 4, _B + 4),  # depthwise, channels padded
    (2 * _B, 2 * _B, 2),  # two groups of a block
]


@pytest.mark.parametrize(("cin", "cout", "group"), FILTER_CASES)
def test_filter_reorder_is_the_one_onnxruntime_writes(tmp_path, cin, cout, group):
    rng = np.random.default_rng(cin + cout)
    weight = rng.standard_normal((cout, cin // group, 3, 3)).astype(np.float32)
    b = ModelBuilder()
    y = b.op("Conv", [b.input((1, cin, 6, 6)), b.const(weight)], group=group, pads=[1] * 4)
    optimized = ort_all(b.model(y), tmp_path)
    (blocked_conv,) = [
        n for n in optimized.graph.node if n.domain == NCHWC_DOMAIN and n.op_type == "Conv"
    ]
    weights = {t.name: numpy_helper.to_array(t) for t in optimized.graph.initializer}
    theirs = weights[blocked_conv.input[1]]
    layout = conv_layout(weight.shape, group, BLOCK)
    ours = reorder_filter(weight, BLOCK, layout.per_output)
    assert ours.shape == theirs.shape
    np.testing.assert_array_equal(ours, theirs)
    inputs = cin if group == 1 and not layout.per_output else weight.shape[1]
    np.testing.assert_array_equal(
        restore_filter(ours, BLOCK, layout.per_output, cout, inputs), weight
    )
    if layout.depthwise:
        group_attr = next(a.i for a in blocked_conv.attribute if a.name == "group")
        assert group_attr == padded(cout, BLOCK)


@pytest.mark.parametrize("model", ["resnet-18", "squeezenet-1.1"])
def test_rules_reach_the_structure_of_onnxruntimes_graph(tmp_path, model):
    path = cached_path(model, "small")
    original = load_model(path)
    theirs = load_model(ort_all(str(path), tmp_path))
    ours = to_fixpoint(to_fixpoint(original, BEFORE_LAYOUT), FORWARD)
    assert op_counts(ours) == op_counts(theirs)
    assert nchwc_values(ours) == nchwc_values(theirs)
    report = check_equivalence(original, ours)
    assert report.equivalent, report.reason


@pytest.mark.parametrize("model", ["resnet-18", "squeezenet-1.1"])
def test_reverse_rules_take_onnxruntimes_graph_out_of_the_layout(tmp_path, model):
    path = cached_path(model, "small")
    plain = to_fixpoint(load_model(ort_all(str(path), tmp_path)), REVERSE)
    assert not [node for node in plain.nodes if node.domain == NCHWC_DOMAIN]
    report = check_equivalence(load_model(path), plain)
    assert report.equivalent, report.reason


def test_a_split_keeps_only_the_channels_a_reader_needs():
    """A Conv with its input columns padded reads 20 of 32 channels: the pair split in front
    of it keeps 20, so that the Conv can leave the layout without the padding."""
    rule = RULES["nchwc-reorder-cancel-reverse"]
    graph = rule.example_graph(2)
    result = rule.apply(graph, next(iter(rule.sites(graph))))
    kept = [n.attr("channels") for n in result.nodes if n.op_type == "ReorderOutput"]
    assert kept[0] == BLOCK + 4


def _reasons(rule_name: str, graph: Graph) -> list[str | None]:
    """The rule's verdict at each match of its patterns in `graph`, in node order."""
    rule = RULES[rule_name]
    return [rule.check(graph, m) for node in graph.nodes for m in rule.matches(graph, node)]


def test_a_conv_is_blocked_with_its_activation_and_joins_the_region_it_reads():
    """As onnxruntime's transformer converts them: a Conv whose only reader is a Relu is blocked
    with the Relu fused, never alone (the Relu would stay in NCHW between its region and the next
    Conv's), and a Conv reading a region's ReorderOutput joins the region (no reorder pair)."""
    rng = np.random.default_rng(0)
    b = ModelBuilder()
    weights = [b.const(rng.standard_normal((BLOCK, BLOCK, 3, 3)).astype(np.float32)) for _ in "ab"]
    first = b.op("Relu", [b.op("Conv", [b.input((1, BLOCK, 6, 6)), weights[0]], pads=[1] * 4)])
    graph = load_model(b.model(b.op("Conv", [first, weights[1]], pads=[1] * 4)))
    reasons = _reasons("nchwc-conv", graph)
    assert reasons[0].startswith("the Relu after the Conv fuses with it")
    assert reasons[1:] == [None, None]  # the Conv with its Relu; the last Conv, read by none
    blocked = RULES["nchwc-conv"].apply(graph, next(iter(RULES["nchwc-conv"].sites(graph))))
    assert [n.attr("activation") for n in blocked.nodes if n.op_type == "Conv"] == ["Relu", None]
    assert _reasons("nchwc-conv", blocked) == [
        "the Conv reads a blocked region's ReorderOutput: it joins the region (nchwc-conv-join)"
    ]
    joined = RULES["nchwc-conv-join"].apply(
        blocked, next(iter(RULES["nchwc-conv-join"].sites(blocked)))
    )
    assert [n.op_type for n in joined.nodes] == ["ReorderInput", "Conv", "Conv", "ReorderOutput"]
    assert check_equivalence(graph, joined).equivalent


def test_a_shared_reorder_stays_for_its_other_reader():
    """Two nchwc Convs share one ReorderInput (as onnxruntime writes them); one leaves the
    layout, the other keeps reading the reorder."""
    b = ModelBuilder()
    x = b.input((1, BLOCK, 5, 5))
    shared = b.op("ReorderInput", [x], domain=NCHWC_DOMAIN)
    outputs = []
    for seed in (1, 2):
        weight = np.random.default_rng(seed).standard_normal((BLOCK, BLOCK, 1, 1))
        layout = conv_layout(weight.shape, 1, BLOCK)
        blocked = nchwc_layout.blocked_conv(b, shared, weight.astype(np.float32), layout)
        outputs.append(b.op("ReorderOutput", [blocked], domain=NCHWC_DOMAIN, channels=BLOCK))
    graph = load_model(b.model(*outputs))
    rule = RULES["nchwc-conv-reverse"]
    match = next(iter(rule.sites(graph)))
    result = rule.apply(graph, match)
    assert op_counts(result) == Counter(
        {
            (NCHWC_DOMAIN, "ReorderInput"): 1,
            (NCHWC_DOMAIN, "Conv"): 1,
            (NCHWC_DOMAIN, "ReorderOutput"): 1,
            ("", "Conv"): 1,
        }
    )
    assert check_equivalence(graph, result).equivalent


def test_resnext_groups_narrower_than_a_block_are_merged_into_the_layout(tmp_path):
    """onnxruntime leaves ResNeXt's grouped Convs of fewer channels a group than a block in NCHW,
    between two reorders; merging groups blocks them, and the reorders around them cancel."""
    path = cached_path("resnext-50", "small")
    theirs = load_model(ort_all(str(path), tmp_path))
    narrow = [n for n in theirs.nodes if n.op_type == "FusedConv" and n.attr("group", 1) > 1]
    assert narrow  # what the rule is for
    ours = to_fixpoint(theirs, ["nchwc-conv-merge-groups", "nchwc-reorder-cancel"])
    assert not [n for n in ours.nodes if n.domain != NCHWC_DOMAIN and "Conv" in n.op_type]
    reorders = sum(n.op_type.startswith("Reorder") for n in ours.nodes)
    assert reorders < sum(n.op_type.startswith("Reorder") for n in theirs.nodes)
    for node in ours.nodes:
        if node.domain == NCHWC_DOMAIN and node.op_type == "Conv" and node.attr("group", 1) > 1:
            per_group = ours.constant(node.inputs[1]).shape[1]
            assert per_group % BLOCK == 0  # whole blocks a group
    report = check_equivalence(load_model(path), ours)
    assert report.equivalent, report.reason


def test_merged_groups_keep_each_group_to_its_own_channels():
    rng = np.random.default_rng(0)
    weight = rng.standard_normal((8, 2, 3, 3)).astype(np.float32)  # 4 groups of 2 channels
    merged = merge_groups(weight, 4, 2)  # 2 groups of 4
    assert merged.shape == (8, 4, 3, 3)
    for channel in range(8):
        group = channel // 2  # old group: 2 output channels each
        offset = group % 2 * 2
        np.testing.assert_array_equal(merged[channel, offset : offset + 2], weight[channel])
        assert not np.delete(merged[channel], [offset, offset + 1], axis=0).any()


def test_unblocking_takes_each_conv_out_in_one_step_and_neighbours_reorders_cancel(tmp_path):
    """In onnxruntime's ResNet-18 every blocked Conv that reads a blocked tensor is a site of
    nchwc-conv-unblock (the others read NCHW: the stem, and the first stage, narrower than a
    block here), and after all of them the reorder pairs between neighbours cancel."""
    path = cached_path("resnet-18", "small")
    theirs = load_model(ort_all(str(path), tmp_path))
    blocked = [n for n in theirs.nodes if n.domain == NCHWC_DOMAIN and n.op_type == "Conv"]
    reading_blocked = [n for n in blocked if nchwc_layout.is_blocked(theirs, n.inputs[0])]
    sites = list(RULES["nchwc-conv-unblock"].sites(theirs))
    assert len(sites) == len(reading_blocked) > 0
    one = RULES["nchwc-conv-unblock"].apply(theirs, sites[-1])
    assert op_counts(one)[("", "Conv")] + op_counts(one)[(MS_DOMAIN, "FusedConv")] == 1
    ours = to_fixpoint(theirs, ["nchwc-conv-unblock", "nchwc-reorder-roundtrip"])
    still = [n for n in ours.nodes if n.domain == NCHWC_DOMAIN and n.op_type == "Conv"]
    assert len(still) == len(blocked) - len(reading_blocked)
    assert sum(n.op_type == "ReorderInput" for n in ours.nodes) < len(sites)
    report = check_equivalence(load_model(path), ours)
    assert report.equivalent, report.reason

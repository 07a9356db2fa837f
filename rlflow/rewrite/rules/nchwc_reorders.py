"""NCHWc reorder algebra: where blocked regions join, split and share their reorders.

- ReorderInput(ReorderOutput(x)) -> x            and back, before any blocked reader
  (the pair only zeroes padded channels, which no reader of it may need: `needed_channels`)
- ReorderOutput(ReorderInput(x)) -> x            (the padding added and dropped again)
- ReorderInput(x), ReorderInput(x) -> one ReorderInput(x)   (ReorderOutput alike)

Converting one op at a time leaves a reorder pair between neighbours; cancelling it grows the
blocked region, as onnxruntime's transformer does in one sweep. Splitting a pair back in is
how a search cuts a region to drop the layout at one site, and sharing merges the duplicates
that per-op rewrites leave where one tensor has several readers.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import onnx

from rlflow.cost import nchwc_block_size
from rlflow.graph import Graph, Node, Value
from rlflow.rewrite.build import ModelBuilder
from rlflow.rewrite.rule import Emitter, Match, Replacement, Rule, both_ways
from rlflow.rewrite.rules.common import pick, shape
from rlflow.rewrite.rules.nchwc_format import ConvLayout, padded
from rlflow.rewrite.rules.nchwc_layout import (
    BLOCKED_READERS,
    NCHWC,
    N,
    NchwcPatternRule,
    NchwcRule,
    blocked_conv,
    blocked_input,
    channels_first,
    example_block,
    is_blocked,
    is_nchwc,
    needed_channels,
    reorder_input,
    reorder_output,
)


def _kept_channels(graph: Graph, x: Value, block: int) -> int:
    """The channels a pair split into `x` keeps: those some result needs (so that a reverse
    rule can drop the padding), in fours as ReorderInput takes them, within the last block."""
    fours = -(-needed_channels(graph, x.name, block) // 4) * 4
    return min(x.shape[1], max(fours, x.shape[1] - block + 4))


class ReorderCancel(NchwcRule, Rule):
    """The reverse splits every edge from a blocked tensor (not just reordered in) into a
    blocked reader, one site per read value."""

    name = "nchwc-reorder-cancel"
    description = "ReorderInput(ReorderOutput(x)) -> x  (no reader needs the zeroed padding)"
    reverse_description = (
        "x -> ReorderInput(ReorderOutput(x))  (x blocked, before a blocked reader)"
    )
    anchor_ops = ("ReorderInput",)
    reverse_anchor_ops = BLOCKED_READERS
    source_ops = {"ReorderInput": 1, "ReorderOutput": 1}
    target_ops: dict[str, int] = {}
    distinct_sites = False

    def matches(self, graph: Graph, anchor: Node) -> Iterator[Match]:
        if self.reverse:
            for x in dict.fromkeys(anchor.present_inputs):
                if is_blocked(graph, x) and not is_nchwc(graph.producer(x), "ReorderInput"):
                    yield Match((anchor,), {"x": x}, tuple(anchor.outputs))
            return
        source = graph.producer(anchor.inputs[0])
        if is_nchwc(anchor, "ReorderInput") and is_nchwc(source, "ReorderOutput"):
            yield Match((anchor,), {"x": source.inputs[0]}, (anchor.outputs[0],), keep=(source,))

    def nchwc_reason(self, graph: Graph, match: Match, block: int) -> str | None:
        if self.reverse:
            return None
        reader, source = match.nodes[0], match.keep[0]
        if not (channels_first(reader) and channels_first(source)):
            return "a reorder is to or from NHWC"
        channels = source.attr("channels")
        if padded(channels, block) != shape(graph, match["x"])[1]:
            return "the ReorderOutput drops whole blocks"
        if needed_channels(graph, reader.outputs[0], block) > channels:
            return "a reader needs the zeros the pair puts in the padded channels"
        return None

    def rewrite(self, graph: Graph, match: Match) -> Replacement:
        emit = Emitter(graph)
        if not self.reverse:
            return emit.result(match["x"])
        reader = match.nodes[0]
        x = graph.value(match["x"])
        out = reorder_output(emit, x, _kept_channels(graph, x, nchwc_block_size()))
        back = reorder_input(emit, emit.values[out], nchwc_block_size())
        inputs = [back if name == x.name else name for name in reader.inputs]
        outputs = emit.copy(reader, inputs, outputs=len(reader.outputs))
        return emit.result(*(outputs if isinstance(outputs, list) else [outputs]))

    def example(self, setting: int) -> onnx.ModelProto:
        block = example_block()
        b = ModelBuilder()
        if setting == 2:  # channels short of a block, the padding a Sigmoid of 0 = 0.5
            return _padded_chain_example(b, block, split=self.reverse)
        dims = pick(setting, [(1, block, 5, 5), (2, 2 * block, 3, 3)])
        if self.reverse:
            pooled = b.op(
                "MaxPool",
                [b.op("Relu", [blocked_input(b, dims)])],
                domain=NCHWC,
                kernel_shape=[3, 3],
                pads=[1] * 4,
            )
            return b.model(b.op("ReorderOutput", [pooled], domain=NCHWC, channels=dims[1]))
        nchw = b.op("ReorderOutput", [blocked_input(b, dims)], domain=NCHWC, channels=dims[1])
        again = b.op("Relu", [b.op("ReorderInput", [nchw], domain=NCHWC)])
        result = b.op("ReorderOutput", [again], domain=NCHWC, channels=dims[1])
        return b.model(result, nchw) if setting == 1 else b.model(result)


def _padded_chain_example(b: ModelBuilder, block: int, split: bool) -> onnx.ModelProto:
    """Sigmoid of a tensor short of a block, read by an nchwc Conv whose filter pads its input
    columns: through a reorder pair (`split` False) or directly."""
    channels = block + 4
    blocked = b.op("Sigmoid", [blocked_input(b, (1, channels, 4, 6))])
    if not split:
        nchw = b.op("ReorderOutput", [blocked], domain=NCHWC, channels=channels)
        blocked = b.op("ReorderInput", [nchw], domain=NCHWC)
    weight = np.random.default_rng(2).standard_normal((8, channels, 3, 3)).astype(np.float32)
    layout = ConvLayout(per_output=False, reorder_input=True)
    conv = blocked_conv(b, blocked, weight, layout, pads=[1] * 4)
    return b.model(b.op("ReorderOutput", [conv], domain=NCHWC, channels=8))


class ReorderRoundTrip(NchwcPatternRule):
    name = "nchwc-reorder-roundtrip"
    description = "ReorderOutput(ReorderInput(x)) -> x  (the padding added and dropped again)"
    pattern = f"{N}ReorderOutput({N}ReorderInput(x))"
    target_ops: dict[str, int] = {}

    def nchwc_reason(self, graph: Graph, match: Match, block: int) -> str | None:
        out = match.nodes[0]
        into = graph.producer(out.inputs[0])
        if not (channels_first(out) and channels_first(into)):
            return "a reorder is to or from NHWC"
        if out.attr("channels") != shape(graph, match["x"])[1]:
            return "the ReorderOutput keeps another channel count"
        return None

    def rewrite(self, graph: Graph, match: Match) -> Replacement:
        return Emitter(graph).result(match["x"])

    def example(self, setting: int) -> onnx.ModelProto:
        block = example_block()
        dims = pick(setting, [(1, block // 2, 5, 5), (2, block, 3, 3), (1, 12, 4, 4)])
        b = ModelBuilder()
        blocked = blocked_input(b, dims)
        nchw = b.op("ReorderOutput", [blocked], domain=NCHWC, channels=dims[1])
        # The ReorderInput also feeds a blocked op, which keeps it.
        pooled = b.op("GlobalAveragePool", [blocked], domain=NCHWC)
        pooled = b.op("ReorderOutput", [pooled], domain=NCHWC, channels=dims[1])
        return b.model(b.op("Relu", [nchw]), pooled)


def _reorder_key(node: Node) -> tuple:
    return node.op_type, node.attr("channels"), node.attr("channels_last", 0)


class ReorderShare(NchwcRule, Rule):
    """Two equal reorders of one tensor become one: the later one's readers read the first."""

    name = "nchwc-reorder-share"
    description = "ReorderInput(x), ReorderInput(x) -> ReorderInput(x)  (ReorderOutput alike)"
    anchor_ops = ("ReorderInput", "ReorderOutput")
    source_ops = {"ReorderInput": 2}
    target_ops = {"ReorderInput": 1}

    def matches(self, graph: Graph, anchor: Node) -> Iterator[Match]:
        if anchor.domain != NCHWC:
            return
        siblings = graph.consumers(anchor.inputs[0])
        later = siblings[siblings.index(anchor) + 1 :]
        for sibling in later:
            if sibling.domain == NCHWC and _reorder_key(sibling) == _reorder_key(anchor):
                bindings = {"first": anchor.outputs[0]}
                yield Match((sibling,), bindings, (sibling.outputs[0],), keep=(anchor,))

    def rewrite(self, graph: Graph, match: Match) -> Replacement:
        return Emitter(graph).result(match["first"])

    def example(self, setting: int) -> onnx.ModelProto:
        block = example_block()
        dims = pick(setting, [(1, block, 5, 5), (2, block, 3, 3), (1, 2 * block, 4, 4)])
        b = ModelBuilder()
        if setting == 1:  # two ReorderOutputs of one blocked tensor
            blocked = blocked_input(b, dims)
            outs = [b.op("ReorderOutput", [blocked], domain=NCHWC, channels=dims[1]) for _ in "ab"]
            return b.model(b.op("Relu", [outs[0]]), b.op("Sigmoid", [outs[1]]))
        x = b.input(dims)
        pools = [
            b.op(op, [b.op("ReorderInput", [x], domain=NCHWC)], domain=NCHWC)
            for op in ("GlobalAveragePool", "GlobalMaxPool")
        ]
        return b.model(*[b.op("ReorderOutput", [p], domain=NCHWC, channels=dims[1]) for p in pools])


RULES = [*both_ways(ReorderCancel), ReorderRoundTrip(), ReorderShare()]

"""A Conv, an activation or a pool joins the blocked region it reads, in one step, as
onnxruntime's transformer grows a region.

- Conv(ReorderOutput(x), w, b) -> ReorderOutput(nchwc.Conv(x, w', b'))      (x blocked)
- Relu(Conv(ReorderOutput(x), w, b)) -> ReorderOutput(nchwc.Conv(x, w', b', activation=Relu))
- Relu(ReorderOutput(nchwc.Conv(x, ...))) -> ReorderOutput(nchwc.Conv(x, ..., activation=Relu))
- MaxPool(ReorderOutput(x)) -> ReorderOutput(nchwc.MaxPool(x))              (AveragePool alike)

The same graph is three or four steps of the other rules: `nchwc-conv` (a reorder pair in,
a ReorderOutput out), `nchwc-reorder-cancel` (the pair between the regions gone), then the
activation moved into the layout and fused. Alone, the first of them costs time (the pair
runs before the cancel removes it), so a search had to take a loss at every Conv of a chain
to grow a region, and the path to a whole blocked CNN was some hundred steps long: SqueezeNet
1.1's layout (26 Convs, 26 activations, 8 Concats, the pools and the cancels) took every step
of a 100-step episode, and only one learner run in several found it. With these rules each Conv
after the first joins its region in one step, so the region grows as onnxruntime grows it in one
sweep: SqueezeNet's layout is 67 steps from the original, none losing more than 0.9% alone by
the per-op cost (`scripts/layout_path.py`). `nchwc-conv` and `nchwc-pool` refuse the sites these
rules take (theirs would put a reorder pair between the regions). With `nchwc-pool-join` taso
reaches SqueezeNet's layout from the original; greedy stops short of it, its remaining steps
priced within the per-op cost's noise (docs/BENCHMARKS.md). The way back is
`nchwc-conv-unblock` then `nchwc-reorder-roundtrip`.

A Conv that reads NCHW directly (fewer input channels than a block) is `nchwc-conv`'s: it has
no reorder to save.
"""

from __future__ import annotations

import inspect

import numpy as np
import onnx

from rlflow.cost import nchwc_block_size
from rlflow.graph import MS_DOMAIN, Graph
from rlflow.rewrite.build import ModelBuilder
from rlflow.rewrite.rule import Emitter, Match, Replacement
from rlflow.rewrite.rules import nchwc
from rlflow.rewrite.rules.common import pick
from rlflow.rewrite.rules.nchwc import (
    POOLS,
    emit_blocked_conv,
    matched_layout,
    pool_reason,
    pool_region_reason,
    region_reason,
)
from rlflow.rewrite.rules.nchwc_format import conv_layout
from rlflow.rewrite.rules.nchwc_layout import (
    ACTIVATIONS,
    NCHWC,
    N,
    NchwcPatternRule,
    blocked_conv,
    blocked_input,
    channels_first,
    example_block,
    fused_activation,
    reorder_output_for,
    typed,
)

_CONVS = ("Conv", f"{MS_DOMAIN}.FusedConv")
_PLAIN_PATTERNS = tuple(f"y={op}({N}ReorderOutput(x), w, b?)" for op in _CONVS)
_ACTIVATED_PATTERNS = tuple(f"z={act}(y=Conv({N}ReorderOutput(x), w, b?))" for act in ACTIVATIONS)


class _JoinRule(NchwcPatternRule):
    """A join rule: its checks and the Conv blocking are shared with `nchwc-conv` and
    `nchwc-pool`, so the `nchwc` module's source is part of its fingerprint."""

    def fingerprint(self) -> str:
        return super().fingerprint() + inspect.getsource(nchwc)


class ConvJoin(_JoinRule):
    """`nchwc-conv` and `nchwc-reorder-cancel` (and the activation's fusion) in one step."""

    name = "nchwc-conv-join"
    description = (
        "Conv(ReorderOutput(x), w, b) -> ReorderOutput(nchwc.Conv(x, w', b'))"
        "  (x blocked; a Relu after the Conv fused, a FusedConv's activation kept)"
    )
    pattern = (*_PLAIN_PATTERNS, *_ACTIVATED_PATTERNS)
    target_ops = {"Conv": 1, "ReorderOutput": 1}
    settings = 4

    def nchwc_reason(self, graph: Graph, match: Match, block: int) -> str | None:
        if reason := region_reason(graph, graph.producer(match.node("y").inputs[0]), block):
            return reason
        layout = matched_layout(graph, match, block)
        if isinstance(layout, str):
            return layout
        if not layout.reorder_input:
            return "the Conv would read NCHW directly (fewer input channels than a block)"
        return None

    def rewrite(self, graph: Graph, match: Match) -> Replacement:
        block = nchwc_block_size()
        conv = match.node("y")
        weight = graph.constant(match["w"])
        layout = matched_layout(graph, match, block)
        activated = match.pattern_index >= len(_PLAIN_PATTERNS)
        attrs = fused_activation(match.nodes[0]) if activated else {}
        emit = Emitter(graph)
        out = graph.value(match.outputs[0])
        y = emit_blocked_conv(
            emit, conv, match["x"], match["b"], out, weight, layout, block, **attrs
        )
        return emit.result(y)

    def example(self, setting: int) -> onnx.ModelProto:
        block = example_block()
        half, two = block // 2, 2 * block
        # input channels, output channels, group, kernel, stride, activation, fused, shared
        cin, cout, group, k, stride, act, fused, shared = pick(
            setting,
            [
                (block, block, 1, 3, 1, None, False, False),
                (block + 4, block + half, 1, 1, 2, "Relu", False, True),  # padded in and out
                (block + 4, block + 4, block + 4, 3, 1, "LeakyRelu", True, False),  # depthwise
                (two, two, 2, 3, 1, "HardSigmoid", False, True),  # two groups of a block each
            ],
        )
        rng = np.random.default_rng(setting)
        weight = rng.standard_normal((cout, cin // group, k, k)).astype(np.float32)
        bias = rng.standard_normal(cout).astype(np.float32)
        attrs: dict[str, object] = {"group": group, "pads": [k // 2] * 4, "strides": [stride] * 2}
        b = ModelBuilder()
        blocked = b.op("Relu", [blocked_input(b, (1, cin, 7, 7))])
        nchw = b.op("ReorderOutput", [blocked], domain=NCHWC, channels=cin)
        inputs = [nchw, b.const(weight), b.const(bias)]
        if fused:
            y = b.op(
                "FusedConv",
                inputs,
                domain=MS_DOMAIN,
                activation=act,
                activation_params=[0.1],
                **attrs,
            )
        else:
            y = b.op("Conv", inputs, **attrs)
            if act:
                params = {"alpha": 0.3, "beta": 0.4} if act == "HardSigmoid" else {}
                y = b.op(act, [y], **params)
        return b.model(y, nchw) if shared else b.model(y)


class ActivationJoin(NchwcPatternRule):
    """An activation after a blocked Conv's ReorderOutput into the Conv: `nchwc-activation-move`
    then `nchwc-conv-activation-fusion` in one step. Alone, the move runs the activation on the
    padded blocked tensor and gains nothing, so a search that blocked a Conv without its
    activation left the activation between its region and the next Conv's, where neither the
    cancel nor the join could reach."""

    name = "nchwc-activation-join"
    description = (
        "Relu(ReorderOutput(nchwc.Conv(x, w, b, s))) -> "
        "ReorderOutput(nchwc.Conv(x, w, b, s, activation=Relu))"
    )
    pattern = tuple(f"y={act}({N}ReorderOutput(c={N}Conv(x, w, b?, s?)))" for act in ACTIVATIONS)
    target_ops = {"Conv": 1, "ReorderOutput": 1}
    settings = len(ACTIVATIONS)

    def nchwc_reason(self, graph: Graph, match: Match, block: int) -> str | None:
        # A ReorderOutput read elsewhere too stays for its readers (`keep_shared_reorders`),
        # so the Conv's output is read outside the pattern and the site is refused before this.
        if not channels_first(graph.producer(match.nodes[0].inputs[0])):
            return "the ReorderOutput is to NHWC"
        if match.node("c").attr("activation") is not None:
            return f"the nchwc Conv applies {match.node('c').attr('activation')} already"
        return None

    def rewrite(self, graph: Graph, match: Match) -> Replacement:
        act, conv = match.nodes[0], match.node("c")
        reorder = graph.producer(act.inputs[0])
        emit = Emitter(graph)
        inputs = [match["x"], match["w"], match["b"], match["s"]]
        fused = emit.copy(conv, inputs, like=reorder.inputs[0], **fused_activation(act))
        out = match.outputs[0]
        return emit.result(reorder_output_for(emit, fused, out, reorder.attr("channels")))

    def example(self, setting: int) -> onnx.ModelProto:
        block = example_block()
        act = list(ACTIVATIONS)[setting % len(ACTIVATIONS)]
        channels = block + 4 if setting % 2 else block
        rng = np.random.default_rng(setting)
        weight = rng.standard_normal((channels, block, 3, 3)).astype(np.float32)
        bias = rng.standard_normal(channels).astype(np.float32)
        b = ModelBuilder()
        source = blocked_input(b, (1, block, 6, 6))
        layout = conv_layout(weight.shape, 1, block)
        total = blocked_input(b, (1, channels, 6, 6)) if setting == 2 else None
        conv = blocked_conv(b, source, weight, layout, bias, total, pads=[1] * 4)
        nchw = b.op("ReorderOutput", [conv], domain=NCHWC, channels=channels)
        params = {"alpha": 0.3, "beta": 0.4} if act == "HardSigmoid" else {}
        params = {"alpha": 0.2} if act == "LeakyRelu" else params
        return b.model(b.op(act, [nchw], **params))


class PoolJoin(_JoinRule):
    """A pool joins the blocked region it reads, as a Conv does (`nchwc-conv-join`): onnxruntime
    blocks SqueezeNet's MaxPools between its blocked Convs in one sweep. Through `nchwc-pool` the
    pool was blocked with a ReorderInput of its own (a reorder pair between the regions, which
    `nchwc-reorder-cancel` removed a step later), so a search priced the first step at a loss and
    left the pools, and the Convs after them, in NCHW."""

    name = "nchwc-pool-join"
    description = (
        "MaxPool(ReorderOutput(x)) -> ReorderOutput(nchwc.MaxPool(x))"
        "  (x blocked, channels in whole blocks; AveragePool alike)"
    )
    pattern = tuple(f"y={op}(r={N}ReorderOutput(x))" for op in POOLS)
    target_ops = {"MaxPool": 1, "ReorderOutput": 1}

    def nchwc_reason(self, graph: Graph, match: Match, block: int) -> str | None:
        return pool_reason(graph, match, block) or pool_region_reason(
            graph, graph.producer(match["r"])
        )

    def rewrite(self, graph: Graph, match: Match) -> Replacement:
        pool = match.node("y")
        x, out = graph.value(match["x"]), graph.value(match.outputs[0])
        emit = Emitter(graph)
        blocked = typed(emit, emit.copy(pool, [x.name], domain=NCHWC), out.shape, out.dtype)
        return emit.result(reorder_output_for(emit, blocked, out.name, out.shape[1]))

    def example(self, setting: int) -> onnx.ModelProto:
        block = example_block()
        op, channels, attrs = pick(
            setting,
            [
                ("MaxPool", block, {"kernel_shape": [3, 3], "strides": [2, 2], "ceil_mode": 1}),
                ("AveragePool", 2 * block, {"kernel_shape": [3, 3], "pads": [1] * 4}),
                ("MaxPool", block, {"kernel_shape": [2, 2], "strides": [2, 2]}),
            ],
        )
        b = ModelBuilder()
        x = b.op("Relu", [blocked_input(b, (1, channels, 7, 7))])
        nchw = b.op("ReorderOutput", [x], domain=NCHWC, channels=channels)
        pooled = b.op(op, [nchw], **attrs)
        return b.model(pooled, nchw) if setting == 2 else b.model(pooled)  # the reorder shared


RULES = [ConvJoin(), ActivationJoin(), PoolJoin()]

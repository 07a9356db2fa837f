"""NCHWc layout rules: onnxruntime's blocked CPU layout, written into the graph site by site.

onnxruntime's optimiser (level `all`, CPU) rewrites CNNs into its `com.microsoft.nchwc` ops:
Convs and pools that run on channel blocks, with ReorderInput/ReorderOutput at the borders of
each blocked region (worth 1.25-2.2x on CNNs). A model that runs with the optimiser off must
say all of that itself, so these rules express each of the transformer's steps, and undo it,
so that a search can choose, site by site, where the blocked layout pays:

- Conv / FusedConv(x, w, b) -> ReorderOutput(nchwc.Conv(ReorderInput(x), w', b'))   and back
  (an activation that alone reads the Conv fused into it, as onnxruntime does)
  (w' in the blocked filter format, b' padded; no ReorderInput for a Conv with fewer input
  channels than a block, which reads NCHW directly; onnxruntime's conditions on channels and
  groups, `nchwc_format.conv_layout`)
- Conv(x, w, group=g) -> ReorderOutput(nchwc.Conv(ReorderInput(x), w'', group=g/k)), where
  onnxruntime leaves a grouped Conv unblocked (fewer channels a group than a block): k groups
  merged into one of whole blocks, w'' block-diagonal (undone by the Conv rule's reverse, into a
  plain Conv with g/k groups)
- MaxPool / AveragePool(x) -> ReorderOutput(nchwc.Pool(ReorderInput(x)))              and back
- GlobalAveragePool / GlobalMaxPool(ReorderOutput(x)) -> ReorderOutput(nchwc.Pool(x)) and back
- BatchNormalization(ReorderOutput(x)) -> ReorderOutput(nchwc.Conv(x, 1x1 depthwise))
  (undone by the Conv rule's reverse, into a plain depthwise Conv)
- nchwc.Conv(x, w', b, s?) -> ReorderInput(Conv(ReorderOutput(x), w, b)) + s, x blocked: one
  Conv inside a blocked region out of the layout in one step. The Conv rule's reverse needs
  reorders on both sides first, and splitting a reorder pair into a region costs time alone, so
  a greedy search or an agent never reached the Convs that run faster in NCHW (ResNet's last
  stage on this CPU) that way; this step is priced by what it does.

and, in `nchwc_blocked`, the rules that grow and shrink blocked regions: reorder pairs
cancelled and shared, ops moved across ReorderOutput, Add and activations fused into the
nchwc Conv; in `nchwc_join`, a Conv, an activation or a pool joining the region it reads in one
step; in `nchwc_projection`, a transformer's projection (Gemm, MatMul) run as a blocked 1x1 Conv.
Every rule refuses every site where onnxruntime does no NCHWc.
"""

from __future__ import annotations

import numpy as np
import onnx

from rlflow.cost import nchwc_block_size
from rlflow.graph import MS_DOMAIN, Graph, Node, Value
from rlflow.rewrite.build import ModelBuilder
from rlflow.rewrite.rule import Emitter, Match, Replacement, both_ways
from rlflow.rewrite.rules import nchwc_blocked
from rlflow.rewrite.rules.common import merge_groups, pick, shape
from rlflow.rewrite.rules.nchwc_format import (
    ConvLayout,
    conv_layout,
    pad_channels,
    padded,
    reorder_filter,
    restore_filter,
)
from rlflow.rewrite.rules.nchwc_layout import (
    ACTIVATIONS,
    NCHWC,
    N,
    NchwcPatternRule,
    blocked_conv,
    blocked_input,
    channels_first,
    conv_out_of_layout,
    example_block,
    float_tensor,
    fused_activation,
    out_of_layout_reason,
    reorder_input,
    reorder_output,
    reorder_output_for,
    typed,
)


def _constants_reason(graph: Graph, match: Match) -> str | None:
    """Why the matched Conv's filter `w` and bias `b` cannot be reordered (None: they can)."""
    weight = graph.constant(match["w"])
    if weight is None or weight.dtype != np.float32:
        return "the filter is not a float constant"
    bias = match["b"]
    if bias and (not graph.is_constant(bias) or graph.constant(bias).ndim != 1):
        return "the bias is not a constant vector"
    return None


def matched_layout(graph: Graph, match: Match, block: int) -> ConvLayout | str:
    """The blocked layout of the matched Conv `y` (filter `w`, bias `b`), or why it has none."""
    if reason := _constants_reason(graph, match):
        return reason
    weight = graph.constant(match["w"])
    return conv_layout(weight.shape, match.node("y").attr("group", 1), block)


def region_reason(graph: Graph, reorder: Node, block: int) -> str | None:
    """Why a Conv reading `reorder`'s output (a ReorderOutput) cannot read its blocked input
    instead and so join the region (None: it can, where the Conv reads blocked tensors)."""
    source = reorder.inputs[0]
    if len(shape(graph, reorder.outputs[0])) != 4 or not float_tensor(graph, source):
        return "nchwc Conv takes 2-D float convolutions only"
    if not channels_first(reorder):
        return "the ReorderOutput is to NHWC"
    if padded(reorder.attr("channels"), block) != shape(graph, source)[1]:
        return "the ReorderOutput drops whole blocks"
    return None


def _fusing_activation(graph: Graph, match: Match) -> str | None:
    """Why the matched plain Conv `y` is not to be blocked alone: the activation that alone reads
    it would fuse into the blocked Conv (`nchwc-conv`'s site with the activation), and blocked
    without it, it would stay in NCHW between the Conv's region and the next Conv's."""
    conv = match.node("y")
    readers = graph.consumers(conv.outputs[0])
    if match.pattern_index != 0 or graph.is_output(conv.outputs[0]) or len(readers) != 1:
        return None  # the site with the activation, a FusedConv, or a Conv read elsewhere
    if readers[0].domain or readers[0].op_type not in ACTIVATIONS:
        return None
    return f"the {readers[0].op_type} after the Conv fuses with it: the site with the activation"


def _made_by_reorder_output(graph: Graph, name: str) -> Node | None:
    """The ReorderOutput that makes the value `name`, if one does."""
    producer = graph.producer(name)
    if producer is None or producer.domain != NCHWC or producer.op_type != "ReorderOutput":
        return None
    return producer


def _joining_region(graph: Graph, match: Match, layout: ConvLayout, block: int) -> str | None:
    """Why the matched Conv `y` is not to be blocked with a ReorderInput of its own: it reads a
    blocked region's ReorderOutput and joins the region in one step (`nchwc-conv-join`), where
    this site would put a reorder pair between them."""
    reorder = _made_by_reorder_output(graph, match["x"])
    if not layout.reorder_input or reorder is None or region_reason(graph, reorder, block):
        return None
    return "the Conv reads a blocked region's ReorderOutput: it joins the region (nchwc-conv-join)"


def emit_blocked_conv(
    emit: Emitter,
    conv: Node,
    source: str,
    bias: str,
    out: Value,
    weight: np.ndarray,
    layout: ConvLayout,
    block: int,
    **attrs: object,
) -> str:
    """ReorderOutput(nchwc.Conv(source, w', b')) standing for `out`: `conv` blocked, with
    `weight` (OIHW) as its filter, `source` its input as the blocked Conv reads it (blocked, or
    NCHW for an OIHWBo filter) and `attrs` overriding the Conv's own."""
    graph = emit.graph
    filters = emit.const(reorder_filter(weight, block, layout.per_output), "weight")
    if bias and len(graph.constant(bias)) % block:
        bias = emit.const(pad_channels(graph.constant(bias), block), "bias")
    n, channels, *spatial = out.shape
    if layout.depthwise:
        attrs["group"] = padded(channels, block)
    blocked = emit.copy(conv, [source, filters, bias], "Conv", NCHWC, **attrs)
    typed(emit, blocked, (n, padded(channels, block), *spatial), out.dtype)
    return reorder_output_for(emit, blocked, out.name, channels)


def _blocked_conv(
    graph: Graph,
    match: Match,
    weight: np.ndarray,
    layout: ConvLayout,
    block: int,
    **attrs: object,
) -> Replacement:
    """ReorderOutput(nchwc.Conv(ReorderInput(x), w', b')) for the matched Conv, with `weight`
    (OIHW) as its filter, the matched activation `z` fused and `attrs` overriding the Conv's own."""
    if match.pattern_index >= len(_CONV_PATTERNS):
        attrs = {**fused_activation(match.nodes[0]), **attrs}
    emit = Emitter(graph)
    x = graph.value(match["x"])
    source = reorder_input(emit, x, block) if layout.reorder_input else x.name
    out = graph.value(match.outputs[0])
    conv = match.node("y")
    return emit.result(
        emit_blocked_conv(emit, conv, source, match["b"], out, weight, layout, block, **attrs)
    )


_CONV_PATTERNS = ("y=Conv(x, w, b?)", "y=com.microsoft.FusedConv(x, w, b?)")
_ACTIVATED_PATTERNS = tuple(f"z={act}(y=Conv(x, w, b?))" for act in ACTIVATIONS)


class ConvToNchwc(NchwcPatternRule):
    """A Conv into the layout, with the activation that alone reads it fused, as onnxruntime's
    transformer converts it. Blocked without it, the activation ran between the Conv's
    ReorderOutput and the next Conv, where that Conv could not join the region
    (`nchwc-conv-join`): greedy, taso and the learners all blocked SqueezeNet's Convs that way
    and stopped short of its layout; since, with `nchwc-pool-join`, taso reaches it
    (docs/BENCHMARKS.md)."""

    name = "nchwc-conv"
    description = (
        "Conv(x, w, b) -> ReorderOutput(nchwc.Conv(ReorderInput(x), w', b'))"
        "  (w' blocked, b' padded; FusedConv keeps its activation, an activation after it fused)"
    )
    reverse_description = "ReorderOutput(nchwc.Conv(ReorderInput(x), w', b')) -> Conv(x, w, b)"
    pattern = (*_CONV_PATTERNS, *_ACTIVATED_PATTERNS)
    reverse_pattern = (
        f"{N}ReorderOutput(y={N}Conv({N}ReorderInput(x), w, b?))",
        f"{N}ReorderOutput(y={N}Conv(x, w, b?))",
    )
    target_ops = {"ReorderInput": 1, "Conv": 1, "ReorderOutput": 1}
    settings = 5

    def nchwc_reason(self, graph: Graph, match: Match, block: int) -> str | None:
        if len(shape(graph, match["x"])) != 4 or not float_tensor(graph, match["x"]):
            return "nchwc Conv takes 2-D float convolutions only"
        layout = matched_layout(graph, match, block)
        if isinstance(layout, str):
            return layout
        if not self.reverse:
            return _fusing_activation(graph, match) or _joining_region(graph, match, layout, block)
        reorder, conv = match.nodes[0], match.node("y")
        weight = graph.constant(match["w"])
        group = conv.attr("group", 1)
        out_channels, in_channels = reorder.attr("channels"), shape(graph, match["x"])[1]
        if not channels_first(reorder) or weight.shape[0] % block:
            return "not a Conv blocked for this machine, reordered out to NCHW"
        if layout.reorder_input != (match.pattern_index == 0):
            return "the Conv reads a blocked tensor: reorder it out first"
        if padded(out_channels, block) != weight.shape[0]:
            return f"{out_channels} channels do not fit the filter's {weight.shape[0]}"
        if layout.depthwise:
            fits = in_channels == out_channels and padded(in_channels, block) == group
        elif layout.per_output:
            fits = in_channels == weight.shape[1]
        elif group == 1:
            fits = padded(in_channels, block) == weight.shape[1]
        else:
            fits = in_channels == weight.shape[1] * group and out_channels == weight.shape[0]
        return None if fits else "the input's channels do not fit the filter"

    def rewrite(self, graph: Graph, match: Match) -> Replacement:
        block = nchwc_block_size()
        layout = matched_layout(graph, match, block)
        if self.reverse:
            return self._unblocked(graph, match, block, layout)
        return _blocked_conv(graph, match, graph.constant(match["w"]), layout, block)

    def _unblocked(self, graph: Graph, match: Match, block: int, layout: ConvLayout) -> Replacement:
        conv = match.node("y")
        channels = match.nodes[0].attr("channels")
        blocked = graph.constant(match["w"])
        in_channels = blocked.shape[1]
        if not layout.per_output and conv.attr("group", 1) == 1:
            in_channels = shape(graph, match["x"])[1]  # the padded input columns go
        emit = Emitter(graph)
        weight = restore_filter(blocked, block, layout.per_output, channels, in_channels)
        bias = match["b"]
        if bias and len(graph.constant(bias)) != channels:
            bias = emit.const(graph.constant(bias)[:channels], "bias")
        op, domain = ("FusedConv", MS_DOMAIN) if conv.attr("activation") else ("Conv", "")
        groups = {"group": channels} if layout.depthwise else {}
        inputs = [match["x"], emit.const(weight, "weight"), bias]
        return emit.result(emit.copy(conv, inputs, op, domain, like=match.outputs[0], **groups))

    def example(self, setting: int) -> onnx.ModelProto:
        block = example_block()
        half, two, odd = block // 2, 2 * block, block + 4
        # input channels, output channels, group, kernel, stride, bias, FusedConv activation,
        # the activation after the Conv
        cin, cout, group, k, stride, with_bias, fused, after = pick(
            setting,
            [
                (odd, odd, odd, 3, 1, True, ("LeakyRelu", [0.1]), None),  # depthwise FusedConv
                (3, half, 1, 3, 1, True, None, None),  # NCHW read directly, outputs below a block
                (block + half, block + half, 1, 3, 2, False, None, None),  # OIHWBiBo, padded
                (two, two, 2, 1, 1, True, None, None),  # two groups of one block each
                (3, block, 1, 3, 2, True, None, "HardSigmoid"),  # the activation fused
            ],
        )
        rng = np.random.default_rng(setting)
        weight = rng.standard_normal((cout, cin // group, k, k)).astype(np.float32)
        bias = rng.standard_normal(cout).astype(np.float32) if with_bias else None
        attrs = {"group": group, "pads": [k // 2] * 4, "strides": [stride] * 2}
        if fused:
            attrs.update(activation=fused[0], activation_params=fused[1])
        b = ModelBuilder()
        x = b.input((1, cin, 7, 7))
        if self.reverse:
            layout = conv_layout(weight.shape, group, block)
            source = b.op("ReorderInput", [x], domain=NCHWC) if layout.reorder_input else x
            if layout.depthwise:
                attrs["group"] = padded(group, block)
            conv = blocked_conv(b, source, weight, layout, bias, **attrs)
            return b.model(b.op("ReorderOutput", [conv], domain=NCHWC, channels=cout))
        inputs = [x, b.const(weight)] + ([b.const(bias)] if bias is not None else [])
        if fused:
            return b.model(b.op("FusedConv", inputs, domain=MS_DOMAIN, **attrs))
        y = b.op("Conv", inputs, **attrs)
        return b.model(b.op(after, [y], alpha=0.3, beta=0.4) if after else y)


def group_merge_factor(weight_shape: tuple[int, ...], group: int, block: int) -> int | None:
    """The fewest groups to merge into one so that each merged group has input and output
    channels in whole blocks, where onnxruntime leaves the Conv as it is; None if none does."""
    out_channels, per_group_in = weight_shape[0], weight_shape[1]
    if (
        group < 2
        or per_group_in == 1
        or not isinstance(conv_layout(weight_shape, group, block), str)
    ):
        return None  # depthwise Convs are blocked as they are, or not at all
    per_group_out = out_channels // group
    for factor in range(2, group + 1):
        if group % factor == 0 and not (factor * per_group_in) % block:
            if not (factor * per_group_out) % block:
                return factor
    return None


class GroupedConvToNchwc(NchwcPatternRule):
    """A grouped Conv too narrow per group for the blocked layout (ResNeXt's 32 groups of 4 or 8
    channels) blocked all the same: groups are merged until each fills whole blocks, the filter
    block-diagonal. More multiply-adds, but the blocked kernel and no reorders around the Conv;
    onnxruntime leaves such a Conv in NCHW between two reorders."""

    name = "nchwc-conv-merge-groups"
    description = (
        "Conv(x, w, group=g) -> ReorderOutput(nchwc.Conv(ReorderInput(x), w', group=g/k))"
        "  (k groups merged to whole blocks, w' block-diagonal)"
    )
    pattern = ConvToNchwc.pattern
    target_ops = {"ReorderInput": 1, "Conv": 1, "ReorderOutput": 1}

    def nchwc_reason(self, graph: Graph, match: Match, block: int) -> str | None:
        if len(shape(graph, match["x"])) != 4 or not float_tensor(graph, match["x"]):
            return "nchwc Conv takes 2-D float convolutions only"
        if reason := _constants_reason(graph, match):
            return reason
        if not isinstance(matched_layout(graph, match, block), str):
            return "onnxruntime blocks this Conv as it is (nchwc-conv)"
        weight = graph.constant(match["w"])
        group = match.node("y").attr("group", 1)
        if group_merge_factor(weight.shape, group, block) is None:
            return f"no merge of groups gives whole blocks of {block} channels"
        return _fusing_activation(graph, match)

    def rewrite(self, graph: Graph, match: Match) -> Replacement:
        block = nchwc_block_size()
        group = match.node("y").attr("group", 1)
        weight = graph.constant(match["w"])
        factor = group_merge_factor(weight.shape, group, block)
        merged = merge_groups(weight, group, factor)
        layout = conv_layout(merged.shape, group // factor, block)
        return _blocked_conv(graph, match, merged, layout, block, group=group // factor)

    def example(self, setting: int) -> onnx.ModelProto:
        block = example_block()
        # input channels, per-group width, kernel, stride, FusedConv activation, Relu after
        channels, width, k, stride, fused, relu = pick(
            setting,
            [
                (2 * block, 4, 3, 1, "Relu", False),  # ResNeXt's 4 channels a group, fused ReLU
                (2 * block, block // 2, 3, 2, None, False),  # two groups make one block
                (4 * block, 2, 1, 1, None, True),  # a pointwise grouped Conv, its Relu fused
            ],
        )
        group = channels // width
        rng = np.random.default_rng(setting)
        weight = rng.standard_normal((channels, width, k, k)).astype(np.float32)
        attrs = {"group": group, "pads": [k // 2] * 4, "strides": [stride] * 2}
        b = ModelBuilder()
        inputs = [b.input((1, channels, 6, 6)), b.const(weight), b.const((channels,))]
        if fused:
            return b.model(b.op("FusedConv", inputs, domain=MS_DOMAIN, activation=fused, **attrs))
        y = b.op("Conv", inputs, **attrs)
        return b.model(b.op("Relu", [y]) if relu else y)


POOLS = ("MaxPool", "AveragePool")


def pool_reason(graph: Graph, match: Match, block: int) -> str | None:
    """Why the matched pool `y` of `x` cannot run blocked (None: it can)."""
    dims = shape(graph, match["x"])
    if len(dims) != 4 or not float_tensor(graph, match["x"]):
        return "nchwc pools take 2-D float pooling only"
    if dims[1] % block:
        return f"{dims[1]} channels are not whole blocks of {block}"
    if len([out for out in match.node("y").outputs if out]) != 1:
        return "the MaxPool also outputs indices"
    return None


def pool_region_reason(graph: Graph, reorder: Node) -> str | None:
    """Why a pool reading `reorder`'s output (a ReorderOutput) cannot pool its blocked input
    instead and so join the region (None: it can)."""
    if not channels_first(reorder):
        return "the ReorderOutput is to NHWC"
    if reorder.attr("channels") != shape(graph, reorder.inputs[0])[1]:
        return "the ReorderOutput drops padded channels"
    return None


class PoolToNchwc(NchwcPatternRule):
    name = "nchwc-pool"
    description = (
        "MaxPool(x) -> ReorderOutput(nchwc.MaxPool(ReorderInput(x)))"
        "  (AveragePool alike; channels in whole blocks)"
    )
    reverse_description = "ReorderOutput(nchwc.MaxPool(ReorderInput(x))) -> MaxPool(x)"
    pattern = tuple(f"y={op}(x)" for op in POOLS)
    reverse_pattern = tuple(f"{N}ReorderOutput(y={N}{op}({N}ReorderInput(x)))" for op in POOLS)
    target_ops = {"ReorderInput": 1, "MaxPool": 1, "ReorderOutput": 1}

    def nchwc_reason(self, graph: Graph, match: Match, block: int) -> str | None:
        if reason := pool_reason(graph, match, block):
            return reason
        if self.reverse:
            reorder = match.nodes[0]
            if (
                not channels_first(reorder)
                or reorder.attr("channels") != shape(graph, match["x"])[1]
            ):
                return "the ReorderOutput drops or reorders channels"
            return None
        reorder = _made_by_reorder_output(graph, match["x"])
        if reorder is None or pool_region_reason(graph, reorder):
            return None
        return "the pool reads a blocked region's ReorderOutput: it joins it (nchwc-pool-join)"

    def rewrite(self, graph: Graph, match: Match) -> Replacement:
        pool = match.node("y")
        emit = Emitter(graph)
        if self.reverse:
            # Unit dilations go: AveragePool has the attribute only from opset 19.
            unit = set(pool.attr("dilations", [1])) == {1}
            plain = emit.copy(
                pool, [match["x"]], domain="", **({"dilations": None} if unit else {})
            )
            return emit.result(plain)
        out = graph.value(match.outputs[0])
        source = reorder_input(emit, graph.value(match["x"]), nchwc_block_size())
        blocked = typed(emit, emit.copy(pool, [source], domain=NCHWC), out.shape, out.dtype)
        result = reorder_output_for(emit, blocked, out.name, out.shape[1])
        return emit.result(result)

    def example(self, setting: int) -> onnx.ModelProto:
        block = example_block()
        op, channels, attrs = pick(
            setting,
            [
                ("MaxPool", block, {"kernel_shape": [3, 3], "pads": [1] * 4, "strides": [2, 2]}),
                ("AveragePool", 2 * block, {"kernel_shape": [3, 3], "count_include_pad": 1}),
                ("MaxPool", block, {"kernel_shape": [2, 2], "strides": [2, 2], "ceil_mode": 1}),
            ],
        )
        b = ModelBuilder()
        x = b.input((1, channels, 7, 7))
        if not self.reverse:
            return b.model(b.op(op, [x], **attrs))
        # The ReorderInput is shared with a global pool, which keeps it.
        blocked = b.op("ReorderInput", [x], domain=NCHWC)
        pools = [
            b.op(op, [blocked], domain=NCHWC, **attrs),
            b.op("GlobalMaxPool", [blocked], domain=NCHWC),
        ]
        return b.model(
            *[b.op("ReorderOutput", [p], domain=NCHWC, channels=channels) for p in pools]
        )


_GLOBAL_POOLS = ("GlobalAveragePool", "GlobalMaxPool")


class GlobalPoolToNchwc(NchwcPatternRule):
    """Global pools go blocked only where their input is blocked already, as in onnxruntime:
    reordering a tensor in for one cheap reduction does not pay."""

    name = "nchwc-global-pool"
    description = (
        "GlobalAveragePool(ReorderOutput(x)) -> ReorderOutput(nchwc.GlobalAveragePool(x))"
        "  (GlobalMaxPool alike)"
    )
    reverse_description = (
        "ReorderOutput(nchwc.GlobalAveragePool(x)) -> GlobalAveragePool(ReorderOutput(x))"
    )
    pattern = tuple(f"y={op}(r={N}ReorderOutput(x))" for op in _GLOBAL_POOLS)
    reverse_pattern = tuple(f"r={N}ReorderOutput(y={N}{op}(x))" for op in _GLOBAL_POOLS)
    target_ops = {"GlobalAveragePool": 1, "ReorderOutput": 1}

    def nchwc_reason(self, graph: Graph, match: Match, block: int) -> str | None:
        reorder = graph.producer(match["r"])
        if not channels_first(reorder):
            return "the ReorderOutput is to NHWC"
        if reorder.attr("channels") % block:
            return f"{reorder.attr('channels')} channels are not whole blocks of {block}"
        return None

    def rewrite(self, graph: Graph, match: Match) -> Replacement:
        pool = match.node("y")
        channels = graph.producer(match["r"]).attr("channels")
        x = graph.value(match["x"])
        emit = Emitter(graph)
        if self.reverse:
            return emit.result(emit.copy(pool, [reorder_output(emit, x, channels)], domain=""))
        blocked = emit.copy(pool, [x.name], domain=NCHWC)
        typed(emit, blocked, (*x.shape[:2], 1, 1), x.dtype)
        result = reorder_output_for(emit, blocked, match.outputs[0], channels)
        return emit.result(result)

    def example(self, setting: int) -> onnx.ModelProto:
        block = example_block()
        op, dims = pick(
            setting,
            [
                ("GlobalAveragePool", (1, block, 5, 5)),
                ("GlobalMaxPool", (1, 2 * block, 4, 4)),
                ("GlobalAveragePool", (2, block, 3, 3)),
            ],
        )
        b = ModelBuilder()
        x = blocked_input(b, dims)
        if self.reverse:
            pooled = b.op(op, [x], domain=NCHWC)
            return b.model(b.op("ReorderOutput", [pooled], domain=NCHWC, channels=dims[1]))
        return b.model(b.op(op, [b.op("ReorderOutput", [x], domain=NCHWC, channels=dims[1])]))


class BatchNormToNchwc(NchwcPatternRule):
    """onnxruntime turns a BatchNormalization of a blocked tensor into a 1x1 depthwise nchwc
    Conv (so that its Relu can fuse as well). The Conv rule's reverse turns it back into a
    plain depthwise Conv, the way out of the layout."""

    name = "nchwc-batchnorm"
    description = (
        "BatchNormalization(ReorderOutput(x), ...) -> ReorderOutput(nchwc.Conv(x, w, b, group=C))"
        "  (1x1 depthwise)"
    )
    pattern = f"BatchNormalization(r={N}ReorderOutput(x), scale, bias, mean, var)"
    target_ops = {"Conv": 1, "ReorderOutput": 1}

    def nchwc_reason(self, graph: Graph, match: Match, block: int) -> str | None:
        reorder = graph.producer(match["r"])
        channels = reorder.attr("channels")
        if not channels_first(reorder) or padded(channels, block) != shape(graph, match["x"])[1]:
            return "the ReorderOutput drops whole blocks or is to NHWC"
        for var in ("scale", "bias", "mean", "var"):
            array = graph.constant(match[var])
            if array is None or array.shape != (channels,) or array.dtype != np.float32:
                return f"the {var} is not a constant float vector of {channels}"
        norm = match.nodes[0]
        if norm.attr("training_mode", 0) or len([out for out in norm.outputs if out]) != 1:
            return "BatchNormalization is in training mode"
        return None

    def rewrite(self, graph: Graph, match: Match) -> Replacement:
        scale, shift, mean, var = (
            graph.constant(match[v]) for v in ("scale", "bias", "mean", "var")
        )
        factor = scale / np.sqrt(var + np.float32(match.nodes[0].attr("epsilon", 1e-5)))
        block = nchwc_block_size()
        weight = pad_channels(factor, block)
        filters = reorder_filter(weight.reshape(-1, 1, 1, 1), block, per_output=True)
        x = graph.value(match["x"])
        emit = Emitter(graph)
        bias = pad_channels(shift - mean * factor, block)
        inputs = [x.name, emit.const(filters, "weight"), emit.const(bias, "bias")]
        conv = emit.op("Conv", inputs, domain=NCHWC, group=len(weight))
        typed(emit, conv, x.shape, x.dtype)
        channels = len(factor)
        result = reorder_output_for(emit, conv, match.outputs[0], channels)
        return emit.result(result)

    def example(self, setting: int) -> onnx.ModelProto:
        block = example_block()
        dims = pick(setting, [(1, block, 5, 5), (2, 2 * block, 3, 3), (1, block + 4, 2, 2)])
        b = ModelBuilder(seed=setting)
        x = b.op("ReorderOutput", [blocked_input(b, dims)], domain=NCHWC, channels=dims[1])
        params = [b.const((dims[1],)) for _ in range(3)]
        var = b.const(np.abs(np.random.default_rng(setting).standard_normal(dims[1])) + 0.5)
        return b.model(b.op("BatchNormalization", [x, *params, var], epsilon=1e-3))


class BlockedConvUnblock(NchwcPatternRule):
    """A blocked Conv that reads a blocked tensor, out of the layout with its two reorders.

    Not a projection's 1x1 Conv over its m x 1 rows (`nchwc_projection`): a plain Conv runs it
    with the weights as the matrix product's first operand, as the `transposed` form of
    `scripts/probe_gemm_layouts.py` does, which it times at 0.76-1.01x of the MatMul
    (mini-DALL-E's vocabulary projection ran 1.5% slower so in its graph, which the per-op
    cost, 1.4% the other way, could not see); `nchwc-projection-reverse` takes a projection
    out to its Gemm instead."""

    name = "nchwc-conv-unblock"
    description = (
        "nchwc.Conv(x, w', b, s?) -> ReorderInput(Conv(ReorderOutput(x), w, b)) + s"
        "  (x blocked; the activation fused into a FusedConv, or after the Sum)"
    )
    pattern = f"y={N}Conv(x, w, b?, s?)"
    target_ops = {"ReorderOutput": 1, "Conv": 1, "ReorderInput": 1}
    settings = 4

    def nchwc_reason(self, graph: Graph, match: Match, block: int) -> str | None:
        if reason := out_of_layout_reason(graph, match) or _constants_reason(graph, match):
            return reason
        weight = graph.constant(match["w"])
        if match.node("y").attr("group", 1) != 1 or weight.ndim != 4:
            return "a grouped or depthwise Conv (the Conv rule's reverse takes those)"
        if weight.shape[0] % block or weight.shape[1] % block:
            return "not a filter blocked for this machine"
        if weight.shape[2:] == (1, 1) and shape(graph, match["x"])[3] == 1:
            return "a projection's rows, an m x 1 image (nchwc-projection-reverse takes it out)"
        return None

    def rewrite(self, graph: Graph, match: Match) -> Replacement:
        conv = match.node("y")
        out = graph.value(match.outputs[0])

        def plain_conv(emit: Emitter, x: Value, weight: np.ndarray, fuse: bool) -> str:
            op, domain = ("FusedConv", MS_DOMAIN) if fuse else ("Conv", "")
            dropped = {} if fuse else {"activation": None, "activation_params": None}
            inputs = [x.name, emit.const(weight, "weight"), match["b"]]
            y = emit.copy(conv, inputs, op, domain, **dropped)
            return typed(emit, y, out.shape, out.dtype)

        return conv_out_of_layout(graph, match, plain_conv, fuse_activation=True)

    def example(self, setting: int) -> onnx.ModelProto:
        block = example_block()
        # input channels, output channels, kernel, stride, activation, Sum input
        cin, cout, k, stride, activation, with_sum = pick(
            setting,
            [
                (block, block, 3, 1, None, False),
                (2 * block, block, 1, 2, ("Relu", []), False),  # a FusedConv in NCHW
                (block, 2 * block, 3, 1, ("Relu", []), True),  # the Sum, then the Relu
                (block + 4, block, 3, 2, ("LeakyRelu", [0.1]), True),  # padded input channels
            ],
        )
        b = ModelBuilder()
        rng = np.random.default_rng(setting)
        weight = rng.standard_normal((cout, cin, k, k)).astype(np.float32)
        bias = rng.standard_normal(cout).astype(np.float32)
        size = 7
        source = b.op("ReorderInput", [b.input((1, cin, size, size))], domain=NCHWC)
        out_size = (size + 2 * (k // 2) - k) // stride + 1
        total = blocked_input(b, (1, cout, out_size, out_size)) if with_sum else None
        attrs: dict[str, object] = {"pads": [k // 2] * 4, "strides": [stride] * 2}
        if activation:
            attrs["activation"] = activation[0]
            if activation[1]:
                attrs["activation_params"] = activation[1]
        layout = ConvLayout(per_output=False, reorder_input=True)
        conv = blocked_conv(b, source, weight, layout, bias, total, **attrs)
        return b.model(b.op("ReorderOutput", [conv], domain=NCHWC, channels=cout))


RULES = [
    *both_ways(ConvToNchwc),
    BlockedConvUnblock(),
    GroupedConvToNchwc(),
    *both_ways(PoolToNchwc),
    *both_ways(GlobalPoolToNchwc),
    BatchNormToNchwc(),
    *nchwc_blocked.RULES,
]

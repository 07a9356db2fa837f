"""The element-wise ops between two blocked projections, run in the blocked layout.

- ReorderInput(f(Reshape(ReorderOutput(y, channels_last)))) -> f(y)        and back
  (f: element-wise ops, Reshapes that keep each row, Splits of the channels at whole blocks)
- Add(Reshape(ReorderOutput(Conv(x, w, b?), channels_last)), c) -> Reshape(ReorderOutput(
  Conv(x, w, b + c)))                                                     (c per channel)

With projections as blocked 1x1 Convs (`nchwc_projection`), a transformer's feed-forward runs
up-projection, ReorderOutput, activation, ReorderInput, down-projection: its widest tensor (4x
the hidden size) leaves the blocked layout and comes back, and onnxruntime's profiler puts
those two reorders at 2-3% of full-size BERT, ViT-Base and Transformer-Transducer. An
element-wise op computes the same on the blocked tensor; a Split of the channels at whole
blocks splits the blocked memory at the same place (the blocks are its outermost dimension);
the Reshapes between only regroup rows. So the ops between run blocked and both reorders go
(a GEGLU's Split, Gelu and Mul alike). A Relu left on the up-projection's Conv is then fused
into it by `nchwc-conv-activation-fusion`.

Every channel count between must be whole blocks, so that no padded channel is computed on.
A per-channel constant between (a projection's bias, where the search blocked the MatMul
without its Add) has no blocked form short of a copy per row: it goes into the up-projection's
Conv as its bias, in the same step (a search that prices each step alone sees the bias in the
Conv cost about what the Add did, and would not take it first), or alone
(`nchwc-projection-bias`).

The reverse takes such ops between blocked producers and blocked readers out to the rows
(channels-last) layout; it is offered on images one pixel wide, the projections' m x 1, so
that the CNNs' blocked activations do not gain sites that only a projection's graph needs.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import onnx

from rlflow.graph import Graph, Node
from rlflow.rewrite.build import ModelBuilder
from rlflow.rewrite.rule import Emitter, Match, Replacement, Rule, both_ways
from rlflow.rewrite.rules.common import shape
from rlflow.rewrite.rules.nchwc_format import ConvLayout
from rlflow.rewrite.rules.nchwc_layout import (
    ACTIVATIONS,
    NCHWC,
    NchwcRule,
    blocked_conv,
    example_block,
    is_nchwc,
    typed,
)

_UNARY = {
    "": frozenset({*ACTIVATIONS, "Gelu", "Erf"}),
    "com.microsoft": frozenset({"Gelu", "FastGelu", "QuickGelu"}),
}
_BINARY = frozenset({"Add", "Sub", "Mul", "Div"})
_MOST_NODES = 16  # a feed-forward's ops between its projections are a handful


def _kind(node: Node) -> str | None:
    """How an op between the projections maps to the blocked layout, or None if it cannot."""
    if node.op_type in _UNARY.get(node.domain, ()) and len(node.present_inputs) == 1:
        return "unary"
    if node.domain:
        return None
    if node.op_type in _BINARY:
        return "binary"
    return {"Split": "split", "Reshape": "reshape"}.get(node.op_type)


def _operands(graph: Graph, node: Node) -> list[str]:
    """The inputs of an op between that are themselves computed between (not constants)."""
    if _kind(node) == "binary":
        return [name for name in node.inputs if graph.constant(name) is None]
    return node.inputs[:1]


def _region(graph: Graph, end: str, reverse: bool) -> tuple[list[Node], list[Node]] | None:
    """The ops computing `end` from the sources, and the sources: ReorderOutputs to rows
    (forward), or blocked nchwc producers (reverse, which has no Reshapes). None if some
    input comes from anything else."""
    nodes: list[Node] = []
    sources: list[Node] = []
    stack, seen = [end], set()
    while stack:
        name = stack.pop()
        if name in seen:
            continue
        seen.add(name)
        node = graph.producer(name)
        if node is None:
            return None
        source = is_nchwc(node, "ReorderOutput")
        if reverse:
            source = node.domain == NCHWC and node.op_type != "ReorderOutput"
        if source:
            if all(node is not other for other in sources):
                sources.append(node)
            continue
        kind = _kind(node)
        if kind is None or (reverse and kind == "reshape") or len(nodes) == _MOST_NODES:
            return None
        if all(node is not other for other in nodes):
            nodes.append(node)
        stack.extend(_operands(graph, node))
    return nodes, sources


class ProjectionJoin(NchwcRule, Rule):
    """Anchored at the ReorderInput that blocks the rows again (forward), or at the last op
    between, whose readers are all blocked ops (reverse)."""

    name = "nchwc-projection-join"
    description = (
        "ReorderInput(f(Reshape(ReorderOutput(y, channels_last)))) -> f(y)"
        "  (f element-wise, Splits of the channels at whole blocks; a bias into y's Conv)"
    )
    reverse_description = (
        "f(y) -> ReorderInput(f(ReorderOutput(y, channels_last)))"
        "  (y blocked, m x 1; f element-wise, read by blocked ops)"
    )
    anchor_ops = ("ReorderInput",)
    reverse_anchor_ops = tuple(sorted({*_UNARY[""], *_UNARY["com.microsoft"], *_BINARY}))
    source_ops = {"ReorderOutput": 1, "ReorderInput": 1}
    target_ops: dict[str, int] = {}

    def matches(self, graph: Graph, anchor: Node) -> Iterator[Match]:
        if self.reverse:
            readers = graph.consumers(anchor.outputs[0])
            if _kind(anchor) in (None, "reshape") or not readers:
                return
            if any(reader.domain != NCHWC for reader in readers):
                return
            found = _region(graph, anchor.outputs[0], reverse=True)
            if found is not None:
                nodes, sources = found
                yield Match(tuple(nodes), {"y": anchor.outputs[0]}, (anchor.outputs[0],))
            return
        if not is_nchwc(anchor, "ReorderInput") or anchor.attr("channels_last", 0) != 1:
            return
        found = _region(graph, anchor.inputs[0], reverse=False)
        if found is None:
            return
        nodes, sources = found
        nodes += [_bias_chain(graph, node)[4] for node in nodes if _is_bias(graph, node)]
        inside = {id(node) for node in (anchor, *nodes)}
        shared = [
            source
            for source in sources
            if graph.is_output(source.outputs[0])
            or any(id(reader) not in inside for reader in graph.consumers(source.outputs[0]))
        ]
        owned = [source for source in sources if all(source is not s for s in shared)]
        bindings = {"x": anchor.inputs[0]}
        yield Match((anchor, *nodes, *owned), bindings, (anchor.outputs[0],), keep=tuple(shared))

    def nchwc_reason(self, graph: Graph, match: Match, block: int) -> str | None:
        if self.reverse:
            return _reverse_reason(graph, match, block)
        return _forward_reason(graph, match, block)

    def rewrite(self, graph: Graph, match: Match) -> Replacement:
        emit = Emitter(graph)
        if self.reverse:
            return emit.result(_to_rows(emit, graph, match))
        return emit.result(_to_blocked(emit, graph, match))

    def example(self, setting: int) -> onnx.ModelProto:
        return _example(setting, self.reverse)


def _forward_reason(graph: Graph, match: Match, block: int) -> str | None:
    anchor = match.nodes[0]
    image, rows = shape(graph, anchor.outputs[0]), shape(graph, anchor.inputs[0])
    if len(image) != 4 or image[0] != 1:
        return "the ReorderInput's result is not one image"
    if image[1] != rows[-1]:
        return "the channels between are not whole blocks (the ReorderInput pads them)"
    sources = [n for n in (*match.nodes[1:], *match.keep) if is_nchwc(n, "ReorderOutput")]
    for source in sources:
        blocked = shape(graph, source.inputs[0])
        if source.attr("channels_last", 0) != 1:
            return "a ReorderOutput writes NCHW, not rows"
        if blocked[2:] != image[2:] or source.attr("channels") != blocked[1]:
            return "a ReorderOutput's image is another size, or drops padded channels"
    return _region_reason(graph, match, block, image[2] * image[3], reverse=False)


def _reverse_reason(graph: Graph, match: Match, block: int) -> str | None:
    made = {name for node in match.nodes for name in node.outputs}
    sources = {name for node in match.nodes for name in _operands(graph, node)} - made
    images = {shape(graph, name)[2:] for name in sources}
    if any(len(shape(graph, name)) != 4 for name in sources) or len(images) != 1:
        return "the blocked tensors are not images of one size"
    ((height, width),) = images
    if width != 1:
        return "the blocked tensor is not the rows of a projection (an image m x 1)"
    return _region_reason(graph, match, block, height, reverse=True)


def _region_reason(
    graph: Graph, match: Match, block: int, pixels: int, reverse: bool
) -> str | None:
    """Why the ops between cannot change layout: every value between must be `pixels` rows
    of whole blocks of channels (last in rows, second when blocked); Splits split those
    channels; a binary op's operands are two such values of one shape, or one and a scalar
    constant."""
    for node in (node for node in match.nodes if node.domain != NCHWC):
        for name in [*node.outputs, *_operands(graph, node)]:
            dims = shape(graph, name)
            if (len(dims) != 4) if reverse else (not dims):  # a scalar: no channels to block
                return f"{name!r} is not {'a blocked image' if reverse else 'rows'}"
            channels = dims[1] if reverse else dims[-1]
            if channels % block or int(np.prod(dims)) != pixels * channels:
                return f"{name!r} is not {pixels} rows of whole blocks of channels"
        kind = _kind(node)
        if not reverse and _is_bias(graph, node):
            reason = _bias_reason(graph, node)
            if reason is not None:
                return reason
        elif kind == "binary":
            constants = [graph.constant(name) for name in node.inputs]
            if any(c is not None and (c.size != 1 or c.ndim > 4) for c in constants):
                return "a binary op's constant is not a scalar"
            if len({shape(graph, name) for name in _operands(graph, node)}) != 1:
                return "a binary op broadcasts between two values"
        if kind == "split":  # each part whole blocks (above): split at whole blocks
            dims = shape(graph, node.inputs[0])
            if node.attr("axis", 0) % len(dims) != (1 if reverse else len(dims) - 1):
                return "a Split does not split the channels"
    return None


def _to_blocked(emit: Emitter, graph: Graph, match: Match) -> str:
    """The ops between on the blocked tensors, computing what the anchor's ReorderInput made."""
    anchor = match.nodes[0]
    _, _, height, width = shape(graph, anchor.outputs[0])
    dtype = graph.value(anchor.outputs[0]).dtype
    memo: dict[str, str] = {}

    def blocked(name: str) -> str:
        if name in memo:
            return memo[name]
        node = graph.producer(name)
        kind = _kind(node) if node.domain != NCHWC else "source"
        if kind in ("source", "reshape"):
            memo[name] = node.inputs[0] if kind == "source" else blocked(node.inputs[0])
            return memo[name]
        if _is_bias(graph, node):
            memo[name] = _folded_conv(emit, graph, node)
            return memo[name]
        inputs = [
            blocked(value) if graph.constant(value) is None else value for value in node.inputs
        ]
        for old, new in zip(node.outputs, _copied(emit, node, inputs, axis=1), strict=True):
            channels = shape(graph, old)[-1]
            memo[old] = typed(emit, new, (1, channels, height, width), dtype)
        return memo[name]

    return blocked(anchor.inputs[0])


def _copied(emit: Emitter, node: Node, inputs: list[str], axis: int) -> list[str]:
    """An op between, on the inputs of the other layout: a Split splits the channels, on
    `axis` there (its sizes kept); every other op keeps its attributes."""
    if _kind(node) != "split":
        return [emit.copy(node, inputs)]
    parts = emit.copy(node, [inputs[0], *node.inputs[1:]], axis=axis, outputs=len(node.outputs))
    return [parts] if isinstance(parts, str) else parts


def _to_rows(emit: Emitter, graph: Graph, match: Match) -> str:
    """The ops between on channels-last rows, between a ReorderOutput of each blocked source
    and one ReorderInput of the result."""
    inside = {id(node) for node in match.nodes}
    dtype = graph.value(match["y"]).dtype
    memo: dict[str, str] = {}

    def rows(name: str) -> str:
        if name in memo:
            return memo[name]
        node = graph.producer(name)
        _, channels, height, width = shape(graph, name)
        if id(node) not in inside:
            out = emit.op("ReorderOutput", [name], domain=NCHWC, channels=channels, channels_last=1)
            memo[name] = typed(emit, out, (1, height, width, channels), dtype)
            return memo[name]
        inputs = [rows(value) if graph.constant(value) is None else value for value in node.inputs]
        for old, new in zip(node.outputs, _copied(emit, node, inputs, axis=3), strict=True):
            _, part, height, width = shape(graph, old)
            memo[old] = typed(emit, new, (1, height, width, part), dtype)
        return memo[name]

    result = emit.op("ReorderInput", [rows(match["y"])], domain=NCHWC, channels_last=1)
    return typed(emit, result, shape(graph, match["y"]), dtype)


class ProjectionBias(NchwcRule, Rule):
    """A per-channel constant added to a blocked projection's rows becomes part of its Conv's
    bias. Anchored at the Add."""

    name = "nchwc-projection-bias"
    description = (
        "Add(Reshape(ReorderOutput(Conv(x, w, b?), channels_last)), c)"
        " -> Reshape(ReorderOutput(Conv(x, w, b + c)))  (c per channel)"
    )
    anchor_ops = ("Add",)
    source_ops = {"Add": 1, "Reshape": 1, "ReorderOutput": 1, "Conv": 1}
    target_ops = {"Reshape": 1, "ReorderOutput": 1, "Conv": 1}

    def matches(self, graph: Graph, anchor: Node) -> Iterator[Match]:
        chain = _bias_chain(graph, anchor)
        if chain is not None:
            rows, addend, reshapes, reorder, conv = chain
            bindings = {"rows": rows, "c": addend}
            yield Match((anchor, *reshapes, reorder, conv), bindings, (anchor.outputs[0],))

    def nchwc_reason(self, graph: Graph, match: Match, block: int) -> str | None:
        return _bias_reason(graph, match.nodes[0])

    def rewrite(self, graph: Graph, match: Match) -> Replacement:
        _, _, reshapes, reorder, conv = _bias_chain(graph, match.nodes[0])
        emit = Emitter(graph)
        out = emit.copy(
            reorder, [_folded_conv(emit, graph, match.nodes[0])], like=reorder.outputs[0]
        )
        for reshape in reversed(reshapes):
            out = emit.copy(reshape, [out, reshape.inputs[1]], like=reshape.outputs[0])
        return emit.result(out)

    def example(self, setting: int) -> onnx.ModelProto:
        """Rows through a blocked 1x1 Conv (without a bias, with one, with a padded block of
        output channels), back to rows, plus a per-channel constant (a vector, a (1, 1, n)
        tensor, a scalar)."""
        block = example_block()
        m, k = 5, block
        n = block + 4 if setting == 2 else block
        rng = np.random.default_rng(setting)
        b = ModelBuilder()
        x = b.op("ReorderInput", [b.input((1, m, 1, k))], domain=NCHWC, channels_last=1)
        weight = rng.standard_normal((n, k, 1, 1)).astype(np.float32)
        bias = rng.standard_normal(n).astype(np.float32) if setting == 1 else None
        conv = blocked_conv(b, x, weight, ConvLayout(per_output=False, reorder_input=True), bias)
        rows = b.op("ReorderOutput", [conv], domain=NCHWC, channels=n, channels_last=1)
        rows = b.op("Reshape", [rows, b.const([1, m, n], np.int64)])
        addend = [(n,), (1, 1, n), (1,)][setting]
        return b.model(b.op("Add", [rows, b.const(addend)]))


def _bias_chain(graph: Graph, add: Node) -> tuple[str, str, list[Node], Node, Node] | None:
    """An Add of a constant to rows that a blocked Conv wrote (through its ReorderOutput and
    Reshapes): the rows, the constant, the Reshapes (the Add's side first), the ReorderOutput
    and the Conv; None for any other Add."""
    if add.op_type != "Add" or add.domain or len(add.inputs) != 2:
        return None
    for rows, addend in (add.inputs, add.inputs[::-1]):
        if graph.constant(addend) is None or graph.constant(rows) is not None:
            continue
        reshapes, node = [], graph.producer(rows)
        while node is not None and node.op_type == "Reshape" and not node.domain:
            reshapes.append(node)
            node = graph.producer(node.inputs[0])
        conv = graph.producer(node.inputs[0]) if is_nchwc(node, "ReorderOutput") else None
        if is_nchwc(conv, "Conv"):
            return rows, addend, reshapes, node, conv
    return None


def _is_bias(graph: Graph, node: Node) -> bool:
    """An Add of a blocked projection's rows and a constant of more than one value: only as
    the Conv's bias can that constant be added blocked."""
    chain = _bias_chain(graph, node)
    return chain is not None and graph.constant(chain[1]).size > 1


def _bias_reason(graph: Graph, add: Node) -> str | None:
    """Why the Add's constant cannot go into the Conv's bias (the Add a `_bias_chain`'s)."""
    rows_name, addend_name, reshapes, reorder, conv = _bias_chain(graph, add)
    if reorder.attr("channels_last", 0) != 1:
        return "the ReorderOutput writes NCHW, not rows"
    if conv.attr("activation") is not None or any(conv.inputs[3:]):
        return "the Conv applies an activation or adds a sum after its bias"
    if any(graph.constant(name) is None for name in conv.present_inputs[1:]):
        return "the Conv's weight or bias is not a constant"
    rows = shape(graph, rows_name)
    if shape(graph, add.outputs[0]) != rows:
        return "the Add broadcasts the rows"
    addend = graph.constant(addend_name)
    if addend.ndim > len(rows) or any(d != 1 for d in addend.shape[:-1]):
        return "the addend is not a per-channel constant"
    if addend.ndim and addend.shape[-1] not in (1, rows[-1]):
        return "the addend is not a per-channel constant"
    if reorder.attr("channels") != rows[-1]:
        return "the rows are not the Conv's channels"
    if any(len(graph.consumers(node.outputs[0])) != 1 for node in (conv, reorder, *reshapes)):
        return "the projection's rows are read by more than the Add"
    return None


def _folded_conv(emit: Emitter, graph: Graph, add: Node) -> str:
    """The Conv of the Add's `_bias_chain` with the Add's constant in its bias (padded
    channels 0): what the Add computed, blocked."""
    rows, addend, _, _, conv = _bias_chain(graph, add)
    channels, blocked = shape(graph, rows)[-1], shape(graph, conv.outputs[0])[1]
    dtype = graph.constant(conv.inputs[1]).dtype
    bias = graph.constant(conv.inputs[2]) if any(conv.inputs[2:3]) else None
    bias = np.zeros(blocked, dtype) if bias is None else bias
    shift = np.broadcast_to(graph.constant(addend).reshape(-1), (channels,)).astype(dtype)
    new_bias = emit.const(bias + np.pad(shift, (0, blocked - channels)), "bias")
    return emit.copy(conv, [conv.inputs[0], conv.inputs[1], new_bias], like=conv.outputs[0])


def _example(setting: int, reverse: bool) -> onnx.ModelProto:
    """Rows from a blocked source through the ops between into a blocked 1x1 Conv, read back
    as rows: a Gelu (setting 0), a GEGLU's Split, Gelu and Mul (1), a Relu scaled by a
    constant (2); written with the reorders and Reshapes between (forward) or blocked."""
    block = example_block()
    m, channels = (5, 2 * block) if setting == 1 else (3 + setting, block)
    b = ModelBuilder()
    x = b.op("ReorderInput", [b.input((1, m, 1, channels))], domain=NCHWC, channels_last=1)
    if not reverse:
        x = b.op("ReorderOutput", [x], domain=NCHWC, channels=channels, channels_last=1)
        x = b.op("Reshape", [x, b.const([1, m, channels], np.int64)])
    axis = 1 if reverse else -1
    if setting == 0:
        y = b.op("Gelu", [x], domain="com.microsoft")
    elif setting == 1:
        half = channels // 2
        gate, value = b.op("Split", [x, b.const([half, half], np.int64)], outputs=2, axis=axis)
        y = b.op("Mul", [gate, b.op("Gelu", [value], domain="com.microsoft")])
    else:
        y = b.op("Mul", [b.op("Relu", [x]), b.const(np.float32(0.5))])
    width = channels // 2 if setting == 1 else channels  # the GEGLU halves them
    if not reverse:
        y = b.op("Reshape", [y, b.const([1, m, 1, width], np.int64)])
        y = b.op("ReorderInput", [y], domain=NCHWC, channels_last=1)
    weight = np.random.default_rng(setting).standard_normal((block, width, 1, 1))
    layout = ConvLayout(per_output=False, reorder_input=True)
    conv = blocked_conv(b, y, weight.astype(np.float32), layout)
    return b.model(b.op("ReorderOutput", [conv], domain=NCHWC, channels=block, channels_last=1))


RULES = [*both_ways(ProjectionJoin), ProjectionBias()]

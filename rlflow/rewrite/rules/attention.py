"""Multi-head self-attention into onnxruntime's fused `Attention` operator, and back.

- Q, K, V projections of one x (MatMul + Add, or onnxruntime's Reshape -> Gemm -> Reshape),
  split into heads (Reshape, Transpose), Softmax(scale * Q K^T [+ causal mask]) V, heads merged
  (Transpose, Reshape) -> Attention(x, [Wq Wk Wv], [bq bk bv], num_heads, scale,
  unidirectional)   (contrib)
- Attention(x, W, b) -> the same written out                                    (back)

onnxruntime has a fusion for this (`AttentionFusion`), but it matches only the graphs its own
exporters write: the zoo's transformers, exported by torch as written, keep their attention
unfused at every onnxruntime level. The forward rule matches the graph as exported and as
onnxruntime saves it at `all` (projections turned into Gemm between reshapes, the scale folded
into a FusedMatMul), so a search can fuse attention from any start state; the reverse writes
the exporter's form again, so that a fusion can be undone per site.

The fused operator computes the three projections as one matrix product and the heads in one
kernel: on this project's CPU 1-4% of a medium transformer end to end (docs/BENCHMARKS.md,
`scripts/bench_rule_everywhere.py`).
A causal mask is accepted only as a constant that is 0 on and below the diagonal and at most
-1e4 above it: there the Softmax weight is exactly 0, as with the operator's own mask.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import onnx

from rlflow.graph import Graph, Node, Value
from rlflow.graph.domains import MS_DOMAIN as MS
from rlflow.rewrite.build import ModelBuilder
from rlflow.rewrite.rule import Emitter, Match, Replacement, Rule
from rlflow.rewrite.rules.common import only_reader, opset, pick, scalar, shape
from rlflow.rewrite.rules.transformer import matmul_projection

_HEADS_PERM = [0, 2, 1, 3]
"""(B, S, H, D) <-> (B, H, S, D): the head split of Q and V, and the merge of the context."""
_MASKED = -1e4
"""A mask entry at or below this takes a Softmax weight of exactly 0 in float32."""


@dataclass(frozen=True)
class _Projection:
    """x @ W + b for one of Q, K, V, and the nodes computing it from x."""

    nodes: tuple[Node, ...]
    x: str
    weight: np.ndarray
    bias: np.ndarray


@dataclass(frozen=True)
class _Site:
    """A matched attention block: everything the fused operator replaces."""

    nodes: tuple[Node, ...]
    x: str
    output: str
    weight: np.ndarray
    bias: np.ndarray
    heads: int
    scale: float
    causal: bool


def _reshapes_back(graph: Graph, value: str, reader: Node) -> tuple[str, list[Node]]:
    """Walk back from `value` through Reshapes, each read only by the next node."""
    chain: list[Node] = []
    while True:
        node = graph.producer(value)
        if node is None or node.op_type != "Reshape" or node.domain:
            return value, chain
        if not only_reader(graph, value, reader):
            return value, chain
        chain.append(node)
        value, reader = node.inputs[0], node


def _gemm_bias(graph: Graph, name: str, width: int) -> np.ndarray | None:
    """A Gemm's C as one bias per output column: a constant of shape (N,) or (1, N)."""
    array = graph.constant(name)
    if array is None or array.shape not in ((width,), (1, width)):
        return None
    return array.reshape(width)


def _projection(graph: Graph, value: str, reader: Node) -> _Projection | None:
    """The projection computing `value` (read by `reader`) from a rank-3 x, if it is one."""
    value, chain = _reshapes_back(graph, value, reader)
    node = graph.producer(value)
    if node is None or node.domain or not only_reader(graph, value, chain[-1] if chain else reader):
        return None
    if node.op_type == "Gemm":
        if node.attr("transA", 0) or node.attr("alpha", 1.0) != 1.0 or len(node.inputs) < 3:
            return None
        weight = graph.constant(node.inputs[1])
        if weight is None or weight.ndim != 2 or node.attr("beta", 1.0) != 1.0:
            return None
        weight = weight.T if node.attr("transB", 0) else weight
        bias = _gemm_bias(graph, node.inputs[2], weight.shape[1])
        x, head = _reshapes_back(graph, node.inputs[0], node)
        nodes = (*chain, node, *head)
    elif node.op_type in ("Add", "MatMul"):
        matmul = node
        if node.op_type == "Add":
            matmul = next(
                (p for i in node.inputs if (p := graph.producer(i)) and p.op_type == "MatMul"),
                None,
            )
        found = matmul_projection(graph, matmul) if matmul is not None else None
        if found is None or found.output != value:  # an Add other than the bias, say
            return None
        weight = found.weight
        bias = found.bias if found.bias is not None else np.zeros(weight.shape[1], weight.dtype)
        x, nodes = matmul.inputs[0], (*chain, *found.nodes)
    else:
        return None
    if bias is None or graph.is_constant(x) or len(shape(graph, x)) != 3:
        return None
    if weight.dtype != np.float32 or shape(graph, x)[-1] != weight.shape[0]:
        return None
    return _Projection(nodes, x, weight, bias.astype(weight.dtype))


def _heads(graph: Graph, value: str, reader: Node, perm: list[int]) -> tuple[Node, Node] | None:
    """Transpose(perm) of Reshape(projection, (B, S, H, D)): the head split of Q, K or V."""
    transpose = graph.producer(value)
    if transpose is None or transpose.op_type != "Transpose" or transpose.domain:
        return None
    if list(transpose.attr("perm", [])) != perm or not only_reader(graph, value, reader):
        return None
    reshape = graph.producer(transpose.inputs[0])
    if reshape is None or reshape.op_type != "Reshape" or reshape.domain:
        return None
    if not only_reader(graph, transpose.inputs[0], transpose):
        return None
    if len(shape(graph, reshape.outputs[0])) != 4:
        return None
    return reshape, transpose


def _causal(mask: np.ndarray, seq: int) -> bool:
    """A constant (.., S, S) mask that is 0 on and below the diagonal and masked above it."""
    if mask.ndim < 2 or mask.shape[-2:] != (seq, seq) or any(d != 1 for d in mask.shape[:-2]):
        return False
    square = mask.reshape(seq, seq)
    above = np.triu(np.ones((seq, seq), bool), k=1)
    return bool(np.all(square[~above] == 0) and np.all(square[above] <= _MASKED))


def _scores(graph: Graph, softmax: Node) -> tuple[list[Node], Node, float, bool] | None:
    """Back from the Softmax: the optional causal mask Add, the scale, and the Q K^T product
    (MatMul, or a FusedMatMul with the scale as alpha and K transposed or not)."""
    nodes: list[Node] = []
    value, reader, causal = softmax.inputs[0], softmax, False
    node = graph.producer(value)
    if node is not None and node.op_type == "Add" and not node.domain and len(node.inputs) == 2:
        constants = [i for i in node.inputs if graph.is_constant(i)]
        seq = shape(graph, value)[-1]
        if len(constants) != 1 or not _causal(graph.constant(constants[0]), seq):
            return None
        if not only_reader(graph, value, reader):
            return None
        nodes.append(node)
        value, reader, causal = next(i for i in node.inputs if i != constants[0]), node, True
        node = graph.producer(value)
    scale = 1.0
    if node is not None and node.op_type in ("Mul", "Div") and not node.domain:
        factor = next((scalar(graph, i) for i in node.inputs[1:] if graph.is_constant(i)), None)
        if factor is None or factor == 0 or not only_reader(graph, value, reader):
            return None
        scale = factor if node.op_type == "Mul" else 1.0 / factor
        nodes.append(node)
        value, reader = node.inputs[0], node
        node = graph.producer(value)
    if node is None or not only_reader(graph, value, reader):
        return None
    if node.op_type == "FusedMatMul" and node.domain == MS:
        if any(node.attr(a, 0) for a in ("transA", "transBatchA", "transBatchB")):
            return None
        scale *= node.attr("alpha", 1.0)
    elif node.op_type != "MatMul" or node.domain:
        return None
    return nodes, node, scale, causal


def match_attention(graph: Graph, softmax: Node) -> _Site | None:
    """The attention block around `softmax`, if it is one the fused operator computes."""
    if softmax.op_type != "Softmax" or softmax.domain or opset(graph) < 13:
        return None
    scores_shape = shape(graph, softmax.inputs[0])
    if len(scores_shape) != 4 or softmax.attr("axis", -1) % 4 != 3:
        return None
    found = _scores(graph, softmax)
    if found is None:
        return None
    score_nodes, product, scale, causal = found
    k_transposed = product.op_type == "FusedMatMul" and product.attr("transB", 0)
    q = _heads(graph, product.inputs[0], product, _HEADS_PERM)
    k = _heads(graph, product.inputs[1], product, _HEADS_PERM if k_transposed else [0, 2, 3, 1])
    readers = graph.consumers(softmax.outputs[0])
    if q is None or k is None or len(readers) != 1 or graph.is_output(softmax.outputs[0]):
        return None
    context = readers[0]
    if context.op_type != "MatMul" or context.domain or context.inputs[0] != softmax.outputs[0]:
        return None
    v = _heads(graph, context.inputs[1], context, _HEADS_PERM)
    merge = graph.consumers(context.outputs[0])
    if v is None or len(merge) != 1 or graph.is_output(context.outputs[0]):
        return None
    merge_transpose = merge[0]
    if (
        merge_transpose.op_type != "Transpose"
        or list(merge_transpose.attr("perm", [])) != _HEADS_PERM
    ):
        return None
    merge_reshape = graph.consumers(merge_transpose.outputs[0])
    if len(merge_reshape) != 1 or merge_reshape[0].op_type != "Reshape":
        return None
    if graph.is_output(merge_transpose.outputs[0]) or merge_reshape[0].domain:
        return None
    projections = [_projection(graph, heads[0].inputs[0], heads[0]) for heads in (q, k, v)]
    if any(p is None for p in projections) or len({p.x for p in projections}) != 1:
        return None
    batch, seq, heads, head_size = shape(graph, q[0].outputs[0])
    x_shape = shape(graph, projections[0].x)
    if x_shape[:2] != (batch, seq) or any(
        shape(graph, h[0].outputs[0]) != (batch, seq, heads, head_size) for h in (k, v)
    ):
        return None
    if any(p.weight.shape[1] != heads * head_size for p in projections):
        return None
    output = merge_reshape[0].outputs[0]
    if int(np.prod(shape(graph, output))) != batch * seq * heads * head_size:
        return None
    nodes: dict[int, Node] = {}
    for node in (
        softmax,
        *score_nodes,
        product,
        *q,
        *k,
        context,
        *v,
        merge_transpose,
        merge_reshape[0],
        *(n for p in projections for n in p.nodes),
    ):
        nodes.setdefault(id(node), node)
    return _Site(
        nodes=tuple(nodes.values()),
        x=projections[0].x,
        output=output,
        weight=np.concatenate([p.weight for p in projections], axis=1),
        bias=np.concatenate([p.bias for p in projections]),
        heads=heads,
        scale=scale,
        causal=causal,
    )


class AttentionFusion(Rule):
    name = "attention-fusion"
    description = (
        "Softmax(scale * Q K^T [+ causal]) V over heads of x Wq + bq, x Wk + bk, x Wv + bv"
        " -> Attention(x, [Wq Wk Wv], [bq bk bv], num_heads, scale)"
    )
    portable = False
    anchor_ops = ("Softmax",)
    source_ops = {"MatMul": 5, "Add": 3, "Reshape": 4, "Transpose": 4, "Mul": 1, "Softmax": 1}
    target_ops = {"Attention": 1}

    def matches(self, graph: Graph, anchor: Node) -> Iterator[Match]:
        site = match_attention(graph, anchor)
        if site is not None:
            yield Match(site.nodes, {"x": site.x}, (site.output,))

    def rewrite(self, graph: Graph, match: Match) -> Replacement:
        site = match_attention(graph, match.nodes[0])
        emit = Emitter(graph)
        attrs = {"num_heads": site.heads, "scale": float(site.scale)}
        if site.causal:
            attrs["unidirectional"] = 1
        weight, bias = emit.const(site.weight, "weight"), emit.const(site.bias, "bias")
        out = graph.value(site.output)
        batch, seq = shape(graph, site.x)[:2]
        fused_shape = (batch, seq, site.weight.shape[1] // 3)
        if out.shape == fused_shape:
            return emit.result(
                emit.op("Attention", [site.x, weight, bias], domain=MS, like=[site.output], **attrs)
            )
        fused = emit.op("Attention", [site.x, weight, bias], domain=MS, **attrs)
        emit.values[fused] = Value(fused, out.dtype, fused_shape)
        target = emit.const(np.array(out.shape, np.int64), "shape")
        return emit.result(emit.op("Reshape", [fused, target]))

    def example(self, setting: int) -> onnx.ModelProto:
        return _example_block(setting, fused=False)


class AttentionFusionReverse(Rule):
    name = "attention-fusion-reverse"
    description = (
        "Attention(x, W, b, num_heads, scale) -> Softmax(scale * Q K^T [+ causal]) V over heads"
        " of x W + b"
    )
    anchor_ops = ("Attention",)
    source_ops = {"Attention": 1}
    target_ops = AttentionFusion.source_ops

    def matches(self, graph: Graph, anchor: Node) -> Iterator[Match]:
        if anchor.domain != MS or self._reason(graph, anchor) is not None:
            return
        yield Match((anchor,), {"x": anchor.inputs[0]}, (anchor.outputs[0],))

    @staticmethod
    def _reason(graph: Graph, node: Node) -> str | None:
        if len(node.present_inputs) != 3 or len([o for o in node.outputs if o]) != 1:
            return "the Attention has a mask, past state or extra outputs"
        weight, bias = graph.constant(node.inputs[1]), graph.constant(node.inputs[2])
        if weight is None or bias is None or weight.ndim != 2 or weight.shape[1] % 3:
            return "the weights are not a constant (E, 3 * hidden) matrix and bias"
        hidden = weight.shape[1] // 3
        sizes = node.attr("qkv_hidden_sizes")
        if sizes is not None and list(sizes) != [hidden] * 3:
            return "Q, K and V have different widths"
        if node.attr("do_rotary", 0) or node.attr("past_present_share_buffer", 0):
            return "rotary embeddings or a shared past buffer"
        if len(shape(graph, node.inputs[0])) != 3 or hidden % node.attr("num_heads"):
            return "the input is not (batch, sequence, hidden) over whole heads"
        return None

    def rewrite(self, graph: Graph, match: Match) -> Replacement:
        node = match.nodes[0]
        emit = Emitter(graph)
        x = match["x"]
        weight, bias = graph.constant(node.inputs[1]), graph.constant(node.inputs[2])
        hidden = weight.shape[1] // 3
        heads = node.attr("num_heads")
        batch, seq, _ = shape(graph, x)
        head_shape = emit.const(np.array([batch, seq, heads, hidden // heads], np.int64), "shape")
        parts = []
        for index, perm in enumerate((_HEADS_PERM, [0, 2, 3, 1], _HEADS_PERM)):
            columns = slice(index * hidden, (index + 1) * hidden)
            part = emit.op("MatMul", [x, emit.const(weight[:, columns], "weight")])
            part = emit.op("Add", [part, emit.const(bias[columns], "bias")])
            part = emit.op("Reshape", [part, head_shape])
            parts.append(emit.op("Transpose", [part], perm=perm))
        scale = node.attr("scale", 0.0) or (hidden // heads) ** -0.5
        scores = emit.op("MatMul", parts[:2])
        scores = emit.op("Mul", [scores, emit.const(np.array(scale, weight.dtype), "scale")])
        if node.attr("unidirectional", 0):
            masked = node.attr("mask_filter_value", -10000.0)  # the operator's own mask value
            mask = np.triu(np.full((seq, seq), masked, weight.dtype), k=1)
            scores = emit.op("Add", [scores, emit.const(mask, "mask")])
        context = emit.op("MatMul", [emit.op("Softmax", [scores], axis=-1), parts[2]])
        merged = emit.op("Transpose", [context], perm=_HEADS_PERM)
        out_shape = emit.const(np.array([batch, seq, hidden], np.int64), "shape")
        return emit.result(emit.op("Reshape", [merged, out_shape]))

    def example(self, setting: int) -> onnx.ModelProto:
        return _example_block(setting, fused=True)


def _example_block(setting: int, fused: bool) -> onnx.ModelProto:
    """One attention block at three shapes: as exported (MatMul + Add, Mul scale), causal
    with a Div scale, and as onnxruntime saves it (Gemm between reshapes, FusedMatMul)."""
    batch, seq, heads, head_size, embed = pick(
        setting, [(1, 5, 2, 3, 4), (2, 4, 3, 2, 6), (1, 6, 2, 4, 8)]
    )
    hidden = heads * head_size
    b = ModelBuilder(seed=setting)
    x = b.op("Neg", [b.input((batch, seq, embed))])
    causal = setting == 1
    if fused:
        attrs = {"num_heads": heads, "scale": 0.5}
        if causal:
            attrs["unidirectional"] = 1
        out = b.op(
            "Attention",
            [x, b.const((embed, 3 * hidden)), b.const((3 * hidden,))],
            domain=MS,
            **attrs,
        )
        return b.model(b.op("Relu", [out]))
    head_shape = b.const([batch, seq, heads, head_size], np.int64)

    def project(perm: list[int]) -> str:
        if setting == 2:
            flat = b.op("Reshape", [x, b.const([batch * seq, embed], np.int64)])
            h = b.op("Gemm", [flat, b.const((embed, hidden)), b.const((hidden,))])
        else:
            h = b.op("Add", [b.const((hidden,)), b.op("MatMul", [x, b.const((embed, hidden))])])
        return b.op("Transpose", [b.op("Reshape", [h, head_shape])], perm=perm)

    q = project([0, 2, 1, 3])
    if setting == 2:
        k = project([0, 2, 1, 3])
        scores = b.op("FusedMatMul", [q, k], domain=MS, alpha=0.35, transB=1)
    else:
        k = project([0, 2, 3, 1])
        product = b.op("MatMul", [q, k])
        scores = b.op(
            *(("Div", [product, b.const(2.0)]) if causal else ("Mul", [product, b.const(0.4)]))
        )
    if causal:
        scores = b.op("Add", [scores, b.const(np.triu(np.full((seq, seq), -1e9), k=1))])
    context = b.op("MatMul", [b.op("Softmax", [scores], axis=-1), project([0, 2, 1, 3])])
    merged = b.op("Transpose", [context], perm=[0, 2, 1, 3])
    flat = [batch * seq, hidden] if setting == 2 else [batch, seq, hidden]
    return b.model(b.op("Relu", [b.op("Reshape", [merged, b.const(flat, np.int64)])]))


RULES = [AttentionFusion(), AttentionFusionReverse()]

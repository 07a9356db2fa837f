"""MatMul rules: into Gemm and back, and into onnxruntime's FusedMatMul (contrib, not portable)
and back, each at one site, so that a search can keep or undo any one of ORT's fusions.

- Add(MatMul(a, b), c) -> Gemm(a, b, c)                   (a, b 2-D; c broadcasts to the result)
  and back, Gemm(a, b, c?) -> Add(MatMul(a, b), c)       (alpha = beta = 1)
- Add(MatMul(a, b), c) -> Reshape(Gemm(Reshape(a, [m, k]), b, c), [..., n])   (a not 2-D, b 2-D,
  c a vector: ORT's MatMulAddFusion on N-D inputs) and back, also where ORT's ReshapeFusion
  has merged a neighbouring Reshape into either end
- Mul(MatMul(a, b), s) -> FusedMatMul(a, b, alpha=s)      (s a constant scalar; also Div, and
  on a FusedMatMul already)
- MatMul(Mul(a, s), b) -> FusedMatMul(a, b, alpha=s)      (the scale on either input; also Div,
  and on a FusedMatMul; a scale read elsewhere too stays for its other readers)
- MatMul(Transpose(a), b) -> FusedMatMul(a, b, transA=1)  (the Transpose swaps the last two axes;
  one that does more keeps the rest: MatMul(q, Transpose(k, [0,2,3,1])) ->
  FusedMatMul(q, Transpose(k, [0,2,1,3]), transB=1))
- MatMul(a, Transpose(b)) -> FusedMatMul(a, b, transB=1)
- FusedMatMul(a, b) -> Mul(MatMul(Transpose?(a), Transpose?(b)), alpha)   (the reverse of all
  three FusedMatMul fusions)

FusedMatMul's alpha is computed in float32, as ORT's MatMulScaleFusion does, so that a fusion
here writes the attribute ORT would.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator

import numpy as np
import onnx
from onnx import helper

from rlflow.graph import Graph, Node
from rlflow.graph.domains import MS_DOMAIN as MS
from rlflow.rewrite.build import ModelBuilder
from rlflow.rewrite.rule import Emitter, Match, PatternRule, Replacement, both_ways
from rlflow.rewrite.rules.common import (
    FLOAT_TYPES,
    only_reader,
    pick,
    rank,
    scalar,
    shape,
    shape_const,
)


class MatMulAddToGemm(PatternRule):
    name = "matmul-add-to-gemm"
    description = "Add(MatMul(a, b), c) -> Gemm(a, b, c)"
    reverse_description = "Gemm(a, b, c) -> Add(MatMul(a, b), c)"
    pattern = "Add(MatMul(a, b), c)"
    reverse_pattern = "Gemm(a, b, c?)"
    target_ops = {"Gemm": 1}

    def check(self, graph: Graph, match: Match) -> str | None:
        if self.reverse:
            gemm = match.nodes[0]
            if gemm.attr("alpha", 1.0) != 1.0 or gemm.attr("beta", 1.0) != 1.0:
                return "Gemm scales by alpha or beta"
            return None
        for var in ("a", "b"):
            if rank(graph, match[var]) != 2:
                return f"MatMul input {var} has rank {rank(graph, match[var])}; Gemm needs rank 2"
        if graph.value(match["a"]).dtype not in FLOAT_TYPES:
            return "Gemm takes float types only"
        (m, _), (_, n) = shape(graph, match["a"]), shape(graph, match["b"])
        bias = shape(graph, match["c"])
        if len(bias) > 2 or np.broadcast_shapes(bias, (m, n)) != (m, n):
            return f"bias of shape {bias} does not broadcast to ({m}, {n})"
        return None

    def rewrite(self, graph: Graph, match: Match) -> Replacement:
        emit = Emitter(graph)
        a, b, c = match["a"], match["b"], match["c"]
        if not self.reverse:
            return emit.result(emit.op("Gemm", [a, b, c]))
        gemm = match.nodes[0]
        a = _transposed(emit, graph, a) if gemm.attr("transA", 0) else a
        b = _transposed(emit, graph, b) if gemm.attr("transB", 0) else b
        product = emit.op("MatMul", [a, b])
        return emit.result(emit.op("Add", [product, c]) if c else product)

    def example(self, setting: int) -> onnx.ModelProto:
        m, k, n = pick(setting, [(2, 3, 4), (1, 8, 5), (5, 1, 7)])
        b = ModelBuilder()
        x = b.input((m, k))
        if self.reverse:
            weight = b.const((n, k))
            return b.model(b.op("Gemm", [x, weight, b.const((n,))], transB=1))
        product = b.op("MatMul", [x, b.const((k, n))])
        return b.model(b.op("Add", [product, b.const(pick(setting, [(n,), (m, n), (1, n)]))]))


def _transposed(emit: Emitter, graph: Graph, name: str) -> str:
    """`name` with its last two axes swapped: a new constant if it is one, else a Transpose."""
    array = graph.constant(name)
    if array is not None:
        return emit.const(np.swapaxes(array, -1, -2), "weight")
    r = rank(graph, name)
    return emit.op("Transpose", [name], perm=[*range(r - 2), r - 1, r - 2])


def _scale_reason(graph: Graph, scale: str, a: str, b: str) -> str | None:
    """Why a Mul or Div by `scale` cannot join the product of `a` and `b` as FusedMatMul's
    alpha (None: it can)."""
    value = scalar(graph, scale)
    if value is None:
        return "the scale is not a constant scalar"
    if value == 0:
        return "the scale is zero"
    if rank(graph, a) < 2 or rank(graph, b) < 2:
        return "FusedMatMul needs inputs of rank 2 or more"
    if graph.value(a).dtype not in FLOAT_TYPES:
        return "FusedMatMul takes float types only"
    return None


def _scaled_product(emit: Emitter, matmul: Node, inputs: list[str], like: str, alpha: float) -> str:
    """`matmul` (a MatMul or FusedMatMul) on `inputs` as a FusedMatMul with `alpha`."""
    if matmul.op_type == "MatMul":
        return emit.op("FusedMatMul", inputs, domain=MS, like=[like], alpha=alpha)
    return emit.copy(matmul, inputs, like=like, alpha=alpha)


def _fused_alpha(node: Node, op_type: str, value: float) -> float:
    """The alpha of `node` (a MatMul or FusedMatMul) once a Mul or Div by `value` joins it,
    computed in float32 as ORT's MatMulScaleFusion does."""
    scale = np.float32(value) if op_type == "Mul" else np.float32(1) / np.float32(value)
    return float(np.float32(node.attr("alpha", 1.0)) * scale)


class MatMulAddToReshapedGemm(PatternRule):
    """ORT's MatMulAddFusion where the input is not a matrix: Gemm is 2-D only, so the input is
    flattened to (m, k) rows and the result given its N-D shape back.

    The reverse reads ORT's saved graphs as they are: its ReshapeFusion may have merged the
    head split after a projection into the output Reshape (ViT: Reshape to [1, 17, 4, 8]) or the
    Reshape before one into the input Reshape (the attention output, flattened from 4-D). The
    MatMul then takes the input as it is if its last axis is k, else in the N-D shape the output
    Reshape gives its rows; a result of another shape is reshaped to it.
    """

    name = "matmul-add-to-reshaped-gemm"
    description = "Add(MatMul(a, b), c) -> Reshape(Gemm(Reshape(a, [m, k]), b, c), [..., n])"
    reverse_description = "Reshape(Gemm(Reshape(x, [m, k]), b, c), s) -> Add(MatMul(x, b), c)"
    pattern = "Add(MatMul(a, b), c)"
    reverse_pattern = "Reshape(g=Gemm(r=Reshape(x, s1), b, c?), s2)"
    target_ops = {"Reshape": 2, "Gemm": 1}

    def check(self, graph: Graph, match: Match) -> str | None:
        if self.reverse:
            gemm = match.node("g")
            if gemm.attr("alpha", 1.0) != 1.0 or gemm.attr("beta", 1.0) != 1.0:
                return "Gemm scales by alpha or beta"
            if gemm.attr("transA", 0):
                return "Gemm transposes its input"
            if match["c"] and shape(graph, match["c"]) != shape(graph, match["g"])[-1:]:
                return "the bias is not a vector over the result's columns"
            return None
        if rank(graph, match["a"]) == 2:
            return "the input is a matrix (matmul-add-to-gemm's site)"
        if rank(graph, match["b"]) != 2:
            return "the weight is not a matrix"
        if graph.value(match["a"]).dtype not in FLOAT_TYPES:
            return "Gemm takes float types only"
        if shape(graph, match["c"]) != shape(graph, match["b"])[-1:]:
            return "the bias is not a vector over the result's last axis"
        return None

    def rewrite(self, graph: Graph, match: Match) -> Replacement:
        emit = Emitter(graph)
        if self.reverse:
            return self._unfused(emit, graph, match)
        a = match["a"]
        *lead, k = shape(graph, a)
        n = shape(graph, match["b"])[1]
        rows = emit.op("Reshape", [a, shape_const(emit, [math.prod(lead), k])])
        product = emit.op("Gemm", [rows, match["b"], match["c"]])
        return emit.result(emit.op("Reshape", [product, shape_const(emit, [*lead, n])]))

    def _unfused(self, emit: Emitter, graph: Graph, match: Match) -> Replacement:
        x, weight = match["x"], match["b"]
        m, k = shape(graph, match["r"])
        n = shape(graph, match["g"])[1]
        dims, out = shape(graph, x), shape(graph, match.outputs[0])
        if dims[-1:] == (k,) and math.prod(dims[:-1]) == m:
            lead = dims[:-1]
        else:
            lead = out[:-1] if out[-1:] == (n,) and math.prod(out[:-1]) == m else (m,)
            x = emit.op("Reshape", [x, shape_const(emit, [*lead, k])])
        if match.node("g").attr("transB", 0):
            weight = _transposed(emit, graph, weight)
        product = emit.op("MatMul", [x, weight])
        if match["c"]:
            product = emit.op("Add", [product, match["c"]])
        if (*lead, n) != out:
            product = emit.op("Reshape", [product, shape_const(emit, list(out))])
        return emit.result(product)

    def example(self, setting: int) -> onnx.ModelProto:
        b = ModelBuilder()
        if self.reverse:
            dims, weight, out, flags = pick(
                setting,
                [
                    ((1, 4, 6), (6, 5), (1, 4, 5), {}),
                    ((2, 3, 8), (4, 8), (2, 3, 2, 2), {"transB": 1}),
                    ((1, 4, 2, 3), (6, 5), (1, 4, 5), {}),
                ],
            )
            rows = math.prod(dims) // (weight[1] if flags else weight[0])
            flat = b.op("Reshape", [b.input(dims), b.const([rows, -1], np.int64)])
            bias = b.const((weight[0] if flags else weight[1],))
            product = b.op("Gemm", [flat, b.const(weight), bias], **flags)
            return b.model(b.op("Reshape", [product, b.const(list(out), np.int64)]))
        dims, n = pick(setting, [((1, 4, 6), 5), ((2, 3, 4, 8), 3), ((7,), 4)])
        product = b.op("MatMul", [b.input(dims), b.const((dims[-1], n))])
        return b.model(b.op("Add", [b.const((n,)), product]))


class MatMulScaleToFusedMatMul(PatternRule):
    name = "matmul-scale-to-fusedmatmul"
    description = "Mul(MatMul(a, b), s) -> FusedMatMul(a, b, alpha=s)"
    portable = False
    pattern = (
        "Mul(MatMul(a, b), s)",
        "Div(MatMul(a, b), s)",
        "Mul(com.microsoft.FusedMatMul(a, b), s)",
        "Div(com.microsoft.FusedMatMul(a, b), s)",
    )
    target_ops = {"FusedMatMul": 1}

    def check(self, graph: Graph, match: Match) -> str | None:
        if reason := _scale_reason(graph, match["s"], match["a"], match["b"]):
            return reason
        if len(shape(graph, match["s"])) > len(shape(graph, match.outputs[0])):
            return "the scale broadcasts the result to a higher rank"
        return None

    def rewrite(self, graph: Graph, match: Match) -> Replacement:
        matmul = match.nodes[1]
        alpha = _fused_alpha(matmul, match.nodes[0].op_type, scalar(graph, match["s"]))
        emit = Emitter(graph)
        inputs = [match["a"], match["b"]]
        return emit.result(_scaled_product(emit, matmul, inputs, match.outputs[0], alpha))

    def example(self, setting: int) -> onnx.ModelProto:
        dims = pick(setting, [((2, 3), (3, 4)), ((2, 4, 5, 3), (2, 4, 3, 5)), ((3, 6, 2), (2, 4))])
        b = ModelBuilder()
        product = b.op("MatMul", [b.input(dims[0]), b.input(dims[1])])
        op = pick(setting, ["Mul", "Div", "Mul"])
        return b.model(b.op(op, [product, b.const(0.125)]))


class MatMulInputScaleToFusedMatMul(PatternRule):
    """A constant scalar Mul or Div on either input of a MatMul moves into FusedMatMul's alpha
    (ORT's MatMulScaleFusion, input side). A scaled value read elsewhere too keeps its Mul for
    those readers, as ORT does."""

    name = "matmul-input-scale-to-fusedmatmul"
    description = "MatMul(Mul(a, s), b) -> FusedMatMul(a, b, alpha=s)"
    portable = False
    pattern = tuple(
        form.format(op=op, scaled=f"s={scale}(a, c)")
        for op in ("MatMul", "com.microsoft.FusedMatMul")
        for scale in ("Mul", "Div")
        for form in ("{op}({scaled}, b)", "{op}(b, {scaled})")
    )
    target_ops = {"FusedMatMul": 1}

    def matches(self, graph: Graph, anchor: Node) -> Iterator[Match]:
        for match in super().matches(graph, anchor):
            if only_reader(graph, match["s"], anchor):
                yield match
            else:
                yield dataclasses.replace(match, nodes=(anchor,), keep=(match.node("s"),))

    def check(self, graph: Graph, match: Match) -> str | None:
        if reason := _scale_reason(graph, match["c"], match["a"], match["b"]):
            return reason
        if shape(graph, match["s"]) != shape(graph, match["a"]):
            return "the scale broadcasts the input to another shape"
        return None

    def rewrite(self, graph: Graph, match: Match) -> Replacement:
        matmul = match.nodes[0]
        scale = match.keep[0] if match.keep else match.node("s")
        alpha = _fused_alpha(matmul, scale.op_type, scalar(graph, match["c"]))
        first = match.pattern_index % 2 == 0
        inputs = [match["a"], match["b"]] if first else [match["b"], match["a"]]
        emit = Emitter(graph)
        return emit.result(_scaled_product(emit, matmul, inputs, match.outputs[0], alpha))

    def example(self, setting: int) -> onnx.ModelProto:
        b = ModelBuilder()
        if setting == 1:  # 4-D, the divided operand second
            key = b.op("Div", [b.input((2, 3, 5, 4)), b.const(2.0)])
            return b.model(b.op("MatMul", [b.input((2, 3, 4, 5)), key]))
        scaled = b.op("Mul", [b.const(0.25), b.input((3, 4))])
        product = b.op("MatMul", [scaled, b.input((4, 2))])
        if setting == 2:  # the scaled value is read again: its Mul stays
            return b.model(product, b.op("Relu", [scaled]))
        return b.model(product)


class MatMulTransposeToFusedMatMul(PatternRule):
    """Folds the swap of the last two axes out of a Transpose feeding either operand (`side`
    "a" or "b") into FusedMatMul's transA / transB. A Transpose doing more than the swap (BERT's
    key, perm [0, 2, 3, 1]) keeps the rest, which leaves the last axis in place."""

    portable = False
    target_ops = {"FusedMatMul": 1}

    def check(self, graph: Graph, match: Match) -> str | None:
        if min(rank(graph, match["a"]), rank(graph, match["b"])) < 2:
            return "FusedMatMul needs inputs of rank 2 or more"
        matmul = match.nodes[0]
        if matmul.attr("transBatchA", 0) or matmul.attr("transBatchB", 0):
            return "the FusedMatMul already transposes batch axes"
        if self._rest(graph, match)[-1] != len(self._rest(graph, match)) - 1:
            return "the Transpose does not move the last axis to the second last"
        return None

    def _rest(self, graph: Graph, match: Match) -> list[int]:
        """The permutation left once the final swap is taken out."""
        r = rank(graph, match[self.side])
        perm = list(match.node("t").attr("perm", list(range(r))[::-1]))
        return perm[:-2] + [perm[-1], perm[-2]]

    def rewrite(self, graph: Graph, match: Match) -> Replacement:
        matmul = match.nodes[0]
        flag = "transA" if self.side == "a" else "transB"
        emit = Emitter(graph)
        rest = self._rest(graph, match)
        operand = match[self.side]
        if rest != list(range(len(rest))):
            operand = emit.op("Transpose", [operand], perm=rest)
        inputs = [operand, match["b"]] if self.side == "a" else [match["a"], operand]
        flags = {flag: 1 - matmul.attr(flag, 0)}
        fused = emit.copy(matmul, inputs, "FusedMatMul", MS, like=match.outputs[0], **flags)
        return emit.result(fused)

    def example(self, setting: int) -> onnx.ModelProto:
        dims, perm = pick(
            setting,
            [
                (((2, 3), (3, 4)), [1, 0]),
                (((2, 3, 5, 4), (2, 3, 4, 6)), [0, 2, 3, 1]),
                (((3, 6, 2), (2, 4)), [1, 0]),
            ],
        )
        b = ModelBuilder()
        operands = [b.input(dims[0]), b.input(dims[1])]
        index = 0 if self.side == "a" else 1
        wanted = dims[index]
        perm = (
            perm
            if len(perm) == len(wanted)
            else [*range(len(wanted) - 2), len(wanted) - 1, len(wanted) - 2]
        )
        source = [0] * len(wanted)
        for axis, moved in enumerate(perm):
            source[moved] = wanted[axis]
        operands[index] = b.op("Transpose", [b.input(source)], perm=perm)
        return b.model(b.op("MatMul", operands))


class MatMulTransposeAToFusedMatMul(MatMulTransposeToFusedMatMul):
    name = "matmul-transpose-a-to-fusedmatmul"
    description = "MatMul(Transpose(a), b) -> FusedMatMul(a, b, transA=1)"
    pattern = ("MatMul(t=Transpose(a), b)", "com.microsoft.FusedMatMul(t=Transpose(a), b)")
    side = "a"


class MatMulTransposeBToFusedMatMul(MatMulTransposeToFusedMatMul):
    name = "matmul-transpose-b-to-fusedmatmul"
    description = "MatMul(a, Transpose(b)) -> FusedMatMul(a, b, transB=1)"
    pattern = ("MatMul(a, t=Transpose(b))", "com.microsoft.FusedMatMul(a, t=Transpose(b))")
    side = "b"


class FusedMatMulToMatMul(PatternRule):
    """Every FusedMatMul back to plain ops, whichever fusion made it: the swaps of the last two
    axes become Transposes (a constant swapped in place), alpha a Mul by a scalar constant."""

    name = "fusedmatmul-to-matmul"
    description = "FusedMatMul(a, b) -> Mul(MatMul(Transpose?(a), Transpose?(b)), alpha)"
    pattern = "com.microsoft.FusedMatMul(a, b)"
    target_ops = {"MatMul": 1, "Mul": 1}

    def check(self, graph: Graph, match: Match) -> str | None:
        fused = match.nodes[0]
        if fused.attr("transBatchA", 0) or fused.attr("transBatchB", 0):
            return "the FusedMatMul transposes batch axes"
        for var, flag in (("a", "transA"), ("b", "transB")):
            if fused.attr(flag, 0) and rank(graph, match[var]) < 2:
                return f"{flag} on an input of rank {rank(graph, match[var])}"
        return None

    def rewrite(self, graph: Graph, match: Match) -> Replacement:
        fused = match.nodes[0]
        emit = Emitter(graph)
        a = _transposed(emit, graph, match["a"]) if fused.attr("transA", 0) else match["a"]
        b = _transposed(emit, graph, match["b"]) if fused.attr("transB", 0) else match["b"]
        product = emit.op("MatMul", [a, b])
        alpha = fused.attr("alpha", 1.0)
        if alpha != 1.0:
            dtype = helper.tensor_dtype_to_np_dtype(graph.value(match.outputs[0]).dtype)
            product = emit.op("Mul", [product, emit.const(np.array(alpha, dtype), "alpha")])
        return emit.result(product)

    def example(self, setting: int) -> onnx.ModelProto:
        b = ModelBuilder()
        if setting == 1:  # an attention score: 4-D, the key transposed, scaled
            q, k = b.input((2, 3, 5, 4)), b.input((2, 3, 5, 4))
            fused = b.op("FusedMatMul", [q, k], domain=MS, transB=1, alpha=0.5)
        elif setting == 2:  # a constant transposed operand: swapped in place
            fused = b.op("FusedMatMul", [b.const((3, 2)), b.input((3, 4))], domain=MS, transA=1)
        else:
            fused = b.op("FusedMatMul", [b.input((2, 3)), b.input((3, 4))], domain=MS, alpha=0.125)
        return b.model(fused)


RULES = [
    *both_ways(MatMulAddToGemm),
    MatMulScaleToFusedMatMul(),
    MatMulTransposeAToFusedMatMul(),
    MatMulTransposeBToFusedMatMul(),
    *both_ways(MatMulAddToReshapedGemm),
    MatMulInputScaleToFusedMatMul(),
    FusedMatMulToMatMul(),
]

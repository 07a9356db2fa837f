"""MatMul rules: into Gemm and back, and into onnxruntime's FusedMatMul (contrib, not portable).

- Add(MatMul(a, b), c) -> Gemm(a, b, c)                   (a, b 2-D; c broadcasts to the result)
  and back, Gemm(a, b, c?) -> Add(MatMul(a, b), c)       (alpha = beta = 1)
- Mul(MatMul(a, b), s) -> FusedMatMul(a, b, alpha=s)      (s a constant scalar; also Div, and
  on a FusedMatMul already)
- MatMul(Transpose(a), b) -> FusedMatMul(a, b, transA=1)  (the Transpose swaps the last two axes;
  one that does more keeps the rest: MatMul(q, Transpose(k, [0,2,3,1])) ->
  FusedMatMul(q, Transpose(k, [0,2,1,3]), transB=1))
- MatMul(a, Transpose(b)) -> FusedMatMul(a, b, transB=1)
"""

from __future__ import annotations

import numpy as np
import onnx

from rlflow.graph import Graph
from rlflow.graph.domains import MS_DOMAIN as MS
from rlflow.rewrite.build import ModelBuilder
from rlflow.rewrite.rule import Emitter, Match, PatternRule, Replacement, both_ways
from rlflow.rewrite.rules.common import FLOAT_TYPES, pick, rank, scalar, shape


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
    array = graph.constant(name)
    if array is not None:
        return emit.const(array.T, "weight")
    return emit.op("Transpose", [name], perm=[1, 0])


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
        value = scalar(graph, match["s"])
        if value is None:
            return "the scale is not a constant scalar"
        if value == 0:
            return "the scale is zero"
        if rank(graph, match["a"]) < 2 or rank(graph, match["b"]) < 2:
            return "FusedMatMul needs inputs of rank 2 or more"
        if len(shape(graph, match["s"])) > len(shape(graph, match.outputs[0])):
            return "the scale broadcasts the result to a higher rank"
        return None

    def rewrite(self, graph: Graph, match: Match) -> Replacement:
        value = scalar(graph, match["s"])
        matmul = match.nodes[1]
        alpha = matmul.attr("alpha", 1.0) * (
            value if match.nodes[0].op_type == "Mul" else 1 / value
        )
        emit = Emitter(graph)
        output = match.outputs[0]
        if matmul.op_type == "MatMul":
            return emit.result(
                emit.op(
                    "FusedMatMul", [match["a"], match["b"]], domain=MS, like=[output], alpha=alpha
                )
            )
        return emit.result(emit.copy(matmul, [match["a"], match["b"]], like=output, alpha=alpha))

    def example(self, setting: int) -> onnx.ModelProto:
        dims = pick(setting, [((2, 3), (3, 4)), ((2, 4, 5, 3), (2, 4, 3, 5)), ((3, 6, 2), (2, 4))])
        b = ModelBuilder()
        product = b.op("MatMul", [b.input(dims[0]), b.input(dims[1])])
        op = pick(setting, ["Mul", "Div", "Mul"])
        return b.model(b.op(op, [product, b.const(0.125)]))


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


RULES = [
    *both_ways(MatMulAddToGemm),
    MatMulScaleToFusedMatMul(),
    MatMulTransposeAToFusedMatMul(),
    MatMulTransposeBToFusedMatMul(),
]

"""Fusions of decomposed activations and normalisations into single operators, and back.

- 0.5 * x * (1 + Erf(x / sqrt 2)) -> Gelu(x)                                    (contrib)
- Gelu(Add(x, b)) -> BiasGelu(x, b)                                             (contrib)
- 0.5 * x * (1 + Tanh(sqrt(2/pi) * (x + 0.044715 x^3))) -> FastGelu(x)           (contrib)
- (x - mean(x)) / sqrt(mean((x - mean(x))^2) + eps) * g + b -> LayerNormalization  (opset 17)
- LayerNormalization(Add(a, b), g, beta?) -> SkipLayerNormalization(a, b, g, beta)  (contrib)
- SkipLayerNormalization(Add(a, c), b, ...) -> SkipLayerNormalization(a, b, ..., bias=c)
  (contrib; c a constant vector: with the rule above, ORT's SkipLayerNormFusion with a bias)

Each contrib fusion has a reverse that writes the plain ops again (Gelu in the erf form,
FastGelu in the tanh form, BiasGelu as Add + Gelu, SkipLayerNormalization as Adds +
LayerNormalization), matching what onnxruntime saves, so that a search starting from ORT's
optimised graph can undo a fusion at one site where it does not pay on this CPU.

Only exact forms are fused: FastGelu is not offered for the Erf form, which it only
approximates (verification would, rightly, reject it).
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
from rlflow.rewrite.rule import Emitter, Match, PatternRule, Replacement
from rlflow.rewrite.rules.common import FLOAT_TYPES, opset, pick, rank, scalar, shape


def _near(graph: Graph, name: str, wanted: float) -> bool:
    value = scalar(graph, name)
    return value is not None and math.isclose(value, wanted, rel_tol=1e-4)


_ERF = ("Erf(Div(x, s))", "Erf(Mul(x, s))")
_GELU_FORMS = (
    "Mul(Mul(x, Add({erf}, one)), half)",
    "Mul(x, Mul(Add({erf}, one), half))",
    "Mul(Mul(x, half), Add({erf}, one))",
)


class GeluFusion(PatternRule):
    name = "gelu-fusion"
    description = "0.5 * x * (1 + Erf(x / sqrt 2)) -> Gelu(x)"
    portable = False
    pattern = tuple(form.format(erf=erf) for form in _GELU_FORMS for erf in _ERF)
    target_ops = {"Gelu": 1}

    def check(self, graph: Graph, match: Match) -> str | None:
        divides = match.pattern_index % 2 == 0
        if not _near(graph, match["s"], math.sqrt(2) if divides else 1 / math.sqrt(2)):
            return "the Erf argument is not x / sqrt(2)"
        if not (_near(graph, match["one"], 1.0) and _near(graph, match["half"], 0.5)):
            return "the constants are not 1 and 0.5"
        if shape(graph, match["x"]) != shape(graph, match.outputs[0]):
            return "a constant broadcasts x to another shape"
        return None

    def rewrite(self, graph: Graph, match: Match) -> Replacement:
        emit = Emitter(graph)
        return emit.result(emit.op("Gelu", [match["x"]], domain=MS, like=[match.outputs[0]]))

    def example(self, setting: int) -> onnx.ModelProto:
        b = ModelBuilder()
        x = b.op("Neg", [b.input(pick(setting, [(2, 8), (1, 4, 6), (3, 2, 2, 5)]))])
        if setting % 2 == 0:
            erf = b.op("Erf", [b.op("Div", [x, b.const(math.sqrt(2))])])
        else:
            erf = b.op("Erf", [b.op("Mul", [x, b.const(1 / math.sqrt(2))])])
        inner = b.op("Add", [b.const(1.0), erf])
        if setting == 2:
            return b.model(b.op("Mul", [b.op("Mul", [x, b.const(0.5)]), inner]))
        return b.model(b.op("Mul", [b.op("Mul", [x, inner]), b.const(0.5)]))


class BiasGeluFusion(PatternRule):
    name = "bias-gelu-fusion"
    description = "Gelu(Add(x, b)) -> BiasGelu(x, b)"
    portable = False
    pattern = "com.microsoft.Gelu(Add(x, b))"
    target_ops = {"BiasGelu": 1}

    def check(self, graph: Graph, match: Match) -> str | None:
        bias, x = shape(graph, match["b"]), shape(graph, match["x"])
        if len(bias) != 1 or not x or bias[0] != x[-1]:
            return f"the bias {bias} is not a vector over the last axis of {x}"
        return None

    def rewrite(self, graph: Graph, match: Match) -> Replacement:
        emit = Emitter(graph)
        fused = emit.op("BiasGelu", [match["x"], match["b"]], domain=MS, like=[match.outputs[0]])
        return emit.result(fused)

    def example(self, setting: int) -> onnx.ModelProto:
        b = ModelBuilder()
        dims = pick(setting, [(2, 8), (1, 4, 6), (3, 2, 5)])
        biased = b.op("Add", [b.input(dims), b.const((dims[-1],))])
        return b.model(b.op("Gelu", [biased], domain=MS))


class FastGeluFusion(PatternRule):
    name = "fastgelu-fusion"
    description = "0.5 * x * (1 + Tanh(sqrt(2/pi) * (x + 0.044715 x^3))) -> FastGelu(x)"
    portable = False
    pattern = "Mul(Mul(x, half), Add(Tanh(Mul(Add(x, Mul(Pow(x, three), c1)), c2)), one))"
    target_ops = {"FastGelu": 1}

    def check(self, graph: Graph, match: Match) -> str | None:
        wanted = {
            "half": 0.5,
            "one": 1.0,
            "three": 3.0,
            "c1": 0.044715,
            "c2": math.sqrt(2 / math.pi),
        }
        for var, value in wanted.items():
            if not _near(graph, match[var], value):
                return f"constant {var} is not {value:.6g}"
        if shape(graph, match["x"]) != shape(graph, match.outputs[0]):
            return "a constant broadcasts x to another shape"
        return None

    def rewrite(self, graph: Graph, match: Match) -> Replacement:
        emit = Emitter(graph)
        return emit.result(emit.op("FastGelu", [match["x"]], domain=MS, like=[match.outputs[0]]))

    def example(self, setting: int) -> onnx.ModelProto:
        b = ModelBuilder()
        x = b.op("Neg", [b.input(pick(setting, [(2, 8), (1, 4, 6), (3, 2, 2, 5)]))])
        cube = b.op("Mul", [b.op("Pow", [x, b.const(3.0)]), b.const(0.044715)])
        inner = b.op("Mul", [b.op("Add", [x, cube]), b.const(math.sqrt(2 / math.pi))])
        plus = b.op("Add", [b.op("Tanh", [inner]), b.const(1.0)])
        return b.model(b.op("Mul", [b.op("Mul", [x, b.const(0.5)]), plus]))


class LayerNormFusion(PatternRule):
    name = "layernorm-fusion"
    description = "(x - mean) / sqrt(var + eps) * g + b -> LayerNormalization(x, g, b)"
    pattern = (
        "Add(Mul(Div(d=Sub(x, m=ReduceMean(x, a1?)),"
        "            Sqrt(Add(v=ReduceMean(Pow(d, two), a2?), eps))), gamma), beta)"
    )
    target_ops = {"LayerNormalization": 1}

    def check(self, graph: Graph, match: Match) -> str | None:
        if opset(graph) < 17:
            return f"LayerNormalization needs opset 17, the graph has {opset(graph)}"
        r = rank(graph, match["x"])
        for mean, axes in (("m", "a1"), ("v", "a2")):
            node = match.node(mean)
            listed = node.attr("axes") if not match[axes] else graph.constant(match[axes])
            if listed is None or [int(a) % r for a in np.ravel(listed)] != [r - 1]:
                return "a ReduceMean is not over the last axis only"
            if node.attr("keepdims", 1) != 1:
                return "a ReduceMean drops the reduced axis"
        if not _near(graph, match["two"], 2.0) or scalar(graph, match["eps"]) is None:
            return "not a variance: the power is not 2 or epsilon is not a constant"
        width = shape(graph, match["x"])[-1:]
        if shape(graph, match["gamma"]) != width or shape(graph, match["beta"]) != width:
            return f"scale and shift are not vectors of the last axis ({width[0]})"
        if graph.value(match["x"]).dtype not in FLOAT_TYPES:
            return "LayerNormalization takes float types only"
        return None

    def rewrite(self, graph: Graph, match: Match) -> Replacement:
        emit = Emitter(graph)
        fused = emit.op(
            "LayerNormalization",
            [match["x"], match["gamma"], match["beta"]],
            axis=-1,
            epsilon=scalar(graph, match["eps"]),
        )
        return emit.result(fused)

    def example(self, setting: int) -> onnx.ModelProto:
        version = pick(setting, [17, 18, 18])
        b = ModelBuilder(opset=version)
        dims = pick(setting, [(2, 8), (1, 4, 6), (3, 2, 5)])
        x = b.input(dims)

        def mean(value: str) -> str:
            if version >= 18:
                return b.op("ReduceMean", [value, b.const([-1], np.int64)])
            return b.op("ReduceMean", [value], axes=[-1])

        centred = b.op("Sub", [x, mean(x)])
        var = mean(b.op("Pow", [centred, b.const(2.0)]))
        normed = b.op("Div", [centred, b.op("Sqrt", [b.op("Add", [var, b.const(1e-5)])])])
        scaled = b.op("Mul", [normed, b.const((dims[-1],))])
        return b.model(b.op("Add", [scaled, b.const((dims[-1],))]))


class SkipLayerNormFusion(PatternRule):
    """The residual Add joins the LayerNormalization; if the sum is read elsewhere too, the
    fused op's fourth output (input_skip_bias_sum) stands for it."""

    name = "skip-layernorm-fusion"
    description = "LayerNormalization(Add(a, b), g, beta) -> SkipLayerNormalization(a, b, g, beta)"
    portable = False
    pattern = ("LayerNormalization(s=Add(a, b), gamma, beta?)",)
    exposed = ("s",)
    target_ops = {"SkipLayerNormalization": 1}

    def check(self, graph: Graph, match: Match) -> str | None:
        a, b = shape(graph, match["a"]), shape(graph, match["b"])
        if len(a) != 3 or a != b:
            return f"SkipLayerNormalization needs two 3-D inputs of one shape, not {a} and {b}"
        if match.nodes[0].attr("axis", -1) % 3 != 2:
            return "the LayerNormalization is not over the last axis"
        if shape(graph, match["gamma"]) != a[-1:]:
            return "the scale is not a vector of the last axis"
        if match["beta"] and shape(graph, match["beta"]) != a[-1:]:
            return "the shift is not a vector of the last axis"
        return None

    def rewrite(self, graph: Graph, match: Match) -> Replacement:
        layernorm, add = match.nodes
        output, total = match.outputs
        shared = any(node is not layernorm for node in graph.consumers(total))
        shared = shared or graph.is_output(total)
        emit = Emitter(graph)
        inputs = [match["a"], match["b"], match["gamma"], match["beta"]]
        epsilon = layernorm.attr("epsilon", 1e-5)
        fused = _skip_layernorm(emit, inputs, epsilon, output, total if shared else "")
        return emit.result(fused[0], fused[1] if shared else total)

    def example(self, setting: int) -> onnx.ModelProto:
        b = ModelBuilder()
        dims = pick(setting, [(1, 4, 8), (2, 3, 6), (1, 5, 4)])
        total = b.op("Add", [b.input(dims), b.op("Neg", [b.input(dims)])])
        normed = b.op(
            "LayerNormalization", [total, b.const((dims[-1],)), b.const((dims[-1],))], epsilon=1e-5
        )
        if setting == 1:  # the sum is read again downstream, as in a pre-LN residual stream
            return b.model(b.op("Add", [normed, total]))
        return b.model(normed)


def _skip_layernorm(
    emit: Emitter, inputs: list[str], epsilon: float, output: str, total: str = ""
) -> list[str]:
    """A SkipLayerNormalization standing for `output`, and for the sum `total` (input + skip +
    bias) as its fourth output if one is given; returns the new names of those."""
    if not total:
        fused = emit.op("SkipLayerNormalization", inputs, domain=MS, like=[output], epsilon=epsilon)
        return [fused]
    fused, _, _, new_total = emit.op(
        "SkipLayerNormalization",
        inputs,
        outputs=4,
        domain=MS,
        like=[output, "", "", total],
        epsilon=epsilon,
    )
    return [fused, new_total]


def _with_sum(graph: Graph, matches: Iterator[Match]) -> Iterator[Match]:
    """Matches anchored at a SkipLayerNormalization, with its sum output among the values the
    rewrite replaces where something reads it."""
    for match in matches:
        fused = match.nodes[0]
        total = fused.outputs[3] if len(fused.outputs) > 3 else ""
        if total and (graph.consumers(total) or graph.is_output(total)):
            match = dataclasses.replace(match, outputs=(*match.outputs, total))
        yield match


def _typed(emit: Emitter, graph: Graph, like: str, value: float) -> str:
    """A scalar constant of `like`'s element type."""
    dtype = helper.tensor_dtype_to_np_dtype(graph.value(like).dtype)
    return emit.const(np.array(value, dtype))


_SLN_EPSILON = 1e-12
"""SkipLayerNormalization's epsilon where the attribute is absent (its schema's default)."""


class SkipLayerNormBiasFusion(PatternRule):
    """A constant vector added to either input of a SkipLayerNormalization becomes its bias
    input: with skip-layernorm-fusion first, ORT's SkipLayerNormFusion of LayerNormalization(
    Add(Add(a, c), b)) (its formats 1 and 2: a projection's bias before the residual Add), here
    a second step so that each site can take the bias or leave it."""

    name = "skip-layernorm-bias-fusion"
    description = (
        "SkipLayerNormalization(Add(a, c), b, g, beta) -> SkipLayerNormalization(a, b, g, beta, c)"
    )
    portable = False
    pattern = (
        "com.microsoft.SkipLayerNormalization(Add(a, c), b, gamma, beta?)",
        "com.microsoft.SkipLayerNormalization(b, Add(a, c), gamma, beta?)",
    )
    target_ops = {"SkipLayerNormalization": 1}

    def matches(self, graph: Graph, anchor: Node) -> Iterator[Match]:
        return _with_sum(graph, super().matches(graph, anchor))

    def check(self, graph: Graph, match: Match) -> str | None:
        width = shape(graph, match["a"])[-1:]
        if not graph.is_constant(match["c"]) or shape(graph, match["c"]) != width:
            return f"the addend is not a constant vector of the last axis {width}"
        if len(shape(graph, match["a"])) != 3:
            return "the biased input is not 3-D"
        return None

    def rewrite(self, graph: Graph, match: Match) -> Replacement:
        fused = match.nodes[0]
        pair = [match["a"], match["b"]] if match.pattern_index == 0 else [match["b"], match["a"]]
        inputs = [*pair, match["gamma"], match["beta"], match["c"]]
        epsilon = fused.attr("epsilon", _SLN_EPSILON)
        emit = Emitter(graph)
        return emit.result(*_skip_layernorm(emit, inputs, epsilon, *match.outputs))

    def example(self, setting: int) -> onnx.ModelProto:
        b = ModelBuilder()
        dims = pick(setting, [(1, 4, 8), (2, 3, 6), (1, 5, 4)])
        biased = b.op("Add", [b.input(dims), b.const((dims[-1],))])
        skip = b.op("Neg", [b.input(dims)])
        pair = [biased, skip] if setting != 1 else [skip, biased]
        params = [b.const((dims[-1],))] + ([b.const((dims[-1],))] if setting != 1 else [])
        outputs = 4 if setting == 2 else 1
        fused = b.op("SkipLayerNormalization", [*pair, *params], outputs, MS, epsilon=1e-5)
        if setting == 2:  # the sum is read again downstream, as in a pre-LN residual stream
            return b.model(b.op("Add", [fused[0], fused[3]]))
        return b.model(fused)


class SkipLayerNormUnfusion(PatternRule):
    """A SkipLayerNormalization, ORT's or ours, back to its Adds (the bias first, as in ORT's
    format 1) and a LayerNormalization; its sum output, if read, is the residual Add's."""

    name = "skip-layernorm-fusion-reverse"
    description = (
        "SkipLayerNormalization(a, b, g, beta, bias) -> "
        "LayerNormalization(Add(Add(a, bias), b), g, beta)"
    )
    pattern = "com.microsoft.SkipLayerNormalization(a, b, gamma, beta?, bias?)"
    target_ops = {"Add": 1, "LayerNormalization": 1}

    def matches(self, graph: Graph, anchor: Node) -> Iterator[Match]:
        return _with_sum(graph, super().matches(graph, anchor))

    def check(self, graph: Graph, match: Match) -> str | None:
        if opset(graph) < 17:
            return f"LayerNormalization needs opset 17, the graph has {opset(graph)}"
        width = shape(graph, match.outputs[0])[-1:]
        for var in ("gamma", "beta"):
            if match[var] and shape(graph, match[var]) != width:
                return f"{var} is not a vector of the last axis {width}"
        return None

    def rewrite(self, graph: Graph, match: Match) -> Replacement:
        emit = Emitter(graph)
        first = match["a"]
        if match["bias"]:
            first = emit.op("Add", [first, match["bias"]])
        total = emit.op("Add", [first, match["b"]])
        epsilon = match.nodes[0].attr("epsilon", _SLN_EPSILON)
        params = [match["gamma"], match["beta"]]
        normed = emit.op("LayerNormalization", [total, *params], axis=-1, epsilon=epsilon)
        return emit.result(*(normed, total)[: len(match.outputs)])

    def example(self, setting: int) -> onnx.ModelProto:
        b = ModelBuilder()
        dims = pick(setting, [(1, 4, 8), (2, 3, 6), (1, 5, 4)])
        inputs = [b.input(dims), b.op("Neg", [b.input(dims)]), b.const((dims[-1],))]
        inputs += [b.const((dims[-1],)) for _ in range(2 if setting == 1 else 1)]  # beta, bias
        outputs = 4 if setting == 2 else 1
        fused = b.op("SkipLayerNormalization", inputs, outputs, MS, epsilon=1e-5)
        if setting == 2:
            return b.model(b.op("Add", [fused[0], fused[3]]))
        return b.model(fused)


class GeluToErfForm(PatternRule):
    """ORT's Gelu back to the erf form that PyTorch exports (and gelu-fusion matches)."""

    name = "gelu-fusion-reverse"
    description = "Gelu(x) -> 0.5 * x * (1 + Erf(x / sqrt 2))"
    pattern = "com.microsoft.Gelu(x)"
    target_ops = {"Div": 1, "Erf": 1, "Add": 1, "Mul": 2}

    def rewrite(self, graph: Graph, match: Match) -> Replacement:
        emit = Emitter(graph)
        x = match["x"]
        erf = emit.op("Erf", [emit.op("Div", [x, _typed(emit, graph, x, math.sqrt(2))])])
        inner = emit.op("Add", [erf, _typed(emit, graph, x, 1.0)])
        product = emit.op("Mul", [x, inner])
        return emit.result(emit.op("Mul", [product, _typed(emit, graph, x, 0.5)]))

    def example(self, setting: int) -> onnx.ModelProto:
        b = ModelBuilder()
        x = b.op("Neg", [b.input(pick(setting, [(2, 8), (1, 4, 6), (3, 2, 2, 5)]))])
        return b.model(b.op("Gelu", [x], domain=MS))


class BiasGeluToAddGelu(PatternRule):
    name = "bias-gelu-fusion-reverse"
    description = "BiasGelu(x, b) -> Gelu(Add(x, b))"
    portable = False
    pattern = "com.microsoft.BiasGelu(x, b)"
    target_ops = {"Add": 1, "Gelu": 1}

    def rewrite(self, graph: Graph, match: Match) -> Replacement:
        emit = Emitter(graph)
        biased = emit.op("Add", [match["x"], match["b"]])
        return emit.result(emit.op("Gelu", [biased], domain=MS, like=[match.outputs[0]]))

    def example(self, setting: int) -> onnx.ModelProto:
        b = ModelBuilder()
        dims = pick(setting, [(2, 8), (1, 4, 6), (3, 2, 5)])
        return b.model(b.op("BiasGelu", [b.input(dims), b.const((dims[-1],))], domain=MS))


class FastGeluToTanhForm(PatternRule):
    """ORT's FastGelu back to the tanh form that fastgelu-fusion matches, its bias (if any) an
    Add before it."""

    name = "fastgelu-fusion-reverse"
    description = "FastGelu(x) -> 0.5 * x * (1 + Tanh(sqrt(2/pi) * (x + 0.044715 x^3)))"
    pattern = "com.microsoft.FastGelu(x, bias?)"
    target_ops = {"Mul": 4, "Pow": 1, "Add": 2, "Tanh": 1}

    def rewrite(self, graph: Graph, match: Match) -> Replacement:
        emit = Emitter(graph)
        x = match["x"]
        if match["bias"]:
            x = emit.op("Add", [x, match["bias"]])

        def const(value: float) -> str:
            return _typed(emit, graph, match.outputs[0], value)

        cube = emit.op("Mul", [emit.op("Pow", [x, const(3.0)]), const(0.044715)])
        inner = emit.op("Mul", [emit.op("Add", [x, cube]), const(math.sqrt(2 / math.pi))])
        plus = emit.op("Add", [emit.op("Tanh", [inner]), const(1.0)])
        return emit.result(emit.op("Mul", [emit.op("Mul", [x, const(0.5)]), plus]))

    def example(self, setting: int) -> onnx.ModelProto:
        b = ModelBuilder()
        dims = pick(setting, [(2, 8), (1, 4, 6), (3, 2, 5)])
        inputs = [b.op("Neg", [b.input(dims)])]
        if setting == 1:
            inputs.append(b.const((dims[-1],)))
        return b.model(b.op("FastGelu", inputs, domain=MS))


RULES = [
    GeluFusion(),
    BiasGeluFusion(),
    FastGeluFusion(),
    LayerNormFusion(),
    SkipLayerNormFusion(),
    SkipLayerNormBiasFusion(),
    SkipLayerNormUnfusion(),
    GeluToErfForm(),
    BiasGeluToAddGelu(),
    FastGeluToTanhForm(),
]

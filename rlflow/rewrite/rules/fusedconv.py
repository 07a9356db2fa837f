"""Fusions of a Conv and what follows it into onnxruntime's FusedConv, and back.

- Relu(Conv(x, w, b?)) -> FusedConv(x, w, b, activation=Relu)         (contrib: there is no
  conv-with-activation op in plain ONNX, so this one has no portable variant)
- Relu(Add(Conv(x, w, b?), z)) -> FusedConv(x, w, b, z, activation=Relu)  (contrib; the sum input)
- Act(Conv(x, w, b?)) -> FusedConv(x, w, b, activation=Act, activation_params=...)  (contrib;
  the rest of ORT's ConvActivationFusion on CPU: Sigmoid, Tanh, LeakyRelu, Clip, HardSigmoid)
- FusedConv(x, w, b?, z?) -> Act(Add?(Conv(x, w, b), z))              (back, whichever made it:
  ORT's fusion is not always the faster choice, so a search must be able to undo it per site)
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper

from rlflow.graph import Graph
from rlflow.graph.domains import MS_DOMAIN as MS
from rlflow.rewrite.build import ModelBuilder
from rlflow.rewrite.rule import Emitter, Match, PatternRule, Replacement
from rlflow.rewrite.rules.common import example_conv, opset, pick, scalar, shape


def _fusedconv_reason(graph: Graph, x: str) -> str | None:
    """Why a Conv of `x` is not fused into a FusedConv here (None: it is)."""
    if len(shape(graph, x)) != 4:
        return "FusedConv takes 2-D convolutions (rank-4 input) only"
    return None


class ConvReluToFusedConv(PatternRule):
    name = "conv-relu-to-fusedconv"
    description = "Relu(Conv(x, w, b)) -> FusedConv(x, w, b, activation=Relu)"
    portable = False
    pattern = "Relu(Conv(x, w, b?))"
    target_ops = {"FusedConv": 1}

    def check(self, graph: Graph, match: Match) -> str | None:
        return _fusedconv_reason(graph, match["x"])

    def rewrite(self, graph: Graph, match: Match) -> Replacement:
        emit = Emitter(graph)
        inputs = [match["x"], match["w"], match["b"]]
        return emit.result(
            emit.copy(
                match.nodes[1], inputs, "FusedConv", MS, like=match.outputs[0], activation="Relu"
            )
        )

    def example(self, setting: int) -> onnx.ModelProto:
        b = ModelBuilder()
        return b.model(b.op("Relu", [example_conv(setting, b)]))


class ConvAddReluToFusedConv(PatternRule):
    name = "conv-add-relu-to-fusedconv"
    description = "Relu(Add(Conv(x, w, b), z)) -> FusedConv(x, w, b, z, activation=Relu)"
    portable = False
    pattern = "Relu(Add(c=Conv(x, w, b?), z))"
    target_ops = {"FusedConv": 1}

    def check(self, graph: Graph, match: Match) -> str | None:
        if reason := _fusedconv_reason(graph, match["x"]):
            return reason
        if shape(graph, match["z"]) != shape(graph, match["c"]):
            return "the added value does not have the Conv's output shape"
        return None

    def rewrite(self, graph: Graph, match: Match) -> Replacement:
        emit = Emitter(graph)
        inputs = [match["x"], match["w"], match["b"], match["z"]]
        return emit.result(
            emit.copy(
                match.node("c"), inputs, "FusedConv", MS, like=match.outputs[0], activation="Relu"
            )
        )

    def example(self, setting: int) -> onnx.ModelProto:
        b = ModelBuilder()
        conv = example_conv(setting, b)
        other = b.op("Neg", [example_conv(setting, b)])
        return b.model(b.op("Relu", [b.op("Add", [conv, other])]))


_FLOAT32 = np.finfo(np.float32)


class ConvActivationToFusedConv(PatternRule):
    """The activations ORT's ConvActivationFusion takes on CPU besides Relu (which keeps its own
    rule), with their parameters as FusedConv's activation_params: LeakyRelu [alpha], Clip
    [min, max] (constant bounds; an absent one is float32's extreme), HardSigmoid [alpha, beta]."""

    name = "conv-activation-to-fusedconv"
    description = "Act(Conv(x, w, b)) -> FusedConv(x, w, b, activation=Act, activation_params)"
    portable = False
    pattern = (
        "Sigmoid(Conv(x, w, b?))",
        "Tanh(Conv(x, w, b?))",
        "LeakyRelu(Conv(x, w, b?))",
        "Clip(Conv(x, w, b?), low?, high?)",
        "HardSigmoid(Conv(x, w, b?))",
    )
    target_ops = {"FusedConv": 1}
    settings = 5

    def check(self, graph: Graph, match: Match) -> str | None:
        if graph.value(match["x"]).dtype != onnx.TensorProto.FLOAT:
            return "FusedConv runs on float32 only on CPU"
        if match.nodes[0].op_type == "Clip" and self._params(graph, match) is None:
            return "the Clip bounds are not constants"
        return _fusedconv_reason(graph, match["x"])

    @staticmethod
    def _params(graph: Graph, match: Match) -> list[float] | None:
        act = match.nodes[0]
        if act.op_type == "LeakyRelu":
            return [act.attr("alpha", 0.01)]
        if act.op_type == "HardSigmoid":
            return [act.attr("alpha", 0.2), act.attr("beta", 0.5)]
        if act.op_type != "Clip":
            return []
        bounds = [float(_FLOAT32.min), float(_FLOAT32.max)]
        for index, (var, attr) in enumerate((("low", "min"), ("high", "max"))):
            if act.attr(attr) is not None:  # Clip before opset 11
                bounds[index] = act.attr(attr)
            elif match[var]:
                bounds[index] = scalar(graph, match[var])
        return None if None in bounds else bounds

    def rewrite(self, graph: Graph, match: Match) -> Replacement:
        params = self._params(graph, match)
        extra = {"activation_params": params} if params else {}
        emit = Emitter(graph)
        inputs = [match["x"], match["w"], match["b"]]
        fused = emit.copy(
            match.nodes[1],
            inputs,
            "FusedConv",
            MS,
            like=match.outputs[0],
            activation=match.nodes[0].op_type,
            **extra,
        )
        return emit.result(fused)

    def example(self, setting: int) -> onnx.ModelProto:
        b = ModelBuilder()
        conv = example_conv(setting, b)
        act, inputs, attrs = [
            ("Sigmoid", [], {}),
            ("Tanh", [], {}),
            ("LeakyRelu", [], {"alpha": 0.1}),
            ("Clip", [b.const(0.0), b.const(6.0)], {}),
            ("HardSigmoid", [], {"alpha": 0.3}),
        ][setting % 5]
        return b.model(b.op(act, [conv, *inputs], **attrs))


class FusedConvToConv(PatternRule):
    """A FusedConv, ORT's or ours, back to Conv, the Add of its sum input if any, and its
    activation as the ONNX op with the parameters spelled out."""

    name = "fusedconv-to-conv"
    description = "FusedConv(x, w, b, z, activation=Act) -> Act(Add(Conv(x, w, b), z))"
    pattern = "com.microsoft.FusedConv(x, w, b?, z?)"
    target_ops = {"Conv": 1, "Relu": 1}
    settings = 6

    _PARAMS = {"Relu": 0, "Sigmoid": 0, "Tanh": 0, "LeakyRelu": 1, "Clip": 2, "HardSigmoid": 2}

    def check(self, graph: Graph, match: Match) -> str | None:
        fused = match.nodes[0]
        act, params = fused.attr("activation"), fused.attr("activation_params", [])
        if act not in self._PARAMS:
            return f"activation {act!r} is not one ORT fuses"
        if len(params) != self._PARAMS[act]:
            return f"{act} takes {self._PARAMS[act]} activation_params, not {len(params)}"
        if act == "Clip" and opset(graph) < 11:
            return "Clip takes its bounds as inputs from opset 11 only"
        return None

    def rewrite(self, graph: Graph, match: Match) -> Replacement:
        fused = match.nodes[0]
        act, params = fused.attr("activation"), list(fused.attr("activation_params", []))
        emit = Emitter(graph)
        inputs = [match["x"], match["w"], match["b"]]
        value = emit.copy(fused, inputs, "Conv", "", activation=None, activation_params=None)
        if match["z"]:
            value = emit.op("Add", [value, match["z"]])
        if act == "Clip":
            dtype = helper.tensor_dtype_to_np_dtype(graph.value(match["x"]).dtype)
            bounds = [emit.const(np.array(bound, dtype), "bound") for bound in params]
            return emit.result(emit.op("Clip", [value, *bounds]))
        names = {"LeakyRelu": ["alpha"], "HardSigmoid": ["alpha", "beta"]}.get(act, [])
        return emit.result(emit.op(act, [value], **dict(zip(names, params, strict=True))))

    def example(self, setting: int) -> onnx.ModelProto:
        b = ModelBuilder()
        n, c, hw, k, out = pick(setting, [(1, 3, 8, 3, 4), (2, 4, 5, 1, 6), (1, 2, 7, 5, 3)])
        act, params = [
            ("Relu", []),
            ("Clip", [0.0, 6.0]),
            ("LeakyRelu", [0.1]),
            ("HardSigmoid", [0.2, 0.5]),
            ("Sigmoid", []),
            ("Tanh", []),
        ][setting % 6]
        extra = {"activation_params": params} if params else {}
        bias = b.const((out,)) if setting % 3 != 2 else ""
        inputs = [b.input((n, c, hw, hw)), b.const((out, c, k, k)), bias]
        if setting % 2:  # the sum input of a residual block
            inputs.append(b.input((n, out, hw, hw)))
        fused = b.op("FusedConv", inputs, domain=MS, activation=act, pads=[k // 2] * 4, **extra)
        return b.model(fused)

"""ONNX models for the interface tests: a builder, the issue's cases, and random graphs.

`random_case(seed)` draws a small graph from the zoo's operator set (Conv, BatchNormalization,
MaxPool, AveragePool, GlobalAveragePool, Flatten, Gemm, MatMul, Add, Mul, Div, Erf, Tanh, Relu,
Softmax, LayerNormalization, Gather, Reshape, Transpose, Split, Concat, Unsqueeze), with, by
chance, weights listed among the inputs (IR 8, or IR 3 at opset 9), a symbolic batch dim (and
sequence dim), integer token ids, and scalar float, int and bool inputs. Every case knows the
valid range of its integer inputs, so that a test can feed it without rlflow's help.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

Dims = Sequence[int | str | None]


@dataclass
class Case:
    """A model, the `--input-shape` sizes of its dynamic dims, its integer inputs' ranges."""

    name: str
    model: onnx.ModelProto
    sizes: dict[str, int] = field(default_factory=dict)
    """Symbol -> the size it is optimised at."""
    int_ranges: dict[str, tuple[int, int]] = field(default_factory=dict)

    def input_shapes(self, sizes: dict[str, int] | None = None) -> dict[str, tuple[int, ...]]:
        """Each input's concrete shape (weights listed as inputs aside) at `sizes`."""
        sizes = {**self.sizes, **(sizes or {})}
        weights = {t.name for t in self.model.graph.initializer}
        shapes = {}
        for info in self.model.graph.input:
            if info.name in weights:
                continue
            dims = info.type.tensor_type.shape.dim
            shapes[info.name] = tuple(
                d.dim_value if d.HasField("dim_value") else sizes[d.dim_param] for d in dims
            )
        return shapes

    def shape_flags(self) -> list[str]:
        """`--input-shape` flags for every input with a dynamic dim."""
        flags = []
        for info in self.model.graph.input:
            dims = info.type.tensor_type.shape.dim
            if any(not d.HasField("dim_value") for d in dims):
                text = "x".join(map(str, self.input_shapes()[info.name]))
                flags += ["--input-shape", f"{info.name}={text}"]
        return flags


def build(
    nodes: list[onnx.NodeProto],
    inputs: Sequence[tuple[str, int, Dims]],
    outputs: Sequence[tuple[str, int, Dims]],
    weights: dict[str, np.ndarray] | None = None,
    *,
    listed: Sequence[str] = (),
    ir_version: int = 8,
    opset: int = 18,
) -> onnx.ModelProto:
    """A checked model; the weights in `listed` are listed among its inputs too."""
    weights = weights or {}
    declared = [helper.make_tensor_value_info(n, t, d) for n, t, d in inputs]
    declared += [
        helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)
        for n, a in weights.items()
        if n in listed
    ]
    graph = helper.make_graph(
        nodes,
        "case",
        declared,
        [helper.make_tensor_value_info(n, t, d) for n, t, d in outputs],
        initializer=[numpy_helper.from_array(a, n) for n, a in weights.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = ir_version
    onnx.checker.check_model(model, full_check=True)
    return model


F = TensorProto.FLOAT


def _weights(seed: int, **shapes: tuple[int, ...]) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {name: rng.standard_normal(shape).astype(np.float32) for name, shape in shapes.items()}


def mlp(
    x_dims: Dims = (2, 8), y_dims: Dims = (2, 4), *, listed: Sequence[str] = (), **kw
) -> onnx.ModelProto:
    """y = Relu(x @ w + b): the issue's fixed-shape, dynamic-dim and weights-as-inputs cases."""
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["h"]),
        helper.make_node("Add", ["h", "b"], ["a"]),
        helper.make_node("Relu", ["a"], ["y"]),
    ]
    return build(
        nodes,
        [("x", F, x_dims)],
        [("y", F, y_dims)],
        _weights(0, w=(8, 4), b=(4,)),
        listed=listed,
        **kw,
    )


def conv_bn(*, listed: Sequence[str] = (), **kw) -> onnx.ModelProto:
    """y = BatchNormalization(Conv(x, w)): a fold every search makes, unless its weights are
    inputs a caller may override."""
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("BatchNormalization", ["c", "scale", "bias", "mean", "var"], ["y"]),
    ]
    weights = _weights(3, w=(4, 3, 3, 3), scale=(4,), bias=(4,), mean=(4,))
    weights["var"] = np.abs(_weights(4, var=(4,))["var"]) + np.float32(0.5)
    io = [("x", F, [1, 3, 8, 8])], [("y", F, [1, 4, 8, 8])]
    return build(nodes, *io, weights, listed=listed, **kw)


def flatten_by_shape() -> onnx.ModelProto:
    """x[N,2,4] -> Reshape(x, [Shape(x)[0], -1]) @ w: loading folds the shape into [n, 8], so the
    result is specialised to the batch size it was given."""
    nodes = [
        helper.make_node("Shape", ["x"], ["shape"]),
        helper.make_node("Gather", ["shape", "zero"], ["n"], axis=0),
        helper.make_node("Unsqueeze", ["n", "axis0"], ["n1"]),
        helper.make_node("Concat", ["n1", "minus_one"], ["target"], axis=0),
        helper.make_node("Reshape", ["x", "target"], ["flat"]),
        helper.make_node("MatMul", ["flat", "w"], ["y"]),
    ]
    weights = {
        "zero": np.array(0, np.int64),
        "axis0": np.array([0], np.int64),
        "minus_one": np.array([-1], np.int64),
        **_weights(1, w=(8, 4)),
    }
    return build(nodes, [("x", F, ["N", 2, 4])], [("y", F, ["N", 4])], weights)


def embedding(rows: int = 1000) -> onnx.ModelProto:
    """y = Gather(emb, ids) @ w: token ids index a table of `rows` rows."""
    nodes = [
        helper.make_node("Gather", ["emb", "ids"], ["e"]),
        helper.make_node("MatMul", ["e", "w"], ["y"]),
    ]
    weights = _weights(2, emb=(rows, 8), w=(8, 4))
    return build(nodes, [("ids", TensorProto.INT64, [2, 5])], [("y", F, [2, 5, 4])], weights)


def scalars() -> onnx.ModelProto:
    """y = Where(flag, x * float(k), x): rank-0 int and bool inputs."""
    nodes = [
        helper.make_node("Cast", ["k"], ["kf"], to=F),
        helper.make_node("Mul", ["x", "kf"], ["scaled"]),
        helper.make_node("Where", ["flag", "scaled", "x"], ["y"]),
    ]
    inputs = [("x", F, [2, 3]), ("k", TensorProto.INT64, []), ("flag", TensorProto.BOOL, [])]
    return build(nodes, inputs, [("y", F, [2, 3])])


# ---- random graphs ------------------------------------------------------------------------------


class _Graph:
    """A graph being drawn: nodes, weights, fresh names."""

    def __init__(self, rng: np.random.Generator) -> None:
        self.rng = rng
        self.nodes: list[onnx.NodeProto] = []
        self.weights: dict[str, np.ndarray] = {}
        self.count = 0

    def name(self, prefix: str) -> str:
        self.count += 1
        return f"{prefix}{self.count}"

    def weight(self, shape: tuple[int, ...], positive: bool = False) -> str:
        name = self.name("w")
        array = self.rng.standard_normal(shape).astype(np.float32) * np.float32(0.5)
        self.weights[name] = np.abs(array) + np.float32(0.5) if positive else array
        return name

    def const(self, values: Sequence[int]) -> str:
        name = self.name("c")
        self.weights[name] = np.array(values, np.int64)
        return name

    def op(self, op_type: str, inputs: Sequence[str], outputs: int = 1, **attrs) -> list[str]:
        names = [self.name("t") for _ in range(outputs)]
        self.nodes.append(helper.make_node(op_type, list(inputs), names, **attrs))
        return names


def _sequence_step(g: _Graph, h: str, width: int, earlier: list[str]) -> str:
    """One random transformer-ish step on h[B, S, width]."""
    choice = g.rng.choice(["linear", "gelu", "norm", "residual", "attention", "split", "act"])
    if choice == "linear":
        (h,) = g.op("MatMul", [h, g.weight((width, width))])
        return g.op("Add", [h, g.weight((width,))])[0]
    if choice == "gelu":
        (half,) = g.op("Div", [h, g.weight((1,), positive=True)])
        (erf,) = g.op("Erf", [half])
        (one,) = g.op("Add", [erf, g.weight((1,), positive=True)])
        return g.op("Mul", [h, one])[0]
    if choice == "norm":
        return g.op("LayerNormalization", [h, g.weight((width,)), g.weight((width,))], axis=-1)[0]
    if choice == "residual" and earlier:
        return g.op("Add", [h, earlier[int(g.rng.integers(len(earlier)))]])[0]
    if choice == "attention":
        (q,) = g.op("MatMul", [h, g.weight((width, width))])
        (k,) = g.op("MatMul", [h, g.weight((width, width))])
        (kt,) = g.op("Transpose", [k], perm=[0, 2, 1])
        (scores,) = g.op("MatMul", [q, kt])
        (scaled,) = g.op("Div", [scores, g.weight((1,), positive=True)])
        (probs,) = g.op("Softmax", [scaled], axis=-1)
        return g.op("MatMul", [probs, h])[0]
    if choice == "split":
        left, right = g.op("Split", [h, g.const([width // 2, width // 2])], outputs=2, axis=-1)
        (left,) = g.op("Relu", [left])
        (right,) = g.op("Tanh", [right])
        return g.op("Concat", [left, right], axis=-1)[0]
    return g.op(str(g.rng.choice(["Relu", "Tanh"])), [h])[0]


def _image_step(
    g: _Graph, h: str, channels: int, earlier: list[tuple[str, int]]
) -> tuple[str, int]:
    """One random CNN step on h[N, channels, 8, 8] (spatial size kept); `earlier`: the values
    before it, with their channels."""
    choice = g.rng.choice(["conv", "bn", "relu", "residual", "branch"])
    if choice == "conv":
        out = int(g.rng.choice([4, 8]))
        inputs = [h, g.weight((out, channels, 3, 3))]
        if g.rng.random() < 0.5:
            inputs.append(g.weight((out,)))
        return g.op("Conv", inputs, pads=[1, 1, 1, 1])[0], out
    if choice == "bn":
        params = [g.weight((channels,)), g.weight((channels,)), g.weight((channels,))]
        params.append(g.weight((channels,), positive=True))
        return g.op("BatchNormalization", [h, *params])[0], channels
    same = [name for name, width in earlier if width == channels]
    if choice == "residual" and same:
        return g.op("Add", [h, same[int(g.rng.integers(len(same)))]])[0], channels
    if choice == "branch":
        (a,) = g.op("Conv", [h, g.weight((4, channels, 1, 1))])
        (b,) = g.op("Relu", [a])
        return g.op("Concat", [h, b], axis=1)[0], channels + 4
    return g.op("Relu", [h])[0], channels


def random_case(seed: int) -> Case:
    """A random small model (see the module docstring); the same seed, the same model."""
    rng = np.random.default_rng(seed)
    g = _Graph(rng)
    dynamic = rng.random() < 0.5
    batch: int | str = "N" if dynamic else 2
    sizes = {"N": int(rng.integers(1, 4))} if dynamic else {}
    inputs: list[tuple[str, int, Dims]] = []
    int_ranges: dict[str, tuple[int, int]] = {}
    ir3 = rng.random() < 0.15
    if not ir3 and rng.random() < 0.5:
        family = "sequence"
        seq: int | str = 4
        if dynamic and rng.random() < 0.5:
            seq, sizes["S"] = "S", int(rng.integers(2, 5))
        width = 8
        if rng.random() < 0.5:
            ids_type = int(rng.choice([TensorProto.INT64, TensorProto.INT32]))
            inputs.append(("ids", ids_type, [batch, seq]))
            rows = int(rng.integers(20, 200))
            int_ranges["ids"] = (0, rows)
            (h,) = g.op("Gather", [g.weight((rows, width)), "ids"])
        else:
            inputs.append(("x", F, [batch, seq, width]))
            h = "x"
        earlier: list[str] = []
        for _ in range(int(rng.integers(2, 6))):
            earlier.append(h)
            h = _sequence_step(g, h, width, earlier)
        out_dims: Dims = [batch, seq, width]
    else:
        family = "image"
        channels = 3
        inputs.append(("x", F, [batch, channels, 8, 8]))
        h, seen = "x", []
        for _ in range(int(rng.integers(2, 5))):
            seen.append((h, channels))
            h, channels = _image_step(g, h, channels, seen)
        (h,) = g.op(
            str(rng.choice(["MaxPool", "AveragePool"])), [h], kernel_shape=[2, 2], strides=[2, 2]
        )
        (h,) = g.op("GlobalAveragePool", [h])
        (h,) = g.op("Flatten", [h], axis=1)
        (h,) = g.op("Gemm", [h, g.weight((channels, 5)), g.weight((5,))])
        out_dims = [batch, 5]
    if not ir3:
        h = _scalar_inputs(g, h, inputs)
    nodes = [*g.nodes, helper.make_node("Identity", [h], ["y"])]
    listed: list[str] = list(g.weights) if ir3 else []
    if not ir3 and rng.random() < 0.3:
        listed = [name for name in g.weights if g.weights[name].dtype == np.float32]
    model = build(
        nodes,
        inputs,
        [("y", F, out_dims)],
        g.weights,
        listed=listed,
        ir_version=3 if ir3 else 8,
        opset=9 if ir3 else 18,
    )
    traits = [family, *(["dynamic"] if dynamic else []), *(["weights-as-inputs"] if listed else [])]
    traits += [*(["ir3"] if ir3 else []), *(name for name, _, _ in inputs if name != "x")]
    return Case(f"{seed}-{'-'.join(traits)}", model, sizes, int_ranges)


def _scalar_inputs(g: _Graph, h: str, inputs: list[tuple[str, int, Dims]]) -> str:
    """By chance, scale h by a scalar float, add a scalar int, switch on a scalar bool."""
    if g.rng.random() < 0.3:
        inputs.append(("alpha", F, []))
        (h,) = g.op("Mul", [h, "alpha"])
    if g.rng.random() < 0.3:
        inputs.append(("k", TensorProto.INT64, []))
        (kf,) = g.op("Cast", ["k"], to=F)
        (h,) = g.op("Add", [h, kf])
    if g.rng.random() < 0.3:
        inputs.append(("flag", TensorProto.BOOL, []))
        (other,) = g.op("Tanh", [h])
        (h,) = g.op("Where", ["flag", h, other])
    return h

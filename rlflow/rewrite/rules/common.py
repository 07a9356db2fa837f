"""Helpers shared by the rule modules: reading constants, emitting Split, example shapes."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from rlflow.graph import Graph, Node
from rlflow.graph.domains import onnx_opset
from rlflow.rewrite.build import ModelBuilder
from rlflow.rewrite.rule import Emitter

FLOAT_TYPES = (1, 10, 11)  # FLOAT, FLOAT16, DOUBLE


def scalar(graph: Graph, name: str) -> float | None:
    """The value of a one-element constant, else None."""
    array = graph.constant(name)
    if array is None or array.size != 1:
        return None
    return float(array.reshape(()))


def rank(graph: Graph, name: str) -> int:
    return len(graph.value(name).shape)


def shape(graph: Graph, name: str) -> tuple[int, ...]:
    return graph.value(name).shape


def shape_const(emit: Emitter, dims: Sequence[int]) -> str:
    """A new int64 constant holding `dims`: a Reshape's target shape, a Slice's bounds."""
    return emit.const(np.array(list(dims), dtype=np.int64), "shape")


def opset(graph: Graph) -> int:
    return onnx_opset(graph.opset)


def emit_split(
    emit: Emitter, graph: Graph, value: str, sizes: Sequence[int], axis: int
) -> list[str]:
    """Split `value` into parts of `sizes` along `axis`: equal parts by `num_outputs` at opset
    18 (the form the generated rules match), else by the split input (opset >= 13)."""
    if opset(graph) >= 18 and len(set(sizes)) == 1:
        parts = emit.op("Split", [value], outputs=len(sizes), axis=axis, num_outputs=len(sizes))
    elif opset(graph) >= 13:
        sizes_name = emit.const(np.array(sizes, dtype=np.int64), "split")
        parts = emit.op("Split", [value, sizes_name], outputs=len(sizes), axis=axis)
    else:
        parts = emit.op("Split", [value], outputs=len(sizes), axis=axis, split=list(sizes))
    return list(parts) if len(sizes) > 1 else [parts]


def split_sizes(graph: Graph, split: Node) -> list[int] | None:
    """The part sizes of a Split node (from its input, its attribute or an even split)."""
    axis = split.attr("axis", 0)
    dim = graph.value(split.inputs[0]).shape[axis]
    if len(split.inputs) > 1 and split.inputs[1]:
        sizes = graph.constant(split.inputs[1])
        return None if sizes is None else [int(s) for s in sizes]
    if split.attr("split") is not None:
        return [int(s) for s in split.attr("split")]
    count = len(split.outputs)
    if dim % count:
        return None
    return [dim // count] * count


def merge_groups(weight: np.ndarray, group: int, factor: int) -> np.ndarray:
    """The filter of a grouped Conv whose groups are merged `factor` at a time: each merged
    group's filter is block-diagonal, zero where an old group would read another's channels,
    so the Conv computes the same thing with `group / factor` groups."""
    per_group_out, per_group_in = weight.shape[0] // group, weight.shape[1]
    merged = np.zeros((weight.shape[0], factor * per_group_in, *weight.shape[2:]), weight.dtype)
    for channel in range(weight.shape[0]):
        offset = (channel // per_group_out) % factor * per_group_in
        merged[channel, offset : offset + per_group_in] = weight[channel]
    return merged


def only_reader(graph: Graph, value: str, reader: Node) -> bool:
    """`reader` is the one node reading `value`, which is not a graph output."""
    readers = graph.consumers(value)
    return len(readers) == 1 and readers[0] is reader and not graph.is_output(value)


def pick(setting: int, options: Sequence) -> object:
    """The option for a shape setting (settings beyond the list wrap around)."""
    return options[setting % len(options)]


def example_conv(setting: int, builder: ModelBuilder) -> str:
    """A Conv with constant weight and bias on a fresh input, at one of three shape settings:
    the example the convolution rules are verified on."""
    n, c, hw, k, out = pick(setting, [(1, 3, 8, 3, 4), (2, 4, 5, 1, 6), (1, 2, 7, 5, 3)])
    x = builder.input((n, c, hw, hw))
    return builder.op(
        "Conv", [x, builder.const((out, c, k, k)), builder.const((out,))], pads=[k // 2] * 4
    )

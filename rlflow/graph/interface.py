"""The original model's interface, recorded at load and put back on the model rlflow writes.

rlflow works on a graph with static shapes whose constants it may fold; a caller of the model
sees something else: input and output names, element types, shapes with symbolic dims (`N`),
and, in older exports, weights listed among the inputs, whose initializer is a default the
caller may override. An optimised model must drop into the caller's code in place of the
original, so `Interface.restore` writes that interface back:

- every input the original declares, in its order, with its element type; a weight listed
  among the inputs stays an input with its default (unless it was folded on request);
- each dynamic dim that the checks showed general (the result is equivalent at other sizes of
  it, see rlflow.optimize) with its symbol; a dim that is not general keeps the size it was
  loaded with, and the model is then specialised to it, which the report says;
- the outputs as declared, their symbolic dims kept where the inputs' are.
"""

from __future__ import annotations

import os
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

from rlflow.graph.ir import Graph

MIN_IR_WITH_LOOSE_INITIALIZERS = 4
"""ONNX IR 3 requires every initializer to be listed among the inputs; IR 4 lifted that."""


class Interface:
    """What a caller of the original model sees, and the sizes its dynamic dims were given.

    Args:
        model: the original ModelProto.
        graph: the Graph it was loaded into (its inputs: those of the model that stayed
            inputs, with static shapes).
        defaults: weights listed among the inputs that stayed inputs, by name.
        folded: weights listed among the inputs that were folded into constants.
        source: the path the model was read from (read again for the final checks, so that
            its bytes are not held through a search), or the ModelProto itself.
    """

    def __init__(
        self,
        model: onnx.ModelProto,
        graph: Graph,
        defaults: Mapping[str, np.ndarray],
        folded: Sequence[str],
        source: str | os.PathLike | onnx.ModelProto,
    ) -> None:
        declared = {info.name: info for info in model.graph.input}
        self.inputs = [_copy(declared[value.name]) for value in graph.inputs]
        self.outputs = [_copy(info) for info in model.graph.output]
        self.shapes = {value.name: tuple(value.shape) for value in graph.inputs}
        self.output_shapes = {value.name: tuple(value.shape) for value in graph.outputs}
        self.defaults = dict(defaults)
        self.folded = tuple(folded)
        self._source = source if isinstance(source, onnx.ModelProto) else Path(source)
        self.symbols: dict[str, int] = {}
        """Each dynamic dim of the inputs (its dim_param, or `x[0]` for an unnamed one) ->
        the size it was loaded with."""
        for info in self.inputs:
            if info.name in self.defaults:
                continue
            for axis, size in enumerate(self.shapes[info.name]):
                symbol = self.symbol(info, axis)
                if symbol is not None:
                    self.symbols[symbol] = size

    @staticmethod
    def symbol(info: onnx.ValueInfoProto, axis: int) -> str | None:
        """The symbol of dim `axis` of a declared input; None if the dim is static."""
        tensor_type = info.type.tensor_type
        if not tensor_type.HasField("shape"):
            return f"{info.name}[{axis}]"
        dim = tensor_type.shape.dim[axis]
        if dim.HasField("dim_value"):
            return None
        return dim.dim_param or f"{info.name}[{axis}]"

    def input_shapes(self, sizes: Mapping[str, int]) -> dict[str, tuple[int, ...]]:
        """Every input's shape (weights listed as inputs aside) with `sizes` for its symbols."""
        shapes = {}
        for info in self.inputs:
            if info.name in self.defaults:
                continue
            shape = self.shapes[info.name]
            shapes[info.name] = tuple(
                sizes.get(self.symbol(info, axis) or "", size) for axis, size in enumerate(shape)
            )
        return shapes

    def restore(self, model: onnx.ModelProto, general: Collection[str]) -> onnx.ModelProto:
        """`model` (a Graph of this interface, exported) with the original's inputs and outputs,
        the dynamic dims in `general` symbolic again; changed in place and returned.

        Where any dim is dynamic, the value_info of inner values goes: their static shapes
        would contradict the sizes a caller feeds (onnxruntime infers them again).
        """
        graph = model.graph
        inputs = [self._input(info, general) for info in self.inputs]
        outputs = [self._output(info, general) for info in self.outputs]
        del graph.input[:]
        graph.input.extend(inputs)
        del graph.output[:]
        graph.output.extend(outputs)
        present = {tensor.name for tensor in graph.initializer}
        graph.initializer.extend(
            numpy_helper.from_array(array, name)
            for name, array in self.defaults.items()
            if name not in present
        )
        if self.symbols:
            del graph.value_info[:]
        return model

    def original(self) -> onnx.ModelProto:
        """The original model as the written one must behave: weights folded on request are
        constants in it too (no longer listed among its inputs)."""
        source = self._source
        model = source if isinstance(source, onnx.ModelProto) else onnx.load(str(source))
        if not self.folded:
            return model
        if model is source:
            model = onnx.ModelProto()
            model.CopyFrom(source)
        kept = [info for info in model.graph.input if info.name not in self.folded]
        del model.graph.input[:]
        model.graph.input.extend(kept)
        model.ir_version = max(model.ir_version, MIN_IR_WITH_LOOSE_INITIALIZERS)
        return model

    def to_json(self) -> dict[str, Any]:
        """The interface for a report: inputs and outputs as declared (dims: sizes, symbols
        or null), weights kept as inputs and weights folded."""
        return {
            "inputs": [_describe(info) for info in self.inputs],
            "outputs": [_describe(info) for info in self.outputs],
            "initializer_inputs": sorted(self.defaults),
            "folded_initializer_inputs": list(self.folded),
        }

    def _input(self, info: onnx.ValueInfoProto, general: Collection[str]) -> onnx.ValueInfoProto:
        if info.name in self.defaults:  # a weight: declared as the original declares it
            return _copy(info)
        dims: list[int | str | None] = []
        for axis, size in enumerate(self.shapes[info.name]):
            symbol = self.symbol(info, axis)
            if symbol is None or symbol not in general:
                dims.append(size)
            else:
                dims.append(symbol if symbol in _params(info) else None)
        return helper.make_tensor_value_info(info.name, info.type.tensor_type.elem_type, dims)

    def _output(self, info: onnx.ValueInfoProto, general: Collection[str]) -> onnx.ValueInfoProto:
        """The declared output with its loaded sizes where the original's dims are static or
        follow a specialised input dim; its own symbols (or unknown dims) where any input dim
        stayed general, as they may follow it."""
        static = list(self.output_shapes[info.name])
        declared = info.type.tensor_type
        if not general:
            dims: list[int | str | None] = list(static)
        elif not declared.HasField("shape"):
            dims = [None] * len(static)
        else:
            dims = []
            for dim, size in zip(declared.shape.dim, static):
                specialised = dim.dim_param in self.symbols and dim.dim_param not in general
                fixed = dim.HasField("dim_value") or specialised
                dims.append(size if fixed else (dim.dim_param or None))
        return helper.make_tensor_value_info(info.name, declared.elem_type, dims)


def _copy(info: onnx.ValueInfoProto) -> onnx.ValueInfoProto:
    copy = onnx.ValueInfoProto()
    copy.CopyFrom(info)
    return copy


def _params(info: onnx.ValueInfoProto) -> set[str]:
    return {d.dim_param for d in info.type.tensor_type.shape.dim if d.dim_param}


def _describe(info: onnx.ValueInfoProto) -> dict[str, Any]:
    tensor_type = info.type.tensor_type
    dims = None
    if tensor_type.HasField("shape"):
        dims = [
            d.dim_value if d.HasField("dim_value") else (d.dim_param or None)
            for d in tensor_type.shape.dim
        ]
    dtype = onnx.TensorProto.DataType.Name(tensor_type.elem_type).lower()
    return {"name": info.name, "dtype": dtype, "dims": dims}

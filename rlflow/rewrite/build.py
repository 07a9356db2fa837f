"""A small builder of ONNX models, for the example each rule is verified on (and for tests)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


class ModelBuilder:
    """Build a model node by node; constants are random (fixed seed) unless given.

    `builder.op(...)` returns the output name(s), so models read as nested calls:
    `b.op("Relu", [b.op("Conv", [x, b.const((8, 3, 3, 3))])])`.
    """

    def __init__(self, opset: int = 17, seed: int = 0) -> None:
        self.opset = opset
        self.rng = np.random.default_rng(seed)
        self.nodes: list[onnx.NodeProto] = []
        self.inputs: list[onnx.ValueInfoProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self.domains: set[str] = set()
        self._count = 0

    def _name(self, prefix: str) -> str:
        self._count += 1
        return f"{prefix}{self._count}"

    def input(self, shape: Sequence[int], dtype: int = TensorProto.FLOAT) -> str:
        name = self._name("x")
        self.inputs.append(helper.make_tensor_value_info(name, dtype, list(shape)))
        return name

    def const(self, value: Any, dtype: type = np.float32) -> str:
        """A constant: an array as given, or random normal values of the shape given as a tuple."""
        if isinstance(value, tuple):
            array = self.rng.standard_normal(value).astype(dtype)
        else:
            array = np.asarray(value, dtype=dtype)
        name = self._name("c")
        self.initializers.append(numpy_helper.from_array(array, name))
        return name

    def op(
        self, op_type: str, inputs: Sequence[str], outputs: int = 1, domain: str = "", **attrs: Any
    ) -> Any:
        names = [self._name(op_type.lower()) for _ in range(outputs)]
        self.nodes.append(helper.make_node(op_type, list(inputs), names, domain=domain, **attrs))
        if domain:
            self.domains.add(domain)
        return names[0] if outputs == 1 else names

    def model(self, *outputs: str) -> onnx.ModelProto:
        graph = helper.make_graph(
            self.nodes,
            "example",
            self.inputs,
            [helper.make_empty_tensor_value_info(name) for name in outputs],
            initializer=self.initializers,
        )
        opsets = [helper.make_opsetid("", self.opset)]
        opsets += [helper.make_opsetid(domain, 1) for domain in sorted(self.domains)]
        model = helper.make_model(graph, opset_imports=opsets)
        model.ir_version = 8
        return model

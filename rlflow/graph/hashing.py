"""Canonical graph hash: the same computation gives the same digest.

A value's hash is built from what computes it, never from its name: graph inputs by
position, dtype and shape; constants by dtype, shape and contents; a node output by
the operator, its attributes, its input hashes (sorted for commutative operators) and
its output index. The graph hash is over the outputs in order, so node order and
intermediate names do not matter, while any change of attribute, weight or edge does.
"""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from rlflow.graph.ir import Graph

# Operators whose result does not depend on the order of their inputs.
COMMUTATIVE = frozenset({"Add", "Mul", "Max", "Min", "Sum", "Mean", "And", "Or", "Xor", "Equal"})


def _digest(*parts: bytes | str) -> bytes:
    h = hashlib.blake2b(digest_size=16)
    for part in parts:
        data = part.encode() if isinstance(part, str) else part
        h.update(len(data).to_bytes(8, "little"))
        h.update(data)
    return h.digest()


def array_digest(array: np.ndarray) -> bytes:
    contiguous = np.ascontiguousarray(array)
    return _digest(str(contiguous.dtype), str(contiguous.shape), contiguous.view(np.uint8).data)


def canonical_hash(graph: Graph) -> str:
    value_hash: dict[str, bytes] = {"": _digest("absent")}
    for position, value in enumerate(graph.inputs):
        value_hash[value.name] = _digest("input", str(position), str(value.dtype), str(value.shape))
    for name in graph.initializers:
        value_hash[name] = _digest("const", graph.const_digest(name))
    for node in graph.nodes:
        input_hashes = [value_hash[name] for name in node.inputs]
        if node.domain in ("", "ai.onnx") and node.op_type in COMMUTATIVE:
            input_hashes.sort()
        attrs = [
            node.attrs[key].SerializeToString(deterministic=True) for key in sorted(node.attrs)
        ]
        node_hash = _digest(node.domain, node.op_type, *attrs, b"|", *input_hashes)
        for index, out in enumerate(node.outputs):
            if out:
                value_hash[out] = _digest(node_hash, str(index))
    return _digest(*(value_hash[value.name] for value in graph.outputs)).hex()

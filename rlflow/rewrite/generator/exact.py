"""Exact evaluation of menu ops in numpy, and the fingerprints that group equal graphs.

Inputs are small random integers held in float64 and every op keeps them integers (no Tanh or
Sigmoid on the menu) whose magnitude stays far below 2**53, so BLAS computes them exactly
whatever its summation order. Equal functions then give bit-identical outputs and can be
grouped by a hash, with no tolerance and no bucket-boundary misses: TASO's integer arithmetic
at numpy speed. (Verification is separate, in float32 and onnxruntime.)
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence

import numpy as np

from rlflow.rewrite.generator.dag import ExprDag
from rlflow.rewrite.generator.menu import SPECS, OpSpec

Digest = tuple[tuple[int, ...], int, int]


def _conv2d(x: np.ndarray, w: np.ndarray, pad: int) -> np.ndarray:
    kernel = w.shape[2]
    if kernel == 1:
        return np.tensordot(w[:, :, 0, 0], x, axes=([1], [1])).transpose(1, 0, 2, 3)
    padded = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    patches = np.lib.stride_tricks.sliding_window_view(padded, (kernel, kernel), axis=(2, 3))
    return np.tensordot(patches, w, axes=([1, 4, 5], [1, 2, 3])).transpose(0, 3, 1, 2)


def evaluate(spec: OpSpec, args: Sequence[np.ndarray]) -> list[np.ndarray]:
    """Run one op of the menu in numpy, with ONNX semantics (ValueError: an odd Split)."""
    op = spec.op_type
    if op == "Add":
        return [args[0] + args[1]]
    if op == "Sub":
        return [args[0] - args[1]]
    if op == "Mul":
        return [args[0] * args[1]]
    if op == "Relu":
        return [np.maximum(args[0], 0.0)]
    if op == "Neg":
        return [-args[0]]
    if op == "Identity":
        return [args[0]]
    if op == "Transpose":
        return [np.ascontiguousarray(args[0].T)]
    if op == "MatMul":
        return [args[0] @ args[1]]
    if op == "Conv":
        return [_conv2d(args[0], args[1], spec.onnx_attrs()["pads"][0])]
    if op == "Concat":
        return [np.concatenate(args, axis=spec.axis)]
    if op == "Split":
        if args[0].shape[spec.axis] % 2:
            raise ValueError("odd split")
        return [np.ascontiguousarray(part) for part in np.split(args[0], 2, axis=spec.axis)]
    raise AssertionError(f"no evaluator for {op}")


def run_dag(dag: ExprDag, inputs: dict[int, np.ndarray]) -> list[np.ndarray | None]:
    """Every value of `dag` (None for unused inputs)."""
    values: list[np.ndarray | None] = [inputs.get(i) for i in range(dag.num_inputs)]
    for key, args in dag.ops:
        values += evaluate(SPECS[key], [values[v] for v in args])
    return values


_INPUT_CACHE: dict[tuple[int, tuple[int, ...]], np.ndarray] = {}


def input_array(index: int, shape: tuple[int, ...]) -> np.ndarray:
    """Integer-valued float64 random data for input `index`, the same in every graph."""
    key = (index, shape)
    if key not in _INPUT_CACHE:
        rng = np.random.default_rng(zlib.crc32(repr(key).encode()))
        _INPUT_CACHE[key] = rng.integers(-4, 5, size=shape).astype(np.float64)
    return _INPUT_CACHE[key]


def input_arrays(shapes: dict[int, tuple[int, ...]]) -> dict[int, np.ndarray]:
    """input_array() of each input at its shape."""
    return {i: input_array(i, shape) for i, shape in shapes.items()}


_PROJECTIONS: dict[int, np.ndarray] = {}


def digest(array: np.ndarray) -> Digest:
    """A hash of shape and exact contents: two random int64 projections (wrapping mod 2**64,
    which a hash may do; far cheaper than hashing the bytes of every value)."""
    size = array.size
    if size not in _PROJECTIONS:
        rng = np.random.default_rng(size)
        _PROJECTIONS[size] = rng.integers(-(2**62), 2**62, size=(size, 2), dtype=np.int64)
    first, second = array.reshape(-1).astype(np.int64) @ _PROJECTIONS[size]
    return array.shape, int(first), int(second)

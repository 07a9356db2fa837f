"""Random model inputs that are valid for the model: the same seed gives the same arrays.

Floats are standard normal. Integer inputs are drawn from the range the model declares in
its metadata (`rlflow.int_range.<input>` = "low,high", high exclusive, e.g. token ids below
the vocabulary size). An integer input without a declared range is drawn from [0, 2): the
widest range that is still valid for the usual meanings of an undeclared int input (a 0/1
mask, an index into any axis of size >= 2, a position), while still varying between seeds.
Bools are fair coin flips.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import onnx
from onnx import helper

from rlflow.cost.source import TensorSpec
from rlflow.errors import RlflowError

INT_RANGE_PREFIX = "rlflow.int_range."
DEFAULT_INT_RANGE = (0, 2)

# fmt: off
_FLOAT_TYPES = {onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.DOUBLE}
_INT_TYPES = {
    onnx.TensorProto.INT8, onnx.TensorProto.INT16, onnx.TensorProto.INT32, onnx.TensorProto.INT64,
    onnx.TensorProto.UINT8, onnx.TensorProto.UINT16, onnx.TensorProto.UINT32,
    onnx.TensorProto.UINT64,
}
# fmt: on


def int_range(metadata: Mapping[str, str], input_name: str) -> tuple[int, int]:
    """The [low, high) range of an integer input, from metadata or DEFAULT_INT_RANGE."""
    key = INT_RANGE_PREFIX + input_name
    text = metadata.get(key)
    if text is None:
        return DEFAULT_INT_RANGE
    try:
        low, high = (int(part) for part in text.split(","))
    except ValueError:
        raise RlflowError(f"model metadata {key}={text!r} is not 'low,high'") from None
    if high <= low:
        raise RlflowError(f"model metadata {key}={text!r} is an empty range (high is exclusive)")
    return low, high


def random_tensor(
    spec: TensorSpec, rng: np.random.Generator, int_bounds: tuple[int, int] = DEFAULT_INT_RANGE
) -> np.ndarray:
    """One random array for `spec`; integers are drawn from [low, high)."""
    if spec.shape is None:
        raise RlflowError(f"input {spec.describe()} has no static shape")
    if spec.dtype in _FLOAT_TYPES:
        dtype = helper.tensor_dtype_to_np_dtype(spec.dtype)
        return rng.standard_normal(spec.shape, dtype=np.float32).astype(dtype)
    if spec.dtype in _INT_TYPES:
        dtype = helper.tensor_dtype_to_np_dtype(spec.dtype)
        info = np.iinfo(dtype)
        low, high = max(int_bounds[0], int(info.min)), min(int_bounds[1], int(info.max) + 1)
        return rng.integers(low, high, size=spec.shape, dtype=np.int64).astype(dtype)
    if spec.dtype == onnx.TensorProto.BOOL:
        return rng.random(spec.shape) < 0.5
    raise RlflowError(f"cannot make random data for input {spec.describe()}")


def random_inputs(
    specs: Sequence[TensorSpec], metadata: Mapping[str, str], seed: int = 0
) -> dict[str, np.ndarray]:
    """Random feeds for every input, integer inputs within their metadata range."""
    rng = np.random.default_rng(seed)
    return {spec.name: random_tensor(spec, rng, int_range(metadata, spec.name)) for spec in specs}

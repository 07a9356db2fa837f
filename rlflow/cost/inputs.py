"""Random model inputs that are valid for the model: the same seed gives the same arrays.

Floats are standard normal times a `scale`: the equivalence check of an optimised model draws
sets at scales 1, 1e3 and 1e-3, because a rewrite that is exact at unit magnitudes can still
overflow, lose precision or clamp at others. Integer inputs are drawn from their domain (the
range the model shows valid, or the fixed value of a shape: rlflow.cost.domains), which
ModelSource attaches to each input; a spec without one (built by hand) takes its metadata
range, else DEFAULT_INT_RANGE. Bools are fair coin flips. Scalars (rank 0) are 0-d arrays.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import onnx
from onnx import helper

from rlflow.cost.domains import (
    DEFAULT_INT_RANGE,
    INT_RANGE_PREFIX,
    INT_TYPES,
    InputDomain,
    int_range,
)
from rlflow.cost.source import TensorSpec
from rlflow.errors import RlflowError

__all__ = [
    "DEFAULT_INT_RANGE",
    "FLOAT_TYPES",
    "INT_RANGE_PREFIX",
    "InputDomain",
    "draw_json",
    "int_range",
    "random_inputs",
    "random_tensor",
]

FLOAT_TYPES = frozenset({onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.DOUBLE})


def random_tensor(
    spec: TensorSpec,
    rng: np.random.Generator,
    int_bounds: tuple[int, int] = DEFAULT_INT_RANGE,
    scale: float = 1.0,
) -> np.ndarray:
    """One random array for `spec`: integers from its domain, else from [low, high) of
    `int_bounds`; floats standard normal times `scale`."""
    if spec.shape is None:
        raise RlflowError(f"input {spec.describe()} has no static shape")
    if spec.dtype in FLOAT_TYPES:
        dtype = helper.tensor_dtype_to_np_dtype(spec.dtype)
        normal = rng.standard_normal(spec.shape, dtype=np.float32)
        return np.asarray(normal * np.float32(scale)).astype(dtype)
    if spec.dtype in INT_TYPES:
        dtype = helper.tensor_dtype_to_np_dtype(spec.dtype)
        if spec.domain is not None and spec.domain.fixed is not None:
            return np.array(spec.domain.fixed, dtype=dtype).reshape(spec.shape)
        if spec.domain is not None:
            int_bounds = (spec.domain.low, spec.domain.high)
        info = np.iinfo(dtype)
        low, high = max(int_bounds[0], int(info.min)), min(int_bounds[1], int(info.max) + 1)
        return np.asarray(rng.integers(low, high, size=spec.shape, dtype=np.int64)).astype(dtype)
    if spec.dtype == onnx.TensorProto.BOOL:
        return np.asarray(rng.random(spec.shape) < 0.5)
    raise RlflowError(f"cannot make random data for input {spec.describe()}")


def random_inputs(
    specs: Sequence[TensorSpec], metadata: Mapping[str, str], seed: int = 0, scale: float = 1.0
) -> dict[str, np.ndarray]:
    """Random feeds for every input: integers within their domain (or their metadata range),
    floats at `scale`."""
    rng = np.random.default_rng(seed)
    return {
        spec.name: random_tensor(spec, rng, int_range(metadata, spec.name), scale) for spec in specs
    }


def draw_json(spec: TensorSpec, scales: Sequence[float]) -> dict[str, object]:
    """How `spec` is drawn, for a report: its dtype and domain, or its float scales."""
    dtype = onnx.TensorProto.DataType.Name(spec.dtype).lower()
    if spec.dtype in FLOAT_TYPES:
        return {"dtype": dtype, "normal_scales": list(scales)}
    if spec.dtype == onnx.TensorProto.BOOL:
        return {"dtype": dtype, "values": "coin flips"}
    domain = spec.domain or InputDomain(*DEFAULT_INT_RANGE, origin="default")
    return {"dtype": dtype, **domain.to_json()}

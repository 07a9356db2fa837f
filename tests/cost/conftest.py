"""Fixtures for the cost tests: a private cache directory and a builder of tiny ONNX models."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

TensorDecl = tuple[str, int, Sequence[int] | None]
ModelBuilder = Callable[..., onnx.ModelProto]


@pytest.fixture(autouse=True)
def cache_dir(tmp_path, monkeypatch):
    """Every test caches under its own directory, never in the user's ~/.cache/rlflow."""
    path = tmp_path / "rlflow-cache"
    monkeypatch.setenv("RLFLOW_CACHE_DIR", str(path))
    return path


def _build(
    nodes: list[onnx.NodeProto],
    inputs: Sequence[TensorDecl],
    outputs: Sequence[TensorDecl],
    initializers: dict[str, np.ndarray] | None = None,
    metadata: dict[str, str] | None = None,
) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes,
        "test",
        [helper.make_tensor_value_info(n, t, s) for n, t, s in inputs],
        [helper.make_tensor_value_info(n, t, s) for n, t, s in outputs],
        initializer=[numpy_helper.from_array(a, n) for n, a in (initializers or {}).items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    for key, value in (metadata or {}).items():
        model.metadata_props.append(onnx.StringStringEntryProto(key=key, value=value))
    return model


@pytest.fixture
def build() -> ModelBuilder:
    """build(nodes, inputs, outputs, initializers=None, metadata=None) -> ModelProto."""
    return _build


@pytest.fixture
def linear_models() -> dict[str, onnx.ModelProto]:
    """y = x @ W + b written four ways: MatMul+Add, Gemm, swapped operands, dropped bias."""
    rng = np.random.default_rng(0)
    weights = {
        "w": rng.standard_normal((16, 16)).astype(np.float32),
        "b": rng.standard_normal(16).astype(np.float32),
    }
    x = [("x", TensorProto.FLOAT, [16, 16])]
    y = [("y", TensorProto.FLOAT, [16, 16])]
    node = helper.make_node
    add_bias = node("Add", ["m", "b"], ["y"])
    return {
        "matmul_add": _build([node("MatMul", ["x", "w"], ["m"]), add_bias], x, y, weights),
        "gemm": _build([node("Gemm", ["x", "w", "b"], ["y"])], x, y, weights),
        "swapped": _build([node("MatMul", ["w", "x"], ["m"]), add_bias], x, y, weights),
        "no_bias": _build([node("MatMul", ["x", "w"], ["y"])], x, y, {"w": weights["w"]}),
    }

"""One model to run in onnxruntime, given as a Graph or a ModelProto.

Measuring needs the model's interface, a hash to cache results by, and its bytes for
onnxruntime; models can be ~0.5 GB, so the bytes are made at most once and only when a
session is really built. A ModelProto is run exactly as given (not re-exported through the
IR), so that the original model a user hands in is what gets measured.
"""

from __future__ import annotations

import functools
import hashlib
from dataclasses import dataclass

import onnx
from onnx import helper

from rlflow.errors import RlflowError
from rlflow.graph import Graph

ModelLike = Graph | onnx.ModelProto


@dataclass(frozen=True)
class TensorSpec:
    """A model input or output: name, ONNX element type, static shape (None if not static)."""

    name: str
    dtype: int
    shape: tuple[int, ...] | None

    def describe(self) -> str:
        dtype = onnx.TensorProto.DataType.Name(self.dtype).lower()
        shape = "?" if self.shape is None else "x".join(map(str, self.shape)) or "scalar"
        return f"{self.name}: {dtype}[{shape}]"


class ModelSource:
    """The interface, hash and (lazily, once) serialized bytes of a Graph or ModelProto."""

    def __init__(self, model: ModelLike) -> None:
        if isinstance(model, Graph):
            self.inputs = [TensorSpec(v.name, v.dtype, tuple(v.shape)) for v in model.inputs]
            self.outputs = [TensorSpec(v.name, v.dtype, tuple(v.shape)) for v in model.outputs]
            self.metadata = dict(model.metadata)
        elif isinstance(model, onnx.ModelProto):
            constants = {t.name for t in model.graph.initializer}
            self.inputs = [_spec(vi) for vi in model.graph.input if vi.name not in constants]
            self.outputs = [_spec(vi) for vi in model.graph.output]
            self.metadata = {p.key: p.value for p in model.metadata_props}
        else:
            raise TypeError(f"expected a Graph or onnx.ModelProto, got {type(model).__name__}")
        self._model = model
        self._bytes: bytes | None = None
        self._hash: str | None = None

    @property
    def graph_hash(self) -> str:
        """Graph.canonical_hash() for a Graph; a digest of the serialized model for a ModelProto."""
        if self._hash is None:
            if isinstance(self._model, Graph):
                self._hash = self._model.canonical_hash()
            else:
                self._hash = (
                    "proto-" + hashlib.blake2b(self.model_bytes(), digest_size=16).hexdigest()
                )
        return self._hash

    def model_bytes(self) -> bytes:
        """The serialized ModelProto (made once, until `release()`)."""
        if self._bytes is None:
            proto = self._model.to_onnx() if isinstance(self._model, Graph) else self._model
            written_version = proto.ir_version
            # onnx writes a newer IR version than onnxruntime reads; our models use nothing
            # from the newer IRs, so they are handed to onnxruntime as its newest one.
            proto.ir_version = min(written_version, max_ort_ir_version())
            try:
                self._bytes = proto.SerializeToString()
            finally:
                proto.ir_version = written_version  # the caller's model is left as it was
        return self._bytes

    def release(self) -> None:
        """Drop the serialized bytes once the sessions that needed them exist."""
        self._bytes = None

    def require_static_inputs(self) -> None:
        dynamic = [spec.describe() for spec in self.inputs if spec.shape is None]
        if dynamic:
            raise RlflowError(
                f"model inputs have dynamic dims ({', '.join(dynamic)}); load it with "
                "rlflow.graph.load_model(..., input_shapes=...) to fix them"
            )


@functools.cache
def max_ort_ir_version() -> int:
    """The newest ONNX IR version this onnxruntime loads, found by trying a one-node model."""
    import onnxruntime as ort

    graph = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["y"])],
        "probe",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1])],
    )
    for version in range(onnx.IR_VERSION, 3, -1):
        probe = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
        probe.ir_version = version
        try:
            ort.InferenceSession(probe.SerializeToString(), providers=["CPUExecutionProvider"])
        except Exception:  # onnxruntime's error types differ by version; any means "too new"
            continue
        return version
    return onnx.IR_VERSION


def _spec(info: onnx.ValueInfoProto) -> TensorSpec:
    tensor_type = info.type.tensor_type
    shape: tuple[int, ...] | None = None
    if tensor_type.HasField("shape") and all(
        dim.HasField("dim_value") for dim in tensor_type.shape.dim
    ):
        shape = tuple(dim.dim_value for dim in tensor_type.shape.dim)
    return TensorSpec(info.name, tensor_type.elem_type, shape)

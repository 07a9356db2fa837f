"""One model to run in onnxruntime, given as a Graph or a ModelProto.

Measuring needs the model's interface, a hash to cache results by, and its bytes for
onnxruntime; models can be ~0.5 GB, so the bytes are made at most once and only when a
session is really built. A ModelProto is run exactly as given (not re-exported through the
IR), so that the original model a user hands in is what gets measured.

A ModelProto's inputs are the ones a caller must feed: weights it lists among its inputs (older
exports) have a default, its initializer, and are run with it. Dynamic dims take the sizes in
`input_shapes`. Each integer input carries the values it may take (rlflow.cost.domains).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

import onnx

from rlflow.cost.domains import INT_TYPES, GraphView, InputDomain, input_domain
from rlflow.errors import RlflowError
from rlflow.graph import Graph
from rlflow.graph.shapes import max_ort_ir_version

ModelLike = Graph | onnx.ModelProto


@dataclass(frozen=True)
class TensorSpec:
    """A model input or output: name, ONNX element type, static shape (None if not static), and
    for an integer input, the values it may take."""

    name: str
    dtype: int
    shape: tuple[int, ...] | None
    domain: InputDomain | None = field(default=None, compare=False)

    def describe(self) -> str:
        dtype = onnx.TensorProto.DataType.Name(self.dtype).lower()
        shape = "?" if self.shape is None else "x".join(map(str, self.shape)) or "scalar"
        return f"{self.name}: {dtype}[{shape}]"


class ModelSource:
    """The interface, hash and (lazily, once) serialized bytes of a Graph or ModelProto."""

    def __init__(
        self, model: ModelLike, input_shapes: Mapping[str, Sequence[int]] | None = None
    ) -> None:
        shapes = {name: tuple(int(d) for d in dims) for name, dims in (input_shapes or {}).items()}
        if isinstance(model, Graph):
            self.inputs = [TensorSpec(v.name, v.dtype, tuple(v.shape)) for v in model.inputs]
            self.outputs = [TensorSpec(v.name, v.dtype, tuple(v.shape)) for v in model.outputs]
            self.metadata = dict(model.metadata)
        elif isinstance(model, onnx.ModelProto):
            constants = {t.name for t in model.graph.initializer}
            self.inputs = [
                _spec(vi, shapes.get(vi.name))
                for vi in model.graph.input
                if vi.name not in constants
            ]
            self.outputs = [_spec(vi) for vi in model.graph.output]
            self.metadata = {p.key: p.value for p in model.metadata_props}
        else:
            raise TypeError(f"expected a Graph or onnx.ModelProto, got {type(model).__name__}")
        self.inputs = self._with_domains(model, self.inputs)
        self._model = model
        self._bytes: bytes | None = None
        self._hash: str | None = None

    def _with_domains(self, model: ModelLike, specs: list[TensorSpec]) -> list[TensorSpec]:
        """`specs` with the domain of each static integer input (rlflow.cost.domains)."""
        wanted = [s for s in specs if s.dtype in INT_TYPES and s.shape is not None]
        if not wanted:
            return specs
        if isinstance(model, Graph):
            view = GraphView.of_graph(model)
        else:
            view = GraphView.of_proto(model, {s.name: s.shape for s in wanted if s.shape})
        domains = {s.name: input_domain(view, s.name, s.shape or (), self.metadata) for s in wanted}
        return [replace(s, domain=domains[s.name]) if s.name in domains else s for s in specs]

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


def _spec(info: onnx.ValueInfoProto, given: tuple[int, ...] | None = None) -> TensorSpec:
    """The spec of a declared input or output; `given` sizes its dynamic dims, and must agree
    with its static ones."""
    tensor_type = info.type.tensor_type
    declared: tuple[int | None, ...] | None = None
    if tensor_type.HasField("shape"):
        declared = tuple(
            d.dim_value if d.HasField("dim_value") else None for d in tensor_type.shape.dim
        )
    if given is not None:
        fits = declared is None or (
            len(given) == len(declared)
            and all(d is None or d == g for d, g in zip(declared, given))
        )
        if not fits:
            dims = "x".join("?" if d is None else str(d) for d in declared or ())
            raise RlflowError(f"input {info.name} is declared {dims}; it cannot take {given}")
        return TensorSpec(info.name, tensor_type.elem_type, given)
    static = None if declared is None or None in declared else tuple(d or 0 for d in declared)
    return TensorSpec(info.name, tensor_type.elem_type, static)

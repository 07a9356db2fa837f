"""Run a model rlflow optimised, under the settings it declares.

    import rlflow.runtime
    session = rlflow.runtime.InferenceSession("model-opt.onnx")
    outputs = session.run(None, {"input": x})

A model optimised in offline mode (the default of `rlflow optimize`) must run as written, with
onnxruntime's optimiser off: it says so in its `ort_config` metadata, and names the target it
was tuned for. This opens it that way, and refuses, with a clear error, a target it cannot run
on (another NCHWc block size, another execution provider) rather than computing a wrong answer.
Plain onnxruntime does the same given `ORT_LOAD_CONFIG_FROM_MODEL=1` in the environment, or
`SessionOptions.graph_optimization_level = ORT_DISABLE_ALL`; it does not check the target.
"""

from __future__ import annotations

import os

import onnx
import onnxruntime as ort

from rlflow.cost.deploy import declared_settings
from rlflow.cost.session import OrtSettings, make_session
from rlflow.cost.target import check_target
from rlflow.errors import RlflowError, first_line


def declared(model: str | os.PathLike | onnx.ModelProto, *, threads: int = 1) -> OrtSettings:
    """The settings a model declares (onnxruntime's defaults if it declares none), on this
    machine's provider; RlflowError if it was tuned for a target this machine is not."""
    proto = _load(model)
    metadata = {entry.key: entry.value for entry in proto.metadata_props}
    settings = declared_settings(metadata, OrtSettings(threads=threads)).resolved()
    check_target(metadata, settings.provider)
    return settings


def InferenceSession(  # noqa: N802  (named like the onnxruntime class it stands in for)
    model: str | os.PathLike | onnx.ModelProto, *, threads: int = 1
) -> ort.InferenceSession:
    """An onnxruntime session for `model` under the settings it declares (see `declared`)."""
    proto = _load(model)
    settings = declared(proto, threads=threads)
    return make_session(proto.SerializeToString(), settings)


def _load(model: str | os.PathLike | onnx.ModelProto) -> onnx.ModelProto:
    if isinstance(model, onnx.ModelProto):
        return model
    try:
        return onnx.load(os.fspath(model))
    except FileNotFoundError:
        raise RlflowError(f"no such file: {model}") from None
    except Exception as error:  # protobuf raises several types for a corrupt file
        raise RlflowError(f"{model} is not a valid ONNX model: {first_line(error)}") from None


__all__ = ["InferenceSession", "declared"]

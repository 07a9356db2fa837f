"""The hardware a model is tuned for: execution provider and, on CPU, the NCHWc block size.

onnxruntime's blocked-layout CPU kernels (the `com.microsoft.nchwc` ops) pack channels in blocks
whose size MLAS picks from the CPU's vector width: 8 floats with AVX2, 16 with AVX-512. A graph
holding nchwc ops and weights reordered for one block size computes garbage, or fails, on a CPU
with the other; so a model optimised in offline mode records the target it was tuned for, and
`rlflow.runtime` refuses to open it on another (`check_target`).
"""

from __future__ import annotations

import functools
import json
import platform
import tempfile
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from rlflow.errors import RlflowError
from rlflow.graph.domains import NCHWC_DOMAIN

TARGET_KEY = "rlflow.target"
"""The metadata entry of an optimised model that names its target (JSON of `Target`)."""


@functools.cache
def nchwc_block_size() -> int | None:
    """MLAS's NCHWc channel block on this CPU, as onnxruntime uses it; None if onnxruntime here
    does not produce NCHWc graphs.

    Read off onnxruntime itself rather than guessed from CPU flags: a one-output-channel Conv
    optimised at level `all` comes back as an nchwc Conv whose reordered filter has its output
    channels padded to one block.
    """
    weight = numpy_helper.from_array(np.ones((1, 3, 1, 1), np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["y"])],
        "block_probe",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 4, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 1, 4, 4])],
        [weight],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    options = ort.SessionOptions()
    options.log_severity_level = 3
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "optimized.onnx"
        options.optimized_model_filepath = str(path)
        ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
        optimized = onnx.load(str(path))
    if not any(node.domain == NCHWC_DOMAIN for node in optimized.graph.node):
        return None
    reordered = [tensor for tensor in optimized.graph.initializer if len(tensor.dims) == 4]
    return int(reordered[0].dims[0]) if reordered else None


@dataclass(frozen=True)
class Target:
    """Where an optimised model is meant to run."""

    provider: str
    """cpu | cuda."""
    nchwc_block: int | None = None
    """The NCHWc block size its nchwc ops were made for (None: it has none)."""
    machine: str = ""
    """The CPU architecture it was tuned on (informative: the block size is what must match)."""

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> Target:
        try:
            values = json.loads(text)
            return cls(
                provider=str(values["provider"]),
                nchwc_block=values.get("nchwc_block"),
                machine=str(values.get("machine", "")),
            )
        except (ValueError, KeyError, TypeError):
            raise RlflowError(f"unreadable {TARGET_KEY} metadata: {text[:80]!r}") from None

    def describe(self) -> str:
        block = f", NCHWc block {self.nchwc_block}" if self.nchwc_block else ""
        return f"{self.provider}{block}" + (f" ({self.machine})" if self.machine else "")


def target_for(provider: str, domains: set[str]) -> Target:
    """The target of a graph using operator `domains`, tuned here for `provider`."""
    block = nchwc_block_size() if provider == "cpu" and NCHWC_DOMAIN in domains else None
    return Target(provider=provider, nchwc_block=block, machine=platform.machine())


def check_target(metadata: Mapping[str, str], provider: str) -> None:
    """RlflowError if a model's recorded target cannot run here on `provider`: another NCHWc
    block size, or another execution provider than it was tuned for with nchwc ops inside."""
    text = metadata.get(TARGET_KEY)
    if text is None:
        return
    target = Target.from_json(text)
    if target.nchwc_block is None:
        return
    if provider != "cpu":
        raise RlflowError(
            f"this model holds onnxruntime's NCHWc CPU ops (tuned for {target.describe()}); "
            f"it cannot run on the {provider} provider: optimise the original for it instead"
        )
    here = nchwc_block_size()
    if here != target.nchwc_block:
        found = f"block {here}" if here else "no NCHWc support"
        raise RlflowError(
            f"this model was tuned for NCHWc block {target.nchwc_block} ({target.describe()}); "
            f"this CPU has {found}: optimise the original here, or use --deploy online"
        )


__all__ = ["TARGET_KEY", "Target", "check_target", "nchwc_block_size", "target_for"]

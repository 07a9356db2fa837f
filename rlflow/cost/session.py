"""Build onnxruntime sessions from one settings object, so every measurement names its backend.

The execution provider is chosen at run time: CUDA when onnxruntime-gpu sees a GPU, else
CPU, through the same code path. Threads are pinned (intra-op N, inter-op 1, sequential
execution) because on the 2-core shared machines a free thread count made repeat timings of
one model drift by ~5%, one thread by ~1%.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace

import onnxruntime as ort

from rlflow.errors import RlflowError

ORT_LEVELS = {
    "disable": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
    "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
    "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
    "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
}
PROVIDERS = {"cpu": "CPUExecutionProvider", "cuda": "CUDAExecutionProvider"}


@dataclass(frozen=True)
class OrtSettings:
    """How onnxruntime runs a model; part of every cache key and every reported result."""

    threads: int = 1
    """Intra-op threads (inter-op is always 1, execution sequential)."""
    ort_level: str = "all"
    """ORT graph optimisation: all | extended | basic | disable."""
    provider: str = "auto"
    """auto | cpu | cuda; auto picks cuda when onnxruntime lists CUDAExecutionProvider."""

    def __post_init__(self) -> None:
        if self.ort_level not in ORT_LEVELS:
            raise RlflowError(
                f"unknown ORT level {self.ort_level!r}; choose one of {', '.join(ORT_LEVELS)}"
            )
        if self.provider not in ("auto", *PROVIDERS):
            raise RlflowError(f"unknown provider {self.provider!r}; choose auto, cpu or cuda")
        if self.threads < 1:
            raise RlflowError(f"threads must be at least 1, got {self.threads}")

    def resolved(self) -> OrtSettings:
        """The same settings with `provider` made concrete for this machine."""
        if self.provider != "auto":
            if PROVIDERS[self.provider] not in ort.get_available_providers():
                raise RlflowError(f"onnxruntime here has no {PROVIDERS[self.provider]}")
            return self
        cuda = PROVIDERS["cuda"] in ort.get_available_providers()
        return replace(self, provider="cuda" if cuda else "cpu")

    def key(self) -> str:
        """A stable text for cache keys (provider resolved, onnxruntime version included)."""
        fields = asdict(self.resolved())
        return ",".join(f"{k}={v}" for k, v in sorted(fields.items())) + f",ort={ort.__version__}"


def make_session(model_bytes: bytes, settings: OrtSettings) -> ort.InferenceSession:
    """An InferenceSession for a serialized model under `settings` (onnxruntime errors propagate)."""
    settings = settings.resolved()
    options = ort.SessionOptions()
    options.intra_op_num_threads = settings.threads
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.graph_optimization_level = ORT_LEVELS[settings.ort_level]
    options.log_severity_level = 3  # ORT's warnings (e.g. unused initializers) are not ours
    providers = [PROVIDERS[settings.provider]]
    if settings.provider != "cpu":
        providers.append(PROVIDERS["cpu"])  # for the nodes the GPU provider does not take
    return ort.InferenceSession(model_bytes, options, providers=providers)

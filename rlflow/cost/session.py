"""Build onnxruntime sessions from one settings object, so every measurement names its backend.

The execution provider is chosen at run time: CUDA when onnxruntime-gpu sees a GPU, else
CPU, through the same code path. Threads are pinned (intra-op N, inter-op 1, sequential
execution) because on the 2-core shared machines a free thread count made repeat timings of
one model drift by ~5%, one thread by ~1%.

On CUDA every provider option that changes numerics is set explicitly (`CUDA_NUMERICS`, and
TF32 from `OrtSettings.tf32`, off by default: onnxruntime's own default turns it on, which
rounds fp32 matmuls and convolutions to 10-bit mantissas and would fail equivalence checks
the CPU passes), and `OrtSettings.provider_options()` is what results record. A timed run on
CUDA keeps its inputs and outputs on the device and waits for the device before the clock
stops (`timed_run`), so a time is the kernels' and not a host copy's or a queue's.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np
import onnxruntime as ort

from rlflow.errors import RlflowError

ORT_LEVELS = {
    "disable": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
    "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
    "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
    **(
        {"layout": ort.GraphOptimizationLevel.ORT_ENABLE_LAYOUT}
        if hasattr(ort.GraphOptimizationLevel, "ORT_ENABLE_LAYOUT")
        else {}
    ),
    "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
}
"""onnxruntime's optimisation levels, lowest first (`layout`, the NCHWc/NHWC passes, exists from
onnxruntime 1.2x on)."""
PROVIDERS = {"cpu": "CPUExecutionProvider", "cuda": "CUDAExecutionProvider"}
CUDA_NUMERICS = {
    "cudnn_conv_algo_search": "EXHAUSTIVE",
    "prefer_nhwc": "0",
    "enable_skip_layer_norm_strict_mode": "1",
    "cudnn_conv1d_pad_to_nc1d": "0",
    "tunable_op_enable": "0",
}
"""CUDA provider options that change which kernel runs or how it rounds, fixed here rather
than left to onnxruntime's defaults (which move between versions); `use_tf32` comes from
`OrtSettings.tf32`. EXHAUSTIVE is onnxruntime's default search for cuDNN's convolution
algorithm, the fastest one it finds, as a deployed session would pick."""
TIMING_VERSION = 2
"""Part of every cache key: bump it when how a run is timed changes, so that timings taken the
old way are not found again (2: runs through an IOBinding, see `timed_run`)."""


@dataclass(frozen=True)
class OrtSettings:
    """How onnxruntime runs a model; part of every cache key and every reported result."""

    threads: int = 1
    """Intra-op threads (inter-op is always 1, execution sequential)."""
    ort_level: str = "all"
    """ORT graph optimisation: all | extended | basic | disable."""
    provider: str = "auto"
    """auto | cpu | cuda; auto picks cuda when onnxruntime lists CUDAExecutionProvider."""
    disabled: tuple[str, ...] = ()
    """onnxruntime graph transformers (or rewrite rules) switched off at this level, by name
    (e.g. "SkipLayerNormFusion"): one of ORT's own tuning knobs."""
    tf32: bool = False
    """CUDA: let fp32 matmuls and convolutions run on TF32 tensor cores (faster, ~1e-3 relative
    error); off by default so that CUDA results match the CPU's. No effect on CPU."""

    def __post_init__(self) -> None:
        if self.ort_level not in ORT_LEVELS:
            raise RlflowError(
                f"unknown ORT level {self.ort_level!r}; choose one of {', '.join(ORT_LEVELS)}"
            )
        if self.provider not in ("auto", *PROVIDERS):
            raise RlflowError(f"unknown provider {self.provider!r}; choose auto, cpu or cuda")
        if self.threads < 1:
            raise RlflowError(f"threads must be at least 1, got {self.threads}")
        object.__setattr__(self, "disabled", tuple(sorted(set(self.disabled))))

    @property
    def label(self) -> str:
        """The level, and the passes switched off: `all`, `all-SkipLayerNormFusion`."""
        return "-".join([self.ort_level, *self.disabled])

    def resolved(self) -> OrtSettings:
        """The same settings with `provider` made concrete for this machine."""
        if self.provider != "auto":
            if PROVIDERS[self.provider] not in ort.get_available_providers():
                raise RlflowError(f"onnxruntime here has no {PROVIDERS[self.provider]}")
            return self
        return replace(self, provider=default_provider())

    def key(self) -> str:
        """A stable text for cache keys (provider resolved, onnxruntime and timing versions; on
        CUDA the GPU's name)."""
        fields = asdict(self.resolved())
        if not fields["disabled"]:
            del fields["disabled"]  # keys made before the field existed stay valid
        if fields["provider"] == "cpu":
            del fields["tf32"]  # no effect on CPU; CPU keys made before it stay valid
        else:  # a cache carried from one GPU to another must not hand over its timings
            fields["gpu"] = gpu_name()
        text = ",".join(f"{k}={v}" for k, v in sorted(fields.items()))
        return f"{text},ort={ort.__version__},timing=v{TIMING_VERSION}"

    def provider_options(self) -> dict[str, str]:
        """The options the execution provider is created with (none on CPU): recorded with
        results, since on CUDA they decide numerics."""
        provider = default_provider() if self.provider == "auto" else self.provider
        if provider != "cuda":
            return {}
        return {"device_id": "0", **CUDA_NUMERICS, "use_tf32": "1" if self.tf32 else "0"}


@functools.cache
def gpu_name() -> str | None:
    """The name of the GPU that CUDA timings ran on (read once per process)."""
    from rlflow.cost.device import gpu_facts

    return gpu_facts()["device"]


def default_provider() -> str:
    """cuda when onnxruntime here lists CUDAExecutionProvider, else cpu (what `auto` means)."""
    return "cuda" if PROVIDERS["cuda"] in ort.get_available_providers() else "cpu"


def make_session(
    model_bytes: bytes, settings: OrtSettings, *, profile_prefix: str | None = None
) -> ort.InferenceSession:
    """An InferenceSession for a serialized model under `settings` (ORT errors propagate);
    with `profile_prefix`, onnxruntime's profiler records every run (`end_profiling()` writes
    the JSON file starting with that prefix)."""
    settings = settings.resolved()
    options = ort.SessionOptions()
    if profile_prefix is not None:
        options.enable_profiling = True
        options.profile_file_prefix = profile_prefix
    options.intra_op_num_threads = settings.threads
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.graph_optimization_level = ORT_LEVELS[settings.ort_level]
    options.log_severity_level = 4  # failures reach the caller as exceptions; no log spam
    wanted = PROVIDERS[settings.provider]
    providers: list = [PROVIDERS["cpu"]]
    if settings.provider != "cpu":
        _preload_cuda_libraries()
        # CPU last, for the nodes the GPU provider does not take.
        providers.insert(0, (wanted, settings.provider_options()))
    extra = {"disabled_optimizers": list(settings.disabled)} if settings.disabled else {}
    session = ort.InferenceSession(model_bytes, options, providers=providers, **extra)
    if session.get_providers()[0] != wanted:
        # onnxruntime falls back to the CPU, with a warning only, when the GPU provider cannot
        # start (a missing cuDNN, say): a measurement would then silently be the CPU's.
        raise RlflowError(
            f"onnxruntime could not start {wanted} (it fell back to "
            f"{session.get_providers()[0]}): check the CUDA and cuDNN libraries it needs"
        )
    return session


_cuda_preloaded = False


def _preload_cuda_libraries() -> None:
    """Load the CUDA and cuDNN libraries of pip's nvidia-* packages, where installed, before
    the first CUDA session (onnxruntime-gpu's own `preload_dlls`; the libraries on the system's
    path are used where it finds none). Once per process; a failure is left to the session."""
    global _cuda_preloaded
    if not _cuda_preloaded and hasattr(ort, "preload_dlls"):
        try:
            with contextlib.redirect_stdout(sys.stderr):  # stdout may carry one JSON object
                ort.preload_dlls()
        except Exception:  # no nvidia-* packages: the session looks on the system's path
            pass
    _cuda_preloaded = True


def timed_run(
    session: ort.InferenceSession, feeds: Mapping[str, np.ndarray]
) -> Callable[[], float]:
    """A function that runs `session` once on `feeds` and returns the wall time in ms.

    Inputs are bound once through an IOBinding and outputs are returned on the host, which is
    what a deployed model pays per call: ~5 us of overhead here, against ~10 us for
    `session.run` (numpy conversion) and ~70 us for `run_with_ort_values`, which would
    otherwise dominate the timings of small operators. On CUDA see `_timed_device_run`.
    """
    if session.get_providers()[0] == PROVIDERS["cuda"]:
        return _timed_device_run(session, feeds)
    binding = session.io_binding()
    for name, array in feeds.items():
        binding.bind_cpu_input(name, np.ascontiguousarray(array))
    for output in session.get_outputs():
        binding.bind_output(output.name)

    def run() -> float:
        start = time.perf_counter_ns()
        session.run_with_iobinding(binding)
        return (time.perf_counter_ns() - start) / 1e6

    return run


def _timed_device_run(
    session: ort.InferenceSession, feeds: Mapping[str, np.ndarray]
) -> Callable[[], float]:
    """`timed_run` on CUDA: inputs copied to the device once and bound there, outputs bound to
    device memory (a deployed GPU model hands its results to the next GPU step, not to the
    host), and the clock stopped only once the device has finished: kernels are launched
    asynchronously, and a run's wall time without the wait would be the launch time only."""
    binding = session.io_binding()
    on_device = {
        name: ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(array), "cuda", 0)
        for name, array in feeds.items()
    }
    for name, value in on_device.items():
        binding.bind_ortvalue_input(name, value)
    for output in session.get_outputs():
        binding.bind_output(output.name, "cuda", 0)
    binding.synchronize_inputs()  # the copies to the device are done before any timing

    def run() -> float:
        start = time.perf_counter_ns()
        session.run_with_iobinding(binding)
        binding.synchronize_outputs()
        return (time.perf_counter_ns() - start) / 1e6

    return run  # the binding holds its own references to the device copies


def kernel_times_ms(
    model_bytes: bytes,
    settings: OrtSettings,
    feeds: Mapping[str, np.ndarray],
    runs: int,
    warmup: int = 5,
) -> dict[str, float]:
    """Each node's median kernel time in ms *inside* the graph, from onnxruntime's profiler,
    over `runs` runs after `warmup` left out (the first runs allocate and prepack).

    What a node costs inside its graph, where the operators before it decide what is still in
    the cache, as against alone: the diagnostics that compare the two, or a node's time with its
    roofline floor, read it here."""
    prefix = os.path.join(tempfile.gettempdir(), "rlflow_kernel_profile")
    session = make_session(model_bytes, settings, profile_prefix=prefix)
    run = timed_run(session, feeds)
    for _ in range(warmup + runs):
        run()
    path = Path(session.end_profiling())
    events = json.loads(path.read_text())
    path.unlink()
    times: dict[str, list[float]] = defaultdict(list)
    for event in events:
        name = event.get("name", "")
        if event.get("cat") == "Node" and name.endswith("_kernel_time"):
            times[name.removesuffix("_kernel_time")].append(event["dur"] / 1000)
    return {node: statistics.median(values[warmup:]) for node, values in times.items()}

"""This machine's peak arithmetic rate and memory bandwidths, as onnxruntime reaches them.

The roofline floor divides by these, so they must be real peaks: on a shared machine a short
measurement catches a slow moment and underrates the machine (we saw a whole ResNet run at
117 GFLOP/s while a 160 ms MatMul measurement said 77), and the "floor" then lies above
measured latency. So each peak is the best rate over a time budget, not over a few runs:

- arithmetic: a 512x512x512 fp32 MatMul (cache-resident, so MLAS runs at its peak);
- DRAM bandwidth: an elementwise Add streaming a 128 MB buffer into another (read + write),
  far beyond any last-level cache;
- cache bandwidth: the same Add on buffers that together fill half of L2. The analytic model
  uses it for operators whose bytes fit in the last-level cache: it is an upper bound on any
  in-cache bandwidth, so the floor stays a floor.

All in onnxruntime with the configured threads; measured once per (machine, threads,
provider, onnxruntime version) and cached in `peaks.json` in the cache directory.

`RLFLOW_PEAKS` (JSON of `MachinePeaks`' fields, e.g. `{"gflops": 250, "gbps": 40}`) pins them
instead: analytic costs then agree across machines, as a reproducible experiment (or a test of
a seeded learner) needs.
"""

from __future__ import annotations

import json
import os
import platform
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper

from rlflow.cost.cache import cache_dir, read_json, update_json_atomic
from rlflow.cost.device import cpu_model
from rlflow.cost.session import OrtSettings, make_session, timed_run
from rlflow.cost.timing_lock import exclusive_timing
from rlflow.errors import RlflowError
from rlflow.graph.shapes import max_ort_ir_version

PEAKS_VERSION = 2  # part of the cache key: bump when what is measured changes
MATMUL_SIZE = 512
DRAM_ELEMENTS = 32 * 1024 * 1024  # 128 MB per buffer
BUDGET_S = 1.0  # per peak: long enough to catch the machine at its fastest
MIN_RUNS = 10
_FALLBACK_CACHES = {2: 1 << 20, 3: 32 << 20}  # when sysfs does not say (bytes)


@dataclass(frozen=True)
class MachinePeaks:
    """Peak fp32 matmul rate and bandwidths reached through onnxruntime."""

    gflops: float
    """Best fp32 MatMul rate, GFLOP/s."""
    gbps: float
    """Best DRAM streaming bandwidth (read + write), GB/s."""
    cache_gbps: float | None = None
    """Best in-cache streaming bandwidth, GB/s; None: use `gbps` for everything."""
    cache_bytes: int = 0
    """Last-level cache size: operators moving at most this many bytes use `cache_gbps`."""


_memory: dict[str, MachinePeaks] = {}
PINNED_PEAKS = "RLFLOW_PEAKS"
"""The environment variable that pins the peaks (see the module docstring)."""


def _pinned(text: str) -> MachinePeaks:
    try:
        return MachinePeaks(**json.loads(text))
    except (ValueError, TypeError) as error:
        raise RlflowError(
            f"{PINNED_PEAKS} must be JSON of gflops, gbps, cache_gbps, cache_bytes: {error}"
        ) from None


def machine_peaks(settings: OrtSettings, *, refresh: bool = False) -> MachinePeaks:
    """The peaks for `settings`' threads and provider: cached, or measured (~3 s) and cached.

    `refresh` measures again and keeps, per peak, the better of the old and new values: a
    peak is a best case, and a re-measurement in a noisy minute must not lower it.
    """
    pinned = os.environ.get(PINNED_PEAKS)
    if pinned:
        return _pinned(pinned)
    settings = replace(settings.resolved(), ort_level="all")
    key = f"{_machine()}|{settings.key()},peaks=v{PEAKS_VERSION}"
    if not refresh and key in _memory:
        return _memory[key]
    path = cache_dir() / "peaks.json"
    entry = read_json(path).get(key)
    if entry and not refresh:
        peaks = MachinePeaks(**entry)
    else:
        peaks = measure_peaks(settings)
        if entry:
            peaks = best_of(MachinePeaks(**entry), peaks)
        update_json_atomic(path, {key: asdict(peaks)})
    _memory[key] = peaks
    return peaks


def best_of(old: MachinePeaks, new: MachinePeaks) -> MachinePeaks:
    """Each peak the better of two measurements (a peak is a best case); `new`'s cache size."""
    return MachinePeaks(
        gflops=max(old.gflops, new.gflops),
        gbps=max(old.gbps, new.gbps),
        cache_gbps=max(old.cache_gbps or 0.0, new.cache_gbps or 0.0) or None,
        cache_bytes=new.cache_bytes,
    )


def measure_peaks(settings: OrtSettings, budget_s: float = BUDGET_S) -> MachinePeaks:
    """Measure the peaks now (no cache), spending about `budget_s` on each."""
    n = MATMUL_SIZE
    rng = np.random.default_rng(0)
    weights = {"w": rng.standard_normal((n, n), dtype=np.float32)}
    matmul = _one_node_model("MatMul", [n, n], weights, [n, n])
    matmul_ms = _best_ms(matmul, settings, rng.standard_normal((n, n), dtype=np.float32), budget_s)
    l2_bytes, llc_bytes = _cache_size(2), _cache_size(3)
    dram_gbps = _stream_gbps(DRAM_ELEMENTS, settings, budget_s)
    # Input and output buffers together fill half of L2, leaving room for everything else.
    cache_gbps = _stream_gbps(l2_bytes // 16, settings, budget_s / 2)
    return MachinePeaks(
        gflops=2.0 * n**3 / (matmul_ms * 1e-3) / 1e9,
        gbps=dram_gbps,
        cache_gbps=max(cache_gbps, dram_gbps),
        cache_bytes=llc_bytes,
    )


def _stream_gbps(elements: int, settings: OrtSettings, budget_s: float) -> float:
    stream = _one_node_model("Add", [elements], {"w": np.ones(1, np.float32)}, [elements])
    best_ms = _best_ms(stream, settings, np.ones(elements, dtype=np.float32), budget_s)
    return 2.0 * 4 * elements / (best_ms * 1e-3) / 1e9


def _one_node_model(
    op_type: str, x_shape: list[int], constants: dict[str, np.ndarray], y_shape: list[int]
) -> onnx.ModelProto:
    graph = helper.make_graph(
        [helper.make_node(op_type, ["x", *constants], ["y"])],
        "peak",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, x_shape)],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, y_shape)],
        [numpy_helper.from_array(array, name) for name, array in constants.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = min(model.ir_version, max_ort_ir_version())
    return model


def _best_ms(
    model: onnx.ModelProto, settings: OrtSettings, x: np.ndarray, budget_s: float
) -> float:
    """The fastest of as many runs as fit in `budget_s` (at least MIN_RUNS)."""
    with exclusive_timing():
        run = timed_run(make_session(model.SerializeToString(), settings), {"x": x})
        run()
        best, runs, deadline = float("inf"), 0, time.perf_counter() + budget_s
        while runs < MIN_RUNS or time.perf_counter() < deadline:
            best, runs = min(best, run()), runs + 1
    return best


def _cache_size(level: int) -> int:
    """Bytes of the CPU's unified or data cache at `level`, from sysfs (else a guess)."""
    for index in sorted(Path("/sys/devices/system/cpu/cpu0/cache").glob("index*")):
        try:
            if int((index / "level").read_text()) != level:
                continue
            if (index / "type").read_text().strip() == "Instruction":
                continue
            text = (index / "size").read_text().strip().upper()
        except (OSError, ValueError):
            continue
        units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
        if text and text[-1] in units:
            return int(text[:-1]) * units[text[-1]]
        if text.isdigit():
            return int(text)
    return _FALLBACK_CACHES[level]


def _machine() -> str:
    """What the peaks belong to: CPU model and count (a cache dir may outlive its machine)."""
    return f"{platform.machine()} {cpu_model()} x{os.cpu_count()}"

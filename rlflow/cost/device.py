"""What a measurement ran on: the CPU's model, or the GPU's name, driver and CUDA version.

Cost tables carry this (`rlflow costs collect`), since a table's timings hold only for the
device, driver and onnxruntime build that produced them. GPU facts come from `nvidia-smi`
(no torch, no CUDA bindings needed); anything that cannot be read is None, never an error.
"""

from __future__ import annotations

import os
import platform
import re
import subprocess
from pathlib import Path
from typing import Any

import onnxruntime as ort


def cpu_model() -> str:
    """The CPU's model name (from /proc/cpuinfo where there is one)."""
    model_name = platform.processor()
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        for line in cpuinfo.read_text(errors="replace").splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return model_name or platform.machine()


def _nvidia_smi(*args: str) -> str | None:
    try:
        done = subprocess.run(
            ["nvidia-smi", *args], capture_output=True, text=True, timeout=30, check=True
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout


def gpu_facts() -> dict[str, str | None]:
    """The first GPU's name and driver, and the highest CUDA version the driver supports."""
    listing = _nvidia_smi("--query-gpu=name,driver_version", "--format=csv,noheader")
    name = driver = cuda = None
    if listing and listing.strip():
        parts = [part.strip() for part in listing.strip().splitlines()[0].split(",")]
        name, driver = parts[0], parts[1] if len(parts) > 1 else None
    banner = _nvidia_smi()
    found = re.search(r"CUDA Version:\s*([\d.]+)", banner or "")
    if found:
        cuda = found.group(1)
    return {"device": name, "driver": driver, "cuda": cuda}


def device_info(provider: str) -> dict[str, Any]:
    """The facts a table or a benchmark records about where it measured on `provider`."""
    info: dict[str, Any] = {
        "provider": provider,
        "onnxruntime": ort.__version__,
        "onnxruntime_build": ort.get_build_info() if hasattr(ort, "get_build_info") else None,
        "machine": platform.machine(),
        "cpu": cpu_model(),
        "cpus": os.cpu_count(),
    }
    if provider == "cuda":
        info.update(gpu_facts())
    else:
        info.update(device=info["cpu"], driver=None, cuda=None)
    return info


__all__ = ["cpu_model", "device_info", "gpu_facts"]

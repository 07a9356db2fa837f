"""One measurement at a time per machine, across processes.

Rewriting graphs is CPU work that parallelises well; timing them is not: two processes timing
on one device at once (one GPU, or the same CPU cores) slow each other down and both record
the interference. So processes that share a device can share one lock file: when
`$RLFLOW_TIMING_LOCK` names a file, every use of the device that must not overlap another --
a Runner's interleaved runs, an operator timed alone by the per-op model, a peak measurement,
an equivalence check's runs -- holds an exclusive `flock` on it, and everything else (rule
matching, searches, training) runs in parallel. `rlflow costs collect --jobs N` sets it for
its workers; several `rlflow bench` processes on one machine set it by hand
(`RLFLOW_TIMING_LOCK=/tmp/rlflow-timing.lock rlflow bench ... &`). Unset (the default), it
costs nothing. This is the in-machine counterpart of the Ray backend's one timer actor per
machine (`rlflow.agents.ray_workers`).

The lock keeps timings apart from each other, not from the other processes' CPU work: on a GPU
that work does not touch the timed kernels, but on the CPU provider it shares caches and memory
bandwidth with the timed run, so there parallel workers pay only where the machine has cores
to spare beyond the timing's (on two cores, time with one process).
"""

from __future__ import annotations

import fcntl
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager

ENV_VAR = "RLFLOW_TIMING_LOCK"
_held = threading.local()


@contextmanager
def exclusive_timing() -> Iterator[None]:
    """Hold the machine's timing lock (`$RLFLOW_TIMING_LOCK`) for the block, if one is set.

    Re-entrant within a thread (a flock taken twice through two file handles of one process
    would wait for itself)."""
    path = os.environ.get(ENV_VAR)
    if not path or getattr(_held, "depth", 0):
        _held.depth = getattr(_held, "depth", 0) + 1
        try:
            yield
        finally:
            _held.depth -= 1
        return
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        _held.depth = 1
        try:
            yield
        finally:
            _held.depth = 0
            fcntl.flock(handle, fcntl.LOCK_UN)


__all__ = ["ENV_VAR", "exclusive_timing"]

"""How a trained advantage run is named on the command line: `guided:RUN_DIR`.

`rlflow search`, `rlflow optimize` and `rlflow bench` take `--method guided:RUN_DIR`; the run is
checked here (a directory whose config.yaml says `kind: advantage`) before any model loads, and
without torch, as `rlflow.agents.spec` does for `agent:RUN_DIR`.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from rlflow.config import run_kind
from rlflow.errors import RlflowError

GUIDED_PREFIX = "guided:"
RUN_KIND = "advantage"
"""The `kind` in the config.yaml of a `rlflow train-advantage` run."""


def is_guided_spec(text: str) -> bool:
    """Whether a method name is `guided:RUN_DIR` (or `guided` alone, which lacks its run)."""
    return text == GUIDED_PREFIX[:-1] or text.startswith(GUIDED_PREFIX)


def read_advantage_run(run_dir: str | Path) -> Path:
    """The run directory, if it holds a `rlflow train-advantage` run; else RlflowError."""
    path, kind = run_kind(run_dir, "advantage", "a `rlflow train-advantage` run")
    config_path = path / "config.yaml"
    if kind != RUN_KIND:
        raise RlflowError(
            f"{config_path} is a {kind!r} run, not a {RUN_KIND!r} run of `rlflow train-advantage`"
        )
    return path


def run_digest(run_dir: str | Path) -> str | None:
    """A digest of a run's checkpoint (None before its first epoch): what a bench cell of
    `guided:RUN_DIR` was made with, so that a cell is redone once the run has trained again."""
    path = Path(run_dir) / "checkpoints" / "latest.pt"
    if not path.is_file():
        return None
    return hashlib.sha256(path.read_bytes()).hexdigest()[:16]


def parse_guided(text: str) -> Path:
    """`guided:RUN_DIR` as the run directory (checked)."""
    prefix, _, run_dir = text.partition(":")
    if prefix != GUIDED_PREFIX[:-1] or not run_dir:
        raise RlflowError(f"bad method {text!r}: expected guided:RUN_DIR (a train-advantage run)")
    return read_advantage_run(run_dir)


__all__ = [
    "GUIDED_PREFIX",
    "RUN_KIND",
    "is_guided_spec",
    "parse_guided",
    "read_advantage_run",
    "run_digest",
]

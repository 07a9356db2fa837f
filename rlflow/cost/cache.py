"""Where measurements are cached on disk, and how cache files are written without tearing.

Every cache lives under `$RLFLOW_CACHE_DIR` if set, else `~/.cache/rlflow`. Files are written
to a temporary name and renamed, so a killed run or a concurrent writer never leaves half a file
(`rlflow.fileio`).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from rlflow.fileio import write_json_atomic


def cache_dir() -> Path:
    """The directory for rlflow's caches (created on first use)."""
    root = os.environ.get("RLFLOW_CACHE_DIR")
    path = Path(root) if root else Path.home() / ".cache" / "rlflow"
    path.mkdir(parents=True, exist_ok=True)
    return path


def read_json(path: Path) -> dict[str, Any]:
    """A JSON object from `path`, or {} if it is missing or unreadable (a cache can be rebuilt)."""
    try:
        with open(path, encoding="utf-8") as handle:
            data = json.load(handle)
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def update_json_atomic(path: Path, entries: dict[str, Any]) -> dict[str, Any]:
    """Merge `entries` into the JSON object at `path` and write it back atomically.

    The file is re-read first so that entries another process wrote meanwhile are kept
    (a race between two writers can still lose the other's newest entries, never corrupt).
    """
    data = read_json(path)
    data.update(entries)
    write_json_atomic(path, data)
    return data


__all__ = ["cache_dir", "read_json", "update_json_atomic", "write_json_atomic"]

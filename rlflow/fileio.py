"""Writing files so that a killed job never leaves half of one: temporary name, then rename.

Every file rlflow writes for later use (models, caches, datasets, checkpoints, reports) goes
through here, so that the guarantee and the file mode are the same everywhere.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


# mkstemp creates 0600 files; an output should get the mode a plain open() would give it.
_FILE_MODE = 0o666 & ~_umask()


def write_bytes_atomic(path: str | os.PathLike, data: bytes) -> Path:
    """Write `data` to a temporary file beside `path`, then rename it over `path`.

    The temporary name (`.NAME.XXXX.tmp`) never ends like the real one, so a killed writer
    leaves at worst a stray hidden *.tmp; concurrent writers each rename a whole file.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.chmod(tmp_name, _FILE_MODE)
        os.replace(tmp_name, path)
    except BaseException:
        Path(tmp_name).unlink(missing_ok=True)
        raise
    return path


def write_text_atomic(path: str | os.PathLike, text: str) -> Path:
    """`write_bytes_atomic` for UTF-8 text."""
    return write_bytes_atomic(path, text.encode("utf-8"))


def write_json_atomic(path: str | os.PathLike, data: Any) -> Path:
    """`data` as indented, key-sorted JSON, written atomically."""
    return write_text_atomic(path, json.dumps(data, indent=1, sort_keys=True))


def write_torch_atomic(path: str | os.PathLike, payload: Any) -> Path:
    """`torch.save(payload)` written atomically (a killed run leaves the old checkpoint)."""
    import io

    import torch  # lazy: the CLI's light commands never save a checkpoint

    buffer = io.BytesIO()
    torch.save(payload, buffer)
    return write_bytes_atomic(path, buffer.getvalue())

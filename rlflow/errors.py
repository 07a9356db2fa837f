"""The one exception type for errors a user can cause (bad path, unsupported model, ...).

The CLI prints its message as one line on stderr and exits with code 2; anything
else escaping is a bug and keeps its traceback.
"""

from __future__ import annotations


class RlflowError(Exception):
    """A user-facing error: the message must make sense on its own, in one line."""


def first_line(error: BaseException, limit: int = 300) -> str:
    """The first line of an exception's message, cut to `limit` characters.

    Libraries (onnx, onnxruntime, protobuf) raise multi-line messages; a user sees one line.
    """
    lines = str(error).strip().splitlines()
    return lines[0][:limit] if lines else type(error).__name__

"""The one exception type for errors a user can cause (bad path, unsupported model, ...).

The CLI prints its message as one line on stderr and exits with code 2; anything
else escaping is a bug and keeps its traceback.
"""

from __future__ import annotations


class RlflowError(Exception):
    """A user-facing error: the message must make sense on its own, in one line."""

"""TensorBoard event files under a run directory: the one writer every trainer logs through.

PPO (`rlflow train-ppo`), the world model (`rlflow train-wm`) and the dream controller
(`rlflow train-controller`) all write their curves under their RUN_DIR. The writer opens on
first use, so torch.utils.tensorboard (slow to import) loads only when something is written
and the CLI starts fast.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

EVENT_FILE_PREFIX = "events.out.tfevents."


class TensorBoard:
    """Scalars and text for `tensorboard --logdir RUN_DIR`.

    `purge_step`: a resumed run passes the step it resumes after, so that TensorBoard drops
    what a killed run logged past its last checkpoint instead of drawing it twice.
    """

    def __init__(self, run_dir: str | Path, *, purge_step: int | None = None) -> None:
        self.run_dir, self.purge_step = Path(run_dir), purge_step
        self._writer: Any = None

    def scalar(self, tag: str, value: float, step: int) -> None:
        self._open().add_scalar(tag, float(value), step)

    def text(self, tag: str, text: str, step: int) -> None:
        self._open().add_text(tag, text, step)

    def flush(self) -> None:
        """Write what is buffered now (e.g. with a checkpoint, so the curves match it)."""
        if self._writer is not None:
            self._writer.flush()

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None

    def __enter__(self) -> TensorBoard:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _open(self) -> Any:
        if self._writer is None:
            from torch.utils.tensorboard import SummaryWriter

            wait_past_earlier_event_files(self.run_dir)
            self._writer = SummaryWriter(log_dir=str(self.run_dir), purge_step=self.purge_step)
        return self._writer


def wait_past_earlier_event_files(run_dir: Path) -> None:
    """Wait for the next second if an event file in `run_dir` was made in this one.

    TensorBoard reads a directory's event files in name order, and a name is the second it was
    made in, then host, process id and a counter compared as text (pid 9999 after 10000): a
    file made in the same second as an earlier one may sort before it, and a resumed run's
    curve would then be read out of order. Only a rerun within the second waits (under one).
    """
    now = time.time()
    if any(run_dir.glob(f"{EVENT_FILE_PREFIX}{int(now):010d}.*")):
        time.sleep(int(now) + 1 - now)

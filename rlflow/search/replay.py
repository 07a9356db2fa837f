"""`replay:RESULT.json`: a result found elsewhere, re-applied to the model here and timed here.

An optimised model is as large as its weights (528 MB for the full-size BERT), while the path
that made it is a few kilobytes: `rlflow optimize --json` and `rlflow bench` record every
result's episode (rule, site and resulting hash per step, `rlflow.rewrite.session.EpisodeState`).
A search run on a CPU machine by a GPU's cost table, or an agent trained there, is then timed on
the GPU by re-applying that episode to the same model (`RewriteSession.replay`, which checks
every hash on the way) and measuring the result exactly as a search's (`rlflow.search.finish`):
against the original, kept only if it is faster here too. The episode starts where it was
recorded to start (`start_state`), and a graph ranked by a cost table is ranked by that table
again. The model must be the same graph: a zoo model exported by another torch may not be (the
replay then refuses in one line).
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlflow.cost import Runner
from rlflow.errors import RlflowError
from rlflow.graph import Graph
from rlflow.rewrite import RuleSet
from rlflow.rewrite.session import EpisodeState, RewriteSession
from rlflow.search.base import NO_PROGRESS, Board, Progress, SearchResult, finish
from rlflow.search.cost import SearchCost

REPLAY_PREFIX = "replay:"


@dataclass(frozen=True)
class Recording:
    """A recorded result: the file it came from, the episode, and where and how it was made."""

    path: Path
    episode: EpisodeState
    start_state: str
    """The start state the episode began from (`original`, `ort:all`, ...)."""
    cost_model: str
    """What ranked its graphs where it was made (`table:h200`, `perop`, ...)."""
    digest: str
    """Of the file: a bench cell made from it is redone when it changes."""

    @property
    def label(self) -> str:
        """A short name for tables: `replay:runs/x/bert-taso.json` -> `replay:bert-taso`."""
        return REPLAY_PREFIX + self.path.stem

    @property
    def table(self) -> str | None:
        """The cost table that ranked it (`table:NAME`), None for any other cost."""
        return self.cost_model if self.cost_model.startswith("table:") else None

    def __str__(self) -> str:
        return f"{REPLAY_PREFIX}{self.path}"


def is_replay_spec(text: str) -> bool:
    """Whether a method name is `replay:RESULT.json` (or `replay` alone, which lacks its file)."""
    return text == REPLAY_PREFIX[:-1] or text.startswith(REPLAY_PREFIX)


def read_recording(text: str) -> Recording:
    """`replay:RESULT.json` as a Recording: the file must be an `rlflow optimize --json` record
    (or one cell of a bench's results.json) holding an episode; RlflowError otherwise."""
    prefix, _, name = text.partition(":")
    if prefix != REPLAY_PREFIX[:-1] or not name:
        raise RlflowError(f"bad method {text!r}: expected replay:RESULT.json")
    path = Path(name)
    try:
        raw = path.read_bytes()
        record: Any = json.loads(raw)
    except OSError as error:
        raise RlflowError(f"replay: cannot read {path}: {error.strerror or error}") from None
    except ValueError as error:
        raise RlflowError(f"replay: {path} is not JSON ({error})") from None
    if not isinstance(record, dict) or not isinstance(record.get("episode"), dict):
        raise RlflowError(
            f"replay: {path} holds no episode (expected the output of `rlflow optimize --json`)"
        )
    return Recording(
        path=path,
        episode=EpisodeState.from_json(record["episode"]),
        start_state=str(record.get("start_state") or "original"),
        cost_model=str(record.get("cost_model") or "analytic"),
        digest=hashlib.sha256(raw).hexdigest()[:16],
    )


def search(
    recording: Recording,
    start: Graph,
    rules: RuleSet | None,
    cost: SearchCost,
    *,
    label: str,
    runner: Runner | None = None,
    progress: Progress = NO_PROGRESS,
    reference: Graph | None = None,
) -> SearchResult:
    """Re-apply the recorded episode to `start` (the model `label` at the recorded start state)
    and time the graph it reaches against it as a search's best graph is timed."""
    episode = recording.episode
    if start.canonical_hash() != episode.original_hash:
        raise RlflowError(
            f"replay: {recording.path} starts from another graph than {label} at "
            f"{recording.start_state} (it was recorded on {episode.model or 'a model'}; "
            "another model or size, or an export by another torch or onnxruntime?)"
        )
    started = time.perf_counter()
    progress.set_postfix_str(f"replaying {len(episode.actions)} steps", refresh=True)
    root = RewriteSession(start, rules, model=label)
    final = RewriteSession.replay(start, episode, root.ruleset, on_step=lambda _: progress.update())
    board = Board(1)
    board.offer(cost(final.graph), final)
    return finish(
        "replay",
        root,
        board,
        cost,
        expansions=len(final.actions),
        started=started,
        runner=runner,
        progress=progress,
        reference=reference,
        capped_by_cost=False,
    )


__all__ = ["REPLAY_PREFIX", "Recording", "is_replay_spec", "read_recording", "search"]

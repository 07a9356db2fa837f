"""The pipeline's counts: how many graphs, groups and pairs are left after each stage.

Enumeration, pruning and verification each count into one Stats, under the stage names of
STAGES, so that `rlflow rules generate` reports them in pipeline order; counts of why graphs or
pairs were dropped are added under other names and reported after the stages.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

STAGES = (
    "graphs enumerated",
    "fingerprint groups",
    "groups with two or more graphs",
    "candidate pairs",
    "after dropping trivial pairs",
    "after dropping pairs of two reducible graphs",
    "after merging input renamings",
    "after dropping common subgraphs",
    "after dropping common tails",
    "after dropping instances with a merged input",
    "after dropping side-by-side rules",
    "after verification",
)


@dataclass
class Stats:
    """Counts at each stage, for the report and the JSON summary."""

    counts: dict[str, int] = field(default_factory=lambda: defaultdict(int))

    def add(self, name: str, amount: int = 1) -> None:
        self.counts[name] += amount

"""The pipeline: enumerate, pair, prune, verify and name the rules of each rank, and write them.

Ranks are independent (rank 2 is the matmul family, rank 4 the conv family; pure elementwise
rules are generated once, at rank 2), so they run in worker processes side by side, and their
rules are then sorted into one stable order: rank, size, text. The same settings therefore
always give the same file.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from rlflow.errors import RlflowError
from rlflow.fileio import write_text_atomic
from rlflow.rewrite.generator.domain import VERIFY_VALUES
from rlflow.rewrite.generator.enumeration import Enumerator
from rlflow.rewrite.generator.menu import DEFAULT_OPS, MENU
from rlflow.rewrite.generator.naming import unique_names
from rlflow.rewrite.generator.pairs import Pair, domain_points, orient, star_pairs
from rlflow.rewrite.generator.prune import prune
from rlflow.rewrite.generator.rulefile import document_text, settings_summary, to_rule
from rlflow.rewrite.generator.stats import STAGES, Stats
from rlflow.rewrite.generator.verification import verify
from rlflow.rewrite.template import GENERATED_PATH

Point = dict[int, tuple[int, ...]]


def rank_rules(
    rank: int,
    op_types: Sequence[str],
    max_ops: int,
    num_inputs: int,
    check: bool = True,
    progress: bool = False,
) -> tuple[list[tuple[Pair, list[Point]]], dict[str, int]]:
    """Enumerate, pair, prune and verify the rules of one rank: (pair, verified points)."""
    stats = Stats()
    enumerator = Enumerator(rank, op_types, max_ops, num_inputs, stats)
    bar = _progress_bar(progress, f"rank {rank}: enumerate", rank)
    enumerator.run(bar)
    stats.add(STAGES[1], len(enumerator.groups))
    stats.add(STAGES[2], sum(len(g) > 1 for g in enumerator.groups.values()))
    candidates = list(star_pairs(enumerator.groups))
    candidates += [Pair(graph, identity) for graph, identity in enumerator.identities]
    stats.add(STAGES[3], len(candidates))
    del enumerator
    pairs = [orient(p) for p in prune(candidates, stats)]
    verified = []
    for pair in _progress_bar(progress, f"rank {rank}: verify", rank)(pairs):
        points = domain_points(pair, VERIFY_VALUES)
        if points is None:
            stats.add("dropped: no whole point in the domain")
            continue
        if check and verify(pair, points):
            stats.add("dropped: failed verification")
            continue
        verified.append((pair, points))
    stats.add(STAGES[-1], len(verified))
    return verified, dict(stats.counts)


def _progress_bar(enabled: bool, label: str, position: int) -> Callable[[Iterable[Any]], Any]:
    if not enabled:
        return iter
    from tqdm import tqdm

    return lambda items: tqdm(items, desc=label, position=position // 2 - 1, leave=False)


def generate(
    max_ops: int = 3,
    ops: Sequence[str] = DEFAULT_OPS,
    num_inputs: int = 4,
    ranks: Sequence[int] = (2, 4),
    check: bool = True,
    progress: bool = False,
    workers: int = 2,
    stats: dict[str, int] | None = None,
) -> list[dict[str, Any]]:
    """Enumerate graphs of up to `max_ops` ops of types `ops` over `num_inputs` inputs of each
    rank, and return the pruned, verified rules as rule-file entries (see write_rules).

    `stats`, if given, receives the counts after each stage (summed over ranks).
    """
    unknown = set(ops) - MENU.keys()
    if unknown:
        raise RlflowError(f"unknown op types {sorted(unknown)}; choose from {sorted(MENU)}")
    if set(ranks) - {2, 4} or max_ops < 1 or num_inputs < 1:
        raise RlflowError("ranks must be 2 and/or 4, and max_ops and num_inputs at least 1")
    jobs = [(rank, tuple(ops), max_ops, num_inputs, check, progress) for rank in ranks]
    if workers > 1 and len(jobs) > 1:
        import concurrent.futures
        import multiprocessing

        context = multiprocessing.get_context("fork")
        with concurrent.futures.ProcessPoolExecutor(min(workers, len(jobs)), context) as pool:
            results = list(pool.map(rank_rules, *zip(*jobs)))
    else:
        results = [rank_rules(*job) for job in jobs]
    verified = [item for items, _ in results for item in items]
    verified.sort(
        key=lambda item: (
            item[0].lhs.rank,
            len(item[0].lhs.ops) + len(item[0].rhs.ops),
            item[0].lhs.text(),
            item[0].rhs.text(),
        )
    )
    if stats is not None:
        for _, counts in results:
            for stage, count in counts.items():
                stats[stage] = stats.get(stage, 0) + count
    names = unique_names([pair for pair, _ in verified])
    return [to_rule(pair, points, name) for (pair, points), name in zip(verified, names)]


def write_rules(
    path: str | os.PathLike[str] = GENERATED_PATH,
    max_ops: int = 3,
    ops: Sequence[str] = DEFAULT_OPS,
    num_inputs: int = 4,
    ranks: Sequence[int] = (2, 4),
    progress: bool = False,
    stats: dict[str, int] | None = None,
) -> list[dict[str, Any]]:
    """Generate the rules and write them to `path` as the rule file the engine loads
    (atomically: a killed run never leaves half a file)."""
    rules = generate(max_ops, ops, num_inputs, ranks, progress=progress, stats=stats)
    settings = settings_summary(max_ops, ops, num_inputs, ranks)
    write_text_atomic(path, document_text(rules, settings))
    return rules

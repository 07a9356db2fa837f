"""Pairs: two DAGs over the same inputs that compute the same outputs, the candidate rules.

Each graph of a fingerprint group is paired with the simplest graph of its group (TASO pairs
it with the first of its hash bucket): the other pairs of a group are compositions of these.
A pair's domain is the joint domain of its two sides; `holds` tests it exactly at the
canonical point, which is how pruning asks whether a smaller rule is already a rule.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from rlflow.rewrite.generator.dag import ExprDag, infer_shapes
from rlflow.rewrite.generator.domain import ROLE_VALUES, fresh_shapes, instantiate
from rlflow.rewrite.generator.exact import input_arrays, run_dag
from rlflow.rewrite.generator.menu import SPECS
from rlflow.rewrite.generator.symbolic import Shape, Subst, resolve_shape


@dataclass(frozen=True)
class Pair:
    """Two DAGs over the same inputs computing the same outputs, in the same order."""

    lhs: ExprDag
    rhs: ExprDag

    def renamed(self, perm: Sequence[int]) -> Pair:
        return Pair(self.lhs.renamed(perm), self.rhs.renamed(perm))

    def used_inputs(self) -> list[int]:
        return sorted(self.lhs.used_inputs() | self.rhs.used_inputs())


def joint_shapes(pair: Pair) -> tuple[Subst, list[Shape], list[Shape]] | None:
    """The constraints of both sides together (the rule's domain), and every value's shape."""
    inputs = fresh_shapes(pair.lhs.rank, pair.lhs.num_inputs)
    left = infer_shapes(pair.lhs, {}, inputs)
    if left is None:
        return None
    right = infer_shapes(pair.rhs, left[0], inputs)
    if right is None:
        return None
    return right[0], left[1], right[1]


def domain_points(
    pair: Pair, tables: Sequence[dict[str, Sequence[int]]]
) -> list[dict[int, tuple[int, ...]]] | None:
    """The concrete input shapes of the pair at each table's point of its joint domain.

    A point where some dim (of an input or of an intermediate value) is not a positive whole
    number is retried with matrix and channel sizes doubled.
    """
    joint = joint_shapes(pair)
    if joint is None:
        return None
    subst, left, right = joint
    used = pair.used_inputs()
    every = [resolve_shape(shape, subst) for shape in (*left, *right)]
    points = []
    for table in tables:
        for scale in (1, 2, 4):
            scaled = {
                role: [v * (scale if role in ("d", "c") else 1) for v in values]
                for role, values in table.items()
            }
            inputs = [every[i] for i in used]
            _, concrete = instantiate([*inputs, *every], scaled)
            if concrete is not None:
                points.append(dict(zip(used, concrete)))
                break
        else:
            return None
    return points


def holds(pair: Pair) -> bool:
    """Whether the two sides agree exactly at the canonical point of their joint domain."""
    points = domain_points(pair, [ROLE_VALUES])
    if points is None:
        return False
    inputs = input_arrays(points[0])
    try:
        left = run_dag(pair.lhs, inputs)
        right = run_dag(pair.rhs, inputs)
    except ValueError:
        return False
    for a, b in zip(pair.lhs.outputs, pair.rhs.outputs):
        if left[a] is None or right[b] is None or not np.array_equal(left[a], right[b]):
            return False
    return True


def star_pairs(groups: dict[Any, list[ExprDag]]) -> Iterable[Pair]:
    """Each graph of a group paired with the group's simplest graph (fewest ops, then least
    text), as TASO pairs each graph with the first of its hash bucket: the other pairs of a
    group are compositions of these."""
    for graphs in groups.values():
        if len(graphs) < 2:
            continue
        # A narrowed graph's own ops do not keep it on the narrowed domain: it pairs only
        # with a graph whose ops do (a Split side), or the rule would be stated too widely.
        ranked = sorted(graphs, key=lambda g: (g.narrowed, len(g.ops), g.text()))
        if ranked[0].narrowed:
            continue
        for graph in ranked[1:]:
            yield Pair(graph, ranked[0])


def orient(pair: Pair) -> Pair:
    """The side with more ops (or an Identity side's partner) on the left, the pattern an
    engine matches when it simplifies; ties keep the canonical order."""
    if pair.lhs.ops and SPECS[pair.lhs.ops[0][0]].op_type == "Identity":
        return Pair(pair.rhs, pair.lhs)
    if len(pair.rhs.ops) > len(pair.lhs.ops):
        return Pair(pair.rhs, pair.lhs)
    return pair

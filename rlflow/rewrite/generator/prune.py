"""Pruning (TASO's, section 3.3): drop the candidate pairs that follow from other rules.

In this order, a pair is dropped when: its two sides are one graph up to renaming and output
order (trivial); both sides hold a repeated value; it is a renaming of inputs of a kept pair;
both sides apply the same op to the same inputs and the pair still holds with that common
subgraph made a fresh input (an instance of a more general rule); both sides end in the same
op on the same operands but one, and the pair of those operands holds (a congruence of a
smaller rule); the pair still holds with some uses of a repeated input made a new input (an
instance, e.g. associativity with x2 := x0); or each output needs only part of each side and
those parts are rules (smaller rules side by side).
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable, Iterable, Sequence

from rlflow.rewrite.generator.dag import ExprDag
from rlflow.rewrite.generator.menu import SPECS
from rlflow.rewrite.generator.pairs import Pair, holds
from rlflow.rewrite.generator.stats import STAGES, Stats


def prune(pairs: Iterable[Pair], stats: Stats) -> list[Pair]:
    """TASO's pruning (see the module docstring), counting survivors after each step."""
    pairs = [p for p in pairs if not is_trivial(p)]
    stats.add(STAGES[4], len(pairs))
    pairs = [p for p in pairs if not (p.lhs.reducible and p.rhs.reducible)]
    stats.add(STAGES[5], len(pairs))
    unique: dict[tuple[str, str], Pair] = {}
    for pair in pairs:
        key, renamed = canonical_renaming(pair)
        unique.setdefault(key, renamed)
    pairs = list(unique.values())
    stats.add(STAGES[6], len(pairs))
    steps: list[Callable[[Pair], bool]] = [
        lambda p: any(holds(q) for q in abstract_common(p)),
        lambda p: any(holds(q) for q in strip_common_tail(p)),
        lambda p: any(holds(q) for q in split_variables(p)),
        lambda p: (parts := decompose(p)) is not None and all(holds(q) for q in parts),
    ]
    for stage, redundant in zip(STAGES[7:11], steps):
        pairs = [p for p in pairs if not redundant(p)]
        stats.add(stage, len(pairs))
    return pairs


def _rewire(
    graph: ExprDag,
    keep: Sequence[int],
    fresh: dict[int, int],
    num_inputs: int,
    outputs: Sequence[int],
) -> ExprDag:
    """`graph` with only the ops `keep`, values in `fresh` turned into new inputs
    (old value id -> new input id) and the given outputs (old value ids)."""
    mapping = {i: i for i in range(graph.num_inputs)} | fresh
    next_id = num_inputs
    op_outputs = graph.op_outputs()
    ops = []
    for index in keep:
        key, args = graph.ops[index]
        ops.append((key, tuple(mapping[v] for v in args)))
        for v in op_outputs[index]:
            mapping[v] = next_id
            next_id += 1
    return ExprDag(graph.rank, num_inputs, tuple(ops), tuple(mapping[v] for v in outputs))


def _leaf_nodes(graph: ExprDag) -> dict[str, int]:
    """Canonical expression -> op index, for the ops that read only graph inputs."""
    nodes = graph.nodes()
    return {
        nodes[i]: i
        for i, (_, args) in enumerate(graph.ops)
        if all(v < graph.num_inputs for v in args)
    }


def abstract_common(pair: Pair) -> list[Pair]:
    """For each op both sides apply to the same inputs, the pair with that op's outputs made
    fresh inputs (TASO's common subgraph). If one of these still holds, `pair` is an instance
    of it."""
    left, right = _leaf_nodes(pair.lhs), _leaf_nodes(pair.rhs)
    general = []
    for node in sorted(left.keys() & right.keys()):
        sides = []
        for graph, index in ((pair.lhs, left[node]), (pair.rhs, right[node])):
            outs = graph.op_outputs()[index]
            fresh = {v: graph.num_inputs + k for k, v in enumerate(outs)}
            keep = [i for i in range(len(graph.ops)) if i != index]
            sides.append(_rewire(graph, keep, fresh, graph.num_inputs + len(outs), graph.outputs))
        general.append(Pair(*sides))
    return general


def strip_common_tail(pair: Pair) -> list[Pair]:
    """For each output both sides compute with the same op from operands that are the same
    but one, the pair with that op removed (TASO's common supergraph). If one of these holds,
    `pair` follows from it by congruence."""
    smaller = []
    producers = [pair.lhs.producers(), pair.rhs.producers()]
    left_exprs, right_exprs = pair.lhs.exprs(), pair.rhs.exprs()
    for a, b in zip(pair.lhs.outputs, pair.rhs.outputs):
        if a not in producers[0] or b not in producers[1]:
            continue
        i, j = producers[0][a], producers[1][b]
        (key_a, args_a), (key_b, args_b) = pair.lhs.ops[i], pair.rhs.ops[j]
        spec = SPECS[key_a]
        if key_a != key_b or spec.num_outputs != 1:
            continue
        orders = [args_b, args_b[::-1]] if spec.commutative else [args_b]
        for other in orders:
            differ = [
                p for p in range(len(args_a)) if left_exprs[args_a[p]] != right_exprs[other[p]]
            ]
            if len(differ) != 1:
                continue
            p = differ[0]
            sides = []
            for graph, index, operand, out in (
                (pair.lhs, i, args_a[p], a),
                (pair.rhs, j, other[p], b),
            ):
                keep = [n for n in range(len(graph.ops)) if n != index]
                outputs = [operand if v == out else v for v in graph.outputs]
                sides.append(_rewire(graph, keep, {}, graph.num_inputs, outputs))
            smaller.append(Pair(*sides))
    return smaller


def _outputs_sorted(pair: Pair) -> Pair:
    """The pair with its output positions reordered by their expressions (on both sides
    alike), so that a rule is not kept twice with its outputs listed in two orders."""
    left, right = pair.lhs.exprs(), pair.rhs.exprs()
    order = sorted(zip(pair.lhs.outputs, pair.rhs.outputs), key=lambda o: (left[o[0]], right[o[1]]))
    lhs = dataclasses.replace(pair.lhs, outputs=tuple(a for a, _ in order))
    rhs = dataclasses.replace(pair.rhs, outputs=tuple(b for _, b in order))
    return Pair(lhs, rhs)


def decompose(pair: Pair) -> list[Pair] | None:
    """Per output, the pair of the ops each side needs for it, if every one of these is
    smaller than its side: then the rule is several smaller rules side by side."""
    if len(pair.lhs.outputs) < 2:
        return None
    parts = []
    for k in range(len(pair.lhs.outputs)):
        sides = []
        for graph in (pair.lhs, pair.rhs):
            cone = _cone(graph, graph.outputs[k])
            if len(cone) >= len(graph.ops):
                return None
            sides.append(_rewire(graph, cone, {}, graph.num_inputs, [graph.outputs[k]]))
        parts.append(Pair(*sides))
    return parts


def _cone(graph: ExprDag, value: int) -> list[int]:
    """The indices of the ops that `value` depends on, in order."""
    producer = graph.producers()
    needed, stack = set(), [value]
    while stack:
        v = stack.pop()
        if v in producer and producer[v] not in needed:
            needed.add(producer[v])
            stack.extend(graph.ops[producer[v]][1])
    return sorted(needed)


def is_trivial(pair: Pair) -> bool:
    """The two sides are one graph, up to op order, commutativity, renaming of inputs and the
    order of outputs (G against G with x0, x1 swapped and its two outputs swapped)."""
    ops = [sorted(k.rstrip("=") for k, _ in g.ops) for g in (pair.lhs, pair.rhs)]
    if ops[0] != ops[1]:
        return False
    target = pair.rhs.text(ordered=False)
    used = pair.used_inputs()
    for order in itertools.permutations(used):
        perm = list(range(pair.lhs.num_inputs))
        for old, new in zip(used, order):
            perm[old] = new
        if pair.lhs.renamed(perm).text(ordered=False) == target:
            return True
    return False


def canonical_renaming(pair: Pair) -> tuple[tuple[str, str], Pair]:
    """The pair renamed so that its text is least over all renamings of its inputs, and that
    text: two pairs that are renamings of each other get the same one."""
    used = pair.used_inputs()
    best: tuple[tuple[str, str], Pair] | None = None
    for order in itertools.permutations(range(len(used))):
        perm = list(range(pair.lhs.num_inputs))
        for old, new in zip(used, order):
            perm[old] = new
        renamed = _outputs_sorted(pair.renamed(perm))
        texts = (renamed.lhs.text(), renamed.rhs.text())
        if texts[1] < texts[0]:
            texts, renamed = texts[::-1], Pair(renamed.rhs, renamed.lhs)
        if best is None or texts < best[0]:
            best = (texts, renamed)
    assert best is not None
    return best


def split_variables(pair: Pair) -> list[Pair]:
    """The pair with some uses of a repeated input read from a new input instead.

    Concat(Concat(x0, x1), x0) = Concat(x0, Concat(x1, x0)) is associativity with x2 := x0; if
    one of these pairs holds, `pair` is an instance of it. Only pairs that still fit the
    enumeration's input budget are tried, so that the general rule was itself enumerated.
    """
    used = pair.used_inputs()
    fresh = len(used)
    if fresh >= pair.lhs.num_inputs:
        return []
    general = []
    for var in used:
        sites = [
            (side, n, p)
            for side, graph in enumerate((pair.lhs, pair.rhs))
            for n, (_, args) in enumerate(graph.ops)
            for p, v in enumerate(args)
            if v == var
        ]
        if len(sites) < 3 or any(v == var for v in (*pair.lhs.outputs, *pair.rhs.outputs)):
            continue
        # Fix the first site to the old name: a subset and its complement are renamings.
        for size in range(1, len(sites)):
            for chosen in itertools.combinations(sites[1:], size):
                sides = {side for side, _, _ in chosen}
                kept = {side for site in sites if site not in chosen for side in [site[0]]}
                if sides != {0, 1} or kept != {0, 1}:
                    continue
                graphs = []
                for side, graph in enumerate((pair.lhs, pair.rhs)):
                    ops = tuple(
                        (
                            key,
                            tuple(
                                fresh if (side, n, p) in chosen else v for p, v in enumerate(args)
                            ),
                        )
                        for n, (key, args) in enumerate(graph.ops)
                    )
                    graphs.append(ExprDag(graph.rank, graph.num_inputs, ops, graph.outputs))
                general.append(Pair(*graphs))
    return general

"""Rule names: kebab-case, from the ops of the two sides, so that a listing says what each
generated rule does (matmul-is-associative, relu-commutes-with-transpose, add-of-matmuls-to-...).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

from rlflow.rewrite.generator.dag import ExprDag
from rlflow.rewrite.generator.menu import SPECS
from rlflow.rewrite.generator.pairs import Pair

SHORT = {
    "MatMul": "matmul",
    "Add": "add",
    "Sub": "sub",
    "Mul": "mul",
    "Relu": "relu",
    "Neg": "neg",
    "Transpose": "transpose",
    "Concat": "concat",
    "Split": "split",
    "Identity": "identity",
}
UNARY = {"Relu", "Neg"}
LINEAR = {"MatMul", "Conv", "Mul"}


def _short(key: str) -> str:
    spec = SPECS[key]
    if spec.op_type == "Conv":
        return key.lower()
    return SHORT[spec.op_type]


def _plural(names: list[str]) -> str:
    counts: dict[str, int] = {}
    for name in names:
        counts[name] = counts.get(name, 0) + 1
    parts = [name if n == 1 else f"{name}s" for name, n in counts.items()]
    return "-and-".join(parts)


def describe(graph: ExprDag) -> str:
    """e.g. "add-of-matmuls", "split-of-matmul-of-concat", "matmul-and-split"."""
    producer = graph.producers()

    def of(index: int) -> str:
        key, args = graph.ops[index]
        children = sorted({producer[v] for v in args if v in producer})
        if not children:
            return _short(key)
        return f"{_short(key)}-of-{_plural([of(c) for c in children])}"

    roots = sorted({producer[v] for v in graph.outputs})
    return _plural([of(r) for r in roots])


def _layers(graph: ExprDag) -> tuple[dict[str, int], dict[str, int]]:
    """Op-type counts of the graph's output ops and of its other ops."""
    producer = graph.producers()
    roots = {producer[v] for v in graph.outputs}
    top: dict[str, int] = defaultdict(int)
    rest: dict[str, int] = defaultdict(int)
    for index, (key, _) in enumerate(graph.ops):
        (top if index in roots else rest)[SPECS[key].op_type] += 1
    return dict(top), dict(rest)


def _swapped(pair: Pair) -> tuple[str, str] | None:
    """(A, B) if one side is A applied to B's results, and the other B applied to A's."""
    for one, other in ((pair.lhs, pair.rhs), (pair.rhs, pair.lhs)):
        top_one, rest_one = _layers(one)
        top_other, rest_other = _layers(other)
        if len(top_one) == len(top_other) == len(rest_one) == len(rest_other) == 1:
            a, b = next(iter(top_one)), next(iter(rest_one))
            if a != b and set(top_other) == {b} and set(rest_other) == {a}:
                return a, b
    return None


def rule_name(pair: Pair) -> str:
    """A kebab-case name that says what the rule does, from its ops (not yet unique):
    x-is-identity, a-is-associative, a-regroups, a-is-idempotent, a-commutes-with-b,
    a-distributes-over-b, transpose-of-a, else "<lhs>-to-<rhs>" (sides as describe() puts
    them), then the axes of Concat and Split, the conv kernel, and -4d for other rank-4 rules."""
    lhs, rhs = pair.lhs, pair.rhs
    types_l = {SPECS[k].op_type for k, _ in lhs.ops}
    types_r = {SPECS[k].op_type for k, _ in rhs.ops}
    short = SHORT | {"Conv": "conv"}
    swapped = _swapped(pair)
    if types_r == {"Identity"}:
        name = f"{describe(lhs)}-is-identity"
    elif types_l == types_r and len(types_l) == 1 and len(lhs.ops) == len(rhs.ops):
        op = short[next(iter(types_l))]
        two = len(lhs.ops) == 2 and len(lhs.outputs) == 1
        name = f"{op}-is-associative" if two else f"{op}-regroups"
    elif types_l == types_r and types_l <= UNARY and len(rhs.ops) == 1:
        name = f"{short[next(iter(types_l))]}-is-idempotent"
    elif swapped is not None:
        a, b = swapped
        if a in UNARY or b in UNARY:
            unary, other = (a, b) if a in UNARY else (b, a)
            name = f"{short[unary]}-commutes-with-{short[other]}"
        elif "Transpose" in (a, b):
            name = f"transpose-of-{short[b if a == 'Transpose' else a]}"
        elif {a, b} & LINEAR and {a, b} & {"Add", "Sub"}:
            linear, other = (a, b) if a in LINEAR else (b, a)
            name = f"{short[linear]}-distributes-over-{short[other]}"
        else:
            name = f"{describe(lhs)}-to-{describe(rhs)}"
    elif describe(lhs) == describe(rhs):
        name = f"{describe(lhs)}-regroups"
    else:
        name = f"{describe(lhs)}-to-{describe(rhs)}"
    specs = [SPECS[k] for g in (lhs, rhs) for k, _ in g.ops]
    axes = sorted({spec.axis for spec in specs if spec.axis >= 0})
    if axes:
        name += "-axis" + "".join(map(str, axes))
    kernels = sorted({spec.key.removeprefix("Conv") for spec in specs if spec.op_type == "Conv"})
    if kernels and "conv1x1" not in name and "conv3x3" not in name:
        name += "-" + "-".join(kernels)
    elif lhs.rank == 4 and not kernels:
        name += "-4d"
    return name


def unique_names(pairs: Sequence[Pair]) -> list[str]:
    """rule_name() of each pair, with -2, -3, ... added where names repeat."""
    names = [rule_name(p) for p in pairs]
    seen: dict[str, int] = {}
    unique = []
    for name in names:
        seen[name] = seen.get(name, 0) + 1
        unique.append(name if seen[name] == 1 else f"{name}-{seen[name]}")
    return unique

"""Points of a domain: concrete input shapes at which a family of shapes is evaluated.

Two graphs are compared only when their domains are equal, at one canonical point of that
domain (ROLE_VALUES); a rule is then verified at three more points (VERIFY_VALUES). A point
gives each variable a value by its role (matrix dim, channels, batch, spatial), so that the
same domain always gets the same point and its key names the domain up to renaming.
"""

from __future__ import annotations

import functools
from collections import defaultdict
from collections.abc import Sequence

from rlflow.rewrite.generator.symbolic import (
    MATRIX,
    WEIGHT,
    Shape,
    term_text,
    term_value,
    term_vars,
)

ROLE_VALUES = {
    "d": (8, 16, 24, 32, 40, 48, 56, 64),
    "c": (8, 16, 24, 32, 40, 48, 56, 64),
    "n": (2, 3, 4, 5),
    "hw": (5, 4, 3, 6, 7, 8, 9, 10),
}
"""The canonical point of a domain: the k-th variable of a role takes the k-th value. Matrix
dims ("d") and channels ("c") are multiples of 8, so that three nested halvings stay whole."""

VERIFY_VALUES = (
    {
        "d": (4, 6, 10, 12, 14, 18, 20, 22),
        "c": (4, 6, 10, 12, 14, 18, 20, 22),
        "n": (1, 2, 3, 1),
        "hw": (6, 5, 7, 4, 3, 6, 5, 7),
    },
    {
        "d": (6, 10, 4, 14, 12, 2, 18, 8),
        "c": (6, 2, 10, 4, 8, 12, 14, 16),
        "n": (2, 1, 2, 3),
        "hw": (4, 7, 5, 3, 6, 4, 5, 3),
    },
    {
        "d": (16, 8, 20, 12, 24, 28, 4, 32),
        "c": (8, 12, 4, 16, 20, 6, 10, 14),
        "n": (3, 2, 1, 2),
        "hw": (3, 4, 6, 5, 7, 3, 4, 5),
    },
)
"""Three more points of each domain, for verification in onnxruntime."""


def fresh_shapes(rank: int, count: int) -> list[Shape]:
    """Input shapes of free variables; variable ids are fixed by the input index."""
    shapes = []
    for i in range(count):
        kind = MATRIX if rank == 2 else ("v", 1000 + i)
        shapes.append((kind, *(("v", 8 * i + d) for d in range(rank))))
    return shapes


def _role(shape: Shape, axis: int) -> str:
    if len(shape) == 3:
        return "d"
    if shape[0] == WEIGHT:
        return "c" if axis < 2 else "hw"
    return ("n", "c", "hw", "hw")[axis]


@functools.lru_cache(maxsize=1 << 16)
def canonical_point(shapes: tuple[Shape, ...]) -> tuple[str, list[tuple[int, ...]] | None]:
    """instantiate() at ROLE_VALUES, cached: many graphs share a domain."""
    return instantiate(shapes)


def instantiate(
    shapes: Sequence[Shape], table: dict[str, Sequence[int]] = ROLE_VALUES
) -> tuple[str, list[tuple[int, ...]] | None]:
    """The domain's key (its shapes with variables named in order of appearance) and the
    concrete shape of each input at the point `table` gives (None if a dim is not whole)."""
    names: dict[int, str] = {}
    values: dict[int, int] = {}
    per_role: dict[str, int] = defaultdict(int)
    key_parts, concrete = [], []
    ok = True
    for shape in shapes:
        kind = shape[0]
        kind_text = kind[1] if kind[0] == "c" else names.setdefault(kind[1], f"k{len(names)}")
        dims = []
        for axis, term in enumerate(shape[1:]):
            for var in term_vars(term):
                if var not in names:
                    names[var] = f"v{len(names)}"
                    role = _role(shape, axis)
                    values[var] = table[role][per_role[role] % len(table[role])]
                    per_role[role] += 1
            dims.append(term_value(term, values))
        key_parts.append(f"{kind_text}[{','.join(term_text(t, names) for t in shape[1:])}]")
        ok = ok and all(d is not None and d > 0 for d in dims)
        concrete.append(tuple(dims))
    return ";".join(key_parts), concrete if ok else None

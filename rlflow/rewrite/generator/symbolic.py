"""Symbolic tensor shapes, and the unification that solves the constraints ops put on them.

Every input dimension of an enumerated graph is a variable, and operators add constraints
(MatMul unifies the inner dims, Concat makes a sum, Split a half). Solving them by unification
gives each graph a *domain*, the family of shapes it is valid for, so that a rule found at one
shape is stated for every shape of its domain. Unification is syntactic (b + c = e + f is
solved as b = e, c = f): it finds the natural domain of rules like concat interchange and never
accepts an unsatisfiable one, at the price of missing the odd rule that holds only on a domain
it cannot express.

A dimension is a term: ("v", id) a variable, ("c", value) a constant, ("s", a, b) the sum of a
Concat, ("h", a) the half of a Split. A shape is (kind, dim0, dim1, ...), where the kind term
keeps activations, conv weights and matrices apart (a variable where it is not yet known).
"""

from __future__ import annotations

from collections.abc import Iterable

Term = tuple
Shape = tuple
Subst = dict

MATRIX, ACTIVATION, WEIGHT = ("c", "m"), ("c", "a"), ("c", "w")
"""The kinds of tensor: rank-2 matrices, rank-4 NCHW activations and rank-4 conv weights."""


def make_sum(a: Term, b: Term) -> Term:
    """a + b, with half(t) + half(t) folded back to t."""
    if a == b and a[0] == "h":
        return a[1]
    return ("s", a, b)


def make_half(a: Term) -> Term:
    """a / 2, with half(t + t) folded back to t."""
    if a[0] == "s" and a[1] == a[2]:
        return a[1]
    return ("h", a)


def resolve(term: Term, subst: Subst) -> Term:
    """`term` with every bound variable replaced, in normal form."""
    tag = term[0]
    if tag == "v":
        bound = subst.get(term[1])
        return term if bound is None else resolve(bound, subst)
    if tag == "c":
        return term
    if tag == "s":
        return make_sum(resolve(term[1], subst), resolve(term[2], subst))
    return make_half(resolve(term[1], subst))


def resolve_shape(shape: Shape, subst: Subst) -> Shape:
    """Every term of `shape` resolved."""
    return tuple(resolve(term, subst) for term in shape)


def _occurs(var: int, term: Term) -> bool:
    if term[0] == "v":
        return term[1] == var
    if term[0] == "c":
        return False
    return any(_occurs(var, part) for part in term[1:])


def unify(a: Term, b: Term, subst: Subst) -> Subst | None:
    """A substitution extending `subst` under which a == b, or None.

    half(t) = u is solved as t = u + u, and a + b = c + d part by part: sufficient, not
    necessary, so a domain can come out narrower than the truth but never wrong.
    """
    a, b = resolve(a, subst), resolve(b, subst)
    if a == b:
        return subst
    if a[0] != "v" and b[0] == "v":
        a, b = b, a
    if a[0] == "v" and not _occurs(a[1], b):
        return {**subst, a[1]: b}
    if b[0] == "h":  # before a[0] == "h": a may be a variable that occurs in b
        return unify(b[1], make_sum(a, a), subst)
    if a[0] == "h":
        return unify(a[1], make_sum(b, b), subst)
    if a[0] == "s" and b[0] == "s":
        subst = unify(a[1], b[1], subst)
        return None if subst is None else unify(a[2], b[2], subst)
    return None


def unify_shapes(a: Shape, b: Shape, subst: Subst, skip: int | None = None) -> Subst | None:
    """Unify two shapes slot by slot (kind included), except dimension `skip`."""
    if len(a) != len(b):
        return None
    for index, (x, y) in enumerate(zip(a, b)):
        if skip is not None and index == skip + 1:
            continue
        subst = unify(x, y, subst)
        if subst is None:
            return None
    return subst


def term_vars(term: Term) -> Iterable[int]:
    """The variables of `term`, left to right."""
    if term[0] == "v":
        yield term[1]
    elif term[0] in ("s", "h"):
        for part in term[1:]:
            yield from term_vars(part)


def term_text(term: Term, names: dict[int, str]) -> str:
    """`term` written out, variables by `names`."""
    tag = term[0]
    if tag == "v":
        return names[term[1]]
    if tag == "c":
        return str(term[1])
    if tag == "s":
        return f"({term_text(term[1], names)}+{term_text(term[2], names)})"
    return f"{term_text(term[1], names)}/2"


def term_value(term: Term, values: dict[int, int]) -> int | None:
    """`term` at the given variable values (None where a half is not whole)."""
    tag = term[0]
    if tag == "v":
        return values[term[1]]
    if tag == "c":
        return term[1]
    if tag == "s":
        a, b = term_value(term[1], values), term_value(term[2], values)
        return None if a is None or b is None else a + b
    whole = term_value(term[1], values)
    return None if whole is None or whole % 2 else whole // 2

"""Generate rewrite rules by enumerating small graphs, as TASO's generator does.

TASO (Jia et al., SOSP'19) enumerates every graph of up to a few operators over a handful of
input tensors, fingerprints each graph's outputs on random inputs, and turns graphs with equal
fingerprints into candidate substitutions, which it then prunes and verifies. This module does
the same over rlflow's op menu and writes the survivors to `rewrite/rules/generated.json`.

Choices, and why:

- **Symbolic shapes.** Every input dimension is a variable; operators add constraints (MatMul
  unifies the inner dims, Concat makes a sum, Split a half) that are solved by unification. A
  graph is then valid for a whole family of shapes, its *domain*, and two graphs are compared
  only when their domains are equal, at one canonical point of that domain. So a rule found at
  one shape is stated for every shape of its domain, and is verified at three more. Unification
  is syntactic (b + c = e + f is solved as b = e, c = f): it finds the natural domain of rules
  like concat interchange and never accepts an unsatisfiable one, at the price of missing the
  odd rule that holds only on a domain it cannot express.
- **Split at a concat seam.** Split cuts into two equal halves (ONNX opset 18 `num_outputs`).
  Splitting a concatenation of unequal parts gives new tensors, so a Split of a dim that is a
  sum is enumerated twice: as is, and with the two parts unified (TASO splits only at a seam).
- **Exact fingerprints.** Inputs are small random integers held in float64 and every op keeps
  them integers (no Tanh or Sigmoid on the menu) whose magnitude stays far below 2**53, so BLAS
  computes them exactly whatever its summation order. Equal functions then give bit-identical
  outputs and can be grouped by a hash, with no tolerance and no bucket-boundary misses; this
  is TASO's integer arithmetic at numpy speed. Verification is separate and uses float32.
- **Pairs.** Each graph is paired with the simplest graph of its group (TASO pairs it with
  the first of its hash bucket): the other pairs of a group are compositions of these. A
  graph with two outputs of different shapes is also recorded on the part of its domain where
  they have one shape, so that it can meet a graph ending in Split (two matmuls sharing an
  input against one matmul on concatenated weights, then Split).
- **Pruning** (TASO's, section 3.3). Graphs where a value is identically zero are dropped, and
  graphs where two values are equal are not extended (any rule built on them follows from a
  smaller one). Pairs are then dropped, in this order, when: the two sides are one graph up
  to renaming and output order (trivial); both sides hold a repeated value; a renaming of
  inputs of a kept pair; both sides apply the same op to the same inputs and the pair still
  holds with that common subgraph made a fresh input (an instance of a more general rule);
  both sides end in the same op on the same operands but one, and the pair of those operands
  holds (a congruence of a smaller rule); the pair still holds with some uses of a repeated
  input made a new input (an instance, e.g. associativity with x2 := x0); or each output
  needs only part of each side and those parts are rules (smaller rules side by side).
- **Verification.** Every kept pair runs in onnxruntime at three shape settings of its domain
  on random float32 inputs; a pair that differs beyond tolerance at any setting is dropped.

Rank-2 tensors form the matmul family and rank-4 NCHW tensors the conv family; pure
elementwise rules are generated once, at rank 2.
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
import os
import sys
import time
import zlib
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rlflow.errors import RlflowError
from rlflow.fileio import write_text_atomic

# ----------------------------------------------------------------------------------------------
# Symbolic dimensions: ("v", id) a variable, ("c", value) a constant, ("s", a, b) the sum of a
# Concat, ("h", a) the half of a Split. Tensor shapes are (kind, dim0, dim1, ...) where the kind
# term keeps activations ("a"), conv weights ("w") and matrices ("m") apart.

Term = tuple
Shape = tuple
Subst = dict


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


# ----------------------------------------------------------------------------------------------
# The op menu. A key names one op with its attributes (e.g. "Concat1" is Concat on axis 1);
# "Split1=" is Split on axis 1 of a concatenation, with the two concatenated parts made equal.

MATRIX, ACTIVATION, WEIGHT = ("c", "m"), ("c", "a"), ("c", "w")


@dataclass(frozen=True)
class OpSpec:
    """One entry of the op menu: an ONNX op with fixed attributes, on tensors of one rank."""

    key: str
    op_type: str
    rank: int
    arity: int
    num_outputs: int = 1
    attrs: tuple[tuple[str, Any], ...] = ()
    commutative: bool = False
    kinds: tuple[Term | None, ...] = ()
    """Required kind of each operand (None: any, but the same for all operands)."""

    @property
    def axis(self) -> int:
        return dict(self.attrs).get("axis", -1)

    @property
    def seam(self) -> bool:
        return self.key.endswith("=")

    def onnx_attrs(self) -> dict[str, Any]:
        return {
            name: list(value) if isinstance(value, tuple) else value for name, value in self.attrs
        }


def _conv(key: str, kernel: int) -> OpSpec:
    pad = kernel // 2
    attrs = (("kernel_shape", (kernel, kernel)), ("pads", (pad,) * 4), ("strides", (1, 1)))
    return OpSpec(key, "Conv", 4, 2, attrs=attrs, kinds=(ACTIVATION, WEIGHT))


def _menu() -> dict[str, list[OpSpec]]:
    """Every op of the generator, by ONNX op type; the caller picks op types to enumerate."""
    menu: dict[str, list[OpSpec]] = defaultdict(list)
    # Relu and Mul of conv weights (and Concat on axis 0 of activations, the batch) make no
    # rule worth having, so at rank 4 they take activations only (Concat0 weights only).
    for rank, tag, plain in ((2, "", None), (4, "4", ACTIVATION)):
        menu["Add"].append(OpSpec(f"Add{tag}", "Add", rank, 2, commutative=True))
        menu["Sub"].append(OpSpec(f"Sub{tag}", "Sub", rank, 2))
        menu["Mul"].append(
            OpSpec(f"Mul{tag}", "Mul", rank, 2, commutative=True, kinds=(plain, plain))
        )
        menu["Relu"].append(OpSpec(f"Relu{tag}", "Relu", rank, 1, kinds=(plain,)))
        menu["Neg"].append(OpSpec(f"Neg{tag}", "Neg", rank, 1))
    menu["MatMul"].append(OpSpec("MatMul", "MatMul", 2, 2))
    menu["Transpose"].append(OpSpec("Transpose", "Transpose", 2, 1, attrs=(("perm", (1, 0)),)))
    menu["Conv"] += [_conv("Conv1x1", 1), _conv("Conv3x3", 3)]
    concat_axes = ((2, 0, None), (2, 1, None), (4, 1, None), (4, 0, WEIGHT))
    for rank, axis, kind in concat_axes:
        tag = f"{axis}" if rank == 2 else f"{axis}r4"
        menu["Concat"].append(
            OpSpec(f"Concat{tag}", "Concat", rank, 2, attrs=(("axis", axis),), kinds=(kind, kind))
        )
    for rank, axis, kind in ((2, 0, None), (2, 1, None), (4, 1, ACTIVATION)):
        tag = f"{axis}" if rank == 2 else f"{axis}r4"
        attrs = (("axis", axis), ("num_outputs", 2))
        for seam in ("", "="):
            menu["Split"].append(
                OpSpec(f"Split{tag}{seam}", "Split", rank, 1, 2, attrs=attrs, kinds=(kind,))
            )
    return dict(menu)


MENU = _menu()
SPECS: dict[str, OpSpec] = {spec.key: spec for specs in MENU.values() for spec in specs}
SPECS["Identity"] = OpSpec("Identity", "Identity", 0, 1)  # any rank: the side of x = f(x)

DEFAULT_OPS = ("MatMul", "Conv", "Add", "Mul", "Relu", "Concat", "Split", "Transpose")
"""TASO's core menu. Sub and Neg are on the menu too (--ops), but they add ~700 rules of
signed-sum algebra that are mostly compositions of each other, and the core menu already
gives well over the 130 rules the project asked for."""
ELEMENTWISE = {"Add", "Sub", "Mul", "Relu", "Neg", "Identity"}


def infer(spec: OpSpec, shapes: Sequence[Shape], subst: Subst) -> tuple[Subst, list[Shape]] | None:
    """The output shapes of `spec` on operands of `shapes`, and the constraints that it adds."""
    if spec.rank and any(len(shape) != spec.rank + 1 for shape in shapes):
        return None
    for shape, kind in zip(shapes, spec.kinds):
        if kind is not None:
            subst = unify(shape[0], kind, subst)
            if subst is None:
                return None
    op = spec.op_type
    first = shapes[0]
    if op in ("Add", "Sub", "Mul"):
        subst = unify_shapes(first, shapes[1], subst)
        return None if subst is None else (subst, [first])
    if op in ("Relu", "Neg", "Identity"):
        return subst, [first]
    if op == "Transpose":
        return subst, [(first[0], first[2], first[1])]
    if op == "MatMul":
        subst = unify(first[2], shapes[1][1], subst)
        return None if subst is None else (subst, [(first[0], first[1], shapes[1][2])])
    if op == "Conv":
        weight = shapes[1]
        kernel = ("c", spec.onnx_attrs()["kernel_shape"][0])
        for a, b in ((first[2], weight[2]), (weight[3], kernel), (weight[4], kernel)):
            subst = unify(a, b, subst)
            if subst is None:
                return None
        return subst, [(ACTIVATION, first[1], weight[1], first[3], first[4])]
    slot = spec.axis + 1
    if op == "Concat":
        subst = unify_shapes(first, shapes[1], subst, skip=spec.axis)
        if subst is None:
            return None
        total = make_sum(resolve(first[slot], subst), resolve(shapes[1][slot], subst))
        return subst, [first[:slot] + (total,) + first[slot + 1 :]]
    if op == "Split":
        dim = resolve(first[slot], subst)
        if spec.seam:
            if dim[0] != "s":
                return None
            subst = unify(dim[1], dim[2], subst)
            if subst is None:
                return None
            dim = resolve(dim, subst)
        half = first[:slot] + (make_half(dim),) + first[slot + 1 :]
        return subst, [half, half]
    raise AssertionError(f"no shape rule for {op}")


# ----------------------------------------------------------------------------------------------
# Numeric evaluation (exact, see the module docstring).


def _conv2d(x: np.ndarray, w: np.ndarray, pad: int) -> np.ndarray:
    kernel = w.shape[2]
    if kernel == 1:
        return np.tensordot(w[:, :, 0, 0], x, axes=([1], [1])).transpose(1, 0, 2, 3)
    padded = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    patches = np.lib.stride_tricks.sliding_window_view(padded, (kernel, kernel), axis=(2, 3))
    return np.tensordot(patches, w, axes=([1, 4, 5], [1, 2, 3])).transpose(0, 3, 1, 2)


def evaluate(spec: OpSpec, args: Sequence[np.ndarray]) -> list[np.ndarray]:
    """Run one op of the menu in numpy, with ONNX semantics."""
    op = spec.op_type
    if op == "Add":
        return [args[0] + args[1]]
    if op == "Sub":
        return [args[0] - args[1]]
    if op == "Mul":
        return [args[0] * args[1]]
    if op == "Relu":
        return [np.maximum(args[0], 0.0)]
    if op == "Neg":
        return [-args[0]]
    if op == "Identity":
        return [args[0]]
    if op == "Transpose":
        return [np.ascontiguousarray(args[0].T)]
    if op == "MatMul":
        return [args[0] @ args[1]]
    if op == "Conv":
        return [_conv2d(args[0], args[1], spec.onnx_attrs()["pads"][0])]
    if op == "Concat":
        return [np.concatenate(args, axis=spec.axis)]
    if op == "Split":
        if args[0].shape[spec.axis] % 2:
            raise ValueError("odd split")
        return [np.ascontiguousarray(part) for part in np.split(args[0], 2, axis=spec.axis)]
    raise AssertionError(f"no evaluator for {op}")


# ----------------------------------------------------------------------------------------------
# Graphs, their domains and their fingerprints.


@dataclass(frozen=True)
class Graph:
    """A small graph: value ids 0..num_inputs-1 are the inputs x0, x1, ...; each op appends its
    outputs. `outputs` lists the graph's outputs (its unconsumed values) in a fixed order."""

    rank: int
    num_inputs: int
    ops: tuple[tuple[str, tuple[int, ...]], ...]
    outputs: tuple[int, ...]
    reducible: bool = field(default=False, compare=False)
    """Two of its values are equal: it holds a smaller graph's work twice."""
    narrowed: bool = field(default=False, compare=False)
    """Recorded on the part of its domain where two of its outputs have one shape."""

    def op_outputs(self) -> list[list[int]]:
        """The value ids of each op's outputs."""
        ids, next_id = [], self.num_inputs
        for key, _ in self.ops:
            count = SPECS[key].num_outputs
            ids.append(list(range(next_id, next_id + count)))
            next_id += count
        return ids

    def used_inputs(self) -> set[int]:
        """Inputs read by an op or returned as an output."""
        read = {v for _, args in self.ops for v in args}
        return {v for v in (*read, *self.outputs) if v < self.num_inputs}

    def exprs(self, names: Sequence[str] | None = None) -> list[str]:
        """A canonical expression for every value (commutative operands sorted)."""
        exprs = list(names) if names is not None else [f"x{i}" for i in range(self.num_inputs)]
        for node, (key, _) in zip(self._node_exprs(exprs), self.ops):
            exprs += [node] if SPECS[key].num_outputs == 1 else [f"{node}#{k}" for k in range(2)]
        return exprs

    def _node_exprs(self, exprs: list[str]) -> Iterable[str]:
        """Yields each op's expression; `exprs` must grow with the op's outputs meanwhile."""
        for key, args in self.ops:
            operands = [exprs[v] for v in args]
            if SPECS[key].commutative:
                operands.sort()
            yield f"{key}({','.join(operands)})"

    def nodes(self, names: Sequence[str] | None = None) -> list[str]:
        """The canonical expression of every op (Split once, not per output)."""
        exprs = list(names) if names is not None else [f"x{i}" for i in range(self.num_inputs)]
        nodes = []
        for node, (key, _) in zip(self._node_exprs(exprs), self.ops):
            nodes.append(node)
            exprs += [node] if SPECS[key].num_outputs == 1 else [f"{node}#{k}" for k in range(2)]
        return nodes

    def text(self, names: Sequence[str] | None = None, ordered: bool = True) -> str:
        """Identifies the ONNX graph up to op order and commutativity (a Split at a concat
        seam is a plain Split), and up to output order if not `ordered`."""
        exprs = self.exprs(names)
        outputs = [exprs[v] for v in self.outputs]
        if not ordered:
            outputs.sort()
        text = "|".join(sorted(self.nodes(names))) + " -> " + ",".join(outputs)
        return text.replace("=", "")

    def renamed(self, perm: Sequence[int]) -> Graph:
        """The same graph reading input perm[i] where it read input i."""
        ops = tuple(
            (key, tuple(perm[v] if v < self.num_inputs else v for v in args))
            for key, args in self.ops
        )
        outputs = tuple(perm[v] if v < self.num_inputs else v for v in self.outputs)
        return Graph(self.rank, self.num_inputs, ops, outputs, self.reducible)


def fresh_shapes(rank: int, count: int) -> list[Shape]:
    """Input shapes of free variables; variable ids are fixed by the input index."""
    shapes = []
    for i in range(count):
        kind = MATRIX if rank == 2 else ("v", 1000 + i)
        shapes.append((kind, *(("v", 8 * i + d) for d in range(rank))))
    return shapes


def infer_graph(
    graph: Graph, subst: Subst | None = None, inputs: Sequence[Shape] | None = None
) -> tuple[Subst, list[Shape]] | None:
    """The constraints of every op of `graph` and the shape of every value, or None."""
    subst = {} if subst is None else subst
    shapes = list(inputs) if inputs is not None else fresh_shapes(graph.rank, graph.num_inputs)
    for key, args in graph.ops:
        result = infer(SPECS[key], [shapes[v] for v in args], subst)
        if result is None:
            return None
        subst, outs = result
        shapes += outs
    return subst, shapes


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


def _role(shape: Shape, axis: int) -> str:
    if len(shape) == 3:
        return "d"
    if shape[0] == WEIGHT:
        return "c" if axis < 2 else "hw"
    return ("n", "c", "hw", "hw")[axis]


def _term_vars(term: Term) -> Iterable[int]:
    if term[0] == "v":
        yield term[1]
    elif term[0] in ("s", "h"):
        for part in term[1:]:
            yield from _term_vars(part)


def _term_text(term: Term, names: dict[int, str]) -> str:
    tag = term[0]
    if tag == "v":
        return names[term[1]]
    if tag == "c":
        return str(term[1])
    if tag == "s":
        return f"({_term_text(term[1], names)}+{_term_text(term[2], names)})"
    return f"{_term_text(term[1], names)}/2"


def _term_value(term: Term, values: dict[int, int]) -> int | None:
    tag = term[0]
    if tag == "v":
        return values[term[1]]
    if tag == "c":
        return term[1]
    if tag == "s":
        a, b = _term_value(term[1], values), _term_value(term[2], values)
        return None if a is None or b is None else a + b
    whole = _term_value(term[1], values)
    return None if whole is None or whole % 2 else whole // 2


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
            for var in _term_vars(term):
                if var not in names:
                    names[var] = f"v{len(names)}"
                    role = _role(shape, axis)
                    values[var] = table[role][per_role[role] % len(table[role])]
                    per_role[role] += 1
            dims.append(_term_value(term, values))
        key_parts.append(f"{kind_text}[{','.join(_term_text(t, names) for t in shape[1:])}]")
        ok = ok and all(d is not None and d > 0 for d in dims)
        concrete.append(tuple(dims))
    return ";".join(key_parts), concrete if ok else None


_INPUT_CACHE: dict[tuple[int, tuple[int, ...]], np.ndarray] = {}


def input_array(index: int, shape: tuple[int, ...]) -> np.ndarray:
    """Integer-valued float64 random data for input `index`, the same in every graph."""
    key = (index, shape)
    if key not in _INPUT_CACHE:
        rng = np.random.default_rng(zlib.crc32(repr(key).encode()))
        _INPUT_CACHE[key] = rng.integers(-4, 5, size=shape).astype(np.float64)
    return _INPUT_CACHE[key]


def run_graph(graph: Graph, inputs: dict[int, np.ndarray]) -> list[np.ndarray | None]:
    """Every value of `graph` (None for unused inputs)."""
    values: list[np.ndarray | None] = [inputs.get(i) for i in range(graph.num_inputs)]
    for key, args in graph.ops:
        values += evaluate(SPECS[key], [values[v] for v in args])
    return values


_PROJECTIONS: dict[int, np.ndarray] = {}


def digest(array: np.ndarray) -> tuple[tuple[int, ...], int, int]:
    """A hash of shape and exact contents: two random int64 projections (wrapping mod 2**64,
    which a hash may do; far cheaper than hashing the bytes of every value)."""
    size = array.size
    if size not in _PROJECTIONS:
        rng = np.random.default_rng(size)
        _PROJECTIONS[size] = rng.integers(-(2**62), 2**62, size=(size, 2), dtype=np.int64)
    first, second = array.reshape(-1).astype(np.int64) @ _PROJECTIONS[size]
    return array.shape, int(first), int(second)


# ----------------------------------------------------------------------------------------------
# Enumeration.

Digest = tuple[tuple[int, ...], int, int]


@dataclass
class Stats:
    """Counts at each stage, for the report and the JSON header."""

    counts: dict[str, int] = field(default_factory=lambda: defaultdict(int))

    def add(self, name: str, amount: int = 1) -> None:
        self.counts[name] += amount


@dataclass
class _State:
    """A graph under construction, with its values at the canonical point of its domain."""

    ops: tuple[tuple[str, tuple[int, ...]], ...]
    shapes: list[Shape]
    exprs: list[str]
    nodes: frozenset[str]
    subst: Subst
    concrete: dict[int, tuple[int, ...]]
    values: list[np.ndarray | None]
    digests: list[Digest | None]


def _connected(graph: Graph) -> bool:
    parent = list(range(graph.num_inputs + sum(SPECS[k].num_outputs for k, _ in graph.ops)))

    def find(v: int) -> int:
        while parent[v] != v:
            parent[v] = parent[parent[v]]
            v = parent[v]
        return v

    members = set()
    for (_, args), outs in zip(graph.ops, graph.op_outputs()):
        for v in (*args, *outs):
            members.add(v)
            parent[find(v)] = find(args[0])
    return len({find(v) for v in members}) == 1


class Enumerator:
    """Depth-first enumeration of the graphs of one rank, grouped by fingerprint.

    Every graph is reached once (a graph is identified by its set of canonical node
    expressions, so op order and commutative operand order do not make new graphs).
    """

    def __init__(
        self, rank: int, op_types: Sequence[str], max_ops: int, num_inputs: int, stats: Stats
    ) -> None:
        self.rank = rank
        self.specs = [s for t in op_types for s in MENU.get(t, ()) if s.rank == rank]
        self.max_ops = max_ops
        self.num_inputs = num_inputs
        self.stats = stats
        self.seen: set[frozenset[str]] = set()
        self.groups: dict[tuple[str, tuple[Digest, ...]], list[Graph]] = defaultdict(list)
        self.identities: list[tuple[Graph, Graph]] = []

    def run(self, progress: Callable[[Iterable[Any]], Iterable[Any]] = iter) -> None:
        count = self.num_inputs
        shapes = fresh_shapes(self.rank, count)
        exprs = [f"x{i}" for i in range(count)]
        root = _State((), shapes, exprs, frozenset(), {}, {}, [None] * count, [None] * count)
        for spec in progress(self.specs):
            self._extend(root, [spec])

    def _extend(self, state: _State, specs: Sequence[OpSpec]) -> None:
        count = len(state.shapes)
        for spec in specs:
            if spec.arity == 1:
                choices: Iterable[tuple[int, ...]] = ((v,) for v in range(count))
            elif spec.commutative:
                choices = itertools.combinations(range(count), 2)
            else:
                choices = itertools.permutations(range(count), 2)
            for args in choices:
                if spec.seam and not self._unequal_parts(state, args[0], spec.axis):
                    continue  # nothing to make equal: the plain Split covers it
                result = infer(spec, [state.shapes[v] for v in args], state.subst)
                if result is None:
                    continue
                operands = [state.exprs[v] for v in args]
                if spec.commutative:
                    operands.sort()
                node = f"{spec.key}({','.join(operands)})"
                if node.replace("=", "") in {n.replace("=", "") for n in state.nodes}:
                    continue  # the same op twice (a seam Split is also a plain Split)
                nodes = state.nodes | {node}
                if nodes in self.seen:
                    continue
                self.seen.add(nodes)
                subst, outs = result
                names = [node] if len(outs) == 1 else [f"{node}#{k}" for k in range(len(outs))]
                child = _State(
                    ops=state.ops + ((spec.key, args),),
                    shapes=state.shapes + outs,
                    exprs=state.exprs + names,
                    nodes=nodes,
                    subst=subst,
                    concrete={},
                    values=[],
                    digests=[],
                )
                self._consider(state, child)

    @staticmethod
    def _unequal_parts(state: _State, value: int, axis: int) -> bool:
        dim = resolve(state.shapes[value][axis + 1], state.subst)
        return dim[0] == "s" and dim[1] != dim[2]

    def _evaluate(self, parent: _State, child: _State) -> str:
        """Fill child's values and digests; the reason it is dropped, or ""."""
        count = self.num_inputs
        graph = Graph(self.rank, count, child.ops, ())
        used = sorted(graph.used_inputs())
        resolved = tuple(tuple(resolve(t, child.subst) for t in child.shapes[i]) for i in used)
        _, concrete = canonical_point(resolved)
        if concrete is None:
            return "graphs dropped: dims not whole at the canonical point"
        child.concrete = dict(zip(used, concrete))
        inputs = {i: input_array(i, s) for i, s in child.concrete.items()}
        try:
            if all(child.concrete[i] == s for i, s in parent.concrete.items()):
                # The parent's values are still right: only the new op needs running.
                key, args = child.ops[-1]
                known = [inputs.get(v) if v < count else parent.values[v] for v in args]
                new_values = evaluate(SPECS[key], known)
                values = [inputs.get(i) for i in range(count)] + parent.values[count:]
                digests = [
                    parent.digests[i] if i in parent.concrete else None for i in range(count)
                ] + parent.digests[count:]
            else:
                full = run_graph(graph, inputs)
                values, new_values, digests = full[:count], full[count:], [None] * count
        except ValueError:
            return "graphs dropped: dims not whole at the canonical point"
        if any(not value.any() for value in new_values):
            return "graphs dropped: a value is identically zero"
        for i in used:
            if digests[i] is None:
                digests[i] = digest(inputs[i])
        child.values = values + new_values
        child.digests = digests + [digest(v) for v in new_values]
        return ""

    def _consider(self, parent: _State, child: _State) -> None:
        """Fingerprint a new graph, record it, and extend it unless it is redundant."""
        self.stats.add("graphs visited")
        dropped = self._evaluate(parent, child)
        if dropped:
            self.stats.add(dropped)
            return
        count = self.num_inputs
        used = sorted(child.concrete)
        known = [d for d in child.digests if d is not None]
        redundant = len(set(known)) < len(known)
        consumed = {v for _, args in child.ops for v in args}
        sinks = [v for v in range(count, len(child.values)) if v not in consumed]
        sinks.sort(key=lambda v: child.digests[v])
        graph = Graph(self.rank, count, child.ops, tuple(sinks), redundant)
        if used == list(range(len(used))) and _connected(graph):
            if self.rank == 2 or any(SPECS[k].op_type not in ELEMENTWISE for k, _ in graph.ops):
                self.stats.add("graphs enumerated")
                resolved = tuple(
                    tuple(resolve(t, child.subst) for t in child.shapes[i]) for i in used
                )
                key, _ = canonical_point(resolved)
                fingerprint = (key, tuple(child.digests[v] for v in sinks))
                self.groups[fingerprint].append(graph)
                self._record_identity(graph, {child.digests[i]: i for i in used}, child.digests)
                if len(sinks) > 1:
                    self._record_equal_outputs(child, graph, used)
        if redundant:
            self.stats.add("graphs not extended: two equal values")
        elif len(child.ops) < self.max_ops:
            self._extend(child, self.specs)

    def _record_equal_outputs(self, state: _State, graph: Graph, used: list[int]) -> None:
        """Record the graph again on the part of its domain where two outputs have one shape.

        A graph ending in Split has two outputs of one shape, so a graph with outputs of two
        shapes (two matmuls sharing an input) is never in its group; on the narrower domain
        it can be, and the pair becomes TASO's merge rule (one matmul on concatenated weights,
        then Split).
        """
        for a, b in itertools.combinations(graph.outputs, 2):
            subst = state.subst
            if [resolve(t, subst) for t in state.shapes[a]] == [
                resolve(t, subst) for t in state.shapes[b]
            ]:
                continue
            subst = unify_shapes(state.shapes[a], state.shapes[b], subst)
            if subst is None:
                continue
            resolved = tuple(tuple(resolve(t, subst) for t in state.shapes[i]) for i in used)
            key, concrete = canonical_point(resolved)
            if concrete is None:
                continue
            inputs = {i: input_array(i, s) for i, s in zip(used, concrete)}
            try:
                values = run_graph(graph, inputs)
            except ValueError:
                continue
            if any(not v.any() for v in values[self.num_inputs :]):
                continue
            digests = {v: digest(values[v]) for v in (*used, *range(self.num_inputs, len(values)))}
            reducible = len(set(digests.values())) < len(digests)
            sinks = sorted(graph.outputs, key=digests.__getitem__)
            narrowed = Graph(self.rank, self.num_inputs, graph.ops, tuple(sinks), reducible, True)
            self.groups[(key, tuple(digests[v] for v in sinks))].append(narrowed)
            self.stats.add("graphs also enumerated with two outputs of one shape")

    def _record_identity(
        self, graph: Graph, input_digests: dict[Digest, int], digests: list[Digest | None]
    ) -> None:
        """A graph whose every output equals an input is a rule with an Identity side."""
        if not all(digests[v] in input_digests for v in graph.outputs):
            return
        ops = tuple(("Identity", (input_digests[digests[v]],)) for v in graph.outputs)
        first = graph.num_inputs
        identity = Graph(self.rank, graph.num_inputs, ops, tuple(range(first, first + len(ops))))
        self.identities.append((graph, identity))


# ----------------------------------------------------------------------------------------------
# Pairs and their pruning.


@dataclass(frozen=True)
class Pair:
    """Two graphs over the same inputs computing the same outputs, in the same order."""

    lhs: Graph
    rhs: Graph

    def renamed(self, perm: Sequence[int]) -> Pair:
        return Pair(self.lhs.renamed(perm), self.rhs.renamed(perm))

    def used_inputs(self) -> list[int]:
        return sorted(self.lhs.used_inputs() | self.rhs.used_inputs())


def joint_shapes(pair: Pair) -> tuple[Subst, list[Shape], list[Shape]] | None:
    """The constraints of both sides together (the rule's domain), and every value's shape."""
    inputs = fresh_shapes(pair.lhs.rank, pair.lhs.num_inputs)
    left = infer_graph(pair.lhs, {}, inputs)
    if left is None:
        return None
    right = infer_graph(pair.rhs, left[0], inputs)
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
    every = [tuple(resolve(t, subst) for t in shape) for shape in (*left, *right)]
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
    inputs = {i: input_array(i, shape) for i, shape in points[0].items()}
    try:
        left = run_graph(pair.lhs, inputs)
        right = run_graph(pair.rhs, inputs)
    except ValueError:
        return False
    for a, b in zip(pair.lhs.outputs, pair.rhs.outputs):
        if left[a] is None or right[b] is None or not np.array_equal(left[a], right[b]):
            return False
    return True


def _rewire(
    graph: Graph,
    keep: Sequence[int],
    fresh: dict[int, int],
    num_inputs: int,
    outputs: Sequence[int],
) -> Graph:
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
    return Graph(graph.rank, num_inputs, tuple(ops), tuple(mapping[v] for v in outputs))


def _leaf_nodes(graph: Graph) -> dict[str, int]:
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
    producers = []
    for graph in (pair.lhs, pair.rhs):
        producers.append({v: i for i, outs in enumerate(graph.op_outputs()) for v in outs})
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
    lhs = Graph(
        pair.lhs.rank,
        pair.lhs.num_inputs,
        pair.lhs.ops,
        tuple(a for a, _ in order),
        pair.lhs.reducible,
    )
    rhs = Graph(
        pair.rhs.rank,
        pair.rhs.num_inputs,
        pair.rhs.ops,
        tuple(b for _, b in order),
        pair.rhs.reducible,
    )
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


def _cone(graph: Graph, value: int) -> list[int]:
    """The indices of the ops that `value` depends on, in order."""
    producer = {v: i for i, outs in enumerate(graph.op_outputs()) for v in outs}
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
                    graphs.append(Graph(graph.rank, graph.num_inputs, ops, graph.outputs))
                general.append(Pair(*graphs))
    return general


def star_pairs(groups: dict[Any, list[Graph]]) -> Iterable[Pair]:
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


# ----------------------------------------------------------------------------------------------
# Verification in onnxruntime.

OPSET = 18
VERIFY_TOLERANCE = 1e-4
"""|lhs - rhs| <= tol * max(1, max|lhs|) + tol * |lhs|, elementwise, in float32."""


def to_nodes(graph: Graph, prefix: str = "") -> tuple[list[list[Any]], list[str]]:
    """The graph as rule-file nodes [op_type, inputs, outputs, attrs] and its output names:
    inputs x<i>, internal values t<k>, outputs y<k> (with `prefix` on t and y names)."""
    names = [f"x{i}" for i in range(graph.num_inputs)]
    position = {v: k for k, v in enumerate(graph.outputs)}
    nodes, internal = [], 0
    for (key, args), outs in zip(graph.ops, graph.op_outputs()):
        out_names = []
        for v in outs:
            if v in position:
                out_names.append(f"{prefix}y{position[v]}")
            else:
                out_names.append(f"{prefix}t{internal}")
                internal += 1
        names += out_names
        spec = SPECS[key]
        nodes.append([spec.op_type, [names[v] for v in args], out_names, spec.onnx_attrs()])
    return nodes, [names[v] for v in graph.outputs]


def verification_model(pair: Pair, shapes: dict[int, tuple[int, ...]]) -> Any:
    """One ONNX model computing both sides from the same inputs (outputs l_y*, then r_y*)."""
    from onnx import TensorProto, helper

    nodes, outputs = [], []
    for side, graph in (("l_", pair.lhs), ("r_", pair.rhs)):
        side_nodes, side_outputs = to_nodes(graph, side)
        nodes += [helper.make_node(op, ins, outs, **attrs) for op, ins, outs, attrs in side_nodes]
        outputs += side_outputs
    graph = helper.make_graph(
        nodes,
        "rule",
        [helper.make_tensor_value_info(f"x{i}", TensorProto.FLOAT, s) for i, s in shapes.items()],
        [helper.make_tensor_value_info(name, TensorProto.FLOAT, None) for name in outputs],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = 8
    return model


def verify(pair: Pair, points: Sequence[dict[int, tuple[int, ...]]], seed: int = 0) -> str:
    """Run both sides in onnxruntime at every point on random float32 inputs; "" if they
    agree everywhere, else why not."""
    from rlflow.cost.session import OrtSettings, make_session

    settings = OrtSettings(threads=1, ort_level="disable", provider="cpu")
    count = len(pair.lhs.outputs)
    for point in points:
        try:
            session = make_session(verification_model(pair, point).SerializeToString(), settings)
            rng = np.random.default_rng(seed)
            feeds = {f"x{i}": rng.standard_normal(s).astype(np.float32) for i, s in point.items()}
            results = session.run(None, feeds)
        except Exception as error:  # a side that onnxruntime rejects is not a rule
            return f"onnxruntime failed at {point}: {str(error).splitlines()[0][:200]}"
        for left, right in zip(results[:count], results[count:]):
            if left.shape != right.shape:
                return f"shapes {left.shape} and {right.shape} differ at {point}"
            left64, right64 = left.astype(np.float64), right.astype(np.float64)
            scale = max(1.0, float(np.abs(left64).max(initial=0.0)))
            slack = VERIFY_TOLERANCE * (scale + np.abs(left64))
            if (np.abs(left64 - right64) > slack).any():
                return f"outputs differ at {point}"
    return ""


# ----------------------------------------------------------------------------------------------
# Names.

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


def describe(graph: Graph) -> str:
    """e.g. "add-of-matmuls", "split-of-matmul-of-concat", "matmul-and-split"."""
    producer = {v: i for i, outs in enumerate(graph.op_outputs()) for v in outs}

    def of(index: int) -> str:
        key, args = graph.ops[index]
        children = sorted({producer[v] for v in args if v in producer})
        if not children:
            return _short(key)
        return f"{_short(key)}-of-{_plural([of(c) for c in children])}"

    roots = sorted({producer[v] for v in graph.outputs})
    return _plural([of(r) for r in roots])


def _layers(graph: Graph) -> tuple[dict[str, int], dict[str, int]]:
    """Op-type counts of the graph's output ops and of its other ops."""
    producer = {v: i for i, outs in enumerate(graph.op_outputs()) for v in outs}
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


# ----------------------------------------------------------------------------------------------
# The pipeline.

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


def orient(pair: Pair) -> Pair:
    """The side with more ops (or an Identity side's partner) on the left, the pattern an
    engine matches when it simplifies; ties keep the canonical order."""
    if pair.lhs.ops and SPECS[pair.lhs.ops[0][0]].op_type == "Identity":
        return Pair(pair.rhs, pair.lhs)
    if len(pair.rhs.ops) > len(pair.lhs.ops):
        return Pair(pair.rhs, pair.lhs)
    return pair


def rank_rules(
    rank: int,
    op_types: Sequence[str],
    max_ops: int,
    num_inputs: int,
    check: bool = True,
    progress: bool = False,
) -> tuple[list[tuple[Pair, list[dict[int, tuple[int, ...]]]]], dict[str, int]]:
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
        if check:
            problem = verify(pair, points)
            if problem:
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


def _rule_inputs(pair: Pair) -> dict[str, dict[str, Any]]:
    """Each input's rank, and `const` for conv weights that another op than Conv reads:
    such a rule only pays when the weight is a constant that folds."""
    joint = joint_shapes(pair)
    assert joint is not None
    subst, shapes, _ = joint
    inputs = {}
    for i in pair.used_inputs():
        entry: dict[str, Any] = {"rank": pair.lhs.rank}
        if resolve(shapes[i][0], subst) == WEIGHT:
            readers = {SPECS[k].op_type for g in (pair.lhs, pair.rhs) for k, a in g.ops if i in a}
            if readers - {"Conv"}:
                entry["const"] = True
        inputs[f"x{i}"] = entry
    return inputs


def to_rule(pair: Pair, points: Sequence[dict[int, tuple[int, ...]]], name: str) -> dict[str, Any]:
    """The rule-file entry of a verified pair."""
    sides = {}
    for side, graph in (("lhs", pair.lhs), ("rhs", pair.rhs)):
        nodes, outputs = to_nodes(graph)
        sides[side] = {"nodes": nodes, "outputs": outputs}
    identity = all(SPECS[k].op_type == "Identity" for k, _ in pair.rhs.ops)
    return {
        "name": name,
        "origin": "generated",
        "inputs": _rule_inputs(pair),
        **sides,
        # Reading Identity(x) -> graph would match every tensor: keep only the simplification.
        "bidirectional": not identity,
        "verified_shapes": [{f"x{i}": list(s) for i, s in point.items()} for point in points],
    }


def unique_names(pairs: Sequence[Pair]) -> list[str]:
    """rule_name() of each pair, with -2, -3, ... added where names repeat."""
    names = [rule_name(p) for p in pairs]
    seen: dict[str, int] = {}
    unique = []
    for name in names:
        seen[name] = seen.get(name, 0) + 1
        unique.append(name if seen[name] == 1 else f"{name}-{seen[name]}")
    return unique


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


DEFAULT_PATH = os.path.join(os.path.dirname(__file__), "rules", "generated.json")


def settings_summary(
    max_ops: int, ops: Sequence[str], num_inputs: int, ranks: Sequence[int]
) -> str:
    return (
        f"max_ops={max_ops} inputs={num_inputs} ranks={','.join(map(str, ranks))} "
        f"ops={','.join(ops)}"
    )


def write_rules(
    path: str | os.PathLike[str] = DEFAULT_PATH,
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
    document = {
        "version": 1,
        "generator": f"rlflow.rewrite.generator {settings}",
        "opset": OPSET,
        "rules": rules,
    }
    text = (
        "{"
        + ", ".join(
            f"{json.dumps(k)}: {json.dumps(v)}" for k, v in document.items() if k != "rules"
        )
        + ', "rules": [\n'
        + ",\n".join(json.dumps(rule) for rule in rules)
        + "\n]}\n"
    )
    write_text_atomic(path, text)
    return rules


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m rlflow.rewrite.generator` (and `rlflow rules generate`)."""
    parser = argparse.ArgumentParser(
        prog="rlflow rules generate",
        description="Enumerate small graphs, keep equal pairs as verified rewrite rules.",
    )
    parser.add_argument("-o", "--output", default=DEFAULT_PATH, help="rule file to write")
    parser.add_argument(
        "--max-ops", type=int, default=3, help="ops per graph (default 3; 4 takes hours)"
    )
    parser.add_argument("--ops", default=",".join(DEFAULT_OPS), help="op types to enumerate")
    parser.add_argument("--inputs", type=int, default=4, help="input tensors per rank")
    parser.add_argument("--ranks", default="2,4", help="tensor ranks: 2 (matmul), 4 (conv)")
    parser.add_argument("--json", action="store_true", help="print one JSON summary last")
    args = parser.parse_args(argv)
    ops = [op for op in args.ops.split(",") if op]
    try:
        ranks = [int(r) for r in args.ranks.split(",") if r]
    except ValueError:
        parser.error("--ranks takes comma-separated ranks, e.g. 2,4")
    started = time.perf_counter()
    stats: dict[str, int] = {}
    try:
        rules = write_rules(
            args.output,
            args.max_ops,
            ops,
            args.inputs,
            ranks,
            progress=sys.stderr.isatty(),
            stats=stats,
        )
    except RlflowError as error:
        print(f"rlflow: error: {error}", file=sys.stderr)
        return 2
    wall = time.perf_counter() - started
    for stage in (*STAGES, *sorted(set(stats) - set(STAGES))):
        if stage in stats:
            print(f"{stage:>48}: {stats[stage]}", file=sys.stderr)
    print(f"wrote {len(rules)} rules to {args.output} in {wall:.0f} s")
    if args.json:
        print(
            json.dumps(
                {
                    "rules": len(rules),
                    "path": str(args.output),
                    "wall_s": round(wall, 1),
                    "stages": stats,
                }
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The op menu: the ONNX ops (with fixed attributes) that graphs are enumerated from, and the
shape rule of each on symbolic shapes.

A key names one op with its attributes ("Concat1" is Concat on axis 1). Split cuts into two
equal halves (ONNX opset 18 `num_outputs`); splitting a concatenation of unequal parts gives
new tensors, so a Split of a dim that is a sum is enumerated twice: as is, and with the two
parts unified ("Split1=", a Split at the concat seam; TASO splits only at a seam).

Rank-2 tensors form the matmul family and rank-4 NCHW tensors the conv family.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from rlflow.rewrite.generator.symbolic import (
    ACTIVATION,
    WEIGHT,
    Shape,
    Subst,
    Term,
    make_half,
    make_sum,
    resolve,
    unify,
    unify_shapes,
)


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

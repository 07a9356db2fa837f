"""ExprDag: the generator's own small graph, a DAG of menu ops over numbered inputs.

Far lighter than the IR's `rlflow.graph.Graph` (no names, no tensors, no ONNX): a tuple of
(op key, operand ids) that hashes, compares and renames cheaply, since millions are built
during enumeration. Its canonical text identifies a graph up to op order and commutativity,
which is how enumeration and pruning tell graphs apart. `to_nodes` writes it out as the
rule-file node list that the engine and onnxruntime read.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from rlflow.rewrite.generator.domain import fresh_shapes
from rlflow.rewrite.generator.menu import SPECS, infer
from rlflow.rewrite.generator.symbolic import Shape, Subst


@dataclass(frozen=True)
class ExprDag:
    """Value ids 0..num_inputs-1 are the inputs x0, x1, ...; each op appends its outputs.
    `outputs` lists the DAG's outputs (its unconsumed values) in a fixed order."""

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

    def producers(self) -> dict[int, int]:
        """Value id -> index of the op computing it (inputs are absent)."""
        return {v: i for i, outs in enumerate(self.op_outputs()) for v in outs}

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

    def renamed(self, perm: Sequence[int]) -> ExprDag:
        """The same DAG reading input perm[i] where it read input i."""
        ops = tuple(
            (key, tuple(perm[v] if v < self.num_inputs else v for v in args))
            for key, args in self.ops
        )
        outputs = tuple(perm[v] if v < self.num_inputs else v for v in self.outputs)
        return ExprDag(self.rank, self.num_inputs, ops, outputs, self.reducible)


def infer_shapes(
    dag: ExprDag, subst: Subst | None = None, inputs: Sequence[Shape] | None = None
) -> tuple[Subst, list[Shape]] | None:
    """The constraints of every op of `dag` and the shape of every value, or None."""
    subst = {} if subst is None else subst
    shapes = list(inputs) if inputs is not None else fresh_shapes(dag.rank, dag.num_inputs)
    for key, args in dag.ops:
        result = infer(SPECS[key], [shapes[v] for v in args], subst)
        if result is None:
            return None
        subst, outs = result
        shapes += outs
    return subst, shapes


def to_nodes(dag: ExprDag) -> tuple[list[list[Any]], list[str]]:
    """The DAG as rule-file nodes [op_type, inputs, outputs, attrs] and its output names:
    inputs x<i>, internal values t<k>, outputs y<k>."""
    names = [f"x{i}" for i in range(dag.num_inputs)]
    position = {v: k for k, v in enumerate(dag.outputs)}
    nodes, internal = [], 0
    for (key, args), outs in zip(dag.ops, dag.op_outputs()):
        out_names = []
        for v in outs:
            if v in position:
                out_names.append(f"y{position[v]}")
            else:
                out_names.append(f"t{internal}")
                internal += 1
        names += out_names
        spec = SPECS[key]
        nodes.append([spec.op_type, [names[v] for v in args], out_names, spec.onnx_attrs()])
    return nodes, [names[v] for v in dag.outputs]

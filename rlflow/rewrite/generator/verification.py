"""Verification of a kept pair: both sides run in onnxruntime, in float32, at three shape
settings of their domain, and must pass the same test as every other rule.

The exact fingerprints that found the pair say the sides agree at one point, in integers;
this says they agree in the arithmetic the engine will run them in, at shapes that differ
from the one they were found at. Each side becomes its own ONNX model over the same inputs
and outputs, and `rlflow.rewrite.verify.same_function` compares them, with the tolerances and
seeds that `rlflow rules verify` uses, so a generated rule is "verified" in the one sense the
project has.
"""

from __future__ import annotations

from collections.abc import Sequence

import onnx
from onnx import TensorProto, helper

from rlflow.errors import RlflowError
from rlflow.rewrite.generator.dag import ExprDag, to_nodes
from rlflow.rewrite.generator.pairs import Pair
from rlflow.rewrite.template import TEMPLATE_OPSET
from rlflow.rewrite.verify import same_function


def side_model(dag: ExprDag, shapes: dict[int, tuple[int, ...]]) -> onnx.ModelProto:
    """One side as a model: float inputs x<i> of `shapes` (all the pair's inputs, so that both
    sides have one signature) and its outputs y<k>."""
    nodes, outputs = to_nodes(dag)
    graph = helper.make_graph(
        [helper.make_node(op, ins, outs, **attrs) for op, ins, outs, attrs in nodes],
        "side",
        [helper.make_tensor_value_info(f"x{i}", TensorProto.FLOAT, s) for i, s in shapes.items()],
        [helper.make_tensor_value_info(name, TensorProto.FLOAT, None) for name in outputs],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", TEMPLATE_OPSET)])


def verify(pair: Pair, points: Sequence[dict[int, tuple[int, ...]]]) -> str:
    """ "" if the two sides compute the same outputs at every point, else why not."""
    for point in points:
        try:
            report = same_function(side_model(pair.lhs, point), side_model(pair.rhs, point))
        except RlflowError as error:  # the lhs itself fails: onnxruntime rejects the pair
            return f"at {point}: {error}"
        if not report.equivalent:
            return f"at {point}: {report.reason}"
    return ""

"""Verification of a kept pair: both sides run in onnxruntime, in float32, at three shape
settings of their domain; a pair that differs beyond tolerance at any setting is dropped.

The exact fingerprints that found the pair say the sides agree at one point, in integers;
this says they agree in the arithmetic the engine will run them in, at shapes that differ
from the one they were found at.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from rlflow.rewrite.generator.dag import to_nodes
from rlflow.rewrite.generator.pairs import Pair
from rlflow.rewrite.template import TEMPLATE_OPSET

VERIFY_TOLERANCE = 1e-4
"""|lhs - rhs| <= tol * max(1, max|lhs|) + tol * |lhs|, elementwise, in float32."""


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
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", TEMPLATE_OPSET)])
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

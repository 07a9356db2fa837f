"""ORT's ReshapeFusion, one site at a time: a Squeeze or Unsqueeze after a Reshape joins it.

- Unsqueeze(Reshape(x, s), axes) -> Reshape(x, s')      (s' the static shape of the result)
- Squeeze(Reshape(x, s), axes) -> Reshape(x, s')

onnxruntime fuses a chain Reshape -> {Reshape, Squeeze, Unsqueeze}* with a static final shape
into one Reshape (the transducer's joint: Reshape(Gemm) -> Unsqueeze after MatMulAddFusion).
Reshape after Reshape is simplify's reshape-reshape-fold; these two take the other links, so
that any such chain folds pairwise. A fold only drops a node that moves no data, so it is never
slower and has no reverse.
"""

from __future__ import annotations

import numpy as np
import onnx

from rlflow.rewrite.build import ModelBuilder
from rlflow.rewrite.rules.common import pick
from rlflow.rewrite.rules.simplify import ReshapeReshapeFold


class _ReshapeLinkFold(ReshapeReshapeFold):
    """`op` after a Reshape joins it (the check and rewrite are reshape-reshape-fold's)."""

    op = ""
    cases: tuple = ()
    """Per shape setting: the input's shape, the Reshape's target, `op`'s axes (None: none)."""

    def example(self, setting: int) -> onnx.ModelProto:
        dims, target, axes = pick(setting, self.cases)
        b = ModelBuilder()
        flat = b.op("Reshape", [b.input(dims), b.const(list(target), np.int64)])
        axes_input = [] if axes is None else [b.const(axes, np.int64)]
        return b.model(b.op(self.op, [flat, *axes_input]))


class ReshapeUnsqueezeFold(_ReshapeLinkFold):
    name = "reshape-unsqueeze-fold"
    description = "Unsqueeze(Reshape(x, s), axes) -> Reshape(x, s')"
    pattern = "Unsqueeze(Reshape(x, s), axes?)"
    op = "Unsqueeze"
    cases = (((2, 12), (2, 3, 4), [1]), ((6, 5), (30,), [0, 2]), ((1, 8), (4, 2), [2]))


class ReshapeSqueezeFold(_ReshapeLinkFold):
    name = "reshape-squeeze-fold"
    description = "Squeeze(Reshape(x, s), axes) -> Reshape(x, s')"
    pattern = "Squeeze(Reshape(x, s), axes?)"
    op = "Squeeze"
    cases = (((2, 12), (2, 1, 12), [1]), ((6, 5), (1, 30, 1), None), ((8,), (1, 8), [0]))


RULES = [ReshapeUnsqueezeFold(), ReshapeSqueezeFold()]

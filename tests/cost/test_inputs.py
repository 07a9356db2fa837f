"""Random inputs: integer inputs within their metadata range, reproducible by seed."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto

from rlflow.cost import DEFAULT_INT_RANGE, int_range, random_inputs
from rlflow.cost.source import TensorSpec
from rlflow.errors import RlflowError

SPECS = [
    TensorSpec("ids", TensorProto.INT64, (4, 256)),
    TensorSpec("mask", TensorProto.INT32, (4, 256)),
    TensorSpec("flags", TensorProto.BOOL, (64,)),
    TensorSpec("x", TensorProto.FLOAT, (2, 3)),
    TensorSpec("h", TensorProto.FLOAT16, (2, 3)),
]


def test_int_inputs_drawn_within_metadata_range():
    feeds = random_inputs(SPECS, {"rlflow.int_range.ids": "1000,1010"}, seed=0)
    ids = feeds["ids"]
    assert ids.dtype == np.int64 and ids.shape == (4, 256)
    assert ids.min() >= 1000 and ids.max() < 1010
    assert len(np.unique(ids)) == 10  # the whole range is used, the high end excluded
    mask = feeds["mask"]  # no metadata: the documented default
    assert mask.dtype == np.int32 and set(np.unique(mask)) == set(range(*DEFAULT_INT_RANGE))
    assert feeds["flags"].dtype == np.bool_ and 0 < feeds["flags"].sum() < 64
    assert feeds["x"].dtype == np.float32 and feeds["h"].dtype == np.float16


def test_same_seed_same_inputs_other_seed_other_inputs():
    a, b, c = (random_inputs(SPECS, {}, seed) for seed in (3, 3, 4))
    assert all(np.array_equal(a[name], b[name]) for name in a)
    assert not np.array_equal(a["x"], c["x"])


@pytest.mark.parametrize("text", ["10", "a,b", "5,5", "9,2"])
def test_malformed_range_is_a_user_error(text):
    with pytest.raises(RlflowError, match="rlflow.int_range.ids"):
        int_range({"rlflow.int_range.ids": text}, "ids")

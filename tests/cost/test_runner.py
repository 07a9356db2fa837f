"""The Runner ranks graphs within one interleaved run and caches by graph hash and settings."""

from __future__ import annotations

import json

import numpy as np
import pytest
from onnx import TensorProto, helper

from rlflow.cost import OrtSettings, Runner
from rlflow.errors import RlflowError
from rlflow.graph import load_model

SIZE = 512


@pytest.fixture
def plain_and_heavy(build):
    """y = x @ W; the heavy one also computes an independent chain z = (x @ V) @ V."""
    rng = np.random.default_rng(0)
    w = rng.standard_normal((SIZE, SIZE)).astype(np.float32)
    v = rng.standard_normal((SIZE, SIZE)).astype(np.float32)
    x = [("x", TensorProto.FLOAT, [64, SIZE])]
    y = ("y", TensorProto.FLOAT, [64, SIZE])
    z = ("z", TensorProto.FLOAT, [64, SIZE])
    matmul = helper.make_node("MatMul", ["x", "w"], ["y"])
    plain = build([matmul], x, [y], {"w": w})
    chain = [
        helper.make_node("MatMul", ["x", "v"], ["u"]),
        helper.make_node("MatMul", ["u", "v"], ["z"]),
    ]
    heavy = build([matmul, *chain], x, [y, z], {"w": w, "v": v})
    return plain, heavy


def test_ranks_extra_matmul_chain_as_slower(plain_and_heavy):
    plain, heavy = plain_and_heavy
    comparison = Runner(runs=20).compare([plain, heavy])
    assert comparison.ratios[0] == 1.0
    assert comparison.ratios[1] > 1.0  # min(heavy) / min(plain): a ranking, not a threshold
    assert comparison.pair_ratio_medians[1] > 1.0
    assert comparison.fastest() == 0
    assert comparison.speedups[1] < 1.0


def test_interleaved_runs_and_named_settings(plain_and_heavy):
    plain, _ = plain_and_heavy
    runner = Runner(OrtSettings(ort_level="disable"), runs=7, min_time_s=0, block=3)
    comparison = runner.compare([plain, load_model(plain)])
    for measurement in comparison.measurements:
        assert measurement.runs == 9  # rounded up to whole blocks
        assert 0 < measurement.min_ms <= measurement.median_ms
        assert (measurement.ort_level, measurement.threads) == ("disable", 1)
        assert measurement.provider in ("cpu", "cuda")


def test_results_cached_in_memory_and_on_disk(plain_and_heavy, tmp_path):
    plain, heavy = plain_and_heavy
    cache_path = tmp_path / "runner.json"
    runner = Runner(runs=5, min_time_s=0.02, cache_path=cache_path)
    first = runner.measure(plain)
    comparison = runner.compare([plain, heavy])
    built = runner.sessions_built
    assert runner.measure(plain) == first
    assert runner.compare([plain, heavy]) == comparison
    assert runner.sessions_built == built
    assert len(json.loads(cache_path.read_text())) == 2

    reloaded = Runner(runs=5, min_time_s=0.02, cache_path=cache_path)
    assert reloaded.measure(plain) == first
    assert reloaded.compare([plain, heavy]) == comparison
    assert reloaded.sessions_built == 0
    other_settings = Runner(
        OrtSettings(ort_level="disable"), runs=5, min_time_s=0.02, cache_path=cache_path
    )
    other_settings.measure(plain)
    assert other_settings.sessions_built == 1
    assert not list(tmp_path.glob("*.tmp"))  # atomic writes leave no temporary files


def test_int_inputs_drawn_within_metadata_range(build):
    """Gather fails on an out-of-range id, so this only runs if ids stay below 1000."""
    embedding = np.zeros((1000, 8), np.float32)
    model = build(
        [helper.make_node("Gather", ["emb", "ids"], ["y"])],
        [("ids", TensorProto.INT64, [1, 256])],
        [("y", TensorProto.FLOAT, [1, 256, 8])],
        {"emb": embedding},
        {"rlflow.int_range.ids": "990,1000"},
    )
    assert Runner(runs=2, min_time_s=0).measure(model).min_ms > 0


def test_user_errors_are_rlflow_errors(build, plain_and_heavy):
    plain, _ = plain_and_heavy
    dynamic = build(
        [helper.make_node("Relu", ["x"], ["y"])],
        [("x", TensorProto.FLOAT, ["batch", 4])],
        [("y", TensorProto.FLOAT, None)],
    )
    with pytest.raises(RlflowError, match="dynamic"):
        Runner().measure(dynamic)
    other_inputs = build(
        [helper.make_node("Relu", ["x"], ["y"])],
        [("x", TensorProto.FLOAT, [2, 4])],
        [("y", TensorProto.FLOAT, None)],
    )
    with pytest.raises(RlflowError, match="same inputs"):
        Runner().compare([plain, other_inputs])
    with pytest.raises(RlflowError, match="ORT level"):
        OrtSettings(ort_level="fast")
    assert OrtSettings().resolved().provider in ("cpu", "cuda")

"""The analytic model: FLOP and byte formulas, the roofline time, and the cached machine peaks."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

from rlflow.cost import AnalyticCostModel, MachinePeaks, OrtSettings, machine_peaks, op_cost
from rlflow.cost import peaks as peaks_module
from rlflow.cost.analytic import has_formula
from rlflow.errors import RlflowError
from rlflow.graph import Graph, Node, Value, load_model

F = TensorProto.FLOAT
PEAKS = MachinePeaks(gflops=100.0, gbps=10.0)


def t(*shape: int, dtype: int = F):
    return (tuple(shape), dtype)


def test_matmul_flops_grow_with_size():
    small = op_cost("MatMul", (t(64, 64), t(64, 64)), (t(64, 64),))
    large = op_cost("MatMul", (t(128, 128), t(128, 128)), (t(128, 128),))
    assert small.flops == 2 * 64**3 and large.flops == 2 * 128**3
    assert large.bytes > small.bytes > 0
    model = AnalyticCostModel(PEAKS)
    assert model.op_time_ms(large) > model.op_time_ms(small) > 0


def test_gemm_and_grouped_conv():
    gemm = op_cost("Gemm", (t(32, 64), t(64, 16), t(16)), (t(32, 16),), (("transA", 0),))
    assert gemm.flops == 2 * 32 * 16 * 64 + 32 * 16
    dense = op_cost("Conv", (t(1, 64, 28, 28), t(64, 64, 3, 3), t(64)), (t(1, 64, 28, 28),))
    grouped = op_cost("Conv", (t(1, 64, 28, 28), t(64, 16, 3, 3), t(64)), (t(1, 64, 28, 28),))
    out = 64 * 28 * 28
    assert dense.flops == 2 * out * 64 * 9 + out
    assert grouped.flops == 2 * out * 16 * 9 + out


# The operators the zoo uses, each with a plausible signature.
ZOO_OPS = [
    ("BatchNormalization", (t(1, 8, 4, 4), t(8), t(8), t(8), t(8)), (t(1, 8, 4, 4),), ()),
    ("Relu", (t(4, 8),), (t(4, 8),), ()),
    ("Add", (t(4, 8), t(8)), (t(4, 8),), ()),
    ("Mul", (t(4, 8), t(4, 8)), (t(4, 8),), ()),
    ("Sub", (t(4, 8), t(1)), (t(4, 8),), ()),
    ("Div", (t(4, 8), t(1)), (t(4, 8),), ()),
    ("Pow", (t(4, 8), t(1)), (t(4, 8),), ()),
    ("Sqrt", (t(4, 8),), (t(4, 8),), ()),
    ("Softmax", (t(4, 8),), (t(4, 8),), ()),
    ("LayerNormalization", (t(4, 8), t(8), t(8)), (t(4, 8),), ()),
    ("Gelu", (t(4, 8),), (t(4, 8),), ()),
    ("Erf", (t(4, 8),), (t(4, 8),), ()),
    ("Tanh", (t(4, 8),), (t(4, 8),), ()),
    ("Sigmoid", (t(4, 8),), (t(4, 8),), ()),
    ("Where", (t(4, 8, dtype=TensorProto.BOOL), t(4, 8), t(1)), (t(4, 8),), ()),
    ("ReduceMean", (t(4, 8), t(1, dtype=TensorProto.INT64)), (t(4, 1),), ()),
    ("Cast", (t(4, 8),), (t(4, 8, dtype=TensorProto.FLOAT16),), ()),
    ("Transpose", (t(4, 8),), (t(8, 4),), ()),
    ("Concat", (t(4, 8), t(4, 8)), (t(8, 8),), ()),
    ("Split", (t(8, 8),), (t(4, 8), t(4, 8)), ()),
    ("Slice", (t(8, 8), t(1, dtype=7), t(1, dtype=7)), (t(4, 8),), ()),
    ("Gather", (t(100, 8), t(4, dtype=7)), (t(4, 8),), ()),
    ("Expand", (t(1, 8), t(2, dtype=7)), (t(4, 8),), ()),
    ("MaxPool", (t(1, 8, 8, 8),), (t(1, 8, 4, 4),), (("kernel_shape", (2, 2)),)),
    ("AveragePool", (t(1, 8, 8, 8),), (t(1, 8, 4, 4),), (("kernel_shape", (2, 2)),)),
    ("GlobalAveragePool", (t(1, 8, 8, 8),), (t(1, 8, 1, 1),), ()),
    ("SomeUnknownOp", (t(4, 8),), (t(4, 8),), ()),
]


@pytest.mark.parametrize("op_type, inputs, outputs, attrs", ZOO_OPS, ids=[o[0] for o in ZOO_OPS])
def test_every_zoo_op_has_a_positive_cost(op_type, inputs, outputs, attrs):
    cost = op_cost(op_type, inputs, outputs, attrs)
    assert cost.bytes > 0
    assert AnalyticCostModel(PEAKS).op_time_ms(cost) > 0
    if op_type in ("Transpose", "Concat", "Split", "Slice", "Gather", "Expand", "SomeUnknownOp"):
        assert cost.flops == 0  # pure data movement
    else:
        assert cost.flops > 0


@pytest.mark.parametrize("op_type", ["Reshape", "Flatten", "Identity", "Dropout", "Squeeze"])
def test_buffer_relabelling_ops_are_free(op_type):
    cost = op_cost(op_type, (t(4, 8),), (t(32),))
    assert cost.flops == 0 and cost.bytes == 0


def test_graph_cost_is_the_sum_of_its_nodes(build):
    rng = np.random.default_rng(0)
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["m"]),
        helper.make_node("Relu", ["m"], ["r"]),
        helper.make_node("Reshape", ["r", "shape"], ["y"]),
    ]
    consts = {"w": rng.standard_normal((64, 64)).astype(np.float32), "shape": np.array([-1])}
    graph = load_model(build(nodes, [("x", F, [8, 64])], [("y", F, None)], consts))
    model = AnalyticCostModel(PEAKS)
    report = model.report(graph)
    node_times = [model.node_time_ms(graph, node) for node in graph.nodes]
    assert report.floor_ms == pytest.approx(sum(node_times)) == pytest.approx(model.cost_ms(graph))
    assert report.ms_by_op["MatMul"] > report.ms_by_op["Relu"] > report.ms_by_op["Reshape"] == 0
    assert report.flops == 2 * 8 * 64 * 64 + 8 * 64
    with_overhead = AnalyticCostModel(PEAKS, overhead_ms=0.01).cost_ms(graph)
    assert with_overhead == pytest.approx(report.floor_ms + 2 * 0.01)  # not for the Reshape


def test_machine_peaks_are_measured_once_and_cached_on_disk(cache_dir, monkeypatch):
    monkeypatch.delenv("RLFLOW_PEAKS", raising=False)  # the suite pins them (tests/conftest.py)
    monkeypatch.setattr(peaks_module, "_memory", {})  # earlier tests may have filled it
    settings = OrtSettings()
    measured = machine_peaks(settings)
    assert measured.gflops > 0 and measured.gbps > 0
    assert (cache_dir / "peaks.json").exists()

    def no_measuring(_settings):
        raise AssertionError("peaks were measured again")

    monkeypatch.setattr(peaks_module, "measure_peaks", no_measuring)
    monkeypatch.setattr(peaks_module, "_memory", {})  # as in a new process
    assert machine_peaks(settings) == measured

    # Measuring again in a slow moment must not lower a peak: the best of both is kept.
    slow = MachinePeaks(gflops=1.0, gbps=1.0, cache_gbps=1.0, cache_bytes=measured.cache_bytes)
    monkeypatch.setattr(peaks_module, "measure_peaks", lambda _settings: slow)
    assert machine_peaks(settings, refresh=True) == measured


def test_pinned_peaks_replace_the_measurement(monkeypatch):
    monkeypatch.setenv("RLFLOW_PEAKS", '{"gflops": 100, "gbps": 10}')
    assert machine_peaks(OrtSettings()) == MachinePeaks(gflops=100, gbps=10)
    monkeypatch.setenv("RLFLOW_PEAKS", "fast")
    with pytest.raises(RlflowError, match="RLFLOW_PEAKS must be JSON"):
        machine_peaks(OrtSettings())


# ---- onnxruntime's own operators, as its optimised graphs hold them ---------------------------


def _relu_flops(*shape: int) -> float:
    return op_cost("Relu", (t(*shape),), (t(*shape),)).flops


def test_fused_conv_is_the_conv_plus_its_activation_and_sum():
    x, w, b, y = t(1, 24, 14, 14), t(24, 24, 3, 3), t(24), t(1, 24, 14, 14)
    conv = op_cost("Conv", (x, w, b), (y,))
    fused = op_cost("FusedConv", (x, w, b), (y,), (("activation", "Relu"),))
    assert fused.flops == conv.flops + _relu_flops(1, 24, 14, 14)
    with_sum = op_cost("FusedConv", (x, w, b, y), (y,), (("activation", "Relu"),))
    add = op_cost("Add", (y, y), (y,))
    assert with_sum.flops == fused.flops + add.flops
    assert with_sum.bytes == fused.bytes + 4 * 24 * 14 * 14  # the Sum input is read too
    sigmoid = op_cost("FusedConv", (x, w, b), (y,), (("activation", "Sigmoid"),))
    assert sigmoid.flops > fused.flops  # the activation's own count


@pytest.mark.parametrize("blocked_input", [False, True])
def test_nchwc_conv_counts_the_padded_channels(blocked_input):
    """24 channels padded to 32 (block 16): the blocked Conv does the padding's work too, but
    stays within the padding's factor of the plain Conv."""
    plain = op_cost("Conv", (t(1, 24, 14, 14), t(24, 24, 3, 3), t(24)), (t(1, 24, 14, 14),))
    channels_in = 32 if blocked_input else 24  # a Conv may read NCHW and write blocked
    x, w = t(1, channels_in, 14, 14), t(32, channels_in, 3, 3)
    y = t(1, 32, 14, 14)
    blocked = op_cost("Conv", (x, w, t(32)), (y,), (("activation", "Relu"),))
    padding = (32 / 24) ** (2 if blocked_input else 1)
    assert plain.flops < blocked.flops <= 1.01 * padding * plain.flops
    assert blocked.flops == op_cost("Conv", (x, w, t(32)), (y,)).flops + _relu_flops(1, 32, 14, 14)
    with_sum = op_cost("Conv", (x, w, t(32), y), (y,), (("activation", "Relu"),))
    assert with_sum.flops == blocked.flops + 32 * 14 * 14


def test_nchwc_pools_and_reorders():
    pool = op_cost("MaxPool", (t(1, 16, 8, 8),), (t(1, 16, 4, 4),), (("kernel_shape", (3, 3)),))
    assert pool.flops == 16 * 4 * 4 * 9
    mean = op_cost("GlobalAveragePool", (t(1, 16, 8, 8),), (t(1, 16, 1, 1),))
    assert mean.flops == 16 * 8 * 8
    for op_type, inputs, outputs in [
        ("ReorderInput", (t(1, 24, 8, 8),), (t(1, 32, 8, 8),)),
        ("ReorderOutput", (t(1, 32, 8, 8),), (t(1, 24, 8, 8),)),
    ]:
        cost = op_cost(op_type, inputs, outputs)
        assert cost.flops == 0 and cost.bytes == 4 * (24 + 32) * 8 * 8  # pure data movement
        assert has_formula(op_type)


def test_fused_matmul_transposes_scale_and_batch():
    a, b, y = t(2, 4, 16, 8), t(2, 4, 8, 5), t(2, 4, 16, 5)
    assert op_cost("FusedMatMul", (a, b), (y,)).flops == op_cost("MatMul", (a, b), (y,)).flops
    scaled = op_cost("FusedMatMul", (a, b), (y,), (("transA", 0), ("alpha", 0.125)))
    assert scaled.flops == 2 * 2 * 4 * 16 * 5 * 8 + 2 * 4 * 16 * 5  # the scale: one a result
    # transA: A is (2, 4, K=8, M=16); transBatchA too: A is (K=8, 2, 4, M=16).
    for a_shape, trans_batch in [((2, 4, 8, 16), 0), ((8, 2, 4, 16), 1)]:
        attrs = (("transA", 1), ("transBatchA", trans_batch), ("alpha", 1.0))
        cost = op_cost("FusedMatMul", (t(*a_shape), b), (y,), attrs)
        assert cost.flops == 2 * 2 * 4 * 16 * 5 * 8


def test_gemm_alpha_beta():
    a, b, c, y = t(32, 64), t(64, 16), t(16), t(32, 16)
    plain = op_cost("Gemm", (a, b, c), (y,), (("transA", 0),))
    scaled = op_cost("Gemm", (a, b, c), (y,), (("transA", 0), ("alpha", 0.5), ("beta", 2.0)))
    assert scaled.flops == plain.flops + 2 * 32 * 16
    transposed = op_cost("Gemm", (t(64, 32), b, c), (y,), (("transA", 1),))
    assert transposed.flops == plain.flops


def test_layer_norms_and_gelus():
    x, gamma = t(1, 16, 32), t(32)
    layer_norm = op_cost("LayerNormalization", (x, gamma, gamma), (x,))
    add = op_cost("Add", (x, x), (x,))
    assert layer_norm.flops == 8 * 16 * 32
    skip = op_cost("SkipLayerNormalization", (x, x, gamma, gamma), (x,))
    assert skip.flops == layer_norm.flops + add.flops
    with_bias = op_cost("SkipLayerNormalization", (x, x, gamma, gamma, gamma), (x,))
    assert with_bias.flops == skip.flops + add.flops
    gelu = op_cost("Gelu", (x,), (x,))
    bias_gelu = op_cost("BiasGelu", (x, gamma), (x,))
    assert bias_gelu.flops == gelu.flops + add.flops
    fast = op_cost("FastGelu", (x,), (x,))
    assert fast.flops == op_cost("Gelu", (x,), (x,), (("approximate", "tanh"),)).flops
    assert op_cost("FastGelu", (x, gamma), (x,)).flops == fast.flops + add.flops
    assert 0 < gelu.flops < fast.flops  # erf is one transcendental, the tanh form adds a cube


def test_unknown_ops_are_named_in_the_report():
    values = {name: Value(name, F, (16, 16)) for name in ("x", "h", "y")}
    nodes = [Node("Frobnicate", ["x"], ["h"], domain="example.custom"), Node("Relu", ["h"], ["y"])]
    graph = Graph(nodes, [values["x"]], [values["y"]], {}, values, {"": 17, "example.custom": 1})
    report = AnalyticCostModel(PEAKS).report(graph)
    assert report.unmodelled == {"Frobnicate": 1}
    assert report.ms_by_op["Frobnicate"] > 0  # priced as data movement

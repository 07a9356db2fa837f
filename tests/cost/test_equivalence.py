"""The equivalence checker accepts true rewrites and rejects planted wrong ones, with reasons."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

from rlflow.cost import EquivalenceChecker, check_equivalence
from rlflow.cost.equivalence import MAGNITUDES
from rlflow.errors import RlflowError
from rlflow.graph import load_model


def test_accepts_identical_graph(linear_models):
    report = check_equivalence(linear_models["matmul_add"], linear_models["matmul_add"])
    assert report.equivalent, report.reason
    assert report.max_abs_err == 0.0


def test_accepts_matmul_add_as_gemm_and_a_graph_as_its_model(linear_models):
    reference = linear_models["matmul_add"]
    assert check_equivalence(reference, linear_models["gemm"]).equivalent
    assert check_equivalence(reference, load_model(linear_models["gemm"])).equivalent
    assert check_equivalence(load_model(reference), linear_models["gemm"]).equivalent


@pytest.mark.parametrize("wrong", ["swapped", "no_bias"])
def test_rejects_planted_wrong_rewrite(linear_models, wrong):
    report = check_equivalence(linear_models["matmul_add"], linear_models[wrong])
    assert not report.equivalent
    assert "output 'y' differs" in report.reason
    assert report.max_abs_err > 0.1


def test_checker_reuses_reference_for_many_candidates(linear_models):
    checker = EquivalenceChecker(linear_models["matmul_add"], seeds=(0, 1))
    verdicts = {name: checker.check(model).equivalent for name, model in linear_models.items()}
    assert verdicts == {"matmul_add": True, "gemm": True, "swapped": False, "no_bias": False}


def _offset_model(build, offset: float):
    """y = x + 1 (+ offset as a second Add when offset != 0)."""
    nodes = [helper.make_node("Add", ["x", "one"], ["y" if not offset else "t"])]
    consts = {"one": np.ones(1, np.float32)}
    if offset:
        nodes.append(helper.make_node("Add", ["t", "eps"], ["y"]))
        consts["eps"] = np.full(1, offset, np.float32)
    io = [("x", TensorProto.FLOAT, [8, 8])], [("y", TensorProto.FLOAT, [8, 8])]
    return build(nodes, *io, consts)


def test_float_tolerance_admits_rounding_not_real_error(build):
    reference = _offset_model(build, 0.0)
    rounding = check_equivalence(reference, _offset_model(build, 1e-6))
    assert rounding.equivalent, rounding.reason
    assert 0 < rounding.max_abs_err < 1e-5
    real = check_equivalence(reference, _offset_model(build, 1e-2))
    assert not real.equivalent


def test_signature_mismatch_is_a_verdict_not_an_exception(build, linear_models):
    reference = linear_models["matmul_add"]
    node = helper.make_node("Relu", ["x"], ["y"])
    wrong_shape = build(
        [node], [("x", TensorProto.FLOAT, [16, 8])], [("y", TensorProto.FLOAT, None)]
    )
    report = check_equivalence(reference, wrong_shape)
    assert not report.equivalent and "input" in report.reason and "16x8" in report.reason
    renamed = build([node], [("x", TensorProto.FLOAT, [16, 16])], [("y", TensorProto.FLOAT, None)])
    renamed.graph.output[0].name = "z"
    renamed.graph.node[0].output[0] = "z"
    report = check_equivalence(reference, renamed)
    assert not report.equivalent and "'z'" in report.reason
    extra_input = build(
        [helper.make_node("Add", ["x", "x2"], ["y"])],
        [("x", TensorProto.FLOAT, [16, 16]), ("x2", TensorProto.FLOAT, [16, 16])],
        [("y", TensorProto.FLOAT, [16, 16])],
    )
    report = check_equivalence(reference, extra_input)
    assert not report.equivalent and "extra input" in report.reason


def test_candidate_that_fails_in_onnxruntime_is_rejected(build, linear_models):
    broken = build(
        [helper.make_node("MatMul", ["x", "w"], ["y"])],  # w is missing
        [("x", TensorProto.FLOAT, [16, 16])],
        [("y", TensorProto.FLOAT, [16, 16])],
    )
    report = check_equivalence(linear_models["matmul_add"], broken)
    assert not report.equivalent and "onnxruntime" in report.reason


def test_broken_reference_raises(build, linear_models):
    broken = build(
        [helper.make_node("MatMul", ["x", "w"], ["y"])],
        [("x", TensorProto.FLOAT, [16, 16])],
        [("y", TensorProto.FLOAT, [16, 16])],
    )
    with pytest.raises(RlflowError, match="reference"):
        check_equivalence(broken, linear_models["matmul_add"])


def test_integer_inputs_in_range_and_integer_outputs_exact(build):
    """Token ids must stay below the vocabulary (else Gather fails); ArgMax vs ArgMin differ."""
    embedding = np.random.default_rng(0).standard_normal((100, 8)).astype(np.float32)

    def model(reduce_op: str):
        nodes = [
            helper.make_node("Gather", ["emb", "ids"], ["e"]),
            helper.make_node(reduce_op, ["e"], ["y"], axis=-1, keepdims=0),
        ]
        return build(
            nodes,
            [("ids", TensorProto.INT64, [4, 16])],
            [("y", TensorProto.INT64, [4, 16])],
            {"emb": embedding},
            {"rlflow.int_range.ids": "0,100"},
        )

    assert check_equivalence(model("ArgMax"), model("ArgMax")).equivalent
    report = check_equivalence(model("ArgMax"), model("ArgMin"))
    assert not report.equivalent and "exact match" in report.reason


def _doubling(build, extra: list | None = None, consts: dict | None = None):
    """y = 2x, or 2x followed by `extra` nodes reading t and writing y."""
    nodes = [helper.make_node("Mul", ["x", "two"], ["t" if extra else "y"]), *(extra or [])]
    io = [("x", TensorProto.FLOAT, [8, 8])], [("y", TensorProto.FLOAT, [8, 8])]
    return build(nodes, *io, {"two": np.full(1, 2.0, np.float32), **(consts or {})})


def test_small_magnitudes_catch_an_absolute_offset(build):
    """An offset of 1e-5 hides in the slack of unit-scale outputs; at inputs of 1e-3 the
    tolerance follows the outputs' scale down, and it shows."""
    reference = _doubling(build)
    offset = _doubling(
        build, [helper.make_node("Add", ["t", "eps"], ["y"])], {"eps": np.full(1, 1e-5, np.float32)}
    )
    assert check_equivalence(reference, offset).equivalent
    report = check_equivalence(reference, offset, scales=MAGNITUDES)
    assert not report.equivalent and "inputs x 0.001" in report.reason


def test_large_magnitudes_catch_a_clamp(build):
    reference = _doubling(build)
    clamped = _doubling(
        build,
        [helper.make_node("Clip", ["t", "low", "high"], ["y"])],
        {"low": np.array(-100, np.float32), "high": np.array(100, np.float32)},
    )
    assert check_equivalence(reference, clamped).equivalent
    report = check_equivalence(reference, clamped, scales=MAGNITUDES)
    assert not report.equivalent and "inputs x 1000" in report.reason


def test_rounding_passes_at_every_magnitude_and_errors_are_the_unit_sets(build):
    """A relative error of 1e-6 (rounding) stays within tolerance at every scale; the reported
    errors are those at unit scale, comparable with any other report."""
    reference = _doubling(build)
    rounded = _doubling(
        build,
        [helper.make_node("Mul", ["t", "nudge"], ["y"])],
        {"nudge": np.full(1, 1 + 2**-20, np.float32)},
    )
    report = check_equivalence(reference, rounded, seeds=(0, 1), scales=MAGNITUDES)
    assert report.equivalent, report.reason
    assert "6 input sets" in report.reason and "1000, 0.001" in report.reason
    unit = check_equivalence(reference, rounded, seeds=(0, 1))
    assert report.max_abs_err == unit.max_abs_err < 1e-5
    assert report.inputs == {"x": {"dtype": "float", "normal_scales": [1.0, 1e3, 1e-3]}}

"""Fuzz: `rlflow optimize` on random graphs keeps the original's interface and outputs.

Each case (tests/fuzz/cases.py: the zoo's operators, weights listed as inputs, dynamic dims,
token ids, scalar inputs) is optimised in process, and the written model is checked here with
plain onnx, onnxruntime and numpy, not with rlflow.cost.equivalence:

- it passes onnx's full checker;
- its inputs and outputs have the original's names, order and element types, and its dims the
  original's: static ones equal, each symbolic one either the same symbol or, where the JSON
  says the model is specialised to it, the size it was given;
- weights listed among the inputs stay inputs with the same defaults (unless folded on request);
- its outputs equal the original's at the given shapes on inputs of scale 1 and 1e3 (run under
  its declared `ort_config`, the original under onnxruntime's defaults), with overridden
  weights too where both models take them, and at two other sizes of every dim it keeps
  symbolic (sizes other than those rlflow checks).
"""

from __future__ import annotations

import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from rlflow.cli import main
from tests.fuzz.cases import Case, embedding, flatten_by_shape, mlp, random_case, scalars

QUICK = ("--budget", "6", "--min-time", "0.05", "--no-peer", "--json")
LEVELS = {
    0: ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
    1: ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
    2: ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
    99: ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
}
NAMED = {
    "ir3-weights-as-inputs": lambda: Case("ir3", mlp(listed=("w", "b"), ir_version=3, opset=9)),
    "dynamic-batch": lambda: Case("dynamic", mlp(["N", 8], ["N", 4]), {"N": 3}),
    "shape-folded": lambda: Case("flatten", flatten_by_shape(), {"N": 3}),
    "token-ids": lambda: Case("embedding", embedding(), int_ranges={"ids": (0, 1000)}),
    "scalars": lambda: Case("scalars", scalars(), int_ranges={"k": (-3, 4)}),
}


@pytest.fixture(autouse=True)
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("RLFLOW_CACHE_DIR", str(tmp_path / "cache"))


def optimize(case: Case, tmp_path, capsys, *flags: str) -> tuple[onnx.ModelProto, dict]:
    """Run `rlflow optimize` on the case; (the written model, the JSON summary)."""
    source, out = tmp_path / "model.onnx", tmp_path / "out.onnx"
    onnx.save(case.model, source)
    code = main(["optimize", str(source), "-o", str(out), *case.shape_flags(), *QUICK, *flags])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    return onnx.load(out), json.loads(captured.out.strip().splitlines()[-1])


def check_case(case: Case, tmp_path, capsys, fold: bool = False) -> None:
    flags = ["--fold-initializer-inputs"] if fold else []
    written, summary = optimize(case, tmp_path, capsys, *flags)
    onnx.checker.check_model(written, full_check=True)
    specialised = summary["interface"]["specialised"]
    assert_interface(case, written, specialised, fold)
    for seed, scale in ((0, 1.0), (1, 1e3)):
        assert_same_outputs(case, written, case.sizes, seed, scale)
    for symbol, given in case.sizes.items():
        if symbol not in specialised:
            for size in (given + 2, 5 * given + 1):
                assert_same_outputs(case, written, {**case.sizes, symbol: size}, 2, 1.0)


def assert_interface(case: Case, written: onnx.ModelProto, specialised: dict, fold: bool) -> None:
    original = case.model.graph
    weights = {t.name: t for t in original.initializer}
    listed = [info.name for info in original.input if info.name in weights]
    expected = [info for info in original.input if not (fold and info.name in weights)]
    assert [info.name for info in written.graph.input] == [info.name for info in expected]
    assert [info.name for info in written.graph.output] == [o.name for o in original.output]
    pairs = [*zip(expected, written.graph.input), *zip(original.output, written.graph.output)]
    for want, got in pairs:
        assert got.type.tensor_type.elem_type == want.type.tensor_type.elem_type, want.name
        want_dims, got_dims = want.type.tensor_type.shape.dim, got.type.tensor_type.shape.dim
        assert len(got_dims) == len(want_dims), want.name
        for want_dim, got_dim in zip(want_dims, got_dims):
            if want_dim.HasField("dim_value"):
                assert got_dim.dim_value == want_dim.dim_value, want.name
            elif want_dim.dim_param in specialised:
                assert got_dim.dim_value == case.sizes[want_dim.dim_param], want.name
            else:
                assert got_dim.dim_param == want_dim.dim_param, want.name
    kept = {t.name: t for t in written.graph.initializer}
    for name in listed if not fold else []:
        assert name in kept, f"weight input {name} lost its default"
        default = onnx.numpy_helper.to_array(weights[name])
        assert np.array_equal(onnx.numpy_helper.to_array(kept[name]), default)


def assert_same_outputs(
    case: Case, written: onnx.ModelProto, sizes: dict[str, int], seed: int, scale: float
) -> None:
    rng = np.random.default_rng(seed)
    feeds = {}
    for name, shape in case.input_shapes(sizes).items():
        info = next(i for i in case.model.graph.input if i.name == name)
        dtype = onnx.helper.tensor_dtype_to_np_dtype(info.type.tensor_type.elem_type)
        if np.issubdtype(dtype, np.floating):
            feeds[name] = np.asarray(rng.standard_normal(shape) * scale).astype(dtype)
        elif dtype == np.bool_:
            feeds[name] = np.asarray(rng.random(shape) < 0.5)
        else:
            low, high = case.int_ranges.get(name, (0, 3))
            feeds[name] = np.asarray(rng.integers(low, high, size=shape)).astype(dtype)
    original_session = session(case.model)
    written_session = session(written)
    overridable = {i.name for i in original_session.get_overridable_initializers()}
    overridable &= {i.name for i in written_session.get_overridable_initializers()}
    for tensor in case.model.graph.initializer:
        if tensor.name in overridable and seed > 0:
            default = onnx.numpy_helper.to_array(tensor)
            feeds[tensor.name] = (default * rng.uniform(0.5, 1.5, default.shape)).astype(np.float32)
    want = original_session.run(None, feeds)
    got = written_session.run(None, feeds)
    for name, w, g in zip((o.name for o in case.model.graph.output), want, got):
        assert g.shape == w.shape, name
        bound = 1e-3 * max(float(np.abs(w).max()), 1e-30) + 1e-3 * np.abs(w)
        assert np.all(np.abs(g - w) <= bound), f"{name} differs at {sizes}, scale {scale}"


def session(model: onnx.ModelProto) -> ort.InferenceSession:
    """onnxruntime under the settings the model declares in ort_config (its defaults if none)."""
    options = ort.SessionOptions()
    options.log_severity_level = 3
    options.intra_op_num_threads = 1
    config = {p.key: p.value for p in model.metadata_props}.get("ort_config")
    if config is not None:
        level = json.loads(config)["session_options"]["graph_optimization_level"]
        options.graph_optimization_level = LEVELS[level]
    return ort.InferenceSession(
        model.SerializeToString(), options, providers=["CPUExecutionProvider"]
    )


@pytest.mark.parametrize("seed", range(20))
def test_random_graphs_keep_interface_and_outputs(seed, tmp_path, capsys):
    case = random_case(seed)
    check_case(case, tmp_path, capsys, fold=seed % 3 == 0)


@pytest.mark.parametrize("name", sorted(NAMED))
def test_named_cases_keep_interface_and_outputs(name, tmp_path, capsys):
    check_case(NAMED[name](), tmp_path, capsys)


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(20, 120))
def test_more_random_graphs_keep_interface_and_outputs(seed, tmp_path, capsys):
    case = random_case(seed)
    check_case(case, tmp_path, capsys, fold=seed % 3 == 0)

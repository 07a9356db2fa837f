"""Shared fixtures: tiny ONNX models built by hand, and a runner for the CLI.

The analytic model's machine peaks are pinned for the whole session (`RLFLOW_PEAKS`, inherited
by the CLI subprocesses too): its costs then agree on every machine, so the seeded learners of
the tests learn the same thing in CI as here. The test of the measured peaks lifts the pin.

The session's caches (`RLFLOW_CACHE_DIR`, inherited the same way) live in a directory of its
own, removed at the end: operators timed while the suite loads both cores must not become the
per-op prices of the user's next training run, and a test must not read (or lose, when a user
clears it) what a user's run cached. Only the zoo's exports, which are the same wherever they
are made and slow to make, are shared with the user's cache.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

# This machine's measured values (2 AMD EPYC cores, onnxruntime 1.32), rounded.
os.environ.setdefault(
    "RLFLOW_PEAKS",
    json.dumps({"gflops": 250.0, "gbps": 40.0, "cache_gbps": 90.0, "cache_bytes": 32 << 20}),
)


SESSION_CACHE = pytest.StashKey[tuple[Path, str | None]]()  # (the directory, the variable before)


def pytest_configure(config):
    """The session's own cache directory (a hook, not module code: test modules import this
    file a second time as `tests.conftest`, and that import must not make another)."""
    before = os.environ.get("RLFLOW_CACHE_DIR")
    user = Path(before) if before else Path.home() / ".cache" / "rlflow"
    session = Path(tempfile.mkdtemp(prefix="rlflow-test-cache-"))
    (user / "zoo").mkdir(parents=True, exist_ok=True)
    (session / "zoo").symlink_to(user / "zoo", target_is_directory=True)
    os.environ["RLFLOW_CACHE_DIR"] = str(session)
    config.stash[SESSION_CACHE] = (session, before)


def pytest_unconfigure(config):
    session, before = config.stash[SESSION_CACHE]
    shutil.rmtree(session, ignore_errors=True)  # the link to the zoo, not the zoo
    if before is None:
        os.environ.pop("RLFLOW_CACHE_DIR", None)
    else:
        os.environ["RLFLOW_CACHE_DIR"] = before


def make_model(nodes, inputs, outputs, initializers=(), opset=17) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes,
        "test",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in outputs],
        initializer=[numpy_helper.from_array(a, n) for n, a in initializers],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return model


def run_onnx(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.log_severity_level = 3
    session = ort.InferenceSession(
        model.SerializeToString(), options, providers=["CPUExecutionProvider"]
    )
    return session.run(None, feeds)


def random_feeds(model: onnx.ModelProto, seed: int = 0) -> dict[str, np.ndarray]:
    """Random inputs for a model's inputs; int inputs within its rlflow.int_range metadata."""
    rng = np.random.default_rng(seed)
    ranges = {
        p.key.removeprefix("rlflow.int_range."): tuple(int(x) for x in p.value.split(","))
        for p in model.metadata_props
        if p.key.startswith("rlflow.int_range.")
    }
    initializers = {t.name for t in model.graph.initializer}
    feeds = {}
    for vi in model.graph.input:
        if vi.name in initializers:
            continue
        shape = [d.dim_value for d in vi.type.tensor_type.shape.dim]
        dtype = helper.tensor_dtype_to_np_dtype(vi.type.tensor_type.elem_type)
        if np.issubdtype(dtype, np.integer):
            low, high = ranges.get(vi.name, (0, 2))
            feeds[vi.name] = rng.integers(low, high, size=shape).astype(dtype)
        elif dtype == np.bool_:
            feeds[vi.name] = rng.random(shape) < 0.5
        else:
            feeds[vi.name] = rng.standard_normal(shape).astype(dtype)
    return feeds


def assert_peer_confirmed(knob, speedup, speedups, selected):
    """A tuning peer (`rlflow.cost.ort_optimizer.Peer`, or a summary's peer_* fields): the best
    knob of the selection run, its speedup from the confirmation run, or the default itself at
    1.0 where the default was best or the confirmation found the knob no faster."""
    best = max(speedups, key=speedups.__getitem__)
    if selected is None:  # the default itself was best: nothing to confirm
        assert best == knob == "all" and speedup == 1.0
    else:
        assert selected == speedups[best] > 1.0
        assert (knob, speedup) == ("all", 1.0) or (knob == best and speedup > 1.0)


@pytest.fixture
def mlp_model() -> onnx.ModelProto:
    """x[2,8] -> MatMul W1 -> Add b1 -> Relu -> MatMul W2 -> y[2,4]."""
    rng = np.random.default_rng(0)
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h0"]),
        helper.make_node("Add", ["h0", "b1"], ["h1"]),
        helper.make_node("Relu", ["h1"], ["h2"]),
        helper.make_node("MatMul", ["h2", "w2"], ["y"]),
    ]
    inits = [
        ("w1", rng.standard_normal((8, 16)).astype(np.float32)),
        ("b1", rng.standard_normal(16).astype(np.float32)),
        ("w2", rng.standard_normal((16, 4)).astype(np.float32)),
    ]
    return make_model(nodes, [("x", [2, 8])], ["y"], inits)

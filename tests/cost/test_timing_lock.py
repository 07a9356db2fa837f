"""The machine's timing lock (`$RLFLOW_TIMING_LOCK`): held by every timing, so that processes
rewriting in parallel time one at a time (`rlflow costs collect --jobs`, several benches)."""

from __future__ import annotations

import fcntl

import pytest
from onnx import TensorProto, helper

from rlflow.cost import PerOpCostModel, Runner, check_equivalence
from rlflow.cost import perop as perop_module
from rlflow.cost import runner as runner_module
from rlflow.cost.timing_lock import ENV_VAR, exclusive_timing


def held_elsewhere(path) -> bool:
    """Whether another open file description holds `path`'s flock (as another process would
    see it: flock locks belong to open file descriptions, not to processes)."""
    with open(path, "a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(handle, fcntl.LOCK_UN)
        return False


@pytest.fixture
def lock_path(tmp_path, monkeypatch):
    path = tmp_path / "timing.lock"
    monkeypatch.setenv(ENV_VAR, str(path))
    return path


def test_the_lock_is_held_inside_and_free_outside(lock_path):
    with exclusive_timing():
        assert held_elsewhere(lock_path)
        with exclusive_timing():  # re-entrant: a nested timing does not wait for itself
            assert held_elsewhere(lock_path)
        assert held_elsewhere(lock_path)
    assert not held_elsewhere(lock_path)


def test_without_the_variable_nothing_is_locked(tmp_path, monkeypatch):
    monkeypatch.delenv(ENV_VAR, raising=False)
    with exclusive_timing():
        assert not list(tmp_path.iterdir())


def spy_on_sessions(monkeypatch, module, lock_path) -> list[bool]:
    """Record, for every session `module` builds, whether the lock was held at that moment."""
    seen: list[bool] = []
    real = module.make_session

    def make_session(*args, **kwargs):
        seen.append(held_elsewhere(lock_path))
        return real(*args, **kwargs)

    monkeypatch.setattr(module, "make_session", make_session)
    return seen


def test_runner_and_perop_time_holding_the_lock(lock_path, monkeypatch, mlp_model):
    by_runner = spy_on_sessions(monkeypatch, runner_module, lock_path)
    Runner(runs=5, min_time_s=0).measure(mlp_model, use_cache=False)
    by_perop = spy_on_sessions(monkeypatch, perop_module, lock_path)
    PerOpCostModel(runs=2).cost_ms(mlp_model)
    assert by_runner == [True]
    assert len(by_perop) > 1 and all(by_perop)  # the overhead's model and each operator
    assert not held_elsewhere(lock_path)


def test_equivalence_checks_run_holding_the_lock(lock_path, monkeypatch, build):
    from rlflow.cost import equivalence

    seen = spy_on_sessions(monkeypatch, equivalence, lock_path)
    node = helper.make_node("Relu", ["x"], ["y"])
    model = build([node], [("x", TensorProto.FLOAT, [4])], [("y", TensorProto.FLOAT, [4])])
    assert check_equivalence(model, model).equivalent
    assert seen == [True, True] and not held_elsewhere(lock_path)

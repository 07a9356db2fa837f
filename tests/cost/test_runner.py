"""The Runner ranks graphs within one interleaved run and caches by graph hash and settings;
its statistics (the median of per-pair ratios compared, each graph's 3rd-smallest run) and
stopping rule are tested on synthetic times."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper

from rlflow.cost import Measurement, OrtSettings, Runner
from rlflow.cost.runner import (
    CACHE_VERSION,
    LOW_RANK,
    AdaptiveStop,
    compare_times,
    kth_smallest,
    measurement_of,
    median_interval,
)
from rlflow.cost.source import ModelSource
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
    assert comparison.ratios[1] > 1.0  # median of heavy run / plain run: a ranking only
    assert comparison.low_ratios[1] > 1.0
    assert comparison.fastest() == 0
    assert comparison.speedups[1] < 1.0
    original_ms, heavy_ms = comparison.scaled_ms
    assert original_ms == comparison.measurements[0].median_ms
    assert original_ms / heavy_ms == pytest.approx(comparison.speedups[1])


def test_interleaved_runs_and_named_settings(plain_and_heavy):
    plain, _ = plain_and_heavy
    runner = Runner(OrtSettings(ort_level="disable"), runs=7, min_time_s=0, block=3)
    comparison = runner.compare([plain, load_model(plain)])
    for measurement in comparison.measurements:
        assert measurement.runs == 9  # rounded up to whole blocks
        assert 0 < measurement.min_ms <= measurement.low_ms <= measurement.median_ms
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
    entries = json.loads(cache_path.read_text())
    assert len(entries) == 2
    assert all(key.startswith(f"{CACHE_VERSION}|") for key in entries)

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


# ---- the adaptive stopping rule, on synthetic times (no timing involved) ----------------------


def feed(stop: AdaptiveStop, rounds) -> int:
    """Feed rounds (per graph, a block of times in ms) until the rule says stop; the round."""
    stop.reset(0)
    for number, round_times in enumerate(rounds, start=1):
        if stop.observe(round_times):
            return number
    raise AssertionError("the rule never stopped")


def rule(**overrides) -> AdaptiveStop:
    """A small rule: 0.1-1 s, 0.5% tolerance, a fixed window of 4 rounds, at least 10 runs."""
    fields = dict(min_time_s=0.1, max_time_s=1.0, tolerance=0.005, patience=4, min_runs=10)
    return AdaptiveStop(**{**fields, "patience_fraction": 0.0, **overrides})


def flat_then(level_ms: float, drop_at: int, dropped_ms: float, block: int = 5):
    """One graph at level_ms per run, from round `drop_at` on at dropped_ms."""
    for number in itertools.count(1):
        yield [[level_ms if number < drop_at else dropped_ms] * block]


def test_adaptive_stop_settles_after_min_time_and_patience():
    stop = rule()
    # 5 ms per graph and round: 0.1 s of timed runs after 20 rounds; settled long before.
    assert feed(stop, flat_then(1.0, 10**9, 1.0)) == 20
    assert stop.reason == "settled"
    assert stop.runs == [100]


def test_adaptive_stop_a_late_drop_restarts_the_patience():
    stop = rule(min_time_s=0.048)
    assert feed(stop, flat_then(1.0, 10**9, 1.0)) == 10  # 48 ms of runs after 10 rounds
    # The minimum falls 2% at round 8: unsettled until round 8 is `patience` rounds back.
    assert feed(stop, flat_then(1.0, 8, 0.98)) == 12
    assert stop.reason == "settled"
    # A drop within the tolerance (0.3%) does not count as an improvement.
    assert feed(stop, flat_then(1.0, 8, 0.997)) == 10
    # With a window of half the rounds so far, round 8 must lie in the first half: round 16.
    stop = rule(min_time_s=0.048, patience_fraction=0.5)
    assert feed(stop, flat_then(1.0, 8, 0.98)) == 16


def test_adaptive_stop_waits_for_every_graph():
    stop = rule()
    # Graph 1 improves 0.3% a round: 1.2% over the patience window, never settled.
    drifting = ([[1.0] * 5, [2.0 * 0.997**number] * 5] for number in itertools.count(1))
    stopped_at = feed(stop, drifting)
    assert stop.reason == "max_time"
    assert max(stop.timed_ms) >= 1000.0
    assert max(stop.timed_ms) - 5 * 2.0 * 0.997**stopped_at < 1000.0  # the first round over
    # Improving 0.1% a round (0.4% per window) is within the tolerance: settled at 0.1 s.
    slow = ([[1.0] * 5, [2.0 * 0.999**number] * 5] for number in itertools.count(1))
    assert feed(stop, slow) == 20 and stop.reason == "settled"


def test_adaptive_stop_caps_runs():
    stop = rule(min_time_s=5.0, max_time_s=10.0, max_runs=50)
    assert feed(stop, flat_then(1.0, 10**9, 1.0)) == 10
    assert stop.reason == "max_runs"


def test_default_runner_is_adaptive_and_fixed_time_still_works(plain_and_heavy):
    plain, _ = plain_and_heavy
    assert Runner().min_time_s is None
    quick = AdaptiveStop(min_time_s=0.02, max_time_s=0.5, patience=3)
    adaptive = Runner(runs=12, block=4, stop=quick).measure(plain)
    assert adaptive.runs >= 12 and adaptive.runs % 4 == 0
    fixed = Runner(runs=12, block=4, min_time_s=0).measure(plain)
    assert fixed.runs == 12
    assert Runner(stop=quick)._key("m", ["h"]) != Runner(min_time_s=0.02)._key("m", ["h"])
    with pytest.raises(RlflowError, match="min_time_s"):
        Runner(min_time_s=-1.0)
    with pytest.raises(RlflowError, match="adaptive"):
        Runner(stop=AdaptiveStop(min_time_s=2.0, max_time_s=1.0))


def test_old_cache_entries_without_low_ms_are_timed_again(plain_and_heavy, tmp_path):
    """An entry written before `low_ms` existed (here planted under the current key) is not
    read as if its minimum were the low statistic: the graph is timed again."""
    plain, _ = plain_and_heavy
    cache_path = tmp_path / "runner.json"
    runner = Runner(runs=5, min_time_s=0, cache_path=cache_path)
    key = runner._key("measure", [ModelSource(plain).graph_hash])
    old = dict(graph_hash="h", min_ms=1.0, median_ms=2.0, runs=5, threads=1)
    cache_path.write_text(json.dumps({key: {**old, "ort_level": "all", "provider": "cpu"}}))
    reloaded = Runner(runs=5, min_time_s=0, cache_path=cache_path)
    measurement = reloaded.measure(plain)
    assert reloaded.sessions_built == 1
    assert measurement.graph_hash != "h" and measurement.low_ms is not None
    assert json.loads(cache_path.read_text())[key]["low_ms"] == measurement.low_ms
    # The statistic is part of the key, and the adaptive rule follows the Runner's rank.
    assert Runner(low_rank=1)._key("m", ["h"]) != Runner()._key("m", ["h"])
    assert Runner(low_rank=5).stop.rank == 5 and Runner().stop.rank == LOW_RANK
    with pytest.raises(RlflowError, match="low_rank"):
        Runner(low_rank=0)


# ---- the compared statistic, on synthetic times (no timing involved) -------------------------


SETTINGS = OrtSettings().resolved()


def compare(*times, rank=LOW_RANK):
    """A Comparison of graphs with these synthetic times (ms)."""
    measurements = [measurement_of(f"g{i}", t, SETTINGS, rank) for i, t in enumerate(times)]
    return compare_times(times, measurements)


def test_kth_smallest():
    assert kth_smallest([5.0, 1.0, 4.0, 2.0, 3.0]) == 3.0  # the 3rd smallest by default
    assert kth_smallest([5.0, 1.0, 4.0, 2.0, 3.0], 1) == 1.0
    assert kth_smallest([2.0, 1.0, 1.0, 7.0], 3) == 2.0  # ties count as runs
    assert kth_smallest([2.0, 1.0], 3) == 2.0  # fewer runs than the rank: the largest
    with pytest.raises(ValueError):
        kth_smallest([])
    with pytest.raises(ValueError):
        kth_smallest([1.0], 0)


def test_measurement_reports_min_low_and_median():
    measurement = measurement_of("g", [9.0, 12.0, 10.0, 30.0, 11.0], SETTINGS)
    assert (measurement.min_ms, measurement.low_ms, measurement.median_ms) == (9.0, 11.0, 11.0)
    assert measurement.runs == 5 and measurement.threads == SETTINGS.threads
    # Built by hand without the low statistic (e.g. from a single time), low is the minimum.
    assert Measurement("g", 4.0, 5.0, 1, 1, "all", "cpu").low_ms == 4.0


def busy(n=40, base=10.0):
    """Runs of a loaded machine: the quiet level `base`, mostly slowed 1.5-2.4 times."""
    return [base * (1.0 + 0.1 * ((7 * k) % 15)) if k % 4 else base for k in range(n)]


def test_a_single_lucky_run_does_not_flip_the_ratio():
    a = busy()
    b = list(a)
    b[17] = 5.0  # one run of b found the core free for once: half the quiet level
    comparison = compare(a, b)
    assert comparison.ratios == (1.0, 1.0) and comparison.speedups == (1.0, 1.0)
    assert comparison.fastest() == 0  # a tie keeps the reference
    assert comparison.measurements[1].min_ms == 5.0  # the minimum is still reported
    assert comparison.low_ratios[1] == 1.0  # the 3rd smallest ignores one lucky run too
    assert compare(a, b, rank=1).low_ratios[1] == 0.5  # what comparing minima made of it


def test_a_really_faster_graph_still_wins_despite_a_lucky_run_of_the_other():
    a = busy()
    a[3] = 5.0  # a's lucky run
    b = [0.95 * t for t in busy()]  # b is 5% faster in every run
    comparison = compare(a, b)
    assert comparison.ratios[1] == pytest.approx(0.95)
    assert comparison.speedups[1] == pytest.approx(1 / 0.95)
    assert comparison.fastest() == 1
    assert compare(a, b, rank=1).low_ratios[1] > 1.0  # by the minimum, the wrong one


def test_lucky_runs_on_one_side_move_the_low_statistic_not_the_pair_median():
    """Three runs of c found the core free: its 3rd smallest halves, its pairs do not care."""
    c = list(busy())
    c[5] = c[9] = 5.0
    assert compare(busy(), c).low_ratios[1] == 1.0  # two lucky runs: not enough for rank 3
    c[13] = 5.0
    assert compare(busy(), c).low_ratios[1] == 0.5  # three: the 3rd smallest is decided by luck
    assert compare(busy(), c).ratios[1] == 1.0 and compare(busy(), c).fastest() == 0


def test_scaled_ms_share_the_original_footing():
    a, b = busy(), [0.8 * t for t in busy()]
    comparison = compare(a, b)
    assert comparison.scaled_ms[0] == comparison.measurements[0].median_ms
    assert comparison.scaled_ms[0] / comparison.scaled_ms[1] == pytest.approx(1 / 0.8)
    assert comparison.scaled_ms[0] / comparison.scaled_ms[1] == pytest.approx(
        comparison.speedups[1]
    )


def one_lucky_run(at_round: int, block: int = 5):
    """One graph at 1 ms per run, but for one run at 0.5 ms in round `at_round`."""
    for number in itertools.count(1):
        yield [[0.5 if number == at_round and run == block // 2 else 1.0 for run in range(block)]]


def test_adaptive_stop_a_single_lucky_run_does_not_restart_the_patience():
    stop = rule(min_time_s=0.048)
    assert feed(stop, one_lucky_run(8)) == 10  # the 3rd smallest never moved
    assert stop.lows[0][-1] == 1.0
    assert feed(rule(min_time_s=0.048, rank=1), one_lucky_run(8)) == 12  # the minimum did
    # Three fast runs in round 8 move the 3rd smallest: unsettled until round 12, as a drop.
    assert feed(rule(min_time_s=0.048), flat_then(1.0, 8, 0.98)) == 12


def test_adaptive_stop_is_never_settled_before_rank_runs():
    quick = dict(min_time_s=0.0, min_runs=1, patience=1)
    ones = ([[1.0]] for _ in itertools.count())
    assert feed(rule(**quick, rank=1), ones) == 2  # one round of history, then settled
    stop = rule(**quick)
    assert feed(stop, ([[1.0]] for _ in itertools.count())) == 4  # rank 3: defined at round 3
    assert stop.lows[0][:2] == [float("inf")] * 2 and stop.lows[0][2:] == [1.0, 1.0]
    assert "rank=3" in stop.key()


def test_median_interval_covers_the_median_about_95_percent_of_the_time():
    assert median_interval(list(range(1, 101))) == (40, 61)
    assert median_interval([3.0]) == (3.0, 3.0)
    rng = np.random.default_rng(0)
    covered = sum(
        low <= 0.0 <= high
        for low, high in (median_interval(rng.standard_normal(60).tolist()) for _ in range(500))
    )
    assert 0.93 <= covered / 500 <= 0.99  # distribution-free: conservative, never far below


def noisy_pairs(spread: float, seed: int = 0, block: int = 5):
    """Two graphs of equal speed whose runs scatter by +- `spread` (relative), independently."""
    rng = np.random.default_rng(seed)
    while True:
        yield [list(1.0 + spread * rng.uniform(-1, 1, block)) for _ in range(2)]


def test_adaptive_stop_waits_until_the_ratio_is_known_closely_enough():
    quiet = feed(rule(max_time_s=100.0), noisy_pairs(0.01))
    stop = rule(max_time_s=100.0)
    noisy = feed(stop, noisy_pairs(0.2))
    assert stop.reason == "settled" and stop.ratio_width(1) <= stop.ratio_tolerance
    assert noisy > 2 * quiet  # noisier pairs need more of them; the low statistic alone
    assert feed(rule(max_time_s=100.0, ratio_tolerance=1.0), noisy_pairs(0.2)) < noisy
    capped = rule(max_time_s=0.3)  # and the time bound still holds
    feed(capped, noisy_pairs(0.2))
    assert capped.reason == "max_time" and capped.ratio_width(1) > capped.ratio_tolerance
    assert "ratio_tol=0.02" in AdaptiveStop().key()


def test_a_profiled_session_records_every_node_of_its_runs(mlp_model, tmp_path):
    from rlflow.cost.session import make_session, timed_run

    source = ModelSource(mlp_model)
    feeds = {"x": np.ones((2, 8), dtype=np.float32)}
    prefix = str(tmp_path / "profile")
    as_written = OrtSettings(threads=1, ort_level="disable")  # no fusion: four kernels a run
    session = make_session(source.model_bytes(), as_written, profile_prefix=prefix)
    run = timed_run(session, feeds)
    for _ in range(3):
        run()
    path = session.end_profiling()
    assert path.startswith(prefix)
    events = json.loads(Path(path).read_text())
    kernels = [e["name"] for e in events if e.get("cat") == "Node" and "_kernel_time" in e["name"]]
    # Four nodes, three runs: every node's kernel appears once per run.
    assert len(kernels) == 3 * len(mlp_model.graph.node)
    assert not make_session(source.model_bytes(), as_written).end_profiling()  # off by default

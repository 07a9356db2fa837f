"""scripts/bench_search_curves.py: its curve arithmetic, and one small run of two methods on a
small model (analytic cost: the search is cut by its cost, so nothing is ever timed)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "bench_search_curves.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_search_curves", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    yield module
    del sys.modules[spec.name]


def test_evaluations_to_reach_counts_from_one_and_says_never(bench):
    curve = [1.0, 1.02, 1.02, 1.10, 1.25]
    assert bench.evaluations_to_reach(curve, 1.10) == 4
    assert bench.evaluations_to_reach(curve, 1.25) == 5
    assert bench.evaluations_to_reach(curve, 1.26) is None
    assert bench.evaluations_to_reach(curve, 1.0) == 0  # no gain to reach
    assert bench.evaluations_to_reach([1.1 * (1 - 1e-12)], 1.1) == 1  # equal graphs, float noise


def test_speedups_carry_the_last_best_to_the_budget(bench):
    assert bench.speedups(2.0, [2.0, 1.6, 1.0], 5) == [1.0, 1.25, 2.0, 2.0, 2.0]
    assert bench.speedups(2.0, [], 2) == [1.0, 1.0]  # nothing costed beyond the start


def test_a_small_run_records_equal_budgets_and_never_times(bench, tmp_path, monkeypatch):
    from rlflow.search import random_walk, taso

    def no_timing(*args, **kwargs):
        raise AssertionError("the final end-to-end timing ran")

    monkeypatch.setattr(taso, "finish", no_timing)
    monkeypatch.setattr(random_walk, "finish", no_timing)
    out = tmp_path / "curves"
    argv = ["--models", "squeezenet-1.1", "--methods", "random", "taso", "--seeds", "0", "1"]
    assert bench.main([*argv, "--evaluations", "12", "--out", str(out)]) == 0

    data = json.loads(out.with_name("curves.json").read_text())
    runs = data["runs"]
    assert sorted((run["method"], run["seed"]) for run in runs) == [
        ("random", 0),
        ("random", 1),
        ("taso", 0),
        ("taso", 1),
    ]
    for run in runs:
        assert run["evaluations"] == 12 and run["stopped"] == "budget"
        curve = run["speedup"]
        assert len(curve) == 12 and curve == sorted(curve) and curve[0] >= 1.0
    taso_final = max(run["speedup"][-1] for run in runs if run["method"] == "taso")
    rows = {row["method"]: row for row in data["summary"]}
    assert rows["taso"]["taso_final"] == taso_final
    assert all(reach is not None and reach <= 12 for reach in rows["taso"]["to_reach_taso"])
    table = out.with_name("curves.md").read_text()
    assert "| squeezenet-1.1 | taso |" in table and "analytic cost, nothing timed" in table
    assert out.with_name("curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_learned_method_without_its_run_is_a_one_line_error(bench, tmp_path, capsys):
    assert bench.main(["--models", "squeezenet-1.1", "--methods", "guided"]) == 2
    assert "guided:RUN_DIR" in capsys.readouterr().err


def test_from_onnxruntime_graph_with_the_perop_cost(bench, tmp_path):
    """`--start ort:all --cost perop`: the curve starts from onnxruntime's graph (its per-op
    cost, NCHWc operators and all, is the start cost) and the budget still cuts the search."""
    out = tmp_path / "curves"
    argv = ["--models", "squeezenet-1.1", "--methods", "random", "--seeds", "0"]
    argv += ["--start", "ort:all", "--cost", "perop", "--evaluations", "4", "--out", str(out)]
    assert bench.main(argv) == 0
    data = json.loads(out.with_name("curves.json").read_text())
    (run,) = data["runs"]
    assert run["evaluations"] == 4 and len(run["speedup"]) == 4 and run["start_cost_ms"] > 0
    assert data["meta"]["start"] == "ort:all" and data["meta"]["cost"] == "per-op measured cost"
    assert "start ort:all" in out.with_name("curves.md").read_text()


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--cost", "perop", "--jobs", "2"], "--jobs 1"),
        (["--start", "ort:fast"], "unknown start state 'ort:fast'"),
    ],
)
def test_bad_cost_or_start_is_a_one_line_error(bench, capsys, extra, message):
    assert bench.main(["--models", "squeezenet-1.1", "--methods", "random", *extra]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1


def test_kept_graphs_are_timed_end_to_end_once_a_model_is_done(bench, tmp_path):
    """`--e2e-at`: each run's best graph after 3 and 12 evaluations, timed against the original
    under onnxruntime's defaults; taso's one run stands for every seed, graphs stay out of the
    JSON, and the table and the plot gain the end-to-end column and row."""
    out = tmp_path / "curves"
    argv = ["--models", "squeezenet-1.1", "resnet-18", "--methods", "random", "taso"]
    argv += ["--seeds", "0", "1", "--evaluations", "12", "--e2e-at", "3", "12"]
    argv += ["--e2e-min-time", "0"]
    assert bench.main([*argv, "--out", str(out)]) == 0

    data = json.loads(out.with_name("curves.json").read_text())
    assert data["meta"]["e2e_at"] == [3, 12]
    for run in data["runs"]:
        assert "kept" not in run and set(run["e2e"]) == {"3", "12"}
        assert all(speedup > 0 for speedup in run["e2e"].values())
    taso = [run["e2e"] for run in data["runs"] if run["method"] == "taso"]
    assert taso[0] == taso[1] and taso[2] == taso[3]
    assert len(data["runs"]) == 8  # two models, each timed once its four runs were back
    rows = {(row["model"], row["method"]): row for row in data["summary"]}
    assert len(rows["resnet-18", "random"]["e2e_final"]) == 2
    table = out.with_name("curves.md").read_text()
    assert "end-to-end speedup after 12 evaluations" in table


def test_e2e_counts_beyond_the_budget_are_refused(bench, capsys):
    argv = ["--models", "squeezenet-1.1", "--evaluations", "10", "--e2e-at", "20"]
    assert bench.main(argv) == 2
    assert "--e2e-at" in capsys.readouterr().err


def test_merged_outputs_count_every_method_against_one_taso(bench, tmp_path):
    common = ["--models", "squeezenet-1.1", "--seeds", "0", "--evaluations", "8"]
    first, second = tmp_path / "first", tmp_path / "second"
    assert bench.main([*common, "--methods", "taso", "--out", str(first)]) == 0
    assert bench.main([*common, "--methods", "random", "--out", str(second)]) == 0
    merged = tmp_path / "merged"
    paths = [str(first.with_name("first.json")), str(second.with_name("second.json"))]
    assert bench.main(["--merge", *paths, "--out", str(merged)]) == 0

    data = json.loads(merged.with_name("merged.json").read_text())
    rows = {row["method"]: row for row in data["summary"]}
    taso_final = data["runs"][0]["speedup"][-1]
    assert rows["random"]["taso_final"] == taso_final  # counted against the other output's taso
    assert len(rows["random"]["to_reach_taso"]) == 1
    assert " and " in data["meta"]["command"] and "--merge" in data["meta"]["command"]
    assert merged.with_name("merged.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_outputs_of_different_budgets_are_not_merged(bench, tmp_path, capsys):
    for name, budget in (("a", "6"), ("b", "8")):
        argv = ["--models", "squeezenet-1.1", "--methods", "taso", "--evaluations", budget]
        assert bench.main([*argv, "--seeds", "0", "--out", str(tmp_path / name)]) == 0
    paths = [str(tmp_path / "a.json"), str(tmp_path / "b.json")]
    assert bench.main(["--merge", *paths, "--out", str(tmp_path / "m")]) == 2
    assert "differs from" in capsys.readouterr().err
    assert bench.main(["--merge", str(tmp_path / "none.json")]) == 2
    (tmp_path / "other.json").write_text("[1, 2]")
    assert bench.main(["--merge", str(tmp_path / "other.json")]) == 2
    assert "not an output of this script" in capsys.readouterr().err

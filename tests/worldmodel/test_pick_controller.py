"""scripts/pick_controller.py: the best temperature among controller runs, by real return or
measured speedup, copied with its choice; and what choosing cost, as learners_table counts it.
The runs are directories with the files the script reads (config.yaml, eval.json), written here."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import yaml

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"


def _run(directory: Path, wm: Path, rows: dict[str, tuple[float, float | None]], steps: int):
    directory.mkdir(parents=True)
    config = {"kind": "controller", "wm": str(wm), "temperature": 1.0, "select": "real-return"}
    (directory / "config.yaml").write_text(yaml.safe_dump(config))
    temperatures = {
        tau: {"temperature": float(tau), "real_return": ret, "speedup": speedup}
        for tau, (ret, speedup) in rows.items()
    }
    report = {"temperatures": temperatures, "selected_temperature": 1.0}
    report |= {"real_env_steps": steps, "real_measurements": len(rows)}
    (directory / "eval.json").write_text(json.dumps(report))
    return directory


def _pick(*argv) -> subprocess.CompletedProcess:
    script = SCRIPTS / "pick_controller.py"
    command = [sys.executable, str(script), *map(str, argv)]
    return subprocess.run(command, capture_output=True, text=True, timeout=120)


def test_the_best_speedup_is_picked_and_every_candidates_episodes_counted(tmp_path):
    wm, data = tmp_path / "wm", tmp_path / "data"
    wm.mkdir(), data.mkdir()
    (wm / "config.yaml").write_text(yaml.safe_dump({"data": str(data)}))
    totals = {"real_env_steps": 1000, "real_measurements": 0}
    (data / "manifest.json").write_text(json.dumps({"totals": totals}))
    first = _run(tmp_path / "a", wm, {"0.5": (14.0, 1.10), "1": (12.0, 1.12)}, steps=60)
    second = _run(tmp_path / "b", wm, {"0.5": (9.0, 1.20), "1": (15.0, 1.05)}, steps=70)

    result = _pick("--by", "speedup", "--out", tmp_path / "fast", first, second)
    assert result.returncode == 0, result.stderr
    fast = tmp_path / "fast"
    assert not list(tmp_path.glob(".fast-*"))  # assembled beside OUT, then renamed into place
    assert json.loads((fast / "eval.json").read_text())["selected_temperature"] == 0.5
    assert yaml.safe_load((fast / "config.yaml").read_text())["select"] == "speedup"
    picked = json.loads((fast / "picked.json").read_text())
    assert picked["picked"]["run"] == str(second) and len(picked["candidates"]) == 4
    assert (picked["real_env_steps"], picked["real_measurements"]) == (130, 4)

    result = _pick("--by", "real-return", "--out", tmp_path / "ret", first, second)
    assert result.returncode == 0, result.stderr
    assert json.loads((tmp_path / "ret" / "eval.json").read_text())["selected_temperature"] == 1.0
    picked = json.loads((tmp_path / "ret" / "picked.json").read_text())
    assert picked["picked"]["run"] == str(second)

    spec = importlib.util.spec_from_file_location("learners_table", SCRIPTS / "learners_table.py")
    table = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(table)
    assert table.training_cost(fast) == (1000 + 130, 4)  # the data and both runs' episodes
    assert table.training_cost(first) == (1000 + 60, 2)  # its own episodes chose its tau


def test_unmeasured_or_missing_candidates_are_refused_in_one_line(tmp_path):
    run = _run(tmp_path / "a", tmp_path, {"1": (12.0, None)}, steps=10)
    result = _pick("--by", "speedup", "--out", tmp_path / "x", run)
    assert result.returncode != 0 and "has no speedup: not measured" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and not (tmp_path / "x").exists()
    (run / "eval.json").unlink()
    result = _pick("--out", tmp_path / "y", run)
    assert result.returncode != 0 and "run --eval-real first" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    result = _pick("--out", tmp_path / "z", tmp_path / "none")
    assert result.returncode != 0 and "not a controller run" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_learners_table_counts_only_the_newest_timings_methods():
    """A bench run again with fewer methods keeps the other cells, which its newest timing did
    not measure: they are left out, not shown at 1.00x; a graph the timing has no entry for is
    the start itself (1.00x)."""
    spec = importlib.util.spec_from_file_location("learners_table", SCRIPTS / "learners_table.py")
    table = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(table)

    def cell(method, graph):
        return {
            "deploy": "offline",
            "model": "m",
            "method": method,
            "method_spec": method,
            "graph_hash": graph,
        }

    results = {
        "cells": {
            "a": cell("greedy", "g1"),
            "b": cell("taso", "g2"),
            "c": cell("random", "start"),
        },
        "comparisons": {
            "m|offline": {
                "members": {"greedy": "g1", "random": "start"},
                "speedup": {"g1": 1.1, "original": 1.0},
            }
        },
    }
    rows = table.rows_of(results)["m"]
    assert set(rows) == {"greedy", "random"}  # taso's cell is from an earlier timing
    assert rows["greedy"][0][0] == 1.1 and rows["random"][0][0] == 1.0


def test_learners_table_shares_a_groups_gain_and_steps_from_the_start():
    """The world model's target as a column: a controller's gain from the learners' start as a
    share of PPO's (log ratios, PPO's seeds by their geometric mean) and its real env steps as a
    share of PPO's; a search spends no real steps, so only its gain is shown."""
    spec = importlib.util.spec_from_file_location("learners_table", SCRIPTS / "learners_table.py")
    table = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(table)
    rows = {
        "m": {
            "greedy": [(0.9, 0, 0, "greedy")],
            "PPO": [(1.0, 6000, 100, "seed-0"), (0.95, 6000, 100, "seed-1")],
            "ctrl": [(0.97, 1200, 0, "seed-6")],
        }
    }
    text = table.markdown(rows, {}, "PPO", {"m": 0.8})
    lines = {line.split("|")[2].strip(): line for line in text.splitlines()[2:]}
    assert lines["ctrl"].endswith("| 98% (20%) |")  # log(0.97/0.8) / log(sqrt(0.95)/0.8)
    assert lines["greedy"].endswith("| 60% |") and lines["PPO"].endswith("| 100% (100%) |")
    assert "share of PPO's gain" in text.splitlines()[0]
    assert "share of" not in table.markdown(rows, {})  # the column only when asked for

"""scripts/probe_perop_flush.py on a small model: each flush size prices the graph into a cache of
its own, the smaller flushes keyed by their size; the errors are printed, never asserted on."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from pathlib import Path

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"


def test_three_flushes_per_graph_and_a_summary_per_repeat(tmp_path):
    out = tmp_path / "flush.json"
    command = [sys.executable, str(SCRIPTS / "probe_perop_flush.py"), "--size", "small"]
    command += ["--models", "squeezenet-1.1", "--repeats", "1", "--out", str(out)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    rows = json.loads(out.read_text())["rows"]
    assert [(row["model"], row["state"]) for row in rows] == [
        ("squeezenet-1.1", "original"),
        ("squeezenet-1.1", "ort:all"),
    ]
    for row in rows:
        assert all(row[f"{key}_ms"] > 0 for key in ("e2e", "full", "reuse", "reuse+act"))
    summaries = [line for line in result.stdout.splitlines() if line.startswith("repeat 0 ")]
    assert [line.split(":")[0] for line in summaries] == [
        "repeat 0 full",
        "repeat 0 reuse",
        "repeat 0 reuse+act",
    ]


def test_the_flush_size_keys_the_operator_cache(tmp_path):
    sys.path.insert(0, str(SCRIPTS))
    try:
        from probe_perop_flush import MIB, ReuseFlushModel, graph_bytes
    finally:
        sys.path.remove(str(SCRIPTS))
    from rlflow.graph import load_model
    from rlflow.zoo import cached_path

    graph = load_model(cached_path("squeezenet-1.1", "small"))
    assert graph_bytes(graph, activations=True) > graph_bytes(graph, activations=False) > 0
    model = ReuseFlushModel(cache_path=tmp_path / "ops.sqlite")
    assert model.cost_ms(graph) > 0
    model.close()
    with sqlite3.connect(tmp_path / "ops.sqlite") as db:
        keys = [row[0] for row in db.execute("SELECT settings FROM op_times")]
    flushes = {key.rsplit("flush=", 1)[1] for key in keys if "flush=" in key}
    weights_mib = graph_bytes(graph, activations=False) / MIB
    assert flushes and all(int(f.removesuffix("MiB")) <= round(weights_mib) for f in flushes)

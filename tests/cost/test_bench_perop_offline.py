"""scripts/bench_perop_offline.py on one small model: its rows, table, chart and resumption.
The timings are a few runs each and never asserted on."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

from rlflow.cost import MachinePeaks

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "bench_perop_offline.py"
PEAKS = MachinePeaks(gflops=100.0, gbps=10.0)


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_perop_offline", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    yield module
    del sys.modules[spec.name]


def test_one_model_table_chart_and_resumption(bench, tmp_path, monkeypatch):
    monkeypatch.setattr(bench, "machine_peaks", lambda settings: PEAKS)  # no 3 s measurement
    out = tmp_path / "table"
    argv = ["--models", "resnet-18", "--out", str(out), "--runs", "3", "--min-time", "0"]
    argv += ["--perop-runs", "2"]
    assert bench.main(argv) == 0
    assert out.with_suffix(".sqlite").exists()  # the table's own operator times

    data = json.loads(out.with_suffix(".json").read_text())
    assert data["meta"]["size"] == "small" and data["meta"]["threads"] == 1
    rows = data["rows"]
    assert [(row["model"], row["state"]) for row in rows] == [
        ("resnet-18", "original"),
        ("resnet-18", "ort:all"),
    ]
    for row in rows:
        assert row["ort_level"] == "disable"  # run as written, operators timed so too
        assert row["perop_fallbacks"] == 0 and not row["notes"]  # nor unmodelled ops
        assert min(row["e2e_ms"], row["perop_ms"], row["analytic_ms"]) > 0
        assert row["date"] and row["load"] >= 0
    table = out.with_suffix(".md").read_text()
    assert "| resnet-18 | ort:all |" in table and "load average" in table
    assert out.with_suffix(".png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    def no_measuring(*args, **kwargs):
        raise AssertionError("a kept row was measured again")

    monkeypatch.setattr(bench, "measure", no_measuring)
    assert bench.main(argv) == 0  # every row kept
    assert json.loads(out.with_suffix(".json").read_text())["rows"] == rows
    with pytest.raises(AssertionError, match="measured again"):
        bench.main([*argv, "--fresh"])


def test_rows_of_other_settings_are_not_kept(bench, tmp_path):
    settings = bench.Deployment("offline").settings(bench.OrtSettings())
    meta = bench.run_meta("small", settings)
    row = bench.Row("m", "original", 3, 1.0, 1.1, 1.2, 0, 0.5, "disable", 0.3, "2026-01-01")
    path = tmp_path / "rows.json"
    path.write_text(json.dumps({"meta": meta, "rows": [bench.asdict(row)]}))
    assert bench.kept_rows(path, meta) == {row.key: row}
    assert bench.kept_rows(path, {**meta, "threads": 2}) == {}
    assert row.perop_error == pytest.approx(0.2) and row.analytic_error == pytest.approx(-0.5)


def test_graph_files_rows_named_as_bench_names_them(bench, tmp_path, monkeypatch):
    """--graphs prices ONNX files (a bench's result models) in place of the zoo's start states:
    each runs at the level it declares, or at the offline one where it declares none."""
    import onnx

    from rlflow.graph import graph_to_onnx, load_model
    from rlflow.zoo import cached_path

    monkeypatch.setattr(bench, "machine_peaks", lambda settings: PEAKS)
    original = load_model(cached_path("resnet-18", "small"))
    settings = bench.Deployment("offline").settings(bench.OrtSettings())
    blocked = bench.start_state(original, "ort:all", settings).graph
    result = tmp_path / "resnet-18_small.taso.offline.onnx"
    onnx.save(graph_to_onnx(blocked), result)
    plain = tmp_path / "plain.onnx"
    onnx.save(graph_to_onnx(original), plain)  # declares nothing: runs at the offline level
    out = tmp_path / "files"
    argv = ["--graphs", str(result), str(plain), "--out", str(out), "--runs", "3"]
    assert bench.main([*argv, "--min-time", "0", "--perop-runs", "2"]) == 0

    rows = json.loads(out.with_suffix(".json").read_text())["rows"]
    assert [(row["model"], row["state"]) for row in rows] == [
        ("resnet-18_small", "taso.offline"),
        ("plain", "file"),
    ]
    assert {row["ort_level"] for row in rows} == {"disable"}
    assert rows[0]["nodes"] == len(blocked.nodes) and rows[1]["nodes"] == len(original.nodes)
    with pytest.raises(SystemExit):
        bench.main(["--graphs", str(tmp_path / "missing.onnx"), "--out", str(out)])

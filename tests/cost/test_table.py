"""Cost tables: the roofline fitted for misses, the JSON round trip, a graph's cost as the table's
sum, misses priced by the fit and reported, and the one-line errors of a bad table name.

The tables here are recorded on CPU by the same recorder `rlflow costs collect` uses, with real
one-node onnxruntime timings; a GPU table only differs in where its numbers come from."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

from rlflow.cost import OrtSettings, PerOpCostModel
from rlflow.cost.analytic import node_signature, op_cost
from rlflow.cost.perop import runs_in_place
from rlflow.cost.session import CUDA_NUMERICS
from rlflow.cost.table import (
    TABLE_VERSION,
    CostTable,
    TableCostModel,
    TableEntry,
    fit_roofline,
    load_table,
    table_names,
)
from rlflow.errors import RlflowError
from rlflow.graph import load_model
from rlflow.search.table_collect import TableRecorder


def test_fit_recovers_a_roofline():
    rng = np.random.default_rng(0)
    launch, gflops, gbps = 0.004, 20000.0, 1500.0
    points = []
    for _ in range(300):
        flops, moved = 10 ** rng.uniform(3, 10), 10 ** rng.uniform(3, 8)
        points.append((flops, moved, launch + max(flops / (gflops * 1e6), moved / (gbps * 1e6))))
    roofline = fit_roofline(points)
    assert roofline.fitted_on == 300
    assert roofline.launch_ms == pytest.approx(launch, rel=0.02)
    assert roofline.gflops == pytest.approx(gflops, rel=0.02)
    assert roofline.gbps == pytest.approx(gbps, rel=0.02)


def test_fit_of_constant_times_is_the_launch_alone():
    roofline = fit_roofline([(1e3, 1e3, 0.01), (1e6, 1e4, 0.01), (1e8, 1e7, 0.01)])
    assert roofline.launch_ms == pytest.approx(0.01)
    assert roofline.gflops is None and roofline.gbps is None
    assert roofline.time_ms(1e12, 1e12) == pytest.approx(0.01)
    assert fit_roofline([]).time_ms(1e9, 1e9) == 0.0


def _recorded(mlp_model, tmp_path):
    """(graph, table) with every operator of the mlp graph timed on CPU, offline."""
    settings = OrtSettings(threads=1, ort_level="disable", provider="cpu")
    perop = PerOpCostModel(settings, cache_path=tmp_path / "perop.sqlite")
    table = CostTable(
        meta={"provider": "cpu", "device": "test", "ort_level": "disable"},
        overhead_ms=perop.overhead_ms(settings),
    )
    graph = load_model(mlp_model)
    TableRecorder(table, perop).record(graph)
    return graph, table, perop


def test_a_covered_graph_costs_the_tables_sum(mlp_model, tmp_path):
    graph, table, perop = _recorded(mlp_model, tmp_path)
    timed = [node for node in graph.nodes if not runs_in_place(node)]
    assert len(table.entries) == len(timed) == 4
    path = table.save(tmp_path / "mlp.json")
    again = load_table(str(path))
    assert again.entries == table.entries and again.overhead_ms == table.overhead_ms
    report = TableCostModel(again).report(graph)
    assert (report.hits, report.misses, report.miss_ms, report.miss_share) == (4, 0, 0.0, 0.0)
    assert report.total_ms == pytest.approx(
        again.overhead_ms + sum(entry.ms for entry in again.entries.values())
    )
    # The table holds what the per-op model measured (rounded to 6 significant digits).
    assert report.total_ms == pytest.approx(perop.cost_ms(graph), rel=1e-4)


def test_misses_are_priced_by_the_fitted_roofline_and_reported(mlp_model, tmp_path):
    graph, table, _ = _recorded(mlp_model, tmp_path)
    relu = next(node for node in graph.nodes if node.op_type == "Relu")
    del table.entries[table.key(graph, relu, "disable")]
    # The mlp's operators take about as long as one run's overhead, so on a loaded machine their
    # net times can all be 0 and the fit with them: the kept entries get times that grow with
    # their FLOPs, so the fit, and the miss it prices, is positive.
    for key, entry in table.entries.items():
        table.entries[key] = replace(entry, ms=0.001 + entry.flops * 1e-9)
    model = TableCostModel(table)
    report = model.report(graph)
    cost = op_cost(*node_signature(graph, relu))
    assert (report.hits, report.misses, report.missed_ops) == (3, 1, {"Relu": 1})
    assert report.miss_ms == pytest.approx(model.roofline.time_ms(cost.flops, cost.bytes))
    assert report.miss_ms > 0
    assert report.miss_share == pytest.approx(report.miss_ms / report.total_ms)
    assert 0 < report.miss_share < 1
    model.cost_ms(graph)
    model.cost_ms(graph)
    usage = model.usage()
    assert usage["graphs_costed"] == 2 and usage["missed_ops"] == {"Relu": 2}
    assert usage["miss_share"] == pytest.approx(report.miss_share)
    assert usage["roofline"]["fitted_on"] == 3
    json.dumps(usage)  # results carry it as JSON


def test_a_graph_declaring_another_level_misses(mlp_model, tmp_path):
    """Operators are looked up at the level their graph runs at, as the per-op model times
    them: the table's own, unless the graph declares another."""
    graph, table, _ = _recorded(mlp_model, tmp_path)
    model = TableCostModel(table)
    assert model.level_for(graph) == "disable"
    level_all = graph.with_metadata(
        {"ort_config": json.dumps({"session_options": {"graph_optimization_level": 99}})}
    )
    assert model.report(level_all).misses == 4


def test_bad_table_names_and_files_are_one_line_errors(tmp_path):
    with pytest.raises(RlflowError, match="no cost table named 'nonesuch'"):
        load_table("nonesuch")
    with pytest.raises(RlflowError, match="not a file"):
        load_table(str(tmp_path / "missing.json"))
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"a": 1}))
    with pytest.raises(RlflowError, match="not an rlflow cost table"):
        load_table(str(other))
    old = tmp_path / "old.json"
    data = CostTable(meta={}, overhead_ms=0.0).to_json()
    old.write_text(json.dumps({**data, "version": TABLE_VERSION + 1}))
    with pytest.raises(RlflowError, match="collect it again"):
        load_table(str(old))
    for name in table_names():  # every shipped table reads
        assert load_table(name).entries


def test_provider_options_fix_numerics_on_cuda_only():
    cpu = OrtSettings(provider="cpu")
    assert cpu.provider_options() == {}
    assert "tf32" not in cpu.key()  # CPU cache keys made before the field stay valid
    assert OrtSettings(provider="cpu", tf32=True).key() == cpu.key()
    cuda = OrtSettings(provider="cuda").provider_options()
    assert cuda["use_tf32"] == "0" and cuda.items() >= CUDA_NUMERICS.items()
    assert OrtSettings(provider="cuda", tf32=True).provider_options()["use_tf32"] == "1"


def test_tables_shipped_with_rlflow_are_named(tmp_path, monkeypatch):
    from rlflow.cost import table as tables

    monkeypatch.setattr(tables, "TABLES_DIR", tmp_path)
    entry = TableEntry("Relu", 0.002, 0, 8, "Relu float32[8] -> float32[8]")
    CostTable(meta={"provider": "cuda"}, overhead_ms=0.01, entries={"k": entry}).save(
        tmp_path / "mini.json"
    )
    assert tables.table_names() == ["mini"]
    assert load_table("mini").entries == {"k": entry}
    assert TableCostModel("mini").name == "table:mini"


@pytest.mark.parametrize(("name", "device"), [("h200", "NVIDIA H200"), ("h100", "NVIDIA H100")])
def test_a_shipped_gpu_table_covers_the_full_zoo_as_onnxruntime_runs_it(name, device):
    """The tables collected on an H200 and an H100 (docs/BENCHMARKS.md, "GPU") hold every
    operator of the full-size zoo's originals, so costing them on any machine needs no roofline
    guess."""
    from rlflow.zoo import cached_path

    table = load_table(name)
    meta = table.meta
    assert meta["device"].startswith(device) and meta["provider"] == "cuda" and meta["complete"]
    assert meta["provider_options"]["use_tf32"] == "0" and meta["deploy"] == "offline"
    assert len(meta["models_done"]) == 9 and not meta["models_failed"]
    for name in ("squeezenet-1.1", "resnet-18"):
        report = TableCostModel(table).report(load_model(cached_path(name, "full")))
        assert report.misses == 0 and report.hits > 0 and report.total_ms > table.overhead_ms

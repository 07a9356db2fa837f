"""Collecting a cost table on CPU: what the rollouts reach is in it and costs from it without a
miss, the metadata says where it was measured, a rerun resumes, other settings are refused."""

from __future__ import annotations

import json

import pytest

from rlflow.cost import Deployment, OrtSettings
from rlflow.cost.table import TableCostModel, load_table
from rlflow.errors import RlflowError
from rlflow.graph import load_model
from rlflow.rewrite import default_ruleset
from rlflow.rewrite.session import RewriteSession
from rlflow.search.table_collect import collect_table


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("RLFLOW_CACHE_DIR", str(tmp_path / "cache"))


class Steps:
    def __init__(self) -> None:
        self.count = 0

    def update(self, n: int = 1) -> None:
        self.count += n

    def set_postfix_str(self, s: str = "", refresh: bool = True) -> None:
        pass


def test_collected_table_covers_the_rollouts_and_resumes(mlp_model, tmp_path):
    graph = load_model(mlp_model)
    out = tmp_path / "mlp.json"
    settings = OrtSettings(threads=1, provider="cpu")
    progress = Steps()
    table = collect_table(
        [("mlp", graph)], out, settings=settings, deploy=Deployment("offline"), steps=2,
        progress=progress,
    )  # fmt: skip
    assert progress.count == 8  # a random walk and a greedy descent of 2 from 2 starts
    meta = json.loads(out.read_text())["meta"]
    assert meta["provider"] == "cpu" and meta["device"] and meta["onnxruntime"]
    assert meta["driver"] is None and meta["cuda"] is None
    assert (meta["deploy"], meta["ort_level"]) == ("offline", "disable")
    assert meta["models_done"] == ["mlp"] and meta["complete"] is True
    loaded = load_table(str(out))
    assert loaded.entries == table.entries and len(loaded.entries) >= 4
    model = TableCostModel(loaded)
    assert model.report(graph).misses == 0
    # Every candidate of the original was weighed by the greedy descent, so it is covered too.
    for candidate in RewriteSession(graph, default_ruleset()).candidates():
        assert model.report(candidate.graph).misses == 0, candidate.rule.name

    again = collect_table(
        [("mlp", graph)], out, settings=settings, deploy=Deployment("offline"), steps=2
    )
    assert again.entries == loaded.entries
    with pytest.raises(RlflowError, match="steps 2 -> 3"):
        collect_table(
            [("mlp", graph)], out, settings=settings, deploy=Deployment("offline"), steps=3
        )


def test_online_tables_time_at_level_all(mlp_model, tmp_path):
    graph = load_model(mlp_model)
    table = collect_table(
        [("mlp", graph)], tmp_path / "online.json", settings=OrtSettings(provider="cpu"),
        deploy=Deployment("online"), steps=1,
    )  # fmt: skip
    assert table.meta["ort_level"] == "all" and table.entries
    assert TableCostModel(table).report(graph).misses == 0


def test_a_model_that_fails_does_not_stop_the_others(mlp_model, tmp_path, monkeypatch):
    """A model whose rollouts fail (on a GPU: a graph onnxruntime optimised for CUDA that its
    CPU cannot run) is listed with its reason; the others are collected and saved, and the
    collection then fails with one line naming it."""
    import rlflow.search.table_collect as table_collect

    rollouts = table_collect._rollouts

    def failing_for_broken(recorder, label, original, run, progress):
        if label == "broken":
            raise RlflowError("onnxruntime cannot load it here")
        rollouts(recorder, label, original, run, progress)

    monkeypatch.setattr(table_collect, "_rollouts", failing_for_broken)
    graph = load_model(mlp_model)
    out = tmp_path / "two.json"
    with pytest.raises(RlflowError, match="1 of 2 models failed.*broken: onnxruntime cannot"):
        collect_table(
            [("broken", graph), ("mlp", graph)], out, settings=OrtSettings(provider="cpu"),
            deploy=Deployment("offline"), steps=1,
        )  # fmt: skip
    meta = json.loads(out.read_text())["meta"]
    assert meta["models_done"] == ["mlp"] and meta["complete"] is False
    assert meta["models_failed"] == {"broken": "onnxruntime cannot load it here"}
    assert TableCostModel(load_table(str(out))).report(graph).misses == 0

"""`rlflow costs collect` on a small zoo model on CPU, the table read back, `--cost table:PATH`
through `rlflow search` end to end, `rlflow costs list`, and the one-line errors of
`--provider` and `--cost` (the CUDA path itself: tests/cost/test_cuda.py, marked gpu)."""

from __future__ import annotations

import json

import onnxruntime as ort
import pytest

from rlflow.cli import main
from rlflow.cost.table import TableCostModel, load_table
from rlflow.graph import load_model
from rlflow.zoo import cached_path

MODEL = "squeezenet-1.1"


@pytest.fixture(scope="module")
def table_path(tmp_path_factory):
    """A table collected on CPU by the command, once for the module."""
    path = tmp_path_factory.mktemp("costs") / "squeezenet.json"
    argv = ["costs", "collect", "--provider", "cpu", "--models", MODEL, "--size", "small"]
    assert main([*argv, "--steps", "2", "--out", str(path)]) == 0
    return path


def test_collect_writes_a_table_that_costs_the_model_without_a_miss(table_path):
    table = load_table(str(table_path))
    meta = table.meta
    assert meta["provider"] == "cpu" and meta["device"] and meta["onnxruntime"]
    assert meta["models"] == [f"{MODEL}:small"] and meta["complete"] and table.entries
    assert meta["command"].startswith("rlflow costs collect --provider cpu")
    assert meta["rules"] and table.rules == meta["rules"]  # what a search elsewhere may use
    graph = load_model(cached_path(MODEL, "small"))
    report = TableCostModel(table).report(graph)
    assert report.misses == 0 and report.hits > 0
    keys = [table.key(graph, node, "disable") for node in graph.nodes]  # a signature per node
    assert report.total_ms == pytest.approx(
        table.overhead_ms + sum(table.entries[key].ms for key in keys if key in table.entries)
    )


def test_search_ranks_by_a_table_end_to_end(capfd, tmp_path, table_path):
    out = tmp_path / "s.onnx"
    argv = ["search", MODEL, "--method", "greedy", "--budget", "2", "--start", "original"]
    argv += ["--cost", f"table:{table_path}", "-o", str(out), "--min-time", "0.05", "--no-peer"]
    code = main([*argv, "--json"])
    stdout, err = capfd.readouterr()
    assert code == 0, err
    summary = json.loads(stdout)
    assert summary["cost_model"] == f"table:{table_path}"
    details = summary["cost_table"]
    assert details["provider"] == "cpu" and details["graphs_costed"] > 0
    assert 0.0 <= details["miss_share"] < 1.0
    assert "cost table" in err and "% of the cost of" in err
    assert out.is_file() and summary["equivalent"]


def test_search_on_a_cpu_machine_makes_a_model_for_the_gpu_of_the_shipped_table(capfd, tmp_path):
    """`--cost table:h200` here: a model for the H200, from the original (onnxruntime's graphs
    here are the CPU's), ranked and chosen by the table's times, none of the CPU's NCHWc
    layouts in it; checked equivalent and timed here too, and said so."""
    out = tmp_path / "s.onnx"
    argv = ["search", MODEL, "--size", "full", "--method", "greedy", "--cost", "table:h200"]
    code = main([*argv, "-o", str(out), "--min-time", "0.05", "--no-peer", "--json"])
    stdout, err = capfd.readouterr()
    assert code == 0, err
    summary = json.loads(stdout)
    assert summary["cost_model"] == "table:h200" and summary["start_state"] == "original"
    assert summary["target"]["provider"] == "cuda" and summary["provider"] == "cpu"
    details = summary["cost_table"]
    assert details["device"] == "NVIDIA H200" and details["provider"] == "cuda"
    assert details["graphs_costed"] > 0 and details["miss_share"] == 0.0  # it covers the model
    assert summary["optimized_cost"] < summary["original_cost"] and summary["steps"] > 0
    assert not any(rule.startswith("nchwc") for rule in summary["rules_applied"])
    assert "cost table h200 (cuda on NVIDIA H200" in err
    assert out.is_file() and summary["equivalent"]
    # What the GPU machine does with the record (the model itself is too large to carry): the
    # same graph, made for the table's provider with the rules it verified, ranked by it again.
    record = tmp_path / "s.json"
    record.write_text(stdout)
    argv = ["optimize", MODEL, "--size", "full", "--method", f"replay:{record}", "--no-peer"]
    code = main([*argv, "-o", str(tmp_path / "r.onnx"), "--min-time", "0.05", "--json"])
    stdout, err = capfd.readouterr()
    assert code == 0, err
    replayed = json.loads(stdout)
    assert replayed["cost_model"] == "table:h200" and replayed["target"]["provider"] == "cuda"
    assert replayed["episode"]["final_hash"] == summary["episode"]["final_hash"]
    assert replayed["optimized_cost"] == pytest.approx(summary["optimized_cost"])
    code = main(
        [
            "search",
            MODEL,
            "--size",
            "full",
            "--method",
            "greedy",
            "--cost",
            "table:h200",
            "--start",
            "ort:all",
            "-o",
            str(tmp_path / "t.onnx"),
        ]
    )
    err = capfd.readouterr().err
    assert code == 2 and "onnxruntime's graphs for cuda" in err and len(err.splitlines()) == 1


def test_costs_list(capfd):
    assert main(["costs", "list", "--json"]) == 0
    listing = json.loads(capfd.readouterr().out)
    assert isinstance(listing["tables"], list)
    for row in listing["tables"]:
        assert row["operators"] > 0 and row["provider"] in ("cpu", "cuda")
    assert "h200" in [row["name"] for row in listing["tables"]]


def test_a_missing_table_is_one_line_before_any_work(capfd, tmp_path):
    out = tmp_path / "s.onnx"
    code = main(["search", MODEL, "--method", "greedy", "--cost", "table:nonesuch", "-o", str(out)])
    err = capfd.readouterr().err
    assert code == 2 and "no cost table named 'nonesuch'" in err
    assert len(err.strip().splitlines()) == 1 and not out.exists()


def test_an_unknown_cost_is_refused_by_the_parser(capfd, tmp_path):
    with pytest.raises(SystemExit) as stop:
        main(["search", MODEL, "--method", "greedy", "--cost", "bogus", "-o", str(tmp_path / "o")])
    assert stop.value.code == 2
    assert "table:NAME" in capfd.readouterr().err


@pytest.mark.skipif("CUDAExecutionProvider" in ort.get_available_providers(), reason="CUDA is here")
def test_provider_cuda_without_cuda_is_one_line(capfd, mlp_model, tmp_path):
    path = tmp_path / "mlp.onnx"
    path.write_bytes(mlp_model.SerializeToString())
    code = main(["measure", str(path), "--provider", "cuda"])
    err = capfd.readouterr().err
    assert code == 2 and "no CUDAExecutionProvider" in err
    assert len(err.strip().splitlines()) == 1


def test_provider_cpu_is_recorded(capfd, mlp_model, tmp_path):
    path = tmp_path / "mlp.onnx"
    path.write_bytes(mlp_model.SerializeToString())
    code = main(["measure", str(path), "--provider", "cpu", "--runs", "5", "--json"])
    out, err = capfd.readouterr()
    assert code == 0, err
    result = json.loads(out)
    assert result["provider"] == "cpu" and result["provider_options"] == {}


LEARNERS = [
    ["collect", "--model", MODEL, "--episodes", "1"],
    ["train-ppo", "--model", MODEL, "--total-steps", "1"],
    ["train-wm-loop", "--model", MODEL, "--iterations", "1"],
]
"""The learners' commands at their least work; the tests below add an option that must stop
each before any."""


@pytest.mark.parametrize("argv", LEARNERS)
def test_learners_take_a_table_cost_and_check_it_first(capfd, tmp_path, argv):
    code = main([*argv, "--cost", "table:nonesuch", "--out", str(tmp_path / "run")])
    err = capfd.readouterr().err
    assert code == 2 and "no cost table named 'nonesuch'" in err
    assert not (tmp_path / "run").exists()


def test_jobs_collect_the_same_table_as_one_process(tmp_path, monkeypatch):
    """Two worker processes (rules matched in parallel, operators timed one at a time under a
    lock) record the same operators as one process; the second run reads the first's timings
    from the per-op cache, so the greedy descents follow the same path. One occasion per entry
    (inherited by the workers): otherwise an entry first timed over OCCASION_SPACING_S before
    (on a slow machine, early in the first run) is timed again in the second, and its minimum
    moves."""
    monkeypatch.setenv("RLFLOW_TIMING_OCCASIONS", "1")
    serial, parallel = tmp_path / "serial.json", tmp_path / "parallel.json"
    argv = ["costs", "collect", "--provider", "cpu", "--models", MODEL, "resnet-18"]
    argv += ["--size", "small", "--steps", "2"]
    assert main([*argv, "--out", str(serial)]) == 0
    assert main([*argv, "--jobs", "2", "--out", str(parallel)]) == 0
    one, two = load_table(str(serial)), load_table(str(parallel))
    assert two.meta["complete"] and sorted(two.meta["models_done"]) == sorted(one.meta["models"])
    assert two.entries == one.entries and two.failed == one.failed
    assert "--jobs 2" in two.meta["command"]


@pytest.mark.skipif("CUDAExecutionProvider" in ort.get_available_providers(), reason="CUDA is here")
@pytest.mark.parametrize(
    "argv", [*LEARNERS, ["train-wm-loop", "--model", MODEL, "--iterations", "1"]]
)
def test_learners_refuse_provider_cuda_without_cuda_first(capfd, tmp_path, argv):
    code = main([*argv, "--provider", "cuda", "--out", str(tmp_path / "run")])
    err = capfd.readouterr().err
    assert code == 2 and "no CUDAExecutionProvider" in err
    assert len(err.strip().splitlines()) == 1 and not (tmp_path / "run").exists()


def test_train_ppo_records_the_provider_it_measured_on(capfd, tmp_path):
    """`--provider cpu` lands in the run's config (and so in the env every rollout of the agent
    builds, where `rlflow optimize --agent` puts its own provider instead)."""
    import yaml

    argv = ["train-ppo", "--model", MODEL, "--provider", "cpu", "--cost", "analytic"]
    argv += ["--total-steps", "4", "--horizon", "2", "--num-envs", "1", "--num-steps", "4"]
    code = main([*argv, "--out", str(tmp_path / "run"), "--no-progress"])
    assert code == 0, capfd.readouterr().err
    config = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())
    assert config["provider"] == "cpu"


def test_an_agent_trained_on_the_gpu_table_makes_a_model_for_the_gpu(capfd, tmp_path):
    """A PPO run rewarded by `table:h200` here: its rollouts start from the original, with the
    rules CUDA verified, and the model it hands back is chosen by the table, for cuda."""
    from rlflow.agents import ppo

    run_dir = tmp_path / "ppo"
    config = ppo.PPOConfig(
        models=[MODEL], size="full", total_steps=8, horizon=4, episodes_per_update=2,
        minibatch_size=4, update_epochs=1, hidden=16, layers=1, heads=1, max_candidates=32,
        cost="table:h200", deploy="offline", provider="cpu",
    )  # fmt: skip
    ppo.train(config, run_dir, progress=False)
    out = tmp_path / "a.onnx"
    argv = ["optimize", MODEL, "--size", "full", "--method", f"agent:{run_dir}", "-o", str(out)]
    code = main([*argv, "--episodes", "1", "--min-time", "0.05", "--no-peer", "--json"])
    stdout, err = capfd.readouterr()
    assert code == 0, err
    summary = json.loads(stdout)
    assert summary["start_state"] == "original" and summary["target"]["provider"] == "cuda"
    assert (
        summary["cost_model"] == "table:h200"
        and summary["optimized_cost"] <= summary["original_cost"]
    )
    assert not any(rule.startswith("nchwc") for rule in summary["rules_applied"])
    assert out.is_file() and summary["equivalent"]

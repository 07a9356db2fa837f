"""`rlflow bench`: report.md, PNG plots and results.json for two models and two methods; a rerun
resumes instead of redoing, and `--retime` times the same graphs again; a trained agent adds
learning curves; bad input is one line."""

from __future__ import annotations

import json
from pathlib import Path

from rlflow.cli import main
from rlflow.commands.bench import DEFAULTS, load_config
from rlflow.cost import check_equivalence
from rlflow.graph import load_model
from rlflow.report import format_rules
from rlflow.zoo import cached_path

REPO = Path(__file__).resolve().parents[2]
QUICK = ("--budget", "4", "--deploys", "offline", "--min-time", "0.05")
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def bench(capsys, out: Path, *args: str) -> dict:
    code = main(["bench", *args, *QUICK, "--out", str(out), "--json"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    return json.loads(captured.out.strip().splitlines()[-1])


def test_two_models_two_methods_report_and_plots(tmp_path, capsys):
    out = tmp_path / "report"
    args = ("--models", "squeezenet-1.1", "resnet-18", "--methods", "greedy", "taso")
    summary = bench(capsys, out, *args)

    report = (out / "report.md").read_text()
    for needle in ("squeezenet-1.1:small", "resnet-18:small", "| greedy | taso |", "`offline`"):
        assert needle in report, needle
    for heading in (
        "Speedup",
        "wall time",
        "Steps",
        "max abs error",
        "Rules applied",
        "Tuning peer",
        "fusions",
    ):
        assert heading in report, heading
    plots = [Path(path) for path in summary["plots"]]
    assert len(plots) >= 2
    for plot in plots:
        assert plot.read_bytes().startswith(PNG_MAGIC) and plot.name in report

    rows = summary["rows"]
    assert {(row["model"], row["method"]) for row in rows} == {
        (model, method)
        for model in ("squeezenet-1.1:small", "resnet-18:small")
        for method in ("greedy", "taso")
    }
    results = json.loads((out / "results.json").read_text())
    for row in rows:
        assert row["equivalent"] and row["speedup"] > 0 and row["deploy"] == "offline"
        assert (
            row["peer_speedup"] > 0
            and row["peer_knob"] in results["peers"][row["model"]]["speedups"]
        )
        assert row["start_state"] in results["starts"][f"{row['model']}|offline"]
        assert row["steps"] == sum(row["rules_applied"].values())
        # every result was timed in its model's one interleaved comparison
        comparison = results["comparisons"][f"{row['model']}|offline"]
        assert comparison["members"][row["method"]] == row["graph_hash"]
        written = load_model(out / row["graph_file"])
        assert written.canonical_hash() == row["graph_hash"]
    original = load_model(cached_path("resnet-18", "small"))
    taso = next(r for r in rows if r["model"] == "resnet-18:small" and r["method"] == "taso")
    assert check_equivalence(original, load_model(out / taso["graph_file"])).equivalent
    assert not list(out.rglob("*.tmp"))

    # A rerun finds every cell and comparison in results.json and redoes none of them.
    before = {path: path.stat().st_mtime_ns for path in (out / "models").iterdir()}
    again = bench(capsys, out, *args)
    assert json.loads((out / "results.json").read_text())["cells"] == results["cells"]
    assert json.loads((out / "results.json").read_text())["comparisons"] == results["comparisons"]
    assert {path: path.stat().st_mtime_ns for path in (out / "models").iterdir()} == before
    assert [row["speedup"] for row in again["rows"]] == [row["speedup"] for row in rows]

    # --retime keeps every cell and times each model's graphs again; the first timing stays.
    retimed = bench(capsys, out, *args, "--retime")
    after = json.loads((out / "results.json").read_text())
    assert after["cells"] == results["cells"]
    assert {path: path.stat().st_mtime_ns for path in (out / "models").iterdir()} == before
    for key, comparison in after["comparisons"].items():
        first = {k: v for k, v in results["comparisons"][key].items() if k != "earlier"}
        assert comparison["earlier"] == [first]
        assert comparison["members"] == first["members"]
    for row, old in zip(retimed["rows"], rows, strict=True):
        assert row["earlier_speedups"] == [old["speedup"]]
        comparison = after["comparisons"][f"{row['model']}|offline"]
        assert row["speedup"] == comparison["speedup"][row["graph_hash"]]
    assert "(earlier " in (out / "report.md").read_text()


def test_configs_bench_yaml_mirrors_the_defaults():
    assert load_config(REPO / "configs" / "bench.yaml") == DEFAULTS


def one_line_error(capsys, argv: list[str]) -> str:
    assert main(argv) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("rlflow: error:"), lines
    return lines[0]


def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys):
    out = tmp_path / "report"
    base = ["bench", "--out", str(out), "--models", "squeezenet-1.1"]
    assert "unknown method 'astar'" in one_line_error(capsys, [*base, "--methods", "astar"])
    missing_run = f"agent:{tmp_path / 'no-run'}"
    assert "no such agent run" in one_line_error(capsys, [*base, "--methods", missing_run])
    message = one_line_error(capsys, [*base, "--methods", "greedy", "--deploys", "fast"])
    assert "unknown deploy mode 'fast'" in message
    message = one_line_error(capsys, [*base, "--methods", "greedy", "--start", "ort:fast"])
    assert "unknown start state 'ort:fast'" in message
    message = one_line_error(
        capsys, ["bench", "--out", str(out), "--models", str(tmp_path / "x.onnx")]
    )
    assert "no such file" in message
    bad_config = tmp_path / "bench.yaml"
    bad_config.write_text("modles: [bert]\n")
    assert "unknown keys" in one_line_error(capsys, [*base, "--config", str(bad_config)])
    assert not out.exists()


def test_agent_adds_learning_curves_and_env_steps(tiny_ppo_run, tmp_path, capsys):
    out = tmp_path / "report"
    methods = ("greedy", f"agent:{tiny_ppo_run}")
    summary = bench(capsys, out, "--models", "squeezenet-1.1", "--methods", *methods)
    names = {Path(path).name for path in summary["plots"]}
    assert {"speedup.png", "learning_curves.png", "speedup_vs_env_steps_offline.png"} <= names
    agent = next(row for row in summary["rows"] if row["method"].startswith("agent:"))
    progress = json.loads((tiny_ppo_run / "progress.json").read_text())
    assert agent["env_steps"] == progress["global_step"] > 0
    assert agent["method"] == f"agent:{tiny_ppo_run.name}" and agent["equivalent"]
    assert f"{agent['env_steps']:,}" in (out / "report.md").read_text()


def test_rules_cell_names_the_three_most_used_then_counts_the_rest():
    rules = {"conv-batchnorm-fold": 53, "conv-relu-to-fusedconv": 33, "gelu-fusion": 2, "x": 1}
    assert format_rules(rules) == (
        "conv-batchnorm-fold x53, conv-relu-to-fusedconv x33, gelu-fusion x2, +1 more"
    )
    assert format_rules({}) == format_rules(None) == "none"


def test_the_printed_table_keeps_a_long_method_name_apart_from_its_deploy(capsys):
    from rlflow.commands.bench import print_rows

    row = {"model": "mini-dalle:medium", "deploy": "offline", "equivalent": True}
    rows = [
        {**row, "method": "taso", "speedup": 1.08, "peer_speedup": 1.01, "wall_s": 40.9},
        {**row, "method": "agent:ppo-mask/seed-0", "speedup": 1.093, "wall_s": 123.4},
    ]
    print_rows(rows)
    header, taso, agent = capsys.readouterr().out.splitlines()
    assert agent.split() == ["mini-dalle:medium", "agent:ppo-mask/seed-0", "offline", "1.093x",
                             "—", "123.4"]  # fmt: skip
    assert header.index("deploy") == taso.index("offline") == agent.index("offline")


def test_seed_runs_of_two_agents_get_distinct_labels(tmp_path):
    """`train-ppo --seeds` lays runs out as RUN_DIR/seed-S: tables name them with their parent
    (two agents' seed-0 runs used to share the label `agent:seed-0` and bench refused them)."""
    from rlflow.optimize import Method

    for name in ("ppo-a", "ppo-b"):
        (tmp_path / name / "seed-0").mkdir(parents=True)
        (tmp_path / name / "seed-0" / "config.yaml").write_text("kind: ppo\n")
    labels = [
        Method.parse(f"agent:{tmp_path / name / 'seed-0'}").label for name in ("ppo-a", "ppo-b")
    ]
    assert labels == ["agent:ppo-a/seed-0", "agent:ppo-b/seed-0"]
    assert Method.parse(f"agent:{tmp_path / 'ppo-a' / 'seed-0'}").agent.kind == "ppo"


def test_a_cell_replays_in_another_bench_and_is_redone_when_its_record_changes(tmp_path, capsys):
    """A bench cell holds its episode like an `optimize --json` record: `replay:CELL.json`
    re-applies it in another bench (from the cell's start state), a rerun keeps the replayed
    cell, and an edited record makes it redone."""
    bench(capsys, tmp_path / "a", "--models", "squeezenet-1.1", "--methods", "greedy", "--no-peer")
    cells = json.loads((tmp_path / "a" / "results.json").read_text())["cells"]
    cell = cells["squeezenet-1.1:small|greedy|offline"]
    record = tmp_path / "greedy.json"
    record.write_text(json.dumps(cell))
    out, key = tmp_path / "b", "squeezenet-1.1:small|replay:greedy|offline"
    args = ("--models", "squeezenet-1.1", "--methods", f"replay:{record}", "--no-peer")
    bench(capsys, out, *args)
    replayed = json.loads((out / "results.json").read_text())["cells"][key]
    assert replayed["equivalent"] and replayed["start_state"] == cell["start_state"]
    assert replayed["episode"]["original_hash"] == cell["episode"]["original_hash"]
    if replayed["steps"]:  # kept: it measured faster here too
        assert replayed["graph_hash"] == cell["graph_hash"]
    bench(capsys, out, *args)
    assert json.loads((out / "results.json").read_text())["cells"][key] == replayed
    record.write_text(json.dumps({**cell, "note": "edited"}))
    bench(capsys, out, *args)
    assert (
        json.loads((out / "results.json").read_text())["cells"][key]["wall_s"] != replayed["wall_s"]
    )


def test_results_from_another_machine_are_not_resumed(tmp_path, capsys):
    """results.json records the machine (CPU, NCHWc block, onnxruntime): onnxruntime's `all`
    graph and every timing depend on it, so a bench moved to another machine starts over (a
    rerun on the same machine resumes: the first test)."""
    from rlflow.commands.bench import bench_machine

    out = tmp_path / "report"
    args = ("--models", "squeezenet-1.1", "--methods", "greedy", "--no-peer")
    bench(capsys, out, *args)
    results = json.loads((out / "results.json").read_text())
    assert results["machine"] == bench_machine("cpu")
    assert (
        f"NCHWc block {results['machine']['nchwc_block'] or 'none'}"
        in (out / "report.md").read_text()
    )
    key = "squeezenet-1.1:small|greedy|offline"
    another = {"cpu": "another CPU", "device": "another CPU"}
    elsewhere = {**results, "machine": {**results["machine"], **another}}
    (out / "results.json").write_text(json.dumps(elsewhere))
    assert main(["bench", *args, *QUICK, "--out", str(out), "--json"]) == 0
    err = capsys.readouterr().err
    assert "measured on another machine (another CPU" in err and "starting over" in err
    redone = json.loads((out / "results.json").read_text())
    assert redone["machine"] == bench_machine("cpu")
    assert redone["cells"][key]["wall_s"] != results["cells"][key]["wall_s"]

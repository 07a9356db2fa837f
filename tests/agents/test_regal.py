"""REGAL: the policy's per-gene biases, `rlflow train-regal` (a tiny run, its rerun rules), and
`brkga` and `regal:RUN_DIR` through `rlflow optimize` and `rlflow bench`."""

from __future__ import annotations

import json

import numpy as np
import pytest
import yaml

from rlflow.agents.regal import CHECKPOINT, RegalConfig, parse_regal
from rlflow.agents.regal_policy import load_regal_policy, make_policy
from rlflow.cli import main
from rlflow.cost import check_equivalence
from rlflow.graph import load_model
from rlflow.rewrite import default_ruleset
from rlflow.rewrite.session import RewriteSession
from rlflow.search.brkga import start_layout
from rlflow.tensorboard import EVENT_FILE_PREFIX
from rlflow.zoo import cached_path
from tests.agents.test_train_ppo_cli import assert_one_line_error, rlflow

NETWORK = {"hidden": 16, "layers": 1, "heads": 1}
TINY = (
    "--models", "squeezenet-1.1", "--budget", "3", "--population", "3", "--seeds", "1",
    "--runs-per-update", "1", "--no-progress",
)  # fmt: skip
QUICK = ("--min-time", "0.05", "--no-peer")


@pytest.fixture(scope="module")
def squeezenet():
    graph = load_model(cached_path("squeezenet-1.1", "small"))
    return RewriteSession(graph, default_ruleset(), model="squeezenet-1.1")


@pytest.fixture(scope="module")
def network_config(tmp_path_factory):
    path = tmp_path_factory.mktemp("regal-config") / "regal.yaml"
    path.write_text(yaml.safe_dump(NETWORK))
    return str(path)


@pytest.fixture(scope="module")
def regal_run(tmp_path_factory, network_config):
    """A real `rlflow train-regal` run directory: two runs of three evaluations."""
    out = tmp_path_factory.mktemp("regal") / "run"
    argv = ["train-regal", *TINY, "--total-runs", "2", "--config", network_config]
    assert main([*argv, "--out", str(out)]) == 0
    return out


def test_an_untrained_policy_is_plain_brkga_on_average(squeezenet):
    rule_names = [rule.name for rule in squeezenet.ruleset]
    policy = make_policy(RegalConfig(**NETWORK), rule_names)
    layout = start_layout(squeezenet)
    biases = policy.biases(squeezenet.graph, layout)
    assert biases.means.shape == biases.inheritance.shape == (layout.size,)
    assert np.all((biases.means > 0) & (biases.means < 1))
    assert abs(biases.means.mean() - 0.5) < 0.05
    assert abs(biases.inheritance.mean() - 0.7) < 0.05
    again = policy.biases(squeezenet.graph, layout)
    assert np.array_equal(biases.means, again.means)  # the means: no sampling

    sampled, logprob, entropy = policy.distributions(squeezenet.graph, layout).sample()
    assert sampled.means.shape == (layout.size,) and logprob.requires_grad
    assert np.isfinite(float(logprob.detach())) and np.isfinite(float(entropy.detach()))


def test_train_regal_writes_a_loadable_run(regal_run, squeezenet):
    config = yaml.safe_load((regal_run / "config.yaml").read_text())
    assert config["kind"] == "regal" and config["budget"] == 3 and config["hidden"] == 16
    progress = json.loads((regal_run / "progress.json").read_text())
    assert [entry["run"] for entry in progress["runs"]] == [1, 2]
    assert progress["updates_done"] == 2
    assert all(np.isfinite(entry["reward"]) for entry in progress["runs"])
    assert list(regal_run.glob(f"{EVENT_FILE_PREFIX}*"))
    assert not list(regal_run.rglob("*.tmp"))

    assert parse_regal(f"regal:{regal_run}") == regal_run
    policy = load_regal_policy(regal_run)
    assert policy.brkga_config.population == 3
    layout = start_layout(squeezenet)
    assert policy.biases(squeezenet.graph, layout).means.shape == (layout.size,)


def test_train_regal_reruns(tmp_path, capsys, network_config):
    out = tmp_path / "run"
    base = ("train-regal", *TINY, "--config", network_config, "--out", str(out))
    code, stdout, err = rlflow(capsys, *base, "--total-runs", "1", "--json")
    assert code == 0, err
    assert len(stdout.strip().splitlines()) == 1 and json.loads(stdout)["runs"] == 1
    before = {path: path.read_bytes() for path in out.rglob("*") if path.is_file()}

    changed = rlflow(capsys, *base, "--total-runs", "1", "--budget", "4")
    assert_one_line_error(changed, str(out), "budget 3 -> 4", "--force")
    assert {path: path.read_bytes() for path in out.rglob("*") if path.is_file()} == before

    code, stdout, err = rlflow(capsys, "train-regal", "--out", str(out), "--total-runs", "2")
    assert code == 0, err
    assert f"resuming {out} at run 1" in err and "trained 2 runs" in stdout

    code, stdout, err = rlflow(capsys, *base, "--total-runs", "1", "--budget", "4", "--force")
    assert code == 0, err
    assert yaml.safe_load((out / "config.yaml").read_text())["budget"] == 4
    assert json.loads((out / "progress.json").read_text())["runs_done"] == 1


def test_train_regal_refuses_another_kind_of_run(tmp_path, capsys):
    (tmp_path / "config.yaml").write_text("kind: ppo\n")
    result = rlflow(capsys, "train-regal", *TINY, "--out", str(tmp_path))
    assert_one_line_error(result, "holds a 'ppo' run", "--force")
    assert not (tmp_path / CHECKPOINT).exists()
    assert_one_line_error(rlflow(capsys, "train-regal", "--out", str(tmp_path / "new")), "--models")


def optimize(capsys, *args: str) -> dict:
    code, stdout, err = rlflow(capsys, "optimize", "squeezenet-1.1", *args, *QUICK, "--json")
    assert code == 0, err
    return json.loads(stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("method", ["brkga", "regal"])
def test_brkga_and_regal_through_optimize(method, regal_run, tmp_path, capsys):
    spelling = "brkga" if method == "brkga" else f"regal:{regal_run}"
    out = tmp_path / "out.onnx"
    flags = ("--method", spelling, "--budget", "4", "--seed", "2", "--start", "original")
    summary = optimize(capsys, *flags, "-o", str(out))
    assert summary["method"] == spelling and summary["seed"] == 2
    assert summary["expansions"] == 4 and summary["budget"] == 4
    assert summary["equivalent"] is True
    original = load_model(cached_path("squeezenet-1.1", "small"))
    report = check_equivalence(original, load_model(out))
    assert report.equivalent, report.reason


def test_brkga_and_regal_through_bench(regal_run, tmp_path, capsys):
    out = tmp_path / "report"
    argv = [
        "bench", "--models", "squeezenet-1.1", "--methods", "brkga", f"regal:{regal_run}",
        "--budget", "3", "--deploys", "offline", "--start", "original", *QUICK,
        "--out", str(out), "--json",
    ]  # fmt: skip
    code, stdout, err = rlflow(capsys, *argv)
    assert code == 0, err
    rows = json.loads(stdout.strip().splitlines()[-1])["rows"]
    assert {row["method"] for row in rows} == {"brkga", f"regal:{regal_run.name}"}
    assert all(row["equivalent"] for row in rows)


def test_bad_methods_are_one_line(tmp_path, capsys):
    base = ("optimize", "squeezenet-1.1", "-o", str(tmp_path / "o.onnx"), "--method")
    missing = tmp_path / "missing"
    assert_one_line_error(rlflow(capsys, *base, f"regal:{missing}"), "no such REGAL run")
    assert_one_line_error(rlflow(capsys, *base, "regal"), "expected regal:RUN_DIR")
    assert_one_line_error(rlflow(capsys, *base, "astar"), "unknown method 'astar'", "brkga")
    (tmp_path / "ppo").mkdir()
    (tmp_path / "ppo" / "config.yaml").write_text("kind: ppo\n")
    result = rlflow(capsys, *base, f"regal:{tmp_path / 'ppo'}")
    assert_one_line_error(result, "not a 'regal' run")
    assert not (tmp_path / "o.onnx").exists()


def test_train_regal_quick_errors_come_before_torch(tmp_path):
    from tests.cli.test_startup import loaded_by

    (tmp_path / "file").write_text("")
    code, loaded = loaded_by(
        "train-regal", "--models", "resnet-18", "--out", str(tmp_path / "file")
    )
    assert code == 2
    assert not loaded & {"torch", "torch_geometric", "onnxruntime"}, loaded

"""`rlflow train-advantage`: a loadable run from the tiny data, whose guide reads a candidate as
training did; reruns continue, other settings are refused unless forced; bad data is one line."""

from __future__ import annotations

import dataclasses
import json
import shutil

import numpy as np
import torch
import yaml

from rlflow.advantage.guide import load_guide
from rlflow.advantage.model import PERCENT
from rlflow.advantage.train import (
    CHECKPOINT,
    AdvantageSettings,
    examples,
    load_checkpoint,
    predict,
)
from rlflow.config import CONFIGS
from rlflow.graph import load_model
from rlflow.rewrite.session import RewriteSession
from rlflow.worldmodel.collect import collect
from rlflow.worldmodel.data import RolloutData
from rlflow.zoo import cached_path
from tests.advantage.conftest import MODEL, run_cli, tiny_settings, train_args


def test_a_run_holds_its_config_checkpoint_curves_and_held_out_error(advantage_run):
    run, summary = advantage_run
    assert summary["epochs"] == 3 and summary["cost"] == "analytic"
    assert summary["examples"] > summary["train_examples"] > 0
    held = summary["held_out"]
    assert held["examples"] == summary["examples"] - summary["train_examples"]
    assert held["mae"] >= 0 and held["baseline_mae"] >= 0
    config = yaml.safe_load((run / "config.yaml").read_text())
    assert config["kind"] == "advantage" and config["hops"] == 2 and config["data_digest"]
    state = load_checkpoint(run)
    assert state["epoch"] == 3 and state["held_out"] == held
    assert list(run.glob("events.out.tfevents.*"))


def test_the_guide_reads_a_candidate_as_training_did(advantage_data, advantage_run):
    """The first observation of the data is the model's original graph: the guide, given that
    graph and the sampled candidates, predicts what the network predicts on the examples."""
    run, _ = advantage_run
    guide = load_guide(run)
    data = RolloutData.load(advantage_data)
    slots = data.arrays["advantage_slots"][0]
    slots = slots[slots >= 0]
    graph = load_model(cached_path(MODEL, "small"))
    candidates = RewriteSession(graph).candidates()
    chosen = [candidates[slot] for slot in slots]
    rule_ids = [data.rule_names.index(candidate.rule.name) for candidate in chosen]
    np.testing.assert_array_equal(data.arrays["candidate_rules"][0][slots], rule_ids)
    expected = predict(guide.model, examples(data, guide.settings).items[: len(slots)]) / PERCENT
    np.testing.assert_allclose(guide(graph, chosen), expected, rtol=1e-5, atol=1e-7)
    every = guide(graph, candidates)
    assert every.shape == (len(candidates),) and np.isfinite(every).all()


def test_a_rerun_continues_and_other_settings_need_force(advantage_data, advantage_run, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(advantage_run[0], run)
    weights = load_checkpoint(run)["model"]

    code, stdout, stderr = run_cli(train_args(advantage_data, run, "--epochs", "4"))
    assert code == 0, stderr
    assert "held out" in stdout and "mean abs error" in stdout and f"guided:{run}" in stdout
    state = load_checkpoint(run)
    assert state["epoch"] == 4
    assert any(not torch.equal(weights[key], state["model"][key]) for key in weights)

    code, _, stderr = run_cli(train_args(advantage_data, run, "--hops", "1"))
    assert code == 2 and len(stderr.strip().splitlines()) == 1
    assert "hops 2 -> 1" in stderr and "--force" in stderr
    assert load_checkpoint(run)["epoch"] == 4  # untouched

    code, _, stderr = run_cli(
        train_args(advantage_data, run, "--hops", "1", "--epochs", "1", "--force")
    )
    assert code == 0, stderr
    assert load_checkpoint(run)["epoch"] == 1
    assert yaml.safe_load((run / "config.yaml").read_text())["hops"] == 1


def test_held_out_models_measure_the_error_on_graphs_never_trained_on(advantage_data, tmp_path):
    data = tmp_path / "two-models"
    collect(tiny_settings(models=[MODEL, "squeezenet-1.1"], episodes=6), data, progress=False)
    unseen = RolloutData.load(data)
    squeezenet = np.isin(unseen.arrays["obs_model"], [1])[:, None] & (
        unseen.arrays["advantage_slots"] >= 0
    )
    argv = train_args(data, tmp_path / "run", "--epochs", "1", "--holdout-models", "squeezenet-1.1")
    code, stdout, stderr = run_cli([*argv, "--json"])
    assert code == 0, stderr
    summary = json.loads(stdout.strip().splitlines()[-1])
    assert summary["held_out_models"] == ["squeezenet-1.1"]
    assert summary["held_out"]["examples"] == int(squeezenet.sum()) > 0
    assert summary["train_examples"] == summary["examples"] - int(squeezenet.sum()) > 0

    code, _, stderr = run_cli(
        train_args(advantage_data, tmp_path / "other", "--holdout-models", "bert")
    )
    assert code == 2 and "not among the data's models (resnet-18)" in stderr
    assert not (tmp_path / "other").exists()


def test_bad_data_and_foreign_runs_are_one_line(tmp_path):
    plain = tmp_path / "plain"
    collect(
        tiny_settings(candidate_samples=0, episodes=1, episodes_per_shard=1, max_episode_steps=2),
        plain,
        progress=False,
    )
    code, _, stderr = run_cli(train_args(plain, tmp_path / "run"))
    assert code == 2 and len(stderr.strip().splitlines()) == 1
    assert "--candidate-samples" in stderr and not (tmp_path / "run").exists()

    code, _, stderr = run_cli(train_args(tmp_path / "nowhere", tmp_path / "run"))
    assert code == 2 and "no such data directory" in stderr

    foreign = tmp_path / "ppo-run"
    foreign.mkdir()
    (foreign / "config.yaml").write_text("kind: ppo\n")
    tiny = tmp_path / "tiny"
    collect(
        tiny_settings(episodes=1, episodes_per_shard=1, max_episode_steps=2), tiny, progress=False
    )
    code, _, stderr = run_cli(train_args(tiny, foreign, "--force"))
    assert code == 2 and "holds a 'ppo' run" in stderr
    assert not (foreign / CHECKPOINT).exists()


def test_configs_advantage_yaml_mirrors_the_settings():
    values = yaml.safe_load((CONFIGS / "advantage.yaml").read_text())["train_advantage"]
    assert values == dataclasses.asdict(AdvantageSettings())

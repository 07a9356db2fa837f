"""World Models' loop (`rlflow train-wm-loop`): collect with random, then with the controller,
retrain, repeat; the held-out report of each world model, and dream-vs-real rank correlation."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import yaml

from rlflow.cli import main
from rlflow.errors import RlflowError
from rlflow.report import read_progress, real_env_steps
from rlflow.worldmodel.data import MANIFEST, RolloutData, read_manifest
from rlflow.worldmodel.heldout import heldout_report, rank_correlation, ranks
from rlflow.worldmodel.loop import LoopSettings, merge_rollouts
from rlflow.worldmodel.model import WorldModel
from rlflow.worldmodel.train import encode_all, evaluate_rnn

LOOP_CONFIG = {
    "collect": {"episodes_per_shard": 4, "max_episode_steps": 6},
    "train_wm": {
        "latent": 4,
        "encoder_hidden": 16,
        "encoder_layers": 1,
        "encoder_heads": 2,
        "decoder_hidden": 16,
        "vae_epochs": 2,
        "rnn_hidden": 16,
        "mixtures": 2,
        "action_embedding": 4,
        "rnn_epochs": 2,
        "rnn_batch": 4,
        "holdout": 0.25,
    },
    "train_controller": {
        "temperatures": [0.5, 1.0],
        "max_steps": 6,
        "generations": 2,
        "population": 4,
        "rollouts": 2,
        "eval_dream_episodes": 4,
    },
}
"""Tiny everything: the point is that each stage of each iteration runs and is reported."""


def test_ranks_and_rank_correlation() -> None:
    np.testing.assert_array_equal(ranks([3.0, 1.0, 2.0, 1.0]), [4.0, 1.5, 3.0, 1.5])
    assert rank_correlation([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert rank_correlation([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    assert rank_correlation([1, 2], [1, 2]) is None  # too few to rank
    assert rank_correlation([1, 2, 3], [5, 5, 5]) is None  # the real side says nothing


def test_heldout_report_of_the_pipeline_world_model(pipeline) -> None:
    world = WorldModel.load(pipeline.wm)
    data = RolloutData.load(pipeline.data)
    report = heldout_report(world, data, [0, 1, 2])
    assert report["episodes"] == 3 and report["steps"] == int(
        data.arrays["episode_steps"][:3].sum()
    )
    assert np.isfinite(report["latent_nll"])
    for key in ("done_accuracy", "mask_accuracy", "mask_exact"):
        assert report[key] is None or 0.0 <= report[key] <= 1.0, key
    assert 0.0 <= report["cost_ratio_mae"] <= report["cost_ratio_max_error"]
    # the same NLL as train-wm's own evaluation of M (teacher forcing with V's means)
    mu, _ = encode_all(world.vae, data)
    expected = evaluate_rnn(world.rnn, data, np.array([0, 1, 2]), mu)["mdn_nll"]
    assert report["latent_nll"] == pytest.approx(expected, rel=1e-5)


def test_merge_rollouts_links_every_shard_in_order(pipeline, tmp_path) -> None:
    merged = merge_rollouts([pipeline.data, pipeline.data], tmp_path / "all")
    data, once = RolloutData.load(merged), RolloutData.load(pipeline.data)
    assert data.num_episodes == 2 * once.num_episodes
    np.testing.assert_array_equal(
        data.arrays["episode_return"], np.tile(once.arrays["episode_return"], 2)
    )
    manifest = read_manifest(merged)
    assert manifest["totals"]["episodes"] == 2 * once.num_episodes
    before = {path.name: path.stat().st_ino for path in merged.iterdir()}
    merge_rollouts([pipeline.data, pipeline.data], tmp_path / "all")  # already there: kept
    assert {path.name: path.stat().st_ino for path in merged.iterdir()} == before


def tiny_loop(tmp_path, *flags: str) -> tuple[list[str], Path]:
    """`rlflow train-wm-loop` on resnet-18 with LOOP_CONFIG and `flags`; argv and LOOP_DIR."""
    config = tmp_path / "loop.yaml"
    config.write_text(yaml.safe_dump(LOOP_CONFIG))
    out = tmp_path / "loop"
    argv = ["train-wm-loop", "--model", "resnet-18", "--out", str(out), "--config", str(config)]
    return [*argv, "--quiet", *flags], out


def test_two_iterations_collect_with_the_controller_and_report(tmp_path, capsys) -> None:
    argv, out = tiny_loop(
        tmp_path, "--iterations", "2", "--episodes", "8", "--controller-episodes", "3"
    )
    assert main([*argv, "--json"]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    first, second = summary["iterations"]
    assert first["policy"] == "random"
    assert second["policy"].startswith("agent:") and second["policy"].endswith("controller")
    # 8 random episodes, then 3 with the controller; each world model trained on all so far
    assert (first["data_episodes"], second["data_episodes"]) == (8, 11)
    assert read_manifest(out / "iter-1" / "data")["settings"]["policy"] == second["policy"]
    for entry in (first, second):
        assert len(entry["controllers"]) == 2
        assert entry["heldout"]["steps"] >= 1 and np.isfinite(entry["heldout"]["latent_nll"])
    assert first["heldout_next"]["episodes"] == 3  # world model 0 on the controller's data
    assert second["heldout_next"] is None
    assert summary["controllers_ranked"] == 4
    rho = summary["dream_real_rank_correlation"]
    assert rho is None or -1.0 <= rho <= 1.0
    assert summary["real_env_steps"] >= first["collected"]["steps"] + second["collected"]["steps"]
    assert (out / "iterations.png").is_file() and (out / "loop.json").is_file()

    # a rerun finds every iteration done and prints the table without redoing any
    stamp = (out / "iter-1" / "report.json").stat().st_mtime_ns
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "Spearman rho" in printed and "latent NLL" in printed
    assert (out / "iter-1" / "report.json").stat().st_mtime_ns == stamp


def test_the_first_round_can_draw_rules_evenly(tmp_path, capsys) -> None:
    argv, out = tiny_loop(tmp_path, "--iterations", "2", "--episodes", "4")
    rules = ["--random-policy", "random-rule", "--rule-repeat", "0.5"]
    assert main([*argv, *rules, "--controller-episodes", "1", "--json"]) == 0
    first, _ = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["iterations"]
    assert first["policy"] == "random-rule"
    settings = read_manifest(out / "iter-0" / "data")["settings"]
    assert (settings["policy"], settings["rule_repeat"]) == ("random-rule", 0.5)
    # rule runs are the random agent's: the controller's round collects without them
    assert "rule_repeat" not in read_manifest(out / "iter-1" / "data")["settings"]
    # the loop's data came from that agent: a rerun asking for the other one is refused
    assert main([*argv, "--controller-episodes", "1"]) == 2
    assert "made with other settings (collect differ)" in capsys.readouterr().err


def test_an_explorer_collects_the_next_rounds_data(tmp_path, capsys) -> None:
    """`--explore-uncertainty`: round 1 collects with a controller trained in round 0's world
    model with the charge turned into a bonus, not with round 0's controller; with
    `--eval-real last` round 0's controllers never run in the real env either."""
    flags = ["--iterations", "2", "--episodes", "4", "--controller-episodes", "2"]
    argv, out = tiny_loop(tmp_path, *flags, "--ensemble", "2", "--explore-uncertainty", "-1")
    assert main([*argv, "--eval-real", "last", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    first, second = summary["iterations"]
    explorer = out / "iter-0" / "explorer"
    assert second["policy"] == f"agent:{explorer.resolve()}"
    assert read_manifest(out / "iter-1" / "data")["settings"]["policy"] == second["policy"]
    assert second["data_episodes"] == 6
    config = yaml.safe_load((explorer / "config.yaml").read_text())
    assert config["uncertainty"] == -1.0 and config["select"] == "temperature"
    assert config["temperatures"] == [config["temperature"]]
    assert sorted(path.name for path in explorer.glob("tau-*")) == ["tau-1"]
    assert not (explorer / "eval.json").exists()  # it collects; it is never evaluated
    # the kept controllers are charged as asked (the config's default), not the explorer's way
    kept = yaml.safe_load((out / "iter-1" / "controller" / "config.yaml").read_text())
    assert kept["uncertainty"] == 1.0
    # only the last round's controllers ran in the real env: round 0's have dream returns only,
    # and the loop's real steps are the data's and the last evaluation's
    assert not (out / "iter-0" / "controller" / "eval.json").exists()
    assert (out / "iter-1" / "controller" / "eval.json").is_file()
    assert [row["real_return"] for row in first["controllers"]] == [None, None]
    assert all(np.isfinite(row["dream_return"]) for row in first["controllers"])
    assert first["eval_real_env_steps"] == 0 and second["eval_real_env_steps"] >= 1
    assert all(row["real_return"] is not None for row in second["controllers"])
    assert summary["controllers_ranked"] == 2
    collected = first["collected"]["steps"] + second["collected"]["steps"]
    assert summary["real_env_steps"] == collected + second["eval_real_env_steps"]
    assert (out / "iterations.png").is_file()
    # each controller's progress.json counts the real steps behind it, as bench reads them
    progress = [out / f"iter-{k}" / "controller" / "progress.json" for k in (0, 1)]
    assert real_env_steps(read_progress(progress[0].parent)) == first["collected"]["steps"]
    last = read_progress(progress[1].parent)
    assert real_env_steps(last) == summary["real_env_steps"]
    assert last["real_measurements"] == summary["real_measurements"]
    assert "speedup" not in read_progress(progress[0].parent)  # never ran in the real env
    assert last["real_return"] in [row["real_return"] for row in second["controllers"]]
    progress[0].unlink()  # a loop made before the file: a rerun writes it, redoing nothing
    stamp = (out / "iter-1" / "report.json").stat().st_mtime_ns
    assert main([*argv, "--eval-real", "last"]) == 0
    assert real_env_steps(read_progress(progress[0].parent)) == first["collected"]["steps"]
    assert (out / "iter-1" / "report.json").stat().st_mtime_ns == stamp
    # the loop's data came from that explorer: a rerun without it is refused
    assert main(argv[:-2]) == 2
    assert "made with other settings" in capsys.readouterr().err


def test_loop_errors_are_one_line(tmp_path, capsys) -> None:
    out = tmp_path / "loop"
    argv = ["train-wm-loop", "--model", "resnet-18", "--out", str(out)]
    assert main([*argv, "--iterations", "0"]) == 2
    assert "--iterations must be at least 1" in capsys.readouterr().err
    assert main([*argv, "--controller-episodes", "0"]) == 2
    assert "--controller-episodes must be at least 1" in capsys.readouterr().err
    assert main([*argv, "--ray-address", "auto"]) == 2
    assert "--ray-address needs --backend ray" in capsys.readouterr().err
    assert main([*argv, "--max-candidates", "0"]) == 2
    assert "--max-candidates must be at least 1" in capsys.readouterr().err
    by_speedup = tmp_path / "speedup.yaml"
    by_speedup.write_text("train_controller:\n  select: speedup\n")
    assert main([*argv, "--config", str(by_speedup)]) == 2  # picks by timings it never takes
    assert "run the loop with --measure" in capsys.readouterr().err
    assert main([*argv, "--ensemble", "1", "--explore-uncertainty", "-1"]) == 2
    assert "--explore-uncertainty needs an ensemble" in capsys.readouterr().err
    with pytest.raises(RlflowError, match="bad --eval-real 'first'"):
        LoopSettings(eval_real="first").validate()  # the API's; the CLI's choices refuse it
    assert main([*argv, "--rule-repeat", "0.5"]) == 2  # RLFlow's agent draws no rules
    assert "--rule-repeat needs a rule-level agent" in capsys.readouterr().err
    assert not out.exists()

    base = {"kind": "rollouts", "settings": {"policy": "random"}, "shards": {}}
    sources = []
    for name, rules in (("good", ["a"]), ("other", ["b"])):
        (tmp_path / name).mkdir()
        (tmp_path / name / MANIFEST).write_text(json.dumps({**base, "rule_names": rules}))
        sources.append(tmp_path / name)
    with pytest.raises(RlflowError, match="another env"):
        merge_rollouts(sources, tmp_path / "all")

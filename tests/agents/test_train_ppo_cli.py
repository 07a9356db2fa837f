"""`rlflow train-ppo` end to end: a tiny run, a killed run that a rerun continues, errors.

Runs `rlflow.cli.main` in this process (torch is already imported here), except the run that
has to be killed, which is a real subprocess.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import yaml

from rlflow.agents.ppo import CHECKPOINT, load_checkpoint
from rlflow.cli import main

TINY = (
    "--model", "resnet-18", "--max-candidates", "4", "--horizon", "5", "--no-progress",
    "--cost", "analytic", "--deploy", "online",  # the ablation: nothing measured
)  # fmt: skip


def rlflow(capsys, *args: str) -> tuple[int, str, str]:
    """Exit code, stdout and stderr of `rlflow ARGS`."""
    capsys.readouterr()
    code = main(list(args))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def assert_one_line_error(result: tuple[int, str, str], *needles: str) -> None:
    code, _, err = result
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("rlflow: error:"), err
    for needle in needles:
        assert needle in lines[0]


def test_tiny_run_json_and_flags_override_the_config(tmp_path, capsys) -> None:
    config = tmp_path / "ppo.yaml"
    config.write_text("episodes_per_update: 2\nhidden: 16\nheads: 2\nlayers: 1\nhorizon: 50\n")
    out = tmp_path / "run"
    flags = ("--total-steps", "12", "--config", str(config), "--json", "--mask-revisits")
    code, stdout, stderr = rlflow(capsys, "train-ppo", *TINY, "--out", str(out), *flags)
    assert code == 0, stderr
    summary = json.loads(stdout.strip().splitlines()[-1])
    assert summary["global_step"] == 12 and summary["resumed"] is False
    assert f"tensorboard --logdir {out}" in stderr
    saved = yaml.safe_load((out / "config.yaml").read_text())
    assert saved["kind"] == "ppo" and saved["horizon"] == 5  # the flag beat the file
    assert saved["hidden"] == 16 and saved["episodes_per_update"] == 2
    assert saved["mask_revisits"] is True and saved["revisit_penalty"] == 0.0
    assert (out / CHECKPOINT).is_file()
    assert not [p for p in out.rglob("*.tmp")]

    # without --model or --config, a rerun takes RUN_DIR's config and continues
    code, stdout, stderr = rlflow(capsys, "train-ppo", "--out", str(out), "--total-steps", "15")
    assert code == 0, stderr
    assert f"resuming {out} at step 12" in stderr and "trained 15 steps" in stdout


def test_killed_run_resumes_from_its_checkpoint(tmp_path, capsys) -> None:
    out = tmp_path / "run"
    config = tmp_path / "ppo.yaml"
    config.write_text("episodes_per_update: 1\nhidden: 16\nheads: 2\nlayers: 1\n")
    command = [sys.executable, "-m", "rlflow.cli", "train-ppo", *TINY, "--out", str(out)]
    process = subprocess.Popen(
        [*command, "--config", str(config), "--total-steps", "100000"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 240
        while not (out / CHECKPOINT).exists():
            assert process.poll() is None, "training ended before its first checkpoint"
            assert time.monotonic() < deadline, "no checkpoint written"
            time.sleep(0.2)
    finally:
        os.kill(process.pid, signal.SIGKILL)
        process.wait()
    killed_at = load_checkpoint(out)["global_step"]
    assert 0 < killed_at < 100000

    flags = ("--total-steps", str(killed_at + 10), "--resume", "--json")
    code, stdout, stderr = rlflow(capsys, "train-ppo", "--out", str(out), *flags)
    assert code == 0, stderr
    summary = json.loads(stdout.strip().splitlines()[-1])
    assert summary["resumed"] is True and summary["global_step"] == killed_at + 10
    assert f"resuming {out} at step {killed_at}" in stderr
    progress = json.loads((out / "progress.json").read_text())
    assert progress["updates"][-1]["global_step"] == killed_at + 10
    assert all(e["global_step"] <= killed_at + 10 for e in progress["episodes"])


def test_errors_are_one_line(tmp_path, capsys) -> None:
    out = tmp_path / "run"
    resume = rlflow(capsys, "train-ppo", *TINY, "--out", str(out), "--resume")
    assert_one_line_error(resume, "no PPO checkpoint")
    assert_one_line_error(rlflow(capsys, "train-ppo", "--out", str(out)), "--model")

    (out / CHECKPOINT).parent.mkdir(parents=True)
    (out / CHECKPOINT).write_bytes(b"garbage")
    corrupt = rlflow(capsys, "train-ppo", *TINY, "--out", str(out))
    assert_one_line_error(corrupt, "cannot read checkpoint", str(out / CHECKPOINT))

    config = tmp_path / "ppo.yaml"
    config.write_text("learning_rat: 0.1\n")
    misspelt = rlflow(
        capsys, "train-ppo", *TINY, "--out", str(tmp_path / "new"), "--config", str(config)
    )
    assert_one_line_error(misspelt, "learning_rat")
    zero = rlflow(capsys, "train-ppo", *TINY, "--out", str(tmp_path / "new"), "--total-steps", "0")
    assert_one_line_error(zero, "total_steps")
    negative = rlflow(
        capsys, "train-ppo", *TINY, "--out", str(tmp_path / "new"), "--revisit-penalty", "-1"
    )
    assert_one_line_error(negative, "revisit_penalty")


def test_the_command_knows_where_checkpoints_are() -> None:
    from rlflow.commands import train_ppo

    assert train_ppo.CHECKPOINT == CHECKPOINT


def test_init_from_fine_tunes_another_runs_network(tmp_path, capsys) -> None:
    """--init-from: a fresh run on another model starts from the source run's weights (with a
    learning rate of 0 it ends on them exactly; without --init-from it does not), and is
    refused for a missing checkpoint or a network of another shape."""
    net = "episodes_per_update: 2\nhidden: 16\nheads: 2\nlayers: 1\n"
    (tmp_path / "ppo.yaml").write_text(net)
    (tmp_path / "frozen.yaml").write_text(net + "learning_rate: 0.0\n")
    source = tmp_path / "source"
    code, _, err = rlflow(capsys, "train-ppo", *TINY, "--config", str(tmp_path / "ppo.yaml"),
                          "--total-steps", "10", "--out", str(source))  # fmt: skip
    assert code == 0, err
    trained = load_checkpoint(source)["model"]
    frozen = ("--config", str(tmp_path / "frozen.yaml"), "--model", "squeezenet-1.1")
    for out, init in ((tmp_path / "tuned", ("--init-from", str(source))), (tmp_path / "fresh", ())):
        code, _, err = rlflow(
            capsys, "train-ppo", *TINY, *frozen, "--total-steps", "10", *init, "--out", str(out)
        )
        assert code == 0, err
    tuned, fresh = load_checkpoint(tmp_path / "tuned"), load_checkpoint(tmp_path / "fresh")
    assert all((tuned["model"][name] == tensor).all() for name, tensor in trained.items())
    assert not all((fresh["model"][name] == tensor).all() for name, tensor in trained.items())
    saved = yaml.safe_load((tmp_path / "tuned" / "config.yaml").read_text())
    assert saved["init_from"] == str(source) and saved["models"] == ["squeezenet-1.1"]

    missing = ("--init-from", str(tmp_path / "none"), "--out", str(tmp_path / "x"))
    assert_one_line_error(
        rlflow(capsys, "train-ppo", *TINY, *missing), "--init-from: no PPO checkpoint"
    )
    other_shape = ("--init-from", str(source), "--out", str(tmp_path / "y"))
    assert_one_line_error(
        rlflow(capsys, "train-ppo", *TINY, *other_shape),
        "its network has another shape",
        "hidden 16, this run 64",
    )


def test_demo_flag_imitates_a_recorded_episode_and_refuses_a_file_without_one(
    tmp_path, capsys
) -> None:
    from tests.agents.test_demos import record_walk

    demo = tmp_path / "walk.json"
    record_walk(demo, steps=2)
    out = tmp_path / "run"
    flags = ("--total-steps", "5", "--demo", str(demo), "--demo-epochs", "3")
    code, _, stderr = rlflow(
        capsys, "train-ppo", *TINY, "--out", str(out), *flags, "--demo-coef", "0.5"
    )
    assert code == 0, stderr
    assert "imitated 1 demo(s): 2 of 2 recorded steps" in stderr
    saved = yaml.safe_load((out / "config.yaml").read_text())
    assert saved["demos"] == [str(demo)] and saved["demo_epochs"] == 3
    assert saved["demo_coef"] == 0.5
    result = rlflow(capsys, "train-ppo", *TINY, "--out", str(tmp_path / "y"), "--demo-coef", "1")
    assert_one_line_error(result, "demo_coef keeps imitating demos: give them")

    empty = tmp_path / "empty.json"
    empty.write_text("[]")
    result = rlflow(capsys, "train-ppo", *TINY, "--out", str(tmp_path / "x"), "--demo", str(empty))
    assert_one_line_error(result, "holds no episode")
    assert not (tmp_path / "x").exists()

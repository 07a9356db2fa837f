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
    flags = ("--total-steps", "12", "--config", str(config), "--json")
    code, stdout, stderr = rlflow(capsys, "train-ppo", *TINY, "--out", str(out), *flags)
    assert code == 0, stderr
    summary = json.loads(stdout.strip().splitlines()[-1])
    assert summary["global_step"] == 12 and summary["resumed"] is False
    assert f"tensorboard --logdir {out}" in stderr
    saved = yaml.safe_load((out / "config.yaml").read_text())
    assert saved["kind"] == "ppo" and saved["horizon"] == 5  # the flag beat the file
    assert saved["hidden"] == 16 and saved["episodes_per_update"] == 2
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


def test_the_command_knows_where_checkpoints_are() -> None:
    from rlflow.commands import train_ppo

    assert train_ppo.CHECKPOINT == CHECKPOINT

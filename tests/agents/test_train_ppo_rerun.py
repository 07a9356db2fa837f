"""`rlflow train-ppo` rerun on an existing run with other settings: one line naming them, exit 2,
the run untouched (it used to continue silently and rewrite config.yaml); `--force` starts the
run over with the new settings; raising --total-steps still continues it."""

from __future__ import annotations

import json

import pytest
import yaml

from rlflow.agents.ppo import CHECKPOINT, load_checkpoint
from tests.agents.test_train_ppo_cli import TINY, assert_one_line_error, rlflow


def snapshot(run_dir) -> dict:
    return {path: path.read_bytes() for path in run_dir.rglob("*") if path.is_file()}


def test_rerun_with_other_settings(tmp_path, capsys) -> None:
    out = tmp_path / "run"
    code, _, err = rlflow(capsys, "train-ppo", *TINY, "--out", str(out), "--total-steps", "6")
    assert code == 0, err
    before = snapshot(out)

    changed = rlflow(capsys, "train-ppo", *TINY, "--out", str(out), "--horizon", "7", "--seed", "3")
    assert_one_line_error(changed, str(out), "horizon 5 -> 7", "seed 0 -> 3", "--force")
    assert snapshot(out) == before

    code, stdout, err = rlflow(capsys, "train-ppo", "--out", str(out), "--total-steps", "9")
    assert code == 0, err
    assert f"resuming {out} at step 6" in err and "trained 9 steps" in stdout

    flags = ("--horizon", "7", "--total-steps", "4", "--force", "--json")
    code, stdout, err = rlflow(capsys, "train-ppo", *TINY, "--out", str(out), *flags)
    assert code == 0, err
    summary = json.loads(stdout)
    assert summary["resumed"] is False and summary["global_step"] == 4
    assert yaml.safe_load((out / "config.yaml").read_text())["horizon"] == 7
    assert load_checkpoint(out)["config"]["horizon"] == 7
    progress = json.loads((out / "progress.json").read_text())
    assert all(entry["global_step"] <= 4 for entry in progress["episodes"])
    assert (out / CHECKPOINT).is_file()


def test_force_and_resume_contradict(tmp_path, capsys) -> None:
    with pytest.raises(SystemExit) as exit_info:
        rlflow(capsys, "train-ppo", *TINY, "--out", str(tmp_path), "--force", "--resume")
    assert exit_info.value.code == 2
    assert "not allowed with argument" in capsys.readouterr().err

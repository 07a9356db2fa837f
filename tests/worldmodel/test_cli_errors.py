"""Bad input to collect / train-wm / train-controller ends in one line and exit code 2; the
config file mirrors the settings dataclasses; reruns resume."""

from __future__ import annotations

import dataclasses
import shutil

import pytest
import yaml

from rlflow.cli import main
from rlflow.config import DEFAULT_CONFIG
from rlflow.worldmodel.collect import CollectSettings
from rlflow.worldmodel.controller import ControllerSettings
from rlflow.worldmodel.train import WorldModelSettings
from tests.worldmodel.conftest import rlflow


def one_line_error(capsys, argv: list[str], *needles: str) -> str:
    code = main(argv)
    err = capsys.readouterr().err
    lines = [line for line in err.strip().splitlines() if line]
    assert code == 2, err
    assert len(lines) == 1, err
    assert lines[0].startswith("rlflow: error:")
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


def test_missing_data_dir_is_one_line_in_a_subprocess(tmp_path):
    result = rlflow("train-wm", "--data", str(tmp_path / "nothing"), "--out", str(tmp_path / "wm"))
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        f"rlflow: error: no such data directory: {tmp_path / 'nothing'} "
        "(make one with `rlflow collect`)"
    ]
    assert not (tmp_path / "wm").exists()


def test_train_wm_bad_data(capsys, tmp_path, pipeline):
    empty = tmp_path / "empty"
    empty.mkdir()
    one_line_error(
        capsys, ["train-wm", "--data", str(empty), "--out", str(tmp_path / "a")], "manifest.json"
    )
    broken = tmp_path / "broken"
    shutil.copytree(pipeline.data, broken)
    (broken / "shard-00001.npz").write_bytes(b"not a zip")
    one_line_error(
        capsys,
        ["train-wm", "--data", str(broken), "--out", str(tmp_path / "b"), "--quiet"],
        "shard-00001.npz",
        "unreadable",
    )
    (broken / "shard-00001.npz").unlink()
    one_line_error(
        capsys,
        ["train-wm", "--data", str(broken), "--out", str(tmp_path / "c"), "--quiet"],
        "missing",
    )


def test_train_controller_bad_world_model(capsys, tmp_path, pipeline):
    one_line_error(
        capsys,
        ["train-controller", "--wm", str(tmp_path / "none"), "--out", str(tmp_path / "c")],
        "no such world-model run directory",
    )
    corrupt = tmp_path / "wm"
    shutil.copytree(pipeline.wm, corrupt)
    (corrupt / "mdnrnn.pt").write_bytes(b"\x00garbage")
    one_line_error(
        capsys,
        ["train-controller", "--wm", str(corrupt), "--out", str(tmp_path / "d")],
        "mdnrnn.pt",
        "unreadable",
    )
    (corrupt / "vae.pt").unlink()
    one_line_error(
        capsys,
        ["train-controller", "--wm", str(corrupt), "--out", str(tmp_path / "e")],
        "vae.pt",
        "missing",
    )


def test_bad_settings_and_flags(capsys, tmp_path, pipeline):
    bad = tmp_path / "bad.yaml"
    bad.write_text("train_controller:\n  generashuns: 3\n")
    one_line_error(
        capsys,
        [
            "train-controller",
            "--wm",
            str(pipeline.wm),
            "--out",
            str(tmp_path / "x"),
            "--config",
            str(bad),
        ],
        "unknown setting(s) generashuns",
    )
    one_line_error(
        capsys,
        ["train-controller", "--wm", str(pipeline.wm), "--out", str(tmp_path / "s")]
        + ["--select", "speedup", "--eval-real", "--no-measure"],
        "measured end-to-end speedup",
        "drop --no-measure",
    )
    assert not (tmp_path / "s").exists()
    bad.write_text("train_wm:\n  latent: many\n")
    one_line_error(
        capsys,
        [
            "train-wm",
            "--data",
            str(pipeline.data),
            "--out",
            str(tmp_path / "y"),
            "--config",
            str(bad),
        ],
        "latent must be int",
    )
    one_line_error(
        capsys,
        ["collect", "--model", "resnet-18", "--episodes", "0", "--out", str(tmp_path / "z")],
        "--episodes must be at least 1",
    )
    one_line_error(
        capsys,
        ["collect", "--model", "no-such-model", "--episodes", "1", "--out", str(tmp_path / "w")],
        "no-such-model",
    )
    one_line_error(
        capsys,
        ["collect", "--model", "resnet-18", "--policy", "ppo:", "--out", str(tmp_path / "v")],
        "bad --policy",
    )
    one_line_error(
        capsys,
        ["collect", "--model", "resnet-18", "--max-candidates", "0", "--out", str(tmp_path / "u")],
        "--max-candidates must be at least 1",
    )


def test_train_wm_rerun_resumes_and_refuses_other_settings(capsys, tmp_path, pipeline):
    run = tmp_path / "wm"
    shutil.copytree(pipeline.wm, run)
    before = {p.name: p.stat().st_mtime_ns for p in run.glob("*.pt")}
    assert (
        main(
            [
                "train-wm",
                "--data",
                str(pipeline.data),
                "--out",
                str(run),
                "--config",
                str(pipeline.config),
                "--quiet",
            ]
        )
        == 0
    )
    capsys.readouterr()
    assert {p.name: p.stat().st_mtime_ns for p in run.glob("*.pt")} == before  # all finished
    one_line_error(
        capsys,
        [
            "train-wm",
            "--data",
            str(pipeline.data),
            "--out",
            str(run),
            "--config",
            str(pipeline.config),
            "--latent",
            "16",
        ],
        "other settings (latent differ)",
    )


def test_config_file_mirrors_the_dataclasses():
    config = yaml.safe_load(DEFAULT_CONFIG.read_text())
    for name, cls in (
        ("collect", CollectSettings),
        ("train_wm", WorldModelSettings),
        ("train_controller", ControllerSettings),
    ):
        defaults = {
            field.name: field.default
            if field.default is not dataclasses.MISSING
            else field.default_factory()
            for field in dataclasses.fields(cls)
            if field.name != "models"
        }
        assert config[name] == defaults, name


@pytest.mark.parametrize("command", ["collect", "train-wm", "train-controller"])
def test_commands_are_registered(command, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main([command, "--help"])
    assert exit_info.value.code == 0
    assert "--out" in capsys.readouterr().out


def test_interrupted_train_wm_resumes_to_the_same_weights(capsys, tmp_path, pipeline):
    import torch

    def train(out, vae_epochs, rnn_epochs):
        argv = ["train-wm", "--data", str(pipeline.data), "--out", str(out), "--quiet"]
        argv += ["--config", str(pipeline.config), "--vae-epochs", str(vae_epochs)]
        assert main([*argv, "--rnn-epochs", str(rnn_epochs)]) == 0

    train(tmp_path / "straight", 3, 4)
    train(tmp_path / "resumed", 1, 2)  # as if stopped early
    train(tmp_path / "resumed", 3, 4)
    capsys.readouterr()
    for name in ("vae.pt", "mdnrnn.pt"):
        one = torch.load(tmp_path / "straight" / name, weights_only=True)["model"]
        two = torch.load(tmp_path / "resumed" / name, weights_only=True)["model"]
        for key in one:
            torch.testing.assert_close(one[key], two[key], rtol=0, atol=0, msg=f"{name} {key}")

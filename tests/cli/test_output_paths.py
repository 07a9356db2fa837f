"""Every command checks where it will write before it starts its work: an output that names a
directory (or a file where a directory is wanted), sits under a file, or cannot be written is one
line and exit 2 at once, with nothing written, instead of an IsADirectoryError at the end."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.cli.test_errors import assert_one_line_error, rlflow

QUICK = ("--min-time", "0.05", "--no-peer")


def listing(folder: Path) -> list[str]:
    return sorted(str(path.relative_to(folder)) for path in folder.rglob("*"))


@pytest.fixture
def model(tmp_path, mlp_model) -> Path:
    path = tmp_path / "mlp.onnx"
    path.write_bytes(mlp_model.SerializeToString())
    return path


@pytest.mark.parametrize("command", ["optimize", "search"])
def test_model_output_naming_a_directory(tmp_path, model, command):
    out = tmp_path / "existing"
    out.mkdir()
    before = listing(tmp_path)
    result = rlflow(command, str(model), "--method", "greedy", "-o", str(out), *QUICK)
    # One line only: the search never started (it would announce itself and draw a bar).
    assert_one_line_error(result, f"-o {out} is a directory")
    assert listing(tmp_path) == before


def test_model_output_under_a_file(tmp_path, model):
    out = tmp_path / "mlp.onnx" / "out.onnx"
    result = rlflow("optimize", str(model), "-o", str(out), *QUICK)
    assert_one_line_error(result, f"{model} is not a directory")


def test_model_output_in_an_unwritable_folder(tmp_path, model):
    folder = Path("/sys")
    if not folder.is_dir():
        pytest.skip("no /sys to stand for a folder nobody may write in")
    out = folder / "rlflow-test" / "out.onnx"
    result = rlflow("optimize", str(model), "-o", str(out), *QUICK)
    assert_one_line_error(result, "cannot write in /sys")
    assert not out.parent.exists()


def test_missing_output_folders_are_still_made(tmp_path, model):
    out = tmp_path / "new" / "deeper" / "out.onnx"
    result = rlflow("optimize", str(model), "--method", "greedy", "-o", str(out), *QUICK)
    assert result.returncode == 0, result.stderr
    assert out.is_file()


def test_zoo_export_to_a_directory(tmp_path):
    result = rlflow("zoo", "export", "resnet-18", "-o", str(tmp_path))
    assert_one_line_error(result, f"-o {tmp_path} is a directory")
    assert listing(tmp_path) == []


def test_rules_generate_to_a_directory_fails_before_generating(tmp_path):
    result = rlflow("rules", "generate", "-o", str(tmp_path), "--max-ops", "1")
    assert_one_line_error(result, f"-o {tmp_path} is a directory")
    assert listing(tmp_path) == []


@pytest.mark.parametrize(
    "argv",
    [
        ["bench", "--models", "MODEL", "--methods", "greedy"],
        ["collect", "--model", "MODEL", "--episodes", "1"],
        ["train-wm", "--data", "DATA"],
        ["train-ppo", "--model", "MODEL"],
        ["train-controller", "--wm", "DATA"],
    ],
    ids=lambda argv: argv[0],
)
def test_run_directory_naming_a_file(tmp_path, model, argv):
    out = tmp_path / "taken.txt"
    out.write_text("not a directory\n")
    data = tmp_path / "data"
    data.mkdir()
    words = [{"MODEL": str(model), "DATA": str(data)}.get(word, word) for word in argv]
    for target in (out, out / "run"):
        before = listing(tmp_path)
        result = rlflow(*words, "--out", str(target))
        needle = f"--out {out} exists and is not a directory" if target == out else "not a dir"
        assert_one_line_error(result, needle)
        assert listing(tmp_path) == before
        assert out.read_text() == "not a directory\n"

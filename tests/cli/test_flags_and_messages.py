"""Flags no setting means (nan, inf, zero counts) are one line naming the flag before any model
is loaded or searched; messages name the user's files and flags, not internal indices."""

from __future__ import annotations

import pytest
from onnx import helper

from rlflow.cli import build_parser
from rlflow.cost import Runner
from rlflow.errors import RlflowError
from rlflow.graph import load_model
from tests.cli.test_errors import assert_one_line_error, rlflow
from tests.conftest import make_model

# A model path that does not exist: the flag's error must come first, so it is the one shown.
MISSING = "missing.onnx"


BAD_VALUES = [
    ("--alpha", "nan"),
    ("--alpha", "inf"),
    ("--alpha", "0.5"),
    ("--min-time", "nan"),
    ("--min-time", "-0.5"),
    ("--threads", "0"),
    ("--budget", "0"),
    ("--episodes", "0"),
    ("--top-k", "0"),
]


@pytest.mark.parametrize(
    "command, flag, value",
    [
        (command, flag, value)
        for command in ("optimize", "bench")
        for flag, value in BAD_VALUES
        if (command, flag) != ("bench", "--alpha")  # bench runs taso at its default alpha
    ],
)
def test_searching_commands_reject_meaningless_flags_first(tmp_path, command, flag, value):
    out = tmp_path / "out"
    argv = {
        "optimize": ["optimize", MISSING, "-o", str(out)],
        "bench": ["bench", "--models", MISSING, "--methods", "greedy", "--out", str(out)],
    }[command]
    assert_one_line_error(rlflow(*argv, flag, value), f"{flag} must be", f"got {value}")
    assert not out.exists()


@pytest.mark.parametrize("flags", [["--runs", "0"], ["--threads", "0"]], ids=["runs", "threads"])
def test_measure_names_its_flag(flags):
    assert_one_line_error(rlflow("measure", MISSING, *flags), f"{flags[0]} must be")


def test_measure_vs_a_model_with_other_inputs_names_both_files(tmp_path, mlp_model):
    first, second = tmp_path / "mlp.onnx", tmp_path / "relu.onnx"
    first.write_bytes(mlp_model.SerializeToString())
    other = make_model([helper.make_node("Relu", ["x"], ["y"])], [("x", [2, 4])], ["y"])
    second.write_bytes(other.SerializeToString())
    result = rlflow("measure", str(first), "--vs", str(second), "--runs", "5")
    needle = f"--vs {second} does not take the same inputs as {first} (x: float32[2x8] against"
    assert_one_line_error(result, needle, "float32[2x4]")
    assert "model 1" not in result.stderr and "model 0" not in result.stderr


def test_runner_messages_say_what_is_wrong(mlp_model):
    with pytest.raises(RlflowError, match="the Runner's runs must be at least 1, got 0"):
        Runner(runs=0)
    with pytest.raises(RlflowError, match="the Runner's low_rank must be at least 1, got 0"):
        Runner(low_rank=0)
    other = make_model([helper.make_node("Relu", ["x"], ["y"])], [("x", [2, 4])], ["y"])
    with pytest.raises(RlflowError) as error:
        Runner(runs=1).compare([load_model(mlp_model), load_model(other)])
    assert str(error.value) == (
        "graphs compared must take the same inputs: graph 2 takes x: float[2x4], "
        "the first x: float[2x8]"
    )


@pytest.mark.parametrize(
    ("command", "dest", "extra"),
    [
        ("bench", "models", ["--out", "r"]),
        ("collect", "model", ["--out", "d"]),
        ("train-ppo", "model", ["--out", "r"]),
        ("train-regal", "models", ["--out", "r"]),
        ("train-wm-loop", "model", ["--out", "l"]),
        ("train-controller", "models", ["--wm", "w", "--out", "c"]),
    ],
)
@pytest.mark.parametrize("spelling", ["--model", "--models"])
def test_every_command_taking_models_reads_both_spellings(command, dest, extra, spelling):
    # Some commands grew --model and others --models; a user should not have to remember which.
    args = build_parser(command).parse_args([command, spelling, "bert", "vit-base", *extra])
    assert getattr(args, dest) == ["bert", "vit-base"]

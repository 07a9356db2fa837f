"""Tests for the model zoo: every model exports to a valid, static, runnable, deterministic ONNX
graph; the cache is reused; bad names fail with a one-line RlflowError; the medium size keeps the
full architecture's operators and every `--size` option of the CLI accepts every size."""

from __future__ import annotations

import argparse
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

import rlflow.fileio
from rlflow.cli import build_parser, main
from rlflow.commands.bench import resolve_options
from rlflow.errors import RlflowError
from rlflow.graph import load_model
from rlflow.zoo import MODEL_NAMES, SIZES, ZOO_VERSION, cached_path, describe, export, to_onnx

CNNS_WITH_BN = ("inception-v3", "resnext-50", "resnet-18", "resnet-50")


def _random_feeds(model: onnx.ModelProto, seed: int = 0) -> dict[str, np.ndarray]:
    """Random inputs for every graph input; integer inputs drawn from their metadata range."""
    props = {prop.key: prop.value for prop in model.metadata_props}
    rng = np.random.default_rng(seed)
    feeds = {}
    for graph_input in model.graph.input:
        tensor_type = graph_input.type.tensor_type
        shape = tuple(dim.dim_value for dim in tensor_type.shape.dim)
        if tensor_type.elem_type == onnx.TensorProto.INT64:
            low, high = map(int, props[f"rlflow.int_range.{graph_input.name}"].split(","))
            feeds[graph_input.name] = rng.integers(low, high, shape, dtype=np.int64)
        else:
            assert tensor_type.elem_type == onnx.TensorProto.FLOAT
            feeds[graph_input.name] = rng.standard_normal(shape).astype(np.float32)
    return feeds


def _run(path: Path, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def _assert_static(values: list[onnx.ValueInfoProto]) -> None:
    for value in values:
        dims = value.type.tensor_type.shape.dim
        assert dims, f"{value.name} has no shape"
        for dim in dims:
            assert dim.HasField("dim_value") and dim.dim_value > 0, f"{value.name}: {dims}"


def _check_model(name: str, size: str, path: Path) -> None:
    model = onnx.load(path)
    onnx.checker.check_model(model, full_check=True)
    _assert_static(list(model.graph.input) + list(model.graph.output))
    assert not any(node.op_type == "Constant" for node in model.graph.node)
    props = {prop.key: prop.value for prop in model.metadata_props}
    assert props["rlflow.zoo"] == f"{name}:{size}"
    for graph_input in model.graph.input:
        if graph_input.type.tensor_type.elem_type == onnx.TensorProto.INT64:
            assert f"rlflow.int_range.{graph_input.name}" in props
    if name in CNNS_WITH_BN:
        # Our conv+batchnorm rewrite needs the BN nodes the exporter would otherwise fold.
        assert any(node.op_type == "BatchNormalization" for node in model.graph.node)
    outputs = _run(path, _random_feeds(model))
    assert len(outputs) == 1 and np.isfinite(outputs[0]).all()
    assert outputs[0].std() > 1e-3  # random weights must not collapse the output to a constant


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_small_model_exports_checks_and_runs(name: str, tmp_path: Path) -> None:
    path = export(name, "small", tmp_path / f"{name}.onnx")
    _check_model(name, "small", path)
    assert len(onnx.load(path).graph.node) <= 300
    assert not list(tmp_path.glob("*.tmp")) and not list(tmp_path.glob("*.data"))


@pytest.mark.parametrize("name", ["bert", "resnet-18", "transformer-transducer"])
def test_export_is_deterministic(name: str, tmp_path: Path) -> None:
    first = export(name, "small", tmp_path / "first.onnx")
    second = export(name, "small", tmp_path / "second.onnx")
    assert first.read_bytes() == second.read_bytes()


def test_int_inputs_carry_their_range(tmp_path: Path) -> None:
    model = onnx.load(export("transformer-transducer", "small", tmp_path / "tt.onnx"))
    props = {prop.key: prop.value for prop in model.metadata_props}
    assert [i.name for i in model.graph.input] == ["audio_features", "labels"]
    assert props["rlflow.int_range.labels"] == "0,32"
    assert "rlflow.int_range.audio_features" not in props


def test_cached_path_exports_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RLFLOW_CACHE_DIR", str(tmp_path))
    path = cached_path("squeezenet-1.1")
    assert path.parent == tmp_path / "zoo"
    assert f"v{ZOO_VERSION}" in path.name and "small" in path.name
    mtime = path.stat().st_mtime_ns
    assert cached_path("squeezenet-1.1", "small") == path
    assert path.stat().st_mtime_ns == mtime
    assert [p.name for p in (tmp_path / "zoo").iterdir()] == [path.name]


def test_cache_dir_defaults_to_home(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("RLFLOW_CACHE_DIR", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    path = cached_path("resnet-18")
    assert path.parent == tmp_path / ".cache" / "rlflow" / "zoo"


def test_failed_export_leaves_no_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def killed_before_rename(source: str, target: object) -> None:
        assert Path(source).stat().st_size > 0  # the whole model was written, under a temp name
        raise KeyboardInterrupt

    monkeypatch.setattr(rlflow.fileio.os, "replace", killed_before_rename)
    with pytest.raises(KeyboardInterrupt):
        export("resnet-18", "small", tmp_path / "model.onnx")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "call",
    [
        lambda: export("resnet-1000", "small", "unused.onnx"),
        lambda: cached_path("resnet-1000"),
        lambda: describe("resnet-1000"),
        lambda: cached_path("resnet-18", "huge"),
    ],
)
def test_unknown_name_or_size_raises(call) -> None:
    with pytest.raises(RlflowError) as error:
        call()
    message = str(error.value)
    assert "\n" not in message
    assert "resnet-1000" in message or "huge" in message
    assert all(name in message for name in MODEL_NAMES) or "small, medium, full" in message


def test_names_and_descriptions() -> None:
    assert MODEL_NAMES == (
        "bert",
        "vit-base",
        "mini-dalle",
        "transformer-transducer",
        "inception-v3",
        "resnext-50",
        "squeezenet-1.1",
        "resnet-18",
        "resnet-50",
    )
    for name in MODEL_NAMES:
        line = describe(name)
        assert line and "\n" not in line
        assert "; medium: " in line and "rough" in line


def test_sizes() -> None:
    assert SIZES == ("small", "medium", "full")


def _size_options(parser: argparse.ArgumentParser, path: str = "rlflow"):
    """(command path, action) for every `--size` option under `parser`, subcommands included."""
    for action in parser._actions:
        if "--size" in action.option_strings:
            yield path, action
        if isinstance(action, argparse._SubParsersAction):
            for name, subparser in action.choices.items():
                yield from _size_options(subparser, f"{path} {name}")


def test_every_size_option_accepts_every_zoo_size(tmp_path: Path) -> None:
    options = dict(_size_options(build_parser()))
    # The commands that take a zoo model; each lists the sizes itself (no torch import at startup).
    for command in ("zoo export", "search", "optimize", "bench", "collect", "train-ppo"):
        assert f"rlflow {command}" in options, sorted(options)
    for path, action in options.items():
        assert tuple(action.choices) == SIZES, path
    args = build_parser().parse_args(["bench", "--out", str(tmp_path), "--size", "medium"])
    assert resolve_options(args)["size"] == "medium"  # the config-file check, too


def _op_types(model: onnx.ModelProto) -> set[str]:
    return set(Counter(node.op_type for node in model.graph.node))


def _check_medium(name: str, path: Path) -> onnx.ModelProto:
    """A medium export: valid, runnable, static in the IR, with exactly full's operator types."""
    _check_model(name, "medium", path)
    graph = load_model(path)
    for value in graph.values.values():
        assert all(dim > 0 for dim in value.shape), (value.name, value.shape)
    medium = onnx.load(path)
    assert _op_types(medium) == _op_types(to_onnx(name, "full"))
    return medium


# One transformer (two stacks, causal mask, joint network) and one CNN: ~5 s in all, full
# exports included. Every model is checked in the slow test below.
@pytest.mark.parametrize(
    ("name", "input_shapes"),
    [
        # the transformers keep full's sequence lengths
        ("transformer-transducer", {"audio_features": (1, 80, 80), "labels": (1, 16)}),
        # the CNNs are the full networks at half the input side
        ("resnet-18", {"image": (1, 3, 112, 112)}),
    ],
)
def test_medium_exports_through_the_cli(
    name: str, input_shapes: dict, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RLFLOW_CACHE_DIR", str(tmp_path / "cache"))
    path = tmp_path / f"{name}.onnx"
    assert main(["zoo", "export", name, "--size", "medium", "-o", str(path)]) == 0
    assert (tmp_path / "cache" / "zoo" / f"{name}-medium-v{ZOO_VERSION}.onnx").exists()
    medium = _check_medium(name, path)
    shapes = {
        value.name: tuple(dim.dim_value for dim in value.type.tensor_type.shape.dim)
        for value in medium.graph.input
    }
    assert shapes == input_shapes


@pytest.mark.slow
@pytest.mark.parametrize("name", MODEL_NAMES)
def test_full_model_exports_checks_and_runs(name: str, tmp_path: Path) -> None:
    path = export(name, "full", tmp_path / f"{name}.onnx")
    _check_model(name, "full", path)
    assert not list(tmp_path.glob("*.data"))  # one file: no external weights


@pytest.mark.slow
@pytest.mark.parametrize("name", MODEL_NAMES)
def test_medium_model_exports_checks_and_runs(name: str, tmp_path: Path) -> None:
    _check_medium(name, export(name, "medium", tmp_path / f"{name}.onnx"))

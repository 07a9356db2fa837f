"""Round trip: load, export, run in onnxruntime: the same outputs as the original model.

Covers the zoo (small sizes here, full sizes under -m slow) and ONNX files made by other
tools: a torch nn.Transformer and a torchvision-style CNN, exported with torch.onnx.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from torch import nn

from rlflow.graph import load_model
from tests.conftest import random_feeds, run_onnx


def assert_round_trip(path: Path, input_shapes=None, atol: float = 1e-5) -> None:
    original = onnx.load(str(path))
    graph = load_model(path, input_shapes)
    exported = graph.to_onnx()
    onnx.checker.check_model(exported, full_check=True)
    for seed in (0, 1):
        feeds = random_feeds(exported, seed)
        expected = run_onnx(original, feeds)
        actual = run_onnx(exported, feeds)
        assert len(expected) == len(actual)
        for want, got in zip(expected, actual):
            assert want.shape == got.shape
            np.testing.assert_allclose(got, want, rtol=0, atol=atol)


def export(module: nn.Module, args: tuple, path: Path, dynamo: bool, **kwargs) -> Path:
    module.eval()
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        torch.onnx.export(module, args, str(path), dynamo=dynamo, verbose=False, **kwargs)
    return path


class BasicBlock(nn.Module):
    """A torchvision-style residual block: conv-bn-relu-conv-bn + (downsampled) identity."""

    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.down = (
            nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))
            if stride != 1 or cin != cout
            else nn.Identity()
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(self.bn2(self.conv2(y)) + self.down(x))


class TinyResNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(3, 8, 3, 2, 1, bias=False), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2)
        )
        self.layers = nn.Sequential(BasicBlock(8, 8, 1), BasicBlock(8, 16, 2))
        self.head = nn.Linear(16, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.layers(self.stem(x))
        return self.head(torch.flatten(nn.functional.adaptive_avg_pool2d(y, 1), 1))


def randomise_batchnorm(module: nn.Module) -> None:
    for layer in module.modules():
        if isinstance(layer, nn.BatchNorm2d):
            layer.running_mean.uniform_(-0.5, 0.5)
            layer.running_var.uniform_(0.5, 1.5)


@pytest.mark.parametrize("dynamo", [False, True], ids=["torchscript", "dynamo"])
def test_torchvision_style_cnn_round_trips(tmp_path, dynamo):
    torch.manual_seed(0)
    model = TinyResNet()
    randomise_batchnorm(model)
    path = export(model, (torch.randn(1, 3, 32, 32),), tmp_path / "cnn.onnx", dynamo)
    assert_round_trip(path)


def test_torch_transformer_with_dynamic_axes_round_trips(tmp_path):
    """nn.Transformer exported with dynamic batch and sequence: needs --input-shape."""
    torch.manual_seed(0)
    model = nn.Transformer(
        d_model=32,
        nhead=4,
        num_encoder_layers=1,
        num_decoder_layers=1,
        dim_feedforward=64,
        dropout=0.0,
        batch_first=True,
    )
    src, tgt = torch.randn(2, 6, 32), torch.randn(2, 5, 32)  # batch 1 would be specialised
    batch, s, t = torch.export.Dim("batch"), torch.export.Dim("s"), torch.export.Dim("t")
    path = export(
        model,
        (src, tgt),
        tmp_path / "transformer.onnx",
        dynamo=True,
        input_names=["src", "tgt"],
        output_names=["out"],
        dynamic_shapes={"src": {0: batch, 1: s}, "tgt": {0: batch, 1: t}},
    )
    assert_round_trip(path, {"src": (2, 7, 32), "tgt": (2, 4, 32)}, atol=1e-4)
    graph = load_model(path, {"src": (2, 7, 32), "tgt": (2, 4, 32)})
    assert graph.outputs[0].shape == (2, 4, 32)
    assert "Shape" not in graph.op_counts()  # shape subgraphs were folded into constants


def test_torch_transformer_dynamo_round_trips(tmp_path):
    torch.manual_seed(0)
    model = nn.Transformer(
        d_model=32,
        nhead=4,
        num_encoder_layers=1,
        num_decoder_layers=1,
        dim_feedforward=64,
        dropout=0.0,
        batch_first=True,
    )
    path = export(
        model,
        (torch.randn(1, 6, 32), torch.randn(1, 5, 32)),
        tmp_path / "transformer.onnx",
        dynamo=True,
    )
    assert_round_trip(path, atol=1e-4)


def _zoo_names() -> tuple[str, ...]:
    from rlflow.zoo import MODEL_NAMES

    return MODEL_NAMES


@pytest.mark.parametrize("name", _zoo_names())
def test_small_zoo_model_round_trips(name):
    from rlflow.zoo import cached_path

    assert_round_trip(cached_path(name, "small"))


@pytest.mark.slow
@pytest.mark.parametrize("name", _zoo_names())
def test_full_zoo_model_round_trips(name):
    from rlflow.zoo import cached_path

    assert_round_trip(cached_path(name, "full"))

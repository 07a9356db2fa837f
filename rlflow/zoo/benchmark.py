"""What a zoo builder returns (module + example inputs), and the shared weight initialisation.

Weights are random but chosen so that rewrites are tested on meaningful numbers: norm scales
and shifts are not the identity, and BatchNorm running statistics are calibrated on random
images and then perturbed, so folding a BatchNorm into a Conv changes every weight and the
activations of deep networks neither vanish nor explode.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor, nn


@dataclass
class Benchmark:
    """A built model ready for export, at one size."""

    module: nn.Module
    """The network, in eval mode."""
    inputs: dict[str, Tensor]
    """Example inputs in ``forward`` order; the keys become the ONNX input names."""
    output: str
    """The ONNX name of the single output."""
    int_ranges: dict[str, tuple[int, int]] = field(default_factory=dict)
    """For each integer input, the valid values as ``(low, high)``, high exclusive."""


def randomize_norms(module: nn.Module) -> None:
    """Give every LayerNorm/BatchNorm a random affine transform instead of (1, 0).

    Identity norms would make norm-related rewrites look exact by accident, and identical
    initializers are merged by the exporter into one tensor read through Identity nodes.
    """
    with torch.no_grad():
        for norm in module.modules():
            if isinstance(norm, nn.LayerNorm | nn.BatchNorm2d) and norm.weight is not None:
                norm.weight.uniform_(0.5, 1.5)
                norm.bias.normal_(0.0, 0.1)


def init_cnn(module: nn.Module, image_shape: tuple[int, ...]) -> None:
    """He-initialise the convs, randomise norm affines, then calibrate and perturb BN statistics.

    The running mean and variance are first set to the batch statistics of eight random images
    (what a trained network would roughly have), then jittered so they are not exact. Fewer
    images give near-zero variances where the small networks shrink the image to 1x1.
    """
    with torch.no_grad():
        for conv in module.modules():
            if isinstance(conv, nn.Conv2d):
                nn.init.kaiming_normal_(conv.weight, mode="fan_in", nonlinearity="relu")
    randomize_norms(module)
    norms = [m for m in module.modules() if isinstance(m, nn.BatchNorm2d)]
    if not norms:
        return
    for norm in norms:
        norm.reset_running_stats()
        norm.momentum = None  # cumulative average: after one batch, exactly its statistics
    module.train()
    with torch.no_grad():
        module(torch.randn(8, *image_shape[1:]))
        for norm in norms:
            norm.momentum = 0.1
            std = norm.running_var.sqrt()
            norm.running_mean.add_(0.1 * std * torch.randn_like(std))
            norm.running_var.mul_(torch.empty_like(std).uniform_(0.8, 1.25))
    module.eval()

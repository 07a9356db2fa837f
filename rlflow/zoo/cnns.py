"""The five CNN benchmarks of X-RLflow / RLFlow, written from the papers (no torchvision here).

- ResNet-18 / ResNet-50 (He et al. 2016): basic blocks [2, 2, 2, 2] / bottlenecks [3, 4, 6, 3],
  widths 64-128-256-512, stride on the 3x3 conv of a bottleneck (the common "v1.5" variant).
- ResNeXt-50 32x4d (Xie et al. 2017): ResNet-50 with grouped 3x3 convs, 32 groups of width 4
  in the first stage (bottleneck width 128, doubling per stage).
- SqueezeNet 1.1 (Iandola et al. 2016, v1.1 from the authors' repository): 8 Fire modules, no
  BatchNorm, a 1x1 conv classifier and global average pooling.
- Inception-v3 (Szegedy et al. 2016): the 299x299 network with modules A (x3), B, C (x4), D,
  E (x2); every conv is Conv (no bias) + BatchNorm (eps 1e-3) + ReLU; no auxiliary head.

A ``width`` divisor and per-stage repeat counts give the small test versions of the same
architectures.

Medium is the full network (every block, every channel, the same weights' shapes) at half the
input side: 1x3x112x112 for the ResNets and ResNeXt, 1x3x149x149 for Inception-v3, so a quarter
of the pixels and about a quarter of the conv FLOPs; only spatial sizes differ from full. SqueezeNet
1.1 is the exception: at 112 it runs in ~0.7 ms, too little for rewrites to show, while the
paper's 224 input already runs in ~3 ms, so its medium is the full network at 224 (the same graph
as full, exported under the medium name).

Why: one onnxruntime run (1 thread, ORT_ENABLE_ALL) should take a few ms, so that an adaptive
per-graph measurement of 1-30 s holds hundreds to thousands of runs, while per-operator work
(BatchNorm, ReLU, Add, Concat) still shows. Halving the side keeps every convolution's weights
and channel counts, so rewrites see the same operators as at full size. Rough latencies, single
process on this project's CPU (AMD EPYC, 2 shared cores, 1 thread), 2026-11-23, load average ~3
from other users; fastest (median) of 30 interleaved runs, and ORT_DISABLE_ALL at medium:

==============  =======  =============  =======  ================
model           small    medium         full     medium, disabled
==============  =======  =============  =======  ================
Inception-v3    0.11 ms  13.5 (18) ms   53 ms    17.6 ms
ResNeXt-50      0.05 ms  14.2 (23) ms   44 ms    17.2 ms
SqueezeNet 1.1  0.03 ms  3.6 (5.5) ms   3.3 ms   4.9 ms
ResNet-18       0.03 ms  6.1 (10) ms    17 ms    7.6 ms
ResNet-50       0.04 ms  12.6 (20) ms   38 ms    15.2 ms
==============  =======  =============  =======  ================

(full: fastest of 8 runs.) onnxruntime's own rewrites (BatchNorm folding, Conv+ReLU fusion)
change medium latency by 20-35%, so graph rewrites at this size are measurable.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

from rlflow.zoo.benchmark import Benchmark, init_cnn


class ConvBN(nn.Sequential):
    """Conv (no bias: BatchNorm's shift makes it redundant) + BatchNorm, optionally + ReLU."""

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: int | tuple[int, int],
        stride: int = 1,
        padding: int | tuple[int, int] = 0,
        groups: int = 1,
        relu: bool = True,
        eps: float = 1e-5,
    ) -> None:
        layers: list[nn.Module] = [
            nn.Conv2d(
                in_channels, out_channels, kernel_size, stride, padding, groups=groups, bias=False
            ),
            nn.BatchNorm2d(out_channels, eps=eps),
        ]
        if relu:
            layers.append(nn.ReLU())
        super().__init__(*layers)


# ----------------------------------------------------------------------------- ResNet, ResNeXt


class BasicBlock(nn.Module):
    """ResNet-18/34 block: two 3x3 convs and an identity (or 1x1 projection) shortcut."""

    expansion = 1

    def __init__(self, in_channels: int, planes: int, stride: int, groups: int, width: int) -> None:
        super().__init__()
        del groups, width  # only bottlenecks are grouped
        self.conv1 = ConvBN(in_channels, planes, 3, stride, 1)
        self.conv2 = ConvBN(planes, planes, 3, 1, 1, relu=False)
        self.shortcut = _shortcut(in_channels, planes, stride)

    def forward(self, x: Tensor) -> Tensor:
        return torch.relu(self.conv2(self.conv1(x)) + self.shortcut(x))


class Bottleneck(nn.Module):
    """ResNet-50 / ResNeXt block: 1x1 reduce, 3x3 (grouped for ResNeXt, strided), 1x1 expand."""

    expansion = 4

    def __init__(self, in_channels: int, planes: int, stride: int, groups: int, width: int) -> None:
        super().__init__()
        out_channels = planes * self.expansion
        self.conv1 = ConvBN(in_channels, width, 1)
        self.conv2 = ConvBN(width, width, 3, stride, 1, groups=groups)
        self.conv3 = ConvBN(width, out_channels, 1, relu=False)
        self.shortcut = _shortcut(in_channels, out_channels, stride)

    def forward(self, x: Tensor) -> Tensor:
        return torch.relu(self.conv3(self.conv2(self.conv1(x))) + self.shortcut(x))


def _shortcut(in_channels: int, out_channels: int, stride: int) -> nn.Module:
    if stride == 1 and in_channels == out_channels:
        return nn.Identity()
    return ConvBN(in_channels, out_channels, 1, stride, relu=False)


class ResNet(nn.Module):
    """ResNet / ResNeXt: 7x7 stem, max pool, four stages, global average pool, linear head.

    Args:
        block: ``BasicBlock`` or ``Bottleneck``.
        repeats: blocks per stage, e.g. (3, 4, 6, 3) for ResNet-50.
        planes: stage widths before expansion, (64, 128, 256, 512) in the paper.
        groups: cardinality of the 3x3 convs (32 for ResNeXt-50 32x4d, 1 for ResNet).
        group_width: width of one group in the first stage (4 for 32x4d); ``None`` means
            ``planes[0]``, which with ``groups=1`` is plain ResNet.
        classes: output logits.
    """

    def __init__(
        self,
        block: type[BasicBlock] | type[Bottleneck],
        repeats: Sequence[int],
        planes: Sequence[int] = (64, 128, 256, 512),
        groups: int = 1,
        group_width: int | None = None,
        classes: int = 1000,
    ) -> None:
        super().__init__()
        group_width = planes[0] if group_width is None else group_width
        self.stem = nn.Sequential(
            ConvBN(3, planes[0], 7, 2, 3), nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
        )
        stages: list[nn.Module] = []
        in_channels = planes[0]
        for index, (stage_planes, count) in enumerate(zip(planes, repeats, strict=True)):
            # ResNeXt's bottleneck width doubles per stage exactly as the planes do.
            width = groups * group_width * stage_planes // planes[0]
            blocks = []
            for block_index in range(count):
                stride = 2 if index > 0 and block_index == 0 else 1
                blocks.append(block(in_channels, stage_planes, stride, groups, width))
                in_channels = stage_planes * block.expansion
            stages.append(nn.Sequential(*blocks))
        self.stages = nn.Sequential(*stages)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(in_channels, classes)

    def forward(self, image: Tensor) -> Tensor:
        x = self.pool(self.stages(self.stem(image)))
        return self.fc(torch.flatten(x, 1))


# ----------------------------------------------------------------------------- SqueezeNet 1.1


class Fire(nn.Module):
    """SqueezeNet Fire module: 1x1 squeeze, then concatenated 1x1 and 3x3 expands, all ReLU."""

    def __init__(self, in_channels: int, squeeze: int, expand1x1: int, expand3x3: int) -> None:
        super().__init__()
        self.squeeze = nn.Conv2d(in_channels, squeeze, 1)
        self.expand1x1 = nn.Conv2d(squeeze, expand1x1, 1)
        self.expand3x3 = nn.Conv2d(squeeze, expand3x3, 3, padding=1)

    def forward(self, x: Tensor) -> Tensor:
        s = torch.relu(self.squeeze(x))
        return torch.cat([torch.relu(self.expand1x1(s)), torch.relu(self.expand3x3(s))], 1)


class SqueezeNet(nn.Module):
    """SqueezeNet 1.1; ``width`` divides every channel count (1 for the paper's network)."""

    def __init__(self, width: int = 1, classes: int = 1000) -> None:
        super().__init__()

        def fire(in_channels: int, squeeze: int, expand: int) -> Fire:
            return Fire(in_channels // width, squeeze // width, expand // width, expand // width)

        def pool() -> nn.Module:
            return nn.MaxPool2d(kernel_size=3, stride=2, ceil_mode=True)

        self.features = nn.Sequential(
            nn.Conv2d(3, 64 // width, 3, stride=2),
            nn.ReLU(),
            pool(),
            fire(64, 16, 64),
            fire(128, 16, 64),
            pool(),
            fire(128, 32, 128),
            fire(256, 32, 128),
            pool(),
            fire(256, 48, 192),
            fire(384, 48, 192),
            fire(384, 64, 256),
            fire(512, 64, 256),
        )
        self.classifier = nn.Sequential(
            nn.Conv2d(512 // width, classes, 1), nn.ReLU(), nn.AdaptiveAvgPool2d(1)
        )

    def forward(self, image: Tensor) -> Tensor:
        return torch.flatten(self.classifier(self.features(image)), 1)


# ----------------------------------------------------------------------------- Inception-v3


def _inception_conv(
    in_channels: int,
    out_channels: int,
    kernel_size: int | tuple[int, int],
    stride: int = 1,
    padding: int | tuple[int, int] = 0,
) -> ConvBN:
    return ConvBN(in_channels, out_channels, kernel_size, stride, padding, eps=1e-3)


class InceptionA(nn.Module):
    """35x35 module (Fig. 5): 1x1 | 1x1-5x5 | 1x1-3x3-3x3 | avgpool-1x1."""

    def __init__(self, in_channels: int, pool_features: int, w: int) -> None:
        super().__init__()
        conv = _inception_conv
        self.branch1x1 = conv(in_channels, 64 // w, 1)
        self.branch5x5 = nn.Sequential(
            conv(in_channels, 48 // w, 1), conv(48 // w, 64 // w, 5, 1, 2)
        )
        self.branch3x3dbl = nn.Sequential(
            conv(in_channels, 64 // w, 1),
            conv(64 // w, 96 // w, 3, 1, 1),
            conv(96 // w, 96 // w, 3, 1, 1),
        )
        self.branch_pool = nn.Sequential(
            nn.AvgPool2d(3, stride=1, padding=1), conv(in_channels, pool_features // w, 1)
        )
        self.out_channels = (64 + 64 + 96 + pool_features) // w

    def forward(self, x: Tensor) -> Tensor:
        branches = [self.branch1x1, self.branch5x5, self.branch3x3dbl, self.branch_pool]
        return torch.cat([branch(x) for branch in branches], 1)


class InceptionB(nn.Module):
    """35->17 grid reduction: 3x3/2 | 1x1-3x3-3x3/2 | maxpool/2."""

    def __init__(self, in_channels: int, w: int) -> None:
        super().__init__()
        conv = _inception_conv
        self.branch3x3 = conv(in_channels, 384 // w, 3, 2)
        self.branch3x3dbl = nn.Sequential(
            conv(in_channels, 64 // w, 1),
            conv(64 // w, 96 // w, 3, 1, 1),
            conv(96 // w, 96 // w, 3, 2),
        )
        self.branch_pool = nn.MaxPool2d(3, stride=2)
        self.out_channels = (384 + 96) // w + in_channels

    def forward(self, x: Tensor) -> Tensor:
        return torch.cat([self.branch3x3(x), self.branch3x3dbl(x), self.branch_pool(x)], 1)


class InceptionC(nn.Module):
    """17x17 module with factorised 7x7 convs (Fig. 6): 1x1 | 1x7-7x1 | 7x1-1x7 twice | pool."""

    def __init__(self, in_channels: int, channels_7x7: int, w: int) -> None:
        super().__init__()
        conv, c7, c192 = _inception_conv, channels_7x7 // w, 192 // w
        self.branch1x1 = conv(in_channels, c192, 1)
        self.branch7x7 = nn.Sequential(
            conv(in_channels, c7, 1),
            conv(c7, c7, (1, 7), 1, (0, 3)),
            conv(c7, c192, (7, 1), 1, (3, 0)),
        )
        self.branch7x7dbl = nn.Sequential(
            conv(in_channels, c7, 1),
            conv(c7, c7, (7, 1), 1, (3, 0)),
            conv(c7, c7, (1, 7), 1, (0, 3)),
            conv(c7, c7, (7, 1), 1, (3, 0)),
            conv(c7, c192, (1, 7), 1, (0, 3)),
        )
        self.branch_pool = nn.Sequential(
            nn.AvgPool2d(3, stride=1, padding=1), conv(in_channels, c192, 1)
        )
        self.out_channels = 4 * c192

    def forward(self, x: Tensor) -> Tensor:
        branches = [self.branch1x1, self.branch7x7, self.branch7x7dbl, self.branch_pool]
        return torch.cat([branch(x) for branch in branches], 1)


class InceptionD(nn.Module):
    """17->8 grid reduction: 1x1-3x3/2 | 1x1-1x7-7x1-3x3/2 | maxpool/2."""

    def __init__(self, in_channels: int, w: int) -> None:
        super().__init__()
        conv, c192 = _inception_conv, 192 // w
        self.branch3x3 = nn.Sequential(conv(in_channels, c192, 1), conv(c192, 320 // w, 3, 2))
        self.branch7x7x3 = nn.Sequential(
            conv(in_channels, c192, 1),
            conv(c192, c192, (1, 7), 1, (0, 3)),
            conv(c192, c192, (7, 1), 1, (3, 0)),
            conv(c192, c192, 3, 2),
        )
        self.branch_pool = nn.MaxPool2d(3, stride=2)
        self.out_channels = 320 // w + c192 + in_channels

    def forward(self, x: Tensor) -> Tensor:
        return torch.cat([self.branch3x3(x), self.branch7x7x3(x), self.branch_pool(x)], 1)


class InceptionE(nn.Module):
    """8x8 module with expanded filter banks (Fig. 7): 1x1 | 1x1-(1x3, 3x1) |
    1x1-3x3-(1x3, 3x1) | avgpool-1x1."""

    def __init__(self, in_channels: int, w: int) -> None:
        super().__init__()
        conv, c384 = _inception_conv, 384 // w
        self.branch1x1 = conv(in_channels, 320 // w, 1)
        self.branch3x3 = conv(in_channels, c384, 1)
        self.branch3x3_a = conv(c384, c384, (1, 3), 1, (0, 1))
        self.branch3x3_b = conv(c384, c384, (3, 1), 1, (1, 0))
        self.branch3x3dbl = nn.Sequential(
            conv(in_channels, 448 // w, 1), conv(448 // w, c384, 3, 1, 1)
        )
        self.branch3x3dbl_a = conv(c384, c384, (1, 3), 1, (0, 1))
        self.branch3x3dbl_b = conv(c384, c384, (3, 1), 1, (1, 0))
        self.branch_pool = nn.Sequential(
            nn.AvgPool2d(3, stride=1, padding=1), conv(in_channels, 192 // w, 1)
        )
        self.out_channels = 320 // w + 4 * c384 + 192 // w

    def forward(self, x: Tensor) -> Tensor:
        b3 = self.branch3x3(x)
        b3dbl = self.branch3x3dbl(x)
        return torch.cat(
            [
                self.branch1x1(x),
                self.branch3x3_a(b3),
                self.branch3x3_b(b3),
                self.branch3x3dbl_a(b3dbl),
                self.branch3x3dbl_b(b3dbl),
                self.branch_pool(x),
            ],
            1,
        )


class InceptionV3(nn.Module):
    """Inception-v3 without the auxiliary classifier.

    Args:
        width: divides every channel count (1 for the paper's network).
        repeats: how many of the A, C and E modules to keep, (3, 4, 2) in the paper; the
            paper's per-module sizes are used in order and the last one repeated if asked for more.
        classes: output logits.
    """

    def __init__(
        self, width: int = 1, repeats: Sequence[int] = (3, 4, 2), classes: int = 1000
    ) -> None:
        super().__init__()
        conv, w = _inception_conv, width
        self.stem = nn.Sequential(
            conv(3, 32 // w, 3, 2),
            conv(32 // w, 32 // w, 3),
            conv(32 // w, 64 // w, 3, 1, 1),
            nn.MaxPool2d(3, stride=2),
            conv(64 // w, 80 // w, 1),
            conv(80 // w, 192 // w, 3),
            nn.MaxPool2d(3, stride=2),
        )
        modules: list[nn.Module] = []
        channels = 192 // w
        for pool_features in _take((32, 64, 64), repeats[0]):
            modules.append(InceptionA(channels, pool_features, w))
            channels = modules[-1].out_channels
        modules.append(InceptionB(channels, w))
        channels = modules[-1].out_channels
        for channels_7x7 in _take((128, 160, 160, 192), repeats[1]):
            modules.append(InceptionC(channels, channels_7x7, w))
            channels = modules[-1].out_channels
        modules.append(InceptionD(channels, w))
        channels = modules[-1].out_channels
        for _ in range(repeats[2]):
            modules.append(InceptionE(channels, w))
            channels = modules[-1].out_channels
        self.mixed = nn.Sequential(*modules)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(channels, classes)

    def forward(self, image: Tensor) -> Tensor:
        x = self.pool(self.mixed(self.stem(image)))
        return self.fc(torch.flatten(x, 1))


def _take(sizes: Sequence[int], count: int) -> list[int]:
    return [sizes[min(i, len(sizes) - 1)] for i in range(count)]


# ----------------------------------------------------------------------------- builders
# Small versions keep every kind of block but one block per stage, 1/8 of the channels and
# 32x32 images (75x75 for Inception, the smallest its stem and reductions accept). Medium and
# full build the same network and differ only in the input side (see the module docstring).

_IMAGE = {"full": 224, "medium": 112}
_INCEPTION_IMAGE = {"full": 299, "medium": 149}
_SQUEEZENET_IMAGE = {"full": 224, "medium": 224}


def _benchmark(module: nn.Module, image: int) -> Benchmark:
    shape = (1, 3, image, image)
    init_cnn(module, shape)
    return Benchmark(module.eval(), {"image": torch.randn(shape)}, "logits")


def build_inception_v3(size: str) -> Benchmark:
    if size in _INCEPTION_IMAGE:
        return _benchmark(InceptionV3(), _INCEPTION_IMAGE[size])
    return _benchmark(InceptionV3(width=8, repeats=(1, 1, 1), classes=10), 75)


def build_resnext_50(size: str) -> Benchmark:
    if size in _IMAGE:
        resnext = ResNet(Bottleneck, (3, 4, 6, 3), groups=32, group_width=4)
        return _benchmark(resnext, _IMAGE[size])
    small = ResNet(Bottleneck, (1, 1, 1, 1), (8, 16, 32, 64), groups=4, group_width=4, classes=10)
    return _benchmark(small, 32)


def build_squeezenet_1_1(size: str) -> Benchmark:
    if size in _SQUEEZENET_IMAGE:
        return _benchmark(SqueezeNet(), _SQUEEZENET_IMAGE[size])
    return _benchmark(SqueezeNet(width=8, classes=10), 32)


def build_resnet_18(size: str) -> Benchmark:
    if size in _IMAGE:
        return _benchmark(ResNet(BasicBlock, (2, 2, 2, 2)), _IMAGE[size])
    return _benchmark(ResNet(BasicBlock, (1, 1, 1, 1), (8, 16, 32, 64), classes=10), 32)


def build_resnet_50(size: str) -> Benchmark:
    if size in _IMAGE:
        return _benchmark(ResNet(Bottleneck, (3, 4, 6, 3)), _IMAGE[size])
    return _benchmark(ResNet(Bottleneck, (1, 1, 1, 1), (8, 16, 32, 64), classes=10), 32)

"""The NCHWc blocked format as onnxruntime's MLAS lays it out, in numpy.

A blocked tensor keeps the shape (N, C', H, W), C' being C rounded up to the block size B, but
its memory is ordered [N][C'/B][H][W][B]: the B channels of a block sit together so that one
vector instruction covers them. Padded channels are zeros when reordered in, may hold other
finite values after an op (a Sigmoid of 0), and are dropped when reordered out: no blocked
reader depends on them, a filter being zero there.

An nchwc Conv takes its filter pre-reordered, in one of two formats (chosen as onnxruntime's
NCHWc transformer chooses them, `conv_layout`):

- OIHWBo: output channels in blocks, [O'/B][I][KH][KW][Bo], stored as (O', I, KH, KW); for a
  Conv reading its NCHW input directly (fewer input channels than a block) and depthwise Convs;
- OIHWBiBo: input channels in blocks too, [O'/B][I'/B][KH][KW][Bi][Bo], stored as
  (O', I', KH, KW); for the rest.

O' and I' are O and I rounded up to whole blocks, the extra filter entries zero.
`restore_filter` undoes the reorder, so that a rewrite can leave the layout.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


def padded(channels: int, block: int) -> int:
    """`channels` rounded up to a whole number of blocks."""
    return -(-channels // block) * block


def pad_channels(vector: np.ndarray, block: int) -> np.ndarray:
    """A per-channel vector (a bias) with zeros for the padded channels."""
    return np.pad(vector, (0, padded(len(vector), block) - len(vector)))


@dataclass(frozen=True)
class ConvLayout:
    """How onnxruntime runs a Conv blocked."""

    per_output: bool
    """The filter is OIHWBo (output channels blocked only); else OIHWBiBo."""
    reorder_input: bool
    """The input is reordered to blocks; else the Conv reads it as NCHW."""
    depthwise: bool = False
    """One channel per group: the nchwc Conv has one group per padded channel."""


def conv_layout(weight_shape: tuple[int, ...], group: int, block: int) -> ConvLayout | str:
    """The layout onnxruntime (1.2x on) gives a 2-D Conv with this filter shape and group
    count, or the reason it leaves the Conv alone. Channels reordered in must come in fours
    (ReorderInput's unit); the blocked filter, padded, gets the same answer.
    """
    if len(weight_shape) != 4:
        return "the Conv is not 2-D"
    out_channels, in_channels = weight_shape[:2]
    if group > 1:
        if in_channels == 1 and out_channels == group:
            if out_channels % 4:
                return "a depthwise Conv needs its channels in fours"
            return ConvLayout(per_output=True, reorder_input=True, depthwise=True)
        if out_channels % block or in_channels % block or (out_channels // group) % block:
            return f"each group needs input and output channels in whole blocks of {block}"
        return ConvLayout(per_output=False, reorder_input=True)
    if in_channels < block:
        return ConvLayout(per_output=True, reorder_input=False)
    if in_channels % 4:
        return f"{in_channels} input channels are neither below {block} nor in fours"
    return ConvLayout(per_output=False, reorder_input=True)


def reorder_filter(weight: np.ndarray, block: int, per_output: bool) -> np.ndarray:
    """An OIHW filter in the blocked format (OIHWBo if `per_output`, else OIHWBiBo, whose
    input channels are padded to whole blocks too)."""
    out_channels, in_channels, height, width = weight.shape
    grown_out = padded(out_channels, block)
    grown_in = in_channels if per_output else padded(in_channels, block)
    full = np.pad(
        weight, [(0, grown_out - out_channels), (0, grown_in - in_channels), (0, 0), (0, 0)]
    )
    if per_output:
        blocks = full.reshape(grown_out // block, block, grown_in, height, width)
        ordered = blocks.transpose(0, 2, 3, 4, 1)
    else:
        blocks = full.reshape(grown_out // block, block, grown_in // block, block, height, width)
        ordered = blocks.transpose(0, 2, 4, 5, 3, 1)
    return np.ascontiguousarray(ordered).reshape(full.shape)


def restore_filter(
    blocked: np.ndarray, block: int, per_output: bool, out_channels: int, in_channels: int
) -> np.ndarray:
    """The OIHW filter of the first `out_channels` outputs and `in_channels` inputs, from the
    blocked format."""
    grown_out, grown_in, height, width = blocked.shape
    if per_output:
        blocks = blocked.reshape(grown_out // block, grown_in, height, width, block)
        ordered = blocks.transpose(0, 4, 1, 2, 3)
    else:
        blocks = blocked.reshape(grown_out // block, grown_in // block, height, width, block, block)
        ordered = blocks.transpose(0, 5, 1, 4, 2, 3)
    return np.ascontiguousarray(ordered.reshape(blocked.shape)[:out_channels, :in_channels])


def used_input_channels(blocked: np.ndarray, block: int) -> int:
    """How many leading input channels an OIHWBiBo filter uses: its later columns are zero,
    so a blocked input may hold anything there."""
    grown_out, grown_in, height, width = blocked.shape
    blocks = blocked.reshape(grown_out // block, grown_in // block, height, width, block, block)
    used = np.flatnonzero(blocks.any(axis=(0, 2, 3, 5)).reshape(-1))
    return int(used[-1]) + 1 if used.size else 0

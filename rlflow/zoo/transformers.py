"""The four transformer benchmarks of X-RLflow / RLFlow: BERT, ViT, mini-DALL-E and
Transformer-Transducer.

Full sizes are those of the papers' benchmark set (X-RLflow, He et al. 2023; RLFlow); where
the papers leave a detail open (norm placement, activation), the original model's choice is used:

- BERT: seq 64, hidden 1024, 8 post-LN layers, 16 heads, FF 4096 (GELU), vocab 30522.
- ViT-Base: 64 patches (1x3x128x128 image, patch 16), hidden 768, 12 pre-LN layers, 12 heads,
  MLP 3072 (GELU), class token, 1000-class head.
- mini-DALL-E: decoder only, seq 16, hidden 768, 8 pre-LN causal layers, 12 heads,
  GEGLU feed-forward 2048, vocab 16384.
- Transformer-Transducer: 80 frames of 80 audio features, d 512, 8 heads, FF 2048 (ReLU),
  12 audio-encoder layers + 2 causal label-encoder layers over U=16 labels (vocab 256),
  joint network tanh(W_a a_t + W_l l_u) -> vocab, giving logits (1, 80, 16, 256).

Medium sizes keep every sequence length (so every attention and reshape shape pattern) and every
layer type of full, with the papers' head width of 64, feed-forward ratio and norm placement, and
shrink width, depth and vocabulary:

- BERT: seq 64, hidden 256, 4 layers, 4 heads, FF 1024, vocab 8192.
- ViT: 64 patches (1x3x128x128, patch 16), hidden 256, 4 layers, 4 heads, MLP 1024, 1000 classes.
- mini-DALL-E: seq 16, hidden 384, 4 layers, 6 heads, GEGLU 1024, vocab 4096 (with 16 tokens a
  layer does little work: hidden 256 ran in ~1.2 ms, under the few ms aimed at).
- Transformer-Transducer: 80 frames x 80 features, d 256, 4 heads, FF 1024, 4 audio + 2 label
  layers, 16 labels, vocab 256, logits (1, 80, 16, 256).

Why: one onnxruntime run (1 thread, ORT_ENABLE_ALL) should take a few ms, so that an adaptive
per-graph measurement of 1-30 s holds hundreds to thousands of runs, while the element-wise work
that fusions remove (its share of a layer is about 1/hidden) stays larger than at full size.
Rough latencies, single process on this project's CPU (AMD EPYC, 2 shared cores, 1 thread),
2026-11-23, load average ~3 from other users; fastest (median) of 30 interleaved runs:

=========================  =======  =============  ===========
model                      small    medium         full
=========================  =======  =============  ===========
BERT                       0.05 ms  3.4 (3.6) ms   83 ms
ViT                        0.05 ms  3.1 (3.4) ms   66 ms
mini-DALL-E                0.04 ms  3.2 (3.6) ms   23 ms
Transformer-Transducer     0.06 ms  5.0 (8.4) ms   39 ms
=========================  =======  =============  ===========

(full: fastest of 8 runs.) At medium, onnxruntime's own fusions are measurable: on BERT its
SkipLayerNormalization fusion alone makes a run ~17% slower (2.7 ms without it, 3.2 ms with it;
ORT_DISABLE_ALL 2.9 ms against ORT_ENABLE_ALL 3.4 ms), on the other three each fusion moves
latency by 1-3%.

Attention is written out (MatMul, Softmax, Reshape, Transpose) rather than through
``scaled_dot_product_attention`` so that the exported graphs expose the operators that the
rewrite rules of the papers act on. Every reshape uses sizes known at build time, so the
exported graphs are fully static.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from rlflow.zoo.benchmark import Benchmark, randomize_norms

# A finite "minus infinity": -inf in a mask turns 0 * mask into NaN under some rewrites.
_MASKED = -1e9


@dataclass(frozen=True)
class TransformerDims:
    """The sizes of one transformer stack."""

    seq: int
    """Sequence length (tokens, patches or frames)."""
    hidden: int
    """Model width d."""
    layers: int
    """Number of encoder/decoder layers."""
    heads: int
    """Attention heads; ``hidden`` must be a multiple of it."""
    ff: int
    """Inner width of the feed-forward block."""


class SelfAttention(nn.Module):
    """Multi-head self-attention with separate Q, K, V projections and an optional causal mask.

    Shapes:
        input (1, seq, hidden) -> output (1, seq, hidden)
    """

    def __init__(self, dims: TransformerDims, causal: bool = False) -> None:
        super().__init__()
        self.seq, self.heads = dims.seq, dims.heads
        self.head_dim = dims.hidden // dims.heads
        self.query = nn.Linear(dims.hidden, dims.hidden)
        self.key = nn.Linear(dims.hidden, dims.hidden)
        self.value = nn.Linear(dims.hidden, dims.hidden)
        self.out = nn.Linear(dims.hidden, dims.hidden)
        self.scale = 1.0 / math.sqrt(self.head_dim)
        mask = torch.triu(torch.full((dims.seq, dims.seq), _MASKED), diagonal=1)
        self.register_buffer("mask", mask if causal else None, persistent=False)

    def _split_heads(self, x: Tensor) -> Tensor:
        return x.reshape(1, self.seq, self.heads, self.head_dim).transpose(1, 2)

    def forward(self, x: Tensor) -> Tensor:
        q = self._split_heads(self.query(x))
        k = self._split_heads(self.key(x))
        v = self._split_heads(self.value(x))
        scores = torch.matmul(q, k.transpose(-2, -1)) * self.scale
        if self.mask is not None:
            scores = scores + self.mask
        context = torch.matmul(torch.softmax(scores, dim=-1), v)
        return self.out(context.transpose(1, 2).reshape(1, self.seq, self.heads * self.head_dim))


class FeedForward(nn.Module):
    """Position-wise feed-forward: Linear, activation (or GEGLU gate), Linear."""

    def __init__(self, hidden: int, ff: int, activation: str) -> None:
        super().__init__()
        self.activation, self.ff = activation, ff
        # GEGLU (Shazeer 2020) needs a value half and a gate half from the first projection.
        width = 2 * ff if activation == "geglu" else ff
        self.up = nn.Linear(hidden, width)
        self.down = nn.Linear(ff, hidden)

    def forward(self, x: Tensor) -> Tensor:
        h = self.up(x)
        if self.activation == "geglu":
            # split with a fixed size exports as one Split; chunk traces Shape arithmetic.
            value, gate = h.split(self.ff, dim=-1)
            h = value * nn.functional.gelu(gate)
        elif self.activation == "gelu":
            h = nn.functional.gelu(h)
        else:
            h = torch.relu(h)
        return self.down(h)


class TransformerLayer(nn.Module):
    """One encoder/decoder layer, post-LN (BERT, original Transformer) or pre-LN (ViT, GPT)."""

    def __init__(
        self, dims: TransformerDims, activation: str, pre_norm: bool, causal: bool = False
    ) -> None:
        super().__init__()
        self.pre_norm = pre_norm
        self.attention = SelfAttention(dims, causal=causal)
        self.attention_norm = nn.LayerNorm(dims.hidden)
        self.feed_forward = FeedForward(dims.hidden, dims.ff, activation)
        self.feed_forward_norm = nn.LayerNorm(dims.hidden)

    def forward(self, x: Tensor) -> Tensor:
        if self.pre_norm:
            x = x + self.attention(self.attention_norm(x))
            return x + self.feed_forward(self.feed_forward_norm(x))
        x = self.attention_norm(x + self.attention(x))
        return self.feed_forward_norm(x + self.feed_forward(x))


def _stack(
    dims: TransformerDims, activation: str, pre_norm: bool, causal: bool = False
) -> nn.Sequential:
    return nn.Sequential(
        *(TransformerLayer(dims, activation, pre_norm, causal) for _ in range(dims.layers))
    )


class Bert(nn.Module):
    """BERT encoder (Devlin et al. 2019): token + position embedding, embedding LayerNorm,
    post-LN GELU layers; returns the last hidden state (1, seq, hidden)."""

    def __init__(self, dims: TransformerDims, vocab: int) -> None:
        super().__init__()
        self.token_embedding = nn.Embedding(vocab, dims.hidden)
        self.position_embedding = nn.Parameter(0.02 * torch.randn(1, dims.seq, dims.hidden))
        self.embedding_norm = nn.LayerNorm(dims.hidden)
        self.layers = _stack(dims, "gelu", pre_norm=False)

    def forward(self, input_ids: Tensor) -> Tensor:
        x = self.token_embedding(input_ids) + self.position_embedding
        return self.layers(self.embedding_norm(x))


class VisionTransformer(nn.Module):
    """ViT (Dosovitskiy et al. 2021): patch embedding as a strided Conv, class token, learned
    position embedding, pre-LN GELU layers, final LayerNorm and a linear head on the class token."""

    def __init__(self, dims: TransformerDims, patch: int, classes: int) -> None:
        super().__init__()
        self.hidden, self.patches = dims.hidden, dims.seq
        self.patch_embedding = nn.Conv2d(3, dims.hidden, kernel_size=patch, stride=patch)
        self.class_token = nn.Parameter(0.02 * torch.randn(1, 1, dims.hidden))
        # dims.seq counts the patches; the class token adds one position.
        self.position_embedding = nn.Parameter(0.02 * torch.randn(1, dims.seq + 1, dims.hidden))
        self.layers = _stack(
            TransformerDims(dims.seq + 1, dims.hidden, dims.layers, dims.heads, dims.ff),
            "gelu",
            pre_norm=True,
        )
        self.norm = nn.LayerNorm(dims.hidden)
        self.head = nn.Linear(dims.hidden, classes)

    def forward(self, image: Tensor) -> Tensor:
        # A fixed-shape reshape, not flatten(2): the legacy exporter traces flatten(2) as Shape,
        # Slice and Concat.
        patches = self.patch_embedding(image).reshape(1, self.hidden, self.patches).transpose(1, 2)
        x = torch.cat([self.class_token, patches], dim=1) + self.position_embedding
        x = self.norm(self.layers(x))
        return self.head(x[:, 0])


class MiniDalle(nn.Module):
    """mini-DALL-E style decoder-only transformer (Ramesh et al. 2021; Dayma et al.): token +
    position embedding, pre-LN causal layers with GEGLU feed-forward, LM head over the vocab."""

    def __init__(self, dims: TransformerDims, vocab: int) -> None:
        super().__init__()
        self.token_embedding = nn.Embedding(vocab, dims.hidden)
        self.position_embedding = nn.Parameter(0.02 * torch.randn(1, dims.seq, dims.hidden))
        self.layers = _stack(dims, "geglu", pre_norm=True, causal=True)
        self.norm = nn.LayerNorm(dims.hidden)
        self.lm_head = nn.Linear(dims.hidden, vocab, bias=False)

    def forward(self, input_ids: Tensor) -> Tensor:
        x = self.token_embedding(input_ids) + self.position_embedding
        return self.lm_head(self.norm(self.layers(x)))


class TransformerTransducer(nn.Module):
    """Transformer-Transducer (Zhang et al. 2020): a transformer audio encoder over projected
    features, a causal transformer label encoder over the previous labels, and the RNN-T joint
    network tanh(W_a a_t + W_l l_u) -> vocab for every (frame, label) pair."""

    def __init__(
        self,
        audio: TransformerDims,
        label: TransformerDims,
        features: int,
        vocab: int,
    ) -> None:
        super().__init__()
        self.audio_projection = nn.Linear(features, audio.hidden)
        self.audio_position = nn.Parameter(0.02 * torch.randn(1, audio.seq, audio.hidden))
        self.audio_encoder = _stack(audio, "relu", pre_norm=True)
        self.audio_norm = nn.LayerNorm(audio.hidden)
        self.label_embedding = nn.Embedding(vocab, label.hidden)
        self.label_position = nn.Parameter(0.02 * torch.randn(1, label.seq, label.hidden))
        self.label_encoder = _stack(label, "relu", pre_norm=True, causal=True)
        self.label_norm = nn.LayerNorm(label.hidden)
        self.joint_audio = nn.Linear(audio.hidden, audio.hidden)
        self.joint_label = nn.Linear(label.hidden, audio.hidden, bias=False)
        self.joint_out = nn.Linear(audio.hidden, vocab)

    def forward(self, audio_features: Tensor, labels: Tensor) -> Tensor:
        a = self.audio_projection(audio_features) + self.audio_position
        a = self.audio_norm(self.audio_encoder(a))
        u = self.label_embedding(labels) + self.label_position
        u = self.label_norm(self.label_encoder(u))
        # (1, T, 1, d) + (1, 1, U, d) -> (1, T, U, d): every frame meets every label.
        joint = self.joint_audio(a).unsqueeze(2) + self.joint_label(u).unsqueeze(1)
        return self.joint_out(torch.tanh(joint))


# ----------------------------------------------------------------------------- builders
# Each builder takes a size ("full": the papers' dimensions, "medium": the same architecture at a
# few ms per run (see the module docstring), "small": shrunk for tests) and returns the module with
# example inputs; the caller seeds torch first.


def build_bert(size: str) -> Benchmark:
    dims, vocab = {
        "full": (TransformerDims(seq=64, hidden=1024, layers=8, heads=16, ff=4096), 30522),
        "medium": (TransformerDims(seq=64, hidden=256, layers=4, heads=4, ff=1024), 8192),
        "small": (TransformerDims(seq=16, hidden=32, layers=2, heads=4, ff=64), 512),
    }[size]
    module = Bert(dims, vocab)
    randomize_norms(module)
    input_ids = torch.randint(0, vocab, (1, dims.seq))
    return Benchmark(
        module.eval(), {"input_ids": input_ids}, "last_hidden_state", {"input_ids": (0, vocab)}
    )


def build_vit(size: str) -> Benchmark:
    # seq counts patches: (image / patch) ** 2.
    dims, image, patch, classes = {
        "full": (TransformerDims(seq=64, hidden=768, layers=12, heads=12, ff=3072), 128, 16, 1000),
        "medium": (TransformerDims(seq=64, hidden=256, layers=4, heads=4, ff=1024), 128, 16, 1000),
        "small": (TransformerDims(seq=16, hidden=32, layers=2, heads=4, ff=64), 32, 8, 10),
    }[size]
    module = VisionTransformer(dims, patch, classes)
    randomize_norms(module)
    return Benchmark(module.eval(), {"image": torch.randn(1, 3, image, image)}, "logits")


def build_mini_dalle(size: str) -> Benchmark:
    dims, vocab = {
        "full": (TransformerDims(seq=16, hidden=768, layers=8, heads=12, ff=2048), 16384),
        "medium": (TransformerDims(seq=16, hidden=384, layers=4, heads=6, ff=1024), 4096),
        "small": (TransformerDims(seq=8, hidden=32, layers=2, heads=4, ff=64), 512),
    }[size]
    module = MiniDalle(dims, vocab)
    randomize_norms(module)
    input_ids = torch.randint(0, vocab, (1, dims.seq))
    return Benchmark(module.eval(), {"input_ids": input_ids}, "logits", {"input_ids": (0, vocab)})


def build_transformer_transducer(size: str) -> Benchmark:
    audio, label, features, vocab = {
        "full": (
            TransformerDims(seq=80, hidden=512, layers=12, heads=8, ff=2048),
            TransformerDims(seq=16, hidden=512, layers=2, heads=8, ff=2048),
            80,
            256,
        ),
        "medium": (
            TransformerDims(seq=80, hidden=256, layers=4, heads=4, ff=1024),
            TransformerDims(seq=16, hidden=256, layers=2, heads=4, ff=1024),
            80,
            256,
        ),
        "small": (
            TransformerDims(seq=16, hidden=32, layers=2, heads=4, ff=64),
            TransformerDims(seq=4, hidden=32, layers=1, heads=4, ff=64),
            20,
            32,
        ),
    }[size]
    module = TransformerTransducer(audio, label, features, vocab)
    randomize_norms(module)
    inputs = {
        "audio_features": torch.randn(1, audio.seq, features),
        "labels": torch.randint(0, vocab, (1, label.seq)),
    }
    return Benchmark(module.eval(), inputs, "logits", {"labels": (0, vocab)})

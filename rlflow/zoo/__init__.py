"""The benchmark models of X-RLflow / RLFlow, built in our own code and exported to ONNX.

Three sizes (``SIZES``): ``small`` (the same architectures shrunk for tests, ~0.1 ms a run, too
little for a rewrite to change latency measurably), ``medium`` (a few ms a run at 1 onnxruntime
thread: the transformers narrower and shallower at the full sequence lengths, the CNNs the full
networks at half the input side; dims and rough latencies in ``transformers`` and ``cnns``) and
``full`` (the papers' sizes, 3-85 ms a run on this project's CPU, bert the slowest).

``export(name, size, path)`` builds a model with fixed-seed random weights and writes it;
``cached_path(name, size)`` keeps one export per model, size and ``ZOO_VERSION`` under
``$RLFLOW_CACHE_DIR/zoo`` (default ``~/.cache/rlflow/zoo``).

Exporter: the TorchScript-based ``torch.onnx.export(..., dynamo=False)`` at opset 18, with
``training=TrainingMode.PRESERVE`` on a model in eval mode. Measured on torch 2.13:

- it keeps BatchNormalization nodes: with ``training=EVAL`` (the default) its "eval peephole"
  pass folds every BN into the preceding Conv, and the dynamo exporter's onnxscript optimizer
  does the same; our own conv+batchnorm rule needs the BN nodes;
- it still constant-folds weight transposes, and the graph is fully static and byte-for-byte
  deterministic;
- it takes ~0.1 s for a small model, where ``dynamo=True`` takes ~2 s.

It is deprecated (a DeprecationWarning, silenced here) but present in torch 2.4-2.13. Should it
go, the way out is ``dynamo=True, optimize=False`` followed by onnxscript's optimizer without
its ``fuse_batchnorm`` rules.

Every export carries ``metadata_props``: ``rlflow.zoo = "<name>:<size>"`` and, per integer
input, ``rlflow.int_range.<input> = "low,high"`` (high exclusive) for drawing valid ids.
"""

from __future__ import annotations

import importlib
import io
import os
import warnings
import zlib
from pathlib import Path
from typing import TYPE_CHECKING

from rlflow.errors import RlflowError
from rlflow.fileio import write_bytes_atomic

if TYPE_CHECKING:
    import onnx

    from rlflow.zoo.benchmark import Benchmark

__all__ = [
    "MODEL_NAMES",
    "MODEL_RULE",
    "OPSET",
    "SIZES",
    "ZOO_VERSION",
    "build",
    "cache_dir",
    "cached_path",
    "describe",
    "export",
    "model_path",
    "to_onnx",
    "zoo_name",
]

ZOO_VERSION = 1
"""Bump whenever a definition, weight initialisation or export setting changes: cached files
carry it in their name, so old exports are simply not found again."""

OPSET = 18
SIZES: tuple[str, ...] = ("small", "medium", "full")

# name -> (one-line description with the full dims, the medium dims, builder as "module.function"
# in this package). The full line is also written into every export's doc_string. Builders are
# imported on use: torch loads only when a model is built, so `rlflow zoo list` and resolving
# MODEL start fast.
_MODELS: dict[str, tuple[str, str, str]] = {
    "bert": (
        "BERT encoder: seq 64, hidden 1024, 8 post-LN layers, 16 heads, FF 4096, vocab 30522",
        "hidden 256, 4 layers, 4 heads, FF 1024, vocab 8192 (rough: 3 ms a run)",
        "transformers.build_bert",
    ),
    "vit-base": (
        "ViT-Base: 1x3x128x128 image, 64 patches of 16, hidden 768, 12 layers, 12 heads, "
        "MLP 3072, 1000 classes",
        "hidden 256, 4 layers, 4 heads, MLP 1024 (rough: 3 ms a run)",
        "transformers.build_vit",
    ),
    "mini-dalle": (
        "mini-DALL-E decoder: seq 16, hidden 768, 8 causal layers, 12 heads, GEGLU 2048, "
        "vocab 16384",
        "hidden 384, 4 layers, 6 heads, GEGLU 1024, vocab 4096 (rough: 3 ms a run)",
        "transformers.build_mini_dalle",
    ),
    "transformer-transducer": (
        "Transformer-Transducer: 80 frames x 80 features, d 512, 8 heads, FF 2048, 12 audio + "
        "2 label layers, 16 labels, vocab 256, joint logits 1x80x16x256",
        "d 256, 4 heads, FF 1024, 4 audio + 2 label layers (rough: 5 ms a run)",
        "transformers.build_transformer_transducer",
    ),
    "inception-v3": (
        "Inception-v3: 1x3x299x299, modules A x3, B, C x4, D, E x2, 1000 classes",
        "1x3x149x149 (rough: 14 ms a run)",
        "cnns.build_inception_v3",
    ),
    "resnext-50": (
        "ResNeXt-50 32x4d: 1x3x224x224, bottlenecks [3, 4, 6, 3], 32 groups, 1000 classes",
        "1x3x112x112 (rough: 14 ms a run)",
        "cnns.build_resnext_50",
    ),
    "squeezenet-1.1": (
        "SqueezeNet 1.1: 1x3x224x224, 8 Fire modules, no BatchNorm, 1000 classes",
        "1x3x224x224, the full network (rough: 3 ms a run)",
        "cnns.build_squeezenet_1_1",
    ),
    "resnet-18": (
        "ResNet-18: 1x3x224x224, basic blocks [2, 2, 2, 2], 1000 classes",
        "1x3x112x112 (rough: 6 ms a run)",
        "cnns.build_resnet_18",
    ),
    "resnet-50": (
        "ResNet-50: 1x3x224x224, bottlenecks [3, 4, 6, 3], 1000 classes",
        "1x3x112x112 (rough: 12 ms a run)",
        "cnns.build_resnet_50",
    ),
}

MODEL_NAMES: tuple[str, ...] = tuple(_MODELS)


def _check(name: str, size: str = "small") -> None:
    if name not in _MODELS:
        raise RlflowError(f"unknown zoo model {name!r}; valid names: {', '.join(MODEL_NAMES)}")
    if size not in SIZES:
        raise RlflowError(f"unknown zoo size {size!r}; valid sizes: {', '.join(SIZES)}")


def describe(name: str) -> str:
    """One line: what the model is at its full (paper) size, then its medium dims and rough
    latency (1 onnxruntime thread on this project's CPU; see ``transformers`` and ``cnns``)."""
    _check(name)
    full, medium, _ = _MODELS[name]
    return f"{full}; medium: {medium}"


def build(name: str, size: str) -> Benchmark:
    """The torch module and example inputs of a zoo model, with its fixed-seed weights."""
    import torch

    _check(name, size)
    module, function = _MODELS[name][2].rsplit(".", 1)
    builder = getattr(importlib.import_module(f"rlflow.zoo.{module}"), function)
    # A seed per name (not per position in the table) keeps weights stable if models are added.
    torch.manual_seed(zlib.crc32(name.encode()))
    return builder(size)


def to_onnx(name: str, size: str) -> onnx.ModelProto:
    """Build a zoo model and export it to an in-memory ONNX model (see the module docstring)."""
    import onnx
    import torch

    benchmark = build(name, size)
    buffer = io.BytesIO()
    with torch.no_grad(), warnings.catch_warnings():
        # The legacy exporter warns that it is legacy and that PRESERVE mode should not
        # constant-fold (a concern for models in training mode only; ours is in eval mode).
        warnings.simplefilter("ignore", DeprecationWarning)
        warnings.filterwarnings("ignore", message="It is recommended that constant folding")
        torch.onnx.export(
            benchmark.module,
            tuple(benchmark.inputs.values()),
            buffer,
            dynamo=False,
            opset_version=OPSET,
            input_names=list(benchmark.inputs),
            output_names=[benchmark.output],
            training=torch.onnx.TrainingMode.PRESERVE,
            do_constant_folding=True,
        )
    model = onnx.load_from_string(buffer.getvalue())
    _lift_constants(model.graph)
    props = {"rlflow.zoo": f"{name}:{size}"}
    for input_name, (low, high) in benchmark.int_ranges.items():
        props[f"rlflow.int_range.{input_name}"] = f"{low},{high}"
    onnx.helper.set_model_props(model, props)
    model.doc_string = f"rlflow zoo {name} ({size}); full size: {_MODELS[name][0]}"
    return model


def _lift_constants(graph: onnx.GraphProto) -> None:
    """Turn Constant nodes (the legacy exporter's reshape shapes, masks, ...) into initializers,
    so node counts and rewrite sites only see real operators."""
    from onnx import numpy_helper

    from rlflow.graph.domains import is_standard

    kept = []
    for node in graph.node:
        value = next((a for a in node.attribute if a.name == "value"), None)
        if node.op_type == "Constant" and is_standard(node.domain) and value is not None:
            tensor = numpy_helper.from_array(numpy_helper.to_array(value.t), node.output[0])
            graph.initializer.append(tensor)
        else:
            kept.append(node)
    del graph.node[:]
    graph.node.extend(kept)


def export(name: str, size: str, path: str | Path) -> Path:
    """Export zoo model ``name`` at ``size`` (one of ``SIZES``) to ``path``, atomically."""
    _check(name, size)
    path = Path(path)
    model = to_onnx(name, size)
    # Renamed only once complete: a killed export never leaves a truncated model under the
    # real name, and concurrent exports of one model race harmlessly.
    write_bytes_atomic(path, model.SerializeToString())
    return path


MODEL_RULE = (
    "a path ending in .onnx or holding a directory part is a file; otherwise a zoo name (rlflow "
    "zoo list) is the zoo model, even where a file or directory of that name exists (write "
    "./NAME for the file); any other name must be an existing file"
)
"""How MODEL is read, in one sentence for the commands' --help."""


def zoo_name(spec: str) -> str | None:
    """The zoo model that MODEL `spec` names, or None when it names a file (`MODEL_RULE`).

    The rule never looks at the disk for a zoo name: a run directory called `resnet-18` must not
    turn `rlflow optimize resnet-18` into "resnet-18 is not a file".
    """
    if spec.endswith(".onnx") or len(Path(spec).parts) > 1:
        return None
    return spec if spec in _MODELS else None


def model_path(spec: str, size: str = "small") -> Path:
    """The .onnx file MODEL `spec` names (`MODEL_RULE`): a zoo model's cached export (made on
    first use), else the existing file; RlflowError for a missing file or an unknown name."""
    name = zoo_name(spec)
    if name is not None:
        return cached_path(name, size)
    path = Path(spec)
    if path.is_file():
        return path
    if path.is_dir():
        raise RlflowError(f"{spec} is a directory, not an ONNX file")
    if spec.endswith(".onnx") or len(path.parts) > 1:
        raise RlflowError(f"no such file: {spec}")
    raise RlflowError(
        f"unknown model {spec!r}: not a zoo model ({', '.join(MODEL_NAMES)}) and not a file"
    )


def cache_dir() -> Path:
    """``$RLFLOW_CACHE_DIR/zoo``, or ``~/.cache/rlflow/zoo`` when the variable is unset."""
    root = os.environ.get("RLFLOW_CACHE_DIR")
    return (Path(root) if root else Path.home() / ".cache" / "rlflow") / "zoo"


def cached_path(name: str, size: str = "small") -> Path:
    """The cached export of ``name`` at ``size``, exporting it first if it is not there yet."""
    _check(name, size)
    path = cache_dir() / f"{name}-{size}-v{ZOO_VERSION}.onnx"
    if not path.exists():
        export(name, size, path)
    return path

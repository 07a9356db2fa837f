"""What several commands share: resolving MODEL (zoo name or .onnx path), `--json` output and
the torch thread count of the learning commands."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from rlflow.errors import RlflowError
from rlflow.fileio import write_bytes_atomic as write_atomic  # noqa: F401 (commands use it)
from rlflow.graph import Graph, load_model


def add_model_arguments(parser: argparse.ArgumentParser, nargs: str | None = None) -> None:
    parser.add_argument(
        "model", nargs=nargs, metavar="MODEL", help="a zoo name (rlflow zoo list) or an .onnx path"
    )
    add_model_options(parser)


def add_model_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--size",
        choices=("small", "medium", "full"),
        default="small",
        help="zoo model size (default small)",
    )
    parser.add_argument(
        "--input-shape",
        action="append",
        default=[],
        metavar="NAME=1x3x224x224",
        help="static shape for an input with dynamic dims (repeatable)",
    )


def add_threads_argument(parser: argparse.ArgumentParser) -> None:
    """`--threads` of the commands that run small torch networks (collect, train-*)."""
    parser.add_argument(
        "--threads", type=int, default=1, help="torch threads (default 1: small nets, shared CPUs)"
    )


def set_torch_threads(threads: int) -> None:
    """Apply `--threads`; RlflowError below 1."""
    import torch

    if threads < 1:
        raise RlflowError(f"--threads must be at least 1, got {threads}")
    torch.set_num_threads(threads)


def parse_input_shapes(specs: list[str]) -> dict[str, tuple[int, ...]]:
    shapes: dict[str, tuple[int, ...]] = {}
    for spec in specs:
        name, sep, dims = spec.rpartition("=")
        try:
            if not sep or not name:
                raise ValueError
            shapes[name] = tuple(int(d) for d in dims.lower().split("x"))
            if any(d < 0 for d in shapes[name]):
                raise ValueError
        except ValueError:
            raise RlflowError(f"bad --input-shape {spec!r}: expected NAME=1x3x224x224") from None
    return shapes


def model_path(spec: str, size: str = "small") -> Path:
    """The .onnx file MODEL names: a path as given, or the zoo's cached export."""
    path = Path(spec)
    if path.is_file():
        return path
    if spec.endswith(".onnx") or os.sep in spec or path.exists():
        raise RlflowError(f"no such file: {spec}" if not path.exists() else f"{spec} is not a file")
    from rlflow import zoo

    if spec in zoo.MODEL_NAMES:
        return zoo.cached_path(spec, size)
    names = ", ".join(zoo.MODEL_NAMES)
    raise RlflowError(f"unknown model {spec!r}: not a file and not a zoo model ({names})")


def resolve_model(spec: str, size: str = "small", input_shapes: list[str] | None = None) -> Graph:
    """Load MODEL into a Graph; errors are RlflowError with a one-line message."""
    return load_model(model_path(spec, size), parse_input_shapes(input_shapes or []))


def model_label(spec: str, size: str) -> str:
    from rlflow import zoo

    return f"{spec}:{size}" if spec in zoo.MODEL_NAMES and not Path(spec).is_file() else spec


def print_json(payload: dict[str, Any]) -> None:
    print(json.dumps(payload, indent=None, sort_keys=False, default=_jsonable))


def _jsonable(value: Any) -> Any:
    if hasattr(value, "item"):
        return value.item()
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


def stderr(message: str) -> None:
    print(message, file=sys.stderr)

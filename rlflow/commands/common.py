"""What several commands share: resolving MODEL (zoo name or .onnx path), checking flags and
output paths before any work, `--json` output and the torch thread count of the learning
commands.

Nothing heavy is imported here at module level (onnx, onnxruntime, torch): every command
imports this module, and a bad flag must be reported at once.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rlflow.errors import RlflowError
from rlflow.fileio import write_bytes_atomic as write_atomic  # noqa: F401 (commands use it)
from rlflow.zoo import MODEL_RULE

if TYPE_CHECKING:
    from rlflow.graph import Graph


def add_model_arguments(parser: argparse.ArgumentParser, nargs: str | None = None) -> None:
    parser.add_argument(
        "model", nargs=nargs, metavar="MODEL", help=f"a zoo name or an .onnx path: {MODEL_RULE}"
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


def add_env_arguments(parser: argparse.ArgumentParser) -> None:
    """`--deploy`, `--start` and `--provider`: how a training or collecting env runs graphs,
    where its episodes begin and what its measurements run on (train-ppo, collect,
    train-wm-loop)."""
    add_provider_argument(parser)
    parser.add_argument(
        "--deploy",
        choices=("offline", "online"),
        help="how graphs run (default offline: as written, as rlflow optimize hands them back)",
    )
    parser.add_argument(
        "--start",
        metavar="STATE",
        help="where episodes begin: original (default) or onnxruntime's graph, ort:all, "
        "ort:all-PASS, ...",
    )


def env_provider(flag: str | None) -> str | None:
    """A training env's `--provider`, checked here (`--provider cuda` without onnxruntime's
    CUDA provider is a one-line error before any work); None when not given: the env's own
    default, CUDA where onnxruntime lists it."""
    from rlflow.cost.session import OrtSettings

    return None if flag is None else OrtSettings(provider=flag).resolved().provider


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
    """`--input-shape NAME=1x3x224x224` flags as {name: dims}; every dim at least 1, each name
    once. Whether they fit the model (inputs it has, dims it fixes) is checked as it loads."""
    shapes: dict[str, tuple[int, ...]] = {}
    for spec in specs:
        name, sep, dims = spec.rpartition("=")
        try:
            if not sep or not name:
                raise ValueError
            shape = tuple(int(d) for d in dims.lower().split("x"))
        except ValueError:
            raise RlflowError(f"bad --input-shape {spec!r}: expected NAME=1x3x224x224") from None
        if any(d < 1 for d in shape):
            raise RlflowError(f"bad --input-shape {spec!r}: every dim must be at least 1")
        if name in shapes:
            raise RlflowError(f"--input-shape gives {name} twice")
        shapes[name] = shape
    return shapes


def model_path(spec: str, size: str = "small") -> Path:
    """The .onnx file MODEL names (`rlflow.zoo.model_path`: a zoo name's cached export, else the
    file). A zoo name wins over a local file of that name; that is said on stderr."""
    from rlflow import zoo

    if zoo.zoo_name(spec) is not None and Path(spec).is_file():
        stderr(f"rlflow: MODEL {spec} is the zoo model; write ./{spec} for the local file")
    return zoo.model_path(spec, size)


def resolve_model(spec: str, size: str = "small", input_shapes: list[str] | None = None) -> Graph:
    """Load MODEL into a Graph; errors are RlflowError with a one-line message."""
    from rlflow.graph import load_model

    shapes = parse_input_shapes(input_shapes or [])  # a bad flag fails before a zoo export
    return load_model(model_path(spec, size), shapes)


def model_label(spec: str, size: str) -> str:
    """How results name MODEL: `name:size` for a zoo model, the path as given for a file."""
    from rlflow import zoo

    return f"{spec}:{size}" if zoo.zoo_name(spec) is not None else spec


# ---- execution provider and cost ------------------------------------------------------------

PROVIDER_CHOICES = ("cuda", "cpu")
COST_TABLE_PREFIX = "table:"


def add_provider_argument(parser: argparse.ArgumentParser) -> None:
    """`--provider cuda|cpu` of every command that measures in onnxruntime."""
    parser.add_argument(
        "--provider",
        choices=PROVIDER_CHOICES,
        help="onnxruntime execution provider to measure on (default: cuda where onnxruntime "
        "lists CUDAExecutionProvider, else cpu)",
    )


def chosen_provider(flag: str | None, command: str) -> str:
    """The provider a command measures on: the flag's, else onnxruntime's best here. A default
    that lands on CUDA is said on stderr (timings on the GPU are not the CPU's); `--provider
    cuda` where onnxruntime has no CUDA provider is a one-line error."""
    from rlflow.cost.session import OrtSettings, default_provider

    if flag is not None:
        return OrtSettings(provider=flag).resolved().provider
    provider = default_provider()
    if provider == "cuda":
        print(
            f"rlflow {command}: measuring on cuda (onnxruntime lists CUDAExecutionProvider; "
            "--provider cpu for the CPU)",
            file=sys.stderr,
        )
    return provider


def cost_type(names: tuple[str, ...]) -> Any:
    """An argparse type for `--cost`: one of `names`, or table:NAME (a table shipped with
    rlflow, `rlflow costs list`) or table:PATH (a table written by `rlflow costs collect`)."""

    def parse(text: str) -> str:
        if text in names:
            return text
        if text.startswith(COST_TABLE_PREFIX) and text[len(COST_TABLE_PREFIX) :]:
            return text
        raise argparse.ArgumentTypeError(
            f"invalid choice: {text!r} (choose from {', '.join(names)}, table:NAME, table:PATH)"
        )

    return parse


def check_cost_table(
    cost: str | None, start: str | None = None, provider: str | None = None
) -> None:
    """RlflowError now, before any work, if `cost` names a table that cannot be read, or one
    of another provider than `provider` (measuring here) with a `start` it cannot take
    (`CostTable.check_start`)."""
    if cost is not None and cost.startswith(COST_TABLE_PREFIX):
        from rlflow.cost.session import OrtSettings
        from rlflow.cost.table import load_table

        table = load_table(cost[len(COST_TABLE_PREFIX) :])
        if start is not None:
            table.check_start(start, OrtSettings(provider=provider or "auto").resolved().provider)


# ---- checks before any work ------------------------------------------------------------------


def check_number(flag: str, value: float | None, minimum: float) -> None:
    """RlflowError unless `value` (None: the flag was not given) is a finite number of at least
    `minimum`: argparse's float() takes "nan" and "inf", which no setting means."""
    if value is None:
        return
    number = isinstance(value, int | float) and not isinstance(value, bool)
    if not number or not math.isfinite(value) or value < minimum:
        raise RlflowError(f"{flag} must be a number of at least {minimum:g}, got {value}")


def check_output_file(flag: str, path: str | Path) -> None:
    """RlflowError unless a file can be written at `path`: it is not a directory and its
    folder (made on writing if missing) can be written in. Commands check this before their
    work, so that a search of minutes never ends in a failed write."""
    path = Path(path)
    if path.is_dir():
        raise RlflowError(f"{flag} {path} is a directory; give a file name")
    _check_writable(flag, path, path.parent)


def check_output_dir(flag: str, path: str | Path) -> None:
    """RlflowError unless `path` is, or can be made as, a directory that can be written in."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise RlflowError(f"{flag} {path} exists and is not a directory")
    _check_writable(flag, path, path)


def _check_writable(flag: str, target: Path, folder: Path) -> None:
    """Probe `folder`, or its nearest existing ancestor, with a temporary file: the one test
    that answers for permissions, read-only mounts and root alike."""
    existing = folder
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise RlflowError(f"{flag} {target}: {existing} is not a directory")
    try:
        with tempfile.TemporaryFile(dir=existing):
            pass
    except OSError as error:
        reason = error.strerror or type(error).__name__
        raise RlflowError(f"{flag} {target}: cannot write in {existing} ({reason})") from None


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

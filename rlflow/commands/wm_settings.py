"""How the world-model commands (collect, train-wm, train-controller) take their settings.

Each has a settings dataclass and a section of configs/worldmodel.yaml; the settings are the
dataclass's defaults, then that section (of `--config FILE` if given), then the flags given
on the command line. All three also take `--threads`, `--quiet` and `--json`.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any, TypeVar

from rlflow.commands.common import add_threads_argument, set_torch_threads

T = TypeVar("T")


def add_common_options(parser: argparse.ArgumentParser, run: Callable[..., int]) -> None:
    """`--config`, `--threads`, `--quiet` and `--json`, and the command's `run`."""
    parser.add_argument("--config", metavar="FILE", help="YAML config (configs/worldmodel.yaml)")
    add_threads_argument(parser)
    parser.add_argument("--quiet", action="store_true", help="no progress bars")
    parser.add_argument("--json", action="store_true", help="print one JSON object last")
    parser.set_defaults(run=run)


def settings_from(
    args: argparse.Namespace, cls: type[T], section: str, flags: list[str], **given: Any
) -> T:
    """Apply `--threads`; the command's settings: `cls`'s defaults, then `section` of the
    config file, then the `flags` given, then `given` (values the command sets itself)."""
    from rlflow import config

    set_torch_threads(args.threads)
    values = {**config.section(args.config, section), **config.overrides(args, flags), **given}
    return config.build(cls, values, f"{section} settings")

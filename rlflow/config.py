"""Settings of the commands: YAML config files, CLI overrides, run directories' config.yaml.

The one place rlflow reads YAML. Precedence: the settings dataclass's defaults, then the config
file's section, then the flags given on the command line. A run directory keeps the settings it
was made with in `config.yaml` (with its `kind`); a rerun must agree with them.
"""

from __future__ import annotations

import dataclasses
from importlib.resources import files
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import Any, TypeVar

import yaml

from rlflow.errors import RlflowError, first_line
from rlflow.fileio import write_bytes_atomic

CONFIGS = files("rlflow.configs")
"""The shipped config files (the repository's configs/, installed as rlflow.configs)."""
DEFAULT_CONFIG = CONFIGS / "worldmodel.yaml"
"""What collect, train-wm and train-controller read their section of without `--config`."""

T = TypeVar("T")


def read_yaml(path: str | Path | Traversable) -> dict[str, Any]:
    """The mapping in a YAML file (empty for an empty file); RlflowError if it is missing,
    unreadable or not a mapping."""
    path = Path(path) if isinstance(path, str) else path
    try:
        values = yaml.safe_load(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise RlflowError(f"no such config file: {path}") from None
    except (OSError, yaml.YAMLError) as error:
        raise RlflowError(f"config {path} is unreadable ({first_line(error)})") from None
    if values is None:
        return {}
    if not isinstance(values, dict):
        raise RlflowError(f"config {path} must be a mapping")
    return values


def section(path: str | Path | None, name: str) -> dict[str, Any]:
    """Section `name` of a config file (`path`, else `DEFAULT_CONFIG`)."""
    path = DEFAULT_CONFIG if path is None else path
    values = read_yaml(path).get(name, {}) or {}
    if not isinstance(values, dict):
        raise RlflowError(f"config {path}: section {name!r} must be a mapping")
    return values


def build(cls: type[T], values: dict[str, Any], source: str) -> T:
    """`cls(**values)`, with unknown keys and wrong types reported as one line."""
    names = {field.name for field in dataclasses.fields(cls)}  # type: ignore[arg-type]
    unknown = sorted(set(values) - names)
    if unknown:
        raise RlflowError(f"{source}: unknown setting(s) {', '.join(unknown)}")
    try:
        settings = cls(**values)
    except TypeError as error:
        raise RlflowError(f"{source}: {first_line(error)}") from None
    for field in dataclasses.fields(cls):  # type: ignore[arg-type]
        value, default = getattr(settings, field.name), _default(field)
        if default is None or value is None:
            continue
        expected = float if isinstance(default, float) else type(default)
        if expected is float and isinstance(value, int) and not isinstance(value, bool):
            setattr(settings, field.name, float(value))
        elif not isinstance(value, expected) or (expected is int and isinstance(value, bool)):
            raise RlflowError(f"{source}: {field.name} must be {expected.__name__}, got {value!r}")
    return settings


def _default(field: dataclasses.Field) -> Any:
    if field.default is not dataclasses.MISSING:
        return field.default
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    return None


def overrides(args: Any, names: list[str]) -> dict[str, Any]:
    """The flags among `names` that were given (argparse default None means not given)."""
    return {name: getattr(args, name) for name in names if getattr(args, name, None) is not None}


def write_run_config(
    run_dir: Path, kind: str, values: dict[str, Any], may_change: tuple[str, ...] = ()
) -> None:
    """Write RUN_DIR/config.yaml (`kind` first, then `values`), or check that a rerun agrees
    with the one there on everything but `may_change` (e.g. epochs, which a rerun may raise)."""
    path = Path(run_dir) / "config.yaml"
    if path.exists():
        saved = read_yaml(path)
        if saved.get("kind") != kind:
            raise RlflowError(f"{run_dir} holds a {saved.get('kind')!r} run, not a {kind!r} run")
        keys = (set(saved) | set(values)) - set(may_change) - {"kind"}
        differ = sorted(key for key in keys if saved.get(key) != values.get(key))
        if differ:
            raise RlflowError(
                f"{run_dir} was made with other settings ({', '.join(differ)} differ); "
                "use a new --out or the same settings"
            )
    save_run_config(run_dir, kind, values)


def save_run_config(run_dir: Path, kind: str, values: dict[str, Any]) -> None:
    """Write RUN_DIR/config.yaml (`kind` first, then `values`) atomically, as it is."""
    text = yaml.safe_dump({"kind": kind, **values}, sort_keys=False)
    write_bytes_atomic(Path(run_dir) / "config.yaml", text.encode("utf-8"))


def run_name(run_dir: str | Path) -> str:
    """How tables name a run directory: its name, with its parent's for one of several seeds
    (`runs/ppo-sq/seed-0` -> `ppo-sq/seed-0`, as `--seeds` lays them out)."""
    run_dir = Path(run_dir)
    if run_dir.name.startswith("seed-") and run_dir.parent.name:
        return f"{run_dir.parent.name}/{run_dir.name}"
    return run_dir.name


def run_kind(run_dir: str | Path, label: str, what: str) -> tuple[Path, Any]:
    """(the run directory, the `kind` its config.yaml names, None if none): the check every
    `agent:`, `guided:` and `regal:` spec starts with. RlflowError, naming the `label` of run
    wanted, if the directory is missing or holds no config.yaml (it is then not `what`)."""
    path = Path(run_dir)
    if not path.is_dir():
        raise RlflowError(f"no such {label} run directory: {run_dir}")
    config_path = path / "config.yaml"
    if not config_path.is_file():
        raise RlflowError(f"{run_dir} has no config.yaml: not {what}")
    return path, read_yaml(config_path).get("kind")

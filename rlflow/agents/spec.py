"""How a trained agent is named on the command line: `agent:RUN_DIR`, parsed once into a value.

`rlflow optimize --agent RUN_DIR`, `rlflow bench --methods ... agent:RUN_DIR` and
`rlflow collect --policy agent:RUN_DIR` all name an agent this way; the kind of agent (a PPO
run or a world-model controller run) is read from the run's own `config.yaml`, so the user
never has to say it. Loading the agent's policy is the world model's job
(`rlflow.worldmodel.policy.load_agent_policy`), since a controller needs the world model.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from rlflow.config import run_kind, run_name
from rlflow.errors import RlflowError

AGENT_PREFIX = "agent:"
AGENT_KINDS = ("ppo", "controller")
"""The `kind` in a run's config.yaml: `rlflow train-ppo` or `rlflow train-controller`."""


@dataclass(frozen=True)
class AgentSpec:
    """A trained agent: its run directory and its kind (from the run's config.yaml)."""

    run_dir: Path
    kind: str

    @property
    def label(self) -> str:
        """A short name for tables: `agent:runs/ppo-sq/` -> `agent:ppo-sq`, and
        `agent:runs/ppo-sq/seed-0` -> `agent:ppo-sq/seed-0`."""
        return AGENT_PREFIX + run_name(self.run_dir)

    def __str__(self) -> str:
        return f"{AGENT_PREFIX}{self.run_dir}"


def is_agent_spec(text: str) -> bool:
    """Whether a method or policy name is `agent:RUN_DIR` (the legacy `ppo:` and
    `controller:` prefixes of `collect --policy` included)."""
    return text.startswith((AGENT_PREFIX, *(f"{kind}:" for kind in AGENT_KINDS)))


def read_agent(run_dir: str | Path) -> AgentSpec:
    """The agent of a training run directory; RlflowError unless it holds one."""
    path, kind = run_kind(run_dir, "agent", "a training run directory")
    config_path = path / "config.yaml"
    if kind is None:
        raise RlflowError(f"{config_path} names no kind (ppo or controller)")
    if kind not in AGENT_KINDS:
        raise RlflowError(
            f"{config_path}: unknown kind {kind!r}; expected {' or '.join(AGENT_KINDS)}"
        )
    return AgentSpec(path, str(kind))


def parse_agent(text: str) -> AgentSpec:
    """`agent:RUN_DIR` as an AgentSpec. `ppo:RUN_DIR` and `controller:RUN_DIR` (the older
    spelling of `collect --policy`) are accepted when the run is of that kind."""
    prefix, _, run_dir = text.partition(":")
    if not is_agent_spec(text) or not run_dir:
        raise RlflowError(f"bad agent {text!r}: expected agent:RUN_DIR")
    spec = read_agent(run_dir)
    if prefix in AGENT_KINDS and prefix != spec.kind:
        raise RlflowError(f"{run_dir} holds a {spec.kind} run, not a {prefix} run")
    return spec


__all__ = ["AGENT_KINDS", "AGENT_PREFIX", "AgentSpec", "is_agent_spec", "parse_agent", "read_agent"]

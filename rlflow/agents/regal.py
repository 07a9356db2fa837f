"""REGAL (Paliwal et al., "Reinforced Genetic Algorithm Learning for Optimizing Computation
Graphs", ICLR 2020): a GNN that gives, per gene of a start graph's BRKGA chromosome, the
parameters of the chromosome distribution, trained with REINFORCE on how much BRKGA with those
biases beats plain BRKGA at equal evaluations.

This module is the light part, loaded without torch: how a trained run is named on the command
line (`regal:RUN_DIR`, checked like `agent:RUN_DIR` in `rlflow.agents.spec`) and the run's
hyperparameters (`RegalConfig`, mirrored by configs/regal.yaml). The network is
`rlflow.agents.regal_policy`, the training loop `rlflow.agents.regal_train`; the search it
biases is `rlflow.search.brkga`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlflow.config import run_kind
from rlflow.errors import RlflowError

REGAL_PREFIX = "regal:"
RUN_KIND = "regal"
"""The `kind` in the config.yaml of a `rlflow train-regal` run."""
CHECKPOINT = Path("checkpoints") / "latest.pt"


def is_regal_spec(text: str) -> bool:
    """Whether a method name is `regal:RUN_DIR` (or `regal` alone, which lacks its run)."""
    return text == REGAL_PREFIX[:-1] or text.startswith(REGAL_PREFIX)


def read_regal_run(run_dir: str | Path) -> Path:
    """The run directory, if it holds a `rlflow train-regal` run; else RlflowError."""
    path, kind = run_kind(run_dir, "REGAL", "a `rlflow train-regal` run")
    config_path = path / "config.yaml"
    if kind != RUN_KIND:
        raise RlflowError(
            f"{config_path} is a {kind!r} run, not a {RUN_KIND!r} run of `rlflow train-regal`"
        )
    if not (path / CHECKPOINT).is_file():
        raise RlflowError(f"{run_dir} has no checkpoint yet ({CHECKPOINT})")
    return path


def parse_regal(text: str) -> Path:
    """`regal:RUN_DIR` as the run directory (checked)."""
    prefix, _, run_dir = text.partition(":")
    if prefix != REGAL_PREFIX[:-1] or not run_dir:
        raise RlflowError(f"bad method {text!r}: expected regal:RUN_DIR (a train-regal run)")
    return read_regal_run(run_dir)


@dataclass
class RegalConfig:
    """Hyperparameters of a REGAL run; `configs/regal.yaml` mirrors them."""

    # ---- the graphs and how they are costed
    models: list[str] = field(default_factory=lambda: ["squeezenet-1.1"])  # one per run, in turn
    size: str = "small"  # zoo model size: small | medium | full
    start: str = "original"  # where BRKGA starts: original | ort:all | ... (offline start states)
    cost: str = "analytic"  # search cost of the decoded graphs: analytic | perop
    portable: bool = False  # only rules that emit standard ONNX ops

    # ---- BRKGA (rlflow.search.brkga.BrkgaConfig), the same for the biased and plain runs
    budget: int = 100  # chromosome evaluations of each run
    population: int = 24
    elite_fraction: float = 0.2
    mutant_fraction: float = 0.15
    inheritance: float = 0.7  # plain BRKGA's; the policy gives its own per gene
    threshold: float = 0.5
    max_steps: int = 16
    concentration: float = 2.0  # c of the key distribution Beta(c m, c (1 - m))
    seeds: int = 4  # BRKGA seeds per model (plain BRKGA runs once per model and seed)

    # ---- the network (rlflow.nn's GraphEncoder, then the per-gene heads)
    hidden: int = 64
    layers: int = 3
    heads: int = 4

    # ---- REINFORCE
    seed: int = 0  # seed of torch and of the BRKGA seeds
    total_runs: int = 200  # biased BRKGA runs of the whole training (a rerun continues)
    runs_per_update: int = 4  # runs whose rewards make one policy-gradient step
    learning_rate: float = 1e-3  # Adam
    baseline_decay: float = 0.9  # per-model moving average of the reward, the baseline
    ent_coef: float = 0.0  # entropy bonus of the per-gene Beta distributions
    max_grad_norm: float = 1.0
    torch_threads: int = 1

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> RegalConfig:
        """A config from a mapping (YAML); unknown keys are an error, missing ones default."""
        known = {f.name for f in dataclasses.fields(cls)}
        values = {key: value for key, value in values.items() if key != "kind"}
        unknown = sorted(set(values) - known)
        if unknown:
            raise RlflowError(f"unknown REGAL config keys: {', '.join(unknown)}")
        try:
            config = cls(**values)
        except TypeError as error:
            raise RlflowError(f"bad REGAL config: {error}") from None
        config.validate()
        return config

    def validate(self) -> None:
        if isinstance(self.models, str):
            self.models = [self.models]
        self.models = [str(model) for model in self.models]
        if not self.models:
            raise RlflowError("give at least one model to train on")
        if self.cost not in ("analytic", "perop"):
            raise RlflowError(f"REGAL trains on the analytic or perop cost, not {self.cost!r}")
        for name in ("budget", "total_runs", "runs_per_update", "seeds", "torch_threads"):
            if getattr(self, name) < 1:
                raise RlflowError(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.concentration <= 0:
            raise RlflowError(f"concentration must be positive, got {self.concentration}")
        if not 0.0 <= self.baseline_decay < 1.0:
            raise RlflowError(f"baseline_decay must be in [0, 1), got {self.baseline_decay}")
        if self.hidden % self.heads:
            raise RlflowError(f"hidden ({self.hidden}) must be a multiple of heads ({self.heads})")
        self.brkga().validate()

    def brkga(self) -> Any:
        """The BRKGA parameters of this run (`rlflow.search.brkga.BrkgaConfig`)."""
        from rlflow.search.brkga import BrkgaConfig

        return BrkgaConfig(
            population=self.population,
            elite_fraction=self.elite_fraction,
            mutant_fraction=self.mutant_fraction,
            inheritance=self.inheritance,
            threshold=self.threshold,
            max_steps=self.max_steps,
        )


__all__ = [
    "CHECKPOINT",
    "REGAL_PREFIX",
    "RUN_KIND",
    "RegalConfig",
    "is_regal_spec",
    "parse_regal",
    "read_regal_run",
]

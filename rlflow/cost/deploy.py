"""How an optimised model is meant to run: the deployment contract, written into the model.

- **offline** (the default): the model runs *as written*, as in onnxruntime's own offline mode
  (optimise once, save, load with the optimiser off). It declares so in onnxruntime's metadata
  entry `ort_config` (`{"session_options": {"graph_optimization_level": 0}}`), which
  onnxruntime itself honours when `ORT_LOAD_CONFIG_FROM_MODEL=1`, and `rlflow.runtime` always.
  Every decision rlflow made is then the one that runs; the model also records the target it
  was tuned for (`rlflow.cost.target`).
- **online**: onnxruntime's optimiser runs over the result when it loads (level `all`, no
  declaration needed): portable, but ORT may redo what rlflow undid.

`declared_settings` reads a model's declaration back, so that the Runner, the equivalence check
and `rlflow measure` run every model under the settings it declares.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, replace

from rlflow.cost.session import ORT_LEVELS, OrtSettings
from rlflow.cost.target import TARGET_KEY, Target, target_for
from rlflow.errors import RlflowError

ORT_CONFIG_KEY = "ort_config"
"""onnxruntime's own metadata entry for session options carried by a model."""
DEPLOY_MODES = ("offline", "online")
LEVEL_NUMBERS = {name: int(level) for name, level in ORT_LEVELS.items()}
"""Level name -> the number onnxruntime's `graph_optimization_level` takes (0, 1, 2, 3, 99)."""


@dataclass(frozen=True)
class Deployment:
    """offline (run as written, optimiser off) or online (ORT's optimiser at load)."""

    mode: str = "offline"

    def __post_init__(self) -> None:
        if self.mode not in DEPLOY_MODES:
            raise RlflowError(f"unknown deploy mode {self.mode!r}; choose offline or online")

    @property
    def ort_level(self) -> str:
        """The level a model deployed this way runs at."""
        return "disable" if self.mode == "offline" else "all"

    def settings(self, base: OrtSettings) -> OrtSettings:
        """`base` (threads, provider) at this deployment's level, no pass switched off."""
        return replace(base, ort_level=self.ort_level, disabled=())

    def metadata(self, provider: str, domains: set[str]) -> dict[str, str]:
        """The metadata entries a model deployed this way carries: `ort_config` and its target
        in offline mode; none online (ORT's defaults need no declaration)."""
        if self.mode == "online":
            return {}
        config = {"session_options": {"graph_optimization_level": LEVEL_NUMBERS["disable"]}}
        target = target_for(provider, domains)
        return {ORT_CONFIG_KEY: json.dumps(config), TARGET_KEY: target.to_json()}


def declared_level(metadata: Mapping[str, str]) -> str | None:
    """The ORT level a model declares in `ort_config` (None: it declares none)."""
    text = metadata.get(ORT_CONFIG_KEY)
    if text is None:
        return None
    try:
        number = json.loads(text)["session_options"]["graph_optimization_level"]
    except (ValueError, KeyError, TypeError):
        raise RlflowError(f"unreadable {ORT_CONFIG_KEY} metadata: {text[:80]!r}") from None
    for name, value in LEVEL_NUMBERS.items():
        if value == number:
            return name
    raise RlflowError(f"{ORT_CONFIG_KEY} declares an unknown optimisation level {number!r}")


def declared_settings(metadata: Mapping[str, str], base: OrtSettings) -> OrtSettings:
    """The settings a model runs under: `base` with the level it declares, if any."""
    level = declared_level(metadata)
    return base if level is None else replace(base, ort_level=level, disabled=())


def declared_target(metadata: Mapping[str, str]) -> Target | None:
    text = metadata.get(TARGET_KEY)
    return None if text is None else Target.from_json(text)


__all__ = [
    "DEPLOY_MODES",
    "ORT_CONFIG_KEY",
    "Deployment",
    "declared_level",
    "declared_settings",
    "declared_target",
]

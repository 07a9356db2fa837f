"""A search's recorded path as world-model data: walk it, then explore from where it was left.

A world model learns only the transitions its data shows. On SqueezeNet from the model as
written, the graph worth the most (onnxruntime's whole blocked layout) lies some fifty rewrites
away, through steps that lose on their own, and random episodes almost never show the end of
that path: the world models priced it at a loss and their controllers stopped near greedy's
graph (docs/BENCHMARKS.md, "Learners against search"). PPO started on taso's recorded path
(`train-ppo --demo`) is "the search, then RL"; this is the world model's counterpart.

`demo:RESULT.json` (`rlflow collect --policy`, `train-wm-loop --demo`) walks the recorded
episode (`rlflow optimize --json`, or one cell of a bench's results.json), then hands over to
the rule-level random agent (`random-rule-cheapest`, with the collection's stop probability
and rule repeat) for the rest of the episode. The first episode of each shard walks the whole
path; every other one leaves it after a prefix of uniformly drawn length (0 to all of it), so
the data holds the path itself and branches off it at every depth (return, then explore, as in
Go-Explore). A recorded step the env does not offer hands over early. The steps walked are real
env steps like any other, counted in the data's manifest.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from rlflow.agents.demos import offered_slot, read_demos
from rlflow.errors import RlflowError
from rlflow.search.replay import Recording
from rlflow.worldmodel.collect import RandomPolicy

DEMO_PREFIX = "demo:"


def is_demo_spec(spec: str) -> bool:
    return spec.startswith(DEMO_PREFIX)


def read_demo(spec: str) -> Recording:
    """The recording of `demo:RESULT.json` (one-line RlflowError for a file without one)."""
    path = spec.removeprefix(DEMO_PREFIX)
    if not path:
        raise RlflowError(f"bad policy {spec!r}: expected demo:RESULT.json")
    return read_demos([path])[0]


class DemoPolicy:
    """Walks a recorded episode for a prefix of it, then acts as `explorer` (see the module
    docstring). Needs the env (`act(..., env=...)`) to find the recorded steps among its
    candidates."""

    def __init__(self, recording: Recording, explorer: RandomPolicy) -> None:
        self.recording = recording
        self.explorer = explorer
        self.env_config: dict[str, Any] = {}
        self.episodes = 0
        self.starting = False
        """Set by `reset`: the episode's prefix is drawn at its first step."""
        self.prefix = 0
        """Recorded steps this episode walks (cut short where the env does not offer one)."""
        self.position = 0
        self.walked = 0
        """Recorded steps walked so far (over all episodes): what the data took from the path."""

    def reset(self) -> None:
        """A new episode: the whole path for a shard's first, a random prefix for the others
        (drawn at the first step, from the shard's action stream)."""
        self.explorer.reset()
        self.starting = True
        self.episodes += 1

    def act(
        self,
        observation: Mapping[str, np.ndarray],
        *,
        deterministic: bool = False,
        rng: np.random.Generator,
        env: Any = None,
    ) -> int:
        if env is None:
            raise RlflowError("a demo policy needs the env to find the recorded steps")
        unwrapped = getattr(env, "unwrapped", env)
        actions = self.recording.episode.actions
        if self.starting:
            self._check_start(unwrapped)
            whole = self.episodes == 1
            self.prefix = len(actions) if whole else int(rng.integers(len(actions) + 1))
            self.position, self.starting = 0, False
        if self.position < self.prefix:
            slot = offered_slot(unwrapped.offered_candidates(), actions[self.position])
            if slot is not None and observation["action_mask"][slot]:
                self.position += 1
                self.walked += 1
                return slot
            self.prefix = self.position  # the env does not offer the recorded step: explore
        return self.explorer.act(observation, deterministic=deterministic, rng=rng, env=env)

    def _check_start(self, env: Any) -> None:
        episode = self.recording.episode
        if env.session.original.canonical_hash() != episode.original_hash:
            raise RlflowError(
                f"demo {self.recording.path} starts from another graph than this collection's "
                f"(recorded on {episode.model or 'another model'} from "
                f"{self.recording.start_state}: give that one model and the same --start, "
                "--size and --deploy)"
            )

    def __repr__(self) -> str:
        return f"DemoPolicy({self.recording.path}, then {self.explorer!r})"


def load_demo_policy(spec: str, stop_probability: float, rule_repeat: float) -> DemoPolicy:
    """`demo:RESULT.json`: its path, then the rule-level random agent that takes the sites a
    controller would (`random-rule-cheapest`) with these stop and repeat chances."""
    explorer = RandomPolicy(stop_probability, cheapest_site=True, rule_repeat=rule_repeat)
    return DemoPolicy(read_demo(spec), explorer)

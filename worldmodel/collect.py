"""Real-environment rollouts for the world model: RLFlow's random agent, shards, resume.

`collect(settings, out)` runs `settings.episodes` episodes of GraphRewrite-v0 with a policy and
writes them as shards (`rlflow.worldmodel.data`). Shard k holds the next `episodes_per_shard`
episodes, seeded from (seed, k), so a rerun skips every shard the manifest lists as finished
(never rewriting one) and a larger `episodes` only adds shards. The manifest records the real
env steps and real end-to-end measurements each shard cost, for the sample-efficiency
comparison with PPO. With `candidate_samples` S > 0, every visited state also records the
cost change of S of its candidates drawn at random (`GraphRewriteEnv.candidate_cost_changes`):
the targets of the learned local advantage (`rlflow train-advantage`).
"""

from __future__ import annotations

import multiprocessing
import sys
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from rlflow.agents.spec import is_agent_spec, parse_agent
from rlflow.cost.deploy import Deployment
from rlflow.cost.ort_optimizer import check_start_name
from rlflow.errors import RlflowError
from rlflow.worldmodel.data import (
    MANIFEST,
    SHARD_FORMAT,
    SHARD_PATTERN,
    EpisodeRecord,
    observation_record,
    read_manifest,
    read_shard,
    step_record,
    write_manifest,
    write_shard,
)

if TYPE_CHECKING:
    from rlflow.agents.policy import Policy


RULE_REPEAT_NEEDS_RULES = (
    "--rule-repeat needs a rule-level agent (random-rule or random-rule-cheapest)"
)
"""Refused for RLFlow's agent (it draws candidates, not rules) and for trained agents."""


class RandomPolicy:
    """RLFlow's random agent: stop with probability `stop_probability`, else a candidate drawn
    uniformly among those on offer (stop when there is none).

    `by_rule` (`--policy random-rule`) draws a rule uniformly among the rules with a candidate
    on offer, then one of its sites: a rule with few sites (one attention fusion per layer
    beside a hundred element-wise moves) is drawn as often as any other, so the world model
    sees what it does from a few episodes.

    `cheapest_site` (`--policy random-rule-cheapest`) then takes the rule's site a controller
    would (`rlflow.worldmodel.policy.cheapest_site`: the lowest cost by the env's own estimate,
    per-op offline) instead of a random one. The world model's action is the rule, not its
    site, so it prices a rule at the average of the sites the data applied it to; where a rule
    gains at some sites and loses at others (ResNet-18's `nchwc-conv-unblock`: +1.1 to +2.2% at
    the last stage's convolutions, -0.3 to -3.7% at the earlier ones), random sites price it as
    a loss, though the controller, choosing as here, would apply it where it gains.

    `rule_repeat` (`--rule-repeat P`, rule-level agents only) draws the last step's rule again
    with probability P while it is still on offer, so rules come in runs of 1 / (1 - P) steps on
    average (temporally extended exploration): a graph that pays only after a run of one rule
    (SqueezeNet's blocked layout: every Conv blocked, then the reorder pairs between them
    cancelled) is as rare in uniform draws, among some forty rules and their reverses, as the
    product of that rule's chances, and a world model never shown it cannot dream it."""

    def __init__(
        self,
        stop_probability: float = 0.2,
        *,
        by_rule: bool = False,
        cheapest_site: bool = False,
        rule_repeat: float = 0.0,
    ) -> None:
        if not 0.0 <= stop_probability <= 1.0:
            raise RlflowError(f"stop probability must be in [0, 1], got {stop_probability}")
        if not 0.0 <= rule_repeat < 1.0:
            raise RlflowError(f"--rule-repeat must be in [0, 1), got {rule_repeat}")
        if rule_repeat and not (by_rule or cheapest_site):
            raise RlflowError(RULE_REPEAT_NEEDS_RULES)
        self.stop_probability = stop_probability
        self.by_rule = by_rule or cheapest_site
        self.cheapest_site = cheapest_site
        self.rule_repeat = rule_repeat
        self.last_rule: int | None = None
        self.env_config: dict[str, Any] = {}

    def reset(self) -> None:
        """A new episode: the next rule is drawn afresh."""
        self.last_rule = None

    def act(
        self,
        observation: Mapping[str, np.ndarray],
        *,
        deterministic: bool = False,
        rng: np.random.Generator,
        env: Any = None,
    ) -> int:
        mask = np.asarray(observation["action_mask"])
        stop = len(mask) - 1
        offered = np.flatnonzero(mask[:-1])
        if offered.size == 0 or rng.random() < self.stop_probability:
            return stop
        if self.by_rule:
            rules = np.asarray(observation["candidate_rules"])[offered]
            repeat = (
                self.rule_repeat
                and self.last_rule is not None
                and self.last_rule in rules
                and rng.random() < self.rule_repeat  # drawn only when repeating is possible
            )
            rule = self.last_rule if repeat else int(rng.choice(np.unique(rules)))
            self.last_rule = rule
            offered = offered[rules == rule]
        if self.cheapest_site and env is not None:
            from rlflow.worldmodel.policy import cheapest_site

            unwrapped = getattr(env, "unwrapped", env)
            return cheapest_site(unwrapped.offered_candidates(), offered, unwrapped)
        return int(rng.choice(offered))

    def __repr__(self) -> str:
        return (
            f"RandomPolicy(stop_probability={self.stop_probability}, by_rule={self.by_rule}, "
            f"cheapest_site={self.cheapest_site}, rule_repeat={self.rule_repeat})"
        )


RANDOM_POLICIES = ("random", "random-rule", "random-rule-cheapest")
"""The random agents: uniform over candidates (RLFlow's), uniform over rules then sites, and
uniform over rules then the site a controller would take."""


def load_policy(spec: str, stop_probability: float = 0.2, rule_repeat: float = 0.0) -> Policy:
    """`random` (RLFlow's random agent), `random-rule` (uniform over rules, then sites),
    `random-rule-cheapest` (then the site a controller would take), `agent:RUN_DIR` (a
    `rlflow train-ppo` run, or a `rlflow train-controller` run for World Models' iterative
    collection) or `demo:RESULT.json` (a search's recorded path, then `random-rule-cheapest`;
    `rlflow.worldmodel.demo_policy`). The stop probability and rule repeat are the random
    agents' own."""
    from rlflow.worldmodel.demo_policy import is_demo_spec, load_demo_policy

    if is_demo_spec(spec):
        return load_demo_policy(spec, stop_probability, rule_repeat)
    if spec in RANDOM_POLICIES:
        return RandomPolicy(
            stop_probability,
            by_rule=spec == "random-rule",
            cheapest_site=spec == "random-rule-cheapest",
            rule_repeat=rule_repeat,
        )
    if not is_agent_spec(spec) or not spec.partition(":")[2]:
        raise RlflowError(
            f"bad --policy {spec!r}: expected {', '.join(RANDOM_POLICIES)}, agent:RUN_DIR "
            "or demo:RESULT.json"
        )
    if rule_repeat:
        raise RlflowError(RULE_REPEAT_NEEDS_RULES)
    from rlflow.worldmodel.policy import load_agent_policy

    return load_agent_policy(parse_agent(spec))


@dataclass
class CollectSettings:
    """What defines a data directory; a rerun must give the same (except episodes, workers)."""

    models: list[str]  # zoo names or .onnx paths; one is drawn per episode (multi-graph)
    episodes: int = 64  # episodes wanted in the directory in total (finished shards count)
    policy: str = "random"  # random | random-rule | random-rule-cheapest | agent:RUN_DIR | demo:..
    size: str = "small"  # zoo model size: small | medium | full
    # reward cost source of the env: analytic | perop | perop-e2e | e2e | e2e-sparse | table:...;
    # None: the env's default for the deploy mode (perop offline, analytic online)
    cost: str | None = None
    deploy: str = "offline"  # how graphs run: offline (as written, as optimize hands back) | online
    start: str = "original"  # where episodes begin: original | ort:all | ort:all-PASS | ...
    seed: int = 0  # seed of shard k's env resets and action draws: (seed, k)
    stop_probability: float = 0.2  # the random agent's chance to stop at each step (RLFlow: 0.2)
    rule_repeat: float = 0.0  # a rule-level random agent's chance to draw its last rule again
    episodes_per_shard: int = 16  # episodes per shard file
    max_episode_steps: int = 50  # truncation of an episode (the env's TimeLimit)
    env: dict[str, Any] = field(default_factory=dict)  # other GraphRewriteEnv arguments
    candidate_samples: int = 0  # candidates per state whose cost change is recorded (0: none)

    def identity(self) -> dict[str, Any]:
        """The settings a rerun must match to add to the same directory (without
        candidate_samples when 0, so that directories made before it existed still match)."""
        identity = asdict(self)
        for key in ("episodes", "episodes_per_shard"):
            identity.pop(key)
        if not self.candidate_samples:
            identity.pop("candidate_samples")
        if not self.rule_repeat:
            identity.pop("rule_repeat")
        if self.deploy == "online":  # directories made before deploy existed were online
            identity.pop("deploy")
        if self.start == "original":
            identity.pop("start")
        return identity

    def make_policy(self) -> Policy:
        """The collecting policy (`load_policy` of these settings)."""
        return load_policy(self.policy, self.stop_probability, self.rule_repeat)

    def env_kwargs(self) -> dict[str, Any]:
        """The GraphRewriteEnv arguments these settings fix, over the free-form `env` ones."""
        kwargs = {**self.env, "size": self.size, "deploy": self.deploy, "start": self.start}
        if self.cost is not None:
            kwargs["cost"] = self.cost
        return kwargs


@dataclass
class ShardJob:
    index: int
    episodes: int
    path: str
    settings: dict[str, Any]


def make_env(settings: CollectSettings, env_config: Mapping[str, Any] | None = None) -> Any:
    """The real GraphRewrite-v0 env of `settings` (the policy's env_config underneath)."""
    import gymnasium as gym

    import rlflow.envs

    kwargs: dict[str, Any] = dict(env_config or {})
    kwargs.pop("models", None)
    kwargs.update(settings.env_kwargs())
    kwargs.setdefault("max_episode_steps", settings.max_episode_steps)
    return gym.make(rlflow.envs.GRAPH_REWRITE_ID, models=list(settings.models), **kwargs)


def run_shard(job: ShardJob, on_step: Callable[[int], object] | None = None) -> dict[str, Any]:
    """Collect one shard's episodes in a fresh env and write the shard; its manifest entry."""
    settings = CollectSettings(**job.settings)
    policy = settings.make_policy()
    env = make_env(settings, policy.env_config)
    unwrapped = env.unwrapped
    num_rules = len(unwrapped.rule_names)
    seed_sequence = np.random.SeedSequence([settings.seed, job.index])
    env_seed, action_seed = seed_sequence.generate_state(2)
    rng = np.random.default_rng(action_seed)
    # Its own stream: sampling candidates leaves the actions of a seed as they were.
    sample_rng = np.random.default_rng([settings.seed, job.index, 1])
    samples = settings.candidate_samples

    def record_of(observation: Mapping[str, np.ndarray], model: int) -> dict[str, Any]:
        record = observation_record(observation, num_rules, model)
        if samples:
            record.update(candidate_targets(unwrapped, observation, samples, sample_rng))
        return record

    started = time.perf_counter()
    measurements_before = unwrapped.real_measurements
    episodes: list[EpisodeRecord] = []
    labels = [unwrapped.model_label(index) for index in range(len(unwrapped.models))]
    real_steps = 0
    try:
        for episode in range(job.episodes):
            observation, info = env.reset(seed=int(env_seed) if episode == 0 else None)
            model = labels.index(info["model"])
            record = EpisodeRecord(model=model)
            current = record_of(observation, model)
            record.observations.append(current)
            if hasattr(policy, "reset"):
                policy.reset()
            while True:
                action = policy.act(observation, deterministic=False, rng=rng, env=unwrapped)
                next_observation, reward, terminated, truncated, info = env.step(action)
                real_steps += 1
                following = record_of(next_observation, model)
                record.steps.append(
                    step_record(
                        observation, action, reward, terminated, truncated, following, num_rules
                    )
                )
                record.observations.append(following)
                observation = next_observation
                if on_step is not None:
                    on_step(1)
                if terminated or truncated:
                    break
            episodes.append(record)
        measurements = unwrapped.real_measurements - measurements_before
    finally:
        env.close()
    entry = {
        "index": job.index,
        "episodes": len(episodes),
        "steps": real_steps,
        "real_env_steps": real_steps,
        "real_env_resets": len(episodes),
        "real_measurements": int(measurements),
        "mean_return": float(np.mean([e.episode_return for e in episodes])),
        "seconds": time.perf_counter() - started,
    }
    write_shard(Path(job.path), episodes, {**entry, "format": SHARD_FORMAT})
    return entry


def candidate_targets(
    env: Any, observation: Mapping[str, np.ndarray], samples: int, rng: np.random.Generator
) -> dict[str, np.ndarray]:
    """`advantage_slots` and `advantage_targets` of one state (`rlflow.worldmodel.data`): up
    to `samples` offered candidates drawn without replacement, and their relative cost changes
    (`GraphRewriteEnv.candidate_cost_changes`); -1 and NaN pad."""
    offered = np.flatnonzero(np.asarray(observation["action_mask"])[:-1])
    chosen = np.sort(rng.choice(offered, size=min(samples, offered.size), replace=False))
    slots = np.full(samples, -1, dtype=np.int16)
    targets = np.full(samples, np.nan, dtype=np.float32)
    slots[: chosen.size] = chosen
    targets[: chosen.size] = env.candidate_cost_changes([int(slot) for slot in chosen])
    return {"advantage_slots": slots, "advantage_targets": targets}


def _env_description(settings: CollectSettings) -> dict[str, Any]:
    """Rule names, feature names and padded sizes of the env: a loader needs them."""
    from rlflow.nn.features import EDGE_FEATURES, GLOBAL_FEATURES, NODE_FEATURES, OP_TYPES

    policy = settings.make_policy()
    env = make_env(settings, policy.env_config)
    given = {**policy.env_config, **settings.env_kwargs()}  # what make_env passed
    try:
        unwrapped = env.unwrapped
        return {
            "rule_names": list(unwrapped.rule_names),
            "op_types": list(OP_TYPES),
            "node_features": list(NODE_FEATURES),
            "edge_features": list(EDGE_FEATURES),
            "global_features": list(GLOBAL_FEATURES),
            "env": {
                **{k: v for k, v in given.items() if k != "models" and _jsonable(v)},
                "size": unwrapped.size,
                "cost": unwrapped.cost,
                "measure_every": unwrapped.measure_every,
                "ort_level": unwrapped.ort_level,
                "max_nodes": unwrapped.max_nodes,
                "max_edges": unwrapped.max_edges,
                "max_candidates": unwrapped.max_candidates,
                "max_site_nodes": unwrapped.max_site_nodes,
                "invalid_action_penalty": unwrapped.invalid_action_penalty,
                "portable": bool(given.get("portable", False)),
                "deploy": unwrapped.deployment.mode,
                "start": unwrapped.start,
                "max_episode_steps": settings.max_episode_steps,
            },
        }
    finally:
        env.close()


def _jsonable(value: Any) -> bool:
    return isinstance(value, str | int | float | bool | type(None))


def prepare(settings: CollectSettings, out: Path) -> tuple[dict[str, Any], list[ShardJob]]:
    """The manifest (new, or the directory's own if the settings agree) and the shards to run."""
    if settings.episodes < 1:
        raise RlflowError(f"--episodes must be at least 1, got {settings.episodes}")
    if settings.candidate_samples < 0:
        raise RlflowError(
            f"--candidate-samples must be at least 0, got {settings.candidate_samples}"
        )
    Deployment(settings.deploy)  # an unknown mode or start state is refused before any work
    check_start_name(settings.start)
    if settings.candidate_samples and settings.cost not in (None, "analytic", "perop"):
        raise RlflowError(
            "--candidate-samples needs a cost model for the candidates (--cost analytic or "
            f"perop), not {settings.cost}"
        )
    if settings.episodes_per_shard < 1:
        raise RlflowError(
            f"episodes per shard must be at least 1, got {settings.episodes_per_shard}"
        )
    if not settings.models:
        raise RlflowError("give at least one --model")
    _check_models(settings.models)
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise RlflowError(f"--out {out} exists and is not a directory")
    if (out / MANIFEST).exists():
        manifest = read_manifest(out)
        if manifest.get("settings") != settings.identity():
            theirs = manifest.get("settings", {})
            differ = sorted(
                key
                for key in set(theirs) | set(settings.identity())
                if theirs.get(key) != settings.identity().get(key)
            )
            raise RlflowError(
                f"{out} holds rollouts collected with other settings ({', '.join(differ)} "
                "differ); use a new --out or the same settings"
            )
    elif out.exists() and any(out.iterdir()):
        raise RlflowError(f"--out {out} is a non-empty directory without {MANIFEST}")
    else:
        manifest = {
            "kind": "rollouts",
            "format": SHARD_FORMAT,
            "settings": settings.identity(),
            **_env_description(settings),
            "shards": {},
        }
    # A listed shard whose file has gone (deleted by hand, e.g. after it was found damaged) is
    # no longer finished: its episodes are collected again, under a new shard.
    for name in [name for name in manifest["shards"] if not (out / name).is_file()]:
        del manifest["shards"][name]
    # A shard written but not yet entered in the manifest (a run killed in between) is whole
    # (written atomically): adopt it instead of redoing it.
    shards: dict[str, Any] = manifest["shards"]
    for path in sorted(out.glob("shard-*.npz")) if out.exists() else []:
        if path.name not in shards:
            try:
                _, meta = read_shard(path)
            except RlflowError:
                continue  # damaged: it will be redone under its own name
            shards[path.name] = {k: v for k, v in meta.items() if k != "format"}
    done = sum(entry["episodes"] for entry in shards.values())
    jobs: list[ShardJob] = []
    index = max((entry["index"] for entry in shards.values()), default=-1) + 1
    remaining = settings.episodes - done
    while remaining > 0:
        count = min(settings.episodes_per_shard, remaining)
        path = out / SHARD_PATTERN.format(index=index)
        jobs.append(ShardJob(index, count, str(path), asdict(settings)))
        remaining -= count
        index += 1
    return manifest, jobs


def _check_models(models: list[str]) -> None:
    """Fail before anything is written when a model is neither a zoo name nor a file (the rule
    of `rlflow.zoo.MODEL_RULE`; a zoo model is exported later, by the env)."""
    from rlflow import zoo

    for model in models:
        if zoo.zoo_name(model) is None:
            zoo.model_path(model)


def update_totals(manifest: dict[str, Any]) -> None:
    shards = manifest["shards"].values()
    manifest["totals"] = {
        key: sum(entry[key] for entry in shards)
        for key in ("episodes", "steps", "real_env_steps", "real_env_resets", "real_measurements")
    }
    manifest["totals"]["seconds"] = sum(entry["seconds"] for entry in shards)


def collect(
    settings: CollectSettings,
    out: str | Path,
    *,
    workers: int = 1,
    progress: bool = True,
    backend: str = "inprocess",
    ray_address: str | None = None,
) -> dict[str, Any]:
    """Collect into `out` until it holds `settings.episodes` episodes; the final manifest.
    `backend`: `inprocess` (`workers` processes) or `ray` (a Ray task per shard, measurements
    on the timer actors: `rlflow.worldmodel.ray_collect`)."""
    from tqdm import tqdm

    if workers < 1:
        raise RlflowError(f"--workers must be at least 1, got {workers}")
    if backend not in ("inprocess", "ray"):
        raise RlflowError(f"unknown backend {backend!r}; choose inprocess or ray")
    out = Path(out)
    manifest, jobs = prepare(settings, out)
    if backend == "ray" and jobs:  # reach Ray before anything is written
        from rlflow.agents.ray_workers import init

        init(ray_address)
    out.mkdir(parents=True, exist_ok=True)
    update_totals(manifest)
    write_manifest(out, manifest)
    if not jobs:
        return manifest
    bar = tqdm(
        desc=f"collect {','.join(settings.models)}",
        unit="step",
        file=sys.stderr,
        disable=not progress,
        mininterval=0.5,
    )

    def finished(entry: dict[str, Any]) -> None:
        manifest["shards"][SHARD_PATTERN.format(index=entry["index"])] = entry
        update_totals(manifest)
        write_manifest(out, manifest)
        bar.set_postfix_str(f"{manifest['totals']['episodes']}/{settings.episodes} episodes")

    try:
        if backend == "ray":
            from rlflow.worldmodel.ray_collect import collect_on_ray

            collect_on_ray(settings, jobs, finished, bar.update, ray_address)
        elif workers == 1:
            for job in jobs:
                finished(run_shard(job, on_step=bar.update))
        else:
            context = multiprocessing.get_context("spawn")
            with ProcessPoolExecutor(max_workers=workers, mp_context=context) as pool:
                futures = [pool.submit(run_shard, job) for job in jobs]
                for future in as_completed(futures):
                    entry = future.result()
                    bar.update(entry["steps"])
                    finished(entry)
    finally:
        bar.close()
    return manifest

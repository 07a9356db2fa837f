"""The dream-trained controller acting in the real env, and any trained agent as a `Policy`.

A controller picks a *rule* (or stop): logits = W [z_t, h_t] + b over the world model's
active rules and stop, masked to the applicable ones, argmax (sampled when not
deterministic). The dream has no sites, so in the real env a rule becomes a concrete
candidate this way (`ControllerPolicy.act`):

1. z_t is the VAE mean of the real observation; h_t is the MDN-RNN state carried through the
   episode (reset when the observation's step fraction is 0, or by `reset()`).
2. The real action mask decides which rules are applicable: an active rule with at least
   one candidate on offer, plus stop (rules the collected data never saw cannot be chosen).
   With the env object, a candidate whose result is a graph this episode has already been at
   does not count: the dream has no graphs to recognise, so a controller can learn a rule and
   its reverse as a cycle that M prices as two gains (BERT: SkipLayerNorm fused and unfused 50
   times in a 50-step episode); in the real env it never returns to a graph, as BRKGA's
   decoder and taso's search do not. And as in the dream (rlflow.worldmodel.dream), a rule
   pair goes one way per episode: once R was applied, R-reverse is not chosen, and the other
   way round.
3. Among the chosen rule's offered candidates, the one whose rewritten graph the env prices
   lowest is applied (`GraphRewriteEnv.estimated_cost`: offline its per-op cost, cached by
   operator signature; no end-to-end measurement) -- a deterministic site choice: the
   dream prices the rule, the env's own cost its site. Without the env object (`env=None`),
   the rule's first offered slot is used.
4. h is advanced with (z_t, rule), exactly as in the dream.
5. After as many rewrites as its dream episodes could take (the checkpoint's `horizon`,
   `ControllerSettings.dream_horizon`), it stops: past them it would act on states it never
   trained on.

`load_agent_policy` opens any `agent:RUN_DIR` (`rlflow.agents.spec`): a PPO run or a
controller run; it lives here because only this layer knows both.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rlflow.agents.policy import Policy, RuleTranslation
from rlflow.agents.spec import AgentSpec
from rlflow.config import read_yaml
from rlflow.errors import RlflowError
from rlflow.worldmodel.controller import (
    CONTROLLER_CHECKPOINT,
    EVAL_REPORT,
    WORLD_BUNDLE,
    ControllerMemory,
    LinearController,
    masked_argmax,
    tau_dir,
)
from rlflow.worldmodel.model import CONFIG, WorldModel, load_checkpoint


def cheapest_site(candidates: list[Any], slots: np.ndarray, env: Any) -> int:
    """The controller's site choice (item 3 of the module docstring): the slot among `slots`
    (indices into `candidates`, the offered slots of one rule) whose rewritten graph `env`
    prices lowest (`GraphRewriteEnv.estimated_cost`: per-op offline, analytic where the env has
    no cost short of an end-to-end timing). The `random-rule-cheapest` collection agent chooses
    sites the same way, so that the world model prices a rule at the sites a controller will
    apply it to.

    The analytic roofline chose until 2026-11-27: free, and right on ResNet-18 (its least-bad
    `nchwc-conv-unblock` is the per-op model's best site), but not on ResNet-50: there its
    choice among all 52 sites gains 0.9% where the per-op model's gains 1.4%, and among the
    sites offered within 128 slots it loses 1.5% where the per-op model's loses 0.1%
    (`scripts/probe_rule_sites.py`)."""
    if len(slots) == 1:
        return int(slots[0])
    cost = getattr(env, "unwrapped", env).estimated_cost
    return int(slots[int(np.argmin([cost(candidates[slot].graph) for slot in slots]))])


def env_config(world: WorldModel) -> dict[str, Any]:
    """GraphRewriteEnv keyword arguments (minus models) of the world model's data."""
    config = dict(world.meta["env"])
    config.pop("max_episode_steps", None)
    return config


class ControllerPolicy:
    """A dream-trained controller acting in GraphRewrite-v0 (the Policy protocol of
    rlflow.agents.policy): `act(observation, *, deterministic, rng, env=None) -> slot`.

    See the module docstring for how a rule becomes a candidate.
    """

    def __init__(
        self,
        world: WorldModel,
        controller: LinearController,
        temperature: float,
        horizon: int | None = None,
    ):
        self.world, self.controller, self.temperature = world, controller, temperature
        self.horizon = horizon  # rewrites per episode at most (None: the env's limit only)
        self.env_config: dict[str, Any] = env_config(world)
        from rlflow.nn.features import GLOBAL_FEATURES

        self._step_feature = GLOBAL_FEATURES.index("step_fraction")
        self._rules = RuleTranslation(world.rule_names)
        self._memory = ControllerMemory(world)  # h and the reverses of the rules applied
        self._visited: set[str] = set()
        self._steps = 0

    def reset(self) -> None:
        """Forget the episode's recurrent state, the graphs it visited and the rules it applied
        (done automatically at step fraction 0)."""
        self._memory = ControllerMemory(self.world)
        self._visited = set()
        self._steps = 0

    @property
    def max_episode_steps(self) -> int:
        """The episode limit of the env it acts in: its data's (`agent_rollouts` reads it)."""
        return self.world.max_episode_steps

    @torch.no_grad()
    def act(
        self,
        observation: Mapping[str, np.ndarray],
        *,
        deterministic: bool = True,
        rng: np.random.Generator | None = None,
        env: Any = None,
    ) -> int:
        unwrapped = getattr(env, "unwrapped", env)
        if unwrapped is not None:
            observation = self._rules.translate(observation, list(unwrapped.rule_names))
        if float(observation["global_features"][self._step_feature]) == 0.0:
            self.reset()
        if self.horizon is not None and self._steps >= self.horizon:
            return len(observation["action_mask"]) - 1  # stop (item 5 of the module docstring)
        world = self.world
        mu, _ = world.encode([observation])
        logits = self.controller.logits(self._memory.inputs(mu))[0]
        valid = world.applicable_actions(observation)
        mask = np.asarray(observation["action_mask"])
        rules = np.asarray(observation["candidate_rules"])
        offered = np.flatnonzero(mask[:-1] > 0)
        if unwrapped is not None:  # not back to a graph of this episode (module docstring)
            candidates = unwrapped.offered_candidates()
            self._visited.add(unwrapped.current_graph().canonical_hash())
            offered = np.array(
                [slot for slot in offered if candidates[slot].graph_hash not in self._visited],
                dtype=np.int64,
            )
            valid[:-1] &= np.isin(world.active_rules, rules[offered])
        valid = self._memory.allowed(valid)
        if deterministic or rng is None:
            action = int(masked_argmax(logits, valid))
        else:
            masked = np.where(valid, logits, -np.inf)
            probs = np.exp(masked - masked.max())
            action = int(rng.choice(len(probs), p=probs / probs.sum()))
        rule = int(world.action_rules(np.array([action]))[0])
        self._memory.advance(mu, rule, action)
        if action == world.num_actions - 1:
            return len(mask) - 1  # stop
        self._steps += 1
        slots = offered[rules[offered] == rule]
        if unwrapped is None:
            return int(slots[0])
        return cheapest_site(candidates, slots, unwrapped)

    def __repr__(self) -> str:
        return (
            f"ControllerPolicy(tau={self.temperature:g}, actions={self.world.num_actions}, "
            f"inputs={self.controller.input_dim})"
        )


def load_controller_policy(
    run_dir: str | Path, temperature: float | None = None
) -> ControllerPolicy:
    """The policy of a `rlflow train-controller` run: at `temperature` if given, else the tau
    its settings select (`ControllerSettings.select`: by the real returns in its `eval.json`
    when there is one; runs made before the setting keep their main temperature)."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise RlflowError(f"no such controller run directory: {run_dir}")
    config_path = run_dir / CONFIG
    if not config_path.is_file():
        raise RlflowError(f"{run_dir} has no {CONFIG}: not a controller run")
    config = read_yaml(config_path)
    if config.get("kind") != "controller":
        raise RlflowError(f"{config_path} is not a controller run config (kind != controller)")
    if temperature is None:
        temperature = run_temperature(run_dir, config)
    world = WorldModel.from_bundle(run_dir / WORLD_BUNDLE)
    return policy_from_checkpoint(world, tau_dir(run_dir, temperature) / CONTROLLER_CHECKPOINT)


def run_temperature(run_dir: Path, config: Mapping[str, Any]) -> float:
    """The tau of a controller run's policy (see `load_controller_policy`)."""
    main = float(config.get("temperature", 1.0))
    eval_path = run_dir / EVAL_REPORT
    if config.get("select", "temperature") == "temperature" or not eval_path.is_file():
        return main
    try:  # chosen when the controllers ran in the real env (evaluate_real)
        return float(json.loads(eval_path.read_text(encoding="utf-8"))["selected_temperature"])
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise RlflowError(f"{eval_path} is unreadable ({error}); delete it or rerun") from None


def policy_from_checkpoint(world: WorldModel, path: Path) -> ControllerPolicy:
    checkpoint = load_checkpoint(path, "controller checkpoint")
    try:
        params = checkpoint["params"].numpy()
        controller = LinearController(checkpoint["num_actions"], checkpoint["input_dim"], params)
        temperature = float(checkpoint["temperature"])
        horizon = checkpoint.get("horizon")  # absent from controllers trained before the setting
    except (KeyError, AttributeError) as error:
        raise RlflowError(f"controller checkpoint {path} is incomplete ({error})") from None
    if controller.num_actions != world.num_actions:
        raise RlflowError(f"controller checkpoint {path} does not fit its world model")
    return ControllerPolicy(
        world, controller, temperature, None if horizon is None else int(horizon)
    )


def load_agent_policy(spec: AgentSpec) -> Policy:
    """The policy of a trained agent: its PPO checkpoint or its controller."""
    if spec.kind == "ppo":
        from rlflow.agents.policy import load_ppo_policy

        return load_ppo_policy(spec.run_dir)
    return load_controller_policy(spec.run_dir)

"""What evaluation and `rlflow optimize --agent` need of a trained agent: the `Policy` protocol.

PPO's policy (`load_ppo_policy`) and the world model's controller both implement it, so the
code that rolls a policy out on an unseen model does not care which learner made it. Both
read an env made with another rule list through `RuleTranslation`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import numpy as np
import torch

from rlflow.errors import RlflowError
from rlflow.nn import CandidateScorer, candidate_data

if TYPE_CHECKING:
    from rlflow.envs.graph_rewrite import GraphRewriteEnv


@runtime_checkable
class Policy(Protocol):
    """A rewrite policy over GraphRewrite-v0 observations.

    `env_config` holds the GraphRewriteEnv keyword arguments (all but `models`) of an env
    whose observations the policy understands: the padded sizes may be raised (a bigger
    model), the rest should be kept. `act` returns an action index of that env: a candidate
    slot or `max_candidates` for stop. `env`, the unwrapped env the observation came from,
    is for policies that look past the observation (e.g. at each candidate's rewritten
    graph); a policy that needs it raises RlflowError without it.
    """

    env_config: dict[str, Any]

    def act(
        self,
        observation: dict[str, np.ndarray],
        *,
        deterministic: bool,
        rng: np.random.Generator,
        env: GraphRewriteEnv | None = None,
    ) -> int: ...


class RuleTranslation:
    """An env's candidate rule ids as the ids of a policy's own rule list.

    A trained policy knows rules by the ids of the rule list it learnt with; an env made with
    another list (another rlflow version, `portable`) numbers them otherwise. Ids are matched
    by rule name, one table per env rule list; a rule the policy never learnt becomes -1 (the
    scorer's padding embedding; a rule the controller cannot choose).
    """

    def __init__(self, rule_names: list[str]) -> None:
        self.rule_names = list(rule_names)
        self._ids = {name: index for index, name in enumerate(self.rule_names)}
        self._tables: dict[tuple[str, ...], np.ndarray] = {}

    def translate(
        self, observation: Mapping[str, np.ndarray], env_rules: list[str]
    ) -> Mapping[str, np.ndarray]:
        """`observation` with its `candidate_rules` in the policy's ids (as is if the env's
        rule list is the policy's)."""
        if env_rules == self.rule_names:
            return observation
        key = tuple(env_rules)
        table = self._tables.get(key)
        if table is None:
            table = np.array([self._ids.get(name, -1) for name in env_rules], dtype=np.int64)
            self._tables[key] = table
        rules = np.asarray(observation["candidate_rules"])
        translated = np.where(rules >= 0, table[np.clip(rules, 0, None)], -1)
        return {**observation, "candidate_rules": translated}


class PPOPolicy:
    """A PPO agent's scorer as a `Policy`: greedy (`deterministic`) or sampled from its
    masked categorical with the caller's `rng`.

    Args:
        scorer: the trained network.
        env_config: GraphRewriteEnv keyword arguments of its training env, without `models`.
        rule_names: the rule vocabulary the scorer was trained with; observations of an env
            with another rule list are translated by name (unknown rules get the padding
            embedding).
    """

    def __init__(
        self,
        scorer: CandidateScorer,
        env_config: dict[str, Any],
        rule_names: list[str],
    ) -> None:
        self.scorer = scorer.eval()
        self.env_config = dict(env_config)
        self._rules = RuleTranslation(rule_names)

    def __repr__(self) -> str:
        return f"PPOPolicy(scorer={self.scorer.mode!r}, rules={len(self._rules.rule_names)})"

    def logits(
        self, observation: dict[str, np.ndarray], env: GraphRewriteEnv | None = None
    ) -> np.ndarray:
        """The masked logits (A + 1,) of one observation (stop last)."""
        env = env.unwrapped if env is not None else None
        if env is not None:
            observation = self._rules.translate(observation, list(env.rule_names))
        from rlflow.agents.ppo import scorer_outputs

        candidates: list[Any] = []
        if self.scorer.needs_candidate_graphs:
            if env is None:
                raise RlflowError("the full scorer needs the env to see each candidate's graph")
            candidates = candidate_data(env.candidate_observations())
        with torch.no_grad():
            logits, _ = scorer_outputs(self.scorer, [observation], [candidates])
        return logits[0].double().numpy()

    def act(
        self,
        observation: dict[str, np.ndarray],
        *,
        deterministic: bool,
        rng: np.random.Generator,
        env: GraphRewriteEnv | None = None,
    ) -> int:
        logits = self.logits(observation, env)
        mask = np.asarray(observation["action_mask"]) != 0
        if deterministic:
            return int(np.argmax(np.where(mask, logits, -np.inf)))
        shifted = np.where(mask, logits - logits[mask].max(), -np.inf)
        probs = np.exp(shifted)
        return int(rng.choice(len(probs), p=probs / probs.sum()))


def load_ppo_policy(run_dir: str | os.PathLike) -> PPOPolicy:
    """The policy of a PPO run directory's latest checkpoint (RlflowError if there is none or
    it cannot be read)."""
    from rlflow.agents.ppo import PPOConfig, load_checkpoint, make_scorer, saved_config

    state = load_checkpoint(run_dir)
    try:
        config = PPOConfig.from_dict(saved_config(state["config"]))
        rule_names = list(state["rule_names"])
        scorer = make_scorer(config, len(rule_names))
        scorer.load_state_dict(state["model"])
    except (KeyError, TypeError, RuntimeError) as error:
        raise RlflowError(
            f"checkpoint in {run_dir} does not match this rlflow's PPO network: "
            f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
        ) from None
    return PPOPolicy(scorer, config.env_kwargs(), rule_names)

"""Behaviour cloning from recorded episodes: a PPO run that starts where a search ended.

A search such as taso reaches graphs that PPO's exploration takes thousands of steps to find,
or never finds: paths through rewrites that lose on their own, which the stop action beats
early in training (docs/BENCHMARKS.md, "Learners against search"). Given recorded episodes
(`rlflow optimize --json`, or one cell of a bench's results.json, written out), a fresh PPO
run first walks each one in its own training env, keeping every step's observation with the
action slot the recorded rewrite occupies there (and the stop at the end), and fits its policy
to choose those slots (cross-entropy) and its value head to the discounted rewards the walk
earned, before its first rollout. PPO then begins on the search's path, as rlflow's searches
begin on onnxruntime's graph, and what it finds beyond is its own. A demonstrator on the model
it is then compared with makes a comparison of PPO against that search one of "the search, then
RL", and is reported as such. With `demo_coef` the cloning loss stays on during PPO, weighted
by it and fading linearly to nothing over the run (as DAPG's demonstration term fades): PPO's
first updates, from returns that are still noise, then do not walk the policy off the
demonstrated path before its own estimates can tell where to leave it.

A recorded step is found among the env's offered candidates as `RewriteSession.replay` finds
it (`recorded_candidate`: by its rule and site, or by the hash it produced). A step the env
does not offer (beyond `max_candidates`, or a graph over `max_nodes`) ends that demonstration
there, without its stop; how many steps were kept is reported.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch.distributions import Categorical
from torch_geometric.data import Data

from rlflow.errors import RlflowError
from rlflow.nn import CandidateScorer
from rlflow.rewrite.session import recorded_candidate
from rlflow.search.replay import Recording, read_recording

if TYPE_CHECKING:
    from rlflow.agents.ppo import PPOConfig


@dataclass
class Demonstrations:
    """The (state, action) pairs of recorded episodes walked in the training env."""

    states: list[Data] = field(default_factory=list)
    candidates: list[list[Data]] = field(default_factory=list)
    actions: list[int] = field(default_factory=list)
    returns: list[float] = field(default_factory=list)
    """The discounted reward from each state on, as the walk earned it."""
    recorded_steps: int = 0
    kept_steps: int = 0

    def __len__(self) -> int:
        return len(self.actions)


def gather(scorer: CandidateScorer, config: PPOConfig) -> Demonstrations:
    """A run's recorded episodes (`config.demos`) walked in an env of its own settings."""
    from rlflow.agents.ppo import make_env

    recordings = read_demos(config.demos)
    env = make_env(config)
    try:
        return walk_demos(env, recordings, scorer, gamma=config.gamma, seed=config.seed)
    finally:
        env.close()


def imitate(scorer: CandidateScorer, demos: Demonstrations, config: PPOConfig) -> dict[str, Any]:
    """Fit a fresh run's network to its walked demonstrations; what was kept of them and how
    well the policy fits, for progress.json."""
    stats = clone(
        scorer,
        demos,
        epochs=config.demo_epochs,
        learning_rate=config.learning_rate,
        minibatch_size=config.minibatch_size,
        vf_coef=config.vf_coef,
        seed=config.seed,
    )
    print(
        f"imitated {len(config.demos)} demo(s): {demos.kept_steps} of {demos.recorded_steps} "
        f"recorded steps offered by the env, {len(demos)} states; the policy's first choice is "
        f"the demonstrated one at {100 * stats['accuracy']:.0f}% of them",
        file=sys.stderr,
    )
    return {
        "files": list(config.demos),
        "recorded_steps": demos.recorded_steps,
        "kept_steps": demos.kept_steps,
        "states": len(demos),
        **stats,
    }


def read_demos(paths: list[str]) -> list[Recording]:
    """The recorded episodes at `paths` (one-line RlflowError for a file without one)."""
    recordings = []
    for path in paths:
        try:
            recordings.append(read_recording(f"replay:{path}"))
        except RlflowError as error:
            raise RlflowError(f"demo {str(error).removeprefix('replay: ')}") from None
    return recordings


def walk_demos(
    env: Any,
    recordings: list[Recording],
    scorer: CandidateScorer,
    *,
    gamma: float,
    seed: int = 0,
) -> Demonstrations:
    """Walk each recording in `env` (a GraphRewriteEnv of the run's settings, its models
    including the recording's), keeping what the policy sees at every step and the slot taken."""
    demos = Demonstrations()
    base = env.unwrapped
    for number, recording in enumerate(recordings):
        episode = recording.episode
        model = _model_index(base, episode.model)
        if model is None:
            raise RlflowError(
                f"demo {recording.path} was recorded on {episode.model or 'another model'}, "
                "which this run does not train on"
            )
        observation, _ = env.reset(seed=seed + number, options={"model": model})
        if base.session.original.canonical_hash() != episode.original_hash:
            raise RlflowError(
                f"demo {recording.path} starts from another graph than this run's "
                f"{base.model_label(model)} at start {base.start!r} (recorded from "
                f"{recording.start_state}: give the same --start, --size and --deploy)"
            )
        rewards: list[float] = []
        demos.recorded_steps += len(episode.actions)
        for action in episode.actions:
            slot = offered_slot(base.offered_candidates(), action)
            if slot is None:
                break
            _keep(demos, scorer, base, observation, slot)
            observation, reward, terminated, truncated, _ = env.step(slot)
            rewards.append(float(reward))
            demos.kept_steps += 1
            if terminated or truncated:
                break
        else:  # the search stopped here: so does the policy
            _keep(demos, scorer, base, observation, base.max_candidates)
            rewards.append(float(env.step(base.max_candidates)[1]))
        demos.returns += discounted_returns(rewards, gamma)
    return demos


def discounted_returns(rewards: list[float], gamma: float) -> list[float]:
    """The discounted sum of rewards from each step on (what the value head is fitted to)."""
    returns, running = [0.0] * len(rewards), 0.0
    for step in range(len(rewards) - 1, -1, -1):
        running = rewards[step] + gamma * running
        returns[step] = running
    return returns


def _model_index(env: Any, recorded: str) -> int | None:
    """The env's model a recording was made on: the same label, or it with the zoo size that
    searches append (`squeezenet-1.1:medium`)."""
    for index in range(len(env.models)):
        label = env.model_label(index)
        if recorded in (label, f"{label}:{env.size}"):
            return index
    return None


def offered_slot(offered: list[Any], action: Any) -> int | None:
    """The action slot of a recorded step among the offered candidates (None: not offered)."""
    found = recorded_candidate(offered, action)
    return next((slot for slot, c in enumerate(offered) if c is found), None)


def _keep(
    demos: Demonstrations,
    scorer: CandidateScorer,
    env: Any,
    observation: dict[str, np.ndarray],
    slot: int,
) -> None:
    from rlflow.agents.ppo import policy_inputs

    state, candidates = policy_inputs(scorer, env, observation)
    demos.states.append(state)
    demos.candidates.append(candidates)
    demos.actions.append(slot)


def clone(
    scorer: CandidateScorer,
    demos: Demonstrations,
    *,
    epochs: int,
    learning_rate: float,
    minibatch_size: int,
    vf_coef: float,
    seed: int = 0,
) -> dict[str, float]:
    """Fit `scorer` to the demonstrations: the taken slot's log-probability up, the value head
    to the walk's returns. Returns the last epoch's mean loss and the share of states where the
    policy's most likely action is the demonstrated one."""
    if not len(demos):
        raise RlflowError("no demonstrated step is offered by this run's env: nothing to clone")
    optimizer = torch.optim.Adam(scorer.parameters(), lr=learning_rate, eps=1e-5)
    rng = np.random.default_rng(seed)
    scorer.train()
    loss = 0.0
    for _ in range(epochs):
        loss = demo_pass(scorer, optimizer, demos, rng, minibatch_size, vf_coef=vf_coef)
    scorer.eval()
    accuracy, mean_logprob = fit(scorer, demos)
    return {"loss": loss, "accuracy": accuracy, "mean_logprob": mean_logprob}


def demo_pass(
    scorer: CandidateScorer,
    optimizer: torch.optim.Optimizer,
    demos: Demonstrations,
    rng: np.random.Generator,
    minibatch_size: int,
    *,
    weight: float = 1.0,
    vf_coef: float = 0.0,
    max_grad_norm: float | None = None,
) -> float:
    """One shuffled pass of the behaviour-cloning loss over the demonstrations, `weight` times
    the demonstrated slots' negative log-probability plus `vf_coef` times the value head's
    squared error to the walk's returns. Before PPO (`clone`) both terms fit a fresh network;
    during PPO (`PPOConfig.demo_coef`) the policy term alone, small and fading, keeps it near
    the demonstrated path while its own returns are still noisy. Returns the pass's mean
    loss, unweighted."""
    from rlflow.agents.ppo import evaluate_actions

    actions = torch.tensor(demos.actions)
    returns = torch.tensor(demos.returns, dtype=torch.float32)
    order = rng.permutation(len(demos))
    loss_sum = 0.0
    for begin in range(0, len(order), minibatch_size):
        idx = order[begin : begin + minibatch_size]
        _, logprob, _, value = evaluate_actions(
            scorer,
            [demos.states[i] for i in idx],
            [demos.candidates[i] for i in idx],
            actions[idx],
        )
        loss = -logprob.mean()
        if vf_coef:
            loss = loss + vf_coef * ((value.reshape(-1) - returns[idx]) ** 2).mean()
        optimizer.zero_grad()
        (weight * loss).backward()
        if max_grad_norm is not None:
            torch.nn.utils.clip_grad_norm_(scorer.parameters(), max_grad_norm)
        optimizer.step()
        loss_sum += loss.item() * len(idx)
    return loss_sum / len(demos)


def fit(scorer: CandidateScorer, demos: Demonstrations) -> tuple[float, float]:
    """(the share of demonstrated states where the policy's most likely action is the one
    demonstrated, the demonstrated actions' mean log-probability)."""
    from rlflow.agents.ppo import scorer_outputs

    actions = torch.tensor(demos.actions)
    with torch.no_grad():
        logits, _ = scorer_outputs(scorer, demos.states, demos.candidates)
    hits = (logits.argmax(dim=-1) == actions).float().mean()
    logprob = Categorical(logits=logits).log_prob(actions).mean()
    return float(hits), float(logprob)


__all__ = [
    "Demonstrations",
    "clone",
    "demo_pass",
    "fit",
    "gather",
    "imitate",
    "read_demos",
    "walk_demos",
]

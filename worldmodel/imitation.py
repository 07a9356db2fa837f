"""A search's path as the controller sees it, the clone CMA-ES starts from, and the term that
keeps it near: the world model's counterpart of `train-ppo --demo --demo-coef`.

PPO from taso's path (`rlflow.agents.demos`) clones the path before its first rollout and keeps
a cloning loss that fades over the run: it begins where the search ended. The loop's `--demo`
gave the world model the same path only as data, and its controllers, trained from zero in the
dream, reached 78-80% of that PPO's gain on SqueezeNet. This gives the controller the path as
PPO gets it, as DAPG (Rajeswaran et al., 2018) does for policy gradients:

1. `path_examples`: the path's first walk in a `demo:` collection (the whole recording,
   `rlflow.worldmodel.demo_policy`) turned into the controller's own inputs, x_t = [z_t, h_t]
   exactly as `ControllerPolicy` forms them in the real env (the VAE mean; the MDN-RNN state
   carried along the recorded rules), each with the dream action of its recorded rule, the
   actions the controller could choose there, and stop after the last step (when the walk
   took them all: the search stopped there, not where the env refused a step). A step the
   controller cannot take (its rule never active in the data, or the reverse of a rule the
   path applied, which a controller never applies in the same episode) is not an example; the
   state still moves past it. Where the path applies both rules of a pair (taso on ResNeXt-50:
   one reorder pair made, then seven cancelled), the clone learns the way it takes more often
   (the first on a tie): a controller that copied the one step first would be barred from the
   seven after it.
2. `cloned_params`: the linear controller fitted to them (masked softmax cross-entropy, a little
   L2), where CMA-ES's search starts instead of zero.
3. `log_likelihoods`: the path's log-likelihood under each candidate controller; CMA-ES adds it
   to the dream return, weighted by `imitation` and fading linearly to nothing over the
   generations (`rlflow.worldmodel.cmaes`), as the PPO run's cloning loss fades.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from rlflow.errors import RlflowError
from rlflow.worldmodel.controller import ControllerMemory, batched_logits, masked_argmax
from rlflow.worldmodel.data import RolloutData, read_manifest
from rlflow.worldmodel.model import WorldModel


@dataclass
class PathExamples:
    """The controller's inputs along a path and the dream actions the path took there."""

    inputs: np.ndarray  # (T, D) float64: [z_t, h_t]
    actions: np.ndarray  # (T,) int64: dream actions, the last one stop
    valid: np.ndarray  # (T, A) bool: the actions the controller could choose at each
    recorded_steps: int  # the recording's steps
    walked_steps: int  # of them, walked by the collection (all, unless the env refused one)

    def __len__(self) -> int:
        return len(self.actions)


def demo_spec(data_dir: str | Path, world: WorldModel) -> str:
    """The `demo:RESULT.json` policy `data_dir` was collected with, from its manifest alone (a
    cheap check before a run starts); RlflowError for any other collection, or one made with
    other rules than `world`'s."""
    from rlflow.worldmodel.demo_policy import is_demo_spec

    manifest = read_manifest(Path(data_dir))
    spec = manifest.get("settings", {}).get("policy")
    if not isinstance(spec, str) or not is_demo_spec(spec):
        raise RlflowError(
            f"{data_dir} was not collected with a demo:RESULT.json policy: nothing to imitate"
        )
    if manifest.get("rule_names") != world.rule_names:
        raise RlflowError(f"{data_dir} was collected with other rules than the world model's")
    return spec


def path_examples(world: WorldModel, data_dir: str | Path) -> PathExamples:
    """The examples of the path walked first in `data_dir` (module docstring, item 1)."""
    from rlflow.worldmodel.demo_policy import read_demo

    spec = demo_spec(data_dir, world)
    data = RolloutData.load(data_dir)
    recorded = [action.rule for action in read_demo(spec).episode.actions]
    first_obs, first_step = int(data.obs_start[0]), int(data.step_start[0])
    names = data.rule_names
    walked = 0
    for t in range(min(len(recorded), int(data.arrays["episode_steps"][0]))):
        rule = int(data.arrays["action_rule"][first_step + t])
        if not 0 <= rule < len(names) or names[rule] != recorded[t]:
            break
        walked += 1
    observations = [data.observation(first_obs + t) for t in range(walked + 1)]
    rules = [int(rule) for rule in data.arrays["action_rule"][first_step : first_step + walked]]
    return _examples(world, observations, rules, len(recorded))


@torch.no_grad()
def _examples(
    world: WorldModel, observations: list[dict[str, np.ndarray]], rules: list[int], recorded: int
) -> PathExamples:
    """Walk `rules` from `observations[0]` as `ControllerPolicy.act` would (the same
    `ControllerMemory`: its h, its reverses blocked; its mask of applicable rules), then stop at
    the last observation if the walk is the whole recording."""
    stop = world.num_actions - 1
    action_of = world.action_of_rule
    names = world.rule_names
    path = [action_of.get(names[rule], -1) for rule in rules]
    minority = _minority_directions(path, world.reverse_actions)
    mu, _ = world.encode(observations)
    memory = ControllerMemory(world)
    inputs, actions, valid = [], [], []
    for t, observation in enumerate(observations):
        x = memory.inputs(mu[t : t + 1])[0]
        can = memory.allowed(world.applicable_actions(observation))
        if t < len(rules):
            action = path[t]
        else:
            action = stop if len(rules) == recorded else -1
        taken = action >= 0 and can[action] and action not in minority
        if taken:
            inputs.append(x)
            actions.append(action)
            valid.append(can)
        if t == len(rules):
            break
        memory.advance(mu[t : t + 1], rules[t], action if taken else -1)
    if not actions:
        raise RlflowError("the collection's first walk holds no step of its path to imitate")
    return PathExamples(
        inputs=np.asarray(inputs),
        actions=np.asarray(actions, dtype=np.int64),
        valid=np.asarray(valid, dtype=bool),
        recorded_steps=recorded,
        walked_steps=len(rules),
    )


def _minority_directions(path: list[int], reverse: np.ndarray) -> set[int]:
    """The dream actions of `path` whose reverse the path takes more often (or as often and
    first): the direction of each rule pair that the clone leaves out."""
    counts = {action: path.count(action) for action in set(path) if action >= 0}
    first = {action: path.index(action) for action in counts}
    minority = set()
    for action, count in counts.items():
        other = int(reverse[action])
        if other < 0 or other not in counts:
            continue
        if (counts[other], -first[other]) > (count, -first[action]):
            minority.add(action)
    return minority


def cloned_params(
    examples: PathExamples, num_actions: int, *, l2: float = 1e-3, steps: int = 500
) -> np.ndarray:
    """The `LinearController` parameters (W row-major, then b) fitted to the examples by masked
    softmax cross-entropy with an L2 penalty (module docstring, item 2); deterministic."""
    x = torch.as_tensor(examples.inputs, dtype=torch.float32)
    target = torch.as_tensor(examples.actions)
    invalid = ~torch.as_tensor(examples.valid)
    weight = torch.zeros(num_actions, x.shape[1], requires_grad=True)
    bias = torch.zeros(num_actions, requires_grad=True)
    optimizer = torch.optim.Adam([weight, bias], lr=0.05)
    for _ in range(steps):
        logits = (x @ weight.T + bias).masked_fill(invalid, float("-inf"))
        loss = torch.nn.functional.cross_entropy(logits, target) + l2 * weight.square().sum()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return np.concatenate([weight.detach().numpy().ravel(), bias.detach().numpy()]).astype(
        np.float64
    )


def log_likelihoods(params: np.ndarray, examples: PathExamples, num_actions: int) -> np.ndarray:
    """(P,): the path's total log-likelihood under each of P controllers' masked softmax."""
    params = np.atleast_2d(params)
    x = np.broadcast_to(examples.inputs, (len(params), *examples.inputs.shape))
    logits = np.where(examples.valid, batched_logits(params, x, num_actions), -np.inf)
    top = logits.max(axis=-1, keepdims=True)
    log_z = top[..., 0] + np.log(np.exp(logits - top).sum(axis=-1))
    chosen = np.take_along_axis(logits, examples.actions[None, :, None], axis=-1)[..., 0]
    return (chosen - log_z).sum(axis=1)


def agreement(params: np.ndarray, examples: PathExamples, num_actions: int) -> float:
    """The share of the path's steps a controller's argmax takes: what it walks of the path."""
    logits = batched_logits(np.atleast_2d(params)[:1], examples.inputs[None], num_actions)[0]
    return float((masked_argmax(logits, examples.valid) == examples.actions).mean())

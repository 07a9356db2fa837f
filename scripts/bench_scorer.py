#!/usr/bin/env python
"""Time per env step and per policy decision, `local` vs `full` scoring (docs/BENCHMARKS.md).

For each model and scorer: an untrained PPO scorer (seed 0, the PPO defaults' network) drives
GraphRewrite-v0 (analytic cost) for a few sampled episodes; the table gives the mean time of
`env.step`, of the policy's decision (featurising the candidates' rewritten graphs for `full`,
then the network's forward pass), and the mean candidates offered. Times are wall times of this
one run on this machine, with torch on one thread.

With `--train-steps N`, each scorer is also trained by PPO for N steps on each model alone
(analytic cost, the other PPO defaults but `--horizon`), and the table adds the training wall
time and the greedy policy's return afterwards (% of the analytic cost saved).

    python scripts/bench_scorer.py --steps 20 resnet-18 bert
    python scripts/bench_scorer.py --steps 20 --train-steps 600 --horizon 20 resnet-18 bert
"""

from __future__ import annotations

import argparse
import shlex
import sys
import tempfile
import time

import gymnasium as gym
import numpy as np
import torch

import rlflow.envs  # noqa: F401  (registers rlflow/GraphRewrite-v0)
from rlflow.agents.evaluate import policy_rollouts
from rlflow.agents.policy import load_ppo_policy
from rlflow.agents.ppo import PPOConfig, evaluate_actions, make_scorer, policy_inputs, train
from rlflow.cost import AnalyticCostModel
from rlflow.envs import GRAPH_REWRITE_ID
from rlflow.nn import SCORER_MODES


def bench(model: str, mode: str, args: argparse.Namespace) -> dict[str, float]:
    config = PPOConfig(
        models=[model],
        size=args.size,
        scorer=mode,
        max_candidates=args.max_candidates,
        max_nodes=args.max_nodes,
        max_edges=args.max_edges,
        horizon=args.horizon,
    )
    env = gym.make(
        GRAPH_REWRITE_ID,
        models=[model],
        max_episode_steps=config.horizon,
        disable_env_checker=True,
        **config.env_kwargs(),
    )
    torch.manual_seed(0)
    scorer = make_scorer(config, len(env.unwrapped.rule_names)).eval()
    observation, info = env.reset(seed=0)
    env_s, policy_s, featurize_s, candidates, nodes = [], [], [], [], []
    for _ in range(args.steps):
        started = time.perf_counter()
        state, graphs = policy_inputs(scorer, env, observation)
        featurized = time.perf_counter()
        with torch.no_grad():
            action, _, _, _ = evaluate_actions(scorer, [state], [graphs])
        decided = time.perf_counter()
        candidates.append(info["num_candidates"])
        nodes.append(info["num_nodes"])
        observation, _, terminated, truncated, info = env.step(int(action))
        env_s.append(time.perf_counter() - decided)
        policy_s.append(decided - started)
        featurize_s.append(featurized - started)
        if terminated or truncated:
            observation, info = env.reset()
    env.close()
    return {
        "nodes": float(np.mean(nodes)),
        "candidates": float(np.mean(candidates)),
        "env_ms": 1e3 * float(np.mean(env_s)),
        "featurize_ms": 1e3 * float(np.mean(featurize_s)),
        "policy_ms": 1e3 * float(np.mean(policy_s)),
    }


def train_and_evaluate(model: str, mode: str, args: argparse.Namespace) -> dict[str, float]:
    config = PPOConfig(
        models=[model],
        size=args.size,
        scorer=mode,
        total_steps=args.train_steps,
        max_candidates=args.max_candidates,
        max_nodes=args.max_nodes,
        max_edges=args.max_edges,
        horizon=args.horizon,
    )
    with tempfile.TemporaryDirectory() as run_dir:
        summary = train(config, run_dir, progress=False)
        policy = load_ppo_policy(run_dir)
    (session,) = policy_rollouts(policy, model, episodes=1, size=args.size)
    analytic = AnalyticCostModel()
    original = analytic.cost_ms(session.original)
    saved = 100.0 * (original - analytic.cost_ms(session.graph)) / original
    return {"train_s": summary["wall_s"], "greedy_return": saved, "steps": len(session.actions)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="+", help="zoo names or .onnx paths")
    parser.add_argument("--size", choices=("small", "full"), default="small")
    parser.add_argument("--steps", type=int, default=20, help="env steps per model and scorer")
    parser.add_argument("--horizon", type=int, default=100, help="steps per episode")
    parser.add_argument("--max-candidates", type=int, default=128)
    parser.add_argument("--max-nodes", type=int, default=512)
    parser.add_argument("--max-edges", type=int, default=1024)
    parser.add_argument("--modes", nargs="+", choices=SCORER_MODES, default=list(SCORER_MODES))
    parser.add_argument("--train-steps", type=int, default=0, help="PPO steps per scorer (0: no)")
    args = parser.parse_args()
    torch.set_num_threads(1)

    print(f"`python {shlex.join(sys.argv)}`\n")
    header = "| model | scorer | ops | candidates | env step ms | policy ms (featurise) | sum ms |"
    rule = "| --- | --- | ---: | ---: | ---: | ---: | ---: |"
    if args.train_steps:
        header += f" PPO {args.train_steps} steps, wall s | greedy return % |"
        rule += " ---: | ---: |"
    print(header)
    print(rule)
    for model in args.models:
        for mode in args.modes:
            row = bench(model, mode, args)
            line = (
                f"| {model}:{args.size} | {mode} | {row['nodes']:.0f} | {row['candidates']:.1f} "
                f"| {row['env_ms']:.1f} | {row['policy_ms']:.1f} ({row['featurize_ms']:.1f}) "
                f"| {row['env_ms'] + row['policy_ms']:.1f} |"
            )
            if args.train_steps:
                trained = train_and_evaluate(model, mode, args)
                line += f" {trained['train_s']:.0f} | {trained['greedy_return']:.2f} |"
            print(line, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

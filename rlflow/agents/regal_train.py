"""Training REGAL's policy with REINFORCE (`rlflow train-regal`).

Each run takes the next training graph in turn and one of `seeds` BRKGA seeds, samples
per-gene biases from the policy (`rlflow.agents.regal_policy`), runs BRKGA with them for
`budget` evaluations, and is rewarded with its improvement over plain BRKGA with the same seed
and budget, in percent of the start graph's cost: r = 100 (C_plain - C_biased) / C_0 (plain
BRKGA runs once per graph and seed; the same seed gives both runs the same random stream, so
the reward measures the biases). Every `runs_per_update` runs make one policy-gradient step on
-(r - b) log pi(biases), b a per-graph moving average of the reward.

A run directory holds `config.yaml`, TensorBoard event files, `progress.json` (one entry per
run and per update) and `checkpoints/latest.pt`, written after every update (atomically), from
which a rerun continues.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rlflow.agents.regal import CHECKPOINT, RUN_KIND, RegalConfig
from rlflow.agents.regal_policy import CHECKPOINT_VERSION, load_checkpoint, make_policy
from rlflow.config import save_run_config
from rlflow.cost import OrtSettings
from rlflow.cost.cache import read_json, write_json_atomic
from rlflow.cost.ort_optimizer import start_state
from rlflow.errors import RlflowError
from rlflow.fileio import write_torch_atomic
from rlflow.graph import Graph, load_model
from rlflow.rewrite import default_ruleset
from rlflow.rewrite.session import RewriteSession
from rlflow.search.brkga import evolve, start_layout
from rlflow.search.cost import make_cost
from rlflow.tensorboard import TensorBoard
from rlflow.zoo import model_path

MAY_CHANGE = ("total_runs", "torch_threads")
"""The only settings a rerun may change when it continues a run (as train-ppo's)."""


def load_start_graphs(config: RegalConfig, settings: OrtSettings) -> dict[str, Graph]:
    """Each training model's start graph (`config.start` of it), by the name given."""
    graphs: dict[str, Graph] = {}
    for model in config.models:
        graph = load_model(model_path(model, config.size))
        if config.start != "original":
            graph = start_state(graph, config.start, settings).graph
        graphs[model] = graph
    return graphs


def train(config: RegalConfig, run_dir: str | Path, *, progress: bool = True) -> dict[str, Any]:
    """Train (or continue training) a REGAL policy into `run_dir`; returns a summary."""
    from tqdm import tqdm

    config.validate()
    run_dir = Path(run_dir)
    checkpoint_path = run_dir / CHECKPOINT
    resumed = load_checkpoint(run_dir) if checkpoint_path.exists() else None
    if resumed is not None:
        _check_resumable(resumed["config"], config, run_dir)
    torch.set_num_threads(config.torch_threads)
    torch.manual_seed(config.seed)

    settings = OrtSettings(threads=1, ort_level="disable")  # offline: graphs run as written
    graphs = load_start_graphs(config, settings)
    ruleset = default_ruleset(portable=config.portable)
    rule_names = [rule.name for rule in ruleset]
    sessions = {name: RewriteSession(graph, ruleset, model=name) for name, graph in graphs.items()}
    cost = make_cost(config.cost, settings)
    brkga = config.brkga()
    policy = make_policy(config, rule_names)
    network = policy.network
    optimizer = torch.optim.Adam(network.parameters(), lr=config.learning_rate)
    runs, updates, wall_before = 0, 0, 0.0
    plain: dict[str, float] = {}
    baselines: dict[str, float] = {}
    progress_log: dict[str, Any] = {"kind": RUN_KIND, "runs": [], "updates": []}
    if resumed is not None:
        if resumed["rule_names"] != rule_names:
            raise RlflowError(
                f"{checkpoint_path} was trained on another rule set; resume it with the same "
                "rlflow version, or train into a new --out"
            )
        network.load_state_dict(resumed["model"])
        optimizer.load_state_dict(resumed["optimizer"])
        runs, updates, wall_before = resumed["runs"], resumed["updates"], resumed["wall_s"]
        plain, baselines = dict(resumed["plain"]), dict(resumed["baselines"])
        torch.set_rng_state(resumed["torch_rng"])
        progress_log = _progress_until(read_json(run_dir / "progress.json"), runs)

    run_dir.mkdir(parents=True, exist_ok=True)
    save_run_config(run_dir, RUN_KIND, config.to_dict())
    writer = TensorBoard(run_dir, purge_step=runs + 1 if resumed else None)
    print(f"tensorboard --logdir {run_dir}", file=sys.stderr)
    if resumed is not None:
        print(f"resuming {run_dir} at run {runs} (update {updates})", file=sys.stderr)

    started = time.perf_counter()
    start_runs = runs
    bar = tqdm(
        total=config.total_runs,
        initial=runs,
        desc=f"regal {'+'.join(config.models)}",
        unit="run",
        disable=not progress,
        file=sys.stderr,
        mininterval=0.5,
    )
    while runs < config.total_runs:
        # ---- runs: sampled biases against plain BRKGA, same seed and budget
        logprobs, entropies, advantages, rewards = [], [], [], []
        network.train()
        while len(logprobs) < config.runs_per_update and runs < config.total_runs:
            model = config.models[runs % len(config.models)]
            seed = config.seed + (runs // len(config.models)) % config.seeds
            session = sessions[model]
            key = f"{model}|{seed}"
            if key not in plain:
                bar.set_postfix_str(f"plain BRKGA on {model}, seed {seed}", refresh=True)
                plain_run = evolve(session, cost, budget=config.budget, config=brkga, seed=seed)
                plain[key] = plain_run.best_cost
            layout = start_layout(session)
            sampled, logprob, entropy = policy.distributions(session.graph, layout).sample()
            biased = evolve(
                session, cost, budget=config.budget, config=brkga, biases=sampled, seed=seed
            )
            start_cost = biased.start_cost
            reward = 100.0 * (plain[key] - biased.best_cost) / start_cost if start_cost else 0.0
            baseline = baselines.get(model, 0.0)
            baselines[model] = (
                config.baseline_decay * baseline + (1 - config.baseline_decay) * reward
            )
            logprobs.append(logprob)
            entropies.append(entropy)
            advantages.append(reward - baseline)
            rewards.append(reward)
            runs += 1
            bar.update(1)
            entry = {
                "run": runs,
                "model": model,
                "seed": seed,
                "reward": reward,
                "biased_cost_ratio": biased.best_cost / start_cost if start_cost else 1.0,
                "plain_cost_ratio": plain[key] / start_cost if start_cost else 1.0,
                "wall_s": wall_before + time.perf_counter() - started,
            }
            progress_log["runs"].append(entry)
            writer.scalar("charts/reward", reward, runs)
            writer.scalar("charts/biased_cost_ratio", entry["biased_cost_ratio"], runs)
            writer.scalar("charts/plain_cost_ratio", entry["plain_cost_ratio"], runs)
            writer.scalar("charts/baseline", baseline, runs)
            bar.set_postfix_str(f"{model} reward {reward:+.2f}%", refresh=False)

        # ---- REINFORCE step
        advantage = torch.tensor(advantages, dtype=torch.float32)
        logprob = torch.stack(logprobs)
        entropy = torch.stack(entropies).mean()
        policy_loss = -(advantage * logprob).mean()
        loss = policy_loss - config.ent_coef * entropy
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(network.parameters(), config.max_grad_norm)
        optimizer.step()
        updates += 1
        elapsed = time.perf_counter() - started
        runs_per_s = (runs - start_runs) / elapsed if elapsed > 0 else 0.0
        writer.scalar("losses/policy_loss", policy_loss.item(), runs)
        writer.scalar("losses/entropy", entropy.item(), runs)
        writer.scalar("charts/runs_per_s", runs_per_s, runs)
        progress_log["updates"].append(
            {
                "update": updates,
                "run": runs,
                "policy_loss": policy_loss.item(),
                "entropy": entropy.item(),
                "mean_reward": float(np.mean(rewards)),
            }
        )

        # ---- checkpoint: progress first, so a kill in between leaves progress ahead of the
        # checkpoint, which a rerun trims back to it
        wall_s = wall_before + time.perf_counter() - started
        progress_log.update(runs_done=runs, updates_done=updates, wall_s=wall_s)
        write_json_atomic(run_dir / "progress.json", progress_log)
        write_torch_atomic(
            checkpoint_path,
            {
                "kind": RUN_KIND,
                "version": CHECKPOINT_VERSION,
                "config": config.to_dict(),
                "rule_names": rule_names,
                "model": network.state_dict(),
                "optimizer": optimizer.state_dict(),
                "runs": runs,
                "updates": updates,
                "plain": plain,
                "baselines": baselines,
                "wall_s": wall_s,
                "torch_rng": torch.get_rng_state(),
            },
        )
        writer.flush()

    bar.close()
    writer.close()
    recent = progress_log["runs"][-config.runs_per_update :]
    return {
        "run_dir": str(run_dir),
        "runs": runs,
        "updates": updates,
        "wall_s": wall_before + time.perf_counter() - started,
        "mean_reward": float(np.mean([e["reward"] for e in recent])) if recent else None,
        "resumed": resumed is not None,
    }


def _check_resumable(saved: dict[str, Any], config: RegalConfig, run_dir: Path) -> None:
    """RlflowError when a rerun asks for other settings than the run it would continue."""
    wanted = config.to_dict()
    changed = [n for n in wanted if n not in MAY_CHANGE and saved.get(n) != wanted[n]]
    if changed:
        details = ", ".join(f"{n} {saved.get(n)!r} -> {wanted[n]!r}" for n in changed)
        raise RlflowError(
            f"{run_dir} holds a REGAL run made with other settings ({details}); rerun with its "
            "settings, train into a new --out, or pass --force to start it over"
        )


def _progress_until(progress: dict[str, Any] | None, runs: int) -> dict[str, Any]:
    """A progress log trimmed to what a checkpoint after `runs` runs had seen."""
    progress = progress or {}
    progress.setdefault("kind", RUN_KIND)
    progress["runs"] = [entry for entry in progress.get("runs", []) if entry["run"] <= runs]
    progress["updates"] = [entry for entry in progress.get("updates", []) if entry["run"] <= runs]
    return progress

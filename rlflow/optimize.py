"""Optimising one model, as a library: run a search method or a trained agent, then check.

`rlflow search`, `rlflow optimize` and `rlflow bench` are thin command lines over this module;
from Python:

    from rlflow.cost import OrtSettings
    from rlflow.graph import load_model
    from rlflow.optimize import Method, optimize

    result = optimize(load_model("model.onnx"), Method.parse("taso"), settings=OrtSettings())
    result.write("model-opt.onnx")
    result.summary()  # the fields of `rlflow optimize --json`

Every path ends the same way: the best few graphs found are timed against the original in one
interleaved run (`rlflow.search.finish`), the chosen graph is checked for equivalence with the
original, and only an equivalent graph is handed back (else RlflowError).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlflow.agents.spec import AgentSpec, is_agent_spec, parse_agent
from rlflow.cost import EquivalenceReport, OrtSettings, Runner, check_equivalence
from rlflow.errors import RlflowError
from rlflow.fileio import write_bytes_atomic
from rlflow.graph import Graph
from rlflow.rewrite.session import RewriteSession
from rlflow.search import Board, Progress, SearchResult, default_runner, finish, make_cost
from rlflow.search.base import NO_PROGRESS

SEARCH_METHODS = ("greedy", "taso", "random")
DEFAULT_METHOD = "taso"
"""What `rlflow optimize` uses without --method/--agent: it needs no trained run, and its
backtracking gets past the local minima where greedy stops (docs/BENCHMARKS.md: at ORT level
all, squeezenet-1.1 full 1.080x against greedy's 1.000x)."""
AGENT_COSTS = {"analytic": "analytic", "perop": "perop", "e2e": "e2e", "e2e-sparse": "e2e"}
"""An agent's env reward source -> the search cost model that ranks its rollouts' graphs."""


@dataclass(frozen=True)
class Method:
    """How a model is optimised: a search baseline by `name`, or a trained `agent`."""

    name: str
    """greedy | taso | random | agent."""
    agent: AgentSpec | None = None

    @classmethod
    def parse(cls, text: str) -> Method:
        """`greedy`, `taso`, `random` or `agent:RUN_DIR` (the run must exist)."""
        if is_agent_spec(text):
            return cls("agent", parse_agent(text))
        if text not in SEARCH_METHODS:
            raise RlflowError(
                f"unknown method {text!r}; choose one of {', '.join(SEARCH_METHODS)} "
                "or agent:RUN_DIR"
            )
        return cls(text)

    @property
    def is_agent(self) -> bool:
        return self.agent is not None

    @property
    def label(self) -> str:
        """A short name for tables: `taso`, or `agent:RUN_DIR_NAME`."""
        return self.agent.label if self.agent is not None else self.name

    def __str__(self) -> str:
        """The spelling that `parse` reads back."""
        return str(self.agent) if self.agent is not None else self.name


@dataclass(frozen=True)
class SearchOptions:
    """How a method runs; search methods and agents read the fields that concern them."""

    budget: int | None = None
    """Search: expansions (None: the method's default)."""
    cost: str | None = None
    """Cost model ranking the graphs found; None: analytic (search), the env's (agent)."""
    alpha: float = 1.05
    """taso: keep graphs under alpha x the best cost."""
    seed: int = 0
    """random: seed of the walks; agents: seed of the rollouts."""
    top_k: int = 3
    """Best graphs timed against the original at the end."""
    portable: bool = False
    """Only rules that emit standard ONNX ops."""
    episodes: int = 4
    """Agents: rollouts on the model."""
    size: str = "small"
    """Agents: zoo size for the env (when MODEL is a zoo name)."""

    def validate(self) -> None:
        """Raise RlflowError on values no method accepts."""
        if self.budget is not None and self.budget < 1:
            raise RlflowError(f"--budget must be at least 1, got {self.budget}")
        if self.top_k < 1:
            raise RlflowError(f"--top-k must be at least 1, got {self.top_k}")
        if self.episodes < 1:
            raise RlflowError(f"--episodes must be at least 1, got {self.episodes}")


def expansion_total(method: Method, budget: int | None) -> int | None:
    """The expansions a search will make (for a progress bar); None when unknown (greedy,
    agents)."""
    from rlflow.search import random_walk, taso

    if method.is_agent:
        return None
    if budget is not None:
        return budget
    return {"taso": taso.DEFAULT_BUDGET, "random": random_walk.DEFAULT_BUDGET}.get(method.name)


def run_search(
    name: str,
    original: Graph,
    label: str,
    settings: OrtSettings,
    options: SearchOptions,
    *,
    runner: Runner,
    progress: Progress | None = None,
) -> SearchResult:
    """Run a search baseline on `original`; its result is measured but not yet checked."""
    from rlflow.rewrite import default_ruleset
    from rlflow.search import search

    options.validate()
    cost = make_cost(options.cost or "analytic", settings)
    session = RewriteSession(original, default_ruleset(portable=options.portable), model=label)
    kwargs: dict[str, Any] = {"runner": runner, "top_k": options.top_k}
    if progress is not None:
        kwargs["progress"] = progress
    if options.budget is not None:
        kwargs["budget"] = options.budget
    if name == "taso":
        kwargs["alpha"] = options.alpha
    if name == "random":
        kwargs["seed"] = options.seed
    return search(name, session, cost, **kwargs)


def run_agent(
    agent: AgentSpec,
    original: Graph,
    label: str,
    settings: OrtSettings,
    options: SearchOptions,
    *,
    runner: Runner,
    progress: Progress | None = None,
) -> SearchResult:
    """Roll a trained agent out on `original`, then time its best final graphs against the
    original exactly as a search does (`rlflow.search.finish`)."""
    from rlflow.agents.evaluate import policy_rollouts
    from rlflow.worldmodel.policy import load_agent_policy

    options.validate()
    policy = load_agent_policy(agent)
    started = time.perf_counter()
    env_cost = str(policy.env_config.get("cost", "analytic"))
    cost = make_cost(options.cost or AGENT_COSTS.get(env_cost, "analytic"), settings)
    cost.reset_count()
    if progress is not None:
        progress.set_postfix_str(f"{options.episodes} {agent.kind} rollouts", refresh=True)
    sessions = policy_rollouts(
        policy, original, episodes=options.episodes, seed=options.seed, size=options.size
    )
    board = Board(options.top_k)
    for session in sessions:
        board.offer(cost(session.graph), session)
    root = RewriteSession(original, sessions[0].ruleset if sessions else None, model=label)
    steps = sum(len(session.actions) for session in sessions)
    if progress is not None:
        progress.update(steps)
    return finish(
        f"agent:{agent.kind}",
        root,
        board,
        cost,
        expansions=steps,
        started=started,
        runner=runner,
        progress=progress if progress is not None else NO_PROGRESS,
    )


def run_method(
    method: Method,
    original: Graph,
    label: str,
    settings: OrtSettings,
    options: SearchOptions,
    *,
    runner: Runner,
    progress: Progress | None = None,
) -> SearchResult:
    """`run_agent` for an agent, else `run_search`: measured, not yet checked."""
    if method.agent is not None:
        return run_agent(
            method.agent, original, label, settings, options, runner=runner, progress=progress
        )
    return run_search(
        method.name, original, label, settings, options, runner=runner, progress=progress
    )


def check_result(original: Graph, result: SearchResult) -> EquivalenceReport:
    """The equivalence report of the result against the original; RlflowError if it fails."""
    report = check_equivalence(original, result.graph)
    if not report.equivalent:
        raise RlflowError(
            f"the optimised graph is not equivalent to the original ({report.reason}); "
            f"nothing written"
        )
    return report


def write_model(path: str | Path, graph: Graph) -> Path:
    """Export `graph` to ONNX at `path`, atomically."""
    return write_bytes_atomic(path, graph.to_onnx().SerializeToString())


@dataclass
class OptimizeResult:
    """One finished, checked optimisation: what ran, what it found, and the proof it is
    equivalent. `graph` is the search result's (the original when nothing measured faster)."""

    method: Method
    original: Graph
    result: SearchResult
    report: EquivalenceReport
    wall_s: float

    @property
    def graph(self) -> Graph:
        return self.result.graph

    def write(self, path: str | Path) -> Path:
        """The optimised model as ONNX at `path` (written atomically)."""
        return write_model(path, self.graph)

    def summary(self, **extra: Any) -> dict[str, Any]:
        """The JSON-ready summary (the `optimize --json` contract); `extra` fields are added
        before the episode record, which stays last."""
        result, report = self.result, self.report
        summary: dict[str, Any] = {
            "model": result.model,
            "method": str(self.method),
            "original_ms": result.original_ms,
            "optimized_ms": result.optimized_ms,
            "speedup": result.speedup,
            "ort_level": result.ort_level,
            "threads": result.threads,
            "provider": result.provider,
            "steps": len(result.actions),
            "rules_applied": result.rules_applied,
            "wall_s": self.wall_s,
            "search_s": result.search_s,
            "measure_s": result.measure_s,
            "max_abs_err": report.max_abs_err,
            "max_rel_err": report.max_rel_err,
            "equivalent": report.equivalent,
            "expansions": result.expansions,
            "evaluated": result.evaluated,
            "cost_model": result.cost_model,
            "original_cost": result.original_cost,
            "optimized_cost": result.cost,
            "original_nodes": len(self.original),
            "optimized_nodes": len(result.graph),
            "finalists": [vars(finalist) for finalist in result.finalists],
            "confirmed": result.confirmed,
            **extra,
        }
        summary["episode"] = result.state.to_json()
        return summary


def optimize(
    original: Graph,
    method: Method,
    *,
    label: str = "model",
    settings: OrtSettings | None = None,
    options: SearchOptions | None = None,
    runner: Runner | None = None,
    progress: Progress | None = None,
) -> OptimizeResult:
    """Optimise `original` with `method` and check the result (RlflowError if it is not
    equivalent). `runner` times the final graphs (default: `rlflow.search.default_runner`)."""
    started = time.perf_counter()
    settings = (settings or OrtSettings()).resolved()
    options = options or SearchOptions()
    options.validate()
    result = run_method(
        method,
        original,
        label,
        settings,
        options,
        runner=runner or default_runner(settings),
        progress=progress,
    )
    report = check_result(original, result)
    return OptimizeResult(method, original, result, report, time.perf_counter() - started)


__all__ = [
    "DEFAULT_METHOD",
    "SEARCH_METHODS",
    "Method",
    "OptimizeResult",
    "SearchOptions",
    "check_result",
    "expansion_total",
    "optimize",
    "run_method",
    "write_model",
]

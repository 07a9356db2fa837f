"""Optimising one model: run a search method or a trained agent, then check and keep the result.

Shared by `rlflow search`, `rlflow optimize` and `rlflow bench`. Every path ends the same way:
the best few graphs found are timed against the original in one interleaved run
(`rlflow.search.finish`), the chosen graph is checked for equivalence with the original, and
only then written. A method is named `greedy`, `taso`, `random` or `agent:RUN_DIR`.
`rlflow search` and `rlflow optimize` also share their options and their whole run
(`add_method_arguments`, `optimize_to_file`): they differ only in how the method is chosen.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlflow.cost import EquivalenceReport, OrtSettings, Runner, check_equivalence
from rlflow.errors import RlflowError
from rlflow.fileio import write_bytes_atomic
from rlflow.graph import Graph
from rlflow.rewrite.session import RewriteSession
from rlflow.search import COST_MODELS, Board, Progress, SearchResult, finish, make_cost
from rlflow.search.base import NO_PROGRESS

SEARCH_METHODS = ("greedy", "taso", "random")
COST_CHOICES = COST_MODELS
DEFAULT_METHOD = "taso"
"""What `rlflow optimize` uses without --method/--agent: it needs no trained run, and its
backtracking gets past the local minima where greedy stops (docs/BENCHMARKS.md: at ORT level
all, squeezenet-1.1 full 1.080x against greedy's 1.000x)."""
AGENT_PREFIX = "agent:"
AGENT_KINDS = ("ppo", "controller")
AGENT_COSTS = {"analytic": "analytic", "perop": "perop", "e2e": "e2e", "e2e-sparse": "e2e"}
"""An agent's env reward source -> the search cost model that ranks its rollouts' graphs."""


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


def check_options(options: SearchOptions) -> None:
    """Raise RlflowError on option values no method accepts."""
    if options.budget is not None and options.budget < 1:
        raise RlflowError(f"--budget must be at least 1, got {options.budget}")
    if options.top_k < 1:
        raise RlflowError(f"--top-k must be at least 1, got {options.top_k}")
    if options.episodes < 1:
        raise RlflowError(f"--episodes must be at least 1, got {options.episodes}")


def is_agent(method: str) -> bool:
    """Whether a method name is `agent:RUN_DIR`."""
    return method.startswith(AGENT_PREFIX)


def method_label(method: str) -> str:
    """A short name for tables: `agent:runs/ppo-sq/` -> `agent:ppo-sq`."""
    if is_agent(method):
        return AGENT_PREFIX + Path(method[len(AGENT_PREFIX) :].rstrip("/")).name
    return method


def validate_method(method: str) -> None:
    """Raise RlflowError unless `method` is a search name or agent:RUN_DIR with a run there."""
    if is_agent(method):
        agent_kind(method[len(AGENT_PREFIX) :])
    elif method not in SEARCH_METHODS:
        raise RlflowError(
            f"unknown method {method!r}; choose one of {', '.join(SEARCH_METHODS)} or agent:RUN_DIR"
        )


def expansion_total(method: str, budget: int | None) -> int | None:
    """The expansions a search will make (for a progress bar); None when unknown (greedy)."""
    from rlflow.search import random_walk, taso

    if budget is not None:
        return budget
    return {"taso": taso.DEFAULT_BUDGET, "random": random_walk.DEFAULT_BUDGET}.get(method)


def run_search(
    method: str,
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

    check_options(options)
    cost = make_cost(options.cost or "analytic", settings)
    session = RewriteSession(original, default_ruleset(portable=options.portable), model=label)
    kwargs: dict[str, Any] = {"runner": runner, "top_k": options.top_k}
    if progress is not None:
        kwargs["progress"] = progress
    if options.budget is not None:
        kwargs["budget"] = options.budget
    if method == "taso":
        kwargs["alpha"] = options.alpha
    if method == "random":
        kwargs["seed"] = options.seed
    return search(method, session, cost, **kwargs)


# ---- agents -------------------------------------------------------------------------------


def agent_config(run_dir: str | Path) -> dict[str, Any]:
    """RUN_DIR/config.yaml as a dict; RlflowError if the directory or the file is not usable."""
    import yaml

    path = Path(run_dir)
    if not path.is_dir():
        raise RlflowError(f"no such agent run directory: {run_dir}")
    config_path = path / "config.yaml"
    if not config_path.is_file():
        raise RlflowError(f"{run_dir} has no config.yaml: not a training run directory")
    try:
        config = yaml.safe_load(config_path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as error:
        raise RlflowError(f"cannot read {config_path}: {type(error).__name__}") from None
    if not isinstance(config, dict):
        raise RlflowError(f"{config_path} is not a YAML mapping")
    return config


def agent_kind(run_dir: str | Path) -> str:
    """The `kind` of a training run (ppo | controller), from its config.yaml."""
    kind = agent_config(run_dir).get("kind")
    if kind is None:
        raise RlflowError(f"{Path(run_dir) / 'config.yaml'} names no kind (ppo or controller)")
    if kind not in AGENT_KINDS:
        raise RlflowError(
            f"{Path(run_dir) / 'config.yaml'}: unknown kind {kind!r}; expected "
            f"{' or '.join(AGENT_KINDS)}"
        )
    return str(kind)


def load_agent(run_dir: str | Path) -> tuple[str, Any]:
    """(kind, policy) of a training run: a PPO checkpoint or a world-model controller."""
    kind = agent_kind(run_dir)
    try:
        if kind == "ppo":
            from rlflow.agents.policy import load_ppo_policy as load_policy
        else:
            from rlflow.worldmodel.controller import load_controller_policy as load_policy
    except ImportError as error:
        raise RlflowError(f"this rlflow cannot load {kind} runs yet ({error})") from None
    return kind, load_policy(run_dir)


def run_agent(
    run_dir: str | Path,
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

    check_options(options)
    kind, policy = load_agent(run_dir)
    started = time.perf_counter()
    env_cost = str(policy.env_config.get("cost", "analytic"))
    cost = make_cost(options.cost or AGENT_COSTS.get(env_cost, "analytic"), settings)
    cost.reset_count()
    if progress is not None:
        progress.set_postfix_str(f"{options.episodes} {kind} rollouts", refresh=True)
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
        f"agent:{kind}",
        root,
        board,
        cost,
        expansions=steps,
        started=started,
        runner=runner,
        progress=progress if progress is not None else NO_PROGRESS,
    )


# ---- check, write, report -----------------------------------------------------------------


def run_method(
    method: str,
    original: Graph,
    label: str,
    settings: OrtSettings,
    options: SearchOptions,
    *,
    runner: Runner,
    progress: Progress | None = None,
) -> SearchResult:
    """`run_search` or, for `agent:RUN_DIR`, `run_agent`."""
    validate_method(method)
    if is_agent(method):
        run_dir = method[len(AGENT_PREFIX) :]
        return run_agent(
            run_dir, original, label, settings, options, runner=runner, progress=progress
        )
    return run_search(method, original, label, settings, options, runner=runner, progress=progress)


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


def summarize(
    result: SearchResult,
    report: EquivalenceReport,
    original: Graph,
    *,
    method: str,
    output: str | Path | None,
    wall_s: float,
    extra: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The JSON-ready summary of one optimisation (DESIGN.md's `optimize --json` contract)."""
    summary: dict[str, Any] = {
        "model": result.model,
        "method": method,
        "output": None if output is None else str(output),
        "original_ms": result.original_ms,
        "optimized_ms": result.optimized_ms,
        "speedup": result.speedup,
        "ort_level": result.ort_level,
        "threads": result.threads,
        "provider": result.provider,
        "steps": len(result.actions),
        "rules_applied": result.rules_applied,
        "wall_s": wall_s,
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
        "original_nodes": len(original),
        "optimized_nodes": len(result.graph),
        "finalists": [vars(finalist) for finalist in result.finalists],
        "confirmed": result.confirmed,
    }
    summary.update(extra or {})
    summary["episode"] = result.state.to_json()
    return summary


def _how_measured(summary: Mapping[str, Any]) -> str:
    finalists = len(summary["finalists"])
    if summary["confirmed"] is None:
        return f"the original was fastest of {finalists} graphs timed interleaved in one run"
    if summary["confirmed"]:
        return f"fastest of {finalists} graphs, confirmed in a second interleaved run"
    return f"the fastest of {finalists} graphs was not faster in a second run: original kept"


def print_summary(summary: Mapping[str, Any]) -> None:
    """The human form of `summarize`'s dict: before/after, speedup, rules, wall time."""
    print(f"{'':<14}{'original':>12}{'optimized':>12}")
    print(f"{'latency ms':<14}{summary['original_ms']:>12.3f}{summary['optimized_ms']:>12.3f}")
    print(f"{'nodes':<14}{summary['original_nodes']:>12}{summary['optimized_nodes']:>12}")
    cost_label = f"cost ({summary['cost_model']})"
    print(f"{cost_label:<14}{summary['original_cost']:>12.4g}{summary['optimized_cost']:>12.4g}")
    print(f"speedup {summary['speedup']:.3f}x ({_how_measured(summary)})")
    if summary["rules_applied"]:
        rules = ", ".join(f"{name} x{count}" for name, count in summary["rules_applied"].items())
        print(f"rules applied ({summary['steps']} steps): {rules}")
    else:
        print("rules applied: none (no rewritten graph measured faster than the original)")
    if summary.get("chosen_by_default"):
        print(f"method: {summary['method']} (the default; choose with --method or --agent)")
    if is_agent(summary["method"]):
        how = (
            f"agent: {summary['method']}, {summary.get('episodes', '?')} rollouts, "
            f"{summary['expansions']} env steps"
        )
    else:
        how = (
            f"search: {summary['method']}, {summary['expansions']} expansions, "
            f"{summary['evaluated']} graphs costed"
        )
    print(
        f"{how}; wall {summary['wall_s']:.1f} s "
        f"(search {summary['search_s']:.1f} s, measure {summary['measure_s']:.1f} s)"
    )
    print(
        f"settings: {summary['threads']} thread(s), ort-level {summary['ort_level']}, "
        f"provider {summary['provider']}"
    )
    print(f"equivalent: yes, max abs error {summary['max_abs_err']:.2e}")
    if summary.get("output"):
        print(f"wrote {summary['output']}")


# ---- the command line of search and optimize -------------------------------------------------


def add_method_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of `rlflow search` and `rlflow optimize` after MODEL and the method: how
    the method runs, how its result is measured, and where it goes."""
    from rlflow.commands.measure import add_ort_arguments

    parser.add_argument(
        "--budget",
        type=int,
        help="search expansions (default: greedy to its local minimum, taso 1000, random 300)",
    )
    parser.add_argument(
        "--cost",
        choices=COST_CHOICES,
        help="cost model ranking the graphs found (default: analytic for a search, the env's "
        "reward source for an agent; e2e: small budgets only)",
    )
    parser.add_argument(
        "--alpha", type=float, default=1.05, help="taso: keep graphs under alpha x best cost"
    )
    parser.add_argument(
        "--portable", action="store_true", help="search: only rules that emit standard ONNX ops"
    )
    parser.add_argument(
        "--episodes", type=int, default=4, help="agent: rollouts on the model (default 4)"
    )
    parser.add_argument("--seed", type=int, default=0, help="random walks / agent rollouts")
    parser.add_argument(
        "--top-k", type=int, default=3, help="best graphs timed against the original at the end"
    )
    parser.add_argument(
        "--min-time",
        type=float,
        metavar="S",
        help="timed seconds per graph in the final measurements (default: adaptive, 1-30 s "
        "until every ratio to the original is known within 2%%)",
    )
    add_ort_arguments(parser)
    parser.add_argument("-o", "--output", required=True, metavar="OUT", help="optimised .onnx")
    parser.add_argument("--json", action="store_true", help="print one JSON object last")


def optimize_to_file(
    args: argparse.Namespace,
    method: str,
    *,
    chosen: str | None = None,
    extra: Mapping[str, Any] | None = None,
) -> int:
    """Run `method` on args.model with `add_method_arguments`' options, check the result,
    write it to args.output and print its summary (JSON with --json); the commands' `run`.
    `chosen` (how the method was chosen) is announced on stderr once the model has loaded."""
    from tqdm import tqdm

    from rlflow.commands.common import model_label, print_json, resolve_model
    from rlflow.search import default_runner

    started = time.perf_counter()
    if args.min_time is not None and args.min_time < 0:
        raise RlflowError(f"--min-time must be at least 0, got {args.min_time}")
    options = SearchOptions(
        budget=args.budget,
        cost=args.cost,
        alpha=args.alpha,
        seed=args.seed,
        top_k=args.top_k,
        portable=args.portable,
        episodes=args.episodes,
        size=args.size,
    )
    check_options(options)
    validate_method(method)  # a bad agent run fails before the model is loaded
    agent = is_agent(method)
    if agent and (args.budget is not None or args.portable):
        raise RlflowError("--budget and --portable are for searches; an agent runs --episodes")
    original = resolve_model(args.model, args.size, args.input_shape)
    label = model_label(args.model, args.size)
    settings = OrtSettings(threads=args.threads, ort_level=args.ort_level).resolved()
    if chosen is not None:
        print(f"rlflow optimize: {label} with {chosen}", file=sys.stderr)
    total = None if agent else expansion_total(method, args.budget)
    with tqdm(
        total=total,
        desc=f"{method_label(method)} {label}",
        unit="step" if agent else "exp",
        file=sys.stderr,
        mininterval=0.5,
    ) as bar:
        result = run_method(
            method,
            original,
            label,
            settings,
            options,
            runner=default_runner(settings, args.min_time),
            progress=bar,
        )
    report = check_result(original, result)
    write_model(args.output, result.graph)
    summary = summarize(
        result,
        report,
        original,
        method=method,
        output=args.output,
        wall_s=time.perf_counter() - started,
        extra={
            "budget": None if agent else total,
            "alpha": args.alpha if method == "taso" else None,
            "seed": args.seed if method == "random" or agent else None,
            "portable": None if agent else args.portable,
            "episodes": args.episodes if agent else None,
            "min_time_s": args.min_time,
            **(extra or {}),
        },
    )
    if args.json:
        print_json(summary)
    else:
        print_summary(summary)
    return 0

"""Optimising one model, as a library: run a search method or a trained agent, then check.

`rlflow search`, `rlflow optimize` and `rlflow bench` are thin command lines over this module;
from Python:

    from rlflow.cost import OrtSettings
    from rlflow.graph import load_with_interface
    from rlflow.optimize import Method, optimize

    graph, interface = load_with_interface("model.onnx", {"x": (1, 3, 224, 224)})
    result = optimize(graph, Method.parse("taso"), settings=OrtSettings(), interface=interface)
    result.write("model-opt.onnx")  # x keeps its symbolic dims where the result allows
    result.summary()  # the fields of `rlflow optimize --json`

Every path ends the same way: the best few graphs found are timed against the original in one
interleaved run (`rlflow.search.finish`), the chosen graph is checked for equivalence with the
original, and only an equivalent graph is handed back (else RlflowError). Given the original's
`Interface` (`rlflow.graph.load_with_interface`), the model handed back keeps it: its inputs,
outputs and the dynamic dims that stay general, checked against the original file itself
(`rlflow.cost.handback`).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from rlflow.advantage.spec import is_guided_spec, parse_guided
from rlflow.agents.regal import is_regal_spec, parse_regal
from rlflow.agents.spec import AgentSpec, is_agent_spec, parse_agent
from rlflow.config import run_name
from rlflow.cost import Deployment, EquivalenceReport, OrtSettings, Runner, check_equivalence
from rlflow.cost.equivalence import FINAL_SEEDS, MAGNITUDES
from rlflow.cost.handback import HandedBack, hand_back
from rlflow.cost.ort_optimizer import (
    Peer,
    StartState,
    fusion_table,
    optimized_graph,
    start_state,
    start_states,
    tuning_peer,
)
from rlflow.errors import RlflowError
from rlflow.fileio import write_bytes_atomic
from rlflow.graph import Graph, Interface
from rlflow.rewrite import RuleSet, default_ruleset
from rlflow.rewrite.session import RewriteSession
from rlflow.search import Board, Progress, SearchResult, default_runner, finish, make_cost
from rlflow.search.base import NO_PROGRESS
from rlflow.search.cost import table_elsewhere
from rlflow.search.replay import Recording, is_replay_spec, read_recording

SEARCH_METHODS = ("greedy", "taso", "random", "brkga")
DEFAULT_METHOD = "taso"
"""What `rlflow optimize` uses without --method/--agent: it needs no trained run, and its
backtracking gets past the local minima where greedy stops (docs/BENCHMARKS.md: at ORT level
all, squeezenet-1.1 full 1.080x against greedy's 1.000x)."""
SEARCH_COSTS = {"offline": "perop", "online": "analytic"}
"""The cost a search ranks graphs by, per deploy mode, unless told otherwise: offline every
operator runs as written, so the per-op measured cost adds up to the graph's latency (and prices
onnxruntime's own kernels, which a roofline cannot); online onnxruntime rewrites the graph
before it runs, so the cheap analytic model is as good a guide as any."""
AGENT_COSTS = {
    "analytic": "analytic",
    "perop": "perop",
    "e2e": "e2e",
    "e2e-sparse": "e2e",
    "perop-e2e": "perop",
}
"""An agent's env reward source -> the search cost model that ranks its rollouts' graphs (a
`table:` source ranks them by its own table)."""


@dataclass(frozen=True)
class Method:
    """How a model is optimised: a search baseline by `name`, or a trained `agent`."""

    name: str
    """greedy | taso | random | brkga | regal | guided | agent."""
    agent: AgentSpec | None = None
    regal: Path | None = None
    """regal: the `rlflow train-regal` run whose policy biases BRKGA."""
    guide: Path | None = None
    """guided: the `rlflow train-advantage` run whose model ranks the candidates."""
    recording: Recording | None = None
    """replay: a result recorded elsewhere (`rlflow.search.replay`), re-applied and timed here."""

    @classmethod
    def parse(cls, text: str) -> Method:
        """`greedy`, `taso`, `random`, `brkga`, `regal:RUN_DIR`, `guided:RUN_DIR`,
        `agent:RUN_DIR` (the run must exist) or `replay:RESULT.json`."""
        if is_agent_spec(text):
            return cls("agent", parse_agent(text))
        if is_replay_spec(text):
            return cls("replay", recording=read_recording(text))
        if is_regal_spec(text):
            return cls("regal", regal=parse_regal(text))
        if is_guided_spec(text):
            return cls("guided", guide=parse_guided(text))
        if text not in SEARCH_METHODS:
            raise RlflowError(
                f"unknown method {text!r}; choose one of {', '.join(SEARCH_METHODS)}, "
                "regal:RUN_DIR, guided:RUN_DIR, agent:RUN_DIR or replay:RESULT.json"
            )
        return cls(text)

    @property
    def is_agent(self) -> bool:
        return self.agent is not None

    @property
    def label(self) -> str:
        """A short name for tables: `taso`, or `agent:RUN_DIR_NAME`."""
        if self.regal is not None:
            return f"regal:{run_name(self.regal)}"
        if self.guide is not None:
            return f"guided:{run_name(self.guide)}"
        if self.recording is not None:
            return self.recording.label
        return self.agent.label if self.agent is not None else self.name

    def __str__(self) -> str:
        """The spelling that `parse` reads back."""
        if self.regal is not None:
            return f"regal:{self.regal}"
        if self.guide is not None:
            return f"guided:{self.guide}"
        if self.recording is not None:
            return str(self.recording)
        return str(self.agent) if self.agent is not None else self.name


@dataclass(frozen=True)
class SearchOptions:
    """How a method runs; search methods and agents read the fields that concern them."""

    budget: int | None = None
    """Search: expansions (None: the method's default)."""
    cost: str | None = None
    """Cost model ranking the graphs found; None: `SEARCH_COSTS` of the deploy mode (search),
    the env's (agent)."""
    alpha: float = 1.05
    """taso: keep graphs under alpha x the best cost."""
    exploration: float = 0.1
    """guided: the chance an expansion takes a random frontier candidate, not the best."""
    seed: int = 0
    """random: seed of the walks; brkga, regal: of the evolution; agents: of the rollouts."""
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
    """The expansions a search will make (for a progress bar; a replay's steps); None when
    unknown (greedy, agents)."""
    from rlflow.search import brkga, guided, random_walk, taso

    if method.recording is not None:
        return len(method.recording.episode.actions)
    if method.is_agent:
        return None
    if budget is not None:
        return budget
    defaults = {
        "taso": taso.DEFAULT_BUDGET,
        "random": random_walk.DEFAULT_BUDGET,
        "brkga": brkga.DEFAULT_BUDGET,
        "regal": brkga.DEFAULT_BUDGET,
        "guided": guided.DEFAULT_BUDGET,
    }
    return defaults.get(method.name)


@dataclass(frozen=True)
class Run:
    """What running one method needs besides the method and its start graph."""

    label: str
    """The model's name in results."""
    settings: OrtSettings
    """The settings the graphs run under (offline: the optimiser off)."""
    options: SearchOptions
    runner: Runner
    """Times the final graphs."""
    progress: Progress | None = None
    reference: Graph | None = None
    """What speedups are against (default: the start graph)."""
    search_cost: str = "analytic"
    """The cost a search ranks graphs by when `options.cost` names none."""
    ruleset: RuleSet | None = None
    """The rules a search rewrites with (None: `default_ruleset`, portable if asked)."""


def run_search(name: str, start: Graph, run: Run, **extra: Any) -> SearchResult:
    """Run a search baseline from `start`; its result is measured but not yet checked.
    `extra` are further keyword arguments of the method (e.g. brkga's `biases`)."""
    from rlflow.search import search

    options = run.options
    options.validate()
    cost = make_cost(options.cost or run.search_cost, run.settings)
    rules = run.ruleset if run.ruleset is not None else default_ruleset(options.portable)
    session = RewriteSession(start, rules, model=run.label)
    kwargs: dict[str, Any] = {
        "runner": run.runner,
        "top_k": options.top_k,
        "reference": run.reference,
    }
    if run.progress is not None:
        kwargs["progress"] = run.progress
    if options.budget is not None:
        kwargs["budget"] = options.budget
    if name == "taso":
        kwargs["alpha"] = options.alpha
    if name in ("random", "brkga"):
        kwargs["seed"] = options.seed
    return search(name, session, cost, **kwargs, **extra)


def run_regal(run_dir: Path, start: Graph, run: Run) -> SearchResult:
    """BRKGA from `start`, its chromosome distribution biased by a trained REGAL policy
    (`rlflow.agents.regal_policy`) with the BRKGA parameters it was trained with."""
    from rlflow.agents.regal_policy import load_regal_policy

    policy = load_regal_policy(run_dir)
    return run_search(
        "brkga", start, run, biases=policy.biases, config=policy.brkga_config, label="regal"
    )


def run_guided(run_dir: Path, start: Graph, run: Run) -> SearchResult:
    """The search guided by a trained advantage run (`rlflow.advantage.guide`), with the
    options' budget, seed, alpha and exploration."""
    from rlflow.advantage.guide import load_guide

    options = run.options
    if not 0.0 <= options.exploration <= 1.0:
        raise RlflowError(f"--exploration must be in [0, 1], got {options.exploration}")
    return run_search(
        "guided",
        start,
        run,
        advantage=load_guide(run_dir),
        seed=options.seed,
        alpha=options.alpha,
        exploration=options.exploration,
    )


def run_agent(agent: AgentSpec, start: Graph, run: Run) -> SearchResult:
    """Roll a trained agent out from `start`, then time its best graphs (each rollout's last,
    and the cheapest it passed) exactly as a search does (`rlflow.search.finish`)."""
    from rlflow.agents.evaluate import agent_rollouts
    from rlflow.worldmodel.policy import load_agent_policy

    options, progress = run.options, run.progress
    options.validate()
    policy = load_agent_policy(agent)
    started = time.perf_counter()
    env_cost = str(policy.env_config.get("cost", "analytic"))
    ranked_by = env_cost if env_cost.startswith("table:") else AGENT_COSTS.get(env_cost, "analytic")
    cost = make_cost(options.cost or ranked_by, run.settings)
    cost.reset_count()
    if progress is not None:
        progress.set_postfix_str(f"{options.episodes} {agent.kind} rollouts", refresh=True)
    # `start` is where the agent begins (the start state chosen here), not a model to which the
    # start of the agent's training env (onnxruntime's graph, say) would be applied again.
    rollouts = agent_rollouts(
        policy,
        start,
        episodes=options.episodes,
        seed=options.seed,
        size=options.size,
        # Measured, if at all, where this result is timed, not where the agent trained.
        env_overrides={"start": "original", "provider": run.settings.provider},
    )
    board = Board(options.top_k)
    for rollout in rollouts:
        for session in rollout.sessions:
            board.offer(cost(session.graph), session)
    ruleset = rollouts[0].final.ruleset if rollouts else None
    root = RewriteSession(start, ruleset, model=run.label)
    steps = sum(len(rollout.final.actions) for rollout in rollouts)
    if progress is not None:
        progress.update(steps)
    return finish(
        f"agent:{agent.kind}",
        root,
        board,
        cost,
        expansions=steps,
        started=started,
        runner=run.runner,
        progress=progress if progress is not None else NO_PROGRESS,
        reference=run.reference,
    )


def run_replay(recording: Recording, start: Graph, run: Run) -> SearchResult:
    """The recorded episode re-applied to `start` and timed (`rlflow.search.replay`), its graph
    ranked by the recorded cost table if one ranked it, else by the cheap analytic model (one
    graph: the ranking only fills the result's cost fields)."""
    from rlflow.search import replay

    cost = make_cost(run.options.cost or recording.table or "analytic", run.settings)
    return replay.search(
        recording,
        start,
        run.ruleset,
        cost,
        label=run.label,
        runner=run.runner,
        progress=run.progress or NO_PROGRESS,
        reference=run.reference,
    )


def run_method(method: Method, start: Graph, run: Run) -> SearchResult:
    """`run_agent` for an agent, `run_regal` for REGAL, `run_replay` for a recorded result, else
    `run_search`: measured, not yet checked."""
    if method.recording is not None:
        return run_replay(method.recording, start, run)
    if method.agent is not None:
        return run_agent(method.agent, start, run)
    if method.regal is not None:
        return run_regal(method.regal, start, run)
    if method.guide is not None:
        return run_guided(method.guide, start, run)
    return run_search(method.name, start, run)


def check_result(
    original: Graph, graph: Graph, *, strict: bool = True, provider: str = "auto"
) -> EquivalenceReport:
    """The equivalence report of an optimised graph against the original, each run under the
    settings it declares (the original with the optimiser off) on `provider`, on every seed of
    FINAL_SEEDS at every float scale of MAGNITUDES; RlflowError if it fails (when `strict`)."""
    report = check_equivalence(
        original, graph, seeds=FINAL_SEEDS, scales=MAGNITUDES, provider=provider
    )
    if not strict:
        return report
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
    settings: OrtSettings
    """The original's settings, what speedups are against (onnxruntime's defaults: level all)."""
    deploy: Deployment
    graph: Graph
    """The result as written: the search's graph with the metadata of its deployment."""
    start: StartState
    """The start state the method began from (the best of those measured, offline)."""
    start_speedups: dict[str, float]
    """Every start state measured, by name: its speedup over the original under ORT's defaults."""
    peer: Peer | None
    fusions: dict[str, dict[str, Any]]
    """onnxruntime's fusions in its `all` graph of the original against the result's, per
    operator (`rlflow.cost.ort_optimizer.fusion_table`): what rlflow kept and dropped."""
    handed: HandedBack | None = None
    """With the original's interface: the model to write, keeping it, and what the checks at
    other sizes found (None: `graph` is written as it is)."""

    def write(self, path: str | Path) -> Path:
        """The optimised model as ONNX at `path` (written atomically)."""
        if self.handed is not None:
            return write_bytes_atomic(path, self.handed.model.SerializeToString())
        return write_model(path, self.graph)

    def summary(self, **extra: Any) -> dict[str, Any]:
        """The JSON-ready summary (the `optimize --json` contract); `extra` fields are added
        before the episode record, which stays last."""
        from rlflow.cost import ORT_CONFIG_KEY, TARGET_KEY

        result, report = self.result, self.report
        metadata = self.graph.metadata
        summary: dict[str, Any] = {
            "model": result.model,
            "method": str(self.method),
            "original_ms": result.original_ms,
            "optimized_ms": result.optimized_ms,
            "speedup": result.speedup,
            "peer_speedup": self.peer.speedup if self.peer else None,
            "peer_knob": self.peer.knob if self.peer else None,
            "peer_speedups": self.peer.speedups if self.peer else None,
            "peer_selected": self.peer.selected if self.peer else None,
            "deploy": self.deploy.mode,
            "ort_config": json.loads(metadata[ORT_CONFIG_KEY])
            if ORT_CONFIG_KEY in metadata
            else None,
            "target": json.loads(metadata[TARGET_KEY]) if TARGET_KEY in metadata else None,
            "start_state": self.start.name,
            "start_speedups": self.start_speedups,
            "fusions": self.fusions,
            "ort_level": self.settings.ort_level,
            "result_ort_level": result.ort_level,
            "threads": result.threads,
            "provider": result.provider,
            "provider_options": self.settings.provider_options(),
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
            "cost_table": result.cost_details,
            "original_cost": result.original_cost,
            "optimized_cost": result.cost,
            "original_nodes": len(self.original),
            "optimized_nodes": len(result.graph),
            "finalists": [vars(finalist) for finalist in result.finalists],
            "confirmed": result.confirmed,
            "check": report.reason,
            "inputs_drawn": dict(report.inputs),
            "interface": self.handed.to_json() if self.handed is not None else None,
            **extra,
        }
        summary["episode"] = result.state.to_json()
        return summary


def _json_entry(metadata: dict[str, str], key: str) -> Any:
    return json.loads(metadata[key]) if key in metadata else None


def choose_start(
    original: Graph, runner: Runner, progress: Progress | None = None
) -> tuple[StartState, dict[str, float]]:
    """The fastest of the start states (the original as written, onnxruntime's graphs of it),
    each timed against the original under the Runner's settings in one interleaved run; ties go
    to the earlier state (the original, then ORT's `all`)."""
    states = start_states(original, runner.settings)
    if progress is not None:
        progress.set_postfix_str(f"timing {len(states)} start states", refresh=True)
    comparison = runner.compare([original, *(state.graph for state in states)])
    speedups = dict(zip((state.name for state in states), comparison.speedups[1:], strict=True))
    best = max(range(len(states)), key=lambda index: comparison.speedups[index + 1])
    return states[best], speedups


def ranking_cost(method: Method, options: SearchOptions) -> str | None:
    """The cost that ranks `method`'s graphs where it matters here (a cost table): `--cost`,
    else, for an agent, the table its training env was rewarded by, for a replay, the table
    that ranked the recorded result (None: neither)."""
    if options.cost or method.recording is not None:
        return options.cost or method.recording.table
    if method.agent is None:
        return options.cost
    from rlflow.worldmodel.policy import load_agent_policy

    cost = str(load_agent_policy(method.agent).env_config.get("cost", ""))
    return cost if cost.startswith("table:") else None


def start_for_cost(
    start: str | StartState, cost: str | None, settings: OrtSettings
) -> str | StartState:
    """`start` for a search ranked by `cost`: from the original where that is a cost table of
    another provider (`CostTable.made_elsewhere`; `best` too, and onnxruntime's graphs, made
    here for this machine's provider, are refused with a one-line error)."""
    table = table_elsewhere(cost, settings)
    if table is None or isinstance(start, StartState):
        return start
    table.check_start(start, settings.resolved().provider)
    return "original"


def recorded_start(
    recording: Recording, start: str | StartState, deploy: Deployment
) -> str | StartState:
    """Where a replay begins: the start state its episode was recorded from. `start` may name
    it (or be `best`, or a state chosen for other methods, as a bench does); naming another is
    an error, as is an online replay of an episode that began from onnxruntime's graph."""
    recorded = recording.start_state
    name = start.name if isinstance(start, StartState) else start
    if name == recorded:
        return start
    if deploy.mode == "online" and recorded != "original":
        raise RlflowError(
            f"replay: {recording.path} began from {recorded}; online, graphs start from the "
            "original (replay it with --deploy offline)"
        )
    if isinstance(start, str) and start != "best":
        raise RlflowError(f"replay: {recording.path} began from {recorded}, not from {start}")
    return recorded


def optimize(
    original: Graph,
    method: Method,
    *,
    label: str = "model",
    settings: OrtSettings | None = None,
    options: SearchOptions | None = None,
    deploy: Deployment | None = None,
    runner: Runner | None = None,
    progress: Progress | None = None,
    peer: bool = True,
    start: str | StartState = "best",
    strict: bool = True,
    interface: Interface | None = None,
) -> OptimizeResult:
    """Optimise `original` with `method` for `deploy` (default offline) and check the result
    (RlflowError if it is not equivalent).

    `settings` are the original's: what a user runs today (default: onnxruntime's defaults,
    level all); speedups are against it. Offline, the method starts from the fastest start
    state (`choose_start`; the original only if `options.portable`), or from `start` when it
    names one (`original`, `ort:all`, ...) or is one already measured (a replay: from the state
    its episode began from); it works on graphs run as written, and the result declares so.
    Online, it starts from the original and everything runs under `settings`. `peer` also times
    the tuning peer (`rlflow.cost.ort_optimizer.tuning_peer`). `runner` times the final graphs
    (default: `rlflow.search.default_runner`). Not `strict`, a result that fails the
    equivalence check is returned with its report (a benchmark records it) instead of raising.
    `interface`, the original's, is restored on the model written (`OptimizeResult.handed`) and
    the check is against the original file; without it, `graph` is checked and written as is.
    """
    started = time.perf_counter()
    settings = (settings or OrtSettings()).resolved()
    options = options or SearchOptions()
    options.validate()
    deploy = deploy or Deployment("offline")
    runner = runner or default_runner(settings)
    reference: Graph | None = original if deploy.mode == "offline" else None
    start_speedups: dict[str, float] = {}
    ranked_by = ranking_cost(method, options)
    elsewhere = table_elsewhere(ranked_by, settings)
    if method.recording is not None:
        start = recorded_start(method.recording, start, deploy)
    start = start_for_cost(start, ranked_by, settings)
    rules = None
    if elsewhere is not None:  # graphs for the table's provider, with the rules it verified
        rules = default_ruleset(options.portable).select(
            names=elsewhere.rules, provider=elsewhere.provider
        )
    if deploy.mode == "online" or options.portable:  # ORT's graphs hold its own operators
        start = StartState("original", original, None)
    elif start == "best":
        start, start_speedups = choose_start(original, runner, progress)
    elif isinstance(start, str):
        start = start_state(original, start, settings)
    run = Run(
        label,
        deploy.settings(settings),
        options,
        runner,
        progress,
        reference,
        search_cost=SEARCH_COSTS[deploy.mode],
        ruleset=rules,
    )
    result = run_method(method, start.graph, run)
    provider = settings.provider
    target = elsewhere.provider if elsewhere is not None else provider
    graph = result.graph.with_metadata(
        deploy.metadata(target, {node.domain for node in result.graph.nodes})
    )
    handed = (
        None
        if interface is None
        else hand_back(original, graph, interface, strict=strict, provider=provider)
    )
    report = (
        handed.report
        if handed is not None
        else check_result(original, graph, strict=strict, provider=provider)
    )
    tuning = None
    if peer:
        if progress is not None:
            progress.set_postfix_str("timing onnxruntime's own knobs (the tuning peer)")
        tuning = tuning_peer(original, runner)
    # onnxruntime's `all` graph here is this provider's: beside a result for another one
    # (a cost table made elsewhere) it would say nothing.
    fusions = {}
    if elsewhere is None:
        ort_all = optimized_graph(original, replace(settings, ort_level="all", disabled=()))
        fusions = fusion_table(ort_all, graph)
    return OptimizeResult(
        method=method,
        original=original,
        result=result,
        report=report,
        wall_s=time.perf_counter() - started,
        settings=settings,
        deploy=deploy,
        graph=graph,
        start=start,
        start_speedups=start_speedups,
        peer=tuning,
        fusions=fusions,
        handed=handed,
    )


__all__ = [
    "DEFAULT_METHOD",
    "SEARCH_METHODS",
    "Method",
    "OptimizeResult",
    "Run",
    "SearchOptions",
    "check_result",
    "choose_start",
    "expansion_total",
    "optimize",
    "ranking_cost",
    "run_method",
    "start_for_cost",
    "write_model",
]

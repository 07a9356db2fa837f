"""`rlflow bench --models ... --methods ... --out REPORT_DIR`: every method on every model.

Methods are search baselines (greedy, taso, random) and trained agents (`agent:RUN_DIR`). Each
runs on each model in each deploy mode (`rlflow.optimize`: offline results run as written and
start from the fastest of onnxruntime's graphs; online ones are optimised again by onnxruntime
at load), its result checked for equivalence and kept under REPORT_DIR/models/; then all
results of a model and mode are timed interleaved with the original under onnxruntime's
defaults, in one Runner.compare: the only comparison that survives a noisy machine, and the
speedup a user deploying the result gets. Beside them, the tuning peer: the best of
onnxruntime's own knobs on the original, timed once per model.
REPORT_DIR gets `results.json` (written after every step: a rerun skips what is done),
`report.md` and PNG plots. Defaults come from `configs/bench.yaml` (`--config`); flags win.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import sys
import time
from pathlib import Path
from typing import Any

from rlflow.commands.common import (
    add_provider_argument,
    check_cost_table,
    check_number,
    check_output_dir,
    chosen_provider,
    cost_type,
    model_label,
    model_path,
    print_json,
)
from rlflow.config import read_yaml
from rlflow.errors import RlflowError
from rlflow.optimize import Method
from rlflow.search import COST_MODELS

DEFAULTS: dict[str, Any] = {
    "models": ["squeezenet-1.1", "resnet-18"],
    "methods": ["greedy", "taso"],
    "deploys": ["offline", "online"],
    "start": "best",
    "peer": True,
    "size": "small",
    "budget": None,
    "cost": None,
    "episodes": 4,
    "top_k": 3,
    "seed": 0,
    "threads": 1,
    "min_time": None,
}
"""The built-in defaults; `configs/bench.yaml` holds the same values (a test keeps them equal)."""
RESULTS_VERSION = 2
"""Part of results.json: bump when its layout changes, so that an old file is not resumed."""


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "bench", help="compare methods on models; write report.md, plots and results.json"
    )
    parser.add_argument(
        "--models",
        "--model",
        dest="models",
        nargs="+",
        metavar="MODEL",
        help="zoo names or .onnx paths",
    )
    parser.add_argument(
        "--methods",
        nargs="+",
        metavar="METHOD",
        help="greedy, taso, random, brkga, regal:RUN_DIR, guided:RUN_DIR, agent:RUN_DIR, "
        "replay:RESULT.json",
    )
    parser.add_argument("--out", required=True, metavar="REPORT_DIR", help="report directory")
    parser.add_argument(
        "--deploys",
        metavar="MODES",
        help="comma-separated deploy modes, offline and/or online (default both)",
    )
    parser.add_argument(
        "--start",
        metavar="STATE",
        help="offline: where every method begins (default best: the fastest measured of the "
        "original and onnxruntime's graphs of it; original: the rules alone)",
    )
    parser.add_argument(
        "--no-peer", action="store_true", help="skip timing onnxruntime's knobs (the peer)"
    )
    parser.add_argument(
        "--size", choices=("small", "medium", "full"), help="zoo model size (default small)"
    )
    parser.add_argument("--budget", type=int, help="search expansions (default: the method's)")
    parser.add_argument(
        "--cost",
        type=cost_type(COST_MODELS),
        metavar="COST",
        help=f"cost model ranking a search's graphs: {', '.join(COST_MODELS)}, table:NAME or "
        "table:PATH (default: perop offline, analytic online; an agent: its env's reward source)",
    )
    parser.add_argument("--episodes", type=int, help="agent rollouts per model (default 4)")
    parser.add_argument("--top-k", type=int, help="best graphs a method times at its end")
    parser.add_argument("--seed", type=int, help="random walks / agent rollouts (default 0)")
    parser.add_argument("--threads", type=int, help="intra-op threads (default 1)")
    add_provider_argument(parser)
    parser.add_argument(
        "--min-time",
        type=float,
        metavar="S",
        help="timed seconds per graph in every measurement (default: adaptive, 1-30 s)",
    )
    parser.add_argument("--config", metavar="FILE", help="YAML defaults (configs/bench.yaml)")
    parser.add_argument(
        "--fresh", action="store_true", help="ignore REPORT_DIR/results.json and start over"
    )
    parser.add_argument(
        "--retime",
        action="store_true",
        help="time each model's results again in a new interleaved run, the cells kept: an "
        "independent timing of the same graphs (earlier timings stay in results.json and the "
        "report; the tuning peer is not timed again)",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object last")
    parser.set_defaults(run=run)


# ---- options ------------------------------------------------------------------------------


def load_config(path: str | os.PathLike | None) -> dict[str, Any]:
    """DEFAULTS updated with a YAML config file's values (RlflowError on unknown keys)."""
    options = dict(DEFAULTS)
    if path is None:
        return options
    data = read_yaml(path)
    unknown = sorted(set(data) - set(DEFAULTS))
    if unknown:
        raise RlflowError(f"config {path}: unknown keys {unknown}; known: {sorted(DEFAULTS)}")
    options.update(data)
    return options


def _split(values: list[str] | str) -> list[str]:
    items = [values] if isinstance(values, str) else list(values)
    return [part.strip() for item in items for part in str(item).split(",") if part.strip()]


def resolve_options(args: argparse.Namespace) -> dict[str, Any]:
    """Config values overridden by the flags given; checked. `methods` become `Method`s."""
    from rlflow.cost import DEPLOY_MODES
    from rlflow.cost.ort_optimizer import check_start_name

    options = load_config(args.config)
    flags = {
        "models": args.models,
        "methods": args.methods,
        "deploys": args.deploys,
        "start": args.start,
        "peer": False if args.no_peer else None,
        "size": args.size,
        "budget": args.budget,
        "cost": args.cost,
        "episodes": args.episodes,
        "top_k": args.top_k,
        "seed": args.seed,
        "threads": args.threads,
        "min_time": args.min_time,
    }
    options.update({key: value for key, value in flags.items() if value is not None})
    for key in ("models", "methods", "deploys"):
        options[key] = list(dict.fromkeys(_split(options[key])))
        if not options[key]:
            raise RlflowError(f"--{key.replace('_', '-')} is empty")
    for mode in options["deploys"]:
        if mode not in DEPLOY_MODES:
            raise RlflowError(f"unknown deploy mode {mode!r}; choose from offline, online")
    if options["start"] != "best":
        check_start_name(str(options["start"]))
    if options["size"] not in ("small", "medium", "full"):
        raise RlflowError(f"size must be small, medium or full, got {options['size']!r}")
    for key, minimum in (("budget", 1), ("episodes", 1), ("top_k", 1), ("threads", 1)):
        check_number(f"--{key.replace('_', '-')}", options[key], minimum)
    check_number("--min-time", options["min_time"], 0.0)
    options["provider"] = chosen_provider(args.provider, "bench")
    check_cost_table(options["cost"], str(options["start"]), options["provider"])
    options["methods"] = [Method.parse(method) for method in options["methods"]]
    labels = [method.label for method in options["methods"]]
    if len(set(labels)) != len(labels):
        raise RlflowError(f"two methods share a name in the report: {labels}")
    for model in options["models"]:
        model_path(model, options["size"])  # fails early on a missing file or unknown name
    return options


def _fingerprint(options: dict[str, Any]) -> dict[str, Any]:
    """What a finished cell depends on besides its (model, method, deploy mode)."""
    keys = ("size", "budget", "cost", "episodes", "top_k", "seed", "threads", "min_time", "start")
    provider = options.get("provider", "cpu")
    on = {} if provider == "cpu" else {"provider": provider}  # CPU results made before resume
    return {"version": RESULTS_VERSION, **{key: options[key] for key in keys}, **on}


def bench_machine(provider: str) -> dict[str, Any]:
    """Where a bench's cells were measured: the device (the CPU, or the GPU beside it), the NCHWc
    block and onnxruntime's version. onnxruntime's `all` graph, a start state, depends on them
    (ResNeXt-50's differed between two of our machines by four grouped Convs left unblocked) and
    so does every timing, so a results.json made elsewhere is not resumed."""
    from rlflow.cost import nchwc_block_size
    from rlflow.cost.device import device_info

    info = device_info(provider)
    keys = ("device", "cpu", "onnxruntime")
    return {**{key: info[key] for key in keys}, "nchwc_block": nchwc_block_size()}


def describe_machine(machine: dict[str, Any]) -> str:
    """One line for a bench_machine() dict."""
    device, cpu = machine.get("device"), machine.get("cpu")
    words = [device or cpu or "unknown CPU"]
    if device and device != cpu:
        words.append(f"beside {cpu}")
    words.append(f"NCHWc block {machine.get('nchwc_block') or 'none'}")
    words.append(f"onnxruntime {machine.get('onnxruntime')}")
    return ", ".join(words)


def command_line(options: dict[str, Any], out: str | os.PathLike) -> str:
    """The `rlflow bench` command that reproduces these options."""
    methods = [str(method) for method in options["methods"]]
    words = ["rlflow", "bench", "--models", *options["models"], "--methods", *methods]
    words += ["--deploys", ",".join(options["deploys"]), "--size", options["size"]]
    for key in ("budget", "cost", "episodes", "top_k", "seed", "threads", "min_time", "start"):
        if options[key] is not None and options[key] != DEFAULTS[key]:
            words += [f"--{key.replace('_', '-')}", str(options[key])]
    if options.get("provider", "cpu") != "cpu":
        words += ["--provider", options["provider"]]
    if not options["peer"]:
        words.append("--no-peer")
    return shlex.join([*words, "--out", str(out)])


# ---- the run ------------------------------------------------------------------------------


class _MethodProgress:
    """Forwards a method's progress (expansions, stage) to the bench bar's postfix."""

    def __init__(self, bar: Any, prefix: str) -> None:
        self.bar, self.prefix, self.count, self.stage = bar, prefix, 0, ""

    def update(self, n: int = 1) -> None:
        self.count += n
        self.bar.set_postfix_str(f"{self.prefix}: {self.count} steps {self.stage}", refresh=False)

    def set_postfix_str(self, s: str = "", refresh: bool = True) -> None:
        self.stage = s
        self.bar.set_postfix_str(f"{self.prefix}: {s}", refresh=refresh)


def _still_valid(cell: dict[str, Any], method: Method, out: Path) -> bool:
    """Whether a recorded cell can stand: same method (an agent's run not trained further since),
    and its model file still there."""
    from rlflow.advantage.spec import run_digest
    from rlflow.report import read_progress, real_env_steps

    if cell.get("method_spec") != str(method):
        return False
    if method.agent is not None:
        if real_env_steps(read_progress(method.agent.run_dir)) != cell.get("env_steps"):
            return False
    if method.regal is not None and _regal_runs(method.regal) != cell.get("regal_runs"):
        return False
    if method.guide is not None and run_digest(method.guide) != cell.get("guide_digest"):
        return False
    if method.recording is not None and method.recording.digest != cell.get("replay_digest"):
        return False
    return not cell["equivalent"] or (out / cell["graph_file"]).is_file()


def _regal_runs(run_dir: Path) -> int | None:
    """The runs a REGAL run has trained: a cell of it is redone once it has trained further."""
    from rlflow.cost.cache import read_json

    return read_json(run_dir / "progress.json").get("runs_done")


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("_")


def run(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from rlflow.cost.cache import read_json

    started = time.perf_counter()
    check_output_dir("--out", args.out)
    options = resolve_options(args)
    out = Path(args.out)
    results_path = out / "results.json"
    state = {} if args.fresh else read_json(results_path)
    if state and state.get("settings") != _fingerprint(options):
        print(
            f"rlflow bench: {results_path} was made with other settings; starting over",
            file=sys.stderr,
        )
        state = {}
    here = bench_machine(options.get("provider", "cpu"))
    if state and state.get("machine", here) != here:  # results made before the key: kept
        print(
            f"rlflow bench: {results_path} was measured on another machine "
            f"({describe_machine(state['machine'])}; here {describe_machine(here)}); "
            "starting over",
            file=sys.stderr,
        )
        state = {}
    state = state or {
        "settings": _fingerprint(options),
        "cells": {},
        "comparisons": {},
        "starts": {},
        "peers": {},
    }
    state["command"] = command_line(options, out)
    state["machine"] = here
    load_before = os.getloadavg()

    models, methods, modes = options["models"], options["methods"], options["deploys"]
    total = len(models) * (len(modes) * (len(methods) + 1) + int(bool(options["peer"])))
    with tqdm(total=total, desc="bench", unit="cell", file=sys.stderr, mininterval=0.5) as bar:
        for model in models:
            bench_model(model, options, state, out, bar, retime=args.retime)
    rows = result_rows(state, options)
    outputs = write_report(rows, options, state, out, load_before, time.perf_counter() - started)
    summary = {
        "out": str(out),
        "report": str(outputs[0]),
        "plots": [str(path) for path in outputs[1:]],
        "results": str(results_path),
        "rows": rows,
    }
    if args.json:
        print_json(summary)
    else:
        print_rows(rows)
        print(f"wrote {outputs[0]}, {len(outputs) - 1} plots and {results_path}")
    return 0


def bench_model(
    model: str,
    options: dict[str, Any],
    state: dict[str, Any],
    out: Path,
    bar: Any,
    retime: bool = False,
) -> None:
    """Every method on one model in every deploy mode, then one comparison per mode, then the
    tuning peer; each finished step is saved to results.json at once, and skipped if it is
    there already (a comparison of the same graphs too, unless `retime`). A comparison that is
    redone keeps the one it replaces under "earlier": on this machine a ratio is only believed
    once a second run says the same, so no timing is thrown away."""
    from rlflow.advantage.spec import run_digest
    from rlflow.cost import Deployment, OrtSettings
    from rlflow.cost.ort_optimizer import start_state, tuning_peer
    from rlflow.fileio import write_json_atomic
    from rlflow.graph import load_model, load_with_interface
    from rlflow.optimize import (
        SearchOptions,
        choose_start,
        optimize,
        ranking_cost,
        start_for_cost,
    )
    from rlflow.report import read_progress, real_env_steps
    from rlflow.search import default_runner

    size = options["size"]
    label = model_label(model, size)
    settings = OrtSettings(
        threads=options["threads"], provider=options.get("provider", "auto")
    ).resolved()
    runner = default_runner(settings, options["min_time"])
    search_options = SearchOptions(
        budget=options["budget"],
        cost=options["cost"],
        seed=options["seed"],
        top_k=options["top_k"],
        episodes=options["episodes"],
        size=size,
    )
    loaded: list[Any] = []  # (graph, interface), loaded on first need

    def original() -> Any:
        if not loaded:
            loaded.append(load_with_interface(model_path(model, size)))
        return loaded[0][0]

    def save() -> None:
        write_json_atomic(out / "results.json", state)

    for mode in options["deploys"]:
        deploy = Deployment(mode)
        start: Any = options["start"]
        for method in options["methods"]:
            key = f"{label}|{method.label}|{mode}"
            cell = state["cells"].get(key)
            if cell is not None and _still_valid(cell, method, out):
                bar.update(1)
                continue
            bar.set_description(f"{label} {method.label} {mode}")
            if mode == "offline" and isinstance(start, str):
                # One start state for every method of the model, measured once.
                ranked_by = [ranking_cost(m, search_options) for m in options["methods"]]
                start = start_for_cost(start, next(filter(None, ranked_by), None), settings)
                if start == "best":
                    start, speedups = choose_start(original(), runner)
                    state["starts"][f"{label}|{mode}"] = speedups
                else:
                    start = start_state(original(), start, settings)
            graph, interface = original(), loaded[0][1]
            result = optimize(
                graph,
                method,
                label=label,
                settings=settings,
                options=search_options,
                deploy=deploy,
                runner=runner,
                progress=_MethodProgress(bar, method.label),
                peer=False,
                start=start,
                strict=False,
                interface=interface,
            )
            graph_file = None
            if result.report.equivalent:
                graph_file = f"models/{_slug(label)}.{_slug(method.label)}.{mode}.onnx"
                result.write(out / graph_file)
            env_steps = None
            if method.agent is not None:
                env_steps = real_env_steps(read_progress(method.agent.run_dir))
            search = result.result
            state["cells"][key] = {
                "model": label,
                "method": method.label,
                "method_spec": str(method),
                "deploy": mode,
                "start_state": result.start.name,
                "threads": search.threads,
                "provider": search.provider,
                "equivalent": result.report.equivalent,
                "max_abs_err": result.report.max_abs_err,
                "max_rel_err": result.report.max_rel_err,
                "equivalence_note": result.report.reason,
                "graph_file": graph_file,
                "graph_hash": result.graph.canonical_hash(),
                "wall_s": result.wall_s,
                "search_s": search.search_s,
                "measure_s": search.measure_s,
                "steps": len(search.actions),
                "expansions": search.expansions,
                "evaluated": search.evaluated,
                "env_steps": env_steps,
                "regal_runs": _regal_runs(method.regal) if method.regal is not None else None,
                "guide_digest": run_digest(method.guide) if method.guide is not None else None,
                "replay_digest": method.recording.digest if method.recording else None,
                "rules_applied": search.rules_applied,
                "fusions": result.fusions,
                "cost_model": search.cost_model,
                "method_speedup": search.speedup,
                "episode": search.state.to_json(),
            }
            save()
            bar.update(1)

        # One interleaved run: the original under ORT's defaults and every distinct result.
        cells = [state["cells"][f"{label}|{m.label}|{mode}"] for m in options["methods"]]
        members = {cell["method"]: cell["graph_hash"] for cell in cells if cell["equivalent"]}
        comparison_key = f"{label}|{mode}"
        before = state["comparisons"].get(comparison_key)
        if before is not None and before["members"] == members and not retime:
            bar.update(1)
            continue
        bar.set_description(f"{label} {mode}: timing")
        bar.set_postfix_str(f"{len(set(members.values())) + 1} graphs interleaved", refresh=True)
        graphs, hashes = [original()], ["original"]
        for cell in cells:
            if cell["equivalent"] and cell["graph_hash"] not in hashes:
                graphs.append(load_model(out / cell["graph_file"]))
                hashes.append(cell["graph_hash"])
        comparison = runner.compare(graphs, use_cache=False)
        measured = list(zip(hashes, comparison.measurements, strict=True))
        state["comparisons"][comparison_key] = {
            "model": label,
            "deploy": mode,
            "members": members,
            # On the original's footing (Comparison.scaled_ms): original's ms / speedup.
            "ms": dict(zip(hashes, comparison.scaled_ms, strict=True)),
            "median_ms": {h: m.median_ms for h, m in measured},
            "ort_levels": {h: m.ort_level for h, m in measured},
            "runs": {h: m.runs for h, m in measured},
            "speedup": dict(zip(hashes, comparison.speedups, strict=True)),
            "loadavg": list(os.getloadavg()),
            "earlier": [*before.pop("earlier", []), before] if before is not None else [],
        }
        save()
        bar.update(1)

    if options["peer"] and label not in state["peers"]:
        bar.set_description(f"{label}: onnxruntime's knobs (the tuning peer)")
        peer = tuning_peer(original(), runner)
        state["peers"][label] = {
            "knob": peer.knob,
            "speedup": peer.speedup,
            "speedups": peer.speedups,
            "selected": peer.selected,
            "loadavg": list(os.getloadavg()),
        }
        save()
        bar.update(1)
    elif options["peer"]:
        bar.update(1)


def result_rows(state: dict[str, Any], options: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per (model, method, deploy mode) of this run's options (`ROW_FIELDS`)."""
    rows = []
    for mode in options["deploys"]:
        for model in options["models"]:
            label = model_label(model, options["size"])
            comparison = state["comparisons"].get(f"{label}|{mode}", {})
            peer = state.get("peers", {}).get(label, {})
            for method in options["methods"]:
                cell = dict(state["cells"][f"{label}|{method.label}|{mode}"])
                graph_hash = cell["graph_hash"]
                measured = cell["equivalent"] and graph_hash in comparison.get("speedup", {})
                times = comparison.get("ms", {})
                earlier = [c["speedup"] for c in comparison.get("earlier", [])]
                cell.update(
                    speedup=comparison["speedup"][graph_hash] if measured else None,
                    earlier_speedups=[s[graph_hash] for s in earlier if graph_hash in s],
                    original_ms=times.get("original"),
                    optimized_ms=times[graph_hash] if measured else None,
                    peer_speedup=peer.get("speedup"),
                    peer_knob=peer.get("knob"),
                )
                cell.pop("episode", None)
                rows.append(cell)
    return rows


def write_report(
    rows: list[dict[str, Any]],
    options: dict[str, Any],
    state: dict[str, Any],
    out: Path,
    load_before: tuple[float, float, float],
    wall_s: float,
) -> list[Path]:
    """report.md and its plots; returns [report path, plot paths...]."""
    from rlflow.fileio import write_text_atomic
    from rlflow.report import (
        EfficiencyPanel,
        plot_learning_curves,
        plot_speedup_bars,
        plot_speedup_vs_env_steps,
        plot_wall_time,
        read_progress,
        read_scalars,
        render_report,
        speedup_by_env_steps,
    )

    # The tuning peer drawn as one more method, so each model's bars show it beside the others.
    peers = {
        (row["model"], row["deploy"]): row["peer_speedup"]
        for row in rows
        if row.get("peer_speedup") is not None
    }
    peer_rows = [
        {"model": model, "deploy": mode, "method": "tuning peer", "speedup": speedup}
        for (model, mode), speedup in peers.items()
    ]
    plots: list[tuple[str, Path | None]] = [
        (
            "Speedup per model and method, beside the tuning peer (onnxruntime's best knob)",
            plot_speedup_bars([*rows, *peer_rows], out / "speedup.png"),
        ),
        ("Optimisation wall time", plot_wall_time(rows, out / "wall_time.png")),
    ]
    agents = {m.label: m.agent.run_dir for m in options["methods"] if m.agent is not None}
    if agents:
        curves = {name: read_scalars(run_dir) for name, run_dir in agents.items()}
        plots.append(
            ("Learning curves of the agents (TensorBoard scalars)",
             plot_learning_curves(curves, out / "learning_curves.png"))
        )  # fmt: skip
        progress = {name: read_progress(run_dir) for name, run_dir in agents.items()}
        for mode in options["deploys"]:
            panels: dict[str, EfficiencyPanel] = {}
            for model in options["models"]:
                label = model_label(model, options["size"])
                panel = panels.setdefault(label, EfficiencyPanel())
                for row in rows:
                    if (row["model"], row["deploy"]) != (label, mode):
                        continue
                    if row["speedup"] is None:
                        continue
                    if row["method"] in agents:
                        if row["env_steps"] is not None:
                            panel.finals[row["method"]] = (row["env_steps"], row["speedup"])
                        model_names = {model, label, str(Path(model).name)}
                        episodes = progress[row["method"]].get("episodes", [])
                        on_model = [e for e in episodes if e.get("model") in model_names]
                        log = {"episodes": on_model or episodes}
                        panel.training[row["method"]] = speedup_by_env_steps(log)
                    else:
                        panel.baselines[row["method"]] = row["speedup"]
            plots.append(
                (f"Speedup against real env steps (deploy {mode})",
                 plot_speedup_vs_env_steps(
                     panels, out / f"speedup_vs_env_steps_{mode}.png", title=mode))
            )  # fmt: skip
    drawn = [(caption, path) for caption, path in plots if path is not None]
    loads = [c["loadavg"][0] for c in state["comparisons"].values() if "loadavg" in c]
    provider = next((row["provider"] for row in rows if row.get("provider")), "cpu")
    preamble = [
        f"`{state['command']}`",
        "",
        f"{time.strftime('%Y-%m-%d %H:%M')}; {describe_machine(state['machine'])}, "
        f"provider {provider}, "
        f"{options['threads']} intra-op thread(s); {os.cpu_count()} CPUs, 1-min load average "
        f"{load_before[0]:.2f} at the start"
        + (f", {min(loads):.2f}-{max(loads):.2f} during the comparisons" if loads else "")
        + f"; this run {wall_s:.0f} s (cells done by an earlier run are not redone).",
        "",
        "Speedups are the deployable ones: each result under the settings it declares against "
        "the original under onnxruntime's defaults (level all), all results of a model and "
        "deploy mode timed interleaved in one run; the tuning peer (onnxruntime's best knob on "
        "the original) in one run per model. Absolute times from different runs are not "
        "comparable on a shared machine.",
    ]
    text = render_report(
        rows,
        title="rlflow bench",
        preamble=preamble,
        plots=[(caption, path.name) for caption, path in drawn],
    )
    report = write_text_atomic(out / "report.md", text)
    return [report, *(path for _, path in drawn)]


def print_rows(rows: list[dict[str, Any]]) -> None:
    """A short text table: model, method, deploy mode, speedup, the peer's, wall time. The
    name columns widen to their longest entry (an agent's run directory can be long)."""
    model_w = max([24, *(len(row["model"]) + 2 for row in rows)])
    method_w = max([20, *(len(row["method"]) + 2 for row in rows)])
    print(
        f"{'model':<{model_w}}{'method':<{method_w}}{'deploy':<10}{'speedup':>10}{'peer':>10}"
        f"{'wall s':>9}"
    )
    for row in rows:
        if not row["equivalent"]:
            speedup = "not equiv"
        elif row["speedup"] is None:
            speedup = "—"
        else:
            speedup = f"{row['speedup']:.3f}x"
        peer = "—" if row.get("peer_speedup") is None else f"{row['peer_speedup']:.3f}x"
        print(
            f"{row['model']:<{model_w}}{row['method']:<{method_w}}{row['deploy']:<10}"
            f"{speedup:>10}{peer:>10}{row['wall_s']:>9.1f}"
        )

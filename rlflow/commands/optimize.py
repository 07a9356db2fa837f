"""`rlflow optimize MODEL -o OUT [--method NAME | --agent RUN_DIR]`: make a model faster.

Runs a search baseline (default: taso) or a trained agent (a PPO run or a world-model
controller run) on the model through `rlflow.optimize`, which times the best graphs found
against the original in one interleaved run and checks the chosen graph for equivalence;
only then is OUT written. `rlflow search` is the same command with a required --method: both
share `add_method_arguments` and `optimize_to_file`.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping
from typing import Any

from rlflow.commands.common import (
    add_model_arguments,
    check_number,
    check_output_file,
    cost_type,
)
from rlflow.cost.deploy import DEPLOY_MODES
from rlflow.errors import RlflowError
from rlflow.optimize import DEFAULT_METHOD, SEARCH_METHODS, Method, SearchOptions
from rlflow.search import COST_MODELS

SEEDED = ("random", "brkga", "regal", "guided")
"""The search methods that --seed seeds."""
SAME_WITHIN = 0.02
"""Speedups this close (relative) are reported as the same: the Runner times each ratio until
its 95% interval is within 2%."""


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "optimize", help="optimise a model (search or trained agent), verified, to OUT"
    )
    add_model_arguments(parser)
    how = parser.add_mutually_exclusive_group()
    how.add_argument(
        "--method",
        metavar="METHOD",
        help=f"search: {', '.join(SEARCH_METHODS)}, regal:RUN_DIR or guided:RUN_DIR "
        f"(default {DEFAULT_METHOD}); replay:RESULT.json re-applies a result recorded by "
        "--json (elsewhere, say) and times it here",
    )
    how.add_argument(
        "--agent", metavar="RUN_DIR", help="a trained run: train-ppo or train-controller RUN_DIR"
    )
    add_method_arguments(parser)
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    if args.agent is not None:
        text, chosen = f"agent:{args.agent}", f"agent {args.agent}"
    elif args.method is not None:
        text, chosen = args.method, f"method {args.method}"
    else:
        text, chosen = DEFAULT_METHOD, f"method {DEFAULT_METHOD} (the default)"
    default = args.agent is None and args.method is None
    return optimize_to_file(args, text, chosen=chosen, extra={"chosen_by_default": default})


def add_method_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of `rlflow search` and `rlflow optimize` after MODEL and the method: how
    the method runs, how its result is measured, and where it goes."""
    from rlflow.commands.measure import add_ort_arguments

    parser.add_argument(
        "--budget",
        type=int,
        help="search expansions (default: greedy to its local minimum, taso 1000, random 300; "
        "brkga and regal: 300 chromosome evaluations)",
    )
    parser.add_argument(
        "--cost",
        type=cost_type(COST_MODELS),
        metavar="COST",
        help=f"cost model ranking the graphs found: {', '.join(COST_MODELS)}, table:NAME (a "
        "table shipped with rlflow, `rlflow costs list`) or table:PATH (`rlflow costs collect`) "
        "(default for a search: perop offline, where each operator runs as written, analytic "
        "online; an agent: its env's reward source; e2e: small budgets only)",
    )
    parser.add_argument(
        "--alpha",
        type=float,
        default=1.05,
        help="taso: keep graphs under alpha x best cost (at least 1; default 1.05)",
    )
    parser.add_argument(
        "--exploration",
        type=float,
        default=0.1,
        help="guided: the chance that an expansion takes a random frontier candidate instead "
        "of the best predicted (0 to 1; default 0.1)",
    )
    parser.add_argument(
        "--portable", action="store_true", help="search: only rules that emit standard ONNX ops"
    )
    parser.add_argument(
        "--episodes", type=int, default=4, help="agent: rollouts on the model (default 4)"
    )
    parser.add_argument(
        "--seed", type=int, default=0, help="random walks, brkga, regal / agent rollouts"
    )
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
    parser.add_argument(
        "--fold-initializer-inputs",
        action="store_true",
        help="weights that the model lists among its inputs (older exports; a caller may "
        "override them) become constants that rewrites may fold, and OUT no longer takes them "
        "as inputs (default: they stay inputs of OUT, with their values as defaults)",
    )
    parser.add_argument(
        "--deploy",
        choices=DEPLOY_MODES,
        default="offline",
        help="offline (default): OUT runs as written, onnxruntime's optimiser off, declared in "
        "its ort_config; online: onnxruntime optimises OUT again when it loads it",
    )
    parser.add_argument(
        "--start",
        default="best",
        metavar="STATE",
        help="offline: where the method begins: best (default: the fastest measured of the "
        "original and onnxruntime's graphs of it), original, ort:all, ort:extended, "
        "ort:all-PASS (that pass of onnxruntime's switched off)",
    )
    parser.add_argument(
        "--no-peer",
        action="store_true",
        help="skip timing onnxruntime's own knobs on the original (the tuning peer)",
    )
    parser.add_argument("-o", "--output", required=True, metavar="OUT", help="optimised .onnx")
    parser.add_argument("--json", action="store_true", help="print one JSON object last")


def optimize_to_file(
    args: argparse.Namespace,
    method_text: str,
    *,
    chosen: str | None = None,
    extra: Mapping[str, Any] | None = None,
) -> int:
    """Run the method on args.model with `add_method_arguments`' options, check the result,
    write it to args.output and print its summary (JSON with --json); the commands' `run`.
    `chosen` (how the method was chosen) is announced on stderr once the model has loaded."""
    from tqdm import tqdm

    from rlflow.commands.common import (
        check_cost_table,
        chosen_provider,
        model_label,
        model_path,
        parse_input_shapes,
        print_json,
    )
    from rlflow.cost import Deployment, OrtSettings
    from rlflow.optimize import expansion_total, optimize
    from rlflow.search import default_runner

    check_output_file("-o", args.output)
    check_number("--alpha", args.alpha, 1.0)
    check_number("--exploration", args.exploration, 0.0)
    if args.exploration > 1.0:
        raise RlflowError(f"--exploration must be at most 1, got {args.exploration}")
    check_number("--min-time", args.min_time, 0.0)
    check_number("--threads", args.threads, 1)
    check_cost_table(args.cost, args.start, args.provider)
    options = SearchOptions(
        budget=args.budget,
        cost=args.cost,
        alpha=args.alpha,
        exploration=args.exploration,
        seed=args.seed,
        top_k=args.top_k,
        portable=args.portable,
        episodes=args.episodes,
        size=args.size,
    )
    options.validate()
    method = Method.parse(method_text)  # a bad agent run fails before the model is loaded
    if method.is_agent and (args.budget is not None or args.portable):
        raise RlflowError("--budget and --portable are for searches; an agent runs --episodes")
    if method.recording is not None and (args.budget is not None or args.portable):
        raise RlflowError("--budget and --portable are for searches; a replay re-applies its steps")
    from rlflow.graph import load_with_interface

    original, interface = load_with_interface(
        model_path(args.model, args.size),
        parse_input_shapes(args.input_shape),
        fold_initializer_inputs=args.fold_initializer_inputs,
    )
    label = model_label(args.model, args.size)
    settings = OrtSettings(
        threads=args.threads,
        ort_level=args.ort_level,
        provider=chosen_provider(args.provider, args.command),
    ).resolved()
    if chosen is not None:
        print(f"rlflow optimize: {label} with {chosen}", file=sys.stderr)
    total = expansion_total(method, args.budget)
    with tqdm(
        total=total,
        desc=f"{method.label} {label}",
        unit="step" if method.is_agent or method.recording else "exp",
        file=sys.stderr,
        mininterval=0.5,
    ) as bar:
        result = optimize(
            original,
            method,
            label=label,
            settings=settings,
            options=options,
            deploy=Deployment(args.deploy),
            runner=default_runner(settings, args.min_time),
            progress=bar,
            peer=not args.no_peer,
            start=args.start,
            interface=interface,
        )
    result.write(args.output)
    if result.result.cost_details is not None:
        print(table_line(result.result.cost_details), file=sys.stderr)
    summary = result.summary(
        output=str(args.output),
        budget=total,
        alpha=args.alpha if method.name in ("taso", "guided") else None,
        exploration=args.exploration if method.name == "guided" else None,
        seed=args.seed if method.name in SEEDED or method.is_agent else None,
        portable=None if method.is_agent else args.portable,
        episodes=args.episodes if method.is_agent else None,
        min_time_s=args.min_time,
        **(extra or {}),
    )
    if args.json:
        print_json(summary)
    else:
        print_summary(summary)
    return 0


def table_line(details: Mapping[str, Any]) -> str:
    """One line on a cost table's use: where it was measured, and how much of the cost of the
    graphs ranked came from operators it lacks (estimated by its fitted roofline)."""
    roofline = details["roofline"]
    peaks = ", ".join(
        text
        for text in (
            f"{roofline['gflops']:.4g} GFLOP/s" if roofline["gflops"] else "",
            f"{roofline['gbps']:.4g} GB/s" if roofline["gbps"] else "",
        )
        if text
    )
    missed = ", ".join(f"{op} x{count}" for op, count in list(details["missed_ops"].items())[:5])
    return (
        f"cost table {details['table']} ({details['provider']} on {details['device']}, "
        f"{details['entries']} operators): {100 * details['miss_share']:.1f}% of the cost of "
        f"{details['graphs_costed']} graphs came from operators missing in it"
        + (f" ({missed})" if missed else "")
        + f", estimated by its fitted roofline (launch {1e3 * roofline['launch_ms']:.3g} us"
        + (f", {peaks}" if peaks else "")
        + ")"
    )


def _how_measured(summary: Mapping[str, Any]) -> str:
    finalists = len(summary["finalists"])
    start = summary["start_state"]
    target = (summary["target"] or {}).get("provider", summary["provider"])
    if target != summary["provider"]:
        return (
            f"measured here on {summary['provider']}; the result is for {target}, chosen by "
            f"{summary['cost_model']}: cost {summary['original_cost']:.4g} -> "
            f"{summary['optimized_cost']:.4g} ms there"
        )
    if summary["confirmed"] is None:
        return f"the start graph ({start}) was fastest of {finalists} timed interleaved in one run"
    if summary["confirmed"]:
        return f"fastest of {finalists} graphs, confirmed in a second interleaved run"
    return f"the fastest of {finalists} graphs was not faster in a second run: {start} kept"


def print_summary(summary: Mapping[str, Any]) -> None:
    """The human form of `OptimizeResult.summary`: before/after, speedup, rules, wall time."""
    out = summary.get("output") or "the result"
    print(f"{'':<14}{'original':>12}{'optimized':>12}")
    print(f"{'latency ms':<14}{summary['original_ms']:>12.3f}{summary['optimized_ms']:>12.3f}")
    print(f"{'nodes':<14}{summary['original_nodes']:>12}{summary['optimized_nodes']:>12}")
    cost_label = f"cost ({summary['cost_model']})"
    print(f"{cost_label:<14}{summary['original_cost']:>12.4g}{summary['optimized_cost']:>12.4g}")
    print(f"speedup {summary['speedup']:.3f}x ({_how_measured(summary)})")
    if summary["peer_speedup"] is not None:
        ratio = summary["speedup"] / summary["peer_speedup"]
        verdict = (
            "rlflow is level with it"
            if abs(ratio - 1.0) <= SAME_WITHIN
            else "rlflow beats it"
            if ratio > 1.0
            else "rlflow does not beat it"
        )
        selected = summary.get("peer_selected")
        confirmation = (
            ""
            if selected is None
            else f" (the best of the first run, {selected:.3f}x, not confirmed in a second)"
            if summary["peer_knob"] == "all"
            else f" (confirmed in a second run; the first said {selected:.3f}x)"
        )
        print(
            f"tuning peer: onnxruntime's best knob on the original, {summary['peer_knob']}, "
            f"{summary['peer_speedup']:.3f}x{confirmation}: {verdict}"
        )
    changed = {op: row for op, row in summary["fusions"].items() if row["dropped"] or row["added"]}
    if summary["fusions"]:
        counts = ", ".join(f"{op} {row['ort']}->{row['rlflow']}" for op, row in changed.items())
        print(f"onnxruntime's fusions (its `all` graph -> the result): {counts or 'all kept'}")
    if summary["rules_applied"]:
        rules = ", ".join(f"{name} x{count}" for name, count in summary["rules_applied"].items())
        print(f"rules applied ({summary['steps']} steps): {rules}")
    else:
        print("rules applied: none (no rewritten graph measured faster than the start graph)")
    if summary.get("chosen_by_default"):
        print(f"method: {summary['method']} (the default; choose with --method or --agent)")
    if summary["method"].startswith("agent:"):
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
    if summary["deploy"] == "offline":
        target = summary["target"] or {}
        block = f", NCHWc block {target['nchwc_block']}" if target.get("nchwc_block") else ""
        print(
            f"deploy offline: {out} runs as written (ort_config: optimiser off), tuned for "
            f"{target.get('provider', summary['provider'])}{block}; started from "
            f"{summary['start_state']}"
        )
    else:
        print(f"deploy online: onnxruntime optimises {out} again when it loads it (level all)")
    print(
        f"settings: {summary['threads']} thread(s), ort-level {summary['ort_level']} for the "
        f"original, provider {summary['provider']}"
    )
    print(f"equivalent: yes, max abs error {summary['max_abs_err']:.2e} ({summary['check']})")
    print(f"inputs drawn: {_inputs_drawn(summary['inputs_drawn'])}")
    for line in _interface_lines(summary["interface"], out):
        print(line)
    if summary.get("output"):
        print(f"wrote {summary['output']}")


def _inputs_drawn(drawn: Mapping[str, Mapping[str, Any]]) -> str:
    """One line: how the equivalence check drew each input."""
    parts = []
    for name, how in drawn.items():
        if "normal_scales" in how:
            scales = ", ".join(f"{scale:g}" for scale in how["normal_scales"])
            parts.append(f"{name} {how['dtype']} normal x {scales}")
        elif "value" in how:
            parts.append(f"{name} {how['dtype']} = {how['value']} ({how['from']})")
        elif "low" in how:
            parts.append(f"{name} {how['dtype']} in [{how['low']}, {how['high']}) ({how['from']})")
        else:
            parts.append(f"{name} {how['dtype']} {how['values']}")
    return "; ".join(parts) or "none (the model takes no inputs)"


def _interface_lines(interface: Mapping[str, Any] | None, out: str) -> list[str]:
    """What the model written (`out`) keeps of the original's interface: weights listed as
    inputs, dynamic dims."""
    if interface is None:
        return []
    lines = []
    if interface["initializer_inputs"]:
        names = ", ".join(interface["initializer_inputs"])
        lines.append(
            f"weights listed as inputs stay inputs of {out}, their values the defaults: {names} "
            "(--fold-initializer-inputs makes them constants)"
        )
    if interface["folded_initializer_inputs"]:
        names = ", ".join(interface["folded_initializer_inputs"])
        lines.append(
            f"weights listed as inputs folded into constants: {names}; {out} does not take them"
        )
    dims = interface["dynamic_dims"]
    general = {symbol: dim for symbol, dim in dims.items() if dim["general"]}
    if general:
        checks = "; ".join(
            f"{symbol}={', '.join(map(str, dim['checked']))}" for symbol, dim in general.items()
        )
        lines.append(f"dynamic dims kept: {', '.join(general)} (equal to the original at {checks})")
    for symbol, size in interface["specialised"].items():
        lines.append(
            f"SPECIALISED: {out} fixes dim {symbol} at {size}, the size it was given: "
            f"{dims[symbol]['reason']}"
        )
    return lines

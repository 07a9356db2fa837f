"""`rlflow measure MODEL [--vs OTHER]`: real end-to-end latency in onnxruntime.

With --vs, both models are timed in one interleaved run (the only comparison that survives
a noisy machine) and, when their inputs and outputs match, checked for equivalence.
"""

from __future__ import annotations

import argparse

from rlflow.commands.common import (
    add_model_arguments,
    add_provider_argument,
    check_number,
    chosen_provider,
    model_label,
    print_json,
    resolve_model,
)
from rlflow.cost import ORT_LEVELS, OrtSettings, Runner, check_equivalence
from rlflow.errors import RlflowError


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("measure", help="measure latency (and compare with --vs)")
    add_model_arguments(parser)
    parser.add_argument("--vs", metavar="OTHER", help="a second model, timed interleaved")
    add_ort_arguments(parser)
    parser.add_argument("--runs", type=int, default=30, help="timed runs per model (minimum)")
    parser.add_argument("--json", action="store_true", help="print one JSON object last")
    parser.set_defaults(run=run)


def add_ort_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--threads", type=int, default=1, help="intra-op threads (default 1)")
    parser.add_argument(
        "--ort-level",
        choices=tuple(ORT_LEVELS),
        default="all",
        help="onnxruntime's own graph optimisation level for a model that declares none in its "
        "ort_config (default all: onnxruntime's default)",
    )
    add_provider_argument(parser)


def run(args: argparse.Namespace) -> int:
    check_number("--runs", args.runs, 1)
    check_number("--threads", args.threads, 1)
    provider = chosen_provider(args.provider, "measure")
    settings = OrtSettings(threads=args.threads, ort_level=args.ort_level, provider=provider)
    runner = Runner(settings, runs=args.runs)
    models = [resolve_model(args.model, args.size, args.input_shape)]
    labels = [model_label(args.model, args.size)]
    if args.vs:
        models.append(resolve_model(args.vs, args.size, args.input_shape))
        labels.append(model_label(args.vs, args.size))
        difference = input_difference(models[0], models[1])
        if difference:
            raise RlflowError(
                f"--vs {args.vs} does not take the same inputs as {args.model} ({difference}); "
                "both are fed the same arrays"
            )
    comparison = runner.compare(models)
    result = {
        "model": labels[0],
        "min_ms": comparison.measurements[0].min_ms,
        "low_ms": comparison.measurements[0].low_ms,
        "median_ms": comparison.measurements[0].median_ms,
        "runs": comparison.measurements[0].runs,
        "threads": settings.threads,
        "ort_level": comparison.measurements[0].ort_level,
        "provider": settings.provider,
        "provider_options": settings.provider_options(),
    }
    if args.vs:
        other = comparison.measurements[1]
        report = check_equivalence(models[0], models[1], provider=settings.provider)
        result.update(
            vs=labels[1],
            vs_min_ms=other.min_ms,
            vs_low_ms=other.low_ms,
            vs_median_ms=other.median_ms,
            vs_ort_level=other.ort_level,
            ratio=comparison.ratios[1],
            speedup=comparison.speedups[1],
            low_ratio=comparison.low_ratios[1],
            equivalent=report.equivalent,
            max_abs_err=report.max_abs_err,
            equivalence_note=report.reason,
        )
    if args.json:
        print_json(result)
    else:
        print_table(result, comparison, labels)
    return 0


def input_difference(first, second) -> str | None:
    """How two graphs' inputs differ (names, then types and shapes), or None if they agree."""
    from rlflow.commands.inspect import describe_value

    ours = {value.name: value for value in first.inputs}
    theirs = {value.name: value for value in second.inputs}
    if ours.keys() != theirs.keys():
        return f"inputs {', '.join(sorted(ours))} against {', '.join(sorted(theirs))}"
    for name, value in ours.items():
        other = theirs[name]
        if (value.dtype, value.shape) != (other.dtype, other.shape):
            return f"{name}: {describe_value(value)} against {describe_value(other)}"
    return None


def print_table(result: dict, comparison, labels: list[str]) -> None:
    width = max(len(label) for label in labels)
    print(f"{'model':<{width}}  {'min ms':>10}  {'median ms':>10}  {'runs':>6}")
    for label, measurement in zip(labels, comparison.measurements):
        print(
            f"{label:<{width}}  {measurement.min_ms:>10.3f}  {measurement.median_ms:>10.3f}  "
            f"{measurement.runs:>6}"
        )
    if "vs" in result:
        print(
            f"ratio {result['vs']} / {result['model']} (median of per-pair ratios): "
            f"{result['ratio']:.3f}  -> speedup {result['speedup']:.3f}x"
            f"  (ratio of 3rd-smallest runs {result['low_ratio']:.3f})"
        )
        verdict = "yes" if result["equivalent"] else "no"
        note = "" if result["equivalent"] else f" ({result['equivalence_note']})"
        print(f"equivalent: {verdict}, max abs error {result['max_abs_err']:.2e}{note}")
    levels = result["ort_level"] + (f" / {result['vs_ort_level']}" if "vs" in result else "")
    print(
        f"settings: {result['threads']} thread(s), ort-level {levels} (a model's own ort_config "
        f"wins), provider {result['provider']}, interleaved in one run"
    )

"""`rlflow rules list | verify | generate | candidates MODEL`: the verified rule library."""

from __future__ import annotations

import argparse
import sys
import time

from rlflow.commands.common import (
    add_model_arguments,
    check_number,
    check_output_file,
    model_label,
    print_json,
    resolve_model,
)


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("rules", help="the rewrite rules: list, verify, generate")
    actions = parser.add_subparsers(dest="rules_action", required=True, metavar="ACTION")

    listing = actions.add_parser("list", help="every rule: equation, origin, verification status")
    listing.add_argument("--portable", action="store_true", help="only plain-ONNX rules")
    listing.add_argument("--json", action="store_true", help="print one JSON object last")

    verify = actions.add_parser("verify", help="verify every rule on random inputs (cached)")
    verify.add_argument("--refresh", action="store_true", help="ignore cached verdicts")
    verify.add_argument("--json", action="store_true", help="print one JSON object last")

    generate = actions.add_parser(
        "generate",
        help="regenerate the generated rules (minutes)",
        description="Enumerate small graphs, keep equal pairs as verified rewrite rules.",
    )
    generate.add_argument(
        "-o", "--output", help="rule file to write (default: the shipped rules/generated.json)"
    )
    generate.add_argument(
        "--max-ops", type=int, default=3, help="ops per graph (default 3; 4 takes hours)"
    )
    generate.add_argument(
        "--ops", type=_names, help="comma-separated op types to enumerate (default: TASO's core)"
    )
    generate.add_argument("--inputs", type=int, default=4, help="input tensors per rank")
    generate.add_argument(
        "--ranks", type=_ranks, default=(2, 4), help="tensor ranks: 2 (matmul), 4 (conv)"
    )
    generate.add_argument("--json", action="store_true", help="print one JSON summary last")

    candidates = actions.add_parser("candidates", help="the candidate rewrites of a model")
    add_model_arguments(candidates)
    candidates.add_argument("--portable", action="store_true", help="only plain-ONNX rules")
    candidates.add_argument("--json", action="store_true", help="print one JSON object last")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    if args.rules_action == "generate":
        return _generate(args)
    if args.rules_action == "list":
        return _list(args)
    if args.rules_action == "verify":
        return _verify(args)
    return _candidates(args)


def _list(args: argparse.Namespace) -> int:
    """One line a rule, `name: source => target` after its status, as egg lists rewrites."""
    from rlflow.rewrite import list_rules
    from rlflow.rewrite.rules import all_rules

    rules = [rule for rule in all_rules() if rule.portable or not args.portable]
    records = [
        {**record, "equation": rule.equation}
        for rule, record in zip(rules, list_rules(rules), strict=True)
    ]
    if args.json:
        print_json({"rules": records, "count": len(records)})
        return 0
    print(f"{'origin':<9} {'portable':<8} {'verified':<8} rule: source => target")
    for record in records:
        status = {True: "yes", False: "FAILED", None: "not yet"}[record["verified"]]
        print(
            f"{record['origin']:<9} {'yes' if record['portable'] else 'no':<8} {status:<8} "
            f"{record['name']}: {record['equation']}"
        )
    verified = sum(r["verified"] is True for r in records)
    print(
        f"{len(records)} rules, {verified} verified"
        + ("" if verified == len(records) else " (run `rlflow rules verify`)")
    )
    return 0


def _verify(args: argparse.Namespace) -> int:
    from rlflow.rewrite import verify_rules

    start = time.perf_counter()
    results = verify_rules(refresh=args.refresh)
    failed = [r for r in results if not r.passed]
    wall_s = time.perf_counter() - start
    if args.json:
        print_json(
            {
                "rules": len(results),
                "verified": len(results) - len(failed),
                "failed": {r.rule: r.reason for r in failed},
                "wall_s": round(wall_s, 1),
            }
        )
        return 0
    for result in failed:
        print(f"FAILED {result.rule}: {result.reason}", file=sys.stderr)
    print(
        f"{len(results) - len(failed)} of {len(results)} rules verified in {wall_s:.1f} s; "
        f"{len(failed)} failed and are excluded from every rule set"
    )
    return 0


def _generate(args: argparse.Namespace) -> int:
    """Write the rule file, then report the count left after each stage on stderr."""
    from rlflow.rewrite.generator import DEFAULT_OPS, STAGES, write_rules
    from rlflow.rewrite.template import GENERATED_PATH

    output = args.output or GENERATED_PATH
    check_number("--max-ops", args.max_ops, 1)
    check_number("--inputs", args.inputs, 1)
    check_output_file("-o", output)
    started = time.perf_counter()
    stats: dict[str, int] = {}
    rules = write_rules(
        output,
        args.max_ops,
        DEFAULT_OPS if args.ops is None else args.ops,
        args.inputs,
        args.ranks,
        progress=sys.stderr.isatty(),
        stats=stats,
    )
    wall = time.perf_counter() - started
    for stage in (*STAGES, *sorted(set(stats) - set(STAGES))):
        if stage in stats:
            print(f"{stage:>48}: {stats[stage]}", file=sys.stderr)
    if args.json:
        summary = {"rules": len(rules), "path": str(output), "wall_s": round(wall, 1)}
        print_json({**summary, "stages": stats})
    else:
        print(f"wrote {len(rules)} rules to {output} in {wall:.0f} s")
    return 0


def _names(text: str) -> tuple[str, ...]:
    return tuple(name for name in text.split(",") if name)


def _ranks(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(rank) for rank in _names(text))
    except ValueError:
        raise argparse.ArgumentTypeError("takes comma-separated ranks, e.g. 2,4") from None


def _candidates(args: argparse.Namespace) -> int:
    from rlflow.rewrite import default_ruleset

    graph = resolve_model(args.model, args.size, args.input_shape)
    ruleset = default_ruleset(portable=args.portable)
    start = time.perf_counter()
    candidates = ruleset.candidates(graph)
    wall_s = time.perf_counter() - start
    by_rule: dict[str, int] = {}
    for candidate in candidates:
        by_rule[candidate.rule.name] = by_rule.get(candidate.rule.name, 0) + 1
    result = {
        "model": model_label(args.model, args.size),
        "nodes": len(graph.nodes),
        "rules": len(ruleset),
        "candidates": len(candidates),
        "by_rule": dict(sorted(by_rule.items(), key=lambda kv: (-kv[1], kv[0]))),
        "wall_s": round(wall_s, 3),
    }
    if args.json:
        print_json(result)
        return 0
    print(
        f"{result['model']}: {len(candidates)} distinct candidates from {len(ruleset)} rules "
        f"({len(graph.nodes)} nodes, {wall_s:.2f} s)"
    )
    for name, count in result["by_rule"].items():
        print(f"  {count:>4}  {name}")
    return 0

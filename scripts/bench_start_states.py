#!/usr/bin/env python
"""How stable the choice of start state is: every start state of a model (the original as
written and onnxruntime's graph at each of its knobs, each run as written) against the original
under onnxruntime's defaults, in several interleaved runs, with nothing cached between them.

`rlflow optimize` picks the fastest of one such run (`choose_start`); where the states lie
within the noise of one run, another run picks another. Prints one line per run, the states
fastest first, and the JSON rows to --out.

    python scripts/bench_start_states.py mini-dalle --size full --repeats 3
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

from rlflow.cost import OrtSettings
from rlflow.cost.ort_optimizer import start_states
from rlflow.graph import load_model
from rlflow.search import default_runner
from rlflow.zoo import cached_path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("--size", default="full", choices=("small", "medium", "full"))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, help="write the runs as JSON here")
    args = parser.parse_args()
    settings = OrtSettings(threads=1).resolved()
    original = load_model(cached_path(args.model, args.size))
    states = start_states(original, settings)
    runner = default_runner(settings)
    runs = []
    for repeat in range(args.repeats):
        started = time.perf_counter()
        comparison = runner.compare([original, *(s.graph for s in states)], use_cache=False)
        speedups = dict(zip((s.name for s in states), comparison.speedups[1:], strict=True))
        runs.append({"speedups": speedups, "loadavg": os.getloadavg()[0]})
        ranked = sorted(speedups.items(), key=lambda item: -item[1])
        print(
            f"run {repeat + 1} ({time.perf_counter() - started:.0f} s, load "
            f"{os.getloadavg()[0]:.2f}): " + ", ".join(f"{k} {v:.3f}x" for k, v in ranked),
            flush=True,
        )
    if args.out:
        args.out.write_text(json.dumps({"model": f"{args.model}:{args.size}", "runs": runs}))


if __name__ == "__main__":
    main()

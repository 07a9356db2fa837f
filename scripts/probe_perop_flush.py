#!/usr/bin/env python
"""How much cache to flush before timing a weight-holding operator: three per-op models, each
beside the graph's end-to-end latency, over the zoo at one size, repeated.

The per-op model (`rlflow.cost.perop`) times an operator that holds weights from flushed caches
(a buffer twice the last-level cache written before every run), since inside a graph the other
operators' weights evict its own. Where a graph's weights fit in the cache, what evicts them
between two runs of the operator is only the rest of the graph: its reuse distance. This probe
prices each graph three ways, each into a fresh operator cache of its own, then times the graph
end to end:

- `full`: the model's flush (twice the last-level cache);
- `reuse`: a flush the size of the graph's other weights (capped at twice the cache);
- `reuse+act`: those weights and every activation tensor of the graph.

and prints each one's error against the end-to-end time (the 3rd-smallest run), per graph and
summarised per repeat; rows go to OUT.json. docs/BENCHMARKS.md ("Per-op cost against
end-to-end latency") has what it found.

    python scripts/probe_perop_flush.py --size medium --repeats 3 --out runs/perop-flush.json
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_perop_offline import relative_error, start_graphs  # noqa: E402

from rlflow.cost import Deployment, OrtSettings, PerOpCostModel, Runner  # noqa: E402
from rlflow.cost.perop import CacheFlusher, last_level_cache_bytes  # noqa: E402
from rlflow.fileio import write_json_atomic  # noqa: E402
from rlflow.graph import Graph  # noqa: E402
from rlflow.zoo import MODEL_NAMES  # noqa: E402

MIB = 2**20
VARIANTS = ("full", "reuse", "reuse+act")


class ReuseFlushModel(PerOpCostModel):
    """The per-op model with a flush the size of the bytes the rest of the graph reads between
    two runs of an operator (its reuse distance), rounded to MiB, which keys the cache too."""

    def __init__(self, *args, activations: bool = False, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.activations = activations
        self._graph_bytes = 0
        self._flush_mib = 0
        self._flushers: dict[int, CacheFlusher] = {}
        self._cap_mib = 2 * (last_level_cache_bytes() or CacheFlusher.FALLBACK_LLC_BYTES) // MIB

    def report(self, model: Graph):  # type: ignore[override]
        self._graph_bytes = graph_bytes(model, self.activations)
        return super().report(model)

    def _raw_ms(self, graph, node, settings):
        own = sum(
            graph.initializers[name].nbytes for name in node.inputs if name in graph.initializers
        )
        self._flush_mib = min(round(max(self._graph_bytes - own, 0) / MIB), self._cap_mib)
        self._settings_keys.clear()  # the flush size is part of the cache key
        return super()._raw_ms(graph, node, settings)

    def _settings_key(self, settings):
        return f"{super()._settings_key(settings)},flush={self._flush_mib}MiB"

    def _time_session(self, model, feeds, settings, runs, shapes, cold):
        if not self._flush_mib:
            return super()._time_session(model, feeds, settings, runs, shapes, False)
        if self._flush_mib not in self._flushers:  # CacheFlusher writes twice what it is given
            self._flushers[self._flush_mib] = CacheFlusher(self._flush_mib * MIB // 2)
        self._flusher = self._flushers[self._flush_mib]
        return super()._time_session(model, feeds, settings, runs, shapes, cold)


def graph_bytes(graph: Graph, activations: bool) -> int:
    """The bytes of the graph's constants, and of its activation tensors if asked."""
    total = sum(array.nbytes for array in graph.initializers.values())
    if activations:
        for name, value in graph.values.items():
            shape = value.shape
            if name not in graph.initializers and shape and all(isinstance(d, int) for d in shape):
                total += int(np.prod(shape)) * 4
    return total


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", default="medium", help="zoo size: small, medium or full")
    parser.add_argument("--models", nargs="+", default=list(MODEL_NAMES), help="zoo models")
    parser.add_argument("--repeats", type=int, default=3, help="passes over the models")
    parser.add_argument("--out", default="runs/perop-flush.json", help="rows as JSON")
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")

    settings = Deployment("offline").settings(OrtSettings(threads=1)).resolved()
    runner = Runner(settings, runs=30)
    rows: list[dict] = []
    for repeat in range(args.repeats):
        with tempfile.TemporaryDirectory() as tmp:
            models = {
                "full": PerOpCostModel(settings, cache_path=f"{tmp}/full.sqlite"),
                "reuse": ReuseFlushModel(settings, cache_path=f"{tmp}/reuse.sqlite"),
                "reuse+act": ReuseFlushModel(
                    settings, cache_path=f"{tmp}/act.sqlite", activations=True
                ),
            }
            for name in args.models:
                for state, graph in start_graphs(name, args.size, settings).items():
                    estimates = {key: model.cost_ms(graph) for key, model in models.items()}
                    e2e = runner.measure(graph, use_cache=False)
                    measured = e2e.low_ms or e2e.min_ms
                    rows.append(
                        {"repeat": repeat, "model": name, "state": state, "e2e_ms": measured}
                        | {f"{key}_ms": ms for key, ms in estimates.items()}
                    )
                    errors = " ".join(
                        f"{key} {100 * relative_error(ms, measured):+.1f}%"
                        for key, ms in estimates.items()
                    )
                    print(f"{repeat} {name} {state}: e2e {measured:.3f} ms; {errors}", flush=True)
                    write_json_atomic(Path(args.out), {"size": args.size, "rows": rows})
            for model in models.values():
                model.close()
        of_repeat = [row for row in rows if row["repeat"] == repeat]
        for key in VARIANTS:
            errors = [relative_error(row[f"{key}_ms"], row["e2e_ms"]) for row in of_repeat]
            print(
                f"repeat {repeat} {key}: median |error| "
                f"{100 * statistics.median(map(abs, errors)):.1f}%, max "
                f"{100 * max(map(abs, errors)):.1f}%, "
                f"mean signed {100 * statistics.mean(errors):+.1f}%"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())

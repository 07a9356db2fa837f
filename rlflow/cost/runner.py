"""End-to-end latency in onnxruntime, measured so that comparisons survive a noisy machine.

Timings here move by tens of percent between runs, so graphs are only ever compared within
one run: after a warm-up they are timed in alternating blocks (A-block B-block, then B A, ...)
and compared by the median of their per-pair ratios: ratio(B) = median over k of
run_k(B) / run_k(A), pair k being the k-th run of each, which were timed a block apart. Each
graph's minimum, `LOW_RANK`-th (3rd) smallest and median run are reported beside it, and the
ratio of the 3rd-smallest runs is kept as secondary information. Results are cached by
(graph hash, settings), in memory and optionally on disk.

Why the median of pairs (this departs from the first design's "compare the minimum", on evidence
from this machine, docs/BENCHMARKS.md "Measurement"): a model measured against itself 10
times per setting, `scripts/bench_cost.py squeezenet-1.1 resnet-18 --size full --reps 10` on
a quiet machine (load 0.5-1), gave 0.987-1.014 for the median of pairs in all 40
repetitions, against 0.80-1.06 for the minimum and 0.79-1.08 for the 3rd smallest; over all
nine full zoo models at both levels the median of pairs held 1 +- 0.03 in 172 of 180, the
3rd smallest in 122, the minimum in 111; at load 4-7 (squeezenet, resnet-18, bert) the
median of pairs in 53 of 60, the 3rd smallest in 26 and the minimum in 28. The low
statistics are extreme values: a graph's fastest runs are rare moments when nothing else
held the core, so which graph got them is luck, even on a quiet machine. A pair, by
contrast, is two runs a block apart, which mostly saw the same load; the median over
hundreds of pairs ignores the pairs the load split, whichever way it split them. (The first
design had found per-pair ratios much noisier than minima; with the adaptive timing below,
on this machine, it is the other way round.)

How long to time is adaptive by default: a fixed quarter second per graph let a 10-ms model
measured against itself stray to 0.90-1.26 here, so rounds of blocks go on until every
graph's 3rd-smallest run has settled and, in a comparison, every ratio is known within 2%
(a 95% interval; `AdaptiveStop`), between 1 and 30 s of timed runs per graph. A single
graph (`Runner.measure`) has no pair to compare with and is summarised by its 3rd-smallest
run (`Measurement.low_ms`).
"""

from __future__ import annotations

import gc
import heapq
import math
import os
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from rlflow.cost.cache import read_json, update_json_atomic
from rlflow.cost.deploy import declared_settings
from rlflow.cost.inputs import random_inputs
from rlflow.cost.session import OrtSettings, make_session, timed_run
from rlflow.cost.source import ModelLike, ModelSource
from rlflow.cost.target import check_target
from rlflow.cost.timing_lock import exclusive_timing
from rlflow.errors import RlflowError, first_line

LOW_RANK = 3
"""A graph's low statistic is its LOW_RANK-th smallest run (see the module docstring)."""

CACHE_VERSION = "v3"
"""Part of every cache key: entries of v1 (compared by the minimum) and v2 (by the 3rd
smallest, no `low_ratios`) are not read."""


def kth_smallest(times: Sequence[float], rank: int = LOW_RANK) -> float:
    """The `rank`-th smallest of `times` (1: the minimum), or the largest if there are fewer."""
    if not times:
        raise ValueError("kth_smallest of no times")
    if rank < 1:
        raise ValueError(f"rank must be at least 1, got {rank}")
    return heapq.nsmallest(rank, times)[-1]


@dataclass(frozen=True)
class Measurement:
    """The latency of one graph under named settings (ms, wall clock around session.run).

    `low_ms` is the `LOW_RANK`-th (3rd) smallest run (the largest if there were fewer runs):
    what a graph measured alone is summarised by; `min_ms` and `median_ms` are reported
    beside it. Built without `low_ms` (e.g. from a single time), it is `min_ms`.
    """

    graph_hash: str
    min_ms: float
    median_ms: float
    runs: int
    threads: int
    ort_level: str
    provider: str
    low_ms: float | None = None
    disabled: tuple[str, ...] = ()
    """onnxruntime passes switched off at `ort_level` for this graph (a tuning knob)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "disabled", tuple(self.disabled))
        if self.low_ms is None:
            object.__setattr__(self, "low_ms", self.min_ms)


@dataclass(frozen=True)
class Comparison:
    """Several graphs timed in one interleaved run; graph 0 is the reference.

    `ratios[i]` = median over k of run_k(graph i) / run_k(graph 0), what graphs are compared
    by: below 1 means graph i is faster. `low_ratios[i]` = low(graph i) / low(graph 0), low
    being `Measurement.low_ms` (the 3rd smallest run), kept as secondary information.
    """

    measurements: tuple[Measurement, ...]
    ratios: tuple[float, ...]
    low_ratios: tuple[float, ...]

    @property
    def speedups(self) -> tuple[float, ...]:
        """1 / ratios: above 1 means graph i is faster than graph 0."""
        return tuple(1.0 / ratio for ratio in self.ratios)

    @property
    def scaled_ms(self) -> tuple[float, ...]:
        """Each graph's latency on one footing: graph 0's median run times the graph's ratio.

        This is what results report as a graph's latency (`original_ms`, `optimized_ms`), so
        that their quotient is exactly the measured speedup; each graph's own statistics are
        in `measurements`.
        """
        return tuple(self.measurements[0].median_ms * ratio for ratio in self.ratios)

    def fastest(self) -> int:
        """Index of the graph with the smallest ratio (graph 0 on a tie)."""
        return min(range(len(self.ratios)), key=self.ratios.__getitem__)


def measurement_of(
    graph_hash: str, times: Sequence[float], settings: OrtSettings, low_rank: int = LOW_RANK
) -> Measurement:
    """The measurement of one graph from its times (ms) under (resolved) settings."""
    return Measurement(
        graph_hash=graph_hash,
        min_ms=float(min(times)),
        low_ms=float(kth_smallest(times, low_rank)),
        median_ms=float(statistics.median(times)),
        runs=len(times),
        threads=settings.threads,
        ort_level=settings.ort_level,
        provider=settings.provider,
        disabled=settings.disabled,
    )


def pair_ratios(times: Sequence[float], reference: Sequence[float]) -> np.ndarray:
    """run_k(graph) / run_k(reference) for every k (the k-th runs of the two, timed a block
    apart; as many runs on each side): what a comparison takes the median of."""
    return np.asarray(times, dtype=float) / np.asarray(reference, dtype=float)


def compare_times(
    times: Sequence[Sequence[float]], measurements: Sequence[Measurement]
) -> Comparison:
    """The comparison of graphs timed interleaved: per graph its times (ms, the same number
    for every graph, pair k being the k-th run of each) and its measurement of them."""
    return Comparison(
        measurements=tuple(measurements),
        ratios=tuple(float(np.median(pair_ratios(t, times[0]))) for t in times),
        low_ratios=tuple(m.low_ms / measurements[0].low_ms for m in measurements),
    )


def median_interval(values: Sequence[float], z: float = 1.96) -> tuple[float, float]:
    """A distribution-free confidence interval of the median of `values` (about 95% for
    z = 1.96): the order statistics n/2 -+ z sqrt(n)/2 around the middle, which hold whatever
    the distribution (the count of values below the true median is binomial(n, 1/2))."""
    if not values:
        raise ValueError("median_interval of no values")
    ordered = sorted(values)
    n = len(ordered)
    spread = z * math.sqrt(n) / 2.0
    low = max(math.floor(n / 2.0 - spread), 1)
    high = min(math.ceil(n / 2.0 + spread) + 1, n)
    return ordered[low - 1], ordered[high - 1]


def geometric_mean(ratios: Iterable[float | None]) -> float:
    """The geometric mean of speedups or ratios (the mean that treats x2 and /2 alike, so a
    summary over models is not ruled by the largest). Entries that are not a positive ratio
    (None: not measured) are left out; nan when none is left."""
    logs = [math.log(ratio) for ratio in ratios if ratio is not None and ratio > 0]
    return math.exp(sum(logs) / len(logs)) if logs else float("nan")


@dataclass
class AdaptiveStop:
    """When to stop timing: after whole rounds (one block of every graph), once every graph's
    low statistic (its `rank`-th smallest run) has settled and, in a comparison, every
    graph's ratio to graph 0 is known closely enough, within bounds on the runs and the
    timed time per graph.

    A graph's low statistic has settled when its running value now is no more than
    `tolerance` (relative) below what it was a window of rounds ago: `patience` rounds, or the
    last `patience_fraction` of all rounds so far if that is longer. It is an extreme value:
    once it stands, improvements come ever more rarely, so a fixed window would call it
    settled too soon; "the second half of the runs did not beat the first by 0.5%" does not.
    It is undefined (infinite) until a graph has `rank` runs, and never settled then.

    A ratio (the median of per-pair ratios, `Comparison.ratios`) is known closely enough when
    its distribution-free 95% interval (`median_interval`) reaches no further than
    `ratio_tolerance` (relative) from it on either side. With the low statistic alone and a
    10-s bound, 8 of 180 self-comparisons strayed 3.1-4.6% from 1, 7 of them on models over
    100 ms stopped at the bound with 50-75 pairs (docs/BENCHMARKS.md): the interval says
    when the pairs are enough, and the bound is 30 s.

    Timing stops at the first round where all of: each graph has `min_runs` runs, the fastest
    graph has `min_time_s` of timed runs, every low statistic has settled and every ratio is
    known closely enough; or, whatever they do, where a graph reaches `max_time_s` of timed
    runs or `max_runs` runs. Pure bookkeeping over the times it is fed (ms per run), so the
    rule is tested on synthetic sequences.
    """

    min_time_s: float = 1.0
    max_time_s: float = 30.0
    tolerance: float = 0.005
    patience: int = 10
    patience_fraction: float = 0.5
    min_runs: int = 30
    max_runs: int = 5000
    rank: int = LOW_RANK
    ratio_tolerance: float = 0.02

    def __post_init__(self) -> None:
        self.reset(0)

    def reset(self, graphs: int) -> None:
        """Start afresh for `graphs` graphs."""
        self.rounds = 0
        self.lows: list[list[float]] = [[] for _ in range(graphs)]
        """Per graph, its running `rank`-th smallest run after each round (inf before)."""
        self.times: list[list[float]] = [[] for _ in range(graphs)]
        """Per graph, all its runs so far (ms)."""
        self.reason = ""
        """Why `observe` last said stop: "settled", "max_time" or "max_runs"."""

    @property
    def runs(self) -> list[int]:
        """Per graph, how many runs it has had so far."""
        return [len(times) for times in self.times]

    @property
    def timed_ms(self) -> list[float]:
        """Per graph, the sum of its runs so far (ms)."""
        return [float(sum(times)) for times in self.times]

    def settled(self, graph: int) -> bool:
        """Whether this graph's low statistic improved by at most `tolerance` in the window."""
        history = self.lows[graph]
        window = max(self.patience, math.ceil(self.patience_fraction * len(history)))
        if len(history) <= window or math.isinf(history[-1]):
            return False
        return history[-1] >= history[-1 - window] * (1.0 - self.tolerance)

    def ratio_width(self, graph: int) -> float:
        """How far (relative) the 95% interval of this graph's ratio to graph 0 reaches from
        the ratio, on its wider side (0 for graph 0 itself)."""
        if graph == 0:
            return 0.0
        pairs = min(len(self.times[0]), len(self.times[graph]))
        if pairs == 0:
            return math.inf
        ratios = pair_ratios(self.times[graph][:pairs], self.times[0][:pairs])
        middle = float(np.median(ratios))
        low, high = median_interval(ratios.tolist())
        return max(middle - low, high - middle) / middle

    def observe(self, round_times: Sequence[Sequence[float]]) -> bool:
        """Record one round (per graph, the times in ms of its block); True: stop timing."""
        if self.rounds == 0 and len(self.times) != len(round_times):
            self.reset(len(round_times))
        self.rounds += 1
        for graph, times in enumerate(round_times):
            self.times[graph].extend(float(time_ms) for time_ms in times)
            so_far = self.times[graph]
            low = kth_smallest(so_far, self.rank) if len(so_far) >= self.rank else math.inf
            self.lows[graph].append(low)
        if max(self.timed_ms) >= 1e3 * self.max_time_s:
            self.reason = "max_time"
        elif max(self.runs) >= self.max_runs:
            self.reason = "max_runs"
        elif (
            min(self.runs) >= self.min_runs
            and min(self.timed_ms) >= 1e3 * self.min_time_s
            and all(self.settled(graph) for graph in range(len(self.runs)))
            and all(
                self.ratio_width(graph) <= self.ratio_tolerance for graph in range(len(self.runs))
            )
        ):
            self.reason = "settled"
        return bool(self.reason)

    def key(self) -> str:
        """The rule's parameters, for cache keys."""
        return (
            f"adaptive({self.min_time_s}-{self.max_time_s}s,tol={self.tolerance},"
            f"patience={self.patience},fraction={self.patience_fraction},rank={self.rank},"
            f"ratio_tol={self.ratio_tolerance})"
        )


class Runner:
    """Times graphs in onnxruntime under fixed settings.

    Every graph runs under the settings it declares in its `ort_config` metadata (an optimised
    model in offline mode declares the optimiser off, `rlflow.cost.deploy`), else under the
    Runner's; `compare` can also be given settings per graph (ORT's own knobs on one model).

    Args:
        settings: provider, threads and ORT optimisation level (default: 1 thread, level all).
        warmup: untimed runs per graph before timing starts (at least 1).
        runs: at least this many timed runs per graph (rounded up to whole blocks).
        min_time_s: None (default): time adaptively, round after round until every graph's
            low statistic has settled (see `AdaptiveStop`; `stop` sets its bounds). A number: a
            fixed protocol of at least this much timed time per graph, judged from the
            warm-up of the fastest graph (0: exactly `runs` runs).
        max_runs: a cap on the runs per graph, in both protocols.
        stop: the adaptive rule's bounds and tolerance (its min_runs, max_runs and rank are
            taken from `runs`, `max_runs` and `low_rank`).
        block: consecutive runs of one graph before switching to the next.
        low_rank: a graph's low statistic (`Measurement.low_ms`, what `measure` summarises
            a graph by and the adaptive stop waits on) is its `low_rank`-th smallest run;
            default `LOW_RANK` (3), 1: the minimum.
        seed: seed of the random inputs (made once per model).
        cache_path: a JSON file to keep results across processes; None keeps them in memory.
    """

    def __init__(
        self,
        settings: OrtSettings | None = None,
        *,
        warmup: int = 3,
        runs: int = 30,
        min_time_s: float | None = None,
        max_runs: int = 5000,
        block: int = 5,
        seed: int = 0,
        cache_path: str | os.PathLike | None = None,
        stop: AdaptiveStop | None = None,
        low_rank: int = LOW_RANK,
    ) -> None:
        counts = dict(warmup=warmup, runs=runs, max_runs=max_runs, block=block, low_rank=low_rank)
        for name, count in counts.items():
            if count < 1:
                raise RlflowError(f"the Runner's {name} must be at least 1, got {count}")
        if min_time_s is not None and min_time_s < 0:
            raise RlflowError(f"min_time_s must be at least 0, got {min_time_s}")
        self.settings = (settings or OrtSettings()).resolved()
        self.warmup, self.runs, self.block, self.seed = warmup, runs, block, seed
        self.min_time_s, self.max_runs = min_time_s, max(max_runs, runs)
        self.low_rank = low_rank
        self.stop = replace(
            stop or AdaptiveStop(), min_runs=runs, max_runs=self.max_runs, rank=low_rank
        )
        if (
            self.stop.min_time_s > self.stop.max_time_s
            or self.stop.patience < 1
            or not 0 <= self.stop.patience_fraction < 1
        ):
            raise RlflowError(
                "the adaptive stop needs min_time_s <= max_time_s, patience >= 1 and "
                "0 <= patience_fraction < 1"
            )
        self.cache_path = Path(cache_path) if cache_path is not None else None
        self._cache: dict[str, Any] = read_json(self.cache_path) if self.cache_path else {}
        self.sessions_built = 0
        """How many onnxruntime sessions this Runner has built (a cache hit builds none)."""

    # ---- public -----------------------------------------------------------------------------

    def settings_for(self, source: ModelSource) -> OrtSettings:
        """The settings a graph runs under: those it declares, else the Runner's."""
        return declared_settings(source.metadata, self.settings)

    def measure(self, model: ModelLike, *, use_cache: bool = True) -> Measurement:
        """The latency of one graph."""
        source = ModelSource(model)
        settings = self.settings_for(source)
        key = self._key("measure", [source.graph_hash], [settings])
        if use_cache and _readable(self._cache.get(key)):
            return _measurement_from_dict(self._cache[key])
        times = self._time([source], [settings])[0]
        measurement = measurement_of(source.graph_hash, times, settings, self.low_rank)
        self._store(key, asdict(measurement))
        return measurement

    def compare(
        self,
        models: Sequence[ModelLike],
        *,
        use_cache: bool = True,
        settings: Sequence[OrtSettings | None] | None = None,
    ) -> Comparison:
        """Time graphs interleaved in one run; ratios are relative to models[0].

        Inputs must have the same names, dtypes and shapes in every graph: each graph gets
        the same random arrays. `settings[i]`, when given and not None, is what graph i runs
        under (resolved for this machine); else the settings it declares, else the Runner's.
        """
        if not models:
            raise RlflowError("compare needs at least one model")
        if settings is not None and len(settings) != len(models):
            raise RlflowError("compare needs one settings entry per model")
        # One source per distinct object, so a model compared with itself is serialized once.
        by_id: dict[int, ModelSource] = {}
        for model in models:
            if id(model) not in by_id:
                by_id[id(model)] = ModelSource(model)
        sources = [by_id[id(model)] for model in models]
        signature = sorted((s.name, s.dtype, s.shape) for s in sources[0].inputs)
        for index, source in enumerate(sources[1:], start=1):
            if sorted((s.name, s.dtype, s.shape) for s in source.inputs) != signature:
                first, other = (
                    ", ".join(spec.describe() for spec in s.inputs) for s in (sources[0], source)
                )
                raise RlflowError(
                    f"graphs compared must take the same inputs: graph {index + 1} takes "
                    f"{other}, the first {first}"
                )
        chosen = [
            self.settings_for(source) if given is None else given.resolved()
            for source, given in zip(sources, settings or [None] * len(sources), strict=True)
        ]
        key = self._key("compare", [source.graph_hash for source in sources], chosen)
        if use_cache and _readable_comparison(self._cache.get(key)):
            return _comparison_from_dict(self._cache[key])
        times = self._time(sources, chosen)
        measurements = [
            measurement_of(source.graph_hash, graph_times, graph_settings, self.low_rank)
            for source, graph_times, graph_settings in zip(sources, times, chosen, strict=True)
        ]
        comparison = compare_times(times, measurements)
        self._store(key, asdict(comparison))
        return comparison

    # ---- timing -----------------------------------------------------------------------------

    def _time(self, sources: list[ModelSource], settings: list[OrtSettings]) -> list[list[float]]:
        """Per graph, the same number of wall times in ms, graphs alternated block by block;
        graph i runs under settings[i]. Sessions are built and run holding the machine's
        timing lock, if one is set (`rlflow.cost.timing_lock`)."""
        with exclusive_timing():
            return self._time_sessions(sources, settings)

    def _time_sessions(
        self, sources: list[ModelSource], settings: list[OrtSettings]
    ) -> list[list[float]]:
        for source, graph_settings in zip(sources, settings, strict=True):
            source.require_static_inputs()
            check_target(source.metadata, graph_settings.provider)
        runners = []
        for index, (source, graph_settings) in enumerate(zip(sources, settings, strict=True)):
            try:
                session = make_session(source.model_bytes(), graph_settings)
            except Exception as error:  # onnxruntime raises several types for a bad model
                raise RlflowError(
                    f"onnxruntime cannot load model {index}: {first_line(error)}"
                ) from None
            self.sessions_built += 1
            runners.append(
                timed_run(session, random_inputs(source.inputs, source.metadata, self.seed))
            )
        for source in sources:
            source.release()  # each session holds its own copy of the model; free ours

        times: list[list[float]] = [[] for _ in sources]
        gc_was_enabled = gc.isenabled()
        gc.disable()  # a collection inside a timed run would land on one graph only
        try:
            fastest_ms = float("inf")
            for index in range(len(sources)):
                try:
                    warm_ms = min(runners[index]() for _ in range(self.warmup))
                except Exception as error:
                    raise RlflowError(
                        f"onnxruntime cannot run model {index}: {first_line(error)}"
                    ) from None
                fastest_ms = min(fastest_ms, warm_ms)
            if self.min_time_s is None:
                self._time_adaptively(runners, times)
            else:
                wanted = int(self.min_time_s * 1e3 / max(fastest_ms, 1e-3))
                runs = max(self.runs, min(wanted, self.max_runs))
                for round_index in range(-(-runs // self.block)):
                    self._round(runners, times, round_index)
        finally:
            if gc_was_enabled:
                gc.enable()
        return times

    def _round(self, runners: list, times: list[list[float]], round_index: int) -> None:
        """One block of every graph, in reverse order every other round (A B, B A, ...)."""
        order = range(len(runners))
        for index in order if round_index % 2 == 0 else reversed(order):
            run = runners[index]
            times[index].extend(run() for _ in range(self.block))

    def _time_adaptively(self, runners: list, times: list[list[float]]) -> None:
        stop = replace(self.stop)  # a fresh copy: its bookkeeping is per call
        stop.reset(len(runners))
        round_index = 0
        while True:
            self._round(runners, times, round_index)
            round_index += 1
            if stop.observe([graph_times[-self.block :] for graph_times in times]):
                return

    # ---- cache ------------------------------------------------------------------------------

    def _key(self, kind: str, hashes: list[str], settings: list[OrtSettings] | None = None) -> str:
        timing = self.stop.key() if self.min_time_s is None else self.min_time_s
        protocol = (
            f"warmup={self.warmup},runs={self.runs},min_time_s={timing},"
            f"max_runs={self.max_runs},block={self.block},seed={self.seed},"
            f"low_rank={self.low_rank}"
        )
        own = settings or [self.settings] * len(hashes)
        members = "|".join(
            graph_hash
            if graph_settings == self.settings
            else f"{graph_hash}@{graph_settings.key()}"
            for graph_hash, graph_settings in zip(hashes, own, strict=True)
        )
        return f"{CACHE_VERSION}|{kind}|{members}|{self.settings.key()}|{protocol}"

    def _store(self, key: str, entry: dict[str, Any]) -> None:
        self._cache[key] = entry
        if self.cache_path is not None:
            self._cache.update(update_json_atomic(self.cache_path, {key: entry}))


def _readable(entry: Any) -> bool:
    """Whether a cached measurement has every field of this version (else: time it again)."""
    return isinstance(entry, dict) and entry.get("low_ms") is not None


def _readable_comparison(entry: Any) -> bool:
    if not isinstance(entry, dict) or entry.get("low_ratios") is None:
        return False
    measurements = entry.get("measurements")
    return bool(measurements) and all(_readable(m) for m in measurements)


def _measurement_from_dict(entry: dict[str, Any]) -> Measurement:
    return Measurement(**{**entry, "disabled": tuple(entry.get("disabled", ()))})


def _comparison_from_dict(entry: dict[str, Any]) -> Comparison:
    return Comparison(
        measurements=tuple(_measurement_from_dict(m) for m in entry["measurements"]),
        ratios=tuple(entry["ratios"]),
        low_ratios=tuple(entry["low_ratios"]),
    )

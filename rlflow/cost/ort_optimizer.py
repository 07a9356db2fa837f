"""onnxruntime's own optimiser, used as a tool: its graphs are start states, its knobs a peer.

- `optimized_graph(model, settings)`: what onnxruntime makes of a model at a level (some passes
  possibly switched off), saved as in its offline mode and loaded into the IR, declared to run
  as written. rlflow's searches start from these, so they begin where onnxruntime ends.
- `changed_passes(model, settings)`: the graph transformers that changed the model, read from
  onnxruntime's own log ("GraphTransformer X modified: 1"); guessing them from a list of names
  would go stale with every onnxruntime release.
- `ort_knobs(model, base)`: onnxruntime's tuning knobs worth trying on a model, every level and
  `all` with each pass that changed it switched off in turn: what a flag search gives a user
  without rlflow, the *tuning peer* every result is shown beside.
"""

from __future__ import annotations

import os
import re
import sys
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path

import onnxruntime as ort

from rlflow.cost.deploy import Deployment
from rlflow.cost.runner import Runner
from rlflow.cost.session import ORT_LEVELS, PROVIDERS, OrtSettings
from rlflow.cost.source import ModelLike, ModelSource
from rlflow.errors import RlflowError, first_line
from rlflow.graph import MS_DOMAIN, NCHWC_DOMAIN, Graph, load_model

_MODIFIED = re.compile(r"GraphTransformer (\S+) modified: 1")
_STDERR_LOCK = threading.Lock()


@dataclass(frozen=True)
class StartState:
    """A graph a search may start from: the original as written, or one of onnxruntime's."""

    name: str
    """original | ort:LEVEL | ort:all-PASS."""
    graph: Graph
    settings: OrtSettings | None
    """The onnxruntime knob that made it (None for the original)."""


def _session_options(settings: OrtSettings, log: bool) -> ort.SessionOptions:
    options = ort.SessionOptions()
    options.intra_op_num_threads = settings.threads
    options.inter_op_num_threads = 1
    options.graph_optimization_level = ORT_LEVELS[settings.ort_level]
    options.log_severity_level = 1 if log else 4
    return options


def _build(model_bytes: bytes, settings: OrtSettings, options: ort.SessionOptions) -> None:
    settings = settings.resolved()
    providers: list = [PROVIDERS["cpu"]]
    if settings.provider != "cpu":  # its options too: some decide layouts (prefer_nhwc)
        providers.insert(0, (PROVIDERS[settings.provider], settings.provider_options()))
    try:
        ort.InferenceSession(
            model_bytes, options, providers=providers, disabled_optimizers=list(settings.disabled)
        )
    except Exception as error:  # onnxruntime raises several types for a bad model
        raise RlflowError(f"onnxruntime cannot optimise the model: {first_line(error)}") from None


@contextmanager
def _stderr_to(path: Path) -> Iterator[None]:
    """Send file descriptor 2 (where onnxruntime's C++ logger writes) to `path` meanwhile."""
    with _STDERR_LOCK, open(path, "wb") as sink:
        sys.stderr.flush()
        saved = os.dup(2)
        os.dup2(sink.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)


def changed_passes(model: ModelLike, settings: OrtSettings) -> list[str]:
    """The onnxruntime graph transformers that changed `model` under `settings`, in the order
    they first did."""
    model_bytes = ModelSource(model).model_bytes()
    with tempfile.TemporaryDirectory() as folder:
        log = Path(folder) / "ort.log"
        with _stderr_to(log):
            _build(model_bytes, settings, _session_options(settings, log=True))
        text = log.read_text(encoding="utf-8", errors="replace")
    return list(dict.fromkeys(_MODIFIED.findall(text)))


def optimized_graph(model: ModelLike, settings: OrtSettings) -> Graph:
    """What onnxruntime makes of `model` under `settings`, saved in its offline mode and loaded
    into the IR, declared (ort_config, target) to run as written."""
    source = ModelSource(model)
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "optimized.onnx"
        options = _session_options(settings, log=False)
        options.optimized_model_filepath = str(path)
        _build(source.model_bytes(), settings, options)
        graph = load_model(path)
    domains = {node.domain for node in graph.nodes}
    declared = Deployment("offline").metadata(settings.resolved().provider, domains)
    return graph.with_metadata({**source.metadata, **declared})


def knob_of(name: str, base: OrtSettings) -> OrtSettings:
    """The knob a start state's name stands for: `ort:all-SkipLayerNormFusion` -> `base` at
    level all with that pass off; RlflowError for a name that is not `ort:LEVEL[-PASS...]`."""
    level, *disabled = name.removeprefix("ort:").split("-")
    if not name.startswith("ort:") or level not in ORT_LEVELS or level == "disable":
        levels = ", ".join(f"ort:{level}" for level in ORT_LEVELS if level != "disable")
        raise RlflowError(
            f"unknown start state {name!r}: original, or one of {levels}, or ort:all-PASS"
        )
    return replace(base, ort_level=level, disabled=tuple(disabled))


def check_start_name(name: str) -> None:
    """RlflowError, in one line, for a name that is neither `original` nor one of
    onnxruntime's graphs: what a command checks before any work."""
    if name != "original":
        knob_of(name, OrtSettings())


def start_state(model: Graph, name: str, base: OrtSettings) -> StartState:
    """One start state by name: `original` (as written, declared offline) or `ort:...`."""
    if name == "original":
        domains = {node.domain for node in model.nodes}
        declared = Deployment("offline").metadata(base.resolved().provider, domains)
        return StartState("original", model.with_metadata(declared), None)
    knob = knob_of(name, base)
    return StartState(name, optimized_graph(model, knob), knob)


def fused_sites(graph: Graph) -> dict[str, list[str]]:
    """onnxruntime's own operators in `graph` (contrib and NCHWc: what its fusions and layout
    passes make), by `domain:op_type`, each site named by the tensor it produces."""
    short = {MS_DOMAIN: "ms", NCHWC_DOMAIN: "nchwc"}
    sites: dict[str, list[str]] = {}
    for node in graph.nodes:
        if node.domain in short:
            sites.setdefault(f"{short[node.domain]}:{node.op_type}", []).append(node.outputs[0])
    return sites


def fusion_table(ort_graph: Graph, result: Graph) -> dict[str, dict[str, object]]:
    """Which of onnxruntime's fusions (in its `all` graph of a model) a result kept, which it
    dropped and which it added, per operator: counts, and the dropped and added sites by the
    tensor the fused operator produces (so they are only as comparable as the names are)."""
    theirs, ours = fused_sites(ort_graph), fused_sites(result)
    table: dict[str, dict[str, object]] = {}
    for op in sorted(set(theirs) | set(ours)):
        ort_sites, our_sites = theirs.get(op, []), ours.get(op, [])
        table[op] = {
            "ort": len(ort_sites),
            "rlflow": len(our_sites),
            "dropped": sorted(set(ort_sites) - set(our_sites)),
            "added": sorted(set(our_sites) - set(ort_sites)),
        }
    return table


def ort_knobs(model: ModelLike, base: OrtSettings) -> list[OrtSettings]:
    """onnxruntime's knobs worth trying on `model`: every level below `all`, then `all` with
    each pass that changed the model switched off in turn (`all` itself, the default, is the
    reference they are compared with, and not listed)."""
    levels = [replace(base, ort_level=level, disabled=()) for level in ORT_LEVELS if level != "all"]
    at_all = replace(base, ort_level="all", disabled=())
    passes = changed_passes(model, at_all)
    return [*levels, *(replace(at_all, disabled=(name,)) for name in passes)]


def start_states(model: Graph, base: OrtSettings) -> list[StartState]:
    """The original as written, and onnxruntime's graph of it under each of `ort_knobs` that
    changes it and at `all`, one per distinct graph (first name kept)."""
    states = [start_state(model, "original", base)]
    seen = {states[0].graph.canonical_hash()}
    knobs = [replace(base, ort_level="all", disabled=()), *ort_knobs(model, base)]
    for knob in knobs:
        if knob.ort_level == "disable":
            continue  # the original as written
        graph = optimized_graph(model, knob)
        digest = graph.canonical_hash()
        if digest not in seen:
            seen.add(digest)
            states.append(StartState(f"ort:{knob.label}", graph, knob))
    return states


@dataclass(frozen=True)
class Peer:
    """The best of onnxruntime's own knobs on a model: what a flag search gives without rlflow.

    `speedups` maps each knob's label to its speedup over the reference (the model under the
    Runner's settings, onnxruntime's defaults), all timed interleaved in one run (the selection
    run). `knob` is the best of them and `speedup` its speedup confirmed in a second run against
    the reference alone (`selected`: what the selection run said of it; None where the
    reference itself was best, at 1.0). The best of a dozen noisy ratios reads high (the
    winner's curse), and rlflow's own results are confirmed the same way before they are shown.
    """

    knob: str
    speedup: float
    speedups: dict[str, float]
    selected: float | None = None


def tuning_peer(model: ModelLike, runner: Runner) -> Peer:
    """Time `model` under each of `ort_knobs` against itself under the Runner's settings, in
    one interleaved run; the best knob, its speedup confirmed in a second run (the reference
    itself when none beats it, or when the confirmation finds the knob no faster)."""
    base = runner.settings
    knobs = ort_knobs(model, base)
    comparison = runner.compare([model] * (len(knobs) + 1), settings=[base, *knobs])
    speedups = {base.label: 1.0}
    speedups.update(
        (knob.label, speedup) for knob, speedup in zip(knobs, comparison.speedups[1:], strict=True)
    )
    best = max(speedups, key=speedups.__getitem__)
    if best == base.label:
        return Peer(best, 1.0, speedups)
    knob = next(knob for knob in knobs if knob.label == best)
    confirmed = runner.compare([model, model], settings=[base, knob], use_cache=False).speedups[1]
    if confirmed <= 1.0:
        return Peer(base.label, 1.0, speedups, selected=speedups[best])
    return Peer(best, confirmed, speedups, selected=speedups[best])


__all__ = [
    "Peer",
    "StartState",
    "changed_passes",
    "fused_sites",
    "fusion_table",
    "knob_of",
    "start_state",
    "optimized_graph",
    "ort_knobs",
    "start_states",
    "tuning_peer",
]

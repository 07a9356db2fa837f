"""Is a rewritten graph still the same function? Run both on the same random inputs and compare.

Used to verify every rewrite rule and every optimised model before it is written. A model that
declares its runtime settings (`ort_config`, `rlflow.cost.deploy`) runs under them; others run
in onnxruntime with its optimiser off (`ort_level="disable"`) by default: we check the
graphs as we wrote them, by ONNX semantics, not what ORT's fusions make of them. With fusions
on, ORT rewrites the two graphs differently (e.g. MatMul+Add into a Gemm or FusedMatMul, an
approximated Gelu) and that changes rounding on one side only, which would force looser
tolerances and could blame our rewrite for ORT's choices. It also builds sessions faster.

Inputs are drawn per seed and per float scale (`scales`: every seed at every scale; integer
inputs within their domains, see rlflow.cost.domains). A model with dynamic dims is checked at
the sizes `input_shapes` gives them.

Tolerances depend on dtype and stay relative to the output's own scale. Floats pass where
|candidate - reference| <= atol * scale + rtol * |reference|, with scale = max(floor, max
|reference output|): a rewrite that reorders a reduction moves every element of an output by
rounding error proportional to the output's magnitude, so an element near zero in a large output
gets the output's absolute slack. The floor, min(1, the inputs' scale), keeps an output that is
all but zero from demanding exact equality: at unit inputs it is 1, at inputs of 1e-3 it is
1e-3, so an output of magnitude 1e-3 is held to 1e-7, not to 1e-4. Integers and bools must match
exactly; NaN matches NaN, inf matches the same inf.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import onnx

from rlflow.cost.deploy import declared_settings
from rlflow.cost.domains import InputDomain
from rlflow.cost.inputs import draw_json, random_inputs
from rlflow.cost.session import OrtSettings, make_session
from rlflow.cost.source import ModelLike, ModelSource, TensorSpec
from rlflow.cost.target import check_target
from rlflow.cost.timing_lock import exclusive_timing
from rlflow.errors import RlflowError, first_line


@dataclass(frozen=True)
class Tolerance:
    """Floats pass where |c - r| <= atol * max(1, max|r|) + rtol * |r|."""

    atol: float
    rtol: float


DEFAULT_TOLERANCES: dict[int, Tolerance] = {
    onnx.TensorProto.FLOAT: Tolerance(atol=1e-4, rtol=1e-3),
    onnx.TensorProto.FLOAT16: Tolerance(atol=1e-2, rtol=1e-2),
    onnx.TensorProto.DOUBLE: Tolerance(atol=1e-8, rtol=1e-6),
}
MAGNITUDES = (1.0, 1e3, 1e-3)
"""Float input scales an optimised model is checked at: unit, large and small magnitudes."""
FINAL_SEEDS = (0, 1)
"""Seeds an optimised model is checked on, each at every scale of MAGNITUDES."""


@dataclass(frozen=True)
class EquivalenceReport:
    """The verdict, the largest errors seen over all outputs and input sets, and why.

    The errors are those of the unit-scale input sets where there are any (what a model
    normally sees; absolute errors at inputs of 1e3 grow with the outputs, and would say
    nothing comparable), and of the failing set on a failure; every set counts toward the
    verdict. `max_rel_err` is |c - r| / max(|r|, atol * scale): relative where the reference is not
    tiny, so that zeros in the reference do not make it infinite. Both are inf when the
    graphs could not be compared (different signatures, a candidate that fails to run).
    `inputs` says how each input was drawn (`rlflow.cost.inputs.draw_json`).
    """

    equivalent: bool
    max_abs_err: float
    max_rel_err: float
    reason: str
    inputs: Mapping[str, Any] = field(default_factory=dict)


class EquivalenceChecker:
    """Checks candidates against one reference; the reference's outputs are computed once.

    Args:
        reference: the graph whose behaviour is the specification.
        seeds: one random input set per seed and scale (integer inputs within their
            domains, see rlflow.cost.domains).
        scales: float inputs are standard normal times each of these (default unit only).
        input_shapes: sizes for the reference's dynamic dims (a ModelProto's), by input.
        domains: integer input domains to use instead of those read off the reference.
        ort_level: ORT optimisation level for both graphs (default disable, see above).
        threads: intra-op threads; 1 keeps onnxruntime's results deterministic.
        provider: auto (CUDA where onnxruntime has it), cpu or cuda; both graphs run on it,
            with TF32 off on CUDA (`OrtSettings.tf32`), so fp32 tolerances hold there too.
        tolerances: per ONNX element type, overriding DEFAULT_TOLERANCES.
        match_output_names: outputs must also keep their names (deployed code fetches
            outputs by name); positions, dtypes and shapes must always match.

    Raises:
        RlflowError: the reference itself does not load or run in onnxruntime.
    """

    def __init__(
        self,
        reference: ModelLike,
        *,
        seeds: Sequence[int] = (0, 1, 2),
        scales: Sequence[float] = (1.0,),
        input_shapes: Mapping[str, Sequence[int]] | None = None,
        domains: Mapping[str, InputDomain] | None = None,
        ort_level: str = "disable",
        threads: int = 1,
        tolerances: Mapping[int, Tolerance] | None = None,
        match_output_names: bool = True,
        provider: str = "auto",
    ) -> None:
        if not seeds or not scales or any(not scale > 0 for scale in scales):
            raise RlflowError("equivalence checking needs a seed and positive float scales")
        self.sets = [(seed, float(scale)) for scale in scales for seed in seeds]
        self.unit_sets = any(scale == 1.0 for _, scale in self.sets)
        self.settings = OrtSettings(threads=threads, ort_level=ort_level, provider=provider)
        self.tolerances = {**DEFAULT_TOLERANCES, **(tolerances or {})}
        self.match_output_names = match_output_names
        self.input_shapes = dict(input_shapes or {})
        source = ModelSource(reference, self.input_shapes)
        source.require_static_inputs()
        self.inputs = [
            replace(spec, domain=domains[spec.name]) if spec.name in (domains or {}) else spec
            for spec in source.inputs
        ]
        self.outputs = source.outputs
        self.metadata = source.metadata
        self.drawn = {spec.name: draw_json(spec, scales) for spec in self.inputs}
        self.feeds = [
            random_inputs(self.inputs, self.metadata, seed, scale) for seed, scale in self.sets
        ]
        try:
            with exclusive_timing():  # runs on the device: not while another process times
                session = make_session(
                    source.model_bytes(), declared_settings(self.metadata, self.settings)
                )
                self.expected = [session.run(None, feeds) for feeds in self.feeds]
        except RlflowError:
            raise
        except Exception as error:
            message = f"the reference model fails in onnxruntime: {first_line(error)}"
            raise RlflowError(message) from None
        finally:
            source.release()

    def check(self, candidate: ModelLike) -> EquivalenceReport:
        """Compare `candidate` with the reference on every seed (a bad candidate never raises);
        its runs hold the machine's timing lock, if one is set (`rlflow.cost.timing_lock`)."""
        with exclusive_timing():
            return self._check(candidate)

    def _check(self, candidate: ModelLike) -> EquivalenceReport:
        try:
            source = ModelSource(candidate, self.input_shapes)
        except RlflowError as error:
            return self._not_equivalent(str(error))
        mismatch = self._signature_mismatch(source)
        if mismatch:
            return self._not_equivalent(mismatch)
        try:
            settings = declared_settings(source.metadata, self.settings)
            check_target(source.metadata, settings.resolved().provider)
            session = make_session(source.model_bytes(), settings)
        except Exception as error:
            reason = f"candidate does not load in onnxruntime: {first_line(error)}"
            return self._not_equivalent(reason)
        finally:
            source.release()
        output_names = [spec.name for spec in source.outputs]
        max_abs = max_rel = 0.0
        for (seed, scale), feeds, expected in zip(self.sets, self.feeds, self.expected):
            where = f"seed {seed}" if scale == 1.0 else f"seed {seed}, inputs x {scale:g}"
            try:
                actual = session.run(output_names, feeds)
            except Exception as error:
                return self._not_equivalent(
                    f"candidate fails to run ({where}): {first_line(error)}"
                )
            for spec, want, got in zip(self.outputs, expected, actual, strict=True):
                abs_err, rel_err, problem = self._compare(
                    spec, np.asarray(want), np.asarray(got), min(1.0, scale)
                )
                if scale == 1.0 or not self.unit_sets or problem:
                    max_abs, max_rel = max(max_abs, abs_err), max(max_rel, rel_err)
                if problem:
                    reason = f"output {spec.name!r} differs on {where}: {problem}"
                    return EquivalenceReport(False, max_abs, max_rel, reason, self.drawn)
        seeds = sorted({seed for seed, _ in self.sets})
        scales = list(dict.fromkeys(f"{scale:g}" for _, scale in self.sets))
        reason = (
            f"{len(self.outputs)} outputs match on {len(self.sets)} input sets "
            f"(seeds {seeds} at float scales {', '.join(scales)})"
        )
        return EquivalenceReport(True, max_abs, max_rel, reason, self.drawn)

    def _not_equivalent(self, reason: str) -> EquivalenceReport:
        return EquivalenceReport(False, float("inf"), float("inf"), reason, self.drawn)

    def _signature_mismatch(self, source: ModelSource) -> str:
        want = {spec.name: spec for spec in self.inputs}
        got = {spec.name: spec for spec in source.inputs}
        for name in want.keys() - got.keys():
            return f"candidate lacks input {want[name].describe()}"
        for name in got.keys() - want.keys():
            return f"candidate has an extra input {got[name].describe()}"
        for name, spec in want.items():
            if (spec.dtype, spec.shape) != (got[name].dtype, got[name].shape):
                return f"input {spec.describe()} is {got[name].describe()} in candidate"
        if len(self.outputs) != len(source.outputs):
            return f"reference has {len(self.outputs)} outputs, candidate {len(source.outputs)}"
        for index, (ref, cand) in enumerate(zip(self.outputs, source.outputs, strict=True)):
            if self.match_output_names and ref.name != cand.name:
                return f"output {index} is named {ref.name!r}, in candidate {cand.name!r}"
            known = ref.shape is not None and cand.shape is not None
            if ref.dtype != cand.dtype or (known and ref.shape != cand.shape):
                return f"output {index} is {ref.describe()}, in candidate {cand.describe()}"
        return ""

    def _compare(
        self, spec: TensorSpec, want: np.ndarray, got: np.ndarray, floor: float = 1.0
    ) -> tuple[float, float, str]:
        """(max abs error, max rel error, problem or "") for one output on one input set;
        `floor` is the least output scale its absolute slack is relative to."""
        if want.shape != got.shape:
            return np.inf, np.inf, f"shape {got.shape} where reference has {want.shape}"
        if want.size == 0:
            return 0.0, 0.0, ""
        tolerance = self.tolerances.get(spec.dtype)
        if tolerance is None or not np.issubdtype(want.dtype, np.floating):
            unequal = want != got
            diff = np.abs(want.astype(np.float64) - got.astype(np.float64))
            abs_err = float(diff.max())
            rel_err = float((diff / np.maximum(np.abs(want.astype(np.float64)), 1.0)).max())
            if unequal.any():
                return abs_err, rel_err, _first_difference(unequal, want, got, "exact match")
            return 0.0, 0.0, ""
        want64, got64 = want.astype(np.float64), got.astype(np.float64)
        finite = np.isfinite(want64)
        scale = max(floor, float(np.abs(want64[finite]).max())) if finite.any() else floor
        slack = tolerance.atol * scale
        same_special = (want64 == got64) | (np.isnan(want64) & np.isnan(got64))
        diff = np.where(same_special, 0.0, np.abs(want64 - got64))
        diff = np.where(np.isnan(diff), np.inf, diff)  # NaN on one side only is a failure
        bad = diff > slack + tolerance.rtol * np.abs(np.where(finite, want64, 0.0))
        abs_err = float(diff.max())
        rel_err = float((diff / np.maximum(np.abs(np.where(finite, want64, 0.0)), slack)).max())
        if bad.any():
            rule = f"atol {tolerance.atol:g} x scale {scale:.3g}, rtol {tolerance.rtol:g}"
            return abs_err, rel_err, _first_difference(bad, want, got, rule)
        return abs_err, rel_err, ""


def check_equivalence(
    reference: ModelLike,
    candidate: ModelLike,
    seeds: Sequence[int] = (0, 1, 2),
    *,
    scales: Sequence[float] = (1.0,),
    input_shapes: Mapping[str, Sequence[int]] | None = None,
    domains: Mapping[str, InputDomain] | None = None,
    ort_level: str = "disable",
    threads: int = 1,
    tolerances: Mapping[int, Tolerance] | None = None,
    match_output_names: bool = True,
    provider: str = "auto",
) -> EquivalenceReport:
    """One-off check of `candidate` against `reference` (see EquivalenceChecker)."""
    checker = EquivalenceChecker(
        reference,
        seeds=seeds,
        scales=scales,
        input_shapes=input_shapes,
        domains=domains,
        ort_level=ort_level,
        threads=threads,
        tolerances=tolerances,
        match_output_names=match_output_names,
        provider=provider,
    )
    return checker.check(candidate)


def _first_difference(bad: np.ndarray, want: np.ndarray, got: np.ndarray, rule: str) -> str:
    index = tuple(int(i) for i in np.argwhere(bad)[0])
    count = int(bad.sum())
    return (
        f"{count} of {bad.size} elements off ({rule}); first at {index}: "
        f"reference {want[index].item()!r}, candidate {got[index].item()!r}"
    )

"""The model rlflow hands back: the optimised graph with the original's interface, checked
against the original as a caller will run it.

The search works on a static-shape Graph; the caller has the original ONNX file. So the graph is
exported, the original's interface is put back on it (`rlflow.graph.Interface`), and the result
is checked against the original file itself, not against the Graph it was loaded into:

- at the shapes it was loaded with, on every seed at every float scale of MAGNITUDES, under the
  settings each declares; the integer inputs' domains are read off the loaded Graph, whose
  static shapes show what a shape input must hold (the original file may not);
- each dynamic dim at other sizes (`other_sizes`, the first SIZES_CHECKED at which the original
  runs), the other dims at their given sizes. A dim whose sizes all match keeps its symbol in the
  written model; any other is fixed at its given size, and the model is specialised to it, with
  the reason. A rewrite that folded a shape computed from that dim is the usual cause.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import onnx

from rlflow.cost.domains import InputDomain
from rlflow.cost.equivalence import (
    FINAL_SEEDS,
    MAGNITUDES,
    EquivalenceChecker,
    EquivalenceReport,
    check_equivalence,
)
from rlflow.cost.source import ModelSource
from rlflow.errors import RlflowError
from rlflow.graph import Graph, Interface, load_model

SIZES_CHECKED = 2
"""Other sizes of each dynamic dim at which the result must match the original to stay general."""

Shapes = dict[str, tuple[int, ...]]


@dataclass(frozen=True)
class SizeCheck:
    """What the checks at other sizes found for one dynamic dim of the original's inputs."""

    symbol: str
    given: int
    checked: tuple[int, ...]
    """Sizes at which the result matched the original."""
    general: bool
    reason: str
    """Why it is not general ("" when it is)."""

    def to_json(self) -> dict[str, Any]:
        return {
            "given": self.given,
            "checked": list(self.checked),
            "general": self.general,
            "reason": self.reason,
        }


@dataclass
class HandedBack:
    """The model to write, its check at the loaded shapes, and each dynamic dim's verdict."""

    model: onnx.ModelProto
    report: EquivalenceReport
    sizes: dict[str, SizeCheck]
    interface: Interface

    @property
    def specialised(self) -> dict[str, int]:
        """Dynamic dims the written model fixes, with their size."""
        return {symbol: check.given for symbol, check in self.sizes.items() if not check.general}

    def to_json(self) -> dict[str, Any]:
        return {
            **self.interface.to_json(),
            "dynamic_dims": {symbol: check.to_json() for symbol, check in self.sizes.items()},
            "specialised": self.specialised,
        }


def hand_back(
    original: Graph,
    graph: Graph,
    interface: Interface,
    *,
    strict: bool = True,
    provider: str = "auto",
) -> HandedBack:
    """`graph` (optimised from `original`, loaded with `interface`) as the model to write,
    checked against the original file on `provider`; RlflowError if it is not equivalent at
    the loaded shapes (unless not `strict`: the failing report is returned)."""
    reference = interface.original()
    domains = {spec.name: spec.domain for spec in ModelSource(original).inputs if spec.domain}
    model = interface.restore(graph.to_onnx(), interface.symbols)
    domains_at = _domains_at(reference, domains)
    sizes = {
        symbol: check_size(reference, model, interface, symbol, domains_at, provider)
        for symbol in interface.symbols
    }
    general = [symbol for symbol, check in sizes.items() if check.general]
    if len(general) < len(sizes):
        interface.restore(model, general)
    report = check_equivalence(
        reference,
        model,
        seeds=FINAL_SEEDS,
        scales=MAGNITUDES,
        input_shapes=interface.input_shapes({}),
        domains=domains,
        provider=provider,
    )
    if strict and not report.equivalent:
        raise RlflowError(
            f"the optimised model is not equivalent to the original ({report.reason}); "
            "nothing written"
        )
    return HandedBack(model, report, sizes, interface)


def check_size(
    reference: onnx.ModelProto,
    model: onnx.ModelProto,
    interface: Interface,
    symbol: str,
    domains_at: Callable[[Shapes], Mapping[str, InputDomain]],
    provider: str = "auto",
) -> SizeCheck:
    """Does `model` match `reference` at other sizes of dynamic dim `symbol` (on `provider`)?"""
    given = interface.symbols[symbol]
    checked: list[int] = []
    refused: list[str] = []
    for size in other_sizes(given):
        shapes = interface.input_shapes({symbol: size})
        try:
            checker = EquivalenceChecker(
                reference,
                seeds=FINAL_SEEDS[:1],
                input_shapes=shapes,
                domains=domains_at(shapes),
                provider=provider,
            )
        except RlflowError:  # the original itself does not run at this size
            refused.append(str(size))
            continue
        report = checker.check(model)
        if not report.equivalent:
            reason = f"at {symbol}={size} the result differs from the original: {report.reason}"
            return SizeCheck(symbol, given, tuple(checked), False, reason)
        checked.append(size)
        if len(checked) == SIZES_CHECKED:
            return SizeCheck(symbol, given, tuple(checked), True, "")
    reason = f"the original does not run at {symbol}={', '.join(refused)}"
    return SizeCheck(symbol, given, tuple(checked), False, reason)


def other_sizes(given: int) -> list[int]:
    """Sizes to try a dim at, in order: twice (keeps any divisibility the model needs), one
    more (needs none), then half, three times and one less."""
    sizes = [2 * given, given + 1, given // 2, 3 * given, given - 1]
    return [size for size in dict.fromkeys(sizes) if size >= 1 and size != given]


def _domains_at(
    reference: onnx.ModelProto, domains: Mapping[str, InputDomain]
) -> Callable[[Shapes], Mapping[str, InputDomain]]:
    """Domains at other input shapes: a fixed shape value follows the sizes, so the original is
    loaded again at them to read it; ranges do not, and are kept."""
    if not any(domain.fixed is not None for domain in domains.values()):
        return lambda shapes: domains

    def at(shapes: Shapes) -> Mapping[str, InputDomain]:
        specs = ModelSource(load_model(reference, shapes)).inputs
        return {spec.name: spec.domain for spec in specs if spec.domain}

    return at

"""Operator domains: the names rlflow gives ONNX's standard domain and onnxruntime's own.

One place for them, so that a check like "is this a standard op?" means the same in the IR, the
rules, the cost models and the featuriser.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

STANDARD_DOMAINS = ("", "ai.onnx")
"""The standard ONNX domain under both of its spellings."""
MS_DOMAIN = "com.microsoft"
"""onnxruntime's contrib operators (FusedConv, FusedMatMul, Gelu, SkipLayerNormalization, ...)."""
NCHWC_DOMAIN = "com.microsoft.nchwc"
"""onnxruntime's blocked-layout CPU operators (nchwc Conv, pools, ReorderInput/ReorderOutput)."""
DEFAULT_OPSET = 17
"""The standard domain's opset assumed when a graph does not say."""


DOMAIN_VERSIONS = {"": DEFAULT_OPSET, MS_DOMAIN: 1, NCHWC_DOMAIN: 1, "ai.onnx.ml": 3}
"""The version imported for a domain that a graph uses but does not import."""


def opset_for(opset: Mapping[str, int], domains: Iterable[str]) -> dict[str, int]:
    """`opset` completed with an import for each of `domains` that it lacks: what a model
    written from a graph must import."""
    result = dict(opset)
    for domain in domains:
        if is_standard(domain):
            if not any(name in result for name in STANDARD_DOMAINS):
                result[""] = DEFAULT_OPSET
        elif domain not in result:
            result[domain] = DOMAIN_VERSIONS.get(domain, 1)
    return result


def is_standard(domain: str) -> bool:
    """Whether an operator of `domain` is a standard ONNX operator."""
    return domain in STANDARD_DOMAINS


def onnx_opset(opset: Mapping[str, int]) -> int:
    """The standard domain's version in an opset mapping (either spelling; else the default)."""
    return opset.get("", opset.get("ai.onnx", DEFAULT_OPSET))


__all__ = [
    "DEFAULT_OPSET",
    "DOMAIN_VERSIONS",
    "opset_for",
    "MS_DOMAIN",
    "NCHWC_DOMAIN",
    "STANDARD_DOMAINS",
    "is_standard",
    "onnx_opset",
]

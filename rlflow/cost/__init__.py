"""Measuring graphs: end-to-end latency, per-op measured and analytic cost, equivalence checks.

Everything runs in onnxruntime under an `OrtSettings` (threads, ORT optimisation level,
provider) that is part of every cache key and every result. Caches live under
`$RLFLOW_CACHE_DIR` (default `~/.cache/rlflow`).
"""

from rlflow.cost.analytic import AnalyticCostModel, AnalyticReport, OpCost, op_cost
from rlflow.cost.cache import cache_dir
from rlflow.cost.deploy import (
    DEPLOY_MODES,
    ORT_CONFIG_KEY,
    Deployment,
    declared_level,
    declared_settings,
    declared_target,
)
from rlflow.cost.equivalence import (
    DEFAULT_TOLERANCES,
    EquivalenceChecker,
    EquivalenceReport,
    Tolerance,
    check_equivalence,
)
from rlflow.cost.inputs import DEFAULT_INT_RANGE, INT_RANGE_PREFIX, int_range, random_inputs
from rlflow.cost.peaks import MachinePeaks, machine_peaks
from rlflow.cost.perop import PerOpCostModel, PerOpReport
from rlflow.cost.runner import Comparison, Measurement, Runner, geometric_mean
from rlflow.cost.session import ORT_LEVELS, OrtSettings, make_session
from rlflow.cost.source import ModelLike, TensorSpec
from rlflow.cost.target import TARGET_KEY, Target, check_target, nchwc_block_size

__all__ = [
    "DEPLOY_MODES",
    "ORT_CONFIG_KEY",
    "TARGET_KEY",
    "Deployment",
    "Target",
    "check_target",
    "declared_level",
    "declared_settings",
    "declared_target",
    "nchwc_block_size",
    "DEFAULT_INT_RANGE",
    "DEFAULT_TOLERANCES",
    "INT_RANGE_PREFIX",
    "ORT_LEVELS",
    "AnalyticCostModel",
    "AnalyticReport",
    "Comparison",
    "EquivalenceChecker",
    "EquivalenceReport",
    "MachinePeaks",
    "Measurement",
    "ModelLike",
    "OpCost",
    "OrtSettings",
    "PerOpCostModel",
    "PerOpReport",
    "Runner",
    "TensorSpec",
    "Tolerance",
    "cache_dir",
    "check_equivalence",
    "geometric_mean",
    "int_range",
    "machine_peaks",
    "make_session",
    "op_cost",
    "random_inputs",
]

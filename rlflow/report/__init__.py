"""Benchmark reports: markdown tables, PNG plots, and what they read from training runs.

Pure rendering over result rows (plain dicts, see `rlflow.report.tables.ROW_FIELDS`) and run
directories (`config.yaml`, `progress.json`, TensorBoard event files); it measures nothing.
"""

from rlflow.report.plots import (
    EfficiencyPanel,
    plot_learning_curves,
    plot_speedup_bars,
    plot_speedup_vs_env_steps,
    plot_wall_time,
)
from rlflow.report.runs import (
    CURVE_TAGS,
    read_progress,
    read_scalars,
    real_env_steps,
    speedup_by_env_steps,
)
from rlflow.report.tables import ROW_FIELDS, format_rules, render_report

__all__ = [
    "CURVE_TAGS",
    "EfficiencyPanel",
    "ROW_FIELDS",
    "format_rules",
    "plot_learning_curves",
    "plot_speedup_bars",
    "plot_speedup_vs_env_steps",
    "plot_wall_time",
    "read_progress",
    "read_scalars",
    "real_env_steps",
    "render_report",
    "speedup_by_env_steps",
]

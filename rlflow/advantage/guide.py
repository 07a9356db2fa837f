"""A trained advantage run as the guide of `rlflow.search.guided`: graph and candidates in,
each candidate's predicted relative cost change out.

The graph is featurised as the env featurises its observations (`rlflow.nn.features`, the
same analytic model), so a candidate's neighbourhood reads as it did in the collected data;
rules are matched by name, and a rule the run never saw gets the embedding of "unknown".
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from rlflow.advantage.model import PERCENT, subgraph_data
from rlflow.advantage.train import load_checkpoint, make_model, predict, settings_of
from rlflow.cost import AnalyticCostModel
from rlflow.graph import Graph
from rlflow.nn.features import count_edges, featurize
from rlflow.rewrite import Candidate


class LearnedAdvantage:
    """The predictions of the network in RUN_DIR's checkpoint (`rlflow train-advantage`).

    Calling it with a graph and candidates of it gives their predicted relative cost changes,
    (C(after) - C(now)) / C(now), as `rlflow.search.guided.Advantage` asks.
    """

    def __init__(self, run_dir: str | Path) -> None:
        state = load_checkpoint(run_dir)
        self.run_dir = Path(run_dir)
        self.settings = settings_of(state)
        self.rule_ids = {name: index for index, name in enumerate(state["rule_names"])}
        self.max_site_nodes = int(state["max_site_nodes"])
        self.cost = state.get("cost")
        """The cost source the targets were collected with (analytic or perop)."""
        self.model = make_model(self.settings, len(state["rule_names"]))
        self.model.load_state_dict(state["model"])
        self.model.eval()
        self.analytic = AnalyticCostModel()
        self.calls = 0
        """Graphs whose candidates were ranked."""

    def __call__(self, graph: Graph, candidates: Sequence[Candidate]) -> np.ndarray:
        self.calls += 1
        if not candidates:
            return np.zeros(0, dtype=np.float64)
        observation = featurize(
            graph, self.analytic, max_nodes=len(graph), max_edges=count_edges(graph)
        )
        items = [
            subgraph_data(
                observation["node_features"],
                observation["edge_index"],
                observation["edge_features"],
                candidate.site,
                self.rule_ids.get(candidate.rule.name, -1),
                hops=self.settings.hops,
                max_site_nodes=self.max_site_nodes,
            )
            for candidate in candidates
        ]
        with torch.inference_mode():
            return predict(self.model, items).astype(np.float64) / PERCENT

    def __repr__(self) -> str:
        return f"LearnedAdvantage({str(self.run_dir)!r}, hops={self.settings.hops})"


def load_guide(run_dir: str | Path) -> LearnedAdvantage:
    """The guide of `--method guided:RUN_DIR`; RlflowError if RUN_DIR holds no trained run."""
    return LearnedAdvantage(run_dir)


__all__ = ["LearnedAdvantage", "load_guide"]

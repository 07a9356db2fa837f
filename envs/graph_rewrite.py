"""GraphRewrite-v0: rewrite a model's graph one verified substitution at a time, for speed.

A thin gymnasium wrapper around `rlflow.rewrite.session.RewriteSession`: the session owns the
graph, its candidates and the action record; this module turns them into fixed-size padded
arrays, an action mask and the X-RLflow reward. It is longer than most modules (~740 lines) for
one reason: the env class carries Gymnasium's full documentation of its spaces, rewards, start
and arguments, a third of the file.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from rlflow.cost import (
    ORT_CONFIG_KEY,
    TARGET_KEY,
    AnalyticCostModel,
    Deployment,
    OrtSettings,
    PerOpCostModel,
    Runner,
)
from rlflow.cost.ort_optimizer import start_state
from rlflow.cost.table import TableCostModel
from rlflow.errors import RlflowError
from rlflow.graph import Graph, load_model
from rlflow.nn.features import (
    EDGE_FEATURES,
    GLOBAL_FEATURES,
    GLOBAL_MAX,
    NODE_FEATURES,
    count_edges,
    featurize,
    global_features,
)
from rlflow.rewrite import Candidate, RuleSet, default_ruleset
from rlflow.rewrite.session import EpisodeState, RewriteSession

COST_SOURCES = ("analytic", "perop", "e2e", "e2e-sparse", "perop-e2e")
MEASURED_COSTS = ("e2e", "e2e-sparse", "perop-e2e")
"""The cost sources that time graphs end to end (every step, or every `measure_every`)."""
TABLE_COST = "table:"
"""The prefix of a cost table's cost source: `table:NAME` (shipped) or `table:PATH`."""
REWARD_MEASURE_S = 0.5  # timed seconds per graph of an end-to-end reward measurement
DEFAULT_MODELS = ("squeezenet-1.1",)
DEFAULT_HORIZON = 50


class GraphRewriteEnv(gym.Env):
    """Make a neural network's computation graph faster by applying verified rewrites.

    Each step applies one candidate rewrite -- a (rule, site) pair of the rule set, already
    applied by `RewriteSession.candidates()` -- to the current graph, as in TASO, X-RLflow
    and RLFlow. The agent picks among the candidates through an action mask, or stops.
    `session` is the episode's RewriteSession, `current_graph()` its graph, and
    `episode_state()` the replayable record (`RewriteSession.replay(original, state)`).

    ## Action Space

    `Discrete(max_candidates + 1)`. Action `i < max_candidates` applies candidate `i` of the
    observation (`candidate_rules[i]` at `candidate_sites[i]`); action `max_candidates`
    stops the episode. `action_mask[i]` is 1 for the candidates on offer and for stop.

    An action whose mask entry is 0 (no candidate in that slot) is a no-op: the graph stays,
    the step counts, the reward is `-invalid_action_penalty` (0 by default) plus whatever the
    cost source says about the unchanged graph (0, except an e2e-sparse measurement), and
    `info["invalid_action"]` is True. An action outside the space raises RlflowError.

    Candidates whose result has more than `max_nodes` operators or more than `max_edges`
    edges are never offered. When more than `max_candidates` remain, a deterministic
    subset is kept: each rule's share is a round-robin over the rules in rule-set order (one
    slot to every rule that has a site, then a second, ...), so every rule with a site stays
    represented while space lasts, and a rule whose share is smaller than its site count
    keeps sites spread evenly over the graph, not its first ones; the kept candidates are
    then listed in the rule set's own order (rules in order, sites in graph order).

    ## Observation Space

    A `Dict` of fixed-size arrays, padded (N = max_nodes, M = max_edges,
    A = max_candidates, K = max_site_nodes; the feature names are the module constants
    NODE_FEATURES, EDGE_FEATURES and GLOBAL_FEATURES):

    - `node_features` (N, F) float32: one row per operator, in the graph's topological
      order (the order `candidate_sites` index): a one-hot op type over `OP_TYPES` plus an
      "other" slot, then `NODE_SCALARS` (log output size, output rank, analytic cost share,
      ...); all in [0, 1], zero rows in padding.
    - `node_mask` (N,) int8: 1 for real operators.
    - `edge_index` (2, M) int64: (producer, consumer) operator indices of each edge; 0 in
      padding.
    - `edge_features` (M, E) float32: the tensor on the edge, `EDGE_FEATURES` (log size,
      rank, log of its last dims, the consumer's input slot, float or not); in [0, 1].
    - `edge_mask` (M,) int8: 1 for real edges.
    - `global_features` (G,) float32: `GLOBAL_FEATURES` (cost now / original, analytic cost
      now / original, step fraction, ...); in [0, 10].
    - `candidate_rules` (A,) int64: the rule id of each candidate, an index into
      `rule_names` (the rule set's names in order); -1 in padding.
    - `candidate_sites` (A, K) int64: the operator indices of each candidate's site, anchor
      first, the first K of them; -1 in padding.
    - `action_mask` (A + 1,) int8: 1 for the candidates on offer; the last entry (stop) is
      always 1. The same array is in `info["action_mask"]`.

    Edges join operators only: a tensor read from a graph input or a constant is summed
    into the reader's features (`reads_input`, `const_inputs`, `log_const_numel`). A tensor
    read by k operators gives k edges; a node reading one tensor twice gets two edges.
    When a step reaches a graph already visited in the episode (same canonical hash, e.g.
    a rule and then its reverse), the episode continues from the first object seen with
    that hash, so node indices, candidate sites and a replay agree.

    ## Rewards

    X-RLflow's: r_t = 100 (C_{t-1} - C_t) / C_0, so an episode's return telescopes to
    100 (C_0 - C_T) / C_0, the percentage of the original cost saved. C comes from `cost`:

    - `"analytic"`: the roofline model (`AnalyticCostModel`), every step; cheap, noise-free.
    - `"perop"`: the per-op measured model (`PerOpCostModel`, TASO's), every step.
    - `"table:NAME"` or `"table:PATH"`: a cost table's per-op times, measured once on another
      device (a GPU's, `rlflow costs collect`), every step; operators it lacks are estimated
      by its fitted roofline (`rlflow.cost.table.TableCostModel`, `env.table_model.usage()`).
      A table of another provider than the one here (a GPU's on a CPU machine) makes graphs
      for that provider: episodes start from the original, with the rules it verified and
      none of the CPU's own layouts (`CostTable.made_elsewhere`).
    - `"e2e"`: the end-to-end latency measured in onnxruntime, every step: C_t is C_0 times
      the graph's ratio to the original, both timed interleaved in one run (the median of
      per-pair ratios, `Runner.compare`), and C_0 the original's median run. A reward thus
      compares ratios each measured in one run, never absolute times taken minutes apart
      under another load (docs/ARCHITECTURE.md, "Decisions"); each measurement times the
      original again.
    - `"e2e-sparse"`: X-RLflow's variant. C_t is measured end to end at reset, every
      `measure_every` steps, on the step that ends the episode (stop, no candidate left)
      and at the horizon; in between it is the last measurement scaled by the analytic cost's
      change since then. The reward of a measured step corrects the accumulated estimate, so
      the return is 100 (C_0 - C_T) / C_0 in measured terms.
    - `"perop-e2e"`: X-RLflow's scheme over the per-op model: "e2e-sparse" with the per-op
      measured cost (cached by operator signature) in place of the analytic one between the
      end-to-end checks. Offline, where per-op costs add up to the latency, it is what the
      learners train on.

    Measurements are made under one `Runner` (1 thread; `ort_level` online, the optimiser
    off offline) and cached by graph hash: `info["real_measurements"]` counts the graphs
    actually timed (onnxruntime sessions built; the original's counts too) since the env was
    made (the world-model work counts those and the real env steps).

    ## Starting State

    The original graph of one model of `models`: drawn uniformly with `self.np_random` at
    every reset, or chosen with `reset(options={"model": name_or_index})`.

    ## Episode End

    Terminated when the stop action is taken or when no candidate is left after a step.
    Truncated by `max_episode_steps` (50 as registered; gymnasium's TimeLimit).

    ## Arguments

    ```python
    import rlflow.envs  # registers rlflow/GraphRewrite-v0
    env = gymnasium.make("rlflow/GraphRewrite-v0", models=["resnet-18", "bert"], cost="analytic")
    ```

    - `models`: zoo names (`rlflow.zoo.MODEL_NAMES`, exported at `size`), paths to .onnx
      files, or Graph objects; default `["squeezenet-1.1"]`.
    - `size`: zoo model size, "small" (default), "medium" or "full".
    - `cost`: "analytic", "perop", "e2e", "e2e-sparse" or "perop-e2e" (see Rewards); default
      "perop" offline
      (each operator runs as written, so per-op costs add up to the graph's latency), else
      "analytic".
    - `measure_every`: steps between end-to-end measurements for "e2e-sparse" and
      "perop-e2e" (default 10).
    - `deploy`: "online" (default: graphs are measured under `ort_level`, onnxruntime's
      optimiser running over them) or "offline" (graphs run as written, optimiser off, as
      `rlflow optimize` hands them back: measurements and the per-op cost are then faithful
      to every rewrite; docs/ARCHITECTURE.md, "What rlflow hands back").
    - `ort_level`: onnxruntime optimisation level of measurements online, "all" (default) or
      another of `rlflow.cost.ORT_LEVELS`.
    - `provider`: where measurements run: "auto" (default: CUDA where onnxruntime has it),
      "cpu" or "cuda".
    - `start`: where episodes begin: "original" (default: the model as given) or one of
      onnxruntime's optimised graphs of it, "ort:all", "ort:extended", ...,
      "ort:all-SkipLayerNormFusion" (`rlflow.cost.ort_optimizer.start_state`), so that an
      agent begins where onnxruntime ends.
    - `ruleset`: the rules; default `default_ruleset(portable=portable)`.
    - `portable`: with the default rules, only those emitting standard ONNX (default False).
    - `max_nodes`, `max_edges`, `max_candidates`, `max_site_nodes`: the padded sizes (512,
      1024, 512, 4). A model larger than max_nodes or max_edges raises RlflowError at reset.
      At 128 slots, the default until 2026-11-27, ResNet-50 medium from onnxruntime's graph
      (186 candidates) was never offered the three sites where `nchwc-conv-unblock` gains, the
      last of its 52; Inception-v3's graph has 354 candidates.
    - `invalid_action_penalty`: subtracted from the reward of a masked action (default 0).
    - `revisit_penalty`: subtracted from the reward of a step that returns to a graph the
      episode has already visited (default 0: X-RLflow's reward). Such a step (a rule, then
      its reverse) costs nothing under the telescoping reward, so a policy may spend its
      horizon cycling; `info["revisits"]` counts the episode's revisits either way.
    - `mask_revisits`: withhold the candidates that lead back to a graph the episode has
      already visited (default False: X-RLflow offers every rewrite). Every graph reachable from
      the start stays reachable: the return telescopes, so a path through a cycle ends on the
      graph, with the return, of the same path with the cycle cut out, in fewer steps. What the
      mask takes away is a way back from a wrong turn within an episode. A charge
      (`revisit_penalty`) only discourages the cycles a policy still takes; the mask leaves none.
    - `horizon`: the episode length the step fraction and the last e2e-sparse measurement
      refer to; default the spec's `max_episode_steps` (set by `gymnasium.make`), else 50.
    - `runner`, `perop_model`: measurement objects to use instead of new ones (tests, or to
      share one cache between envs).
    - `render_mode`: None or "ansi" (a text summary).
    """

    metadata: dict[str, Any] = {"render_modes": ["ansi"], "render_fps": 4}

    def __init__(
        self,
        models: Sequence[str | Graph] | str | Graph | None = None,
        *,
        size: str = "small",
        cost: str | None = None,
        measure_every: int = 10,
        ort_level: str = "all",
        deploy: str = "online",
        provider: str = "auto",
        start: str = "original",
        ruleset: RuleSet | None = None,
        portable: bool = False,
        max_nodes: int = 512,
        max_edges: int = 1024,
        max_candidates: int = 512,
        max_site_nodes: int = 4,
        invalid_action_penalty: float = 0.0,
        revisit_penalty: float = 0.0,
        mask_revisits: bool = False,
        horizon: int | None = None,
        runner: Runner | None = None,
        perop_model: PerOpCostModel | None = None,
        render_mode: str | None = None,
    ) -> None:
        if cost is None:  # offline every operator runs as written: per-op costs add up
            cost = "perop" if deploy == "offline" else "analytic"
        if cost not in COST_SOURCES and not cost.startswith(TABLE_COST):
            raise RlflowError(
                f"unknown cost {cost!r}; choose one of {', '.join(COST_SOURCES)}, table:NAME "
                "or table:PATH"
            )
        if min(max_nodes, max_edges, max_candidates, max_site_nodes, measure_every) < 1:
            raise RlflowError(
                "max_nodes, max_edges, max_candidates, max_site_nodes and measure_every "
                "must be at least 1"
            )
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            raise RlflowError(f"unknown render mode {render_mode!r}; choose None or 'ansi'")
        if models is None:
            models = DEFAULT_MODELS
        elif isinstance(models, str | Graph):
            models = [models]
        if not models:
            raise RlflowError("models is empty: give at least one zoo name, path or Graph")
        self.models: list[str | Graph] = list(models)
        self.size = size
        self.cost = cost
        self.measure_every = measure_every
        self.ort_level = ort_level
        self.deployment = Deployment(deploy)
        self.start = start
        self.settings = settings = measurement_settings(ort_level, deploy, provider)
        """The onnxruntime settings measurements run under (offline: the optimiser off)."""
        self.table_model = (
            TableCostModel(cost[len(TABLE_COST) :]) if cost.startswith(TABLE_COST) else None
        )
        """The cost table of a `table:` cost (None otherwise)."""
        table = self.table_model.table if self.table_model is not None else None
        here = settings.resolved().provider
        if table is not None:
            table.check_start(start, here)  # a table made elsewhere starts from the original
        if ruleset is None:
            ruleset = _default_rules(portable)
            if table is not None and table.made_elsewhere(here):
                # Graphs for the table's provider: the rules it verified, not the CPU's own.
                ruleset = ruleset.select(names=table.rules, provider=table.provider)
        self.ruleset = ruleset
        self.rule_names: list[str] = self.ruleset.names
        self._rule_ids = {name: index for index, name in enumerate(self.rule_names)}
        self.max_nodes, self.max_edges = max_nodes, max_edges
        self.max_candidates, self.max_site_nodes = max_candidates, max_site_nodes
        self.invalid_action_penalty = invalid_action_penalty
        self.revisit_penalty = revisit_penalty
        self.mask_revisits = mask_revisits
        self.render_mode = render_mode
        self._horizon_arg = horizon

        self.analytic = AnalyticCostModel()
        needs_runner = cost in MEASURED_COSTS
        if runner is None and needs_runner:
            # A reward is measured on every (e2e) or every Nth (e2e-sparse) step: a fixed half
            # second of timed runs per graph, not the final measurements' adaptive 1-30 s.
            runner = Runner(settings, min_time_s=REWARD_MEASURE_S)
        self.runner = runner
        self.perop_model = perop_model
        self._owns_perop = cost in ("perop", "perop-e2e") and perop_model is None
        if self._owns_perop:
            self.perop_model = PerOpCostModel(settings, analytic=self.analytic)
        self.real_measurements = 0
        """End-to-end measurements actually made (cache misses) since the env was made."""

        self.action_space = spaces.Discrete(max_candidates + 1)
        self.observation_space = spaces.Dict(
            {
                "node_features": spaces.Box(
                    0.0, 1.0, (max_nodes, len(NODE_FEATURES)), dtype=np.float32
                ),
                "node_mask": spaces.MultiBinary(max_nodes),
                "edge_index": spaces.Box(0, max_nodes - 1, (2, max_edges), dtype=np.int64),
                "edge_features": spaces.Box(
                    0.0, 1.0, (max_edges, len(EDGE_FEATURES)), dtype=np.float32
                ),
                "edge_mask": spaces.MultiBinary(max_edges),
                "global_features": spaces.Box(
                    0.0, GLOBAL_MAX, (len(GLOBAL_FEATURES),), dtype=np.float32
                ),
                "candidate_rules": spaces.Box(
                    -1, max(len(self.rule_names) - 1, -1), (max_candidates,), dtype=np.int64
                ),
                "candidate_sites": spaces.Box(
                    -1, max_nodes - 1, (max_candidates, max_site_nodes), dtype=np.int64
                ),
                "action_mask": spaces.MultiBinary(max_candidates + 1),
            }
        )

        # Per model, loaded on first use: the graph and a root session whose candidate cache
        # keeps the original graph's candidates from one episode to the next.
        self._roots: dict[int, RewriteSession] = {}
        self._analytic_ms: dict[str, float] = {}
        self._measured_ms: dict[str, float] = {}
        self.session: RewriteSession | None = None
        self._model_index = 0
        self._steps = 0
        self._return = 0.0
        self._candidates: list[Candidate] = []
        self._offered: list[int] = []  # action slot -> index into self._candidates
        self._eligible = 0  # candidates within max_nodes / max_edges and the mask, before the cap
        self._visited: dict[str, Graph] = {}
        self._revisits = 0  # steps of the episode that returned to a graph already visited
        self._cost0 = self._cost_now = 1.0
        self._analytic0 = self._analytic_now = 1.0
        # e2e-sparse, perop-e2e: (last measured cost, the estimate between checks then)
        self._anchor = (1.0, 1.0)
        self._measured_now = False

    # ---- gymnasium API ----------------------------------------------------------------------

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        super().reset(seed=seed)
        options = options or {}
        if options.get("model") is not None:
            self._model_index = self._resolve_model(options["model"])
        else:
            self._model_index = int(self.np_random.integers(len(self.models)))
        root = self._root(self._model_index)
        self.session = root.fork()
        self._steps, self._return, self._revisits = 0, 0.0, 0
        self._visited = {root.original.canonical_hash(): root.original}
        self._refresh_candidates()

        original = self.session.original
        self._analytic0 = self._analytic_now = self._analytic_cost(original)
        if self.cost == "analytic":
            self._cost0 = self._analytic0
        elif self.cost == "perop":
            self._cost0 = self._perop_cost(original)
        elif self.table_model is not None:
            self._cost0 = self.table_model.cost_ms(original)
        else:
            self._cost0 = self._measured_cost(original)
            self._anchor = (self._cost0, self._between_checks_cost(original))
        self._cost_now = self._cost0
        self._measured_now = self.cost in MEASURED_COSTS
        return self._observation(), self._info(rule=None, invalid=False)

    def step(
        self, action: int | np.integer
    ) -> tuple[dict[str, np.ndarray], float, bool, bool, dict[str, Any]]:
        if self.session is None:
            raise RlflowError("call reset() before step()")
        if not self.action_space.contains(action):
            raise RlflowError(f"action {action!r} is outside Discrete({self.action_space.n})")
        slot = int(action)
        self._steps += 1
        rule: str | None = None
        invalid = revisit = False
        terminated = False
        if slot == self.max_candidates:
            terminated = True
        elif slot < len(self._offered):
            index = self._offered[slot]
            rule = self._candidates[index].rule.name
            self.session.apply(index)
            revisit = self._settle_on_first_seen_version()
            self._revisits += revisit
            self._refresh_candidates()
            terminated = not self._offered
        else:
            invalid = True
        reward = self._advance_cost(final=terminated)
        if invalid:
            reward -= self.invalid_action_penalty
        if revisit:
            reward -= self.revisit_penalty
        self._return += reward
        return self._observation(), reward, terminated, False, self._info(rule, invalid)

    def render(self) -> str | None:
        if self.render_mode != "ansi" or self.session is None:
            return None
        rules = sorted({self._candidates[i].rule.name for i in self._offered})
        return (
            f"{self.model_label(self._model_index)}: step {self._steps}, "
            f"{len(self.session.graph)} ops (was {len(self.session.original)}), "
            f"cost {self._cost_now:.4g} / {self._cost0:.4g} ms ({self.cost}), "
            f"return {self._return:.3f}, {len(self._offered)} candidates"
            + (f" of {self._eligible}" if self._eligible > len(self._offered) else "")
            + (f": {', '.join(rules)}" if rules else "")
        )

    def close(self) -> None:
        # A per-op model passed in may serve other envs too: only our own is closed.
        if self.perop_model is not None and self._owns_perop:
            self.perop_model.close()
            self.perop_model = None

    # ---- helpers for agents, searches and the world model -----------------------------------

    def current_graph(self) -> Graph:
        """The graph the episode is at."""
        if self.session is None:
            raise RlflowError("call reset() before current_graph()")
        return self.session.graph

    def episode_state(self) -> EpisodeState:
        """The episode so far as a replayable record (`RewriteSession.replay`), with its return."""
        if self.session is None:
            raise RlflowError("call reset() before episode_state()")
        return self.session.state(reward=self._return)

    def offered_candidates(self) -> list[Candidate]:
        """The candidates behind the action slots, in slot order."""
        return [self._candidates[index] for index in self._offered]

    def candidate_cost_changes(self, slots: Sequence[int]) -> np.ndarray:
        """(C(after) - C(now)) / C(now) of the candidates in `slots`, without stepping: the
        relative change in the env's cost that applying each would make (negative: faster).
        The targets of the learned local advantage (`rlflow collect --candidate-samples`).
        Only for the cost models (analytic, perop): timing every candidate end to end would
        take seconds per candidate."""
        if self.session is None:
            raise RlflowError("call reset() before candidate_cost_changes()")
        if self.cost not in ("analytic", "perop"):
            raise RlflowError(
                f"per-candidate cost changes need the analytic or perop cost, not {self.cost}"
            )
        offered = self.offered_candidates()
        cost_of = self._analytic_cost if self.cost == "analytic" else self._perop_cost
        changes = np.zeros(len(slots), dtype=np.float64)
        for position, slot in enumerate(slots):
            if not 0 <= slot < len(offered):
                raise RlflowError(f"slot {slot} holds no candidate ({len(offered)} offered)")
            after = cost_of(offered[slot].graph)
            changes[position] = (after - self._cost_now) / self._cost_now if self._cost_now else 0.0
        return changes

    def estimated_cost(self, graph: Graph) -> float:
        """The env's cost of `graph` without timing it end to end: its cost table, else its
        per-op model (offline, where per-op costs add up: the default), else the analytic
        cost; cached like the rewards'. What a controller ranks a rule's sites by
        (`rlflow.worldmodel.policy.cheapest_site`)."""
        if self.table_model is not None:
            return self.table_model.cost_ms(graph)
        if self.perop_model is not None:
            return self._perop_cost(graph)
        return self._analytic_cost(graph)

    def candidate_observations(self) -> list[dict[str, np.ndarray]]:
        """The observation arrays of each offered candidate's rewritten graph, in slot order:
        the graph part (`featurize`) and `global_features` as if the candidate were applied
        (its cost estimated by the analytic cost's change, no measurement made; the candidate
        counts are the current graph's, since the candidate's own are not enumerated). For
        scoring whole rewritten graphs, as X-RLflow does."""
        if self.session is None:
            raise RlflowError("call reset() before candidate_observations()")
        observations = []
        original_nodes = len(self.session.original)
        for candidate in self.offered_candidates():
            graph = candidate.graph
            observation = featurize(
                graph, self.analytic, max_nodes=self.max_nodes, max_edges=self.max_edges
            )
            analytic = self._analytic_cost(graph)
            change = analytic / self._analytic_now if self._analytic_now > 0 else 1.0
            observation["global_features"] = global_features(
                cost_ratio=self._cost_now * change / self._cost0 if self._cost0 > 0 else 1.0,
                analytic_ratio=analytic / self._analytic0 if self._analytic0 > 0 else 1.0,
                step_fraction=(self._steps + 1) / self._horizon(),
                node_ratio=len(graph) / original_nodes,
                candidate_fill=len(self._offered) / self.max_candidates,
                candidates_capped=self._eligible > len(self._offered),
                original_cost_ms=self._analytic0,
                node_fill=len(graph) / self.max_nodes,
            )
            observations.append(observation)
        return observations

    def model_label(self, index: int) -> str:
        """How model `index` is named in episode states and `reset(options={"model": ...})`."""
        model = self.models[index]
        return model.name if isinstance(model, Graph) else str(model)

    # ---- models -----------------------------------------------------------------------------

    def _resolve_model(self, choice: int | str) -> int:
        if isinstance(choice, int | np.integer) and not isinstance(choice, bool):
            if 0 <= int(choice) < len(self.models):
                return int(choice)
        elif isinstance(choice, str):
            for index in range(len(self.models)):
                if self.model_label(index) == choice:
                    return index
        labels = ", ".join(self.model_label(i) for i in range(len(self.models)))
        raise RlflowError(
            f"reset option model={choice!r} is neither an index below {len(self.models)} "
            f"nor one of the env's models: {labels}"
        )

    def _root(self, index: int) -> RewriteSession:
        root = self._roots.get(index)
        if root is None:
            graph = self._load(index)
            root = RewriteSession(graph, self.ruleset, model=self.model_label(index))
            self._roots[index] = root
        return root

    def _load(self, index: int) -> Graph:
        model = self.models[index]
        if isinstance(model, Graph):
            graph = model
        else:
            graph = load_model(_model_path(model, self.size))
        if self.start != "original" or self.deployment.mode == "offline":
            graph = start_state(graph, self.start, self.settings).graph
            if self.deployment.mode == "online":  # measured as onnxruntime would load it
                graph = graph.without_metadata((ORT_CONFIG_KEY, TARGET_KEY))
        label = self.model_label(index)
        if len(graph) > self.max_nodes:
            raise RlflowError(
                f"model {label} has {len(graph)} operators, more than max_nodes="
                f"{self.max_nodes}; raise max_nodes to at least {len(graph)}"
            )
        edges = count_edges(graph)
        if edges > self.max_edges:
            raise RlflowError(
                f"model {label} has {edges} edges, more than max_edges={self.max_edges}; "
                f"raise max_edges to at least {edges}"
            )
        return graph

    # ---- candidates -------------------------------------------------------------------------

    def _settle_on_first_seen_version(self) -> bool:
        """Stay on the first graph object seen with this hash in the episode; True when the
        episode had already visited this graph.

        Two paths to one hash can order the nodes differently, while the session caches
        candidates (whose sites are node indices) by hash: staying on the first version keeps
        the observed node order, the sites and a replay of the episode all in agreement.
        """
        assert self.session is not None
        graph = self.session.graph
        digest = graph.canonical_hash()
        first = self._visited.get(digest)
        if first is None:
            self._visited[digest] = graph
            return False
        self.session.graph = first  # may be `graph` itself: a cached candidate taken again
        return True

    def _refresh_candidates(self) -> None:
        assert self.session is not None
        self._candidates = self.session.candidates()
        # Candidate lists hold new weights (~1 MB a candidate on the full transformers), so the
        # shared cache keeps only the original's and the current's.
        keep = {self.session.original.canonical_hash(), self.session.graph.canonical_hash()}
        cache = self.session.cache
        for digest in [d for d in cache if d not in keep]:
            del cache[digest]
        eligible = [
            index
            for index, candidate in enumerate(self._candidates)
            if candidate.num_nodes <= self.max_nodes
            and self._fits_edges(candidate)
            and not (self.mask_revisits and candidate.graph_hash in self._visited)
        ]
        self._eligible = len(eligible)
        names = [self._candidates[index].rule.name for index in eligible]
        self._offered = [eligible[i] for i in capped_indices(names, self.max_candidates)]

    def _fits_edges(self, candidate: Candidate) -> bool:
        # Counting inputs is a cheap upper bound on edges, known without building the graph:
        # exact counts only near the limit.
        if candidate.num_inputs <= self.max_edges:
            return True
        return count_edges(candidate.graph) <= self.max_edges

    # ---- costs and reward -------------------------------------------------------------------

    def _advance_cost(self, final: bool) -> float:
        """Move C to the current graph and return the reward 100 (C_{t-1} - C_t) / C_0."""
        assert self.session is not None
        graph = self.session.graph
        self._analytic_now = self._analytic_cost(graph)
        self._measured_now = False
        if self.cost == "analytic":
            cost = self._analytic_now
        elif self.cost == "perop":
            cost = self._perop_cost(graph)
        elif self.table_model is not None:
            cost = self.table_model.cost_ms(graph)
        elif self.cost == "e2e":
            cost = self._measured_cost(graph)
            self._measured_now = True
        else:
            measure = (
                final or self._steps % self.measure_every == 0 or self._steps >= self._horizon()
            )
            estimate = self._between_checks_cost(graph)
            if measure:
                cost = self._measured_cost(graph)
                self._anchor = (cost, estimate)
                self._measured_now = True
            else:
                measured, estimate_then = self._anchor
                cost = measured * estimate / estimate_then if estimate_then > 0 else measured
        reward = 100.0 * (self._cost_now - cost) / self._cost0 if self._cost0 > 0 else 0.0
        self._cost_now = cost
        return float(reward)

    def _horizon(self) -> int:
        if self._horizon_arg is not None:
            return self._horizon_arg
        if self.spec is not None and self.spec.max_episode_steps:
            return int(self.spec.max_episode_steps)
        return DEFAULT_HORIZON

    def _analytic_cost(self, graph: Graph) -> float:
        digest = graph.canonical_hash()
        cost = self._analytic_ms.get(digest)
        if cost is None:
            cost = self.analytic.cost_ms(graph)
            self._analytic_ms[digest] = cost
        return cost

    def _between_checks_cost(self, graph: Graph) -> float:
        """What scales the last end-to-end measurement between checks: the per-op cost for
        "perop-e2e", the analytic one for "e2e-sparse"."""
        if self.cost == "perop-e2e":
            return self._perop_cost(graph)
        return self._analytic_cost(graph)

    def _perop_cost(self, graph: Graph) -> float:
        assert self.perop_model is not None
        return self.perop_model.cost_ms(graph)

    def _measured_cost(self, graph: Graph) -> float:
        """C_0 x the graph's ratio to the original in one interleaved run (see Rewards)."""
        assert self.runner is not None and self.session is not None
        digest = graph.canonical_hash()
        cost = self._measured_ms.get(digest)
        if cost is None:
            original = self.session.original
            is_original = digest == original.canonical_hash()
            original_ms = None if is_original else self._measured_cost(original)
            built = self.runner.sessions_built
            if original_ms is None:
                cost = self.runner.compare([original]).scaled_ms[0]  # C_0: its median run
            else:
                cost = original_ms * self.runner.compare([original, graph]).ratios[1]
            self.real_measurements += self.runner.sessions_built - built
            self._measured_ms[digest] = cost
        return cost

    # ---- observation ------------------------------------------------------------------------

    def _observation(self) -> dict[str, np.ndarray]:
        assert self.session is not None
        graph = self.session.graph
        observation = featurize(
            graph, self.analytic, max_nodes=self.max_nodes, max_edges=self.max_edges
        )
        observation["global_features"] = global_features(
            cost_ratio=self._cost_now / self._cost0 if self._cost0 > 0 else 1.0,
            analytic_ratio=self._analytic_now / self._analytic0 if self._analytic0 > 0 else 1.0,
            step_fraction=self._steps / self._horizon(),
            node_ratio=len(graph) / len(self.session.original),
            candidate_fill=len(self._offered) / self.max_candidates,
            candidates_capped=self._eligible > len(self._offered),
            original_cost_ms=self._analytic0,
            node_fill=len(graph) / self.max_nodes,
        )
        rules = np.full(self.max_candidates, -1, dtype=np.int64)
        sites = np.full((self.max_candidates, self.max_site_nodes), -1, dtype=np.int64)
        for slot, index in enumerate(self._offered):
            candidate = self._candidates[index]
            rules[slot] = self._rule_ids[candidate.rule.name]
            site = candidate.site[: self.max_site_nodes]
            sites[slot, : len(site)] = site
        observation["candidate_rules"] = rules
        observation["candidate_sites"] = sites
        observation["action_mask"] = self._action_mask()
        return observation

    def _action_mask(self) -> np.ndarray:
        mask = np.zeros(self.max_candidates + 1, dtype=np.int8)
        mask[: len(self._offered)] = 1
        mask[-1] = 1
        return mask

    def _info(self, rule: str | None, invalid: bool) -> dict[str, Any]:
        assert self.session is not None
        return {
            "model": self.model_label(self._model_index),
            "step": self._steps,
            "cost": self._cost_now,
            "original_cost": self._cost0,
            "speedup": self._cost0 / self._cost_now if self._cost_now > 0 else 1.0,
            "analytic_cost": self._analytic_now,
            "measured": self._measured_now,
            "graph_hash": self.session.graph.canonical_hash(),
            "num_nodes": len(self.session.graph),
            "rule": rule,
            "invalid_action": invalid,
            "revisits": self._revisits,
            "action_mask": self._action_mask(),
            "num_candidates": len(self._offered),
            "eligible_candidates": self._eligible,
            "real_measurements": self.real_measurements,
            "op_measurements": self.perop_model.measured_ops if self.perop_model else 0,
        }


# ---- pure functions (also used by tests and the featurisers of rlflow.nn) ------------------


def capped_indices(rule_names: Sequence[str], limit: int) -> list[int]:
    """Which of a candidate list (given by its rules' names, in rule-set order) to keep.

    Each rule's share is a round-robin over rules in order of first appearance (one slot to
    every rule with a site, then a second, ...) until `limit` are given out; a rule whose
    share is below its site count keeps sites spread evenly over its list (graph order), not
    its first ones, so no part of a large graph falls outside every slot (ResNet-50's gaining
    unblockings sit in its last stage). Returned in the list's own order.
    """
    if len(rule_names) <= limit:
        return list(range(len(rule_names)))
    by_rule: dict[str, list[int]] = {}
    for index, name in enumerate(rule_names):
        by_rule.setdefault(name, []).append(index)
    share = dict.fromkeys(by_rule, 0)
    given = 0
    for rank in itertools.count():
        for name, indices in by_rule.items():
            if rank < len(indices) and given < limit:
                share[name] += 1
                given += 1
        if given == limit:
            break
    chosen: list[int] = []
    for name, indices in by_rule.items():
        count, kept = len(indices), share[name]
        # The midpoints of `kept` equal parts of the rule's sites: 1 of 3 is the middle one.
        chosen += [indices[(2 * part + 1) * count // (2 * kept)] for part in range(kept)]
    return sorted(chosen)


def measurement_settings(ort_level: str, deploy: str, provider: str = "auto") -> OrtSettings:
    """The onnxruntime settings an env of these arguments measures under: one thread on
    `provider`, and offline the optimiser off (graphs run as written). Ray's timer actors
    measure for envs in other processes under the same settings (`rlflow.agents.ray_workers`)."""
    settings = OrtSettings(threads=1, ort_level=ort_level, provider=provider)
    deployment = Deployment(deploy)
    return deployment.settings(settings) if deployment.mode == "offline" else settings


@functools.cache
def _default_rules(portable: bool) -> RuleSet:
    """The verified rules, loaded once per process: every env then shares the Rule objects."""
    return default_ruleset(portable=portable)


def _model_path(model: str, size: str) -> Path:
    """A zoo name's cached export, or the file (`rlflow.zoo.MODEL_RULE`, as every command)."""
    from rlflow import zoo

    return zoo.model_path(model, size)

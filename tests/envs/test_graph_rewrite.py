"""GraphRewrite-v0: gymnasium's checker, seeded determinism, replay, multi-graph draws, the
candidate cap, and rewards that telescope (analytic) or add up to the measured saving."""

from __future__ import annotations

import json

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

import rlflow.envs
from rlflow.cost import OrtSettings, PerOpCostModel, Runner
from rlflow.envs.graph_rewrite import GraphRewriteEnv, capped_indices
from rlflow.errors import RlflowError
from rlflow.nn.features import EDGE_FEATURES, GLOBAL_FEATURES, NODE_FEATURES, graph_edges
from rlflow.rewrite.session import EpisodeState, RewriteSession

SMALL = "resnet-18"  # 41 operators, 16 candidates from 3 rules


def fast_runner() -> Runner:
    """A Runner timing a few runs only: these tests check bookkeeping, not latency."""
    return Runner(OrtSettings(threads=1), warmup=1, runs=3, block=1, min_time_s=0.0)


def masked_random_action(obs: dict[str, np.ndarray], rng: np.random.Generator) -> int:
    """A uniformly drawn candidate, or stop when there is none."""
    offered = np.flatnonzero(obs["action_mask"][:-1])
    if offered.size == 0:
        return len(obs["action_mask"]) - 1
    return int(rng.choice(offered))


def run_episode(env: gym.Env, seed: int, steps: int, action_seed: int = 0) -> list:
    """Reset with `seed` and take up to `steps` masked-random actions; the transitions."""
    rng = np.random.default_rng(action_seed)
    obs, info = env.reset(seed=seed)
    transitions = [(obs, 0.0, False, info)]
    for _ in range(steps):
        obs, reward, terminated, truncated, info = env.step(masked_random_action(obs, rng))
        transitions.append((obs, reward, terminated, info))
        if terminated or truncated:
            break
    return transitions


# ---- registration and gymnasium's checker ----------------------------------------------------


def test_import_registers_the_env_and_make_applies_the_time_limit():
    assert rlflow.envs.GRAPH_REWRITE_ID in gym.registry
    spec = gym.spec("rlflow/GraphRewrite-v0")
    assert spec.entry_point == "rlflow.envs.graph_rewrite:GraphRewriteEnv"
    assert spec.max_episode_steps == rlflow.envs.MAX_EPISODE_STEPS
    env = gym.make("rlflow/GraphRewrite-v0", models=[SMALL], max_episode_steps=3)
    obs, info = env.reset(seed=0)
    assert env.observation_space.contains(obs)
    assert info["model"] == SMALL and info["num_candidates"] > 0
    truncated = False
    for _ in range(3):
        obs, _, terminated, truncated, _ = env.step(int(np.flatnonzero(obs["action_mask"])[0]))
        assert not terminated
    assert truncated
    env.close()


@pytest.mark.parametrize(
    "kwargs",
    [
        {},  # the registered defaults: squeezenet-1.1, analytic
        {"models": [SMALL], "cost": "e2e-sparse", "measure_every": 2},
        {"models": [SMALL], "cost": "e2e"},
        {"models": [SMALL], "cost": "perop"},
        {"models": [SMALL, "squeezenet-1.1"], "max_candidates": 4, "portable": True},
    ],
    ids=["defaults", "e2e-sparse", "e2e", "perop", "two-models-capped-portable"],
)
@pytest.mark.filterwarnings("ignore:.*alternative render modes")  # the unregistered perop env
def test_check_env_passes(kwargs, tmp_path):
    if kwargs.get("cost") in ("e2e", "e2e-sparse"):
        kwargs = {**kwargs, "runner": fast_runner()}
    if kwargs.get("cost") == "perop":
        # A sqlite connection cannot go through gymnasium's deepcopy of a spec's kwargs, and
        # the test must not write the user's cache: this one is checked unregistered.
        perop = PerOpCostModel(OrtSettings(threads=1), cache_path=tmp_path / "p.sqlite", runs=2)
        env = GraphRewriteEnv(**kwargs, perop_model=perop)
    else:
        env = gym.make("rlflow/GraphRewrite-v0", **kwargs).unwrapped
    check_env(env)
    env.close()


def test_the_observation_follows_the_documented_layout():
    env = GraphRewriteEnv([SMALL], max_nodes=64, max_edges=160, max_candidates=32)
    obs, info = env.reset(seed=0)
    graph = env.current_graph()
    nodes, edges = len(graph), graph_edges(graph)
    assert obs["node_features"].shape == (64, len(NODE_FEATURES))
    assert obs["edge_features"].shape == (160, len(EDGE_FEATURES))
    assert obs["global_features"].shape == (len(GLOBAL_FEATURES),)
    assert obs["node_mask"].sum() == nodes and obs["node_mask"][:nodes].all()
    assert obs["edge_mask"].sum() == len(edges)
    # One-hot op types: exactly one per real node, none in padding.
    one_hot = obs["node_features"][:, : NODE_FEATURES.index("op=other") + 1]
    assert (one_hot[:nodes].sum(axis=1) == 1).all() and one_hot[nodes:].sum() == 0
    conv = NODE_FEATURES.index("op=Conv")
    assert one_hot[:nodes, conv].sum() == graph.op_counts()["Conv"]
    producers, consumers = obs["edge_index"][:, : len(edges)]
    assert [(int(p), int(c)) for p, c in zip(producers, consumers)] == [e[:2] for e in edges]
    assert (producers < consumers).all()  # topological order
    assert (obs["edge_index"][:, len(edges) :] == 0).all()
    # Cost shares add up to one; the globals start at ratio 1, step 0.
    share = obs["node_features"][:nodes, NODE_FEATURES.index("cost_share")]
    assert share.sum() == pytest.approx(1.0, rel=1e-4)
    globals_ = dict(zip(GLOBAL_FEATURES, obs["global_features"]))
    assert globals_["cost_ratio"] == 1.0 and globals_["step_fraction"] == 0.0
    # Candidates: a rule id per slot, the site within the graph, anchor first.
    count = info["num_candidates"]
    assert (obs["candidate_rules"][:count] >= 0).all() and (
        obs["candidate_rules"][count:] == -1
    ).all()
    for slot, candidate in enumerate(env.offered_candidates()):
        assert env.rule_names[obs["candidate_rules"][slot]] == candidate.rule.name
        site = obs["candidate_sites"][slot]
        assert tuple(site[site >= 0]) == candidate.site[: env.max_site_nodes]
        assert site[0] >= 0 and (site < nodes).all()
    assert (obs["candidate_sites"][count:] == -1).all()
    assert obs["action_mask"].sum() == count + 1 and obs["action_mask"][-1] == 1
    assert np.array_equal(info["action_mask"], obs["action_mask"])


# ---- determinism, replay, multi-graph --------------------------------------------------------


def test_same_seed_and_actions_give_identical_episodes():
    first = run_episode(GraphRewriteEnv([SMALL, "squeezenet-1.1"]), seed=7, steps=12)
    second = run_episode(GraphRewriteEnv([SMALL, "squeezenet-1.1"]), seed=7, steps=12)
    assert len(first) == len(second) > 5
    for (obs_a, reward_a, _, info_a), (obs_b, reward_b, _, info_b) in zip(first, second):
        assert reward_a == reward_b
        assert info_a["graph_hash"] == info_b["graph_hash"]
        for key in obs_a:
            assert np.array_equal(obs_a[key], obs_b[key]), key


def test_an_episode_replays_to_its_final_hash():
    env = GraphRewriteEnv(["squeezenet-1.1"])
    transitions = run_episode(env, seed=3, steps=15, action_seed=5)
    state = env.episode_state()
    assert len(state.actions) == len(transitions) - 1
    assert state.reward == pytest.approx(sum(t[1] for t in transitions))
    restored = EpisodeState.from_json(json.loads(json.dumps(state.to_json())))
    replayed = RewriteSession.replay(env.session.original, restored, env.ruleset)
    assert replayed.graph.canonical_hash() == transitions[-1][3]["graph_hash"] == state.final_hash


def test_models_are_drawn_by_seed_or_picked_by_option():
    env = GraphRewriteEnv([SMALL, "squeezenet-1.1"])
    drawn = {env.reset(seed=seed)[1]["model"] for seed in range(12)}
    assert drawn == {SMALL, "squeezenet-1.1"}
    for seed in range(4):
        assert env.reset(seed=seed, options={"model": "squeezenet-1.1"})[1]["model"] == (
            "squeezenet-1.1"
        )
        assert env.reset(seed=seed, options={"model": 0})[1]["model"] == SMALL
    with pytest.raises(RlflowError, match="not-a-model"):
        env.reset(options={"model": "not-a-model"})


def test_a_model_larger_than_the_padding_is_refused_with_the_limit_to_raise():
    with pytest.raises(RlflowError, match="raise max_nodes to at least 41"):
        GraphRewriteEnv([SMALL], max_nodes=16).reset(seed=0)
    with pytest.raises(RlflowError, match="raise max_edges"):
        GraphRewriteEnv([SMALL], max_edges=16).reset(seed=0)


# ---- actions ---------------------------------------------------------------------------------


def test_capped_indices_share_slots_round_robin_and_spread_each_rules_sites():
    names = ["a", "a", "a", "b", "b", "c"]
    assert capped_indices(names, 10) == list(range(6))
    # One slot each: the middle of a's three sites, the second of b's two, c's one.
    assert capped_indices(names, 3) == [1, 4, 5]
    # a gets a second slot: its first and last sites, not its first two.
    assert capped_indices(names, 4) == [0, 2, 4, 5]
    assert capped_indices(names, 1) == [1]


def test_capped_indices_reach_a_rules_last_sites():
    # ResNet-50's case: 52 sites of one rule among many candidates of others, few slots
    # left for it; its kept sites span its whole list, the last quarter included.
    names = ["unblock"] * 52 + ["other"] * 200
    kept = [i for i in capped_indices(names, 60) if names[i] == "unblock"]
    assert len(kept) == 30 and len(set(kept)) == 30
    assert kept[0] < 2 and kept[-1] >= 50
    assert max(b - a for a, b in zip(kept, kept[1:], strict=False)) <= 2


def test_the_candidate_cap_keeps_a_deterministic_subset_covering_several_rules():
    env = GraphRewriteEnv(["squeezenet-1.1"], max_candidates=3)
    obs, info = env.reset(seed=0)
    assert info["eligible_candidates"] > 3 == info["num_candidates"]
    rules = obs["candidate_rules"]
    assert len(set(rules.tolist())) > 1
    assert obs["action_mask"][:-1].sum() == info["num_candidates"] == 3
    assert obs["global_features"][GLOBAL_FEATURES.index("candidates_capped")] == 1.0
    again, _ = GraphRewriteEnv(["squeezenet-1.1"], max_candidates=3).reset(seed=1)
    assert np.array_equal(again["candidate_rules"], rules)
    assert np.array_equal(again["candidate_sites"], obs["candidate_sites"])
    # The slots follow the full list's order: one site of each of the first three rules.
    full = env.session.candidates()
    rules_in_order = list(dict.fromkeys(candidate.rule.name for candidate in full))
    assert [c.rule.name for c in env.offered_candidates()] == rules_in_order[:3]


def test_a_masked_action_is_a_no_op_and_stop_terminates():
    env = GraphRewriteEnv([SMALL], max_candidates=64)
    obs, info = env.reset(seed=0)
    masked = int(np.flatnonzero(obs["action_mask"] == 0)[0])
    obs2, reward, terminated, truncated, info2 = env.step(masked)
    assert info2["invalid_action"] and info2["rule"] is None
    assert reward == 0.0 and not terminated and not truncated
    assert info2["graph_hash"] == info["graph_hash"] and info2["step"] == 1
    with pytest.raises(RlflowError, match="outside"):
        env.step(env.action_space.n)
    _, reward, terminated, _, info3 = env.step(env.max_candidates)
    assert terminated and reward == 0.0 and info3["rule"] is None


def test_candidates_over_the_node_limit_are_not_offered():
    env = GraphRewriteEnv([SMALL], max_nodes=41)
    _, info = env.reset(seed=0)
    assert len(env.current_graph()) == 41
    assert all(len(c.graph) <= 41 for c in env.offered_candidates())
    # Splitting resnet-18's Gemm into MatMul + Add adds an operator: withheld, not offered.
    assert any(len(c.graph) > 41 for c in env.session.candidates())
    assert info["eligible_candidates"] == info["num_candidates"] < len(env.session.candidates())
    assert env.step(0)[4]["num_nodes"] <= 41


# ---- rewards ---------------------------------------------------------------------------------


def test_analytic_rewards_telescope_to_the_saved_percentage():
    env = GraphRewriteEnv(["squeezenet-1.1"])
    transitions = run_episode(env, seed=0, steps=20, action_seed=2)
    info = transitions[-1][3]
    total = sum(t[1] for t in transitions)
    assert total == pytest.approx(
        100 * (info["original_cost"] - info["cost"]) / info["original_cost"]
    )
    assert info["cost"] == pytest.approx(env.analytic.cost_ms(env.current_graph()))
    assert info["speedup"] == pytest.approx(info["original_cost"] / info["cost"])
    assert info["real_measurements"] == 0


def step_back_to_the_start(env: GraphRewriteEnv) -> tuple[list[float], list[dict]]:
    """From a fresh episode: a rewrite, one that returns to the start graph (a rule and its
    reverse), and the first rewrite again; the three rewards and infos."""
    _, info = env.reset(seed=0)
    start = info["graph_hash"]
    for slot in range(info["num_candidates"]):
        first_reward, first = env.step(slot)[1::3]
        offered = env.offered_candidates()
        back = [s for s, c in enumerate(offered) if c.graph.canonical_hash() == start]
        if back:
            back_reward, returned = env.step(back[0])[1::3]
            again_reward, again = env.step(slot)[1::3]  # the start's cached candidate again
            return [first_reward, back_reward, again_reward], [first, returned, again]
        env.reset(seed=0)
    raise AssertionError("no rewrite of the start graph has its reverse on offer")


def test_a_step_back_to_a_visited_graph_is_counted_and_charged_the_revisit_penalty():
    free_rewards, free_infos = step_back_to_the_start(GraphRewriteEnv([SMALL]))
    charged = GraphRewriteEnv([SMALL], revisit_penalty=0.25)
    rewards, infos = step_back_to_the_start(charged)
    assert [info["revisits"] for info in infos] == [0, 1, 2]
    assert [info["revisits"] for info in free_infos] == [0, 1, 2]
    assert infos[2]["graph_hash"] == infos[0]["graph_hash"] != infos[1]["graph_hash"]
    # X-RLflow's reward telescopes, so a rule and its reverse sum to zero; the penalty is
    # taken off each revisit and nothing else.
    assert sum(free_rewards[:2]) == pytest.approx(0.0, abs=1e-9)
    assert rewards[0] == pytest.approx(free_rewards[0])
    assert rewards[1:] == pytest.approx([reward - 0.25 for reward in free_rewards[1:]])
    assert charged.reset(seed=0)[1]["revisits"] == 0


def test_masking_revisits_withholds_exactly_the_candidates_back_to_a_visited_graph():
    free, masked = GraphRewriteEnv([SMALL]), GraphRewriteEnv([SMALL], mask_revisits=True)
    free.reset(seed=0)
    _, info = masked.reset(seed=0)
    visited, withheld = {info["graph_hash"]}, 0
    rng = np.random.default_rng(0)
    for _ in range(12):
        every = [candidate.graph_hash for candidate in free.offered_candidates()]
        offered = [candidate.graph_hash for candidate in masked.offered_candidates()]
        assert offered == [digest for digest in every if digest not in visited]
        withheld += len(every) - len(offered)
        slot = int(rng.integers(len(offered)))
        free.step(every.index(offered[slot]))  # both envs walk the same path
        _, _, terminated, _, info = masked.step(slot)
        assert info["revisits"] == 0 and info["graph_hash"] not in visited
        visited.add(info["graph_hash"])
        if terminated:
            break
    assert withheld > 0  # the walk met rewrites back (a rule's reverse) and none was offered


def test_e2e_sparse_measures_every_n_steps_and_the_return_is_the_measured_saving():
    runner = fast_runner()
    env = GraphRewriteEnv([SMALL], cost="e2e-sparse", measure_every=3, runner=runner)
    rng = np.random.default_rng(0)
    obs, info = env.reset(seed=0)
    assert info["measured"] and info["real_measurements"] == 1
    total, measured_steps = 0.0, []
    for step in range(1, 6):
        obs, reward, terminated, _, info = env.step(masked_random_action(obs, rng))
        total += reward
        if info["measured"]:
            measured_steps.append(step)
        if terminated:
            break
    if not terminated:  # stop: the last step is measured and corrects the estimate
        obs, reward, terminated, _, info = env.step(env.max_candidates)
        total += reward
        measured_steps.append(info["step"])
    assert measured_steps[0] == 3 and info["measured"] and terminated
    # C_0 is the original's median run; C_T is C_0 x the final graph's ratio to the original,
    # both timed interleaved in one run (cache hits: the env measured them).
    original = env.session.original
    original_ms = runner.compare([original]).scaled_ms[0]
    final_ms = original_ms * runner.compare([original, env.current_graph()]).ratios[1]
    assert info["original_cost"] == original_ms and info["cost"] == pytest.approx(final_ms)
    assert total == pytest.approx(100 * (original_ms - final_ms) / original_ms)
    # One session for the original at reset, two (original again, graph) per measured step.
    assert 1 < info["real_measurements"] <= 1 + 2 * len(measured_steps)
    assert info["real_measurements"] == runner.sessions_built


def test_perop_e2e_scales_the_last_check_by_the_per_op_cost_between_checks(tmp_path):
    runner = fast_runner()
    perop = PerOpCostModel(OrtSettings(threads=1), cache_path=tmp_path / "p.sqlite", runs=2)
    env = GraphRewriteEnv(
        [SMALL], cost="perop-e2e", measure_every=2, runner=runner, perop_model=perop
    )
    rng = np.random.default_rng(0)
    obs, info = env.reset(seed=0)
    assert info["measured"] and info["original_cost"] == info["cost"]
    anchor = (info["cost"], perop.cost_ms(env.current_graph()))
    for _ in range(4):
        obs, _, terminated, _, info = env.step(masked_random_action(obs, rng))
        now = perop.cost_ms(env.current_graph())
        if info["measured"]:
            anchor = (info["cost"], now)
        else:  # between checks: the last measurement, moved as the per-op cost moved
            assert info["cost"] == pytest.approx(anchor[0] * now / anchor[1])
        if terminated:
            break
    assert info["step"] >= 2 and info["real_measurements"] >= 2
    env.close()


def test_render_ansi_summarises_the_episode():
    env = GraphRewriteEnv([SMALL], render_mode="ansi")
    env.reset(seed=0)
    text = env.render()
    assert text.startswith(f"{SMALL}: step 0") and "candidates" in text

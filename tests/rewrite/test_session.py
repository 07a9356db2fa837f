"""RewriteSession: apply, candidates, fork independence, JSON round trip, replay, tampering."""

from __future__ import annotations

import json

import pytest

from rlflow.errors import RlflowError
from rlflow.graph import Graph, load_model
from rlflow.rewrite import default_ruleset
from rlflow.rewrite.session import Action, EpisodeState, RewriteSession
from rlflow.zoo import cached_path


@pytest.fixture(scope="module")
def ruleset():
    return default_ruleset()


@pytest.fixture(scope="module")
def resnet():
    return load_model(cached_path("resnet-18", "small"))


def _walk(session: RewriteSession, steps: int) -> None:
    """Apply the last candidate a few times (a deterministic, non-trivial path)."""
    for _ in range(steps):
        candidates = session.candidates()
        if not candidates:
            break
        session.apply(len(candidates) - 1)


def test_apply_records_the_action_and_moves_the_graph(resnet, ruleset):
    session = RewriteSession(resnet, ruleset, model="resnet-18:small")
    assert session.max_ops == 2 * len(resnet)
    candidates = session.candidates()
    assert candidates, "resnet-18 should have rewrites"
    assert session.candidates() is candidates  # cached by hash
    chosen = candidates[0]
    graph = session.apply(0)
    assert graph is chosen.graph is session.graph
    assert session.original is resnet
    assert session.actions == [Action(chosen.rule.name, chosen.site, graph.canonical_hash())]
    with pytest.raises(IndexError):
        session.apply(len(session.candidates()))


def test_fork_is_independent_and_shares_the_cache(resnet, ruleset):
    session = RewriteSession(resnet, ruleset)
    session.apply(0)
    fork = session.fork()
    assert fork.cache is session.cache
    assert fork.graph is session.graph and fork.actions == session.actions
    fork.apply(0)
    assert len(fork.actions) == 2 and len(session.actions) == 1
    assert fork.graph is not session.graph
    # A candidate list computed through the fork is reused by the parent.
    computed = fork.candidates()
    assert session.cache[fork.graph.canonical_hash()] == (fork.graph, computed)
    assert session.candidates(fork.graph) is computed


def test_episode_saved_to_json_replays_to_the_same_hash(resnet, ruleset):
    session = RewriteSession(resnet, ruleset, model="resnet-18:small")
    _walk(session, 4)
    assert len(session.actions) == 4
    state = session.state(reward=1.5)
    loaded = EpisodeState.from_json(json.loads(json.dumps(state.to_json())))
    assert loaded == state
    replayed = RewriteSession.replay(resnet, loaded, ruleset)
    assert replayed.graph.canonical_hash() == state.final_hash == session.graph.canonical_hash()
    assert replayed.actions == session.actions
    report = replayed.validate()
    assert report.equivalent, report.reason


def test_tampered_state_fails_replay_naming_the_step(resnet, ruleset):
    session = RewriteSession(resnet, ruleset)
    _walk(session, 3)
    data = session.state().to_json()

    bad_hash = json.loads(json.dumps(data))
    bad_hash["actions"][1]["graph_hash"] = "0" * 64
    with pytest.raises(RlflowError, match="step 2 .*gave hash"):
        RewriteSession.replay(resnet, EpisodeState.from_json(bad_hash), ruleset)

    bad_rule = json.loads(json.dumps(data))
    bad_rule["actions"][2]["rule"] = "no-such-rule"
    with pytest.raises(RlflowError, match="step 3 .*no-such-rule.*not a candidate"):
        RewriteSession.replay(resnet, EpisodeState.from_json(bad_rule), ruleset)

    # A site is only a locator: a step whose result hash is right still replays.
    moved_site = json.loads(json.dumps(data))
    moved_site["actions"][2]["site"] = [10_000]
    replayed = RewriteSession.replay(resnet, EpisodeState.from_json(moved_site), ruleset)
    assert replayed.graph.canonical_hash() == data["final_hash"]

    bad_final = json.loads(json.dumps(data))
    bad_final["final_hash"] = "f" * 64
    with pytest.raises(RlflowError, match="final hash"):
        RewriteSession.replay(resnet, EpisodeState.from_json(bad_final), ruleset)

    other_model = load_model(cached_path("resnet-50", "small"))
    with pytest.raises(RlflowError, match="original"):
        RewriteSession.replay(other_model, EpisodeState.from_json(data), ruleset)

    with pytest.raises(RlflowError, match="malformed"):
        EpisodeState.from_json({"actions": []})


def test_empty_episode_replays_to_the_original(resnet, ruleset):
    state = RewriteSession(resnet, ruleset, model="m").state()
    assert state.actions == [] and state.final_hash == state.original_hash
    assert RewriteSession.replay(resnet, state, ruleset).graph is resnet


def _reordered(graph: Graph) -> Graph:
    """The same graph (same hash) with two independent adjacent nodes swapped."""
    nodes = list(graph.nodes)
    for i in range(len(nodes) - 1):
        if not set(nodes[i].outputs) & set(nodes[i + 1].inputs):
            nodes[i], nodes[i + 1] = nodes[i + 1], nodes[i]
            break
    else:
        raise AssertionError("no independent adjacent nodes")
    return Graph(
        nodes,
        graph.inputs,
        graph.outputs,
        graph.initializers,
        dict(graph.values),
        graph.opset,
        graph.metadata,
        graph.name,
        graph.ir_version,
        graph.functions,
    )


def test_another_node_order_of_the_same_graph(resnet, ruleset):
    """Two paths can reach one hash with the nodes in different orders; sites are node
    indices. The session keeps to the version its cached sites index, and replay finds a step
    by its rule and result hash when the recorded site indexes the other order."""
    other = _reordered(resnet)
    assert other.canonical_hash() == resnet.canonical_hash()
    assert [n.op_type for n in other.nodes] != [n.op_type for n in resnet.nodes] or any(
        a is not b for a, b in zip(other.nodes, resnet.nodes)
    )

    session = RewriteSession(resnet, ruleset)
    session.candidates()
    moved = RewriteSession(other, ruleset, _cache=session.cache)
    assert moved.candidates() is session.candidates()
    assert moved.graph is resnet  # now on the version the sites index

    # Its own cache: sites index `other`'s order. The portable rules' last candidates (kernel
    # enlargements, Winograd left out) go through the swapped nodes; the NCHWc rules' would not.
    standard = ruleset.select(portable=True)
    portable = standard.select(names=[r.name for r in standard if r.name != "conv-winograd"])
    recorded = RewriteSession(other, portable)
    _walk(recorded, 3)
    replayed = RewriteSession.replay(resnet, recorded.state(), portable)
    assert replayed.graph.canonical_hash() == recorded.graph.canonical_hash()
    assert [a.graph_hash for a in replayed.actions] == [a.graph_hash for a in recorded.actions]
    # The walk went through the swapped nodes, so some site was found by its result hash.
    assert [a.site for a in replayed.actions] != [a.site for a in recorded.actions]

"""`--backend ray` on a real two-node Ray cluster (two raylets on this machine, each offering
one `rlflow_timer`, as two timing machines would): a collect reached through the cluster's
address writes the in-process shards, and its measurements go to one timer actor per node,
both of which serve."""

from __future__ import annotations

import pytest
import ray
from ray.cluster_utils import Cluster

from rlflow.agents.ray_workers import TIMER_NAME, TIMER_RESOURCE
from rlflow.worldmodel.collect import CollectSettings, collect
from tests.agents.test_ray_backend import assert_same_shards


@pytest.fixture
def two_nodes():
    cluster = Cluster()
    for _ in range(2):
        cluster.add_node(num_cpus=1, resources={TIMER_RESOURCE: 1}, include_dashboard=False)
    cluster.wait_for_nodes()
    yield cluster
    ray.shutdown()
    cluster.shutdown()


def test_measurements_go_to_one_timer_per_node(tmp_path, two_nodes) -> None:
    settings = CollectSettings(
        models=["resnet-18"], episodes=4, episodes_per_shard=1, cost="perop", max_episode_steps=3
    )
    # In process first, so that every operator is in the per-op cache the timers read too.
    collect(settings, tmp_path / "here", progress=False)
    collect(
        settings, tmp_path / "ray", progress=False, backend="ray", ray_address=two_nodes.address
    )
    assert_same_shards(tmp_path / "here", tmp_path / "ray")
    timers = [ray.get_actor(TIMER_NAME.format(index=index)) for index in range(2)]
    nodes = {ray.get(timer.node_id.remote()) for timer in timers}
    assert nodes == {node["NodeID"] for node in ray.nodes() if node["Alive"]}  # one each
    assert all(ray.get(timer.served.remote()) > 0 for timer in timers)  # both measured

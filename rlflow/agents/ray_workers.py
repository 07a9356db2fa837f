"""Ray for more than one machine: env workers as actors, latency measured by timer actors.

Rollouts scale out; timing must not. Every env (a PPO vector env's, or a `collect` shard's)
can run in any Ray worker, but its latency measurements (the per-op model's operator timings
and the end-to-end checks) go to a *timer actor*: one per machine that offers the custom
resource `rlflow_timer` (`ray start --resources '{"rlflow_timer": 1}'`), holding that one
unit for its whole life, so one measurement at a time runs per machine, on the hardware the
timing nodes were chosen for. An env keeps one timer for all its measurements, so a reward's
ratios are never mixed across machines. The timers cache as the in-process models do
(per-op timings on disk by operator signature, on their own machine).

`init` connects to a cluster (`address`, or `RAY_ADDRESS`), else starts a local Ray whose
node offers one `rlflow_timer`. In-process stays the default everywhere; Ray is the optional
extra `pip install 'rlflow[ray]'`.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.utils import batch_space, concatenate, create_empty_array

from rlflow.errors import RlflowError

TIMER_RESOURCE = "rlflow_timer"
"""The custom resource a timing machine offers, one unit per machine."""
TIMER_NAME = "rlflow-timer-{index}"


def require_ray() -> Any:
    """The `ray` module; RlflowError saying how to install it when it is missing."""
    try:
        import ray
    except ImportError:
        raise RlflowError(
            "--backend ray needs Ray: pip install 'rlflow[ray]' (or pip install ray)"
        ) from None
    return ray


def check_address(address: str | None, timeout_s: float = 5.0) -> None:
    """RlflowError unless `HOST:PORT` accepts a connection within `timeout_s`: Ray itself
    retries an unreachable address for minutes. Other forms (`auto`, `ray://...`) are left to
    Ray, which fails fast on them."""
    import socket

    host, _, port = (address or "").rpartition(":")
    if not host or not port.isdigit() or "://" in address:
        return
    try:
        socket.create_connection((host, int(port)), timeout=timeout_s).close()
    except OSError as error:
        raise RlflowError(
            f"cannot reach Ray at {address} ({error.strerror or error}); start the cluster "
            "with `ray start --head` there, or drop --ray-address for a local Ray"
        ) from None


def init(address: str | None = None) -> Any:
    """Ray, connected: to the running session if there is one, to `address` (or the
    `RAY_ADDRESS` environment variable, as Ray reads it) if given, else a new local Ray whose
    node offers one `rlflow_timer`."""
    import os

    ray = require_ray()
    if ray.is_initialized():
        return ray
    check_address(address)
    try:
        if address or os.environ.get("RAY_ADDRESS"):
            ray.init(address=address, log_to_driver=False)
        else:
            # "local": a new Ray of our own, even where another runs on this machine (Ray
            # would otherwise join that one, which refuses the resources asked for here).
            ray.init(
                address="local",
                resources={TIMER_RESOURCE: 1},
                include_dashboard=False,
                log_to_driver=False,
            )
    except (ConnectionError, RuntimeError, ValueError) as error:
        where = address or os.environ.get("RAY_ADDRESS") or "a local Ray"
        raise RlflowError(f"cannot start or reach Ray at {where}: {error}") from None
    return ray


def get(ray: Any, references: Any) -> Any:
    """`ray.get`, with an RlflowError raised in a worker (a bad model, a corrupt checkpoint)
    raised here as the one line it is, not as Ray's traceback of the worker."""
    try:
        return ray.get(references)
    except ray.exceptions.RayError as error:
        cause = getattr(error, "cause", None)
        while cause is not None and (
            isinstance(cause, ray.exceptions.RayError) or not isinstance(cause, RlflowError)
        ):
            cause = getattr(cause, "cause", None)
        if cause is None:
            raise
        raise RlflowError(str(cause)) from None


# ---- timing ------------------------------------------------------------------------------


class Timer:
    """What a timer actor runs: the in-process measurement objects, one per settings."""

    def __init__(self) -> None:
        self._runners: dict[Any, Any] = {}
        self._perop: dict[Any, Any] = {}
        self.requests = 0

    def served(self) -> int:
        """Measurement requests this timer has answered (a cached answer counts)."""
        return self.requests

    def compare(self, graphs: list[Any], settings: Any, min_time_s: float) -> tuple[Any, int]:
        """`Runner.compare(graphs)` under `settings`, and the sessions it built."""
        from rlflow.cost import Runner

        runner = self._runners.get((settings, min_time_s))
        if runner is None:
            runner = self._runners[(settings, min_time_s)] = Runner(settings, min_time_s=min_time_s)
        self.requests += 1
        built = runner.sessions_built
        comparison = runner.compare(graphs)
        return comparison, runner.sessions_built - built

    def perop_cost(self, graph: Any, settings: Any) -> tuple[float, int]:
        """`PerOpCostModel.cost_ms(graph)` under `settings`, and the operators it timed."""
        from rlflow.cost import PerOpCostModel

        model = self._perop.get(settings)
        if model is None:
            model = self._perop[settings] = PerOpCostModel(settings)
        self.requests += 1
        before = model.measured_ops
        cost = model.cost_ms(graph)
        return cost, model.measured_ops - before

    def node(self) -> str:
        """The machine this timer measures on."""
        import socket

        return socket.gethostname()

    def node_id(self) -> str:
        """The Ray node this timer runs on (one timer per node offering `rlflow_timer`)."""
        import ray

        return ray.get_runtime_context().get_node_id()


_timers: dict[tuple[str, str], list[Any]] = {}
"""The timer actors of this driver, by Ray session and job: held here so that they live (with
their caches) as long as the driver, not only as long as one run's handles. The session is part
of the key because job ids start again at 1 in every session: a driver that joins a second Ray
(another cluster, or a new local one) must not reach for the first one's actors."""


def timers(ray: Any) -> list[Any]:
    """One timer actor per unit of `rlflow_timer` in the cluster (made on first use, found by
    name after); RlflowError when no machine offers the resource."""
    context = ray.get_runtime_context()
    job = (context.get_session_name(), context.get_job_id())
    if job in _timers:
        return _timers[job]
    count = int(ray.cluster_resources().get(TIMER_RESOURCE, 0))
    if count < 1:
        raise RlflowError(
            f"no Ray node offers the {TIMER_RESOURCE} resource, so nothing can be measured: "
            f"start the timing machines with ray start --resources '{{\"{TIMER_RESOURCE}\": 1}}'"
        )
    actor = ray.remote(Timer)
    _timers[job] = [
        actor.options(
            name=TIMER_NAME.format(index=index),
            get_if_exists=True,
            resources={TIMER_RESOURCE: 1},
            num_cpus=0,  # a timing node keeps its CPUs for the measurement itself
        ).remote()
        for index in range(count)
    ]
    return _timers[job]


class RemoteRunner:
    """The part of `rlflow.cost.Runner` the env uses, run by a timer actor."""

    def __init__(self, timer: Any, settings: Any, min_time_s: float) -> None:
        self.timer, self.settings, self.min_time_s = timer, settings, min_time_s
        self.sessions_built = 0

    def compare(self, graphs: Sequence[Any]) -> Any:
        import ray

        comparison, built = get(
            ray, self.timer.compare.remote(list(graphs), self.settings, self.min_time_s)
        )
        self.sessions_built += built
        return comparison


class RemotePerOp:
    """The part of `rlflow.cost.PerOpCostModel` the env uses, run by a timer actor."""

    def __init__(self, timer: Any, settings: Any) -> None:
        self.timer, self.settings = timer, settings
        self.measured_ops = 0

    def cost_ms(self, graph: Any) -> float:
        import ray

        cost, measured = get(ray, self.timer.perop_cost.remote(graph, self.settings))
        self.measured_ops += measured
        return float(cost)

    def close(self) -> None:
        """Nothing to close here: the timer actor keeps its cache."""


def remote_measurers(env_kwargs: dict[str, Any], timer: Any) -> dict[str, Any]:
    """GraphRewriteEnv keyword arguments that send the env's measurements to `timer`: a
    runner and a per-op model under the settings the env itself would measure with."""
    from rlflow.envs.graph_rewrite import REWARD_MEASURE_S, measurement_settings

    settings = measurement_settings(
        str(env_kwargs.get("ort_level", "all")),
        str(env_kwargs.get("deploy", "online")),
        str(env_kwargs.get("provider", "auto")),
    ).resolved()
    return {
        "runner": RemoteRunner(timer, settings, REWARD_MEASURE_S),
        "perop_model": RemotePerOp(timer, settings),
    }


def needs_timer(env_kwargs: dict[str, Any]) -> bool:
    """Whether an env of these arguments measures anything (its cost source is not analytic;
    offline without a cost named, the env's default is the per-op model)."""
    cost = env_kwargs.get("cost")
    if cost is None:
        return env_kwargs.get("deploy", "online") == "offline"
    return cost != "analytic"


def measurers_for(timer: Any) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """A hook for env factories: the env arguments that route measurements to `timer` (none
    when the env measures nothing)."""

    def measurers(env_kwargs: dict[str, Any]) -> dict[str, Any]:
        return remote_measurers(env_kwargs, timer) if needs_timer(env_kwargs) else {}

    return measurers


def pick_timers(ray: Any, env_kwargs: dict[str, Any], count: int) -> list[Any]:
    """A timer for each of `count` workers, round robin over the machines' timers (None each
    when the env measures nothing, so a cluster without timing nodes still collects)."""
    if not needs_timer(env_kwargs):
        return [None] * count
    cycle = itertools.cycle(timers(ray))
    return [next(cycle) for _ in range(count)]


# ---- env workers -------------------------------------------------------------------------


class EnvWorker:
    """What an env actor runs: one training env, reset in the step that ends an episode."""

    def __init__(
        self, models: list[str], horizon: int, env_kwargs: dict[str, Any], timer: Any
    ) -> None:
        from rlflow.agents.vector import make_env

        kwargs = dict(env_kwargs)
        if timer is not None:
            kwargs.update(remote_measurers(kwargs, timer))
        self.env = make_env(models, horizon, kwargs)

    def spaces(self) -> tuple[Any, Any]:
        return self.env.observation_space, self.env.action_space

    def reset(self, seed: int | None, options: dict[str, Any] | None) -> tuple[Any, dict]:
        return self.env.reset(seed=seed, options=options)

    def step(self, action: int) -> tuple[Any, float, bool, bool, dict, Any, dict | None]:
        """The step, then (when it ended the episode) the reset: (obs, reward, terminated,
        truncated, info, final obs, final info)."""
        observation, reward, terminated, truncated, info = self.env.step(action)
        if not (terminated or truncated):
            return observation, reward, terminated, truncated, info, None, None
        final_observation, final_info = observation, info
        observation, info = self.env.reset()
        return observation, reward, terminated, truncated, info, final_observation, final_info

    def call(self, name: str, *args: Any, **kwargs: Any) -> Any:
        attribute = self.env.get_wrapper_attr(name)
        return attribute(*args, **kwargs) if callable(attribute) else attribute

    def close(self) -> None:
        self.env.close()


def writable(value: Any) -> Any:
    """`value` with its numpy arrays copied: Ray hands arrays back read-only (zero-copy), and
    torch warns about, and must not write into, those."""
    if isinstance(value, np.ndarray):
        return value.copy() if not value.flags.writeable else value
    if isinstance(value, dict):
        return {key: writable(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(writable(item) for item in value)
    return value


class RayVectorEnv(VectorEnv):
    """gymnasium's `SyncVectorEnv` (same-step autoreset) with each env in a Ray actor: the
    envs step in parallel, on any machine of the cluster."""

    def __init__(
        self,
        models: list[str],
        horizon: int,
        env_kwargs: dict[str, Any],
        num_envs: int,
        address: str | None = None,
    ) -> None:
        super().__init__()
        self._ray = ray = init(address)
        # A CPU per env where the cluster has them; fewer CPUs than envs share them rather
        # than leave envs waiting for a CPU forever.
        cpus = float(ray.cluster_resources().get("CPU", 1.0))
        worker = ray.remote(num_cpus=min(1.0, cpus / num_envs))(EnvWorker)
        chosen = pick_timers(ray, env_kwargs, num_envs)
        self.workers = [worker.remote(models, horizon, env_kwargs, timer) for timer in chosen]
        self.num_envs = num_envs
        self.single_observation_space, self.single_action_space = get(
            ray, self.workers[0].spaces.remote()
        )
        self.observation_space = batch_space(self.single_observation_space, num_envs)
        self.action_space = batch_space(self.single_action_space, num_envs)
        self.metadata = {"autoreset_mode": AutoresetMode.SAME_STEP}
        self._observations = create_empty_array(self.single_observation_space, n=num_envs)

    def _batch(self, observations: list[Any]) -> Any:
        return concatenate(self.single_observation_space, observations, self._observations)

    def reset(
        self, *, seed: int | list[int | None] | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Any, dict[str, Any]]:
        if seed is None or isinstance(seed, int):
            seeds = [None if seed is None else seed + i for i in range(self.num_envs)]
        else:
            seeds = list(seed)
        results = get(
            self._ray,
            [w.reset.remote(s, options) for w, s in zip(self.workers, seeds, strict=True)],
        )
        infos: dict[str, Any] = {}
        for index, (_, info) in enumerate(results):
            infos = self._add_info(infos, info, index)
        return self._batch([observation for observation, _ in results]), infos

    def step(self, actions: Any) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict]:
        actions = np.asarray(actions)
        results = get(
            self._ray, [w.step.remote(int(a)) for w, a in zip(self.workers, actions, strict=True)]
        )
        infos: dict[str, Any] = {}
        for index, (*_, info, final_observation, final_info) in enumerate(results):
            if final_info is not None:
                final = {"final_obs": writable(final_observation), "final_info": final_info}
                infos = self._add_info(infos, final, index)
            infos = self._add_info(infos, info, index)
        rewards = np.array([result[1] for result in results], dtype=np.float64)
        terminations = np.array([result[2] for result in results], dtype=np.bool_)
        truncations = np.array([result[3] for result in results], dtype=np.bool_)
        observations = self._batch([result[0] for result in results])
        return observations, rewards, terminations, truncations, infos

    def call(self, name: str, *args: Any, **kwargs: Any) -> tuple[Any, ...]:
        results = get(self._ray, [w.call.remote(name, *args, **kwargs) for w in self.workers])
        return tuple(writable(result) for result in results)

    def get_attr(self, name: str) -> tuple[Any, ...]:
        return self.call(name)

    def close_extras(self, **kwargs: Any) -> None:
        try:
            self._ray.get([w.close.remote() for w in self.workers])
        except self._ray.exceptions.RayError:
            pass  # a worker that died has nothing left to close
        finally:
            for worker in self.workers:
                self._ray.kill(worker)

"""The World Models loop: collect, train V and M, train the controller, collect with it, repeat.

Iteration 0 collects with RLFlow's random agent (or the rule-balanced `random-rule`); iteration
k > 0 with iteration k-1's controller, so the data grows where the controller goes (Ha &
Schmidhuber, section 5: "iterative training"). Each iteration trains a fresh world model on all
the data so far and a fresh controller in its dream, then runs the controllers in the real env
for their real returns (every round's, or with `eval_real` last only the final round's).

With `explore_uncertainty` (`--explore-uncertainty U`), round k > 0 collects instead with an
explorer: a controller trained in round k-1's world model whose dream charges U per unit of the
ensemble's disagreement, a bonus where U is negative, so the data grows where the world model
is unsure rather than where it is sure (optimism for collecting, the charge for the controller
kept). On SqueezeNet, whose world models priced the path to its blocked layout at a loss from
steps their random data rarely showed, 4 explorer episodes added by hand to 16 random ones took
three data seeds' controllers (charged 0.5) from 76-89% of PPO's gain to 99-111%, one seed of
the three finding that layout; run end to end on three fresh seeds (2 explorer episodes,
`eval_real` last) it stayed near greedy, 67-80%: an explorer does not aim at that layout
(docs/BENCHMARKS.md).

With `demo` (`--demo RESULT.json`, `--demo-episodes N`), the first round also collects N
episodes that walk a search's recorded path and explore from it (`demo:` in
`rlflow.worldmodel.demo_policy`, in iter-0/data-demo/), part of every round's data from then
on: "the search, then the world model", as `train-ppo --demo` is the search, then RL. With
the controllers' `imitation` above 0 (`--imitation W`) they also start from the path, cloned
from that first walk, and are kept near it (`rlflow.worldmodel.imitation`), as `train-ppo
--demo --demo-coef` keeps PPO; the explorers do not.

LOOP_DIR/iter-K/ holds `data/` (this iteration's rollouts, a `rlflow collect` directory),
`data-all/` (iterations 0..K merged, shards linked), `wm/` (a `train-wm` run), `controller/`
(a `train-controller` run whose `progress.json` counts the loop's real steps up to it, as
`rlflow bench` reads them for an `agent:`), `explorer/` (with `explore_uncertainty`, before a
next round) and `report.json`; LOOP_DIR/loop.json gathers the iterations. Each stage resumes as
its own command does, and a finished iteration is not redone.

The held-out report scores world model K on data it never saw: its own held-out split, and
iteration K+1's rollouts (collected by a controller it trained, the distribution the loop moves
to). The dream returns of all controllers (every iteration and tau) are ranked against their
real returns (Spearman's rho): whether a dream can pick the better controller.
"""

from __future__ import annotations

import math
import os
import shutil
import sys
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from rlflow.config import write_run_config
from rlflow.errors import RlflowError
from rlflow.fileio import write_json_atomic
from rlflow.worldmodel.collect import RANDOM_POLICIES, CollectSettings, collect, update_totals
from rlflow.worldmodel.controller import EVAL_REPORT, ControllerSettings, progress_record
from rlflow.worldmodel.data import MANIFEST, SHARD_PATTERN, RolloutData, read_manifest
from rlflow.worldmodel.heldout import heldout_report, rank_correlation
from rlflow.worldmodel.model import PROGRESS, WorldModel
from rlflow.worldmodel.train import WorldModelSettings, train_world_model, training_data
from rlflow.worldmodel.train_controller import train_controller

LOOP_REPORT = "loop.json"
EVAL_REAL = ("every", "last")
ITERATION_REPORT = "report.json"


@dataclass
class LoopSettings:
    """The loop's own knobs; each stage takes its settings from its section of the config."""

    iterations: int = 3  # collect-train-control rounds (World Models: until the task is solved)
    backend: str = "inprocess"  # where collection runs: inprocess | ray
    ray_address: str | None = None  # --backend ray: the cluster (default: a local Ray)
    workers: int = 1  # in-process collection processes
    measure: bool = False  # time each controller's cheapest graph end to end (slow)
    random_policy: str = "random"
    """The first round's agent: random (RLFlow's, uniform over candidates) | random-rule
    (uniform over rules, then sites: rules with few sites drawn as often as the others)."""
    controller_episodes: int | None = None
    """Episodes collected with each controller (rounds after the first; None: as many as the
    random round). The random round has to cover the space; a controller's rounds only add
    where it goes, and their real env steps are what the loop's sample efficiency counts."""
    explore_uncertainty: float | None = None
    """Rounds after the first collect with an explorer trained with this uncertainty charge
    (negative: a bonus for the ensemble's disagreement) in the last round's world model, at the
    controller's main tau; None: with the last round's controller itself."""
    demo: str | None = None
    """A search's recorded result (`rlflow optimize --json`) whose path the first round also
    walks and explores from, `demo_episodes` times (None: random data alone)."""
    demo_episodes: int = 4
    eval_real: str = "every"
    """Which rounds run their controllers in the real env: every (World Models' curve of real
    returns per round) | last (only the final round's: an earlier controller that collects
    does so at its main tau, and with an explorer it never runs; the measurements a sample
    efficiency counts are then the data's and the final evaluation's)."""

    def validate(self) -> None:
        if self.iterations < 1:
            raise RlflowError(f"--iterations must be at least 1, got {self.iterations}")
        if self.random_policy not in RANDOM_POLICIES:
            raise RlflowError(
                f"bad random policy {self.random_policy!r}: expected one of "
                + ", ".join(RANDOM_POLICIES)
            )
        if self.explore_uncertainty is not None and not math.isfinite(self.explore_uncertainty):
            raise RlflowError(
                f"--explore-uncertainty must be a finite number, got {self.explore_uncertainty}"
            )
        if self.eval_real not in EVAL_REAL:
            raise RlflowError(
                f"bad --eval-real {self.eval_real!r}: expected one of " + ", ".join(EVAL_REAL)
            )
        if self.controller_episodes is not None and self.controller_episodes < 1:
            raise RlflowError(
                f"--controller-episodes must be at least 1, got {self.controller_episodes}"
            )
        if self.demo is not None and self.demo_episodes < 1:
            raise RlflowError(f"--demo-episodes must be at least 1, got {self.demo_episodes}")

    def episodes(self, index: int, first: int) -> int:
        """Episodes round `index` collects: `first` with the random agent, then per controller."""
        if index == 0 or self.controller_episodes is None:
            return first
        return self.controller_episodes


def iteration_dir(loop_dir: Path, index: int) -> Path:
    return Path(loop_dir) / f"iter-{index}"


def merge_rollouts(sources: list[Path], out: Path) -> Path:
    """One data directory holding every shard of `sources` (linked, else copied), renumbered
    in order; rebuilt unless it already holds exactly these sources' shards."""
    manifests = [read_manifest(source) for source in sources]
    first = manifests[0]
    for source, manifest in zip(sources[1:], manifests[1:], strict=True):
        for key in ("rule_names", "env", "node_features", "edge_features", "global_features"):
            if manifest.get(key) != first.get(key):
                raise RlflowError(f"{source} was collected with another env ({key} differs)")
    shards: dict[str, Any] = {}
    links: list[tuple[Path, Path]] = []
    for source, manifest in zip(sources, manifests, strict=True):
        for name in sorted(manifest["shards"]):
            index = len(shards)
            target = SHARD_PATTERN.format(index=index)
            shards[target] = {**manifest["shards"][name], "index": index, "source": str(source)}
            links.append((source / name, out / target))
    policies = [manifest["settings"]["policy"] for manifest in manifests]
    merged = {
        **first,
        "settings": {**first["settings"], "policy": policies},
        "sources": [str(source) for source in sources],
        "shards": shards,
    }
    update_totals(merged)
    if (out / MANIFEST).is_file() and read_manifest(out) == merged:
        if all(target.is_file() for _, target in links):
            return out
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    for source, target in links:
        try:
            os.link(source, target)
        except OSError:  # another file system, or links not allowed: copy
            shutil.copyfile(source, target)
    write_json_atomic(out / MANIFEST, merged)
    return out


def run_loop(
    models: list[str],
    loop_dir: str | Path,
    loop: LoopSettings,
    collect_settings: CollectSettings,
    wm_settings: WorldModelSettings,
    controller_settings: ControllerSettings,
    *,
    progress: bool = True,
) -> dict[str, Any]:
    """Run (or continue) the loop in `loop_dir`; its report (also LOOP_DIR/loop.json)."""
    from rlflow.worldmodel.evaluate import check_measured, evaluate_real

    loop.validate()
    wm_settings.validate()
    if controller_settings.imitation > 0:  # the controllers imitate the demo's first walk
        if loop.demo is None:
            raise RlflowError("--imitation needs --demo: the search's path to imitate")
        demo_data = iteration_dir(Path(loop_dir).resolve(), 0) / "data-demo"
        controller_settings = replace(controller_settings, imitate=str(demo_data))
    controller_settings.validate()
    check_measured(controller_settings, loop.measure, "run the loop with --measure")
    first_round = replace(collect_settings, policy=loop.random_policy)
    first_round.make_policy()  # its agent's options refused before any work
    demo_round = None
    if loop.demo is not None:
        demo_round = replace(
            collect_settings,
            models=list(models),
            policy=f"demo:{loop.demo}",
            episodes=loop.demo_episodes,
        )
        demo_round.make_policy()  # a file without a recording refused before any work
    loop_dir = Path(loop_dir)
    loop_dir.mkdir(parents=True, exist_ok=True)
    collect_identity = asdict(first_round)
    if not collect_settings.rule_repeat:  # absent from loops made before the option
        collect_identity.pop("rule_repeat")
    identity = {
        "models": list(models),
        "collect": collect_identity,
        "train_wm": asdict(wm_settings),
        "train_controller": controller_settings.identity(),
    }
    if loop.controller_episodes is not None:  # absent from loops made before the option
        identity["controller_episodes"] = loop.controller_episodes
    if loop.explore_uncertainty is not None:  # absent from loops made before the option
        identity["explore_uncertainty"] = loop.explore_uncertainty
    if demo_round is not None:  # absent from loops made before the option
        identity["demo"] = {"file": loop.demo, "episodes": loop.demo_episodes}
    write_run_config(loop_dir, "world_models_loop", identity, may_change=("iterations",))
    iterations: list[dict[str, Any]] = []
    for index in range(loop.iterations):
        here = iteration_dir(loop_dir, index)
        report_path = here / ITERATION_REPORT
        if report_path.is_file():
            iterations.append(_read_json(report_path))
            if not (here / "controller" / PROGRESS).is_file():  # loops made before it was written
                _write_progress(here / "controller", iterations)
            continue
        _say(progress, f"iteration {index}: collect, train the world model and the controller")
        policy, rule_repeat = loop.random_policy, collect_settings.rule_repeat
        if index > 0:  # the controller's round: rule repeats are the random agent's
            collector = iteration_dir(loop_dir, index - 1) / "controller"
            if loop.explore_uncertainty is not None:
                collector = train_explorer(
                    iteration_dir(loop_dir, index - 1),
                    controller_settings,
                    loop.explore_uncertainty,
                    progress,
                )
            policy = f"agent:{collector.resolve()}"
            rule_repeat = 0.0
        settings = replace(
            collect_settings,
            models=list(models),
            policy=policy,
            rule_repeat=rule_repeat,
            seed=collect_settings.seed + index,
            episodes=loop.episodes(index, collect_settings.episodes),
        )
        manifest = collect(
            settings,
            here / "data",
            workers=loop.workers,
            progress=progress,
            backend=loop.backend,
            ray_address=loop.ray_address,
        )
        if index > 0:  # the last world model, on the data its controller (or explorer) went to
            previous = iteration_dir(loop_dir, index - 1)
            world = WorldModel.load(previous / "wm")
            iterations[-1]["heldout_next"] = heldout_report(world, RolloutData.load(here / "data"))
            write_json_atomic(previous / ITERATION_REPORT, iterations[-1])
        sources = [iteration_dir(loop_dir, k) / "data" for k in range(index + 1)]
        collected = dict(manifest["totals"])
        if demo_round is not None:
            demo_data = iteration_dir(loop_dir, 0) / "data-demo"
            if index == 0:  # its real steps are the first round's too
                _say(progress, f"iteration 0: {loop.demo_episodes} episodes from {loop.demo}")
                walked = collect(demo_round, demo_data, workers=1, progress=progress)["totals"]
                collected = {key: value + walked[key] for key, value in collected.items()}
            sources.insert(1, demo_data)
        data_dir = merge_rollouts(sources, here / "data-all")
        wm_dir = here / "wm"
        data = training_data(data_dir, wm_dir)
        wm_dir.mkdir(parents=True, exist_ok=True)
        write_run_config(
            wm_dir,
            "world_model",
            {"data": str(data_dir.resolve()), **asdict(wm_settings)},
            may_change=("vae_epochs", "rnn_epochs"),
        )
        wm_summary = train_world_model(data_dir, wm_dir, wm_settings, progress=progress, data=data)
        world = WorldModel.load(wm_dir)
        _, held_out = data.episodes_split(wm_settings.holdout, wm_settings.seed)
        heldout = heldout_report(world, data, held_out) if len(held_out) else None

        controller_dir = here / "controller"
        controller_dir.mkdir(parents=True, exist_ok=True)
        write_run_config(
            controller_dir,
            "controller",
            {"wm": str(wm_dir.resolve()), **controller_settings.identity()},
            may_change=("generations", "ppo_iterations", "eval_dream_episodes"),
        )
        trained = train_controller(wm_dir, controller_dir, controller_settings, progress=progress)
        if loop.eval_real == "every" or index == loop.iterations - 1:
            real = evaluate_real(
                controller_dir,
                WorldModel.from_bundle(controller_dir / "world_model.pt"),
                controller_settings,
                list(models),
                random_episodes=0,
                seed=controller_settings.seed,
                measure=loop.measure,
                progress=progress,
            )
            write_json_atomic(controller_dir / EVAL_REPORT, real)
        else:
            real = _unevaluated(trained, controller_settings)
        entry = {
            "iteration": index,
            "policy": policy,
            "collected": collected,
            "data_episodes": data.num_episodes,
            "heldout": heldout,
            "heldout_next": None,
            "world_model": {"vae": wm_summary["vae"], "mdnrnn_val": wm_summary["mdnrnn_val"]},
            "controllers": [
                {
                    "temperature": row["temperature"],
                    "dream_return": row["dream_return"],
                    "real_return": row["real_return"],
                    "speedup": row["speedup"],
                    "parameters": trained[tau]["parameters"],
                }
                for tau, row in real["temperatures"].items()
            ],
            "selected_temperature": real["selected_temperature"],
            "eval_real_env_steps": real["real_env_steps"],
            "eval_real_measurements": real["real_measurements"],
        }
        iterations.append(entry)
        _write_progress(controller_dir, iterations)
        write_json_atomic(report_path, entry)
    return _summarise(loop_dir, iterations)


def _unevaluated(trained: dict[str, Any], settings: ControllerSettings) -> dict[str, Any]:
    """A round whose controllers stay out of the real env (`eval_real` last): their training
    dream returns, no real ones, no real steps; the policy keeps its main tau."""
    rows = {
        f"{tau:g}": {
            "temperature": tau,
            "dream_return": float(trained[f"{tau:g}"]["dream_return"]),
            "real_return": None,
            "speedup": None,
        }
        for tau in settings.temperatures
    }
    return {
        "temperatures": rows,
        "selected_temperature": None,
        "real_env_steps": 0,
        "real_measurements": 0,
    }


def train_explorer(
    iteration: Path, settings: ControllerSettings, uncertainty: float, progress: bool
) -> Path:
    """The explorer of a finished round (ITERATION/explorer, resumed as any controller run):
    trained in its world model at the controller's main tau with `uncertainty` as the charge,
    never run in the real env before it collects (its real steps are the next round's data)."""
    explorer = replace(
        settings,
        imitation=0.0,  # an explorer goes where M is unsure, not where the path went
        imitate=None,
        uncertainty=uncertainty,
        temperatures=[settings.temperature],
        select="temperature",
    )
    out = iteration / "explorer"
    out.mkdir(parents=True, exist_ok=True)
    wm_dir = (iteration / "wm").resolve()
    write_run_config(
        out, "controller", {"wm": str(wm_dir), **explorer.identity()}, may_change=("generations",)
    )
    _say(progress, f"{iteration.name}: the explorer (uncertainty {uncertainty:g})")
    train_controller(wm_dir, out, explorer, progress=progress)
    return out


def _real_cost(iterations: list[dict[str, Any]]) -> dict[str, int]:
    """The real env steps and measurements of these rounds: collections and real evaluations."""
    collected = [entry["collected"] for entry in iterations]
    cost = {
        "collect_real_env_steps": sum(int(c.get("real_env_steps", 0)) for c in collected),
        "collect_real_measurements": sum(int(c.get("real_measurements", 0)) for c in collected),
        "eval_real_env_steps": sum(int(entry["eval_real_env_steps"]) for entry in iterations),
        "eval_real_measurements": sum(int(entry["eval_real_measurements"]) for entry in iterations),
    }
    cost["real_env_steps"] = cost["collect_real_env_steps"] + cost["eval_real_env_steps"]
    cost["real_measurements"] = cost["collect_real_measurements"] + cost["eval_real_measurements"]
    return cost


def _write_progress(controller_dir: Path, iterations: list[dict[str, Any]]) -> None:
    """CONTROLLER/progress.json of the last of `iterations`, as `train-controller` writes it: the
    real steps and measurements behind that controller (every round's so far, the explorers'
    data included), what `rlflow bench` counts for it as an `agent:` against PPO's."""
    entry, cost = iterations[-1], _real_cost(iterations)
    tau = entry["selected_temperature"]  # None: its controllers never ran in the real env
    row = next((row for row in entry["controllers"] if row["temperature"] == tau), None)
    episodes = []
    if row is not None:
        episodes.append(
            {
                "global_step": cost["real_env_steps"],
                "return": row["real_return"],
                "speedup": row["speedup"],
                "real_measurements": cost["real_measurements"],
            }
        )
    progress = progress_record(cost, row, episodes, loop_iteration=entry["iteration"])
    write_json_atomic(controller_dir / PROGRESS, progress)


def _summarise(loop_dir: Path, iterations: list[dict[str, Any]]) -> dict[str, Any]:
    controllers = [row for entry in iterations for row in entry["controllers"]]
    evaluated = [row for row in controllers if row["real_return"] is not None]
    cost = _real_cost(iterations)
    summary = {
        "loop_dir": str(loop_dir),
        "iterations": iterations,
        "dream_real_rank_correlation": rank_correlation(
            [row["dream_return"] for row in evaluated],
            [row["real_return"] for row in evaluated],
        ),
        "controllers_ranked": len(evaluated),
        "real_env_steps": cost["real_env_steps"],
        "real_measurements": cost["real_measurements"],
    }
    write_json_atomic(loop_dir / LOOP_REPORT, summary)
    return summary


def _read_json(path: Path) -> dict[str, Any]:
    import json

    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise RlflowError(
            f"{path} is unreadable ({error}); delete it to redo the iteration"
        ) from None


def _say(progress: bool, text: str) -> None:
    if progress:
        print(text, file=sys.stderr)

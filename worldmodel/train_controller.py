"""`rlflow train-controller`'s training: one controller per dream temperature, resumable.

Training never touches the real env: controllers are scored on `DreamBatch` rollouts only,
by CMA-ES (World Models; default, `rlflow.worldmodel.cmaes`) or PPO (RLFlow,
`rlflow.worldmodel.dream_ppo`), one per dream temperature tau. The run keeps the world model
it started in (`world_model.pt`); each tau's trainer saves its state after every generation
or iteration (`tau-T/state.pkl`), so a rerun continues where a killed one stopped, and a
finished controller (`tau-T/controller.pt`) is kept unless more training is asked for.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from rlflow.fileio import write_torch_atomic
from rlflow.tensorboard import TensorBoard
from rlflow.worldmodel.cmaes import CMAESTrainer
from rlflow.worldmodel.controller import (
    CONTROLLER_CHECKPOINT,
    WORLD_BUNDLE,
    ControllerSettings,
    ControllerTrainer,
    dream_returns,
    tau_dir,
)
from rlflow.worldmodel.dream_ppo import DreamPPOTrainer
from rlflow.worldmodel.model import (
    WorldModel,
    load_checkpoint,
    load_pickle,
    save_pickle,
)

if TYPE_CHECKING:
    from rlflow.worldmodel.imitation import PathExamples

STATE_FILE = "state.pkl"
TRAINERS: dict[str, type[ControllerTrainer]] = {"cmaes": CMAESTrainer, "ppo": DreamPPOTrainer}


def train_controller(
    wm_dir: str | Path, run_dir: str | Path, settings: ControllerSettings, *, progress: bool = True
) -> dict[str, Any]:
    """Train one controller per temperature in the world model's dream; never steps a real
    env. Returns {temperature: {"dream_return": ..., "parameters": ...}} summaries."""
    settings.validate()
    run_dir = Path(run_dir)
    bundle = run_dir / WORLD_BUNDLE
    if bundle.exists():
        world = WorldModel.from_bundle(bundle)  # a resumed run keeps the world it started in
    else:
        world = WorldModel.load(wm_dir)
        run_dir.mkdir(parents=True, exist_ok=True)
        world.save_bundle(bundle)
    path = None
    if settings.imitate is not None:  # CMA-ES from a search's path (`imitation`)
        from rlflow.worldmodel.imitation import path_examples

        path = path_examples(world, settings.imitate)
    results: dict[str, Any] = {}
    with TensorBoard(run_dir) as board:
        for temperature in settings.temperatures:
            out = tau_dir(run_dir, temperature)
            out.mkdir(parents=True, exist_ok=True)
            checkpoint_path = out / CONTROLLER_CHECKPOINT
            done = None
            if checkpoint_path.exists():
                done = load_checkpoint(checkpoint_path, "controller checkpoint")
                if done.get("trained_for", -1) != settings.budget:
                    done = None  # more training asked for: continue from state.pkl
            if done is None:
                done = train_at(world, out, settings, temperature, board, progress, path)
                write_torch_atomic(checkpoint_path, done)
            results[f"{temperature:g}"] = {
                "temperature": temperature,
                "dream_return": float(done["dream_return"]),
                "parameters": int(done["params"].numel()),
            }
            if "path_agreement" in done:
                results[f"{temperature:g}"]["path_agreement"] = float(done["path_agreement"])
    return results


def train_at(
    world: WorldModel,
    out: Path,
    settings: ControllerSettings,
    temperature: float,
    board: TensorBoard,
    progress: bool = True,
    path: PathExamples | None = None,
) -> dict[str, Any]:
    """Train (or resume from `out/state.pkl`) the controller at temperature tau, imitating
    `path` if given; its checkpoint, with its final dream return over `eval_dream_episodes`
    fresh episodes."""
    from tqdm import tqdm

    state_path = out / STATE_FILE
    state = load_pickle(state_path, "controller state") if state_path.exists() else None
    trainer = TRAINERS[settings.method](world, settings, temperature, state, path)
    tag = f"controller/tau{temperature:g}"
    bar = tqdm(
        total=settings.budget,
        initial=min(trainer.done, settings.budget),
        desc=f"train-controller {trainer.name} tau {temperature:g}",
        unit=trainer.unit,
        file=sys.stderr,
        disable=not progress,
    )
    while trainer.done < settings.budget:
        scalars = trainer.step()
        for key, value in scalars.items():
            board.scalar(f"{tag}/{key}", value, trainer.done)
        save_pickle(state_path, trainer.state())
        bar.update(1)
        bar.set_postfix_str(trainer.postfix.format(**scalars))
    bar.close()
    params = trainer.params()
    rng = np.random.default_rng([settings.seed, 999_983, int(temperature * 1000)])
    dream_return = float(
        dream_returns(
            world,
            params[None],
            episodes=settings.eval_dream_episodes,
            temperature=temperature,
            rng=rng,
            **settings.dream_options(world),
        )[0]
    )
    board.scalar(f"{tag}/final_dream_return", dream_return, 0)
    imitated = {}
    if path is not None:  # how much of the path the controller still walks
        from rlflow.worldmodel.imitation import agreement

        imitated["path_agreement"] = agreement(params, path, world.num_actions)
    return {
        "params": torch.as_tensor(params),
        "num_actions": world.num_actions,
        "input_dim": world.latent + world.hidden,
        "temperature": temperature,
        "horizon": settings.dream_steps(world),
        "method": settings.method,
        "dream_return": dream_return,
        "trained_for": settings.budget,
        **imitated,
    }

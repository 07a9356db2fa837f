"""World Models' way to train the controller: CMA-ES on its dream return.

The linear controller's parameters are one flat vector; each generation, every candidate
vector of the population is scored by its mean dream return over the same dream episodes
(common random numbers, `dream_returns`), and CMA-ES moves its search distribution toward
the better ones. Generation g draws its dreams from (seed, g, tau), so a resumed run scores
exactly what an uninterrupted one would.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from rlflow.worldmodel.controller import ControllerSettings, LinearController, dream_returns
from rlflow.worldmodel.model import WorldModel


class CMAESTrainer:
    """One controller's CMA-ES at temperature tau, a generation per `step` (see
    `rlflow.worldmodel.train_controller`, which runs it and keeps `state()` between runs)."""

    name, unit = "CMA-ES", "gen"
    postfix = "dream return best {dream_return_best:.2f} mean {dream_return_mean:.2f}"

    def __init__(
        self,
        world: WorldModel,
        settings: ControllerSettings,
        temperature: float,
        state: dict[str, Any] | None = None,
    ) -> None:
        import cma

        self.world, self.settings, self.temperature = world, settings, temperature
        if state is not None:
            self.es, self.done = state["es"], state["generation"]
            np.random.set_state(state["numpy_rng"])  # cma draws from numpy's global RNG
            return
        size = LinearController.num_params(world.num_actions, world.latent + world.hidden)
        options = {
            "popsize": settings.population,
            "seed": settings.seed + 1,
            "verbose": -9,
            "CMA_diagonal": size > settings.diagonal_above,
        }
        self.es = cma.CMAEvolutionStrategy(np.zeros(size), settings.sigma0, options)
        self.done = 0

    def step(self) -> dict[str, float]:
        """One generation; its scalars for TensorBoard."""
        settings = self.settings
        candidates = np.asarray(self.es.ask())
        rng = np.random.default_rng([settings.seed, self.done, int(self.temperature * 1000)])
        fitness = dream_returns(
            self.world,
            candidates,
            episodes=settings.rollouts,
            temperature=self.temperature,
            max_steps=settings.max_steps,
            rng=rng,
        )
        self.es.tell(list(candidates), list(-fitness))  # cma minimises
        self.done += 1
        return {
            "dream_return_mean": fitness.mean(),
            "dream_return_best": fitness.max(),
            "sigma": self.es.sigma,
        }

    def state(self) -> dict[str, Any]:
        return {"es": self.es, "generation": self.done, "numpy_rng": np.random.get_state()}

    def params(self) -> np.ndarray:
        """The controller: the mean of the search distribution."""
        return np.asarray(self.es.result.xfavorite, dtype=np.float64)

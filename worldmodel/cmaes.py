"""World Models' way to train the controller: CMA-ES on its dream return.

The linear controller's parameters are one flat vector; each generation, every candidate
vector of the population is scored by its mean dream return over the same dream episodes
(common random numbers, `dream_returns`), and CMA-ES moves its search distribution toward
the better ones. Generation g draws its dreams from (seed, g, tau), so a resumed run scores
exactly what an uninterrupted one would.

With a path to imitate (`ControllerSettings.imitation`, `rlflow.worldmodel.imitation`) the
search starts at the controller cloned from it, and the fitness adds the path's log-likelihood,
its weight fading linearly to nothing over the generations, as DAPG's demonstration term does.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from rlflow.worldmodel.controller import ControllerTrainer, LinearController, dream_returns
from rlflow.worldmodel.imitation import agreement, cloned_params, log_likelihoods


class CMAESTrainer(ControllerTrainer):
    """One controller's CMA-ES, a generation per step."""

    name, unit = "CMA-ES", "gen"
    postfix = "dream return best {dream_return_best:.2f} mean {dream_return_mean:.2f}"

    def setup(self, state: dict[str, Any] | None) -> None:
        import cma

        if state is not None:
            self.es, self.done = state["es"], state["generation"]
            np.random.set_state(state["numpy_rng"])  # cma draws from numpy's global RNG
            return
        world, settings = self.world, self.settings
        size = LinearController.num_params(world.num_actions, world.latent + world.hidden)
        options = {
            "popsize": settings.population,
            "seed": settings.seed + 1,
            "verbose": -9,
            "CMA_diagonal": size > settings.diagonal_above,
        }
        start = np.zeros(size)
        if self.path is not None:  # from the controller cloned from the path
            start = cloned_params(self.path, world.num_actions)
        self.es = cma.CMAEvolutionStrategy(start, settings.sigma0, options)

    def step(self) -> dict[str, float]:
        candidates = np.asarray(self.es.ask())
        fitness = dream_returns(
            self.world,
            candidates,
            episodes=self.settings.rollouts,
            temperature=self.temperature,
            rng=self.dream_rng(),
            **self.settings.dream_options(self.world),
        )
        scalars = {
            "dream_return_mean": fitness.mean(),
            "dream_return_best": fitness.max(),
        }
        if self.path is not None:  # the path's log-likelihood, its weight fading to nothing
            weight = self.settings.imitation * (1 - self.done / self.settings.generations)
            likelihood = log_likelihoods(candidates, self.path, self.world.num_actions)
            fitness = fitness + weight * likelihood
            scalars["path_log_likelihood_mean"] = likelihood.mean()
        self.es.tell(list(candidates), list(-fitness))  # cma minimises
        self.done += 1
        if self.path is not None:
            scalars["path_agreement"] = agreement(self.params(), self.path, self.world.num_actions)
        return {**scalars, "sigma": self.es.sigma}

    def state(self) -> dict[str, Any]:
        return {"es": self.es, "generation": self.done, "numpy_rng": np.random.get_state()}

    def params(self) -> np.ndarray:
        """The mean of the search distribution."""
        return np.asarray(self.es.result.xfavorite, dtype=np.float64)

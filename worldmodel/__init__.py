"""RLFlow's model-based learner: a world model of graph rewriting and a controller in its dream.

- `worldmodel.collect`: real rollouts (RLFlow's random agent, or a PPO / controller policy) into
  shards; `worldmodel.data`: the shard format and `RolloutData`.
- `worldmodel.vae` (V: `GraphVAE`), `worldmodel.mdnrnn` (M: `MDNRNN`), `worldmodel.train`
  (`rlflow train-wm`), `worldmodel.model` (`WorldModel`, checkpoints).
- `worldmodel.dream` (`DreamEnv`, `DreamBatch`: no real env inside),
  `worldmodel.controller` (C: CMA-ES or PPO in the dream; `load_controller_policy` for the
  real env), `worldmodel.evaluate` (`--eval-real`: the dream-vs-real temperature table).

Submodules are imported on use: `import worldmodel` alone loads nothing heavy.
"""

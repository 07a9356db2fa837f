"""RLFlow's model-based learner: a world model of graph rewriting and a controller in its dream.

The folder `worldmodel/` installs as `rlflow.worldmodel` (setup.py), so its modules are:

- `collect`: real rollouts (RLFlow's random agent, or a PPO / controller policy) into shards;
  `data`: the shard format and `RolloutData`.
- `vae` (V: `GraphVAE`), `mdnrnn` (M: `MDNRNN`), `train` (`rlflow train-wm`), `model`
  (`WorldModel`, checkpoints).
- `dream` (`DreamEnv`, `DreamBatch`: no real env inside), `controller` (C: CMA-ES or PPO in the
  dream; `load_controller_policy` for the real env), `evaluate` (`--eval-real`: the
  dream-vs-real temperature table).

Submodules are imported on use: `import rlflow.worldmodel` alone loads nothing heavy.
"""

"""RLFlow's model-based learner: a world model of graph rewriting and a controller in its dream.

The folder `worldmodel/` installs as `rlflow.worldmodel` (setup.py), so its modules are:

- `collect`: real rollouts (RLFlow's random agent, or a PPO / controller policy) into shards;
  `data`: the shard format and `RolloutData`.
- `vae` (V: `GraphVAE`), `mdnrnn` (M: `MDNRNN`), `train` (`rlflow train-wm`), `model`
  (`WorldModel`, checkpoints).
- `dream` (`DreamEnv`, `DreamBatch`: no real env inside), `controller` (C: `LinearController`,
  its settings and dream return), `train_controller` (`rlflow train-controller`: one
  controller per dream temperature, by `cmaes` or `dream_ppo`), `policy` (a controller, or any
  trained agent, acting in the real env), `evaluate` (`--eval-real`: the dream-vs-real
  temperature table).

Submodules are imported on use: `import rlflow.worldmodel` alone loads nothing heavy.
"""

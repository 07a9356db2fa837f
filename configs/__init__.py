"""The shipped defaults files, installed as `rlflow.configs` (setup.py maps this folder, as it
maps envs/ and worldmodel/), so that an installed rlflow finds them with importlib.resources.

- `worldmodel.yaml`: `rlflow collect`, `train-wm` and `train-controller` read their section
  of it when no `--config` is given;
- `ppo.yaml` (`rlflow train-ppo --config`) and `bench.yaml` (`rlflow bench --config`): the
  commands' defaults written out, a starting point for a config of one's own;
- `ppo-ent.yaml` and `worldmodel-long.yaml`: the few settings docs/BENCHMARKS.md's learner runs
  change from those defaults, so that its commands run as written.

The defaults files mirror their settings dataclasses; the tests keep them equal.
"""

"""`--backend inprocess|ray` and `--ray-address`, shared by the commands that roll out envs
(collect, train-ppo, train-wm-loop): where the envs step and who measures for them."""

from __future__ import annotations

import argparse

BACKENDS = ("inprocess", "ray")


def add_backend_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--backend",
        choices=BACKENDS,
        default="inprocess",
        help="where envs step: inprocess (default) or ray (env workers as Ray tasks/actors, "
        "measurements on the timer actor of each machine offering the rlflow_timer resource)",
    )
    parser.add_argument(
        "--ray-address",
        metavar="ADDRESS",
        help="--backend ray: the cluster to join (e.g. auto, or HOST:6379; default: "
        "RAY_ADDRESS, else a local Ray started for the run)",
    )


def check_backend(args: argparse.Namespace) -> None:
    """Before any work: --ray-address only with --backend ray, and Ray installed for it."""
    from rlflow.errors import RlflowError

    if args.ray_address and args.backend != "ray":
        raise RlflowError("--ray-address needs --backend ray")
    if args.backend == "ray":
        from rlflow.agents.ray_workers import check_address, require_ray

        require_ray()
        check_address(args.ray_address)

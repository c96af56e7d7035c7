"""The `--ray [ADDRESS]` and `--workers N` options of the commands that can fan out over a Ray
cluster (`batch`, `eval`)."""

from __future__ import annotations

import argparse


def add_ray_arguments(p: argparse.ArgumentParser, what: str) -> None:
    """`what`: what the workers share out (in the help)."""
    p.add_argument("--ray", nargs="?", const="", default=None, metavar="ADDRESS",
                   help=f"spread {what} over a Ray cluster: ADDRESS (host:port, or 'auto' for "
                        "the cluster this machine is in); without one, $RAY_ADDRESS or a new "
                        'local instance (pip install "sparsellm[ray]")')
    p.add_argument("--workers", type=int, default=None,
                   help="with --ray: engines run at once, each with --num-cores threads "
                        "(default: the cluster's CPUs / --num-cores)")


def check_ray_arguments(args: argparse.Namespace) -> None:
    if args.workers is not None and args.ray is None:
        raise ValueError("--workers is for --ray (a cluster's engines; a local run has one)")

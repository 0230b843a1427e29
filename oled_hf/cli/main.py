"""``oled-moe``: one parser, one module per group of subcommands.

Each module exposes ``register(subparsers)`` and sets ``func`` on its parsers, so adding a
subcommand never touches the others.
"""

from __future__ import annotations

import argparse
import sys

from . import benchmark, chat, checkpoints, demo, report, serve, trace
from . import eval as eval_cmd
from .common import run_command

COMMAND_MODULES = [checkpoints, demo, chat, serve, trace, benchmark, eval_cmd, report]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="oled-moe", description="Run LLaDA2 MoE diffusion LLMs with expert offloading."
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module in COMMAND_MODULES:
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    return run_command(parser, args, args.command)


if __name__ == "__main__":
    sys.exit(main())

"""``oled-moe``: one parser, one module per group of subcommands.

Each module exposes ``register(subparsers)`` and sets ``func`` on its parsers, so adding a
subcommand never touches the others. A subcommand's options are added only for the command being
run (``common.add_command``, ``common.configure_commands``), and every module imports torch,
transformers and the rest of the package inside the functions that run: ``oled-moe --help`` and
``--version`` import neither (under 2 s; they took 37 s on a busy machine).
"""

from __future__ import annotations

import argparse
import sys

from . import benchmark, chat, checkpoints, demo, report, serve, trace
from . import eval as eval_cmd
from .common import HelpFormatter, Parser, add_debug_argument, configure_commands, run_command

COMMAND_MODULES = [checkpoints, demo, chat, serve, trace, benchmark, eval_cmd, report]


def version_text() -> str:
    """``oled-moe X.Y.Z``: the version of the code running, from the one place pyproject.toml reads it too.

    Not package metadata, which in a clone or an editable install is whatever was installed last.
    """
    from ..modeling.auto_map import CODE_VERSION

    return f"oled-moe {CODE_VERSION}"


def build_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    """The ``oled-moe`` parser; ``argv``: only the command it names gets its options (None: every command)."""
    parser = Parser(
        prog="oled-moe", description="Run LLaDA2 MoE diffusion LLMs with expert offloading.",
        formatter_class=HelpFormatter,
    )
    add_debug_argument(parser)
    parser.add_argument("--version", action="version", version=version_text(), help="print the version and exit")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module in COMMAND_MODULES:
        module.register(sub)
    configure_commands(parser, argv)
    for p in subparsers_of(parser):
        p.formatter_class = HelpFormatter  # every subcommand's help shows its defaults
    return parser


def subparsers_of(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    """Every parser below ``parser`` (``trace record`` included), for settings all of them share."""
    found = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in dict.fromkeys(action.choices.values()):  # aliases map to the same parser
                found += [child, *subparsers_of(child)]
    return found


def command_name(args: argparse.Namespace) -> str | None:
    """``trace record`` rather than ``trace``, for error lines."""
    parts = [getattr(args, "command", None), getattr(args, "trace_command", None)]
    return " ".join(p for p in parts if p) or None


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser(argv)
    args = parser.parse_args(argv)
    return run_command(parser, args, command_name(args))


if __name__ == "__main__":
    sys.exit(main())

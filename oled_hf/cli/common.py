"""What every ``oled-moe`` subcommand shares: model options and how a command is run.

A leaf module: the subcommand modules import it, and it imports none of them, so a subcommand
can run on its own (``python -m oled_hf.cli.chat``) without going through ``main``.
"""

from __future__ import annotations

import argparse
import os
import sys


def add_model_arguments(p: argparse.ArgumentParser) -> None:
    """Loading and decoding options shared by ``chat`` and ``serve``."""
    from ..offload.config import KNOWN_POLICIES

    p.add_argument("--model", default=None,
                   help="checkpoint folder (default: the trained toy checkpoint, when available)")
    p.add_argument("--device", default="auto", help="cpu, cuda, cuda:N, or auto (cuda when available)")
    p.add_argument("--cache-size", type=int, default=None,
                   help="offload experts, keeping this many expert slots per MoE layer on the device")
    p.add_argument("--policy", choices=KNOWN_POLICIES, default=None,
                   help="expert-cache retention policy (with --cache-size; default oled)")
    p.add_argument("--block-length", type=int, default=None,
                   help="diffusion block length (default: the checkpoint's generation_config)")
    p.add_argument("--threshold", type=float, default=None,
                   help="confidence threshold to commit a token (default: the checkpoint's generation_config)")


def run_command(parser: argparse.ArgumentParser, args: argparse.Namespace, command: str | None) -> int:
    """Run a parsed command; a user error is one line on stderr and exit status 2."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except (ValueError, FileNotFoundError) as err:
        print(f"oled-moe {command}: error: {err}", file=sys.stderr)
        return 2


def standalone(name: str, configure, help_text: str, argv: list[str] | None) -> int:
    """Run one subcommand as its own program, with the parser ``oled-moe NAME`` would use."""
    parser = argparse.ArgumentParser(prog=f"oled-moe {name}", description=help_text)
    configure(parser)
    return run_command(parser, parser.parse_args(argv), name)

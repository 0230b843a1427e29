"""Old flag spellings kept working for a while: each use prints one warning line naming the new one.

One concept has one name in every command (``--system`` for the offloading system,
``--max-new-tokens`` for the answer length); the names the commands had before (``--policy``,
``--offload-system``, ``--max-tokens``, ``--gen-length``) still parse, so a script written for an
older release runs, and says on stderr what to write instead. Why not ``warnings.warn``: a
command line's user reads stderr, not a Python warning filter, and one line per flag is enough.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any


def deprecation_line(prog: str, old: str, advice: str) -> str:
    """``oled-moe chat: warning: --max-tokens is deprecated and will be removed; use --max-new-tokens``."""
    return f"{prog}: warning: {old} is deprecated and will be removed; {advice}"


class DeprecatedAlias(argparse.Action):
    """An old spelling of another flag: it stores into that flag's ``dest`` and warns once per use.

    ``new``: the flag to write instead (named in the warning); ``convert``: turns the old value
    into the new flag's (``--policy lru`` -> the system ``lru+cpu+adaptive``) and says so in the
    advice; it may raise ``argparse.ArgumentTypeError`` for a value the old flag did not take.
    """

    def __init__(self, option_strings: list[str], dest: str, *, new: str,
                 convert: Callable[[Any], tuple[Any, str]] | None = None, **kwargs: Any) -> None:
        self.new, self.convert = new, convert
        kwargs.setdefault("help", f"deprecated: use {new} (default: {new}'s)")
        super().__init__(option_strings, dest, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        advice = f"use {self.new}"
        if self.convert is not None:
            try:
                values, advice = self.convert(values)
            except (argparse.ArgumentTypeError, ValueError) as err:
                raise argparse.ArgumentError(self, str(err)) from None
        print(deprecation_line(parser.prog, option_string or self.option_strings[0], advice), file=sys.stderr)
        setattr(namespace, self.dest, values)


class DeprecatedFlag(argparse.Action):
    """A flag kept with its old meaning, warning once per use; ``advice(values)`` says what to write instead."""

    def __init__(self, option_strings: list[str], dest: str, *, advice: Callable[[Any], str], **kwargs: Any) -> None:
        self.advice = advice
        super().__init__(option_strings, dest, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        print(deprecation_line(parser.prog, option_string or self.option_strings[0], self.advice(values)),
              file=sys.stderr)
        setattr(namespace, self.dest, values)


def add_alias(p: argparse.ArgumentParser, old: str, new: str, dest: str, **kwargs: Any) -> None:
    """Register ``old`` as a deprecated spelling of the flag ``new`` (which stores into ``dest``)."""
    p.add_argument(old, dest=dest, action=DeprecatedAlias, new=new, default=argparse.SUPPRESS, **kwargs)

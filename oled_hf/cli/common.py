"""What every ``oled-moe`` subcommand shares: model options, the model-path resolver, how a command is run.

A leaf module: the subcommand modules import it, and it imports none of them, so a subcommand
can run on its own (``python -m oled_hf.cli.chat``) without going through ``main``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sys
import threading
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path

MAKE_ONE = ("`oled-moe make-tiny DIR` writes a random-weight checkpoint, "
            "`oled-moe prepare SRC DIR` links an official one")


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Every option's help ends with its default, as the reference tool's does: ``(default: X)``.

    Unlike ``ArgumentDefaultsHelpFormatter``, a help text that already says what its default is
    (``default: the checkpoint's generation_config``) is left alone, and flags are not shown as
    ``(default: False)``.
    """

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        unset = any(action.default is v for v in (None, False, argparse.SUPPRESS))
        if "default" in text or unset or not action.option_strings:
            return text
        return f"{text} (default: %(default)s)"


class Parser(argparse.ArgumentParser):
    """argparse's parser whose usage errors are one line, as every other ``oled-moe`` error is.

    argparse prints the whole usage (a dozen lines for ``serve``) above the error; the line that
    matters is the last, so that is the one printed, with where the usage is. Subparsers inherit it.
    """

    def error(self, message: str):  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {one_line(ValueError(message))} (see {self.prog} --help)\n")


def add_command(sub: argparse._SubParsersAction, name: str, help: str,
                configure: Callable[[argparse.ArgumentParser], None],
                description: str | None = None) -> argparse.ArgumentParser:
    """A subcommand whose options ``configure`` adds only when :func:`configure_commands` is told
    it runs (or shows its help).

    Why: adding a command's options may import what running it needs (the system grammar, the
    simulator's flags); ``oled-moe --help`` lists every command and should import none of it.
    """
    p = sub.add_parser(name, help=help, description=description or help)
    p.set_defaults(func=lambda args: p.print_help() or 2)  # until configure sets the command's own
    vars(p)["_oled_configure"] = configure
    return p


def configure_commands(parser: argparse.ArgumentParser, argv: list[str] | None) -> None:
    """Add the options of the command ``argv`` names (and of its subcommands); None: of every command.

    The command is the first word of ``argv`` that is not an option: above a subcommand the
    parsers take only flags without values (``--debug``, ``--version``, ``-h``).
    """
    for action in parser._actions:
        if not isinstance(action, argparse._SubParsersAction):
            continue
        words = [w for w in argv if not w.startswith("-")] if argv is not None else None
        wanted = words[0] if words else None
        for name, child in action.choices.items():
            if argv is not None and name != wanted:
                continue
            configure = vars(child).pop("_oled_configure", None)
            if configure is not None:
                configure(child)
            configure_commands(child, None if argv is None else argv[argv.index(name) + 1:])


def resolve_device(device: str, source: str | None = None) -> str:
    """``device`` resolved (``auto``: the accelerator when there is one) and checked against this
    machine, or a ValueError naming it.

    Why here: every subcommand resolves its ``--device`` through this one function, so a
    ``--device cuda`` on a machine without CUDA is the same one-line error everywhere, before a
    model loads, instead of a traceback from deep inside ``from_pretrained`` (or a quiet CPU run).
    """
    import torch

    source = source or f"--device {device}"  # how the user wrote it, for the error line
    resolved = "cuda" if device == "auto" and torch.cuda.is_available() else "cpu" if device == "auto" else device
    allowed = "allowed: auto, cpu, cuda, cuda:N"
    try:
        dev = torch.device(resolved)
    except (RuntimeError, ValueError, TypeError):
        raise ValueError(f"{source}: not a device ({allowed})") from None
    if dev.type == "cpu":
        return resolved
    if dev.type != "cuda":
        raise ValueError(f"{source}: oled-moe runs on cpu or cuda ({allowed})")
    if not torch.cuda.is_available():
        raise ValueError(f"{source}: CUDA is not available on this machine (torch.cuda.is_available() "
                         "is False); use --device cpu or --device auto")
    count = torch.cuda.device_count()
    if dev.index is not None and dev.index >= count:
        raise ValueError(f"{source}: this machine has {count} CUDA device(s) (allowed: cuda:0 to "
                         f"cuda:{count - 1})")
    return resolved


def default_model_path() -> Path | None:
    """The trained toy checkpoint the package ships, or None when this install has no ``oled_hf.toy``."""
    try:
        from ..toy import TOY_CHECKPOINT
    except ImportError:
        return None
    return Path(TOY_CHECKPOINT)


def resolve_model(model: str | os.PathLike | None, flag: str = "--model") -> Path:
    """The checkpoint folder a command should load, or a ValueError naming the path and what is missing.

    One resolver for every subcommand, so a wrong path reads the same everywhere and never reaches
    the hub client (whose "Repo id must use alphanumeric chars" says nothing about the folder).
    A hub id (``ORG/NAME[@REVISION]``) that is not a local path becomes its snapshot folder in the
    HF cache (``checkpoints.hub``: offline, only the cache answers), checked like any folder.
    Nothing is ever written here but the hub's own cache: a missing model is an error.
    """
    if model is None:
        path = default_model_path()
        if path is None:
            raise ValueError(f"{flag} is required (a checkpoint folder: {MAKE_ONE})")
        if not (path / "config.json").is_file():
            raise ValueError(f"no {flag} given and the default toy checkpoint {path} is not built "
                             f"(python -m oled_hf.toy.train {path} trains it); pass {flag} PATH")
        return path
    from ..checkpoints.hub import expand_user, resolve_checkpoint

    path = resolve_checkpoint(model, flag)  # an id spelled ORG/NAME that is not cached raises there
    if not path.exists():
        raise ValueError(f"{flag} {model}: no such folder (give a checkpoint folder with config.json; {MAKE_ONE})")
    shown = model if path == expand_user(model, flag) else f"{model} (hub snapshot {path})"
    if not path.is_dir():
        raise ValueError(f"{flag} {shown} is a file, not a checkpoint folder (one holding config.json)")
    config = path / "config.json"
    if not config.is_file():
        raise ValueError(f"{flag} {shown}: no config.json in that folder, so it is not a checkpoint ({MAKE_ONE})")
    model_type = _model_type(config)
    if not model_type:
        raise ValueError(f"{flag} {shown}: its config.json has no model_type, so Transformers cannot load it "
                         f"({MAKE_ONE})")
    if model_type == "llada2_moe":
        raise ValueError(f"{flag} {shown} is an official LLaDA2 checkpoint (model_type llada2_moe); "
                         f"run `oled-moe prepare {model} OUT` and pass --model OUT")
    return path


def served_model_name(path: Path) -> str:
    """The name clients use for ``path``: its config's ``oled_model_name``, else the hub id of a HF
    cache snapshot, else the folder's name.

    The shipped toy lives in a folder called ``checkpoint``, a snapshot in one named by its commit
    hash: neither says anything to a client.
    """
    from ..checkpoints.hub import hub_id_of

    try:
        name = json.loads((Path(path) / "config.json").read_text()).get("oled_model_name")
    except (OSError, ValueError, AttributeError):
        name = None
    if isinstance(name, str) and name:
        return name
    return hub_id_of(path) or Path(path).resolve().name


def _model_type(config: Path) -> str | None:
    try:
        data = json.loads(config.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ValueError(f"{config} is not readable JSON: {err}") from err
    if not isinstance(data, dict):
        raise ValueError(f"{config} does not hold a JSON object")
    return data.get("model_type")


def cpu_compute_note(stats: dict) -> str:
    """How misses were served, in words: every figure that depends on it (hit rate, CPU share) says so."""
    mode, asked = stats.get("cpu_compute", "?"), stats.get("cpu_compute_requested")
    if asked == "auto" and mode == "off":
        return "CPU compute off (auto: no accelerator, host and device are the same cores; every miss is copied)"
    if mode == "off":
        return "CPU compute off (every miss is copied)"
    return f"CPU compute {mode} (misses may run on the CPU where the cost model finds it cheaper)"


def user_error_types() -> tuple[type[BaseException], ...]:
    """What loading a bad checkpoint or bad input raises: reported as one line, not a traceback."""
    types: list[type[BaseException]] = [ValueError, OSError]  # JSONDecodeError, FileNotFoundError included
    try:
        from safetensors import SafetensorError

        types.append(SafetensorError)
    except ImportError:
        pass
    return tuple(types)


# what an optional dependency is installed with (pyproject.toml's extras)
EXTRAS = {"scipy": "eval", "lm_eval": "eval", "datasets": "eval", "evaluate": "eval", "fastapi": "serve",
          "uvicorn": "serve", "openai": "serve", "httpx": "serve", "prometheus_client": "serve", "matplotlib": "plot"}


def missing_extra(err: ModuleNotFoundError) -> str | None:
    """``scipy is not installed; pip install 'oled-hf[eval]'`` for an optional dependency, else None."""
    top = (err.name or "").split(".")[0]
    extra = EXTRAS.get(top)
    if extra is None:
        return None
    return f"{top} is not installed (it comes with the {extra} extra): pip install 'oled-hf[{extra}]'"


def one_line(err: BaseException) -> str:
    """An exception's message on one line (transformers' OSErrors span several)."""
    text = " ".join(str(err).split())
    return text or type(err).__name__


def add_debug_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument("--debug", action="store_true", help="show the full traceback of an error")


def run_command(parser: argparse.ArgumentParser, args: argparse.Namespace, command: str | None) -> int:
    """Run a parsed command; a user error is one line on stderr and exit status 2 (``--debug``: traceback)."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    from ..progress import quiet_library_bars

    quiet_library_bars(getattr(args, "quiet", False))  # no "Loading weights" bars in pipes or with --quiet
    try:
        with terminate_as_interrupt():
            return int(args.func(args) or 0)
    except KeyboardInterrupt:  # Ctrl-C (or SIGTERM): what a command half-wrote was removed on the way out
        if getattr(args, "debug", False):
            traceback.print_exc()
        print(f"oled-moe {command}: interrupted; files it was writing were removed", file=sys.stderr)
        return 130
    except ModuleNotFoundError as err:
        message = missing_extra(err)
        if message is None:
            raise
        if getattr(args, "debug", False):
            traceback.print_exc()
        print(f"oled-moe {command}: error: {message}", file=sys.stderr)
        return 2
    except user_error_types() as err:
        if getattr(args, "debug", False):
            traceback.print_exc()
        print(f"oled-moe {command}: error: {one_line(err)}", file=sys.stderr)
        return 2


@contextlib.contextmanager
def terminate_as_interrupt() -> Iterator[None]:
    """SIGTERM (``kill``, a scheduler's timeout) raises KeyboardInterrupt while a command runs, as Ctrl-C does.

    Python's default SIGTERM ends the process at once: no ``finally`` runs, so a checkpoint being
    written stayed as a hidden temporary folder. As an exception it unwinds through the writers,
    which remove what they half-wrote. Only in the main thread (where signals can be set).
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum, frame):
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def standalone(name: str, configure, help_text: str, argv: list[str] | None) -> int:
    """Run one subcommand as its own program, with the parser ``oled-moe NAME`` would use."""
    parser = Parser(prog=f"oled-moe {name}", description=help_text, formatter_class=HelpFormatter)
    configure(parser)
    add_debug_argument(parser)
    return run_command(parser, parser.parse_args(argv), name)

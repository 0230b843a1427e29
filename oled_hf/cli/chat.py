"""``oled-moe chat``: a conversation in the terminal, each diffusion block printed as it is decoded.

From a terminal it shows a ``>>>`` prompt; from a pipe it reads one user turn per line until end
of input and prints only the replies (one per turn, newline-terminated) and command output on
stdout, so it can be scripted. Loading messages and errors go to stderr.
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TextIO

from ..options.aliases import add_alias, deprecation_line
from ..options.budget import budget_choices, check_budget_device
from ..serve.options import (
    SYSTEM_HELP,
    add_serving_model_arguments,
    add_system_argument,
    live_system,
    loading_problem,
    max_model_len_problem,
    model_argument,
)
from .common import add_command, resolve_device, resolve_model, standalone

PROMPT = ">>> "
HELP = """commands:
  /help    show this help
  /clear   forget the conversation and start over
  /stats   the last reply's figures and the expert cache's (hit rate, bytes copied, CPU share);
           /stats layers adds one row per MoE layer (numbered as the model's decoder layers, from 1)
  /exit    quit (also /quit, Ctrl-D, or the end of piped input)
anything else is sent to the model as your next message"""


DESCRIPTION = "chat with a model; replies stream block by block (reads a pipe too)"


def register(sub: argparse._SubParsersAction) -> None:
    add_command(sub, "chat", DESCRIPTION, configure)


def configure(p: argparse.ArgumentParser) -> None:
    add_serving_model_arguments(p)
    add_system_argument(p, action=SystemOrPrompt, type=None,
                        help=f"{SYSTEM_HELP}; a value with a space is read as the system prompt, as this flag did "
                             "before (deprecated: use --system-prompt)")
    p.add_argument("--system-prompt", default=None, metavar="TEXT", help="the system prompt (default: none)")
    p.add_argument("--max-new-tokens", type=int, default=256, help="most new tokens per reply")
    add_alias(p, "--max-tokens", "--max-new-tokens", "max_new_tokens", type=int, metavar="N")
    p.set_defaults(func=chat)


SYSTEM_NAME = re.compile(r"[A-Za-z0-9_.+-]+")  # what a system name (a preset, or parts joined by '+') is made of


class SystemOrPrompt(argparse.Action):
    """chat's ``--system``: the offloading system, as in every command; a value no system name could
    be (a space, punctuation) is the system prompt, this flag's meaning before ``--system-prompt``,
    with one deprecation line, so an old ``--system "You are terse."`` still runs as it did."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values,
                 option_string: str | None = None) -> None:
        if SYSTEM_NAME.fullmatch(values):
            try:
                namespace.system = live_system(values)
            except argparse.ArgumentTypeError as err:
                raise argparse.ArgumentError(self, f"{err} (a system prompt is --system-prompt TEXT)") from None
            return
        print(deprecation_line(parser.prog, "--system TEXT for the system prompt", "use --system-prompt TEXT"),
              file=sys.stderr)
        namespace.system_prompt = values


class ChatSession:
    def __init__(self, model, tokenizer, max_tokens: int, block_length: int | None, threshold: float | None,
                 system: str | None = None, out=None, max_model_len: int | None = None):
        self.model, self.tokenizer, self.max_tokens = model, tokenizer, max_tokens
        self.context = int(model.config.max_position_embeddings)
        if max_model_len is not None:
            self.context = min(self.context, int(max_model_len))
        self.block_length, self.threshold, self.system = block_length, threshold, system
        self.out = out or sys.stdout
        self.history: list[dict[str, str]] = []
        self.last: str | None = None
        # a model trained on single-turn prompts only answers the first message of a conversation;
        # for one that says so in its config, each message is sent on its own
        self.single_turn = bool(getattr(model.config, "oled_single_turn", False))

    def clear(self) -> None:
        self.history = []

    def _messages(self, user: str) -> list[dict[str, str]]:
        head = [{"role": "system", "content": self.system}] if self.system else []
        history = [] if self.single_turn else self.history
        return head + history + [{"role": "user", "content": user}]

    def reply(self, user: str) -> str:
        """Generate and print the answer block by block; the turn is kept only if it completed."""
        from ..serve.streaming import BlockTextStreamer

        inputs = self.tokenizer.apply_chat_template(self._messages(user), add_generation_prompt=True,
                                                    return_tensors="pt", return_dict=True)
        prompt_len = int(inputs["input_ids"].shape[1])
        gen = getattr(self.model, "generation_config", None)
        block = self.block_length or getattr(gen, "block_length", None) or 32
        context = self.context
        room = context // block * block - prompt_len
        if room < 1:
            raise ValueError(f"the conversation ({prompt_len} tokens) fills the context of {context} tokens "
                             "(the model's, or --max-model-len); /clear to start over")

        def show(text: str) -> None:
            self.out.write(text)
            self.out.flush()

        streamer = BlockTextStreamer(self.tokenizer, show)
        kwargs = {"max_new_tokens": min(self.max_tokens, room), "block_length": block}
        if self.threshold is not None:
            kwargs["threshold"] = self.threshold
        inputs = {k: v.to(self.model.device) for k, v in inputs.items()}
        start = time.perf_counter()
        try:
            out = self.model.generate(**inputs, streamer=streamer, return_dict_in_generate=True, **kwargs)
        finally:
            show("\n")
        seconds = time.perf_counter() - start
        new_tokens = int(out.sequences.shape[1]) - prompt_len
        self.last = (f"last reply: {new_tokens} tokens, {int(out.iterations[0])} iterations over "
                     f"{int(out.blocks[0])} blocks ({float(out.tokens_per_forward[0]):.2f} tokens per forward), "
                     f"{seconds:.2f} s")
        self.history += [{"role": "user", "content": user}, {"role": "assistant", "content": streamer.text}]
        return streamer.text

    def stats(self, per_layer: bool = False) -> str:
        """The last reply and the expert cache since load, as a short table (``per_layer``: one row a layer)."""
        lines = [self.last] if self.last else []
        stats = self.model.offload_stats() if hasattr(self.model, "offload_stats") else None
        if not isinstance(stats, dict):
            lines.append("offloading off (load with --cache-size N to offload experts)")
            return "\n".join(lines)
        from .common import cpu_compute_note

        total = stats["total"]
        lines.append(f"expert cache since load: policy {stats['policy']}, {stats['total_slots']} slots "
                     f"({stats['slots_per_layer']:.1f} per MoE layer) on {stats['device']}; {cpu_compute_note(stats)}")
        rows = [("hit rate", f"{total['hit_rate']:.3f}  ({total['hits']} hits, {total['misses']} misses)"),
                ("bytes copied", f"{total['bytes_copied'] / 2**20:.2f} MiB  ({total['evictions']} evictions)"),
                ("CPU share", f"{cpu_share(self.model, total):.3f}  ({total['cpu_expert_tokens']} CPU expert-tokens)"),
                ("forwards", str(total["forwards"]))]
        lines += [f"  {name:<14}{value}" for name, value in rows]
        if per_layer:
            from ..serve.metrics import moe_layer_numbers

            numbers = moe_layer_numbers(self.model.config, len(stats["layers"]))
            lines.append("  layer  slots  hit rate  MiB copied  CPU expert-tokens   (layer: decoder layer, from 1)")
            lines += [f"  {n:>5}  {r['capacity']:>5}  {r['hit_rate']:>8.3f}  "
                      f"{r['bytes_copied'] / 2**20:>10.2f}  {r['cpu_expert_tokens']:>17}"
                      for n, r in zip(numbers, stats["layers"])]
        else:
            lines.append("  (/stats layers: per MoE layer)")
        return "\n".join(lines)


def cpu_share(model, total: dict) -> float:
    """CPU expert-tokens over all routed expert-tokens (device + CPU) since load."""
    runtime = getattr(model, "_offload_runtime", None)
    device_tokens = int(sum(runtime.controller.stats.gpu_expert_tokens)) if runtime is not None else 0
    cpu = int(total["cpu_expert_tokens"])
    return cpu / (cpu + device_tokens) if cpu + device_tokens else 0.0


def _lines(interactive: bool):
    if not interactive:
        yield from piped_lines(sys.stdin, sys.stderr)
        return
    while True:
        try:
            yield input(PROMPT)
        except UnicodeDecodeError as err:  # the terminal sent bytes its encoding cannot decode
            print(f"error: {undecodable(err)}; the line was skipped", file=sys.stderr, flush=True)
        except (EOFError, KeyboardInterrupt):
            print(file=sys.stderr)
            return


def piped_lines(stdin: TextIO, stderr: TextIO) -> Iterator[str]:
    """The lines of piped input; one that is not text in stdin's encoding is reported and skipped.

    One stray byte (a binary file, a Latin-1 export) used to end the whole scripted session with a
    traceback; a line is decoded on its own so that only that line is lost, and it is not sent to
    the model as replacement characters the user never typed.
    """
    raw = getattr(stdin, "buffer", None)
    if raw is None:  # already text (a StringIO)
        yield from stdin
        return
    encoding = stdin.encoding or "utf-8"
    for number, line in enumerate(raw, 1):
        try:
            yield line.decode(encoding)
        except UnicodeDecodeError as err:
            print(f"error: input line {number}: {undecodable(err)}; the line was skipped", file=stderr, flush=True)


def undecodable(err: UnicodeDecodeError) -> str:
    """``not valid utf-8 text (byte 0xff at position 3)``: what one-line message shows of a decode error."""
    return f"not valid {err.encoding} text (byte 0x{err.object[err.start]:02x} at position {err.start})"


def chat(args: argparse.Namespace) -> int:
    from ..serve.engine import load_model

    if args.max_new_tokens < 1:
        raise ValueError(f"--max-new-tokens {args.max_new_tokens} is invalid: must be at least 1")
    if args.block_length is not None and args.block_length < 1:
        raise ValueError(f"--block-length {args.block_length} is invalid: must be at least 1")
    if args.threshold is not None and not 0.0 <= args.threshold <= 1.0:
        raise ValueError(f"--threshold {args.threshold} is invalid: must be between 0 and 1")
    problem = loading_problem(args)
    if problem:
        raise ValueError(problem)
    path = str(resolve_model(model_argument(args)))
    problem = max_model_len_problem(Path(path), args.max_model_len)
    if problem:
        raise ValueError(problem)
    device = resolve_device(args.device)  # a --device this machine lacks: one line, before anything loads
    budgets = budget_choices(args)
    check_budget_device(budgets, device)
    model, tokenizer = load_model(path, device=device, budget=budgets[0] if budgets else None,
                                  dtype=args.dtype, system=args.system)
    session = ChatSession(model, tokenizer, args.max_new_tokens, args.block_length, args.threshold,
                          args.system_prompt, max_model_len=args.max_model_len)
    interactive = sys.stdin.isatty()
    offloading = bool(budgets)
    print(f"loaded {path} on {model.device} (offloading {'on' if offloading else 'off'}); /help for commands",
          file=sys.stderr, flush=True)
    if session.single_turn:
        print("note: this model was trained on single-turn prompts (oled_single_turn in its config.json): "
              "each message is sent without the earlier turns", file=sys.stderr, flush=True)
    for raw in _lines(interactive):
        line = raw.strip()
        if not line:
            continue
        command = line.split()[0].lower() if line.startswith("/") else None
        if command in ("/exit", "/quit"):
            break
        if command == "/help":
            print(HELP, flush=True)
        elif command == "/clear":
            session.clear()
            print("(conversation cleared)", flush=True)
        elif command == "/stats":
            print(session.stats(per_layer="layers" in line.split()[1:]), flush=True)
        elif command is not None:
            print(f"unknown command {command}; /help lists the commands", file=sys.stderr, flush=True)
        else:
            try:
                session.reply(line)
            except ValueError as err:
                print(f"error: {err}", file=sys.stderr, flush=True)
            except KeyboardInterrupt:
                if not interactive:
                    raise
                print("(interrupted; the turn was dropped)", file=sys.stderr, flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    """Run ``chat`` on its own (``python -m oled_hf.cli.chat --model ./tiny``), as ``oled-moe chat`` would."""
    return standalone("chat", configure, DESCRIPTION, argv)


if __name__ == "__main__":
    sys.exit(main())

"""``oled-moe chat``: a conversation in the terminal, each diffusion block printed as it is decoded.

From a terminal it shows a ``>>>`` prompt; from a pipe it reads one user turn per line until end
of input and prints only the replies (one per turn, newline-terminated) and command output on
stdout, so it can be scripted. Loading messages and errors go to stderr.
"""

from __future__ import annotations

import argparse
import sys
import time

from .common import add_model_arguments, standalone

PROMPT = ">>> "
HELP = """commands:
  /help    show this help
  /clear   forget the conversation and start over
  /stats   expert-offloading statistics (cache hit rate, bytes copied, CPU expert-tokens) and the last reply's
  /exit    quit (also /quit, Ctrl-D, or the end of piped input)
anything else is sent to the model as your next message"""


DESCRIPTION = "chat with a model; replies stream block by block (reads a pipe too)"


def register(sub: argparse._SubParsersAction) -> None:
    configure(sub.add_parser("chat", help=DESCRIPTION))


def configure(p: argparse.ArgumentParser) -> None:
    add_model_arguments(p)
    p.add_argument("--max-tokens", type=int, default=256, help="most tokens per reply")
    p.add_argument("--system", default=None, help="system prompt")
    p.set_defaults(func=chat)


class ChatSession:
    def __init__(self, model, tokenizer, max_tokens: int, block_length: int | None, threshold: float | None,
                 system: str | None = None, out=None):
        self.model, self.tokenizer, self.max_tokens = model, tokenizer, max_tokens
        self.block_length, self.threshold, self.system = block_length, threshold, system
        self.out = out or sys.stdout
        self.history: list[dict[str, str]] = []
        self.last: str | None = None

    def clear(self) -> None:
        self.history = []

    def _messages(self, user: str) -> list[dict[str, str]]:
        head = [{"role": "system", "content": self.system}] if self.system else []
        return head + self.history + [{"role": "user", "content": user}]

    def reply(self, user: str) -> str:
        """Generate and print the answer block by block; the turn is kept only if it completed."""
        from ..serve.streaming import BlockTextStreamer

        inputs = self.tokenizer.apply_chat_template(self._messages(user), add_generation_prompt=True,
                                                    return_tensors="pt", return_dict=True)
        prompt_len = int(inputs["input_ids"].shape[1])
        gen = getattr(self.model, "generation_config", None)
        block = self.block_length or getattr(gen, "block_length", None) or 32
        context = int(self.model.config.max_position_embeddings)
        room = context // block * block - prompt_len
        if room < 1:
            raise ValueError(f"the conversation ({prompt_len} tokens) fills the model's context of {context} "
                             "tokens; /clear to start over")

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

    def stats(self) -> str:
        lines = [self.last] if self.last else []
        stats = self.model.offload_stats() if hasattr(self.model, "offload_stats") else None
        if stats is None:
            lines.append("offloading off (load with --cache-size N to offload experts)")
            return "\n".join(lines)
        if not isinstance(stats, dict):
            stats = stats.to_dict() if hasattr(stats, "to_dict") else vars(stats)
        lines.append("offloading on (totals since load):")
        total = stats.get("total") if isinstance(stats.get("total"), dict) else {}
        for key, value in {**stats, **total}.items():
            if isinstance(value, (int, float, str)) and not isinstance(value, bool):
                lines.append(f"  {key}: {value:.4g}" if isinstance(value, float) else f"  {key}: {value}")
        layers = stats.get("layers")
        if isinstance(layers, list) and layers and all(isinstance(r, dict) and "hit_rate" in r for r in layers):
            lines.append("  hit rate per MoE layer: " + " ".join(f"{float(r['hit_rate']):.2f}" for r in layers))
        return "\n".join(lines)


def _lines(interactive: bool):
    if not interactive:
        yield from sys.stdin
        return
    while True:
        try:
            yield input(PROMPT)
        except (EOFError, KeyboardInterrupt):
            print(file=sys.stderr)
            return


def chat(args: argparse.Namespace) -> int:
    from ..serve.engine import load_model, resolve_model_path

    if args.max_tokens < 1:
        raise ValueError(f"--max-tokens {args.max_tokens} is invalid: must be at least 1")
    if args.block_length is not None and args.block_length < 1:
        raise ValueError(f"--block-length {args.block_length} is invalid: must be at least 1")
    if args.threshold is not None and not 0.0 <= args.threshold <= 1.0:
        raise ValueError(f"--threshold {args.threshold} is invalid: must be between 0 and 1")
    path = resolve_model_path(args.model)
    model, tokenizer = load_model(path, device=args.device, cache_size=args.cache_size, policy=args.policy)
    session = ChatSession(model, tokenizer, args.max_tokens, args.block_length, args.threshold, args.system)
    interactive = sys.stdin.isatty()
    print(f"loaded {path} on {model.device} (offloading {'on' if args.cache_size else 'off'}); /help for commands",
          file=sys.stderr, flush=True)
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
            print(session.stats(), flush=True)
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

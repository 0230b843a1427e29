"""A ``generate`` streamer that turns each completed diffusion block into new text.

``generate`` calls ``put(prompt)`` once, then ``put(tokens)`` after every completed block, then
``end()``. Each block's text is the difference between the decoded completion so far and what has
already been handed out, so the pieces always concatenate to the final text. Two things are held
back until the next block (or the end): a trailing U+FFFD (a UTF-8 character whose bytes are split
across blocks) and a tail that could be the start of a stop sequence. A stop sequence ends the text
before it, as OpenAI's ``stop`` does.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence

REPLACEMENT = "\ufffd"


class LockedTokenizer:
    """Serialises a tokenizer shared between threads (the HTTP loop encodes, the worker decodes)."""

    def __init__(self, tokenizer, lock: threading.RLock | None = None):
        self._tokenizer = tokenizer
        self.lock = lock or threading.RLock()

    def decode(self, *args, **kwargs):
        with self.lock:
            return self._tokenizer.decode(*args, **kwargs)

    def __call__(self, *args, **kwargs):
        with self.lock:
            return self._tokenizer(*args, **kwargs)

    def apply_chat_template(self, *args, **kwargs):
        with self.lock:
            return self._tokenizer.apply_chat_template(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._tokenizer, name)


def _held_stop_prefix(text: str, stops: Sequence[str]) -> int:
    """Length of the longest tail of ``text`` that is a proper prefix of a stop sequence."""
    longest = 0
    for stop in stops:
        for k in range(min(len(stop) - 1, len(text)), longest, -1):
            if text.endswith(stop[:k]):
                longest = k
                break
    return longest


class BlockTextStreamer:
    """Calls ``on_text(piece)`` once per completed block (``piece`` may be empty) and once at the end if needed."""

    def __init__(self, tokenizer, on_text: Callable[[str], None], stop: Sequence[str] = (),
                 on_start: Callable[[], None] | None = None):
        self.tokenizer, self.on_text, self.stop, self.on_start = tokenizer, on_text, list(stop), on_start
        self.token_ids: list[int] = []
        self.text = ""  # what has been handed out
        self.stop_hit = False
        self._prompt_seen = False

    def put(self, value) -> None:
        if not self._prompt_seen:  # generate's first call carries the prompt
            self._prompt_seen = True
            if self.on_start is not None:
                self.on_start()
            return
        self.token_ids.extend(int(t) for t in value.reshape(-1).tolist())
        self._emit(final=False, always=True)

    def end(self) -> None:
        self._emit(final=True, always=False)

    def _emit(self, final: bool, always: bool) -> None:
        piece = "" if self.stop_hit else self._advance(final)
        if piece or always:
            self.on_text(piece)

    def _advance(self, final: bool) -> str:
        text = self.tokenizer.decode(self.token_ids, skip_special_tokens=True)
        cuts = [i for i in (text.find(s) for s in self.stop) if i >= 0]
        if cuts:
            text, final, self.stop_hit = text[: min(cuts)], True, True
        if not final:
            text = text.rstrip(REPLACEMENT)
            text = text[: len(text) - _held_stop_prefix(text, self.stop)]
        if len(text) <= len(self.text) or not text.startswith(self.text):
            return ""
        piece, self.text = text[len(self.text):], text
        return piece

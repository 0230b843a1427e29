"""OpenAI's error body, the request body's decoding, the validated requests, and the token budget.

Every rejection is an :class:`APIError` (OpenAI's ``{"error": {message, type, param, code}}``).
:func:`parse_json` decodes a body; the fields are checked by the pydantic models of
:mod:`.schema` into :class:`ChatRequest` / :class:`CompletionRequest` (what the engine takes);
:func:`resolve_max_tokens` fits the completion to the context. ``presence_penalty`` and
``frequency_penalty`` (OpenAI's range, -2 to 2) are applied by ``serve/penalties.py``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

ROLES = ("system", "developer", "user", "assistant")
MAX_STOP_SEQUENCES = 4
SEED_RANGE = (-(2**63), 2**63 - 1)  # OpenAI: a 64-bit signed integer
# Below this, logits / temperature overflows float32 (1e-300 gives inf, then NaN probabilities), so
# sampling cannot be computed; vLLM clamps to the same floor. 0 still means greedy.
MIN_TEMPERATURE = 1e-2
MAX_TEMPERATURE = 2.0
# Python's default limit on int <-> str conversion (sys.int_info.default_max_str_digits): past it
# int() raises, and below it the conversion is quadratic, so longer integer literals are refused.
MAX_INT_DIGITS = 4300
CLIP = 64  # characters of a client's value echoed in an error message
PENALTY_RANGE = (-2.0, 2.0)  # presence_penalty / frequency_penalty, OpenAI's range (serve/penalties.py)


def clip(text: str, limit: int = CLIP) -> str:
    """``text`` cut to ``limit`` characters (an error must not echo a 100k-character name back)."""
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


class APIError(Exception):
    """An error answered as ``{"error": {"message", "type", "param", "code"}}``."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 type: str = "invalid_request_error"):
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.type = status, message, param, code, type

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def bad(message: str, param: str | None = None, code: str | None = None) -> APIError:
    return APIError(400, message, param=param, code=code)


@dataclass
class GenerationOptions:
    """What both endpoints share: sampling, length, stop sequences and the diffusion knobs."""

    model: str | None = None
    stream: bool = False
    include_usage: bool = False
    max_tokens: int | None = None
    stop: list[str] = field(default_factory=list)
    temperature: float | None = None
    top_p: float | None = None
    seed: int | None = None
    block_length: int | None = None
    threshold: float | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0


@dataclass
class ChatRequest(GenerationOptions):
    messages: list[dict[str, str]] = field(default_factory=list)


@dataclass
class CompletionRequest(GenerationOptions):
    prompt: str | list[int] = ""


class _LongInt:
    """An integer literal of more than MAX_INT_DIGITS digits, kept unconverted so the walk can name its field."""

    def __init__(self, digits: int):
        self.digits = digits


def _parse_int(text: str) -> int | _LongInt:
    digits = len(text) - text.startswith("-")
    return _LongInt(digits) if digits > MAX_INT_DIGITS else int(text)


def parse_json(raw: bytes) -> dict[str, Any]:
    """Decode a request body; refuse what ``json`` accepts but nothing downstream can handle.

    Python's ``json`` raises RecursionError on deep nesting (``[`` x 100000), ValueError on an
    integer of more than 4300 digits (in any field, even ``user``), and it decodes ``"\\ud800"``
    into a lone surrogate that cannot be encoded again (tokenizers and even the error answer
    would fail on it): all are the client's error, so all are a 400 here, naming the field.
    """
    try:
        body = json.loads(raw, parse_int=_parse_int)
    except RecursionError:
        raise bad("the request body is nested too deeply to parse (JSON arrays/objects nested about 1000 levels "
                  "or more)", code="invalid_json") from None
    except ValueError as err:  # JSONDecodeError, UnicodeDecodeError, or int() under a lower interpreter limit
        raise bad(f"the request body is not valid JSON ({clip(str(err), 200)})", code="invalid_json") from None
    problem = _unusable_value(body)
    if problem is not None:
        where, message, code = problem
        raise bad(message, param=where or None, code=code)
    if not isinstance(body, dict):
        raise bad(f"the request body must be a JSON object, got {type(body).__name__}", code="invalid_json")
    return body


def _unusable_value(body: Any) -> tuple[str, str, str] | None:
    """(path, message, code) for the first value no handler can use, else None.

    Such values are a string or key that is not valid Unicode, and an integer too long to convert;
    the path reads like ``messages[0].content``. Iterative, so that the deepest body ``json`` can
    parse cannot overflow the stack here.
    """
    stack: list[tuple[str, Any]] = [("", body)]
    while stack:
        path, value = stack.pop()
        if isinstance(value, _LongInt):
            where = f"'{path}'" if path else "the request body"
            return path, (f"{where} is an integer of {value.digits} digits: this server accepts integers of at "
                          f"most {MAX_INT_DIGITS} digits"), "invalid_value"
        if isinstance(value, str) and not _encodable(value):
            return _surrogate(path)
        if isinstance(value, dict):
            for key, item in value.items():
                if not _encodable(key):
                    return _surrogate(path or clip(key.encode("utf-8", "backslashreplace").decode()))
                stack.append((f"{path}.{key}" if path else key, item))
        elif isinstance(value, list):
            stack.extend((f"{path}[{i}]", item) for i, item in enumerate(value))
    return None


def _surrogate(path: str) -> tuple[str, str, str]:
    return path, (f"{path or 'the request body'} contains a lone UTF-16 surrogate (an unpaired \\ud800-\\udfff "
                  "escape): strings must be valid Unicode"), "invalid_json"


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def resolve_max_tokens(prompt_tokens: int, requested: int | None, default: int, block_length: int, context: int,
                       prompt_param: str) -> int:
    """The completion budget: requested (checked against the context) or the default (capped to fit)."""
    if prompt_tokens > context:
        raise bad(f"the prompt has {prompt_tokens} tokens, more than the model's context of {context} tokens",
                  param=prompt_param, code="context_length_exceeded")
    # The decoder works on whole blocks: prompt + completion rounded up to a block must fit.
    allowed = context // block_length * block_length - prompt_tokens
    if allowed < 1:
        raise bad(f"the prompt has {prompt_tokens} tokens, which leaves no room for a completion in the model's "
                  f"context of {context} tokens (blocks of {block_length})", param=prompt_param,
                  code="context_length_exceeded")
    if requested is None:
        return min(default, allowed)
    if requested > allowed:
        raise bad(f"'max_tokens' is {requested}, but the prompt has {prompt_tokens} tokens and the context is "
                  f"{context} tokens (blocks of {block_length}): at most {allowed} tokens can be generated",
                  param="max_tokens", code="context_length_exceeded")
    return requested

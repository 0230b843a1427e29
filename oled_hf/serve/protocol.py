"""OpenAI request bodies -> validated, typed requests; every rejection is an :class:`APIError`.

Validation is by hand rather than through pydantic models so that each message names the field
(``param``) the way OpenAI's own errors do, and so that wrong types (``"max_tokens": "5"``,
``true`` for an integer) are refused instead of coerced. Fields the server cannot honour in a way
that changes the answer (``n > 1``, several prompts, ``logprobs``, tools, ``tool_choice:
"required"``, ``function_call``, ``response_format`` other than text, a non-zero ``logit_bias``)
are refused, naming the field; their neutral values (``"none"``/``"auto"``, ``{"type": "text"}``,
``{}``) are accepted. ``presence_penalty`` and ``frequency_penalty`` (OpenAI's range, -2 to 2) are
applied (``serve/penalties.py``). Harmless unknown fields (``user``, ``metadata``...) are ignored,
as most OpenAI-compatible servers do.
"""

from __future__ import annotations

import json
import math
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


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _opt_int(body: dict, name: str, low: int, high: int | None = None) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if not _is_int(value):
        raise bad(f"'{name}' must be an integer, got {json.dumps(value)}", param=name, code="invalid_type")
    if value < low or (high is not None and value > high):
        upper = f" and at most {high}" if high is not None else ""
        raise bad(f"'{name}' must be at least {low}{upper}, got {value}", param=name, code="invalid_value")
    return value


def _opt_number(body: dict, name: str, low: float, high: float, low_open: bool = False) -> float | None:
    value = body.get(name)
    if value is None:
        return None
    if not _is_number(value):
        raise bad(f"'{name}' must be a number, got {json.dumps(value)}", param=name, code="invalid_type")
    if value > high or value < low or (low_open and value == low):
        interval = f"{'(' if low_open else '['}{low:g}, {high:g}]"
        raise bad(f"'{name}' must be in {interval}, got {value}", param=name, code="invalid_value")
    return float(value)


def _opt_bool(body: dict, name: str) -> bool:
    value = body.get(name)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise bad(f"'{name}' must be true or false, got {json.dumps(value)}", param=name, code="invalid_type")
    return value


def _stop(body: dict) -> list[str]:
    value = body.get("stop")
    if value is None:
        return []
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not all(isinstance(s, str) for s in items):
        raise bad("'stop' must be a string or a list of strings", param="stop", code="invalid_type")
    if len(items) > MAX_STOP_SEQUENCES:
        raise bad(f"'stop' takes at most {MAX_STOP_SEQUENCES} sequences, got {len(items)}", param="stop",
                  code="invalid_value")
    return [s for s in items if s]


def _refuse_unsupported(body: dict) -> None:
    n = body.get("n")
    if n is not None and (not _is_int(n) or n != 1):
        raise bad(f"'n' must be 1: this server returns one choice per request (got {json.dumps(n)})", param="n",
                  code="unsupported_value")
    best_of = body.get("best_of")
    if best_of is not None and best_of != 1:
        raise bad("'best_of' must be 1: this server returns one choice per request", param="best_of",
                  code="unsupported_value")
    for name in ("logprobs", "top_logprobs", "echo", "suffix"):
        if body.get(name) not in (None, False, 0, ""):
            raise bad(f"'{name}' is not supported by this server", param=name, code="unsupported_parameter")
    for name in ("tools", "functions"):
        if body.get(name):
            raise bad(f"'{name}' is not supported by this server (no tool calling)", param=name,
                      code="unsupported_parameter")
    for name in ("tool_choice", "function_call"):  # without tools, "none" and "auto" both mean: answer in text
        value = body.get(name)
        if value is not None and value not in ("none", "auto"):
            raise bad(f"'{name}' {_shown(value)} is not supported by this server (no tool calling): only \"none\" or "
                      "\"auto\" are accepted", param=name, code="unsupported_value")
    fmt = body.get("response_format")
    if fmt is not None and not (isinstance(fmt, dict) and fmt.get("type") == "text"):
        raise bad(f"'response_format' {_shown(fmt)} is not supported by this server (no JSON mode or schemas): only "
                  "{\"type\": \"text\"} is accepted", param="response_format", code="unsupported_value")
    bias = body.get("logit_bias")
    if bias is not None and not (isinstance(bias, dict) and all(_is_number(v) and v == 0 for v in bias.values())):
        raise bad("'logit_bias' is not supported by this server: only an empty map (or all-zero biases) is accepted",
                  param="logit_bias", code="unsupported_parameter")


def _shown(value: Any) -> str:
    """A client's value as JSON, clipped, for an error message."""
    return clip(json.dumps(value, ensure_ascii=False))


def _options(body: dict, out: GenerationOptions) -> None:
    _refuse_unsupported(body)
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise bad("'model' must be a string", param="model", code="invalid_type")
    out.model = model
    out.stream = _opt_bool(body, "stream")
    options = body.get("stream_options")
    if options is not None:
        if not isinstance(options, dict):
            raise bad("'stream_options' must be an object", param="stream_options", code="invalid_type")
        out.include_usage = _opt_bool(options, "include_usage")
    limit = _opt_int(body, "max_completion_tokens", 1)
    out.max_tokens = _opt_int(body, "max_tokens", 1) if limit is None else limit
    out.stop = _stop(body)
    out.temperature = _temperature(body)
    out.top_p = _opt_number(body, "top_p", 0.0, 1.0, low_open=True)
    out.seed = _opt_int(body, "seed", *SEED_RANGE)
    out.block_length = _opt_int(body, "block_length", 1)
    out.threshold = _opt_number(body, "threshold", 0.0, 1.0)
    for name in ("presence_penalty", "frequency_penalty"):  # OpenAI's range; 0 or absent: none
        setattr(out, name, _opt_number(body, name, *PENALTY_RANGE) or 0.0)


def _temperature(body: dict) -> float | None:
    """0 (greedy) or [MIN_TEMPERATURE, MAX_TEMPERATURE]; tinier values would overflow the sampler."""
    value = _opt_number(body, "temperature", 0.0, MAX_TEMPERATURE)
    if value is not None and 0.0 < value < MIN_TEMPERATURE:
        raise bad(f"'temperature' must be 0 (greedy) or in [{MIN_TEMPERATURE:g}, {MAX_TEMPERATURE:g}], got {value:g}: "
                  "smaller values overflow the sampler", param="temperature", code="invalid_value")
    return value


def _content(message: dict, i: int) -> str:
    content = message.get("content")
    if isinstance(content, str):
        return content
    if content is None and message.get("role") == "assistant":
        return ""
    if isinstance(content, list):  # content parts: only text can be fed to a text model
        texts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise bad(f"messages[{i}].content: only text parts are supported", param=f"messages[{i}].content",
                          code="invalid_value")
            texts.append(part["text"])
        return "".join(texts)
    raise bad(f"messages[{i}].content must be a string or a list of text parts", param=f"messages[{i}].content",
              code="invalid_type")


def parse_chat(body: dict[str, Any]) -> ChatRequest:
    out = ChatRequest()
    messages = body.get("messages")
    if messages is None:
        raise bad("'messages' is required", param="messages", code="missing_required_parameter")
    if not isinstance(messages, list) or not messages:
        raise bad("'messages' must be a non-empty list of {role, content} objects", param="messages",
                  code="invalid_type")
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise bad(f"messages[{i}] must be an object", param=f"messages[{i}]", code="invalid_type")
        role = message.get("role")
        if role not in ROLES:
            raise bad(f"messages[{i}].role must be one of {', '.join(ROLES)}, got {json.dumps(role)}",
                      param=f"messages[{i}].role", code="invalid_value")
        role = "system" if role == "developer" else role
        if role == "system" and i > 0:
            raise bad(f"messages[{i}]: a system message is only allowed first", param=f"messages[{i}].role",
                      code="invalid_value")
        out.messages.append({"role": role, "content": _content(message, i)})
    _options(body, out)
    return out


def parse_completion(body: dict[str, Any]) -> CompletionRequest:
    out = CompletionRequest()
    prompt = body.get("prompt")
    if prompt is None:
        raise bad("'prompt' is required", param="prompt", code="missing_required_parameter")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]  # a batch of one
    if isinstance(prompt, list) and prompt and all(_is_int(t) for t in prompt):
        out.prompt = list(prompt)
    elif isinstance(prompt, str):
        out.prompt = prompt
    elif isinstance(prompt, list) and len(prompt) > 1:
        raise bad("'prompt' must be a single prompt: batches of prompts are not supported", param="prompt",
                  code="unsupported_value")
    else:
        raise bad("'prompt' must be a string or a list of token ids", param="prompt", code="invalid_type")
    if not out.prompt:
        raise bad("'prompt' must not be empty: diffusion decoding needs a prompt", param="prompt",
                  code="invalid_value")
    _options(body, out)
    return out


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

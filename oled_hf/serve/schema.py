"""The request bodies of ``/v1/chat/completions`` and ``/v1/completions`` as pydantic models.

Pydantic (FastAPI's own) checks every type and range here, strictly (``"max_tokens": "5"`` and
``true`` for an integer are refused, never coerced), and the models are the OpenAPI schema the
app publishes (``/openapi.json``, ``/docs``). Three things stay by hand, each for a reason the
library does not cover:

* The error body. Pydantic's errors (FastAPI answers them 422 with a ``detail`` list) are turned
  by :func:`api_error` into OpenAI's 400 ``{"error": {message, type, param, code}}``, naming the
  field in ``param`` and the value and the allowed range in the message, as OpenAI's clients read.
* The body is decoded by ``protocol.parse_json``, not by FastAPI: ``json`` fails on deep nesting,
  on integers of more than 4300 digits (in any field) and lets lone surrogates through, and each
  of those must be a 400 naming its field. The handlers therefore take the raw request and call
  :func:`parse_chat` / :func:`parse_completion`; the schema reaches OpenAPI through
  ``openapi_extra`` (FastAPI's documented way for a body the route parses itself).
* Rules that are not a type or a range: fields the server cannot honour are refused naming why
  (:func:`_refuse_unsupported`; their neutral values such as ``"none"``, ``{"type": "text"}``,
  ``{}``, all-zero biases are accepted), the temperature gap below ``MIN_TEMPERATURE``, a system
  message only first, the prompt's batch-of-one forms. These raise :class:`~.protocol.APIError`
  from validators (pydantic passes non-``ValueError`` exceptions through unchanged).

Unknown fields (``user``, ``metadata``...) are accepted and ignored, as most OpenAI-compatible
servers do.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

import annotated_types
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from .protocol import (
    MAX_STOP_SEQUENCES,
    MAX_TEMPERATURE,
    MIN_TEMPERATURE,
    PENALTY_RANGE,
    ROLES,
    SEED_RANGE,
    APIError,
    ChatRequest,
    CompletionRequest,
    GenerationOptions,
    bad,
    clip,
)

_STRICT = ConfigDict(strict=True, extra="allow")


class StreamOptions(BaseModel):
    model_config = _STRICT
    include_usage: bool | None = Field(None, description="a last chunk with the token counts")


class TextPart(BaseModel):
    model_config = _STRICT
    type: Literal["text"]
    text: str


class Message(BaseModel):
    model_config = _STRICT
    role: Literal[ROLES]  # type: ignore[valid-type]
    content: str | list[TextPart] | None = Field(
        None, description="a string or a list of text parts; always encoded as text (null: assistant only)")


class _Options(BaseModel):
    """What both endpoints share, in the order the fields are checked."""

    model_config = _STRICT
    model: str | None = Field(None, description="must be the served name (else 404 model_not_found)")
    stream: bool | None = Field(None, description="server-sent events, one chunk per completed diffusion block")
    stream_options: StreamOptions | None = None
    max_completion_tokens: int | None = Field(None, ge=1, description="most new tokens (wins over max_tokens)")
    max_tokens: int | None = Field(None, ge=1, description="most new tokens; absent: --default-max-tokens")
    stop: str | Annotated[list[str], Field(max_length=MAX_STOP_SEQUENCES)] | None = Field(
        None, description=f"a string or up to {MAX_STOP_SEQUENCES} strings")
    temperature: float | None = Field(None, ge=0.0, le=MAX_TEMPERATURE, allow_inf_nan=False,
                                      description=f"0 (greedy) or {MIN_TEMPERATURE:g} to {MAX_TEMPERATURE:g}")
    top_p: float | None = Field(None, gt=0.0, le=1.0, allow_inf_nan=False, description="nucleus sampling")
    seed: int | None = Field(None, ge=SEED_RANGE[0], le=SEED_RANGE[1], description="the sampler's seed")
    block_length: int | None = Field(None, ge=1, description="(extension) diffusion block length")
    threshold: float | None = Field(None, ge=0.0, le=1.0, allow_inf_nan=False,
                                    description="(extension) confidence needed to commit a token")
    presence_penalty: float | None = Field(None, ge=PENALTY_RANGE[0], le=PENALTY_RANGE[1], allow_inf_nan=False)
    frequency_penalty: float | None = Field(None, ge=PENALTY_RANGE[0], le=PENALTY_RANGE[1], allow_inf_nan=False)

    @model_validator(mode="before")
    @classmethod
    def _unsupported(cls, body: Any) -> Any:
        if isinstance(body, dict):
            _refuse_unsupported(body)
        return body

    @field_validator("temperature")
    @classmethod
    def _sampler_floor(cls, value: float | None) -> float | None:
        """0 (greedy) or [MIN_TEMPERATURE, MAX_TEMPERATURE]: tinier values overflow the sampler."""
        if value is not None and 0.0 < value < MIN_TEMPERATURE:
            raise bad(f"'temperature' must be 0 (greedy) or in [{MIN_TEMPERATURE:g}, {MAX_TEMPERATURE:g}], got "
                      f"{value:g}: smaller values overflow the sampler", param="temperature", code="invalid_value")
        return value


class ChatCompletionBody(_Options):
    """``POST /v1/chat/completions``."""

    messages: list[Message] = Field(min_length=1, description="system (first only), developer, user, assistant")


class CompletionBody(_Options):
    """``POST /v1/completions``."""

    prompt: str | list[int] = Field(description="a non-empty string or token ids (or a list of one of those)")

    @field_validator("prompt", mode="before")
    @classmethod
    def _one_prompt(cls, prompt: Any) -> Any:
        """A batch of one is that prompt; several prompts, and forms that are neither, are refused."""
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
            prompt = prompt[0]
        ids = isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool)
                                                          for t in prompt)
        if prompt is None:
            raise bad("'prompt' is required", param="prompt", code="missing_required_parameter")
        if isinstance(prompt, list) and len(prompt) > 1 and not ids:
            raise bad("'prompt' must be a single prompt: batches of prompts are not supported", param="prompt",
                      code="unsupported_value")
        if not (ids or isinstance(prompt, str)):
            raise bad("'prompt' must be a string or a list of token ids", param="prompt", code="invalid_type")
        if not prompt:
            raise bad("'prompt' must not be empty: diffusion decoding needs a prompt", param="prompt",
                      code="invalid_value")
        return prompt


def parse_chat(body: dict[str, Any]) -> ChatRequest:
    """Validate a chat body (from ``protocol.parse_json``) into the engine's options; APIError if refused."""
    checked = _validate(ChatCompletionBody, body)
    out = ChatRequest()
    for i, message in enumerate(checked.messages):
        role = "system" if message.role == "developer" else message.role
        if role == "system" and i > 0:
            raise bad(f"messages[{i}]: a system message is only allowed first", param=f"messages[{i}].role",
                      code="invalid_value")
        if message.content is None and role != "assistant":
            raise _content_error(i, None)
        content = message.content or ""
        text = content if isinstance(content, str) else "".join(part.text for part in content)
        out.messages.append({"role": role, "content": text})
    _options(checked, out)
    return out


def parse_completion(body: dict[str, Any]) -> CompletionRequest:
    """Validate a completions body into the engine's options; APIError if refused."""
    checked = _validate(CompletionBody, body)
    out = CompletionRequest(prompt=checked.prompt if isinstance(checked.prompt, str) else list(checked.prompt))
    _options(checked, out)
    return out


def _validate(model: type[_Options], body: dict[str, Any]) -> _Options:
    try:
        return model.model_validate(body)
    except ValidationError as err:
        raise api_error(err, model, body) from None


def _options(checked: _Options, out: GenerationOptions) -> None:
    out.model, out.stream = checked.model, bool(checked.stream)
    out.include_usage = bool(checked.stream_options and checked.stream_options.include_usage)
    out.max_tokens = checked.max_completion_tokens if checked.max_completion_tokens is not None else checked.max_tokens
    stop = [checked.stop] if isinstance(checked.stop, str) else list(checked.stop or [])
    out.stop = [s for s in stop if s]
    out.temperature, out.top_p, out.seed = checked.temperature, checked.top_p, checked.seed
    out.block_length, out.threshold = checked.block_length, checked.threshold
    out.presence_penalty = checked.presence_penalty or 0.0  # 0 or absent: none
    out.frequency_penalty = checked.frequency_penalty or 0.0


# ---- pydantic's errors as OpenAI's -------------------------------------------------------------
TYPE_NAMES = {"int": "an integer", "float": "a number", "bool": "true or false", "string": "a string"}


def api_error(err: ValidationError, model: type[BaseModel], body: dict[str, Any]) -> APIError:
    """The first of pydantic's errors as OpenAI's 400 body: ``param`` names the field, the message the
    value and what is allowed (the wording the server has always used)."""
    errors = err.errors()
    first = errors[0]
    loc = first["loc"]
    name = str(loc[0])
    raw = body.get(name)
    if name not in body or (raw is None and model.model_fields[name].is_required()):
        return bad(f"'{name}' is required", param=name, code="missing_required_parameter")
    if name == "messages":
        return _messages_error(loc, raw)
    if name == "stop":
        if any(e["type"] == "too_long" for e in errors):
            return bad(f"'stop' takes at most {MAX_STOP_SEQUENCES} sequences, got {len(raw)}", param="stop",
                       code="invalid_value")
        return bad("'stop' must be a string or a list of strings", param="stop", code="invalid_type")
    if name == "stream_options" and len(loc) > 1:  # named as the inner field, as before
        name, raw, model = str(loc[1]), raw.get(loc[1]), StreamOptions
    elif name == "stream_options":
        return bad("'stream_options' must be an object", param=name, code="invalid_type")
    kind = first["type"].split("_")[0]
    if kind in TYPE_NAMES or first["type"] == "finite_number":
        wanted = TYPE_NAMES.get(kind, "a number")
        got = "" if wanted == "a string" else f", got {_shown(raw)}"
        return bad(f"'{name}' must be {wanted}{got}", param=name, code="invalid_type")
    return bad(_range_message(model, name, raw), param=name, code="invalid_value")


def _range_message(model: type[BaseModel], name: str, value: Any) -> str:
    """``'x' must be at least 1 and at most 5, got 9`` (integers) or ``'x' must be in (0, 1], got 0`` (numbers)."""
    field = model.model_fields[name]
    bounds = {type(m).__name__: getattr(m, type(m).__name__.lower()) for m in field.metadata
              if isinstance(m, (annotated_types.Ge, annotated_types.Gt, annotated_types.Le))}
    if "float" not in str(field.annotation):
        upper = f" and at most {bounds['Le']}" if "Le" in bounds else ""
        return f"'{name}' must be at least {bounds['Ge']}{upper}, got {clip(str(value))}"
    low_open = "Gt" in bounds
    low = bounds["Gt"] if low_open else bounds["Ge"]
    return f"'{name}' must be in {'(' if low_open else '['}{low:g}, {bounds['Le']:g}], got {clip(str(value))}"


def _messages_error(loc: tuple, messages: Any) -> APIError:
    if len(loc) == 1:
        return bad("'messages' must be a non-empty list of {role, content} objects", param="messages",
                   code="invalid_type")
    i = int(loc[1])
    message = messages[i]
    if len(loc) == 2:
        return bad(f"messages[{i}] must be an object", param=f"messages[{i}]", code="invalid_type")
    if loc[2] == "role":
        return bad(f"messages[{i}].role must be one of {', '.join(ROLES)}, got {json.dumps(message.get('role'))}",
                   param=f"messages[{i}].role", code="invalid_value")
    return _content_error(i, message.get("content"))


def _content_error(i: int, content: Any) -> APIError:
    if isinstance(content, list):  # content parts: only text can be fed to a text model
        return bad(f"messages[{i}].content: only text parts are supported", param=f"messages[{i}].content",
                   code="invalid_value")
    return bad(f"messages[{i}].content must be a string or a list of text parts", param=f"messages[{i}].content",
               code="invalid_type")


def _is_zero(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value == 0


def _refuse_unsupported(body: dict) -> None:
    """Refuse, naming the field and why, what the server cannot honour without changing the answer.

    By hand: each field's accepted values are its neutral ones in several JSON types (``false``,
    ``0`` or ``""`` for ``logprobs``/``echo``/``suffix``; ``"none"``/``"auto"`` for tool choice; an
    all-zero ``logit_bias``), and the message says why the rest is refused (no tool calling, one
    choice per request); a pydantic ``Literal`` would answer only "input should be 1".
    """
    n = body.get("n")
    if n is not None and (not isinstance(n, int) or isinstance(n, bool) or n != 1):
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
    if bias is not None and not (isinstance(bias, dict) and all(_is_zero(v) for v in bias.values())):
        raise bad("'logit_bias' is not supported by this server: only an empty map (or all-zero biases) is accepted",
                  param="logit_bias", code="unsupported_parameter")


def _shown(value: Any) -> str:
    """A client's value as JSON, clipped, for an error message."""
    return clip(json.dumps(value, ensure_ascii=False))


def openapi_body(model: type[BaseModel]) -> dict[str, Any]:
    """``openapi_extra`` for a route that parses its own body: the model's JSON schema as the request body."""
    schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
    schema.pop("$defs", None)  # in the document's components (schema_components)
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": schema}}}}


def schema_components() -> dict[str, Any]:
    """The nested models the request schemas refer to (``#/components/schemas/...``)."""
    defs: dict[str, Any] = {}
    for model in (ChatCompletionBody, CompletionBody):
        defs.update(model.model_json_schema(ref_template="#/components/schemas/{model}").get("$defs", {}))
    return defs

"""What tether knows about LLM providers: which failures are worth retrying, the token usage a
result reports, and how a streamed answer is assembled into the result that gets journaled.

Nothing here imports an SDK: exceptions and results are recognised by their shape (an HTTP
status on the exception or its response, the SDKs' module names for transport errors; a
`usage` with OpenAI's or Anthropic's fields; `chat.completion.chunk` objects and Anthropic's
`message_start` ... `message_stop` events), so OpenAI, Anthropic, LiteLLM and plain httpx
callers are handled alike, and the SDKs stay optional.
"""

from __future__ import annotations

import email.utils
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from .errors import CallTimeout

_TRANSPORT_MODULES = frozenset({"openai", "anthropic", "httpx", "httpcore", "litellm", "aiohttp"})
_RETRIABLE_STATUS = frozenset({408, 409, 425, 429})


@dataclass(frozen=True, slots=True)
class ProviderFailure:
    """A failed provider call: `retriable` (rate limit, timeout, 5xx, a dropped connection)
    or not (a 4xx request error: retrying sends the same bad request), the HTTP status when
    there is one, and the delay the provider asked for (Retry-After), in seconds."""

    retriable: bool
    status: int | None
    retry_after: float | None
    reason: str


def provider_failure(exc: BaseException) -> ProviderFailure | None:
    """How `exc` failed, if it is a provider's failure; None for anything else."""
    if isinstance(exc, CallTimeout):
        return ProviderFailure(True, None, None, "timeout")
    response = getattr(exc, "response", None)
    status = getattr(exc, "status_code", None)
    if not isinstance(status, int):
        status = getattr(response, "status_code", None)
    top = type(exc).__module__.partition(".")[0]
    if isinstance(status, int) and 400 <= status < 600 and (
            top in _TRANSPORT_MODULES or hasattr(exc, "status_code")):
        retriable = status >= 500 or status in _RETRIABLE_STATUS
        return ProviderFailure(retriable, status, _retry_after(response),
                               f"HTTP {status}" + (" (rate limited)" if status == 429 else ""))
    if top in _TRANSPORT_MODULES:
        name = type(exc).__name__
        if "Timeout" in name:
            return ProviderFailure(True, None, None, "timeout")
        if any(w in name for w in ("Connection", "Protocol", "Transport", "Network", "Read")):
            return ProviderFailure(True, None, None, "connection")
    return None


def _retry_after(response: Any) -> float | None:
    """Seconds from `retry-after-ms` or `retry-after` (seconds or an HTTP date), if sane."""
    headers = getattr(response, "headers", None)
    if headers is None:
        return None
    try:
        ms = headers.get("retry-after-ms")
        if ms is not None:
            value = float(ms) / 1000
        else:
            raw = headers.get("retry-after")
            if raw is None:
                return None
            try:
                value = float(raw)
            except ValueError:
                when = email.utils.parsedate_to_datetime(raw)
                value = when.timestamp() - time.time()
    except (TypeError, ValueError, AttributeError):
        return None
    return value if 0 <= value <= 3600 else None


# -- usage -------------------------------------------------------------------------------------

USAGE_KEYS = ("input_tokens", "output_tokens", "cache_read_input_tokens",
              "cache_creation_input_tokens")


def _field(obj: Any, name: str) -> Any:
    return obj.get(name) if isinstance(obj, Mapping) else getattr(obj, name, None)


def usage_of(result: Any) -> dict[str, int] | None:
    """The token usage `result` reports (OpenAI `usage.prompt_tokens/completion_tokens`,
    Anthropic `usage.input_tokens/output_tokens` and cache tokens, LangChain's
    `usage_metadata.input_tokens/output_tokens`), as
    {"input_tokens", "output_tokens", ...} with ints only; None when it reports none."""
    usage = _field(result, "usage")
    if usage is None:  # a LangChain chat model's AIMessage: usage_metadata.input_tokens, ...
        usage = _field(result, "usage_metadata")
    if usage is None:
        return None
    out: dict[str, int] = {}
    for ours, theirs in (("input_tokens", "prompt_tokens"), ("output_tokens", "completion_tokens")):
        value = _field(usage, ours)
        if value is None:
            value = _field(usage, theirs)
        if isinstance(value, int) and not isinstance(value, bool):
            out[ours] = value
    for key in USAGE_KEYS[2:]:
        value = _field(usage, key)
        if isinstance(value, int) and not isinstance(value, bool) and value:
            out[key] = value
    cached = _field(_field(usage, "prompt_tokens_details"), "cached_tokens")
    if isinstance(cached, int) and cached:
        out["cache_read_input_tokens"] = cached
    if "input_tokens" not in out and "output_tokens" not in out:
        return None
    return out


def gen_ai_attributes(result: Any, usage: Mapping[str, int] | None, requested: Any
                      ) -> dict[str, Any] | None:
    """OpenTelemetry's GenAI attributes of a model call (for its tether.call span):
    gen_ai.request.model (`requested`: the `model` the call was given, if a string),
    gen_ai.response.model (the result's `model`), gen_ai.usage.input_tokens / output_tokens
    (`usage`, as usage_of gives it); None when there is none of them."""
    out: dict[str, Any] = {}
    if isinstance(requested, str) and requested:
        out["gen_ai.request.model"] = requested
    if usage is not None:
        model = _field(result, "model")
        if isinstance(model, str) and model:
            out["gen_ai.response.model"] = model
        for key in ("input_tokens", "output_tokens"):
            if key in usage:
                out[f"gen_ai.usage.{key}"] = usage[key]
    return out or None


def add_usage(total: dict[str, int], usage: Mapping[str, int]) -> None:
    for key, value in usage.items():
        total[key] = total.get(key, 0) + value


# -- streams -----------------------------------------------------------------------------------

def chunk_json(chunk: Any) -> Any:
    """A chunk as plain JSON for live events (SSE): pydantic models by their JSON dump."""
    dump = getattr(chunk, "model_dump", None)
    if callable(dump):
        return dump(mode="json", exclude_none=True)
    return orjson.loads(orjson.dumps(chunk, default=str))


def assemble(chunks: Sequence[Any]) -> Any:
    """The one result a stream of chunks amounts to: an OpenAI ChatCompletion from
    `chat.completion.chunk`s, an Anthropic Message from its stream events, the joined text
    from str chunks, else the list of chunks."""
    if not chunks:
        return []
    first = chunks[0]
    if all(isinstance(c, str) for c in chunks):
        return "".join(chunks)
    if _field(first, "object") == "chat.completion.chunk":
        return _openai(chunks)
    if _field(first, "type") == "message_start":
        return _anthropic(chunks)
    return list(chunks)


def _dump(obj: Any) -> Any:
    dump = getattr(obj, "model_dump", None)
    return dump(mode="json") if callable(dump) else obj


def _openai(chunks: Sequence[Any]) -> Any:
    choices: dict[int, dict[str, Any]] = {}
    head = _dump(chunks[0])
    usage = None
    for raw in chunks:
        chunk = _dump(raw)
        usage = chunk.get("usage") or usage
        for c in chunk.get("choices") or []:
            choice = choices.setdefault(c["index"], {
                "index": c["index"], "finish_reason": None, "logprobs": None,
                "message": {"role": "assistant", "content": None, "tool_calls": []}})
            delta = c.get("delta") or {}
            message = choice["message"]
            if delta.get("role"):
                message["role"] = delta["role"]
            if delta.get("content") is not None:
                message["content"] = (message["content"] or "") + delta["content"]
            if delta.get("refusal") is not None:
                message["refusal"] = (message.get("refusal") or "") + delta["refusal"]
            for tc in delta.get("tool_calls") or []:
                calls = message["tool_calls"]
                while len(calls) <= tc["index"]:
                    calls.append({"id": None, "type": "function",
                                  "function": {"name": "", "arguments": ""}})
                call = calls[tc["index"]]
                if tc.get("id"):
                    call["id"] = tc["id"]
                fn = tc.get("function") or {}
                call["function"]["name"] += fn.get("name") or ""
                call["function"]["arguments"] += fn.get("arguments") or ""
            if c.get("finish_reason"):
                choice["finish_reason"] = c["finish_reason"]
    for choice in choices.values():
        if not choice["message"]["tool_calls"]:
            del choice["message"]["tool_calls"]
        choice["finish_reason"] = choice["finish_reason"] or "stop"
    result = {"id": head.get("id"), "object": "chat.completion", "created": head.get("created"),
              "model": head.get("model"), "choices": [choices[i] for i in sorted(choices)],
              "usage": usage, "system_fingerprint": head.get("system_fingerprint"),
              "service_tier": head.get("service_tier")}
    return _validated("openai.types.chat", "ChatCompletion", result)


def _anthropic(events: Sequence[Any]) -> Any:
    message: dict[str, Any] = {}
    partial: dict[int, str] = {}
    for raw in events:
        event = _dump(raw)
        kind = event.get("type")
        if kind == "message_start":
            message = dict(event["message"])
            message["content"] = list(message.get("content") or [])
        elif kind == "content_block_start":
            message["content"].append(dict(event["content_block"]))
        elif kind == "content_block_delta":
            block = message["content"][event["index"]]
            delta = event["delta"]
            if delta.get("type") == "text_delta":
                block["text"] = block.get("text", "") + delta["text"]
            elif delta.get("type") == "input_json_delta":
                partial[event["index"]] = partial.get(event["index"], "") + delta["partial_json"]
            elif delta.get("type") == "thinking_delta":
                block["thinking"] = block.get("thinking", "") + delta["thinking"]
            elif delta.get("type") == "signature_delta":
                block["signature"] = delta["signature"]
        elif kind == "content_block_stop" and event["index"] in partial:
            text = partial.pop(event["index"])
            message["content"][event["index"]]["input"] = orjson.loads(text) if text else {}
        elif kind == "message_delta":
            message.update({k: v for k, v in (event.get("delta") or {}).items() if v is not None})
            usage = dict(message.get("usage") or {})
            usage.update({k: v for k, v in (event.get("usage") or {}).items() if v is not None})
            message["usage"] = usage
    return _validated("anthropic.types", "Message", message)


def _validated(module: str, name: str, data: dict[str, Any]) -> Any:
    """data as the SDK's model when the SDK is there (it is: it made the chunks)."""
    try:
        cls = getattr(__import__(module, fromlist=[name]), name)
    except (ImportError, AttributeError):
        return data
    return cls.model_validate(data)

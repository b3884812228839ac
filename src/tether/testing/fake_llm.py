"""A scriptable fake of the OpenAI and Anthropic HTTP APIs, for tests and offline examples.

    fake = FakeLLM()
    fake.script(Reply(text="Let me check.", tool_calls=[ToolCall("search", {"q": "x"})]),
                Reply(status=429, error="slow down", retry_after=0.2),
                Reply(text="Done.", disconnect_after=2))
    with fake.serve() as url:          # a uvicorn thread on 127.0.0.1, a free port
        openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0)
        anthropic.AsyncAnthropic(base_url=url, api_key="x", max_retries=0)

`POST /v1/chat/completions` (OpenAI) and `POST /v1/messages` (Anthropic) answer with the next
scripted reply (a default echo when the script is empty), as JSON or, with `"stream": true`,
as server-sent events shaped like the real APIs' (OpenAI `chat.completion.chunk`s then
`[DONE]`, usage in a last chunk with `stream_options.include_usage`; Anthropic
`message_start` ... `message_stop`). A reply can be an error (status, message, Retry-After),
or stream slowly (`chunk_delay`) and drop the connection after some chunks
(`disconnect_after`). `requests` records every request body; `usage()` sums the tokens of
the responses delivered whole, which is what a provider bills.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any

import orjson

from ..extras import requires_extra


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: dict[str, Any]


@dataclass(frozen=True)
class Reply:
    """One scripted answer. `status` other than 200 makes it an error with `error` as its
    message (and a Retry-After header with `retry_after`). Tokens default to word counts."""

    text: str = ""
    tool_calls: tuple[ToolCall, ...] | list[ToolCall] = ()
    status: int = 200
    error: str = ""
    retry_after: float | None = None
    chunk_delay: float = 0.0
    disconnect_after: int | None = None
    input_tokens: int | None = None
    output_tokens: int | None = None


@dataclass
class Served:
    """What the server did for one request."""

    api: str  # "openai" or "anthropic"
    body: dict[str, Any]
    status: int
    stream: bool
    chunks: int = 0
    completed: bool = False
    usage: dict[str, int] = field(default_factory=dict)


class _Disconnect(Exception):
    """Raised inside a streaming body: uvicorn drops the connection mid-response."""


def _words(text: str) -> list[str]:
    """`text` in streaming pieces: each word with the space before it."""
    pieces: list[str] = []
    for i, word in enumerate(text.split(" ")):
        pieces.append(word if i == 0 else " " + word)
    return [p for p in pieces if p]


def _prompt_tokens(body: dict[str, Any]) -> int:
    count = 0
    system = body.get("system")
    if isinstance(system, str):
        count += len(system.split())
    for message in body.get("messages") or []:
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, str):
            count += len(content.split())
        elif isinstance(content, list):
            for part in content:
                if isinstance(part, dict):
                    count += len(str(part.get("text") or part.get("content") or "").split())
    return max(count, 1)


class FakeLLM:
    def __init__(self, model: str = "fake-model") -> None:
        self.model = model
        self._script: deque[Reply] = deque()
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self.requests: list[Served] = []

    # -- scripting ---------------------------------------------------------------------------

    def script(self, *replies: Reply) -> None:
        """Queue replies, answered in order, one per request (to either API)."""
        with self._lock:
            self._script.extend(replies)

    def pending(self) -> int:
        with self._lock:
            return len(self._script)

    def usage(self, api: str | None = None) -> dict[str, int]:
        """Tokens of the responses delivered whole (an error or a dropped stream bills none)."""
        total = {"input_tokens": 0, "output_tokens": 0}
        with self._lock:
            for served in self.requests:
                if served.completed and (api is None or served.api == api):
                    for key in total:
                        total[key] += served.usage.get(key, 0)
        return total

    def _next(self, api: str, body: dict[str, Any]) -> tuple[Reply, Served]:
        with self._lock:
            reply = self._script.popleft() if self._script else None
            if reply is None:
                last = (body.get("messages") or [{}])[-1]
                content = last.get("content") if isinstance(last, dict) else ""
                reply = Reply(text=f"echo: {content if isinstance(content, str) else '...'}")
            served = Served(api, body, reply.status, bool(body.get("stream")))
            self.requests.append(served)
        if reply.status == 200:
            out = reply.output_tokens
            if out is None:
                out = len(reply.text.split()) + 10 * len(reply.tool_calls)
            served.usage = {"input_tokens": reply.input_tokens or _prompt_tokens(body),
                            "output_tokens": out}
        return reply, served

    # -- the app -----------------------------------------------------------------------------

    def app(self) -> Any:
        """The FastAPI app (for an ASGI server of your own; `serve` runs one)."""
        with requires_extra("server", "tether.testing.FakeLLM"):
            from fastapi import FastAPI, Request
            from fastapi.responses import JSONResponse, Response, StreamingResponse

        app = FastAPI(title="tether fake LLM")

        def error(api: str, reply: Reply) -> Response:
            headers = {} if reply.retry_after is None else {"retry-after": f"{reply.retry_after:g}"}
            if api == "openai":
                body: dict[str, Any] = {"error": {"message": reply.error, "type": _kind(reply.status),
                                                  "param": None, "code": None}}
            else:
                body = {"type": "error", "error": {"type": _kind(reply.status),
                                                   "message": reply.error}}
            return JSONResponse(body, status_code=reply.status, headers=headers)

        async def answer(api: str, request: Request) -> Response:
            try:
                body = orjson.loads(await request.body())
            except orjson.JSONDecodeError:
                return JSONResponse({"error": {"message": "body is not JSON"}}, status_code=400)
            if not isinstance(body, dict) or not isinstance(body.get("messages"), list):
                return JSONResponse({"error": {"message": "messages: a list is required"}},
                                    status_code=400)
            reply, served = self._next(api, body)
            if reply.status != 200:
                return error(api, reply)
            rid = next(self._ids)
            if not served.stream:
                served.completed = True
                make = _openai_completion if api == "openai" else _anthropic_message
                return JSONResponse(make(self.model, rid, reply, served.usage))
            events = (_openai_chunks if api == "openai" else _anthropic_events)(
                self.model, rid, reply, served.usage, body)
            return StreamingResponse(self._stream(events, reply, served),
                                     media_type="text/event-stream")

        # Plain Starlette routes: the raw request, no FastAPI parameter inference.
        async def chat_completions(request: Request) -> Response:
            return await answer("openai", request)

        async def messages(request: Request) -> Response:
            return await answer("anthropic", request)

        app.add_route("/v1/chat/completions", chat_completions, methods=["POST"])
        app.add_route("/v1/messages", messages, methods=["POST"])
        return app

    async def _stream(self, events: list[bytes], reply: Reply, served: Served
                      ) -> AsyncIterator[bytes]:
        for i, event in enumerate(events):
            if reply.disconnect_after is not None and i >= reply.disconnect_after:
                raise _Disconnect(f"scripted disconnect after {i} chunks")
            if reply.chunk_delay and i:
                await asyncio.sleep(reply.chunk_delay)
            yield event
            with self._lock:
                served.chunks += 1
        with self._lock:
            served.completed = True

    @contextlib.contextmanager
    def serve(self, host: str = "127.0.0.1", port: int = 0) -> Iterator[str]:
        """Run the app on a uvicorn thread for the block; yields its base URL."""
        with requires_extra("server", "tether.testing.FakeLLM"):
            import uvicorn

        config = uvicorn.Config(self.app(), host=host, port=port, log_level="critical",
                                lifespan="off")
        server = uvicorn.Server(config)
        thread = threading.Thread(target=server.run, name="fake-llm", daemon=True)
        thread.start()
        deadline = time.monotonic() + 10
        while not server.started:
            if not thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the fake LLM server did not start")
            time.sleep(0.01)
        bound = server.servers[0].sockets[0].getsockname()[1]
        try:
            yield f"http://{host}:{bound}"
        finally:
            server.should_exit = True
            thread.join(10)


def _kind(status: int) -> str:
    return {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
            429: "rate_limit_error", 529: "overloaded_error"}.get(status, "api_error")


# -- OpenAI shapes -----------------------------------------------------------------------------

def _openai_tool_calls(reply: Reply) -> list[dict[str, Any]]:
    return [{"id": f"call_{i}", "type": "function",
             "function": {"name": t.name, "arguments": orjson.dumps(t.arguments).decode()}}
            for i, t in enumerate(reply.tool_calls)]


def _openai_usage(usage: dict[str, int]) -> dict[str, int]:
    return {"prompt_tokens": usage["input_tokens"], "completion_tokens": usage["output_tokens"],
            "total_tokens": usage["input_tokens"] + usage["output_tokens"]}


def _finish(reply: Reply) -> str:
    return "tool_calls" if reply.tool_calls else "stop"


def _openai_completion(model: str, rid: int, reply: Reply, usage: dict[str, int]) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": reply.text or None}
    if reply.tool_calls:
        message["tool_calls"] = _openai_tool_calls(reply)
    return {"id": f"chatcmpl-{rid}", "object": "chat.completion", "created": int(time.time()),
            "model": model, "choices": [{"index": 0, "message": message, "logprobs": None,
                                         "finish_reason": _finish(reply)}],
            "usage": _openai_usage(usage)}


def _sse(data: Any, event: str | None = None) -> bytes:
    head = b"" if event is None else b"event: " + event.encode() + b"\n"
    return head + b"data: " + orjson.dumps(data) + b"\n\n"


def _openai_chunks(model: str, rid: int, reply: Reply, usage: dict[str, int],
                   body: dict[str, Any]) -> list[bytes]:
    base = {"id": f"chatcmpl-{rid}", "object": "chat.completion.chunk",
            "created": int(time.time()), "model": model}

    def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
        return _sse({**base, "choices": [{"index": 0, "delta": delta, "logprobs": None,
                                          "finish_reason": finish}]})

    out = [chunk({"role": "assistant", "content": ""})]
    out += [chunk({"content": piece}) for piece in _words(reply.text)]
    for i, call in enumerate(_openai_tool_calls(reply)):
        args = call["function"]["arguments"]
        out.append(chunk({"tool_calls": [{"index": i, "id": call["id"], "type": "function",
                                          "function": {"name": call["function"]["name"],
                                                       "arguments": ""}}]}))
        for j in range(0, len(args), 8):
            out.append(chunk({"tool_calls": [{"index": i, "function": {"arguments": args[j:j + 8]}}]}))
    out.append(chunk({}, _finish(reply)))
    if (body.get("stream_options") or {}).get("include_usage"):
        out.append(_sse({**base, "choices": [], "usage": _openai_usage(usage)}))
    out.append(b"data: [DONE]\n\n")
    return out


# -- Anthropic shapes --------------------------------------------------------------------------

def _anthropic_blocks(reply: Reply) -> list[dict[str, Any]]:
    blocks: list[dict[str, Any]] = [{"type": "text", "text": reply.text}] if reply.text else []
    blocks += [{"type": "tool_use", "id": f"toolu_{i}", "name": t.name, "input": t.arguments}
               for i, t in enumerate(reply.tool_calls)]
    return blocks


def _anthropic_message(model: str, rid: int, reply: Reply, usage: dict[str, int]) -> dict[str, Any]:
    return {"id": f"msg_{rid}", "type": "message", "role": "assistant", "model": model,
            "content": _anthropic_blocks(reply),
            "stop_reason": "tool_use" if reply.tool_calls else "end_turn", "stop_sequence": None,
            "usage": {"input_tokens": usage["input_tokens"], "output_tokens": usage["output_tokens"]}}


def _anthropic_events(model: str, rid: int, reply: Reply, usage: dict[str, int],
                      body: dict[str, Any]) -> list[bytes]:
    start = _anthropic_message(model, rid, reply, usage)
    start.update(content=[], stop_reason=None, usage={"input_tokens": usage["input_tokens"],
                                                      "output_tokens": 1})
    out = [_sse({"type": "message_start", "message": start}, "message_start")]
    for index, block in enumerate(_anthropic_blocks(reply)):
        if block["type"] == "text":
            opened: dict[str, Any] = {"type": "text", "text": ""}
            deltas = [{"type": "text_delta", "text": piece} for piece in _words(block["text"])]
        else:
            opened = {**block, "input": {}}
            args = orjson.dumps(block["input"]).decode()
            deltas = [{"type": "input_json_delta", "partial_json": args[j:j + 8]}
                      for j in range(0, len(args), 8)]
        out.append(_sse({"type": "content_block_start", "index": index, "content_block": opened},
                        "content_block_start"))
        out += [_sse({"type": "content_block_delta", "index": index, "delta": d},
                     "content_block_delta") for d in deltas]
        out.append(_sse({"type": "content_block_stop", "index": index}, "content_block_stop"))
    out.append(_sse({"type": "message_delta",
                     "delta": {"stop_reason": "tool_use" if reply.tool_calls else "end_turn",
                               "stop_sequence": None},
                     "usage": {"output_tokens": usage["output_tokens"]}}, "message_delta"))
    out.append(_sse({"type": "message_stop"}, "message_stop"))
    return out

"""Provider failures, usage and stream assembly (tether.llm), on the real SDKs' exception and
result types built offline."""

from __future__ import annotations

import email.utils
import time
from typing import Any

import anthropic
import httpx
import openai
import pytest
from anthropic.types import RawMessageStreamEvent
from openai.types.chat import ChatCompletionChunk
from pydantic import TypeAdapter

from tether import llm
from tether.errors import CallTimeout


def response(status: int, headers: dict[str, str] | None = None) -> httpx.Response:
    return httpx.Response(status, headers=headers or {}, json={"error": {"message": "m"}},
                          request=httpx.Request("POST", "http://provider.invalid/v1/x"))


def openai_error(status: int, headers: dict[str, str] | None = None) -> Exception:
    return openai.OpenAI(api_key="x", base_url="http://provider.invalid")._make_status_error(
        "boom", body=None, response=response(status, headers))


def anthropic_error(status: int, headers: dict[str, str] | None = None) -> Exception:
    return anthropic.Anthropic(api_key="x", base_url="http://provider.invalid")._make_status_error(
        "boom", body=None, response=response(status, headers))


@pytest.mark.parametrize("make", [openai_error, anthropic_error])
@pytest.mark.parametrize(("status", "retriable"), [
    (400, False), (401, False), (403, False), (404, False), (422, False),
    (408, True), (409, True), (429, True), (500, True), (502, True), (503, True), (529, True)])
def test_status_errors_are_retriable_only_when_retrying_can_help(
        make: Any, status: int, retriable: bool) -> None:
    failure = llm.provider_failure(make(status))
    assert failure is not None
    assert (failure.status, failure.retriable) == (status, retriable)


@pytest.mark.parametrize(("headers", "seconds"), [
    ({"retry-after": "2"}, 2.0), ({"retry-after": "0.5"}, 0.5), ({"retry-after-ms": "250"}, 0.25),
    ({"retry-after": "soon"}, None), ({"retry-after": "99999"}, None), ({}, None)])
def test_retry_after_is_read_from_the_response(headers: dict[str, str], seconds: float | None) -> None:
    failure = llm.provider_failure(openai_error(429, headers))
    assert failure is not None and failure.retry_after == seconds


def test_retry_after_as_an_http_date() -> None:
    when = email.utils.formatdate(time.time() + 30, usegmt=True)
    failure = llm.provider_failure(anthropic_error(429, {"retry-after": when}))
    assert failure is not None and failure.retry_after is not None
    assert 25 <= failure.retry_after <= 31


def test_transport_failures_are_retriable() -> None:
    request = httpx.Request("POST", "http://provider.invalid")
    for exc in (openai.APITimeoutError(request), openai.APIConnectionError(request=request),
                anthropic.APIConnectionError(request=request), httpx.ReadTimeout("slow"),
                httpx.RemoteProtocolError("peer closed connection"), CallTimeout("3 s")):
        failure = llm.provider_failure(exc)
        assert failure is not None and failure.retriable, exc


def test_other_exceptions_are_not_provider_failures() -> None:
    for exc in (ValueError("x"), KeyError("k"), TimeoutError("node's own"), RuntimeError()):
        assert llm.provider_failure(exc) is None


def test_httpx_status_errors_count_too() -> None:
    resp = response(503)
    exc = httpx.HTTPStatusError("unavailable", request=resp.request, response=resp)
    failure = llm.provider_failure(exc)
    assert failure is not None and failure.retriable and failure.status == 503


def test_usage_of_openai_anthropic_and_dict_results() -> None:
    assert llm.usage_of({"usage": {"prompt_tokens": 3, "completion_tokens": 5, "total_tokens": 8,
                                   "prompt_tokens_details": {"cached_tokens": 2}}}) == {
        "input_tokens": 3, "output_tokens": 5, "cache_read_input_tokens": 2}
    message = anthropic.types.Message.model_validate({
        "id": "m", "type": "message", "role": "assistant", "model": "x", "content": [],
        "stop_reason": "end_turn", "stop_sequence": None,
        "usage": {"input_tokens": 7, "output_tokens": 11, "cache_creation_input_tokens": 4}})
    assert llm.usage_of(message) == {"input_tokens": 7, "output_tokens": 11,
                                     "cache_creation_input_tokens": 4}
    for nothing in ("text", {"usage": None}, {"usage": {"other": 1}}, [1, 2], None):
        assert llm.usage_of(nothing) is None


def chunk(**kw: Any) -> ChatCompletionChunk:
    return ChatCompletionChunk.model_validate({"id": "c", "object": "chat.completion.chunk",
                                               "created": 1, "model": "m", **kw})


def test_openai_chunks_assemble_into_a_chat_completion() -> None:
    chunks = [
        chunk(choices=[{"index": 0, "delta": {"role": "assistant", "content": ""}}]),
        chunk(choices=[{"index": 0, "delta": {"content": "Hel"}}]),
        chunk(choices=[{"index": 0, "delta": {"content": "lo"}}]),
        chunk(choices=[{"index": 0, "delta": {"tool_calls": [
            {"index": 0, "id": "call_1", "type": "function",
             "function": {"name": "search", "arguments": '{"q":'}}]}}]),
        chunk(choices=[{"index": 0, "delta": {"tool_calls": [
            {"index": 0, "function": {"arguments": ' "x"}'}}]}}]),
        chunk(choices=[{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]),
        chunk(choices=[], usage={"prompt_tokens": 4, "completion_tokens": 6, "total_tokens": 10}),
    ]
    done = llm.assemble(chunks)
    assert type(done) is openai.types.chat.ChatCompletion
    message = done.choices[0].message
    assert message.content == "Hello" and done.choices[0].finish_reason == "tool_calls"
    assert message.tool_calls is not None
    assert [(c.id, c.function.name, c.function.arguments) for c in message.tool_calls] == [  # type: ignore[union-attr]
        ("call_1", "search", '{"q": "x"}')]
    assert llm.usage_of(done) == {"input_tokens": 4, "output_tokens": 6}


def test_anthropic_events_assemble_into_a_message() -> None:
    adapter: TypeAdapter[RawMessageStreamEvent] = TypeAdapter(RawMessageStreamEvent)
    raw = [
        {"type": "message_start", "message": {
            "id": "msg", "type": "message", "role": "assistant", "model": "x", "content": [],
            "stop_reason": None, "stop_sequence": None, "usage": {"input_tokens": 9, "output_tokens": 1}}},
        {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
        {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Hi"}},
        {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "!"}},
        {"type": "content_block_stop", "index": 0},
        {"type": "content_block_start", "index": 1, "content_block": {
            "type": "tool_use", "id": "toolu_1", "name": "search", "input": {}}},
        *({"type": "content_block_delta", "index": 1,
           "delta": {"type": "input_json_delta", "partial_json": part}} for part in ('{"q": ', '"x"}')),
        {"type": "content_block_stop", "index": 1},
        {"type": "message_delta", "delta": {"stop_reason": "tool_use", "stop_sequence": None},
         "usage": {"output_tokens": 14}},
        {"type": "message_stop"},
    ]
    done = llm.assemble([adapter.validate_python(e) for e in raw])
    assert type(done) is anthropic.types.Message
    assert done.stop_reason == "tool_use"
    assert done.content[0].text == "Hi!"  # type: ignore[union-attr]
    assert done.content[1].input == {"q": "x"}  # type: ignore[union-attr]
    assert llm.usage_of(done) == {"input_tokens": 9, "output_tokens": 14}


def test_text_chunks_join_and_other_chunks_stay_a_list() -> None:
    assert llm.assemble(["a", "b", "c"]) == "abc"
    assert llm.assemble([{"n": 1}, {"n": 2}]) == [{"n": 1}, {"n": 2}]
    assert llm.assemble([]) == []


def test_gen_ai_attributes_name_the_model_and_tokens_only_when_known() -> None:
    from tether.llm import gen_ai_attributes, usage_of

    openai_like = {"model": "gpt-x-2024", "usage": {"prompt_tokens": 12, "completion_tokens": 3}}
    assert gen_ai_attributes(openai_like, usage_of(openai_like), "gpt-x") == {
        "gen_ai.request.model": "gpt-x", "gen_ai.response.model": "gpt-x-2024",
        "gen_ai.usage.input_tokens": 12, "gen_ai.usage.output_tokens": 3}
    # No usage: not a model's result, whatever its fields say; only the model asked for.
    assert gen_ai_attributes({"model": "m"}, None, None) is None
    assert gen_ai_attributes({"model": "m"}, None, "asked") == {"gen_ai.request.model": "asked"}
    # A `model=` that is not a name, or a result model that is not one, is left out.
    anthropic_like = {"model": 7, "usage": {"input_tokens": 5, "output_tokens": 9}}
    assert gen_ai_attributes(anthropic_like, usage_of(anthropic_like), {"x": 1}) == {
        "gen_ai.usage.input_tokens": 5, "gen_ai.usage.output_tokens": 9}

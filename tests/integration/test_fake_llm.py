"""tether.testing.FakeLLM through the real `openai` and `anthropic` SDKs: scripted replies as
JSON and as SSE streams, errors with Retry-After, dropped streams, billed usage."""

from __future__ import annotations

from collections.abc import Iterator

import anthropic
import openai
import pytest

from tether import llm
from tether.testing import FakeLLM, Reply, ToolCall

MESSAGES = [{"role": "user", "content": "what is durable execution"}]


@pytest.fixture
def fake() -> Iterator[tuple[FakeLLM, str]]:
    server = FakeLLM()
    with server.serve() as url:
        yield server, url


async def test_openai_sdk_streams_and_reads_json(fake: tuple[FakeLLM, str]) -> None:
    server, url = fake
    server.script(Reply(text="It survives crashes", tool_calls=[ToolCall("search", {"q": "dbos"})]),
                  Reply(text="plain answer", input_tokens=5, output_tokens=2))
    async with openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="k", max_retries=0) as client:
        stream = await client.chat.completions.create(
            model="m", messages=MESSAGES, stream=True,  # type: ignore[arg-type]
            stream_options={"include_usage": True})
        chunks = [c async for c in stream]
        whole = await client.chat.completions.create(model="m", messages=MESSAGES)  # type: ignore[arg-type]
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "It survives crashes"
    done = llm.assemble(chunks)
    assert done.choices[0].message.tool_calls[0].function.name == "search"
    assert done.choices[0].finish_reason == "tool_calls"
    assert whole.choices[0].message.content == "plain answer"
    assert whole.usage is not None and whole.usage.total_tokens == 7
    assert [r.api for r in server.requests] == ["openai", "openai"]
    assert server.requests[0].body["messages"] == MESSAGES
    assert server.usage() == {"input_tokens": 4 + 5, "output_tokens": 3 + 10 + 2}
    assert llm.usage_of(done) == {"input_tokens": 4, "output_tokens": 13}


async def test_anthropic_sdk_streams_and_reads_json(fake: tuple[FakeLLM, str]) -> None:
    server, url = fake
    server.script(Reply(text="Hello from the fake", tool_calls=[ToolCall("lookup", {"id": 7})]),
                  Reply(text="short"))
    async with anthropic.AsyncAnthropic(base_url=url, api_key="k", max_retries=0) as client:
        stream = await client.messages.create(model="m", max_tokens=50, messages=MESSAGES,  # type: ignore[arg-type]
                                              stream=True)
        events = [e async for e in stream]
        whole = await client.messages.create(model="m", max_tokens=50, messages=MESSAGES)  # type: ignore[arg-type]
    assert [e.type for e in events][:2] == ["message_start", "content_block_start"]
    assert events[-1].type == "message_stop"
    done = llm.assemble(events)
    assert done.content[0].text == "Hello from the fake"
    assert done.content[1].input == {"id": 7}
    assert whole.content[0].text == "short"  # type: ignore[union-attr]
    assert server.usage("anthropic") == {"input_tokens": 8, "output_tokens": 4 + 10 + 1}


async def test_errors_carry_status_message_and_retry_after(fake: tuple[FakeLLM, str]) -> None:
    server, url = fake
    server.script(Reply(status=429, error="slow down", retry_after=0.25),
                  Reply(status=400, error="model: unknown model 'x'"),
                  Reply(status=529, error="overloaded"))
    async with openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="k", max_retries=0) as oa, \
            anthropic.AsyncAnthropic(base_url=url, api_key="k", max_retries=0) as an:
        with pytest.raises(openai.RateLimitError) as limited:
            await oa.chat.completions.create(model="m", messages=MESSAGES)  # type: ignore[arg-type]
        with pytest.raises(openai.BadRequestError) as bad:
            await oa.chat.completions.create(model="m", messages=MESSAGES)  # type: ignore[arg-type]
        with pytest.raises(anthropic.APIStatusError) as overloaded:
            await an.messages.create(model="m", max_tokens=5, messages=MESSAGES)  # type: ignore[arg-type]
    assert llm.provider_failure(limited.value) == llm.ProviderFailure(
        True, 429, 0.25, "HTTP 429 (rate limited)")
    failure = llm.provider_failure(bad.value)
    assert failure is not None and not failure.retriable
    assert "unknown model 'x'" in str(bad.value)
    failure = llm.provider_failure(overloaded.value)
    assert failure is not None and failure.retriable and failure.status == 529
    assert server.usage() == {"input_tokens": 0, "output_tokens": 0}  # errors bill nothing


async def test_a_dropped_stream_fails_the_reader_and_bills_nothing(fake: tuple[FakeLLM, str]) -> None:
    server, url = fake
    server.script(Reply(text="one two three four five", disconnect_after=3))
    received: list[str] = []
    async with openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="k", max_retries=0) as client:
        stream = await client.chat.completions.create(model="m", messages=MESSAGES, stream=True)  # type: ignore[arg-type]
        with pytest.raises(Exception) as dropped:  # the SDK's own transport error
            async for c in stream:
                received.append(c.choices[0].delta.content or "")
    failure = llm.provider_failure(dropped.value)
    assert failure is not None and failure.retriable, repr(dropped.value)
    assert "".join(received) == "one two"  # the role chunk, then two words
    assert server.requests[0].chunks == 3 and not server.requests[0].completed
    assert server.usage() == {"input_tokens": 0, "output_tokens": 0}


async def test_an_empty_script_echoes(fake: tuple[FakeLLM, str]) -> None:
    server, url = fake
    async with openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="k", max_retries=0) as client:
        whole = await client.chat.completions.create(model="m", messages=MESSAGES)  # type: ignore[arg-type]
    assert whole.choices[0].message.content == "echo: what is durable execution"
    assert server.pending() == 0

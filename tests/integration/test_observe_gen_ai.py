"""A journaled model call's tether.call span carries OpenTelemetry's GenAI attributes
(gen_ai.request.model from the call's `model=`, gen_ai.response.model and the token usage
from its result), through the real OpenAI and Anthropic SDKs against tether.testing.FakeLLM,
seen by the SDK's in-memory exporter; other calls carry none."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import tether
from apps.inprocess import WAIT, working
from tether.observe import enable_tracing
from tether.testing import FakeLLM, Reply

agent = tether.Agent("genai")
ASK = [{"role": "user", "content": "count these four words"}]
URL_ENV = "TETHER_TEST_GENAI_URL"


async def plain() -> dict[str, Any]:
    return {"model": "not-a-model-call"}  # no usage: not a model's result


@agent.node(start=True)
async def ask(state: dict[str, Any], ctx: tether.Context) -> tether.Command:
    url = os.environ[URL_ENV]
    if state["api"] == "openai":
        import openai

        async with openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="k", max_retries=0) as oa:
            answer: Any = await ctx.call(oa.chat.completions.create, model="gpt-asked",
                                         messages=ASK)
    else:
        import anthropic

        async with anthropic.AsyncAnthropic(base_url=url, api_key="k", max_retries=0) as an:
            answer = await ctx.stream_call(an.messages.create, model="claude-asked",
                                           max_tokens=64, messages=ASK, stream=True)
    await ctx.call(plain)
    return tether.finish({"model": answer.model})


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeLLM]:
    llm = FakeLLM(model="served-model")
    with llm.serve() as url:
        monkeypatch.setenv(URL_ENV, url)
        yield llm


@pytest.mark.parametrize("api", ["openai", "anthropic"])
async def test_a_model_calls_span_has_its_model_and_tokens(db_url: str, fake: FakeLLM,
                                                           api: str) -> None:
    fake.script(Reply(text="one two three", output_tokens=7))
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    rt = tether.Runtime(db_url, agents=[agent], version="v1")
    enable_tracing(rt, provider.get_tracer("tether"))
    async with working(rt):
        run = await rt.start(agent, {"api": api})
        done = await rt.wait(run.thread_id, timeout=WAIT)
    provider.force_flush()
    assert done.status == "completed", done.error
    assert done.state["model"] == "served-model"
    calls = [s for s in exporter.get_finished_spans() if s.name == "tether.call"]
    assert len(calls) == 2
    model_call, plain_call = sorted(calls, key=lambda s: s.start_time or 0)
    billed = fake.usage(api)
    assert billed["input_tokens"] > 0 and billed["output_tokens"] == 7
    attrs = dict(model_call.attributes or {})
    assert {k: v for k, v in attrs.items() if k.startswith("gen_ai.")} == {
        "gen_ai.request.model": "gpt-asked" if api == "openai" else "claude-asked",
        "gen_ai.response.model": "served-model",
        "gen_ai.usage.input_tokens": billed["input_tokens"],
        "gen_ai.usage.output_tokens": billed["output_tokens"],
    }
    assert attrs["tether.thread_id"] == run.thread_id and attrs["tether.step"] == 1
    assert not any(k.startswith("gen_ai.") for k in plain_call.attributes or {})

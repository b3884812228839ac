"""An LLM agent for the crash tests, run by `tether worker --app llm_app:runtime` against the
FakeLLM whose base URL is in FAKE_LLM_URL (started by the test).

`ask` streams one completion through the real SDK named by the run's input ("openai" or
"anthropic") with ctx.stream_call, then journals `hold`, which waits on the first attempt
(long enough for the test to SIGKILL the worker after the completion was journaled) and
returns at once on later ones.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

# Both SDKs imported with the app, before the worker takes runs: an import inside a step
# blocks the event loop for seconds on a busy machine, longer than the tests' 2 s lease TTL,
# so another worker would take the run over before its first attempt made the call.
import anthropic
import openai

import tether

agent = tether.Agent("llm", retry=tether.RetryPolicy(attempts=5, initial=0.05))
ASK = [{"role": "user", "content": "stream me a story"}]


async def hold(attempt: int, seconds: float) -> int:
    if attempt == 1:
        await asyncio.sleep(seconds)
    return attempt


@agent.node(start=True)
async def ask(state: dict[str, Any], ctx: tether.Context) -> tether.Command:
    url = os.environ["FAKE_LLM_URL"]
    if state["api"] == "openai":
        async with openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="k", max_retries=0) as oa:
            answer: Any = await ctx.stream_call(
                oa.chat.completions.create, model="m", messages=ASK, stream=True,
                stream_options={"include_usage": True})
        text = answer.choices[0].message.content
    else:
        async with anthropic.AsyncAnthropic(base_url=url, api_key="k", max_retries=0) as an:
            answer = await ctx.stream_call(an.messages.create, model="m", max_tokens=256,
                                           messages=ASK, stream=True)
        text = answer.content[0].text
    held = await ctx.call(hold, ctx.attempt, state.get("hold", 0.0))
    return tether.finish({"text": text, "type": type(answer).__qualname__,
                          "module": type(answer).__module__, "held_on": held})


runtime = tether.Runtime(agents=[agent], poll_interval=0.05)

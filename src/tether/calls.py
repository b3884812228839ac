"""How a journaled call runs the first time (Context records what it returns): a per-call
timeout and retry policy, a stream consumed chunk by chunk, a sync function in a process pool.

Provider failures decide the retries (tether.llm): a rate limit, a timeout, a 5xx or a dropped
connection is retried, no sooner than the provider's Retry-After; a 4xx request error is not,
since the same request would fail the same way.
"""

from __future__ import annotations

import asyncio
import inspect
import pickle
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from concurrent.futures import Executor
from typing import Any

import orjson

from . import llm
from .errors import CallTimeout, DefinitionError
from .retry import RetryPolicy

OnRetry = Callable[[int, float, BaseException], None]


def retry_delay(policy: RetryPolicy, failures: int, exc: BaseException) -> float | None:
    """Seconds before the next attempt after `failures` failed ones, or None to give up: the
    policy's backoff, never for a provider's request error, never sooner than its
    Retry-After."""
    failure = llm.provider_failure(exc)
    if failure is not None and not failure.retriable:
        return None
    delay = policy.next_delay(failures, exc)
    if delay is not None and failure is not None and failure.retry_after is not None:
        delay = max(delay, failure.retry_after)
    return delay


async def attempts(make: Callable[[], Awaitable[Any]], name: str, timeout: float | None,
                   retry: RetryPolicy | None, on_retry: OnRetry) -> Any:
    """`await make()` under `timeout` (CallTimeout when it expires), again as `retry`
    decides after a failure; the last failure propagates (to the node's own policy)."""
    if timeout is not None and not timeout > 0:
        raise DefinitionError(f"call timeout must be > 0 seconds, got {timeout!r}")
    failures = 0
    while True:
        try:
            if timeout is None:
                return await make()
            deadline = asyncio.timeout(timeout)
            try:
                async with deadline:
                    return await make()
            except TimeoutError as exc:
                if not deadline.expired():
                    raise  # the callee's own TimeoutError
                raise CallTimeout(f"call to {name} took longer than {timeout:g} s") from exc
        except Exception as exc:
            failures += 1
            delay = None if retry is None else retry_delay(retry, failures, exc)
            if delay is None:
                raise
            on_retry(failures, delay, exc)
            await asyncio.sleep(delay)


async def invoke(fn: Callable[..., Any], args: Sequence[Any], kwargs: Mapping[str, Any]) -> Any:
    value = fn(*args, **kwargs)
    if inspect.isawaitable(value):
        value = await value
    return value


async def stream(fn: Callable[..., Any], args: Sequence[Any], kwargs: Mapping[str, Any],
                 forward: Callable[[Any], None],
                 assemble: Callable[[list[Any]], Any] | None) -> Any:
    """Consume the stream `fn` returns (an async iterator, an awaitable of one, or an async
    context manager around one, as SDKs give), `forward` each chunk as it arrives, and
    return what the chunks assemble into (llm.assemble unless `assemble` is given)."""
    source = fn(*args, **kwargs)
    if inspect.isawaitable(source):
        source = await source
    chunks: list[Any] = []
    if hasattr(source, "__aiter__"):
        await _drain(source, chunks, forward)
        closing = getattr(source, "close", None)  # SDK streams: give the connection back
        if closing is not None and inspect.iscoroutinefunction(closing):
            await closing()
    elif hasattr(source, "__aenter__"):
        async with source as entered:
            await _drain(entered, chunks, forward)
    else:
        raise DefinitionError(
            f"ctx.stream_call(): {type(source).__name__!r} is not an async iterator of chunks "
            "(pass the function that starts the stream, e.g. with stream=True)")
    return (assemble or llm.assemble)(chunks)


async def _drain(source: AsyncIterator[Any], chunks: list[Any], forward: Callable[[Any], None]
                 ) -> None:
    async for chunk in source:
        chunks.append(chunk)
        forward(chunk)


async def in_process(pool: Callable[[], Executor] | None, fn: Callable[..., Any],
                     args: Sequence[Any], kwargs: Mapping[str, Any], name: str) -> Any:
    """`fn(*args, **kwargs)` in the worker's process pool, awaited without blocking the loop."""
    if pool is None:
        raise DefinitionError("ctx.cpu_call() runs in a worker's process pool, and this "
                              "context has none (it runs outside a worker)")
    if inspect.iscoroutinefunction(fn):
        raise DefinitionError(f"ctx.cpu_call() takes a sync function; {name} is async "
                              "(await it with ctx.call instead)")
    try:
        future = pool().submit(fn, *args, **kwargs)
        return await asyncio.wrap_future(future)
    except (pickle.PicklingError, AttributeError, TypeError) as exc:
        if "pickle" not in str(exc):
            raise
        raise DefinitionError(
            f"ctx.cpu_call({name}): its function, arguments and result go to another process "
            f"and must be picklable (a module-level function): {exc}") from None


# -- what a call was given, for people -----------------------------------------------------

ARGS_PREVIEW_MAX = 4000
"""Characters of a call's arguments kept with its journaled result (for the run page)."""
_SECRET_WORDS = ("key", "token", "secret", "password", "authorization", "credential")


def _shown(value: object) -> object:
    """A value JSON cannot carry, as people would read it (its repr, bounded)."""
    text = repr(value)
    return text if len(text) <= 200 else text[:199] + "…"


def args_preview(args: Sequence[Any], kwargs: Mapping[str, Any]) -> str | None:
    """A journaled call's arguments as JSON text for people (None when it had none): the
    positional ones as a list, the keywords by name, values JSON cannot carry as their repr,
    a keyword that names a secret (api_key, token, password...) masked; cut at
    ARGS_PREVIEW_MAX characters. Never used to replay: a replay returns the result."""
    shown: dict[str, Any] = {}
    if args:
        shown["args"] = args  # a tuple is a JSON array to orjson
    if kwargs:
        shown["kwargs"] = {k: ("***" if any(w in k.lower() for w in _SECRET_WORDS) else v)
                           for k, v in kwargs.items()}
    elif not args:
        return None
    try:
        text = orjson.dumps(shown, default=_shown, option=orjson.OPT_NON_STR_KEYS).decode()
    except (TypeError, orjson.JSONEncodeError):  # e.g. an int too large, a recursive value
        text = orjson.dumps({k: _shown(v) for k, v in shown.items()}).decode()
    if len(text) > ARGS_PREVIEW_MAX:
        text = text[:ARGS_PREVIEW_MAX - 1] + "…"
    return text


def args_of(text: str | None) -> Any:
    """A stored arguments preview read back: its JSON value, or the text itself when it was
    cut (no longer JSON)."""
    if text is None:
        return None
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        return text

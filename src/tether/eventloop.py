"""The event loop tether's own entry points run on (`tether worker` and the other CLI
commands, `tether bench`): uvloop where it is installed (a dependency on Linux and macOS), else
asyncio's own. Set TETHER_LOOP=asyncio to use asyncio's loop everywhere.

uvloop runs the same asyncio code with a faster loop (callbacks, timers and sockets in C): at
10,000 concurrent runs a worker spends about a tenth less CPU per step (docs/benchmarks.md).
Code that calls `runtime.work()` itself runs on whatever loop it started.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from .errors import ConfigError

T = TypeVar("T")
LOOPS = ("uvloop", "asyncio")


def loop_name() -> str:
    """The loop `run` uses: TETHER_LOOP if set (uvloop or asyncio), else uvloop where it is
    installed, else asyncio."""
    chosen = os.environ.get("TETHER_LOOP", "").strip().lower()
    if chosen and chosen not in LOOPS:
        raise ConfigError(f"TETHER_LOOP must be one of {', '.join(LOOPS)}, got {chosen!r}")
    if chosen == "asyncio":
        return "asyncio"
    try:
        import uvloop  # noqa: F401
    except ImportError:
        if chosen == "uvloop":
            raise ConfigError("TETHER_LOOP=uvloop but uvloop is not installed "
                              "(pip install uvloop)") from None
        return "asyncio"
    return "uvloop"


def _factory(name: str) -> Callable[[], asyncio.AbstractEventLoop] | None:
    if name == "uvloop":
        import uvloop

        return uvloop.new_event_loop
    return None  # asyncio's default


def run(main: Coroutine[Any, Any, T]) -> T:
    """asyncio.run(main) on the loop `loop_name()` names."""
    try:
        factory = _factory(loop_name())
    except BaseException:
        main.close()  # never awaited: no "coroutine was never awaited" warning
        raise
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(main)

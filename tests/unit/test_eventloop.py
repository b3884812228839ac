"""tether's entry points run on uvloop where it is installed, or on asyncio's loop when
TETHER_LOOP=asyncio; a bad TETHER_LOOP is a clear error."""

from __future__ import annotations

import asyncio

import pytest
import uvloop

from tether import eventloop
from tether.errors import ConfigError


async def _loop_type() -> type:
    await asyncio.sleep(0)
    return type(asyncio.get_running_loop())


@pytest.mark.parametrize(("setting", "expected"), [("", uvloop.Loop), ("uvloop", uvloop.Loop),
                                                    (" UVLOOP ", uvloop.Loop),
                                                    ("asyncio", asyncio.SelectorEventLoop)])
def test_run_uses_the_loop_tether_loop_names(
    monkeypatch: pytest.MonkeyPatch, setting: str, expected: type
) -> None:
    monkeypatch.setenv("TETHER_LOOP", setting)
    assert eventloop.run(_loop_type()) is expected


def test_an_unknown_loop_is_a_config_error_and_nothing_runs(
    monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TETHER_LOOP", "trio")
    ran = []

    async def main() -> None:
        ran.append(True)

    with pytest.raises(ConfigError, match="TETHER_LOOP must be one of uvloop, asyncio, got 'trio'"):
        eventloop.run(main())
    assert not ran

"""Store-wide gauges for `tether serve`'s /metrics: runs by status and version, effects by
status, read from the store at most once per `ttl` seconds however often it is scraped."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from ..store.base import StatusCounts

if TYPE_CHECKING:
    from ..runtime import Runtime


class StoreGauges:
    def __init__(self, runtime: Runtime, ttl: float = 5.0) -> None:
        self.runtime = runtime
        self.ttl = ttl
        self.counts: StatusCounts | None = None
        self.read_at = float("-inf")
        self.reads = 0
        self._lock = asyncio.Lock()

    async def refresh(self) -> StatusCounts:
        """The counts, read again only when the cached ones are older than `ttl` (concurrent
        scrapes share one read)."""
        async with self._lock:
            if self.counts is None or time.monotonic() - self.read_at >= self.ttl:
                self.counts = await self.runtime.status_counts()
                self.read_at = time.monotonic()
                self.reads += 1
            return self.counts

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import GaugeMetricFamily

        counts = self.counts
        runs = GaugeMetricFamily("tether_runs", "Runs in the store by status and version",
                                 labels=["status", "version"])
        effects = GaugeMetricFamily("tether_effects_open",
                                    "Effects in the store not done, by status (pending, "
                                    "running, dead)", labels=["status"])
        if counts is not None:
            for (status, version), n in sorted(counts.runs.items()):
                runs.add_metric([status, version], n)
            for status in ("pending", "running", "dead"):
                effects.add_metric([status], counts.effects.get(status, 0))
        yield runs
        yield effects

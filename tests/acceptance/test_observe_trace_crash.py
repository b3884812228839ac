"""Acceptance: a run whose worker is SIGKILLed mid-way and which a second worker finishes has
all its step spans in one trace. The workers are real `tether worker` subprocesses that
configure the OpenTelemetry SDK from OTEL_* (console exporter, a short batch delay so the
killed worker's finished spans were exported before the kill)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import tether
from apps import Workers, eventually
from apps import observe_app as app

OTEL = {"OTEL_TRACES_EXPORTER": "console", "OTEL_BSP_SCHEDULE_DELAY": "20",
        "OTEL_SERVICE_NAME": "tether-test"}


def spans_in(output: str) -> list[dict[str, Any]]:
    """The JSON spans the console exporter printed (other lines skipped)."""
    decoder, spans, i = json.JSONDecoder(), [], 0
    while (i := output.find("{\n", i)) != -1:
        obj, end = decoder.raw_decode(output, i)
        if isinstance(obj, dict) and "context" in obj:
            spans.append(obj)
        i = end
    return spans


async def test_a_killed_runs_steps_are_in_one_trace(db_url: str, tmp_path: Path) -> None:
    steps = 6
    async with tether.Runtime(db_url, agents=[app.agent, app.child_agent]) as rt:
        run = await rt.start(app.agent, {"steps": steps, "pause": 0.2}, thread_id="traced")
        with Workers(db_url, tmp_path, call_log=tmp_path / "log",
                     app="apps.observe_app:make_runtime") as workers:
            first = workers.start(concurrency=2, lease_ttl=1.0, env=OTEL)

            async def midway() -> bool:
                return (await rt.peek(run.thread_id)).step >= 3

            await eventually(midway, what="3 committed steps", workers=workers)
            await asyncio.sleep(0.3)  # the batch processor exports what ended
            first.kill()
            second = workers.start(concurrency=2, lease_ttl=1.0, env=OTEL)
            done = await rt.wait(run.thread_id, timeout=60)
            assert second.terminate() == 0, second.output()
        assert done.status == "completed"
    killed, finished = spans_in(first.output()), spans_in(second.output())
    step_spans = [s for s in killed + finished if s["name"] == "tether.step"
                  and s["attributes"].get("tether.thread_id") == "traced"]
    committed = {s["attributes"]["tether.step"] for s in step_spans}
    assert committed == set(range(1, steps + 1)), step_spans
    assert len({s["context"]["trace_id"] for s in step_spans}) == 1
    assert len({s["parent_id"] for s in step_spans}) == 1
    workers_seen = {s["attributes"]["tether.worker"] for s in step_spans}
    assert len(workers_seen) == 2, workers_seen
    assert {s["resource"]["attributes"]["service.name"] for s in step_spans} == {"tether-test"}

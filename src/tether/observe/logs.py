"""Structured logs: one JSON line per finished run and per failed step (`tether worker
--log-format json`), and a JSON formatter for tether's other log records.

A finished run's line: event "run_finished", thread_id, agent, version, status, steps (the
run's last step), attempts (executions of its last step), and wait_ms (created to first claim,
when this process made that claim), exec_ms (the run's steps, node and commit, summed over
every drive of it in this process: before and after a park for a person, a retry, a release),
total_ms (created to finished). A failure's line: event "step_failed", with node, step,
attempt, category, final and error.
"""

from __future__ import annotations

import logging
import sys
import time
from collections import OrderedDict
from collections.abc import Mapping
from typing import IO, Any

import orjson

from ..hub import Driver, RunObserver
from ..retry import FailureCategory
from ..store.base import EffectRecord, NewRun, RunRecord


class JsonLogs:
    """An Observer writing JSON lines to `stream` (stderr by default)."""

    def __init__(self, stream: IO[str] | None = None) -> None:
        self.stream = stream
        # Queue waits of runs first claimed here, until they finish (a retry or a resume is
        # another drive of the run); bounded, oldest forgotten first.
        # Ordered: the oldest is dropped past 100,000 in O(1) (a plain dict's first key is
        # found by scanning the slots of every key deleted before it).
        self.waits: OrderedDict[str, float] = OrderedDict()
        self.execs: OrderedDict[str, float] = OrderedDict()
        """Steps' time of runs whose drive here ended open (parked, released), by thread_id."""

    def write(self, record: dict[str, Any]) -> None:
        stream = self.stream if self.stream is not None else sys.stderr
        stream.write(orjson.dumps(record).decode() + "\n")
        stream.flush()

    def run_observer(self, run: RunRecord, worker: str) -> RunObserver:
        return _RunLog(self, run, worker)

    def effect(self, effect: EffectRecord, outcome: str, started: float, finished: float) -> None:
        if outcome == "dead":
            self.write({"ts": finished, "event": "effect_dead", "thread_id": effect.thread_id,
                        "effect": effect.name, "key": effect.key, "attempts": effect.attempts})

    def run_created(self, new: NewRun, parent: RunRecord | None, traceparent: str | None,
                    at: float) -> str | None:
        return None

    def worker_started(self, worker: Driver) -> None:
        pass

    def worker_stopped(self, worker: Driver) -> None:
        pass


class _RunLog:
    __slots__ = ("exec", "log", "run", "worker")

    def __init__(self, log: JsonLogs, run: RunRecord, worker: str) -> None:
        self.log = log
        self.run = run
        self.worker = worker
        self.exec = log.execs.pop(run.thread_id, 0.0)  # its earlier drives in this process
        if run.step == 0 and run.attempt <= 1:
            if len(log.waits) >= 100_000:
                log.waits.popitem(last=False)
            log.waits[run.thread_id] = max(0.0, time.time() - run.created_at)

    def call(self, step: int, name: str, replayed: bool, started: float, finished: float,
             llm: Mapping[str, Any] | None = None) -> None:
        pass

    def step(self, step: int, node: str, attempt: int, started: float, finished: float,
             status: str, received: int, sent: int) -> None:
        self.exec += finished - started
        if status == "completed":
            self._finished("completed", step, attempt, finished)

    def parked(self, step: int, node: str, attempt: int, started: float, kind: str) -> None:
        self.exec += time.time() - started
        self._keep()

    def _keep(self) -> None:
        """The drive ends with the run open: its steps' time is added to the next drive's."""
        execs = self.log.execs
        if len(execs) >= 100_000:
            execs.popitem(last=False)
        execs[self.run.thread_id] = self.exec

    def failed(self, step: int, node: str | None, attempt: int, started: float,
               category: FailureCategory, exc: BaseException, final: bool) -> None:
        now = time.time()
        self.exec += now - started
        run = self.run
        self.log.write({"ts": now, "event": "step_failed", "thread_id": run.thread_id,
                        "agent": run.agent, "version": run.version, "node": node, "step": step,
                        "attempt": attempt, "category": category.value, "final": final,
                        "error": f"{type(exc).__name__}: {exc}", "worker": self.worker})
        if final:
            self._finished("failed", step - 1, attempt, now)

    def released(self, reason: str) -> None:
        self._keep()

    def _finished(self, status: str, steps: int, attempts: int, at: float) -> None:
        run = self.run
        wait = self.log.waits.pop(run.thread_id, None)
        self.log.write({
            "ts": at, "event": "run_finished", "thread_id": run.thread_id, "agent": run.agent,
            "version": run.version, "status": status, "steps": steps, "attempts": attempts,
            "wait_ms": None if wait is None else round(wait * 1000, 3),
            "exec_ms": round(self.exec * 1000, 3),
            "total_ms": round(max(0.0, at - run.created_at) * 1000, 3), "worker": self.worker})


class JsonFormatter(logging.Formatter):
    """A log record as one JSON line (ts, level, logger, message, and the exception)."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {"ts": record.created, "event": "log", "level": record.levelname,
                               "logger": record.name, "message": record.getMessage()}
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return orjson.dumps(out).decode()


def json_logging() -> None:
    """Every handler of the root logger writes JSON lines from now on."""
    root = logging.getLogger()
    if not root.handlers:
        root.addHandler(logging.StreamHandler())
    for handler in root.handlers:
        handler.setFormatter(JsonFormatter())

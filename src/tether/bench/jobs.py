"""A benchmark job: one workload on one backend, run in its own process, and its results."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field

from .common import Result

PACKAGE_MODULE = "tether.bench.workloads"  # runs one workload per process (workloads.main)
TIMEOUT_S = 900.0  # per workload process; the workloads give up sooner themselves


@dataclass(slots=True)
class Job:
    backend: str
    workload: str
    args: tuple[str, ...] = ()
    label: str = ""
    timeout: float = TIMEOUT_S
    results: list[Result] = field(default_factory=list)
    error: str | None = None
    seconds: float = 0.0
    module: str = PACKAGE_MODULE

    def argv(self) -> list[str]:
        return [sys.executable, "-m", self.module, self.workload, self.backend, *self.args]

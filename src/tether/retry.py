"""Retry policies and failure categories."""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from enum import StrEnum


class FailureCategory(StrEnum):
    """Why a run failed for good; recorded with the run's error."""

    EXCEPTION = "exception"            # the node raised and retries are exhausted
    NONDETERMINISM = "nondeterminism"  # replay diverged from the journal
    SERIALIZATION = "serialization"    # an update or result was not serializable
    DEFINITION = "definition"          # unknown node / bad command returned
    CANCELLED = "cancelled"


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How often and how fast a failing node is retried.

    `attempts` counts every execution, the first included (attempts=1: no retry). The delay
    before attempt n+1 is `initial * factor**(n-1)`, capped at `maximum`, with full jitter
    between `(1 - jitter)` and 1 of that value. Only exceptions that are instances of
    `retry_on` are retried; others fail the run at once.
    """

    attempts: int = 3
    initial: float = 0.5
    factor: float = 2.0
    maximum: float = 60.0
    jitter: float = 0.5
    retry_on: tuple[type[BaseException], ...] = field(default=(Exception,))

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise ValueError("RetryPolicy.attempts must be >= 1")
        if self.initial < 0 or self.maximum < 0 or self.factor < 1:
            raise ValueError("RetryPolicy delays must be >= 0 and factor >= 1")
        if not 0 <= self.jitter <= 1:
            raise ValueError("RetryPolicy.jitter must be within [0, 1]")

    def next_delay(self, failures: int, exc: BaseException) -> float | None:
        """Seconds to wait before the next attempt after `failures` failed ones, or None to
        give up."""
        if failures >= self.attempts or not isinstance(exc, self.retry_on):
            return None
        base = min(self.maximum, self.initial * self.factor ** (failures - 1))
        return base * (1 - self.jitter * random.random())



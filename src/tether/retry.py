"""Retry policies and failure categories."""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from enum import StrEnum

from .errors import (
    DefinitionError,
    LeaseLost,
    NondeterminismError,
    RunNotFound,
    SerializationError,
    StoreError,
)
from .llm import provider_failure


class FailureCategory(StrEnum):
    """Why a step failed: one taxonomy for the run's error, the metrics (`category` label) and
    the traces (`tether.failure.category`). Whether the failure was final (the run failed) or
    retriable (the step runs again) is told apart beside it, never folded into it: a node
    whose retries are exhausted failed for good with the category of its last failure."""

    EXCEPTION = "exception"            # the node (user code) raised
    TIMEOUT = "timeout"                # the node raised TimeoutError (a deadline of its own)
    NONDETERMINISM = "nondeterminism"  # replay diverged from the journal
    SERIALIZATION = "serialization"    # an update or result was not serializable
    LLM_PROVIDER = "llm_provider"      # a provider's failure (tether.llm): rate limit, 5xx, 4xx...
    DEFINITION = "definition"          # unknown node / bad command returned / unknown recipient
    LEASE_LOST = "lease_lost"          # another worker took the run over (fenced out)
    STORE_UNAVAILABLE = "store_unavailable"  # the database failed; the run is given back
    CANCELLED = "cancelled"            # the run was cancelled


def categorize(exc: BaseException) -> FailureCategory:
    """The category of a step's failure."""
    for types, category in (
        (NondeterminismError, FailureCategory.NONDETERMINISM),
        (SerializationError, FailureCategory.SERIALIZATION),
        ((DefinitionError, RunNotFound), FailureCategory.DEFINITION),
        (LeaseLost, FailureCategory.LEASE_LOST),
        (StoreError, FailureCategory.STORE_UNAVAILABLE),
    ):
        if isinstance(exc, types):
            return category
    if provider_failure(exc) is not None:  # before TimeoutError: a CallTimeout is one too
        return FailureCategory.LLM_PROVIDER
    if isinstance(exc, TimeoutError):
        return FailureCategory.TIMEOUT
    return FailureCategory.EXCEPTION


FINAL_CATEGORIES = frozenset({FailureCategory.NONDETERMINISM, FailureCategory.SERIALIZATION,
                              FailureCategory.DEFINITION})
"""Categories never retried: running the same code on the same state fails the same way."""


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



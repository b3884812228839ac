"""Which Postgres errors tether retries: an undone transaction (SQLSTATE class 40) only."""

from __future__ import annotations

import psycopg
import psycopg.errors as pe
import pytest

from tether.store.pg_io import _retryable


@pytest.mark.parametrize("exc", [pe.DeadlockDetected(), pe.SerializationFailure(),
                                 pe.TransactionRollback()])
def test_deadlocks_and_serialization_failures_are_retried(exc: psycopg.Error) -> None:
    # psycopg's DeadlockDetected is an OperationalError, not a TransactionRollback.
    assert _retryable(exc)


@pytest.mark.parametrize("exc", [pe.UniqueViolation(), pe.InvalidSqlStatementName(),
                                 psycopg.OperationalError("connection lost")])
def test_other_errors_are_not(exc: psycopg.Error) -> None:
    assert not _retryable(exc)

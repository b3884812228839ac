"""Postgres plumbing without a server: which errors are retried, and URL pool options."""

from __future__ import annotations

import psycopg
import psycopg.errors as pe
import pytest

from tether.errors import ConfigError
from tether.store.pg_conn import pool_options, retryable


@pytest.mark.parametrize("exc", [pe.DeadlockDetected(), pe.SerializationFailure(),
                                 pe.TransactionRollback()])
def test_deadlocks_and_serialization_failures_are_retried(exc: psycopg.Error) -> None:
    # psycopg's DeadlockDetected is an OperationalError, not a TransactionRollback.
    assert retryable(exc)


@pytest.mark.parametrize("exc", [pe.UniqueViolation(), pe.InvalidSqlStatementName(),
                                 psycopg.OperationalError("connection lost")])
def test_other_errors_are_not(exc: psycopg.Error) -> None:
    assert not retryable(exc)


# -- tether's own options in a Postgres URL ---------------------------------------------------


def test_pool_options_are_taken_out_of_the_url() -> None:
    rest, opts = pool_options("u@h/db?sslmode=disable&pool_max=40&pool_timeout=2.5&pool_min=4",
                               "x")
    assert rest == "u@h/db?sslmode=disable"
    assert opts == {"pool_max": 40, "pool_timeout": 2.5, "pool_min": 4}
    assert pool_options("u@h/db?pool_max=5", "x") == ("u@h/db", {"pool_max": 5})
    assert pool_options("u@h/db", "x") == ("u@h/db", {})


@pytest.mark.parametrize("query", ["pool_max=0", "pool_max=2.5", "pool_timeout=-1",
                                   "pool_min=many"])
def test_bad_pool_options_are_config_errors(query: str) -> None:
    with pytest.raises(ConfigError, match=query.split("=")[0]):
        pool_options(f"u@h/db?{query}", "postgresql://u@h/db")

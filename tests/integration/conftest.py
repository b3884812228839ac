"""Fixtures for the in-process integration tests."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tests set their own settings: none leak in from the environment. A node still sleeping
    when a test stops its worker holds the shutdown 1 s at most."""
    for var in ("DB", "LEASE_TTL", "POLL_INTERVAL", "SNAPSHOT_EVERY", "CONCURRENCY"):
        monkeypatch.delenv(f"TETHER_{var}", raising=False)
    monkeypatch.setenv("TETHER_SHUTDOWN_GRACE", "1")

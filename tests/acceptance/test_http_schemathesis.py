"""Property-based tests of the HTTP API against its OpenAPI schema (schemathesis): for
generated requests to every operation, no 5xx, and every response matches the documented
status codes, content types and schemas.

The schema is built in-process from the same app the server runs (and checked equal to the
server's /openapi.json), so pytest can parametrize by operation at collection time. One
SQLite-backed `tether serve --worker` serves the module, with only agents that finish by
themselves, so the event streams schemathesis opens end on their own.
"""

from __future__ import annotations

import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.specs.openapi.checks import positive_data_acceptance

from tether.service import create_app

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "apps"))

import http_app
from http_harness import Procs, Server

OPENAPI = create_app(http_app.quick).openapi()
schema = schemathesis.openapi.from_dict(OPENAPI)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, sqlite_template: Path) -> Iterator[Server]:
    tmp = tmp_path_factory.mktemp("schemathesis")
    db = tmp / "t.db"
    shutil.copyfile(sqlite_template, db)
    procs = Procs(tmp, f"sqlite:///{db}")
    try:
        yield procs.serve(app="http_app:quick", worker=True)
    finally:
        procs.close()


def test_served_schema_is_the_tested_one(server: Server) -> None:
    served = httpx.get(server.base_url + "/openapi.json").json()
    assert served == OPENAPI
    assert set(served["paths"]) == {
        "/runs", "/runs:batch", "/runs/{thread_id}", "/runs/{thread_id}/resume", "/runs/{thread_id}/cancel",
        "/runs/{thread_id}/checkpoints", "/runs/{thread_id}/fork", "/runs/{thread_id}/events",
        "/runs/{thread_id}/messages", "/runs/{thread_id}/retry",
        "/interrupts", "/healthz", "/audit", "/metrics",
        "/deployments", "/deployments/{version}/drain", "/deployments/{version}/retire",
        "/workers",
    }


@schema.parametrize()
@settings(max_examples=40, deadline=None, derandomize=True,
          suppress_health_check=list(HealthCheck))
def test_api_conforms_to_its_schema(case: schemathesis.Case, server: Server) -> None:
    excluded = []
    if case.query and "cursor" in case.query:
        # A cursor is opaque: a schema-valid string this server never issued is a 400.
        excluded.append(positive_data_acceptance)
    if case.headers and "Last-Event-ID" in case.headers:
        # Likewise an event id: one this server never sent is a 400.
        excluded.append(positive_data_acceptance)
    if case.query and case.query.get("until") and case.query.get("wait") is None:
        # `until` means nothing without `wait` (the seconds to wait): a 422 saying so.
        excluded.append(positive_data_acceptance)
    if case.query and isinstance(case.query.get("wait"), (int, float)):
        case.query["wait"] = min(case.query["wait"], 0.5)  # a long-poll: keep each short
    batch = case.body.get("runs") if isinstance(case.body, dict) else None
    if case.path.startswith("/deployments") or (
            case.path == "/runs" and isinstance(case.body, dict) and case.body.get("version")
    ) or (case.path == "/runs:batch" and isinstance(batch, list) and any(
            isinstance(r, dict) and r.get("version") for r in batch)):
        # Routing, draining and a start on an explicit version name versions that must exist
        # (a registered worker or a weight): a schema-valid unknown version is a 422 saying
        # so, not a schema breach.
        excluded.append(positive_data_acceptance)
    if _has_big_int(case.body):
        # State is stored as JSON with 64-bit integers; a larger one is a 422 naming it.
        excluded.append(positive_data_acceptance)
    case.call_and_validate(base_url=server.base_url, timeout=15, excluded_checks=excluded)


def _has_big_int(value: Any) -> bool:
    if isinstance(value, dict):
        return any(_has_big_int(v) for v in value.values())
    if isinstance(value, list):
        return any(_has_big_int(v) for v in value)
    return isinstance(value, int) and not -(2**63) <= value < 2**64

"""The CLI's tables stay readable in an 80-column terminal: no state, version or worker id is
cut to an ellipsis (rich's default when a table is too wide)."""

from __future__ import annotations

import time

import pytest

from tether.cli.deploy import _table
from tether.deploy import Deployment


def test_deploy_status_fits_80_columns(monkeypatch: pytest.MonkeyPatch,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("COLUMNS", "80")
    _table([
        Deployment("2026-11-30-hotfix", 0, "draining", 1,
                   {"queued": 0, "running": 3, "waiting": 9, "sleeping": 0},
                   oldest_open=time.time() - 7200, stranded=0),
        Deployment("v2", 100, "active", 2, {"queued": 1}, oldest_open=time.time() - 5),
    ])
    out = capsys.readouterr().out
    assert "…" not in out, out
    assert max(len(line) for line in out.splitlines()) <= 80, out
    assert "draining" in out and "active" in out
    assert "running," in out and "9 waiting" in out and "1 queued" in out  # the cell wraps
    assert "2026-11-30" in out and "hotfix" in out  # folded, not cut


def test_rows_too_wide_for_the_terminal_are_printed_as_records(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from tether.cli._common import print_table
    from tether.cli.runs import RUN_COLUMNS

    monkeypatch.setenv("COLUMNS", "80")
    tid = "support-ticket-2026-000123"
    rows = [(tid, "support_agent", "completed", "", "", "12", "", "2026-12-01", "3",
             "TimeoutError: the model did not answer within 30 s " * 2),
            ("t2", "support_agent", "waiting", "", "2", "4", "review", "2026-12-01", "1", "")]
    print_table(RUN_COLUMNS, rows, optional=("actor", "inbox", "node", "error"))
    out = capsys.readouterr().out
    assert "…" not in out and max(len(line) for line in out.splitlines()) <= 80, out
    assert tid in out  # an id is never wrapped
    for word in ("support_agent", "completed", "waiting", "2026-12-01", "review"):
        assert word in out, (word, out)
    assert "actor" not in out  # no row has one: left out
    assert "inbox" in out and "error" in out and "TimeoutError:" in out
    assert "┃" not in out  # 80 columns cannot hold them: one record per run
    monkeypatch.setenv("COLUMNS", "160")
    print_table(RUN_COLUMNS, rows, optional=("actor", "inbox", "node", "error"))
    wide = capsys.readouterr().out
    assert "┃ thread_id" in wide and "…" not in wide  # a table where they fit


def test_checkpoint_records_are_titled_by_step_and_node(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from tether.cli.runs import _print_checkpoints
    from tether.types import Checkpoint

    worker = "ip-10-0-12-34.eu-west-1.compute.internal:123456:9f8e7d"  # too wide for a table
    cps = [Checkpoint("t1", step, node, nxt, {"question": 1, "topics": 2, "notes": 3}, "d",
                      worker, 1, 10.0, 10.25)
           for step, node, nxt in ((1, "plan", "research"), (2, "research", None))]
    monkeypatch.setenv("COLUMNS", "80")
    _print_checkpoints(cps)
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert "…" not in out and "..." not in out and max(map(len, lines)) <= 80, out
    assert "step 1 · plan" in lines and "step 2 · research" in lines, out
    assert not any(line.startswith(worker) for line in lines), out  # not a title: a field
    assert [line.split() for line in lines if "worker" in line] == [["worker", worker]] * 2, out
    assert any(line.split() == ["next", "research"] for line in lines), out
    assert "snapshot (the whole state)" in out  # the caption is kept


def test_audit_details_wrap_between_tokens(monkeypatch: pytest.MonkeyPatch,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    from tether.cli.audit import _print_events
    from tether.types import AuditEvent

    key = "support-ticket-2026-000123-idempotency"
    events = [
        AuditEvent(3, 1_764_000_000.0, "root", "start", "ticket-42", "ticket-42",
                   {"agent": "support_agent", "version": "2026-11-30-hotfix",
                    "idempotency_key": key, "input": {"tags": ["[urgent]", "billing"]}}),
        AuditEvent(2, 1_764_000_000.0, "root", "resume", "ticket-42", "ticket-42",
                   {"interrupt_id": None, "value": {"approved": True, "note": "ship it"}}),
        AuditEvent(1, 1_764_000_000.0, "root", "cancel", "ticket-41", "ticket-41", {}),
    ]
    for columns in ("80", "120"):  # records, then a table
        monkeypatch.setenv("COLUMNS", columns)
        _print_events(events)
        out = capsys.readouterr().out
        lines = out.splitlines()
        assert "…" not in out and max(map(len, lines)) <= int(columns), out
        words = {w for line in lines for w in line.replace("│", " ").split()}
        for token in (f"idempotency_key={key}", "version=2026-11-30-hotfix",
                      "agent=support_agent", "interrupt_id=null", "2025-11-24", "ticket-42"):
            assert token in words, (token, out)  # whole, on one line
        assert '["[urgent]",' in words, out  # JSON values spaced, markup kept as text
        if columns == "80":
            assert "#3 start" in lines and "#1 cancel" in lines, out  # records, titled
        else:
            assert "┃ details" in out, out


def test_interrupt_payloads_wrap_between_tokens(monkeypatch: pytest.MonkeyPatch,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    from tether.cli.runs import _print_interrupts
    from tether.types import Interrupt

    ask = Interrupt("ticket-42:3:0", "ticket-42", 3, {"question": "publish the [draft] now?",
                                                      "draft": "notes on draft for ada"},
                    "pending", None, 0.0, None)
    monkeypatch.setenv("COLUMNS", "80")
    _print_interrupts([ask])
    out = capsys.readouterr().out
    assert "…" not in out and max(map(len, out.splitlines())) <= 80, out
    words = {w for line in out.splitlines() for w in line.replace("│", " ").split()}
    assert {"ticket-42:3:0", '{"question":', '"publish', "[draft]", '"notes'} <= words, out

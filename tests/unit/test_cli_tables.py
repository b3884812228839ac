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

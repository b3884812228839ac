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

"""`tether demo`: a part runs with no traceback whatever TETHER_* the shell exports, and a part
that fails says so and makes the demo exit non-zero."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tether.demo import run


def test_the_async_part_ignores_the_shells_tether_db_and_shows_the_offload_line(
        tmp_path: Path) -> None:
    # The demo once exported TETHER_DB to the CPU-offload workload, which builds Runtime(url)
    # on fresh databases: its passes shared one database and the third collided (a traceback,
    # no offload line, and still "ok").
    env = {**os.environ, "TETHER_DB": f"sqlite:///{tmp_path / 'shell.db'}", "COLUMNS": "200"}
    done = subprocess.run([sys.executable, "-m", "tether", "demo", "async"], env=env,
                          cwd=tmp_path, capture_output=True, text=True, timeout=300)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out
    assert "Traceback" not in out and "FAILED" not in out, out
    assert "offloaded with ctx.cpu_call" in out, out
    assert not (tmp_path / "shell.db").exists()


def test_a_part_whose_child_fails_says_so_and_exits_non_zero(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(run, "CPU_WORKLOAD", ("-m", "tether.bench.workloads", "C", "nosuchdb"))
    monkeypatch.setattr(run.con, "width", 200)
    assert asyncio.run(run.run_demo(["async"])) == 1
    out = capsys.readouterr().out
    assert "FAILED" in out and "exited with status" in out, out
    assert "Traceback" not in out
    assert out.rstrip().endswith("FAILED: async (exit status 1)")

"""The examples that print a table (examples/quickstart.py, examples/langgraph_durable.py)
fit an 80-column terminal: every run's whole thread id and status on its row, no cell cut to
an ellipsis, no line wider than the terminal (issue 30, item 8). Each runs on a fresh database
of its own, whatever TETHER_DB says, and leaves no file behind (README, "LLM calls"); with
--db it runs on the database given."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.mark.parametrize(("name", "runs"), [("quickstart.py", 5), ("langgraph_durable.py", 3)])
def test_the_examples_tables_fit_80_columns(name: str, runs: int, tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TETHER_")}
    here, scratch = tmp_path / "here", tmp_path / "tmp"
    here.mkdir()
    scratch.mkdir()
    # Run as the README says, from a shell that exports a database of its own: the example
    # makes a fresh one in a temporary folder, leaves nothing behind, and never uses that one.
    env.update({"COLUMNS": "80", "TETHER_DB": f"sqlite:///{tmp_path / 'yours.db'}",
                "TMPDIR": str(scratch)})
    proc = subprocess.run([sys.executable, str(EXAMPLES / name)], cwd=here, env=env,
                          capture_output=True, text=True, timeout=180, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["here", "tmp"], (
        list(tmp_path.rglob("*")))
    assert "a fresh SQLite file" in proc.stdout, proc.stdout
    out = proc.stdout
    assert "…" not in out and "..." not in out, out
    assert max(len(line) for line in out.splitlines()) <= 80, out
    rows = [line.split("│")[1:3] for line in out.splitlines() if line.startswith("│ q")]
    assert len(rows) == runs, out
    for i, (thread_id, status) in enumerate(rows):
        assert re.fullmatch(rf"q{i}-[0-9a-f]{{6}}", thread_id.strip()), out  # the whole id
        assert status.strip() == "completed", out


def test_quickstart_runs_on_the_database_given(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TETHER_")}
    env.update({"COLUMNS": "80", "TMPDIR": str(tmp_path)})
    db = f"sqlite:///{tmp_path / 'mine.db'}"
    proc = subprocess.run([sys.executable, str(EXAMPLES / "quickstart.py"), "--db", db],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=180,
                          stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # (rich wraps the long URL wherever the terminal's width falls)
    assert f"started5runson{db};" in "".join(proc.stdout.split()), proc.stdout
    assert (tmp_path / "mine.db").exists()
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith("mine.db")) == []

"""The small examples the README lists (examples/agent_queue.py, saga.py, outbox_tool_call.py)
run as it says, `python examples/NAME.py`: exit 0, no traceback, what each is about shown,
and their temporary database removed, even from a shell that exports a TETHER_DB of its own."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"

SHOWS = {
    "agent_queue.py": [r"agent -> PROCESSING 1 message\(s\) in its inbox",
                       r"agent -> RESPONSE   1 reply committed with step 4",
                       r"answer to 'what is an outbox\?'"],
    "saga.py": [r"run failed: \[exception\] CardDeclined: card declined for 840 EUR",
                r"cancel #2 hotel Barcelona, 2 nights  \(key \w+:2:0:compensate\)\n"
                r"  cancel #1 flight CDG-BCN  \(key \w+:1:0:compensate\)"],
    "outbox_tool_call.py": [r"handler called 2 times with key '\w+:1:0'; invoices sent: 1"],
}


@pytest.mark.parametrize("name", sorted(SHOWS))
def test_the_example_runs_as_the_readme_says(name: str, tmp_path: Path) -> None:
    here, scratch = tmp_path / "here", tmp_path / "tmp"
    here.mkdir()
    scratch.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("TETHER_")}
    env.update({"TMPDIR": str(scratch), "TETHER_DB": f"sqlite:///{tmp_path / 'yours.db'}"})
    proc = subprocess.run([sys.executable, str(EXAMPLES / name)], cwd=here, env=env,
                          capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    for shown in SHOWS[name]:
        assert re.search(shown, proc.stdout), (shown, proc.stdout)
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["here", "tmp"], (
        list(tmp_path.rglob("*")))


def test_the_saga_outbox_table_is_aligned(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TETHER_")}
    env["TMPDIR"] = str(tmp_path)
    proc = subprocess.run([sys.executable, str(EXAMPLES / "saga.py")], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = proc.stdout.split("outbox:\n", 1)[1].splitlines()
    assert len(rows) == 4, proc.stdout
    assert len({row.index(" done ") for row in rows}) == 1, proc.stdout  # one column

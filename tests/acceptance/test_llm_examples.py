"""examples/openai_agent.py and examples/anthropic_agent.py run offline (against FakeLLM) to a
completed run: streamed answer, tool call approved by a person, usage billed once."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.mark.parametrize("name", ["openai_agent.py", "anthropic_agent.py"])
def test_the_llm_examples_run_offline(name: str, tmp_path: Path) -> None:
    env = {**os.environ, "TMPDIR": str(tmp_path)}  # the example's database goes there
    for var in ("OPENAI_API_KEY", "OPENAI_BASE_URL", "ANTHROPIC_API_KEY", "ANTHROPIC_BASE_URL"):
        env.pop(var, None)
    proc = subprocess.run([sys.executable, str(EXAMPLES / name)], env=env, capture_output=True,
                          text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert list(tmp_path.iterdir()) == []  # its temporary database removed
    out = proc.stdout
    assert "Sorry about that. Let me refund it." in out  # the streamed tokens, as they came
    assert "approval asked: {'tool': 'refund', 'args': {'order': 'A-17', 'amount': 25}}" in out
    assert "completed: Done: 25 EUR are refunded for order A-17." in out
    assert "usage: {'input_tokens': " in out

"""The LangGraph example (examples/langgraph_durable.py) as the app of `tether serve` and
`tether worker` subprocesses (`--app langgraph_app:runtime`, tests/apps on PYTHONPATH). The
example's tool logs each call it starts to LANGGRAPH_TOOL_LOG."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))

from langgraph_durable import TOPICS, graph, runtime, support

__all__ = ["TOPICS", "graph", "runtime", "support"]

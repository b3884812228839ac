"""The comparison anchors: LangGraph and DBOS Transact on the shared workloads, each in its
own venv under bench/.anchors/ (see README.md here). `python -m bench.anchors --help`.

This package is also imported inside the anchors' venvs (the harnesses import
bench.anchors.common), so nothing here may import tether or anything outside the standard
library at import time.
"""

from __future__ import annotations

from collections.abc import Callable


def run_anchors(systems: list[str], backends: list[str], workloads: list[str], quick: bool,
                timeout: float | None = None,
                on_row: Callable[[dict[str, object]], None] | None = None
                ) -> list[dict[str, object]]:
    """Run the anchors (installing their venvs first if needed) and return the result rows,
    in the WORKLOADS.md format, with a metric "error" row for a workload that failed or
    timed out. Systems: "langgraph", "dbos"; backends: "sqlite", "postgres"; workloads:
    "W1".."W5" (LangGraph has W1, W2, W5)."""
    from .runner import run_anchors as run

    return run(systems, backends, workloads, quick, timeout, on_row)


__all__ = ["run_anchors"]

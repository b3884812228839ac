"""LangGraph on tether (`pip install "tether[langgraph]"`).

- `TetherSaver`: a LangGraph checkpointer (BaseCheckpointSaver) on tether's database and
  migrations, SQLite or Postgres: `async with TetherSaver.from_conn_string(db_url) as saver`.
- `agent(name, graph)`: a compiled graph as a tether Agent; its super-steps run as the run's
  steps on tether's workers, under leases; `interrupt()` is a tether interrupt.
- `call(fn, ...)` (`call_sync` in a sync node): inside a node of such a graph, a journaled
  call of the step running it.
- `StrictSerializer`: how both read checkpoints back: LangGraph's own types and the classes
  given as `allowed_types=`, nothing else imported (a stored row is not trusted code).
"""

from __future__ import annotations

from ..extras import requires_extra

with requires_extra("langgraph", "tether.langgraph"):
    import langgraph.checkpoint.base  # noqa: F401  (named first in the error when missing)

    from ._calls import call, call_sync
    from ._strict import StrictSerializer
    from .durable import agent
    from .saver import TetherSaver

__all__ = ["StrictSerializer", "TetherSaver", "agent", "call", "call_sync"]

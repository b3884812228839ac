"""LangGraph on tether (`pip install "tether[langgraph]"`).

- `TetherSaver`: a LangGraph checkpointer (BaseCheckpointSaver) on tether's database and
  migrations, SQLite or Postgres: `async with TetherSaver.from_conn_string(db_url) as saver`.
"""

from __future__ import annotations

try:
    import langgraph.checkpoint.base  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise ImportError(
        'tether.langgraph needs LangGraph: pip install "tether[langgraph]"') from exc

from .saver import TetherSaver

__all__ = ["TetherSaver"]

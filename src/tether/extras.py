"""Optional parts of tether and the extra that installs each.

The core install (embedded SQLite, the CLI; from a checkout `pip install .`, or a built wheel)
pulls only what it uses.
A part whose libraries come with an extra imports them through `requires_extra`, so a missing
library is a ConfigError naming the exact `pip install` to run instead of a bare
ModuleNotFoundError from deep inside tether.
"""

from __future__ import annotations

import importlib.metadata
import json
import urllib.parse
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Final

from .errors import ConfigError

# The top-level modules each extra installs; an ImportError for any other module is a bug and
# passes through unchanged.
EXTRAS: Final[dict[str, tuple[str, ...]]] = {
    "postgres": ("psycopg", "psycopg_pool", "psycopg_binary"),
    "server": ("fastapi", "starlette", "uvicorn", "pydantic", "pydantic_core", "jinja2",
               "markupsafe"),
    "langgraph": ("langgraph", "langchain_core", "ormsgpack"),
    "metrics": ("prometheus_client",),
    "otel": ("opentelemetry",),
}


class MissingExtra(ConfigError):
    """A part of tether was used whose optional libraries are not installed."""

    def __init__(self, extra: str, part: str, module: str) -> None:
        self.extra = extra
        self.module = module
        super().__init__(
            f"{part} needs the {extra!r} extra ({module} is not installed): {install_hint(extra)}"
        )


def install_hint(extra: str) -> str:
    """The command that installs `extra`, the way this tether was installed (PEP 610's
    direct_url.json): from a checkout (editable or not), a wheel file, or an index."""
    return f'pip install {_source()}"{_target()}[{extra}]"'


def _origin() -> dict[str, Any]:
    try:
        text = importlib.metadata.distribution("tether").read_text("direct_url.json")
    except importlib.metadata.PackageNotFoundError:
        return {}
    try:
        found = json.loads(text) if text else {}
    except ValueError:
        return {}
    return found if isinstance(found, dict) else {}


def _source() -> str:
    dir_info = _origin().get("dir_info")
    return "-e " if isinstance(dir_info, dict) and dir_info.get("editable") else ""


def _target() -> str:
    url = _origin().get("url")
    if isinstance(url, str) and url.startswith("file://"):
        return urllib.parse.unquote(urllib.parse.urlsplit(url).path)
    return "tether"


@contextmanager
def requires_extra(extra: str, part: str) -> Iterator[None]:
    """Turn the import of a missing library of `extra` inside the block into MissingExtra
    (`part` names what was being used, e.g. "the Postgres store")."""
    modules = EXTRAS[extra]
    try:
        yield
    except ImportError as exc:
        top = (exc.name or "").partition(".")[0]
        if top not in modules:
            raise
        raise MissingExtra(extra, part, top) from exc

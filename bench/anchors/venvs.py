"""The anchors' own virtual environments, under bench/.anchors/<system>/, with pinned versions.

Each anchor is installed apart from tether (its dependencies would otherwise mix with the
project's) with the ordinary `python -m venv` and `pip install`. A venv whose installed
versions already match the pins is left as it is.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent  # bench/
VENVS = ROOT / ".anchors"

# Pinned versions: the latest on PyPI when the anchors were written (2026-11).
PINS: dict[str, dict[str, str]] = {
    "langgraph": {
        "langgraph": "1.2.22",
        "langgraph-checkpoint": "4.3.2",
        "langgraph-checkpoint-sqlite": "3.1.2",
        "langgraph-checkpoint-postgres": "3.2.0",
        "psycopg": "3.3.9",
        "psycopg-binary": "3.3.9",
        "psycopg-pool": "3.3.3",
        "aiosqlite": "0.22.1",
    },
    "dbos": {
        "dbos": "3.4.0",
        "sqlalchemy": "2.1.9",
        "psycopg": "3.3.9",
        "psycopg-binary": "3.3.9",
    },
}
SYSTEMS = tuple(PINS)


def venv_dir(system: str) -> Path:
    return VENVS / system


def venv_python(system: str) -> Path:
    return venv_dir(system) / "bin" / "python"


def requirements(system: str) -> list[str]:
    """pip requirement strings for the system's pins (psycopg-binary as psycopg's extra)."""
    pins = PINS[system]
    reqs = []
    for name, version in pins.items():
        if name == "psycopg-binary":
            continue
        extra = "[binary]" if name == "psycopg" and "psycopg-binary" in pins else ""
        reqs.append(f"{name}{extra}=={version}")
    return reqs


_INSTALLED = (
    "import importlib.metadata as m, json, sys\n"
    "out = {}\n"
    "for name in sys.argv[1:]:\n"
    "    try:\n"
    "        out[name] = m.version(name)\n"
    "    except m.PackageNotFoundError:\n"
    "        out[name] = None\n"
    "print(json.dumps(out))\n"
)


def installed_versions(system: str) -> dict[str, str | None]:
    """The versions of the pinned packages in the system's venv (None: not installed); empty
    if the venv has no working python."""
    python = venv_python(system)
    if not python.exists():
        return {}
    proc = subprocess.run([str(python), "-c", _INSTALLED, *PINS[system]], capture_output=True,
                          text=True, timeout=60, check=False)
    if proc.returncode != 0:
        return {}
    result: dict[str, str | None] = json.loads(proc.stdout)
    return result


def is_current(system: str) -> bool:
    return installed_versions(system) == PINS[system]


def log(msg: str) -> None:
    print(f"[anchors] {msg}", file=sys.stderr, flush=True)


def ensure_venv(system: str) -> Path:
    """Create or update bench/.anchors/<system>/ to the pinned versions; returns its python.
    Skips pip when the venv already has them."""
    if system not in PINS:
        raise ValueError(f"unknown system {system!r}: {', '.join(SYSTEMS)}")
    python = venv_python(system)
    if is_current(system):
        log(f"{system}: venv up to date ({venv_dir(system)})")
        return python
    if not python.exists():
        log(f"{system}: creating venv {venv_dir(system)}")
        VENVS.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, "-m", "venv", str(venv_dir(system))], check=True)
    log(f"{system}: installing {' '.join(requirements(system))}")
    proc = subprocess.run([str(python), "-m", "pip", "install", "-q",
                           "--disable-pip-version-check", *requirements(system)],
                          capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"{system}: pip install failed: {proc.stderr[-1000:]}")
    got = installed_versions(system)
    if got != PINS[system]:
        raise RuntimeError(f"{system}: installed versions {got} differ from the pins {PINS[system]}")
    return python

"""Loopback ports for the servers the tests start (tether serve, a worker's metrics, Prometheus,
PgBouncer, a Postgres pair of their own).

A port from `bind(("127.0.0.1", 0))` comes from the kernel's ephemeral range, the same range
every outgoing connection takes its local port from: between the probe closing it and the
server binding it, a connection to Postgres (by any process on the machine) could take it, and
the server fails with "Address already in use" (seen in CI under pytest-xdist). So the ports
handed out here lie below the ephemeral range, where no outgoing connection goes; each xdist
worker has a slice of its own; a port is handed out at most once a process, and only if it can
be bound now.
"""

from __future__ import annotations

import os
import random
import socket
from pathlib import Path

BASE = 20000  # below the usual ephemeral range (32768-60999) and above the common services'
_given: set[int] = set()


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def _slice() -> range:
    """This process's ports: its xdist worker's share of [BASE, the ephemeral range's start)."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1") or 1)
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    index = int(worker[2:]) if worker[2:].isdigit() else 0
    width = (_ephemeral_low() - BASE) // max(workers, 1)
    start = BASE + index * width
    return range(start, start + width)


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port() -> int:
    """A loopback port no one listens on, outside the ephemeral range (see the module's doc)."""
    ports = _slice()
    if len(ports) >= 100:
        for _ in range(200):
            port = random.choice(ports)
            if port not in _given and _bindable(port):
                _given.add(port)
                return port
    # An unusual port range (or a crowded slice): the kernel's choice, as before.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])

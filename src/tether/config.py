"""Settings, from arguments or TETHER_* environment variables."""

from __future__ import annotations

import os
from dataclasses import dataclass

from .errors import ConfigError

DEFAULT_DB = "sqlite:///tether.db"


@dataclass(frozen=True, slots=True)
class Settings:
    db: str = DEFAULT_DB
    lease_ttl: float = 30.0
    poll_interval: float = 0.25
    snapshot_every: int = 100
    concurrency: int = 100
    shutdown_grace: float = 10.0
    cpu_workers: int = 0
    """Processes of the worker's pool for ctx.cpu_call; 0: one per CPU."""

    def __post_init__(self) -> None:
        if self.lease_ttl <= 0:
            raise ConfigError(f"lease_ttl must be > 0 seconds, got {self.lease_ttl}")
        if self.poll_interval <= 0:
            raise ConfigError(f"poll_interval must be > 0 seconds, got {self.poll_interval}")
        if self.snapshot_every < 1:
            raise ConfigError(f"snapshot_every must be >= 1, got {self.snapshot_every}")
        if self.concurrency < 1:
            raise ConfigError(f"concurrency must be >= 1, got {self.concurrency}")
        if self.cpu_workers < 0:
            raise ConfigError(f"cpu_workers must be >= 0 (0: one per CPU), got {self.cpu_workers}")

    @classmethod
    def from_env(cls, prefix: str = "TETHER_", **overrides: object) -> Settings:
        """Settings from `TETHER_DB`, `TETHER_LEASE_TTL`, ...; explicit overrides win
        (None means "not given")."""
        values: dict[str, object] = {}
        for name, typ in (("db", str), ("lease_ttl", float), ("poll_interval", float),
                          ("snapshot_every", int), ("concurrency", int),
                          ("shutdown_grace", float), ("cpu_workers", int)):
            raw = os.environ.get(prefix + name.upper())
            if raw is not None and raw != "":
                try:
                    values[name] = typ(raw)
                except ValueError:
                    raise ConfigError(
                        f"{prefix}{name.upper()}={raw!r} is not a valid {typ.__name__}"
                    ) from None
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)  # type: ignore[arg-type]


def default_db() -> str:
    return os.environ.get("TETHER_DB") or DEFAULT_DB


def redact(url: str) -> str:
    """The URL with its password (in the userinfo or a `password=` parameter) masked."""
    from urllib.parse import urlsplit

    try:
        parts = urlsplit(url)
    except ValueError:
        return "<malformed URL>"
    userinfo, at, hostinfo = parts.netloc.rpartition("@")
    netloc = f"{userinfo.split(':', 1)[0]}:***@{hostinfo}" if at and ":" in userinfo else parts.netloc
    query = "&".join(
        "password=***" if item.split("=", 1)[0].lower() == "password" else item
        for item in parts.query.split("&")
    ) if parts.query else ""
    if netloc == parts.netloc and query == parts.query:
        return url
    return parts._replace(netloc=netloc, query=query).geturl()

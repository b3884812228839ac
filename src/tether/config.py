"""Settings, and the one precedence every setting is found by.

For each setting, the first of these that gives it wins, for `Runtime(...)` and every `tether`
command alike:

1. a flag of the command (`--db`, `--lease-ttl`, `--concurrency`, ...; for a worker in your
   own process, `runtime.work(concurrency=)`),
2. the environment: `TETHER_APP`, `TETHER_DB`, `TETHER_LEASE_TTL`, ... (`TETHER_` + the name),
3. `[tool.tether]` in the nearest pyproject.toml (the working directory, then its parents):
   `app = "module:attr"`, `db = "sqlite:///app.db"`, `lease_ttl = 5`, ...,
4. the code: the arguments given to `Runtime(...)`,
5. the default.

`resolve` returns the settings with where each came from (`Settings.sources`), which
`tether worker` prints at start and errors name ("the database ... came from TETHER_DB").
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote, unquote_plus, urlsplit

from .errors import ConfigError

DEFAULT_DB = "sqlite:///tether.db"
ENV_PREFIX = "TETHER_"


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
    sources: Mapping[str, str] = field(default_factory=dict, compare=False, repr=False)
    """Where each setting came from: "--db", "TETHER_DB", "pyproject.toml [tool.tether]
    (PATH)", "Runtime(...)" or "default"."""

    def __post_init__(self) -> None:
        if not isinstance(self.db, str) or not self.db:
            raise ConfigError(f"db must be a database URL, got {self.db!r}")
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
        if self.shutdown_grace < 0:
            raise ConfigError(f"shutdown_grace must be >= 0 seconds, got {self.shutdown_grace}")

    def source(self, name: str) -> str:
        return self.sources.get(name, "default")

    @classmethod
    def from_env(cls, prefix: str = ENV_PREFIX, **overrides: object) -> Settings:
        """Settings by the precedence above with `overrides` as flags (None: not given)."""
        return resolve(flags=overrides, prefix=prefix)


# name -> type, for every setting of Settings (sources aside).
TYPES: dict[str, type] = {"db": str, "lease_ttl": float, "poll_interval": float,
                          "snapshot_every": int, "concurrency": int, "shutdown_grace": float,
                          "cpu_workers": int}
assert set(TYPES) == {f.name for f in fields(Settings)} - {"sources"}


def resolve(*, flags: Mapping[str, object] | None = None, code: Mapping[str, object] | None = None,
            flag_names: Mapping[str, str] | None = None, prefix: str = ENV_PREFIX,
            environ: Mapping[str, str] | None = None, cwd: str | Path | None = None) -> Settings:
    """Settings from flags, then the environment, then [tool.tether], then `code`, then the
    defaults (a None value means "not given"). `flag_names` names each flag for `sources`."""
    env = os.environ if environ is None else environ
    config, config_path = project_config(cwd)
    values: dict[str, object] = {}
    sources: dict[str, str] = {}
    for name, typ in TYPES.items():
        flag = (flags or {}).get(name)
        raw = env.get(prefix + name.upper())
        if flag is not None:
            values[name], sources[name] = flag, (flag_names or {}).get(name, f"--{name.replace('_', '-')}")
        elif raw is not None and raw != "":
            values[name], sources[name] = _parse(raw, typ, f"{prefix}{name.upper()}"), prefix + name.upper()
        elif name in config and config_path is not None:
            where = f"[tool.tether] in {config_path}"
            value = _parse(config[name], typ, f"{name} {where}")
            if name == "db":
                value = _beside(str(value), config_path.parent)
            values[name], sources[name] = value, where
        elif (code or {}).get(name) is not None:
            values[name], sources[name] = (code or {})[name], "Runtime(...)"
    return Settings(**values, sources=sources)  # type: ignore[arg-type]


def resolve_app(flag: str | None, *, prefix: str = ENV_PREFIX,
                environ: Mapping[str, str] | None = None,
                cwd: str | Path | None = None) -> tuple[str | None, str]:
    """The `module:attr` of the user's Runtime (--app, then TETHER_APP, then `app` in
    [tool.tether]) and where it came from; (None, "") when none names it."""
    if flag:
        return flag, "--app"
    raw = (os.environ if environ is None else environ).get(prefix + "APP")
    if raw:
        return raw, prefix + "APP"
    config, path = project_config(cwd)
    app = config.get("app")
    if app is not None:
        if not isinstance(app, str) or not app:
            raise ConfigError(f"app in [tool.tether] of {path} must be a string module:attr")
        return app, f"[tool.tether] in {path}"
    return None, ""


def project_config(cwd: str | Path | None = None) -> tuple[dict[str, Any], Path | None]:
    """[tool.tether] of the nearest pyproject.toml (`cwd`, then its parents) and its path;
    ({}, None) without one. Unknown keys are an error (a typo must not be ignored)."""
    here = Path(cwd if cwd is not None else os.getcwd()).resolve()
    for folder in (here, *here.parents):
        path = folder / "pyproject.toml"
        if path.is_file():
            try:
                with path.open("rb") as f:
                    data = tomllib.load(f)
            except (OSError, tomllib.TOMLDecodeError) as exc:
                raise ConfigError(f"cannot read {path}: {exc}") from None
            section = data.get("tool", {}).get("tether", {})
            if not isinstance(section, dict):
                raise ConfigError(f"[tool.tether] in {path} must be a table")
            unknown = sorted(set(section) - {"app", *TYPES})
            if unknown:
                raise ConfigError(f"unknown key {unknown[0]!r} in [tool.tether] of {path}; "
                                  f"known: app, {', '.join(TYPES)}")
            return section, path
    return {}, None


def _beside(url: str, folder: Path) -> str:
    """A relative SQLite path in a pyproject.toml names a file beside it, wherever the command
    runs from."""
    prefix = "sqlite:///"
    path = url[len(prefix):]
    if not url.startswith(prefix) or path.startswith(("/", ":memory:")):
        return url
    return prefix + str(folder / path)


def _parse(raw: object, typ: type, where: str) -> object:
    if isinstance(raw, typ) and not isinstance(raw, bool):
        return raw
    if typ is float and isinstance(raw, int) and not isinstance(raw, bool):
        return float(raw)
    if isinstance(raw, str):
        try:
            return typ(raw)
        except ValueError:
            pass
    raise ConfigError(f"{where}={raw!r} is not a valid {typ.__name__}")


def default_db() -> str:
    """The database URL when nothing else names one: TETHER_DB, [tool.tether] db, default."""
    return resolve().db


SECRET_WORDS = ("pass", "pwd", "secret", "token", "key", "credential")
"""A URL query parameter whose name holds one of these (libpq's password, sslpassword,
passfile, sslkey; a pooler's or proxy's token, api_key, client_secret ...) is masked."""


def redact(url: str) -> str:
    """The URL with every secret in it masked: the userinfo's password and the value of every
    query parameter whose name is secret-like (SECRET_WORDS). Every URL tether shows (CLI
    output and errors, logs, pages, audit details) goes through this."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<malformed URL>"
    userinfo, at, hostinfo = parts.netloc.rpartition("@")
    netloc = f"{userinfo.split(':', 1)[0]}:***@{hostinfo}" if at and ":" in userinfo else parts.netloc
    query = "&".join(_masked(item) for item in parts.query.split("&")
                     ) if parts.query else ""
    if netloc == parts.netloc and query == parts.query:
        return url
    return parts._replace(netloc=netloc, query=query).geturl()


def _masked(item: str) -> str:
    name = item.split("=", 1)[0]
    # Unquoted: "pass%77ord" is what libpq reads as password.
    lowered = unquote_plus(name).lower()
    if any(word in lowered for word in SECRET_WORDS):
        return f"{name}=***"
    value = unquote(item.partition("=")[2])
    if "://" in value:  # a URL in the query (listen_url=...): its own secrets masked
        masked = redact(value)
        return item if masked == value else f"{name}={quote(masked, safe='')}"
    return item

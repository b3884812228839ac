"""Settings, and where each one is found.

In a program, `Runtime(...)` takes each setting from the first of these that gives it:

1. the code: an argument given to `Runtime(...)` (or `with_db(...)`) wins,
2. the environment: `TETHER_DB`, `TETHER_LEASE_TTL`, ... (`TETHER_` + the name),
3. `[tool.tether]` in the nearest pyproject.toml (the working directory, then its parents):
   `db = "sqlite:///app.db"`, `lease_ttl = 5`, ...,
4. the default.

A `tether` command acts for the operator: it loads the app (its Runtime, settled as above) and
applies its flags (`--db`, `--lease-ttl`, `--concurrency`, ...), then the environment, over it
(`operator=True`): flag, `TETHER_*`, the code, `[tool.tether]`, the default. The app itself is
found by --app, then `TETHER_APP`, then `app` in [tool.tether].

An environment value a program's code overrides is logged once as a warning, and so is a
`TETHER_*` variable tether does not know (a typo such as TETHER_CONCURENCY must not be
silently ignored). `resolve` returns the settings with where each came from
(`Settings.sources`), which `tether worker` prints at start and errors name ("the database ...
came from TETHER_DB").
"""

from __future__ import annotations

import contextlib
import contextvars
import difflib
import logging
import os
import tomllib
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote, unquote_plus, urlsplit

from .errors import ConfigError

DEFAULT_DB = "sqlite:///tether.db"
ENV_PREFIX = "TETHER_"
log = logging.getLogger("tether.config")


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
VALID: dict[str, tuple[Callable[[Any], bool], str, str]] = {
    "db": (bool, "a database URL (sqlite:///path.db, sqlite:///:memory: or "
           "postgresql://user@host:port/db)", '"sqlite:///app.db"'),
    "lease_ttl": (lambda v: v > 0, "a number of seconds > 0", "5"),
    "poll_interval": (lambda v: v > 0, "a number of seconds > 0", "0.25"),
    "snapshot_every": (lambda v: v >= 1, "a whole number >= 1", "100"),
    "concurrency": (lambda v: v >= 1, "a whole number >= 1", "100"),
    "shutdown_grace": (lambda v: v >= 0, "a number of seconds >= 0", "10"),
    "cpu_workers": (lambda v: v >= 0, "a whole number >= 0 (0: one per CPU)", "4"),
}
"""Per setting: whether a value of its type is valid, what is valid, and an example."""


OTHER_ENV = frozenset({
    "APP", "LOOP", "TOKEN", "TOKEN_NAME", "ALLOWED_HOSTS", "TRACE_DETAIL", "LISTEN_URL",
    "MAX_STREAMS", "MAX_STREAMS_PER_CLIENT", "CHROMIUM", "TEST_PG", "TEST_EXAMPLES",
    "TEST_GENAI_URL", "TEST_PGBOUNCER", "BIN", "URL", "FSYNC_DELAY_MS"})
"""The TETHER_* variables besides the settings' (read by the CLI, the server, the event loop,
tracing, the test suite, the TypeScript client's tests and example (BIN, URL) and the slow-disk shim)."""
OTHER_ENV_FAMILIES = ("BENCH_", "LGS_")
"""Prefixes (after TETHER_) of variable families: the benchmarks' knobs."""
_warned: set[str] = set()
_loading_app: contextvars.ContextVar[bool] = contextvars.ContextVar("_loading_app", default=False)


def known_env(prefix: str = ENV_PREFIX) -> frozenset[str]:
    """Every TETHER_* variable tether reads (families aside: OTHER_ENV_FAMILIES)."""
    return frozenset(prefix + n for n in (*(t.upper() for t in TYPES), *OTHER_ENV))


@contextlib.contextmanager
def loading_app() -> Iterator[None]:
    """While a command imports the app: its Runtime(...) does not warn that the environment is
    overridden by the code (the command applies the environment over the app next)."""
    token = _loading_app.set(True)
    try:
        yield
    finally:
        _loading_app.reset(token)


def _warn_once(key: str, message: str) -> None:
    if key not in _warned:
        _warned.add(key)
        log.warning(message)


def did_you_mean(name: str, known: Iterable[str]) -> str:
    """' (did you mean X?)' for the nearest known name, else ''."""
    near = difflib.get_close_matches(name, list(known), n=1, cutoff=0.75)
    return f" (did you mean {near[0]}?)" if near else ""


def check_environment(env: Mapping[str, str], prefix: str = ENV_PREFIX) -> list[str]:
    """The TETHER_* variables of `env` tether does not know, each warned about once."""
    known = known_env(prefix)
    unknown = sorted(k for k in env if k.startswith(prefix) and k not in known
                     and not k[len(prefix):].startswith(OTHER_ENV_FAMILIES))
    for name in unknown:  # the names compared without the prefix they all share
        near = did_you_mean(name[len(prefix):], [k[len(prefix):] for k in known])
        _warn_once(f"unknown {name}", f"{name} is not a tether setting and is ignored"
                   f"{near.replace('mean ', 'mean ' + prefix)}; settings: "
                   f"{', '.join(prefix + t.upper() for t in TYPES)}")
    return unknown


def _shown(name: str, value: object) -> str:
    return redact(str(value)) if name == "db" else repr(value)


def resolve(*, flags: Mapping[str, object] | None = None, code: Mapping[str, object] | None = None,
            flag_names: Mapping[str, str] | None = None, prefix: str = ENV_PREFIX,
            environ: Mapping[str, str] | None = None, cwd: str | Path | None = None,
            operator: bool = False) -> Settings:
    """Settings from flags (a None value means "not given"), then the code, then the
    environment, then [tool.tether], then the defaults; `operator` (a command over the app it
    loads): flags, then the environment, then the code. `flag_names` names each flag for
    `sources`."""
    env = os.environ if environ is None else environ
    check_environment(env, prefix)
    config, config_path = project_config(cwd)
    values: dict[str, object] = {}
    sources: dict[str, str] = {}
    for name, typ in TYPES.items():
        flag = (flags or {}).get(name)
        var = prefix + name.upper()
        raw = env.get(var) or None
        given = (code or {}).get(name)
        if flag is not None:
            values[name], sources[name] = flag, (flag_names or {}).get(name, f"--{name.replace('_', '-')}")
        elif raw is not None and (operator or given is None):
            values[name], sources[name] = _value(name, raw, var, f"{var}={raw}"), var
        elif given is not None:
            values[name], sources[name] = given, "Runtime(...)"
            if raw is not None and not _loading_app.get() and _differs(raw, typ, given):
                _warn_once(f"ignored {var}", (
                    f"{var}={_shown(name, raw)} is ignored: the code gives {name} "
                    f"(Runtime(...): {_shown(name, given)}), and an argument given in code wins "
                    f"in a program (a tether command applies {var} over the app it loads)"))
        elif name in config and config_path is not None:
            where = f"[tool.tether] in {config_path}"
            value = _value(name, config[name], where, f"{name} = {config[name]!r}")
            if name == "db":
                value = _beside(str(value), config_path.parent)
            values[name], sources[name] = value, where
    return Settings(**values, sources=sources)  # type: ignore[arg-type]


def _differs(raw: str, typ: type, given: object) -> bool:
    try:
        return bool(_parse(raw, typ) != given)
    except ValueError:
        return True


def _value(name: str, raw: object, where: str, shown: str) -> object:
    """`raw` as setting `name`'s type, or a ConfigError naming the setting, where it came
    from and what is valid."""
    ok, valid, example = VALID[name]
    try:
        value = _parse(raw, TYPES[name])
        if ok(value):
            return value
    except ValueError:
        pass
    if name == "db":
        shown = redact(shown)
    in_file = where.startswith("[tool.tether]")
    hint = (f"e.g. {name} = {example}" if in_file
            else f"e.g. {ENV_PREFIX}{name.upper()}={example.strip(chr(34))}")
    raise ConfigError(f"{shown} (from {where if in_file else 'the environment'}) is not a valid "
                      f"setting: {name} is {valid}, {hint}")


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
                raise ConfigError(f"unknown key {unknown[0]!r} in [tool.tether] of {path}"
                                  f"{did_you_mean(unknown[0], ['app', *TYPES])}; "
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


def _parse(raw: object, typ: type) -> Any:
    """`raw` as `typ` (a str is converted), or ValueError."""
    if isinstance(raw, typ) and not isinstance(raw, bool):
        return raw
    if typ is float and isinstance(raw, int) and not isinstance(raw, bool):
        return float(raw)
    if isinstance(raw, str):
        return typ(raw.strip())
    raise ValueError(f"not a {typ.__name__}")


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

"""tether.config: one precedence for every setting (flag, environment, [tool.tether] in the
nearest pyproject.toml, the code, the default), with where each value came from; the same for
Runtime(...) and the CLI's runtime_for."""

from __future__ import annotations

from pathlib import Path

import pytest

from tether import ConfigError, Runtime
from tether.cli._common import runtime_for
from tether.config import project_config, resolve, resolve_app


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A project folder with a pyproject.toml, the working directory, no TETHER_* set."""
    for var in ("APP", "DB", "LEASE_TTL", "POLL_INTERVAL", "SNAPSHOT_EVERY", "CONCURRENCY",
                "SHUTDOWN_GRACE"):
        monkeypatch.delenv(f"TETHER_{var}", raising=False)
    (tmp_path / "pyproject.toml").write_text(
        '[project]\nname = "x"\n\n[tool.tether]\napp = "myapp:runtime"\ndb = "sqlite:///app.db"\n'
        "lease_ttl = 5\nconcurrency = 7\n")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_each_source_in_order(project: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    where = f"[tool.tether] in {project / 'pyproject.toml'}"
    code = {"db": "sqlite:///code.db", "lease_ttl": 2.0, "poll_interval": 0.5}
    s = resolve(code=code)
    # [tool.tether] over the code; a relative SQLite path is beside the pyproject.toml.
    assert (s.db, s.source("db")) == (f"sqlite:///{project / 'app.db'}", where)
    assert (s.lease_ttl, s.source("lease_ttl")) == (5.0, where)
    assert (s.concurrency, s.source("concurrency")) == (7, where)
    assert (s.poll_interval, s.source("poll_interval")) == (0.5, "Runtime(...)")
    assert (s.snapshot_every, s.source("snapshot_every")) == (100, "default")
    # The environment over [tool.tether]; a flag over everything.
    monkeypatch.setenv("TETHER_DB", "sqlite:///env.db")
    monkeypatch.setenv("TETHER_CONCURRENCY", "9")
    s = resolve(code=code, flags={"concurrency": 11, "db": None})
    assert (s.db, s.source("db")) == ("sqlite:///env.db", "TETHER_DB")
    assert (s.concurrency, s.source("concurrency")) == (11, "--concurrency")


def test_found_from_a_subfolder_and_absent_elsewhere(project: Path, tmp_path_factory: pytest.TempPathFactory,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    sub = project / "a" / "b"
    sub.mkdir(parents=True)
    monkeypatch.chdir(sub)
    assert resolve().db == f"sqlite:///{project / 'app.db'}"
    assert resolve_app(None) == ("myapp:runtime", f"[tool.tether] in {project / 'pyproject.toml'}")
    elsewhere = tmp_path_factory.mktemp("elsewhere")
    assert not any((p / "pyproject.toml").exists() for p in (elsewhere, *elsewhere.parents))
    monkeypatch.chdir(elsewhere)
    assert project_config() == ({}, None)
    assert resolve_app(None) == (None, "")
    assert (resolve().db, resolve().source("db")) == ("sqlite:///tether.db", "default")


def test_app_precedence(project: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert resolve_app("other:rt") == ("other:rt", "--app")
    monkeypatch.setenv("TETHER_APP", "env:rt")
    assert resolve_app(None) == ("env:rt", "TETHER_APP")


def test_runtime_and_cli_resolve_alike(project: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (project / "myapp.py").write_text(
        "import tether\nruntime = tether.Runtime('sqlite:///code.db', lease_ttl=2)\n")
    monkeypatch.syspath_prepend(str(project))
    monkeypatch.setenv("TETHER_LEASE_TTL", "3")
    rt = Runtime("sqlite:///code.db", lease_ttl=2)
    cli_rt = runtime_for(None, None)  # the app from [tool.tether]
    for r in (rt, cli_rt):
        assert r.settings.lease_ttl == 3.0 and r.settings.source("lease_ttl") == "TETHER_LEASE_TTL"
        assert r.db_url == f"sqlite:///{project / 'app.db'}"
    flagged = runtime_for("sqlite:///flag.db", None, concurrency=4)
    assert (flagged.db_url, flagged.settings.source("db")) == ("sqlite:///flag.db", "--db")
    assert flagged.settings.concurrency == 4
    # A flag given through with_db keeps the agents and the code's settings underneath.
    assert rt.with_db("sqlite:///w.db").settings.source("db") == "--db"


@pytest.mark.parametrize(("body", "match"), [
    ("[tool.tether]\nlease_tll = 5\n", "unknown key 'lease_tll'"),
    ("[tool.tether]\nlease_ttl = 'soon'\n", "lease_ttl \\[tool.tether\\]"),
    ("[tool.tether]\napp = 3\n", "must be a string"),
    ("[tool.tether\n", "cannot read"),
])
def test_bad_config_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, body: str,
                                     match: str) -> None:
    monkeypatch.delenv("TETHER_APP", raising=False)
    monkeypatch.delenv("TETHER_LEASE_TTL", raising=False)
    (tmp_path / "pyproject.toml").write_text(body)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match=match):
        resolve_app(None)
        resolve()

"""tether.config: in a program the code's Runtime(...) arguments win, TETHER_* and then
[tool.tether] (the nearest pyproject.toml) fill what the code leaves out; a command's flags,
then TETHER_*, apply over the app it loads (runtime_for); with where each value came from, a
warning when the environment is overridden by code, and one for an unknown TETHER_* name."""

from __future__ import annotations

import logging
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tether import ConfigError, Runtime, config
from tether.cli._common import json_value, runtime_for
from tether.config import known_env, project_config, resolve, resolve_app

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def fresh_warnings() -> Iterator[None]:
    """Each test sees the once-per-process warnings anew."""
    saved = set(config._warned)
    config._warned.clear()
    yield
    config._warned.clear()
    config._warned.update(saved)


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
    # The code over [tool.tether], which fills the rest (a relative SQLite path is beside the
    # pyproject.toml).
    assert (s.db, s.source("db")) == ("sqlite:///code.db", "Runtime(...)")
    assert (s.lease_ttl, s.source("lease_ttl")) == (2.0, "Runtime(...)")
    assert (s.concurrency, s.source("concurrency")) == (7, where)
    assert resolve().db == f"sqlite:///{project / 'app.db'}"
    assert (s.snapshot_every, s.source("snapshot_every")) == (100, "default")
    # The environment over [tool.tether] but under the code; a flag over everything.
    monkeypatch.setenv("TETHER_DB", "sqlite:///env.db")
    monkeypatch.setenv("TETHER_CONCURRENCY", "9")
    s = resolve(code=code, flags={"concurrency": 11, "db": None})
    assert (s.db, s.source("db")) == ("sqlite:///code.db", "Runtime(...)")
    assert (s.concurrency, s.source("concurrency")) == (11, "--concurrency")
    assert resolve(code={"db": None}).source("db") == "TETHER_DB"
    # A command over the app it loads: flags, then the environment, then the code.
    s = resolve(code=code, flags={"lease_ttl": 4.0}, operator=True)
    assert (s.db, s.source("db")) == ("sqlite:///env.db", "TETHER_DB")
    assert (s.lease_ttl, s.source("lease_ttl")) == (4.0, "--lease-ttl")
    assert (s.poll_interval, s.concurrency) == (0.5, 9)


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
    # In a program the code wins over the environment and [tool.tether].
    rt = Runtime("sqlite:///code.db", lease_ttl=2)
    assert (rt.settings.lease_ttl, rt.settings.source("lease_ttl")) == (2.0, "Runtime(...)")
    assert rt.db_url == "sqlite:///code.db"
    # A command applies the environment over the app it loads ([tool.tether]'s app here),
    # whose code still wins over [tool.tether].
    cli_rt = runtime_for(None, None)
    assert cli_rt.settings.lease_ttl == 3.0
    assert cli_rt.settings.source("lease_ttl") == "TETHER_LEASE_TTL"
    assert cli_rt.db_url == "sqlite:///code.db"
    flagged = runtime_for("sqlite:///flag.db", None, concurrency=4)
    assert (flagged.db_url, flagged.settings.source("db")) == ("sqlite:///flag.db", "--db")
    assert flagged.settings.concurrency == 4
    # A flag given through with_db keeps the agents and the code's settings underneath.
    assert rt.with_db("sqlite:///w.db").settings.source("db") == "--db"


@pytest.mark.parametrize(("body", "match"), [
    ("[tool.tether]\nlease_tll = 5\n", "unknown key 'lease_tll'.*did you mean lease_ttl"),
    ("[tool.tether]\nlease_ttl = 'soon'\n", "lease_ttl = 'soon' \\(from \\[tool.tether\\] in .*"
     "is not a valid setting: lease_ttl is a number of seconds > 0"),
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


def test_the_environment_a_program_overrides_is_warned_once(
        project: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setenv("TETHER_DB", "postgresql://u:secret@prod/db")
    with caplog.at_level(logging.WARNING, logger="tether.config"):
        for _ in range(3):
            rt = Runtime("sqlite:///test.db")
            assert (rt.db_url, rt.settings.source("db")) == ("sqlite:///test.db", "Runtime(...)")
        assert Runtime().db_url == "postgresql://u:secret@prod/db"  # the code left it out
    ignored = [r.getMessage() for r in caplog.records if "is ignored" in r.getMessage()]
    assert len(ignored) == 1, ignored
    assert "TETHER_DB=postgresql://u:***@prod/db is ignored" in ignored[0]
    assert "secret" not in ignored[0]
    # The same value in both: nothing is ignored, nothing said.
    caplog.clear()
    monkeypatch.setenv("TETHER_LEASE_TTL", "2")
    Runtime("sqlite:///test.db", lease_ttl=2)
    assert not [r for r in caplog.records if "TETHER_LEASE_TTL" in r.getMessage()]


def test_a_command_loading_the_app_does_not_warn_it_applies_the_environment(
        project: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    (project / "myapp.py").write_text(
        "import tether\nruntime = tether.Runtime('sqlite:///code.db', lease_ttl=2)\n")
    monkeypatch.syspath_prepend(str(project))
    monkeypatch.setenv("TETHER_LEASE_TTL", "3")
    with caplog.at_level(logging.WARNING, logger="tether.config"):
        rt = runtime_for(None, None)
    assert rt.settings.lease_ttl == 3.0
    assert not [r for r in caplog.records if "is ignored" in r.getMessage()]


def test_an_unknown_tether_variable_is_warned_with_the_nearest_name(
        project: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setenv("TETHER_CONCURENCY", "5")
    monkeypatch.setenv("TETHER_BENCH_ANYTHING", "1")
    monkeypatch.setenv("TETHER_FOO", "1")  # near no name: no guess
    monkeypatch.setenv("TETHER_TOKEN", "x" * 32)
    with caplog.at_level(logging.WARNING, logger="tether.config"):
        resolve()
        Runtime("sqlite:///:memory:")
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 2, said
    assert said[0].startswith("TETHER_CONCURENCY is not a tether setting and is ignored "
                              "(did you mean TETHER_CONCURRENCY?); settings: TETHER_DB, ")
    assert said[1].startswith("TETHER_FOO is not a tether setting and is ignored; settings: ")


def test_every_tether_variable_the_project_reads_is_known() -> None:
    files = subprocess.run(["git", "ls-files", "src", "tests", "bench", "examples", "docs",
                            "scripts", "README.md"], cwd=ROOT, capture_output=True, text=True,
                           check=True).stdout.split()
    names = set()
    for f in files:
        path = ROOT / f
        if path.suffix in (".py", ".md", ".sh", ".toml", ".yml", "") and path.is_file():
            names |= set(re.findall(r"(?<![A-Z_])TETHER_[A-Z][A-Z0-9_]*[A-Z0-9]",
                                    path.read_text(errors="replace")))
    names -= {"TETHER_CONCURENCY", "TETHER_FOO"}  # this file's unknown names, on purpose
    assert names, "no TETHER_* names found"
    unknown = config.check_environment(dict.fromkeys(names, "1"))
    assert not unknown, f"read by the project but warned as unknown: {unknown}"
    assert {"TETHER_DB", "TETHER_TOKEN", "TETHER_ALLOWED_HOSTS", "TETHER_TRACE_DETAIL",
            "TETHER_LISTEN_URL", "TETHER_MAX_STREAMS", "TETHER_MAX_STREAMS_PER_CLIENT",
            "TETHER_CHROMIUM", "TETHER_TEST_PG", "TETHER_LOOP"} <= known_env()


def test_a_bad_setting_in_the_apps_project_is_named_as_a_setting(
        project: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The app's Runtime(...) reads [tool.tether] while the command imports it: the error is
    # the setting's, not "cannot import module 'badsetting'".
    path = project / "pyproject.toml"
    path.write_text('[tool.tether]\napp = "badsetting:runtime"\nlease_ttl = "five"\n')
    (project / "badsetting.py").write_text("import tether\nruntime = tether.Runtime('sqlite:///x.db')\n")
    monkeypatch.syspath_prepend(str(project))
    with pytest.raises(ConfigError) as info:
        runtime_for(None, None)
    assert str(info.value) == (
        f"lease_ttl = 'five' (from [tool.tether] in {path}) is not a valid setting: lease_ttl "
        "is a number of seconds > 0, e.g. lease_ttl = 5")
    assert not (project / "x.db").exists()


@pytest.mark.parametrize(("var", "raw", "valid"), [
    ("CONCURRENCY", "-3", "concurrency is a whole number >= 1, e.g. TETHER_CONCURRENCY=100"),
    ("LEASE_TTL", "0", "lease_ttl is a number of seconds > 0, e.g. TETHER_LEASE_TTL=5"),
    ("CPU_WORKERS", "two", "cpu_workers is a whole number >= 0 (0: one per CPU)"),
])
def test_a_bad_environment_value_names_the_variable_and_what_is_valid(
        project: Path, monkeypatch: pytest.MonkeyPatch, var: str, raw: str, valid: str) -> None:
    monkeypatch.setenv(f"TETHER_{var}", raw)
    with pytest.raises(ConfigError) as info:
        resolve()
    assert str(info.value).startswith(
        f"TETHER_{var}={raw} (from the environment) is not a valid setting: {valid}")


def test_a_bare_word_as_json_value_hints_at_quoting() -> None:
    with pytest.raises(ConfigError) as info:
        json_value("yes", "--value")
    assert str(info.value).endswith(
        "a string is quoted JSON: --value '\"yes\"' (true, false, null and numbers are bare)")
    with pytest.raises(ConfigError) as info:
        json_value('{"a": yes}', "--value")
    assert "quoted JSON" not in str(info.value)
    assert json_value('"yes"', "--value") == "yes"

"""A part of tether whose extra is not installed says which `pip install` to run. Each case
runs in a fresh interpreter where the extra's libraries cannot be imported
(`sys.modules[name] = None` makes `import name` raise ModuleNotFoundError)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tether import extras
from tether.errors import ConfigError
from tether.extras import EXTRAS, MissingExtra, install_hint, requires_extra


def without(modules: tuple[str, ...], code: str) -> subprocess.CompletedProcess[str]:
    """Run `code` in a new interpreter in which none of `modules` can be imported."""
    block = "".join(f"sys.modules[{m!r}] = None\n" for m in modules)
    script = "import sys\n" + block + textwrap.dedent(code)
    return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=60)


def test_the_postgres_store_names_its_extra() -> None:
    proc = without(EXTRAS["postgres"], """
        from tether.errors import ConfigError
        from tether.store import make_store
        try:
            make_store("postgresql://postgres@127.0.0.1:5432/postgres")
        except ConfigError as exc:
            print(type(exc).__name__, exc)
        """)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == (
        "MissingExtra the Postgres store needs the 'postgres' extra (psycopg is not installed): "
        + install_hint("postgres"))


def test_sqlite_needs_no_extra() -> None:
    proc = without(EXTRAS["postgres"] + EXTRAS["server"], """
        import tether
        from tether.store import make_store
        print(type(make_store("sqlite:///:memory:")).__name__)
        """)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "SQLiteStore"


def test_tether_serve_names_its_extra() -> None:
    proc = without(EXTRAS["server"], """
        from tether.cli import main
        sys.exit(main(["serve", "--db", "sqlite:///:memory:"]))
        """)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == (
        "tether: error: tether serve needs the 'server' extra (uvicorn is not installed): "
        + install_hint("server"))
    assert "Traceback" not in proc.stderr


def test_requires_extra_passes_other_import_errors_through() -> None:
    with pytest.raises(ModuleNotFoundError, match="no_such_module"), \
            requires_extra("postgres", "the Postgres store"):
        import no_such_module  # type: ignore[import-not-found]  # noqa: F401
    with pytest.raises(ImportError, match="cannot import name"), \
            requires_extra("server", "tether serve"):
        from tether import no_such_name  # type: ignore[attr-defined]  # noqa: F401


def test_missing_extra_is_a_config_error() -> None:
    exc = MissingExtra("server", "tether serve", "uvicorn")
    assert isinstance(exc, ConfigError)
    assert (exc.extra, exc.module) == ("server", "uvicorn")
    assert str(exc).endswith(install_hint("server"))


def test_tether_langgraph_names_its_extra() -> None:
    proc = without(EXTRAS["langgraph"], """
        from tether.errors import ConfigError
        try:
            import tether.langgraph
        except ConfigError as exc:
            print(type(exc).__name__, exc)
        """)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == (
        "MissingExtra tether.langgraph needs the 'langgraph' extra (langgraph is not installed): "
        + install_hint("langgraph"))


def test_tether_saver_on_postgres_names_its_extra() -> None:
    proc = without(EXTRAS["postgres"], """
        from tether.errors import ConfigError
        from tether.langgraph import TetherSaver
        try:
            TetherSaver("postgresql://postgres@127.0.0.1:5432/postgres")
        except ConfigError as exc:
            print(type(exc).__name__, exc)
        """)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == (
        "MissingExtra TetherSaver on Postgres needs the 'postgres' extra (psycopg is not "
        'installed): ' + install_hint("postgres"))


def test_metrics_port_without_the_metrics_extra_names_it(tmp_path: Path) -> None:
    proc = without(EXTRAS["metrics"], f"""
        import tether
        from tether.cli import main
        sys.modules["obsapp"] = type(sys)("obsapp")
        sys.modules["obsapp"].rt = tether.Runtime("sqlite:///{tmp_path}/x.db",
                                                  agents=[tether.Agent("a")])
        sys.exit(main(["worker", "--app", "obsapp:rt", "--metrics-port", "0"]))
        """)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == (
        "tether: error: tether worker --metrics-port needs the 'metrics' extra "
        '(prometheus_client is not installed): ' + install_hint("metrics"))


def test_tracing_asked_for_without_the_otel_extra_names_it(tmp_path: Path) -> None:
    proc = without(EXTRAS["otel"], f"""
        import os
        import tether
        from tether.cli import main
        os.environ["OTEL_TRACES_EXPORTER"] = "console"
        sys.modules["obsapp"] = type(sys)("obsapp")
        sys.modules["obsapp"].rt = tether.Runtime("sqlite:///{tmp_path}/x.db",
                                                  agents=[tether.Agent("a")])
        sys.exit(main(["worker", "--app", "obsapp:rt"]))
        """)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == (
        "tether: error: tether worker with OTEL_TRACES_EXPORTER set needs the 'otel' extra "
        '(opentelemetry is not installed): ' + install_hint("otel"))


def test_metrics_and_tracing_are_off_without_their_extras() -> None:
    proc = without(EXTRAS["metrics"] + EXTRAS["otel"], """
        import tether, tether.observe
        rt = tether.Runtime("sqlite:///:memory:")
        print(tether.observe.enable_tracing_from_env(rt, "x"), rt.hub.observers)
        """)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[] []"


@pytest.mark.parametrize(("origin", "hint"), [
    ({}, 'pip install "tether[postgres]"'),
    ({"url": "file:///work/tether", "dir_info": {"editable": True}},
     'pip install -e "/work/tether[postgres]"'),
    ({"url": "file:///src/my%20tether", "dir_info": {}}, 'pip install "/src/my tether[postgres]"'),
    ({"url": "file:///dl/tether-0.1.0-py3-none-any.whl", "archive_info": {}},
     'pip install "/dl/tether-0.1.0-py3-none-any.whl[postgres]"'),
    ({"url": "https://example.com/tether.tar.gz", "archive_info": {}},
     'pip install "tether[postgres]"'),
])
def test_the_hint_follows_how_tether_was_installed(monkeypatch: pytest.MonkeyPatch,
                                                   origin: dict[str, object], hint: str) -> None:
    """No `tether` on the package index here: a hint names the checkout or the wheel it
    came from (PEP 610's direct_url.json), `tether[...]` only for an index install."""
    monkeypatch.setattr(extras, "_origin", lambda: origin)
    assert install_hint("postgres") == hint

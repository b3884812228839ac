"""Agent definitions, commands, Runtime construction errors and Settings (no database)."""

from __future__ import annotations

from typing import Any

import pytest

import tether
from tether import (
    Agent,
    Command,
    ConfigError,
    Context,
    DefinitionError,
    RetryPolicy,
    Runtime,
    Settings,
    append,
    finish,
    goto,
)
from tether.config import DEFAULT_DB, default_db, redact

# -- commands ---------------------------------------------------------------------------------


def test_goto_and_finish_build_commands() -> None:
    assert goto("write", {"a": 1}) == Command("goto", "write", {"a": 1})
    assert goto("write") == Command("goto", "write", None)
    assert finish({"done": True}) == Command("finish", None, {"done": True})
    assert finish() == Command("finish", None, None)


def test_append_holds_items() -> None:
    assert append([1, 2]).items == (1, 2)
    assert isinstance(append([]), tether.Append)


# -- agent definitions ------------------------------------------------------------------------


def test_first_node_is_the_start_unless_one_is_marked() -> None:
    agent = Agent("a1")

    @agent.node
    async def first(state: dict[str, Any], ctx: Context) -> Command:
        return goto("second")

    @agent.node
    async def second(state: dict[str, Any], ctx: Context) -> Command:
        return finish()

    assert agent.start_node() == "first"
    assert list(agent.nodes) == ["first", "second"]
    # The decorator returns the function itself, so it stays callable and testable.
    assert agent.get_node("first").fn is first


def test_start_true_on_a_later_node_wins() -> None:
    agent = Agent("a2")

    @agent.node
    async def helper(state: dict[str, Any], ctx: Context) -> Command:
        return finish()

    @agent.node(start=True)
    async def entry(state: dict[str, Any], ctx: Context) -> Command:
        return goto("helper")

    assert agent.start_node() == "entry"


def test_node_name_override_and_node_retry() -> None:
    agent = Agent("a3")
    policy = RetryPolicy(attempts=9)

    @agent.node(name="custom", retry=policy)
    async def fn(state: dict[str, Any], ctx: Context) -> Command:
        return finish()

    node = agent.get_node("custom")
    assert node.name == "custom" and node.retry is policy
    assert "fn" not in agent.nodes


def test_sync_node_is_refused() -> None:
    agent = Agent("a4")
    with pytest.raises(DefinitionError, match="async def"):

        @agent.node
        def not_async(state: dict[str, Any], ctx: Context) -> Command:  # type: ignore[type-var]
            return finish()


def test_sync_node_with_arguments_is_refused() -> None:
    agent = Agent("a5")
    with pytest.raises(DefinitionError, match="async def"):

        @agent.node(start=True)
        def not_async(state: dict[str, Any], ctx: Context) -> Command:  # type: ignore[type-var]
            return finish()

    assert agent.nodes == {}


def test_duplicate_node_is_refused() -> None:
    agent = Agent("a6")

    @agent.node
    async def step(state: dict[str, Any], ctx: Context) -> Command:
        return finish()

    with pytest.raises(DefinitionError, match="'step'"):

        @agent.node(name="step")
        async def other(state: dict[str, Any], ctx: Context) -> Command:
            return finish()

    assert agent.get_node("step").fn is step


def test_two_start_nodes_are_refused() -> None:
    agent = Agent("a7")

    @agent.node(start=True)
    async def one(state: dict[str, Any], ctx: Context) -> Command:
        return finish()

    with pytest.raises(DefinitionError) as info:

        @agent.node(start=True)
        async def two(state: dict[str, Any], ctx: Context) -> Command:
            return finish()

    assert "'one'" in str(info.value) and "'two'" in str(info.value)
    assert agent.start_node() == "one"


def test_unknown_node_lookup_lists_the_nodes() -> None:
    agent = Agent("a8")

    @agent.node
    async def alpha(state: dict[str, Any], ctx: Context) -> Command:
        return finish()

    @agent.node
    async def beta(state: dict[str, Any], ctx: Context) -> Command:
        return finish()

    with pytest.raises(DefinitionError) as info:
        agent.get_node("gamma")
    message = str(info.value)
    assert "'gamma'" in message and "'a8'" in message
    assert "alpha" in message and "beta" in message


def test_agent_without_nodes_has_no_start() -> None:
    with pytest.raises(DefinitionError, match="no nodes"):
        Agent("empty").start_node()


@pytest.mark.parametrize("name", ["", "has space", "semi;colon", 3, None])
def test_bad_agent_names_are_refused(name: Any) -> None:
    with pytest.raises(DefinitionError):
        Agent(name)


@pytest.mark.parametrize("name", ["researcher", "web-search", "team.lead", "a_b2"])
def test_good_agent_names(name: str) -> None:
    assert Agent(name).name == name


# -- runtime definitions (no connection is made) ----------------------------------------------


def _agent(name: str) -> Agent:
    agent = Agent(name)

    @agent.node
    async def only(state: dict[str, Any], ctx: Context) -> Command:
        return finish()

    return agent


def test_runtime_registers_agents_by_name() -> None:
    a, b = _agent("alpha"), _agent("beta")
    rt = Runtime("sqlite:///:memory:", agents=[a, b], version="v7")
    assert rt.agent("alpha") is a and rt.agent(b) is b
    assert rt.version == "v7"


def test_runtime_unknown_agent_lists_the_known_ones() -> None:
    rt = Runtime("sqlite:///:memory:", agents=[_agent("alpha"), _agent("beta")])
    with pytest.raises(DefinitionError) as info:
        rt.agent("gamma")
    assert "'gamma'" in str(info.value)
    assert "alpha" in str(info.value) and "beta" in str(info.value)


def test_runtime_refuses_two_agents_with_one_name() -> None:
    with pytest.raises(DefinitionError, match="'twin'"):
        Runtime("sqlite:///:memory:", agents=[_agent("twin"), _agent("twin")])


def test_runtime_refuses_non_agents() -> None:
    with pytest.raises(DefinitionError):
        Runtime("sqlite:///:memory:", agents=["alpha"])  # type: ignore[list-item]


def test_runtime_refuses_an_empty_version() -> None:
    with pytest.raises(DefinitionError):
        Runtime("sqlite:///:memory:", agents=[_agent("alpha")], version="")


@pytest.mark.parametrize(
    "url",
    ["nonsense", "", "mysql://u@h/db", "sqlite://host/x.db", "sqlite://", "http://x"],
)
def test_malformed_db_urls_are_config_errors(url: str) -> None:
    with pytest.raises(ConfigError):
        Runtime(url, agents=[_agent("alpha")])


def test_malformed_url_error_redacts_the_password() -> None:
    with pytest.raises(ConfigError) as info:
        Runtime("mysql://user:hunter2@db.example/x")
    assert "hunter2" not in str(info.value)


# -- settings ---------------------------------------------------------------------------------

_VARS = ("DB", "LEASE_TTL", "POLL_INTERVAL", "SNAPSHOT_EVERY", "CONCURRENCY", "SHUTDOWN_GRACE")


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for var in _VARS:
        monkeypatch.delenv(f"TETHER_{var}", raising=False)
    return monkeypatch


def test_settings_defaults(clean_env: pytest.MonkeyPatch) -> None:
    s = Settings.from_env()
    assert s == Settings()
    assert s.db == DEFAULT_DB == "sqlite:///tether.db"
    assert default_db() == DEFAULT_DB


def test_settings_from_env(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("TETHER_DB", "sqlite:///env.db")
    clean_env.setenv("TETHER_LEASE_TTL", "2.5")
    clean_env.setenv("TETHER_POLL_INTERVAL", "0.1")
    clean_env.setenv("TETHER_SNAPSHOT_EVERY", "7")
    clean_env.setenv("TETHER_CONCURRENCY", "3")
    clean_env.setenv("TETHER_SHUTDOWN_GRACE", "1")
    s = Settings.from_env()
    assert (s.db, s.lease_ttl, s.poll_interval, s.snapshot_every, s.concurrency,
            s.shutdown_grace) == ("sqlite:///env.db", 2.5, 0.1, 7, 3, 1.0)
    assert default_db() == "sqlite:///env.db"


def test_settings_overrides_win_and_none_means_not_given(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("TETHER_LEASE_TTL", "2.5")
    clean_env.setenv("TETHER_DB", "sqlite:///env.db")
    s = Settings.from_env(lease_ttl=9.0, db=None)
    assert s.lease_ttl == 9.0
    assert s.db == "sqlite:///env.db"


def test_empty_env_values_are_ignored(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("TETHER_LEASE_TTL", "")
    clean_env.setenv("TETHER_DB", "")
    assert Settings.from_env().lease_ttl == 30.0
    assert default_db() == DEFAULT_DB


def test_runtime_reads_env_settings(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("TETHER_LEASE_TTL", "4")
    rt = Runtime("sqlite:///:memory:", agents=[_agent("alpha")])
    assert rt.settings.lease_ttl == 4.0
    # The code wins over the environment in a program (a command applies TETHER_* over the
    # app it loads instead).
    assert Runtime("sqlite:///:memory:", lease_ttl=1.5).settings.lease_ttl == 1.5


@pytest.mark.parametrize(
    ("var", "raw"),
    [("LEASE_TTL", "soon"), ("SNAPSHOT_EVERY", "1.5"), ("CONCURRENCY", "many")],
)
def test_settings_invalid_env_names_the_variable(
    clean_env: pytest.MonkeyPatch, var: str, raw: str
) -> None:
    clean_env.setenv(f"TETHER_{var}", raw)
    with pytest.raises(ConfigError) as info:
        Settings.from_env()
    assert f"TETHER_{var}" in str(info.value) and raw in str(info.value)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"lease_ttl": 0},
        {"lease_ttl": -1},
        {"poll_interval": 0},
        {"snapshot_every": 0},
        {"concurrency": 0},
    ],
)
def test_settings_out_of_range_are_config_errors(kwargs: dict[str, float]) -> None:
    with pytest.raises(ConfigError):
        Settings(**kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("postgresql://u:secret@db.example:5432/app", "postgresql://u:***@db.example:5432/app"),
        ("postgresql://u@db.example/app", "postgresql://u@db.example/app"),
        ("postgresql://db.example/app", "postgresql://db.example/app"),
        ("sqlite:///tether.db", "sqlite:///tether.db"),
        ("sqlite:///:memory:", "sqlite:///:memory:"),
    ],
)
def test_redact(url: str, expected: str) -> None:
    assert redact(url) == expected


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://u:secret@db.example:5432/app",
        "postgresql://u:p%40ss:secret@db.example/app",
        "postgresql://u:secret@[::1]:5432/app",
        "postgresql://:secret@db.example/app",
        "postgresql://u@db.example/app?password=secret",
        "postgresql://u@db.example/app?sslmode=require&password=secret",
    ],
)
def test_redact_never_shows_the_password(url: str) -> None:
    assert "secret" not in redact(url)

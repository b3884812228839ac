"""Routing and the checks of rainbow deploys, as pure functions (tether.deploy)."""

from __future__ import annotations

import hashlib
import subprocess
import sys
from collections import Counter

import pytest

from tether.deploy import Routes, bucket, check_weights, pick, plan_upgrade
from tether.errors import DefinitionError, InvalidState
from tether.store.base import RunRecord


def test_bucket_is_blake2b_of_the_thread_id() -> None:
    digest = hashlib.blake2b(b"abc", digest_size=8).digest()
    assert bucket("abc", 1000) == int.from_bytes(digest, "big") % 1000 == 721
    assert bucket("thread-1", 100) == 45


def test_same_thread_id_same_version_in_another_interpreter() -> None:
    weights = [("v1", 30), ("v2", 70)]
    ours = [pick(f"t{i}", weights) for i in range(200)]
    code = ("from tether.deploy import pick\n"
            "print(','.join(pick(f't{i}', [('v1', 30), ('v2', 70)]) for i in range(200)))")
    theirs = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            check=True, env={"PYTHONHASHSEED": "12345"}).stdout.strip()
    assert theirs.split(",") == ours


@pytest.mark.parametrize("weights", [[("v1", 50), ("v2", 50)], [("v1", 90), ("v2", 10)],
                                     [("a", 1), ("b", 1), ("c", 2)]])
def test_split_follows_the_weights(weights: list[tuple[str, int]]) -> None:
    n = 20_000
    got = Counter(pick(f"thread-{i}", weights) for i in range(n))
    total = sum(w for _, w in weights)
    for version, weight in weights:
        assert abs(got[version] / n - weight / total) < 0.02, got


def test_zero_weight_gets_nothing_and_no_weight_is_an_error() -> None:
    assert {pick(f"x{i}", [("v1", 0), ("v2", 3)]) for i in range(500)} == {"v2"}
    with pytest.raises(ValueError):
        pick("x", [("v1", 0)])


def test_choose_prefers_versions_serving_the_agent() -> None:
    routes = Routes(weights=(("v1", 50), ("v2", 50)),
                    agents={"v1": {"a": ("n",)}, "v2": {"b": ("m",)}})
    assert {routes.choose(f"t{i}", "v1", "a") for i in range(100)} == {"v1"}
    assert {routes.choose(f"t{i}", "v1", "b") for i in range(100)} == {"v1", "v2"}
    assert Routes().choose("t", "own", "a") == "own"


@pytest.mark.parametrize(("weights", "match"), [
    ({"v1": -1}, ">= 0"), ({"v1": 0}, "sum to 0"), ({"v1": 1.5}, "integer"),
    ({"v1": True}, "integer"), ({}, "must map"), ({"v3": 1}, "unknown version 'v3'"),
    ({"": 1}, "non-empty"),
])
def test_bad_weights(weights: dict[str, int], match: str) -> None:
    routes = Routes(known=frozenset({"v1", "v2"}))
    with pytest.raises(DefinitionError, match=match):
        check_weights(weights, routes, "v1")


def test_weights_for_a_retired_version_are_refused() -> None:
    routes = Routes(known=frozenset({"v1", "v2"}), retired=frozenset({"v1"}))
    with pytest.raises(InvalidState, match="retired"):
        check_weights({"v1": 1, "v2": 1}, routes, "v2")
    assert check_weights({"v1": 0, "v2": 1}, routes, "v2") == [("v1", 0), ("v2", 1)]


def run(tid: str, status: str, node: str | None, version: str = "v1",
        agent: str = "a") -> RunRecord:
    return RunRecord(tid, agent, version, status, node, 1, 1, 0, b"{}", "h", None,
                     "w" if status == "running" else None, None, 1, None, None, None, None,
                     None, None, 0.0, 0.0)


def test_plan_upgrade_gives_each_refusal_its_reason() -> None:
    runs = [run("ok", "waiting", "n"), run("q", "queued", "n"), run("busy", "running", "n"),
            run("gone", "waiting", "legacy"), run("other", "queued", "n", version="v0"),
            run("done", "completed", None), run("b", "sleeping", "n", agent="b")]
    ok, refused = plan_upgrade(runs, [r.thread_id for r in runs] + ["missing"], "v1", "v2",
                               {"a": ("n", "m")})
    assert ok == ["ok", "q"]
    why = dict(refused)
    assert why["missing"] == "no such run"
    assert "running (leased by w)" in why["busy"]
    assert "next node 'legacy' does not exist" in why["gone"]
    assert "on version 'v0'" in why["other"]
    assert "completed (terminal)" in why["done"]
    assert "does not serve agent 'b'" in why["b"]

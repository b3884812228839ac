"""RetryPolicy: attempts, capped exponential backoff, jitter bounds, the retry_on filter."""

from __future__ import annotations

import random

import pytest

from tether import Agent, FailureCategory, RetryPolicy, finish


def test_defaults() -> None:
    p = RetryPolicy()
    assert p.attempts == 3
    assert p.retry_on == (Exception,)


def test_attempts_count_every_execution_including_the_first() -> None:
    p = RetryPolicy(attempts=3, initial=0.01, jitter=0)
    err = RuntimeError("boom")
    assert p.next_delay(1, err) is not None
    assert p.next_delay(2, err) is not None
    assert p.next_delay(3, err) is None
    assert p.next_delay(4, err) is None


def test_one_attempt_never_retries() -> None:
    assert RetryPolicy(attempts=1).next_delay(1, RuntimeError()) is None


def test_backoff_grows_by_factor_and_is_capped() -> None:
    p = RetryPolicy(attempts=10, initial=1.0, factor=2.0, maximum=5.0, jitter=0)
    delays = [p.next_delay(n, ValueError()) for n in range(1, 8)]
    assert delays == [1.0, 2.0, 4.0, 5.0, 5.0, 5.0, 5.0]


def test_factor_one_is_a_constant_delay() -> None:
    p = RetryPolicy(attempts=5, initial=0.3, factor=1.0, jitter=0)
    assert [p.next_delay(n, ValueError()) for n in (1, 2, 3, 4)] == [0.3] * 4


@pytest.mark.parametrize("jitter", [0.0, 0.25, 0.5, 1.0])
def test_jitter_stays_within_bounds(jitter: float) -> None:
    random.seed(1234)
    p = RetryPolicy(attempts=100, initial=2.0, factor=3.0, maximum=20.0, jitter=jitter)
    for failures in (1, 2, 3, 4):
        base = min(20.0, 2.0 * 3.0 ** (failures - 1))
        samples = [p.next_delay(failures, ValueError()) for _ in range(500)]
        assert all(d is not None for d in samples)
        values = [d for d in samples if d is not None]
        assert min(values) >= base * (1 - jitter) - 1e-12
        assert max(values) <= base + 1e-12
        if jitter > 0:
            # Jitter actually spreads the delays (a fixed value would fail thundering herds).
            assert max(values) - min(values) > base * jitter * 0.5
        else:
            assert set(values) == {base}


def test_retry_on_filters_exception_types() -> None:
    p = RetryPolicy(attempts=5, initial=0.01, retry_on=(TimeoutError, ConnectionError))
    assert p.next_delay(1, TimeoutError()) is not None
    assert p.next_delay(1, ConnectionResetError()) is not None  # a subclass counts
    assert p.next_delay(1, ValueError()) is None
    assert p.next_delay(1, KeyError("k")) is None


@pytest.mark.parametrize(
    "kwargs",
    [
        {"attempts": 0},
        {"attempts": -1},
        {"initial": -0.1},
        {"maximum": -1.0},
        {"factor": 0.5},
        {"jitter": -0.1},
        {"jitter": 1.5},
    ],
)
def test_invalid_policies_are_refused(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        RetryPolicy(**kwargs)  # type: ignore[arg-type]


def test_policy_is_immutable() -> None:
    p = RetryPolicy()
    with pytest.raises(AttributeError):
        p.attempts = 5  # type: ignore[misc]


def test_node_policy_overrides_agent_policy() -> None:
    agent_policy = RetryPolicy(attempts=7)
    node_policy = RetryPolicy(attempts=2)
    agent = Agent("retrying", retry=agent_policy)

    @agent.node(start=True, retry=node_policy)
    async def careful(state: dict, ctx: object) -> object:
        return finish()

    @agent.node
    async def plain(state: dict, ctx: object) -> object:
        return finish()

    assert agent.retry_for(agent.get_node("careful")) is node_policy
    assert agent.retry_for(agent.get_node("plain")) is agent_policy


def test_agent_default_policy_retries() -> None:
    agent = Agent("default_retry")
    assert agent.retry.attempts > 1


def test_failure_categories_are_str_values() -> None:
    assert {c.value for c in FailureCategory} >= {
        "exception",
        "nondeterminism",
        "serialization",
        "definition",
        "cancelled",
    }
    assert FailureCategory.EXCEPTION == "exception"

"""The step plan both stores follow: a commit's kind and its wake-ups (pure logic)."""

from __future__ import annotations

from typing import Any

import pytest

from tether.errors import DuplicateEffectKey
from tether.store.base import EffectRow, Lease, NewRun, OutMessage, RunRecord, StepCommit
from tether.store.plan import (
    ADVANCE,
    FINISH,
    FULL,
    MOVE,
    RELEASE,
    SPAWN,
    step_kind,
    step_wakes,
    wakes_workers,
)


def _run(parent: str | None = None) -> RunRecord:
    return RunRecord("t1", "a", "v1", "running", "n", 1, 1, 0, b"{}", "h", None, "w", 9.0, 3,
                     None, None, None, parent, None, None, 1.0, 1.0)


def _commit(status: str = "running", **kw: Any) -> StepCommit:
    return StepCommit(Lease("t1", "w", 3), 2, "n", None if status == "completed" else "m", "d",
                      b"{}", 1, 1.0, 2.0, status, **kw)


CHILD = NewRun("c1", "a", "v1", "start", b"{}", "h", parent_thread_id="t1")


@pytest.mark.parametrize(("commit", "kind"), [
    (_commit(), ADVANCE),
    (_commit(run=_run()), ADVANCE),
    (_commit("completed", run=_run()), FINISH),
    (_commit("completed", run=_run(parent="p")), RELEASE),  # its parent may wait for it
    (_commit("completed"), RELEASE),  # the run is not at hand: it may have a parent
    (_commit("failed", run=_run()), RELEASE),
    (_commit("queued"), RELEASE),
    (_commit("running", wake_at=5.0), MOVE),
    (_commit("waiting", waiting_for="join"), MOVE),
    (_commit("sleeping", wake_at=5.0), MOVE),
    (_commit(children=[CHILD]), SPAWN),
    (_commit("completed", run=_run(), children=[CHILD]), SPAWN),
    (_commit(messages=[OutMessage(b"hi", recipient="t2")]), FULL),
    (_commit(effects=[EffectRow("k", 0, "send", b"{}")]), FULL),
    (_commit(consumed=[1]), FULL),
    (_commit(groups=[("g", "member")]), FULL),
    (_commit("waiting", waiting_for="mail"), FULL),
    (_commit("completed", run=_run(), consumed=[1]), FULL),
])
def test_each_commit_has_one_kind(commit: StepCommit, kind: str) -> None:
    assert step_kind(commit) is kind


def test_only_releases_and_spawns_wake_this_processs_workers_among_the_simple_kinds() -> None:
    assert [k for k in (ADVANCE, FINISH, MOVE, RELEASE, SPAWN) if wakes_workers(k)] == [
        RELEASE, SPAWN]


def test_a_full_step_says_whom_it_wakes() -> None:
    wakes = step_wakes(_commit("completed", messages=[
        OutMessage(b"1", recipient="t3"), OutMessage(b"2", group="g2"),
        OutMessage(b"3", recipient="t2"), OutMessage(b"4", recipient="t3"),
        OutMessage(b"5", group="g1")],
        effects=[EffectRow("k1", 0, "tx", b"{}", apply=lambda c, p, k: None)]))
    assert (wakes.terminal, wakes.announce, wakes.workers) == (True, True, True)
    assert wakes.direct == ("t2", "t3") and wakes.groups == ("g1", "g2")
    assert not wakes.dispatchers  # a transactional effect is done in the commit itself
    assert not wakes.mail_requeue


def test_a_step_parking_for_mail_requeues_itself_and_wakes_nobody_else() -> None:
    wakes = step_wakes(_commit("waiting", waiting_for="mail", consumed=[4],
                               effects=[EffectRow("k1", 0, "send", b"{}")]))
    assert wakes.mail_requeue and wakes.dispatchers
    assert not (wakes.terminal or wakes.announce or wakes.workers)
    assert wakes.direct == () and wakes.groups == ()


def test_an_effect_key_used_twice_in_one_step_is_refused_before_any_write() -> None:
    with pytest.raises(DuplicateEffectKey, match="used twice in step 2"):
        step_wakes(_commit(effects=[EffectRow("k", 0, "a", b"{}"), EffectRow("k", 1, "b", b"{}")]))

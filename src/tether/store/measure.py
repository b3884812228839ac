"""The load figures `tether advise --measure` reads, assembled once for both stores.

Each store runs the named queries of its dialect's queries/measure.sql through its own
connections (`Store.measure`); this module turns their rows into one LoadStats.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

Query = Callable[[str, Mapping[str, Any]], Awaitable[list[tuple[Any, ...]]]]
DURATION_SAMPLE = 100_000  # step durations read for the percentiles


@dataclass(frozen=True, slots=True)
class LoadStats:
    """What the store holds about its load over a window ending `now` (database clock).

    `since` is the window's start, or the first run's creation when the data is younger than
    the window (so rates are over the time that has data, and `covered` says how long that
    is). Counts over the window unless named `*_now` (the state at `now`)."""

    now: float
    since: float
    window: float
    covered: float
    runs_started: int
    runs_finished: int
    runs_started_second_half: int
    run_seconds_mean: float | None
    steps_per_run_mean: float | None
    peak_runs_minute: int
    steps: int
    steps_second_half: int
    checkpoint_bytes: int
    checkpoints_total: int
    peak_steps_minute: int
    step_durations: list[float] = field(repr=False)
    statuses_now: dict[str, int]
    oldest_waiting_since: float | None
    interrupts_pending_now: int
    oldest_interrupt_at: float | None
    effects: int
    effects_dead_now: int
    effects_open_now: int
    mail: int
    db_bytes: int
    max_connections: int | None
    new_versions: int = 0
    """Versions whose first registered worker started in the window (deploys)."""
    weight_changes: int = 0


def _num(v: Any) -> float | None:
    return None if v is None else float(v)


async def measure(query: Query, now: float, window: float) -> LoadStats:
    """The LoadStats over the `window` seconds before `now`, through `query(name, params)`."""
    since = now - window
    (started, finished, run_s, steps_per_run, first_run, oldest_wait, _), = await query(
        "measure_runs", {"since": since, "mid": since})
    if first_run is None:
        since = now  # nothing to measure: the window covers no data
    elif float(first_run) > since:
        since = float(first_run)  # measure over the time that has data
    mid = (since + now) / 2
    p = {"since": since, "mid": mid}
    (_, _, _, _, _, _, second_half), = await query("measure_runs", p)
    statuses = {str(s): int(n) for s, n in await query("measure_statuses", {})}
    peak_runs = await query("measure_runs_peak", p)
    (steps, cp_bytes, steps_second, cp_total, _), = await query("measure_steps", p)
    peak_steps = await query("measure_steps_peak", p)
    durations = [float(r[0]) for r in await query(
        "measure_step_durations", {**p, "limit": DURATION_SAMPLE})]
    (pending, oldest_interrupt), = await query("measure_interrupts", {})
    (effects, dead, open_), = await query("measure_effects", p)
    (mail,), = await query("measure_mail", p)
    (db_bytes, max_conn), = await query("measure_db", {})
    (new_versions, weight_changes), = await query("measure_deploys", p)
    return LoadStats(
        now=now, since=since, window=window, covered=max(0.0, now - since),
        runs_started=int(started), runs_finished=int(finished),
        runs_started_second_half=int(second_half),
        run_seconds_mean=_num(run_s), steps_per_run_mean=_num(steps_per_run),
        peak_runs_minute=int(peak_runs[0][1]) if peak_runs else 0,
        steps=int(steps), steps_second_half=int(steps_second), checkpoint_bytes=int(cp_bytes),
        checkpoints_total=int(cp_total),
        peak_steps_minute=int(peak_steps[0][1]) if peak_steps else 0,
        step_durations=durations, statuses_now=statuses,
        oldest_waiting_since=_num(oldest_wait), interrupts_pending_now=int(pending),
        oldest_interrupt_at=_num(oldest_interrupt), effects=int(effects),
        effects_dead_now=int(dead), effects_open_now=int(open_), mail=int(mail),
        db_bytes=int(db_bytes or 0), max_connections=None if max_conn is None else int(max_conn),
        new_versions=int(new_versions), weight_changes=int(weight_changes),
    )

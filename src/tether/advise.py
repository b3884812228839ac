"""The scaling advisor: from the load a store measured (or what-if figures), what to run.

Three parts, each testable alone:
- `Inputs.from_stats` turns the store's LoadStats (store/measure.py) into the figures the
  model needs; what-if flags fill or override them, and every figure keeps its source
  (measured, assumed, or a default), so the output never mixes them up;
- `probe` measures this database's commit latency and batched write rate (seconds), the way
  `tether bench`'s L workload does, so the write ceiling is this machine's, not a constant;
- `advise` applies the capacity model and the decision table of docs/advisor.md and returns
  the recommendation, each reason naming the figure that drove it, the headroom, and settings.
"""

from __future__ import annotations

import asyncio
import math
import os
import statistics
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .config import redact
from .errors import ConfigError
from .store.measure import LoadStats

# -- thresholds (docs/advisor.md traces each one) ---------------------------------------------
STEP_CPU_S = 75e-6
"""A worker's CPU per step (bench W2 at 10,000 runs on SQLite: 75.6 us; 50.3 on Postgres)."""
CPU_BUDGET = 0.5
"""Plan a worker's steps at half of one core: the rest is headroom for peaks (10x) and GC."""
MAX_SLOTS = 5_000
"""Concurrent runs to plan per worker: half of the 10,000 bench W2 ran in one process (3.5x
ideal, 245 MiB)."""
WRITE_BUDGET = 0.5
"""Plan at most half of the measured write ceiling; the rest absorbs peak minutes."""
POOL_DEFAULT = 10
"""Connections per worker process (the Postgres store's default pool_max)."""
CONNECTIONS_BUDGET = 0.8
"""Leave a fifth of max_connections to other clients, psql, migrations."""
ONE_REQUEST_S = 1.0
"""A run shorter than this, of one step and no human wait, fits in a request."""
DEFAULT_LEASE_TTL = 30.0
PG_DB_CPU_S_PER_STEP = 90e-6
"""The Postgres server's own CPU per step: its backends' CPU time (from /proc) over the steps
committed, bench S (`python -m bench.scale_out`: 2,000 runs of 10 steps drained by 4 `tether
worker` processes of concurrency 100 on PostgreSQL 15, 2 cores, the median of 3; 83-117 us over
every row of 1, 2 and 4 processes; 2026-12-04, bench/results/scale_out.txt)."""
PG_DB_CORES = 2
"""The bench server's cores: the model's primary has them all for tether's backends."""
PG_ROWS_PER_STEP = 2.1
"""Rows a step writes (inserted + updated + deleted, pg_stat_database; bench S)."""
PG_WAL_BYTES_PER_STEP = 900.0
"""WAL a step writes (its records and its share of the commit records; bench S)."""
BENCH_PG_STEPS_PER_S = PG_DB_CORES / PG_DB_CPU_S_PER_STEP
"""Where one primary saturates: its cores over its CPU per step (about 22,200 steps/s)."""
BENCH_PG_CEILING = BENCH_PG_STEPS_PER_S * PG_ROWS_PER_STEP
"""The same ceiling in rows/s."""
BENCH_PG_WHERE = (f"the model of one primary from bench S: {PG_DB_CPU_S_PER_STEP * 1e6:.0f} us of "
                  f"the server's CPU a step on PostgreSQL 15 with {PG_DB_CORES} cores, about "
                  f"{PG_ROWS_PER_STEP:g} rows and {PG_WAL_BYTES_PER_STEP:,.0f} bytes of WAL a "
                  "step; docs/advisor.md")


@dataclass(frozen=True, slots=True)
class Figure:
    value: float
    source: str  # "measured", "assumed" (a what-if flag) or "default"


@dataclass(frozen=True, slots=True)
class Inputs:
    """The model's inputs; None where nothing measured or given."""

    runs_per_s: Figure | None = None
    peak_runs_per_s: Figure | None = None
    steps_per_run: Figure | None = None
    step_seconds: Figure | None = None
    human_wait_s: Figure | None = None
    deploys_per_week: Figure | None = None
    retention_days: Figure | None = None
    languages: Figure = Figure(1, "default")
    regions: Figure = Figure(1, "default")
    growth_per_day: Figure | None = None
    db_bytes: Figure | None = None
    bytes_per_step: Figure | None = None
    max_connections: Figure | None = None
    in_flight: Figure | None = None
    """Runs running when measured: the concurrency planned never falls below it."""

    WHAT_IF = ("runs_per_s", "steps_per_run", "step_seconds", "human_wait", "deploys_per_week",
               "retention_days", "languages", "regions")

    @classmethod
    def from_stats(cls, stats: LoadStats | None) -> Inputs:
        if stats is None or (stats.runs_started == 0 and stats.steps == 0):
            return cls()
        m = "measured"
        covered = max(stats.covered, 1.0)
        steps_per_run = stats.steps_per_run_mean
        if steps_per_run is None and stats.runs_started:
            steps_per_run = stats.steps / stats.runs_started
        step_s = statistics.median(stats.step_durations) if stats.step_durations else None
        waits = [t for t in (stats.oldest_waiting_since, stats.oldest_interrupt_at) if t is not None]
        first_half = stats.steps - stats.steps_second_half
        growth = None
        if first_half > 0 and stats.steps_second_half > 0 and covered >= 3600:
            ratio = stats.steps_second_half / first_half
            growth = ratio ** (86400 / (covered / 2))  # per day, compounded
        return cls(
            runs_per_s=Figure(stats.runs_started / covered, m),
            peak_runs_per_s=Figure(stats.peak_runs_minute / 60, m),
            steps_per_run=None if steps_per_run is None else Figure(steps_per_run, m),
            step_seconds=None if step_s is None else Figure(step_s, m),
            human_wait_s=Figure(stats.now - min(waits), m) if waits else None,
            growth_per_day=None if growth is None else Figure(growth, m),
            db_bytes=Figure(stats.db_bytes, m),
            bytes_per_step=Figure(stats.checkpoint_bytes / stats.steps, m) if stats.steps else None,
            max_connections=None if stats.max_connections is None
            else Figure(stats.max_connections, m),
            in_flight=Figure(stats.statuses_now.get("running", 0), m),
        )

    def with_what_ifs(self, what_ifs: Mapping[str, float | None]) -> Inputs:
        """These inputs with the given what-if values (assumed) in place of measured ones."""
        names = {"human_wait": "human_wait_s"}
        changes: dict[str, Figure] = {}
        for key, value in what_ifs.items():
            if key not in self.WHAT_IF:
                raise ConfigError(f"unknown what-if figure {key!r}")
            if value is None:
                continue
            if not math.isfinite(value) or value < 0:
                raise ConfigError(f"--{key.replace('_', '-')} must be a number >= 0, got {value}")
            if key in ("languages", "regions") and (value < 1 or value != int(value)):
                raise ConfigError(f"--{key} must be a whole number >= 1, got {value}")
            changes[names.get(key, key)] = Figure(float(value), "assumed")
        fields = {f: getattr(self, f) for f in self.__dataclass_fields__}
        fields.update(changes)
        return Inputs(**fields)

    def empty(self) -> bool:
        return self.runs_per_s is None


@dataclass(frozen=True, slots=True)
class Probe:
    """This database's write limits, measured now: single-row commits and 100-row batches."""

    commit_ms: float
    single_rows_per_s: float
    batch_rows_per_s: float
    dialect: str


@dataclass(slots=True)
class Advice:
    recommendation: str
    summary: str
    reasons: list[str] = field(default_factory=list)
    headroom: list[str] = field(default_factory=list)
    settings: dict[str, Any] = field(default_factory=dict)
    model: dict[str, Any] = field(default_factory=dict)


def _v(f: Figure | None, default: float) -> float:
    return default if f is None else f.value


def _src(f: Figure | None) -> str:
    return "default" if f is None else f.source


def _fmt(x: float) -> str:
    if x == 0:
        return "0"
    if abs(x) >= 100:
        return f"{x:,.0f}"
    if abs(x) >= 1:
        return f"{x:,.2f}".rstrip("0").rstrip(".")
    return f"{x:.3g}"


def advise(inputs: Inputs, dialect: str, probe: Probe | None,
           db_url: str | None = None) -> Advice:
    """The decision table of docs/advisor.md, in order; the first branch that holds wins.
    `db_url` (the database measured or meant) goes in the suggested settings, masked."""
    runs_per_s = _v(inputs.runs_per_s, 0.0)
    steps_per_run = _v(inputs.steps_per_run, 5.0)
    step_s = _v(inputs.step_seconds, 1.0)
    human_wait = _v(inputs.human_wait_s, 0.0)
    run_s = steps_per_run * step_s
    # Little's law over the peak (10x the mean when no peak was measured: the lesson's figure).
    peak_runs = max(_v(inputs.peak_runs_per_s, runs_per_s * 10), runs_per_s)
    concurrency = max(peak_runs * run_s, _v(inputs.in_flight, 0.0))
    steps_per_s = peak_runs * steps_per_run
    worker_steps = CPU_BUDGET / STEP_CPU_S
    by_cpu = max(1, math.ceil(steps_per_s / worker_steps))
    slots = max(1, min(MAX_SLOTS, math.ceil(concurrency / by_cpu)))
    if slots > 100:
        slots = math.ceil(slots / 100) * 100
    workers = max(by_cpu, math.ceil(concurrency / slots))
    ceiling = _write_ceiling(probe, concurrency)
    write_use = steps_per_s / ceiling if ceiling else 0.0
    pool = POOL_DEFAULT
    connections = workers * pool
    max_conn = _v(inputs.max_connections, 100.0)
    model: dict[str, Any] = {"runs_per_s": runs_per_s, "peak_runs_per_s": peak_runs, "run_seconds": run_s,
             "concurrency": concurrency, "steps_per_s": steps_per_s, "workers": workers,
             "slots_per_worker": slots, "write_ceiling_rows_per_s": ceiling,
             "write_utilisation": write_use, "connections": connections}
    settings: dict[str, Any] = {"concurrency": slots, "lease_ttl": DEFAULT_LEASE_TTL}
    retention = _v(inputs.retention_days, 30.0)
    settings["retention"] = f"tether prune --completed {int(retention)}d --failed {int(max(retention, 90))}d"
    reasons: list[str] = []

    def src(name: str, f: Figure | None) -> str:
        return f"{name} ({_src(f)})"

    if _v(inputs.languages, 1) > 1 or _v(inputs.regions, 1) > 1:
        what = []
        if _v(inputs.languages, 1) > 1:
            what.append(f"{_fmt(inputs.languages.value)} languages ({_src(inputs.languages)})")
        if _v(inputs.regions, 1) > 1:
            what.append(f"{_fmt(inputs.regions.value)} regions ({_src(inputs.regions)})")
        reasons.append(f"{' and '.join(what)}: tether is one Python library on one database; "
                       "workflows across languages or regions need a server built for that")
        return Advice("outgrown", "outgrown: a multi-region or multi-language engine such as "
                      "Temporal or Restate", reasons, [], settings, model)
    if inputs.empty() and not any(f is not None and f.source == "assumed" for f in (
            inputs.runs_per_s, inputs.steps_per_run, inputs.step_seconds)):
        reasons.append("no load to measure: the store has no runs in the window and no what-if "
                       "figures were given (--runs-per-s, --steps-per-run, --step-seconds)")
        return Advice("sqlite", "embedded SQLite (start simple; measure again under load)",
                      reasons, [], settings, model)
    if steps_per_run <= 1 and human_wait == 0 and run_s < ONE_REQUEST_S:
        reasons.append(f"{src('steps per run', inputs.steps_per_run)} is {_fmt(steps_per_run)}, "
                       f"a run takes {_fmt(run_s)} s and nobody waits for a person: a request "
                       "that writes one row does this; a checkpoint log adds nothing")
        return Advice("no-durable-engine", "you need no durable engine: FastAPI + Postgres",
                      reasons, [], settings, model)
    over = bool(ceiling) and write_use > WRITE_BUDGET
    on_sqlite = dialect == "sqlite"
    if on_sqlite:
        sqlite_ok = not over and workers == 1
        if sqlite_ok:
            reasons.append(f"{_fmt(steps_per_s)} steps/s at the peak (from "
                           f"{src('runs/s', inputs.runs_per_s)} x {_fmt(steps_per_run)} steps) "
                           f"is {write_use:.0%} of SQLite's measured write ceiling "
                           f"({_fmt(ceiling)} rows/s)" if ceiling else
                           f"{_fmt(steps_per_s)} steps/s at the peak fits one worker")
            reasons.append(f"{_fmt(concurrency)} concurrent runs fit one worker of concurrency "
                           f"{slots} (bench W2 ran 10,000 in one process)")
            settings["db"] = redact(db_url) if db_url else "sqlite:///tether.db"
            return Advice("sqlite", "embedded SQLite, one worker process", reasons,
                          _headroom(inputs, steps_per_s, ceiling, "SQLite's measured write "
                                    "ceiling"), settings, model)
        if over:
            reasons.append(f"{_fmt(steps_per_s)} steps/s at the peak is {write_use:.0%} of "
                           f"SQLite's measured write ceiling ({_fmt(ceiling)} rows/s), over the "
                           f"{WRITE_BUDGET:.0%} budget")
        if workers > 1:
            reasons.append(f"{_fmt(concurrency)} concurrent runs and {_fmt(steps_per_s)} "
                           f"steps/s need {workers} workers: more than one machine's worth "
                           "is Postgres's job")
        ceiling = 0.0
    measured_pg = bool(ceiling)
    model.update(pg_model(steps_per_s))
    if not measured_pg:
        ceiling = BENCH_PG_STEPS_PER_S
        write_use = steps_per_s / ceiling
        over = write_use > WRITE_BUDGET
        model["write_ceiling_rows_per_s"] = BENCH_PG_CEILING
        model["write_utilisation"] = write_use
        model["write_ceiling_source"] = "model"
        reasons.append(f"Postgres's ceiling was not measured here: planned against "
                       f"{_fmt(ceiling)} steps/s ({BENCH_PG_WHERE}); a primary with more "
                       "cores goes about as much further; run `tether advise --measure --db "
                       "postgresql://...` against yours to check the plan")
    whose = "this Postgres's measured write" if measured_pg else "one Postgres's (model)"
    unit = "rows/s" if measured_pg else "steps/s"
    pg_ceiling = ("this Postgres's write ceiling" if measured_pg else
                  f"one Postgres's ceiling ({_fmt(ceiling)} steps/s, model)")
    if over:
        dbs = math.ceil(steps_per_s / (ceiling * WRITE_BUDGET))
        reasons.append(f"{_fmt(steps_per_s)} steps/s at the peak is {write_use:.0%} of "
                       f"{whose} ceiling ({_fmt(ceiling)} {unit}), over the "
                       f"{WRITE_BUDGET:.0%} budget: one primary is not enough; about {dbs} "
                       f"databases split by thread_id (every table carries it, each with its "
                       "own workers), or an engine built to scale writes out")
        model["databases_needed"] = dbs
        return Advice("outgrown", f"outgrown one Postgres: about {dbs} databases split by "
                      "thread_id, or a horizontally scaled engine", reasons, [], settings,
                      model)
    settings["pool_max"] = pool
    reasons.append(f"{_fmt(steps_per_s)} steps/s costs the primary about "
                   f"{_fmt(model['db_cores_needed'])} cores of CPU, "
                   f"{_fmt(model['db_rows_per_s'])} rows/s and "
                   f"{_fmt(model['db_wal_mb_per_s'])} MB/s of WAL (the model: "
                   f"{PG_DB_CPU_S_PER_STEP * 1e6:.0f} us, {PG_ROWS_PER_STEP:g} rows and "
                   f"{PG_WAL_BYTES_PER_STEP:,.0f} bytes a step, bench S)")
    if connections > CONNECTIONS_BUDGET * max_conn:
        reasons.append(f"{workers} workers x pool {pool} = {connections} connections, over "
                       f"{CONNECTIONS_BUDGET:.0%} of max_connections {int(max_conn)} "
                       f"({_src(inputs.max_connections)}): put PgBouncer in front in "
                       "transaction mode (URL ?pool_mode=transaction&listen_url=<a direct or "
                       "session-mode URL, for LISTEN>; docs/howto-ha.md) or raise "
                       "max_connections")
        return Advice("postgres-pooler", f"tether on Postgres with a connection pooler, "
                      f"{workers} workers of concurrency {slots}", reasons,
                      _headroom(inputs, steps_per_s, ceiling, pg_ceiling),
                      settings, model)
    reasons.append(f"{workers} workers of concurrency {slots} for {_fmt(concurrency)} concurrent "
                   f"runs ({src('runs/s', inputs.runs_per_s)} x {_fmt(run_s)} s a run)")
    reasons.append(f"{connections} connections of max_connections {int(max_conn)} "
                   f"({_src(inputs.max_connections)})")
    if _v(inputs.deploys_per_week, 0) > 0 or human_wait > DEFAULT_LEASE_TTL:
        reasons.append(f"{src('deploys/week', inputs.deploys_per_week)} "
                       f"{_fmt(_v(inputs.deploys_per_week, 0))} and the longest human wait "
                       f"{_fmt(human_wait / 3600)} h: keep each version's workers until it "
                       "drains (tether deploy drain --wait)")
    return Advice("postgres", f"tether on one Postgres with {workers} workers of concurrency "
                  f"{slots}", reasons,
                  _headroom(inputs, steps_per_s, ceiling, pg_ceiling),
                  settings, model)


def pg_model(steps_per_s: float) -> dict[str, float]:
    """What `steps_per_s` costs one Postgres primary by the model (bench S's figures): its
    CPU in cores, its WAL in MB/s, its rows/s, and the share of the model's ceiling."""
    return {"db_cpu_us_per_step": PG_DB_CPU_S_PER_STEP * 1e6,
            "db_cores_needed": steps_per_s * PG_DB_CPU_S_PER_STEP,
            "db_rows_per_s": steps_per_s * PG_ROWS_PER_STEP,
            "db_wal_mb_per_s": steps_per_s * PG_WAL_BYTES_PER_STEP / 1e6,
            "model_ceiling_steps_per_s": BENCH_PG_STEPS_PER_S}


def _write_ceiling(probe: Probe | None, concurrency: float) -> float:
    """Rows/s the database can commit at this concurrency: the group commit batches about as
    many writes as there are runs in flight, so between the single-row and 100-row rates."""
    if probe is None:
        return 0.0
    batch = max(1.0, min(100.0, concurrency))
    single, batched = probe.single_rows_per_s, probe.batch_rows_per_s
    return min(batched, single * batch)


def _headroom(inputs: Inputs, steps_per_s: float, ceiling: float, what: str) -> list[str]:
    out: list[str] = []
    g = inputs.growth_per_day
    if ceiling and steps_per_s > 0:
        limit = ceiling * WRITE_BUDGET
        if g is not None and g.value > 1.0001 and limit > steps_per_s:
            days = math.log(limit / steps_per_s) / math.log(g.value)
            out.append(f"at the measured growth ({(g.value - 1) * 100:.1f}%/day), {what} "
                       f"({_fmt(limit)} steps/s at the {WRITE_BUDGET:.0%} budget) is reached in "
                       f"about {days:.0f} days")
        else:
            out.append(f"{what} allows about {_fmt(limit / steps_per_s)}x today's peak "
                       "(no growth measured)" if g is None or g.value <= 1.0001 else
                       f"{what} is already passed")
    out.extend(_parked(inputs))
    if inputs.bytes_per_step is not None and inputs.runs_per_s is not None:
        mean_steps = inputs.runs_per_s.value * _v(inputs.steps_per_run, 5.0)
        per_day = inputs.bytes_per_step.value * mean_steps * 86400
        out.append(f"checkpoints grow the database about {_fmt(per_day / 1e6)} MB/day "
                   f"({_fmt(inputs.bytes_per_step.value)} bytes/step); retention bounds it")
    return out


def _parked(inputs: Inputs) -> list[str]:
    """What a human wait keeps in the store: runs/s x the wait runs parked (Little's law)."""
    wait, rate = _v(inputs.human_wait_s, 0.0), _v(inputs.runs_per_s, 0.0)
    if wait <= 0 or rate <= 0:
        return []
    parked = rate * wait
    steps = _v(inputs.steps_per_run, 5.0)
    per_step = _v(inputs.bytes_per_step, 1000.0)
    bytes_held = parked * steps * per_step
    return [f"{_fmt(rate)} runs/s with a {span(wait)} wait for a person keeps about "
            f"{_fmt(parked)} runs parked (Little's law): as many run and interrupt rows and "
            f"about {_fmt(parked * steps)} checkpoint rows ({_fmt(steps)} steps a run), about "
            f"{_fmt(bytes_held / 1e6)} MB at {_fmt(per_step)} bytes a step"
            f"{'' if inputs.bytes_per_step is not None else ' (assumed)'}; a parked run holds "
            "no worker slot and no connection"]


def span(seconds: float) -> str:
    """A duration as people say it: 90 s, 45 min, 3.5 h, 2 days."""
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    if seconds < 172800:
        return f"{seconds / 3600:.1f} h".replace(".0 h", " h")
    return f"{seconds / 86400:.1f} days".replace(".0 days", " days")


def plain(v: Any) -> str:
    """A table cell: numbers written out (8.64e+04 is 86,400), never in e-notation."""
    if v is None:
        return ""
    if isinstance(v, bool) or not isinstance(v, float):
        return str(v)
    if v.is_integer() or abs(v) >= 100:
        return f"{v:,.0f}"
    return f"{v:,.4f}".rstrip("0").rstrip(".") or "0"


# -- the probe --------------------------------------------------------------------------------

async def probe(db_url: str, seconds: float = 1.0) -> Probe:
    """Commit latency and batched write rate of this database, now (about 2 x `seconds`).

    SQLite: a scratch file beside the database (same disk; WAL, synchronous=FULL), removed
    after. Postgres: a scratch table in the database, dropped after."""
    if db_url.startswith("sqlite"):
        return await asyncio.to_thread(_probe_sqlite, db_url, seconds)
    return await asyncio.to_thread(_probe_postgres, db_url, seconds)


def _probe_sqlite(db_url: str, seconds: float) -> Probe:
    from .bench.limits import BATCH, sqlite_raw
    from .store.sqlite_schema import parse_sqlite_url

    path = parse_sqlite_url(db_url)[0]
    where = os.path.dirname(os.path.abspath(path)) if path != ":memory:" else None
    fd, scratch = tempfile.mkstemp(prefix=".tether-probe-", suffix=".db", dir=where)
    os.close(fd)
    os.unlink(scratch)
    try:
        single = sqlite_raw(scratch, "FULL", 1, seconds, "probe1")
        batched = sqlite_raw(scratch, "FULL", BATCH, seconds, "probe100")
    finally:
        for suffix in ("", "-wal", "-shm"):
            if os.path.exists(scratch + suffix):
                os.unlink(scratch + suffix)
    return Probe(1000 / single, single, batched, "sqlite")


def _probe_postgres(db_url: str, seconds: float) -> Probe:
    from .bench.limits import BATCH, pg_raw

    name = f"tether_probe_{os.getpid()}_{int(time.time())}"
    single = pg_raw(db_url, 1, 1, seconds, name + "_1", True)
    batched = pg_raw(db_url, 1, BATCH, seconds, name + "_100", True)
    return Probe(1000 / single, single, batched, "postgres")


def parse_duration(text: str) -> float:
    """Seconds in "30d", "12h", "15m", "90s" (or a plain number of seconds)."""
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
    raw = text.strip().lower()
    try:
        value = float(raw[:-1]) * units[raw[-1]] if raw and raw[-1] in units else float(raw)
    except ValueError:
        raise ConfigError(f"bad duration {text!r}: use e.g. 30d, 12h, 15m or 90s") from None
    if not math.isfinite(value) or value <= 0:
        raise ConfigError(f"a duration must be > 0, got {text!r}")
    return value


def measured_json(stats: LoadStats) -> dict[str, Any]:
    """The `measured` object of `tether advise --json` (DESIGN.md's keys, and the rest)."""
    covered = max(stats.covered, 1.0)
    d = sorted(stats.step_durations)

    def pct(q: float) -> float | None:
        return None if not d else d[min(len(d) - 1, int(q * len(d)))]

    waits = [t for t in (stats.oldest_waiting_since, stats.oldest_interrupt_at) if t is not None]
    return {
        "window_s": stats.window, "covered_s": stats.covered,
        "runs_started": stats.runs_started, "runs_finished": stats.runs_finished,
        "runs_per_s": stats.runs_started / covered, "peak_runs_per_minute": stats.peak_runs_minute,
        "steps": stats.steps, "steps_per_s": stats.steps / covered,
        "peak_steps_per_minute": stats.peak_steps_minute,
        "running": stats.statuses_now.get("running", 0),
        "waiting": stats.statuses_now.get("waiting", 0),
        "sleeping": stats.statuses_now.get("sleeping", 0),
        "queued": stats.statuses_now.get("queued", 0),
        "longest_wait_s": stats.now - min(waits) if waits else None,
        "interrupts_pending": stats.interrupts_pending_now,
        "step_p50_s": pct(0.5), "step_p99_s": pct(0.99),
        "run_seconds_mean": stats.run_seconds_mean, "steps_per_run": stats.steps_per_run_mean,
        "checkpoint_bytes_per_step": stats.checkpoint_bytes / stats.steps if stats.steps else None,
        "db_bytes": stats.db_bytes,
        "effects": stats.effects, "effects_per_s": stats.effects / covered,
        "effects_dead": stats.effects_dead_now, "mail": stats.mail,
        "mail_per_s": stats.mail / covered, "max_connections": stats.max_connections,
        "deploys": stats.new_versions, "weight_changes": stats.weight_changes,
    }

"""The scaling advisor's decision table on what-if inputs: each branch, and bad input."""

from __future__ import annotations

import pytest

from tether.advise import Figure, Inputs, Probe, advise, parse_duration
from tether.errors import ConfigError

SQLITE_PROBE = Probe(commit_ms=0.12, single_rows_per_s=8_000, batch_rows_per_s=230_000,
                     dialect="sqlite")
PG_PROBE = Probe(commit_ms=0.2, single_rows_per_s=4_700, batch_rows_per_s=70_000,
                 dialect="postgres")


def what_if(**values: float) -> Inputs:
    return Inputs().with_what_ifs(values)


def test_several_languages_or_regions_have_outgrown_a_library() -> None:
    a = advise(what_if(runs_per_s=1, languages=2), "postgres", PG_PROBE)
    assert a.recommendation == "outgrown"
    assert "2 languages (assumed)" in a.reasons[0]
    assert advise(what_if(regions=3), "sqlite", None).recommendation == "outgrown"


def test_an_empty_store_without_what_ifs_says_there_is_no_load() -> None:
    a = advise(Inputs(), "sqlite", SQLITE_PROBE)
    assert a.recommendation == "sqlite"
    assert a.reasons[0].startswith("no load to measure")


def test_one_short_step_and_no_human_wait_needs_no_durable_engine() -> None:
    a = advise(what_if(runs_per_s=20, steps_per_run=1, step_seconds=0.2), "postgres", PG_PROBE)
    assert a.recommendation == "no-durable-engine"
    assert "steps per run (assumed) is 1" in a.reasons[0]
    # a person in the loop needs the checkpoint log, however short the run
    waits = advise(what_if(runs_per_s=20, steps_per_run=1, step_seconds=0.2, human_wait=3600),
                   "sqlite", SQLITE_PROBE)
    assert waits.recommendation == "sqlite"


def test_a_small_load_stays_on_embedded_sqlite_with_its_headroom() -> None:
    inputs = what_if(runs_per_s=2, steps_per_run=5, step_seconds=3)
    a = advise(inputs, "sqlite", SQLITE_PROBE)
    assert a.recommendation == "sqlite"
    assert "100 steps/s at the peak" in a.reasons[0] and "rows/s" in a.reasons[0]
    assert a.model["concurrency"] == pytest.approx(2 * 10 * 5 * 3)
    assert a.settings["concurrency"] == 300
    assert any("today's peak" in h for h in a.headroom)


def test_measured_growth_gives_the_days_until_the_ceiling() -> None:
    base = what_if(runs_per_s=2, steps_per_run=5, step_seconds=3)
    grown = Inputs(**{**{f: getattr(base, f) for f in base.__dataclass_fields__},
                      "growth_per_day": Figure(1.1, "measured")})
    a = advise(grown, "sqlite", SQLITE_PROBE)
    # ceiling: min(230,000, 8,000 x 100) = 230,000 rows/s, half of it planned: 115,000/s;
    # today's peak 100 steps/s; ln(1150) / ln(1.1) = 73.9, about 74 days
    assert any("in about 74 days" in h for h in a.headroom), a.headroom


def test_past_sqlites_write_ceiling_means_postgres() -> None:
    slow_disk = Probe(commit_ms=10, single_rows_per_s=100, batch_rows_per_s=2_000, dialect="sqlite")
    a = advise(what_if(runs_per_s=20, steps_per_run=10, step_seconds=1), "sqlite", slow_disk)
    assert a.recommendation == "postgres"
    assert any("of SQLite's measured write ceiling (2,000 rows/s)" in r for r in a.reasons)


def test_many_workers_on_postgres() -> None:
    a = advise(what_if(runs_per_s=50, steps_per_run=20, step_seconds=2), "postgres", PG_PROBE)
    # peak 500 runs/s x 40 s = 20,000 concurrent; 10,000 steps/s: 2 workers by CPU, 4 by slots
    assert a.recommendation == "postgres"
    assert a.summary == "tether on one Postgres with 4 workers of concurrency 5000"
    assert a.settings["pool_max"] == 10


def test_too_many_connections_for_max_connections_means_a_pooler() -> None:
    base = what_if(runs_per_s=100, steps_per_run=10, step_seconds=10)
    inputs = Inputs(**{**{f: getattr(base, f) for f in base.__dataclass_fields__},
                       "max_connections": Figure(100, "measured")})
    big_pg = Probe(commit_ms=0.2, single_rows_per_s=10_000, batch_rows_per_s=1_000_000,
                   dialect="postgres")
    a = advise(inputs, "postgres", big_pg)
    assert a.recommendation == "postgres-pooler"
    assert any("max_connections 100 (measured)" in r for r in a.reasons)
    assert any("pool_mode=transaction&listen_url=" in r for r in a.reasons)  # (howto-ha.md)


def test_past_one_postgres_write_ceiling_has_outgrown_it() -> None:
    a = advise(what_if(runs_per_s=500, steps_per_run=20, step_seconds=0.5), "postgres", PG_PROBE)
    assert a.recommendation == "outgrown"
    assert any("this Postgres's measured write ceiling" in r for r in a.reasons)


@pytest.mark.parametrize(("flag", "value"), [("runs_per_s", -1.0), ("step_seconds", float("nan")),
                                              ("languages", 0.0), ("regions", 1.5)])
def test_bad_what_if_values_are_refused(flag: str, value: float) -> None:
    with pytest.raises(ConfigError):
        what_if(**{flag: value})


def test_durations() -> None:
    assert parse_duration("24h") == 86400 and parse_duration("7d") == 7 * 86400
    assert parse_duration("90") == 90
    for bad in ("", "x", "-1h", "0s", "1y"):
        with pytest.raises(ConfigError):
            parse_duration(bad)


def test_without_a_measurement_the_bench_ceiling_of_one_postgres_decides() -> None:
    """1,000,000 steps/s is far past one primary: said so with the figure and its origin, and
    what comes next (it recommended "Postgres with a pooler, 200 workers", ceiling 0)."""
    from tether.advise import BENCH_PG_CEILING

    for dialect in ("sqlite", "postgres"):
        a = advise(what_if(runs_per_s=5000, steps_per_run=20), dialect, None)
        assert a.recommendation == "outgrown", (dialect, a.summary)
        assert a.model["write_ceiling_rows_per_s"] == BENCH_PG_CEILING
        assert any("planned against 22,222 steps/s (the model of one primary from bench S"
                   in r for r in a.reasons), a.reasons
        assert any("4500% of one Postgres's (model) ceiling (22,222 steps/s)" in r
                   and "about 90 databases split by thread_id" in r for r in a.reasons), a.reasons
    # Within the bench ceiling the plan stands, and says which ceiling it used.
    small = advise(what_if(runs_per_s=50, steps_per_run=20, step_seconds=2), "postgres", None)
    assert small.recommendation == "postgres"
    assert any("22,222 steps/s" in h for h in small.headroom), small.headroom


def test_the_model_of_one_primary_is_its_cpu_per_step() -> None:
    """The unmeasured ceiling is the model's: the server's cores over its CPU per step (bench
    S), and the plan says what the load costs the server (cores, rows/s, WAL)."""
    from tether import advise as adv

    assert pytest.approx(adv.PG_DB_CORES / adv.PG_DB_CPU_S_PER_STEP) == adv.BENCH_PG_STEPS_PER_S
    a = advise(what_if(runs_per_s=100, steps_per_run=10, step_seconds=1), "postgres", None)
    # 10x peak: 1,000 runs/s x 10 steps = 10,000 steps/s, 45% of 22,222: one primary holds
    assert a.recommendation in ("postgres", "postgres-pooler"), a.summary
    assert a.model["write_ceiling_source"] == "model"
    assert a.model["write_utilisation"] == pytest.approx(10_000 / adv.BENCH_PG_STEPS_PER_S)
    assert a.model["db_cores_needed"] == pytest.approx(10_000 * adv.PG_DB_CPU_S_PER_STEP)
    assert a.model["db_wal_mb_per_s"] == pytest.approx(10_000 * adv.PG_WAL_BYTES_PER_STEP / 1e6)
    assert any("90 us of the server's CPU a step" in r and "2 cores" in r for r in a.reasons)
    assert any(r.startswith("10,000 steps/s costs the primary about 0.9 cores of CPU, 21,000 "
                            "rows/s and 9 MB/s of WAL") for r in a.reasons), a.reasons
    # Twice that is past half of the ceiling: more primaries, named.
    b = advise(what_if(runs_per_s=200, steps_per_run=10, step_seconds=1), "postgres", None)
    assert b.recommendation == "outgrown" and b.model["databases_needed"] == 2
    # A measured Postgres is planned against its own probe, the model kept beside it.
    m = advise(what_if(runs_per_s=100, steps_per_run=10, step_seconds=1), "postgres", PG_PROBE)
    assert "write_ceiling_source" not in m.model and "db_cores_needed" in m.model


def test_a_human_wait_says_how_many_runs_it_parks() -> None:
    a = advise(what_if(runs_per_s=5, steps_per_run=10, human_wait=86400), "sqlite", None)
    parked = [h for h in a.headroom if "runs parked" in h]
    assert parked and "5 runs/s with a 24 h wait for a person keeps about 432,000 runs" in \
        parked[0], a.headroom


def test_table_cells_are_plain_numbers() -> None:
    from tether.advise import plain, span

    assert plain(86400.0) == "86,400" and plain(8.64e4) == "86,400"
    assert plain(0.4575) == "0.4575" and plain(1e-05) == "0" and plain(12.5) == "12.5"
    assert plain(None) == "" and plain(3) == "3" and plain(True) == "True"
    assert [span(s) for s in (0.0, 159, 3600, 86400, 3 * 86400)] == \
        ["0 s", "3 min", "60 min", "24 h", "3 days"]


def test_measured_advice_uses_the_apps_database_and_the_runs_in_flight() -> None:
    base = what_if(runs_per_s=0.01, steps_per_run=2, step_seconds=1)
    inputs = Inputs(**{**{f: getattr(base, f) for f in base.__dataclass_fields__},
                       "in_flight": Figure(100, "measured")})
    a = advise(inputs, "sqlite", None, "sqlite:///srv/app/prod.db")
    assert a.recommendation == "sqlite"
    assert a.settings["db"] == "sqlite:///srv/app/prod.db"
    assert a.settings["concurrency"] >= 100  # not 1 beside 100 busy slots
    pg = advise(what_if(runs_per_s=0.01, steps_per_run=2), "sqlite", None,
                "postgresql://app:s3cret@db:5432/x")
    assert "s3cret" not in str(pg.settings)

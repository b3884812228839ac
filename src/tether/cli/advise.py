"""`tether advise`: the scaling advisor (docs/advisor.md)."""

from __future__ import annotations

import textwrap
from typing import Any

import click

from ..advise import (
    POOL_DEFAULT,
    Advice,
    Inputs,
    Probe,
    advise,
    measured_json,
    parse_duration,
    plain,
    probe,
    span,
)
from ..store.measure import LoadStats
from ._common import connection_options, console, dump, json_option, plural, run, runtime_for
from ._root import cli

NON_NEGATIVE = click.FloatRange(min=0)
WHAT_IFS = [
    ("runs-per-s", "runs started per second, on average"),
    ("steps-per-run", "super-steps in a run"),
    ("step-seconds", "seconds a step takes (mostly the LLM call)"),
    ("human-wait", "seconds the longest run waits for a person"),
    ("deploys-per-week", "new versions shipped per week"),
    ("retention-days", "days finished runs must stay readable"),
]


def _what_if_options(f: Any) -> Any:
    for name, help_ in reversed(WHAT_IFS):
        f = click.option(f"--{name}", type=NON_NEGATIVE, default=None, metavar="N",
                         help=f"what if: {help_}")(f)
    f = click.option("--regions", type=click.IntRange(min=1), default=None, metavar="N",
                     help="what if: regions the runs must live in")(f)
    f = click.option("--languages", type=click.IntRange(min=1), default=None, metavar="N",
                     help="what if: languages the agents are written in")(f)
    return f


@cli.command("advise", short_help="what to run for your load, and when it stops being enough",
             help="what to run for your load (measured with --measure, or what-if "
                  "flags), and when it stops being enough")
@click.option("--measure", is_flag=True, help="read the load from the store (and probe its "
              "write rate unless --no-probe)")
@click.option("--window", default="24h", show_default=True, metavar="DURATION",
              help="how far back --measure looks (e.g. 1h, 24h, 7d)")
@click.option("--no-probe", is_flag=True, help="skip the write probe (a few seconds of "
              "commits to a scratch table or file)")
@click.option("--probe-seconds", type=click.FloatRange(min=0.1, max=30), default=1.0,
              show_default=True, metavar="SECONDS", help="length of each probe measurement")
@_what_if_options
@connection_options
@json_option
def advise_cmd(measure: bool, window: str, no_probe: bool, probe_seconds: float,
               languages: int | None, regions: int | None, db: str | None, app: str | None,
               verbose: bool, as_json: bool, **what_ifs: float | None) -> int:
    async def main() -> int:
        window_s = parse_duration(window)
        rt = runtime_for(db, app)
        stats: LoadStats | None = None
        fleet: dict[str, Any] = {}
        measured_probe: Probe | None = None
        try:
            if measure:
                await rt.open()
                stats = await rt.store.measure(window_s)
                fleet = _fleet(await rt.workers(), await rt.deployments())
                if not no_probe:
                    measured_probe = await probe(rt.db_url, probe_seconds)
        finally:
            await rt.close()
        values: dict[str, float | None] = {k: v for k, v in what_ifs.items()}
        values["human_wait"] = values.pop("human_wait", None)
        values["languages"] = None if languages is None else float(languages)
        values["regions"] = None if regions is None else float(regions)
        inputs = Inputs.from_stats(stats).with_what_ifs(values)
        advice = advise(inputs, rt.dialect, measured_probe, rt.db_url)
        if fleet:
            advice.reasons.extend(_fleet_reasons(fleet, advice, inputs))
        out = _json(advice, inputs, stats, measured_probe, window_s)
        if stats is not None:
            out["measured"].update(fleet)
        if as_json:
            dump(out)
        else:
            _print(out)
        return 0

    return run(main(), verbose)


def _fleet(workers: list[Any], deployments: list[Any]) -> dict[str, Any]:
    """The registered workers and versions, as `tether advise --measure` reports them."""
    live = [w for w in workers if w.alive]
    slots = sum(w.concurrency for w in live)
    busy = sum(w.busy for w in live)
    return {
        "workers_live": len(live), "worker_slots": slots, "worker_busy": busy,
        "slot_utilisation": busy / slots if slots else None,
        "versions_live": sorted({w.version for w in live}),
        "versions": len(deployments),
        "stranded": sum(d.stranded for d in deployments),
        "connections_held_estimate": len(live) * POOL_DEFAULT,
    }


def _fleet_reasons(fleet: dict[str, Any], advice: Advice, inputs: Inputs) -> list[str]:
    out: list[str] = []
    if fleet["workers_live"]:
        util = fleet["slot_utilisation"] or 0.0
        out.append(f"{fleet['workers_live']} live workers hold {fleet['worker_slots']} slots, "
                   f"{util:.0%} busy now (measured); the plan needs {advice.model['workers']} "
                   f"of concurrency {advice.settings['concurrency']}")
        mc = inputs.max_connections
        if mc is not None:
            out.append(f"registered workers hold about {fleet['connections_held_estimate']} "
                       f"connections (pool {POOL_DEFAULT} each) of max_connections "
                       f"{int(mc.value)} (measured)")
    if fleet["stranded"]:
        out.append(f"{plural(fleet['stranded'], 'run')} "
                   f"{'is' if fleet['stranded'] == 1 else 'are'} stranded (no live worker of their version): "
                   "see tether deploy status")
    return out


def _json(advice: Advice, inputs: Inputs, stats: LoadStats | None, pr: Probe | None,
          window_s: float) -> dict[str, Any]:
    assumed = {name: f.value for name in inputs.__dataclass_fields__
               if (f := getattr(inputs, name)) is not None and f.source == "assumed"}
    out: dict[str, Any] = {
        "recommendation": advice.recommendation,
        "summary": advice.summary,
        "reasons": advice.reasons,
        "headroom": advice.headroom,
        "settings": advice.settings,
        "assumed": assumed,
        "model": advice.model,
    }
    if stats is not None:
        out["measured"] = measured_json(stats)
        if stats.covered < window_s:
            out["note"] = (f"the store holds {span(stats.covered)} of data: measured over "
                           f"that, not the {span(window_s)} window")
    if pr is not None:
        out["probe"] = {"commit_ms": pr.commit_ms, "single_rows_per_s": pr.single_rows_per_s,
                        "batch100_rows_per_s": pr.batch_rows_per_s}
    return out


def _item(c: Any, lead: str, text: str) -> None:
    """One point of the advice, wrapped at the terminal's width under its own first word (a
    hanging indent), so a figure and its unit stay together on a line."""
    c.print(textwrap.fill(text, max(40, c.width), initial_indent=lead,
                          subsequent_indent=" " * len(lead), break_long_words=False,
                          break_on_hyphens=False), markup=False, soft_wrap=True)


def _print(out: dict[str, Any]) -> None:
    from rich.table import Table

    c = console()
    c.print(f"[bold]Recommendation:[/bold] {out['summary']}  ({out['recommendation']})")
    for r in out["reasons"]:
        _item(c, "  - ", r)
    for h in out["headroom"]:
        _item(c, "  headroom: ", h)
    if "note" in out:
        _item(c, "  note: ", out["note"])
    for title, key in (("measured", "measured"), ("assumed (what-if)", "assumed"),
                       ("probe", "probe"), ("suggested settings", "settings")):
        if not out.get(key):
            continue
        table = Table(title=title, title_justify="left")
        table.add_column("figure")
        table.add_column("value", justify="right", overflow="fold")
        for k, v in out[key].items():
            table.add_row(k, plain(v))
        c.print(table)

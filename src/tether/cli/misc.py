"""`tether migrate`, `tether demo` and `tether completion`."""

from __future__ import annotations

import click

from ..config import redact
from ..errors import ConfigError
from ._common import connection_options, dump, json_option, run, runtime_for
from ._root import cli


@cli.command("migrate", help="apply schema migrations")
@connection_options
@json_option
def migrate(db: str | None, app: str | None, verbose: bool, as_json: bool) -> int:
    async def main() -> int:
        rt = runtime_for(db, app)
        applied = await rt.migrate()
        await rt.store.open(check_schema=False)
        try:
            current, latest = await rt.store.schema_version()
        finally:
            await rt.store.close()
        if as_json:
            dump({"applied": applied, "version": current, "latest": latest})
        elif applied:
            print(f"applied migrations {applied} to {redact(rt.db_url)}; schema at version "
                  f"{current}")
        else:
            print(f"schema at {redact(rt.db_url)} is up to date (version {current})")
        return 0

    return run(main(), verbose)


@cli.command("demo", short_help="crash recovery, actors, HITL, effects, async, deploys: end to end on SQLite",
             help="Durable execution shown end to end on embedded SQLite: a crash mid-step, "
                  "a queue of actors, a person in the loop, an effect done once, asyncio "
                  "against threads, two versions at once. PART: crash, queue, hitl, effect, "
                  "async, deploy (default: all).")
@click.argument("parts", nargs=-1, metavar="[PART]...")
def demo(parts: tuple[str, ...]) -> int:
    async def main() -> int:
        from ..demo.run import PARTS, run_demo

        unknown = [p for p in parts if p not in PARTS]
        if unknown:
            raise ConfigError(f"unknown demo part {unknown[0]!r}; parts: {', '.join(PARTS)}")
        return await run_demo(list(parts) or list(PARTS))

    return run(main())


SHELLS = ("bash", "zsh", "fish")


@cli.command("completion", short_help="print the shell completion script (bash, zsh or fish)",
             help="Print the script that makes SHELL complete tether's commands and options, "
                  'e.g. in ~/.bashrc: eval "$(tether completion bash)".')
@click.argument("shell", type=click.Choice(SHELLS))
def completion(shell: str) -> int:
    from click.shell_completion import get_completion_class

    cls = get_completion_class(shell)
    assert cls is not None  # every name in SHELLS is one of click's
    print(cls(cli, {}, "tether", "_TETHER_COMPLETE").source())
    return 0

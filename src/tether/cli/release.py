"""`tether workers release WORKER_ID`: an operator gives back a dead or stuck worker's leases
at once instead of waiting out their TTL.

Its own module until the worker registry's `tether workers` (the listing) lands beside it:
then `workers` becomes that group's default command and `release` one of its subcommands.
"""

from __future__ import annotations

import click

from ._common import connection_options, dump, json_option, run, runtime_for
from ._root import cli


@cli.group("workers", help="workers and their leases")
def workers() -> None:
    pass


@workers.command("release", help="give back every run and effect a worker leases now (any worker "
                                 "resumes them); the worker, if alive, is fenced out")
@click.argument("worker_id")
@connection_options
@json_option
def release(worker_id: str, db: str | None, app: str | None, verbose: bool, as_json: bool) -> int:
    async def main() -> int:
        rt = runtime_for(db, app)
        try:
            released = await rt.release_worker(worker_id)
        finally:
            await rt.close()
        if as_json:
            dump({"worker": worker_id, "released": released})
        elif released:
            print(f"released {len(released)} run(s) of {worker_id}: {' '.join(released)}")
        else:
            print(f"{worker_id} leases no run (its effects, if any, were released)")
        return 0

    return run(main(), verbose)

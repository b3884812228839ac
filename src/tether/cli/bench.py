"""`tether bench`: the benchmark workloads that ship in the package (tether.bench.runner).

The runner parses its own options (argparse, in tether.bench.runner.add_arguments): the same
parser serves the checkout's `python -m bench.run`, so the options are defined once, and
`tether bench --help` is the runner's."""

from __future__ import annotations

import asyncio

import click

from ._common import run
from ._root import cli


@cli.command("bench", help="run the benchmark workloads (W1-W5, E, M, L); see tether bench --help",
             short_help="run the benchmark workloads (W1-W5, E, M, L)", add_help_option=False,
             context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.argument("argv", nargs=-1, type=click.UNPROCESSED)
def bench(argv: tuple[str, ...]) -> int:
    from ..bench.runner import parse
    from ..bench.runner import run as run_bench

    try:
        args = parse(argv, prog="tether bench")
    except SystemExit as exc:  # argparse's: 0 after --help, 2 (with its message) on a bad option
        return exc.code if isinstance(exc.code, int) else 2

    async def main() -> int:
        # blocking: one subprocess per workload
        return await asyncio.to_thread(run_bench, args, "tether bench", list(argv))

    return run(main())

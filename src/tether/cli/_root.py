"""The root group every command module adds its commands to."""

from __future__ import annotations

import click

from .. import __version__

CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 100}


@click.group(context_settings=CONTEXT, no_args_is_help=False)
@click.version_option(__version__, "--version", prog_name="tether", message="%(prog)s %(version)s")
def cli() -> None:
    """durable execution for agents"""

"""The root group every command module adds its commands to."""

from __future__ import annotations

import click

CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 100}


@click.group(context_settings=CONTEXT, no_args_is_help=False)
def cli() -> None:
    """durable execution for agents"""

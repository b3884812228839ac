"""The `tether` command (Click). Every read command takes --json; --db defaults to $TETHER_DB,
then sqlite:///tether.db; --app module:attr names the user's tether.Runtime.

One module per command group, each adding its commands to the root group `cli` (_root.py).
Every module of this package not starting with "_" is imported here, so a new command group is
a new module and nothing else. Shell completion is Click's: `tether completion bash` prints the
script.
"""

from __future__ import annotations

import importlib
import pkgutil
import sys
from collections.abc import Sequence

import click

from ._common import USER_ERROR, load_app
from ._root import cli
from .serve import is_loopback

# The command modules, imported for what they register on `cli`.
COMMANDS = tuple(sorted(m.name for m in pkgutil.iter_modules(__path__) if not m.name.startswith("_")))
for _name in COMMANDS:
    importlib.import_module(f"{__name__}.{_name}")


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line `argv` (default: sys.argv[1:]); its exit status."""
    try:
        rv = cli.main(list(argv) if argv is not None else None, prog_name="tether",
                      standalone_mode=False)
    except click.ClickException as exc:  # a usage error: bad option, missing argument
        exc.show()
        return exc.exit_code
    except click.exceptions.Abort:
        return 130
    return rv if isinstance(rv, int) else 0


__all__ = ["USER_ERROR", "cli", "is_loopback", "load_app", "main"]

if __name__ == "__main__":
    sys.exit(main())

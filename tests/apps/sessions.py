"""Shell sessions of the docs (```console blocks) as scripts, their shown output checked.

In a ```console block, a line starting with `$ ` is a command; the lines after it, up to the
next command, are its output as shown. `...` in a shown line matches any text, and a line that
is only `...` matches any number of lines (doctest's ELLIPSIS). The blocks of one page run in
order in one bash process, in one folder, so background jobs (`cmd &`, `kill %1`) and files
carry from block to block, as in one terminal.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path

FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```\s*$", re.MULTILINE | re.DOTALL)
MARK = "@@tether-docs-session@@"


@dataclass(frozen=True)
class Command:
    line: int  # in the page, 1-based
    text: str
    shown: str  # the output as the page shows it


def blocks(text: str, lang: str) -> list[tuple[int, str]]:
    """The page's fenced blocks in `lang`: (line of their first content line, content)."""
    return [(text.count("\n", 0, m.start(2)) + 1, m.group(2)) for m in FENCE.finditer(text)
            if m.group(1) == lang]


def commands(text: str) -> list[Command]:
    found: list[Command] = []
    for first, body in blocks(text, "console"):
        current: tuple[int, str] | None = None
        shown: list[str] = []
        for i, line in enumerate(body.splitlines()):
            if line.startswith("$ "):
                if current:
                    found.append(Command(current[0], current[1], "\n".join(shown)))
                current, shown = (first + i, line[2:]), []
            elif current is None:
                raise ValueError(f"line {first + i}: output before any `$ ` command")
            else:
                shown.append(line)
        if current:
            found.append(Command(current[0], current[1], "\n".join(shown)))
    return found


def pattern(shown: str) -> re.Pattern[str]:
    parts = []
    for line in shown.splitlines():
        if line.strip() == "...":
            parts.append(r"(?:[^\n]*\n)*?")
        else:
            parts.append(".*?".join(re.escape(p) for p in line.rstrip().split("...")) + r"[ \t]*\n")
    return re.compile("".join(parts), re.DOTALL)


def matches(shown: str, output: str) -> bool:
    text = "".join(line.rstrip() + "\n" for line in output.splitlines())
    return pattern(shown).fullmatch(text) is not None


def run_session(cmds: list[Command], cwd: Path, env: dict[str, str], timeout: float,
                page: str) -> None:
    """Run the commands in one bash (stopping at the first failure), then compare each one's
    output with what the page shows. Raises AssertionError naming the page's line."""
    script = ["set -e"]
    for i, cmd in enumerate(cmds):
        script.append(f"echo '{MARK} {i}'")
        script.append(cmd.text)
    script.append(f"echo '{MARK} end'")
    # Its own process group: what the session left running in the background (a worker, if
    # a command failed before the page stops it) is killed with it.
    proc = subprocess.Popen(["bash", "-c", "\n".join(script)], cwd=cwd, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True)
    try:
        stdout, _ = proc.communicate(timeout=timeout)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    pieces = re.split(rf"^{re.escape(MARK)} (\d+|end)\n", stdout, flags=re.MULTILINE)
    outputs: dict[str, str] = dict(zip(pieces[1::2], pieces[2::2], strict=True))
    for i, cmd in enumerate(cmds):
        got = outputs.get(str(i))
        if got is None:
            raise AssertionError(f"{page}:{cmd.line}: `{cmd.text}` never ran (a command before "
                                 f"it failed: exit {proc.returncode})\n{stdout}")
        if (str(i + 1) if i + 1 < len(cmds) else "end") not in outputs:
            raise AssertionError(f"{page}:{cmd.line}: `{cmd.text}` failed (exit "
                                 f"{proc.returncode}); its output:\n{got}")
        if not matches(cmd.shown, got):
            raise AssertionError(f"{page}:{cmd.line}: `{cmd.text}` printed\n{got}\nbut the page "
                                 f"shows\n{cmd.shown}")

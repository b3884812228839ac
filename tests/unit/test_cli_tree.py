"""The shape of the `tether` command (Click): every command module is loaded, every option
says what it does, usage errors exit 2 with Click's message, and completion scripts print."""

from __future__ import annotations

import argparse
from collections.abc import Iterator

import click
import pytest

from tether.bench import runner
from tether.cli import COMMANDS, cli, main


def commands(group: click.Group, prefix: str = "tether") -> Iterator[tuple[str, click.Command]]:
    for name, command in group.commands.items():
        path = f"{prefix} {name}"
        yield path, command
        if isinstance(command, click.Group):
            yield from commands(command, path)


def test_every_command_module_is_loaded() -> None:
    assert set(COMMANDS) >= {"bench", "effects", "misc", "runs", "serve", "worker"}
    names = {path for path, _ in commands(cli)}
    assert names >= {
        "tether migrate", "tether worker", "tether serve", "tether checkpoints",
        "tether interrupts", "tether demo", "tether bench", "tether completion",
        "tether runs start", "tether runs list", "tether runs show", "tether runs resume",
        "tether runs cancel", "tether runs fork", "tether effects list", "tether effects retry"}


def test_every_command_and_option_has_help() -> None:
    missing = []
    for path, command in commands(cli):
        if not command.help and not command.short_help:
            missing.append(path)
        missing += [f"{path} {p.opts[0]}" for p in command.params
                    if isinstance(p, click.Option) and not p.help]
    # `tether bench` hands its arguments to the runner's own parser (shared with bench.run).
    parser = argparse.ArgumentParser()
    runner.add_arguments(parser, anchors_by_default=False)
    missing += [f"tether bench {a.option_strings[0]}" for a in parser._actions if not a.help]
    assert missing == []


def test_usage_errors_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["runs", "list", "--limit", "0"]) == 2
    assert "Invalid value for '--limit': must be >= 1, got 0" in capsys.readouterr().err
    assert main(["serve", "--port", "70000"]) == 2
    assert "must be within 0..65535, got 70000" in capsys.readouterr().err
    assert main(["worker", "--lease-ttl", "soon"]) == 2
    assert "'soon' is not a number" in capsys.readouterr().err
    assert main([]) == 2
    assert "Missing command" in capsys.readouterr().err
    assert main(["runs", "fork", "t-1"]) == 2
    assert "Missing option '--step'" in capsys.readouterr().err


def test_help_exits_0(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    assert "runs" in out and "completion" in out
    assert main(["bench", "--help"]) == 0
    assert "--workloads" in capsys.readouterr().out


@pytest.mark.parametrize("shell", ["bash", "zsh", "fish"])
def test_completion_scripts(shell: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["completion", shell]) == 0
    assert "_TETHER_COMPLETE" in capsys.readouterr().out
    assert main(["completion", "powershell"]) == 2

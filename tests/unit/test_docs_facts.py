"""Facts the README, the docs and the CLI's help state that the code decides: the demo's parts,
the extras to install, how the TypeScript example is run, and which source of the database URL
wins; each checked against its source."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from tether.cli import cli
from tether.cli._common import runtime_for
from tether.cli.misc import demo
from tether.demo.run import PARTS

ROOT = Path(__file__).resolve().parents[2]


def test_the_typescript_example_is_run_with_the_tsx_npm_ci_installed() -> None:
    """`npx tsx` from the checkout's root finds no tsx there and offers to download one: the
    commands that run examples/typescript/main.ts use clients/typescript's (`--prefix`)."""
    files = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md")),
             ROOT / "examples" / "typescript" / "main.ts",
             ROOT / "examples" / "typescript" / "package.json"]
    runs = [(p.relative_to(ROOT), line) for p in files for line in p.read_text().splitlines()
            if re.search(r"\bnpx\b.*examples/typescript/main\.ts", line)]
    assert len(runs) >= 4, runs
    bare = [f"{p}: {line.strip()}" for p, line in runs
            if "npx --prefix clients/typescript tsx " not in line]
    assert not bare, "\n".join(bare)


def test_the_readme_and_the_help_name_every_demo_part() -> None:
    readme = " ".join((ROOT / "README.md").read_text().split())
    said = re.search(r"`tether demo crash` \(or (.*?)\) runs one part", readme)
    assert said, "the README no longer lists the demo's parts"
    assert ["crash", *re.findall(r"`(\w+)`", said.group(1))] == list(PARTS), said.group(0)
    assert "deploys" in (demo.short_help or "") and "deploy" in (demo.help or ""), demo.help


def test_the_readme_install_lists_every_extra() -> None:
    text = (ROOT / "README.md").read_text()
    install = text.split("## Install", 1)[1].split("\n## ", 1)[0]
    listed = set(re.findall(r'^pip install "\.\[(\w+)\]"', install, re.MULTILINE))
    extras = re.search(r"\[project\.optional-dependencies\](.*?)\n\[",
                       (ROOT / "pyproject.toml").read_text(), re.DOTALL)
    assert extras
    declared = set(re.findall(r"^(\w+) = \[", extras.group(1), re.MULTILINE)) - {"dev"}
    assert listed == declared, (listed, declared)


def test_the_db_help_names_its_sources_in_the_order_they_win(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for var in [v for v in os.environ if v.startswith("TETHER_")]:
        monkeypatch.delenv(var)
    (tmp_path / "order_app.py").write_text(
        'import tether\nruntime = tether.Runtime("sqlite:///from_code.db")\n')
    (tmp_path / "pyproject.toml").write_text(
        '[tool.tether]\napp = "order_app:runtime"\ndb = "sqlite:///from_toml.db"\n')
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "order_app", raising=False)
    assert runtime_for(None, None).db_url.endswith("/from_code.db")
    monkeypatch.setenv("TETHER_DB", "sqlite:///from_env.db")
    assert runtime_for(None, None).db_url.endswith("from_env.db")
    said = " ".join(CliRunner().invoke(cli, ["runs", "list", "--help"]).output.split())
    sources = ("$TETHER_DB", "the app's Runtime(...)", "db in [tool.tether]",
               "sqlite:///tether.db")
    at = [said.index(s) for s in sources]
    assert at == sorted(at), said

"""User docs, the examples, the demo and the CLI's help speak to a user: no words of the team's
own process (the source lesson, a rule by someone's name, "another helper", the bench
machine's lock file)."""

from __future__ import annotations

import re
from pathlib import Path

from tether.cli.misc import demo
from tether.demo.run import PARTS

ROOT = Path(__file__).resolve().parents[2]
INTERNAL = re.compile(r"the lesson'?s?\b|Bedi's|another helper|helper's|bench\.lock|/work/",
                      re.IGNORECASE)


def test_user_docs_and_help_have_no_internal_language() -> None:
    examples = [p for p in sorted((ROOT / "examples").rglob("*"))
                if p.suffix in (".py", ".ts", ".json", ".md") and "node_modules" not in p.parts]
    files = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md")),
             *sorted((ROOT / "src" / "tether" / "cli").glob("*.py")),
             *sorted((ROOT / "src" / "tether" / "demo").glob("*.py")), *examples]
    found = [f"{p.relative_to(ROOT)}:{n}: {line.strip()[:100]}"
             for p in files for n, line in enumerate(p.read_text().splitlines(), 1)
             if INTERNAL.search(line)]
    assert not found, "\n".join(found)


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

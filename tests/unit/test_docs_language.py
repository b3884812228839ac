"""User docs, the examples, the demo and the CLI's help speak to a user: no words of the team's
own process (the source lesson, a rule by someone's name, "another helper", the bench
machine's lock file)."""

from __future__ import annotations

import re
from pathlib import Path

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

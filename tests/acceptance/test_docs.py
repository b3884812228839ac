"""The docs are tested: every Python block of README.md and docs/*.md runs (Sybil), each page
in a fresh directory, and the shell sessions of the README, the tutorial and the deploy how-to
run as scripts with their shown output checked (tests/apps/sessions.py). A block that cannot
run alone carries `<!-- skip: next "why" -->`, which Sybil honours and this test requires a
reason for."""

from __future__ import annotations

import os
import re
import sys
import unittest
from pathlib import Path

import pytest
from sybil import Sybil
from sybil.parsers.markdown import PythonCodeBlockParser, SkipParser

from apps import sessions

ROOT = Path(__file__).resolve().parents[2]
PAGES = [p for p in (ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md")))
         if "```python" in p.read_text()]
SYBIL = Sybil(parsers=[PythonCodeBlockParser(), SkipParser()])
SKIP = re.compile(r"<!--\s*skip:\s*(\w+)(.*?)-->", re.DOTALL)


def run_python_blocks(page: Path) -> tuple[int, list[str]]:
    """Evaluate the page's Python blocks in order in one namespace (a page is one program),
    in the working directory; (blocks run, reasons of the skipped ones)."""
    for m in SKIP.finditer(page.read_text()):
        if m.group(1) == "next" and not m.group(2).strip().startswith('"'):
            line = page.read_text().count("\n", 0, m.start()) + 1
            raise AssertionError(f"{page}:{line}: a skipped block must say why: "
                                 '<!-- skip: next "reason" -->')
    ran, skipped = 0, []
    document = SYBIL.parse(page)
    try:
        for example in document.examples():
            directive = isinstance(example.parsed, tuple)  # a skip marker, not a block
            try:
                example.evaluate()
            except unittest.SkipTest as exc:
                skipped.append(f"line {example.line}: {exc}")
            else:
                ran += not directive
    finally:
        document.namespace.clear()
    return ran, skipped


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_python_blocks_run(page: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for var in [v for v in os.environ if v.startswith("TETHER_")]:
        monkeypatch.delenv(var)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    ran, skipped = run_python_blocks(page)
    assert ran + len(skipped) == page.read_text().count("```python")
    assert len(skipped) <= 3, f"{page.name}: too many blocks skipped: {skipped}"


def test_a_broken_block_fails(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    page = tmp_path / "page.md"
    page.write_text("# A page\n\n```python\nx = 1\n```\n\ntext\n\n```python\nassert x == 2, 'x is 1'\n```\n")
    with pytest.raises(AssertionError, match="x is 1"):
        run_python_blocks(page)
    page.write_text("```python\nundefined_name()\n```\n")
    with pytest.raises(NameError):
        run_python_blocks(page)
    page.write_text('<!-- skip: next "it needs a GPU" -->\n```python\nundefined_name()\n```\n')
    assert run_python_blocks(page) == (0, ["line 2: it needs a GPU"])
    page.write_text("<!-- skip: next -->\n```python\nundefined_name()\n```\n")
    with pytest.raises(AssertionError, match="must say why"):
        run_python_blocks(page)


# -- shell sessions -----------------------------------------------------------------------------


def session_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TETHER_")}
    bindir = str(Path(sys.executable).parent)  # this virtualenv's `tether` and `python`
    env.update(PATH=f"{bindir}{os.pathsep}{env.get('PATH', '')}", COLUMNS="120",
               PYTHONUNBUFFERED="1")
    env.pop("VIRTUAL_ENV", None)
    return env


NAMED = re.compile(r"#\s*(\w+\.py):")  # a block that opens with `# myapp_v1.py: ...`


def write_files(page: Path, folder: Path) -> None:
    """The files a page asks to save: each Python block that opens with `# NAME.py: ...` as
    NAME.py (without one, the page's first Python block as myapp.py), its first TOML block as
    pyproject.toml."""
    text = page.read_text()
    code = [body for _, body in sessions.blocks(text, "python")]
    named = {m.group(1): body for body in code if (m := NAMED.match(body))}
    for name, body in (named or {"myapp.py": code[0]}).items():
        (folder / name).write_text(body)
    toml = sessions.blocks(text, "toml")
    if toml:
        (folder / "pyproject.toml").write_text(toml[0][1])


@pytest.mark.slow
@pytest.mark.parametrize("name", ["README.md", "docs/tutorial.md", "docs/howto-deploy.md"])
def test_shell_sessions_as_shown(name: str, tmp_path: Path) -> None:
    page = ROOT / name
    write_files(page, tmp_path)
    cmds = sessions.commands(page.read_text())
    assert cmds, f"{name} has no console session"
    sessions.run_session(cmds, tmp_path, session_env(), timeout=180, page=name)


def test_session_runner_checks_the_output(tmp_path: Path) -> None:
    text = "```console\n$ echo hello world\nhello ...\n$ printf 'a\\nb\\nc\\n'\na\n...\n```\n"
    cmds = sessions.commands(text)
    assert [(c.line, c.text) for c in cmds] == [(2, "echo hello world"), (4, r"printf 'a\nb\nc\n'")]
    sessions.run_session(cmds, tmp_path, session_env(), timeout=30, page="p.md")
    wrong = sessions.commands("```console\n$ echo hello\ngoodbye\n```\n")
    with pytest.raises(AssertionError, match=r"p\.md:2: `echo hello` printed"):
        sessions.run_session(wrong, tmp_path, session_env(), timeout=30, page="p.md")
    failing = sessions.commands("```console\n$ false\n$ echo never\nnever\n```\n")
    with pytest.raises(AssertionError, match="`false` failed"):
        sessions.run_session(failing, tmp_path, session_env(), timeout=30, page="p.md")
    assert sessions.matches("a...z", "abcz\n") and not sessions.matches("a...z", "abc\n")

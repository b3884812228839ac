"""The wheel is self-contained: built from this checkout, installed in a clean virtualenv
outside it (core dependencies only, from the package index), it migrates a SQLite database,
runs a durable run to completion, and a missing extra names the wheel to install it from
(there is no `tether` on the package index to point at)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

PROGRAM = textwrap.dedent("""
    import asyncio, sys
    import tether

    agent = tether.Agent("hello")

    @agent.node(start=True)
    async def greet(state, ctx):
        said = await ctx.call(str.upper, state["name"])
        return tether.finish({"said": said})

    async def main():
        rt = tether.Runtime(sys.argv[1], agents=[agent])
        await rt.migrate()
        run = await rt.start("hello", {"name": "wheel"}, thread_id="w-1")
        work = asyncio.create_task(rt.work(concurrency=2))
        done = await rt.wait(run.thread_id, timeout=60)
        work.cancel()
        try:
            await work
        except asyncio.CancelledError:
            pass
        await rt.close()
        print(done.status.value, done.state["said"])
        try:
            tether.Runtime("postgresql://127.0.0.1:1/none", agents=[agent])
        except tether.ConfigError as exc:
            print(exc)

    asyncio.run(main())
""")


def _clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items()
            if not k.startswith(("TETHER_", "PYTHON", "VIRTUAL_ENV", "COV_", "COVERAGE"))}


def run(*cmd: str | Path, cwd: Path) -> str:
    done = subprocess.run([str(c) for c in cmd], cwd=cwd, env=_clean_env(), text=True,
                          capture_output=True, timeout=600)
    assert done.returncode == 0, f"{cmd}: {done.stdout}\n{done.stderr}"
    return done.stdout


def test_the_wheel_installs_and_runs_alone(tmp_path: Path) -> None:
    dist = tmp_path / "dist"
    run(sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", dist, ROOT, cwd=tmp_path)
    (wheel,) = dist.glob("tether-*.whl")
    venv = tmp_path / "venv"
    run(sys.executable, "-m", "venv", venv, cwd=tmp_path)
    run(venv / "bin" / "python", "-m", "pip", "install", "-q", "--disable-pip-version-check",
        wheel, cwd=tmp_path)
    assert run(venv / "bin" / "tether", "--version", cwd=tmp_path).startswith("tether ")
    db = f"sqlite:///{tmp_path / 'w.db'}"
    run(venv / "bin" / "tether", "migrate", "--db", db, cwd=tmp_path)
    (tmp_path / "prog.py").write_text(PROGRAM)
    out = run(venv / "bin" / "python", tmp_path / "prog.py", db, cwd=tmp_path).splitlines()
    assert out[0] == "completed WHEEL"
    assert out[1].endswith(f'pip install "{wheel}[postgres]"'), out[1]
    # Every file the code reads at run time came with it (SQL, templates, static files).
    listed = run(venv / "bin" / "python", "-c",
                 "import importlib.resources as r; t = r.files('tether');"
                 "print(sorted(p.name for p in (t / 'store' / 'sql' / 'sqlite' / 'migrations')"
                 ".iterdir())[:1])", cwd=tmp_path)
    assert "0001" in listed

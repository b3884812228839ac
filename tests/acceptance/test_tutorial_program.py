"""The tutorial's program (docs/tutorial.md, sections 1 and 7) as a user runs it: twice in a
row, each run finishing; and interrupted with Ctrl-C (SIGINT) while its in-process worker is in
the middle of a step: the worker stops and gives its run back before the database is closed.
Section 7 puts the program at the end of myapp.py, so the `tether` commands that import myapp
must still load it (the program under its `__main__` guard), and one left unguarded is named."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import tether
from apps import sessions

ROOT = Path(__file__).resolve().parents[2]


def program(folder: Path) -> Path:
    """myapp.py of section 1 followed by section 7's main(), as the tutorial shows them."""
    blocks = [code for _, code in sessions.blocks((ROOT / "docs" / "tutorial.md").read_text(),
                                                  "python")]
    assert len(blocks) == 2, "the tutorial's Python blocks changed: update this test"
    path = folder / "tutorial_program.py"
    path.write_text(blocks[0] + "\n\n" + blocks[1])
    return path


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TETHER_")}
    return {**env, **extra}


def test_the_program_runs_twice(tmp_path: Path) -> None:
    path = program(tmp_path)
    for _ in range(2):
        done = subprocess.run([sys.executable, str(path)], cwd=tmp_path, env=clean_env(),
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stdout + done.stderr
        assert done.stdout.splitlines() == ["waiting interrupt", "completed True"], done.stdout
        assert "Traceback" not in done.stderr, done.stderr


def test_the_cli_still_loads_myapp_with_the_program_in_it(tmp_path: Path) -> None:
    """Section 7 says to add the program to myapp.py: the `tether` commands of sections 3-6,
    which import myapp for its runtime, must not run the program (nor fail) on import."""
    (tmp_path / "myapp.py").write_text(program(tmp_path).read_text())
    toml = sessions.blocks((ROOT / "docs" / "tutorial.md").read_text(), "toml")[0][1]
    (tmp_path / "pyproject.toml").write_text(toml)
    tether_cli = str(Path(sys.executable).parent / "tether")
    done = subprocess.run([tether_cli, "migrate"], cwd=tmp_path, env=clean_env(),
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "sqlite:///research.db" in done.stdout, done.stdout
    assert "waiting interrupt" not in done.stdout and "Warning" not in done.stderr, done


def test_an_unguarded_program_in_myapp_is_named_with_the_fix(tmp_path: Path) -> None:
    """The same file with `asyncio.run(main())` at module level (the guard left out): the
    command cannot import it, and says why and what to change."""
    text = program(tmp_path).read_text()
    guarded = 'if __name__ == "__main__":'
    assert guarded in text
    unguarded = "\n".join(line.strip() if line.strip() == "asyncio.run(main())" else line
                          for line in text.splitlines() if not line.startswith(guarded))
    (tmp_path / "myapp.py").write_text(unguarded + "\n")
    tether_cli = str(Path(sys.executable).parent / "tether")
    done = subprocess.run([tether_cli, "migrate", "--app", "myapp:runtime"], cwd=tmp_path,
                          env=clean_env(), capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    assert ("myapp calls asyncio.run() when imported: put that call under "
            '`if __name__ == "__main__":`') in done.stderr, done.stderr


async def runs(db: str) -> list[tether.Run]:
    rt = tether.Runtime(db)
    try:
        return await rt.list_runs()
    except tether.SchemaError:  # the program has not migrated yet
        return []
    finally:
        await rt.close()


def test_ctrl_c_in_a_step_gives_the_run_back_before_closing(tmp_path: Path) -> None:
    path = program(tmp_path)
    db = f"sqlite:///{tmp_path / 'research.db'}"
    proc = subprocess.Popen([sys.executable, str(path)], cwd=tmp_path,
                            env=clean_env(TETHER_SHUTDOWN_GRACE="0.5"),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while True:  # the run leased by the program's worker, its first step (2 s) in flight
            found = asyncio.run(runs(db)) if (tmp_path / "research.db").exists() else []
            if found and found[0].status == "running" and found[0].lease_owner:
                break
            assert time.monotonic() < deadline and proc.poll() is None, proc.communicate()
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode != 0  # KeyboardInterrupt, as Ctrl-C is for any Python program
    assert "KeyboardInterrupt" in err
    assert "not open" not in err and "could not release" not in err, err
    (run,) = asyncio.run(runs(db))
    # Given back at once (not held until the 30 s lease TTL): any worker resumes it now.
    assert run.status == "queued" and run.lease_owner is None, run

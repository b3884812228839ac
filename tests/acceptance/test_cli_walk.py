"""What a newcomer typed on purpose in the walk of issue 30 ("Done means"): a worker id with a
typo is named as not a registered worker instead of a release that seems to have worked."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

TETHER = str(Path(sys.executable).parent / "tether")


def tether(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TETHER_")}
    return subprocess.run([TETHER, *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=60)


def test_releasing_a_worker_that_is_not_registered_says_so(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'walk.db'}"
    assert tether("migrate", "--db", db, cwd=tmp_path).returncode == 0
    done = tether("workers", "release", "vm:123:abcdef", "--db", db, cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout == ("vm:123:abcdef leases no run and is not a registered worker "
                           "(`tether workers` lists their ids)\n"), done.stdout

"""A slow disk for benches and tests: an LD_PRELOAD shim (bench/slowdisk.c, built here with
gcc) that makes fsync and fdatasync sleep TETHER_FSYNC_DELAY_MS milliseconds first, so a
workload sees the disk a cloud volume gives (0.9 ms median, 4 ms p90 on the issue's machine).

    python -m bench.slowdisk --delay-ms 2 -- python -m bench.workloads W2 sqlite 10000

runs the command under it; `build()` returns the shim's path for tests.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

SOURCE = Path(__file__).with_name("slowdisk.c")


def build(where: Path | None = None) -> Path:
    """The shim built into `where` (a temporary directory by default); needs gcc."""
    gcc = shutil.which("gcc") or shutil.which("cc")
    if gcc is None:
        raise RuntimeError("the slow-disk shim needs gcc (Debian: apt-get install gcc)")
    out = (where or Path(tempfile.mkdtemp(prefix="tether-slowdisk-"))) / "slowdisk.so"
    subprocess.run([gcc, "-shared", "-fPIC", "-O2", "-o", str(out), str(SOURCE), "-ldl"],
                   check=True, capture_output=True)
    return out


def env(shim: Path, delay_ms: float) -> dict[str, str]:
    """The environment that runs a child under the shim."""
    return {**os.environ, "LD_PRELOAD": str(shim), "TETHER_FSYNC_DELAY_MS": f"{delay_ms:g}"}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--delay-ms", type=float, default=1.0, help="added to each fsync")
    ap.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND ARGS...")
    args = ap.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        ap.error("give the command to run after --")
    with tempfile.TemporaryDirectory(prefix="tether-slowdisk-") as tmp:
        shim = build(Path(tmp))
        return subprocess.run(command, env=env(shim, args.delay_ms)).returncode


if __name__ == "__main__":
    sys.exit(main())

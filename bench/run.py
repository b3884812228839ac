"""Run tether's benchmark workloads from a checkout (what `tether bench` does, with the
comparison anchors of bench/anchors when they are there); see bench/README.md.

    python -m bench.run [--backend sqlite|postgres|both] [--workloads W1,W2,W5,E,M,L] [--quick]
                        [--timeout SECONDS] [--out FILE]

The code is in the package: tether.bench.runner.
"""

from __future__ import annotations

import sys
from pathlib import Path

from tether.bench.runner import main

RESULTS = Path(__file__).resolve().parent / "results" / "latest.md"

if __name__ == "__main__":
    sys.exit(main(prog="python -m bench.run", default_out=RESULTS))

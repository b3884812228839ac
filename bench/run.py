"""Run tether's benchmark workloads from a checkout: what `tether bench` does, plus what only a
checkout has, M (the megaagent example, bench/mega.py) and the comparison anchors of
bench/anchors (on by default); see bench/README.md. Run from the checkout's root:

    python -m bench.run [--backend sqlite|postgres|both] [--workloads W1,W2,W5,E,M,L] [--quick]
                        [--timeout SECONDS] [--out FILE] [--no-anchors]

The runner is the package's: tether.bench.runner, handed this checkout's parts.
"""

from __future__ import annotations

import sys
from pathlib import Path

from tether.bench.runner import Checkout, main

from .anchors import run_anchors

RESULTS = Path(__file__).resolve().parent / "results" / "latest.md"
CHECKOUT = Checkout(module="bench.workloads", workloads=("M",), anchors=run_anchors)

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:], "python -m bench.run", CHECKOUT, default_out=RESULTS))

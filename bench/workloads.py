"""One benchmark workload in this process, as JSON lines: `python -m bench.workloads W1 sqlite`
(see bench/README.md). The workloads are in the package: tether.bench."""

from __future__ import annotations

import sys

from tether.bench.workloads import main

if __name__ == "__main__":
    main(sys.argv[1:])

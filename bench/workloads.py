"""One benchmark workload in this process, as JSON lines: `python -m bench.workloads W1 sqlite`
(see bench/README.md). The workloads are in the package (tether.bench), but for M, which runs
the checkout's examples/megaagent and so lives here (bench/mega.py)."""

from __future__ import annotations

import sys

from tether.bench.workloads import USAGE, main

from .mega import m_call

CHECKOUT_USAGE = (USAGE.replace("python -m tether.bench.workloads", "python -m bench.workloads")
                  + "\n  M  sqlite|postgres [agents] [timeout_s]")

if __name__ == "__main__":
    main(sys.argv[1:], {"M": m_call}, usage=CHECKOUT_USAGE)

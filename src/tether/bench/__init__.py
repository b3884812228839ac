"""tether's benchmark workloads (the shared WORKLOADS.md set plus tether's own), runnable from
an installed package: `tether bench`, or `python -m tether.bench.workloads W1 sqlite` for one
workload in one process. M (the megaagent example) and the comparison anchors need a tether
checkout: they live in its bench/ directory, which hands them to the runner (bench/run.py).

Modules: `common` (result lines, fresh databases, worker subprocesses), `checkpoint` (W1, W2),
`crash` (W3), `queue` (W4), `suspend` (W5), `effects` (E), `limits` (L), `workloads` (one
workload per process), `runner` and `report` (subprocess per workload, the table with goals,
the markdown file).
"""

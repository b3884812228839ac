"""tether's benchmark workloads (the shared WORKLOADS.md set plus tether's own), runnable from
an installed package: `tether bench`, or `python -m tether.bench.workloads W1 sqlite` for one
workload in one process.

Modules: `common` (result lines, fresh databases, worker subprocesses), `checkpoint` (W1, W2),
`crash` (W3), `queue` (W4), `suspend` (W5), `effects` (E), `mega` (M), `limits` (L),
`workloads` (one workload per process), `runner` and `report` (subprocess per workload, the
table with goals, the markdown file).
"""

"""One workload in this process, its results as JSON lines on stdout (the shared WORKLOADS.md
format); the runner starts one such process per workload, so peak RSS is per workload.
M (the megaagent example) is not in the package: a checkout runs it with
`python -m bench.workloads M sqlite 1000 300`, which hands its own workloads to `main`.

    python -m tether.bench.workloads W1 sqlite
    python -m tether.bench.workloads W2 postgres 10000      # runs
    python -m tether.bench.workloads W2 sqlite 10000 queued # started before the worker
    python -m tether.bench.workloads W3 sqlite outbox 100 10 2   # variant, runs, steps, lease TTL
    python -m tether.bench.workloads W4 postgres 20000 4    # jobs, worker processes
    python -m tether.bench.workloads W5 sqlite 10000        # runs
    python -m tether.bench.workloads E postgres 10000       # effects
    python -m tether.bench.workloads L postgres 2.0         # seconds per measurement
    python -m tether.bench.workloads C sqlite 1000 20 100 1 # W2 runs, CPU runs, ms, processes
    python -m tether.bench.workloads R sqlite 10000         # W2 runs, one version then two
    python -m tether.bench.workloads RP postgres 10000      # the same, a worker process each
    python -m tether.bench.workloads S postgres 1,2,4 3     # worker processes, rounds
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Coroutine, Mapping
from typing import Any

from .. import eventloop
from .common import BACKENDS, PartialFailure, Result, emit

USAGE = """usage: python -m tether.bench.workloads WORKLOAD BACKEND [ARGS...]
  W1 sqlite|postgres
  W2 sqlite|postgres [runs] [handover|queued]
  W3 sqlite|postgres [plain|outbox] [runs] [steps] [lease_ttl_s]
  W4 sqlite|postgres [jobs] [workers]
  W5 sqlite|postgres [runs]
  E  sqlite|postgres [effects]
  L  sqlite|postgres [seconds]
  C  sqlite|postgres [runs] [cpu_runs] [burn_ms] [cpu_workers]
  R  sqlite|postgres [runs] [rounds]
  RP sqlite|postgres [runs] [rounds] [served|embedded]
  S  postgres [processes,...] [rounds]"""

Workload = Callable[[str, list[str]], Coroutine[Any, Any, list[Result]]]


def number_arg(args: list[str], i: int, default: float, kind: Callable[[str], float] = int,
               usage: str = USAGE) -> float:
    """args[i] as a number (`default` if absent); SystemExit with the usage if it is not one."""
    if len(args) <= i:
        return default
    try:
        return kind(args[i])
    except ValueError:
        raise SystemExit(f"{args[i]!r} is not a number\n{usage}") from None


def workload_call(workload: str, backend: str, args: list[str]) -> Coroutine[Any, Any, list[Result]]:
    """The coroutine that runs `workload` with its command-line arguments (SystemExit with
    the usage on bad ones)."""
    def arg(i: int, default: float, kind: Callable[[str], float] = int) -> float:
        return number_arg(args, i, default, kind)

    if workload == "W1":
        from .checkpoint import w1

        return w1(backend)
    if workload == "W2":
        from .checkpoint import W2_PATHS, w2

        path = args[1] if len(args) > 1 else "handover"
        if path not in W2_PATHS:
            raise SystemExit(f"W2 path must be handover or queued, got {path!r}\n{USAGE}")
        return w2(backend, int(arg(0, 1000)), path)
    if workload == "W3":
        from .crash import VARIANTS, w3

        variant = args[0] if args else "plain"
        if variant not in VARIANTS:
            raise SystemExit(f"W3 variant must be plain or outbox, got {variant!r}\n{USAGE}")
        return w3(backend, variant, int(arg(1, 100)), int(arg(2, 10)), arg(3, 2.0, float))
    if workload == "W4":
        from .queue import w4

        return w4(backend, int(arg(0, 20000)), int(arg(1, 4)))
    if workload == "W5":
        from .suspend import w5

        return w5(backend, int(arg(0, 10000)))
    if workload == "E":
        from .effects import e_workload

        return e_workload(backend, int(arg(0, 10000)))
    if workload == "L":
        from .limits import limits

        return limits(backend, arg(0, 2.0, float))
    if workload == "C":
        from .cpu import cpu_offload

        return cpu_offload(backend, int(arg(0, 1000)), int(arg(1, 20)), arg(2, 100.0, float),
                           int(arg(3, 0)))
    if workload == "R":
        from .rainbow import rainbow

        return rainbow(backend, int(arg(0, 1000)), int(arg(1, 3)))
    if workload == "RP":
        from .scale import rainbow_processes

        layout = args[2] if len(args) > 2 else "served"
        if layout not in ("served", "embedded"):
            raise SystemExit(f"RP layout must be served or embedded, got {layout!r}\n{USAGE}")
        return rainbow_processes(backend, int(arg(0, 1000)), int(arg(1, 3)),
                                 layout == "embedded")
    if workload == "S":
        from .scale import s_workload

        procs = tuple(int(p) for p in (args[0] if args else "1,2,4").split(","))
        return s_workload(backend, procs, int(arg(1, 3)))
    raise SystemExit(f"unknown workload {workload!r}\n{USAGE}")


def main(argv: list[str], more: Mapping[str, Workload] | None = None,
         usage: str = USAGE) -> None:
    """Run argv's workload (`more`: a checkout's own, by name) and print its result lines."""
    if len(argv) < 2 or argv[1] not in BACKENDS:
        raise SystemExit(usage)
    name = argv[0].upper()
    own = more.get(name) if more else None
    call = own(argv[1], argv[2:]) if own else workload_call(name, argv[1], argv[2:])
    try:
        results = eventloop.run(call)
    except PartialFailure as exc:
        for result in exc.results:
            emit(result)
        print(exc, file=sys.stderr, flush=True)  # the last line: the runner's error row
        raise SystemExit(1) from None
    for result in results:
        emit(result)


if __name__ == "__main__":
    main(sys.argv[1:])

"""Before/after pairs: one workload run alternately from two checkouts, back to back, so that
the machine's drift (other processes, the disk) falls on both sides alike.

    python -m bench.pairs --before /path/to/main/checkout --pairs 5 W2 sqlite 1000

Each run is `python -m bench.workloads ARGS...` in a fresh process with PYTHONPATH set to that
checkout's src/ (so one venv serves both), the order within a pair alternating. Prints every
run's metrics plus its CPU time (user + system, from the process's rusage), then the median of
each metric per side and after/before, and the median of the pairs' own ratios with a
bootstrap 95% interval (the figure to quote when the runs' spread is wider than the change).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent


def metrics_of(stdout: str, unsized: bool = False) -> dict[str, float]:
    """The metrics a `python -m bench.workloads` run printed (its JSON lines), by name;
    `unsized`: without the size suffix (wall_s_10k -> wall_s)."""
    metrics: dict[str, float] = {}
    for line in stdout.splitlines():
        if line.startswith("{"):
            row = json.loads(line)
            name = row["metric"].rsplit("_", 1)[0] if unsized else row["metric"]
            metrics[name] = float(row["value"])
    return metrics


def run_once(checkout: Path, args: list[str]) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": f"{checkout / 'src'}{os.pathsep}{checkout}"}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    out = subprocess.run([sys.executable, "-m", "bench.workloads", *args], cwd=checkout, env=env,
                         capture_output=True, text=True, check=True).stdout
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    metrics = metrics_of(out)
    metrics["cpu_s"] = round((after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), 3)
    return metrics


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.pairs")
    parser.add_argument("--before", type=Path, required=True, help="the checkout to compare with")
    parser.add_argument("--after", type=Path, default=HERE, help="default: this checkout")
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("workload", nargs=argparse.REMAINDER, help="arguments of bench.workloads")
    args = parser.parse_args(argv)
    if not args.workload:
        parser.error("name a workload, e.g. W2 sqlite 1000")
    for side in (args.before, args.after):
        if not (side / "src" / "tether").is_dir():
            parser.error(f"{side} is not a tether checkout")
    sides: dict[str, list[dict[str, float]]] = {"before": [], "after": []}
    for i in range(args.pairs):
        order = [("before", args.before), ("after", args.after)]
        for name, checkout in order if i % 2 == 0 else order[::-1]:
            metrics = run_once(checkout, args.workload)
            sides[name].append(metrics)
            print(f"pair {i + 1} {name:6} " + " ".join(f"{k}={v:g}" for k, v in metrics.items()),
                  flush=True)
    print(f"\nmedians over {args.pairs} pairs: {' '.join(args.workload)}")
    for metric in sides["before"][0]:
        b = statistics.median(m[metric] for m in sides["before"])
        a = statistics.median(m[metric] for m in sides["after"])
        ratio = f"{a / b:.3f}" if b else "-"
        paired = pair_ratios(sides, metric)
        spread = ""
        if paired:
            low, high = bootstrap_ci(paired)
            spread = f"  pair ratio {statistics.median(paired):.3f} [{low:.3f}, {high:.3f}]"
        print(f"  {metric:28} before {b:12g}  after {a:12g}  after/before {ratio}{spread}")
    print("(pair ratio: the median of each pair's after/before, with a bootstrap 95% interval)")
    return 0


def pair_ratios(sides: dict[str, list[dict[str, float]]], metric: str) -> list[float]:
    """after/before of each pair (the two runs back to back share the machine's state)."""
    return [a[metric] / b[metric] for b, a in zip(sides["before"], sides["after"], strict=True)
            if b.get(metric) and metric in a]


def bootstrap_ci(ratios: list[float], rounds: int = 5000) -> tuple[float, float]:
    """A 95% interval of the median of `ratios` (percentile bootstrap, fixed seed)."""
    rng = random.Random(1)
    medians = sorted(statistics.median(rng.choices(ratios, k=len(ratios)))
                     for _ in range(rounds))
    return medians[int(0.025 * rounds)], medians[int(0.975 * rounds) - 1]


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""The Grafana dashboard in docs/ queries only metrics tether exports, with their labels."""

from __future__ import annotations

import json
import re
from pathlib import Path

from tether.observe.metrics import Metrics

DASHBOARD = Path(__file__).resolve().parents[2] / "docs" / "grafana-dashboard.json"
STORE_GAUGES = {"tether_runs": {"status", "version"}, "tether_effects_open": {"status"}}


def exported() -> dict[str, set[str]]:
    """Every sample name the worker's collector yields, with its label names (each family
    given one series so its samples appear)."""
    m = Metrics()
    for c in (m.started, m.finished, m.steps, m.retries, m.failures, m.released, m.calls,
              m.effects, m.parks, m.mail_delivered, m.mail_sent, m.takeovers):
        c.inc(("x",) * 3)  # arity does not matter to the names
    for h in (m.step_seconds, m.run_seconds, m.queue_wait, m.call_seconds, m.effect_seconds):
        h.observe(("x",) * 2, 0.1)
    m.committed(3, 0.01)
    m.pools.append(lambda: {"in_use": 2, "idle": 1, "max": 10, "waiting": 0})
    names: dict[str, set[str]] = dict(STORE_GAUGES)
    for fam in m.collect():
        labels = set(fam.samples[0].labels) - {"le"} if fam.samples else set()
        names.setdefault(fam.name, set()).update(labels)
        for s in fam.samples:
            names.setdefault(s.name, set()).update(set(s.labels) - {"le"})
    return names


def test_every_dashboard_query_names_an_exported_metric_and_its_labels() -> None:
    dash = json.loads(DASHBOARD.read_text())
    metrics = exported()
    queried = set()
    for panel in dash["panels"]:
        for target in panel["targets"]:
            expr = target["expr"]
            for name in re.findall(r"\b(tether_[a-z_]+)", expr):
                queried.add(name)
                assert name in metrics, f"{panel['title']}: {name} is not exported"
                for by in re.findall(r"by \(([^)]*)\)", expr):
                    for label in (x.strip() for x in by.split(",")):
                        assert label == "le" or label in metrics[name], (
                            f"{panel['title']}: {name} has no label {label!r}")
    assert {"tether_runs", "tether_steps_total", "tether_step_duration_seconds_bucket",
            "tether_retries_total", "tether_failures_total"} <= queried

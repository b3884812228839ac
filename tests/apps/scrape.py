"""Scraping a process's Prometheus endpoint in the observability tests."""

from __future__ import annotations

import httpx
from prometheus_client.parser import text_string_to_metric_families

from .http_harness import free_port

__all__ = ["Samples", "free_port", "scrape", "total"]

Samples = dict[str, list[tuple[dict[str, str], float]]]


def scrape(port: int) -> tuple[str, Samples]:
    """The text of http://127.0.0.1:PORT/metrics and its samples by name."""
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
    samples: Samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            samples.setdefault(s.name, []).append((s.labels, s.value))
    return text, samples


def total(samples: Samples, name: str, **labels: str) -> float:
    """The sum of `name`'s samples whose labels include `labels`."""
    return sum(v for lab, v in samples.get(name, [])
               if all(lab.get(k) == want for k, want in labels.items()))

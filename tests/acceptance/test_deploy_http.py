"""Acceptance: the deployment endpoints of a real `tether serve` with worker processes of two
versions (apps/deploy_v1.py, apps/deploy_v2.py) on every store: GET /workers, PUT and GET
/deployments, POST /deployments/{version}/drain, and stranded runs in GET /healthz."""

from __future__ import annotations

import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "apps"))

from http_harness import Procs, app_env, wait_until

pytestmark = pytest.mark.slow

TTL = "1"


@pytest.fixture
def procs(tmp_path: Path, db_url: str) -> Iterator[Procs]:
    p = Procs(tmp_path, db_url)
    try:
        yield p
    finally:
        p.close()


def test_deployments_over_http(procs: Procs, db_url: str) -> None:
    server = procs.serve(app="deploy_v1:make_runtime",
                         env=app_env(db_url, TETHER_LEASE_TTL=TTL))
    w1 = procs.worker("--lease-ttl", TTL, app="deploy_v1:make_runtime")
    procs.worker("--lease-ttl", TTL, app="deploy_v2:make_runtime")
    with server.client() as http:
        def both() -> bool:
            found = http.get("/workers").json()["workers"]
            return sorted(w["version"] for w in found if w["alive"]) == ["v1", "v2"]

        wait_until(both, 30, "both workers in GET /workers")
        workers = {w["version"]: w for w in http.get("/workers").json()["workers"]}
        assert workers["v2"]["agents"] == {"deal": ["draft", "review", "polish"]}
        assert workers["v1"]["pid"] == w1.popen.pid and workers["v1"]["concurrency"] == 10

        r = http.put("/deployments", json={"weights": {"v1": 50, "v2": 50}})
        assert r.status_code == 200, r.text
        assert {d["version"]: d["weight"] for d in r.json()["deployments"]} == {"v1": 50, "v2": 50}
        before = http.get("/deployments").json()
        for body, reason in (({"weights": {"v1": -1}}, "greater than or equal to 0"),
                             ({"weights": {"v9": 5}}, "unknown version 'v9'"),
                             ({"weights": {"v1": 0, "v2": 0}}, "sum to 0"),
                             ({"weights": {"v1": "5"}}, "weights.v1"),
                             ({"weights": {"v1": True}}, "weights.v1"),
                             ({"weights": {}}, "weights"),
                             ({"v1": 5}, "weights")):
            bad = http.put("/deployments", json=body)
            assert bad.status_code == 422, (body, bad.text)
            assert reason in bad.json()["error"]["message"], (body, bad.json())
        assert http.post("/deployments/v9/drain").status_code == 422
        assert http.get("/deployments").json() == before

        runs = [http.post("/runs", json={"agent": "deal", "input": {"ask": True}}).json()
                for _ in range(30)]
        split = Counter(r["version"] for r in runs)
        assert split["v1"] > 0 and split["v2"] > 0, split
        on_v1 = [r["thread_id"] for r in runs if r["version"] == "v1"]

        def parked() -> bool:
            return all(http.get(f"/runs/{t}").json()["status"] == "waiting" for t in on_v1)

        wait_until(parked, 30, "the v1 runs to wait for input")
        drained = http.post("/deployments/v1/drain")
        assert drained.status_code == 200, drained.text
        assert drained.json()["weight"] == 0 and drained.json()["state"] == "draining"
        assert drained.json()["runs"] == {"waiting": len(on_v1)}
        later = [http.post("/runs", json={"agent": "deal", "input": {}}).json()["version"]
                 for _ in range(20)]
        assert set(later) == {"v2"}
        health = http.get("/healthz").json()
        assert (health["status"], health["stranded"]) == ("ok", 0)

        assert w1.terminate() == 0
        stopped = time.monotonic()

        def stranded() -> bool:
            return http.get("/healthz").json()["stranded"] == len(on_v1)

        wait_until(stranded, 30, "GET /healthz to report the stranded v1 runs")
        assert time.monotonic() - stopped <= float(TTL) + 2.0
        health = http.get("/healthz")
        assert health.status_code == 200 and health.json()["status"] == "stranded"
        v1 = next(d for d in http.get("/deployments").json()["deployments"]
                  if d["version"] == "v1")
        assert (v1["workers"], v1["stranded"], v1["state"]) == (0, len(on_v1), "draining")

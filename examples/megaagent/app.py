"""MegaAgent (arXiv:2408.09955), made durable: a boss recruits G admins, each admin recruits N
workers; tasks flow down and results flow up, all through durable mailboxes.

Two-layer coordination: inside a group the admin talks to its workers densely (group chat via
`ctx.publish`); between groups only the admins talk, sparsely, on `tether.ADMIN_CHANNEL`. Every
agent is an actor run: Idle (parked, no worker held) -> Processing -> Response -> Idle.
A node that returns `tether.receive()` runs again when mail arrives, with it in `ctx.inbox`.

Settings come from the environment so worker subprocesses load the same app:
MEGA_DB (default sqlite:///megaagent.db), MEGA_SEED, MEGA_LEASE_TTL, MEGA_PG_POOL_TIMEOUT.
"""

from __future__ import annotations

import asyncio
import os
import random
import zlib
from typing import Any

import tether

boss = tether.Agent("boss")
admin = tether.Agent("admin")
worker = tether.Agent("worker")

SEED = int(os.environ.get("MEGA_SEED", "7"))


async def simulated_llm(task: str, who: str) -> dict[str, Any]:
    """A simulated LLM call with seeded latency (20-60 ms) and a deterministic answer."""
    rng = random.Random(zlib.crc32(f"{SEED}:{who}:{task}".encode()))
    await asyncio.sleep(rng.uniform(0.02, 0.06))
    return {"score": rng.randint(1, 100)}


def expected_score(task: str, who: str) -> int:
    """What simulated_llm answers for (task, who): lets a checker verify totals."""
    rng = random.Random(zlib.crc32(f"{SEED}:{who}:{task}".encode()))
    rng.uniform(0.02, 0.06)
    return rng.randint(1, 100)


# -- boss: recruits admins, then collects one summary per group ------------------------------

@boss.node(start=True)
async def recruit_admins(state: dict[str, Any], ctx: tether.Context) -> tether.Command:
    sizes = state.get("sizes") or [state["workers_per_group"]] * state["groups"]
    admins = [ctx.spawn(admin, {"group": f"g{g}", "workers": sizes[g],
                                "boss": ctx.thread_id, "task": f"task-{g}"})
              for g in range(state["groups"])]
    return tether.goto("collect", {"admins": admins, "summaries": {}})


@boss.node
async def collect(state: dict[str, Any], ctx: tether.Context) -> tether.Command:
    summaries = dict(state["summaries"])
    for msg in ctx.inbox:
        summaries[msg.body["group"]] = msg.body
    if len(summaries) == len(state["admins"]):
        return tether.finish({"summaries": summaries,
                              "total": sum(s["total"] for s in summaries.values()),
                              "results": sum(s["n"] for s in summaries.values())})
    return tether.receive({"summaries": summaries})


# -- admin: recruits workers into its group, publishes the task, gathers results -------------

@admin.node(start=True)
async def recruit_workers(state: dict[str, Any], ctx: tether.Context) -> tether.Command:
    ctx.join_group(state["group"], admin=True)
    members = [ctx.spawn(worker, {"group": state["group"], "admin": ctx.thread_id})
               for _ in range(state["workers"])]
    return tether.goto("coordinate", {"members": members, "ready": 0, "results": {}, "notes": 0})


@admin.node
async def coordinate(state: dict[str, Any], ctx: tether.Context) -> tether.Command:
    ready, results, notes = state["ready"], dict(state["results"]), state["notes"]
    for msg in ctx.inbox:
        kind = msg.body["kind"]
        if kind == "ready":
            ready += 1
            if ready == state["workers"]:  # everyone has joined: dense intra-group chat
                ctx.publish(state["group"], {"kind": "task", "task": state["task"]})
        elif kind == "result":
            if msg.sender in results:
                raise RuntimeError(f"result from {msg.sender} delivered twice")
            results[msg.sender] = msg.body["score"]
        elif kind == "note":  # the sparse inter-group layer: another admin finished
            notes += 1
    update = {"ready": ready, "results": results, "notes": notes}
    if len(results) == state["workers"]:
        ctx.send(state["boss"], {"group": state["group"], "n": len(results),
                                 "total": sum(results.values())})
        ctx.publish(tether.ADMIN_CHANNEL, {"kind": "note", "group": state["group"]})
        return tether.finish(update)
    return tether.receive(update)


# -- worker: joins its group, waits for the task, answers with a (simulated) LLM call -------

@worker.node(start=True)
async def enlist(state: dict[str, Any], ctx: tether.Context) -> tether.Command:
    ctx.join_group(state["group"])
    ctx.send(state["admin"], {"kind": "ready"})
    return tether.goto("work")


@worker.node
async def work(state: dict[str, Any], ctx: tether.Context) -> tether.Command:
    for msg in ctx.inbox:
        if msg.body["kind"] == "task":
            answer = await ctx.call(simulated_llm, msg.body["task"], ctx.thread_id)
            ctx.send(state["admin"], {"kind": "result", "score": answer["score"]})
            return tether.finish({"task": msg.body["task"], "score": answer["score"]})
    return tether.receive()


DB = os.environ.get("MEGA_DB", "sqlite:///megaagent.db")
# How long a step may wait for one of the Postgres store's pooled connections (a URL option;
# the default is 15 s). With 100,000 agents on 4 workers, steps queue for the pool behind
# transactions that wait for a hot admin row; a timed-out step is aborted and its run given
# back, which only adds work.
if (_pool_wait := os.environ.get("MEGA_PG_POOL_TIMEOUT")) and DB.startswith("postgres"):
    DB += ("&" if "?" in DB else "?") + f"pool_timeout={float(_pool_wait):g}"
runtime = tether.Runtime(DB, agents=[boss, admin, worker], version="v1",
                         lease_ttl=float(os.environ.get("MEGA_LEASE_TTL", "5")),
                         poll_interval=0.1)

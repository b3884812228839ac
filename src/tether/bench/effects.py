"""E: the effect outbox. Dispatch rate of N committed effects to a no-op handler, and what
one effect adds to its step's commit (W1-style runs in three interleaved variants)."""

from __future__ import annotations

import asyncio
import sqlite3
import time
from typing import Any

import tether

from .checkpoint import W1_RUN_DEADLINE
from .common import (
    PartialFailure,
    Result,
    StatusCounts,
    bench_db,
    direct_url,
    noop_effect,
    outbox_counts,
    peak_rss_mib,
    percentile,
    sqlite_path,
    stop_worker,
    timed_commits,
)
from .limits import W1_MSG_BYTES

E_EFFECTS_PER_RUN = 10  # E dispatch: N effects requested by N / 10 runs, 10 per step
E_DEADLINE = 120.0  # s to produce the effects, and for the overhead runs' effects to drain
E_DISPATCH_DEADLINE = 60.0  # s of dispatch before the workload reports what it got and gives up
E_OVERHEAD_ROUNDS, E_OVERHEAD_THREADS, E_OVERHEAD_STEPS = 10, 10, 20

e_producer = tether.Agent("bench_e_producer")


@e_producer.node(start=True)
async def e_produce(state: dict[str, Any], ctx: tether.Context) -> tether.Command:
    for i in range(state["n"]):
        ctx.effect("noop", {"i": i})
    return tether.finish({})


async def without_dispatch(runtime: tether.Runtime, stop: asyncio.Event, concurrency: int,
                           name: str) -> asyncio.Task[None]:
    """Start the runtime's in-process worker, then register effect `name`'s no-op handler:
    the worker's dispatcher takes the handler names when it is built, so this worker commits
    the effects its steps request (ctx.effect finds the handler) but never performs them.
    tether itself is unchanged; callers check the outbox to be sure."""
    worker = asyncio.create_task(runtime.work(concurrency=concurrency, stop=stop))
    while not runtime.local_workers:
        if worker.done():
            await worker  # raises what stopped it
        await asyncio.sleep(0.001)
    runtime.effect(name)(noop_effect)
    return worker


async def e_dispatch(backend: str, effects: int, analyze: bool = False) -> list[Result]:
    """`effects` effects committed first (by effects/10 runs, 10 per step, with no dispatcher
    running), then one worker dispatches them to a no-op handler: effects/s from its first
    claim to its last done mark. `analyze`: run ANALYZE on the database first (a diagnostic:
    the planner then has statistics of the filled outbox). Raises PartialFailure with the
    rate so far if the effects are not all done within E_DISPATCH_DEADLINE seconds."""
    per_run = E_EFFECTS_PER_RUN
    n_runs = effects // per_run
    async with bench_db(backend) as url:
        producer = tether.Runtime(url, agents=[e_producer], version="bench")
        await producer.migrate()
        async with producer:
            stop = asyncio.Event()
            worker = await without_dispatch(producer, stop, 1000, "noop")
            for lo in range(0, n_runs, 1000):
                await asyncio.gather(*(
                    producer.start(e_producer, {"n": per_run}, thread_id=f"e-{i:05d}")
                    for i in range(lo, min(lo + 1000, n_runs))))
            async with StatusCounts(url) as counts:
                await counts.until("completed", n_runs, time.perf_counter() + E_DEADLINE,
                                   "E produce")
            await stop_worker(stop, worker)
        before = await outbox_counts(url)
        if before != {"pending": n_runs * per_run}:
            raise RuntimeError(f"E: expected {n_runs * per_run} pending effects, found {before}")
        if analyze:
            if backend == "sqlite":
                conn = sqlite3.connect(sqlite_path(url))
                try:
                    conn.execute("ANALYZE")
                finally:
                    conn.close()
            else:
                import psycopg

                async with await psycopg.AsyncConnection.connect(direct_url(url), autocommit=True) as aconn:
                    await aconn.execute(b"ANALYZE")

        runtime = tether.Runtime(url, agents=[e_producer], version="bench")
        runtime.effect("noop")(noop_effect)
        store = runtime.store
        claim_inner, complete_inner = store.claim_effects, store.complete_effect
        clock = time.perf_counter
        first_claim: list[float] = []
        claims: list[int] = []
        done = [0]
        all_done = asyncio.Event()
        last_done = [0.0]
        total = n_runs * per_run

        async def claim_effects(*args: Any, **kwargs: Any) -> Any:
            t = clock()
            got = await claim_inner(*args, **kwargs)
            if got:
                if not first_claim:
                    first_claim.append(t)
                claims.append(len(got))
            return got

        async def complete_effect(*args: Any, **kwargs: Any) -> bool:
            ok = await complete_inner(*args, **kwargs)
            if ok:
                done[0] += 1
                last_done[0] = clock()
                if done[0] >= total:
                    all_done.set()
            return ok

        store.claim_effects = claim_effects  # type: ignore[method-assign]
        store.complete_effect = complete_effect  # type: ignore[method-assign]
        async with runtime:
            stop = asyncio.Event()
            worker = asyncio.create_task(runtime.work(concurrency=100, stop=stop))
            try:
                await asyncio.wait_for(all_done.wait(), E_DISPATCH_DEADLINE)
                timed_out = False
            except TimeoutError:
                timed_out = True
                last_done[0] = clock()  # the rate so far
            await stop_worker(stop, worker)
        after = await outbox_counts(url)
        if not timed_out and after != {"done": total}:
            raise RuntimeError(f"E: effects by status after dispatch: {after}")
    sfx = "_analyzed" if analyze else ""
    n_done = after.get("done", 0)
    wall = last_done[0] - first_claim[0] if first_claim else float(E_DISPATCH_DEADLINE)
    out = [
        Result(backend, "E", f"effects_done{sfx}", n_done, "count"),
        Result(backend, "E", f"dispatch_s{sfx}", round(wall, 3), "s"),
        Result(backend, "E", f"effects_per_s{sfx}", round(n_done / wall, 1), "1/s"),
        Result(backend, "E", f"claim_batches{sfx}", len(claims), "count"),
        Result(backend, "E", f"claim_batch_mean{sfx}",
               round(sum(claims) / len(claims), 1) if claims else 0, "count"),
    ]
    if timed_out:
        raise PartialFailure(f"E dispatch{' after ANALYZE' if analyze else ''}: {n_done:,} of "
                             f"{total:,} effects done within {E_DISPATCH_DEADLINE:.0f} s "
                             f"(by status: {after})", out)
    return out


e_plain = tether.Agent("bench_e_plain")
e_fx = tether.Agent("bench_e_fx")


@e_plain.node(start=True)
async def e_plain_step(state: dict[str, Any], ctx: tether.Context) -> tether.Command:
    msg = f"{ctx.thread_id} step {ctx.step} ".ljust(W1_MSG_BYTES, ".")
    update = {"messages": tether.append([msg])}
    if ctx.step < E_OVERHEAD_STEPS:
        return tether.goto("e_plain_step", update)
    return tether.finish(update)


@e_fx.node(start=True)
async def e_fx_step(state: dict[str, Any], ctx: tether.Context) -> tether.Command:
    msg = f"{ctx.thread_id} step {ctx.step} ".ljust(W1_MSG_BYTES, ".")
    ctx.effect("noop", {"step": ctx.step})
    update = {"messages": tether.append([msg])}
    if ctx.step < E_OVERHEAD_STEPS:
        return tether.goto("e_fx_step", update)
    return tether.finish(update)


async def e_overhead(backend: str) -> list[Result]:
    """W1-style sequential runs (concurrency 1) in three variants, interleaved in rounds:
    `plain` (no effect), `effect` (one ctx.effect per step; the same worker's dispatcher
    performs them as they commit) and `effect_nodispatch` (one ctx.effect per step, on a
    second database whose worker does not dispatch): the commit path's own cost apart from
    the dispatcher's competing claims and done marks."""
    variants = ("plain", "effect", "effect_nodispatch")
    walls = dict.fromkeys(variants, 0.0)
    async with bench_db(backend) as url, bench_db(backend) as url_nd:
        runtime = tether.Runtime(url, agents=[e_plain, e_fx], version="bench")
        runtime.effect("noop")(noop_effect)
        runtime_nd = tether.Runtime(url_nd, agents=[e_fx], version="bench")
        await runtime.migrate()
        await runtime_nd.migrate()
        commits = timed_commits(runtime)
        commits_nd = timed_commits(runtime_nd)
        async with runtime, runtime_nd:
            stop = asyncio.Event()
            worker = asyncio.create_task(runtime.work(concurrency=1, stop=stop))
            worker_nd = await without_dispatch(runtime_nd, stop, 1, "noop")
            target = {"plain": (runtime, e_plain), "effect": (runtime, e_fx),
                      "effect_nodispatch": (runtime_nd, e_fx)}
            for kind in variants:  # warm-up: connections, statement caches
                rt, agent = target[kind]
                warm = await rt.start(agent, {"messages": []}, thread_id=f"warm-{kind}")
                await rt.wait(warm.thread_id, timeout=W1_RUN_DEADLINE)
            for rnd in range(E_OVERHEAD_ROUNDS):
                order = variants[rnd % 3:] + variants[:rnd % 3]
                for kind in order:
                    rt, agent = target[kind]
                    t0 = time.perf_counter()
                    for i in range(E_OVERHEAD_THREADS):
                        tid = f"{kind}-{rnd:02d}-{i:03d}"
                        await rt.start(agent, {"messages": []}, thread_id=tid)
                        run = await rt.wait(tid, timeout=W1_RUN_DEADLINE)
                        if run.status is not tether.RunStatus.COMPLETED:
                            raise RuntimeError(f"E overhead: run {tid} ended {run.status}: "
                                               f"{run.error}")
                    walls[kind] += time.perf_counter() - t0
            t_drain = time.perf_counter()
            expected = (E_OVERHEAD_ROUNDS * E_OVERHEAD_THREADS + 1) * E_OVERHEAD_STEPS
            while (await outbox_counts(url)).get("done", 0) < expected:
                if time.perf_counter() - t_drain > E_DEADLINE:
                    raise RuntimeError(f"E overhead: effects not all done: "
                                       f"{await outbox_counts(url)}")
                await asyncio.sleep(0.01)
            drain = time.perf_counter() - t_drain
            await stop_worker(stop, worker)
            await stop_worker(stop, worker_nd)
        nd = await outbox_counts(url_nd)
        if nd != {"pending": expected}:
            raise RuntimeError(f"E overhead: the non-dispatching worker's outbox is {nd}")
    checkpoints = E_OVERHEAD_ROUNDS * E_OVERHEAD_THREADS * E_OVERHEAD_STEPS
    commits.update(commits_nd)  # thread ids differ between the two
    lat = {k: [end - begin for tid, cs in commits.items() if tid.startswith(k + "-")
               for begin, end in cs] for k in variants}
    for k, xs in lat.items():
        if len(xs) != checkpoints:
            raise RuntimeError(f"E overhead: {len(xs)} {k} checkpoints, expected {checkpoints}")
    rate = {k: checkpoints / w for k, w in walls.items()}
    p50 = {k: percentile(xs, 0.5) * 1e3 for k, xs in lat.items()}
    out = [Result(backend, "E", f"checkpoints_per_s_{k}", round(rate[k], 1), "1/s")
           for k in variants]
    out += [Result(backend, "E", f"{k}_vs_plain", round(rate[k] / rate["plain"], 3), "x")
            for k in variants[1:]]
    out += [Result(backend, "E", f"commit_p50_ms_{k}", round(p50[k], 3), "ms") for k in variants]
    out += [Result(backend, "E", f"commit_p50_overhead_ms_{k}", round(p50[k] - p50["plain"], 3),
                   "ms") for k in variants[1:]]
    out.append(Result(backend, "E", "effects_drain_after_last_run_s", round(drain, 3), "s"))
    return out


async def e_workload(backend: str, effects: int) -> list[Result]:
    """Dispatch on a fresh outbox as a user gets it, dispatch again after ANALYZE (each with
    its own database), then the commit overhead. A dispatch that gives up does not stop the
    rest; the workload fails at the end with its message."""
    out: list[Result] = []
    errors: list[str] = []
    for analyze in (False, True):
        try:
            out += await e_dispatch(backend, effects, analyze)
        except PartialFailure as exc:
            out += exc.results
            errors.append(str(exc))
    out += await e_overhead(backend)
    out.append(Result(backend, "E", "peak_rss_mib", round(peak_rss_mib(), 1), "MiB"))
    if errors:
        raise PartialFailure("; ".join(errors), out)
    return out

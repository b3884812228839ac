/**
 * Every method of TetherClient against a real `tether serve --worker` (the demo's agents),
 * on SQLite and Postgres: runs, listing and paging, the long-poll wait, events with an
 * interrupt answered, a dropped stream resumed with Last-Event-ID, the error classes,
 * retries on 503, AbortSignal, deployments, workers and the audit log.
 */
import assert from "node:assert/strict";
import { after, before, describe, it } from "node:test";

import {
  ConnectionError, InvalidState, ResumeConflict, RunConflict, RunNotFound, TetherClient,
  TetherError, ValidationError, WaitTimeout, type RunEvent,
} from "../src/index.ts";
import { BACKENDS, Database, Procs } from "./harness.ts";

async function collect(iter: AsyncIterable<RunEvent>, stop?: (ev: RunEvent) => boolean,
                       ): Promise<RunEvent[]> {
  const out: RunEvent[] = [];
  for await (const ev of iter) {
    out.push(ev);
    if (stop?.(ev)) break;
  }
  return out;
}

/** A fetch whose event streams break (the connection drops) after `frames` frames. */
function droppingFetch(frames: number, drops: { count: number }): typeof fetch {
  return async (input, init) => {
    const res = await fetch(input, init);
    if (!String(input).endsWith("/events") || res.body === null || drops.count <= 0) return res;
    drops.count--;
    const reader = res.body.getReader();
    let seen = 0;
    const body = new ReadableStream<Uint8Array>({
      async pull(ctrl) {
        const { done, value } = await reader.read();
        if (done) return ctrl.close();
        ctrl.enqueue(value);
        seen += new TextDecoder().decode(value).split("\n\n").length - 1;
        if (seen >= frames) {
          await reader.cancel();
          ctrl.error(new TypeError("terminated: the connection dropped"));
        }
      },
    });
    return new Response(body, { status: res.status, headers: res.headers });
  };
}

for (const backend of BACKENDS) {
  describe(`TetherClient on ${backend}`, () => {
    const db = new Database(backend);
    const procs = new Procs(db);
    let tether: TetherClient;
    let baseUrl: string;

    before(async () => {
      baseUrl = await procs.serve({ worker: true });
      tether = new TetherClient({ baseUrl });
    });
    after(async () => {
      await procs.close();
      db.drop();
    });

    it("starts, gets, waits for and lists runs", async () => {
      const run = await tether.start("research", { topic: "ts", parts: 2 },
                                     { threadId: `r-${backend}` });
      assert.equal(run.thread_id, `r-${backend}`);
      assert.ok(["queued", "running"].includes(run.status));
      const again = await tether.start("research", { topic: "ts", parts: 2 },
                                       { threadId: `r-${backend}` });
      assert.equal(again.created_at, run.created_at); // the same run
      const done = await tether.wait(run.thread_id, { timeoutMs: 30_000 });
      assert.equal(done.status, "completed");
      assert.deepEqual((done.state.notes as string[]).length, 2);
      assert.equal((await tether.get(run.thread_id)).status, "completed");

      const keyed = await tether.start("research", { topic: "k", parts: 1 },
                                       { idempotencyKey: `key-${backend}` });
      const same = await tether.start("research", { topic: "k", parts: 1 },
                                      { idempotencyKey: `key-${backend}` });
      assert.equal(same.thread_id, keyed.thread_id);
      await tether.wait(keyed.thread_id);

      const version = done.version;
      const page = await tether.list({ agent: "research", version, limit: 1 });
      assert.equal(page.runs.length, 1);
      assert.ok(page.next_cursor);
      const second = await tether.list({ agent: "research", limit: 1, cursor: page.next_cursor });
      assert.notEqual(second.runs[0]?.thread_id, page.runs[0]?.thread_id);
      const all = [];
      for await (const r of tether.listAll({ agent: "research", limit: 1 })) all.push(r.thread_id);
      assert.deepEqual(new Set(all), new Set([run.thread_id, keyed.thread_id]));
      assert.equal(all.length, 2);
      assert.deepEqual((await tether.list({ version: "nope" })).runs, []);
      assert.equal((await tether.list({ status: "completed" })).runs.length >= 2, true);
    });

    it("streams a run's events, answers its interrupt and gets the result", async () => {
      const run = await tether.start("approval", { customer: "ada" });
      const seen: RunEvent[] = [];
      for await (const ev of tether.events(run.thread_id)) {
        seen.push(ev);
        if (ev.type === "interrupted") {
          assert.deepEqual(Object.keys(ev.payload as object).sort(), ["draft", "question"]);
          const pending = await tether.interrupts({ threadId: run.thread_id });
          assert.deepEqual(pending.map((i) => i.id), [ev.interrupt_id]);
          const answered = await tether.resume(run.thread_id, true);
          assert.equal(answered.status, "resolved");
          const twice = { interruptId: ev.interrupt_id };
          await assert.rejects(tether.resume(run.thread_id, false, twice), ResumeConflict);
          await assert.rejects(tether.resume(run.thread_id, false, twice), RunConflict);
        }
      }
      const types = seen.map((e) => e.type);
      assert.equal(types[0], "status");
      assert.equal(types.at(-1), "completed");
      assert.ok(types.indexOf("interrupted") < types.indexOf("resumed"), types.join());
      assert.ok(seen.every((e) => typeof e.id === "string" && e.id.length > 0));
      const step = seen.find((e) => e.type === "step");
      assert.equal(step?.type === "step" && step.node, "draft");
      const result = await tether.get(run.thread_id);
      assert.equal(result.state.approved, true);
      assert.deepEqual(await tether.interrupts({ threadId: run.thread_id }), []);
      const all = await tether.interrupts({ threadId: run.thread_id, status: "all" });
      assert.equal(all[0]?.value, true);
    });

    it("resumes a dropped stream after Last-Event-ID, nothing repeated or lost", async () => {
      const drops = { count: 2 };
      const flaky = new TetherClient({ baseUrl, fetch: droppingFetch(2, drops),
                                       retryDelayMs: 20 });
      const run = await flaky.start("research", { topic: "drop", parts: 5 });
      const seen = await collect(flaky.events(run.thread_id));
      assert.equal(drops.count, 0); // both drops happened
      assert.deepEqual(seen.filter((e) => e.type === "status").length, 1);
      const from = Number(seen[0]?.step ?? 0); // where the run was when the stream began
      assert.deepEqual(seen.filter((e) => e.type === "step").map((e) => e.step),
                       [1, 2, 3, 4, 5].filter((n) => n > from));
      assert.equal(seen.at(-1)?.type, "completed");
      const ids = seen.map((e) => e.id);
      assert.equal(new Set(ids).size, ids.length);
      // A new stream given the id of an event continues after it.
      const third = seen[2];
      assert.ok(third?.id);
      const rest = await collect(tether.events(run.thread_id, { lastEventId: third.id }));
      const after = seen.slice(3);
      assert.deepEqual(rest.map((e) => [e.type, e.step]), after.map((e) => [e.type, e.step]));
    });

    it("waits with until, times out, and aborts", async () => {
      const run = await tether.start("approval", { customer: "bob" });
      const waiting = await tether.wait(run.thread_id, { until: "waiting", timeoutMs: 30_000 });
      assert.equal(waiting.status, "waiting");
      const t0 = Date.now();
      const err = await tether.wait(run.thread_id, { timeoutMs: 300 }).catch((e: unknown) => e);
      assert.ok(err instanceof WaitTimeout, String(err));
      assert.equal((err.run as { status: string }).status, "waiting");
      assert.ok(Date.now() - t0 < 5_000);
      const ctrl = new AbortController();
      setTimeout(() => ctrl.abort(new Error("enough")), 200);
      await assert.rejects(tether.wait(run.thread_id, { signal: ctrl.signal }), /enough/);
      const ctrl2 = new AbortController();
      const events = collect(tether.events(run.thread_id, { signal: ctrl2.signal }), (ev) => {
        if (ev.type === "interrupted") ctrl2.abort(new Error("stop following"));
        return false;
      });
      await assert.rejects(events, /stop following/);
      await assert.rejects(tether.get(run.thread_id, { signal: AbortSignal.abort() }));
      const cancelled = await tether.cancel(run.thread_id);
      assert.equal(cancelled.status, "cancelled");
      assert.equal((await tether.cancel(run.thread_id)).status, "cancelled");
      const evs = await collect(tether.events(run.thread_id));
      assert.deepEqual(evs.map((e) => e.type), ["status", "cancelled"]);
    });

    it("throws the error classes of the API's error.type", async () => {
      const missing = await tether.get("no-such-run").catch((e: unknown) => e);
      assert.ok(missing instanceof RunNotFound && missing instanceof TetherError);
      assert.equal(missing.status, 404);
      assert.equal(missing.type, "RunNotFound");
      assert.match(missing.message, /no-such-run/);
      await assert.rejects(collect(tether.events("no-such-run")), RunNotFound);
      const bad = await tether.list({ limit: 0 }).catch((e: unknown) => e);
      assert.ok(bad instanceof ValidationError);
      assert.equal(bad.status, 422);
      assert.ok(bad.details && bad.details.length > 0);
      await assert.rejects(tether.start("no-such-agent", {}), (e: unknown) =>
        e instanceof TetherError && e.status === 422 && e.type === "DefinitionError");
      const done = await tether.start("research", { topic: "x", parts: 1 }, { threadId: `c-${backend}` });
      await assert.rejects(tether.start("research", { topic: "other", parts: 1 },
                                        { threadId: done.thread_id }), RunConflict);
      await tether.wait(done.thread_id);
      await assert.rejects(tether.retry(done.thread_id), InvalidState);
      await assert.rejects(tether.send(done.thread_id, "late"), InvalidState);
      await assert.rejects(tether.list({ cursor: "bogus" }), (e: unknown) =>
        e instanceof TetherError && e.type === "InvalidCursor" && e.status === 400);
      await assert.rejects(collect(tether.events(done.thread_id, { lastEventId: "bogus" })),
                           (e: unknown) => e instanceof TetherError && e.type === "InvalidEventId");
      const nowhere = new TetherClient({ baseUrl: "http://127.0.0.1:9", retries: 2,
                                         retryDelayMs: 1 });
      await assert.rejects(nowhere.get("x"), ConnectionError);
    });

    it("retries idempotent calls on 503, not the others", async () => {
      let fails = 0;
      let calls = 0;
      const flaky: typeof fetch = async (input, init) => {
        calls++;
        if (fails > 0) {
          fails--;
          return new Response(JSON.stringify({ error: { type: "StoreError", message: "db" } }),
                              { status: 503, headers: { "Content-Type": "application/json" } });
        }
        return fetch(input, init);
      };
      const client = new TetherClient({ baseUrl, fetch: flaky, retryDelayMs: 5 });
      fails = 2;
      assert.ok(Array.isArray(await client.workers()));
      assert.equal(calls, 3);
      fails = 1;
      calls = 0;
      const err = await client.start("research", { topic: "y", parts: 1 }).catch((e) => e);
      assert.ok(err instanceof TetherError && err.status === 503 && err.type === "StoreError");
      assert.equal(calls, 1); // no thread_id nor key: a retry could start a second run
      fails = 1;
      calls = 0;
      const run = await client.start("research", { topic: "y", parts: 1 },
                                     { idempotencyKey: `retry-${backend}` });
      assert.equal(calls, 2);
      await client.wait(run.thread_id);
      fails = 10;
      await assert.rejects(client.get(run.thread_id), (e: unknown) =>
        e instanceof TetherError && e.status === 503);
    });

    it("retries, forks, sends and reads checkpoints", async () => {
      const failing = await tether.start("research", { parts: 1 }); // no topic: KeyError
      const failed = await tether.wait(failing.thread_id, { timeoutMs: 60_000 });
      assert.equal(failed.status, "failed");
      assert.equal(failed.error?.type, "KeyError");
      const again = await tether.retry(failing.thread_id);
      assert.equal(again.thread_id, failing.thread_id);
      assert.equal(again.status, "queued");
      await tether.cancel(failing.thread_id);

      const run = await tether.start("research", { topic: "f", parts: 3 });
      await tether.wait(run.thread_id);
      const cps = await tether.checkpoints(run.thread_id);
      assert.deepEqual(cps.map((c) => c.step), [1, 2, 3]);
      assert.deepEqual(cps.map((c) => c.node), ["study", "study", "study"]);
      assert.equal((await tether.checkpoints(run.thread_id, { state: false }))[0]?.state, null);
      const fork = await tether.fork(run.thread_id, 1, { threadId: `fork-${backend}` });
      assert.equal(fork.thread_id, `fork-${backend}`);
      assert.equal(fork.forked_from, run.thread_id);
      assert.equal((await tether.wait(fork.thread_id)).status, "completed");

      const actor = await tether.start("answerer", {});
      await tether.wait(actor.thread_id, { until: "waiting" });
      const msg = await tether.send(actor.thread_id, "hello", { sender: "ts" });
      assert.equal(msg.message, "hello");
      assert.equal(msg.sender, "ts");
      await until(async () => (await tether.get(actor.thread_id)).state.answered === 1);
      await tether.cancel(actor.thread_id);
    });

    it("reads deployments and workers, routes, drains, retires, pages the audit log",
       async () => {
         const workers = await tether.workers();
         assert.equal(workers.length, 1);
         assert.equal(workers[0]?.alive, true);
         const version = workers[0]?.version ?? "";
         const deps = await tether.deployments();
         assert.deepEqual(deps.map((d) => d.version), [version]);
         const routed = await tether.route({ [version]: 100 });
         assert.equal(routed[0]?.weight, 100);
         await assert.rejects(tether.route({ [version]: -1 }), ValidationError);
         await assert.rejects(tether.retire(version), InvalidState); // it has weight
         await assert.rejects(tether.drain("never-seen"), (e: unknown) =>
           e instanceof TetherError && e.status === 422);
         const page = await tether.audit({ limit: 2 });
         assert.equal(page.events.length, 2);
         assert.ok(page.next_cursor);
         const next = await tether.audit({ limit: 2, cursor: page.next_cursor });
         assert.ok(next.events[0] && page.events[1] && next.events[0].id < page.events[1].id);
         const routes = await tether.audit({ action: "route" });
         assert.equal(routes.events.length, 1);
         assert.equal(routes.next_cursor, null);
         assert.equal(routes.events[0]?.actor, "anonymous");
         const health = await tether.health();
         assert.equal(health.status, "ok");
       });

  });
}

async function until(check: () => Promise<boolean>, timeoutMs = 30_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!(await check())) {
    if (Date.now() > deadline) throw new Error("timed out");
    await new Promise((ok) => setTimeout(ok, 50));
  }
}

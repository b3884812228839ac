/** A `tether serve` with a bearer token: the client sends it on every call and stream; a
 * missing or wrong one is Unauthorized (401), /healthz answers without it. */
import assert from "node:assert/strict";
import { after, before, describe, it } from "node:test";

import { TetherClient, Unauthorized, type RunEvent } from "../src/index.ts";
import { BACKENDS, Database, Procs } from "./harness.ts";

const TOKEN = "s3cret-token-for-the-ts-tests";

for (const backend of BACKENDS) {
  describe(`token auth on ${backend}`, () => {
    const db = new Database(backend);
    const procs = new Procs(db);
    let baseUrl: string;

    before(async () => {
      baseUrl = await procs.serve({ worker: true, token: TOKEN });
    });
    after(async () => {
      await procs.close();
      db.drop();
    });

    it("refuses calls without the token or with a wrong one", async () => {
      for (const token of [undefined, "wrong"]) {
        const client = new TetherClient({ baseUrl, token });
        const err = await client.list().catch((e: unknown) => e);
        assert.ok(err instanceof Unauthorized, String(err));
        assert.equal(err.status, 401);
        await assert.rejects(client.start("research", { topic: "t", parts: 1 }), Unauthorized);
        await assert.rejects(async () => {
          for await (const _ of client.events("any")) break;
        }, Unauthorized);
        if (token === undefined) {
          assert.deepEqual(await client.health(), { status: "ok" }); // no details without it
        }
      }
    });

    it("runs, streams and audits with the token", async () => {
      const tether = new TetherClient({ baseUrl, token: TOKEN });
      const run = await tether.start("approval", { customer: "eve" });
      const types: string[] = [];
      for await (const ev of tether.events(run.thread_id) as AsyncIterable<RunEvent>) {
        types.push(ev.type);
        if (ev.type === "interrupted") await tether.resume(run.thread_id, "yes");
      }
      assert.equal(types.at(-1), "completed");
      assert.equal((await tether.get(run.thread_id)).state.approved, "yes");
      const health = await tether.health();
      assert.equal(health.status, "ok");
      assert.equal(health.worker, true);
      const audit = await tether.audit({ threadId: run.thread_id });
      assert.deepEqual(audit.events.map((e) => [e.action, e.actor]),
                       [["resume", "token"], ["start", "token"]]);
    });
  });
}

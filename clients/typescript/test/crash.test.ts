/** The kill-and-continue scenario: `tether serve` without a worker and two `tether worker`
 * processes; the worker holding a streamed run is SIGKILLed mid-run, the other takes it over
 * once the lease expires, and the client's event stream goes on to the end: every step
 * once, in order, and the run completes. */
import assert from "node:assert/strict";
import { after, before, describe, it } from "node:test";

import { TetherClient, type RunEvent } from "../src/index.ts";
import { BACKENDS, Database, Procs, type Proc } from "./harness.ts";

for (const backend of BACKENDS) {
  describe(`a worker SIGKILLed mid-run on ${backend}`, () => {
    const db = new Database(backend);
    const procs = new Procs(db);
    let tether: TetherClient;
    let workers: Proc[];

    before(async () => {
      tether = new TetherClient({ baseUrl: await procs.serve() });
      workers = [await procs.worker(), await procs.worker()];
    });
    after(async () => {
      await procs.close();
      db.drop();
    });

    it("streams on while another worker takes the run over", async () => {
      const run = await tether.start("research", { topic: "crash", parts: 8 });
      const seen: RunEvent[] = [];
      let killed: Proc | undefined;
      for await (const ev of tether.events(run.thread_id)) {
        seen.push(ev);
        if (ev.type === "step" && ev.step >= 2 && killed === undefined) {
          const owner = (await tether.get(run.thread_id)).lease_owner ?? "";
          const pid = Number(owner.split(":").at(-2));
          killed = workers.find((w) => w.pid === pid);
          assert.ok(killed, `the lease owner ${owner} is one of our workers`);
          process.kill(pid, "SIGKILL");
        }
      }
      assert.ok(killed && !killed.alive());
      const from = Number(seen[0]?.step ?? 0); // where the run was when the stream began
      const steps = seen.filter((e) => e.type === "step").map((e) => e.step);
      assert.deepEqual(steps, [1, 2, 3, 4, 5, 6, 7, 8].filter((n) => n > from));
      assert.equal(seen.at(-1)?.type, "completed");
      const done = await tether.get(run.thread_id);
      assert.equal(done.status, "completed");
      assert.equal((done.state.notes as string[]).length, 8);
      const survivor = workers.find((w) => w !== killed);
      assert.ok(survivor?.alive());
      const owners = new Set((await tether.checkpoints(run.thread_id, { state: false }))
        .map((c) => c.worker));
      assert.equal(owners.size, 2, "steps before and after the kill ran on two workers");
    });
  });
}

/** examples/typescript/main.ts, as docs/typescript.md runs it, against real servers: the
 * research and approval runs, and the crash variant with two workers, one SIGKILLed. */
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { fileURLToPath } from "node:url";
import { after, describe, it } from "node:test";
import { promisify } from "node:util";

import { Database, Procs } from "./harness.ts";

const MAIN = fileURLToPath(new URL("../../../examples/typescript/main.ts", import.meta.url));
const run = promisify(execFile);

async function example(baseUrl: string, ...args: string[]): Promise<string> {
  const { stdout } = await run(process.execPath, ["--import", "tsx", MAIN, ...args], {
    env: { ...process.env, TETHER_URL: baseUrl }, timeout: 120_000,
    cwd: fileURLToPath(new URL("..", import.meta.url)),
  });
  return stdout;
}

describe("examples/typescript/main.ts", () => {
  const dbs: Database[] = [];
  const all: Procs[] = [];
  after(async () => {
    for (const p of all) await p.close();
    for (const d of dbs) d.drop();
  });

  it("streams a research run and answers an approval's interrupt", async () => {
    const db = new Database("sqlite");
    const procs = new Procs(db);
    dbs.push(db);
    all.push(procs);
    const out = await example(await procs.serve({ worker: true }));
    assert.match(out, /step 3: study done\n/);
    assert.match(out, /result: completed, notes \["notes on durable execution part 1"/);
    assert.match(out, /draft asks \{"question":"send this draft\?"/);
    assert.match(out, /result: completed, approved=true/);
  });

  it("survives the worker SIGKILLed mid-run (--crash)", async () => {
    const db = new Database("sqlite");
    const procs = new Procs(db);
    dbs.push(db);
    all.push(procs);
    const baseUrl = await procs.serve();
    await procs.worker();
    await procs.worker();
    const out = await example(baseUrl, "--crash");
    assert.match(out, /SIGKILL worker/);
    assert.match(out, /step 8: study done\n/);
    assert.match(out, /result: completed, 8 notes, steps ran on 2 workers/);
  });
});

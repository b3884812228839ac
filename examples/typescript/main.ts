/**
 * A TypeScript program in front of Python agents: start durable runs on a `tether serve`,
 * print their steps as they stream in, answer an interrupt, print the results.
 *
 *   tether migrate --db sqlite:///demo.db
 *   tether serve --app tether.demo.app:runtime --db sqlite:///demo.db --worker &
 *   npx --prefix clients/typescript tsx examples/typescript/main.ts
 *
 * The crash variant survives a SIGKILLed worker: run the server without --worker and two
 * workers on this machine, and the program kills the one holding its run mid-run; the other
 * takes it over when the lease expires, and the stream goes on:
 *
 *   tether serve --app tether.demo.app:runtime --db sqlite:///demo.db &
 *   tether worker --app tether.demo.app:runtime --db sqlite:///demo.db --lease-ttl 2 &
 *   tether worker --app tether.demo.app:runtime --db sqlite:///demo.db --lease-ttl 2 &
 *   npx --prefix clients/typescript tsx examples/typescript/main.ts --crash
 *
 * Run from the checkout's root, after `npm ci` in clients/typescript (which installs tsx).
 * TETHER_URL (default http://127.0.0.1:8000) and TETHER_TOKEN say where and how to connect.
 * In your own project: `npm install ./clients/typescript` and import from "@tether/client".
 */
import { TetherClient, type RunEvent } from "../../clients/typescript/src/index.ts";

const tether = new TetherClient({
  baseUrl: process.env.TETHER_URL ?? "http://127.0.0.1:8000",
  token: process.env.TETHER_TOKEN,
});

function show(ev: RunEvent): void {
  switch (ev.type) {
    case "status":
      console.log(`  [${ev.thread_id.slice(0, 8)}] ${ev.status} at step ${ev.step}`);
      break;
    case "step":
      console.log(`  step ${ev.step}: ${ev.node} done${ev.next_node ? `, next ${ev.next_node}` : ""}`);
      break;
    case "interrupted":
      console.log(`  step ${ev.step}: ${ev.node} asks ${JSON.stringify(ev.payload)}`);
      break;
    default:
      console.log(`  ${ev.type}`);
  }
}

/** A research run: several steps, each a (simulated) LLM call, streamed as they commit. */
async function research(): Promise<void> {
  console.log("research run:");
  const run = await tether.start("research", { topic: "durable execution", parts: 3 });
  for await (const ev of tether.events(run.thread_id)) show(ev);
  const done = await tether.get(run.thread_id);
  console.log(`  result: ${done.status}, notes ${JSON.stringify(done.state.notes)}`);
}

/** A run that asks a person: the interrupt arrives on the stream, the answer resumes it. */
async function approval(): Promise<void> {
  console.log("approval run:");
  const run = await tether.start("approval", { customer: "ada" });
  for await (const ev of tether.events(run.thread_id)) {
    show(ev);
    if (ev.type === "interrupted") {
      console.log("  answering: approved");
      await tether.resume(run.thread_id, true);
    }
  }
  const done = await tether.wait(run.thread_id);
  console.log(`  result: ${done.status}, approved=${JSON.stringify(done.state.approved)}`);
}

/** A long research run whose worker is SIGKILLed at step 3: the stream continues. */
async function crash(): Promise<void> {
  console.log("research run, its worker killed mid-run:");
  const run = await tether.start("research", { topic: "crash safety", parts: 8 });
  let killed = false;
  for await (const ev of tether.events(run.thread_id)) {
    show(ev);
    if (ev.type === "step" && ev.step >= 3 && !killed) {
      // A worker's id is host:pid:suffix; this works when the workers run on this machine.
      const owner = (await tether.get(run.thread_id)).lease_owner ?? "";
      const pid = Number(owner.split(":").at(-2));
      console.log(`  SIGKILL worker ${owner} (pid ${pid})`);
      process.kill(pid, "SIGKILL");
      killed = true;
    }
  }
  const done = await tether.get(run.thread_id);
  const workers = new Set((await tether.checkpoints(run.thread_id, { state: false }))
    .map((cp) => cp.worker));
  console.log(`  result: ${done.status}, ${(done.state.notes as unknown[]).length} notes, ` +
              `steps ran on ${workers.size} workers`);
}

if (process.argv.includes("--crash")) {
  await crash();
} else {
  await research();
  await approval();
}

/**
 * Real `tether serve` and `tether worker` processes for the tests, on the demo's agents
 * (tether.demo.app:runtime), on a fresh SQLite file or a fresh Postgres database each.
 *
 * TETHER_BIN: the tether command (default: ../../.venv/bin/tether, else `tether`);
 * TETHER_TEST_PG: the Postgres server (default postgresql://postgres@127.0.0.1:5432/postgres);
 * TETHER_TS_BACKENDS: which stores to test, comma-separated (default sqlite,postgres).
 */
import { spawn, spawnSync, type ChildProcess } from "node:child_process";
import { existsSync, mkdtempSync, openSync, readFileSync, rmSync, closeSync } from "node:fs";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";

const ROOT = resolve(dirname(fileURLToPath(import.meta.url)), "../../..");
export const TETHER = process.env.TETHER_BIN
  ?? (existsSync(join(ROOT, ".venv/bin/tether")) ? join(ROOT, ".venv/bin/tether") : "tether");
const PG = process.env.TETHER_TEST_PG ?? "postgresql://postgres@127.0.0.1:5432/postgres";
export const BACKENDS = (process.env.TETHER_TS_BACKENDS ?? "sqlite,postgres")
  .split(",").map((b) => b.trim()).filter((b) => b === "sqlite" || b === "postgres");
export const APP = "tether.demo.app:runtime";

function env(extra: Record<string, string> = {}): NodeJS.ProcessEnv {
  const path = [join(ROOT, "src"), process.env.PYTHONPATH].filter(Boolean).join(":");
  const out: NodeJS.ProcessEnv = { ...process.env, PYTHONPATH: path, DEMO_LEASE_TTL: "1.5",
                                   ...extra };
  delete out.TETHER_TOKEN;
  delete out.TETHER_DB;
  return { ...out, ...extra };
}

function python(): string {
  const sibling = join(dirname(TETHER), "python");
  return existsSync(sibling) ? sibling : "python3";
}

export async function freePort(): Promise<number> {
  return new Promise((ok, fail) => {
    const srv = createServer();
    srv.once("error", fail);
    srv.listen(0, "127.0.0.1", () => {
      const addr = srv.address();
      srv.close(() => (typeof addr === "object" && addr ? ok(addr.port) : fail(new Error())));
    });
  });
}

/** A fresh, migrated database: SQLite in a temporary directory, or a new Postgres one. */
export class Database {
  readonly url: string;
  readonly dir: string;
  private readonly pgName: string | undefined;

  constructor(readonly backend: string) {
    this.dir = mkdtempSync(join(tmpdir(), "tether-ts-"));
    if (backend === "postgres") {
      this.pgName = `tether_ts_${process.pid}_${Math.random().toString(36).slice(2, 10)}`;
      this.admin(`CREATE DATABASE ${this.pgName}`);
      const u = new URL(PG);
      u.pathname = `/${this.pgName}`;
      this.url = u.toString();
    } else {
      this.url = `sqlite:///${join(this.dir, "tether.db")}`;
    }
    const r = spawnSync(TETHER, ["migrate", "--db", this.url], { env: env(), encoding: "utf8" });
    if (r.status !== 0) throw new Error(`tether migrate failed: ${r.stdout}${r.stderr}`);
  }

  private admin(sql: string): void {
    const code = "import sys, psycopg\n"
      + "with psycopg.connect(sys.argv[1], autocommit=True) as c: c.execute(sys.argv[2])";
    const r = spawnSync(python(), ["-c", code, PG, sql], { env: env(), encoding: "utf8" });
    if (r.status !== 0) throw new Error(`${sql}: ${r.stderr}`);
  }

  drop(): void {
    if (this.pgName !== undefined) {
      this.admin(`DROP DATABASE IF EXISTS ${this.pgName} WITH (FORCE)`);
    }
    rmSync(this.dir, { recursive: true, force: true });
  }
}

/** A tether process; its output goes to a file in the database's directory. */
export class Proc {
  constructor(readonly child: ChildProcess, readonly log: string) {}

  get pid(): number {
    return this.child.pid ?? -1;
  }

  alive(): boolean {
    return this.child.exitCode === null && this.child.signalCode === null;
  }

  output(): string {
    return existsSync(this.log) ? readFileSync(this.log, "utf8") : "";
  }

  async stop(): Promise<void> {
    if (!this.alive()) return;
    const exited = new Promise<void>((ok) => this.child.once("exit", () => ok()));
    this.child.kill("SIGTERM");
    const timer = setTimeout(() => this.child.kill("SIGKILL"), 15_000);
    await exited;
    clearTimeout(timer);
  }
}

export class Procs {
  private readonly procs: Proc[] = [];
  constructor(readonly db: Database) {}

  private spawn(name: string, args: string[], extra: Record<string, string>): Proc {
    const log = join(this.db.dir, `${name}-${this.procs.length}.log`);
    const fd = openSync(log, "w");
    const child = spawn(TETHER, args, { env: env(extra), stdio: ["ignore", fd, fd] });
    closeSync(fd);
    const proc = new Proc(child, log);
    this.procs.push(proc);
    return proc;
  }

  /** `tether serve` on a free port, once it answers /healthz; its base URL. */
  async serve(options: { worker?: boolean; token?: string } = {}): Promise<string> {
    const port = await freePort();
    const args = ["serve", "--app", APP, "--db", this.db.url, "--port", String(port)];
    if (options.worker) args.push("--worker", "--concurrency", "10", "--lease-ttl", "1.5");
    const proc = this.spawn("serve", args, options.token ? { TETHER_TOKEN: options.token } : {});
    const base = `http://127.0.0.1:${port}`;
    await until(async () => {
      if (!proc.alive()) throw new Error(`tether serve exited:\n${proc.output()}`);
      try {
        return (await fetch(`${base}/healthz`)).status === 200;
      } catch {
        return false;
      }
    }, 30_000, "tether serve to answer /healthz");
    return base;
  }

  /** A `tether worker` process, once it has started. */
  async worker(): Promise<Proc> {
    const proc = this.spawn("worker", ["worker", "--app", APP, "--db", this.db.url,
                                       "--concurrency", "10", "--lease-ttl", "1.5"], {});
    await until(() => {
      if (!proc.alive()) throw new Error(`tether worker exited:\n${proc.output()}`);
      return proc.output().includes("tether worker:");
    }, 30_000, "tether worker to start");
    return proc;
  }

  async close(): Promise<void> {
    for (const p of this.procs.reverse()) await p.stop();
    this.procs.length = 0;
  }
}

export async function until(check: () => boolean | Promise<boolean>, timeoutMs: number,
                            what: string): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!(await check())) {
    if (Date.now() > deadline) throw new Error(`timed out after ${timeoutMs} ms: ${what}`);
    await new Promise((ok) => setTimeout(ok, 50));
  }
}

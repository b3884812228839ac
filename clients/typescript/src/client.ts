/**
 * `TetherClient`: start, watch and answer durable runs of a `tether serve` over HTTP, from
 * Node (>= 18) or a browser. fetch-based; no runtime dependency.
 */
import { ConnectionError, WaitTimeout, errorFrom } from "./errors.js";
import { readSse } from "./sse.js";
import {
  TERMINAL,
  type AuditPage, type Checkpoint, type Deployment, type Health, type Interrupt, type Json,
  type Message, type Run, type RunEvent, type RunPage, type RunStatus, type RunSummary,
  type Worker,
} from "./types.js";

export interface TetherClientOptions {
  /** Where `tether serve` answers, e.g. "http://127.0.0.1:8000". */
  baseUrl: string;
  /** The server's bearer token (TETHER_TOKEN), if it has one. */
  token?: string;
  /** A fetch to use instead of the global one (a test double, a proxy agent, ...). */
  fetch?: typeof fetch;
  /** Attempts of an idempotent call on 502/503/504 or a connection error (default 4). */
  retries?: number;
  /** The first retry's delay in ms, doubled each time up to 2 s, with jitter (default 200). */
  retryDelayMs?: number;
  /** Sent as X-Tether-Client (the server refuses writes without a JSON body from an
   * unnamed client: that is how it tells a program from another site's form). */
  clientName?: string;
}

/** Every call takes `signal` to abort it. */
export interface CallOptions {
  signal?: AbortSignal;
}

export interface StartOptions extends CallOptions {
  /** The run's id (default: a new uuid); the same threadId and input return the same run. */
  threadId?: string;
  /** The same key returns the same run instead of starting another. */
  idempotencyKey?: string;
  /** The code version to run it on (default: the deployment weights' choice). */
  version?: string;
}

export interface ListOptions extends CallOptions {
  status?: RunStatus;
  agent?: string;
  version?: string;
  /** Runs per page, 1..1000 (default 50). */
  limit?: number;
  /** `next_cursor` of the previous page. */
  cursor?: string;
}

export interface WaitOptions extends CallOptions {
  /** Also return as soon as the run is in one of these statuses (e.g. "waiting"). */
  until?: RunStatus | readonly RunStatus[];
  /** Give up after this many ms with WaitTimeout (default: wait for ever). */
  timeoutMs?: number;
}

export interface EventsOptions extends CallOptions {
  /** Continue after this event (its `id`) instead of from the run's current status. */
  lastEventId?: string;
  /** Reconnect attempts in a row before giving up with ConnectionError (default 8). */
  reconnects?: number;
}

export interface InterruptsOptions extends CallOptions {
  threadId?: string;
  /** pending (default), resolved or all. */
  status?: "pending" | "resolved" | "all";
  limit?: number;
}

export interface AuditOptions extends CallOptions {
  threadId?: string;
  /** One action: start, resume, cancel, fork, send, retry, route, drain, retire, ... */
  action?: string;
  limit?: number;
  /** `next_cursor` of the previous page. */
  cursor?: string;
}

type Query = Record<string, string | number | boolean | readonly string[] | undefined>;

interface Request {
  method: "GET" | "POST" | "PUT";
  path: string;
  query?: Query;
  body?: unknown;
  headers?: Record<string, string>;
  /** Safe to send again after a 502/503/504 or a lost connection. */
  idempotent: boolean;
  signal: AbortSignal | undefined;
}

const RETRY_STATUSES = new Set([502, 503, 504]);
/** The longest long-poll the server takes (seconds); wait() chains them. */
const LONG_POLL_S = 30;
const LONG_POLL_MARGIN_MS = 15_000;

function sleep(ms: number, signal: AbortSignal | undefined): Promise<void> {
  return new Promise((resolve, reject) => {
    if (signal?.aborted) {
      reject(signal.reason);
      return;
    }
    const onAbort = (): void => {
      clearTimeout(timer);
      reject(signal?.reason);
    };
    const timer = setTimeout(() => {
      signal?.removeEventListener("abort", onAbort);
      resolve();
    }, ms);
    signal?.addEventListener("abort", onAbort, { once: true });
  });
}

/** A signal aborted when `outer` is (AbortSignal.any is not in Node 18). */
function linked(outer: AbortSignal | undefined): { ctrl: AbortController; done: () => void } {
  const ctrl = new AbortController();
  if (outer === undefined) return { ctrl, done: () => undefined };
  const onAbort = (): void => ctrl.abort(outer.reason);
  if (outer.aborted) onAbort();
  else outer.addEventListener("abort", onAbort, { once: true });
  return { ctrl, done: () => outer.removeEventListener("abort", onAbort) };
}

const seg = encodeURIComponent;

export class TetherClient {
  readonly baseUrl: string;
  private readonly token: string | undefined;
  private readonly fetchImpl: typeof fetch;
  private readonly retries: number;
  private readonly retryDelayMs: number;
  private readonly clientName: string;

  constructor(options: TetherClientOptions) {
    if (!options || typeof options.baseUrl !== "string" || options.baseUrl === "") {
      throw new TypeError("TetherClient needs { baseUrl }, e.g. http://127.0.0.1:8000");
    }
    this.baseUrl = options.baseUrl.replace(/\/+$/, "");
    this.token = options.token;
    // The global fetch is looked up per call, and called unbound from globalThis (a
    // browser's fetch throws when called on another `this`).
    this.fetchImpl = options.fetch ?? ((input, init) => globalThis.fetch(input, init));
    this.retries = Math.max(1, options.retries ?? 4);
    this.retryDelayMs = options.retryDelayMs ?? 200;
    this.clientName = options.clientName ?? "@tether/client";
  }

  // -- runs -------------------------------------------------------------------------------

  /** Start a run of `agent` with `input` as its initial state (a worker picks it up). With
   * a `threadId` or `idempotencyKey` the call is retried on 502/503/504: the same request
   * returns the same run. */
  start(agent: string, input: Record<string, Json | unknown> = {},
        options: StartOptions = {}): Promise<Run> {
    const headers: Record<string, string> = {};
    if (options.idempotencyKey !== undefined) headers["Idempotency-Key"] = options.idempotencyKey;
    return this.call<Run>({
      method: "POST", path: "/runs", headers, signal: options.signal,
      body: { agent, input, thread_id: options.threadId, version: options.version },
      idempotent: options.threadId !== undefined || options.idempotencyKey !== undefined,
    });
  }

  /** One run with its current state. */
  get(threadId: string, options: CallOptions = {}): Promise<Run> {
    return this.call<Run>({ method: "GET", path: `/runs/${seg(threadId)}`, idempotent: true,
                            signal: options.signal });
  }

  /** One page of runs, newest first, without their state. */
  list(options: ListOptions = {}): Promise<RunPage> {
    return this.call<RunPage>({
      method: "GET", path: "/runs", idempotent: true, signal: options.signal,
      query: { status: options.status, agent: options.agent, version: options.version,
               limit: options.limit, cursor: options.cursor },
    });
  }

  /** Every run that `list(options)` selects, page after page (`limit` per page), as an
   * async iterator: `for await (const run of client.listAll({ status: "waiting" }))`. */
  async *listAll(options: Omit<ListOptions, "cursor"> = {}): AsyncGenerator<RunSummary> {
    let cursor: string | undefined;
    do {
      const page = await this.list({ ...options, cursor });
      yield* page.runs;
      cursor = page.next_cursor ?? undefined;
    } while (cursor !== undefined);
  }

  /** Wait until the run is completed, failed or cancelled (or, with `until`, in one of those
   * statuses) and return it; a chain of long-polls (GET /runs/{id}?wait=S), no busy loop.
   * Throws WaitTimeout after `timeoutMs`. */
  async wait(threadId: string, options: WaitOptions = {}): Promise<Run> {
    const until = options.until === undefined ? []
      : typeof options.until === "string" ? [options.until] : [...options.until];
    const deadline = options.timeoutMs === undefined ? Infinity : Date.now() + options.timeoutMs;
    for (;;) {
      const left = (deadline - Date.now()) / 1000;
      const wait = Math.min(LONG_POLL_S, Math.max(0.001, left));
      // Each long-poll is bounded here too: an answer that does not come within its wait
      // and a margin (a proxy holding it, a connection gone quiet) is asked for again.
      const { ctrl, done } = linked(options.signal);
      const timer = setTimeout(() => ctrl.abort(new Error("long-poll overdue")),
                               wait * 1000 + LONG_POLL_MARGIN_MS);
      let run: Run;
      try {
        run = await this.call<Run>({
          method: "GET", path: `/runs/${seg(threadId)}`, idempotent: true,
          signal: ctrl.signal, query: { wait, until },
        });
      } catch (err) {
        if (ctrl.signal.aborted && !options.signal?.aborted) continue;
        throw err;
      } finally {
        clearTimeout(timer);
        done();
      }
      if (TERMINAL.includes(run.status) || until.includes(run.status)) return run;
      if (Date.now() >= deadline) {
        throw new WaitTimeout(`run ${threadId} is still ${run.status} after ` +
                              `${options.timeoutMs} ms`, run);
      }
    }
  }

  /** The run's events as they happen: a `status` event, then steps, interrupts, ..., and
   * one terminal event (completed, failed, cancelled), after which the iteration ends. A
   * dropped connection is reconnected with Last-Event-ID: no event is repeated or lost.
   * Break out of the loop, or abort `signal`, to stop following. */
  async *events(threadId: string, options: EventsOptions = {}): AsyncGenerator<RunEvent> {
    let lastId = options.lastEventId;
    const limit = options.reconnects ?? 8;
    let failures = 0;
    for (;;) {
      const { ctrl, done } = linked(options.signal);
      try {
        let res: Response;
        try {
          res = await this.request({
            method: "GET", path: `/runs/${seg(threadId)}/events`, idempotent: true,
            signal: ctrl.signal,
            headers: { Accept: "text/event-stream",
                       ...(lastId === undefined ? {} : { "Last-Event-ID": lastId }) },
          });
        } catch (err) {
          if (!(err instanceof ConnectionError) || ++failures > limit) throw err;
          await sleep(this.backoff(failures), options.signal);
          continue;
        }
        if (!res.ok || res.body === null) {
          if (RETRY_STATUSES.has(res.status) && ++failures <= limit) {
            await res.body?.cancel().catch(() => undefined);
            await sleep(this.backoff(failures), options.signal);
            continue;
          }
          throw await errorFrom(res);
        }
        try {
          for await (const frame of readSse(res.body, lastId)) {
            failures = 0;
            lastId = frame.id;
            const data = JSON.parse(frame.data) as Record<string, unknown>;
            const ev = { ...data, id: frame.id } as RunEvent;
            yield ev;
            if ((TERMINAL as readonly string[]).includes(ev.type)) return;
          }
        } catch (err) {
          if (options.signal?.aborted) throw options.signal.reason;
          if (err instanceof SyntaxError) throw err;
          // The connection dropped mid-stream: reconnect after the last event received.
        }
        // The stream ended without a terminal event (a server shutting down, a proxy's
        // timeout, a lost connection): reconnect.
        if (++failures > limit) {
          throw new ConnectionError(0, "ConnectionError",
                                    `the event stream of ${threadId} kept dropping`);
        }
        await sleep(this.backoff(failures), options.signal);
      } finally {
        ctrl.abort();
        done();
      }
    }
  }

  /** Answer the run's pending interrupt with `value` (exactly once: a second answer is a
   * ResumeConflict). */
  resume(threadId: string, value: Json | unknown,
         options: CallOptions & { interruptId?: string } = {}): Promise<Interrupt> {
    return this.call<Interrupt>({
      method: "POST", path: `/runs/${seg(threadId)}/resume`, idempotent: false,
      signal: options.signal, body: { value, interrupt_id: options.interruptId },
    });
  }

  /** Cancel the run now (a finished run is returned unchanged). */
  cancel(threadId: string, options: CallOptions = {}): Promise<Run> {
    return this.call<Run>({ method: "POST", path: `/runs/${seg(threadId)}/cancel`,
                            idempotent: true, signal: options.signal });
  }

  /** Run a failed run again from its failed step (InvalidState unless it failed). */
  retry(threadId: string, options: CallOptions = {}): Promise<Run> {
    return this.call<Run>({ method: "POST", path: `/runs/${seg(threadId)}/retry`,
                            idempotent: false, signal: options.signal });
  }

  /** A new run starting from the state after `step` of this one. */
  fork(threadId: string, step: number,
       options: CallOptions & { threadId?: string } = {}): Promise<Run> {
    return this.call<Run>({
      method: "POST", path: `/runs/${seg(threadId)}/fork`, idempotent: false,
      signal: options.signal, body: { step, thread_id: options.threadId },
    });
  }

  /** Put a message in the run's mailbox (ctx.inbox); InvalidState for a finished run. */
  send(threadId: string, message: Json | unknown,
       options: CallOptions & { sender?: string } = {}): Promise<Message> {
    return this.call<Message>({
      method: "POST", path: `/runs/${seg(threadId)}/messages`, idempotent: false,
      signal: options.signal, body: { message, sender: options.sender },
    });
  }

  /** Interrupts waiting for a person, oldest first (or resolved ones, or all). */
  async interrupts(options: InterruptsOptions = {}): Promise<Interrupt[]> {
    const out = await this.call<{ interrupts: Interrupt[] }>({
      method: "GET", path: "/interrupts", idempotent: true, signal: options.signal,
      query: { thread_id: options.threadId, status: options.status, limit: options.limit },
    });
    return out.interrupts;
  }

  /** The run's checkpoint log, by step (with the state after each, unless state: false). */
  async checkpoints(threadId: string,
                    options: CallOptions & { state?: boolean } = {}): Promise<Checkpoint[]> {
    const out = await this.call<{ checkpoints: Checkpoint[] }>({
      method: "GET", path: `/runs/${seg(threadId)}/checkpoints`, idempotent: true,
      signal: options.signal, query: { state: options.state },
    });
    return out.checkpoints;
  }

  // -- deployments, workers, audit --------------------------------------------------------

  /** Per version: weight, state, live workers, open runs by status, stranded runs. */
  async deployments(options: CallOptions = {}): Promise<Deployment[]> {
    const out = await this.call<{ deployments: Deployment[] }>({
      method: "GET", path: "/deployments", idempotent: true, signal: options.signal });
    return out.deployments;
  }

  /** Set the whole weight table of new runs, e.g. { v1: 90, v2: 10 }. */
  async route(weights: Record<string, number>, options: CallOptions = {}): Promise<Deployment[]> {
    const out = await this.call<{ deployments: Deployment[] }>({
      method: "PUT", path: "/deployments", idempotent: true, signal: options.signal,
      body: { weights } });
    return out.deployments;
  }

  /** Weight 0 for the version: its open runs finish on it, no new run lands on it. */
  drain(version: string, options: CallOptions = {}): Promise<Deployment> {
    return this.call<Deployment>({ method: "POST", path: `/deployments/${seg(version)}/drain`,
                                   idempotent: true, signal: options.signal });
  }

  /** Retire a drained version (InvalidState while it has weight or open runs). */
  retire(version: string, options: CallOptions = {}): Promise<Deployment> {
    return this.call<Deployment>({ method: "POST", path: `/deployments/${seg(version)}/retire`,
                                   idempotent: true, signal: options.signal });
  }

  /** Registered workers with their last heartbeat. */
  async workers(options: CallOptions = {}): Promise<Worker[]> {
    const out = await this.call<{ workers: Worker[] }>({
      method: "GET", path: "/workers", idempotent: true, signal: options.signal });
    return out.workers;
  }

  /** One page of the audit log of operator actions, newest first. */
  audit(options: AuditOptions = {}): Promise<AuditPage> {
    return this.call<AuditPage>({
      method: "GET", path: "/audit", idempotent: true, signal: options.signal,
      query: { thread_id: options.threadId, action: options.action, limit: options.limit,
               cursor: options.cursor },
    });
  }

  /** Liveness and database check (the details need the token). */
  health(options: CallOptions = {}): Promise<Health> {
    // Not retried: a 503 here is the answer (the database or the worker is down).
    return this.call<Health>({ method: "GET", path: "/healthz", idempotent: false,
                               signal: options.signal }, [503]);
  }

  // -- transport ----------------------------------------------------------------------------

  private backoff(attempt: number): number {
    const base = Math.min(2000, this.retryDelayMs * 2 ** (attempt - 1));
    return base / 2 + Math.random() * (base / 2);
  }

  private url(path: string, query: Query | undefined): string {
    const params = new URLSearchParams();
    for (const [key, value] of Object.entries(query ?? {})) {
      if (value === undefined) continue;
      if (Array.isArray(value)) for (const v of value) params.append(key, String(v));
      else params.append(key, String(value));
    }
    const qs = params.toString();
    return `${this.baseUrl}${path}${qs ? `?${qs}` : ""}`;
  }

  /** One request (with the retries of an idempotent one); the raw response. */
  private async request(req: Request): Promise<Response> {
    const headers: Record<string, string> = { "X-Tether-Client": this.clientName,
                                              ...req.headers };
    if (this.token) headers.Authorization = `Bearer ${this.token}`;
    let body: string | undefined;
    if (req.body !== undefined) {
      headers["Content-Type"] = "application/json";
      body = JSON.stringify(req.body);
    }
    const attempts = req.idempotent ? this.retries : 1;
    for (let attempt = 1; ; attempt++) {
      let res: Response;
      try {
        res = await this.fetchImpl(this.url(req.path, req.query),
                                   { method: req.method, headers, body, signal: req.signal });
      } catch (err) {
        if (req.signal?.aborted) throw req.signal.reason;
        if (attempt >= attempts) {
          throw new ConnectionError(0, "ConnectionError",
                                    `${req.method} ${this.baseUrl}${req.path}: ${String(err)}`,
                                    { cause: err });
        }
        await sleep(this.backoff(attempt), req.signal);
        continue;
      }
      if (RETRY_STATUSES.has(res.status) && attempt < attempts) {
        await res.body?.cancel().catch(() => undefined);
        await sleep(this.backoff(attempt), req.signal);
        continue;
      }
      return res;
    }
  }

  private async call<T>(req: Request, okStatuses: readonly number[] = []): Promise<T> {
    const res = await this.request(req);
    if (!res.ok && !okStatuses.includes(res.status)) throw await errorFrom(res);
    return await res.json() as T;
  }
}

/**
 * The shapes the client returns and takes, named after the Python API's words; each is the
 * type generated from the server's OpenAPI document (src/schema.ts), so it cannot drift.
 */
import type { components } from "./schema.js";

type S = components["schemas"];

/** A run with its current state (GET /runs/{thread_id}). */
export type Run = S["RunOut"];
/** A run without its state (an item of `list()`). */
export type RunSummary = S["RunSummary"];
/** One page of runs; pass `next_cursor` as `cursor` for the next one (null: the last). */
export type RunPage = S["RunPage"];
export type RunStatus = S["RunStatus"];
export type RunError = S["RunErrorOut"];
export type Interrupt = S["InterruptOut"];
export type Checkpoint = S["CheckpointOut"];
export type Message = S["MessageOut"];
export type Deployment = S["DeploymentOut"];
export type Worker = S["WorkerOut"];
export type AuditEvent = S["AuditOut"];
/** One page of the audit log; pass `next_cursor` as `cursor` for the next (older) one. */
export type AuditPage = S["AuditList"];
export type Health = S["Health"];
export type ErrorBody = S["ErrorBody"];

/** A JSON value (a run's input, a resume value, a message). */
export type Json = null | boolean | number | string | Json[] | { [key: string]: Json };

/** The statuses after which a run never changes again. */
export const TERMINAL: readonly RunStatus[] = ["completed", "failed", "cancelled"];

interface Base {
  /** The SSE id of this event: pass it as `lastEventId` to continue after it. */
  id: string | undefined;
  thread_id: string;
  /** The step it concerns: the step that committed (`step`), or that parked (`interrupted`,
   * `sleeping`; it runs again on resume). */
  step?: number | null;
  [key: string]: unknown;
}

/** The first event of a stream: where the run is. */
export interface StatusEvent extends Base {
  type: "status";
  status: RunStatus;
  agent?: string;
  node?: string | null;
  version?: string;
}
/** A step committed: `node` ran, `next_node` runs next (null: the run finished). */
export interface StepEvent extends Base {
  type: "step";
  step: number;
  node: string | null;
  next_node: string | null;
  status: RunStatus;
}
/** The run asks a person: answer with `resume(thread_id, value)`. */
export interface InterruptedEvent extends Base {
  type: "interrupted";
  step: number;
  node: string | null;
  interrupt_id: string;
  payload: unknown;
}
export interface ResumedEvent extends Base {
  type: "resumed";
  interrupt_id: string;
}
export interface SleepingEvent extends Base {
  type: "sleeping";
  wake_at?: number | null;
}
/** A chunk a node sent with `ctx.stream(...)` (only from a worker inside the server). */
export interface StreamEvent extends Base {
  type: "stream";
  data: unknown;
}
export interface CompletedEvent extends Base { type: "completed" }
export interface CancelledEvent extends Base { type: "cancelled" }
export interface FailedEvent extends Base {
  type: "failed";
  category?: string;
  error?: string;
}
/** Any other event type (processing, response, idle, retrying, ...). */
export interface OtherEvent extends Base {
  type: "processing" | "response" | "idle" | "retrying";
}

/** One Server-Sent Event of `events()`; narrow on `type`. */
export type RunEvent = StatusEvent | StepEvent | InterruptedEvent | ResumedEvent
  | SleepingEvent | StreamEvent | CompletedEvent | CancelledEvent | FailedEvent | OtherEvent;

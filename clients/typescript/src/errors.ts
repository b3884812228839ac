/**
 * Errors of the tether API, one class per `error.type` of its JSON error body
 * (`{"error": {"type": ..., "message": ...}}`), with the HTTP status and message.
 * The classes mirror the Python exceptions of the same names (`RunPruned` is a `RunNotFound`,
 * `ResumeConflict` a `RunConflict`).
 */

/** Any error of the API (or of reaching it). `type` is the API's `error.type`. */
export class TetherError extends Error {
  /** The HTTP status (0: no answer, the request did not reach the server). */
  readonly status: number;
  /** The API's `error.type`, e.g. RunNotFound, ValidationError. */
  readonly type: string;
  /** Per-field problems of a ValidationError. */
  readonly details: ReadonlyArray<Record<string, unknown>> | undefined;
  /** The whole JSON error body, when there was one. */
  readonly body: unknown;

  constructor(status: number, type: string, message: string,
              extra: { details?: ReadonlyArray<Record<string, unknown>>; body?: unknown;
                       cause?: unknown } = {}) {
    super(message, extra.cause === undefined ? undefined : { cause: extra.cause });
    this.name = new.target.name;
    this.status = status;
    this.type = type;
    this.details = extra.details;
    this.body = extra.body;
  }
}

/** No run with that thread_id (404). */
export class RunNotFound extends TetherError {}
/** The run existed and was removed by retention (410); `prunedAt` says when. */
export class RunPruned extends RunNotFound {
  get prunedAt(): number | undefined {
    const err = (this.body as { error?: { pruned_at?: unknown } } | undefined)?.error;
    return typeof err?.pruned_at === "number" ? err.pruned_at : undefined;
  }
}
/** The request conflicts with the run (409): e.g. the same thread_id with another input. */
export class RunConflict extends TetherError {}
/** The interrupt was already answered (409). */
export class ResumeConflict extends RunConflict {}
/** The run (or version) is not in a state that allows this (409). */
export class InvalidState extends TetherError {}
/** The run's lease moved to another worker meanwhile (409). */
export class LeaseLost extends TetherError {}
/** Unknown agent or version, or another definition problem (422). */
export class DefinitionError extends TetherError {}
/** A value that cannot be stored as JSON (422). */
export class SerializationError extends TetherError {}
/** A body or parameter that fails validation (422); see `details`. */
export class ValidationError extends TetherError {}
/** A server configuration problem (400). */
export class ConfigError extends TetherError {}
/** The database is unreachable (503). */
export class StoreError extends TetherError {}
/** Missing or wrong bearer token (401). */
export class Unauthorized extends TetherError {}
/** Refused (403): a read-only server, another site's page, or a Host not the server's. */
export class Forbidden extends TetherError {}
/** A cursor this server did not hand out (400). */
export class InvalidCursor extends TetherError {}
/** A Last-Event-ID this server did not send (400). */
export class InvalidEventId extends TetherError {}
/** A request body over the server's limit (413). */
export class ContentTooLarge extends TetherError {}
/** Too many wrong tokens from this client (429). */
export class TooManyRequests extends TetherError {}
/** A 404 that is not a run's (an unknown path). */
export class NotFound extends TetherError {}
/** A bug or an outage on the server (5xx). */
export class ServerError extends TetherError {}
/** The server could not be reached (connection refused or reset); `status` is 0. */
export class ConnectionError extends TetherError {}
/** `wait()` gave up after its `timeoutMs`; the run is still going (`run` is its last read). */
export class WaitTimeout extends TetherError {
  readonly run: unknown;
  constructor(message: string, run: unknown) {
    super(0, "WaitTimeout", message);
    this.run = run;
  }
}

type ErrorClass = new (status: number, type: string, message: string,
                       extra?: { details?: ReadonlyArray<Record<string, unknown>>;
                                 body?: unknown }) => TetherError;

const BY_TYPE: Record<string, ErrorClass> = {
  RunNotFound, RunPruned, RunConflict, ResumeConflict, InvalidState, LeaseLost, DefinitionError,
  SerializationError, ValidationError, ConfigError, StoreError, StoreUnavailable: StoreError,
  Unauthorized, Forbidden, ReadOnly: Forbidden, InvalidCursor, InvalidEventId, ContentTooLarge,
  TooManyRequests, NotFound,
};

function byStatus(status: number): ErrorClass {
  if (status === 401) return Unauthorized;
  if (status === 403) return Forbidden;
  if (status === 404) return NotFound;
  if (status === 413) return ContentTooLarge;
  if (status === 422) return ValidationError;
  if (status === 429) return TooManyRequests;
  if (status >= 500) return ServerError;
  return TetherError;
}

/** The error a non-2xx answer stands for, from its JSON error body. */
export async function errorFrom(res: Response): Promise<TetherError> {
  const text = await res.text().catch(() => "");
  let body: unknown;
  try {
    body = text ? JSON.parse(text) : undefined;
  } catch {
    body = undefined;
  }
  const err = (body as { error?: { type?: unknown; message?: unknown; details?: unknown } }
               | undefined)?.error;
  const type = typeof err?.type === "string" ? err.type : `HTTP${res.status}`;
  const message = typeof err?.message === "string" ? err.message
    : `${res.status} ${res.statusText || "error"}${text ? `: ${text.slice(0, 200)}` : ""}`;
  const details = Array.isArray(err?.details)
    ? err.details as ReadonlyArray<Record<string, unknown>> : undefined;
  const cls = BY_TYPE[type] ?? byStatus(res.status);
  return new cls(res.status, type, message, { details, body });
}

/**
 * @tether/client: a TypeScript client for `tether serve`.
 *
 *   import { TetherClient } from "@tether/client";
 *   const tether = new TetherClient({ baseUrl: "http://127.0.0.1:8000" });
 *   const run = await tether.start("research", { topic: "durable execution" });
 *   for await (const ev of tether.events(run.thread_id)) console.log(ev.type, ev.step);
 */
export { TetherClient } from "./client.js";
export type {
  AuditOptions, CallOptions, EventsOptions, InterruptsOptions, ListOptions, StartOptions,
  TetherClientOptions, WaitOptions,
} from "./client.js";
export * from "./errors.js";
export { TERMINAL } from "./types.js";
export type * from "./types.js";
export type { components, operations, paths } from "./schema.js";
export { SseParser, type SseFrame } from "./sse.js";

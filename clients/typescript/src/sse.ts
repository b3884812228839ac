/**
 * A minimal Server-Sent Events parser over a fetch body (the WHATWG format: `event`, `data`,
 * `id`, `retry` fields, comments, LF, CR or CRLF line ends, a leading BOM). Written here
 * rather than depended on: it is some sixty lines, and the client stays free of runtime
 * dependencies in Node and in browsers (whose EventSource cannot send a bearer token).
 */

export interface SseFrame {
  /** The `event` field (default "message"). */
  event: string;
  /** The `data` lines, joined by "\n". */
  data: string;
  /** The last `id` seen on the stream so far (the SSE "last event ID"). */
  id: string | undefined;
  /** A `retry` field in milliseconds, when the frame had one. */
  retry: number | undefined;
}

/** Parses SSE text pushed in chunks; `push` returns the frames completed by the chunk. */
export class SseParser {
  private buffer = "";
  private started = false;
  private event = "";
  private data: string[] = [];
  private hasData = false;
  private retry: number | undefined;
  private lastId: string | undefined;

  constructor(lastId?: string) {
    this.lastId = lastId;
  }

  push(chunk: string): SseFrame[] {
    this.buffer += chunk;
    if (!this.started && this.buffer.length > 0) {
      this.started = true;
      if (this.buffer.charCodeAt(0) === 0xfeff) this.buffer = this.buffer.slice(1);
    }
    const out: SseFrame[] = [];
    for (;;) {
      const m = /\r\n|\r|\n/.exec(this.buffer);
      if (m === null) break;
      // A lone CR at the end may be the first half of CRLF: wait for the next chunk.
      if (m[0] === "\r" && m.index === this.buffer.length - 1) break;
      const line = this.buffer.slice(0, m.index);
      this.buffer = this.buffer.slice(m.index + m[0].length);
      const frame = this.line(line);
      if (frame !== undefined) out.push(frame);
    }
    return out;
  }

  private line(line: string): SseFrame | undefined {
    if (line === "") {
      const frame = this.hasData
        ? { event: this.event || "message", data: this.data.join("\n"), id: this.lastId,
            retry: this.retry }
        : undefined;
      this.event = "";
      this.data = [];
      this.hasData = false;
      this.retry = undefined;
      return frame;
    }
    if (line.startsWith(":")) return undefined; // a comment: keepalive
    const colon = line.indexOf(":");
    const field = colon === -1 ? line : line.slice(0, colon);
    let value = colon === -1 ? "" : line.slice(colon + 1);
    if (value.startsWith(" ")) value = value.slice(1);
    if (field === "event") this.event = value;
    else if (field === "data") {
      this.data.push(value);
      this.hasData = true;
    } else if (field === "id") {
      if (!value.includes("\0")) this.lastId = value;
    } else if (field === "retry" && /^\d+$/.test(value)) this.retry = Number(value);
    return undefined;
  }
}

/** The frames of an SSE response body, as they arrive. */
export async function* readSse(body: ReadableStream<Uint8Array>,
                               lastId?: string): AsyncGenerator<SseFrame> {
  const reader = body.getReader();
  const decoder = new TextDecoder();
  const parser = new SseParser(lastId);
  try {
    for (;;) {
      const { done, value } = await reader.read();
      if (done) return; // a frame not ended by a blank line is dropped, as the format says
      yield* parser.push(decoder.decode(value, { stream: true }));
    }
  } finally {
    await reader.cancel().catch(() => undefined);
  }
}

/** The SSE parser on the format's corners: split chunks, CRLF and CR line ends, multi-line
 * data, comments, a BOM, ids kept across frames, and an unterminated last frame dropped. */
import assert from "node:assert/strict";
import { describe, it } from "node:test";

import { SseParser } from "../src/index.ts";

describe("SseParser", () => {
  it("parses frames however the text is split", () => {
    const text = "\uFEFF: keepalive\r\nevent: step\r\ndata: {\"a\":1}\r\nid: 7\r\n\r\n"
      + "data: one\rdata: two\r\rretry: 50\nevent: x\ndata:no-space\n\nevent: cut\ndata: 1";
    for (const size of [1, 2, 3, 5, text.length]) {
      const p = new SseParser();
      const frames = [];
      for (let i = 0; i < text.length; i += size) frames.push(...p.push(text.slice(i, i + size)));
      assert.deepEqual(frames, [
        { event: "step", data: "{\"a\":1}", id: "7", retry: undefined },
        { event: "message", data: "one\ntwo", id: "7", retry: undefined },
        { event: "x", data: "no-space", id: "7", retry: 50 },
      ], `chunks of ${size}`);
    }
  });

  it("starts from a given last id and ignores frames without data", () => {
    const p = new SseParser("41");
    assert.deepEqual(p.push("event: nothing\n\nid: 42\n\ndata: d\n\n"),
                     [{ event: "message", data: "d", id: "42", retry: undefined }]);
  });
});

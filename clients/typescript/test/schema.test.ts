/** src/schema.ts is what openapi-typescript makes of a live `tether serve`'s /openapi.json
 * (normalized as scripts/generate.mjs does): any change to the API fails here until the
 * types are regenerated (`npm run generate -- URL`). */
import assert from "node:assert/strict";
import { readFile } from "node:fs/promises";
import { after, before, describe, it } from "node:test";

// @ts-expect-error: a plain ES module without declarations
import { SCHEMA_TS, fetchDocument, render } from "../scripts/generate.mjs";
import { Database, Procs } from "./harness.ts";

describe("the generated types", () => {
  const db = new Database("sqlite");
  const procs = new Procs(db);
  let baseUrl: string;

  before(async () => {
    baseUrl = await procs.serve();
  });
  after(async () => {
    await procs.close();
    db.drop();
  });

  it("match the served OpenAPI document exactly", async () => {
    const doc = await fetchDocument(baseUrl);
    assert.ok(doc.paths["/deployments/{version}/retire"], "the served document is current");
    const fresh: string = await render(doc);
    const committed = await readFile(SCHEMA_TS, "utf8");
    assert.equal(committed, fresh, "src/schema.ts is stale: run npm run generate -- URL");
  });
});

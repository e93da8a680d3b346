/** The client without a server: retries, the SSE parser, webhook signatures, the types' drift. */
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { mkdtempSync, readFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { test } from "node:test";

import { ContextlogClient, ContextlogError, verifyWebhook, WebhookVerificationError } from "../src/index.js";
import { parseEvents } from "../src/sse.js";
import { sign } from "../src/webhooks.js";
import { PACKAGE } from "./helpers.js";

function answering(...responses: Array<[number, unknown, Record<string, string>?]>) {
  const calls: string[] = [];
  const fake = (async (url: string | URL | Request) => {
    calls.push(String(url));
    const [status, body, headers] = responses.shift()!;
    const type = status >= 400 ? "application/problem+json" : "application/json";
    return new Response(JSON.stringify(body), { status, headers: { "content-type": type, ...headers } });
  }) as typeof fetch;
  return { fake, calls };
}

test("429 and 503 are retried after their Retry-After; other problems throw", async () => {
  const slept: number[] = [];
  const problem = (status: number) => ({ type: "t", title: "x", status, detail: "d", error: "Refused" });
  const { fake, calls } = answering(
    [429, problem(429), { "retry-after": "2" }],
    [503, problem(503), { "retry-after": "1" }],
    [202, { event_id: "e1" }],
    [409, problem(409)],
  );
  const client = new ContextlogClient({ baseUrl: "http://x/", apiKey: "k", fetch: fake, sleep: async (ms) => void slept.push(ms) });
  assert.equal(await client.postMessage("a", "c", { role: "user", content: "hi" }), "e1");
  assert.deepEqual(slept, [2000, 1000]);
  assert.equal(calls[0], "http://x/v1/agents/a/channels/c/messages");
  await assert.rejects(client.clear("a", "c"), (e: unknown) => e instanceof ContextlogError && e.status === 409 && e.error === "Refused");
});

test("retries stop after the configured count", async () => {
  const p = { type: "t", title: "x", status: 503, detail: "down" };
  const { fake } = answering([503, p], [503, p]);
  const client = new ContextlogClient({ baseUrl: "http://x", apiKey: "k", fetch: fake, retries: 1, sleep: async () => {} });
  await assert.rejects(client.context("a", "c"), (e: unknown) => e instanceof ContextlogError && e.status === 503);
});

test("server-sent events are parsed across chunks; comments are skipped", async () => {
  const chunks = [": connected\n\nid: 1-0\nda", "ta: {\"a\":1}\n\n: keepalive\n\nid: 2-0\ndata: x\ndata: y\n\n"];
  const body = new ReadableStream<Uint8Array>({
    start(c) {
      for (const chunk of chunks) c.enqueue(new TextEncoder().encode(chunk));
      c.close();
    },
  });
  const got = [];
  for await (const e of parseEvents(body)) got.push(e);
  assert.deepEqual(got, [
    { id: "1-0", event: "message", data: '{"a":1}' },
    { id: "2-0", event: "message", data: "x\ny" },
  ]);
});

test("webhook signatures follow the Standard Webhooks test vector", async () => {
  const secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
  const body = '{"test": 2432232314}';
  const signature = await sign(secret, "msg_p5jXN8AQM9LWM0D4loKWxJek", 1614265330, body);
  assert.equal(signature, "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=");
  const headers = { "webhook-id": "msg_p5jXN8AQM9LWM0D4loKWxJek", "webhook-timestamp": "1614265330", "webhook-signature": `v1,x ${signature}` };
  assert.deepEqual(await verifyWebhook(secret, headers, body, { now: 1614265330 }), { test: 2432232314 });
  await assert.rejects(verifyWebhook(secret, headers, body + " ", { now: 1614265330 }), WebhookVerificationError);
  await assert.rejects(verifyWebhook(secret, headers, body, { now: 1614265330 + 301 }), WebhookVerificationError);
  await assert.rejects(verifyWebhook(secret, {}, body), WebhookVerificationError);
});

test("src/openapi.ts is what docs/openapi.json generates (npm run generate)", () => {
  const out = join(mkdtempSync(join(tmpdir(), "contextlog-ts-")), "openapi.ts");
  const bin = join(PACKAGE, "node_modules/.bin/openapi-typescript");
  execFileSync(bin, ["../../docs/openapi.json", "--default-non-nullable", "false", "-o", out], { cwd: PACKAGE, stdio: "ignore" });
  assert.equal(readFileSync(join(PACKAGE, "src/openapi.ts"), "utf8"), readFileSync(out, "utf8"), "run `npm run generate` and commit src/openapi.ts");
});

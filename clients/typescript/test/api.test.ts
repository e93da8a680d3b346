/** The client against a real `contextlog api`, ingest and worker (tests/support/api_server.py). */
import assert from "node:assert/strict";
import { readFileSync, writeFileSync } from "node:fs";
import { createServer } from "node:http";
import type { AddressInfo } from "node:net";
import { resolve } from "node:path";
import { test } from "node:test";

import type { MessageParam } from "@anthropic-ai/sdk/resources/messages";

import { ContextlogClient, ContextlogError, verifyWebhook } from "../src/index.js";
import { fakeAnthropic, PACKAGE, ROOT, runNode, text, useDeployment } from "./helpers.js";

const live = useDeployment();

test("a turn: post, then read it back as MessageParam[]", async (t) => {
  if (live.skip) return t.skip(live.skip);
  const client = live.client!;
  const first = await client.postMessage("alpha", "ts", { role: "user", content: "hello", source: "ts" });
  const again = await client.postMessage("alpha", "ts", { role: "user", content: "hello", source: "ts" }, { idempotencyKey: "k1" });
  const same = await client.postMessage("alpha", "ts", { role: "user", content: "hello", source: "ts" }, { idempotencyKey: "k1" });
  assert.equal(again, same);
  assert.notEqual(first, again);
  const blocks = [{ type: "text" as const, text: "hi there" }];
  const reply = await client.postMessage("alpha", "ts", { role: "assistant", content: blocks });
  const ctx = await client.context("alpha", "ts", { waitFor: reply, timeout: 10 });
  const messages: MessageParam[] = ctx.messages;
  assert.deepEqual(messages.map((m) => m.role), ["user", "assistant"]);
  assert.deepEqual(messages[1]!.content, blocks);
  const { request } = await client.request("alpha", "ts", { system: "Be brief.", cache: true });
  assert.equal(request.messages.length, 2);
  assert.ok(Array.isArray(request.system) && request.system[0]!.text === "Be brief.");
  const turn = await client.turn("alpha", "ts", { role: "user", content: "and now?", system: "Be brief." });
  assert.equal(turn.request.system, "Be brief.");
  assert.deepEqual(turn.request.messages.at(-1), { role: "user", content: [{ type: "text", text: "and now?" }] });
});

test("a preserved-thinking bot: its frame, thinking kept, system messages, boundaries", async (t) => {
  if (live.skip) return t.skip(live.skip);
  const client = live.client!;
  const tools = [{ name: "lookup", description: "d", input_schema: { type: "object" as const } }];
  const thinking = { type: "enabled" as const, budget_tokens: 2048 };
  await client.setFrame("alpha", "frame", { model: "claude-x", system: "Be brief.", tools, thinking });
  await client.postMessage("alpha", "frame", { role: "user", content: "hello", source: "ts" });
  await client.postMessage("alpha", "frame", { role: "system", content: "The user is on mobile." });
  const thought = { type: "thinking" as const, thinking: "Hmm.", signature: "c2ln" };
  const last = await client.postMessage("alpha", "frame", { role: "assistant", content: [thought, { type: "text", text: "Hi." }] });
  const ctx = await client.context("alpha", "frame", { waitFor: last, timeout: 10 });
  assert.deepEqual(ctx.messages.map((m) => m.role), ["user", "system", "assistant"]);
  assert.deepEqual((ctx.messages[2]!.content as unknown[])[0], thought);
  assert.equal(ctx.boundary, null);
  const folded = await client.context("alpha", "frame", { systemMessages: "fold" });
  assert.deepEqual(folded.messages.map((m) => m.role), ["user", "assistant"]);
  const { request } = await client.request("alpha", "frame");
  assert.equal(request.system, "Be brief.");
  assert.deepEqual(request.tools, tools);
  const changed = await client.setFrame("alpha", "frame", { model: "claude-x", system: "Be briefer.", tools, thinking });
  const after = await client.context("alpha", "frame", { waitFor: changed, timeout: 10 });
  assert.equal(after.boundary?.kind, "frame");
  assert.equal(after.thinking_removed, 1);
});

test("search, retention and erase: what an agent said, found and forgotten", async (t) => {
  if (live.skip) return t.skip(live.skip);
  const client = live.client!;
  await client.postMessage("recall", "ts", { role: "user", content: "the rollback plan is ready", sender: "ann", source: "ts" });
  await client.postMessage("recall", "ts", { role: "user", content: "the rollout waits", sender: "bob", source: "ts" });
  const senders = async () => (await client.search("recall", "rollback OR rollout", { channel: "ts" })).hits.map((h) => h.sender);
  for (let i = 0; i < 100 && (await senders()).length < 2; i++) await new Promise((r) => setTimeout(r, 100));
  assert.deepEqual((await senders()).sort(), ["ann", "bob"]);
  assert.ok(await client.setRetention("recall", "ts", { keep_log_days: 30 }));
  const narrow = new ContextlogClient({ baseUrl: live.server!.url, apiKey: live.server!.narrow });
  await assert.rejects(narrow.erase("alpha", { sender: "ann" }), (e: unknown) => e instanceof ContextlogError && e.status === 403);
  assert.equal((await client.erase("recall", { sender: "ann", source: "ts" })).length, 4);
  for (let i = 0; i < 100 && (await senders()).includes("ann"); i++) await new Promise((r) => setTimeout(r, 100));
  assert.deepEqual(await senders(), ["bob"]);
});

test("refusals are ContextlogErrors with the library's class", async (t) => {
  if (live.skip) return t.skip(live.skip);
  const client = live.client!;
  await assert.rejects(client.postMessage("alpha", "ts", { role: "robot", content: "x" }), (e: unknown) => e instanceof ContextlogError && e.status === 422 && e.error === "EventRejected");
  const narrow = new ContextlogClient({ baseUrl: live.server!.url, apiKey: live.server!.narrow });
  await assert.rejects(narrow.context("beta", "ts"), (e: unknown) => e instanceof ContextlogError && e.status === 403);
  await assert.rejects(narrow.sessions("alpha"), (e: unknown) => e instanceof ContextlogError && e.status === 403);
  await assert.rejects(client.session("alpha", "ts", "nope"), (e: unknown) => e instanceof ContextlogError && e.status === 409 && e.error === "Refused");
});

test("sessions: save, list, export, import, restore, notices, purge; a webhook on the way", async (t) => {
  if (live.skip) return t.skip(live.skip);
  const client = live.client!;
  const received: Array<{ headers: Record<string, string | string[] | undefined>; body: string }> = [];
  const hooks = createServer((req, res) => {
    let body = "";
    req.on("data", (c) => (body += c));
    req.on("end", () => {
      received.push({ headers: req.headers, body });
      res.writeHead(204).end();
    });
  });
  await new Promise<void>((done) => hooks.listen(0, "127.0.0.1", () => done()));
  const url = `http://127.0.0.1:${(hooks.address() as AddressInfo).port}/hook`;
  const hook = await client.createWebhook({ url, source: "ts-sessions", kinds: ["session_saved"], agents: ["alpha"] });
  try {
    const said = await client.postMessage("alpha", "s1", { role: "user", content: "the door is blue", source: "ts-sessions" });
    const saved = await client.save("alpha", "s1", { description: "door", source: "ts-sessions" });
    await client.context("alpha", "s1", { waitFor: saved, timeout: 10 });
    void said;
    const page = await client.sessions("alpha", { channel: "s1" });
    assert.equal(page.sessions.length, 1);
    const sid = page.sessions[0]!.session_id;
    assert.equal((await client.session("alpha", "s1", sid)).description, "door");
    const doc = await client.exportSession("alpha", "s1", sid);
    await client.importSession("alpha", "s2", doc, "ts-sessions");
    // The save's summary lands whenever the worker gets to it: its notice is not the point.
    const answers = async (n: number): Promise<string[]> => {
      const kinds: string[] = [];
      for await (const { id, notice } of client.notifications("alpha", { source: "ts-sessions", wait: 10 })) {
        if (notice.kind !== "summary_ready") kinds.push(notice.kind);
        if (kinds.length < n) continue;
        await client.ack("alpha", { source: "ts-sessions", through: id }); // a break skips the loop's own
        break;
      }
      return kinds;
    };
    assert.deepEqual(await answers(2), ["session_saved", "session_imported"]);
    const cleared = await client.clear("alpha", "s1", { source: "ts-sessions" });
    await client.context("alpha", "s1", { waitFor: cleared, timeout: 10 });
    assert.equal((await client.context("alpha", "s1")).messages.length, 0);
    const restored = await client.restore("alpha", "s1", "last", { source: "ts-sessions" });
    const back = await client.context("alpha", "s1", { waitFor: restored, timeout: 10 });
    assert.equal(back.messages.length, 1);
    assert.deepEqual(await answers(1), ["restore_done"]);
    await client.purge("alpha", "s1", 0, { source: "ts-sessions" });
    for (let i = 0; i < 200 && !received.length; i++) await new Promise((r) => setTimeout(r, 50));
    assert.equal(received.length, 1, "the webhook delivery");
    const payload = await verifyWebhook(hook.secret!, received[0]!.headers as Record<string, string>, received[0]!.body);
    assert.equal(payload.type, "session_saved");
  } finally {
    await client.deleteWebhook(hook.webhook_id);
    hooks.close();
  }
});

test("the README's TypeScript snippet runs as written", async (t) => {
  if (live.skip) return t.skip(live.skip);
  const client = live.client!;
  const readme = readFileSync(resolve(ROOT, "README.md"), "utf8");
  const snippet = /^```ts\n([\s\S]*?)^```/m.exec(readme)![1]!;
  const file = resolve(PACKAGE, "dist/readme_snippet.mjs"); // beside node_modules
  writeFileSync(file, snippet.replace('"@contextlog/client"', JSON.stringify(resolve(PACKAGE, "dist/src/index.js"))));
  const claude = await fakeAnthropic(() => "Ada owns it.");
  try {
    const out = await runNode(file, [], "", {
      CONTEXTLOG_URL: live.server!.url,
      CONTEXTLOG_KEY: live.server!.key,
      ANTHROPIC_BASE_URL: claude.url,
      ANTHROPIC_API_KEY: "sk-ant-test",
    });
    assert.match(out, /^session_saved saved session/);
    assert.equal(text(claude.requests[0]!.messages.at(-1)!.content), "Who owns the launch checklist?");
  } finally {
    await claude.close();
  }
});

/** The two examples, run as a user runs them, against a real `contextlog api` and a fake
 * Anthropic API (never the real one). */
import assert from "node:assert/strict";
import { resolve } from "node:path";
import { after, before, test } from "node:test";

import { fakeAnthropic, PACKAGE, runNode, text, useDeployment, type FakeAnthropic } from "./helpers.js";

const live = useDeployment();
let claude: FakeAnthropic;

before(async () => {
  claude = await fakeAnthropic((req) => {
    const last = text(req.messages.at(-1)!.content);
    if (last.includes("book")) return /\d|four|two/.test(last) ? "Booked." : "For how many people?";
    if (/four|two/.test(last)) return "Booked for " + last + ".";
    return `echo: ${last}`;
  });
});
after(async () => claude?.close());

/** Run an example as a user runs it. */
function run(example: string, args: string[], input = "", env: Record<string, string> = {}): Promise<string> {
  return runNode(resolve(PACKAGE, "dist/examples", example), args, input, {
    CONTEXTLOG_URL: live.server!.url,
    CONTEXTLOG_KEY: live.server!.key,
    ANTHROPIC_BASE_URL: claude.url,
    ANTHROPIC_API_KEY: "sk-ant-test-not-a-real-key",
    ...env,
  });
}

test("session manager: /save, a restart with --continue, /sessions, /purge", async (t) => {
  if (live.skip) return t.skip(live.skip);
  const env = { CONTEXTLOG_CHANNEL: "sm" };
  const first = await run("session_manager.js", [], "my name is Ada\n/save intro\n/sessions\n/quit\n", env);
  assert.match(first, /echo: my name is Ada/);
  assert.match(first, /saved/);
  assert.match(first, /_intro {2}2 messages {2}intro/);
  await live.client!.clear("assistant", "sm"); // a new day: the window starts empty
  const second = await run("session_manager.js", ["--continue"], "what is my name?\n/purge 0\n/sessions\n", env);
  assert.match(second, /resumed: 2 messages in context/);
  const asked = claude.requests.at(-1)!;
  assert.deepEqual(asked.messages.map((m) => text(m.content)), ["my name is Ada", "echo: my name is Ada", "what is my name?"]);
  assert.match(second, /no saved sessions/);
});

test("clarification: each sender's question and answer survive a restart", async (t) => {
  if (live.skip) return t.skip(live.skip);
  assert.equal((await run("clarification.js", ["bob", "book a table tonight"])).trim(), "For how many people?");
  assert.equal((await run("clarification.js", ["carol", "book a table for two"])).trim(), "Booked.");
  // a new process: bob's history comes back from contextlog
  assert.match(await run("clarification.js", ["bob", "four"]), /Booked for four/);
  const asked = claude.requests.at(-1)!;
  assert.deepEqual(asked.messages.map((m) => text(m.content)), ["book a table tonight", "For how many people?", "four"]);
});

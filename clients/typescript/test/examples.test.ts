/** The two examples, run as a user runs them, against a real `contextlog api` and a fake
 * Anthropic API (never the real one). */
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { resolve } from "node:path";
import { after, before, test } from "node:test";

import { ContextlogClient } from "../src/index.js";
import { deploy, fakeAnthropic, PACKAGE, text, type Deployment, type FakeAnthropic } from "./helpers.js";

let server: Deployment | undefined;
let skip: string | false = false;
let claude: FakeAnthropic;

before(async () => {
  const got = await deploy();
  if (typeof got === "string") skip = got;
  else server = got;
  claude = await fakeAnthropic((req) => {
    const last = text(req.messages.at(-1)!.content);
    if (last.includes("book")) return /\d|four|two/.test(last) ? "Booked." : "For how many people?";
    if (/four|two/.test(last)) return "Booked for " + last + ".";
    return `echo: ${last}`;
  });
});
after(async () => {
  await server?.stop();
  await claude?.close();
});

/** Run an example as its own process (asynchronously: the fake API answers from here). */
function run(example: string, args: string[], input = "", env: Record<string, string> = {}): Promise<string> {
  const child = spawn(process.execPath, [resolve(PACKAGE, "dist/examples", example), ...args], {
    env: {
      ...process.env,
      CONTEXTLOG_URL: server!.url,
      CONTEXTLOG_KEY: server!.key,
      ANTHROPIC_BASE_URL: claude.url,
      ANTHROPIC_API_KEY: "sk-ant-test-not-a-real-key",
      ...env,
    },
  });
  let stdout = "";
  let stderr = "";
  child.stdout.on("data", (c) => (stdout += c));
  child.stderr.on("data", (c) => (stderr += c));
  child.stdin.end(input);
  return new Promise((done, fail) => {
    child.once("exit", (code) => (code === 0 ? done(stdout) : fail(new Error(`${example} exited ${code}: ${stderr}`))));
  });
}

test("session manager: /save, a restart with --continue, /sessions, /purge", async (t) => {
  if (skip) return t.skip(skip);
  const env = { CONTEXTLOG_CHANNEL: "sm" };
  const first = await run("session_manager.js", [], "my name is Ada\n/save intro\n/sessions\n/quit\n", env);
  assert.match(first, /echo: my name is Ada/);
  assert.match(first, /saved/);
  assert.match(first, /_intro {2}2 messages {2}intro/);
  const client = new ContextlogClient({ baseUrl: server!.url, apiKey: server!.key });
  await client.clear("assistant", "sm"); // a new day: the window starts empty
  const second = await run("session_manager.js", ["--continue"], "what is my name?\n/purge 0\n/sessions\n", env);
  assert.match(second, /resumed: 2 messages in context/);
  const asked = claude.requests.at(-1)!;
  assert.deepEqual(asked.messages.map((m) => text(m.content)), ["my name is Ada", "echo: my name is Ada", "what is my name?"]);
  assert.match(second, /no saved sessions/);
});

test("clarification: each sender's question and answer survive a restart", async (t) => {
  if (skip) return t.skip(skip);
  assert.equal((await run("clarification.js", ["bob", "book a table tonight"])).trim(), "For how many people?");
  assert.equal((await run("clarification.js", ["carol", "book a table for two"])).trim(), "Booked.");
  // a new process: bob's history comes back from contextlog
  assert.match(await run("clarification.js", ["bob", "four"]), /Booked for four/);
  const asked = claude.requests.at(-1)!;
  assert.deepEqual(asked.messages.map((m) => text(m.content)), ["book a table tonight", "For how many people?", "four"]);
});

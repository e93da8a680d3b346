/**
 * A terminal bot with saved sessions, on contextlog's HTTP API and @anthropic-ai/sdk.
 *
 *   node dist/examples/session_manager.js [--continue]
 *
 * Lines typed are user turns; the commands are `/save [description]`, `/sessions`,
 * `/resume <id|last>`, `/purge [keep]` and `/quit`. `--continue` resumes the newest saved
 * session first. Configuration: CONTEXTLOG_URL, CONTEXTLOG_KEY, CONTEXTLOG_AGENT (default
 * `assistant`), CONTEXTLOG_CHANNEL (`terminal`), ANTHROPIC_MODEL, and the SDK's own
 * ANTHROPIC_API_KEY / ANTHROPIC_BASE_URL.
 */
import Anthropic from "@anthropic-ai/sdk";
import { createInterface } from "node:readline";

import { ContextlogClient } from "../src/index.js";

const env = process.env;
const agent = env.CONTEXTLOG_AGENT ?? "assistant";
const channel = env.CONTEXTLOG_CHANNEL ?? "terminal";
const model = env.ANTHROPIC_MODEL ?? "claude-sonnet-4-5";
const source = "session-manager";
const memory = new ContextlogClient({
  baseUrl: env.CONTEXTLOG_URL ?? "http://127.0.0.1:8420",
  apiKey: env.CONTEXTLOG_KEY ?? "",
});
const claude = new Anthropic();
let lastEvent: string | undefined; // read our own writes: the next context waits for it

async function turn(line: string): Promise<string> {
  // One round trip: post the user's message, get the request once it is stored.
  const { request } = await memory.turn(agent, channel, {
    role: "user",
    content: line,
    source,
    system: "You are a helpful assistant.",
    cache: true,
  });
  const reply = await claude.messages.create({ model, max_tokens: 1024, ...request });
  const answer = reply.content.map((b) => (b.type === "text" ? b.text : "")).join("");
  lastEvent = await memory.postMessage(agent, channel, {
    role: "assistant",
    content: reply.content,
    source,
  });
  return answer;
}

async function command(name: string, arg: string): Promise<string> {
  switch (name) {
    case "/save":
      lastEvent = await memory.save(agent, channel, { description: arg || null, source });
      await memory.context(agent, channel, { waitFor: lastEvent, timeout: 10 });
      return "saved";
    case "/sessions": {
      await settled();
      const page = await memory.sessions(agent, { channel });
      if (!page.sessions.length) return "no saved sessions";
      return page.sessions
        .map((s) => `${s.session_id}  ${s.message_count} messages  ${s.description ?? s.preview}`)
        .join("\n");
    }
    case "/resume":
      lastEvent = await memory.restore(agent, channel, arg || "last", { source });
      return await resumed();
    case "/purge":
      lastEvent = await memory.purge(agent, channel, Number(arg || 0), { source });
      return `purged, keeping ${Number(arg || 0)}`;
    default:
      return `unknown command ${name}`;
  }
}

/** Once our last command is stored (a read of our own writes). */
async function settled(): Promise<void> {
  if (lastEvent) await memory.context(agent, channel, { waitFor: lastEvent, timeout: 10 });
}

async function resumed(): Promise<string> {
  const ctx = await memory.context(agent, channel, { waitFor: lastEvent, timeout: 10 });
  return `resumed: ${ctx.messages.length} messages in context`;
}

async function main(): Promise<void> {
  if (process.argv.includes("--continue")) {
    lastEvent = await memory.restore(agent, channel, "last", { source });
    console.log(await resumed());
  }
  const lines = createInterface({ input: process.stdin });
  for await (const raw of lines) {
    const line = raw.trim();
    if (!line) continue;
    if (line === "/quit") break;
    const [name = "", ...rest] = line.split(" ");
    console.log(line.startsWith("/") ? await command(name, rest.join(" ")) : await turn(line));
  }
}

main().catch((e) => {
  console.error(`error: ${e instanceof Error ? e.message : e}`);
  process.exit(1);
});

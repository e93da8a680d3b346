/**
 * A per-sender conversation with a clarification round trip: each sender's history (a
 * `MessageParam[]`) lives in contextlog, so a question the bot asked survives a restart
 * and the sender's answer is read with it.
 *
 *   node dist/examples/clarification.js <sender> <message...>
 *
 * One turn per run: post the sender's message to their own channel, read their history,
 * ask Claude, post and print the reply. Configuration as in session_manager.ts.
 */
import Anthropic from "@anthropic-ai/sdk";
import type { MessageParam } from "@anthropic-ai/sdk/resources/messages";

import { ContextlogClient } from "../src/index.js";

const env = process.env;
const agent = env.CONTEXTLOG_AGENT ?? "concierge";
const model = env.ANTHROPIC_MODEL ?? "claude-sonnet-4-5";
const memory = new ContextlogClient({
  baseUrl: env.CONTEXTLOG_URL ?? "http://127.0.0.1:8420",
  apiKey: env.CONTEXTLOG_KEY ?? "",
});

const SYSTEM =
  "You book restaurant tables. If the party size or time is missing, ask one short " +
  "clarifying question; otherwise confirm the booking.";

async function main(): Promise<void> {
  const [sender, ...words] = process.argv.slice(2);
  if (!sender || !words.length) throw new Error("usage: clarification.js <sender> <message...>");
  const channel = `dm:${sender}`; // one conversation per sender
  const asked = await memory.postMessage(agent, channel, {
    role: "user",
    content: words.join(" "),
    sender,
    source: "concierge",
  });
  const history: MessageParam[] = (await memory.context(agent, channel, { waitFor: asked })).messages;
  const reply = await new Anthropic().messages.create({
    model,
    max_tokens: 512,
    system: SYSTEM,
    messages: history,
  });
  await memory.postMessage(agent, channel, { role: "assistant", content: reply.content, source: "concierge" });
  console.log(reply.content.map((b) => (b.type === "text" ? b.text : "")).join(""));
}

main().catch((e) => {
  console.error(`error: ${e instanceof Error ? e.message : e}`);
  process.exit(1);
});

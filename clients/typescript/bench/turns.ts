/**
 * One side of `make bench`'s `http` benchmark: bot turns through the client (`turn`: post
 * and read in one request), timed here
 * (process start-up excluded). Argument: a JSON plan; prints the latencies (ms) as JSON.
 */
import { ContextlogClient } from "../src/index.js";

interface Plan {
  url: string;
  key: string;
  agent: string;
  channels: string[];
  turns: number;
  warm: number;
  thinkMs: number;
  tag: string;
}

const plan = JSON.parse(process.argv[2]!) as Plan;
const client = new ContextlogClient({ baseUrl: plan.url, apiKey: plan.key, retries: 0 });
const pause = (ms: number) => new Promise((r) => setTimeout(r, ms));
const samples: number[] = [];
for (let t = 0; t < plan.warm + plan.turns; t++) {
  const channel = plan.channels[t % plan.channels.length]!;
  const text = `turn ${plan.tag}.${t} from typescript: ` + "question words ".repeat(10);
  const start = performance.now();
  const { request } = await client.turn(plan.agent, channel, { role: "user", content: text, timeout: 30 });
  const elapsed = performance.now() - start;
  const last = request.messages.at(-1)!;
  const blocks = last.content as Array<{ text?: string }>;
  if (last.role !== "user" || blocks.at(-1)?.text !== text) throw new Error("read-your-writes broken");
  if (t >= plan.warm) samples.push(elapsed);
  await client.postMessage(plan.agent, channel, { role: "assistant", content: "answer words ".repeat(20) });
  await pause(plan.thinkMs);
}
console.log(JSON.stringify(samples));

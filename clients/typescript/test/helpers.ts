/** A real `contextlog api` (with ingest and worker) for the tests, and a fake Anthropic API. */
import { spawn, type ChildProcess } from "node:child_process";
import { createServer, type IncomingMessage, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import { dirname, resolve } from "node:path";
import { createInterface } from "node:readline";
import { fileURLToPath } from "node:url";

export const ROOT = resolve(dirname(fileURLToPath(import.meta.url)), "../../../..");
export const PACKAGE = resolve(ROOT, "clients/typescript");
const PYTHON = process.env.CONTEXTLOG_PYTHON ?? resolve(ROOT, ".venv/bin/python");

export interface Deployment {
  url: string;
  key: string;
  narrow: string;
  stop(): Promise<void>;
}

/** Start the deployment (`tests/support/api_server.py`); a skip reason when there are no
 * servers (under CI=true that is a failure, as the Python suite does). */
export async function deploy(): Promise<Deployment | string> {
  const child = spawn(PYTHON, ["-m", "tests.support.api_server"], {
    cwd: ROOT,
    stdio: ["pipe", "pipe", "inherit"],
  });
  const first = await firstLine(child);
  const info = JSON.parse(first) as { skip?: string; url: string; key: string; narrow: string };
  if (info.skip) {
    child.stdin!.end();
    if (process.env.CI === "true") throw new Error(`no servers for the API tests: ${info.skip}`);
    return info.skip;
  }
  return {
    url: info.url,
    key: info.key,
    narrow: info.narrow,
    stop: () =>
      new Promise((done) => {
        child.once("exit", () => done());
        child.stdin!.end();
      }),
  };
}

function firstLine(child: ChildProcess): Promise<string> {
  return new Promise((done, fail) => {
    const lines = createInterface({ input: child.stdout! });
    lines.once("line", (line) => done(line));
    child.once("exit", (code) => fail(new Error(`api_server exited (${code}) before starting`)));
  });
}

export interface FakeAnthropic {
  url: string;
  requests: Array<{ messages: Array<{ role: string; content: unknown }>; system?: unknown }>;
  close(): Promise<void>;
}

/** A local stand-in for the Messages API: answers each request with `reply(request)`. */
export async function fakeAnthropic(
  reply: (request: FakeAnthropic["requests"][number]) => string,
): Promise<FakeAnthropic> {
  const requests: FakeAnthropic["requests"] = [];
  const server: Server = createServer(async (req: IncomingMessage, res) => {
    const chunks: Buffer[] = [];
    for await (const chunk of req) chunks.push(chunk as Buffer);
    const body = JSON.parse(Buffer.concat(chunks).toString());
    requests.push(body);
    res.writeHead(200, { "content-type": "application/json" });
    res.end(
      JSON.stringify({
        id: `msg_${requests.length}`,
        type: "message",
        role: "assistant",
        model: body.model,
        content: [{ type: "text", text: reply(body) }],
        stop_reason: "end_turn",
        stop_sequence: null,
        usage: { input_tokens: 1, output_tokens: 1 },
      }),
    );
  });
  await new Promise<void>((done) => server.listen(0, "127.0.0.1", () => done()));
  const { port } = server.address() as AddressInfo;
  return {
    url: `http://127.0.0.1:${port}`,
    requests,
    close: () => new Promise((done) => server.close(() => done())),
  };
}

/** Text of a message's content (string or blocks). */
export function text(content: unknown): string {
  if (typeof content === "string") return content;
  return (content as Array<{ type: string; text?: string }>)
    .map((b) => (b.type === "text" ? b.text : ""))
    .join("");
}

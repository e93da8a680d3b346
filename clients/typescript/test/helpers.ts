/** A real `contextlog api` (with ingest and worker) for the tests, and a fake Anthropic API. */
import { spawn, type ChildProcess } from "node:child_process";
import { createServer, type IncomingMessage, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import { dirname, resolve } from "node:path";
import { createInterface } from "node:readline";
import { after, before } from "node:test";
import { fileURLToPath } from "node:url";

import { ContextlogClient } from "../src/index.js";

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

export interface Live {
  /** the deployment, once `before` ran (undefined when skipped) */
  server?: Deployment;
  /** a client of it with the every-right key */
  client?: ContextlogClient;
  /** why the tests skip (no servers), or false */
  skip: string | false;
}

/** One deployment for a test file: started before its tests, stopped after them. */
export function useDeployment(): Live {
  const live: Live = { skip: false };
  before(async () => {
    const got = await deploy();
    if (typeof got === "string") live.skip = got;
    else {
      live.server = got;
      live.client = new ContextlogClient({ baseUrl: got.url, apiKey: got.key });
    }
  });
  after(async () => live.server?.stop());
  return live;
}

/** Run a node script as its own process (asynchronously, so servers of this process
 * answer it); its standard output, or a rejection with its standard error. */
export function runNode(file: string, args: string[], input: string, env: Record<string, string>): Promise<string> {
  const child = spawn(process.execPath, [file, ...args], { env: { ...process.env, ...env } });
  let stdout = "";
  let stderr = "";
  child.stdout.on("data", (c) => (stdout += c));
  child.stderr.on("data", (c) => (stderr += c));
  child.stdin.end(input);
  return new Promise((done, fail) => {
    child.once("exit", (code) => (code === 0 ? done(stdout) : fail(new Error(`${file} exited ${code}: ${stderr}`))));
  });
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

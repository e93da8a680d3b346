/**
 * Verify a contextlog webhook delivery (the Standard Webhooks signature scheme): an
 * HMAC-SHA256 of `<webhook-id>.<webhook-timestamp>.<raw body>` keyed with the base64 part
 * of the webhook's `whsec_` secret, sent as `v1,<base64>` in `webhook-signature`. Uses the
 * Web Crypto API only.
 */

export class WebhookVerificationError extends Error {
  constructor(message: string) {
    super(message);
    this.name = "WebhookVerificationError";
  }
}

export interface VerifyOptions {
  /** Unix seconds to check the timestamp against (default: now) */
  now?: number;
  /** how far the timestamp may be from `now`, in seconds (default 300) */
  toleranceSeconds?: number;
}

type HeaderSource = Headers | Record<string, string | string[] | undefined>;

function header(headers: HeaderSource, name: string): string {
  if (typeof (headers as Headers).get === "function") return (headers as Headers).get(name) ?? "";
  const record = headers as Record<string, string | string[] | undefined>;
  const key = Object.keys(record).find((k) => k.toLowerCase() === name);
  const value = key === undefined ? undefined : record[key];
  return Array.isArray(value) ? (value[0] ?? "") : (value ?? "");
}

/** The HMAC of one attempt, as `v1,<base64>`. */
export async function sign(secret: string, id: string, timestamp: number, body: string | Uint8Array) {
  const key = await crypto.subtle.importKey(
    "raw",
    Buffer.from(secret.replace(/^whsec_/, ""), "base64"),
    { name: "HMAC", hash: "SHA-256" },
    false,
    ["sign"],
  );
  const raw = typeof body === "string" ? new TextEncoder().encode(body) : body;
  const signed = new Uint8Array([...new TextEncoder().encode(`${id}.${timestamp}.`), ...raw]);
  const digest = await crypto.subtle.sign("HMAC", key, signed);
  return "v1," + Buffer.from(digest).toString("base64");
}

function equal(a: string, b: string): boolean {
  if (a.length !== b.length) return false;
  let diff = 0;
  for (let i = 0; i < a.length; i++) diff |= a.charCodeAt(i) ^ b.charCodeAt(i);
  return diff === 0;
}

/**
 * Check a delivery and return its parsed payload (`{type, timestamp, data}`); throws
 * `WebhookVerificationError` when a header is missing, the timestamp is out of
 * tolerance, or no signature matches. Pass the raw body, before any JSON parsing.
 */
export async function verifyWebhook(
  secret: string,
  headers: HeaderSource,
  body: string | Uint8Array,
  options: VerifyOptions = {},
): Promise<{ type: string; timestamp: string; data: Record<string, unknown> }> {
  const id = header(headers, "webhook-id");
  const stamp = header(headers, "webhook-timestamp");
  const offered = header(headers, "webhook-signature");
  if (!id || !stamp || !offered) throw new WebhookVerificationError("missing webhook-* headers");
  const timestamp = Number(stamp);
  const now = options.now ?? Math.floor(Date.now() / 1000);
  if (!Number.isInteger(timestamp) || Math.abs(now - timestamp) > (options.toleranceSeconds ?? 300)) {
    throw new WebhookVerificationError("the timestamp is missing or out of tolerance");
  }
  const expected = await sign(secret, id, timestamp, body);
  if (!offered.split(" ").some((s) => equal(s, expected))) {
    throw new WebhookVerificationError("no matching signature");
  }
  const text = typeof body === "string" ? body : new TextDecoder().decode(body);
  return JSON.parse(text);
}

/**
 * toolsidecar worker library for Node.js.
 *
 * Serves tools over NATS by the toolsidecar worker protocol
 * (docs/worker-protocol.md): each tool is a NATS micro endpoint on
 * `<prefix>.<tool>` in queue group `toolsidecar`; the request body is the
 * manifest exactly as Core sent it; a success reply is the result bytes;
 * an error reply carries `Nats-Service-Error`, `Nats-Service-Error-Code` and
 * `Tool-Error-Type`. Progress messages (`Tool-Progress: 1`) keep a long call
 * alive; `<prefix>.cancel.<action_id>` aborts the call's signal.
 */
import { headers, type ConnectionOptions, type Msg, type NatsConnection, type Subscription } from "@nats-io/nats-core";
import { Svcm, type Service, type ServiceMsg } from "@nats-io/services";
import { connect as natsConnect } from "@nats-io/transport-node";
import { readFileSync, statSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";

/** The micro service name every worker library registers under. */
export const SERVICE_NAME = "toolsidecar-worker";
/** This library's version, in the service's metadata. */
export const VERSION = "0.1.0";
/** The variable naming the credentials file the sidecar's embedded NATS issues. */
export const CREDENTIALS_ENV = "TOOLSIDECAR_WORKER_CREDENTIALS";
/** The endpoint metadata key under which a tool's declaration is published. */
export const TOOL_METADATA_KEY = "toolsidecar.tool";

/** Where a sidecar on its defaults (embedded NATS on 127.0.0.1:4222) writes the worker credentials. */
export function defaultCredentials(): string {
  return join(tmpdir(), "toolsidecar-nats-4222", "worker-credentials.json");
}

/** What connect() of @nats-io/transport-node takes to reach the sidecar's NATS. */
export interface WorkerConnectOptions {
  servers: string;
  user?: string;
  pass?: string;
}

/**
 * Where and as whom a worker connects, as the Go and Python libraries
 * decide it: the file TOOLSIDECAR_WORKER_CREDENTIALS names; else NATS_URL
 * with NATS_USER and NATS_PASSWORD; else, with neither set, the file of a
 * sidecar on its defaults when it exists. NATS_URL overrides the file's URL.
 * The file must be this user's and readable by no one else: one anybody
 * could write would send the worker's calls to another server.
 *
 *   const nc = await connect({ ...connectOptions(), name: "my-worker" });
 */
export function connectOptions(env: NodeJS.ProcessEnv = process.env): WorkerConnectOptions {
  let path = env[CREDENTIALS_ENV] ?? "";
  if (!path && !env.NATS_URL && !env.NATS_USER) {
    try {
      statSync(defaultCredentials());
      path = defaultCredentials();
    } catch {
      // no sidecar on its defaults here
    }
  }
  if (path) {
    const c = readCredentials(path);
    return { servers: env.NATS_URL || c.url || "nats://127.0.0.1:4222", user: c.user, pass: c.password };
  }
  return { servers: env.NATS_URL || "nats://127.0.0.1:4222", user: env.NATS_USER || undefined, pass: env.NATS_PASSWORD || undefined };
}

/**
 * Why a worker connects without credentials, when connectOptions() found
 * none: the file it looked for and the variables that name others; "" when
 * it found some. A server that wants credentials answers only
 * "Authorization Violation": add this to the connect error.
 *
 *   const nc = await connect(opts).catch((e) => { throw new Error(`${e.message} (${noCredentials()})`); });
 */
export function noCredentials(env: NodeJS.ProcessEnv = process.env): string {
  const opts = connectOptions(env);
  if (opts.user) {
    return "";
  }
  if (env.NATS_URL) {
    return `NATS_URL is set and neither ${CREDENTIALS_ENV} (the sidecar's credentials file) nor NATS_USER is`;
  }
  return `no credentials file at ${defaultCredentials()}, where a sidecar on its defaults writes it (is the sidecar started?), and ${CREDENTIALS_ENV} names no other`;
}

/**
 * Connect to the sidecar's NATS as a worker does: where and as whom
 * connectOptions() says, reconnecting for ever once connected; opts come
 * after those (a name, say). A first connection that fails rejects at once
 * with an Error whose message names the server, the cause and what to
 * check, as the Go library's Connect does (the cause is the NATS client's
 * error, in `cause`): print its message, not its stack.
 *
 *   const nc = await connect({ name: "my-worker" }).catch((e) => { console.error(e.message); process.exit(1); });
 */
export async function connect(opts: ConnectionOptions = {}, env: NodeJS.ProcessEnv = process.env): Promise<NatsConnection> {
  const all: ConnectionOptions = { maxReconnectAttempts: -1, ...connectOptions(env), ...opts };
  try {
    return await natsConnect(all);
  } catch (e) {
    const reason = e instanceof Error ? e.message : String(e);
    throw new Error(`connecting to ${all.servers}: ${reason} (${connectFix(all, reason, env)})`, { cause: e });
  }
}

/** What to check when a first connection failed for reason. */
function connectFix(opts: ConnectionOptions, reason: string, env: NodeJS.ProcessEnv): string {
  if (!opts.user && !opts.token && !opts.authenticator) {
    // A server that wants credentials says only "Authorization Violation".
    return noCredentials(env);
  }
  if (/authorization|authentication/i.test(reason)) {
    return `the server refused user ${opts.user}: is ${CREDENTIALS_ENV} (or NATS_USER and NATS_PASSWORD) the current credentials of the sidecar behind this URL? It issues a new password at each start`;
  }
  return "is the sidecar started, with its NATS on that address? NATS_URL, or the url of the sidecar's credentials file, names it";
}

function readCredentials(path: string): { url?: string; user: string; password: string } {
  let st;
  try {
    st = statSync(path);
  } catch {
    throw new Error(`the credentials file ${path} does not exist: is the sidecar started (it writes the file), and is ${CREDENTIALS_ENV} its path?`);
  }
  if ((st.mode & 0o077) !== 0) {
    throw new Error(`the credentials file ${path}: mode ${(st.mode & 0o777).toString(8)}: others may read or change it (the sidecar writes it 0600)`);
  }
  if (process.getuid && st.uid !== process.getuid()) {
    throw new Error(`the credentials file ${path}: owned by uid ${st.uid}, not by this user (${process.getuid()})`);
  }
  let c: { url?: unknown; user?: unknown; password?: unknown };
  try {
    c = JSON.parse(readFileSync(path, "utf8"));
  } catch {
    c = {};
  }
  if (typeof c.user !== "string" || typeof c.password !== "string" || !c.user || !c.password) {
    throw new Error(`the credentials file ${path} is not the sidecar's (JSON with url, user and password)`);
  }
  return { url: typeof c.url === "string" ? c.url : undefined, user: c.user, password: c.password };
}

/** The error taxonomy every worker language shares. */
export type ErrorType =
  | "invalid_args"
  | "not_found"
  | "timeout"
  | "worker_crash"
  | "rate_limited"
  | "cancelled"
  | "tool_error";

/** micro's numeric codes for each type. */
export const ERROR_CODES: Record<ErrorType, number> = {
  invalid_args: 400,
  not_found: 404,
  timeout: 504,
  worker_crash: 500,
  rate_limited: 429,
  cancelled: 499,
  tool_error: 422,
};

/**
 * Throw a ToolError from a handler to choose the error type the model sees.
 * Any other Error thrown is a `tool_error`, as a Go handler's returned error
 * is; a thrown value that is not an Error is a `worker_crash`, as a Go
 * panic is (docs/worker-protocol.md, "Errors").
 */
export class ToolError extends Error {
  constructor(
    readonly type: ErrorType,
    message: string,
  ) {
    super(message);
    this.name = "ToolError";
  }
}

/**
 * The reason of `call.signal` when the sidecar cancelled the call (it no
 * longer waits for the reply): `call.signal.reason instanceof CancelledBySidecar`.
 */
export class CancelledBySidecar extends ToolError {
  constructor() {
    super("cancelled", "cancelled by the sidecar");
    this.name = "CancelledBySidecar";
  }
}

/** One call, as a handler receives it; A is the type of its arguments. */
export interface Call<A = unknown> {
  tool: string;
  runId: string;
  actionId: string;
  toolCallId: string;
  /** The model's arguments, parsed (the sidecar validated them against the tool's schema). */
  args: A;
  /** The request body, the manifest as Core sent it. */
  manifest: Uint8Array;
  attempt: number;
  /** Absolute deadline from Tool-Deadline, restarted by progress(). */
  deadline?: Date;
  /** The Action ID: stable across retries, for de-duplication. */
  idempotencyKey: string;
  traceparent: string;
  /**
   * Aborted on cancellation by the sidecar (reason: a CancelledBySidecar)
   * or at the deadline (reason: a ToolError of type "timeout").
   */
  signal: AbortSignal;
  /** Tell the sidecar the call is alive; restarts both deadlines. */
  progress(): void;
}

/**
 * A handler returns the result: a string or bytes as is, anything else as
 * JSON. Type its arguments with the parameter: `Handler<{ city: string }>`.
 */
export type Handler<A = any> = (call: Call<A>) => unknown | Promise<unknown>;

export interface ServeOptions {
  /** Subject prefix; default "toolsidecar.tools". */
  prefix?: string;
  /** micro service name; default SERVICE_NAME, shared by every library. */
  name?: string;
  version?: string;
  /** Calls run at once across tools; default 64. */
  concurrency?: number;
  /** Aborting it stops the worker, as stop() does. */
  signal?: AbortSignal;
}

/** A running worker, as serve() resolves it: serving until stopped. */
export interface Worker {
  service: Service;
  /** Stop taking calls and wait for those in flight; resolves as stopped does. */
  stop(): Promise<void>;
  /**
   * Resolves once the worker has stopped, by stop() or by serve()'s
   * signal, and the calls in flight have ended: await it to serve until
   * then (`await worker.stopped`).
   */
  stopped: Promise<void>;
}

const HEADER = {
  deadline: "Tool-Deadline",
  attempt: "Tool-Attempt",
  idempotencyKey: "Tool-Idempotency-Key",
  traceparent: "traceparent",
  progress: "Tool-Progress",
  errorType: "Tool-Error-Type",
  serviceError: "Nats-Service-Error",
  serviceCode: "Nats-Service-Error-Code",
  describe: "Tool-Describe",
  worker: "Tool-Worker",
} as const;

const encoder = new TextEncoder();
const decoder = new TextDecoder();

/** A JSON Schema object. */
export type JsonSchema = Record<string, unknown>;

/** The part of a zod 4 schema the library uses (zod is an optional peer). */
export interface ZodLike {
  _zod: unknown;
  safeParse(v: unknown): { success: true; data: unknown } | { success: false; error: { message: string } };
}

/** What a worker declares of a tool besides its handler. */
export interface ToolSpec {
  name: string;
  /** What the model reads of the tool. */
  description?: string;
  /** The arguments' JSON Schema, or a zod schema (zod 4, when installed): the arguments are then parsed by it. */
  parameters?: JsonSchema | ZodLike;
  /** Absent: unsafe, never sent twice. */
  sideEffects?: "read_only" | "idempotent" | "unsafe";
  /** Per attempt; absent: the sidecar's default (30 s). */
  timeoutMs?: number;
  /** After a timeout, no responders or a retryable error. */
  retries?: number;
}

/** A tool declared in code, made by tool() and served by serve(). */
export interface DeclaredTool<A = any> {
  spec: ToolSpec;
  handler: Handler<A>;
}

/**
 * Declare a tool in code: the sidecar reads its name, description, schema,
 * side effects, timeout and retries from this worker, and needs no
 * configuration entry for it.
 *
 *   const getWeather = tool({ name: "get_weather", description: "Weather for a city",
 *     parameters: z.object({ city: z.string() }), sideEffects: "read_only" },
 *     async (call) => ({ city: call.args.city, forecast: "sunny" }));
 *   await serve(nc, [getWeather]);
 */
export function tool<A = any>(spec: ToolSpec, handler: Handler<A>): DeclaredTool<A> {
  if (!/^[A-Za-z0-9_-]{1,64}$/.test(spec.name)) throw new Error(`tool name ${JSON.stringify(spec.name)}: want 1 to 64 of A-Z a-z 0-9 _ -`);
  return { spec, handler };
}

function isZod(p: unknown): p is ZodLike {
  return typeof p === "object" && p !== null && "_zod" in p && typeof (p as ZodLike).safeParse === "function";
}

/** The declaration as the sidecar reads it from the endpoint's metadata. */
export async function declaration(spec: ToolSpec): Promise<string> {
  let parameters: JsonSchema | undefined;
  if (isZod(spec.parameters)) {
    const zod = (await import("zod")) as unknown as { toJSONSchema(s: unknown, o: { io: "input" }): JsonSchema };
    // The arguments as the model writes them: a field with a default is optional.
    const { $schema: _ignored, ...schema } = zod.toJSONSchema(spec.parameters, { io: "input" });
    parameters = schema;
  } else {
    parameters = spec.parameters;
  }
  const d: Record<string, unknown> = { description: spec.description ?? "", parameters };
  if (spec.sideEffects) d.side_effects = spec.sideEffects;
  if (spec.timeoutMs) d.timeout = `${Math.round(spec.timeoutMs)}ms`;
  if (spec.retries) d.retries = spec.retries;
  return JSON.stringify(d);
}

/** A declared tool's handler, with its arguments parsed by its zod schema when it has one. */
function declaredHandler(t: DeclaredTool): Handler {
  const p = t.spec.parameters;
  if (!isZod(p)) return t.handler;
  return (call) => {
    const parsed = p.safeParse(call.args);
    if (!parsed.success) throw new ToolError("invalid_args", parsed.error.message);
    return t.handler({ ...call, args: parsed.data });
  };
}

/**
 * Serve the given tools: a list of tools declared with tool() (the sidecar
 * learns their schemas from this worker), or a record of name to handler
 * (tools the sidecar's configuration declares) or to a declared tool. It
 * resolves once the worker is serving (every endpoint known to the
 * server), not when it stops: the worker serves until stop() is called or
 * opts.signal aborts, and `worker.stopped` resolves then.
 *
 *   const worker = await serve(nc, tools, { signal });
 *   await worker.stopped; // serving until the signal aborts
 */
export async function serve(
  nc: NatsConnection,
  tools: Record<string, Handler | DeclaredTool> | DeclaredTool[],
  opts: ServeOptions = {},
): Promise<Worker> {
  const entries: Array<[string, Handler | DeclaredTool]> = Array.isArray(tools) ? tools.map((t) => [t.spec.name, t]) : Object.entries(tools);
  const served: Array<{ name: string; handler: Handler; metadata?: Record<string, string> }> = [];
  for (const [name, h] of entries) {
    if (typeof h === "function") served.push({ name, handler: h });
    else served.push({ name, handler: declaredHandler(h), metadata: { [TOOL_METADATA_KEY]: await declaration(h.spec) } });
  }
  const prefix = opts.prefix ?? "toolsidecar.tools";
  const limit = opts.concurrency ?? 64;
  const inflight = new Map<string, AbortController>();
  const running = new Set<Promise<void>>();
  const waiting: Array<() => void> = [];
  let active = 0;

  const acquire = async () => {
    if (active >= limit) await new Promise<void>((resolve) => waiting.push(resolve));
    active++;
  };
  const release = () => {
    active--;
    waiting.shift()?.();
  };

  const cancelSub: Subscription = nc.subscribe(`${prefix}.cancel.*`, {
    callback: (_err, m) => {
      const id = m.subject.slice(`${prefix}.cancel.`.length);
      inflight.get(id)?.abort(new CancelledBySidecar());
    },
  });

  const service = await new Svcm(nc).add({
    name: opts.name ?? SERVICE_NAME,
    version: opts.version ?? VERSION,
    metadata: { language: "node", library_version: VERSION },
    queue: "toolsidecar",
  });
  for (const { name: tool, handler, metadata } of served) {
    service.addEndpoint(tool, {
      subject: `${prefix}.${tool}`,
      metadata,
      handler: (_err, msg) => {
        if (msg.headers?.get(HEADER.describe)) {
          answerDescribe(msg, tool, metadata?.[TOOL_METADATA_KEY], service.info().id);
          return;
        }
        const p = (async () => {
          await acquire();
          try {
            await handle(nc, tool, handler, msg, inflight);
          } finally {
            release();
          }
        })();
        running.add(p);
        void p.finally(() => running.delete(p));
      },
    });
  }

  // The server knows every subscription once this resolves: a caller
  // that is told the worker serves can send it calls at once.
  await nc.flush();

  let stopping: Promise<void> | undefined;
  let markStopped: () => void = () => {};
  const stopped = new Promise<void>((resolve) => (markStopped = resolve));
  const worker: Worker = {
    service,
    stopped,
    stop() {
      stopping ??= (async () => {
        await service.stop();
        cancelSub.unsubscribe();
        await Promise.allSettled([...running]);
        markStopped();
      })();
      return stopping;
    },
  };
  if (opts.signal?.aborted) await worker.stop();
  opts.signal?.addEventListener("abort", () => void worker.stop(), { once: true });
  return worker;
}

async function handle(
  nc: NatsConnection,
  tool: string,
  handler: Handler,
  msg: ServiceMsg,
  inflight: Map<string, AbortController>,
): Promise<void> {
  let manifest: { run_id?: string; action_id?: string; tool_call_id?: string; args?: unknown };
  try {
    manifest = JSON.parse(decoder.decode(msg.data));
  } catch (e) {
    replyError(msg, new ToolError("invalid_args", `request body is not a manifest: ${(e as Error).message}`));
    return;
  }
  const h = msg.headers;
  const controller = new AbortController();
  const actionId = manifest.action_id ?? "";
  if (actionId) inflight.set(actionId, controller);

  const deadlineMs = Number(h?.get(HEADER.deadline) ?? "");
  const budget = Number.isFinite(deadlineMs) && deadlineMs > 0 ? deadlineMs - Date.now() : 0;
  let timer: NodeJS.Timeout | undefined;
  const arm = () => {
    if (budget <= 0) return;
    clearTimeout(timer);
    timer = setTimeout(() => controller.abort(new ToolError("timeout", "deadline passed")), budget);
  };
  arm();

  const call: Call = {
    tool,
    runId: manifest.run_id ?? "",
    actionId,
    toolCallId: manifest.tool_call_id ?? "",
    args: manifest.args,
    manifest: msg.data,
    attempt: Number(h?.get(HEADER.attempt) ?? "1") || 1,
    deadline: budget > 0 ? new Date(deadlineMs) : undefined,
    idempotencyKey: h?.get(HEADER.idempotencyKey) ?? "",
    traceparent: h?.get(HEADER.traceparent) ?? "",
    signal: controller.signal,
    progress() {
      if (!msg.reply) return;
      const ph = headers();
      ph.set(HEADER.progress, "1");
      nc.publish(msg.reply, undefined, { headers: ph });
      arm();
    },
  };

  try {
    const result = await Promise.race([
      Promise.resolve().then(() => handler(call)),
      new Promise<never>((_, reject) => {
        controller.signal.addEventListener("abort", () => reject(controller.signal.reason), { once: true });
      }),
    ]);
    msg.respond(encode(result));
  } catch (e) {
    if (controller.signal.reason instanceof CancelledBySidecar) {
      return; // the sidecar stopped waiting; nobody reads a reply
    }
    replyError(msg, e);
  } finally {
    clearTimeout(timer);
    if (actionId) inflight.delete(actionId);
  }
}

/**
 * Answers the sidecar's request for a tool's declaration, sent on the
 * tool's own subject: only a worker allowed to serve the tool receives it,
 * so the sidecar takes declarations from these answers alone. The tool
 * does not run.
 */
function answerDescribe(msg: Msg, tool: string, declaration: string | undefined, id: string): void {
  const h = headers();
  h.set(HEADER.worker, `node ${id}`);
  if (declaration === undefined) {
    h.set(HEADER.serviceError, `tool ${tool} is served without a declaration`);
    h.set(HEADER.serviceCode, "404");
    msg.respond(undefined, { headers: h });
    return;
  }
  msg.respond(encoder.encode(declaration), { headers: h });
}

function encode(result: unknown): Uint8Array {
  if (result instanceof Uint8Array) return result;
  if (typeof result === "string") return encoder.encode(result);
  return encoder.encode(JSON.stringify(result ?? null));
}

function replyError(msg: Msg, e: unknown): void {
  const err = e instanceof ToolError ? e : new ToolError(e instanceof Error ? "tool_error" : "worker_crash", describe(e));
  const h = headers();
  // One header line: a line break would end the header block early.
  h.set(HEADER.serviceError, err.message.replace(/\r\n|\r|\n/g, " "));
  h.set(HEADER.serviceCode, String(ERROR_CODES[err.type]));
  h.set(HEADER.errorType, err.type);
  msg.respond(undefined, { headers: h });
}

function describe(e: unknown): string {
  if (e instanceof Error) return e.message;
  return `worker threw ${String(e)}`;
}

import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import { connect } from "@nats-io/transport-node";
import { createInbox, headers, type NatsConnection } from "@nats-io/nats-core";
import { execFileSync, spawn, spawnSync } from "node:child_process";
import { once } from "node:events";
import { chmodSync, existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { z } from "zod";
import {
  CancelledBySidecar,
  connect as connectWorker,
  connectOptions,
  noCredentials,
  CREDENTIALS_ENV,
  serve,
  tool,
  TOOL_METADATA_KEY,
  ToolError,
  VERSION,
  type Handler,
  type Worker,
} from "../src/index.js";

// A real NATS server is started by scripts/with-nats.sh (npm run test:nats).
const url = process.env.NATS_URL;
if (!url) throw new Error("NATS_URL is not set: run the tests through scripts/with-nats.sh");

const prefix = "nodetest";
const decoder = new TextDecoder();
let nc: NatsConnection;
let side: NatsConnection;
let worker: Worker;
let cancelled: Promise<unknown>;
let resolveCancelled: (reason: unknown) => void;

const manifest = (tool: string, actionId: string, args: unknown) =>
  JSON.stringify({ type: "tool_call_manifest", run_id: "run_1", action_id: actionId, tool_call_id: "call_" + actionId, tool, args });

function sidecarHeaders(actionId: string, timeoutMs: number) {
  const h = headers();
  h.set("Tool-Deadline", String(Date.now() + timeoutMs));
  h.set("Tool-Attempt", "2");
  h.set("Tool-Idempotency-Key", actionId);
  h.set("traceparent", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01");
  return h;
}

before(async () => {
  nc = await connect({ servers: url });
  side = await connect({ servers: url });
  cancelled = new Promise((resolve) => (resolveCancelled = resolve));
  worker = await serve(
    nc,
    {
      echo: ((call) => ({ args: call.args, attempt: call.attempt, key: call.idempotencyKey, trace: call.traceparent, callId: call.toolCallId })) as Handler<{ x: number }>,
      text: () => "plain text",
      typed: () => {
        throw new ToolError("rate_limited", "slow down");
      },
      plain: async () => {
        throw new Error("disk full");
      },
      slow: async (call) => {
        for (let i = 0; i < 12; i++) {
          await new Promise((r) => setTimeout(r, 50));
          call.progress();
        }
        return { done: true };
      },
      hang: (call) =>
        new Promise((_, reject) => {
          call.signal.addEventListener("abort", () => {
            resolveCancelled(call.signal.reason);
            reject(call.signal.reason);
          });
        }),
    },
    { prefix },
  );
  await nc.flush();
});

after(async () => {
  await worker.stop();
  await nc.drain();
  await side.drain();
});

test("success carries the manifest and the headers", async () => {
  const r = await side.request(`${prefix}.echo`, manifest("echo", "act_1", { x: 1 }), { timeout: 2000, headers: sidecarHeaders("act_1", 2000) });
  assert.equal(r.headers?.get("Nats-Service-Error-Code") ?? "", "");
  assert.deepEqual(JSON.parse(decoder.decode(r.data)), {
    args: { x: 1 },
    attempt: 2,
    key: "act_1",
    trace: "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
    callId: "call_act_1",
  });
  const t = await side.request(`${prefix}.text`, manifest("text", "act_2", {}), { timeout: 2000 });
  assert.equal(decoder.decode(t.data), "plain text");
});

test("errors become micro error headers with the taxonomy", async () => {
  const cases: Array<[string, string, string, string]> = [
    ["typed", "rate_limited", "429", "slow down"],
    ["plain", "tool_error", "422", "disk full"],
  ];
  for (const [tool, type, code, message] of cases) {
    const r = await side.request(`${prefix}.${tool}`, manifest(tool, "act_" + tool, {}), { timeout: 2000 });
    assert.equal(r.headers?.get("Tool-Error-Type"), type, tool);
    assert.equal(r.headers?.get("Nats-Service-Error-Code"), code, tool);
    assert.equal(r.headers?.get("Nats-Service-Error"), message, tool);
  }
  const bad = await side.request(`${prefix}.echo`, "not json", { timeout: 2000 });
  assert.equal(bad.headers?.get("Tool-Error-Type"), "invalid_args");
});

test("progress messages reach the reply subject before the result", async () => {
  const inbox = createInbox();
  const seen: string[] = [];
  const done = new Promise<void>((resolve) => {
    side.subscribe(inbox, {
      callback: (_e, m) => {
        if (m.headers?.get("Tool-Progress") === "1") seen.push("progress");
        else {
          seen.push("result:" + decoder.decode(m.data));
          resolve();
        }
      },
    });
  });
  side.publish(`${prefix}.slow`, manifest("slow", "act_slow", {}), { reply: inbox, headers: sidecarHeaders("act_slow", 400) });
  await done;
  assert.ok(seen.filter((s) => s === "progress").length >= 3, seen.join(","));
  assert.equal(seen.at(-1), 'result:{"done":true}');
});

test("the cancel subject aborts the call and no reply is sent", async () => {
  const inbox = createInbox();
  let replies = 0;
  side.subscribe(inbox, { callback: () => replies++ });
  side.publish(`${prefix}.hang`, manifest("hang", "act_hang", {}), { reply: inbox, headers: sidecarHeaders("act_hang", 10000) });
  await side.flush();
  await new Promise((r) => setTimeout(r, 100));
  side.publish(`${prefix}.cancel.act_hang`);
  const reason = await cancelled;
  assert.ok(reason instanceof CancelledBySidecar && reason.type === "cancelled");
  await new Promise((r) => setTimeout(r, 100));
  assert.equal(replies, 0);
});

test("endpoints are micro endpoints found through $SRV.INFO", async () => {
  const r = await side.request("$SRV.INFO", undefined, { timeout: 2000 });
  const info = JSON.parse(decoder.decode(r.data));
  const subjects = info.endpoints.map((e: { subject: string }) => e.subject).sort();
  assert.ok(subjects.includes(`${prefix}.echo`) && subjects.includes(`${prefix}.hang`), subjects.join(","));
  assert.equal(info.endpoints[0].queue_group, "toolsidecar");
  assert.equal(info.name, "toolsidecar-worker");
  assert.deepEqual(info.metadata, { language: "node", library_version: VERSION });
});

test("declared tools: zod and JSON Schema declarations in the endpoint metadata, arguments parsed by zod", async () => {
  const rates = tool(
    { name: "rates", description: "Hotel rates", parameters: z.object({ city: z.string(), nights: z.number().int().min(1).default(1) }), sideEffects: "read_only", timeoutMs: 2500 },
    async (call: { args: { city: string; nights: number } }) => ({ city: call.args.city, nights: call.args.nights }),
  );
  const plain = tool(
    { name: "plain", parameters: { type: "object", required: ["q"], properties: { q: { type: "string" } } }, retries: 2 },
    async (call) => call.args,
  );
  const w = await serve(nc, [rates, plain], { prefix: prefix + "d" });
  try {
    const inbox = createInbox();
    const sub = side.subscribe(inbox);
    side.publish("$SRV.INFO", undefined, { reply: inbox });
    const decls: Record<string, { description: string; parameters: any; side_effects?: string; timeout?: string; retries?: number }> = {};
    for await (const m of sub) {
      const info = JSON.parse(decoder.decode(m.data));
      for (const e of info.endpoints) {
        if (e.subject.startsWith(prefix + "d.")) decls[e.name] = JSON.parse(e.metadata[TOOL_METADATA_KEY]);
      }
      if (Object.keys(decls).length === 2) break;
    }
    assert.equal(decls.rates.description, "Hotel rates");
    assert.equal(decls.rates.side_effects, "read_only");
    assert.equal(decls.rates.timeout, "2500ms");
    assert.deepEqual(decls.rates.parameters.required, ["city"]);
    assert.equal(decls.rates.parameters.properties.nights.minimum, 1);
    assert.equal(decls.rates.parameters.$schema, undefined);
    assert.deepEqual(decls.plain.parameters.required, ["q"]);
    assert.equal(decls.plain.retries, 2);

    // The sidecar takes a declaration only from a describe request on the
    // tool's own subject; the tool does not run for it.
    const dh = headers();
    dh.set("Tool-Describe", "1");
    const described = await side.request(`${prefix}d.rates`, undefined, { timeout: 2000, headers: dh });
    assert.deepEqual(JSON.parse(decoder.decode(described.data)), decls.rates);
    assert.match(described.headers?.get("Tool-Worker") ?? "", /^node \S+$/);

    const ok = await side.request(`${prefix}d.rates`, manifest("rates", "act_z1", { city: "Oslo" }), { timeout: 2000 });
    assert.deepEqual(JSON.parse(decoder.decode(ok.data)), { city: "Oslo", nights: 1 });
    const bad = await side.request(`${prefix}d.rates`, manifest("rates", "act_z2", { city: "Oslo", nights: 0 }), { timeout: 2000 });
    assert.equal(bad.headers?.get("Tool-Error-Type"), "invalid_args");
  } finally {
    await w.stop();
  }
});

test("connectOptions reads the sidecar's credentials file and refuses one others may read", () => {
  const dir = mkdtempSync(join(tmpdir(), "creds-"));
  const file = join(dir, "worker-credentials.json");
  writeFileSync(file, JSON.stringify({ url: "nats://127.0.0.1:4999", user: "toolsidecar-worker", password: "pw" }), { mode: 0o600 });
  assert.deepEqual(connectOptions({ [CREDENTIALS_ENV]: file }), { servers: "nats://127.0.0.1:4999", user: "toolsidecar-worker", pass: "pw" });
  assert.equal(connectOptions({ [CREDENTIALS_ENV]: file, NATS_URL: "nats://h:1" }).servers, "nats://h:1");
  chmodSync(file, 0o644);
  assert.throws(() => connectOptions({ [CREDENTIALS_ENV]: file }), /others may read/);
  assert.throws(() => connectOptions({ [CREDENTIALS_ENV]: join(dir, "none") }), /does not exist: is the sidecar started/);
  assert.deepEqual(connectOptions({ NATS_URL: "nats://h:2", NATS_USER: "u", NATS_PASSWORD: "p" }), { servers: "nats://h:2", user: "u", pass: "p" });
  rmSync(dir, { recursive: true });
});

test("noCredentials names the file looked for and the variable, when no credentials were found", () => {
  const dir = mkdtempSync(join(tmpdir(), "nocreds-"));
  const saved = process.env.TMPDIR;
  process.env.TMPDIR = dir; // no sidecar on its defaults here
  try {
    const file = join(dir, "worker-credentials.json");
    assert.match(noCredentials({}), new RegExp(`no credentials file at ${join(dir, "toolsidecar-nats-4222")}.*${CREDENTIALS_ENV} names no other`));
    assert.match(noCredentials({ NATS_URL: "nats://h:1" }), new RegExp(`NATS_URL is set and neither ${CREDENTIALS_ENV}`));
    writeFileSync(file, JSON.stringify({ user: "toolsidecar-worker", password: "pw" }), { mode: 0o600 });
    assert.equal(noCredentials({ [CREDENTIALS_ENV]: file }), "");
  } finally {
    if (saved === undefined) {
      delete process.env.TMPDIR;
    } else {
      process.env.TMPDIR = saved;
    }
    rmSync(dir, { recursive: true });
  }
});

test("serve({ signal }) stops the worker when the signal aborts; worker.stopped resolves after the calls in flight", async () => {
  const conn = await connect({ servers: url });
  const ac = new AbortController();
  let release: () => void = () => {};
  const gate = new Promise<void>((resolve) => (release = resolve));
  let started: () => void = () => {};
  const inFlight = new Promise<void>((resolve) => (started = resolve));
  const order: string[] = [];
  const w = await serve(
    conn,
    {
      ping: () => "pong",
      slow: async () => {
        started();
        await gate;
        order.push("call ended");
        return "late";
      },
    },
    { prefix: "nodestop", signal: ac.signal, name: "stoppable" },
  );
  assert.ok(w.stopped instanceof Promise, "serve resolves a worker without a stopped promise");
  const ok = await side.request("nodestop.ping", manifest("ping", "act_p", {}), { timeout: 2000 });
  assert.equal(decoder.decode(ok.data), "pong");
  const slow = side.request("nodestop.slow", manifest("slow", "act_s", {}), { timeout: 5000 });
  await inFlight;
  const done = w.stopped.then(() => order.push("stopped"));
  ac.abort();
  release();
  await done;
  assert.deepEqual(order, ["call ended", "stopped"]);
  assert.equal(decoder.decode((await slow).data), "late");
  await w.stop(); // the same stop, already done
  await assert.rejects(side.request("nodestop.ping", manifest("ping", "act_q", {}), { timeout: 500 }));
  await conn.drain();
});

/** Starts natsd (scripts/with-nats.sh's NATSD) letting in only user worker with password; resolves its URL. */
async function natsdWithPassword(password: string): Promise<{ url: string; stop: () => Promise<void> }> {
  const dir = mkdtempSync(join(tmpdir(), "natsd-"));
  const file = join(dir, "url");
  const p = spawn(process.env.NATSD ?? "", ["--listen", "127.0.0.1:-1", "--url-file", file, "--worker-password", password], { stdio: "ignore" });
  while (!existsSync(file) || readFileSync(file, "utf8") === "") {
    if (p.exitCode !== null) throw new Error(`natsd exited ${p.exitCode}`);
    await new Promise((resolve) => setTimeout(resolve, 20));
  }
  return {
    url: readFileSync(file, "utf8"),
    stop: async () => {
      p.kill();
      if (p.exitCode === null) await once(p, "exit");
      rmSync(dir, { recursive: true });
    },
  };
}

test("connect(): a wrong URL, missing or refused credentials reject with an Error naming the cause and the fix", async () => {
  await assert.rejects(connectWorker({}, { NATS_URL: "nats://127.0.0.1:1", NATS_USER: "worker", NATS_PASSWORD: "p" }), (e: Error) => {
    assert.match(e.message, /^connecting to nats:\/\/127\.0\.0\.1:1: .*refused.* \(is the sidecar started, with its NATS on that address\?/);
    return true;
  });
  const srv = await natsdWithPassword("s3cret");
  try {
    await assert.rejects(connectWorker({}, { NATS_URL: srv.url }), (e: Error) => {
      assert.match(e.message, /Authorization Violation/i);
      assert.ok(e.message.includes(`(NATS_URL is set and neither ${CREDENTIALS_ENV}`), e.message);
      return true;
    });
    await assert.rejects(connectWorker({}, { NATS_URL: srv.url, NATS_USER: "worker", NATS_PASSWORD: "wrong" }), (e: Error) => {
      assert.ok(e.message.includes("the server refused user worker"), e.message);
      return true;
    });
    const nc = await connectWorker({}, { NATS_URL: srv.url, NATS_USER: "worker", NATS_PASSWORD: "s3cret" });
    await nc.close();
  } finally {
    await srv.stop();
  }
});

test("the example worker says in one line why it cannot connect, with no stack trace", () => {
  const script = new URL("../examples/worker.js", import.meta.url);
  const r = spawnSync("node", [script.pathname], { env: { ...process.env, NATS_URL: "nats://127.0.0.1:1", NATS_USER: "worker", NATS_PASSWORD: "p" }, encoding: "utf8" });
  assert.equal(r.status, 1, r.stderr);
  const lines = r.stderr.trim().split("\n");
  assert.equal(lines.length, 1, r.stderr);
  assert.match(lines[0], /^connecting to nats:\/\/127\.0\.0\.1:1: .*is the sidecar started/);
});

test("npm install <checkout>/plugins/node into a new application works offline, and the application serves a tool with it", () => {
  // The folder is linked: the library's NATS client (its locked dev
  // dependencies, which npm ci put in plugins/node) serves the application
  // too, so nothing comes from the registry.
  const app = mkdtempSync(join(tmpdir(), "node-app-"));
  try {
    writeFileSync(join(app, "package.json"), JSON.stringify({ name: "app", version: "1.0.0", type: "module", private: true }));
    execFileSync("npm", ["install", "--offline", "--no-audit", "--no-fund", new URL("../..", import.meta.url).pathname], { cwd: app, encoding: "utf8", stdio: "pipe" });
    const program = `import { connect, serve } from "@toolsidecar/worker";
      const nc = await connect({ name: "app" });
      const w = await serve(nc, { ping: () => "pong" }, { prefix: "nodeapp" });
      const r = await nc.request("nodeapp.ping", "{}", { timeout: 2000 });
      await w.stop();
      await nc.drain();
      console.log(new TextDecoder().decode(r.data));`;
    const out = execFileSync("node", ["--input-type=module", "-e", program], { cwd: app, encoding: "utf8" });
    assert.equal(out.trim(), "pong");
  } finally {
    rmSync(app, { recursive: true });
  }
});

test("typed handlers: Handler<A> gives call.args the type A", () => {
  const h: Handler<{ city: string }> = (call) => call.args.city.toUpperCase();
  assert.equal(typeof h, "function");
});

test("npm pack ships exactly the library, its types, README and LICENSE", () => {
  const out = execFileSync("npm", ["pack", "--dry-run", "--json", "--ignore-scripts=false"], { cwd: new URL("../..", import.meta.url), encoding: "utf8" });
  const files = (JSON.parse(out)[0].files as Array<{ path: string }>).map((f) => f.path).sort();
  assert.deepEqual(files, [
    "LICENSE",
    "README.md",
    "dist/cjs/index.d.ts",
    "dist/cjs/index.js",
    "dist/cjs/package.json",
    "dist/src/index.d.ts",
    "dist/src/index.js",
    "package.json",
  ]);
});

test("the package loads by its name from ESM and from CommonJS, as the NATS client does", () => {
  const cwd = new URL("../..", import.meta.url);
  const esm = execFileSync("node", ["--input-type=module", "-e", "import * as w from '@toolsidecar/worker'; console.log(typeof w.serve, typeof w.tool, w.SERVICE_NAME)"], { cwd, encoding: "utf8" });
  const cjs = execFileSync(
    "node",
    ["-e", "const w = require('@toolsidecar/worker'); const { z } = require('zod'); w.declaration({ name: 't', parameters: z.object({ a: z.string() }) }).then((d) => console.log(typeof w.serve, typeof w.tool, w.SERVICE_NAME, d))"],
    { cwd, encoding: "utf8" },
  );
  assert.equal(esm.trim(), "function function toolsidecar-worker");
  assert.match(cjs, /^function function toolsidecar-worker \{"description":"","parameters":\{"type":"object","properties":\{"a":\{"type":"string"\}\},"required":\["a"\]\}\}/);
});

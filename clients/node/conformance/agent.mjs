#!/usr/bin/env node
// The conformance agent of @fencelock/client: speaks the JSON-lines
// protocol of clients/conformance/PROTOCOL.md (version 1) on stdin/stdout
// and drives the library through its public API only. No lock logic here:
// retries, renewals and stop-by are the library's.
//
// Run from the repository root: `node clients/node/conformance/agent.mjs`
// (after `npm ci && npm run build` in clients/node).
import { createConnection } from "node:net";
import { createInterface } from "node:readline";

// The built library (dist/) and its dependencies: `npm ci` in clients/node
// installs and builds them (clients/node/test.sh does).
let lib;
let grpcStatus;
try {
  lib = await import("../dist/index.js");
  ({ status: grpcStatus } = await import("@grpc/grpc-js"));
} catch (e) {
  process.stderr.write(
    `[node-agent] cannot load @fencelock/client (${e.message}); run \`npm ci\` in clients/node first\n`,
  );
  process.exit(3);
}
const { Client, FencelockError, tlsFromFiles } = lib;

const AGENT_VERSION = "0.1.0";
const PROTOCOL = 1;
const STORE_TIMEOUT_MS = 5000;
const EXIT_RELEASE_MS = 2000;

let client;
const leases = new Map();
let nextHandle = 1;

function send(obj) {
  process.stdout.write(JSON.stringify(obj) + "\n");
}

function log(...args) {
  process.stderr.write(`[node-agent] ${args.join(" ")}\n`);
}

const CODE_NAMES = Object.fromEntries(Object.entries(grpcStatus).map(([name, value]) => [value, name]));

class AgentError extends Error {
  constructor(kind, message, reason = null, code = null) {
    super(message);
    this.kind = kind;
    this.reason = reason;
    this.code = code;
  }
}

/** The library's typed error as a protocol ERROR. */
function errorObject(e) {
  if (e instanceof AgentError) return { kind: e.kind, reason: e.reason, code: e.code, message: e.message };
  if (e instanceof FencelockError) {
    const code = e.grpcCode === undefined ? null : (CODE_NAMES[e.grpcCode] ?? String(e.grpcCode));
    switch (e.code) {
      case "REJECTED":
        return { kind: "rejected", reason: e.reason ?? null, code, message: e.message };
      case "GRPC":
        return { kind: "rejected", reason: null, code, message: e.message };
      case "UNAVAILABLE":
        return { kind: "unavailable", reason: e.reason ?? null, code, message: e.message };
      case "LEASE_ENDED":
        return { kind: "lease_ended", reason: e.leaseState ?? null, code: null, message: e.message };
      case "INVALID_ARGUMENT":
        return { kind: "invalid_argument", reason: null, code: null, message: e.message };
      case "INVALID_CONFIG":
      case "INVALID_ENDPOINT":
        return { kind: "invalid_config", reason: null, code: null, message: e.message };
      case "LOCK_LOST":
        return { kind: "lost", reason: e.lostReason ?? null, code: null, message: e.message };
      default:
        return { kind: "agent", reason: null, code: null, message: `${e.code}: ${e.message}` };
    }
  }
  return { kind: "agent", reason: null, code: null, message: String(e?.stack ?? e) };
}

const lostName = (reason) => (reason === "NOT_HELD" ? "not_held" : reason === "UNCONFIRMED" ? "unconfirmed" : null);
const stopByIn = (lease) => Math.round(lease.stopBy - performance.now());

function needClient() {
  if (!client) throw new AgentError("agent", "connect first");
  return client;
}

function lease(cmd) {
  const l = leases.get(cmd.handle);
  if (!l) throw new AgentError("agent", `unknown handle ${JSON.stringify(cmd.handle)}`);
  return l;
}

function storeWrite(store, line) {
  return new Promise((resolve, reject) => {
    const idx = store.lastIndexOf(":");
    const host = store.slice(0, idx).replace(/^\[|\]$/g, "");
    const port = Number(store.slice(idx + 1));
    const socket = createConnection({ host, port });
    let buffer = "";
    const timer = setTimeout(() => {
      socket.destroy();
      reject(new AgentError("agent", `fenced store ${store}: no answer within ${STORE_TIMEOUT_MS} ms`));
    }, STORE_TIMEOUT_MS);
    socket.setEncoding("utf8");
    socket.on("connect", () => socket.write(JSON.stringify(line) + "\n"));
    socket.on("data", (chunk) => {
      buffer += chunk;
      const nl = buffer.indexOf("\n");
      if (nl >= 0) {
        clearTimeout(timer);
        socket.end();
        try {
          resolve(JSON.parse(buffer.slice(0, nl)));
        } catch (e) {
          reject(new AgentError("agent", `fenced store ${store}: bad reply: ${e.message}`));
        }
      }
    });
    socket.on("error", (e) => {
      clearTimeout(timer);
      reject(new AgentError("agent", `fenced store ${store}: ${e.message}`));
    });
  });
}

const ops = {
  async hello() {
    return { agent: "node", client_version: AGENT_VERSION, protocol: PROTOCOL };
  },

  async connect(cmd) {
    if (client) throw new AgentError("agent", "connect was already called");
    const options = {};
    if (cmd.stop_by_margin_percent != null) options.stopByMarginPercent = cmd.stop_by_margin_percent;
    if (cmd.call_timeout_ms != null) options.callTimeoutMs = cmd.call_timeout_ms;
    if (cmd.attempt_timeout_ms != null) options.attemptTimeoutMs = cmd.attempt_timeout_ms;
    if (cmd.tls) options.tls = tlsFromFiles(cmd.tls.ca_file, cmd.tls.cert_file, cmd.tls.key_file);
    client = new Client(cmd.endpoints, options);
    return {};
  },

  async acquire(cmd) {
    const c = needClient();
    const options = { ttlMs: cmd.ttl_ms ?? 0, waitMs: cmd.wait_ms ?? 0 };
    if (cmd.request_id != null) {
      if (!/^([0-9a-fA-F]{2})*$/.test(cmd.request_id))
        throw new AgentError("agent", `request_id is not hex: ${cmd.request_id}`);
      options.requestId = Buffer.from(cmd.request_id, "hex");
    }
    const handle = cmd.handle ?? `h${nextHandle++}`;
    if (leases.has(handle)) throw new AgentError("agent", `handle ${handle} is in use`);
    const l = await c.lock(cmd.resource, options);
    leases.set(handle, l);
    l.onLost((reason) => {
      if (leases.get(handle) === l) send({ event: "lost", handle, lost_reason: lostName(reason), stop_by_in_ms: stopByIn(l) });
    });
    return {
      handle,
      token: l.token.toString(),
      lease_ttl_ms: l.leaseTtlMs,
      deduplicated: l.deduplicated,
      shard_id: l.shardId,
      request_id: l.requestId.toString("hex"),
      stop_by_in_ms: stopByIn(l),
    };
  },

  async status(cmd) {
    const l = lease(cmd);
    const lostReason = lostName(l.lostReason);
    return {
      held: l.isHeld,
      lost: lostReason !== null,
      lost_reason: lostReason,
      stop_by_in_ms: stopByIn(l),
      token: l.token.toString(),
    };
  },

  async wait_lost(cmd) {
    const l = lease(cmd);
    const timeoutMs = Math.max(0, Number(cmd.timeout_ms ?? 0));
    let timer;
    await Promise.race([l.lost, new Promise((r) => (timer = setTimeout(r, timeoutMs)))]);
    clearTimeout(timer);
    const lostReason = lostName(l.lostReason);
    return { lost: lostReason !== null, lost_reason: lostReason, stop_by_in_ms: stopByIn(l) };
  },

  async release(cmd) {
    const l = lease(cmd);
    leases.delete(cmd.handle);
    return { released: await l.release() };
  },

  async get(cmd) {
    const s = await needClient().get(cmd.resource);
    return {
      held: s.held,
      token: s.fencingToken.toString(),
      last_token: s.lastToken.toString(),
      queue_length: s.queueLength,
      shard_id: s.shardId,
      epoch: s.epoch,
    };
  },

  async fenced_write(cmd) {
    const l = lease(cmd);
    if (cmd.check_lease !== false && !l.isHeld) {
      throw new AgentError("lost", `the lease is not held (${l.lostReason ?? "stop-by passed"}); nothing was sent`, lostName(l.lostReason));
    }
    const reply = await storeWrite(cmd.store, { key: cmd.key, token: l.token.toString(), value: cmd.value });
    return { accepted: Boolean(reply.accepted), highest: String(reply.highest) };
  },

  async stats() {
    if (!client) return {};
    const s = client.stats;
    return { renew_calls: s.renewBatchCalls, renewed_items: s.renewedItems, renew_failures: s.renewFailures };
  },
};

async function handle(line) {
  if (!line.trim()) return;
  let cmd;
  try {
    cmd = JSON.parse(line);
  } catch (e) {
    send({ id: null, ok: false, error: { kind: "agent", reason: null, code: null, message: `bad JSON: ${e.message}` } });
    return;
  }
  const id = cmd?.id ?? null;
  const op = ops[cmd?.op];
  if (!op) {
    send({ id, ok: false, error: { kind: "unsupported", reason: null, code: null, message: `unknown op ${cmd?.op}` } });
    return;
  }
  try {
    const result = await op(cmd);
    send({ id, ok: true, ...result });
  } catch (e) {
    if (!(e instanceof AgentError) && !(e instanceof FencelockError)) log(`op ${cmd.op} failed:`, e?.stack ?? e);
    send({ id, ok: false, error: errorObject(e) });
  }
}

const pending = new Set();
const rl = createInterface({ input: process.stdin, crlfDelay: Infinity });
rl.on("line", (line) => {
  const p = handle(line).finally(() => pending.delete(p));
  pending.add(p);
});
rl.on("close", async () => {
  // EOF: release what is held (best effort, at most 2 s), then exit 0.
  const done = (async () => {
    // Commands still running get a moment to finish, so what they took is released too.
    await Promise.race([Promise.allSettled([...pending]), new Promise((r) => setTimeout(r, 500))]);
    await Promise.allSettled([...leases.values()].map((l) => l.release()));
    leases.clear();
    await client?.close();
  })();
  await Promise.race([done, new Promise((r) => setTimeout(r, EXIT_RELEASE_MS))]);
  process.exit(0);
});
process.on("unhandledRejection", (e) => log("unhandled rejection:", e?.stack ?? e));

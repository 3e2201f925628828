// The conformance agent (conformance/agent.mjs) speaks PROTOCOL.md v1:
// driven here against a scripted fake node and a tiny fenced store.
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { createServer } from "node:net";
import { dirname, join } from "node:path";
import { createInterface } from "node:readline";
import { after, test } from "node:test";
import { fileURLToPath } from "node:url";
import * as grpc from "@grpc/grpc-js";
import { batchReply, fail, grant, released, startFake, within } from "./fake-server.mjs";

const agentPath = join(dirname(fileURLToPath(import.meta.url)), "..", "conformance", "agent.mjs");
const cleanup = [];
after(() => {
  for (const f of cleanup) f();
});

function startAgent() {
  const child = spawn(process.execPath, [agentPath], { stdio: ["pipe", "pipe", "pipe"] });
  cleanup.push(() => child.kill("SIGKILL"));
  const waiting = new Map();
  const events = [];
  let stderr = "";
  child.stderr.on("data", (d) => (stderr += d));
  createInterface({ input: child.stdout }).on("line", (line) => {
    const msg = JSON.parse(line);
    if (msg.event) events.push(msg);
    else waiting.get(msg.id)?.(msg);
  });
  let id = 0;
  const send = (op, args = {}, ms = 10000) => {
    const n = ++id;
    const reply = new Promise((resolve) => waiting.set(n, resolve));
    child.stdin.write(JSON.stringify({ id: n, op, ...args }) + "\n");
    return within(reply, ms, `${op} reply (stderr: ${stderr})`);
  };
  const exited = new Promise((resolve) => child.on("exit", (code) => resolve(code)));
  return { child, send, events, exited, stderr: () => stderr };
}

async function fencedStore() {
  const highest = new Map();
  const server = createServer((socket) => {
    let buf = "";
    socket.on("data", (d) => {
      buf += d;
      if (!buf.includes("\n")) return;
      const { key, token } = JSON.parse(buf.slice(0, buf.indexOf("\n")));
      const t = BigInt(token);
      const h = highest.get(key) ?? 0n;
      const accepted = t >= h;
      if (accepted) highest.set(key, t);
      socket.end(JSON.stringify({ accepted, highest: String(highest.get(key) ?? 0n) }) + "\n");
    });
  });
  await new Promise((r) => server.listen(0, "127.0.0.1", r));
  cleanup.push(() => server.close());
  return { address: `127.0.0.1:${server.address().port}`, highest };
}

test("agent: hello, connect, acquire, status, fenced_write, get, release, stats, errors, EOF", async () => {
  const big = (1n << 60n) + 5n;
  let renewCalls = 0;
  const node = await startFake({
    Acquire: (req) => {
      if (req.resource === "acme/held") throw fail("LOCK_HELD", {}, grpc.status.ABORTED);
      return grant({ fencingToken: big, leaseTtlMs: 30000, shardId: 4 });
    },
    RenewBatch: (items) => {
      renewCalls += 1;
      return batchReply(items.map(() => ({ renewed: { expiresAtMs: 0, leaseTtlMs: 30000 } })));
    },
    Release: () => released(true),
    Get: () => {
      throw fail("NO_QUORUM", { retry: 1 });
    },
  });
  cleanup.push(() => node.kill());
  const store = await fencedStore();
  const agent = startAgent();
  const hello = await agent.send("hello");
  assert.deepEqual(hello, { id: 1, ok: true, agent: "node", client_version: "0.1.0", protocol: 1 });
  assert.equal((await agent.send("acquire", { resource: "acme/x", ttl_ms: 0, wait_ms: 0 })).error.kind, "agent");
  assert.equal((await agent.send("connect", { endpoints: [node.address], call_timeout_ms: 3000 })).ok, true);

  const a = await agent.send("acquire", { resource: "acme/x", ttl_ms: 30000, wait_ms: 0, handle: "h-a", unknown_field: 1 });
  assert.equal(a.ok, true, JSON.stringify(a));
  assert.equal(a.handle, "h-a");
  assert.equal(a.token, big.toString(), "tokens travel as exact decimal strings");
  assert.equal(a.shard_id, 4);
  assert.match(a.request_id, /^[0-9a-f]{32}$/);
  assert.ok(a.stop_by_in_ms > 25000 && a.stop_by_in_ms <= 28500, String(a.stop_by_in_ms));
  const b = await agent.send("acquire", { resource: "acme/y", ttl_ms: 30000, wait_ms: 0 });
  assert.notEqual(b.request_id, a.request_id);
  const explicit = await agent.send("acquire", { resource: "acme/z", ttl_ms: 30000, wait_ms: 0, request_id: "abcd01" });
  assert.equal(explicit.request_id, "abcd01");
  assert.equal(node.calls.at(-1).request.requestId.toString("hex"), "abcd01");

  const held = await agent.send("acquire", { resource: "acme/held", ttl_ms: 30000, wait_ms: 0 });
  assert.deepEqual(held.error && [held.error.kind, held.error.reason, held.error.code], ["rejected", "LOCK_HELD", "ABORTED"]);
  const badTtl = await agent.send("acquire", { resource: "acme/q", ttl_ms: -5, wait_ms: 0 });
  assert.equal(badTtl.error.kind, "invalid_argument");

  const st = await agent.send("status", { handle: "h-a" });
  assert.equal(st.held, true);
  assert.equal(st.lost, false);
  assert.equal(st.lost_reason, null);
  assert.equal(st.token, big.toString());

  const w = await agent.send("fenced_write", { handle: "h-a", store: store.address, key: "k", value: "v" });
  assert.deepEqual([w.ok, w.accepted, w.highest], [true, true, big.toString()]);
  assert.equal(store.highest.get("k"), big);

  const g = await agent.send("get", { resource: "acme/x" });
  assert.deepEqual([g.ok, g.error.kind, g.error.reason], [false, "rejected", "NO_QUORUM"]);

  const wl = await agent.send("wait_lost", { handle: "h-a", timeout_ms: 50 });
  assert.deepEqual([wl.ok, wl.lost, wl.lost_reason], [true, false, null]);

  const rel = await agent.send("release", { handle: "h-a" });
  assert.deepEqual([rel.ok, rel.released], [true, true]);
  assert.equal((await agent.send("status", { handle: "h-a" })).error.kind, "agent");
  assert.equal((await agent.send("frobnicate")).error.kind, "unsupported");
  const stats = await agent.send("stats");
  assert.equal(stats.ok, true);
  assert.equal(typeof stats.renew_calls, "number");

  // EOF: the agent releases what it holds (acme/y, acme/z) and exits 0.
  const releasesBefore = node.calls.filter((c) => c.method === "Release").length;
  agent.child.stdin.end();
  assert.equal(await within(agent.exited, 5000, "agent exit"), 0);
  assert.equal(node.calls.filter((c) => c.method === "Release").length, releasesBefore + 2);
  void renewCalls;
});

test("agent: a lost lease is an event and a wait_lost answer; fenced_write refuses locally, or writes when told not to check", async () => {
  const node = await startFake({
    Acquire: () => grant({ leaseTtlMs: 1200 }),
    RenewBatch: (items) => batchReply(items.map(() => ({ error: { reason: 15, message: "gone", retry: 1 } }))),
    Release: () => released(false),
  });
  cleanup.push(() => node.kill());
  const store = await fencedStore();
  const agent = startAgent();
  await agent.send("connect", { endpoints: [node.address] });
  await agent.send("acquire", { resource: "acme/l", ttl_ms: 1200, wait_ms: 0, handle: "l" });
  const wl = await agent.send("wait_lost", { handle: "l", timeout_ms: 5000 }, 8000);
  assert.deepEqual([wl.lost, wl.lost_reason], [true, "not_held"]);
  assert.deepEqual(agent.events.map((e) => [e.event, e.handle, e.lost_reason]), [["lost", "l", "not_held"]]);
  const st = await agent.send("status", { handle: "l" });
  assert.deepEqual([st.held, st.lost, st.lost_reason], [false, true, "not_held"]);
  const refused = await agent.send("fenced_write", { handle: "l", store: store.address, key: "k", value: "v" });
  assert.equal(refused.error.kind, "lost");
  assert.equal(store.highest.size, 0, "nothing was sent");
  const forced = await agent.send("fenced_write", { handle: "l", store: store.address, key: "k", value: "v", check_lease: false });
  assert.equal(forced.accepted, true);
  agent.child.stdin.end();
  assert.equal(await within(agent.exited, 5000, "agent exit"), 0);
});

// The client against a real 3-node cluster with mutual TLS and per-tenant
// identities (docs/security.md): certificates from `fencelock dev certs`.
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, before, describe, test } from "node:test";
import { Client, tlsFromFiles } from "../dist/index.js";
import { findBinary, skipReason, startCluster, waitReady } from "./cluster.mjs";
import { within } from "./fake-server.mjs";

const skip = skipReason();

describe("against a real cluster with mutual TLS", { skip, timeout: 120_000 }, () => {
  let cluster;
  let certs;
  const clients = [];
  const identity = (name) =>
    tlsFromFiles(join(certs, "ca.crt"), join(certs, `${name}.crt`), join(certs, `${name}.key`));
  const client = (name) => {
    const c = new Client(cluster.endpoints, { callTimeoutMs: 8000, tls: identity(name) });
    clients.push(c);
    return c;
  };
  const resource = (tenant) => `${tenant}/tls-${process.pid}-${Date.now()}`;

  before(async () => {
    certs = mkdtempSync(join(tmpdir(), "fencelock-node-certs-"));
    const out = join(certs, "tls");
    const r = spawnSync(
      findBinary().bin,
      ["dev", "certs", "--out", out, "--nodes", "3", "--host", "127.0.0.1", "--host", "localhost", "--tenant", "acme:worker-1", "--tenant", "beta:batch"],
      { encoding: "utf8" },
    );
    assert.equal(r.status, 0, r.stderr);
    certs = out;
    cluster = await startCluster({ tls: { dir: certs } });
    await waitReady(cluster.endpoints, cluster, { tls: identity("client-acme-worker-1") });
  });
  after(async () => {
    for (const c of clients) await c.close().catch(() => {});
    await cluster?.stop();
    if (certs) rmSync(join(certs, ".."), { recursive: true, force: true });
  });

  test("a tenant's identity locks its own resources over TLS", async () => {
    const acme = client("client-acme-worker-1");
    const lease = await within(acme.lock(resource("acme"), { ttlMs: 30000 }), 15000, "lock");
    assert.ok(lease.token > 0n);
    assert.equal(await lease.release(), true);
  });

  test("another tenant's resource is PERMISSION_DENIED, never retried", async () => {
    const acme = client("client-acme-worker-1");
    const err = await within(acme.lock(resource("beta")), 15000, "lock").catch((e) => e);
    assert.equal(err.code, "REJECTED");
    assert.equal(err.reason, "PERMISSION_DENIED");
    assert.equal(err.retryable, false);
  });

  test("a lease belongs to the identity that took it: another identity cannot release it with its id", async () => {
    const acme = client("client-acme-worker-1");
    const beta = client("client-beta-batch");
    const r = resource("acme");
    const lease = await acme.lock(r, { ttlMs: 30000 });
    const err = await beta.releaseLease(r, lease.leaseId).catch((e) => e);
    assert.equal(err.reason, "PERMISSION_DENIED");
    assert.ok(lease.isHeld);
    assert.equal(await lease.release(), true);
  });

  test("without a client certificate the handshake fails: no answer, never a grant", async () => {
    const c = new Client(cluster.endpoints.map((e) => `https://${e}`), {
      callTimeoutMs: 1500,
      tls: undefined,
    });
    clients.push(c);
    const err = await within(c.lock(resource("acme")), 10000, "lock").catch((e) => e);
    assert.ok(["UNAVAILABLE", "GRPC"].includes(err.code), `${err.code}: ${err.message}`);
  });
});

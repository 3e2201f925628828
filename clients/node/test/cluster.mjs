// A real fencelock cluster for tests: three `fencelock serve` processes on
// loopback ports, each with its own config and data directory (like
// crates/server/tests/real_process/process.rs). The binary comes from
// $FENCELOCK_BIN, else $CARGO_TARGET_DIR/debug/fencelock, else
// /work/main/target/debug/fencelock, else ~/.cache/fencelock/target/debug/fencelock.
import { spawn, spawnSync } from "node:child_process";
import { existsSync, mkdtempSync, openSync, rmSync, writeFileSync } from "node:fs";
import { createServer } from "node:net";
import { homedir, tmpdir } from "node:os";
import { join } from "node:path";
import { Client } from "../dist/index.js";

export function findBinary() {
  const candidates = [
    process.env.FENCELOCK_BIN,
    process.env.CARGO_TARGET_DIR && join(process.env.CARGO_TARGET_DIR, "debug", "fencelock"),
    "/work/main/target/debug/fencelock",
    join(homedir(), ".cache", "fencelock", "target", "debug", "fencelock"),
  ].filter(Boolean);
  return { bin: candidates.find((c) => existsSync(c)), candidates };
}

/** Why the real-cluster tests cannot run here, or undefined when they can. Fails instead when FENCELOCK_REQUIRE_CLUSTER=1. */
export function skipReason() {
  const { bin, candidates } = findBinary();
  if (bin) return undefined;
  const why = `no fencelock binary (looked at ${candidates.join(", ")}); set FENCELOCK_BIN`;
  if (process.env.FENCELOCK_REQUIRE_CLUSTER === "1") throw new Error(why);
  return why;
}

async function freePort(taken) {
  for (;;) {
    const port = await new Promise((resolve, reject) => {
      const s = createServer();
      s.once("error", reject);
      s.listen(0, "127.0.0.1", () => {
        const p = s.address().port;
        s.close(() => resolve(p));
      });
    });
    if (!taken.has(port)) {
      taken.add(port);
      return port;
    }
  }
}

const live = new Set();
process.on("exit", () => {
  for (const child of live) {
    try {
      child.kill("SIGKILL");
    } catch {}
  }
});

/**
 * Starts a cluster and waits until it answers. `tls`: {dir} with the files
 * of `fencelock dev certs` (ca.crt, node-N.crt/.key).
 */
export async function startCluster({ nodes = 3, shards = 4, tls } = {}) {
  const { bin } = findBinary();
  if (!bin) throw new Error(skipReason() ?? "no binary");
  const dir = mkdtempSync(join(tmpdir(), "fencelock-node-test-"));
  const taken = new Set();
  const ports = [];
  for (let i = 0; i < nodes; i++) ports.push(await freePort(taken));
  const peers = ports.map((p, i) => `{ id = ${i + 1}, addr = "127.0.0.1:${p}" }`).join(", ");
  for (let id = 1; id <= nodes; id++) {
    const tlsSection = tls
      ? `ca_file = "${join(tls.dir, "ca.crt")}"\ncert_file = "${join(tls.dir, `node-${id}.crt`)}"\nkey_file = "${join(tls.dir, `node-${id}.key`)}"\n`
      : "insecure = true\n";
    writeFileSync(
      join(dir, `node${id}.toml`),
      `node_id = ${id}\nlisten_addr = "127.0.0.1:${ports[id - 1]}"\ndata_dir = "${join(dir, `data${id}`)}"\n` +
        `peers = [${peers}]\nshard_count = ${shards}\n\n[raft]\ntick_interval_ms = 50\nelection_ticks = 10\nproposal_timeout_ms = 2000\n\n[tls]\n${tlsSection}`,
    );
  }
  const procs = new Array(nodes).fill(undefined);
  const startNode = (i) => {
    const log = openSync(join(dir, `node${i + 1}.log`), "a");
    const env = { ...process.env, RUST_LOG: process.env.RUST_LOG ?? "warn" };
    for (const k of ["FENCELOCK_TLS_CA_FILE", "FENCELOCK_TLS_CERT_FILE", "FENCELOCK_TLS_KEY_FILE"]) delete env[k];
    const child = spawn(bin, ["serve", "--config", join(dir, `node${i + 1}.toml`)], {
      stdio: ["ignore", "ignore", log],
      env,
    });
    live.add(child);
    child.on("exit", () => live.delete(child));
    procs[i] = child;
  };
  for (let i = 0; i < nodes; i++) startNode(i);
  const endpoints = ports.map((p) => `127.0.0.1:${p}`);
  const cluster = {
    dir,
    endpoints,
    /** SIGKILL node i (0-based). */
    kill(i) {
      const c = procs[i];
      procs[i] = undefined;
      if (c && c.exitCode === null) c.kill("SIGKILL");
      return c ? new Promise((r) => (c.exitCode !== null ? r() : c.once("exit", r))) : Promise.resolve();
    },
    restart(i) {
      startNode(i);
    },
    async stop() {
      await Promise.all(
        procs.map((c) => {
          if (!c || c.exitCode !== null) return undefined;
          return new Promise((resolve) => {
            const t = setTimeout(() => c.kill("SIGKILL"), 5000);
            c.once("exit", () => {
              clearTimeout(t);
              resolve();
            });
            c.kill("SIGTERM");
          });
        }),
      );
      if (!process.env.FENCELOCK_KEEP_TEST_DIRS) rmSync(dir, { recursive: true, force: true });
    },
    logs() {
      return spawnSync("tail", ["-n", "20", ...procs.map((_, i) => join(dir, `node${i + 1}.log`))]).stdout.toString();
    },
  };
  if (!tls) await waitReady(endpoints, cluster);
  return cluster;
}

/** Waits (at most 60 s) until every shard of a probe resource answers. */
export async function waitReady(endpoints, cluster, options = {}) {
  const probe = new Client(endpoints, { callTimeoutMs: 2000, attemptTimeoutMs: 1000, connectTimeoutMs: 1000, ...options });
  const end = performance.now() + 60_000;
  let last;
  try {
    for (;;) {
      try {
        // A handful of resources, so several shards have leaders.
        for (let i = 0; i < 8; i++) await probe.get(`acme/probe-${i}`);
        return;
      } catch (e) {
        last = e;
      }
      if (performance.now() > end) throw new Error(`cluster not ready in 60 s: ${last}\n${cluster?.logs() ?? ""}`);
      await new Promise((r) => setTimeout(r, 200));
    }
  } finally {
    await probe.close();
  }
}

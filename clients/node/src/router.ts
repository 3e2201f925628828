// Where to send a call: the seed endpoints, the learned route of each shard
// (its leader, or the node that last served it), which shard each resource
// belongs to, and one gRPC connection per node.
//
// The client does not know the placement map; it learns routes from
// answers: a success names the shard (`shard_id`) and the node that served
// it; a NOT_LEADER names the shard and its leader. A node that forwards to
// the leader serves as well as the leader itself.

import * as grpc from "@grpc/grpc-js";
import { type ClientTls, MAX_ENDPOINTS } from "./config.js";
import { FencelockError } from "./errors.js";
import type { Reroute } from "./retry.js";

/** Resources whose shard the client remembers; cleared when full. */
export const MAX_CACHED_RESOURCES = 65_536;
/** Shards whose route the client remembers; cleared when full. */
export const MAX_CACHED_SHARDS = 4_096;
/** Connections kept to nodes learned from hints (beyond the seeds). */
export const MAX_LEARNED_CONNECTIONS = 64;

/** gRPC channel options: keepalive so a silently dead node is noticed, and quick reconnects to restarted nodes. */
const CHANNEL_OPTIONS: grpc.ChannelOptions = {
  "grpc.keepalive_time_ms": 10_000,
  "grpc.keepalive_timeout_ms": 5_000,
  "grpc.keepalive_permit_without_calls": 1,
  "grpc.initial_reconnect_backoff_ms": 100,
  "grpc.max_reconnect_backoff_ms": 1_000,
  "grpc.enable_retries": 0,
};

/** `host:port` -> `scheme://host:port`; URLs unchanged. */
export function normalize(endpoint: string, scheme: string): string {
  return endpoint.includes("://") ? endpoint : `${scheme}://${endpoint}`;
}

/** Checks a URL and returns the gRPC target (`host:port`) and whether it uses TLS. */
function parseUrl(url: string): { target: string; secure: boolean } {
  let parsed: URL;
  try {
    parsed = new URL(url);
  } catch {
    throw new FencelockError("INVALID_ENDPOINT", { message: `invalid endpoint ${JSON.stringify(url)}: not a URL` });
  }
  if (parsed.protocol !== "http:" && parsed.protocol !== "https:")
    throw new FencelockError("INVALID_ENDPOINT", {
      message: `invalid endpoint ${JSON.stringify(url)}: scheme must be http or https`,
    });
  if (!parsed.hostname)
    throw new FencelockError("INVALID_ENDPOINT", { message: `invalid endpoint ${JSON.stringify(url)}: no host` });
  const secure = parsed.protocol === "https:";
  const port = parsed.port || (secure ? "443" : "80");
  return { target: `${parsed.hostname}:${port}`, secure };
}

export class Router {
  /** The seed endpoints as URLs, in the caller's order, without repeats. */
  readonly seeds: string[];
  /** `http` or `https`, from the first seed, for hinted addresses. */
  private readonly scheme: string;
  private readonly channels = new Map<string, grpc.Client>();
  private readonly shardRoutes = new Map<number, string>();
  private readonly resourceShards = new Map<string, number>();
  /** Index in `seeds` of the node asked when no route is known. */
  private preferred = 0;
  private closed = false;

  constructor(
    endpoints: string[],
    private readonly tls?: ClientTls,
  ) {
    if (!Array.isArray(endpoints) || endpoints.length === 0)
      throw new FencelockError("INVALID_ENDPOINT", { message: "at least one endpoint is needed" });
    if (endpoints.length > MAX_ENDPOINTS)
      throw new FencelockError("INVALID_ENDPOINT", { message: `at most ${MAX_ENDPOINTS} endpoints are accepted` });
    const defaultScheme = tls ? "https" : "http";
    const seeds: string[] = [];
    for (const endpoint of endpoints) {
      const trimmed = typeof endpoint === "string" ? endpoint.trim() : "";
      if (!trimmed)
        throw new FencelockError("INVALID_ENDPOINT", { message: `invalid endpoint ${JSON.stringify(endpoint)}: empty` });
      const url = normalize(trimmed, defaultScheme);
      parseUrl(url);
      if (!seeds.includes(url)) seeds.push(url);
    }
    this.seeds = seeds;
    this.scheme = seeds[0]!.split("://")[0]!;
  }

  private seed(): string {
    return this.seeds[this.preferred % this.seeds.length]!;
  }

  /** The node to ask about `resource` now. */
  target(resource: string): string {
    const shard = this.resourceShards.get(resource);
    const route = shard === undefined ? undefined : this.shardRoutes.get(shard);
    return route ?? this.seed();
  }

  /** The node to ask about a known shard (held leases). */
  targetForShard(shardId: number): string {
    return this.shardRoutes.get(shardId) ?? this.seed();
  }

  /** A connection to `url`, made on first use (grpc-js connects lazily and reconnects by itself). */
  channel(url: string): grpc.Client {
    if (this.closed) throw new FencelockError("INVALID_ARGUMENT", { message: "the client is closed" });
    const existing = this.channels.get(url);
    if (existing) return existing;
    const learned = [...this.channels.keys()].filter((u) => !this.seeds.includes(u));
    if (learned.length >= MAX_LEARNED_CONNECTIONS) {
      for (const u of learned) {
        this.channels.get(u)?.close();
        this.channels.delete(u);
      }
    }
    const { target, secure } = parseUrl(url);
    let creds: grpc.ChannelCredentials;
    if (secure) {
      const t = this.tls;
      creds = t
        ? grpc.credentials.createSsl(Buffer.from(t.caPem), Buffer.from(t.keyPem), Buffer.from(t.certPem))
        : grpc.credentials.createSsl();
    } else {
      creds = grpc.credentials.createInsecure();
    }
    const client = new grpc.Client(target, creds, CHANNEL_OPTIONS);
    this.channels.set(url, client);
    return client;
  }

  /** `url` served `shardId` (and `resource`, when known): send them there next time. */
  learn(resource: string | undefined, shardId: number, url: string): void {
    if (!shardId) return;
    if (resource !== undefined) {
      if (this.resourceShards.size >= MAX_CACHED_RESOURCES && !this.resourceShards.has(resource))
        this.resourceShards.clear();
      this.resourceShards.set(resource, shardId);
    }
    if (this.shardRoutes.size >= MAX_CACHED_SHARDS && !this.shardRoutes.has(shardId)) this.shardRoutes.clear();
    this.shardRoutes.set(shardId, url);
  }

  /** Applies the routing half of a failed attempt at `failedUrl`; returns the node to try next. */
  reroute(reroute: Reroute, resource: string | undefined, shardId: number | undefined, failedUrl: string): string {
    switch (reroute.kind) {
      case "stay":
        return failedUrl;
      case "to": {
        const url = normalize(reroute.address, this.scheme);
        if (shardId) this.learn(resource, shardId, url);
        return url;
      }
      case "elsewhere": {
        for (const [shard, url] of this.shardRoutes) if (url === failedUrl) this.shardRoutes.delete(shard);
        if (this.seed() === failedUrl) this.preferred = (this.preferred + 1) % this.seeds.length;
        break;
      }
      case "refresh": {
        if (resource !== undefined) this.resourceShards.delete(resource);
        if (shardId) this.shardRoutes.delete(shardId);
        break;
      }
    }
    if (resource !== undefined) return this.target(resource);
    if (shardId) return this.targetForShard(shardId);
    return this.seed();
  }

  /** Closes every connection. */
  close(): void {
    this.closed = true;
    for (const c of this.channels.values()) c.close();
    this.channels.clear();
  }
}

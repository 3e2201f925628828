//! `fencelock admin ...`: the operator commands, one `AdminService` call
//! each. Any node answers; the call returns when the action is done.

use std::time::Duration;

use clap::{Args, Subcommand};
use fencelock_api::v1::admin_service_client::AdminServiceClient;
use fencelock_api::v1::{
    reshard_request, AddNodeRequest, BalanceRequest, DrainNodeRequest, HotResourcesRequest,
    ListNodesRequest, ListShardsRequest, MoveReplicaRequest, MoveSlots, NodeState, ReplicaRole,
    ReshardRequest, ResumeMigration, SlotRange, SplitShard, TransferLeaderRequest,
    UndrainNodeRequest,
};

use super::client::{endpoint_url, exit_code};
use super::json::Object;
use super::{Output, EXIT_OK, EXIT_UNAVAILABLE, EXIT_USAGE};

/// How long one admin action may run (a drain moves every replica of a
/// node, one after the other).
const ADMIN_CALL_TIMEOUT: Duration = Duration::from_secs(600);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);

#[derive(Debug, Args)]
pub struct AdminArgs {
    /// Nodes of the cluster, comma-separated: the action goes to the first
    /// that accepts a connection (any node answers every admin call).
    /// Default: $FENCELOCK_ENDPOINTS, else $FENCELOCK_ENDPOINT, else
    /// http://127.0.0.1:7001.
    #[arg(
        long,
        alias = "endpoint",
        env = "FENCELOCK_ENDPOINTS",
        value_delimiter = ',',
        value_name = "HOST:PORT,...",
        global = true
    )]
    endpoints: Vec<String>,
    /// Output format.
    #[arg(long, value_enum, default_value_t = Output::Human, global = true)]
    output: Output,
    #[command(flatten)]
    tls: super::TlsArgs,
    #[command(subcommand)]
    command: AdminCommand,
}

#[derive(Debug, Subcommand)]
enum AdminCommand {
    /// List nodes: address, state, replicas, leaderships.
    Nodes,
    /// List shards: epoch, leader, replicas, slot ranges, lock counts.
    Shards {
        /// Only these shards.
        #[arg(long = "shard", value_name = "ID")]
        shards: Vec<u64>,
    },
    /// Move a shard's leadership to another of its voters.
    TransferLeader {
        #[arg(long, value_name = "ID")]
        shard: u64,
        #[arg(long, value_name = "NODE")]
        to: u64,
    },
    /// Move one replica of a shard to another node (learner, catch up,
    /// promote, remove the old one).
    MoveReplica {
        #[arg(long, value_name = "ID")]
        shard: u64,
        #[arg(long, value_name = "NODE")]
        from: u64,
        #[arg(long, value_name = "NODE")]
        to: u64,
    },
    /// Even out replicas and leaderships over the UP nodes.
    Balance,
    /// Move every replica and leadership off a node before maintenance.
    Drain {
        #[arg(long, value_name = "NODE")]
        node: u64,
    },
    /// Cancel a drain: the node is UP again (nothing moves back by itself;
    /// run `balance` to give it replicas).
    Undrain {
        #[arg(long, value_name = "NODE")]
        node: u64,
    },
    /// Add a running node started with `join = true`.
    AddNode {
        /// The new node's configured node_id.
        #[arg(long, value_name = "NODE")]
        id: u64,
        /// The new node's advertised `host:port`.
        #[arg(long, value_name = "HOST:PORT")]
        addr: String,
    },
    /// Move slots between shards, split a shard, or finish an interrupted
    /// migration.
    #[command(subcommand)]
    Reshard(ReshardCommand),
    /// The placement controller's own moves (replacing the replicas of
    /// nodes down for `controller.node_down_after_ms`): show, pause or
    /// resume them. The flag is replicated; operator actions run either way.
    #[command(subcommand)]
    Scheduler(SchedulerCommand),
    /// The most acquired resources right now, over every shard (counts
    /// decay by half every minute; `contended` found the lock held).
    Hot {
        /// Most resources to list (1 to 1000).
        #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u32).range(1..=1000))]
        limit: u32,
    },
    /// After a restore from backup or a rebuild after losing every
    /// replica: make every shard mint tokens above the highest one any
    /// protected system has seen (docs/operations.md, "Recovery without
    /// token reuse"). Run again to finish one cut short.
    #[command(group(clap::ArgGroup::new("floor").required(true).args(["above_token", "above_epoch"])))]
    RaiseEpochs {
        /// The highest fencing token any protected system has seen.
        #[arg(long, value_name = "TOKEN")]
        above_token: Option<i64>,
        /// Or the epoch new tokens must be above.
        #[arg(long, value_name = "EPOCH")]
        above_epoch: Option<u64>,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Subcommand)]
enum SchedulerCommand {
    /// Whether the controller is paused.
    Status,
    /// No move by itself until resumed (a move under way finishes).
    Pause,
    /// Move by itself again.
    Resume,
    /// What the controller would do now, carried out by no one (a dry
    /// run): the work, why, and its steps. Only nodes the map marks DOWN
    /// count as down here; members not answering now are listed apart.
    Plan,
}

#[derive(Debug, Subcommand)]
enum ReshardCommand {
    /// Move slots from one shard to another (the target takes a new epoch).
    Move {
        #[arg(long, value_name = "ID")]
        from: u64,
        #[arg(long, value_name = "ID")]
        to: u64,
        /// Slots as ranges: `0-99,200,300-310`.
        #[arg(long, value_name = "RANGES", value_parser = parse_ranges)]
        slots: Vec<SlotRange>,
    },
    /// Split a shard: a new shard on the same nodes takes its upper slots.
    Split {
        #[arg(long, value_name = "ID")]
        shard: u64,
        /// First slot of the new shard (default: the middle).
        #[arg(long, value_name = "SLOT", default_value_t = 0)]
        at: u32,
    },
    /// Finish a migration an interrupted reshard left in progress.
    Resume,
}

/// `0-99,200` → ranges. (clap calls this once per `--slots` value.)
fn parse_ranges(s: &str) -> Result<SlotRange, String> {
    let parse = |t: &str| t.trim().parse::<u32>().map_err(|e| format!("{t:?}: {e}"));
    match s.split_once('-') {
        Some((a, b)) => Ok(SlotRange {
            start: parse(a)?,
            end: parse(b)?,
        }),
        None => {
            let n = parse(s)?;
            Ok(SlotRange { start: n, end: n })
        }
    }
}

fn ranges_text(ranges: &[SlotRange]) -> String {
    ranges
        .iter()
        .map(|r| {
            if r.start == r.end {
                r.start.to_string()
            } else {
                format!("{}-{}", r.start, r.end)
            }
        })
        .collect::<Vec<_>>()
        .join(",")
}

/// `s` cut to at most `max` characters, ending in `…` when cut.
fn shorten(s: &str, max: usize) -> String {
    if s.chars().count() <= max {
        return s.to_owned();
    }
    let mut out: String = s.chars().take(max - 1).collect();
    out.push('…');
    out
}

fn name_of(name: &str, prefix: &str) -> String {
    name.strip_prefix(prefix).unwrap_or(name).to_owned()
}

/// A connection to the first of `endpoints` that accepts one. Only a
/// failed connect moves on to the next node: an admin action that was sent
/// is never sent again elsewhere (it may be under way there).
async fn connect_first(
    endpoints: &[String],
    tls: &fencelock_server::security::PeerTls,
) -> Result<(tonic::transport::Channel, String), u8> {
    let mut refused = Vec::new();
    for endpoint in endpoints {
        let url = endpoint_url(endpoint);
        let endpoint = match tls.endpoint(&url) {
            Ok(e) => e
                .connect_timeout(CONNECT_TIMEOUT)
                .timeout(ADMIN_CALL_TIMEOUT),
            Err(e) => {
                eprintln!("error: invalid endpoint {url:?}: {e}");
                return Err(EXIT_USAGE);
            }
        };
        match endpoint.connect().await {
            Ok(channel) => return Ok((channel, url)),
            Err(e) => refused.push(format!("{url}: {}", error_chain(&e))),
        }
    }
    eprintln!(
        "error: UNAVAILABLE: cannot connect to any node ({}); nothing was done",
        refused.join("; ")
    );
    Err(EXIT_UNAVAILABLE)
}

/// An error and its sources, `a: b: c`.
fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(e) = source {
        text.push_str(": ");
        text.push_str(&e.to_string());
        source = e.source();
    }
    text
}

pub async fn run(args: AdminArgs) -> u8 {
    let tls = match args.tls.peer_tls() {
        Ok(tls) => tls,
        Err(e) => {
            eprintln!("error: {e}");
            return EXIT_USAGE;
        }
    };
    let endpoints = super::resolve_endpoints(&args.endpoints);
    let (channel, url) = match connect_first(&endpoints, &tls).await {
        Ok(connected) => connected,
        Err(code) => {
            super::diagnose::explain(&endpoints, args.tls.given()).await;
            return code;
        }
    };
    let mut admin = AdminServiceClient::new(channel);
    let result = match args.command {
        AdminCommand::Nodes => admin.list_nodes(ListNodesRequest {}).await.map(|r| {
            let r = r.into_inner();
            let nodes: Vec<Object> = r
                .nodes
                .iter()
                .map(|n| {
                    let state = NodeState::try_from(n.state).unwrap_or(NodeState::Unspecified);
                    Object::new()
                        .with("node_id", n.node_id)
                        .with("address", n.address.clone())
                        .with("state", name_of(state.as_str_name(), "NODE_STATE_"))
                        .with("replicas", n.replica_count)
                        .with("leaders", n.leader_count)
                        .with("marked_down", n.marked_down)
                })
                .collect();
            (
                Object::new()
                    .with("ok", true)
                    .with("map_version", r.map_version)
                    .with("nodes", nodes.clone()),
                table(&nodes),
            )
        }),
        AdminCommand::Shards { shards } => admin
            .list_shards(ListShardsRequest { shard_ids: shards })
            .await
            .map(|r| {
                let r = r.into_inner();
                let shards: Vec<Object> = r
                    .shards
                    .iter()
                    .map(|s| {
                        let role = |want: ReplicaRole| {
                            s.replicas
                                .iter()
                                .filter(|x| x.role == want as i32)
                                .map(|x| x.node_id.to_string())
                                .collect::<Vec<_>>()
                                .join(",")
                        };
                        Object::new()
                            .with("shard_id", s.shard_id)
                            .with("epoch", s.epoch)
                            .with("leader", s.leader_node_id)
                            .with("voters", role(ReplicaRole::Voter))
                            .with("learners", role(ReplicaRole::Learner))
                            .with("slots", ranges_text(&s.slot_ranges))
                            .with("held", s.held_locks)
                            .with("waiters", s.waiters)
                    })
                    .collect();
                // Long slot lists are cut in the table; JSON has them whole.
                let rows: Vec<Object> = r
                    .shards
                    .iter()
                    .zip(&shards)
                    .map(|(s, row)| {
                        let mut short = Object::new();
                        for (key, value) in row.fields() {
                            short = if *key == "slots" {
                                short.with(key, shorten(&ranges_text(&s.slot_ranges), 40))
                            } else {
                                short.with(key, value.clone())
                            };
                        }
                        short
                    })
                    .collect();
                let unreachable = r
                    .unreachable_node_ids
                    .iter()
                    .map(u64::to_string)
                    .collect::<Vec<_>>()
                    .join(",");
                let mut text = table(&rows);
                if !unreachable.is_empty() {
                    text.push_str(&format!(
                        "not answering: node {unreachable} (their replicas' applied index and leadership are unknown)\n"
                    ));
                }
                (
                    Object::new()
                        .with("ok", true)
                        .with("map_version", r.map_version)
                        .with("migration_id", r.migration_id)
                        .with("unreachable_node_ids", unreachable)
                        .with("shards", shards.clone()),
                    text,
                )
            }),
        AdminCommand::TransferLeader { shard, to } => admin
            .transfer_leader(TransferLeaderRequest {
                shard_id: shard,
                to_node_id: to,
            })
            .await
            .map(|r| {
                single(
                    Object::new()
                        .with("ok", true)
                        .with("shard_id", shard)
                        .with("leader", r.into_inner().leader_node_id),
                )
            }),
        AdminCommand::MoveReplica { shard, from, to } => admin
            .move_replica(MoveReplicaRequest {
                shard_id: shard,
                from_node_id: from,
                to_node_id: to,
            })
            .await
            .map(|r| {
                single(
                    Object::new()
                        .with("ok", true)
                        .with("shard_id", shard)
                        .with("from", from)
                        .with("to", to)
                        .with("map_version", r.into_inner().map_version),
                )
            }),
        AdminCommand::Scheduler(command) => {
            use fencelock_api::v1::scheduler_request::Action;
            let action = match command {
                SchedulerCommand::Status => Action::Status,
                SchedulerCommand::Pause => Action::Pause,
                SchedulerCommand::Resume => Action::Resume,
                SchedulerCommand::Plan => Action::Plan,
            };
            admin
                .scheduler(fencelock_api::v1::SchedulerRequest {
                    action: action as i32,
                })
                .await
                .map(|r| {
                    let r = r.into_inner();
                    let status = Object::new()
                        .with("ok", true)
                        .with("paused", r.paused)
                        .with("map_version", r.map_version);
                    if command != SchedulerCommand::Plan {
                        return single(status);
                    }
                    let ids = |ids: &[u64]| {
                        let names: Vec<String> = ids.iter().map(u64::to_string).collect();
                        if names.is_empty() {
                            "-".to_owned()
                        } else {
                            names.join(",")
                        }
                    };
                    let (object, mut human) = single(
                        status
                            .with("unreachable", ids(&r.unreachable))
                            .with("down", ids(&r.down))
                            .with("work", r.work.clone())
                            .with("reason", r.reason.clone()),
                    );
                    let steps: Vec<Object> = r
                        .steps
                        .iter()
                        .map(|s| Object::new().with("step", s.clone()))
                        .collect();
                    for (i, step) in r.steps.iter().enumerate() {
                        human.push_str(&format!("{:<16} {step}\n", format!("step {}", i + 1)));
                    }
                    (object.with("steps", steps), human)
                })
        }
        AdminCommand::Balance => admin.balance(BalanceRequest {}).await.map(|r| {
            let r = r.into_inner();
            single(
                Object::new()
                    .with("ok", true)
                    .with("replicas_moved", r.replicas_moved)
                    .with("leaders_moved", r.leaders_moved)
                    .with("map_version", r.map_version),
            )
        }),
        AdminCommand::Drain { node } => admin
            .drain_node(DrainNodeRequest { node_id: node })
            .await
            .map(|r| {
                let r = r.into_inner();
                single(
                    Object::new()
                        .with("ok", true)
                        .with("node_id", node)
                        .with("replicas_moved", r.replicas_moved)
                        .with("leaders_moved", r.leaders_moved)
                        .with("map_version", r.map_version),
                )
            }),
        AdminCommand::RaiseEpochs {
            above_token,
            above_epoch,
        } => admin
            .raise_epochs(fencelock_api::v1::RaiseEpochsRequest {
                above_token: above_token.unwrap_or(0),
                above_epoch: above_epoch.unwrap_or(0),
            })
            .await
            .map(|r| {
                let r = r.into_inner();
                let shards: Vec<Object> = r
                    .shards
                    .iter()
                    .map(|s| Object::new().with("shard_id", s.shard_id).with("epoch", s.epoch))
                    .collect();
                let (object, mut human) = single(
                    Object::new()
                        .with("ok", true)
                        .with("above_epoch", r.above_epoch)
                        .with("map_version", r.map_version),
                );
                human.push_str(&table(&shards));
                (object.with("shards", shards), human)
            }),
        AdminCommand::Undrain { node } => admin
            .undrain_node(UndrainNodeRequest { node_id: node })
            .await
            .map(|r| {
                single(
                    Object::new()
                        .with("ok", true)
                        .with("node_id", node)
                        .with("map_version", r.into_inner().map_version),
                )
            }),
        AdminCommand::AddNode { id, addr } => admin
            .add_node(AddNodeRequest {
                address: addr.clone(),
                node_id: id,
            })
            .await
            .map(|r| {
                single(
                    Object::new()
                        .with("ok", true)
                        .with("node_id", id)
                        .with("address", addr)
                        .with("map_version", r.into_inner().map_version),
                )
            }),
        AdminCommand::Hot { limit } => admin
            .hot_resources(HotResourcesRequest { limit })
            .await
            .map(|r| {
                let r = r.into_inner();
                let rows: Vec<Object> = r
                    .resources
                    .iter()
                    .map(|h| {
                        Object::new()
                            .with("resource", h.resource.clone())
                            .with("shard", h.shard_id)
                            .with("acquires", h.acquires)
                            .with("contended", h.contended)
                            .with("overcount", h.overcount)
                    })
                    .collect();
                let mut human = table(&rows);
                if !r.shards_missing.is_empty() {
                    human.push_str(&format!(
                        "(no answer from the leaders of shards {:?}: their resources are missing)\n",
                        r.shards_missing
                    ));
                }
                let missing: Vec<String> = r.shards_missing.iter().map(u64::to_string).collect();
                (
                    Object::new()
                        .with("ok", true)
                        .with("resources", rows.clone())
                        .with("shards_missing", missing.join(",")),
                    human,
                )
            }),
        AdminCommand::Reshard(cmd) => {
            let action = match cmd {
                ReshardCommand::Move { from, to, slots } => {
                    reshard_request::Action::MoveSlots(MoveSlots {
                        from_shard_id: from,
                        to_shard_id: to,
                        slots,
                    })
                }
                ReshardCommand::Split { shard, at } => {
                    reshard_request::Action::SplitShard(SplitShard {
                        shard_id: shard,
                        split_at_slot: at,
                    })
                }
                ReshardCommand::Resume => reshard_request::Action::Resume(ResumeMigration {}),
            };
            admin
                .reshard(ReshardRequest {
                    action: Some(action),
                })
                .await
                .map(|r| {
                    let r = r.into_inner();
                    single(
                        Object::new()
                            .with("ok", true)
                            .with("migration_id", r.migration_id)
                            .with("new_shard_id", r.new_shard_id)
                            .with("epoch", r.epoch)
                            .with("resources_moved", r.resources_moved)
                            .with("map_version", r.map_version),
                    )
                })
        }
    };
    match result {
        Ok((object, human)) => {
            match args.output {
                Output::Json => println!("{}", object.render()),
                Output::Human => print!("{human}"),
            }
            EXIT_OK
        }
        Err(status) => {
            // A TLS mismatch fails the call before it reaches the service:
            // nothing was done, whatever the transport's words suggest.
            if fencelock_api::v1::ErrorDetail::from_status(&status).is_none() {
                use super::diagnose::{hint, probe, Finding};
                let finding = probe(&url, args.tls.given()).await;
                if matches!(finding, Finding::ExpectsTls | Finding::SpeaksPlaintext) {
                    let text = hint(finding, &url).unwrap_or_default();
                    eprintln!("error: UNAVAILABLE: {text}; nothing was done");
                    return EXIT_UNAVAILABLE;
                }
            }
            let status = without_answer_is_unknown(status);
            let detail = fencelock_api::v1::ErrorDetail::from_status(&status);
            let reason = detail
                .as_ref()
                .map(|d| name_of(d.reason().as_str_name(), "REASON_"))
                .unwrap_or_else(|| format!("{:?}", status.code()));
            let message = detail
                .map(|d| d.message)
                .unwrap_or_else(|| status.message().to_owned());
            eprintln!("error: {reason}: {message}");
            if args.output == Output::Json {
                println!(
                    "{}",
                    Object::new()
                        .with("ok", false)
                        .with("reason", reason)
                        .with("message", message)
                        .render()
                );
            }
            exit_code(&status)
        }
    }
}

/// One object: JSON as is, human as `key value` lines.
fn single(object: Object) -> (Object, String) {
    let mut human = String::new();
    for (key, value) in object.fields() {
        if *key != "ok" {
            human.push_str(&format!("{key:<16} {value}\n"));
        }
    }
    (object, human)
}

/// Rows as an aligned table, headed by the first row's keys.
fn table(rows: &[Object]) -> String {
    let Some(first) = rows.first() else {
        return "(none)\n".to_owned();
    };
    let keys: Vec<&str> = first.fields().iter().map(|(k, _)| *k).collect();
    let cells: Vec<Vec<String>> = rows
        .iter()
        .map(|r| r.fields().iter().map(|(_, v)| v.to_string()).collect())
        .collect();
    let widths: Vec<usize> = keys
        .iter()
        .enumerate()
        .map(|(i, k)| {
            cells
                .iter()
                .map(|row| row.get(i).map_or(0, |c| c.len()))
                .max()
                .unwrap_or(0)
                .max(k.len())
        })
        .collect();
    let line = |items: Vec<&str>| {
        let mut out = String::new();
        for (i, item) in items.iter().enumerate() {
            out.push_str(&format!("{item:<width$}  ", width = widths[i]));
        }
        out.trim_end().to_owned() + "\n"
    };
    let mut out = line(keys.clone());
    for row in &cells {
        out.push_str(&line(row.iter().map(String::as_str).collect()));
    }
    out
}

/// A call that broke off without an answer (the node running the action
/// died mid-way, the connection dropped) did an unknown part of its work:
/// say so with a reason, as every other failure does. `UNAVAILABLE` without
/// a detail means no connection was made: nothing was done.
fn without_answer_is_unknown(status: tonic::Status) -> tonic::Status {
    if status.code() == tonic::Code::Unavailable {
        return status;
    }
    fencelock_api::v1::ErrorDetail::or_outcome_unknown(
        status,
        0,
        "the node running the action gave no answer; it may be partly done. Look with \
         `fencelock admin shards` and run it again (every step checks what is already done); \
         an interrupted migration is finished by the meta leader on its own",
    )
}

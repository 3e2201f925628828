//! Bytes the store writes into Raft: entry payloads and snapshot data.
//! (A crate of its own, pure like the state machine and placement it
//! encodes, so the coverage-guided fuzzer reaches it without RocksDB; the
//! store loop, `fencelock-multiraft`, is its one writer.)
//!
//! An entry payload starts with a version byte that also says what it
//! carries: lock commands for the shard's [`LockTable`] (version 1),
//! placement commands for the meta shard's [`PlacementMap`] (version 2), or
//! lock commands that start the shard's next epoch (version 3: the epoch
//! follows the header). All carry the proposing leader's time stamp. A
//! snapshot's data is the lock table plus, on the meta shard, the placement
//! map.

use fencelock_placement::{PlacementCommand, PlacementMap};
use fencelock_statemachine::{Command, FrozenTable, LockTable};

/// Payload of lock commands.
const PAYLOAD_LOCKS: u8 = 1;
/// Payload of placement commands (meta shard only).
const PAYLOAD_PLACEMENT: u8 = 2;
/// Payload of lock commands applied at a new epoch of the shard.
const PAYLOAD_LOCKS_AT_EPOCH: u8 = 3;
/// Snapshot envelope magic and version.
const STATE_MAGIC: &[u8; 4] = b"FLSS";
const STATE_VERSION: u8 = 1;

/// What one entry carries.
#[derive(Debug, PartialEq, Eq)]
pub enum Payload {
    Locks(Vec<Command>),
    /// Lock commands applied at `epoch`, which the shard takes at this
    /// entry if it is above the current one (an epoch the placement
    /// controller handed out with `AdvanceEpoch`; docs/safety.md, "Fencing
    /// tokens").
    LocksAtEpoch {
        epoch: u64,
        commands: Vec<Command>,
    },
    Placement(Vec<PlacementCommand>),
}

/// A payload of lock commands: the leader's time stamp and the commands.
pub fn encode_payload(now_ms: u64, commands: &[Command]) -> Vec<u8> {
    let mut out = Vec::with_capacity(16 + commands.len() * 64);
    header(&mut out, PAYLOAD_LOCKS, now_ms, commands.len());
    encode_commands(&mut out, commands);
    out
}

/// A payload of lock commands that the shard applies at `epoch`.
pub fn encode_payload_at_epoch(now_ms: u64, epoch: u64, commands: &[Command]) -> Vec<u8> {
    let mut out = Vec::with_capacity(24 + commands.len() * 64);
    header(&mut out, PAYLOAD_LOCKS_AT_EPOCH, now_ms, commands.len());
    out.extend_from_slice(&epoch.to_be_bytes());
    encode_commands(&mut out, commands);
    out
}

fn encode_commands(out: &mut Vec<u8>, commands: &[Command]) {
    for c in commands {
        // Length prefix first, patched once the command is written in place.
        let at = out.len();
        out.extend_from_slice(&[0; 4]);
        c.encode_into(out);
        let len = (out.len() - at - 4) as u32;
        out[at..at + 4].copy_from_slice(&len.to_be_bytes());
    }
}

/// A payload of placement commands for the meta shard.
pub fn encode_placement_payload(now_ms: u64, commands: &[PlacementCommand]) -> Vec<u8> {
    let mut out = Vec::with_capacity(16 + commands.len() * 64);
    header(&mut out, PAYLOAD_PLACEMENT, now_ms, commands.len());
    for c in commands {
        let bytes = c.encode();
        out.extend_from_slice(&(bytes.len() as u32).to_be_bytes());
        out.extend_from_slice(&bytes);
    }
    out
}

fn header(out: &mut Vec<u8>, version: u8, now_ms: u64, count: usize) {
    out.push(version);
    out.extend_from_slice(&now_ms.to_be_bytes());
    out.extend_from_slice(&(count as u32).to_be_bytes());
}

fn take<'a>(data: &mut &'a [u8], n: usize) -> Result<&'a [u8], String> {
    if data.len() < n {
        return Err("payload truncated".into());
    }
    let (head, tail) = data.split_at(n);
    *data = tail;
    Ok(head)
}

fn be_u32(data: &mut &[u8]) -> Result<usize, String> {
    Ok(u32::from_be_bytes(take(data, 4)?.try_into().expect("4 bytes")) as usize)
}

/// Inverse of the encoders; never panics on bad input.
pub fn decode_payload(data: &[u8]) -> Result<(u64, Payload), String> {
    let mut rest = data;
    let version = take(&mut rest, 1)?[0];
    let now_ms = u64::from_be_bytes(take(&mut rest, 8)?.try_into().expect("8 bytes"));
    let n = be_u32(&mut rest)?;
    if n > rest.len() {
        return Err("payload count too large".into());
    }
    let payload = match version {
        PAYLOAD_LOCKS => Payload::Locks(decode_commands(&mut rest, n)?),
        PAYLOAD_LOCKS_AT_EPOCH => {
            let epoch = u64::from_be_bytes(take(&mut rest, 8)?.try_into().expect("8 bytes"));
            let commands = decode_commands(&mut rest, n)?;
            Payload::LocksAtEpoch { epoch, commands }
        }
        PAYLOAD_PLACEMENT => {
            let mut commands = Vec::with_capacity(n);
            for _ in 0..n {
                let len = be_u32(&mut rest)?;
                commands.push(
                    PlacementCommand::decode(take(&mut rest, len)?).map_err(|e| e.to_string())?,
                );
            }
            Payload::Placement(commands)
        }
        v => return Err(format!("unknown payload version {v}")),
    };
    if !rest.is_empty() {
        return Err("trailing bytes in payload".into());
    }
    Ok((now_ms, payload))
}

fn decode_commands(rest: &mut &[u8], n: usize) -> Result<Vec<Command>, String> {
    let mut commands = Vec::with_capacity(n);
    for _ in 0..n {
        let len = be_u32(rest)?;
        commands.push(Command::decode(take(rest, len)?).map_err(|e| e.to_string())?);
    }
    Ok(commands)
}

/// A shard replica's state as snapshot data.
pub fn encode_state(table: &LockTable, placement: Option<&PlacementMap>) -> Vec<u8> {
    encode_frozen_state(&table.freeze(), placement)
}

/// [`encode_state`] of a table frozen earlier ([`LockTable::freeze`]): what
/// the store's snapshot thread runs while the table goes on changing.
pub fn encode_frozen_state(table: &FrozenTable, placement: Option<&PlacementMap>) -> Vec<u8> {
    let locks = table.encode();
    let mut out = Vec::with_capacity(16 + locks.len());
    out.extend_from_slice(STATE_MAGIC);
    out.push(STATE_VERSION);
    out.extend_from_slice(&(locks.len() as u32).to_be_bytes());
    out.extend_from_slice(&locks);
    match placement {
        Some(map) => {
            out.push(1);
            out.extend_from_slice(&map.snapshot());
        }
        None => out.push(0),
    }
    out
}

/// Inverse of [`encode_state`]; never panics on bad input.
pub fn decode_state(data: &[u8]) -> Result<(LockTable, Option<PlacementMap>), String> {
    let mut rest = data;
    if take(&mut rest, 4)? != STATE_MAGIC {
        return Err("not a fencelock shard snapshot".into());
    }
    let version = take(&mut rest, 1)?[0];
    if version != STATE_VERSION {
        return Err(format!("unknown snapshot version {version}"));
    }
    let len = be_u32(&mut rest)?;
    let table = LockTable::restore(take(&mut rest, len)?).map_err(|e| e.to_string())?;
    let placement = match take(&mut rest, 1)?[0] {
        0 if rest.is_empty() => None,
        1 => Some(PlacementMap::restore(rest).map_err(|e| e.to_string())?),
        _ => return Err("bad placement marker in snapshot".into()),
    };
    Ok((table, placement))
}

#[cfg(test)]
mod tests {
    use super::*;
    use fencelock_statemachine::{LeaseId, Limits, ResourceName, SlotSet};

    #[test]
    fn entry_payload_round_trips_and_refuses_damage() {
        let commands = vec![
            Command::Tick,
            Command::Release {
                owner: fencelock_statemachine::Owner::anonymous(),
                resource: ResourceName::parse("acme/x").unwrap(),
                lease_id: LeaseId([3; 16]),
            },
        ];
        let bytes = encode_payload(42, &commands);
        assert_eq!(decode_payload(&bytes), Ok((42, Payload::Locks(commands))));
        for cut in 0..bytes.len() {
            assert!(decode_payload(&bytes[..cut]).is_err(), "truncated at {cut}");
        }
        let mut long = bytes.clone();
        long.push(0);
        assert!(decode_payload(&long).is_err());
        let mut version = bytes;
        version[0] = 9;
        assert!(decode_payload(&version).is_err());
    }

    #[test]
    fn payload_at_an_epoch_round_trips_and_refuses_damage() {
        let commands = vec![Command::Tick];
        let bytes = encode_payload_at_epoch(42, 77, &commands);
        assert_eq!(
            decode_payload(&bytes),
            Ok((
                42,
                Payload::LocksAtEpoch {
                    epoch: 77,
                    commands
                }
            ))
        );
        for cut in 0..bytes.len() {
            assert!(decode_payload(&bytes[..cut]).is_err(), "truncated at {cut}");
        }
        let mut long = bytes;
        long.push(0);
        assert!(decode_payload(&long).is_err());
    }

    /// Deterministic damage to valid payloads and snapshot data (a log
    /// entry or snapshot from a peer or a bad disk): decoding returns an
    /// error or a value, never panics.
    #[test]
    fn damaged_payloads_and_snapshots_never_panic() {
        let mut rng: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut next = move || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng
        };
        let map = PlacementMap::bootstrap(&[(1, "127.0.0.1:7001".into())], 4, 3).unwrap();
        let table = LockTable::bootstrap(Limits::default(), SlotSet::EMPTY, 1, 1).unwrap();
        let seeds = [
            encode_payload(
                1,
                &[
                    Command::Tick,
                    Command::LeaderChanged {
                        clock_offset_allowance_ms: 5,
                    },
                ],
            ),
            encode_placement_payload(2, &[PlacementCommand::RemoveNode { node_id: 3 }]),
            encode_payload_at_epoch(3, 9, &[Command::Tick]),
            encode_state(&table, Some(&map)),
            encode_state(&table, None),
        ];
        for round in 0..20_000 {
            let mut bytes = seeds[round % seeds.len()].clone();
            for _ in 0..(1 + next() % 4) {
                let at = (next() as usize) % bytes.len().max(1);
                match next() % 3 {
                    0 if !bytes.is_empty() => bytes[at] ^= 1 << (next() % 8),
                    1 => bytes.truncate(at),
                    _ => bytes.insert(at.min(bytes.len()), next() as u8),
                }
            }
            let _ = decode_payload(&bytes);
            let _ = decode_state(&bytes);
        }
    }

    #[test]
    fn placement_payload_and_meta_state_round_trip() {
        let commands = vec![PlacementCommand::AddNode {
            node_id: 4,
            addr: "127.0.0.1:7004".into(),
        }];
        let bytes = encode_placement_payload(7, &commands);
        assert_eq!(
            decode_payload(&bytes),
            Ok((7, Payload::Placement(commands)))
        );
        let map = PlacementMap::bootstrap(&[(1, "127.0.0.1:7001".into())], 4, 3).unwrap();
        let table = LockTable::bootstrap(Limits::default(), SlotSet::EMPTY, 1, 1).unwrap();
        let state = encode_state(&table, Some(&map));
        let (t, m) = decode_state(&state).unwrap();
        assert_eq!(t, table);
        assert_eq!(m.unwrap().snapshot(), map.snapshot());
        for cut in 0..state.len() {
            assert!(decode_state(&state[..cut]).is_err(), "truncated at {cut}");
        }
    }
}

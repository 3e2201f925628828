//! Fencing tokens: one integer that orders every grant of a resource.
//!
//! Layout (a positive signed 64-bit integer, so it fits SQL `BIGINT`):
//!
//! ```text
//!  bit 63   62 ........... 40   39 ................ 0
//!  [ 0 ] [ epoch: 23 bits     ] [ position: 40 bits  ]
//! ```
//!
//! * `epoch` is the shard's epoch, handed out by the placement controller
//!   from a replicated counter: globally unique per shard generation and
//!   strictly increasing whenever a shard gains resources. Epoch 0 is never
//!   used, so every token is at least `1 << 40`.
//! * `position` is the Raft log index of the grant counted from the first
//!   entry applied in this epoch (so it starts at 1). When one Raft entry
//!   carries several commands that grant, each further grant takes the next
//!   position: `position = max(last_position + 1, index - epoch_base)`.
//!
//! Because the epoch only rises and, within an epoch, positions only rise
//! with the log, tokens minted by a shard strictly increase in log order;
//! a resource that moves to another shard lands in a higher epoch.
//!
//! Before the position field overflows, the shard refuses new acquires with
//! `TokenSpaceExhausted` from [`POSITION_SOFT_LIMIT`] on (so the placement
//! controller can hand it a new epoch) and still hands queued waiters their
//! turn up to [`MAX_POSITION`]; past that a waiter's turn ends with
//! `TokenSpaceExhausted` instead of a grant. Nothing ever wraps.

/// Bits of the position field.
pub const POSITION_BITS: u32 = 40;
/// Bits of the epoch field.
pub const EPOCH_BITS: u32 = 23;
/// Largest epoch that fits the layout.
pub const MAX_EPOCH: u64 = (1 << EPOCH_BITS) - 1;
/// Largest position that fits the layout.
pub const MAX_POSITION: u64 = (1 << POSITION_BITS) - 1;
/// From this position on, new acquires are refused; the remaining
/// 2^36 positions are reserved for handing the lock to already queued waiters.
pub const POSITION_SOFT_LIMIT: u64 = MAX_POSITION - (1 << 36);

const _: () = assert!(EPOCH_BITS + POSITION_BITS == 63);

/// A fencing token. Ordered like the integer it encodes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct FencingToken(u64);

impl FencingToken {
    /// "No token": lower than every real token.
    pub const NONE: FencingToken = FencingToken(0);

    /// Builds a token. Callers must pass a valid epoch (1..=MAX_EPOCH) and
    /// position (1..=MAX_POSITION); the state machine checks both before it
    /// mints.
    pub fn new(epoch: u64, position: u64) -> FencingToken {
        assert!(
            (1..=MAX_EPOCH).contains(&epoch),
            "epoch {epoch} out of range"
        );
        assert!(
            (1..=MAX_POSITION).contains(&position),
            "position {position} out of range"
        );
        FencingToken((epoch << POSITION_BITS) | position)
    }

    /// Rebuilds a token from its integer form (e.g. when decoding).
    pub fn from_u64(value: u64) -> FencingToken {
        FencingToken(value)
    }

    pub fn as_u64(self) -> u64 {
        self.0
    }

    /// The token as the signed integer protected systems store. Never
    /// negative: bit 63 is always zero.
    pub fn as_i64(self) -> i64 {
        debug_assert!(self.0 <= i64::MAX as u64);
        self.0 as i64
    }

    pub fn epoch(self) -> u64 {
        self.0 >> POSITION_BITS
    }

    pub fn position(self) -> u64 {
        self.0 & MAX_POSITION
    }
}

impl std::fmt::Display for FencingToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_round_trips_and_fits_bigint() {
        let t = FencingToken::new(MAX_EPOCH, MAX_POSITION);
        assert_eq!(t.epoch(), MAX_EPOCH);
        assert_eq!(t.position(), MAX_POSITION);
        assert_eq!(t.as_i64(), i64::MAX);
        let small = FencingToken::new(1, 1);
        assert_eq!(small.as_u64(), (1 << 40) + 1);
    }

    #[test]
    fn higher_epoch_beats_any_position_of_a_lower_epoch() {
        assert!(FencingToken::new(2, 1) > FencingToken::new(1, MAX_POSITION));
        assert!(FencingToken::new(1, 2) > FencingToken::new(1, 1));
        assert!(FencingToken::new(1, 1) > FencingToken::NONE);
    }

    #[test]
    #[should_panic]
    fn epoch_zero_is_not_a_token() {
        FencingToken::new(0, 1);
    }
}

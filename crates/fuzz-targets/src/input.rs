//! Reading structured choices out of fuzzer bytes.
//!
//! Once the bytes run out every read returns zero, so any byte string is a
//! complete input: a fuzzer's mutation never makes an input "invalid", it
//! only changes the choices made.

pub struct Input<'a> {
    data: &'a [u8],
}

impl<'a> Input<'a> {
    pub fn new(data: &'a [u8]) -> Input<'a> {
        Input { data }
    }

    pub fn is_empty(&self) -> bool {
        self.data.is_empty()
    }

    pub fn u8(&mut self) -> u8 {
        match self.data.split_first() {
            Some((&b, rest)) => {
                self.data = rest;
                b
            }
            None => 0,
        }
    }

    pub fn u16(&mut self) -> u16 {
        u16::from_be_bytes([self.u8(), self.u8()])
    }

    pub fn u32(&mut self) -> u32 {
        u32::from_be_bytes([self.u8(), self.u8(), self.u8(), self.u8()])
    }

    pub fn u64(&mut self) -> u64 {
        (u64::from(self.u32()) << 32) | u64::from(self.u32())
    }

    /// An index below `n` (`n` > 0).
    pub fn below(&mut self, n: usize) -> usize {
        debug_assert!(n > 0);
        usize::from(self.u8()) % n
    }

    /// One of `options`, or (for the last choice) a raw `u64`: fuzzers find
    /// boundaries much faster when the interesting values are one byte away.
    pub fn pick_or_raw(&mut self, options: &[u64]) -> u64 {
        let i = self.below(options.len() + 1);
        match options.get(i) {
            Some(&v) => v,
            None => self.u64(),
        }
    }

    /// Up to `max` bytes, length first.
    pub fn bytes(&mut self, max: usize) -> &'a [u8] {
        let n = self.below(max + 1).min(self.data.len());
        let (head, tail) = self.data.split_at(n);
        self.data = tail;
        head
    }
}

//! The checks behind Meridian's fuzz targets, and the seeds of their corpora.
//!
//! Each target in `fuzz_targets/` is one line that hands libFuzzer's bytes to a `check`
//! here; a check panics when a property fails. Keeping the checks in a library lets
//! `cargo test` replay the committed corpora through them and write the seeds
//! (`MERIDIAN_WRITE_SEEDS=1 cargo test --manifest-path fuzz/Cargo.toml`), so the seeds
//! are generated from the same input formats the targets read, never typed by hand.
//!
//! Every target reads its own small input format, documented in its module: a few header
//! bytes that steer the run (limits, cut points, keys), then the data under test.

pub mod frame;
pub mod gateway_core;
pub mod resume_token;
pub mod seeds;
pub mod websocket;

/// Reads a fuzz input front to back; past the end every read gives zeros, so any input
/// decodes to something.
pub struct Cursor<'a> {
    data: &'a [u8],
    at: usize,
}

impl<'a> Cursor<'a> {
    pub fn new(data: &'a [u8]) -> Self {
        Cursor { data, at: 0 }
    }

    pub fn is_empty(&self) -> bool {
        self.at >= self.data.len()
    }

    pub fn u8(&mut self) -> u8 {
        let byte = self.data.get(self.at).copied().unwrap_or(0);
        self.at += 1;
        byte
    }

    pub fn u16(&mut self) -> u16 {
        u16::from_le_bytes([self.u8(), self.u8()])
    }

    pub fn u64(&mut self) -> u64 {
        let mut bytes = [0u8; 8];
        for byte in &mut bytes {
            *byte = self.u8();
        }
        u64::from_le_bytes(bytes)
    }

    /// Up to `n` bytes (fewer at the end of the input).
    pub fn bytes(&mut self, n: usize) -> &'a [u8] {
        let start = self.at.min(self.data.len());
        let end = self.at.saturating_add(n).min(self.data.len());
        self.at = self.at.saturating_add(n);
        &self.data[start..end]
    }

    /// Everything not read yet.
    pub fn rest(&mut self) -> &'a [u8] {
        let start = self.at.min(self.data.len());
        self.at = self.data.len();
        &self.data[start..]
    }
}

/// Writes inputs in the formats [`Cursor`] reads (for the seeds).
#[derive(Default)]
pub struct Writer(pub Vec<u8>);

impl Writer {
    pub fn u8(&mut self, value: u8) -> &mut Self {
        self.0.push(value);
        self
    }

    pub fn u16(&mut self, value: u16) -> &mut Self {
        self.0.extend_from_slice(&value.to_le_bytes());
        self
    }

    pub fn u64(&mut self, value: u64) -> &mut Self {
        self.0.extend_from_slice(&value.to_le_bytes());
        self
    }

    pub fn bytes(&mut self, value: &[u8]) -> &mut Self {
        self.0.extend_from_slice(value);
        self
    }
}

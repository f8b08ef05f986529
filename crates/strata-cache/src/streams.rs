//! The sequential-stream detector behind the sequential cutoff: large sequential IO goes
//! around the cache, as in bcache. Reads and writes are tracked apart, and a write stream
//! counts only what it wrote since the last flush (`synced`): a stream flushed every few
//! blocks, such as a file system's journal, is one its writer waits on, and stays in the
//! cache, as bcache caches synchronous writes in writeback.

/// bcache-style sequential detection: a few recent streams, each with the bytes it has
/// read or written contiguously; a stream past the cutoff bypasses the cache.
pub struct Streams {
    s: [(u64, u64, u64); 16], // (next offset, contiguous bytes, last use)
    tick: u64,
}

impl Default for Streams {
    fn default() -> Self {
        Self::new()
    }
}

impl Streams {
    pub fn new() -> Streams {
        Streams { s: [(u64::MAX, 0, 0); 16], tick: 0 }
    }

    /// Records a request; true when its stream has gone past `cutoff` bytes (0: never).
    pub fn observe(&mut self, offset: u64, len: u64, cutoff: u64) -> bool {
        self.tick += 1;
        let i = match self.s.iter().position(|e| e.0 == offset) {
            Some(i) => {
                self.s[i].1 += len;
                i
            }
            None => {
                let i = self.s.iter().enumerate().min_by_key(|(_, e)| e.2).map(|(i, _)| i).unwrap_or(0);
                self.s[i].1 = len;
                i
            }
        };
        self.s[i].0 = offset + len;
        self.s[i].2 = self.tick;
        cutoff > 0 && self.s[i].1 > cutoff
    }

    /// A flush: every stream starts counting again from here (each keeps its place).
    pub fn synced(&mut self) {
        for e in &mut self.s {
            e.1 = 0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sequential_streams_cross_the_cutoff_and_random_ones_do_not() {
        let mut s = Streams::new();
        let mut bypassed = 0;
        for i in 0..100u64 {
            bypassed += s.observe(i * 65536, 65536, 1 << 20) as u32;
        }
        assert_eq!(bypassed, 100 - 16, "bypass starts once 1 MiB has run contiguously");
        let mut s = Streams::new();
        assert!((0..100u64).all(|i| !s.observe((i * 7919 % 1000) * 4096 + 1, 4096, 1 << 20)));
        // Interleaved streams are tracked apart.
        let mut s = Streams::new();
        let mut last = false;
        for i in 0..40u64 {
            s.observe(i * 65536, 65536, 1 << 20);
            last = s.observe((1 << 30) + i * 65536, 65536, 1 << 20);
        }
        assert!(last);
    }

    #[test]
    fn a_stream_flushed_every_few_blocks_never_crosses_the_cutoff() {
        let mut s = Streams::new();
        let mut bypassed = 0;
        for i in 0..1000u64 {
            bypassed += s.observe(i * 4096, 4096, 1 << 20) as u32;
            if i % 16 == 15 {
                s.synced();
            }
        }
        assert_eq!(bypassed, 0);
        // Unflushed, the same stream crosses it after 1 MiB, and its place survived the flushes.
        assert!((0..300u64).any(|i| s.observe((1000 + i) * 4096, 4096, 1 << 20)));
    }
}

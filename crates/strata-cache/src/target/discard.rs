//! Discard and write-zeroes: the cached copies a request replaces on the origin are dropped
//! (durably) before the origin sees it; a dirty block is zeroed in its slot instead (and on
//! the origin too, outside writeback).

use super::write::{Piece, Route};
use super::Inner;
use std::sync::Arc;
use strata_io::{Buf, Error, ErrorKind, Result, ZeroFlags};

impl Inner {
    /// Drops the cached copy of `b` before part of it is discarded; false if the origin is
    /// to be left alone (part of a dirty block: the cache holds the only good copy of the
    /// rest, and will write it all back).
    fn uncache_for_discard(&self, b: u64, whole: bool) -> bool {
        let mut st = self.state.lock();
        st.zeroed.remove(&b);
        match st.map.get(&b).copied() {
            Some(s) if !whole && st.meta.entries[s as usize].dirty => false,
            Some(_) => {
                st.policy.remove(b);
                st.demote(b, &self.counters);
                true
            }
            None => true,
        }
    }

    /// Drops the cached copies a request is about to replace on the origin, and makes that
    /// durable with one commit for the whole range rather than one per block (`settle`).
    async fn uncache_range(
        &self,
        pieces: &[(u64, u64, u64)],
        drop_block: impl Fn(&Self, u64, bool) -> bool,
    ) -> Result<()> {
        for &(b, within, n) in pieces {
            let _x = self.shard(b).clone().write_owned().await;
            drop_block(self, b, within == 0 && n == self.block_len(b));
        }
        let upto = {
            let st = self.state.lock();
            pieces.iter().filter_map(|(b, _, _)| st.pending.get(b).copied()).max()
        };
        match upto {
            Some(n) => self.commit_upto(n).await,
            None => Ok(()),
        }
    }

    pub(super) async fn discard(self: &Arc<Self>, offset: u64, len: u64) -> Result<()> {
        strata_io::check_range("cache discard", offset, len, self.origin_bytes)?;
        self.state.lock().stopped()?;
        let pieces = self.pieces(offset, len);
        self.uncache_range(&pieces, |me, b, whole| me.uncache_for_discard(b, whole)).await?;
        for (b, within, n) in pieces {
            let _x = self.shard(b).clone().write_owned().await;
            if self.uncache_for_discard(b, within == 0 && n == self.block_len(b)) {
                self.settle(b).await?;
                self.origin.discard(b * self.block + within, n).await?;
            }
        }
        Ok(())
    }

    /// Drops the cached copy of `b` if it is clean and about to be zeroed whole on the origin;
    /// true if the zeroes go to the origin, false if they are written like data (a dirty
    /// block, whose slot is its only current copy, or part of a clean one).
    fn uncache_for_zeroes(&self, b: u64, whole: bool) -> bool {
        let mut st = self.state.lock();
        match st.map.get(&b).copied() {
            Some(s) if st.meta.entries[s as usize].dirty || !whole => false,
            Some(_) => {
                st.policy.remove(b);
                st.demote(b, &self.counters);
                true
            }
            None => true,
        }
    }

    pub(super) async fn write_zeroes(self: &Arc<Self>, offset: u64, len: u64, flags: ZeroFlags) -> Result<()> {
        strata_io::check_range("cache write_zeroes", offset, len, self.origin_bytes)
            .map_err(|e| Error::new(ErrorKind::NoSpace, e.context))?;
        self.state.lock().stopped()?;
        let pieces = self.pieces(offset, len);
        self.uncache_range(&pieces, |me, b, whole| me.uncache_for_zeroes(b, whole)).await?;
        for (b, within, n) in pieces {
            let x = self.shard(b).clone().write_owned().await;
            let whole = within == 0 && n == self.block_len(b);
            if self.uncache_for_zeroes(b, whole) {
                self.settle(b).await?;
                self.origin.write_zeroes(b * self.block + within, n, flags).await?;
                if whole {
                    self.state.lock().zeroed.insert(b);
                }
            } else {
                if flags.fast_only {
                    return Err(Error::new(ErrorKind::Unsupported, "zeroing a cached block is not fast"));
                }
                drop(x);
                if let Piece::Refused =
                    self.write_piece(b, within, Buf::zeroed(n as usize), false, Route::Policy).await?
                {
                    self.write_refused(b, within, Buf::zeroed(n as usize), false).await?;
                }
            }
        }
        Ok(())
    }
}

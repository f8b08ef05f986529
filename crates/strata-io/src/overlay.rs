//! Block status of a target that holds copies of some of its origin's blocks (a cache, a
//! write log): a block it holds reads from its copy, so it is data whatever the origin says
//! (even a clean copy: the conservative answer); a block it does not hold reads from the
//! origin, so the origin's own answer holds for it. That keeps `base:allocation`'s holes and
//! zeroes, which `nbdcopy` and `qemu-img convert` skip, for the blocks never cached.

use crate::{BlockDev, Extent, Result};

/// Most blocks one run looks at: it is looked at under the target's lock, which IO waits
/// for, and a request for 4 GiB of 4 KiB blocks would hold it for a million lookups.
const RUN_BLOCKS: u64 = 16_384;

/// Whether the block holding byte `offset` is held, and the bytes from `offset` (at most
/// `len`, and at most [`RUN_BLOCKS`] blocks) over which that stays so, for blocks of `block`
/// bytes.
pub fn leading_run(offset: u64, len: u64, block: u64, held: impl Fn(u64) -> bool) -> (bool, u64) {
    let end = offset + len;
    let first = offset / block;
    let is_held = held(first);
    let mut b = first + 1;
    while b * block < end && b - first < RUN_BLOCKS && held(b) == is_held {
        b += 1;
    }
    (is_held, (b * block).min(end) - offset)
}

/// The extents of `[offset, offset+len)`, run by run: `run(pos, left)` says (under the
/// target's own lock) whether the block at `pos` is held and how far that goes
/// ([`leading_run`]); a held run is data, another is asked of `origin`. Stops early where
/// the origin describes less than asked, or after 64 runs (a device may answer less).
pub async fn block_status(
    origin: &dyn BlockDev,
    offset: u64,
    len: u64,
    run: impl Fn(u64, u64) -> (bool, u64),
) -> Result<Vec<Extent>> {
    let (end, mut pos, mut out) = (offset + len, offset, Vec::new());
    for _ in 0..64 {
        if pos >= end {
            break;
        }
        let (held, n) = run(pos, end - pos);
        if held {
            out.push(Extent::data(n));
            pos += n;
            continue;
        }
        let mut left = n;
        for mut e in origin.block_status(pos, n).await? {
            if left == 0 {
                break;
            }
            e.len = e.len.min(left);
            left -= e.len;
            out.push(e);
        }
        pos += n - left;
        if left > 0 {
            break;
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mem::MemDev;
    use crate::Buf;

    #[test]
    fn a_run_ends_where_holding_changes_or_the_range_does() {
        let held = |b: u64| (2..5).contains(&b);
        assert_eq!(leading_run(0, 100, 10, held), (false, 20));
        assert_eq!(leading_run(25, 100, 10, held), (true, 25));
        assert_eq!(leading_run(25, 10, 10, held), (true, 10));
        assert_eq!(leading_run(55, 100, 10, held), (false, 100));
        assert_eq!(leading_run(0, u64::MAX / 2, 1, |_| false), (false, RUN_BLOCKS), "a run is looked at in part");
    }

    #[tokio::test]
    async fn held_blocks_are_data_and_the_rest_as_the_origin_says() {
        const MIB: u64 = 1 << 20;
        let origin = MemDev::new(16 * MIB);
        origin.write(8 * MIB, Buf::from_slice(&[1u8; 4096]), false).await.unwrap();
        let block = MIB;
        let held = |b: u64| b == 2;
        let got = block_status(&origin, 0, 16 * MIB, |pos, left| leading_run(pos, left, block, held)).await.unwrap();
        assert_eq!(got.iter().map(|e| e.len).sum::<u64>(), 16 * MIB, "{got:?}");
        let at = |off: u64| crate::testing::extent_at(&got, off);
        assert!(at(0).hole && at(MIB + 5).hole, "{got:?}");
        assert_eq!(at(2 * MIB + 5), Extent::data(block), "the held block is data though the origin has a hole there");
        assert!(at(3 * MIB).hole, "{got:?}");
        assert!(!at(8 * MIB).hole, "the origin's data: {got:?}");
        assert!(at(15 * MIB).zero, "{got:?}");
    }
}

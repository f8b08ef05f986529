//! Thin volumes and snapshots against in-memory references under random reads, writes,
//! trims, flushes, snapshots and deletes; at the end both checkers pass, and the pool
//! reopened from its metadata reads the same.

mod common;

use rand::{Rng, SeedableRng};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;
use strata_io::mem::MemDev;
use strata_io::testing::model::pattern;
use strata_io::{BlockDev, Buf, ErrorKind, ZeroFlags};
use strata_thin::meta::Metadata;
use strata_thin::pool::Tunables;
use strata_thin::{Pool, PoolOptions, ThinDev};

const BS: u64 = 64 << 10;
const VOL: u64 = 24 * BS;

/// A volume's expected bytes (None where a discard, or a first write without zeroing, left
/// them unspecified) and which blocks it maps.
#[derive(Clone)]
struct Want(Vec<Option<u8>>, Vec<bool>);

impl Want {
    fn new() -> Want {
        Want(vec![Some(0); VOL as usize], vec![false; (VOL / BS) as usize])
    }

    fn write(&mut self, off: u64, data: &[u8], skip_zeroing: bool) {
        for b in off / BS..(off + data.len() as u64).div_ceil(BS) {
            if !self.1[b as usize] && skip_zeroing {
                self.0[(b * BS) as usize..((b + 1) * BS) as usize].fill(None);
            }
            self.1[b as usize] = true;
        }
        for (i, v) in data.iter().enumerate() {
            self.0[off as usize + i] = Some(*v);
        }
    }

    /// Whole blocks of the range are unmapped.
    fn unmap(&mut self, off: u64, len: u64) {
        for b in off.div_ceil(BS)..(off + len) / BS {
            self.1[b as usize] = false;
        }
    }
    fn check(&self, offset: u64, got: &[u8], what: &str) {
        for (i, g) in got.iter().enumerate() {
            if let Some(w) = self.0[offset as usize + i] {
                assert_eq!(*g, w, "{what}: byte {} reads {g:#x}, expected {w:#x}", offset as usize + i);
            }
        }
    }
}

pub async fn pool(md: &Arc<MemDev>, data: &Arc<MemDev>, opts: PoolOptions) -> Arc<Pool> {
    Pool::open(md.clone(), data.clone(), "mem:data", opts).await.unwrap()
}

async fn run(seed: u64, opts: PoolOptions) -> (Arc<MemDev>, Arc<MemDev>, BTreeMap<u32, Want>) {
    let md = Arc::new(MemDev::new(4 << 20));
    let data = Arc::new(MemDev::new(200 * BS));
    let mut m = Metadata::format(&*md, data.size(), BS, "mem:data", false).await.unwrap();
    m.create_thin(1).unwrap();
    m.set_volume_size(1, VOL).unwrap();
    m.commit(&*md).await.unwrap();
    let p = pool(&md, &data, opts).await;
    let mut vols: BTreeMap<u32, (ThinDev, Want)> = BTreeMap::new();
    vols.insert(1, (ThinDev::new(p.clone(), 1, None).unwrap(), Want::new()));
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    let mut next_id = 2;
    for step in 0..1500 {
        if std::env::var_os("THIN_FULLCHECK").is_some() {
            for (vid, (dev, want)) in &vols {
                let got = dev.read(0, Buf::zeroed(VOL as usize)).await.unwrap();
                want.check(0, &got, &format!("before step {step}: volume {vid}"));
            }
        }
        let ids: Vec<u32> = vols.keys().copied().collect();
        let id = ids[rng.gen_range(0..ids.len())];
        let sector = rng.gen_range(0..VOL / 512);
        let n = rng.gen_range(1..=(3 * BS / 512).min(VOL / 512 - sector));
        let (off, len) = (sector * 512, n * 512);
        let what = format!("seed {seed} step {step} volume {id}");
        if std::env::var_os("THIN_TRACE").is_some() {
            eprintln!("{what}: op {} off {off} len {len}", rng.clone().gen_range(0..100));
        }
        let nvols = vols.len();
        let op = rng.gen_range(0..100);
        if (89..=95).contains(&op) && nvols < 6 {
            let snap = next_id;
            next_id += 1;
            p.with_meta(|m| {
                m.create_snapshot(snap, id)?;
                m.set_volume_size(snap, VOL)
            })
            .unwrap();
            let w = vols[&id].1.clone();
            vols.insert(snap, (ThinDev::new(p.clone(), snap, None).unwrap(), w));
            continue;
        }
        if op >= 96 && nvols > 1 {
            vols.remove(&id);
            p.with_meta(|m| m.delete(id)).unwrap();
            continue;
        }
        let (dev, want) = vols.get_mut(&id).unwrap();
        match op {
            0..=34 => {
                let got = dev.read(off, Buf::zeroed(len as usize)).await.unwrap();
                want.check(off, &got, &what);
            }
            35..=69 => {
                let buf = pattern(rng.gen(), off, len as usize);
                want.write(off, &buf, opts.skip_block_zeroing);
                match dev.write(off, buf, rng.gen_bool(0.1)).await {
                    Ok(_) => {}
                    Err(e) => panic!("{what}: write: {e}"),
                }
            }
            70..=77 => {
                dev.discard(off, len).await.unwrap();
                // Whole blocks in the range are unmapped (read as zeroes); partial ones keep
                // their data, but the contract leaves the range unspecified.
                want.0[off as usize..(off + len) as usize].fill(None);
                want.unmap(off, len);
            }
            78..=81 => {
                let may_unmap = rng.gen_bool(0.5);
                dev.write_zeroes(off, len, ZeroFlags { may_unmap, fast_only: false }).await.unwrap();
                // Whole blocks unmapped if allowed (or unmapped already); the rest written.
                // Without block zeroing, all written (a first write would show old data).
                let zeroes = vec![0u8; len as usize];
                let mapped: Vec<bool> = want.1.clone();
                let skip = opts.skip_block_zeroing;
                for b in off / BS..(off + len).div_ceil(BS) {
                    let (s, e) = ((b * BS).max(off), ((b + 1) * BS).min(off + len));
                    let whole = e - s == BS;
                    if whole && (may_unmap || !mapped[b as usize]) && !skip {
                        want.unmap(s, BS);
                        want.0[s as usize..e as usize].fill(Some(0));
                    } else if mapped[b as usize] || skip {
                        want.write(s, &zeroes[..(e - s) as usize], skip);
                    } else {
                        want.0[s as usize..e as usize].fill(Some(0));
                    }
                }
            }
            82..=88 => dev.flush().await.unwrap(),
            _ => {}
        }
    }
    p.commit().await.unwrap();
    for (id, (dev, want)) in &vols {
        let got = dev.read(0, Buf::zeroed(VOL as usize)).await.unwrap();
        want.check(0, &got, &format!("seed {seed}: volume {id} at the end"));
    }
    let report = strata_thin::check::check(&*md).await;
    assert!(report.clean(), "seed {seed}: {report:?}");
    (md, data, vols.into_iter().map(|(id, (_, w))| (id, w)).collect())
}

#[tokio::test]
async fn volumes_and_snapshots_match_their_references() {
    for seed in 0..4 {
        let opts = PoolOptions { skip_block_zeroing: seed % 2 == 1, ..PoolOptions::default() };
        let (md, data, wants) = run(seed, opts).await;
        // Reopened from what is on the devices, every volume reads the same.
        let p = pool(&md, &data, opts).await;
        for (id, want) in wants {
            let dev = ThinDev::new(p.clone(), id, None).unwrap();
            let got = dev.read(0, Buf::zeroed(VOL as usize)).await.unwrap();
            want.check(0, &got, &format!("seed {seed}: volume {id} reopened"));
        }
        let mut bytes = vec![0u8; md.size() as usize];
        md.read_into(0, &mut bytes).unwrap();
        if let Some((ok, text)) = common::thin_check_bytes(&bytes) {
            assert!(ok, "seed {seed}: thin_check: {text}");
        }
    }
}

/// A pool of `data_blocks` on RAM with volume 1 of `vol_blocks`.
async fn one_volume(data_blocks: u64, vol_blocks: u64) -> (Arc<MemDev>, Arc<MemDev>, Arc<Pool>, ThinDev) {
    let md = Arc::new(MemDev::new(1 << 20));
    let data = Arc::new(MemDev::new(data_blocks * BS));
    let mut m = Metadata::format(&*md, data.size(), BS, "", false).await.unwrap();
    m.create_thin(1).unwrap();
    m.commit(&*md).await.unwrap();
    let p = pool(&md, &data, PoolOptions::default()).await;
    let dev = ThinDev::new(p.clone(), 1, Some(vol_blocks * BS)).unwrap();
    (md, data, p, dev)
}

#[tokio::test]
async fn a_full_pool_refuses_new_blocks_and_keeps_mapped_ones_working() {
    let (md, _, p, dev) = one_volume(8, 16).await;
    for b in 0..8 {
        dev.write(b * BS, pattern(b, 0, 4096), false).await.unwrap();
    }
    let e = dev.write(8 * BS, pattern(9, 0, 4096), false).await.unwrap_err();
    assert_eq!(e.kind, ErrorKind::NoSpace, "{e}");
    assert_eq!(p.status().mode, "out_of_data_space");
    dev.write(2 * BS + 512, pattern(7, 0, 4096), true).await.unwrap();
    let got = dev.read(2 * BS + 512, Buf::zeroed(4096)).await.unwrap();
    assert_eq!(&got[..], &pattern(7, 0, 4096)[..]);
    // Freed by a trim, a block is reused after the commit that frees it.
    dev.discard(0, BS).await.unwrap();
    dev.write(8 * BS, pattern(9, 0, 4096), false).await.unwrap();
    assert_eq!(p.status().mode, "ok");
    dev.flush().await.unwrap();
    assert!(strata_thin::check::check(&*md).await.clean());
}

/// A write across several blocks that fails in one of them (no space left, an IO error) gives
/// back every block its other pieces took: none stays counted with no mapping, which only an
/// offline repair would free. The data device is slow, so the other pieces are still writing
/// when the failing one ends the request.
#[tokio::test]
async fn a_write_that_fails_in_one_block_gives_back_the_blocks_of_the_others() {
    use strata_io::fault::{FaultDev, Ops, Rule};
    for no_space in [true, false] {
        let md = Arc::new(MemDev::new(1 << 20));
        let (data, faults) = FaultDev::new(MemDev::new(8 * BS));
        let data = Arc::new(data);
        let mut m = Metadata::format(&*md, data.size(), BS, "", false).await.unwrap();
        m.create_thin(1).unwrap();
        m.commit(&*md).await.unwrap();
        let p = Pool::open(md.clone(), data.clone(), "mem:data", PoolOptions::default()).await.unwrap();
        let dev = ThinDev::new(p.clone(), 1, Some(16 * BS)).unwrap();
        for b in 0..6 {
            dev.write(b * BS, pattern(b, 0, 4096), false).await.unwrap();
        }
        // Two blocks are left. Four blocks written: the third finds none. Or two written, the
        // second's data write failing while the first's is still under way.
        let delay = Rule::delay(Ops::WRITE, Duration::from_millis(50));
        let blocks = if no_space {
            faults.add(delay);
            4
        } else {
            faults.add(delay.range(6 * BS..7 * BS));
            faults.add(Rule::write_error(7 * BS..8 * BS));
            2
        };
        let e = dev.write(8 * BS, pattern(9, 0, blocks * BS as usize), false).await.unwrap_err();
        assert_eq!(e.kind, if no_space { ErrorKind::NoSpace } else { ErrorKind::Io }, "{e}");
        faults.clear();
        let st = p.status();
        let mapped = dev.thin_status().mapped_blocks;
        assert_eq!(st.data_used_blocks, mapped, "no space {no_space}: blocks counted but mapped by nothing: {st:?}");
        dev.flush().await.unwrap();
        let r = strata_thin::check::check(&*md).await;
        assert!(r.clean() && r.warnings.is_empty(), "no space {no_space}: {r:?}");
    }
}

/// A mapping leaf damaged on disk (read only when a request needs it): requests that need it
/// fail, the others go on, and status and the log say what was found.
#[tokio::test]
async fn a_leaf_found_damaged_while_serving_is_reported() {
    let md = Arc::new(MemDev::new(4 << 20));
    let data = Arc::new(MemDev::new(4000 * BS));
    let mut m = Metadata::format(&*md, data.size(), BS, "", false).await.unwrap();
    m.create_thin(1).unwrap();
    for v in 0..3000 {
        let b = m.alloc_data().unwrap();
        m.insert(1, v, b).unwrap();
    }
    m.commit(&*md).await.unwrap();
    // A leaf of volume 1's mapping tree under its root's second child (opening the pool
    // reads the first leaf), and the first and last blocks it maps.
    let mut at = m.tm.view(m.subtree(1).unwrap()).unwrap().val64(1);
    let (first, last) = loop {
        let n = m.tm.view(at).unwrap();
        if n.leaf {
            break (n.key(0), n.key(n.len - 1));
        }
        at = n.val64(0);
    };
    let mut byte = [0u8; 1];
    md.read_into(at * 4096 + 3000, &mut byte).unwrap();
    md.write_from(at * 4096 + 3000, &[byte[0] ^ 0x40]).unwrap();
    let p = pool(&md, &data, PoolOptions::default()).await;
    let dev = ThinDev::new(p.clone(), 1, Some(4000 * BS)).unwrap();
    assert_eq!(p.status().mode, "ok", "nothing read yet");
    assert!(dev.read(first * BS, Buf::zeroed(4096)).await.is_err());
    assert!(dev.write(last * BS, pattern(1, 0, 4096), false).await.is_err());
    let st = p.status();
    assert_eq!(st.mode, "metadata_unreadable", "{st:?}");
    assert!(st.reason.as_deref().is_some_and(|r| r.contains(&format!("block {at}"))), "{st:?}");
    // Blocks the damaged leaf does not map still serve.
    assert!(last < 2999);
    dev.read(2999 * BS, Buf::zeroed(4096)).await.unwrap();
}

#[tokio::test]
async fn only_flushes_and_fua_writes_after_provisioning_commit_and_one_commit_takes_them_all() {
    let (md, data, p, dev) = one_volume(64, 32).await;
    // No periodic commit here (see the next test).
    p.set_tunables(Tunables { commit_period: Duration::ZERO, ..p.tunables() });
    let commits = || p.status().commits;
    for b in 0..10 {
        dev.write(b * BS + 4096, pattern(b, 0, 4096), false).await.unwrap();
    }
    assert_eq!(commits(), 0, "provisioning alone commits nothing");
    dev.flush().await.unwrap();
    assert_eq!(commits(), 1, "one flush commits every block provisioned before it");
    dev.flush().await.unwrap();
    dev.write(3 * BS, pattern(1, 0, 4096), true).await.unwrap();
    assert_eq!(commits(), 1, "a flush or FUA write that changes no mapping commits nothing");
    dev.write(20 * BS, pattern(2, 0, 4096), true).await.unwrap();
    assert_eq!(commits(), 2, "a FUA write that provisions commits");
    // What the last commit holds survives a reopen: the provisioned blocks and their zeroes.
    drop(dev);
    drop(p);
    let p = pool(&md, &data, PoolOptions::default()).await;
    let dev = ThinDev::new(p, 1, Some(32 * BS)).unwrap();
    let got = dev.read(20 * BS, Buf::zeroed(BS as usize)).await.unwrap();
    assert_eq!(&got[..4096], &pattern(2, 0, 4096)[..]);
    assert!(got[4096..].iter().all(|&b| b == 0), "the rest of a new block is zeroed");
    let ext = dev.block_status(0, 32 * BS).await.unwrap();
    assert_eq!(ext[0], strata_io::Extent::data(BS * 10));
    assert_eq!(ext[1], strata_io::Extent::hole(BS * 10));
    assert_eq!(ext[2], strata_io::Extent::data(BS));
}

#[tokio::test]
async fn provisioning_is_committed_within_a_commit_period_without_a_flush() {
    let (md, _, p, dev) = one_volume(64, 32).await;
    p.set_tunables(Tunables { commit_period: Duration::from_millis(20), ..p.tunables() });
    dev.write(3 * BS, pattern(3, 0, 4096), false).await.unwrap();
    // The background commit makes it durable; no flush is sent. (Waits up to 20 s.)
    let mut tries = 0;
    loop {
        let m = Metadata::open(&*md).await.unwrap();
        if m.lookup(1, 3).unwrap().is_some() {
            break;
        }
        tries += 1;
        assert!(tries < 2000, "no periodic commit");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let st = p.status();
    assert!(st.commits >= 1 && st.last_commit_unix_ms > 0 && st.commit_period_ms == 20, "{st:?}");
    // Past an hour the admin message is refused and the period stays; an hour is taken.
    let e = p.message("commit_period_ms 3600001").await.unwrap_err();
    assert!(e.to_string().contains("past an hour"), "{e}");
    assert_eq!(p.status().commit_period_ms, 20);
    p.message("commit_period_ms 3600000").await.unwrap();
    assert_eq!(p.status().commit_period_ms, 3_600_000);
    // The metadata the periodic commit wrote, the volume closed, passes the checker.
    drop(dev);
    assert!(strata_thin::check::check(&*md).await.clean());
}

#[tokio::test]
async fn a_full_pool_grows_live_and_the_writes_it_refused_then_succeed() {
    // Data and metadata devices larger than the pool uses, as after lvextend.
    let md = Arc::new(MemDev::new(2 << 20));
    let data = Arc::new(MemDev::new(32 * BS));
    let mut m = Metadata::create(1 << 20, 8 * BS, BS).unwrap();
    m.create_thin(1).unwrap();
    m.commit(&*md).await.unwrap();
    let p = pool(&md, &data, PoolOptions::default()).await;
    p.set_tunables(Tunables { low_water_blocks: 2, ..p.tunables() });
    let dev = ThinDev::new(p.clone(), 1, Some(32 * BS)).unwrap();
    for b in 0..5 {
        dev.write(b * BS, pattern(b, 0, BS as usize), false).await.unwrap();
    }
    assert!(!p.status().below_low_water);
    // At the mark (dm-thin's rule: free blocks at or below it).
    dev.write(5 * BS, pattern(5, 0, BS as usize), false).await.unwrap();
    let st = p.status();
    assert!(st.below_low_water && st.data_free_blocks == 2 && st.low_water_blocks == 2, "{st:?}");
    dev.write(6 * BS, pattern(6, 0, BS as usize), false).await.unwrap();
    dev.write(7 * BS, pattern(7, 0, BS as usize), false).await.unwrap();
    let e = dev.write(8 * BS, pattern(8, 0, 4096), false).await.unwrap_err();
    assert_eq!(e.kind, ErrorKind::NoSpace, "{e}");
    assert_eq!(p.status().mode, "out_of_data_space");
    dev.write(2 * BS, pattern(20, 0, 4096), false).await.unwrap();
    // Grown live: data to the whole device, metadata to 2 MiB.
    p.extend(Some(32 * BS), Some(2 << 20)).await.unwrap();
    let st = p.status();
    assert_eq!((st.mode.as_str(), st.data_blocks, st.metadata_blocks), ("ok", 32, 512), "{st:?}");
    assert!(!st.below_low_water);
    for b in 8..32 {
        dev.write(b * BS, pattern(b, 0, BS as usize), false).await.unwrap();
    }
    dev.write(0, pattern(0, 0, 4096), false).await.unwrap();
    let e = p.extend(Some(64 * BS), None).await.unwrap_err();
    assert!(e.context.contains("cannot grow"), "{e}");
    dev.flush().await.unwrap();
    for b in 0..32 {
        let want = match b {
            0 => [pattern(0, 0, 4096).to_vec(), pattern(0, 0, BS as usize)[4096..].to_vec()].concat(),
            2 => [pattern(20, 0, 4096).to_vec(), pattern(2, 0, BS as usize)[4096..].to_vec()].concat(),
            _ => pattern(b, 0, BS as usize).to_vec(),
        };
        let got = dev.read(b * BS, Buf::zeroed(BS as usize)).await.unwrap();
        assert!(got[..] == want[..], "block {b} damaged");
    }
    let r = strata_thin::check::check(&*md).await;
    assert!(r.clean(), "{:?}", r.errors);
    let mut bytes = vec![0u8; md.size() as usize];
    md.read_into(0, &mut bytes).unwrap();
    if let Some((ok, text)) = common::thin_check_bytes(&bytes) {
        assert!(ok, "thin_check after growing: {text}");
    }
}

#[tokio::test]
async fn a_reopened_pool_reads_its_leaves_when_needed_and_deletes_and_trims_through_them() {
    // 1,200 mappings: several leaves under an internal node, none read at open.
    let n = 1200;
    let (md, data, p, dev) = one_volume(2 * n + 64, n).await;
    for b in 0..n {
        dev.write(b * BS, pattern(b, 0, 512), false).await.unwrap();
    }
    dev.flush().await.unwrap();
    drop((dev, p));
    let reopen = || async { pool(&md, &data, PoolOptions::default()).await };
    let p = reopen().await;
    p.snapshot(1, 2).await.unwrap();
    let snap = ThinDev::new(p.clone(), 2, Some(n * BS)).unwrap();
    for b in (0..n).step_by(3) {
        snap.write(b * BS, pattern(b + 7, 0, 512), false).await.unwrap();
    }
    snap.flush().await.unwrap();
    drop((snap, p));
    // Reopened: the snapshot's own leaves are read to delete it, its blocks freed; trims of
    // the origin rebalance leaves read on the way.
    let p = reopen().await;
    let used = p.status().data_used_blocks;
    p.delete_volume(2).await.unwrap();
    p.wait_deletions().await.unwrap();
    assert_eq!(p.status().data_used_blocks, used - n.div_ceil(3));
    let dev = ThinDev::new(p.clone(), 1, Some(n * BS)).unwrap();
    dev.discard(100 * BS, 700 * BS).await.unwrap();
    dev.flush().await.unwrap();
    for b in (0..n).step_by(7) {
        let got = dev.read(b * BS, Buf::zeroed(512)).await.unwrap();
        let want = if (100..800).contains(&b) { Buf::zeroed(512) } else { pattern(b, 0, 512) };
        assert!(got[..] == want[..], "block {b}");
    }
    drop((dev, p));
    let r = strata_thin::check::check(&*md).await;
    assert!(r.clean() && r.warnings.is_empty(), "{:?} {:?}", r.errors, r.warnings);
    assert_eq!(r.data_blocks_used, n - 700);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_writes_to_one_block_all_land() {
    let (md, _, p, dev) = one_volume(64, 32).await;
    let dev = Arc::new(dev);
    // First writes racing to provision one block, then writes racing to copy it after a
    // snapshot: each 4 KiB piece must survive the others' provisioning or copy.
    for round in 0..2u64 {
        let writes = (0..16u64).map(|i| {
            let dev = dev.clone();
            tokio::spawn(async move { dev.write(5 * BS + i * 4096, pattern(round * 100 + i, 0, 4096), false).await })
        });
        for w in futures::future::join_all(writes).await {
            w.unwrap().unwrap();
        }
        let got = dev.read(5 * BS, Buf::zeroed(BS as usize)).await.unwrap();
        for i in 0..16u64 {
            let piece = &got[(i * 4096) as usize..((i + 1) * 4096) as usize];
            assert_eq!(piece, &pattern(round * 100 + i, 0, 4096)[..], "round {round}: piece {i} lost");
        }
        if round == 0 {
            p.with_meta(|m| m.create_snapshot(2, 1)).unwrap();
        }
    }
    let snap = ThinDev::new(p.clone(), 2, Some(32 * BS)).unwrap();
    let got = snap.read(5 * BS, Buf::zeroed(4096)).await.unwrap();
    assert_eq!(&got[..], &pattern(0, 0, 4096)[..], "the snapshot keeps the first round");
    dev.flush().await.unwrap();
    assert_eq!(p.status().copied_blocks, 1, "one copy for sixteen racing writes");
    assert!(strata_thin::check::check(&*md).await.clean());
}

#[tokio::test]
async fn a_pool_whose_counts_are_below_its_references_fails_both_checkers() {
    let (md, _, p, dev) = one_volume(16, 16).await;
    dev.write(0, pattern(1, 0, 4096), false).await.unwrap();
    dev.flush().await.unwrap();
    drop((dev, p));
    // Damage as a bug would make it: every checksum right, a block in use counted free.
    let mut m = Metadata::open(&*md).await.unwrap();
    let root = m.subtree(1).unwrap();
    m.tm.md.dec(root).unwrap();
    m.set_volume_size(1, BS).unwrap();
    m.commit(&*md).await.unwrap();
    let r = strata_thin::check::check(&*md).await;
    assert!(r.errors.iter().any(|e| e.contains("reference counts differ")), "{:?}", r.errors);
    let mut bytes = vec![0u8; md.size() as usize];
    md.read_into(0, &mut bytes).unwrap();
    if let Some((ok, text)) = common::thin_check_bytes(&bytes) {
        assert!(!ok, "thin_check passed a node counted free: {text}");
    }
}

/// Without block zeroing, zeroes written to an unmapped block stay zeroes when a later write
/// provisions the block (they read as the data device's old bytes before: write-zeroes left
/// the block unmapped).
#[tokio::test]
async fn zeroes_written_without_block_zeroing_survive_a_later_first_write() {
    let md = Arc::new(MemDev::new(1 << 20));
    let data = Arc::new(MemDev::new(8 * BS));
    data.write_from(0, &vec![0xAA; (8 * BS) as usize]).unwrap();
    let mut m = Metadata::format(&*md, data.size(), BS, "", false).await.unwrap();
    m.create_thin(1).unwrap();
    m.commit(&*md).await.unwrap();
    let opts = PoolOptions { skip_block_zeroing: true, ..PoolOptions::default() };
    let p = Pool::open(md, data, "", opts).await.unwrap();
    let dev = ThinDev::new(p, 1, Some(4 * BS)).unwrap();
    for may_unmap in [false, true] {
        let at = if may_unmap { BS } else { 0 };
        dev.write_zeroes(at, BS, ZeroFlags { may_unmap, fast_only: false }).await.unwrap();
        dev.write_zeroes(at + BS * 2, 8192, ZeroFlags { may_unmap, fast_only: false }).await.unwrap();
        dev.write(at + 4096, pattern(1, at + 4096, 512), false).await.unwrap();
        dev.write(at + BS * 2 + 16384, pattern(2, at + BS * 2 + 16384, 512), false).await.unwrap();
        let got = dev.read(at, Buf::zeroed(4096)).await.unwrap();
        assert!(got.iter().all(|&b| b == 0), "zeroed whole block (may_unmap {may_unmap})");
        let got = dev.read(at + BS * 2, Buf::zeroed(8192)).await.unwrap();
        assert!(got.iter().all(|&b| b == 0), "zeroed part of a block (may_unmap {may_unmap})");
    }
}

//! Deletion in the background: a deleted volume is hidden at once (one transaction) and its
//! space freed by steps, each committed; every committed state passes both checkers, a
//! snapshot's origin is untouched throughout, and a deletion cut short resumes on open.

mod common;

use std::sync::Arc;
use std::time::Duration;
use strata_io::mem::MemDev;
use strata_io::testing::model::pattern;
use strata_io::{BlockDev, Buf, ErrorKind};
use strata_thin::meta::{DevId, Metadata};
use strata_thin::ThinDev;

const BS: u64 = 64 << 10;

/// A pool whose volume 1 maps `n` blocks (inserted in order: leaves half full, so `n` of
/// 40,000 make a tree of three levels), committed.
async fn pool_with(n: u64, data_blocks: u64) -> (Arc<MemDev>, Arc<MemDev>, Metadata) {
    let md = Arc::new(MemDev::new(64 << 20));
    let data = Arc::new(MemDev::new(data_blocks * BS));
    let mut m = Metadata::format(&*md, data.size(), BS, "", false).await.unwrap();
    m.create_volume(1, n * BS).unwrap();
    for v in 0..n {
        let b = m.alloc_data().unwrap();
        m.insert(1, v, b).unwrap();
    }
    m.commit(&*md).await.unwrap();
    (md, data, m)
}

/// Levels of device `id`'s mapping tree.
fn height(m: &Metadata, id: DevId) -> usize {
    let mut b = m.subtree(id).unwrap();
    let mut h = 1;
    while !m.tm.view(b).unwrap().leaf {
        b = m.tm.view(b).unwrap().val64(0);
        h += 1;
    }
    h
}

use common::{checked, open};

#[tokio::test]
async fn a_large_volume_is_hidden_at_once_and_freed_by_checked_steps() {
    let n = 40_000;
    let (md, data, m) = pool_with(n, n + 100).await;
    assert_eq!(height(&m, 1), 3);
    let md_before = {
        let mut e = Metadata::format(&MemDev::new(64 << 20), data.size(), BS, "", false).await.unwrap();
        e.commit(&MemDev::new(64 << 20)).await.unwrap();
        e.tm.md.allocated()
    };
    drop(m);
    let p = open(&md, &data).await;
    p.pause_deletions(true);
    p.set_delete_step_nodes(16);
    let commits = p.status().commits;
    p.delete_volume(1).await.unwrap();
    // One transaction: the volume is gone from view, its space not yet free.
    let s = p.status();
    assert_eq!((s.commits, s.volumes, s.deleting.clone()), (commits + 1, 0, vec![1]));
    assert_eq!(s.data_used_blocks, n);
    assert!(ThinDev::new(p.clone(), 1, None).is_err());
    let e = p.create_volume(1, BS).await.unwrap_err();
    assert!(e.kind == ErrorKind::Busy && e.context.contains("being deleted"), "{e:?}");
    assert!(p.snapshot(1, 2).await.unwrap_err().context.contains("being deleted"));
    checked(&md, "marked").await;
    let mut steps = 0;
    let mut used = n;
    loop {
        let (id, done) = p.delete_step().await.unwrap().expect("a deletion in progress");
        assert_eq!(id, 1);
        steps += 1;
        let now = p.status().data_used_blocks;
        assert!(now < used, "step {steps} freed nothing");
        used = now;
        if steps % 10 == 1 || done {
            checked(&md, &format!("after step {steps}")).await;
        }
        if done {
            break;
        }
    }
    // 40,000 mappings in 16-node steps: many steps, every one committed.
    assert!(steps > 10, "{steps} steps");
    let s = p.status();
    assert_eq!((s.data_used_blocks, s.metadata_used_blocks, s.deleting.len()), (0, md_before, 0));
    assert!(p.delete_step().await.unwrap().is_none());
    // The id is free again.
    p.create_volume(1, BS).await.unwrap();
    drop(p);
    checked(&md, "at the end").await;
}

#[tokio::test]
async fn a_snapshot_deleted_in_steps_leaves_its_origin_untouched() {
    let n = 12_000;
    let (md, data, m) = pool_with(n, 2 * n).await;
    drop(m);
    let p = open(&md, &data).await;
    let origin = ThinDev::new(p.clone(), 1, None).unwrap();
    let marked: Vec<u64> = (0..n).step_by(97).collect();
    for &b in &marked {
        origin.write(b * BS, pattern(b, 0, 512), false).await.unwrap();
    }
    p.snapshot(1, 2).await.unwrap();
    // The snapshot gets blocks of its own in its first quarter, and the origin a new one
    // (its root and the leaf copied): the rest of the tree stays shared.
    let snap = ThinDev::new(p.clone(), 2, None).unwrap();
    let own = n / 4;
    for b in 0..own {
        snap.write(b * BS, pattern(b + 1, 0, 512), false).await.unwrap();
    }
    origin.write(0, pattern(0, 0, 512), false).await.unwrap();
    origin.flush().await.unwrap();
    snap.flush().await.unwrap();
    drop(snap);
    let mappings = p.with_meta(|m| m.mappings(1).unwrap());
    let used = p.status().data_used_blocks;
    p.pause_deletions(true);
    p.set_delete_step_nodes(8);
    p.delete_volume(2).await.unwrap();
    let mut steps = 0;
    loop {
        let (_, done) = p.delete_step().await.unwrap().unwrap();
        steps += 1;
        assert_eq!(p.with_meta(|m| m.mappings(1).unwrap()), mappings, "step {steps}");
        for &b in marked.iter().step_by(7) {
            let got = origin.read(b * BS, Buf::zeroed(512)).await.unwrap();
            assert!(got[..] == pattern(b, 0, 512)[..], "step {steps}: origin block {b}");
        }
        if steps % 8 == 1 || done {
            checked(&md, &format!("after step {steps}")).await;
        }
        if done {
            break;
        }
    }
    assert!(steps > 3, "{steps} steps");
    assert_eq!(p.status().data_used_blocks, used - own);
    for &b in &marked {
        let got = origin.read(b * BS, Buf::zeroed(512)).await.unwrap();
        assert!(got[..] == pattern(b, 0, 512)[..], "origin block {b}");
    }
    drop((origin, p));
    checked(&md, "at the end").await;
}

#[tokio::test]
async fn a_deletion_cut_short_resumes_on_open_and_its_id_waits() {
    let n = 20_000;
    let (md, data, mut m) = pool_with(n, n + 100).await;
    m.create_volume(3, BS).unwrap();
    m.start_delete(1).unwrap();
    m.commit(&*md).await.unwrap();
    for _ in 0..4 {
        assert!(!m.delete_step(1, 16).unwrap());
        m.commit(&*md).await.unwrap();
    }
    // A step whose commit is cut after its nodes were written, before the superblock:
    // the committed state holds (the step wrote no block of it).
    m.delete_step(1, 16).unwrap();
    let c = m.prepare_commit().unwrap().unwrap();
    for (b, bytes) in &c.writes {
        md.write(b * 4096, Buf::from_slice(bytes), false).await.unwrap();
    }
    drop((c, m));
    checked(&md, "cut").await;
    let mut m = Metadata::open(&*md).await.unwrap();
    assert_eq!(m.deleting().iter().copied().collect::<Vec<_>>(), vec![1]);
    assert_eq!(m.volumes().map(|(id, _)| id).collect::<Vec<_>>(), vec![3]);
    let e = m.create_thin(1).unwrap_err();
    assert!(e.kind == ErrorKind::Busy && e.context.contains("being deleted"), "{e:?}");
    assert!(m.create_snapshot(2, 1).is_err() && m.set_volume_size(1, BS).is_err());
    assert!(m.start_delete(1).is_err());
    let used = m.tm.data.allocated();
    assert!(used > 1 && used < n, "{used} data blocks in use after four steps");
    drop(m);
    // Served again: the deletion resumes by itself and ends.
    let p = open(&md, &data).await;
    tokio::time::timeout(Duration::from_secs(30), p.wait_deletions()).await.expect("the deletion resumed").unwrap();
    let s = p.status();
    assert_eq!((s.data_used_blocks, s.volumes, s.deleting.len()), (0, 1, 0));
    p.create_volume(1, BS).await.unwrap();
    drop(p);
    checked(&md, "resumed and ended").await;
}

//! Live changes at the pool's limits: a create, snapshot or delete that cannot be done is
//! refused before it changes anything, and the pool stays writable. The superblock's
//! record of sizes fills, and the metadata device fills down to its reserve.

mod common;

use std::sync::Arc;
use strata_io::mem::MemDev;
use strata_io::{BlockDev, Buf, ErrorKind};
use strata_thin::meta::Metadata;
use strata_thin::ThinDev;

const BS: u64 = 64 << 10;

use common::{checked, open};

/// Writes `fill` to block `v` of `vol`, flushed.
async fn write(vol: &ThinDev, v: u64, fill: u8) -> strata_io::Result<()> {
    let b = Buf::from_slice(&vec![fill; BS as usize]);
    vol.write(v * BS, b, false).await?;
    vol.flush().await
}

async fn read(vol: &ThinDev, v: u64) -> u8 {
    let b = vol.read(v * BS, Buf::zeroed(BS as usize)).await.unwrap();
    assert!(b.iter().all(|&x| x == b[0]), "block {v} torn");
    b[0]
}

#[tokio::test]
async fn a_snapshot_or_create_without_room_for_its_size_changes_nothing() {
    let md = Arc::new(MemDev::new(4 << 20));
    let data = Arc::new(MemDev::new(64 << 20));
    let mut m = Metadata::format(&*md, data.size(), BS, "", false).await.unwrap();
    m.create_volume(1, 8 * BS).unwrap();
    m.commit(&*md).await.unwrap();
    drop(m);
    let p = open(&md, &data).await;
    let vol = ThinDev::new(p.clone(), 1, None).unwrap();
    write(&vol, 0, 1).await.unwrap();

    // Snapshots of the sized volume until the superblock's record has no room for another.
    let mut id = 2;
    let e = loop {
        match p.snapshot(1, id).await {
            Ok(()) => id += 1,
            Err(e) => break e,
        }
        assert!(id < 5000, "the record never filled");
    };
    assert!(e.kind == ErrorKind::Invalid && e.context.contains("no room left in the superblock"), "{e:?}");
    let volumes = p.status().volumes;
    assert_eq!(volumes as u32, id - 1);
    // Nothing of the refused snapshot is left: the same request is refused the same way,
    // and so is a new volume.
    let again = p.snapshot(1, id).await.unwrap_err();
    assert_eq!((again.kind, again.context), (e.kind, e.context.clone()));
    let e = p.create_volume(id, BS).await.unwrap_err();
    assert!(e.kind == ErrorKind::Invalid && e.context.contains("no room left"), "{e:?}");
    let s = p.status();
    assert_eq!((s.mode.as_str(), s.volumes), ("ok", volumes));
    assert!(p.with_meta(|m| m.device(id)).is_err(), "volume {id} exists");

    // The pool still takes writes, and a deletion makes room.
    write(&vol, 1, 2).await.unwrap();
    p.delete_volume(2).await.unwrap();
    p.wait_deletions().await.unwrap();
    p.snapshot(1, id).await.unwrap();
    p.commit().await.unwrap();
    checked(&md, "after the refused changes").await;
    drop(vol);
    drop(p);
    let p = open(&md, &data).await;
    assert_eq!(p.status().volumes, volumes);
    let snap = ThinDev::new(p.clone(), id, None).unwrap();
    assert_eq!((read(&snap, 0).await, read(&snap, 1).await), (1, 2));
}

#[tokio::test]
async fn snapshots_on_nearly_full_metadata_are_refused_and_the_pool_stays_writable() {
    // The smallest metadata device; volume 1 maps blocks until the metadata is down to a
    // few blocks above its reserve.
    let md = Arc::new(MemDev::new(256 << 10));
    let data = Arc::new(MemDev::new(16_384 * BS));
    let mut m = Metadata::format(&*md, data.size(), BS, "", false).await.unwrap();
    m.create_thin(1).unwrap();
    let mut v = 0;
    while m.tm.md.allocatable() > m.metadata_reserve() + 4 {
        let b = m.alloc_data().unwrap();
        m.insert(1, v, b).unwrap();
        v += 1;
    }
    m.commit(&*md).await.unwrap();
    drop(m);
    let p = open(&md, &data).await;
    let vol = ThinDev::new(p.clone(), 1, Some(v * BS)).unwrap();

    // Unsized snapshots (no record to fill) until the metadata refuses one.
    let mut id = 2;
    let e = loop {
        match p.snapshot(1, id).await {
            Ok(()) => id += 1,
            Err(e) => break e,
        }
        assert!(id < 100_000, "the metadata never filled");
    };
    assert!(e.kind == ErrorKind::NoSpace && e.context.contains("thin extend --metadata"), "{e:?}");
    let s = p.status();
    assert_ne!(s.mode, "failed", "{:?}", s.reason);
    assert_eq!(s.volumes as u32, id - 1);
    assert!(p.with_meta(|m| m.device(id)).is_err(), "volume {id} exists");
    // The volume still reads; deleting the snapshots gives the metadata back, and the
    // pool takes writes and snapshots again.
    assert_eq!(read(&vol, 0).await, 0);
    for snap in 2..id {
        p.delete_volume(snap).await.unwrap();
    }
    p.wait_deletions().await.unwrap();
    assert_eq!(p.status().mode, "ok");
    write(&vol, 0, 7).await.unwrap();
    assert_eq!(read(&vol, 0).await, 7);
    p.snapshot(1, id).await.unwrap();
    p.commit().await.unwrap();
    checked(&md, "after the metadata filled").await;
}

/// dm-thin's transaction id is opaque: LVM sets it, and `thin_restore` takes any 64-bit
/// value. A pool at the largest one counts on from it, wrapping, as with any other.
#[tokio::test]
async fn a_pool_at_the_last_transaction_id_counts_on_past_it() {
    let md = Arc::new(MemDev::new(4 << 20));
    let data = Arc::new(MemDev::new(64 << 20));
    let mut m = Metadata::format(&*md, data.size(), BS, "", false).await.unwrap();
    m.sb.transaction_id = u64::MAX;
    m.create_volume(1, 8 * BS).unwrap();
    assert_eq!(m.sb.transaction_id, 0);
    m.commit(&*md).await.unwrap();
    drop(m);
    let p = open(&md, &data).await;
    p.snapshot(1, 2).await.unwrap();
    p.delete_volume(2).await.unwrap();
    p.commit().await.unwrap();
    checked(&md, "after wrapping the transaction id").await;
}

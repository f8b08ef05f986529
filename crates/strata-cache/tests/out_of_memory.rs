//! A cache whose books need more memory than the system gives is refused with why, at
//! `create`, at loading its table and at opening, rather than aborting the process midway.
//! In a test binary of its own: it caps the address space of the whole process.

use std::sync::Arc;
use strata_cache::meta::Meta;
use strata_cache::{offline, CacheDev, CreateOptions, OpenOptions};
use strata_io::mem::MemDev;
use strata_io::testing::cap_address_space;
use strata_io::{BlockDev, Buf, ErrorKind};

const BLOCK: u32 = 32 << 10;

fn assert_refused_for_memory(e: strata_io::Error, what: &str) {
    assert_eq!(e.kind, ErrorKind::NoMemory, "{what}: {e}");
    let msg = e.to_string();
    assert!(msg.contains("MiB of memory") && msg.contains("larger cache block size"), "{what}: {msg}");
}

#[test]
fn a_cache_whose_books_exceed_the_memory_given_is_refused_with_why() {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        // About two million 32 KiB slots: some 130 MiB to load the table, 130 more to open.
        let (origin, cache) = (Arc::new(MemDev::new(256 << 30)), Arc::new(MemDev::new(64 << 30)));
        let o = CreateOptions { block_bytes: BLOCK, origin_spec: "mem:oom".into(), ..CreateOptions::default() };
        let headroom = Some(32 << 20);

        cap_address_space(headroom);
        let e = offline::create(&*cache, &*origin, &o).await.expect_err("created under the cap");
        cap_address_space(None);
        assert_refused_for_memory(e, "create");
        offline::create(&*cache, &*origin, &o).await.unwrap();

        cap_address_space(headroom);
        let e = Meta::load(&*cache).await.err().expect("loaded under the cap");
        cap_address_space(None);
        assert_refused_for_memory(e, "load");
        let (meta, _) = Meta::load(&*cache).await.unwrap();
        let slots = meta.sb.slots;
        assert!(slots > 2_000_000, "{slots} slots");

        cap_address_space(headroom);
        let e = CacheDev::open(cache.clone(), origin.clone(), meta, OpenOptions::default()).await.err();
        cap_address_space(None);
        assert_refused_for_memory(e.expect("opened under the cap"), "open");

        // Refused, it lost nothing: it opens and serves with the memory it needs.
        let (meta, _) = Meta::load(&*cache).await.unwrap();
        let dev = CacheDev::open(cache.clone(), origin.clone(), meta, OpenOptions::default()).await.unwrap();
        dev.write(1 << 30, Buf::from_slice(&[5u8; 4096]), true).await.unwrap();
        assert_eq!(&dev.read(1 << 30, Buf::zeroed(4096)).await.unwrap()[..], &[5u8; 4096][..]);
        dev.shutdown().await.unwrap();
    });
}

//! Every file device claims its file: one writer or many readers, a second open within one
//! process refused like one from another, `?ro&shared` reading beside a writer. Opened from
//! specs, as `strata serve` opens them, so the refusals' hints are checked too.

use std::sync::Arc;
use strata::spec::Spec;
use strata_io::file::{FileDev, FileOptions};
use strata_io::{BlockDev, Buf, ErrorKind, Result};

/// Parses and opens `spec`. Files open without waiting, so this may run inside a test's
/// runtime too.
fn open(spec: &str, read_only: bool) -> Result<Arc<dyn BlockDev>> {
    let spec: Spec = spec.parse()?;
    futures::executor::block_on(strata::open::open(&spec, read_only))
}

fn file_with(dir: &tempfile::TempDir, name: &str, byte: u8) -> String {
    let p = dir.path().join(name);
    std::fs::write(&p, vec![byte; 1 << 20]).unwrap();
    p.display().to_string()
}

#[test]
fn a_second_writer_in_one_process_is_refused_naming_this_process() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let p = file_with(&dir, "w.img", 0);
    let _first = open(&p, false).unwrap();
    let me = format!("pid {}", std::process::id());
    for second in [p.clone(), format!("hdd:{p}"), format!("ssd:{p}?direct=off")] {
        let err = open(&second, false).err().unwrap_or_else(|| panic!("{second} opened beside a writer"));
        assert_eq!(err.kind, ErrorKind::Busy, "{err}");
        assert!(err.context.contains(&format!("cannot claim {p}")), "{err}");
        assert!(err.context.contains("already open in this process") && err.context.contains(&me), "{err}");
        assert!(err.context.contains("?ro&shared"), "{err}");
    }
    // The device type under the spec layer claims too.
    let err = FileDev::open(std::path::Path::new(&p), &FileOptions::default()).err().unwrap();
    assert_eq!(err.kind, ErrorKind::Busy, "{err}");
    assert!(err.context.contains(&me), "{err}");
}

#[tokio::test]
async fn a_reader_beside_a_writer_needs_shared() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let p = file_with(&dir, "rw.img", 0);
    let writer = open(&p, false).unwrap();
    let err = open(&format!("{p}?ro"), false).err().expect("a claimed reader beside a writer");
    assert_eq!(err.kind, ErrorKind::Busy, "{err}");
    assert!(err.context.contains("?ro&shared"), "{err}");
    // The caller's read-only flag claims like ?ro.
    assert_eq!(open(&p, true).err().unwrap().kind, ErrorKind::Busy);
    // shared without ro is refused outright.
    let err = open(&format!("{p}?shared"), false).err().unwrap();
    assert_eq!(err.kind, ErrorKind::Invalid, "{err}");
    assert!(err.context.contains("shared is only allowed with ro"), "{err}");
    // ro&shared takes no claim and sees the writer's data.
    let reader = open(&format!("{p}?ro&shared"), false).unwrap();
    let _hdd_reader = open(&format!("hdd:{p}?ro&shared"), false).unwrap();
    writer.write(0, Buf::from_slice(&[9u8; 4096]), true).await.unwrap();
    let got = reader.read(0, Buf::zeroed(4096)).await.unwrap();
    assert!(got.iter().all(|&b| b == 9));
    assert_eq!(reader.write(0, Buf::zeroed(4096), false).await.unwrap_err().kind, ErrorKind::ReadOnly);
}

#[test]
fn readers_share_and_keep_a_writer_out() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let p = file_with(&dir, "ro.img", 7);
    let a = open(&format!("{p}?ro"), false).unwrap();
    let b = open(&p, true).unwrap();
    let err = open(&p, false).err().expect("a writer beside readers");
    assert_eq!(err.kind, ErrorKind::Busy, "{err}");
    assert!(err.context.contains("already open in this process"), "{err}");
    drop((a, b));
    open(&p, false).unwrap();
}

#[tokio::test]
async fn dropping_the_device_releases_the_claim() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let p = dir.path().join("d.img");
    let spec = format!("{}?size=1MiB", p.display());
    let dev = open(&spec, false).unwrap();
    dev.write(0, Buf::from_slice(&[3u8; 4096]), false).await.unwrap();
    dev.flush().await.unwrap();
    assert_eq!(open(&spec, false).err().unwrap().kind, ErrorKind::Busy);
    drop(dev);
    let again = open(&spec, false).expect("the claim outlived its device");
    let got = again.read(0, Buf::zeroed(4096)).await.unwrap();
    assert!(got.iter().all(|&b| b == 3));
}

#[test]
fn mem_devices_claim_nothing() {
    let _a = open("mem:1MiB", false).unwrap();
    let _b = open("mem:1MiB", false).unwrap();
}

//! Specs opened end to end: what each kind opens into, what opening refuses, a cache whose
//! origin spec carries its own options, and a typo'd prefix told apart from a file name.

use std::process::Command;
use std::sync::Arc;
use strata::cmd::cache::create;
use strata::open::open;
use strata::spec::Spec;
use strata_cache::CreateOptions;
use strata_io::{BlockDev, Buf, ErrorKind, Result};

async fn open_str(spec: &str, read_only: bool) -> Result<Arc<dyn BlockDev>> {
    open(&spec.parse()?, read_only).await
}

#[tokio::test]
async fn specs_open_and_reject() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let p = dir.path().join("s.img");
    let dev = open_str(&format!("{}?size=1MiB", p.display()), false).await.unwrap();
    assert_eq!(dev.size(), 1 << 20);
    // Reopening with a different size must not resize existing data.
    let err = open_str(&format!("{}?size=2MiB", p.display()), false).await.err().unwrap();
    assert!(err.to_string().contains("refusing to resize"), "{err}");
    drop(dev); // the file's claim goes with it; a second writer would be refused
    let hdd = open_str(&format!("hdd:{}?rpm=5400&seek_max_ms=12", p.display()), false).await.unwrap();
    assert!(hdd.describe().starts_with("hdd model (seek 0.5-12 ms, 5400 rpm"), "{}", hdd.describe());
    drop(hdd);
    let err = open_str(&format!("{}?bogus=1", p.display()), false).await.err().unwrap();
    assert!(err.to_string().contains("unknown option(s): bogus"), "{err}");
    let err = open_str("/nonexistent/dir/x.img", false).await.err().unwrap();
    assert!(err.to_string().contains("cannot open"), "{err}");
    assert_eq!(open_str("mem:64KiB", false).await.unwrap().size(), 65536);
    assert!(open_str("mem:lots", false).await.is_err());
}

#[tokio::test]
async fn a_read_only_spec_refuses_writes() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let p = dir.path().join("ro.img");
    std::fs::write(&p, vec![7u8; 8192]).unwrap();
    let dev = open_str(&format!("{}?ro", p.display()), false).await.unwrap();
    let err = dev.write(0, Buf::zeroed(4096), false).await.unwrap_err();
    assert_eq!(err.kind, ErrorKind::ReadOnly);
    let got = dev.read(0, Buf::zeroed(4096)).await.unwrap();
    assert!(got.iter().all(|&b| b == 7));
}

#[tokio::test]
async fn fault_specs_wrap_the_inner_device() {
    let dev = open_str("fault:write:enospc@mem:1MiB", false).await.unwrap();
    assert_eq!(dev.size(), 1 << 20);
    assert_eq!(dev.describe(), "fault(mem)".replace("mem", &open_str("mem:1MiB", false).await.unwrap().describe()));
    assert_eq!(dev.write(0, Buf::zeroed(4096), false).await.unwrap_err().kind, ErrorKind::NoSpace);
    for bad in ["fault:read:eio", "fault:read:eio@", "fault:nope:eio@mem:1MiB", "fault:@mem:1MiB"] {
        assert_eq!(open_str(bad, false).await.err().unwrap().kind, ErrorKind::Invalid, "{bad}");
    }
}

/// `cache:PATH?origin=SPEC` takes everything after `origin=` as the origin's spec, so the
/// origin may carry options of its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cache_origin_spec_carries_its_own_options() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let origin = dir.path().join("o.img");
    let cache = dir.path().join("c.img");
    let origin_spec: Spec = format!("{}?size=16MiB", origin.display()).parse().unwrap();
    let cache_spec: Spec = format!("{}?size=8MiB", cache.display()).parse().unwrap();
    let opts = CreateOptions { block_bytes: 32 << 10, ..CreateOptions::default() };
    let sb = create(&origin_spec, &cache_spec, opts).await.unwrap();
    assert_eq!(sb.origin_spec, origin.display().to_string(), "recorded without size=");
    assert_eq!(sb.origin_bytes, 16 << 20);
    assert!(!sb.origin_id.is_empty(), "the origin file's identity is recorded");

    let text = format!("cache:{}?origin=hdd:{}?rpm=5400&seek_max_ms=12", cache.display(), origin.display());
    let spec: Spec = text.parse().unwrap();
    let Spec::Cache { origin: Some(o), .. } = &spec else { panic!("{spec:?}") };
    assert_eq!(o.to_string(), format!("hdd:{}?seek_max_ms=12&rpm=5400", origin.display()));
    let dev = open(&spec, false).await.unwrap();
    let d = dev.describe();
    assert!(d.starts_with("cache (writeback") && d.contains("hdd model (seek 0.5-12 ms, 5400 rpm"), "{d}");
    dev.write(1 << 20, Buf::from_slice(&[0x5a; 4096]), true).await.unwrap();
    assert!(dev.read(1 << 20, Buf::zeroed(4096)).await.unwrap().iter().all(|&b| b == 0x5a));
    dev.shutdown().await.unwrap();
    drop(dev);

    // Another file at the origin's path is refused by identity, whatever its spec's options.
    let moved = dir.path().join("other.img");
    std::fs::write(&moved, vec![0u8; 16 << 20]).unwrap();
    std::fs::rename(&moved, &origin).unwrap();
    let err = open(&spec, false).await.err().unwrap();
    assert!(err.context.contains("wrong origin"), "{err}");
}

fn strata_in(dir: &std::path::Path, args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_strata")).current_dir(dir).args(args).output().unwrap()
}

#[test]
fn a_typo_in_a_prefix_names_the_kinds_but_a_file_of_that_name_opens() {
    let d = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let o = strata_in(d.path(), &["cache", "create", "--origin", "hdx:o.img", "--cache", "c.img?size=8MiB"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success());
    assert!(
        err.contains(
            "unknown device kind \"hdx\" (file path, mem:, hdd:, ssd:, fault:, cache:, writecache:, thin:, slice:, qos:, nbd://"
        ),
        "{err}"
    );
    assert!(!d.path().join("c.img").exists(), "nothing was created");
    // A relative path whose first part reads like a kind is a file once it exists.
    std::fs::write(d.path().join("hdx:o.img"), vec![1u8; 16 << 20]).unwrap();
    let o = strata_in(d.path(), &["cache", "create", "--json", "--origin", "hdx:o.img", "--cache", "c.img?size=8MiB"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["path"], "c.img");
    // Recorded by its absolute path, so that it opens from any working directory.
    assert_eq!(v["origin_spec"], d.path().canonicalize().unwrap().join("hdx:o.img").to_str().unwrap());
    assert_eq!(v["origin_bytes"], 16 << 20);
    assert_eq!(v["block_size"], 64 << 10);
    assert_eq!(v["mode"], "writeback");
    assert_eq!(v["policy"], strata_policy::DEFAULT_POLICY);
    assert!(v["cache_blocks"].as_u64().unwrap() > 0, "{v}");
    // A cache device must be a file, not a model or RAM.
    let o = strata_in(d.path(), &["cache", "create", "--origin", "hdx:o.img", "--cache", "mem:8MiB"]);
    assert!(String::from_utf8_lossy(&o.stderr).contains("must be a file or block device path"), "{o:?}");
}

/// Slices of one file in one server share its open device (no second claim), write where
/// they say, and are refused past the device's end or over another open slice unless both
/// ask for `overlap`; a closed slice's range is free again.
#[tokio::test]
async fn slices_share_their_device_and_refuse_overlaps() {
    use strata::open::Opener;
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let p = dir.path().join("d.img");
    let opener = Opener::new();
    let open = |s: String| {
        let opener = &opener;
        async move { opener.open(&s.parse()?, false).await }
    };
    let a = open(format!("slice:0+1MiB@{}?size=4MiB", p.display())).await.unwrap();
    let b = open(format!("slice:1MiB+2MiB@{}", p.display())).await.unwrap();
    assert_eq!((a.size(), b.size()), (1 << 20, 2 << 20));
    assert!(b.describe().starts_with("slice 1048576+2097152 of "), "{}", b.describe());
    b.write(4096, Buf::from_slice(&[9u8; 4096]), false).await.unwrap();
    b.flush().await.unwrap();
    let raw = std::fs::read(&p).unwrap();
    assert!(raw[(1 << 20) + 4096..(1 << 20) + 8192].iter().all(|&x| x == 9));
    assert!(raw[..(1 << 20) + 4096].iter().all(|&x| x == 0));
    assert_eq!(a.read(1 << 20, Buf::zeroed(512)).await.unwrap_err().kind, ErrorKind::OutOfRange);

    let err = open(format!("slice:3MiB+2MiB@{}", p.display())).await.err().unwrap();
    assert!(err.to_string().contains("past the end of"), "{err}");
    let err = open(format!("slice:512KiB+1MiB@{}", p.display())).await.err().unwrap();
    assert!(err.to_string().contains("overlaps the slice 0+1048576"), "{err}");
    let err = open(format!("slice:512KiB+1MiB?overlap@{}", p.display())).await.err().unwrap();
    assert!(err.to_string().contains("give both ?overlap"), "{err}");
    let c = open(format!("slice:3MiB+1MiB?overlap@{}", p.display())).await.unwrap();
    open(format!("slice:3MiB+512KiB?overlap@{}", p.display())).await.expect("both say overlap");
    drop(a);
    let a2 = open(format!("slice:512KiB+512KiB@{}", p.display())).await.expect("the closed slice's range is free");
    // A slice of a slice is checked against the slice below it.
    let err = open(format!("slice:0+1MiB@slice:2MiB+2MiB?overlap@{}", p.display())).await.err().unwrap();
    assert!(err.to_string().contains("overlaps"), "{err}");
    drop(c);
    let nested = open(format!("slice:512KiB+512KiB@slice:3MiB+1MiB@{}", p.display())).await.unwrap();
    nested.write(0, Buf::from_slice(&[5u8; 512]), false).await.unwrap();
    nested.flush().await.unwrap();
    assert_eq!(std::fs::read(&p).unwrap()[(3 << 20) + (512 << 10)], 5);
    drop(nested);
    let err = open(format!("slice:512KiB+1MiB@slice:3MiB+1MiB@{}", p.display())).await.err().unwrap();
    assert!(err.to_string().contains("past the end of slice:3MiB+1MiB@"), "{err}");
    drop((a2, b));
}

//! Running thin-provisioning-tools from the tests, and checking and opening pools.
#![allow(dead_code)]

use std::path::Path;
use std::process::{Command, Output};

/// Runs a thin-provisioning-tools program; None (with a note) when it is missing outside CI.
pub fn tool(name: &str, args: &[&str]) -> Option<Output> {
    match Command::new(name).args(args).output() {
        Ok(out) => Some(out),
        Err(e) if std::env::var("CI").as_deref() == Ok("true") => {
            panic!("{name} is missing under CI=true (scripts/setup.sh installs thin-provisioning-tools): {e}")
        }
        Err(e) => {
            eprintln!("SKIP: {name} not runnable ({e}); install thin-provisioning-tools");
            None
        }
    }
}

/// thin_check's verdict on the metadata at `path` and what it printed.
pub fn thin_check(path: &Path) -> Option<(bool, String)> {
    let out = tool("thin_check", &[path.to_str().unwrap()])?;
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    Some((out.status.success(), text))
}

/// thin_check's verdict on metadata held in memory.
pub fn thin_check_bytes(bytes: &[u8]) -> Option<(bool, String)> {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("meta.img");
    std::fs::write(&path, bytes).unwrap();
    thin_check(&path)
}

pub fn thin_dump(path: &Path) -> Option<String> {
    let out = tool("thin_dump", &[path.to_str().unwrap()])?;
    assert!(out.status.success(), "thin_dump: {}", String::from_utf8_lossy(&out.stderr));
    Some(String::from_utf8(out.stdout).unwrap())
}

/// Both checkers on the committed metadata: clean, and no warning.
pub async fn checked(md: &strata_io::mem::MemDev, when: &str) {
    use strata_io::BlockDev;
    let r = strata_thin::check::check(md).await;
    assert!(r.clean() && r.warnings.is_empty(), "{when}: {:?} {:?}", r.errors, r.warnings);
    let mut bytes = vec![0u8; md.size() as usize];
    md.read_into(0, &mut bytes).unwrap();
    if let Some((ok, text)) = thin_check_bytes(&bytes) {
        assert!(ok, "{when}: thin_check: {text}");
    }
}

/// The pool on `md` and `data`, opened with the default options.
pub async fn open(
    md: &std::sync::Arc<strata_io::mem::MemDev>,
    data: &std::sync::Arc<strata_io::mem::MemDev>,
) -> std::sync::Arc<strata_thin::Pool> {
    strata_thin::Pool::open(md.clone(), data.clone(), "", strata_thin::PoolOptions::default()).await.unwrap()
}

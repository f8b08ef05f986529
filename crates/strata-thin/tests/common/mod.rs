//! Running thin-provisioning-tools from the tests.
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

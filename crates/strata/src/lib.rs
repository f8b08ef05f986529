//! The `strata` command: serving volumes, inspecting them, and the tools around the engine.
//! The binary is a thin shell over these modules so tests can drive them directly.

pub mod cmd;
pub mod config;
pub mod crashtest;
pub mod http;
pub mod open;
pub mod spec;

/// fio's JSON report, skipping any notes it prints before it.
pub fn fio_json(stdout: &[u8]) -> anyhow::Result<serde_json::Value> {
    use anyhow::Context;
    let text = String::from_utf8_lossy(stdout);
    let start = text.find("\n{").map(|i| i + 1).or_else(|| text.starts_with('{').then_some(0));
    let json = start.map(|i| &text[i..]).context("fio printed no JSON report")?;
    serde_json::from_str(json).context("parsing fio's JSON report")
}

/// The path of `prog` on PATH, if any.
pub fn which(prog: &str) -> Option<std::path::PathBuf> {
    std::env::var_os("PATH")?.to_str()?.split(':').map(|d| std::path::PathBuf::from(d).join(prog)).find(|p| p.is_file())
}

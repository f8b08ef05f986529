//! `strata serve --config FILE`: the same settings as the flags, in TOML, for services.
//!
//! ```toml
//! unix = "/run/strata/nbd.sock"
//! tcp = "127.0.0.1:10809"
//! admin = "127.0.0.1:9810"
//! read_only = false
//!
//! [[volume]]
//! name = "vol0"
//! spec = "/var/lib/strata/vol0.img?size=16GiB"
//! read_only = false
//! ```

use anyhow::{Context, Result};
use serde::Deserialize;
use std::path::{Path, PathBuf};

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    pub unix: Option<PathBuf>,
    pub tcp: Option<String>,
    pub admin: Option<String>,
    #[serde(default)]
    pub read_only: bool,
    pub max_connections: Option<usize>,
    pub max_inflight: Option<usize>,
    #[serde(default, rename = "volume")]
    pub volumes: Vec<VolumeConfig>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VolumeConfig {
    pub name: String,
    pub spec: String,
    #[serde(default)]
    pub read_only: bool,
}

impl Config {
    pub fn load(path: &Path) -> Result<Config> {
        let text = std::fs::read_to_string(path).with_context(|| format!("reading config {}", path.display()))?;
        toml::from_str(&text).with_context(|| format!("parsing config {}", path.display()))
    }
}

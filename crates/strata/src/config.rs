//! `strata serve --config FILE`: the same settings as the flags, in TOML, for services.
//!
//! ```toml
//! unix = "/run/strata/nbd.sock"
//! tcp = "127.0.0.1:10809"
//! admin = "127.0.0.1:9810"
//! read_only = false
//! # tls = "require"                      # off, on or require, as --tls
//! # tls_psk = "/etc/strata/keys.psk"     # as --tls-psk
//! # tls_certificates = "/etc/strata/pki" # as --tls-certificates
//! # tls_verify_peer = true
//! # admin_token_file = "/etc/strata/admin.token"
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
    pub tls: Option<String>,
    pub tls_psk: Option<PathBuf>,
    pub tls_certificates: Option<PathBuf>,
    #[serde(default)]
    pub tls_verify_peer: bool,
    pub admin_token_file: Option<PathBuf>,
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tls_settings_read_like_the_flags() {
        let c: Config = toml::from_str(
            "tls = \"require\"\ntls_psk = \"/k.psk\"\ntls_verify_peer = true\nadmin_token_file = \"/t\"\n",
        )
        .unwrap();
        assert_eq!(c.tls.as_deref(), Some("require"));
        assert_eq!(c.tls_psk, Some(PathBuf::from("/k.psk")));
        assert!(c.tls_verify_peer && c.tls_certificates.is_none());
        assert_eq!(c.admin_token_file, Some(PathBuf::from("/t")));
        assert!(toml::from_str::<Config>("tls_key = 1").is_err());
    }
}

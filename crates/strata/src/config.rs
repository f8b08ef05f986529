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
//!
//! # Two volumes on one disk, sharing its time 2:1 (see docs/QOS.md).
//! [[volume]]
//! name = "db"
//! spec = "slice:0+100GiB@/dev/sdb"
//! group = "db"
//!
//! [[volume]]
//! name = "batch"
//! spec = "slice:100GiB+100GiB@/dev/sdb"
//! group = "batch"
//!
//! [qos.db]
//! weight = 200
//! latency_ms = 50
//! model = "174019176,41708,370,178075866,42705,378"  # from `strata qos calibrate`
//!
//! [qos.batch]
//! wbps = "40MiB"
//! ```
//!
//! A volume with `group = "G"` is served as `qos:G?OPTIONS@SPEC`, the options being those of
//! the table `[qos.G]` (every option a `qos:` spec takes).

use crate::spec::Spec;
use anyhow::{bail, Context, Result};
use serde::Deserialize;
use std::collections::BTreeMap;
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
    /// qos groups' options, by group name.
    #[serde(default)]
    pub qos: BTreeMap<String, toml::Table>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VolumeConfig {
    pub name: String,
    pub spec: String,
    #[serde(default)]
    pub read_only: bool,
    /// The qos group the volume belongs to.
    pub group: Option<String>,
}

impl Config {
    pub fn load(path: &Path) -> Result<Config> {
        let text = std::fs::read_to_string(path).with_context(|| format!("reading config {}", path.display()))?;
        Config::parse(&text).map_err(|e| {
            let what = if e.is::<toml::de::Error>() { "parsing config" } else { "config" };
            e.context(format!("{what} {}", path.display()))
        })
    }

    /// A config from its text, checked.
    fn parse(text: &str) -> Result<Config> {
        let cfg: Config = toml::from_str(text)?;
        cfg.check()?;
        Ok(cfg)
    }

    fn check(&self) -> Result<()> {
        for (key, n) in [("max_connections", self.max_connections), ("max_inflight", self.max_inflight)] {
            if n == Some(0) {
                bail!("{key} = 0: at least 1, as --{}", key.replace('_', "-"));
            }
        }
        for g in self.qos.keys() {
            if !self.volumes.iter().any(|v| v.group.as_deref() == Some(g)) {
                bail!("[qos.{g}]: unknown group (no [[volume]] has group = {g:?})");
            }
        }
        Ok(())
    }

    /// The spec a volume is served from: its own, in its qos group if it has one.
    pub fn spec(&self, v: &VolumeConfig) -> Result<Spec> {
        let text = match &v.group {
            None => v.spec.clone(),
            Some(g) => {
                let mut opts = Vec::new();
                for (k, value) in self.qos.get(g).into_iter().flatten() {
                    let value = match value {
                        toml::Value::String(s) => s.clone(),
                        toml::Value::Integer(n) => n.to_string(),
                        toml::Value::Float(x) => x.to_string(),
                        other => bail!("[qos.{g}] {k} = {other}: expected a string or a number"),
                    };
                    // A value goes into the spec as it is: one that could end it or start
                    // another option is refused, not read as more settings.
                    if value.contains(['&', '?', '@', '=']) || g.contains(['&', '?', '@', '=']) {
                        bail!("[qos.{g}] {k} = {value:?}: a group name or value holds no '&', '?', '@' or '='");
                    }
                    opts.push(format!("{k}={value}"));
                }
                let q = if opts.is_empty() { String::new() } else { format!("?{}", opts.join("&")) };
                format!("qos:{g}{q}@{}", v.spec)
            }
        };
        text.parse().with_context(|| format!("volume {}", v.name))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_qos_value_cannot_set_another_option() {
        let cfg = Config::parse(
            r#"
            [[volume]]
            name = "a"
            spec = "mem:1MiB"
            group = "g"
            [qos.g]
            weight = "5&rbps=1"
            "#,
        )
        .unwrap();
        let why = format!("{:#}", cfg.spec(&cfg.volumes[0]).unwrap_err());
        assert!(why.contains("holds no '&'"), "{why}");
    }

    #[test]
    fn a_volume_in_a_group_is_served_through_qos() {
        let cfg = Config::parse(
            r#"
            [[volume]]
            name = "a"
            spec = "slice:0+1GiB@hdd:/d.img"
            group = "db"
            [[volume]]
            name = "b"
            spec = "slice:1GiB+1GiB@hdd:/d.img"
            group = "batch"
            [qos.db]
            weight = 200
            rbps = "10MiB"
            "#,
        )
        .unwrap();
        assert_eq!(
            cfg.spec(&cfg.volumes[0]).unwrap().to_string(),
            "qos:db?weight=200&rbps=10MiB@slice:0+1GiB@hdd:/d.img"
        );
        assert_eq!(cfg.spec(&cfg.volumes[1]).unwrap().to_string(), "qos:batch@slice:1GiB+1GiB@hdd:/d.img");
    }

    #[test]
    fn bad_groups_are_refused() {
        let volume = "[[volume]]\nname = \"a\"\nspec = \"mem:1MiB\"\ngroup = \"db\"\n";
        let e = Config::parse(&format!("{volume}[qos.dbb]\nweight = 5\n")).unwrap_err();
        assert!(e.to_string().contains("[qos.dbb]: unknown group"), "{e}");
        for zero in ["max_connections = 0", "max_inflight = 0"] {
            let e = Config::parse(&format!("{zero}\n{volume}")).unwrap_err();
            assert!(e.to_string().contains("at least 1"), "{zero}: {e}");
        }
        for (table, why) in [
            ("weight = 0", "weight 0 is out of range"),
            ("weight = 20000", "out of range"),
            ("speed = 5", "unknown option(s): speed"),
            ("weight = true", "expected a string or a number"),
        ] {
            let cfg = Config::parse(&format!("{volume}[qos.db]\n{table}\n")).unwrap();
            let e = cfg.spec(&cfg.volumes[0]).unwrap_err();
            assert!(format!("{e:#}").contains(why), "{table}: {e:#}");
        }
    }

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

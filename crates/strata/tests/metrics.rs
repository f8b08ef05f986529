//! `/metrics` as Prometheus and Grafana read it: a cache volume served with a little IO, its
//! exposition checked against the conventions (counters end in `_total`, every family has a
//! type and a help line), by `promtool check metrics` (Prometheus's own linter) where it is
//! installed, and against the shipped Grafana dashboard, whose every query must name metrics
//! that are exported and, with promtool, parse.

mod common;

use common::{Server, ServerOpts, MIB};
use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::process::{Command, Stdio};

const DASHBOARD: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../contrib/grafana/strata-dashboard.json");

/// A server with a write-back cache volume `vol` and a RAM volume `raw`, after writes, a
/// flush and reads of what was written; returns it with its `/metrics`.
fn served_with_io() -> (Server, String) {
    let dir = common::tempdir();
    let d = dir.path().display().to_string();
    let out = Command::new(env!("CARGO_BIN_EXE_strata"))
        .args(["cache", "create", "--mode", "writeback"])
        .args(["--origin", &format!("{d}/origin.img?size=32MiB"), "--cache", &format!("{d}/cache.img?size=8MiB")])
        .output()
        .unwrap();
    assert!(out.status.success(), "cache create: {}", String::from_utf8_lossy(&out.stderr));
    let srv = Server::start_opts(
        dir,
        ServerOpts {
            admin: true,
            args: vec!["vol=cache:{dir}/cache.img".into(), "raw=mem:4MiB".into(), "shared=qos:batch@mem:4MiB".into()],
            ..Default::default()
        },
    );
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let mut c = strata_nbd::client::Client::connect_unix(srv.sock.as_ref().unwrap(), "vol").await.unwrap();
        for i in 0..16u64 {
            c.write(i * 64 * 1024, &[i as u8 + 1; 64 * 1024], false).await.unwrap();
        }
        c.flush().await.unwrap();
        for _ in 0..2 {
            for i in 0..16u64 {
                assert_eq!(c.read(i * 64 * 1024, 4096).await.unwrap(), vec![i as u8 + 1; 4096]);
            }
        }
        c.read(4 * MIB, 64 * 1024).await.unwrap(); // and a miss
        c.disconnect().await.unwrap();
    });
    let metrics = srv.admin_get("/metrics");
    (srv, metrics)
}

/// The text exposition, read line by line.
#[derive(Default)]
struct Exposition {
    /// Family name to its `# TYPE`.
    types: BTreeMap<String, String>,
    helps: BTreeSet<String>,
    /// (sample name, labels as written, value)
    samples: Vec<(String, String, f64)>,
}

impl Exposition {
    fn parse(text: &str) -> Exposition {
        let mut e = Exposition::default();
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                let (name, kind) = rest.split_once(' ').unwrap_or_else(|| panic!("bad TYPE line {line:?}"));
                assert!(e.types.insert(name.into(), kind.into()).is_none(), "two TYPE lines for {name}");
            } else if let Some(rest) = line.strip_prefix("# HELP ") {
                let (name, help) = rest.split_once(' ').unwrap_or_else(|| panic!("bad HELP line {line:?}"));
                assert!(!help.trim().is_empty(), "empty help for {name}");
                assert!(e.helps.insert(name.into()), "two HELP lines for {name}");
            } else if !line.is_empty() {
                let (series, value) = line.rsplit_once(' ').unwrap_or_else(|| panic!("bad sample line {line:?}"));
                let (name, labels) = match series.split_once('{') {
                    Some((n, l)) => (n, l.trim_end_matches('}')),
                    None => (series, ""),
                };
                let value: f64 = value.parse().unwrap_or_else(|_| panic!("bad value in {line:?}"));
                e.samples.push((name.into(), labels.into(), value));
            }
        }
        e
    }

    /// The family a sample belongs to (a histogram's `_bucket`, `_sum` and `_count` are its).
    fn family<'a>(&self, sample: &'a str) -> &'a str {
        for suffix in ["_bucket", "_sum", "_count"] {
            if let Some(f) = sample.strip_suffix(suffix) {
                if self.types.get(f).map(String::as_str) == Some("histogram") {
                    return f;
                }
            }
        }
        sample
    }

    fn kind(&self, name: &str) -> &str {
        self.types.get(name).map(String::as_str).unwrap_or_else(|| panic!("no metric {name}"))
    }

    /// The value of `name` for volume `vol` whose labels also contain `with`.
    fn value(&self, name: &str, vol: &str, with: &str) -> f64 {
        let volume = format!("volume=\"{vol}\"");
        self.samples
            .iter()
            .find(|(n, l, _)| n == name && l.split(',').any(|x| x == volume) && l.contains(with))
            .unwrap_or_else(|| panic!("no sample {name}{{{volume},{with}}}"))
            .2
    }

    fn names(&self) -> BTreeSet<&str> {
        self.samples.iter().map(|(n, _, _)| n.as_str()).collect()
    }
}

#[test]
fn metrics_follow_the_prometheus_conventions() {
    let (srv, text) = served_with_io();
    let e = Exposition::parse(&text);
    for (name, labels, _) in &e.samples {
        let family = e.family(name);
        assert!(e.types.contains_key(family) && e.helps.contains(family), "{name}: no TYPE or HELP line");
        assert_eq!(e.kind(family) == "counter", name.ends_with("_total"), "{name}{{{labels}}}: _total is for counters");
        assert!(!name.split('_').any(|w| ["s", "ms", "us"].contains(&w)), "{name}: units are spelled out");
        assert!(!name.starts_with("strata_target_"), "{name}: the old untyped gauges are gone");
    }
    for family in ["strata_request_duration_seconds", "strata_qos_latency_seconds"] {
        assert_eq!(e.kind(family), "histogram", "{family}");
        for suffix in ["_bucket", "_sum", "_count"] {
            assert!(e.names().contains(format!("{family}{suffix}").as_str()), "{family}{suffix} missing");
        }
    }
    for counter in [
        "strata_cache_read_hits_total",
        "strata_cache_read_misses_total",
        "strata_cache_write_misses_total",
        "strata_cache_promotions_total",
        "strata_cache_demotions_total",
        "strata_cache_writebacks_total",
        "strata_cache_commits_total",
        "strata_cache_migration_bytes_total",
        "strata_cache_origin_busy_seconds_total",
        "strata_requests_total",
    ] {
        assert_eq!(e.kind(counter), "counter", "{counter}");
    }
    for gauge in
        ["strata_cache_dirty_blocks", "strata_cache_capacity_blocks", "strata_cache_hit_ratio", "strata_cache_info"]
    {
        assert_eq!(e.kind(gauge), "gauge", "{gauge}");
    }
    // The numbers are the volume's: reads of written blocks hit, the flush committed.
    assert!(e.value("strata_cache_read_hits_total", "vol", "") >= 32.0, "{text}");
    assert!(e.value("strata_cache_read_misses_total", "vol", "") >= 1.0, "{text}");
    assert!(e.value("strata_cache_commits_total", "vol", "") >= 1.0, "{text}");
    let ratio = e.value("strata_cache_hit_ratio", "vol", "window=\"total\"");
    assert!(ratio > 0.0 && ratio < 1.0, "hit ratio {ratio}");
    assert!(e.value("strata_cache_origin_busy_seconds_total", "vol", "io=\"foreground\"") >= 0.0);
    let info = format!("mode=\"writeback\",restart_mode=\"writeback\",policy=\"{}\"", strata_policy::DEFAULT_POLICY);
    assert_eq!(e.value("strata_cache_info", "vol", &info), 1.0);
    assert_eq!(e.value("strata_cache_degraded", "vol", ""), 0.0);
    assert_eq!(e.value("strata_cache_writeback_target_ratio", "vol", ""), 0.1);
    // The same figures as /status, whose keys stay as they were.
    let status = srv.status();
    let target = &status["volumes"][0]["target"];
    assert_eq!(status["volumes"][0]["name"], "vol");
    assert_eq!(target["cache_blocks"].as_f64().unwrap(), e.value("strata_cache_capacity_blocks", "vol", ""));
    assert_eq!(target["writeback_percent"], 10);
    // A plain device reports no target figures.
    assert!(!e.samples.iter().any(|(n, l, _)| n.starts_with("strata_cache_") && l.contains("volume=\"raw\"")));
    assert!(status["volumes"][1]["target"].is_null());
    srv.stop();
}

/// Runs `promtool` with `args`, `stdin` on its standard input; returns (success, output).
fn promtool(args: &[&str], stdin: &str) -> (bool, String) {
    let mut child = common::cmd("promtool")
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting promtool");
    child.stdin.take().unwrap().write_all(stdin.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    (out.status.success(), text)
}

/// Every PromQL expression in the dashboard's panels, with Grafana's variables in place.
fn dashboard_queries() -> Vec<String> {
    fn walk(v: &serde_json::Value, out: &mut Vec<String>) {
        match v {
            serde_json::Value::Object(m) => {
                for (k, child) in m {
                    match (k.as_str(), child) {
                        ("expr", serde_json::Value::String(e)) => out.push(e.clone()),
                        _ => walk(child, out),
                    }
                }
            }
            serde_json::Value::Array(a) => a.iter().for_each(|c| walk(c, out)),
            _ => {}
        }
    }
    let d: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(DASHBOARD).unwrap()).unwrap();
    let mut out = Vec::new();
    walk(&d["panels"], &mut out);
    out
}

#[test]
fn promtool_accepts_the_metrics_and_the_dashboard_queries() {
    if !common::have("promtool") {
        eprintln!("SKIP: promtool_accepts_the_metrics_and_the_dashboard_queries: promtool is not installed (Debian package prometheus; see scripts/setup.sh)");
        return;
    }
    let (srv, text) = served_with_io();
    let (ok, problems) = promtool(&["check", "metrics"], &text);
    assert!(ok && problems.trim().is_empty(), "promtool check metrics:\n{problems}\n--- /metrics ---\n{text}");
    // promtool must be able to fail: an old-style gauge counter is refused.
    let (ok, problems) =
        promtool(&["check", "metrics"], "# HELP strata_x_hits Hits.\n# TYPE strata_x_hits counter\nstrata_x_hits 1\n");
    assert!(!ok && problems.contains("_total"), "promtool let a counter without _total through: {problems}");
    // The dashboard's queries parse (as recording rules, the one way promtool checks PromQL).
    let mut rules = String::from("groups:\n  - name: dashboard\n    rules:\n");
    for (i, q) in dashboard_queries().iter().enumerate() {
        let q = q.replace("$__rate_interval", "1m").replace("$volume", ".*");
        rules.push_str(&format!("      - record: dashboard:query{i}\n        expr: {}\n", serde_json::Value::from(q)));
    }
    let file = srv.path().join("dashboard-rules.yml");
    std::fs::write(&file, &rules).unwrap();
    let (ok, problems) = promtool(&["check", "rules", file.to_str().unwrap()], "");
    assert!(ok, "promtool check rules on the dashboard's queries:\n{problems}\n{rules}");
    srv.stop();
}

#[test]
fn the_grafana_dashboard_queries_only_exported_metrics() {
    let d: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(DASHBOARD).unwrap()).unwrap();
    // Importable: a Prometheus data source chosen at import, used by every panel and query.
    let vars = d["templating"]["list"].as_array().expect("templating variables");
    assert!(vars.iter().any(|v| v["type"] == "datasource" && v["query"] == "prometheus" && v["name"] == "datasource"));
    let panels = d["panels"].as_array().expect("panels");
    assert!(panels.len() >= 8);
    for p in panels.iter().filter(|p| p["type"] != "row") {
        assert_eq!(p["datasource"]["uid"], "${datasource}", "panel {}", p["title"]);
        for t in p["targets"].as_array().expect("targets") {
            assert_eq!(t["datasource"]["uid"], "${datasource}", "panel {}", p["title"]);
        }
    }
    let (srv, text) = served_with_io();
    let e = Exposition::parse(&text);
    let exported = e.names();
    let mut used = BTreeSet::new();
    // The panels' queries, and the variables' (Grafana's label_values() over a metric).
    let variables = vars.iter().filter_map(|v| v["definition"].as_str().map(String::from));
    for q in dashboard_queries().into_iter().chain(variables) {
        let mut rest = q.as_str();
        while let Some(i) = rest.find("strata_") {
            let name: String = rest[i..].chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
            rest = &rest[i + name.len()..];
            assert!(
                exported.contains(name.as_str()),
                "the dashboard queries {name}, which /metrics does not export: {q}"
            );
            used.insert(name);
        }
    }
    for needed in [
        "strata_requests_total",
        "strata_cache_read_hits_total",
        "strata_cache_dirty_blocks",
        "strata_cache_capacity_blocks",
        "strata_cache_promotions_total",
        "strata_cache_demotions_total",
        "strata_cache_writebacks_total",
        "strata_cache_migration_bytes_total",
        "strata_cache_origin_busy_seconds_total",
        "strata_cache_degraded",
        "strata_cache_stopped",
    ] {
        assert!(used.contains(needed), "the dashboard does not show {needed}");
    }
    srv.stop();
}

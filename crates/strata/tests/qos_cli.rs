//! `strata serve` with qos volumes from a config file, end to end: two groups on slices of
//! one emulated disk, each NBD connection its own stream, status and metrics per group,
//! settings changed live with `strata qos set`; `strata qos calibrate`; bad configs refused.

mod common;

use std::process::{Command, Output};
use std::time::{Duration, Instant};

fn strata(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_strata")).args(args).output().unwrap()
}

fn text(o: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

const CONFIG: &str = r#"
[[volume]]
name = "db"
spec = "slice:0+16MiB@hdd:{dir}/d.img?size=64MiB&seek_max_ms=2&seed=3"
group = "db"

[[volume]]
name = "batch"
spec = "slice:16MiB+16MiB@hdd:{dir}/d.img?size=64MiB&seek_max_ms=2&seed=3"
group = "batch"

[qos.db]
weight = 200
"#;

fn group<'a>(status: &'a serde_json::Value, volume: &str, name: &str) -> &'a serde_json::Value {
    let vol = status["volumes"].as_array().unwrap().iter().find(|v| v["name"] == volume).unwrap();
    vol["target"]["groups"].as_array().unwrap().iter().find(|g| g["name"] == name).unwrap()
}

#[test]
fn two_groups_on_one_disk_from_a_config() {
    let d = common::tempdir();
    let cfg = d.path().join("strata.toml");
    std::fs::write(&cfg, CONFIG.replace("{dir}", &d.path().to_string_lossy())).unwrap();
    let srv = common::Server::start_opts(
        d,
        common::ServerOpts {
            admin: true,
            args: vec!["--config".into(), cfg.display().to_string()],
            ..Default::default()
        },
    );
    let sock = srv.sock.clone().unwrap();
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let (db1, db2, batch) = rt.block_on(async {
        let mut db1 = strata_nbd::client::Client::connect_unix(&sock, "db").await.unwrap();
        let mut db2 = strata_nbd::client::Client::connect_unix(&sock, "db").await.unwrap();
        let mut batch = strata_nbd::client::Client::connect_unix(&sock, "batch").await.unwrap();
        let a = common::random_bytes(64 << 10, 1);
        let b = common::random_bytes(64 << 10, 2);
        db1.write(0, &a, false).await.unwrap();
        batch.write(0, &b, false).await.unwrap();
        db2.write(1 << 20, &b, true).await.unwrap();
        common::assert_same_bytes(&db2.read(0, a.len() as u32).await.unwrap(), &a, "db read back");
        common::assert_same_bytes(&batch.read(0, b.len() as u32).await.unwrap(), &b, "batch read back");
        (db1, db2, batch)
    });
    let status = srv.status();
    let db = group(&status, "db", "db");
    assert_eq!(db["weight"], 200, "{status}");
    assert_eq!(db["streams"], 3, "the group's own stream and one per connection: {status}");
    // db2 went from 1 MiB back to 0, a seek; the others have no history yet, which counts as seeky.
    assert_eq!(db["seeky_streams"], 3, "{status}");
    assert!(db["requests"].as_u64().unwrap() >= 3 && db["device_time_s"].as_f64().unwrap() > 0.0, "{status}");
    assert_eq!(group(&status, "batch", "batch")["streams"], 2, "{status}");
    assert_eq!(group(&status, "db", "batch"), group(&status, "batch", "batch"), "one scheduler for the disk");
    let metrics = srv.admin_get("/metrics");
    assert!(metrics.contains("strata_qos_device_seconds_total{volume=\"db\",group=\"db\"}"), "{metrics}");
    assert!(
        metrics.contains("strata_qos_latency_seconds_bucket{volume=\"batch\",group=\"batch\",le=\"+Inf\"} 2"),
        "{metrics}"
    );

    let admin = srv.admin.clone().unwrap();
    let o = strata(&["qos", "set", "--admin", &admin, "db", "weight=300", "rbps=20MiB"]);
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(text(&o), "db: group db: weight = 300, rbps = 20MiB\n");
    let o = strata(&["qos", "set", "--admin", &admin, "db", "--group", "batch", "riops=500"]);
    assert!(o.status.success() && text(&o).contains("group batch: riops = 500"), "{}", text(&o));
    // A refused setting takes the others of its `set` with it.
    for bad in
        [vec!["weight=0"], vec!["--group", "nosuch", "weight=5"], vec!["colour=red"], vec!["weight=50", "riops=0"]]
    {
        let mut args = vec!["qos", "set", "--admin", &admin, "db"];
        args.extend(bad.iter().copied());
        let o = strata(&args);
        assert!(!o.status.success(), "{bad:?}: {}", text(&o));
    }
    assert_eq!(group(&srv.status(), "db", "db")["weight"], 300, "weight=50 came with a refused riops=0");
    // A port alone (or `:PORT`) means loopback, for the client commands as for `serve`.
    let port = admin.rsplit_once(':').unwrap().1.to_string();
    for given in [port.clone(), format!(":{port}")] {
        let o = strata(&["status", "--admin", &given]);
        assert!(o.status.success() && text(&o).contains("db"), "--admin {given}: {}", text(&o));
    }
    let o = strata(&["qos", "status", "--admin", &admin]);
    let shown = text(&o);
    assert!(o.status.success(), "{shown}");
    assert!(
        shown.contains("cost: the hdd model's own figures, depth 1, slice 100 ms, idle 8 ms, max wait 10000 ms"),
        "{shown}"
    );
    let db_line = shown.lines().find(|l| l.trim_start().starts_with("db ")).unwrap();
    assert!(db_line.contains(" 300 ") && db_line.ends_with("rbps=20MiB"), "{shown}");
    assert!(shown.lines().any(|l| l.trim_start().starts_with("batch ") && l.ends_with("riops=500")), "{shown}");

    rt.block_on(async {
        for c in [db1, db2, batch] {
            c.disconnect().await.unwrap();
        }
    });
    // The connections' streams go with them.
    let deadline = Instant::now() + Duration::from_secs(10);
    while group(&srv.status(), "db", "db")["streams"] != 1 {
        assert!(Instant::now() < deadline, "streams left after disconnecting: {}", srv.status());
        std::thread::sleep(Duration::from_millis(20));
    }
    srv.stop();
}

#[test]
fn calibrate_prints_a_model_and_bad_configs_are_refused() {
    let d = common::tempdir();
    let img = format!("hdd:{}?size=16MiB&seek_max_ms=1", d.path().join("c.img").display());
    let o = strata(&["qos", "calibrate", &img, "--seconds", "0.05"]);
    assert!(o.status.success(), "{}", text(&o));
    let out = text(&o);
    let model = out.lines().find_map(|l| l.strip_prefix("model=")).expect("a model= line");
    let figures: Vec<u64> = model.split(',').map(|n| n.parse().unwrap()).collect();
    assert_eq!(figures.len(), 6, "{out}");
    assert!(figures.iter().all(|&n| n > 0), "{out}");
    // The emulated disk's sequential reads are far cheaper than its random ones.
    assert!(figures[1] > figures[2], "{out}");
    let o = strata(&["qos", "calibrate", "mem:1MiB"]);
    assert!(!o.status.success() && text(&o).contains("too small to calibrate"), "{}", text(&o));

    let cfg = d.path().join("bad.toml");
    for (config, why) in [
        ("[[volume]]\nname = \"a\"\nspec = \"mem:1MiB\"\ngroup = \"db\"\n[qos.dbx]\nweight = 2\n", "[qos.dbx]: unknown group"),
        ("[[volume]]\nname = \"a\"\nspec = \"mem:1MiB\"\ngroup = \"db\"\n[qos.db]\nweight = 0\n", "weight 0 is out of range"),
        (
            "[[volume]]\nname = \"a\"\nspec = \"slice:0+1MiB@mem:4MiB\"\n[[volume]]\nname = \"b\"\nspec = \"slice:512KiB+1MiB@mem:4MiB\"\n",
            "overlaps the slice 0+1048576",
        ),
        ("[[volume]]\nname = \"a\"\nspec = \"slice:3MiB+2MiB@mem:4MiB\"\n", "past the end of mem:4MiB"),
    ] {
        std::fs::write(&cfg, config).unwrap();
        let o = strata(&["serve", "--unix", &d.path().join("x.sock").to_string_lossy(), "--config", &cfg.to_string_lossy()]);
        assert!(!o.status.success(), "{config}");
        assert!(text(&o).contains(why), "{config}: {}", text(&o));
    }
}

/// `strata cache flush` on a qos volume over a cache (the stacking QOS.md advises) reaches
/// the cache through qos and waits until its dirty blocks are written back.
#[test]
fn cache_flush_goes_through_qos() {
    let d = common::tempdir();
    let p = |f: &str| d.path().join(f).display().to_string();
    let o = strata(&[
        "cache",
        "create",
        "--origin",
        &format!("{}?size=8MiB", p("o.img")),
        "--cache",
        &format!("{}?size=4MiB", p("c.img")),
    ]);
    assert!(o.status.success(), "{}", text(&o));
    let spec = format!("db=qos:db@cache:{}", p("c.img"));
    let srv = common::Server::start_opts(d, common::ServerOpts { admin: true, args: vec![spec], ..Default::default() });
    let sock = srv.sock.clone().unwrap();
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let mut c = strata_nbd::client::Client::connect_unix(&sock, "db").await.unwrap();
        c.write(0, &common::random_bytes(256 << 10, 1), false).await.unwrap();
    });
    let dirty = |s: &serde_json::Value| s["volumes"][0]["target"]["below"]["dirty_blocks"].as_u64();
    assert!(dirty(&srv.status()).is_some(), "{}", srv.status());
    let admin = srv.admin.clone().unwrap();
    let o = strata(&["cache", "flush", "--admin", &admin, "db"]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(text(&o).contains("db: no dirty blocks"), "{}", text(&o));
    assert_eq!(dirty(&srv.status()), Some(0), "{}", srv.status());
    let o = strata(&["status", "--admin", &admin]);
    assert!(text(&o).contains("\n  below:\n    "), "{}", text(&o));
}

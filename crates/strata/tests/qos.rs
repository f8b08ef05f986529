//! The qos target opened from specs: volumes in groups over slices of one device share one
//! device and one scheduler; data through it is exactly what a reference holds under
//! concurrent IO from several connections; settings change live through messages; bad
//! specs and messages are refused and change nothing. A device several volumes share is
//! shut down by the last of them only; the state of a cache or remote origin below qos
//! shows through it.

use std::sync::Arc;
use strata::open::Opener;
use strata_io::testing::{check_all_blocks_at_once, check_model, random_ops, Slice, Workload};
use strata_io::{BlockDev, Buf, ErrorKind, Result};

async fn open(opener: &Opener, spec: &str) -> Result<Arc<dyn BlockDev>> {
    opener.open(&spec.parse()?, false).await
}

/// Runs the model checker on `parts` equal regions of `dev`, each through its own
/// connection handle, all at once.
async fn check_connections(dev: &Arc<dyn BlockDev>, parts: u64, seed: u64) -> std::result::Result<(), String> {
    let region = dev.size() / parts;
    let w = Workload { granularity: 4096, max_granules: 16, span: region };
    let runs = (0..parts).map(|i| {
        let conn = dev.connect().expect("a qos volume gives each connection its own handle");
        let slice = Slice { inner: conn, offset: i * region, len: region };
        let ops = random_ops(seed + i, 300, region, &w);
        async move { check_model(&slice, &ops).await.map_err(|e| format!("region {i}: {e}")) }
    });
    futures::future::join_all(runs).await.into_iter().collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn data_through_qos_over_slices_is_what_a_reference_holds() {
    // Slices engaged on RAM (2 at a time, 1 ms slices, 1 ms idling), so requests wait and
    // reorder; and request by request with the defaults.
    for device_opts in ["depth=2&slice_ms=1&idle_ms=1", ""] {
        let opener = Opener::new();
        let q = if device_opts.is_empty() { String::new() } else { format!("&{device_opts}") };
        let a = open(&opener, &format!("qos:a?weight=200{q}@slice:0+2MiB@mem:8MiB")).await.unwrap();
        let b = open(&opener, "qos:b@slice:2MiB+2MiB@mem:8MiB").await.unwrap();
        let c = open(&opener, "qos:a@slice:4MiB+4MiB@mem:8MiB").await.unwrap();
        assert!(a.describe().starts_with("slice 0+2097152 of qos group a (weight 200) over "), "{}", a.describe());
        let (ra, rb, rc) = tokio::join!(check_connections(&a, 4, 1), check_connections(&b, 3, 10), async {
            check_all_blocks_at_once(&*c.connect().unwrap()).await
        });
        ra.unwrap();
        rb.unwrap();
        rc.unwrap();
        // The three volumes are slices of one device: a slice overlapping theirs is refused.
        let whole = open(&opener, "slice:0+8MiB?overlap@mem:8MiB").await;
        assert!(whole.is_err(), "overlapping the qos volumes' slices is refused");
        let status = a.status().unwrap();
        let groups = status["groups"].as_array().unwrap();
        assert_eq!(groups.len(), 2, "{status}");
        assert_eq!(groups[0]["name"], "a");
        assert_eq!(groups[0]["weight"], 200);
        assert!(groups[0]["requests"].as_u64().unwrap() > 1000, "{status}");
        assert!(groups[1]["device_time_s"].as_f64().unwrap() > 0.0, "{status}");
        assert_eq!(groups[0]["queued"], 0);
        let names: Vec<&str> = a.metrics().iter().map(|s| s.name).collect();
        for want in ["strata_qos_requests_total", "strata_qos_device_share_ratio", "strata_qos_latency_seconds_bucket"]
        {
            assert!(names.contains(&want), "{names:?}");
        }
    }
}

/// A fault layer over a qos volume hands each connection its own stream, and its rules still
/// apply to what comes through the handle.
#[tokio::test]
async fn connections_pass_through_a_fault_layer() {
    let opener = Opener::new();
    let dev = open(&opener, "fault:write:eio:0-4KiB@qos:a@mem:4MiB").await.unwrap();
    let (one, two) = (dev.connect().expect("a handle per connection"), dev.connect().unwrap());
    one.write(8192, Buf::from_slice(&[7; 4096]), false).await.unwrap();
    assert_eq!(&two.read(8192, Buf::zeroed(4096)).await.unwrap()[..], &[7; 4096][..]);
    let e = two.write(0, Buf::from_slice(&[1; 4096]), false).await.unwrap_err();
    assert_eq!(e.kind, ErrorKind::Io, "{e}");
    // The volume's own stream and one per connection.
    assert_eq!(dev.status().unwrap()["groups"][0]["streams"], 3, "{}", dev.status().unwrap());
}

#[tokio::test]
async fn settings_change_live_and_bad_ones_are_refused() {
    let opener = Opener::new();
    let a = open(&opener, "qos:a?weight=200@slice:0+1MiB@mem:4MiB").await.unwrap();
    let b = open(&opener, "qos:b@slice:1MiB+1MiB@mem:4MiB").await.unwrap();
    assert_eq!(a.message("weight 300").await.unwrap(), "group a: weight = 300");
    assert_eq!(a.message("riops 1000").await.unwrap(), "group a: riops = 1000");
    assert_eq!(b.message("group a rbps 10MiB/s").await.unwrap(), "group a: rbps = 10MiB");
    for (msg, why) in [
        ("weight 0", "weight 0 is out of range (1 to 10000)"),
        ("weight 10001", "out of range"),
        ("group nosuch weight 5", "unknown group \"nosuch\""),
        ("speed 5", "unknown setting \"speed\""),
        ("wiops 0", "would stop the group"),
        ("hello", "unknown message"),
    ] {
        let e = a.message(msg).await.unwrap_err();
        assert_eq!(e.kind, ErrorKind::Invalid, "{msg}");
        assert!(e.context.contains(why), "{msg}: {e}");
    }
    let status = b.status().unwrap();
    let ga = &status["groups"][0];
    assert_eq!(ga["weight"], 300, "refused messages changed nothing: {status}");
    assert_eq!(ga["limits"][0], "riops=1000");
    assert_eq!(ga["limits"][2], "rbps=10MiB");

    // A second spec naming a group must agree with it; device options must agree too.
    let e = open(&opener, "qos:a?weight=100@slice:2MiB+1MiB@mem:4MiB").await.err().unwrap();
    assert!(e.to_string().contains("qos group a already runs with weight=300"), "{e}");
    open(&opener, "qos:a?weight=300@slice:2MiB+512KiB@mem:4MiB").await.expect("agreeing settings are fine");
    let e = open(&opener, "qos:c?depth=3@slice:3MiB+512KiB@mem:4MiB").await.err().unwrap();
    assert!(e.to_string().contains("already runs with other device options"), "{e}");
    // Overlapping slices and slices past the end are refused for qos volumes too.
    let e = open(&opener, "qos:c@slice:512KiB+1MiB@mem:4MiB").await.err().unwrap();
    assert!(e.to_string().contains("overlaps the slice 0+1048576"), "{e}");
    let e = open(&opener, "qos:c@slice:3MiB+2MiB@mem:4MiB").await.err().unwrap();
    assert!(e.to_string().contains("past the end"), "{e}");
    // Data still flows.
    a.write(0, Buf::from_slice(&[1u8; 4096]), false).await.unwrap();
    assert_eq!(a.read(0, Buf::zeroed(4096)).await.unwrap()[0], 1);
}

/// qos above a cache, as QOS.md advises: the cache's messages (`flush`) go through to it,
/// its status shows under `below` and its metrics with the scheduler's; a message mixing
/// qos settings and the cache's is refused and changes nothing.
#[tokio::test]
async fn a_cache_under_qos_takes_its_messages_and_shows_its_status() {
    use strata_cache::{meta::Meta, offline::create, CacheDev, CacheStatus, CreateOptions, Mode, OpenOptions};
    use strata_io::mem::MemDev;
    use strata_qos::{DeviceOptions, Qos, QosOptions};
    let (origin, fast) = (Arc::new(MemDev::new(4 << 20)), Arc::new(MemDev::new(2 << 20)));
    let o = CreateOptions {
        mode: Mode::Writeback,
        writeback_percent: 100,
        migration_budget_bytes_per_s: 0,
        origin_spec: "mem:origin".into(),
        ..CreateOptions::default()
    };
    create(&*fast, &*origin, &o).await.unwrap();
    let (meta, _) = Meta::load(&*fast).await.unwrap();
    let cache = CacheDev::open(fast.clone(), origin.clone(), meta, OpenOptions::default()).await.unwrap();
    let qos = Qos::new(Arc::new(cache), &DeviceOptions::default(), None);
    let vol = qos.join("db", &QosOptions::default()).unwrap();
    for i in 0..8 {
        vol.write(i * (64 << 10), Buf::from_slice(&[9u8; 4096]), false).await.unwrap();
    }
    let cache_status = || CacheStatus::from_json(vol.status().unwrap()["below"].clone()).expect("a cache's status");
    assert!(cache_status().dirty_blocks > 0, "{}", vol.status().unwrap());
    assert_eq!(vol.status().unwrap()["groups"][0]["name"], "db", "the qos fields stay where they were");
    let names: Vec<&str> = vol.metrics().iter().map(|s| s.name).collect();
    for want in ["strata_qos_requests_total", "strata_cache_dirty_blocks"] {
        assert!(names.contains(&want), "{names:?}");
    }

    let e = vol.message("weight 300\nflush").await.unwrap_err();
    assert_eq!(e.kind, ErrorKind::Invalid);
    assert!(e.context.contains("not both"), "{e}");
    assert_eq!(vol.status().unwrap()["groups"][0]["weight"], 100, "a refused message changes nothing");
    vol.message("sequential_cutoff 0").await.expect("a cache setting goes to the cache");
    let e = vol.message("speed 5").await.unwrap_err();
    assert!(!e.context.starts_with("qos:"), "the cache answers what neither knows: {e}");
    assert_eq!(vol.message("weight 300").await.unwrap(), "group db: weight = 300");

    let answer = vol.message("flush").await.unwrap();
    assert!(answer.starts_with("writing back"), "{answer}");
    let start = std::time::Instant::now();
    while cache_status().dirty_blocks > 0 {
        assert!(start.elapsed().as_secs() < 20, "flush through qos never wrote back: {}", vol.status().unwrap());
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert_eq!(&origin.read(0, Buf::zeroed(4096)).await.unwrap()[..], &[9u8; 4096][..]);
}

/// Volumes over one cache (slices of it, or qos groups over it) share one open cache: a
/// volume's shutdown (its export removed) leaves the cache running for the others, its
/// write-back going on and no clean-shutdown mark written under them; only the last one's
/// shutdown closes it, cleanly, whether they close one after another or all at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_last_volume_over_a_shared_cache_shuts_it_down() {
    use strata_cache::{meta::Meta, CacheStatus};
    use strata_io::file::{Claim, FileDev, FileOptions};
    use strata_qos::status::below_qos;
    let dir = tempfile::tempdir().unwrap();
    let (origin, cache) = (dir.path().join("o.img"), dir.path().join("c.img"));
    let made = std::process::Command::new(env!("CARGO_BIN_EXE_strata"))
        .args(["cache", "create", "--writeback-percent", "100", "--migration-budget", "0"])
        .args(["--origin", &format!("{}?size=4MiB", origin.display())])
        .args(["--cache", &format!("{}?size=2MiB", cache.display())])
        .output()
        .unwrap();
    assert!(made.status.success(), "{}", String::from_utf8_lossy(&made.stderr));
    let clean = || async {
        let opts = FileOptions { read_only: true, ..FileOptions::default() };
        let (meta, _) = Meta::load(&FileDev::open_claimed(&cache, &opts, Claim::Unclaimed).unwrap()).await.unwrap();
        meta.sb.clean_shutdown
    };
    let c = cache.display();
    for specs in [
        [format!("slice:0+2MiB@cache:{c}"), format!("slice:2MiB+2MiB@cache:{c}")],
        [format!("qos:a@slice:0+2MiB@cache:{c}"), format!("qos:b@slice:2MiB+2MiB@cache:{c}")],
        [format!("qos:a@slice:1MiB+3MiB@cache:{c}"), format!("slice:0+1MiB@cache:{c}")],
    ] {
        let opener = Opener::new();
        let (a, b) = (open(&opener, &specs[0]).await.unwrap(), open(&opener, &specs[1]).await.unwrap());
        assert!(!clean().await, "{specs:?}: an open cache is not marked clean");
        for (i, vol) in [&a, &b].into_iter().enumerate() {
            vol.write(4096, Buf::from_slice(&[i as u8 + 1; 4096]), false).await.unwrap();
        }
        a.shutdown().await.unwrap();
        assert!(!clean().await, "{specs:?}: marked clean under a volume still serving");
        b.message("flush").await.unwrap();
        let dirty = || CacheStatus::from_json(below_qos(b.status().unwrap())).unwrap().dirty_blocks;
        let start = std::time::Instant::now();
        while dirty() > 0 {
            assert!(start.elapsed().as_secs() < 20, "{specs:?}: no write-back after a sibling closed");
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        b.shutdown().await.unwrap();
        assert!(clean().await, "{specs:?}: the last volume closes the cache cleanly");
        drop((a, b));

        // Both at once: still one clean shutdown, after the other's flush.
        let (a, b) = (open(&opener, &specs[0]).await.unwrap(), open(&opener, &specs[1]).await.unwrap());
        let (ra, rb) = tokio::join!(a.shutdown(), b.shutdown());
        ra.unwrap();
        rb.unwrap();
        assert!(clean().await, "{specs:?}: closed together, the cache is closed cleanly");
    }

    // A volume refused once the cache is open for it (a slice past its end, a qos group
    // over the whole of it beside a slice) gives the cache up as a closing one does: held
    // by no other volume, the cache is shut down, not dropped.
    for refused in [format!("slice:3MiB+2MiB@cache:{c}"), format!("qos:a@slice:3MiB+2MiB@cache:{c}")] {
        let e = open(&Opener::new(), &refused).await.err().expect("past the end");
        assert!(e.context.contains("past the end"), "{e}");
        assert!(clean().await, "{refused}: the cache opened for a refused volume was not closed cleanly");
    }
    let opener = Opener::new();
    let slice = open(&opener, &format!("slice:0+1MiB@cache:{c}")).await.unwrap();
    let e = open(&opener, &format!("qos:a@cache:{c}")).await.err().expect("the whole device beside a slice");
    assert!(e.context.contains("the slice 0+1048576 of cache:"), "{e}");
    slice.write(0, Buf::from_slice(&[7u8; 4096]), false).await.expect("the slice goes on serving");
    slice.shutdown().await.unwrap();
    assert!(clean().await);
}

/// A volume over the whole of a shared device (a qos group over it) overlaps every other
/// volume on it: beside it, slices and other whole-device groups are refused, whichever
/// opened first, and it opens again once they are gone.
#[tokio::test]
async fn a_volume_over_the_whole_shared_device_overlaps_every_other() {
    let opener = Opener::new();
    let whole = open(&opener, "qos:a@mem:4MiB").await.unwrap();
    for other in
        ["qos:b@mem:4MiB", "qos:a@mem:4MiB", "qos:b@slice:1MiB+1MiB?overlap@mem:4MiB", "slice:0+4KiB?overlap@mem:4MiB"]
    {
        let e = open(&opener, other).await.err().expect("overlapping the whole device");
        assert!(e.context.contains("a volume over the whole of mem:4MiB is already open"), "{other}: {e}");
    }
    whole.write(0, Buf::from_slice(&[3u8; 4096]), false).await.expect("the whole-device volume goes on serving");
    whole.shutdown().await.unwrap();
    drop(whole);
    let slice = open(&opener, "qos:b@slice:1MiB+1MiB@mem:4MiB").await.unwrap();
    let e = open(&opener, "qos:a@mem:4MiB").await.err().expect("the whole device beside a slice");
    assert!(e.context.contains("the slice 1048576+1048576 of mem:4MiB is already open"), "{e}");
    drop(slice);
    open(&opener, "qos:a@mem:4MiB").await.expect("alone again");
}

/// qos over a remote origin, directly and under a cache: the remote's state and counters
/// come through qos's `below` (under the cache's `origin` there), and its `strata_remote_*`
/// metrics with the scheduler's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_remote_origin_under_qos_shows_its_state_and_metrics() {
    use strata_io::mem::MemDev;
    use strata_nbd::{Export, Limits, Server};
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("r.sock");
    let mem: Arc<dyn BlockDev> = Arc::new(MemDev::new(4 << 20));
    let export = Export { name: "vol".into(), description: String::new(), dev: mem, read_only: false };
    let server = Arc::new(Server::new(vec![export], Limits::default()).unwrap());
    let listener = tokio::net::UnixListener::bind(&sock).unwrap();
    tokio::spawn({
        let server = server.clone();
        async move { server.serve_unix(listener).await }
    });
    let uri = format!("nbd+unix:///vol?socket={}", sock.display());
    let cache = dir.path().join("c.img");
    let args = ["cache", "create", "--origin", &uri, "--cache", &format!("{}?size=2MiB", cache.display())];
    let mut create = std::process::Command::new(env!("CARGO_BIN_EXE_strata"));
    create.args(args);
    // It connects to the server this runtime serves, so it runs off the runtime's threads.
    let made = tokio::task::spawn_blocking(move || create.output()).await.unwrap().unwrap();
    assert!(made.status.success(), "{}", String::from_utf8_lossy(&made.stderr));

    let opener = Opener::new();
    let direct = open(&opener, &format!("qos:a@{uri}")).await.unwrap();
    let cached = open(&opener, &format!("qos:b@cache:{}", cache.display())).await.unwrap();
    direct.write(0, Buf::from_slice(&[3u8; 4096]), true).await.unwrap();
    cached.write(1 << 20, Buf::from_slice(&[4u8; 4096]), false).await.unwrap();
    cached.message("flush").await.unwrap();
    let written = |vol: &Arc<dyn BlockDev>, origin: &dyn Fn(&serde_json::Value) -> serde_json::Value| {
        let st = vol.status().unwrap();
        let remote = origin(&st["below"]);
        assert_eq!(remote["state"], "up", "{st}");
        assert_eq!(remote["origin"], uri.as_str(), "{st}");
        remote["written_bytes"].as_u64().unwrap()
    };
    assert_eq!(written(&direct, &|b| b.clone()), 4096);
    let start = std::time::Instant::now();
    while written(&cached, &|b| b["origin"].clone()) < 4096 {
        assert!(start.elapsed().as_secs() < 20, "no write-back to the remote: {}", cached.status().unwrap());
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    for vol in [&direct, &cached] {
        let names: Vec<&str> = vol.metrics().iter().map(|s| s.name).collect();
        for want in ["strata_qos_requests_total", "strata_remote_up", "strata_remote_written_bytes_total"] {
            assert!(names.contains(&want), "{want} missing from {names:?}");
        }
    }
    for vol in [direct, cached] {
        vol.shutdown().await.unwrap();
    }
    server.shutdown();
}

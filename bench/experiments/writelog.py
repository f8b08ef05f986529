"""writelog (the write-log target, seed 003's writecache): what a full log costs and how it
drains, each figure against its peer in the same run. A log of LOG bytes (4 KiB blocks,
default tunables) over an hdd: origin four times as large:

- memory: the server's resident memory with the log open, over the same server with a
  4 KiB file volume, per log block (and the target's own `memory_bytes`);
- commit cost: 4 KiB random writes with a FLUSH after each (fio `fsync=1`, iodepth 1), median
  latency, against the same on the log's fast file served raw (same NBD path);
- recovery: the log filled (write-back paused), the server killed with SIGKILL, and the time
  until a restarted server listens, per GiB of log;
- drain: the log filled by 4 KiB writes in random order over a region its size, then
  `strata writecache detach` timed, against the dirty bytes at the origin's own sequential
  write rate (fio, 1 MiB writes on the origin alone);
- streaming past a full log: the log filled with a log's worth of 64 KiB random writes
  (write-back held), then, with default tunables, a sequential 1 MiB write stream twice the
  log's size, against the same stream on the origin alone.

Scale 1: LOG 1 GiB.
"""

import time

import benchlib as b
import plots

NAME = "writelog"
TITLE = "write log: memory, commit cost, recovery, drain in address order, streaming past a full log"
BLOCK = 4 * b.KIB


def params(scale):
    log = max(16, int(1024 * scale)) * b.MIB
    return log, 4 * log


def expected_seconds(scale):
    log, origin = params(scale)
    seq = 150 * b.MIB
    # fills at ~200 MiB/s, drain and streams at the origin's rate, 2 x 20 s of fsync writes
    return 4 * log / (200 * b.MIB) + 5 * log / seq + 40 + origin / (500 * b.MIB) + 10


def rss_bytes(pid, field="VmRSS"):
    """Resident memory of `pid`: all of it (VmRSS), or its anonymous part (RssAnon), which
    leaves out the pages of the binary's code that serving the log touched."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    return 0


def fio_job(uri, name, rw, bs, size, extra=()):
    return b.fio(["--ioengine=nbd", f"--uri={uri}", f"--name={name}", f"--rw={rw}", f"--bs={bs}",
                  f"--size={b.fio_size(size)}", *extra], timeout=3600)


def write_side(rep):
    return b.job_side(rep, "write")


def run(ctx):
    log, origin_bytes = params(ctx.scale)
    out = ctx.dir(NAME)
    work = ctx.work(NAME)
    p = ctx.progress
    origin, logf, fast, sock = work / "origin.img", work / "log.img", work / "fast.img", work / "s.sock"
    log_file_bytes = b.cache_file_bytes(log, BLOCK)
    res = {}

    def fresh_log():
        for f in (origin, logf):
            if f.exists():
                f.unlink()
        b.writecache_create(ctx, f"hdd:{origin}?size={b.size_str(origin_bytes)}",
                            f"{logf}?size={b.size_str(log_file_bytes)}")

    # Memory.
    p.set(step="memory: an empty log against a plain volume")
    fresh_log()
    with b.Strata(ctx, sock, f"small={work / 'small.img'}?size=4KiB") as s:
        base = rss_bytes(s.proc.pid)
        anon_base = rss_bytes(s.proc.pid, "RssAnon")
    with b.Strata(ctx, sock, f"vol=writecache:{logf}") as s:
        t = s.target("vol")
        slots = t["blocks"]
        with_log = rss_bytes(s.proc.pid)
        anon = rss_bytes(s.proc.pid, "RssAnon")
        res["memory"] = {"blocks": slots, "rss_plain_bytes": base, "rss_with_log_bytes": with_log,
                         "rss_bytes_per_block": (with_log - base) / slots,
                         "anon_bytes_per_block": (anon - anon_base) / slots,
                         "target_memory_bytes_per_block": t["memory_bytes"] / slots}
    p.note(f"  {NAME}: memory {res['memory']['rss_bytes_per_block']:.1f} B per block (RSS), "
           f"{res['memory']['anon_bytes_per_block']:.1f} B (anonymous), "
           f"{res['memory']['target_memory_bytes_per_block']:.1f} B (books)")

    # Commit cost: a flush after each 4 KiB write, through the log and on the raw fast file.
    secs = max(3, int(20 * ctx.scale))
    lat = {}
    for label, volume in [("raw fast file", f"fast={fast}?size={b.size_str(log_file_bytes)}"),
                          ("write log", f"fast=writecache:{logf}")]:
        p.set(step=f"commit cost: 4 KiB randwrite + flush each, {label} ({secs} s)")
        with b.Strata(ctx, sock, volume) as s:
            rep = fio_job(s.uri("fast"), "commit", "randwrite", "4k", log // 2,
                          ["--iodepth=1", "--fsync=1", "--time_based", f"--runtime={secs}"])
        w = write_side(rep)
        sync = rep["jobs"][0].get("sync", {})
        lat[label] = {"write_p50_us": w["clat_ns"]["percentile"]["50.000000"] / 1000,
                      "flush_p50_us": sync.get("lat_ns", {}).get("percentile", {}).get("50.000000", 0) / 1000,
                      "iops": w["iops"]}
        lat[label]["write_plus_flush_p50_us"] = lat[label]["write_p50_us"] + lat[label]["flush_p50_us"]
    res["commit"] = lat | {"ratio": lat["write log"]["write_plus_flush_p50_us"]
                           / lat["raw fast file"]["write_plus_flush_p50_us"]}

    # Recovery after SIGKILL with a full log.
    p.set(step="recovery: filling the log, then SIGKILL and restart")
    fresh_log()
    fill = slots * BLOCK * 95 // 100 // b.MIB * b.MIB
    s = b.Strata(ctx, sock, f"vol=writecache:{logf}")
    try:
        s.message("vol", "writeback_running off")
        fio_job(s.uri("vol"), "fill", "write", "1M", fill, ["--iodepth=8", "--end_fsync=1"])
        dirty = s.target("vol")["dirty_blocks"]
    finally:
        s.p.stop(sig=9)
    t0 = time.monotonic()
    with b.Strata(ctx, sock, f"vol=writecache:{logf}") as s:
        up = time.monotonic() - t0
        t = s.target("vol")
        rss_full = rss_bytes(s.proc.pid)
    # Write-back stays off after the restart (tunables set live are kept in the superblock);
    # what has been written back since, if anything, counts as recovered too.
    res["recovery"] = {"dirty_blocks": dirty, "recovered_dirty_blocks": t["dirty_blocks"] + t["writebacks"],
                       "seconds": up,
                       "seconds_per_gib": up / (log / (1 << 30)), "rss_full_bytes_per_block": (rss_full - base) / slots}

    # The origin's own sequential write rate, then the drain of a log written at random.
    p.set(step="origin alone: sequential 1 MiB writes")
    with b.Strata(ctx, sock, f"origin=hdd:{origin}") as s:
        rep = fio_job(s.uri("origin"), "seq", "write", "1M", 2 * log, ["--iodepth=4", "--end_fsync=1"])
    seq_bps = write_side(rep)["bw_bytes"]
    stream_origin = 2 * log / seq_bps
    p.set(step="drain: a log written at random offsets, then detach")
    fresh_log()
    with b.Strata(ctx, sock, f"vol=writecache:{logf}") as s:
        s.message("vol", "writeback_running off")
        fio_job(s.uri("vol"), "random-fill", "randwrite", "4k", fill, ["--iodepth=16", "--end_fsync=1"])
        dirty = s.target("vol")["dirty_blocks"]
        t0 = time.monotonic()
        s.message("vol", "cleaner on")
        s.message("vol", "writeback_running on")
        b.run([ctx.strata, "writecache", "detach", "--admin", s.admin, "vol"], timeout=3600)
        drain = time.monotonic() - t0
    ideal = dirty * BLOCK / seq_bps
    res["drain"] = {"dirty_blocks": dirty, "seconds": drain, "origin_sequential_bytes_per_s": seq_bps,
                    "dirty_at_origin_rate_s": ideal, "ratio": drain / ideal}

    # A stream twice the log's size through a full log.
    p.set(step="streaming: 2x the log's size through a full log")
    fresh_log()
    with b.Strata(ctx, sock, f"vol=writecache:{logf}") as s:
        # Full: a log's worth of dirty blocks (write-back held while it fills; the log's few
        # spare slots stay free), then default tunables.
        s.message("vol", "writeback_running off")
        fio_job(s.uri("vol"), "fill", "randwrite", "64k", log, ["--iodepth=8"])
        free_at_start = s.target("vol")["free_blocks"]
        s.message("vol", "writeback_running on")
        t0 = time.monotonic()
        fio_job(s.uri("vol"), "stream", "write", "1M", 2 * log, ["--iodepth=4", "--offset=" + b.fio_size(log),
                                                                  "--end_fsync=1"])
        stream = time.monotonic() - t0
        t = s.target("vol")
    res["stream"] = {"seconds": stream, "origin_alone_seconds": stream_origin, "rate_ratio": stream_origin / stream,
                     "free_blocks_at_start": free_at_start, "writes_around": t["writes_around"]}

    rows = []
    for figure, v in res.items():
        for key, value in v.items():
            items = value.items() if isinstance(value, dict) else [(None, value)]
            for sub, x in items:
                rows.append({"figure": figure, "measure": f"{key} {sub}" if sub else key, "value": x})
    b.write_csv(out / "writelog.csv", rows, ["figure", "measure", "value"])
    # Each figure against its peer, and the bound for it.
    labels = ["commit: log / raw file", "drain: time / ideal", "stream: rate / origin's"]
    measured = [res["commit"]["ratio"], res["drain"]["ratio"], res["stream"]["rate_ratio"]]
    bounds = [1.3, 1.25, 0.9]
    plots.bar_chart(out / "ratios.png",
                    f"Write log of {log // b.MIB} MiB over an hdd: origin: each figure over its peer in the same "
                    f"run (measured) and the bound it must meet (scale {ctx.scale:g})",
                    [x for l in labels for x in (l, l + " (bound)")],
                    [x for pair in zip(measured, bounds) for x in pair], "ratio", "figure",
                    kinds=["measured", "bound"] * len(labels))
    return {"setup": {"log_bytes": log, "origin_bytes": origin_bytes, "block_bytes": BLOCK, "origin": "hdd:"},
            **res, "files": ["writelog.csv", "ratios.png"]}

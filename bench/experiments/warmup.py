"""warmup (seed 000): how fast a cache as large as the data comes up to speed on a zipf:1.2
randread workload, from empty and from a cache full of junk, against the HDD origin alone,
the fast file alone, a fully warm cache, and nbdkit's cache filter over the same origin.
Also the write-heavy variant (zipf 50/50 in writeback mode against the origin alone).

Scale 1: data 512 MiB (2 jobs x 256 MiB), cache data area = data size, origin 2 GiB,
warm-up series 300 s, baselines 60 s, the 50/50 pair 60 s and 180 s.

    WARMUP_DATA_MIB=4096 sets the data size alone (seed 000's own: 2 jobs x 2 GiB; the
    origin is 4 times the data), the times staying the scale's.
"""

import os

import benchlib as b
import plots
from experiments.rig import BLOCK, Rig, avg_iops, hit_series

NAME = "warmup"
TITLE = "zipf:1.2 warm-up: empty cache, cache full of junk, peers"

SERIES = ["HDD origin alone", "fast file alone", "strata warm (all hits)", "strata empty cache",
          "strata cache full of junk", "nbdkit cache filter", "HDD origin alone 50/50",
          "strata writeback 50/50"]


def params(scale):
    data = (int(os.environ.get("WARMUP_DATA_MIB", 0)) // 2 * 2 or max(8, int(512 * scale) // 2 * 2)) * b.MIB
    long_s = max(2.5, round(300 * scale, 1))
    short_s = max(1.0, round(60 * scale, 1))
    mixed_s = max(2.0, round(180 * scale, 1))
    junk_zipf_s = max(1.0, round(30 * scale, 1))
    return data, long_s, short_s, mixed_s, junk_zipf_s


def expected_seconds(scale):
    data, long_s, short_s, mixed_s, junk_s = params(scale)
    io = 3 * long_s + 4 * short_s + mixed_s + junk_s
    fills = 3 * data / (40 * b.MIB) + 4 * data / (300 * b.MIB) + 8 * 1.0
    return io + fills


def run(ctx):
    data, long_s, short_s, mixed_s, junk_s = params(ctx.scale)
    out = ctx.dir(NAME)
    rig = Rig(ctx, NAME, data, data)
    rig.prepare()
    p = ctx.progress
    results = {}
    iops_rows, hit_rows = [], []

    def record(label, rep, series, rows, totals=None, **extra):
        r = {"avg_iops": avg_iops(rep), "runtime_s": max(j["job_runtime"] for j in rep["jobs"]) / 1000}
        if rows and totals:
            r["hit_ratio_total"] = totals["hit_ratio"]
            tail = [h for t, h in hit_series(rows) if t >= rows[-1]["t_s"] - 10]
            r["hit_ratio_last_10s"] = b.mean(tail) if tail else None
            for k in ["promotions", "demotions", "writebacks", "cached_blocks_end", "dirty_blocks_end"]:
                r[k] = totals[k]
        r |= extra
        results[label] = r
        iops_rows.extend({"series": label, "t_s": t, "iops": v} for t, v in series)
        hit_rows.extend({"series": label} | row for row in rows)
        p.note(f"  {NAME}: {label}: {r['avg_iops']:,.0f} IOPS"
               + (f", hit ratio {r['hit_ratio_total']:.3f}" if r.get("hit_ratio_total") is not None else ""))
        return series

    def step(i, label, secs):
        p.set(step=f"{label} ({i}/{len(SERIES)}, {secs:g} s)")

    # 1. The origin alone, 2. the fast file alone (the cache file, served read-only).
    step(1, SERIES[0], short_s)
    with rig.serve_origin() as s:
        rep, ser, _, _ = rig.run_zipf(s.uri("origin"), short_s)
    record(SERIES[0], rep, ser, [])
    step(2, SERIES[1], short_s)
    with rig.serve_fast() as s:
        rep, ser, _, _ = rig.run_zipf(s.uri("fast"), short_s)
    record(SERIES[1], rep, ser, [])

    # 3. Fully warm: every data block promoted first, so every read hits.
    step(3, SERIES[2] + ": promoting the data", short_s)
    slots = rig.create_cache()
    with rig.serve_cache() as s:
        pre = rig.prefill(s, 0, data)
        step(3, SERIES[2], short_s)
        rep, ser, rows, tot = rig.run_zipf(s.uri("vol"), short_s, server=s)
    record(SERIES[2], rep, ser, rows, tot, cached_blocks_start=pre["cached_blocks"])

    # 4. Empty cache.
    step(4, SERIES[3], long_s)
    rig.create_cache()
    with rig.serve_cache() as s:
        rep, ser, rows, tot = rig.run_zipf(s.uri("vol"), long_s, server=s)
    empty = record(SERIES[3], rep, ser, rows, tot)

    # 5. Full of junk: the junk region promoted and then read zipf-hot, server restarted
    # (a clean restart keeps the policy's hints, so the junk is warm junk).
    step(5, SERIES[4] + ": filling the cache with junk", long_s)
    rig.create_cache()
    with rig.serve_cache() as s:
        junk = rig.prefill(s, rig.junk_offset, slots * BLOCK, zipf_seconds=junk_s)
    step(5, SERIES[4], long_s)
    with rig.serve_cache() as s:
        start = s.target("vol")
        rep, ser, rows, tot = rig.run_zipf(s.uri("vol"), long_s, server=s)
    full = record(SERIES[4], rep, ser, rows, tot, cached_blocks_start=start["cached_blocks"],
                  junk_promotions=junk["promotions"])

    # 6. nbdkit's cache filter over the same origin (strata serves the hdd: origin).
    step(6, SERIES[5], long_s)
    with rig.serve_origin() as s:
        env = dict(b.ENV, TMPDIR=str(rig.work))
        with b.nbdkit(rig.ksock, "nbd", f"socket={rig.sock}", "export=origin", "cache-on-read=true",
                      f"cache-max-size={b.fio_size(slots * BLOCK)}", "cache-min-block-size=64K",
                      filters=["cache"], log=ctx.scratch / "nbdkit.log", env=env) as k:
            rep, ser, _, _ = rig.run_zipf(k.uri(), long_s)
    kit = record(SERIES[5], rep, ser, [])

    # 7, 8. Write-heavy zipf 50/50: origin alone, then strata in writeback mode (empty start).
    step(7, SERIES[6], short_s)
    with rig.serve_origin() as s:
        rep, ser, _, _ = rig.run_zipf(s.uri("origin"), short_s, rw="randrw")
    record(SERIES[6], rep, ser, [])
    step(8, SERIES[7], mixed_s)
    rig.create_cache(mode="writeback")
    with rig.serve_cache() as s:
        rep, ser, rows, tot = rig.run_zipf(s.uri("vol"), mixed_s, rw="randrw", server=s)
    record(SERIES[7], rep, ser, rows, tot)

    warm = results[SERIES[2]]["avg_iops"]
    fast = results[SERIES[1]]["avg_iops"]
    level = 0.8 * warm
    derived = {
        "warm_over_fast_file": warm / fast if fast else None,
        "eighty_percent_of_warm_iops": level,
        "empty_time_to_80pct_s": b.time_to_reach(empty, level),
        "junk_time_to_80pct_s": b.time_to_reach(full, level),
        "nbdkit_time_to_80pct_s": b.time_to_reach(kit, level),
        "empty_over_hdd": results[SERIES[3]]["avg_iops"] / results[SERIES[0]]["avg_iops"],
        "junk_over_hdd": results[SERIES[4]]["avg_iops"] / results[SERIES[0]]["avg_iops"],
        "nbdkit_over_hdd": results[SERIES[5]]["avg_iops"] / results[SERIES[0]]["avg_iops"],
        "writeback_5050_over_hdd_5050": results[SERIES[7]]["avg_iops"] / results[SERIES[6]]["avg_iops"],
    }
    # The last 30 s (or third) of each warm-up series: where it settled.
    for label, ser in ((SERIES[3], empty), (SERIES[4], full), (SERIES[5], kit)):
        tail_from = max(ser[-1][0] - 30, ser[-1][0] * 2 / 3) if ser else 0
        results[label]["avg_iops_tail"] = b.mean(v for t, v in ser if t >= tail_from)

    b.write_csv(out / "iops.csv", iops_rows, ["series", "t_s", "iops"])
    b.write_csv(out / "hit_ratio.csv", hit_rows, ["series", "t_s", "hit_ratio"] + b.StatusPoller.FIELDS)
    b.write_csv(out / "series.csv", ({"series": k} | v for k, v in results.items()))

    setup = (f"2 jobs x {rig.region // b.MIB} MiB, 4 KiB, iodepth 8, zipf:1.2; hdd: origin, "
             f"{slots * BLOCK // b.MIB} MiB cache file, 64 KiB blocks (scale {ctx.scale:g})")
    by = {}
    for r in iops_rows:
        by.setdefault(r["series"], []).append((r["t_s"], r["iops"]))
    plots.time_series(out / "iops.png", f"IOPS over time, randread: {setup}",
                      [(k, by[k]) for k in SERIES[:6] if k in by], "IOPS (both jobs, 500 ms samples; log scale)",
                      log=True, smooth_s=max(1.0, long_s / 30))
    plots.time_series(out / "iops_5050.png", f"IOPS over time, 50/50 randrw: {setup}",
                      [(k, by[k]) for k in SERIES[6:] if k in by], "IOPS (reads + writes, 500 ms samples; log scale)",
                      log=True, smooth_s=max(1.0, long_s / 30))
    hits = {}
    for r in hit_rows:
        if r.get("hit_ratio") is not None:
            hits.setdefault(r["series"], []).append((r["t_s"], r["hit_ratio"]))
    plots.time_series(out / "hit_ratio.png", f"strata hit ratio over time (per 500 ms, 64 KiB blocks): {setup}",
                      [(k, hits[k]) for k in SERIES if k in hits], "hit ratio (cache-block accesses)",
                      smooth_s=max(1.0, long_s / 30), ylim=(0, 1.02))
    return {
        "setup": {"data_bytes": data, "region_bytes": rig.region, "cache_blocks": slots, "block_bytes": BLOCK,
                  "cache_bytes": slots * BLOCK, "origin_bytes": rig.origin_bytes, "warmup_series_s": long_s,
                  "baseline_series_s": short_s, "rw5050_series_s": mixed_s, "junk_zipf_s": junk_s,
                  "origin": "hdd: (7200 rpm model)", "fio": "randread 4k iodepth 8 zipf:1.2, 2 jobs"},
        "series": results,
        "derived": derived,
        "files": ["iops.csv", "hit_ratio.csv", "series.csv", "iops.png", "iops_5050.png", "hit_ratio.png"],
    }

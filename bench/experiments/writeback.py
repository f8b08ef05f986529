"""writeback: does write-back converge under sustained load? seed 000's rig (2 jobs, zipf,
4 KiB, iodepth 8, an hdd: origin, a cache as large as the data, 64 KiB blocks) runs 50/50
randrw, first on the origin alone flat out, then on an empty writeback cache twice: rate-limited
to half the origin-alone IOPS (a load that leaves the origin half its time), and flat out
(the cache absorbs writes far faster than the origin takes them), with status polled
every 500 ms: the dirty share of the cache against its target (writeback_percent, and the
+5 points the rule allows) and the write-back rate (blocks and origin writes per second;
adjacent dirty blocks go in one write).

Scale 1: data 512 MiB (2 jobs x 256 MiB), cache = data, 300 s per load, baseline 60 s.
"""

import benchlib as b
import plots
from experiments.rig import Rig, avg_iops

NAME = "writeback"
TITLE = "write-back under a sustained 50/50 zipf load: dirty share and write-back rate over time"
PERCENT = 10


def params(scale):
    data = max(8, int(512 * scale) // 2 * 2) * b.MIB
    load_s = max(5.0, round(300 * scale, 1))
    base_s = max(2.0, round(60 * scale, 1))
    return data, load_s, base_s


def expected_seconds(scale):
    data, load_s, base_s = params(scale)
    return 2 * load_s + base_s + 2 * data / (40 * b.MIB) + 10


def settle_time(points, level):
    """The first time from which every later point is at or below `level` (None if never)."""
    t_settled = None
    for t, y in points:
        if y > level:
            t_settled = None
        elif t_settled is None:
            t_settled = t
    return t_settled


def run(ctx):
    data, load_s, base_s = params(ctx.scale)
    out = ctx.dir(NAME)
    rig = Rig(ctx, NAME, data, data)
    rig.prepare()
    p = ctx.progress

    p.set(step=f"HDD origin alone, 50/50 flat out ({base_s:g} s)")
    with rig.serve_origin() as s:
        rep, _, _, _ = rig.run_zipf(s.uri("origin"), base_s, rw="randrw")
    origin_iops = avg_iops(rep)
    # Half the origin's IOPS, split over the two jobs (fio's rate_iops is per job and direction).
    per_job = max(1, int(origin_iops / 2 / 2 / 2))

    loads = [(f"at {2 * 2 * per_job} IOPS (half the origin's)", [f"--rate_iops={per_job},{per_job}"]),
             ("flat out", [])]
    dirty_series, rate_series, csv_rows, results = [], [], [], {}
    tail_from = max(load_s - 30, load_s * 2 / 3)
    for label, extra in loads:
        p.set(step=f"strata writeback, 50/50 {label} ({load_s:g} s)")
        slots = rig.create_cache(mode="writeback")
        with rig.serve_cache() as s:
            s.message("vol", f"writeback_percent {PERCENT}")
            rep, _, rows, tot = rig.run_zipf(s.uri("vol"), load_s, rw="randrw", server=s, extra=extra)
        dirty, wb_rate, wr_rate = [], [], []
        prev = None
        for r in rows:
            t = r["t_s"]
            share = r["dirty_blocks"] / r["cache_blocks"] if r.get("cache_blocks") else None
            row = {"load": label, "t_s": t, "dirty_blocks": r["dirty_blocks"], "cache_blocks": r["cache_blocks"],
                   "dirty_share": share, "writebacks": r["writebacks"], "writeback_writes": r.get("writeback_writes")}
            if prev is not None and t > prev["t_s"]:
                dt = t - prev["t_s"]
                row["writeback_blocks_per_s"] = (r["writebacks"] - prev["writebacks"]) / dt
                if r.get("writeback_writes") is not None and prev.get("writeback_writes") is not None:
                    row["writeback_writes_per_s"] = (r["writeback_writes"] - prev["writeback_writes"]) / dt
            prev = r
            csv_rows.append(row)
            if share is not None:
                dirty.append((t, 100 * share))
            if row.get("writeback_blocks_per_s") is not None:
                wb_rate.append((t, row["writeback_blocks_per_s"]))
            if row.get("writeback_writes_per_s") is not None:
                wr_rate.append((t, row["writeback_writes_per_s"]))
        dirty_series.append((f"dirty share, {label}", dirty))
        rate_series += [(f"blocks written back /s, {label}", wb_rate), (f"origin writes /s, {label}", wr_rate)]
        tail = [y for t, y in dirty if t >= tail_from]
        last = rows[-1] if rows else {}
        results[label] = {
            "iops": avg_iops(rep),
            "dirty_share_tail_mean": b.mean(tail) / 100 if tail else None,
            "dirty_share_max": max((y for _, y in dirty), default=0) / 100,
            "dirty_blocks_end": last.get("dirty_blocks"),
            "settled_within_target_plus_5_at_s": settle_time(dirty, PERCENT + 5),
            "writebacks": tot.get("writebacks"),
            "writeback_writes": last.get("writeback_writes"),
            "blocks_per_writeback_write": (last["writebacks"] / last["writeback_writes"]
                                           if last.get("writeback_writes") else None),
        }
        p.note(f"  {NAME}: {label}: {results[label]['iops']:,.0f} IOPS, dirty share at the end "
               f"{results[label]['dirty_share_tail_mean']}")

    b.write_csv(out / "dirty.csv", csv_rows, ["load", "t_s", "dirty_blocks", "cache_blocks", "dirty_share",
                                              "writebacks", "writeback_writes", "writeback_blocks_per_s",
                                              "writeback_writes_per_s"])
    setup = (f"2 jobs x {rig.region // b.MIB} MiB, 4 KiB 50/50 randrw, iodepth 8, zipf:1.2; hdd: origin "
             f"({origin_iops:,.0f} IOPS alone), {slots * 64 // 1024} MiB cache, 64 KiB blocks, "
             f"writeback_percent {PERCENT} (scale {ctx.scale:g})")
    ends = [0, load_s]
    plots.time_series(out / "dirty.png", f"Dirty share of the cache over time: {setup}",
                      dirty_series + [(f"target ({PERCENT}%)", [(t, PERCENT) for t in ends]),
                                      (f"target + 5 points ({PERCENT + 5}%)", [(t, PERCENT + 5) for t in ends])],
                      "dirty blocks (% of the cache)", smooth_s=2.0, ylim=(0, 100))
    plots.time_series(out / "writeback_rate.png", f"Write-back rate over time: {setup}", rate_series,
                      "per second (500 ms samples)", smooth_s=max(2.0, load_s / 30))
    return {
        "setup": {"data_bytes": data, "cache_blocks": slots, "block_bytes": 64 * b.KIB, "load_s": load_s,
                  "baseline_s": base_s, "writeback_percent": PERCENT, "rate_iops_per_job_and_direction": per_job,
                  "origin": "hdd: (7200 rpm model)", "fio": "randrw 50/50 4k iodepth 8 zipf:1.2, 2 jobs"},
        "origin_alone_iops": origin_iops,
        "loads": results,
        "files": ["dirty.csv", "dirty.png", "writeback_rate.png"],
    }

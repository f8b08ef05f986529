"""small-cache (seed 000's "where next"): the warmup workload with the cache at 5% of the
data, smaller than the hot 10%. fio records its iolog; the live hit ratio is set against
`strata sim` on that same trace: OPT (Belady with bypass, the bound) and the simulated
policies at the same cache size and block size.

Scale 1: data 512 MiB (2 jobs x 256 MiB), cache 25.6 MiB (410 blocks of 64 KiB), each
live series 180 s (policy strata, then smq).
"""

import csv
import io

import benchlib as b
import plots
from experiments.rig import BLOCK, Rig, avg_iops, hit_series

NAME = "small_cache"
TITLE = "zipf:1.2 with the cache at 5% of the data: live hit ratio vs strata sim and OPT"
LIVE = [("strata", "strata (live)"), ("smq", "smq (live)")]
SIM_POLICIES = ["opt", "strata", "smq", "lru", "arc", "lirs", "s3fifo", "2q", "clock", "sieve"]


def params(scale):
    data = max(8, int(512 * scale) // 2 * 2) * b.MIB
    cache = max(4 * BLOCK, int(data * 0.05) // BLOCK * BLOCK)
    secs = max(3.0, round(180 * scale, 1))
    return data, cache, secs


def expected_seconds(scale):
    data, _, secs = params(scale)
    return len(LIVE) * secs + 5 * data / (300 * b.MIB) + 4


def merge_iologs(paths, dest):
    """One fio v3 iolog from the per-job ones, ordered by time, all on one file name (the
    jobs share the export; their offsets are already absolute)."""
    recs = []
    for p in paths:
        for line in p.read_text().splitlines()[1:]:
            parts = line.split()
            if len(parts) == 5 and parts[2] in ("read", "write"):
                recs.append((int(parts[0]), parts[2], parts[3], parts[4]))
    recs.sort(key=lambda r: r[0])
    with open(dest, "w") as f:
        f.write("fio version 3 iolog\n0 nbd add\n0 nbd open\n")
        for t, op, off, ln in recs:
            f.write(f"{t} nbd {op} {off} {ln}\n")
        f.write(f"{recs[-1][0] if recs else 0} nbd close\n")
    return len(recs)


def run(ctx):
    data, cache, secs = params(ctx.scale)
    out = ctx.dir(NAME)
    rig = Rig(ctx, NAME, data, cache)
    rig.prepare()
    p = ctx.progress
    live, iops_rows, hit_rows = {}, [], []
    iolog = rig.work / "trace"
    slots = None
    for i, (policy, label) in enumerate(LIVE):
        p.set(step=f"{label} ({i + 1}/{len(LIVE) + 1}, {secs:g} s)")
        slots = rig.create_cache(policy=policy)
        with rig.serve_cache() as s:
            rep, ser, rows, tot = rig.run_zipf(s.uri("vol"), secs, server=s,
                                              iolog_prefix=iolog if policy == "strata" else None)
        tail = [h for t, h in hit_series(rows) if rows and t >= rows[-1]["t_s"] - max(10, secs / 6)]
        live[label] = {"policy": policy, "avg_iops": avg_iops(rep), "hit_ratio": tot.get("hit_ratio"),
                       "hit_ratio_tail": b.mean(tail) if tail else None, "promotions": tot.get("promotions"),
                       "demotions": tot.get("demotions"), "requests": b.total_ios(rep)}
        iops_rows.extend({"series": label, "t_s": t, "iops": v} for t, v in ser)
        hit_rows.extend({"series": label} | r for r in rows)
        p.note(f"  {NAME}: {label}: {live[label]['avg_iops']:,.0f} IOPS, hit ratio {live[label]['hit_ratio']:.3f}")

    p.set(step=f"strata sim on the recorded trace ({len(LIVE) + 1}/{len(LIVE) + 1})")
    trace = rig.work / "trace.iolog"
    n = merge_iologs([rig.work / "trace.1", rig.work / "trace.2"], trace)
    sim = b.run([ctx.strata, "sim", trace, "--format", "fio", "--block-size", str(BLOCK), "--size", str(slots),
                 "--policy", ",".join(SIM_POLICIES), "--ops", "read", "--csv", "--jobs", "2"], timeout=1800).stdout
    simulated = {}
    for row in csv.DictReader(io.StringIO(sim[sim.index("policy,"):])):
        simulated[row["policy"]] = {"hit_ratio": float(row["hit_ratio"]), "promotions": int(row["promotions"]),
                                    "requests": int(row["requests"])}
    opt = simulated.get("opt", {}).get("hit_ratio")
    live_strata = live["strata (live)"]["hit_ratio"]
    derived = {
        "live_strata_over_opt": live_strata / opt if opt else None,
        "sim_strata_over_opt": simulated["strata"]["hit_ratio"] / opt if opt else None,
        "live_minus_sim_strata": live_strata - simulated["strata"]["hit_ratio"],
        "trace_requests": n,
    }

    b.write_csv(out / "iops.csv", iops_rows, ["series", "t_s", "iops"])
    b.write_csv(out / "hit_ratio.csv", hit_rows, ["series", "t_s", "hit_ratio"] + b.StatusPoller.FIELDS)
    rows = [{"kind": "live", "policy": v["policy"], "hit_ratio": v["hit_ratio"], "promotions": v["promotions"],
             "avg_iops": v["avg_iops"]} for v in live.values()]
    rows += [{"kind": "sim", "policy": k, "hit_ratio": v["hit_ratio"], "promotions": v["promotions"]}
             for k, v in simulated.items()]
    b.write_csv(out / "policies.csv", rows, ["kind", "policy", "hit_ratio", "promotions", "avg_iops"])

    setup = (f"2 jobs x {rig.region // b.MIB} MiB zipf:1.2 4 KiB randread, iodepth 8; cache {slots} x 64 KiB "
             f"= {slots * BLOCK / b.MIB:.1f} MiB (5% of the data); hdd: origin (scale {ctx.scale:g})")
    labels = [k for k in live] + [f"{k} (sim)" for k in simulated]
    vals = [v["hit_ratio"] for v in live.values()] + [v["hit_ratio"] for v in simulated.values()]
    kinds = ["live strata server"] * len(live) + ["strata sim, same trace"] * len(simulated)
    plots.bar_chart(out / "hit_ratio_vs_sim.png", f"Hit ratio, live vs simulated on the same fio trace: {setup}",
                    labels, vals, "hit ratio (64 KiB cache-block accesses)", "policy (opt = offline optimum, the bound)",
                    kinds=kinds, ylim=(0, 1.05))
    hits = {}
    for r in hit_rows:
        if r.get("hit_ratio") is not None:
            hits.setdefault(r["series"], []).append((r["t_s"], r["hit_ratio"]))
    plots.time_series(out / "hit_ratio.png", f"Live hit ratio over time (per 500 ms): {setup}",
                      list(hits.items()), "hit ratio (cache-block accesses)", smooth_s=max(1.0, secs / 30),
                      ylim=(0, 1.02))
    return {
        "setup": {"data_bytes": data, "region_bytes": rig.region, "cache_blocks": slots, "block_bytes": BLOCK,
                  "cache_bytes": slots * BLOCK, "series_s": secs, "sim_policies": SIM_POLICIES},
        "live": live,
        "sim": simulated,
        "derived": derived,
        "files": ["iops.csv", "hit_ratio.csv", "policies.csv", "hit_ratio_vs_sim.png", "hit_ratio.png"],
    }

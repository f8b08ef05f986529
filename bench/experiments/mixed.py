"""mixed (seed 003's FIO tests): random 8 KiB IO biased to hot regions (fio's zoned
distribution: 60% of IO on 10% of the volume, 30% on 20%, 8% on 30%, 2% on 40%), 100%
read, 50/50 and 100% write, run twice on the same cache (pass 1, pass 2; fio repeats its
random sequence, as the seed's second run did), for a sweep of cache sizes. Reported as
time per pass like the seed's tables, for strata writeback, writethrough and writearound,
strata's write log (writecache, 4 KiB blocks, default tunables, a log of the same data
capacity) and nbdkit's cache filter over the same hdd: origin, with the origin alone as the
reference. 32 KiB cache blocks, as the seed's dm-cache (an 8 KiB IO promotes a whole block).

Scale 1: volume 512 MiB, caches 32/128/512 MiB, 2000 IOs per pass at iodepth 8.
"""

import benchlib as b
import plots

NAME = "mixed"
TITLE = "random 8 KiB IO on hot zones, pass 1 and pass 2, by cache size"
BLOCK = 32 * b.KIB
ZONES = "zoned:60/10:30/20:8/30:2/40"
MIXES = [("100% read", "randread", None), ("50/50", "randrw", 50), ("100% write", "randwrite", None)]
CONFIGS = ["strata writeback", "strata writethrough", "strata writearound", "strata writecache",
           "nbdkit cache filter"]
ORIGIN = "origin alone"


def params(scale):
    vol = max(16, int(512 * scale)) * b.MIB
    fracs = [1 / 16, 1 / 4, 1] if scale >= 0.25 else [1 / 4, 1] if scale >= 0.05 else [1 / 4]
    caches = [max(4 * BLOCK, int(vol * f) // BLOCK * BLOCK) for f in fracs]
    ios = max(32, int(2000 * scale))
    return vol, caches, ios


def expected_seconds(scale):
    vol, caches, ios = params(scale)
    hdd_pass = ios / 110
    # Pass 1 near origin speed, pass 2 faster with the larger caches; writethrough writes
    # and the origin runs at origin speed.
    per_size = len(MIXES) * (7 * hdd_pass + 1.0 * hdd_pass + 5)
    return len(caches) * per_size + len(MIXES) * hdd_pass + vol / (300 * b.MIB) + 3


def fio_pass(uri, rw, mix, vol, ios):
    args = ["--ioengine=nbd", f"--uri={uri}", "--name=mixed", f"--rw={rw}", "--bs=8k", "--iodepth=8",
            f"--random_distribution={ZONES}", f"--size={b.fio_size(vol)}", f"--number_ios={ios}",
            "--norandommap"]
    if mix is not None:
        args.append(f"--rwmixread={mix}")
    rep = b.fio(args, timeout=ios + 600)
    job = rep["jobs"][0]
    return {"time_s": job["job_runtime"] / 1000, "iops": b.total_iops(rep), "ios": b.total_ios(rep)}


def run(ctx):
    vol, caches, ios = params(ctx.scale)
    out = ctx.dir(NAME)
    work = ctx.work(NAME)
    origin = work / "origin.img"
    cachef = work / "cache.img"
    sock, ksock = work / "s.sock", work / "k.sock"
    p = ctx.progress
    p.set(step="writing the origin")
    b.fill_random(origin, vol)
    rows = []
    steps = len(MIXES) * (1 + len(caches) * len(CONFIGS))
    k = 0

    def add(config, cache_bytes, mix, pass_no, r):
        rows.append({"config": config, "cache_mib": cache_bytes / b.MIB if cache_bytes else None, "workload": mix,
                     "pass": pass_no} | r)

    for mix, rw, pct in MIXES:
        k += 1
        p.set(step=f"{ORIGIN}, {mix} ({k}/{steps})")
        with b.Strata(ctx, sock, f"origin=hdd:{origin}") as s:
            r = fio_pass(s.uri("origin"), rw, pct, vol, ios)
        add(ORIGIN, None, mix, 1, r)

    for cache_bytes in caches:
        cache_file = b.cache_file_bytes(cache_bytes, BLOCK)
        for config in CONFIGS:
            for mix, rw, pct in MIXES:
                k += 1
                p.set(step=f"{config}, cache {cache_bytes / b.MIB:g} MiB, {mix} ({k}/{steps})")
                if config == "strata writecache":
                    if cachef.exists():
                        cachef.unlink()
                    b.writecache_create(ctx, f"hdd:{origin}",
                                        f"{cachef}?size={b.size_str(b.cache_file_bytes(cache_bytes, 4 * b.KIB))}")
                    with b.Strata(ctx, sock, f"vol=writecache:{cachef}") as s:
                        for n in (1, 2):
                            r = fio_pass(s.uri("vol"), rw, pct, vol, ios)
                            t = s.target("vol")
                            add(config, cache_bytes, mix, n, r | {"dirty_blocks": t.get("dirty_blocks"),
                                                                  "writes_around": t.get("writes_around")})
                elif config.startswith("strata"):
                    mode = config.split()[1]
                    if cachef.exists():
                        cachef.unlink()
                    b.cache_create(ctx, f"hdd:{origin}", f"{cachef}?size={b.size_str(cache_file)}",
                                   block_size="32KiB", mode=mode)
                    with b.Strata(ctx, sock, f"vol=cache:{cachef}") as s:
                        for n in (1, 2):
                            r = fio_pass(s.uri("vol"), rw, pct, vol, ios)
                            t = s.target("vol")
                            add(config, cache_bytes, mix, n, r | {"hit_ratio_total": t.get("hit_ratio_total"),
                                                                  "promotions": t.get("promotions"),
                                                                  "dirty_blocks": t.get("dirty_blocks")})
                else:
                    env = dict(b.ENV, TMPDIR=str(work))
                    with b.Strata(ctx, sock, f"origin=hdd:{origin}") as s, \
                            b.nbdkit(ksock, "nbd", f"socket={sock}", "export=origin", "cache-on-read=true",
                                     f"cache-max-size={b.fio_size(cache_bytes)}", "cache-min-block-size=32K",
                                     filters=["cache"], log=ctx.scratch / "nbdkit.log", env=env) as kit:
                        for n in (1, 2):
                            add(config, cache_bytes, mix, n, fio_pass(kit.uri(), rw, pct, vol, ios))

    b.write_csv(out / "times.csv", rows, ["config", "cache_mib", "workload", "pass", "time_s", "iops", "ios",
                                           "hit_ratio_total", "promotions", "dirty_blocks", "writes_around"])
    # The seed's tables: rows = cache size, columns = config x pass.
    table = {}
    for r in rows:
        key = "origin" if r["config"] == ORIGIN else f"{r['cache_mib']:g}"
        table.setdefault(r["workload"], {}).setdefault(key, {})[f"{r['config']} pass {r['pass']}"] = r["time_s"]
    groups = [f"{c / b.MIB:g}" for c in caches]
    bars = [f"{c} pass {n}" for c in CONFIGS for n in (1, 2)]
    values = {}
    hline = {}
    for r in rows:
        if r["config"] == ORIGIN:
            hline[r["workload"]] = ("origin alone", r["time_s"])
        else:
            values[(r["workload"], f"{r['cache_mib']:g}", f"{r['config']} pass {r['pass']}")] = r["time_s"]
    plots.grouped_bars(out / "times.png",
                       f"Time per pass, {ios} random 8 KiB IOs ({ZONES}), iodepth 8, on a {vol // b.MIB} MiB hdd: "
                       f"volume; 32 KiB cache blocks (scale {ctx.scale:g}); lower is better",
                       groups, bars, values, "time per pass (s; log scale)", "cache size (MiB)", log=True,
                       hline=hline, annotate=False, panels=[m for m, _, _ in MIXES],
                       colors=["#9ecae1", "#1f77b4", "#a1d99b", "#2ca02c", "#fdd0a2", "#e6550d", "#fcbba1",
                               "#cb181d", "#dadaeb", "#756bb1"])
    # The rule: no strata mode slower than the origin alone on any workload, in any pass.
    origin_s = {r["workload"]: r["time_s"] for r in rows if r["config"] == ORIGIN}
    worst = {}
    for r in rows:
        if r["config"].startswith("strata"):
            ratio = r["time_s"] / origin_s[r["workload"]]
            key = f"{r['config']}, {r['workload']}"
            worst[key] = round(max(worst.get(key, 0.0), ratio), 3)
    return {
        "setup": {"volume_bytes": vol, "cache_sizes_bytes": caches, "ios_per_pass": ios, "block_bytes": BLOCK,
                  "distribution": ZONES, "iodepth": 8, "bs": "8k"},
        "table_time_s": table,
        "worst_over_origin": worst,
        "rows": rows,
        "files": ["times.csv", "times.png"],
    }

"""qos: seed 001's four IO-controller experiments (the 2009 IO-scheduler-based controller
against dm-ioband and plain CFQ), scaled. One emulated disk (`hdd:`, 7200 rpm, 150 MiB/s)
cut into two slices, one per group; fio --ioengine=nbd, 4 KiB O_DIRECT, one NBD connection
per fio job. A busy group grows from 1 to 32 streams against a lone stream (or, in
experiment 4, a growing group of random readers against 16 sequential readers); each point
runs three ways:

- no controller: `strata serve` with the two slices (the disk serves requests in arrival
  order, as noop would);
- strata qos: the two slices in two `qos:` groups of equal weight;
- nbdkit rate: nbdkit's rate filter caps the busy group at half of what it gets alone (a
  static cap is what a bandwidth throttle offers), both groups through nbdkit's nbd plugin
  to the no-controller server.

Plus, per point, the busy group alone (the other idle) with no controller and with qos:
the targets compare against those. And the cost of qos itself without contention: 4 KiB
random reads at iodepth 32 from one connection on a RAM volume, with and without a `qos:`
group over it, in alternating rounds, with the server's CPU per request.

    QOS_EXPERIMENTS=1,2,3,4 (default 1) picks the experiments; QOS_RUNTIME overrides the
    seconds per point (default 20 at scale 1).

Scale 1: 20 s per run, 5 runs per point, 6 points: about 11 minutes per experiment, plus
a minute for the RAM overhead (3 rounds of 10 s).
Smaller scales run fewer points (1 and 2 competitors) and shorter runs.
"""

import os

import benchlib as b
import plots

NAME = "qos"
TITLE = "Proportional share of one disk between two groups (seed 001)"
WAYS = ["no controller", "strata qos", "nbdkit rate"]
DISK_GIB = 8


def experiments():
    """Experiment number: (title, busy side header, lone side header, busy job, lone job,
    points as (busy jobs, lone jobs))."""
    counts = [1, 2, 4, 8, 16, 32]
    seq = {"rw": "read", "bs": "4k"}
    rand = {"rw": "randread", "bs": "4k"}
    writers = {"rw": "randwrite", "bs": "64k", "iodepth": "4"}
    return {
        1: ("Sequential readers vs Random reader", "Sequential readers", "Random Reader", seq, rand,
            [(n, 1) for n in counts]),
        2: ("Random writers vs Random reader", "Random Writers", "Random Reader", writers, rand,
            [(n, 1) for n in counts]),
        3: ("Sequential Readers vs Sequential reader", "Sequential Readers", "Sequential Reader", seq, seq,
            [(n, 1) for n in counts]),
        4: ("Sequential Readers vs Multiple Random Readers", "Sequential Readers", "Multiple Random Readers", seq,
            rand, [(16, n) for n in [1, 2, 4, 8, 16]]),
    }


def chosen():
    return [int(x) for x in os.environ.get("QOS_EXPERIMENTS", "1").split(",") if x.strip()]


def params(scale):
    runtime = float(os.environ.get("QOS_RUNTIME", 0)) or max(0.3, round(20 * scale, 1))
    small = scale < 0.25
    return runtime, small


def points(exp, small):
    pts = experiments()[exp][5]
    return pts[:2] if small else pts


def overhead_params(scale):
    return max(0.3, round(10 * scale, 1)), 3 if scale >= 0.25 else 1


def expected_seconds(scale):
    runtime, small = params(scale)
    n = sum(len(points(e, small)) for e in chosen())
    o_runtime, rounds = overhead_params(scale)
    return n * 5 * (runtime + 1.5) + rounds * 2 * (o_runtime + 1)


def job(name, uri, spec, jobs, region, runtime):
    """fio options for `jobs` clones of one job, each in its own part of the slice."""
    args = [f"--name={name}", "--ioengine=nbd", f"--uri={uri}", "--direct=1", "--time_based",
            f"--runtime={int(runtime * 1000)}ms", f"--numjobs={jobs}", f"--size={region}", f"--offset_increment={region}",
            "--randrepeat=0", "--norandommap"]
    return args + [f"--{k}={v}" for k, v in spec.items()]


def side_of(j):
    return j["write"] if j["write"]["io_bytes"] > j["read"]["io_bytes"] else j["read"]


def summarise(report, name):
    """Per-stream bandwidth (KB/s) and the group's aggregate and max latency (ms)."""
    jobs = [j for j in report["jobs"] if j["jobname"] == name]
    if not jobs:
        return None
    bws = [side_of(j)["bw_bytes"] / 1000 for j in jobs]
    lat = max(side_of(j)["lat_ns"]["max"] for j in jobs) / 1e6
    return {"n": len(jobs), "max_bw": max(bws), "min_bw": min(bws), "agg_bw": sum(bws), "max_lat_ms": lat}


def run(ctx):
    runtime, small = params(ctx.scale)
    out = ctx.dir(NAME)
    work = ctx.work(NAME)
    p = ctx.progress
    slice_bytes = DISK_GIB // 2 << 30
    disk = f"hdd:{work}/disk.img?size={DISK_GIB}GiB"
    plain = [f"busy=slice:0+{DISK_GIB // 2}GiB@{disk}", f"lone=slice:{DISK_GIB // 2}GiB+{DISK_GIB // 2}GiB@{disk}"]
    grouped = [f"busy=qos:busy@slice:0+{DISK_GIB // 2}GiB@{disk}",
               f"lone=qos:lone@slice:{DISK_GIB // 2}GiB+{DISK_GIB // 2}GiB@{disk}"]
    log = ctx.scratch / "qos-servers.log"
    rows, tables, results = [], [], {}

    def measure(volumes, busy_spec, lone_spec, nb, nl, rate_bits=None):
        """Runs the point; `lone_spec` None leaves the lone group idle."""
        with b.Strata(ctx, work / "s.sock", *volumes, admin=False) as s:
            uris = {"busy": s.uri("busy"), "lone": s.uri("lone")}
            if rate_bits is None:
                return run_fio(uris, busy_spec, lone_spec, nb, nl)
            with b.nbdkit(work / "kb.sock", "nbd", f"socket={work / 's.sock'}", "export=busy", f"rate={int(rate_bits)}",
                          filters=("rate",), log=log) as kb, \
                    b.nbdkit(work / "kl.sock", "nbd", f"socket={work / 's.sock'}", "export=lone", log=log) as kl:
                return run_fio({"busy": kb.uri(), "lone": kl.uri()}, busy_spec, lone_spec, nb, nl)

    def run_fio(uris, busy_spec, lone_spec, nb, nl):
        args = job("busy", uris["busy"], busy_spec, nb, slice_bytes // nb, runtime)
        if lone_spec is not None:
            args += job("lone", uris["lone"], lone_spec, nl, slice_bytes // nl, runtime)
        rep = b.fio(args, timeout=runtime * 4 + 120)
        return {"busy": summarise(rep, "busy"), "lone": summarise(rep, "lone")}

    for exp in chosen():
        title, busy_head, lone_head, busy_spec, lone_spec, pts = experiments()[exp]
        pts = points(exp, small)
        res = results.setdefault(str(exp), {"title": title, "points": []})
        rate_bits = None
        for nb, nl in pts:
            point = {"busy_jobs": nb, "lone_jobs": nl}
            for way, volumes in [("no controller alone", plain), ("strata qos alone", grouped)]:
                p.set(step=f"experiment {exp}: {nb}+{nl}: {way}")
                point[way] = measure(volumes, busy_spec, None, nb, nl)["busy"]
            if rate_bits is None:
                # The peer's static cap: half of what the busy group gets alone at the first point.
                rate_bits = point["no controller alone"]["agg_bw"] * 1000 * 8 / 2
            for way in WAYS:
                p.set(step=f"experiment {exp}: {nb}+{nl}: {way}")
                volumes = grouped if way == "strata qos" else plain
                point[way] = measure(volumes, busy_spec, lone_spec, nb, nl,
                                     rate_bits=rate_bits if way == "nbdkit rate" else None)
                r = point[way]
                rows.append({"experiment": exp, "way": way, "busy_jobs": nb, "lone_jobs": nl,
                             "busy_max_kbs": r["busy"]["max_bw"], "busy_min_kbs": r["busy"]["min_bw"],
                             "busy_agg_kbs": r["busy"]["agg_bw"], "busy_max_lat_ms": r["busy"]["max_lat_ms"],
                             "lone_agg_kbs": r["lone"]["agg_bw"], "lone_max_lat_ms": r["lone"]["max_lat_ms"]})
            res["points"].append(point)
        res["rate_bits_per_s"] = rate_bits
        res["targets"] = targets(res["points"])
        for way in WAYS:
            tables.append(table(exp, title, way, busy_head, lone_head, res["points"]))
        plot(out / f"experiment{exp}.png", exp, title, lone_head, res["points"], runtime)

    results["overhead"] = overhead(ctx, work)
    text = "\n\n".join(tables) + "\n"
    (out / "tables.txt").write_text(text)
    print(text)
    b.write_csv(out / "points.csv", rows)
    files = ["points.csv", "tables.txt"] + [f"experiment{e}.png" for e in chosen()]
    return {"setup": {"runtime_s": runtime, "disk_gib": DISK_GIB, "experiments": chosen()}, "results": results,
            "files": files}


def overhead(ctx, work):
    """IOPS and server CPU per request on RAM with and without qos, median of the rounds."""
    runtime, rounds = overhead_params(ctx.scale)
    got = {"mem": {"iops": [], "cpu_us": []}, "qos over mem": {"iops": [], "cpu_us": []}}
    for rnd in range(rounds):
        for name, spec in [("mem", "v=mem:256MiB"), ("qos over mem", "v=qos:a@mem:256MiB")]:
            ctx.progress.set(step=f"overhead round {rnd + 1}/{rounds}: {name}")
            with b.Strata(ctx, work / "o.sock", spec, admin=False) as s:
                b.fill_nbd(s.uri("v"), 256 * b.MIB)
                rep, cpu = b.fio_server_cpu(s, ["--name=job", "--ioengine=nbd", f"--uri={s.uri('v')}", "--rw=randread",
                                                "--bs=4k", "--iodepth=32", "--time_based",
                                                f"--runtime={int(runtime * 1000)}ms", "--size=256M",
                                                "--randrepeat=0", "--norandommap"])
            side = rep["jobs"][0]["read"]
            got[name]["iops"].append(side["iops"])
            got[name]["cpu_us"].append(cpu / max(1, side["total_ios"]) * 1e6)
    res = {k: {"iops": b.median(v["iops"]), "server_cpu_us_per_req": b.median(v["cpu_us"]), "rounds": v["iops"]}
           for k, v in got.items()}
    res["qos / mem iops"] = res["qos over mem"]["iops"] / res["mem"]["iops"]
    res["qos - mem cpu us per req"] = res["qos over mem"]["server_cpu_us_per_req"] - res["mem"]["server_cpu_us_per_req"]
    return res


def table(exp, title, way, busy_head, lone_head, pts):
    """The seed's layout: the busy side, then the lone side."""
    lines = [f"Experiment {exp}: {title} -- {way}", f"[{busy_head}] [{lone_head}]",
             "nr Max-bandw Min-bandw Agg-bandw Max-latency nr Agg-bandw Max-latency"]
    for pt in pts:
        r = pt[way]
        bs, lo = r["busy"], r["lone"]
        lines.append(f"{bs['n']} {bs['max_bw']:.0f}KB/s {bs['min_bw']:.0f}KB/s {bs['agg_bw']:.0f}KB/s "
                     f"{bs['max_lat_ms']:.0f} msec {lo['n']} {lo['agg_bw']:.0f}KB/s {lo['max_lat_ms']:.0f} msec")
    return "\n".join(lines)


def targets(pts):
    """The issue's targets, as ratios per way and point (qos must meet them; the others are shown)."""
    out = {}
    for way in WAYS:
        first = pts[0][way]["lone"]
        rows = []
        for pt in pts:
            r = pt[way]
            alone = pt["strata qos alone"]["agg_bw"]
            rows.append({
                "busy_jobs": pt["busy_jobs"], "lone_jobs": pt["lone_jobs"],
                "lone_bw_vs_first": r["lone"]["agg_bw"] / first["agg_bw"] if first["agg_bw"] else None,
                "lone_max_lat_vs_first": r["lone"]["max_lat_ms"] / first["max_lat_ms"] if first["max_lat_ms"] else None,
                "busy_agg_vs_half_alone": r["busy"]["agg_bw"] / (alone / 2) if alone else None,
                "busy_min_over_max": r["busy"]["min_bw"] / r["busy"]["max_bw"] if r["busy"]["max_bw"] else None,
            })
        out[way] = rows
    out["qos alone vs no controller alone"] = [
        pt["strata qos alone"]["agg_bw"] / pt["no controller alone"]["agg_bw"] for pt in pts]
    return out


def plot(path, exp, title, lone_head, pts, runtime):
    """The lone stream's bandwidth and max latency against the number of competitors."""
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.3))
    xs = [pt["busy_jobs"] if exp != 4 else pt["lone_jobs"] for pt in pts]
    for i, way in enumerate(WAYS):
        c = plots.COLORS[i]
        axes[0].plot(xs, [pt[way]["lone"]["agg_bw"] for pt in pts], marker="o", color=c, label=way)
        axes[1].plot(xs, [pt[way]["lone"]["max_lat_ms"] for pt in pts], marker="o", color=c, label=way)
    xlabel = "random readers in the group" if exp == 4 else "streams in the other group"
    for ax, ylabel in zip(axes, [f"{lone_head}: bandwidth (KB/s)", f"{lone_head}: max latency (ms)"]):
        ax.set_xscale("log", base=2)
        ax.set_xticks(xs, [str(x) for x in xs])
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(plots.wrap(f"Experiment {exp}: {title}; hdd: model, two slices of one disk, equal weights, "
                            f"fio nbd 4 KiB O_DIRECT, {runtime:g} s per point"), fontsize=10)
    plots.save(fig, path)

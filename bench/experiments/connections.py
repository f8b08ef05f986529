"""connections: several NBD connections to one export against one (issue 14, item 2). The
kernel's nbd-client -C N, qemu and nbdcopy spread a client's queue over several connections;
strata must serve 4 connections at iodepth 8 each at least as fast as one at iodepth 32.
fio --ioengine=nbd, 4 KiB randread and randwrite, on a `mem:` volume and an O_DIRECT file
served by one strata; each round runs both shapes back to back (which goes first alternates),
and each ratio is the median over the rounds of 4x8 against 1x32, with the server's CPU per
request.

Scale 1: a 1 GiB volume and file, 10 s runs, 3 rounds (about 3 minutes).
"""

import benchlib as b
import plots

NAME = "connections"
TITLE = "Several connections to one export: 4 connections at iodepth 8 against 1 at iodepth 32"
SHAPES = [("1 connection x iodepth 32", 1, 32), ("4 connections x iodepth 8", 4, 8)]
EXPORTS = [("mem", "mem: volume"), ("direct", "O_DIRECT file")]
RWS = ["randread", "randwrite"]


def params(scale):
    size_mib = max(64, int(1024 * scale))
    runtime = max(0.5, round(10 * scale, 1))
    rounds = 3 if scale >= 0.25 else 1
    return size_mib, runtime, rounds


def expected_seconds(scale):
    size_mib, runtime, rounds = params(scale)
    return rounds * len(EXPORTS) * len(RWS) * len(SHAPES) * (runtime + 0.5) + size_mib / 100 + 5


def run(ctx):
    size_mib, runtime, rounds = params(ctx.scale)
    out = ctx.dir(NAME)
    work = ctx.work(NAME)
    img = work / "file.img"
    p = ctx.progress
    p.set(step="writing the file")
    b.fill_random(img, size_mib * b.MIB)
    runs = {}  # (export, rw, shape): one {"iops", "server_us_per_req"} per round
    with b.Strata(ctx, work / "s.sock", f"direct={img}", f"mem=mem:{size_mib}MiB", admin=False) as s:
        b.fill_nbd(s.uri("mem"), size_mib * b.MIB)
        for rnd in range(rounds):
            for export, _ in EXPORTS:
                for rw in RWS:
                    for shape, jobs, depth in SHAPES if rnd % 2 == 0 else SHAPES[::-1]:
                        p.set(step=f"round {rnd + 1}/{rounds}: {export} {rw} {shape}")
                        args = ["--name=job", "--ioengine=nbd", f"--uri={s.uri(export)}", "--bs=4k",
                                f"--rw={rw}", f"--size={size_mib}M", "--norandommap", "--randrepeat=0",
                                "--time_based", f"--runtime={int(runtime * 1000)}ms", f"--numjobs={jobs}",
                                f"--iodepth={depth}"]
                        rep, cpu = b.fio_server_cpu(s, args)
                        iops = b.total_iops(rep)
                        ios = iops * runtime
                        runs.setdefault((export, rw, shape), []).append(
                            {"iops": iops, "server_us_per_req": cpu / ios * 1e6 if ios else None})

    rows, ratios = [], {}
    for export, label in EXPORTS:
        for rw in RWS:
            for shape, _, _ in SHAPES:
                rs = runs[(export, rw, shape)]
                rows.append({"export": label, "rw": rw, "shape": shape, "iops": b.median([r["iops"] for r in rs]),
                             "server_us_per_req": b.median([r["server_us_per_req"] for r in rs
                                                            if r["server_us_per_req"] is not None])})
            one, four = runs[(export, rw, SHAPES[0][0])], runs[(export, rw, SHAPES[1][0])]
            ratios[f"{label} {rw}: 4 x 8 / 1 x 32"] = b.median(
                [f["iops"] / o["iops"] for o, f in zip(one, four) if o["iops"]])
    b.write_csv(out / "connections.csv", rows, ["export", "rw", "shape", "iops", "server_us_per_req"])
    b.write_ratios(out, ratios)
    plots.bar_chart(out / "ratios.png",
                    f"4 connections at iodepth 8 against 1 at iodepth 32, 4 KiB ({size_mib} MiB, {runtime} s runs, "
                    f"median of {rounds} rounds, scale {ctx.scale:g}); target at least 1",
                    list(ratios), list(ratios.values()), "ratio", "figure")
    return {
        "setup": {"size_mib": size_mib, "runtime_s": runtime, "rounds": rounds},
        "results": {f"{dict(EXPORTS)[export]} {rw} {shape}": r for (export, rw, shape), r in runs.items()},
        "ratios": ratios,
        "files": ["connections.csv", "ratios.csv", "ratios.png"],
    }

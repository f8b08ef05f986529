"""overhead: the NBD data path against its peers (the foundation issue's figures). fio
--ioengine=nbd, 4 KiB random reads and writes at iodepth 32, against strata and nbdkit on
the same backing (file through the page cache, file with O_DIRECT, RAM), plus fio directly
on the file (io_uring, O_DIRECT and buffered) as the limit. Rounds alternate the servers
so drift on a shared machine hits all of them; each figure is the median of the rounds;
server CPU per request comes from /proc.

Scale 1: a 1 GiB file, 10 s per run, 3 rounds (about 8 minutes).
"""

import os
import subprocess

import benchlib as b
import plots

NAME = "overhead"
TITLE = "NBD data path: strata vs nbdkit vs fio on the file"
RWS = ["randread", "randwrite"]
SERIES = ["strata file (page cache)", "strata file (O_DIRECT)", "strata mem", "nbdkit file", "nbdkit memory",
          "fio io_uring O_DIRECT on the file", "fio io_uring buffered on the file"]


def params(scale):
    size_mib = max(32, int(1024 * scale))
    runtime = max(0.5, round(10 * scale, 1))
    rounds = 3 if scale >= 0.25 else 1
    return size_mib, runtime, rounds, 32


def expected_seconds(scale):
    size_mib, runtime, rounds, _ = params(scale)
    return rounds * len(RWS) * (len(SERIES) * (runtime + 0.5) + 4 * size_mib / 1500) + size_mib / 300


def run(ctx):
    size_mib, runtime, rounds, iodepth = params(ctx.scale)
    out = ctx.dir(NAME)
    work = ctx.work(NAME)
    img = work / "backing.img"
    p = ctx.progress
    p.set(step="writing the backing file")
    b.fill_random(img, size_mib * b.MIB)

    def warm():
        # Same page-cache state for every run: the whole file cached, and no dirty pages left
        # by the run before for the kernel to write back during this one.
        os.sync()
        subprocess.run(["cat", str(img)], stdout=subprocess.DEVNULL, check=True)

    common = ["--name=job", "--bs=4k", f"--iodepth={iodepth}", f"--runtime={int(runtime * 1000)}ms", "--time_based",
              f"--size={size_mib}M", "--randrepeat=0", "--norandommap"]
    results = {}

    def record(name, rw, report, server_cpu):
        side = b.job_side(report, rw)
        ios = side["total_ios"] if "total_ios" in side else side["io_bytes"] // 4096
        job = report["jobs"][0]
        runtime_s = job["elapsed"] if job.get("elapsed") else runtime
        client_cpu = (job["usr_cpu"] + job["sys_cpu"]) / 100 * runtime_s
        r = results.setdefault(f"{name} {rw}", {"iops": [], "server_us_per_req": [], "client_us_per_req": []})
        r["iops"].append(side["iops"])
        if server_cpu is not None and ios:
            r["server_us_per_req"].append(server_cpu / ios * 1e6)
        if ios:
            r["client_us_per_req"].append(client_cpu / ios * 1e6)

    def run_nbd(server, name, export, rw):
        p.set(step=f"round {rnd + 1}/{rounds}: {name} {rw}")
        warm()
        rep, cpu = b.fio_server_cpu(server, common + ["--ioengine=nbd", f"--uri={server.uri(export)}", f"--rw={rw}"])
        record(name, rw, rep, cpu)

    log = ctx.scratch / "overhead-servers.log"
    for rnd in range(rounds):
        for rw in RWS:
            # A server claims each file it opens: the buffered volume gets a server of its own.
            with b.Strata(ctx, work / "s.sock", f"buffered={img}?direct=off", admin=False) as s:
                run_nbd(s, "strata file (page cache)", "buffered", rw)
            with b.Strata(ctx, work / "s.sock", f"direct={img}", f"mem=mem:{size_mib}MiB", admin=False) as s:
                run_nbd(s, "strata file (O_DIRECT)", "direct", rw)
                # Fill the RAM volume first so reads hit real memory, as nbdkit's do below.
                if rw == "randread":
                    b.fill_nbd(s.uri("mem"), size_mib * b.MIB)
                run_nbd(s, "strata mem", "mem", rw)
            with b.nbdkit(work / "k.sock", "file", str(img), log=log) as k:
                run_nbd(k, "nbdkit file", "", rw)
            with b.nbdkit(work / "k.sock", "memory", f"{size_mib}M", log=log) as k:
                if rw == "randread":
                    b.fill_nbd(k.uri(), size_mib * b.MIB)
                run_nbd(k, "nbdkit memory", "", rw)
            p.set(step=f"round {rnd + 1}/{rounds}: fio on the file {rw}")
            warm()
            rep = b.fio(common + ["--ioengine=io_uring", "--direct=1", f"--filename={img}", f"--rw={rw}"])
            record("fio io_uring O_DIRECT on the file", rw, rep, None)
            warm()
            rep = b.fio(common + ["--ioengine=io_uring", "--direct=0", f"--filename={img}", f"--rw={rw}"])
            record("fio io_uring buffered on the file", rw, rep, None)

    summary = {k: {m: b.median(v) for m, v in r.items()} | {"rounds": r["iops"]} for k, r in results.items()}
    ratios = {}
    for rw in RWS:
        ratios[f"file page cache {rw}: strata / nbdkit file"] = (
            summary[f"strata file (page cache) {rw}"]["iops"] / summary[f"nbdkit file {rw}"]["iops"])
        ratios[f"file O_DIRECT {rw}: strata / nbdkit file"] = (
            summary[f"strata file (O_DIRECT) {rw}"]["iops"] / summary[f"nbdkit file {rw}"]["iops"])
        ratios[f"file O_DIRECT {rw}: strata / fio direct"] = (
            summary[f"strata file (O_DIRECT) {rw}"]["iops"] / summary[f"fio io_uring O_DIRECT on the file {rw}"]["iops"])
        ratios[f"mem {rw}: strata / nbdkit memory"] = (
            summary[f"strata mem {rw}"]["iops"] / summary[f"nbdkit memory {rw}"]["iops"])

    rows = []
    for k, r in summary.items():
        name, rw = k.rsplit(" ", 1)
        rows.append({"series": name, "rw": rw, "iops": r["iops"], "server_us_per_req": r["server_us_per_req"],
                     "client_us_per_req": r["client_us_per_req"]})
    b.write_csv(out / "overhead.csv", rows, ["series", "rw", "iops", "server_us_per_req", "client_us_per_req"])
    b.write_csv(out / "ratios.csv", [{"ratio": k, "value": v} for k, v in ratios.items()], ["ratio", "value"])
    values = {(None, r["rw"], r["series"]): r["iops"] for r in rows}
    plots.grouped_bars(out / "iops.png",
                       f"NBD data path, 4 KiB random IO at iodepth 32 over a Unix socket, {size_mib} MiB file, "
                       f"{runtime} s runs, median of {rounds} alternating rounds (scale {ctx.scale:g}); higher is better",
                       RWS, SERIES, values, "IOPS (log scale)", "workload", log=True)
    return {
        "setup": {"size_mib": size_mib, "runtime_s": runtime, "rounds": rounds, "iodepth": iodepth},
        "results": summary,
        "ratios": ratios,
        "files": ["overhead.csv", "ratios.csv", "iops.png"],
    }
